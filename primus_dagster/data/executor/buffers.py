"""Bounded per-trainer output buffers of a data executor (thread-safe, no I/O).

Task runners :meth:`TrainerBuffers.put` batches; a shuffle picks the trainer buffer from the
current fills; a full target blocks the runner (backpressure), so one buffer never holds more
than ``capacity`` batches. The dataset server :meth:`TrainerBuffers.get` s one trainer's
batches for its ``DoGet`` stream.

Example::

    >>> from primus_dagster.data.shuffle import RebalanceShuffle
    >>> buffers = TrainerBuffers(trainers=2, capacity=1)
    >>> buffers.put("a", RebalanceShuffle(2)), buffers.put("b", RebalanceShuffle(2))
    (0, 1)
    >>> buffers.get(1, timeout=0)
    'b'
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from primus_dagster.data.shuffle import Shuffle

T = TypeVar("T")


class TrainerBuffers(Generic[T]):
    """One bounded FIFO per trainer under one lock, with two conditions: ``_items`` (a buffer got an
    item: getters wait on it) and ``_room`` (a buffer got room: blocked putters wait on it). Waking
    only the side that can go on matters: in one process every needless wake-up is a GIL hand-over."""

    def __init__(self, trainers: int, capacity: int):
        if trainers < 1 or capacity < 1:
            raise ValueError(f"need trainers >= 1 and capacity >= 1, got {trainers}, {capacity}")
        self.trainers = trainers
        self.capacity = capacity
        self._queues: list[deque[T]] = [deque() for _ in range(trainers)]
        self._lock = threading.Lock()
        self._items = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)
        self.high_water = 0  # the largest fill any one buffer ever reached
        self.waiting = 0  # puts blocked on a full buffer right now (backpressure)
        self._closed = False

    def fills(self) -> list[int]:
        with self._lock:
            return [len(q) for q in self._queues]

    def put(
        self, item: T, shuffle: Shuffle, abort: Callable[[], bool] | None = None, poll_s: float = 0.1
    ) -> int | None:
        """Put ``item`` into the buffer the shuffle chooses, waiting while it is full.

        Returns the trainer index, or None when ``abort()`` turned true (or the buffers were
        closed) while waiting.
        """
        with self._lock:
            waiting = False
            try:
                while True:
                    if self._closed or (abort is not None and abort()):
                        return None
                    target = shuffle.choose([len(q) for q in self._queues])
                    queue = self._queues[target]
                    if len(queue) < self.capacity:
                        queue.append(item)
                        self.high_water = max(self.high_water, len(queue))
                        self._items.notify_all()
                        return target
                    if not waiting:
                        waiting = True
                        self.waiting += 1
                    self._room.wait(poll_s)
            finally:
                if waiting:
                    self.waiting -= 1

    def get(
        self,
        trainer: int,
        finished: Callable[[], bool] | None = None,
        timeout: float | None = None,
        poll_s: float = 0.1,
    ) -> T | None:
        """The oldest item of ``trainer``'s buffer; None when it is empty and ``finished()`` is
        true, after ``timeout`` seconds, or once the buffers are closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if self._closed:
                    return None
                queue = self._queues[trainer]
                if queue:
                    item = queue.popleft()
                    self._room.notify_all()
                    return item
                if finished is not None and finished():
                    return None
                wait = poll_s
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        return None
                self._items.wait(wait)

    def purge(self, predicate: Callable[[T], bool]) -> int:
        """Drop every buffered item matching ``predicate``; returns how many."""
        removed = 0
        with self._lock:
            for i, queue in enumerate(self._queues):
                keep = deque(item for item in queue if not predicate(item))
                removed += len(queue) - len(keep)
                self._queues[i] = keep
            self._room.notify_all()
        return removed

    def requeue(self, trainer: int, item: T) -> None:
        """Put ``item`` back at the head of ``trainer``'s buffer (a stream broke while holding it);
        may exceed the capacity by the items in flight."""
        with self._lock:
            self._queues[trainer].appendleft(item)
            self._items.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def wake(self) -> None:
        """Wake every waiter so it re-checks its abort / finished condition."""
        with self._lock:
            self._items.notify_all()
            self._room.notify_all()

    def close(self) -> None:
        """Make every current and future put/get return None at once, even with items buffered."""
        with self._lock:
            self._closed = True
            self._items.notify_all()
            self._room.notify_all()

    def totals(self, key: Callable[[T], str], value: Callable[[T], float]) -> dict[str, float]:
        """``value`` summed over every buffered item, grouped by ``key`` (e.g. rows per data kind)."""
        out: dict[str, float] = {}
        with self._lock:
            for queue in self._queues:
                for item in queue:
                    name = key(item)
                    out[name] = out.get(name, 0.0) + value(item)
        return out

    def fill_ratio(self, targets: list[int] | None = None) -> float:
        """Buffered batches over capacity, across ``targets`` (default: every trainer)."""
        with self._lock:
            indices = range(self.trainers) if targets is None else targets
            total = sum(len(self._queues[i]) for i in indices)
            slots = self.capacity * len(indices)
        return total / slots if slots else 0.0
