"""Stream shuffles: which trainer's buffer a data executor puts its next batch into.

Primus has two shuffles for stream data (``StreamSpec.shuffle``):

* **forward** -- a fixed pairing: executor ``i`` feeds trainer ``i mod T``. No coordination,
  good locality, but a slow trainer (or a skewed executor) stalls its partner.
* **rebalance** -- each batch goes to the *least-loaded* trainer. "Load" here is the fill of
  the per-trainer output queue *inside this executor* (the executor's dataset server keeps one
  bounded queue per trainer): a trainer that reads slowly leaves its queue full, so new
  batches flow to the trainers that keep up. Ties go round-robin so equal trainers get equal
  shares. This is a local decision (no trainer-side signal), which is what makes it cheap.

Both are pure: they map the current queue fills to a trainer index.

With ``data.deterministic`` and several trainers neither applies: which trainer gets a batch must not
depend on timing, so every batch has a fixed one, :func:`ordered_trainer` (its task's place in the plan
and its own place in the task's output), put through a :class:`FixedShuffle`.

Example::

    >>> fwd = ForwardShuffle(executor_index=5, trainers=2)
    >>> fwd.choose([0, 0])
    1
    >>> reb = RebalanceShuffle(trainers=3)
    >>> [reb.choose([2, 0, 0]), reb.choose([2, 0, 0]), reb.choose([2, 1, 0])]
    [1, 2, 2]
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Literal, Protocol

ShuffleKind = Literal["forward", "rebalance"]


class Shuffle(Protocol):
    """Picks the trainer (0..trainers-1) whose buffer receives the next batch."""

    trainers: int

    def choose(self, fills: Sequence[int]) -> int:
        """The trainer for the next batch, given each trainer buffer's current fill (batches)."""

    def targets(self) -> list[int]:
        """The trainers this shuffle can ever choose (for buffer-fill metrics)."""


def _check_trainers(trainers: int) -> None:
    if trainers < 1:
        raise ValueError(f"need at least one trainer, got {trainers}")


class ForwardShuffle:
    """Fixed pairing: executor ``executor_index`` always feeds trainer ``executor_index mod trainers``.

    >>> ForwardShuffle(3, 2).choose([9, 0])
    1
    """

    def __init__(self, executor_index: int, trainers: int):
        _check_trainers(trainers)
        if executor_index < 0:
            raise ValueError(f"executor_index must be >= 0, got {executor_index}")
        self.executor_index = executor_index
        self.trainers = trainers
        self.trainer = executor_index % trainers

    def choose(self, fills: Sequence[int]) -> int:
        return self.trainer

    def targets(self) -> list[int]:
        return [self.trainer]

    def __repr__(self) -> str:
        return f"ForwardShuffle(executor_index={self.executor_index}, trainers={self.trainers})"


class RebalanceShuffle:
    """Least-loaded trainer: the emptiest buffer wins; ties are broken round-robin.

    The round-robin cursor starts after the last chosen trainer, so with all buffers equally
    full the batches are dealt 0, 1, 2, 0, 1, ...

    >>> r = RebalanceShuffle(2)
    >>> [r.choose([0, 0]) for _ in range(4)]
    [0, 1, 0, 1]
    """

    def __init__(self, trainers: int):
        _check_trainers(trainers)
        self.trainers = trainers
        self._next = 0  # where the tie-break search starts

    def choose(self, fills: Sequence[int]) -> int:
        if len(fills) != self.trainers:
            raise ValueError(f"expected {self.trainers} buffer fills, got {len(fills)}")
        low = min(fills)
        for step in range(self.trainers):
            index = (self._next + step) % self.trainers
            if fills[index] == low:
                self._next = (index + 1) % self.trainers
                return index
        raise AssertionError("unreachable: the minimum is always found")  # pragma: no cover

    def targets(self) -> list[int]:
        return list(range(self.trainers))

    def __repr__(self) -> str:
        return f"RebalanceShuffle(trainers={self.trainers})"


class FixedShuffle:
    """Always the one trainer ``trainer`` (a batch whose trainer is fixed: :func:`ordered_trainer`).

    >>> FixedShuffle(1, trainers=2).choose([9, 0])
    1
    """

    def __init__(self, trainer: int, trainers: int):
        _check_trainers(trainers)
        if not 0 <= trainer < trainers:
            raise ValueError(f"trainer {trainer} out of range for {trainers} trainers")
        self.trainer, self.trainers = trainer, trainers

    def choose(self, fills: Sequence[int]) -> int:
        return self.trainer

    def targets(self) -> list[int]:
        return [self.trainer]


def ordered_trainer(place: int, index: int, trainers: int) -> int:
    """The trainer of batch ``index`` (its place in the task's output, skipped batches counted) of the task
    at ``place`` in its kind's plan order, in a deterministic run: a task's batches are dealt round-robin
    from the trainer its place picks, so every trainer gets its share of a task and of many one-batch tasks
    alike, the same on every re-read of the task and in every run of the same plan (whatever the task ids,
    which name where the data lies).

    >>> [ordered_trainer(3, i, 2) for i in range(4)], ordered_trainer(4, 0, 2)
    ([1, 0, 1, 0], 0)
    """
    _check_trainers(trainers)
    return (place + index) % trainers


def make_shuffle(kind: str, executor_index: int = 0, trainers: int = 1) -> ForwardShuffle | RebalanceShuffle:
    """The shuffle named by ``StreamSpec.shuffle``.

    >>> make_shuffle("forward", executor_index=2, trainers=2).trainer
    0
    """
    if kind == "forward":
        return ForwardShuffle(executor_index, trainers)
    if kind == "rebalance":
        return RebalanceShuffle(trainers)
    raise ValueError(f"unknown shuffle {kind!r}; expected 'forward' or 'rebalance'")


def executor_index_from_id(executor_id: str) -> int:
    """A stable index for an executor id: its trailing number (``data-3`` -> 3), else a CRC32.

    Pools name executors ``<pool>-<n>``, so the forward pairing is ``n mod trainers``; any other
    id still gets a deterministic index.

    >>> executor_index_from_id("data-7"), executor_index_from_id("x") == executor_index_from_id("x")
    (7, True)
    """
    match = re.search(r"(\d+)$", executor_id)
    if match:
        return int(match.group(1))
    return zlib.crc32(executor_id.encode())
