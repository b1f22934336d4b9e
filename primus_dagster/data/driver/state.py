"""The central data driver, in process: task table, leases, retries, claim ledger, barriers, snapshots.

:class:`DataDriver` implements :class:`~primus_dagster.data.driver.api.DriverAPI`. It is pure logic (no I/O
but :meth:`DataDriver.save` / :meth:`DataDriver.load`), takes its clock as an argument and is thread-safe (one
re-entrant lock; :class:`~.server.DriverServer` serves it over Flight). Task states, leases, and why delivery
is exactly once across failures and restores: ``docs/data_plane.md``.

Example::

    driver = DataDriver(lease_s=30, trainers=1)
    driver.add_tasks(plan.tasks)
    leases = driver.lease("exec-0", max_tasks=2)          # an executor's next tasks, in order
    driver.claim("trainer-0", batch_id)                   # True: the first claim, the reader yields it
    snap = driver.barrier("trainer-0", [batch_id], 1)     # all trainers reported: snapshot S_1
    driver = DataDriver.restore(snap)                     # serves again what S_1 had not consumed

``deterministic=True`` (``data.deterministic``): tasks are handed out in the order they were added (the
plan's order, per kind), and -- once a reader reports its place in that order with :meth:`DataDriver.task_order`
-- only within ``order_window`` tasks of the slowest reporting reader, which is what bounds the reorder
buffer of a deterministic :class:`~primus_dagster.data.reader.RemoteReader` (``docs/data_plane.md``).
"""

from __future__ import annotations

import functools
import heapq
import json
import logging
import os
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from primus_dagster.data.driver.api import (
    BUFFERED_ROWS,
    Completion,
    ExecutorReport,
    Lease,
    MemberFailure,
    quality_columns_from_dict,
)
from primus_dagster.data.driver.barrier import BarrierTracker
from primus_dagster.data.driver.delivery import DeliveryWatch
from primus_dagster.data.driver.snapshot import read_snapshot, save_snapshot
from primus_dagster.data.driver.task_record import (
    FAILED,
    NEW,
    PENDING,
    RUNNING,
    SNAPSHOT_FORMAT,
    STATES,
    SUCCEEDED,
    DataAbortedError,
    DataFailedError,
    TaskRecord,
)
from primus_dagster.data.tasks import BatchId, DataTask, read_location
from primus_dagster.spec import DataPlaneSpec

log = logging.getLogger(__name__)
P = ParamSpec("P")
_DURATION_WINDOW = 256  # completed tasks the straggler median looks at
_MIN_DURATIONS = 5  # completions before any task counts as a straggler
R = TypeVar("R")
_BUSY = frozenset((NEW, PENDING, RUNNING))
_QUEUED = frozenset((NEW, PENDING))
#: Kinds whose data arrives by itself (push: Kafka): rows queued at the driver have arrived and wait
#: for a loader, so they count into the kind's serving buffer. A batch backlog (pull) does not.
PUSH_KINDS = ("stream",)


def _count(rows: Any) -> int:
    return 0 if rows is None else len(rows)


def _places(places: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Quality counts per file (``{uri: {rule: rows}}``) as plain ints."""
    return {str(where): {str(rule): int(n) for rule, n in counts.items()} for where, counts in places.items()}


def _preview(rec: TaskRecord, limit: int = 8) -> str:
    """The first claimed first rows of a task, for messages."""
    rows = [] if rec.claimed is None else rec.claimed.to_list()
    return "none" if not rows else ", ".join(map(str, rows[:limit])) + (" ..." if len(rows) > limit else "")


OrderKey = tuple[str, str, str]
#: ``(kinds with a task to lease, in hand-out order; running tasks per kind; rows buffered per kind
#: at the executors) -> kind to lease next``: the mixture prioritisation's loading side
#: (``primus_dagster.training.priority.LoadingPriority``).
LoadingPolicy = Callable[[Sequence[str], Mapping[str, int], Mapping[str, float]], str]


def _api(method: Callable[Concatenate[DataDriver, P], R]) -> Callable[Concatenate[DataDriver, P], R]:
    """Run under the driver's lock, after expiring overdue leases."""

    @functools.wraps(method)
    def wrapper(self: DataDriver, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            self._expire_locked()
            return method(self, *args, **kwargs)

    return wrapper


class DataDriver:
    """The task table and ledgers of one run's tasks (states and guarantees: ``docs/data_plane.md``).

    Example::

        driver = DataDriver(lease_s=30, trainers=2, clock=fake_clock)
        driver.add_tasks(plan.tasks)
        leases = driver.lease("exec-1", max_tasks=2)
        driver.heartbeat(ExecutorReport("exec-1", "grpc://127.0.0.1:9000", running=[...]))
        driver.raise_if_failed()
    """

    def __init__(
        self,
        max_attempts: int = 3,
        failed_task_threshold: float = 0.05,
        lease_s: float = 60.0,
        trainers: int = 1,
        clock: Callable[[], float] = time.monotonic,
        *,
        backup_after: float = 0.0,
        pending_window: int = 1024,
        loading_policy: LoadingPolicy | None = None,
        deterministic: bool = False,
        order_window: int = 16,
    ):
        if max_attempts < 1 or not 0 <= failed_task_threshold <= 1 or lease_s <= 0 or trainers < 1:
            raise ValueError(
                f"bad driver config: max_attempts={max_attempts}, failed_task_threshold="
                f"{failed_task_threshold}, lease_s={lease_s}, trainers={trainers}"
            )
        self.max_attempts = max_attempts
        self.failed_task_threshold = failed_task_threshold
        self.lease_s = float(lease_s)
        self.trainers = trainers
        if backup_after < 0:
            raise ValueError(
                f"bad driver config: backup_after={backup_after} (a multiple of the median task time, >= 0)"
            )
        self.backup_after = float(backup_after)
        self._durations: deque[float] = deque(maxlen=_DURATION_WINDOW)  # seconds of recent first-copy completions
        self.pending_window = max(1, pending_window)
        if order_window < 1:
            raise ValueError(f"bad driver config: order_window={order_window} (tasks ahead of a reader, >= 1)")
        self.deterministic = bool(deterministic)
        self.order_window = int(order_window)
        self._order: dict[str, list[str]] = {}  # per kind, task ids in the order they were added
        self._cursors: dict[str, dict[str, int]] = {}  # reader -> kind -> its place in _order (task_order)
        self.source_versions: dict[str, Any] = {}
        self._clock = clock
        self._lock = threading.RLock()
        self._tasks: dict[str, TaskRecord] = {}
        self._planned = False  # tasks were added (possibly none): from then on an empty task set is done
        self._counts = dict.fromkeys(STATES, 0)
        self._busy_by_kind: dict[str, int] = {}  # new + pending + running tasks per kind (batch / stream)
        self._running_by_kind: dict[str, int] = {}
        self._queued_rows: dict[str, int] = {}  # rows of the new + pending tasks per kind (known row counts)
        # Per kind, heaps of DataTask.order_key (last item: task id); ``pending_window`` queued per kind.
        self._new: dict[str, list[OrderKey]] = {}
        self._pending: dict[str, list[OrderKey]] = {}
        self.loading_policy = loading_policy
        self._deadlines: list[tuple[float, int, str]] = []  # (deadline, attempt, task id); lazily updated
        self._failed_ids: set[str] = set()
        self._given_up_ids: set[str] = set()  # packs with a file given up
        # The failure threshold counts files (a pack: its files), given up one by one or with their task.
        self._units = 0
        self._failed_units = 0
        self._executors: dict[str, tuple[ExecutorReport, float]] = {}
        self._barriers = BarrierTracker()
        self._delivery = DeliveryWatch()
        self._aborted: str | None = None
        self._quality: dict[str, dict[str, int]] = {}  # succeeded task -> rows touched per data-quality rule
        self._quality_places: dict[str, dict[str, dict[str, int]]] = {}  # a succeeded pack's, per file
        self._quality_columns: dict[str, dict[str, list[str]]] = {}  # succeeded task -> rule -> native columns
        self._quality_total: Counter[str] = Counter()
        self._stats = {
            "rows": 0,
            "batches": 0,
            "claimed_batches": 0,
            "consumed_batches": 0,
            "consumed_done": 0,
            "backups_started": 0,
            "backups_won": 0,
        }

    @classmethod
    def for_job(cls, data: DataPlaneSpec, trainers: int = 1, loading_policy: LoadingPolicy | None = None) -> DataDriver:
        """A driver configured by a job's ``data`` section."""
        return cls(
            max_attempts=data.max_attempts,
            failed_task_threshold=data.failed_task_threshold,
            lease_s=data.lease.total_seconds(),
            trainers=trainers,
            backup_after=data.backup_after,
            loading_policy=loading_policy,
            deterministic=data.deterministic,
        )

    # -- task table -------------------------------------------------------------------------
    def _set_state(self, rec: TaskRecord, state: str) -> None:
        self._counts[rec.state] -= 1
        self._counts[state] += 1
        kind = rec.task.kind
        busy = (state in _BUSY) - (rec.state in _BUSY)
        if busy:
            self._busy_by_kind[kind] = self._busy_by_kind.get(kind, 0) + busy
        running = (state == RUNNING) - (rec.state == RUNNING)
        if running:
            self._running_by_kind[kind] = self._running_by_kind.get(kind, 0) + running
        queued = (state in _QUEUED) - (rec.state in _QUEUED)
        if queued and rec.task.read.rows:
            self._queued_rows[kind] = self._queued_rows.get(kind, 0) + queued * rec.task.read.rows
        rec.state = state
        if state == FAILED:
            self._failed_ids.add(rec.task.task_id)
            self._failed_units += rec.units - len(rec.given_up or ())

    def _key(self, rec: TaskRecord) -> OrderKey:
        """The hand-out heap key: the task's chronological ``order_key``, or (deterministic) its place
        in its kind's order of addition."""
        if self.deterministic:
            return (f"{rec.seq:012d}", rec.task.stream, rec.task.task_id)
        return rec.task.order_key

    def _insert(self, rec: TaskRecord) -> None:
        self._tasks[rec.task.task_id] = rec
        order = self._order.setdefault(rec.task.kind, [])
        rec.seq = len(order)
        order.append(rec.task.task_id)
        self._counts[rec.state] += 1
        if rec.state in _BUSY:
            self._busy_by_kind[rec.task.kind] = self._busy_by_kind.get(rec.task.kind, 0) + 1
        if rec.state == RUNNING:
            self._running_by_kind[rec.task.kind] = self._running_by_kind.get(rec.task.kind, 0) + 1
        if rec.state in _QUEUED and rec.task.read.rows:
            self._queued_rows[rec.task.kind] = self._queued_rows.get(rec.task.kind, 0) + rec.task.read.rows
        if rec.state == NEW:
            heapq.heappush(self._new.setdefault(rec.task.kind, []), self._key(rec))
        elif rec.state == PENDING:
            self._push_pending(rec)
        elif rec.state == FAILED:
            self._failed_ids.add(rec.task.task_id)
        self._units += rec.units
        self._failed_units += rec.units if rec.state == FAILED else len(rec.given_up or ())
        if rec.given_up:
            self._given_up_ids.add(rec.task.task_id)
        stats = self._stats  # non-zero only for restored records
        stats["claimed_batches"] += 0 if rec.claimed is None else len(rec.claimed)
        stats["consumed_batches"] += 0 if rec.consumed is None else len(rec.consumed)
        if rec.state == SUCCEEDED:
            stats["rows"], stats["batches"] = stats["rows"] + rec.rows, stats["batches"] + rec.batches
            stats["consumed_done"] += rec.consumed_done

    def _get(self, task_id: str) -> TaskRecord:
        if (rec := self._tasks.get(task_id)) is None:
            raise KeyError(f"unknown data task {task_id!r}")
        return rec

    @_api
    def add_tasks(self, tasks: Iterable[DataTask]) -> int:
        """Register tasks (idempotent by task id: known ids are ignored); returns how many were new."""
        before = len(self._tasks)
        for task in tasks:
            if task.task_id not in self._tasks:
                self._insert(TaskRecord(task))
        self._planned = True
        return len(self._tasks) - before

    def _push_pending(self, rec: TaskRecord) -> None:
        heapq.heappush(self._pending.setdefault(rec.task.kind, []), self._key(rec))

    def _promote(self, kind: str) -> None:
        """Queue new tasks of ``kind``: keep ``pending_window`` of them queued, and never leave an
        earlier new task of the kind behind."""
        new, pending = self._new.get(kind), self._pending.setdefault(kind, [])
        while new and (len(pending) < self.pending_window or new[0] < pending[0]):
            key = heapq.heappop(new)
            rec = self._tasks[key[-1]]
            if rec.state == NEW:
                self._set_state(rec, PENDING)
                heapq.heappush(pending, key)

    def _pending_head(self, kind: str) -> OrderKey | None:
        """The order key of ``kind``'s next pending task (stale heap entries dropped), or None."""
        self._promote(kind)
        pending = self._pending[kind]
        while pending:
            if self._tasks[pending[0][-1]].state == PENDING:  # skip stale entries (e.g. a late complete())
                return pending[0]
            heapq.heappop(pending)
            self._promote(kind)
        return None

    def _next_pending(self) -> TaskRecord | None:
        """The next task to lease: the chronologically first pending one, or, with a
        ``loading_policy``, the first one of the kind it picks."""
        heads = {kind: head for kind in sorted({*self._new, *self._pending}) if (head := self._pending_head(kind))}
        if self.deterministic:  # the heads are each kind's first pending task in the plan's order
            heads = {kind: head for kind, head in heads.items() if self._in_window(kind, self._tasks[head[-1]].seq)}
        if not heads:
            return None
        order = sorted(heads, key=lambda kind: heads[kind])  # kinds by their first task
        kind = order[0]
        if self.loading_policy is not None and len(order) > 1:
            kind = self.loading_policy(order, dict(self._running_by_kind), self._serving_rows_locked())
            if kind not in heads:
                raise ValueError(f"loading policy picked kind {kind!r}; kinds with a task to lease: {order}")
        return self._tasks[heapq.heappop(self._pending[kind])[-1]]

    def _in_window(self, kind: str, seq: int) -> bool:
        """Task ``seq`` of ``kind`` lies within ``order_window`` of every reporting reader's place in the
        order (True while no reader has reported)."""
        if not self._cursors:
            return True
        frontier = min(cursor.get(kind, 0) for cursor in self._cursors.values())
        return seq < frontier + self.order_window

    def _retry_or_fail(self, rec: TaskRecord, error: str, retryable: bool = True) -> None:
        rec.failures, rec.error = rec.failures + 1, error
        if not retryable or rec.failures >= self.max_attempts:
            self._set_state(rec, FAILED)
        else:
            self._set_state(rec, PENDING)
            self._push_pending(rec)

    # -- executors --------------------------------------------------------------------------
    @_api
    def lease(self, executor_id: str, max_tasks: int = 1, completed: Sequence[Completion] = ()) -> list[Lease]:
        """Up to ``max_tasks`` tasks in chronological order, now running for ``executor_id``; the tasks in
        ``completed`` are completed first (:meth:`complete`: an executor's finished task rides with its next lease)."""
        for done in completed:
            self.complete(
                executor_id, done.task_id, done.rows, done.batches, done.quality, done.places, done.quality_columns
            )
        report = self._executors.get(executor_id, (ExecutorReport(executor_id, ""), 0.0))[0]
        self._executors[executor_id] = (report, self._clock())  # seen (alive) now
        if self._tasks_failed():
            return []
        out: list[Lease] = []
        deadline = self._clock() + self.lease_s
        while len(out) < max_tasks:
            rec = self._next_pending()
            if rec is None:
                break
            self._set_state(rec, RUNNING)
            rec.attempts += 1
            rec.owner, rec.backup = executor_id, None
            rec.deadline, rec.started = deadline, self._clock()
            heapq.heappush(self._deadlines, (deadline, rec.attempts, rec.task.task_id))
            out.append(self._lease_of(rec, deadline))
        if not out and (straggler := self._straggler(executor_id)) is not None:
            straggler.backup = executor_id
            self._stats["backups_started"] += 1
            out.append(self._lease_of(straggler, deadline))
        return out

    @staticmethod
    def _lease_of(rec: TaskRecord, deadline: float) -> Lease:
        claimed = () if rec.claimed is None else rec.claimed.to_tuple()
        place = max(rec.seq, 0)
        return Lease(task=rec.leased_task(), attempt=rec.attempts, deadline=deadline, claimed_rows=claimed, place=place)

    def _straggler(self, executor_id: str) -> TaskRecord | None:
        """The longest-running task without a backup, held by another executor, running longer than
        ``backup_after`` times the median task time (None when there is none, or backups are off)."""
        if not self.backup_after or len(self._durations) < _MIN_DURATIONS:
            return None
        limit = self.backup_after * statistics.median(self._durations)
        now = self._clock()
        running = (
            rec
            for rec in self._tasks.values()
            if rec.state == RUNNING and rec.backup is None and rec.owner != executor_id and now - rec.started > limit
        )
        return min(running, key=lambda rec: rec.started, default=None)

    @_api
    def heartbeat(self, report: ExecutorReport) -> dict[str, Any]:
        """Extend the leases of ``report.running`` it still owns; returns ``{"cancel": [task ids it lost],
        "done": bool, "failed": bool, "deadline": float}``."""
        now = self._clock()
        self._executors[report.executor_id] = (report, now)
        deadline = now + self.lease_s
        cancel: list[str] = []
        for task_id in report.running:
            rec = self._tasks.get(task_id)
            if rec is None or rec.state != RUNNING or report.executor_id not in (rec.owner, rec.backup):
                cancel.append(task_id)
            elif rec.owner == report.executor_id:
                rec.deadline = deadline  # the heap entry is moved lazily by _expire_locked
        return {"cancel": cancel, "done": self._done(), "failed": self._tasks_failed(), "deadline": deadline}

    @_api
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
        """The task's output is fully served; ``rows``/``batches`` count its WHOLE output, batches
        skipped because they were already claimed included; ``quality``: its rows touched per
        data-quality rule (see :meth:`quality_counts`), ``places``: the same per file of a pack,
        ``quality_columns``: the native columns whose values broke each rule. A late
        completion by an executor that lost the lease is accepted too (same deterministic output); one
        for a failed task is ignored."""
        rec = self._get(task_id)
        if rec.state in (SUCCEEDED, FAILED):
            return
        rec.ended()
        if rec.state == RUNNING:
            if executor_id == rec.owner and rec.backup is None:
                self._durations.append(self._clock() - rec.started)
            elif executor_id == rec.backup:
                self._stats["backups_won"] += 1
        self._set_state(rec, SUCCEEDED)
        rec.owner, rec.backup, rec.rows, rec.batches = executor_id, None, int(rows), int(batches)
        stats = self._stats
        stats["rows"], stats["batches"] = stats["rows"] + rec.rows, stats["batches"] + rec.batches
        stats["consumed_done"] += rec.consumed_done
        if quality:
            self._quality[task_id] = {str(rule): int(n) for rule, n in quality.items()}
            self._quality_total.update(self._quality[task_id])
        if places:
            self._quality_places[task_id] = _places(places)
        if quality_columns:
            self._quality_columns[task_id] = quality_columns_from_dict(quality_columns)
        self._delivery.completed(executor_id, task_id, _count(rec.claimed), rec.batches, self._clock())

    def _reopen_undelivered(self, now: float) -> list[str]:
        """Completed tasks with unclaimed batches, pending again: at once when their executor died (no
        failure counted), and -- the end-of-run audit -- when every task has finished and no batch was
        claimed for ``lease_s`` (the unclaimed batches were dropped on the way: a failure is counted, so
        a task whose batches keep getting lost fails by name after ``max_attempts``)."""
        dead = {eid for eid, (_, seen) in self._executors.items() if seen < now - self.lease_s}
        reopened = self._delivery.orphans(dead) if dead else []
        for task_id in reopened:
            rec = self._tasks[task_id]
            self._reopen(rec, f"executor {rec.owner} died before all batches were claimed; reopened", failure=False)
        if self._busy():
            return reopened
        for task_id in self._delivery.stalled(now, self.lease_s):
            rec = self._tasks[task_id]
            claimed = _count(rec.claimed)
            error = (
                f"{rec.batches - claimed} of {rec.batches} batches (task {task_id}, {rec.task.read.uri}) were served "
                f"by executor {rec.owner} but never claimed by a trainer: no claim for {self.lease_s:g}s after every "
                f"task finished (claimed first rows: {_preview(rec)})"
            )
            log.warning("delivery audit: %s; serving them again", error)
            self._reopen(rec, error, failure=True)
            reopened.append(task_id)
        return reopened

    def _reopen(self, rec: TaskRecord, error: str, *, failure: bool) -> None:
        """A succeeded task back to pending (or failed, when ``failure`` is its last): its counts leave the
        totals, the re-run reports them again and skips the claimed batches."""
        stats = self._stats
        stats["rows"], stats["batches"] = stats["rows"] - rec.rows, stats["batches"] - rec.batches
        self._quality_total.subtract(self._quality.pop(rec.task.task_id, {}))
        self._quality_places.pop(rec.task.task_id, None)
        self._quality_columns.pop(rec.task.task_id, None)
        if failure:
            self._retry_or_fail(rec, error)
            return
        rec.error = error
        self._set_state(rec, PENDING)
        self._push_pending(rec)

    @_api
    def fail(
        self, executor_id: str, task_id: str, error: str, retryable: bool = True, member: MemberFailure | None = None
    ) -> None:
        """Attempt failed: back to pending, or failed after ``max_attempts`` failures (at once when not
        ``retryable``: a schema, type or data-quality failure). Ignored when ``executor_id`` no longer
        holds the task (its lost lease was already counted). ``member``: one file of a pack failed; that
        file's failures are counted instead, and after ``max_attempts`` of them (at once when not
        retryable) it is given up alone and the pack goes on without it -- unless an attempt may have
        served rows of it or of a later file, then the pack is given up (``docs/data_plane.md``, Packs)."""
        rec = self._get(task_id)
        if rec.state != RUNNING:
            return
        pack = member is not None and bool(rec.task.read.members)
        if member is not None and pack:
            rec.served_members = max(rec.served_members, member.served_members)
        else:
            rec.ended()
        where = f"executor {executor_id}, attempt {rec.attempts}"
        if executor_id == rec.backup:
            rec.backup = None  # the original copy goes on
        elif executor_id == rec.owner:
            if rec.backup is not None:
                self._promote_backup(rec)
            elif member is not None and pack:
                self._member_failed(rec, member, f"{error} ({where})")
            else:
                self._retry_or_fail(rec, f"{error} ({where})", retryable)

    def _member_failed(self, rec: TaskRecord, member: MemberFailure, error: str) -> None:
        """File ``member.uri`` of the pack ``rec`` failed (its owner's attempt, no other copy running)."""
        left = rec.members_left()
        if member.uri not in left:  # not a file it reads: the pack failed
            rec.ended()
            self._retry_or_fail(rec, error, member.retryable)
            return
        failures = rec.member_failures = rec.member_failures or {}
        failures[member.uri] = failures.get(member.uri, 0) + 1
        if member.retryable and failures[member.uri] < self.max_attempts:
            rec.error = error  # read again; the pack's own failures are not counted
            self._set_state(rec, PENDING)
            self._push_pending(rec)
            return
        if rec.served_members > left.index(member.uri):
            # Served batches may hold rows of it or of a later file: without it, their ids would name other rows.
            self._retry_or_fail(
                rec,
                f"{error}; an earlier attempt may have served rows of {member.uri} or of a later file of the pack, "
                "so the pack is given up with it",
                retryable=False,
            )
            return
        rec.given_up = rec.given_up or {}
        rec.given_up[member.uri] = [error, failures.pop(member.uri)]
        rec.error = error
        self._given_up_ids.add(rec.task.task_id)
        self._failed_units += 1
        log.warning(
            "data task %s: file %s given up (%s); the other %d file(s) of its pack are read without it",
            rec.task.task_id,
            member.uri,
            error,
            len(left) - 1,
        )
        if len(left) == 1:
            self._set_state(rec, FAILED)
        else:
            self._set_state(rec, PENDING)
            self._push_pending(rec)

    @_api
    def release(self, executor_id: str, task_ids: Iterable[str]) -> list[str]:
        """``executor_id`` stops without finishing these tasks (scale-in, shutdown): each goes back
        to pending at once -- no failure counted, no lease to wait out -- or, with a backup copy
        running, to that copy. Batches already claimed are skipped when it is read again. Returns
        the ids released."""
        released = []
        for task_id in task_ids:
            rec = self._tasks.get(task_id)
            if rec is None or rec.state != RUNNING:
                continue
            rec.ended()
            if executor_id == rec.backup:
                rec.backup = None
            elif executor_id == rec.owner:
                if rec.backup is not None:
                    self._promote_backup(rec)
                else:
                    self._set_state(rec, PENDING)
                    self._push_pending(rec)
            else:
                continue
            released.append(task_id)
        return released

    def _promote_backup(self, rec: TaskRecord) -> None:
        """The original copy is gone (failed, lease expired): the backup copy owns the task now."""
        rec.owner, rec.backup = rec.backup, None
        rec.deadline = self._clock() + self.lease_s
        heapq.heappush(self._deadlines, (rec.deadline, rec.attempts, rec.task.task_id))

    @_api
    def executors(self) -> dict[str, ExecutorReport]:
        """Executors heard from (lease or heartbeat) within ``lease_s``, with their last reports."""
        horizon = self._clock() - self.lease_s
        return {eid: report for eid, (report, seen) in self._executors.items() if seen >= horizon}

    def expire(self) -> list[str]:
        """Return overdue running tasks to pending (or failed); returns their ids. Also run by every call."""
        with self._lock:
            return self._expire_locked()

    def _expire_locked(self) -> list[str]:
        now = self._clock()
        expired: list[str] = []
        silent: dict[str, list[str]] = {}  # executor -> tasks whose lease it let expire
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, attempt, task_id = heapq.heappop(heap)
            rec = self._tasks[task_id]
            if rec.state != RUNNING or rec.attempts != attempt:
                continue  # finished, or an older attempt's entry
            if rec.deadline > now:  # extended by a heartbeat: re-file under the new deadline
                heapq.heappush(heap, (rec.deadline, attempt, task_id))
                continue
            rec.ended()
            if rec.backup is not None:
                self._promote_backup(rec)
                continue
            self._retry_or_fail(
                rec, f"lease expired: executor {rec.owner} sent no heartbeat for {self.lease_s:g}s (attempt {attempt})"
            )
            expired.append(task_id)
            silent.setdefault(str(rec.owner), []).append(task_id)
        for owner, task_ids in silent.items():
            seen = self._executors.get(owner, (None, now))[1]
            log.warning(
                "executor %s is silent (no heartbeat for %.1fs, lease %gs): its lease on %d task(s) expired, "
                "they go to other executors: %s",
                owner,
                now - seen,
                self.lease_s,
                len(task_ids),
                ", ".join(task_ids[:5]) + (" ..." if len(task_ids) > 5 else ""),
            )
        if self._delivery:
            expired += self._reopen_undelivered(now)
        return expired

    # -- readers and trainers ---------------------------------------------------------------
    @_api
    def claim(self, trainer_id: str, batch: BatchId) -> bool:
        """True for the first claim of ``(task_id, first_row)`` (yield it), False after (drop it)."""
        rec = self._get(batch.task_id)
        first = rec.claim(batch.first_row)
        self._stats["claimed_batches"] += first
        if first and rec.state == SUCCEEDED:
            self._delivery.claimed(batch.task_id, _count(rec.claimed), rec.batches, self._clock())
        return first

    def claim_many(self, trainer_id: str, batches: Iterable[BatchId]) -> list[bool]:
        """:meth:`claim` for several batches under one lock (one RPC over Flight)."""
        with self._lock:
            return [self.claim(trainer_id, b) for b in batches]

    def _consume(self, batch: BatchId) -> None:
        rec = self._tasks[batch.task_id]
        was_done = rec.consumed_done
        claimed_before = rec.claimed is not None and batch.first_row in rec.claimed
        if rec.consume(batch):
            self._stats["consumed_batches"] += 1
            self._stats["claimed_batches"] += not claimed_before
            self._stats["consumed_done"] += int(rec.consumed_done) - int(was_done)

    @_api
    def barrier(self, trainer_id: str, consumed: list[BatchId], barrier_id: int) -> dict[str, Any] | None:
        """Record ``consumed`` (idempotent); when all ``trainers`` reported ``barrier_id`` the snapshot is
        taken and returned, to this and every later call for that barrier (poll with ``consumed=[]``)."""
        for batch in consumed:
            self._get(batch.task_id)  # all known, or nothing recorded
        for batch in consumed:
            self._consume(batch)
        if barrier_id == self._barriers.last:
            return self._barriers.get()
        if not self._barriers.arrive(trainer_id, barrier_id, self.trainers):
            return None
        snapshot = self._snapshot_locked(barrier_id)
        self._barriers.keep(barrier_id, snapshot)
        return snapshot

    @_api
    def task_order(self, trainer_id: str, kind: str, start: int = 0, limit: int = 64) -> dict[str, Any]:
        """Up to ``limit`` of ``kind``'s tasks from place ``start`` in the plan's order (the order they
        were added): ``{"total": tasks of the kind, "planned": bool, "window": order_window (0: not
        deterministic), "done", "failed", "tasks": [[task_id, sealed, failed], ...]}``; ``sealed``: no
        batch of it will be claimed any more (each one claimed, or the task failed). Records ``start`` as
        ``trainer_id``'s place in ``kind``'s order: a deterministic driver leases only within
        ``order_window`` tasks of the slowest reporting reader."""
        if start < 0 or limit < 0:
            raise ValueError(f"task_order: start and limit must be >= 0, got {start}, {limit}")
        order = self._order.get(kind, [])
        self._cursors.setdefault(trainer_id, {})[kind] = int(start)
        rows: list[list[Any]] = []
        for task_id in order[start : start + limit]:
            rec = self._tasks[task_id]
            rows.append([task_id, rec.sealed, rec.state == FAILED])
        return {
            "total": len(order),
            "planned": self._planned,
            "window": self.order_window if self.deterministic else 0,
            "done": self._done(),
            "failed": self._tasks_failed(),
            "tasks": rows,
        }

    def barrier_snapshot(self) -> dict[str, Any] | None:
        """The snapshot of the last completed barrier (None before the first)."""
        with self._lock:
            return self._barriers.get()

    # -- snapshots ------------------------------------------------------------------------
    def _snapshot_locked(self, barrier_id: int | None) -> dict[str, Any]:
        config: dict[str, Any] = {
            "max_attempts": self.max_attempts,
            "failed_task_threshold": self.failed_task_threshold,
            "lease_s": self.lease_s,
            "trainers": self.trainers,
            "backup_after": self.backup_after,
        }
        if self.deterministic:  # a restored driver goes on in the same order
            config.update(deterministic=True, order_window=self.order_window)
        return {
            "format": SNAPSHOT_FORMAT,
            "barrier_id": barrier_id,
            "source_versions": json.loads(json.dumps(self.source_versions)),
            "config": config,
            "tasks": [rec.to_snapshot() for rec in self._tasks.values()],
            "quality": {task_id: dict(counts) for task_id, counts in self._quality.items()},
            "quality_places": {task_id: _places(places) for task_id, places in self._quality_places.items()},
            "quality_columns": {task_id: dict(columns) for task_id, columns in self._quality_columns.items()},
        }

    def snapshot(self) -> dict[str, Any]:
        """JSON-serialisable state: tasks (payload, state, attempts, failures, error, rows, batches,
        consumed first_rows), source versions, config and the last barrier id."""
        with self._lock:
            return self._snapshot_locked(self._barriers.last)

    def save(self, path: str | os.PathLike[str], snapshot: dict[str, Any] | None = None) -> Path:
        """Write ``snapshot`` (default: a fresh one) atomically (temp file + ``os.replace``)."""
        return save_snapshot(path, self.snapshot() if snapshot is None else snapshot)

    @classmethod
    def restore(cls, snapshot: dict[str, Any], **kwargs: Any) -> DataDriver:
        """A driver in the state of ``snapshot`` (rules: ``docs/data_plane.md``); ``kwargs`` override its config."""
        if snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(
                f"not a data driver snapshot (format {snapshot.get('format')!r}, expected {SNAPSHOT_FORMAT!r})"
            )
        driver = cls(**{**snapshot.get("config", {}), **kwargs})
        for entry in snapshot["tasks"]:
            driver._insert(TaskRecord.from_snapshot(entry))
        driver._planned = True
        driver.source_versions = dict(snapshot.get("source_versions") or {})
        for task_id, counts in (snapshot.get("quality") or {}).items():
            if task_id in driver._tasks and driver._tasks[task_id].state == SUCCEEDED:
                driver._quality[task_id] = {str(rule): int(n) for rule, n in counts.items()}
                driver._quality_total.update(driver._quality[task_id])
        for task_id, places in (snapshot.get("quality_places") or {}).items():
            if task_id in driver._quality:
                driver._quality_places[task_id] = _places(places)
        for task_id, columns in (snapshot.get("quality_columns") or {}).items():
            if task_id in driver._quality:
                driver._quality_columns[task_id] = quality_columns_from_dict(columns)
        barrier_id = snapshot.get("barrier_id")
        driver._barriers.keep(barrier_id, snapshot if barrier_id is not None else None)
        return driver

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> DataDriver:
        """:meth:`restore` from a file written by :meth:`save`."""
        return cls.restore(read_snapshot(path), **kwargs)

    # -- status -----------------------------------------------------------------------------
    def _tasks_failed(self) -> bool:
        """Aborted, or the files of the failed tasks and the given-up files of packs are more than
        ``failed_task_threshold`` of all files (a task that is no pack counts as one)."""
        units = self._units
        return self._aborted is not None or (units > 0 and self._failed_units / units > self.failed_task_threshold)

    def abort(self, reason: str) -> None:
        """Fail the run's tasks from outside (an executor out of restarts, a cancelled run): from now on the
        status says failed, executors stop leasing and readers end; :meth:`raise_if_failed` raises
        :class:`DataAbortedError` with ``reason``."""
        with self._lock:
            if self._aborted is None:
                self._aborted = reason

    def _busy(self) -> int:
        """Tasks not finished: new, pending or running."""
        return self._counts[NEW] + self._counts[PENDING] + self._counts[RUNNING]

    def _done(self) -> bool:
        """Every task finished and every batch of the succeeded ones claimed by a trainer."""
        return self._planned and not self._busy() and not self._delivery and not self._tasks_failed()

    def failure_report(self, limit: int | None = None) -> list[dict[str, Any]]:
        """One row per failed task and per given-up file of a pack (the first ``limit``): ``{"task_id", "uri",
        "attempts", "failures", "error"}``; a file's row also has ``where``: the file (``uri``)."""
        with self._lock:
            rows: list[dict[str, Any]] = []
            for task_id in sorted(self._failed_ids | self._given_up_ids):
                rec = self._tasks[task_id]
                rows += rec.given_up_rows()
                if rec.state == FAILED and rec.units > len(rec.given_up or ()):
                    rows.append(rec.failure_row())
                if limit is not None and len(rows) >= limit:
                    break
            return rows[:limit]

    @_api
    def status(self) -> dict[str, Any]:
        """``{"counts": {state: n}, "total", "done", "failed", "failed_tasks": [report rows],
        "rows", "batches", "claimed_batches", "consumed_batches", "consumed_done", "barrier_id",
        "executors", "silent_executors", "source_versions"}``; ``done``: every task finished (failures within
        the threshold tolerated) and every batch of the succeeded ones claimed; ``silent_executors``:
        executors heard from once but not within ``lease_s`` (frozen, gone, or stopped after the run);
        ``consumed_done``: succeeded tasks whose every batch was consumed; ``failed_tasks``: the first 100
        rows of :meth:`failure_report` (``counts["failed"]``: all)."""
        horizon = self._clock() - self.lease_s
        return {
            "counts": dict(self._counts),
            "total": len(self._tasks),
            "done": self._done(),
            "failed": self._tasks_failed(),
            "aborted": self._aborted,
            "failed_tasks": self.failure_report(100),
            **self._stats,
            "barrier_id": self._barriers.last,
            "executors": sum(seen >= horizon for _, seen in self._executors.values()),
            "silent_executors": sorted(eid for eid, (_, seen) in self._executors.items() if seen < horizon),
            "serving_rows": self._serving_rows_locked(),
            "running_by_kind": dict(self._running_by_kind),
            "source_versions": dict(self.source_versions),
            "quality": {rule: n for rule, n in sorted(self._quality_total.items()) if n},
        }

    def rows_by_partition(self) -> dict[tuple[str, datetime], int]:
        """Rows served per (source, partition) of the plan whose every task succeeded (0: its tasks served
        none); a partition with a task not (yet) succeeded is left out."""
        with self._lock:
            rows: Counter[tuple[str, datetime]] = Counter()
            unfinished: set[tuple[str, datetime]] = set()
            for rec in self._tasks.values():
                key = (rec.task.read.source, rec.task.read.partition)
                if rec.state == SUCCEEDED:
                    rows[key] += rec.rows
                else:
                    unfinished.add(key)
            return {key: n for key, n in rows.items() if key not in unfinished}

    def quality_counts(self, offset_sources: Collection[str] = ()) -> dict[str, Any]:
        """Rows the succeeded tasks touched per data-quality rule (repaired or dropped):
        ``{"total": {rule: rows}, "by_source": {source: {rule: rows}}, "by_task": {task_id: {rule: rows}},
        "by_location": {source: {rule: {where: rows}}}, "columns": {source: {rule: [native column]}}}``; ``where`` names the file (and row groups of a split
        one), or for the sources in ``offset_sources`` (Kafka) the topic, partition and offset range.

        >>> driver.quality_counts(offset_sources={"clicks"})["by_location"]  # doctest: +SKIP
        {'clicks': {'dense_invalid': {'topic clicks partition 0 offsets 0-500': 12}}}
        """
        with self._lock:
            by_source: dict[str, Counter[str]] = {}
            by_location: dict[str, dict[str, Counter[str]]] = {}
            columns: dict[str, dict[str, set[str]]] = {}
            for task_id, counts in self._quality.items():
                read = self._tasks[task_id].task.read
                by_source.setdefault(read.source, Counter()).update(counts)
                for rule, names in self._quality_columns.get(task_id, {}).items():
                    columns.setdefault(read.source, {}).setdefault(rule, set()).update(names)
                rules = by_location.setdefault(read.source, {})
                places = self._quality_places.get(task_id) or {
                    read_location(read, offsets=read.source in offset_sources): counts
                }
                for where, counted in places.items():
                    for rule, rows in counted.items():
                        if rows:
                            rules.setdefault(rule, Counter())[where] += rows
            return {
                "total": {rule: n for rule, n in sorted(self._quality_total.items()) if n},
                "by_source": {name: dict(sorted(c.items())) for name, c in sorted(by_source.items())},
                "by_task": {task_id: dict(counts) for task_id, counts in sorted(self._quality.items())},
                "by_location": {
                    name: {rule: dict(sorted(c.items())) for rule, c in sorted(rules.items())}
                    for name, rules in sorted(by_location.items())
                },
                "columns": {
                    name: {rule: sorted(names) for rule, names in sorted(rules.items())}
                    for name, rules in sorted(columns.items())
                },
            }

    def backlog_by_kind(self) -> dict[str, int]:
        """Tasks not yet read (new, pending or running) per kind."""
        with self._lock:
            return dict(self._busy_by_kind)

    def running_by_kind(self) -> dict[str, int]:
        """Tasks running (leased) per kind: how many executors' task runners work on each kind."""
        with self._lock:
            return dict(self._running_by_kind)

    def _buffered_rows_locked(self) -> dict[str, float]:
        horizon = self._clock() - self.lease_s
        rows: dict[str, float] = {}
        for report, seen in self._executors.values():
            if seen < horizon:
                continue
            for key, value in report.metrics.items():
                if key.startswith(BUFFERED_ROWS):
                    kind = key[len(BUFFERED_ROWS) :]
                    rows[kind] = rows.get(kind, 0.0) + max(0.0, float(value))
        return rows

    def buffered_rows_by_kind(self) -> dict[str, float]:
        """Rows per kind waiting in the live executors' serving buffers, as their last heartbeats
        reported them (metrics ``buffered_rows.<kind>``)."""
        with self._lock:
            return self._buffered_rows_locked()

    def _serving_rows_locked(self) -> dict[str, float]:
        rows = self._buffered_rows_locked()
        for kind in PUSH_KINDS:
            if self._queued_rows.get(kind):
                rows[kind] = rows.get(kind, 0.0) + self._queued_rows[kind]
        return rows

    def serving_rows_by_kind(self) -> dict[str, float]:
        """The serving buffers' state per kind, in rows: :meth:`buffered_rows_by_kind` plus, for a
        push kind (``stream``: Kafka offset ranges), the rows that arrived and wait for a loader (its
        new and pending tasks). What the mixture prioritisation weighs
        (``primus_dagster.training.priority``): a stream surge shows here before any loader takes it."""
        with self._lock:
            return self._serving_rows_locked()

    def raise_if_failed(self) -> None:
        """Raise :class:`DataFailedError` (with the failed-task report) when the task set failed
        (more than ``failed_task_threshold`` of it), :class:`DataAbortedError` when it was aborted."""
        with self._lock:
            if self._aborted is not None:
                raise DataAbortedError(self._aborted)
            if self._tasks_failed():
                raise DataFailedError(self.failure_report(), self._units, self.failed_task_threshold)

    def task_info(self, task_id: str) -> dict[str, Any]:
        """State, attempts, owner, error, counts and ledgers of one task."""
        with self._lock:
            return self._get(task_id).describe()
