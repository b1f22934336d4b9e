"""The driver's API as executors and readers see it (in process, or over Flight actions).

``DataDriver`` implements it in process; ``DriverClient`` implements it over Arrow Flight
``DoAction`` calls to a ``DriverServer``. Executors and readers are written against this
protocol only, so they run the same against either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from primus_dagster.data.tasks import BatchId, DataTask


@dataclass(frozen=True)
class Lease:
    """A task handed to an executor: run it, skipping the batches already claimed."""

    task: DataTask
    attempt: int
    deadline: float  # driver clock (seconds); heartbeat before it
    claimed_rows: tuple[int, ...] = ()  # first_row of batches already claimed: do not serve them
    place: int = 0  # the task's place among its kind's tasks in the plan's order (the order they were added)


@dataclass(frozen=True)
class MemberFailure:
    """A file of a pack failed (:meth:`DriverAPI.fail`): ``uri``, whether a retry may help, and
    ``served_members`` -- the batches the attempt handed out hold rows of the pack's first
    ``served_members`` files only (:class:`~primus_dagster.data.sources.base.PackFailure`)."""

    uri: str
    retryable: bool = True
    served_members: int = 0


@dataclass(frozen=True)
class Completion:
    """A task an executor finished serving: :meth:`DriverAPI.complete`'s arguments, sent with its
    next :meth:`DriverAPI.lease` (one round trip per task instead of two).

    >>> Completion("s:part-0.parquet", rows=99_000, batches=2).quality is None
    True
    """

    task_id: str
    rows: int
    batches: int
    quality: dict[str, int] | None = None
    places: dict[str, dict[str, int]] | None = None
    quality_columns: dict[str, list[str]] | None = None  # rule -> the native columns whose values broke it


def quality_columns_from_dict(data: dict[str, Any]) -> dict[str, list[str]]:
    """``{rule: [native column]}`` from its JSON form (a completion, a snapshot)."""
    return {str(rule): [str(column) for column in columns] for rule, columns in dict(data).items()}


#: Prefix of the heartbeat metrics ``buffered_rows.<kind>``: rows of that kind in the executor's serving buffers.
BUFFERED_ROWS = "buffered_rows."


@dataclass
class ExecutorReport:
    """What an executor tells the driver with each heartbeat (also the scaling metrics)."""

    executor_id: str
    address: str  # Flight location of its dataset server, e.g. grpc://127.0.0.1:PORT
    running: list[str] = field(default_factory=list)  # task ids it is working on
    # rows_per_s, buffer_fill, cpu, rss_bytes, buffered_rows.<kind>
    metrics: dict[str, float] = field(default_factory=dict)


class DriverAPI(Protocol):
    def lease(self, executor_id: str, max_tasks: int = 1, completed: Sequence[Completion] = ()) -> list[Lease]:
        """Up to ``max_tasks`` pending tasks, in chronological order, now running for this executor;
        the tasks in ``completed`` are completed first (as by :meth:`complete`, in order)."""

    def heartbeat(self, report: ExecutorReport) -> dict[str, Any]:
        """Extend the leases of ``report.running``; returns {"cancel": [task ids no longer owned], "done": bool}."""

    def complete(
        self,
        executor_id: str,
        task_id: str,
        rows: int,
        batches: int,
        quality: dict[str, int] | None = None,
        places: dict[str, dict[str, int]] | None = None,
        quality_columns: dict[str, list[str]] | None = None,
    ) -> None:
        """The executor has served every batch of the task. ``rows`` / ``batches`` count the task's
        WHOLE output, including the batches skipped because they were in ``Lease.claimed_rows``
        (the driver uses them to decide, at a barrier, whether every batch was consumed);
        ``quality``: its rows touched per data-quality rule (repaired, dropped), summed by the driver;
        ``places``: the same per file of a pack (``{uri: {rule: rows}}``); ``quality_columns``: the native
        columns whose values broke each rule (``{rule: [column]}``)."""

    def fail(
        self, executor_id: str, task_id: str, error: str, retryable: bool = True, member: MemberFailure | None = None
    ) -> None:
        """The task failed on this executor (retried until max attempts; at once failed when not ``retryable``);
        ``member``: it was one file of a pack (that file may be given up alone)."""

    def release(self, executor_id: str, task_ids: list[str]) -> list[str]:
        """The executor stops without finishing these tasks: hand them out again now (no failure)."""

    def claim(self, trainer_id: str, batch: BatchId) -> bool:
        """True when this is the first claim of ``batch`` (the reader yields it), else False (drop it)."""

    def barrier(self, trainer_id: str, consumed: list[BatchId], barrier_id: int) -> dict[str, Any] | None:
        """A trainer's consumed batches since its last barrier. When every trainer of the group
        has reported ``barrier_id``, the driver returns (and keeps) the snapshot taken at it."""

    def executors(self) -> dict[str, ExecutorReport]:
        """Live executors (heartbeat within the lease time) and their last reports."""

    def status(self) -> dict[str, Any]:
        """Counts per state, failed-task report, whether all tasks are done, whether the task set failed."""

    def task_order(self, trainer_id: str, kind: str, start: int = 0, limit: int = 64) -> dict[str, Any]:
        """The plan's order of ``kind``'s tasks from place ``start``, each with whether it is sealed (no
        batch of it will be claimed any more); records ``start`` as this reader's place (a deterministic
        reader: ``data.deterministic``)."""
