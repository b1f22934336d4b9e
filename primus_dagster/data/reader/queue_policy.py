"""Which reader queue the trainer takes its next batch from: :class:`QueueStat` and policies.

A reader keeps one bounded queue per batch kind (``batch``, ``stream``); a ``choose_queue``
callable sees a :class:`QueueStat` per queue and names the one to pop. The mixture
prioritisation of ``primus_dagster.training.priority`` is such a callable.

Example::

    reader = RemoteReader(driver, 0, choose_queue=RoundRobin())
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass
class QueueStat:
    """What ``choose_queue`` sees of one queue: fill (batches and rows), capacity, totals, age of its head batch."""

    name: str
    size: int
    capacity: int
    received: int
    head_age_s: float
    rows: int = 0


ChooseQueue = Callable[[Mapping[str, QueueStat]], str]


def batch_first(stats: Mapping[str, QueueStat]) -> str:
    """The first non-empty queue in the reader's queue order (default: batch, then stream)."""
    return next(name for name, stat in stats.items() if stat.size)


class RoundRobin:
    """Alternate between the non-empty queues."""

    def __init__(self) -> None:
        self._last = -1

    def __call__(self, stats: Mapping[str, QueueStat]) -> str:
        names = list(stats)
        for step in range(1, len(names) + 1):
            index = (self._last + step) % len(names)
            if stats[names[index]].size:
                self._last = index
                return names[index]
        raise ValueError("every queue is empty")
