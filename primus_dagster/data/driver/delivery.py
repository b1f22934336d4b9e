"""Delivery watch: completed tasks whose batches have not all been claimed yet.

An executor calls ``complete`` once every batch of a task has been handed to a Flight stream;
Flight ``DoGet`` has no acknowledgement, so a batch can still be lost in transit: the executor
dies right after, or the stream's reader drops it (a reader that died, or any client holding the
token). The driver therefore watches completed tasks until readers have claimed all their
batches, and reopens one (re-leased with its claimed batches skipped) when its owner dies, or --
the end-of-run audit -- when every task has finished and no claim came for a lease (``stalled``).

Example::

    watch = DeliveryWatch()
    watch.completed("exec-0", "t1", claimed=3, batches=4, now=10.0)
    watch.claimed("t1", claimed=4, batches=4, now=11.0)   # all delivered: no longer watched
    watch.orphans({"exec-0"})                             # -> [] (nothing left to reopen)
"""

from __future__ import annotations


class DeliveryWatch:
    """Task id -> owner of completed tasks with unclaimed batches, and when delivery last moved."""

    def __init__(self) -> None:
        self._owner: dict[str, str] = {}
        self.moved = 0.0  # clock of the last completion or claim of a completed task

    def __len__(self) -> int:
        return len(self._owner)

    def completed(self, owner: str, task_id: str, claimed: int, batches: int, now: float) -> None:
        self.moved = now
        if claimed < batches:
            self._owner[task_id] = owner

    def claimed(self, task_id: str, claimed: int, batches: int, now: float) -> None:
        self.moved = now
        if claimed >= batches:
            self._owner.pop(task_id, None)

    def orphans(self, dead: set[str]) -> list[str]:
        """Watched tasks whose owner is in ``dead``; they stop being watched."""
        lost = [task_id for task_id, owner in self._owner.items() if owner in dead]
        for task_id in lost:
            del self._owner[task_id]
        return lost

    def stalled(self, now: float, after_s: float) -> list[str]:
        """Every watched task when nothing was delivered for ``after_s`` (their unclaimed batches are
        taken as lost); they stop being watched."""
        if not self._owner or now - self.moved < after_s:
            return []
        lost = sorted(self._owner)
        self._owner.clear()
        return lost
