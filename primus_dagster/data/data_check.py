"""``validate --data`` and ``plan --check-data``: read the first batch of each source's first planned
task through the source's adapter and normaliser, so that every column its declared feature cannot
take (a list mapped as one id, a string mapped dense, epoch seconds read as milliseconds, a missing
column) is named with its file and fix before a training run starts.

Example::

    for check in check_source_data(job, context, TimeWindow.hours_from(job.dataset.start, 24)):
        print(check.line())       # "impressions: ok (4,096 rows of f.parquet)" or the error

A source asset's checks read the whole partition instead (:func:`scan_with_findings`): besides the
scan's counters, each file's rows that break a gated data-quality rule (:data:`GATED_RULES`: ids that
are not whole, null event times, event times outside the partition), counted and with a few of the
values, whatever the source's quality action did with them, and each failed read sorted by cause.

Example::

    found = scan_with_findings(adapter, adapter.partition(start))
    [f.line() for f in found.of("bad_id")]  # ["/d/part-0.parquet: 1 row(s) with an id that is not ..."]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from primus_dagster.data.canonical import DataQualityError, PermanentDataError, SchemaMismatchError
from primus_dagster.data.graph import Planner
from primus_dagster.data.sources import (
    Partition,
    PartitionScan,
    ReadTask,
    SourceAdapter,
    SourceContext,
    SourceReadError,
    TimeWindow,
    scan_partition,
)
from primus_dagster.data.task_batches import read_batches
from primus_dagster.spec import JobSpec


@dataclass(frozen=True)
class SourceDataCheck:
    """What reading one source's first batch found: ``problem`` None when it read cleanly."""

    source: str
    where: str  # the task read ("" when the window has no task of the source)
    rows: int
    problem: str | None

    def line(self) -> str:
        if self.problem is not None:
            return f"{self.source}: {self.problem}"
        if not self.where:
            return f"{self.source}: no ready partition in the window to check"
        return f"{self.source}: ok ({self.rows:,} rows of {self.where})"


def check_source_data(job: JobSpec, context: SourceContext, window: TimeWindow) -> Iterator[SourceDataCheck]:
    """One :class:`SourceDataCheck` per source of ``job``, in spec order, from its first task in ``window``."""
    with Planner.for_job(job, context) as planner:
        tasks = list(planner.plan(window).tasks)
    for _, source in job.dataset.all_sources():
        task = next((t for t in tasks if t.read.source == source.name), None)
        if task is None:
            yield SourceDataCheck(source.name, "", 0, None)
            continue
        batches = read_batches(job, context, [task])
        try:
            batch = next(batches, None)
            yield SourceDataCheck(source.name, task.task_id, batch.rows if batch is not None else 0, None)
        except PermanentDataError as exc:
            yield SourceDataCheck(source.name, task.task_id, 0, str(exc))
        finally:
            batches.close()


_BROKEN = {  # a gated rule -> what its rows have
    "bad_id": "an id that is not a whole int64 (null, NaN, fractional or out of range)",
    "null_ts": "a null event time",
    "ts_outside_partition": "an event time outside the partition",
}
#: The data-quality rules whose rows fail a source asset's checks whatever the source's quality action
#: (a repaired or dropped row is still wrong at the source): ids that are not ids, missing or stray event times.
GATED_RULES = tuple(_BROKEN)


@dataclass(frozen=True)
class RuleFinding:
    """The rows of one read task (a file, its row-group range, an offset range) breaking one gated rule.

    ``rows``: as the normaliser counted them (when the read stopped on the rule -- quality action
    ``fail`` -- those of the batches before, and ``error`` its message); ``examples``: per native
    column, a few distinct breaking values as text; ``action``: what the source's quality policy did;
    ``window``: the partition's ``[start, end)``.
    """

    uri: str
    rule: str
    rows: int
    examples: dict[str, list[str]]
    action: str
    window: str
    error: str | None = None

    def line(self) -> str:
        """One line naming the file, the rows, the columns with their example values and the action."""
        if self.error is not None:
            return self.error if self.error.startswith(self.uri) else f"{self.uri}: {self.error}"
        columns = "; ".join(
            f"column {column!r}" + (f", e.g. {', '.join(values)}" if values else "")
            for column, values in self.examples.items()
        )
        broken = _BROKEN[self.rule] + (f" {self.window}" if self.rule == "ts_outside_partition" else "")
        return f"{self.uri}: {self.rows:,} row(s) with {broken} ({columns}); quality.{self.rule}: {self.action}"

    def as_json(self) -> dict[str, object]:
        """The finding as plain JSON (for metadata)."""
        out: dict[str, object] = {
            "path": self.uri,
            "rule": self.rule,
            "rows": self.rows,
            "columns": self.examples,
            "action": self.action,
        }
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class PartitionFindings:
    """What :func:`scan_with_findings` found: the scan, its failed reads by cause, the gated rules' rows."""

    scan: PartitionScan
    schema_errors: list[tuple[str, str]] = field(default_factory=list)  # (uri, message): a schema mismatch
    read_errors: list[tuple[str, str]] = field(default_factory=list)  # any other failed read or listing
    rule_findings: list[RuleFinding] = field(default_factory=list)

    def of(self, *rules: str) -> list[RuleFinding]:
        """The findings of ``rules``, in read order."""
        return [finding for finding in self.rule_findings if finding.rule in rules]


class _FindingsRecorder:
    """Reads through ``adapter`` for :func:`~primus_dagster.data.scan_partition`, noting per task what the
    normaliser counted under the gated rules and why a read failed."""

    def __init__(self, adapter: SourceAdapter) -> None:
        self.adapter = adapter
        self.schema_errors: set[tuple[str, str]] = set()
        self.split_errors: list[tuple[str, str]] = []
        self.findings: list[RuleFinding] = []
        self.quality: Counter[str] = Counter()
        self.window = ""

    @property
    def last_read_stats(self) -> dict:
        return self.adapter.last_read_stats

    def split(self, partition: Partition) -> list[ReadTask]:
        self.window = f"[{partition.start.isoformat()}, {partition.end.isoformat()})"
        try:
            return self.adapter.split(partition)
        except SourceReadError as exc:  # a footer that cannot be read: the partition's tasks are unknown
            self.split_errors.append((exc.uri, str(exc)))
            return []

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        stopped: DataQualityError | None = None
        try:
            yield from self.adapter.read(task)
        except SchemaMismatchError as exc:
            self.schema_errors.add((task.uri, str(exc)))
            raise
        except DataQualityError as exc:
            stopped = exc
            raise
        finally:
            self._note(task.uri, stopped)

    def _note(self, uri: str, stopped: DataQualityError | None) -> None:
        normalize = self.adapter.normalize
        examples, actions = dict(normalize.examples), normalize.actions
        counts = normalize.take()  # this task's counts (and examples): taken before the next task reads
        self.quality.update(counts)
        for rule in GATED_RULES:
            failed = stopped is not None and stopped.rule == rule
            if not counts.get(rule) and not failed:
                continue
            columns = {column: values for (of, column), values in examples.items() if of == rule}
            if failed and stopped is not None:
                columns.setdefault(stopped.column, [])
            error = str(stopped) if failed else None
            finding = RuleFinding(uri, rule, counts.get(rule, 0), columns, actions[rule], self.window, error)
            self.findings.append(finding)


def scan_with_findings(
    adapter: SourceAdapter, partition: Partition, on_task: Callable[[ReadTask, int, int], None] | None = None
) -> PartitionFindings:
    """:func:`~primus_dagster.data.scan_partition` of ``partition`` (every row, rows outside the partition
    kept for the event-time rule to count), with its failed reads sorted by cause and the rows of each
    task that break a rule of :data:`GATED_RULES`. A listing that fails (a footer read by ``split``) is a
    read error of the partition, not an exception."""
    adapter.normalize.fail_on_misread_times = False  # however many rows are outside: counted, not raised
    adapter.normalize.take()  # counts of earlier reads are not this partition's
    recorder = _FindingsRecorder(adapter)
    scan = scan_partition(recorder, partition, on_task=on_task)  # type: ignore[arg-type]
    scan.errors += recorder.split_errors
    scan.quality = recorder.quality
    gated = {(f.uri, f.error) for f in recorder.findings if f.error is not None}
    return PartitionFindings(
        scan=scan,
        schema_errors=[e for e in scan.errors if e in recorder.schema_errors],
        read_errors=[e for e in scan.errors if e not in recorder.schema_errors and e not in gated],
        rule_findings=recorder.findings,
    )
