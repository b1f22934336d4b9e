"""``validate --data`` and ``plan --check-data``: read the first batch of each source's first planned
task through the source's adapter and normaliser, so that every column its declared feature cannot
take (a list mapped as one id, a string mapped dense, epoch seconds read as milliseconds, a missing
column) is named with its file and fix before a training run starts.

Example::

    for check in check_source_data(job, context, TimeWindow.hours_from(job.dataset.start, 24)):
        print(check.line())       # "impressions: ok (4,096 rows of f.parquet)" or the error
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from primus_dagster.data.canonical import PermanentDataError
from primus_dagster.data.graph import Planner
from primus_dagster.data.sources import SourceContext, TimeWindow
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
