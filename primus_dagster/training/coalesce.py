"""Micro-batches of ``training.batch_size`` rows across reader batches: :class:`BatchCoalescer`.

A reader batch is one executor batch of one task: a small file or a Kafka range's tail gives one of
a few rows. Cut on its own, each would be one optimiser step of a few rows (5 000 tiny files: 5 006
steps of ~1.4 samples). The coalescer merges the rows of consecutive reader batches of the same kind
and the same columns into micro-batches of exactly ``size`` rows, in order, each row in one
micro-batch; only a flush makes a shorter one: at a kind (or columns) switch, and where the trainer
calls :meth:`~BatchCoalescer.flush` -- before a checkpoint barrier (the barrier reports every reader
batch handed out, so their rows must all be trained) and at the end of the data.

Each :class:`MicroBatch` names the reader batches whose last rows it holds (``finished``): once it
is trained, those reader batches are trained whole (what ``RunHooks.on_batch`` is told).

Example::

    coalescer = BatchCoalescer(spec.batch_size)
    for batch in reader:
        for micro in coalescer.add(batch):
            trainer.train_micro(micro.batch)
    for micro in coalescer.flush():
        trainer.train_micro(micro.batch)
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
        self._parts: list[Batch] = []  # the open micro-batch's rows (fewer than size)
        self._rows = 0
        self._finished: list[Batch] = []  # reader batches whose last rows are in the parts

    @property
    def pending_rows(self) -> int:
        """Rows held for the open micro-batch (not trained yet)."""
        return self._rows

    def add(self, batch: Batch) -> list[MicroBatch]:
        """The micro-batches ``batch`` completes: first the open one flushed when ``batch`` cannot join
        it (another kind or other columns), then every full one; its last rows may stay held. A batch
        without rows has nothing to train and is passed over (executors never send one)."""
        if batch.rows == 0:
            return []
        out = [] if self._joins(batch) else self.flush()
        start = 0
        while start < batch.rows:
            take = min(self.size - self._rows, batch.rows - start)
            self._parts.append(batch if take == batch.rows else batch.slice(start, start + take))
            self._rows, start = self._rows + take, start + take
            if start == batch.rows:
                self._finished.append(batch)
            if self._rows == self.size:
                out.append(self._close())
        return out

    def flush(self) -> list[MicroBatch]:
        """The open micro-batch, however short (none when no rows are held)."""
        return [self._close()] if self._parts else []

    def _joins(self, batch: Batch) -> bool:
        if not self._parts:
            return True
        first = self._parts[0]
        return batch.kind == first.kind and batch.columns.schema.equals(first.columns.schema)

    def _close(self) -> MicroBatch:
        parts, finished = self._parts, tuple(self._finished)
        self._parts, self._rows, self._finished = [], 0, []
        return MicroBatch(parts[0] if len(parts) == 1 else Batch.concat(parts), finished)
