"""Which tasks a training window reads, and what a run consumed (lineage).

:func:`plan_training_tasks` plans a window with the DTGG planner by the one input rule of
:mod:`primus_dagster.spec.inputs` (the one the sensors and the training asset's dependencies follow):
the kinds the mode trains, the stream sources over the window, the batch sources over the window
shifted back by ``training.batch_lag``, less the batch partitions whose labels are not complete by the
window's end. :func:`consumed_sources` describes what the planned tasks read, per source (MLflow
dataset inputs, the asset's metadata).

Example::

    tasks = plan_training_tasks(job, SourceContext("/data"), TimeWindow.hours_from(t0, 24))
    consumed_sources(job, tasks)["impressions"]["partitions"]
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from primus_dagster.data import DataTask, NotReady, Planner, SourceContext, TimeWindow, source_versions
from primus_dagster.spec import (
    JobSpec,
    Span,
    clip_to_dataset,
    complete_at,
    labels_complete,
    mode_kinds,
    partition_starts,
    read_span,
    training_span_fed_by,
)

log = logging.getLogger(__name__)


class NoTrainingDataError(RuntimeError):
    """The window has no ready data for the job (which partitions were not ready, and why)."""


class IncompleteWindowError(NoTrainingDataError):
    """Partitions inside the window are not ready, and the run was asked for the whole window
    (``complete_window``: the training asset, ``train --strict``): it fails before it starts, naming them."""


class SourceUnavailableError(NoTrainingDataError):
    """A source the training mode reads could not be listed or read at all (broker down, catalog
    unreachable, bad credentials): the run fails rather than train on the other sources alone."""


def label_incomplete(job: JobSpec, tasks: list[DataTask], window: TimeWindow) -> list[NotReady]:
    """The batch partitions among ``tasks`` whose labels are not complete by the end of ``window``
    (:func:`~primus_dagster.spec.labels_complete`: a partition ``[start, end)`` of a source counts as
    complete at ``end + label_delay``, and the memory tower learns complete labels only). One entry per
    (source, partition)."""
    out: dict[tuple[str, datetime], NotReady] = {}
    for task in tasks:
        source = job.dataset.source(task.read.source)
        if not labels_complete(source, task.partition, window.end) and (source.name, task.partition) not in out:
            out[(source.name, task.partition)] = NotReady(
                task.stream,
                source.name,
                task.partition,
                f"labels complete at {complete_at(source, task.partition).isoformat()} "
                f"(label_delay {source.label_delay}), after the window end {window.end.isoformat()}",
                "waiting",
            )
    return list(out.values())


@dataclass(frozen=True)
class EmptyPartition:
    """A ready partition of a training window that held no rows: nothing to read (no data file, no Kafka
    record; found when planning) or only files without rows (found when its phase ends)."""

    source: str
    partition: datetime
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"source": self.source, "partition": self.partition.isoformat(), "reason": self.reason}


#: Why a ready partition with no task is empty.
NOTHING_TO_READ = "nothing to read (no data file or record)"
#: Why a partition whose tasks all served no row is empty.
NO_ROWS = "its files hold no rows"


def partitions_without_tasks(
    job: JobSpec, window: TimeWindow, tasks: Collection[DataTask], left_out: Collection[NotReady]
) -> list[EmptyPartition]:
    """The partitions a training ``window`` reads (of the kinds its mode trains, inside the dataset) that
    are ready -- not in ``left_out`` -- and got no task: empty. A join's right source is read by its left
    source's tasks and never counts."""
    planned = {(read.source, read.partition) for t in tasks for read in (t.read, *t.right_reads)}
    planned |= {(n.source, n.partition) for n in left_out}
    joined = {stream.join.right for stream in job.dataset.streams if stream.join is not None}
    out = []
    for kind in sorted(mode_kinds(job.training.mode)):
        span = clip_to_dataset(job.dataset, read_span(job, kind, window))
        if span is None:
            continue
        for _, source in job.dataset.all_sources():
            if source.kind != kind or source.name in joined:
                continue
            for start in partition_starts(span, source.granularity):
                if (source.name, start) not in planned:
                    out.append(EmptyPartition(source.name, start, NOTHING_TO_READ))
    return sorted(out, key=lambda e: (e.partition, e.source))


def empty_partitions_line(empty: Collection[EmptyPartition], limit: int = 10) -> str:
    """``src 2026-11-01T05:00, ... and N more`` for the run log."""
    shown = ", ".join(f"{e.source} {e.partition:%Y-%m-%dT%H:%M}" for e in list(empty)[:limit])
    return shown + (f" and {len(empty) - limit} more" if len(empty) > limit else "")


def plan_training_tasks(
    job: JobSpec,
    context: SourceContext,
    window: TimeWindow,
    skipped: list[NotReady] | None = None,
    complete_window: bool = False,
    empty: list[EmptyPartition] | None = None,
) -> list[DataTask]:
    """The tasks a training window reads (:func:`primus_dagster.spec.training_inputs`), in hand-out
    order: of the kinds the mode trains, the stream tasks of ``window`` and the batch tasks of ``window``
    shifted back by ``training.batch_lag`` (handed out beside the stream hours they feed), less the
    batch partitions whose labels are not complete by the window's end (:func:`label_incomplete`;
    counted in the log). Partitions not ready inside the window are skipped with a warning and appended
    to ``skipped`` -- or, with ``complete_window``, raise :class:`IncompleteWindowError` naming them; ready
    partitions with nothing to read are named in a warning and appended to ``empty``. Raises :class:`SourceUnavailableError` when a source the mode trains could not be
    read at all (a broker or catalog that cannot be reached: never a run on part of its sources in
    silence), :class:`NoTrainingDataError` naming what was not ready when nothing is."""
    lag = job.training.batch_lag
    spans: dict[Span, set[str]] = {}  # the source time the kinds of the mode read: one plan each
    for kind in sorted(mode_kinds(job.training.mode), reverse=True):  # stream first
        spans.setdefault(read_span(job, kind, window), set()).add(kind)
    tasks: list[DataTask] = []
    not_ready: list[NotReady] = []
    with Planner.for_job(job, context) as planner:
        for span, kinds in spans.items():
            plan = planner.plan(TimeWindow(span.start, span.end))
            not_ready += [n for n in plan.not_ready if job.dataset.source(n.source).kind in kinds]
            for task in plan.tasks:
                if task.kind not in kinds:
                    continue
                fed = training_span_fed_by(job, job.dataset.source(task.read.source), task.partition)
                if fed.start != task.partition:  # lagged: handed out beside the training time it feeds
                    task = replace(task, meta={**task.meta, "order_at": fed.start.isoformat()})
                tasks.append(task)
    failed = [n for n in not_ready if n.state == "error"]
    if failed:
        first = {n.source: n.reason for n in reversed(failed)}
        reasons = "; ".join(f"{name}: {reason}" for name, reason in sorted(first.items()))
        raise SourceUnavailableError(
            f"job {job.name}: cannot read source(s) {sorted(first)} for window {window} ({reasons}); "
            "nothing was trained: a run without them would train on part of its data"
        )
    if not_ready and complete_window:
        shown = ", ".join(f"{n.source} {n.partition:%Y-%m-%dT%H:%M} ({n.reason})" for n in not_ready[:10])
        more = f" and {len(not_ready) - 10} more" if len(not_ready) > 10 else ""
        raise IncompleteWindowError(
            f"job {job.name}: window {window} is incomplete: {len(not_ready)} partition(s) not ready: {shown}{more}; "
            "nothing was trained: materialise those partitions first (primus-dagster train without --strict "
            "skips them)"
        )
    if not_ready:
        shown = ", ".join(f"{n.source} {n.partition:%Y-%m-%dT%H:%M}" for n in not_ready[:5])
        more = f" and {len(not_ready) - 5} more" if len(not_ready) > 5 else ""
        log.warning(
            "%d partition(s) inside the window are not ready and are skipped: %s%s", len(not_ready), shown, more
        )
        if skipped is not None:
            skipped.extend(not_ready)
    incomplete = label_incomplete(job, tasks, window)
    if incomplete:
        left_out = {(n.source, n.partition) for n in incomplete}
        tasks = [t for t in tasks if (t.read.source, t.partition) not in left_out]
        not_ready += incomplete
        for name in sorted({n.source for n in incomplete}):
            count = sum(1 for n in incomplete if n.source == name)
            log.info("%s: %d batch partition(s) left out: labels not complete by %s", name, count, window.end)
    tasks.sort(key=lambda t: t.order_key)
    nothing = partitions_without_tasks(job, window, tasks, not_ready)
    if nothing:
        log.warning(
            "%d ready partition(s) of the window hold nothing to read: %s", len(nothing), empty_partitions_line(nothing)
        )
        if empty is not None:
            empty.extend(nothing)
    if not tasks:
        missing = "; ".join(f"{n.source} {n.partition:%Y-%m-%dT%H}: {n.reason}" for n in not_ready[:5])
        raise NoTrainingDataError(
            f"job {job.name}: no ready data in window {window} (batch lag {lag}; {missing or 'no sources of the mode'})"
        )
    return tasks


def consumed_sources(
    job: JobSpec, tasks: list[DataTask], failed: Collection[str] = frozenset()
) -> dict[str, dict[str, Any]]:
    """What a run reads, per source: its ``type``, ``kind``, ``location`` (path, table URI or topic),
    the partitions (ISO times), the number of tasks, their ``bytes`` (as listed: file sizes, 0 for
    Kafka ranges) and, from :func:`source_versions`, the table ``versions`` and Kafka ``offsets`` ranges.
    Lineage for MLflow's dataset inputs and the asset's metadata.

    ``failed``: ids of tasks given up (read in part or not at all): a source they read gets
    ``incomplete: True``, ``failed_tasks`` (how many) and ``incomplete_partitions`` (those partitions,
    not consumed in full); the entries of the other sources are unchanged."""
    versions = source_versions(tasks)
    out: dict[str, dict[str, Any]] = {}
    incomplete: dict[str, set[str]] = {}
    for task in tasks:
        given_up = task.task_id in failed
        for read in (task.read, *task.right_reads):
            if read.source not in out:
                spec = job.dataset.source(read.source)
                location = next((getattr(spec, a) for a in ("path", "uri", "table", "topic") if hasattr(spec, a)), "")
                out[read.source] = {"type": spec.type, "kind": spec.kind, "location": str(location)}
                out[read.source].update(partitions=set(), tasks=0, bytes=0)
            out[read.source]["partitions"].add(read.partition.isoformat())
            out[read.source]["tasks"] += 1
            out[read.source]["bytes"] += read.size_bytes
            if given_up:
                incomplete.setdefault(read.source, set()).add(read.partition.isoformat())
                out[read.source]["failed_tasks"] = out[read.source].get("failed_tasks", 0) + 1
    for name, entry in out.items():
        entry["partitions"] = sorted(entry["partitions"])
        entry.update(versions.get(name, {}))
        if name in incomplete:
            entry.update(incomplete=True, incomplete_partitions=sorted(incomplete[name]))
    return dict(sorted(out.items()))


def planned_line(job: JobSpec, tasks: list[DataTask], skipped: list[NotReady]) -> str:
    """The run-log line of a planned window: tasks and partitions per source, how many were not ready."""
    consumed = consumed_sources(job, tasks)
    parts = ", ".join(
        f"{name} ({e['kind']}): {e['tasks']} task(s) over {len(e['partitions'])} partition(s)"
        for name, e in consumed.items()
    )
    partitions = sum(len(e["partitions"]) for e in consumed.values())
    return f"planned {len(tasks)} task(s): {partitions} partition(s) ready, {len(skipped)} not ready; {parts or 'none'}"
