"""Delivery watch: completed tasks whose batches have not all been claimed yet.

An executor calls ``complete`` once every batch of a task has been handed to a Flight stream;
Flight ``DoGet`` has no acknowledgement, so a batch can still be lost in transit when the
executor dies right after. The driver therefore watches completed tasks until readers have
claimed all their batches; when the owner dies first, the task is reopened (re-leased with
its claimed batches skipped), which closes that window without waiting for a restore.

Example::

    watch = DeliveryWatch()
    watch.completed("exec-0", "t1", claimed=3, batches=4)
    watch.claimed("t1", claimed=4)          # all delivered: no longer watched
    watch.orphans({"exec-0"})               # -> [] (nothing left to reopen)
"""

from __future__ import annotations


class DeliveryWatch:
    """Task id -> owner of completed tasks with unclaimed batches (see module docstring)."""

    def __init__(self) -> None:
        self._owner: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def completed(self, owner: str, task_id: str, claimed: int, batches: int) -> None:
        if claimed < batches:
            self._owner[task_id] = owner

    def claimed(self, task_id: str, claimed: int, batches: int) -> None:
        if claimed >= batches:
            self._owner.pop(task_id, None)

    def forget(self, task_id: str) -> None:
        self._owner.pop(task_id, None)

    def orphans(self, dead: set[str]) -> list[str]:
        """Watched tasks whose owner is in ``dead``; they stop being watched."""
        lost = [task_id for task_id, owner in self._owner.items() if owner in dead]
        for task_id in lost:
            del self._owner[task_id]
        return lost
