"""The reorder buffer of a deterministic reader (``data.deterministic``): one kind's batches in the plan's order.

A :class:`KindOrder` holds the batches of one kind (``batch`` or ``stream``) that arrived, keyed by task
and ``first_row``, and releases them in ONE order fixed by the plan: task by task in the order the driver
was given them (its ``task_order``), each task's batches by ``first_row``, whichever executor read which
task when. It learns that order, and when a task is *sealed* (no batch of it will be claimed any more),
from the driver's :meth:`~primus_dagster.data.driver.DataDriver.task_order` replies.

Why releasing the smallest held ``first_row`` of the current task is safe: an executor serves a task's
batches in ``first_row`` order, a retry skips the batches already claimed, and so the *first* claims of
a task's batches come in ``first_row`` order however many copies run. A held batch whose task has no
claim in flight at this reader therefore has every smaller batch of the task (of this reader) already
held or released.

Pure bookkeeping: :class:`~primus_dagster.data.reader.RemoteReader` calls it under its lock.

Example::

    order = KindOrder("batch")
    order.update(0, driver.task_order("trainer-0", "batch", 0, 64))
    order.add(batch)                       # arrived and claimed
    next_one = order.take(claiming={})     # the next batch in the plan's order, or None (wait)
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

from primus_dagster.data.batch import Batch

log = logging.getLogger(__name__)


class KindOrder:
    """One kind's place in the plan's order, the tasks ahead as the driver last described them, and the
    batches held for release (module docstring)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.pos = 0  # place (in the kind's task order) of the task being released
        self.total: int | None = None  # the kind's tasks (None: the driver was not asked yet)
        self.planned = False  # the driver's task set is final
        self.ids: dict[int, str] = {}  # place -> task id, from pos on
        self.sealed: set[int] = set()  # places whose task no batch will be claimed of any more
        self.failed: set[int] = set()  # places whose task failed
        self.held: dict[str, dict[int, Batch]] = {}  # task id -> first_row -> batch
        self.late: deque[Batch] = deque()  # batches of a failed task this order already passed
        self.passed_failed: set[str] = set()
        self.batches = 0  # held + late
        self.rows = 0
        self.moved = False  # pos advanced since the driver was last told

    @property
    def exhausted(self) -> bool:
        """Every task of the kind passed, nothing left to release."""
        return self.planned and self.total is not None and self.pos >= self.total and not self.late

    @property
    def current(self) -> str | None:
        """The id of the task being released (None: not known yet, or none left)."""
        return self.ids.get(self.pos)

    def add(self, batch: Batch) -> None:
        """A claimed batch of this kind arrived."""
        meta = batch.meta
        self.batches += 1
        self.rows += batch.rows
        if meta.task_id in self.passed_failed:
            log.warning(
                "deterministic order: batch %s of failed task %s arrived after its place; released out of order",
                meta.first_row,
                meta.task_id,
            )
            self.late.append(batch)
            return
        self.held.setdefault(meta.task_id, {})[meta.first_row] = batch

    def update(self, start: int, reply: Mapping[str, Any]) -> None:
        """Apply a ``task_order`` reply for places ``start`` on."""
        self.total = int(reply["total"])
        self.planned = bool(reply["planned"])
        for offset, (task_id, sealed, failed) in enumerate(reply["tasks"]):
            place = start + offset
            if place < self.pos:
                continue
            self.ids[place] = str(task_id)
            if sealed:
                self.sealed.add(place)
            if failed:
                self.failed.add(place)
        if self.planned and self.pos >= self.total and any(self.held.values()):
            self._release_leftovers()

    def take(self, claiming: Mapping[str, int]) -> Batch | None:
        """The next batch in the plan's order, or None while it is not known yet (``claiming``: claims in
        flight per task id at the reader)."""
        while True:
            if self.late:
                return self._out(self.late.popleft())
            task_id = self.current
            if task_id is None or claiming.get(task_id, 0) > 0:
                return None
            held = self.held.get(task_id)
            if held:
                first_row = min(held)
                batch = held.pop(first_row)
                if not held:
                    del self.held[task_id]
                return self._out(batch)
            if self.pos not in self.sealed:
                return None
            self._advance(task_id)

    def _advance(self, task_id: str) -> None:
        if self.pos in self.failed:
            self.passed_failed.add(task_id)
        self.held.pop(task_id, None)
        del self.ids[self.pos]
        self.sealed.discard(self.pos)
        self.failed.discard(self.pos)
        self.pos += 1
        self.moved = True
        if self.planned and self.total is not None and self.pos >= self.total and any(self.held.values()):
            self._release_leftovers()

    def _release_leftovers(self) -> None:
        """Batches still held once every task passed (a claim the order could not place): released, not lost."""
        leftovers = sorted(
            (batch for rows in self.held.values() for batch in rows.values()),
            key=lambda b: (b.meta.task_id, b.meta.first_row),
        )
        log.warning("deterministic order: %d %s batch(es) held past the last task; released", len(leftovers), self.kind)
        self.held.clear()
        self.late.extend(leftovers)

    def _out(self, batch: Batch) -> Batch:
        self.batches -= 1
        self.rows -= batch.rows
        return batch

    def describe(self) -> str:
        """Where the order waits, for messages."""
        task_id = self.current
        total = "?" if self.total is None else str(self.total)
        if task_id is None:
            return f"{self.kind} task at place {self.pos} of {total} (not described by the driver yet)"
        state = "sealed" if self.pos in self.sealed else "not sealed"
        return (
            f"{self.kind} task {task_id} (place {self.pos} of {total}, {state}, "
            f"{len(self.held)} later task(s) with {self.batches} batch(es) held)"
        )
