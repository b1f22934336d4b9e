"""Data tasks a run gave up (failed ``data.max_attempts`` times): which file or offset range, why, how often.

Below ``data.failed_task_threshold`` a run goes on without a given-up task's rows. :func:`record_failed_tasks`
collects each phase's given-up tasks from its driver onto the run (``TrainingRun.failed_tasks``), says them
in the run log (a warning per task, the first :data:`FAILED_TASKS_LOGGED`, and a count), sends them to
MLflow (the ``failed_tasks`` metric, the ``failed_tasks.json`` artifact) and marks the partitions they
read incomplete in the run's consumed sources (and its MLflow dataset inputs); the result, ``train
--json`` and the training asset's metadata carry them. With ``data.allow_failed_tasks: false`` or
``train --strict`` (:func:`failed_tasks_allowed`) the first task given up fails the run:
:class:`FailedTasksError`, one line naming the files.

Example::

    rows = record_failed_tasks(run, phase, driver, step=trainer.step)
    rows[0]["where"], rows[0]["error"], rows[0]["attempts"]   # '/data/imp/hour=00/part-0.parquet', ...
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from primus_dagster.data import DataDriver, DataTask, read_location
from primus_dagster.spec import JobSpec
from primus_dagster.training.modes import Phase, phase_tasks
from primus_dagster.training.planning import consumed_sources
from primus_dagster.training.run_state import TrainingRequest, TrainingRun

log = logging.getLogger(__name__)

#: Warning lines a phase's given-up tasks get in the run log (then one line counting the rest).
FAILED_TASKS_LOGGED = 20
#: Files (or offset ranges) a :class:`FailedTasksError` names before "... and N more".
FAILED_TASKS_NAMED = 5
#: The MLflow metric (tasks given up so far in the run) and artifact (every row) of the report.
FAILED_TASKS_METRIC = "failed_tasks"
FAILED_TASKS_ARTIFACT = "failed_tasks.json"
_ERROR_CHARS = 500  # of a task's last error, in a row (the run log and the error line say less)
_LINE_ERROR_CHARS = 200


class FailedTasksError(RuntimeError):
    """A data task was given up and the run does not allow it (``data.allow_failed_tasks: false`` or
    ``train --strict``): the message is one line naming the files; ``rows`` are the given-up tasks
    (:func:`failed_task_rows`)."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], total: int, why: str):
        self.rows = [dict(r) for r in rows]
        self.total = total
        super().__init__(
            f"{len(rows)} of {total} data task(s) given up and {why}: {failed_tasks_text(rows, FAILED_TASKS_NAMED)}"
        )


def failed_tasks_allowed(request: TrainingRequest) -> bool:
    """Whether tasks given up below ``data.failed_task_threshold`` let the run go on: the spec's
    ``data.allow_failed_tasks``, unless the request is ``strict`` (``train --strict``)."""
    return request.job.data.allow_failed_tasks and not request.strict


def not_allowed_why(request: TrainingRequest) -> str:
    """What forbids given-up tasks in ``request``, for :class:`FailedTasksError`."""
    return "train --strict allows none" if request.strict else "data.allow_failed_tasks is false"


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def offset_sources(job: JobSpec) -> set[str]:
    """The sources whose tasks are offset ranges (Kafka): :func:`read_location` names their offsets."""
    return {source.name for _, source in job.dataset.all_sources() if source.type == "kafka"}


def failed_task_rows(
    report: Sequence[Mapping[str, Any]], tasks: Mapping[str, DataTask], phase: str, offset_sources: Collection[str]
) -> list[dict[str, Any]]:
    """The driver's failure report (rows of ``DataDriver.failure_report``) as the run reports it: per task
    ``{"phase", "source", "partition", "where", "error", "attempts", "failures", "task_id"}``; ``where``: the
    file (with its row-group range) or, for ``offset_sources`` (Kafka), the topic, partition and offsets;
    ``tasks``: the phase's tasks by id (a task not among them keeps the report's uri)."""
    rows = []
    for entry in report:
        task = tasks.get(str(entry["task_id"]))
        read = task.read if task is not None else None
        rows.append(
            {
                "phase": phase,
                "source": read.source if read is not None else "",
                "partition": read.partition.isoformat() if read is not None else "",
                "where": str(entry["where"])  # one file of a pack, given up alone
                if entry.get("where")
                else read_location(read, offsets=read.source in offset_sources)
                if read is not None
                else str(entry.get("uri") or entry["task_id"]),
                "error": _one_line(str(entry.get("error") or "no error recorded"), _ERROR_CHARS),
                "attempts": int(entry.get("attempts") or 0),
                "failures": int(entry.get("failures") or 0),
                "task_id": str(entry["task_id"]),
            }
        )
    return rows


def failed_task_line(row: Mapping[str, Any]) -> str:
    """One given-up task in a line: where, its source and partition, attempts and the last error.

    >>> failed_task_line({"where": "a.parquet", "source": "imp", "partition": "2026-11-01T00:00:00+00:00",
    ...                   "attempts": 3, "error": "Parquet magic bytes not found"})
    'a.parquet (imp 2026-11-01T00:00:00+00:00): given up after 3 attempt(s): Parquet magic bytes not found'
    """
    at = f" ({row['source']} {row['partition']})" if row.get("source") else ""
    error = _one_line(str(row["error"]), _LINE_ERROR_CHARS)
    return f"{row['where']}{at}: given up after {row['attempts']} attempt(s): {error}"


def failed_tasks_text(rows: Sequence[Mapping[str, Any]], limit: int) -> str:
    """The first ``limit`` given-up tasks (:func:`failed_task_line`) joined by ``"; "``, then
    ``"... and N more"``.

    >>> failed_tasks_text([{"where": "a", "attempts": 1, "error": "x"}, {"where": "b", "attempts": 1, "error": "y"}], 1)
    'a: given up after 1 attempt(s): x; ... and 1 more'
    """
    parts = [failed_task_line(r) for r in rows[:limit]]
    if len(rows) > limit:
        parts.append(f"... and {len(rows) - limit} more")
    return "; ".join(parts)


def run_failed_tasks(run: TrainingRun) -> list[dict[str, Any]]:
    """Every task the run gave up so far, phase by phase."""
    return [row for rows in run.failed_tasks.values() for row in rows]


def record_failed_tasks(run: TrainingRun, phase: Phase, driver: DataDriver, step: int) -> list[dict[str, Any]]:
    """The tasks ``phase``'s driver gave up (module docstring): kept on the run (a phase recorded again,
    after a restart, replaces its rows), logged, sent to MLflow at ``step``, their partitions marked
    incomplete in ``run.consumed``; the phase's rows."""
    report = driver.failure_report()
    kafka = offset_sources(run.job)
    by_id = {t.task_id: t for t in phase_tasks(run.tasks, phase)} if report else {}
    rows = failed_task_rows(report, by_id, phase.name, kafka)
    had = bool(run.failed_tasks.get(phase.name))
    run.failed_tasks[phase.name] = rows
    every = run_failed_tasks(run)
    run.tracker.log_metrics({FAILED_TASKS_METRIC: float(len(every))}, step)
    if rows or had:  # the artifact and the lineage follow the run's report
        run.tracker.log_dict({"failed_tasks": every}, FAILED_TASKS_ARTIFACT)
        run.consumed = consumed_sources(run.job, run.tasks, {row["task_id"] for row in every})
    if not rows:
        return rows
    for row in rows[:FAILED_TASKS_LOGGED]:
        log.warning("data task given up, phase %s: %s", phase.name, failed_task_line(row))
    more = f", {len(rows) - FAILED_TASKS_LOGGED} not listed above" if len(rows) > FAILED_TASKS_LOGGED else ""
    log.warning(
        "phase %s: %d of %d data task(s) given up, their rows not trained%s; every one is in the result's "
        "failed_tasks and the MLflow artifact %s, their partitions are marked incomplete",
        phase.name,
        len(rows),
        sum(task.units for task in by_id.values()),  # a pack counts as its files, as the threshold does
        more,
        FAILED_TASKS_ARTIFACT,
    )
    run.tracker.log_source_inputs({name: entry for name, entry in run.consumed.items() if entry.get("incomplete")})
    return rows
