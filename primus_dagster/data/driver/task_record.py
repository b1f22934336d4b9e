"""The driver's per-task record, task states, the failure errors of the task set and snapshot entries.

Kept apart from :mod:`.state` so the state machine reads on its own; nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

from primus_dagster.data.driver.ledger import RowSet
from primus_dagster.data.tasks import BatchId, DataTask

NEW, PENDING, RUNNING, SUCCEEDED, FAILED = "new", "pending", "running", "succeeded", "failed"
STATES: tuple[str, ...] = (NEW, PENDING, RUNNING, SUCCEEDED, FAILED)
SNAPSHOT_FORMAT = "primus-data-driver/1"


class DataAbortedError(RuntimeError):
    """The run's tasks were failed from outside the task table (:meth:`DataDriver.abort`): the reason says why."""


class DataFailedError(RuntimeError):
    """More than ``failed_task_threshold`` of the run's tasks failed; ``report`` lists each failed task.

    Example::

        try:
            driver.raise_if_failed()
        except DataFailedError as err:
            for row in err.report:  # {"task_id", "uri", "attempts", "failures", "error"}
                print(row["task_id"], row["error"])
    """

    def __init__(self, report: list[dict[str, Any]], total: int, threshold: float):
        self.report = report
        self.total = total
        self.threshold = threshold
        lines = [
            f"{r['task_id']} (uri {r['uri']}): failed {r['failures']}x in {r['attempts']} attempts, "
            f"last error: {r['error']}"
            for r in report[:20]
        ]
        if len(report) > 20:
            lines.append(f"... and {len(report) - 20} more")
        super().__init__(
            f"data failed: {len(report)} of {total} tasks failed (threshold {threshold:.2%}):\n  " + "\n  ".join(lines)
        )


class TaskRecord:
    """One row of the task table (``__slots__``: millions of them)."""

    __slots__ = (
        "attempts",
        "backup",
        "batches",
        "claimed",
        "consumed",
        "consumed_rows",
        "deadline",
        "error",
        "failures",
        "given_up",
        "member_failures",
        "owner",
        "rows",
        "seq",
        "served_members",
        "started",
        "state",
        "task",
    )

    def __init__(self, task: DataTask) -> None:
        self.task = task
        self.state = NEW
        self.attempts = 0  # times handed out
        self.failures = 0  # failed attempts (fail() or lease expiry); max_attempts of them fail the task
        self.owner: str | None = None  # executor of the current (or last) attempt
        self.backup: str | None = None  # executor running a backup copy of a straggling attempt
        self.started = 0.0  # clock when the current attempt was leased
        self.deadline = 0.0
        self.error: str | None = None
        self.rows = 0  # the task's whole output, reported by complete()
        self.batches = 0
        self.claimed: RowSet | None = None  # first_rows claimed by readers
        self.consumed: RowSet | None = None  # first_rows trainers reported consumed at barriers
        self.consumed_rows = 0
        self.seq = -1  # position among its kind's tasks in the order they were added (the plan's order)
        # A pack: its files given up (uri -> [error, failures]), the failures of its other files, and how many of
        # its (remaining) first files an ended attempt may have served rows of (docs/data_plane.md, Packs).
        self.given_up: dict[str, list[Any]] | None = None
        self.member_failures: dict[str, int] | None = None
        self.served_members = 0

    @property
    def units(self) -> int:
        """The files it reads (a pack: its files): what the failure threshold counts."""
        return self.task.units

    def leased_task(self) -> DataTask:
        """The task to hand out: a pack without its given-up files (the same task id)."""
        return self.task.without(self.given_up) if self.given_up else self.task

    def members_left(self) -> list[str]:
        """A pack's files not given up, in order (what an attempt reads)."""
        given_up = self.given_up or {}
        return [uri for uri, _, _ in self.task.read.members if uri not in given_up]

    def ended(self) -> None:
        """An attempt ended some other way than a file failing before it served any of that file's rows: it
        may have served rows of any file of the pack."""
        if self.task.read.members:
            self.served_members = len(self.task.read.members)

    def claim(self, first_row: int) -> bool:
        if self.claimed is None:
            self.claimed = RowSet()
        return self.claimed.add(first_row)

    def consume(self, batch: BatchId) -> bool:
        """Record a consumed batch (also claimed); True when it was not recorded before."""
        self.claim(batch.first_row)
        if self.consumed is None:
            self.consumed = RowSet()
        if not self.consumed.add(batch.first_row):
            return False
        self.consumed_rows += batch.rows
        return True

    @property
    def sealed(self) -> bool:
        """No batch of it will be claimed any more: failed, or succeeded with every batch claimed."""
        if self.state == FAILED:
            return True
        return self.state == SUCCEEDED and (0 if self.claimed is None else len(self.claimed)) >= self.batches

    @property
    def consumed_done(self) -> bool:
        """Succeeded and every batch of its output consumed (counts must match exactly: conservative)."""
        if self.state != SUCCEEDED:
            return False
        count = 0 if self.consumed is None else len(self.consumed)
        return count == self.batches and self.consumed_rows == self.rows

    def failure_row(self) -> dict[str, Any]:
        return {
            "task_id": self.task.task_id,
            "uri": self.task.read.uri,
            "attempts": self.attempts,
            "failures": self.failures,
            "error": self.error,
        }

    def given_up_rows(self) -> list[dict[str, Any]]:
        """A row per file of a pack given up, as :meth:`failure_row` (``uri`` and ``where``: the file; its
        attempts: those that read it and failed)."""
        return [
            {
                "task_id": self.task.task_id,
                "uri": uri,
                "where": uri,
                "attempts": int(failures),
                "failures": int(failures),
                "error": error,
            }
            for uri, (error, failures) in (self.given_up or {}).items()
        ]

    def describe(self) -> dict[str, Any]:
        """Everything about the task but its payload (for tests, debugging, the UI)."""
        return {
            "task_id": self.task.task_id,
            "state": self.state,
            "attempts": self.attempts,
            "failures": self.failures,
            "owner": self.owner,
            "backup": self.backup,
            "deadline": self.deadline,
            "error": self.error,
            "rows": self.rows,
            "batches": self.batches,
            "claimed": [] if self.claimed is None else self.claimed.to_list(),
            "consumed": [] if self.consumed is None else self.consumed.to_list(),
            "consumed_rows": self.consumed_rows,
            "consumed_done": self.consumed_done,
            "given_up": dict(self.given_up or {}),
            "member_failures": dict(self.member_failures or {}),
            "served_members": self.served_members,
        }

    def to_snapshot(self) -> dict[str, Any]:
        out = {
            "task": self.task.to_dict(),
            "state": self.state,
            "attempts": self.attempts,
            "failures": self.failures,
            "error": self.error,
            "rows": self.rows,
            "batches": self.batches,
            "consumed": [] if self.consumed is None else self.consumed.to_list(),
            "consumed_rows": self.consumed_rows,
        }
        if self.task.read.members:
            out.update(
                given_up=dict(self.given_up or {}),
                member_failures=dict(self.member_failures or {}),
                served_members=self.served_members,
            )
        return out

    @classmethod
    def from_snapshot(cls, entry: dict[str, Any]) -> TaskRecord:
        """The record as of the barrier: claims = consumed, running → pending, succeeded but not fully
        consumed → pending (see the exactly-once argument in :mod:`.state`)."""
        rec = cls(DataTask.from_dict(entry["task"]))
        rec.attempts = int(entry.get("attempts", 0))
        rec.failures = int(entry.get("failures", 0))
        rec.error = entry.get("error")
        rec.rows = int(entry.get("rows", 0))
        rec.batches = int(entry.get("batches", 0))
        consumed = entry.get("consumed") or []
        if consumed:
            rec.consumed = RowSet(consumed)
            rec.claimed = rec.consumed.copy()
        rec.consumed_rows = int(entry.get("consumed_rows", 0))
        state = entry.get("state", NEW)
        if state not in STATES:
            raise ValueError(f"snapshot task {rec.task.task_id}: unknown state {state!r}")
        rec.state = state
        rec.given_up = {str(uri): list(row) for uri, row in (entry.get("given_up") or {}).items()} or None
        rec.member_failures = {str(uri): int(n) for uri, n in (entry.get("member_failures") or {}).items()} or None
        rec.served_members = int(entry.get("served_members", 0))
        if state == RUNNING or (state == SUCCEEDED and not rec.consumed_done):
            rec.state = PENDING
            rec.ended()  # the attempt running at the barrier may have served any of its rows
        return rec
