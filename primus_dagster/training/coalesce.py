"""Micro-batches of ``training.batch_size`` rows across reader batches: :class:`BatchCoalescer`.

A reader batch is one executor batch of one task: a small file or a Kafka range's tail gives one of
a few rows. Cut on its own, each would be one optimiser step of a few rows (5 000 tiny files: 5 006
steps of ~1.4 samples). The coalescer merges the rows of consecutive reader batches of the same kind
and the same columns into micro-batches of exactly ``size`` rows, in order, each row in one
micro-batch. Each kind (and set of columns) has an open micro-batch of its own, so ``mixed`` mode,
whose reader batches alternate between ``batch`` and ``stream``, still trains full steps of each. Only
:meth:`~BatchCoalescer.flush` makes a shorter one; the trainer calls it before a checkpoint barrier (the
barrier reports every reader batch handed out, so their rows must all be trained) and at the end of
the data.

Each :class:`MicroBatch` names the reader batches whose last rows it holds (``finished``): once it
is trained, those reader batches are trained whole (what ``RunHooks.on_batch`` is told).

Example::

    coalescer = BatchCoalescer(spec.batch_size)
    for batch in reader:
        for micro in coalescer.add(batch):
            trainer.train_step(micro.batch)
    for micro in coalescer.flush():
        trainer.train_step(micro.batch)
"""

from __future__ import annotations

from dataclasses import dataclass

from primus_dagster.data import Batch


@dataclass(frozen=True)
class MicroBatch:
    """One optimiser step's rows (``batch``: ``size`` rows except a flush's) and the reader batches
    whose last rows are among them (``finished``, in the order they came). A micro-batch merged from
    several reader batches carries its first part's task id and first row."""

    batch: Batch
    finished: tuple[Batch, ...]


class _OpenMicroBatch:
    """The rows held for one kind's next micro-batch (fewer than ``size``)."""

    def __init__(self, first: Batch) -> None:
        self.kind, self.schema = first.kind, first.schema
        self.parts: list[Batch] = []
        self.rows = 0
        self.finished: list[Batch] = []  # reader batches whose last rows are in the parts

    def takes(self, batch: Batch) -> bool:
        return batch.kind == self.kind and batch.schema.equals(self.schema)

    def close(self) -> MicroBatch:
        parts = self.parts
        return MicroBatch(parts[0] if len(parts) == 1 else Batch.concat(parts), tuple(self.finished))


class BatchCoalescer:
    """Reader batches in, micro-batches of ``size`` rows out (module docstring).

    Example::

        coalescer = BatchCoalescer(4)
        [m.batch.rows for m in coalescer.add(three_rows)]      # []: 3 rows held
        [m.batch.rows for m in coalescer.add(three_rows)]      # [4]: 2 rows held
        [m.batch.rows for m in coalescer.flush()]              # [2]
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"micro-batch size {size}: must be at least 1")
        self.size = size
        self._open: list[_OpenMicroBatch] = []  # one per kind and columns, in the order they opened

    @property
    def pending_rows(self) -> int:
        """Rows held for the open micro-batches (not trained yet)."""
        return sum(group.rows for group in self._open)

    def add(self, batch: Batch) -> list[MicroBatch]:
        """The full micro-batches ``batch`` completes in its kind's open one; its last rows may stay held.
        A batch without rows has nothing to train and is passed over (executors never send one)."""
        if batch.rows == 0:
            return []
        group = next((g for g in self._open if g.takes(batch)), None)
        if group is None:
            group = _OpenMicroBatch(batch)
            self._open.append(group)
        out = []
        start = 0
        while start < batch.rows:
            take = min(self.size - group.rows, batch.rows - start)
            group.parts.append(batch if take == batch.rows else batch.slice(start, start + take))
            group.rows, start = group.rows + take, start + take
            if start == batch.rows:
                group.finished.append(batch)
            if group.rows == self.size:
                out.append(group.close())
                group.parts, group.rows, group.finished = [], 0, []
        if not group.parts:
            self._open.remove(group)
        return out

    def flush(self) -> list[MicroBatch]:
        """The open micro-batches, however short, in the order they opened (none when no rows are held)."""
        out = [group.close() for group in self._open]
        self._open = []
        return out
