"""The lock-step rounds of one rank (package docstring: *Rounds, not* ``Join``).

Example::

    loop = RankLoop(spec, lambda wait_s: reader.next_batch(timeout=wait_s))   # after init_process_group
    loop.run()
    loop.close()
    loop.result(rank, wall_s, cpu_s).params_checksum
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from primus_dagster.data import Batch
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.coalesce import BatchCoalescer, MicroBatch
from primus_dagster.training.distributed.exchange import (
    HEADER_BYTES,
    MAX_TABLES,
    STATUS_FIELDS,
    GradientExchange,
    RowSparseExchange,
    adapt_learns_batch,
)
from primus_dagster.training.distributed.mesh import ByteAllGather, PeerMesh
from primus_dagster.training.features import FeatureLayout, ModelInit
from primus_dagster.training.models import KINDS, MTRM, model_inputs
from primus_dagster.training.trainer import Trainer, TrainerStats


@dataclass
class RankResult:
    """What one rank did: counters, its time, a checksum of its final parameters."""

    rank: int
    steps: int
    samples: int
    samples_by_kind: dict[str, int]
    wall_s: float  # after init_process_group, to the end of training
    train_s: float  # inside its own optimiser steps (null steps excluded)
    params_checksum: str  # sha256 of the concatenated float32 parameter bytes ("" without a model)
    params_abs_sum: float  # float64 sum of |p|
    null_steps: int = 0  # rounds this rank took part in without data of its own
    cpu_s: float = 0.0  # CPU seconds of this process in the measured loop (all its threads)
    sample_ids: list[int] | None = None  # trained sample ids in order (record_ids=True)
    extra: dict[str, float] = field(default_factory=dict)


def params_checksum(model: nn.Module) -> tuple[str, float]:
    """(sha256 of the float32 parameter bytes in order, float64 sum of their absolute values)."""
    flat = [p.detach().to(torch.float32).contiguous() for p in model.parameters()]
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in flat)).hexdigest()
    return digest, float(sum(float(t.abs().sum(dtype=torch.float64)) for t in flat))


class RankLoop:
    """One rank's rounds (package docstring). ``pull(wait_s)``: a reader batch; None: ended;
    TimeoutError: none yet. ``exchange``: how the gradients become the group's
    (:class:`~.exchange.GradientExchange`; default :class:`~.exchange.RowSparseExchange`);
    ``transport="gloo"``: its round messages over gloo (:class:`~.mesh.GlooBytes`) instead of the peer
    sockets.

    A rank's micro-batch holds ``batch_size`` rows of consecutive reader batches of one kind
    (:class:`~primus_dagster.training.coalesce.BatchCoalescer`; shorter only when flushed: see
    :meth:`_head`). Checkpoints (set by the training job): with ``every`` > 0, once ``rounds`` reaches
    ``next_checkpoint`` the ranks stop pulling and finish the rows they hold, the open micro-batch
    flushed (null steps for the others); at the first round in which no rank holds one, every rank
    calls ``on_checkpoint(rounds)`` -- the same round on every rank, decided from the gathered table,
    so the checkpoint covers whole reader batches -- and the next one falls ``every`` rounds later.
    ``on_batch_done(rounds, batch)``: after the micro-batch with a reader batch's last rows;
    ``before_round(rounds)``: before every round.

    Example::

        loop = RankLoop(spec, lambda wait_s: reader.next_batch(timeout=wait_s))
        loop.run()
        loop.result(rank, wall_s, cpu_s).params_checksum
    """

    def __init__(
        self,
        spec: TrainingSpec,
        pull: Callable[[float], Batch | None],
        *,
        exchange: GradientExchange | None = None,
        record_ids: bool = False,
        timeout_s: float = 300.0,
        transport: Literal["auto", "gloo"] = "auto",
    ):
        self.spec, self.pull = spec, pull
        self.exchange: GradientExchange = exchange if exchange is not None else RowSparseExchange()
        self.timeout_s, self.transport = timeout_s, transport
        self.mesh: ByteAllGather | None = None  # round messages in a group of more than one go through it
        self.mesh_s = 0.0  # seconds in mesh.all_gather (waiting for the peers included)
        # micro-batches ready to train; the coalescer holds the rows of the open one (training/coalesce.py)
        self.pending, self.ended = deque[MicroBatch](), False
        self.coalescer = BatchCoalescer(spec.batch_size)
        self.trainer: Trainer | None = None
        self.rounds, self.null_steps = 0, 0
        self.widths = (0, 0)
        self.init: ModelInit | None = None  # the layout (and fresh statistics) the model is built on
        self.divisor = {"memory": 1, "adapt": 1, "all": 1}  # of each group in this round (0: not sent)
        self.sample_ids: list[int] | None = [] if record_ids else None
        self.every, self.next_checkpoint = 0, 0  # checkpoints every `every` rounds (0: none), the next at
        self.on_checkpoint: Callable[[int], None] | None = None
        self.on_batch_done: Callable[[int, Batch], None] | None = None
        self.before_round: Callable[[int], None] | None = None
        self.on_build: Callable[[Trainer], None] | None = None

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank put into the gradient collectives so far."""
        return self.exchange.sent

    @property
    def exchange_s(self) -> float:
        """Seconds of the gradient exchange so far (row_sparse: packing, the round's all-gather, applying)."""
        return self.exchange.seconds + self.mesh_s

    def reset_counters(self) -> None:
        """Zero the trainer's counters and the exchange's bytes and seconds (after a warm-up)."""
        if self.trainer is not None:
            self.trainer.counters = TrainerStats()
        self.null_steps, self.mesh_s = 0, 0.0
        self.exchange.reset_counters()

    def close(self) -> None:
        """Close the peer connections (also closed when the process exits)."""
        if self.mesh is not None:
            self.mesh.close()
            self.mesh = None

    def _head(self, wait_s: float, pull: bool) -> Batch | None:
        """This rank's micro-batch of the round: reader batches are pulled (``pull``) until one of
        ``batch_size`` rows is full; when the data ends, none is ready (``wait_s``) or pulling stops (a
        checkpoint drain), the open one is flushed, however short. None: this rank holds no rows."""
        while not self.pending and not self.ended and pull:
            try:
                batch = self.pull(wait_s)
            except TimeoutError:
                break
            self.ended = batch is None
            if batch is not None:
                self.pending.extend(self.coalescer.add(batch))
        if not self.pending:
            self.pending.extend(self.coalescer.flush())
        return self.pending[0].batch if self.pending else None

    def build(self, n_dense: int, n_sparse: int) -> Trainer:
        """Build the model and its trainer on :attr:`init` (every rank at the same round, same seed;
        without one: the plain layout of these widths), then ``on_build``."""
        init = self.init or ModelInit(FeatureLayout.plain(self.spec.model, n_dense, n_sparse))
        if (init.layout.n_dense, init.layout.n_sparse) != (n_dense, n_sparse):
            raise ValueError(
                f"batches of input widths {(n_dense, n_sparse)}; the model's layout: "
                f"{(init.layout.n_dense, init.layout.n_sparse)}"
            )
        self.trainer = self.exchange.build(self.spec, init)
        self.widths = (n_dense, n_sparse)
        if self.on_build is not None:
            self.on_build(self.trainer)
        return self.trainer

    def _null_step(self, trainer: Trainer, kind: str, messages: list[torch.Tensor] | None) -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        self.exchange.null_gradients(trainer, kind, messages, self.divisor)
        trainer.optimizer.step()
        self.null_steps += 1

    def _observe(self, model: nn.Module, ready: torch.Tensor) -> None:
        """Every ready rank's label sum and count, in rank order (MTRM's label-delay calibration)."""
        if isinstance(model, MTRM):
            for row in ready.tolist():
                index = int(row[2])
                model.label_sums[index] += row[5]
                model.label_counts[index] += row[6]

    def _checkpoint_due(self) -> bool:
        return self.every > 0 and self.rounds >= self.next_checkpoint

    def _gather(
        self, mine: torch.Tensor, message: torch.Tensor | None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The round's status table ``[world, STATUS_FIELDS + MAX_TABLES]`` and, through the mesh, every
        rank's message (``message``: this rank's; None: its status alone)."""
        if self.mesh is None:
            rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(rows, mine)
            return torch.stack(rows), None
        started = time.perf_counter()
        messages = self.mesh.all_gather(mine.view(torch.uint8) if message is None else message)
        self.mesh_s += time.perf_counter() - started
        return torch.stack([m[:HEADER_BYTES].view(torch.float64) for m in messages]), messages

    def run(self, max_rounds: int | None = None) -> None:
        """Rounds until every rank's data ended (or ``max_rounds`` training rounds)."""
        wait_s, done = 0.0, 0
        if self.mesh is None and self.exchange.round_messages and dist.get_world_size() > 1:
            self.mesh = PeerMesh.connect(self.timeout_s, same_host=False if self.transport == "gloo" else None)
        while max_rounds is None or done < max_rounds:
            if self.before_round is not None:
                self.before_round(self.rounds)
            draining = self._checkpoint_due()
            head = self._head(wait_s, pull=not draining)
            mine = torch.zeros(STATUS_FIELDS + MAX_TABLES, dtype=torch.float64)
            mine[1] = float(self.ended)
            loss, started, message = None, time.perf_counter(), None
            if head is not None:
                label_sum = float(model_inputs(head)[2].sum())
                shape = (head.dense.shape[1], head.sparse.shape[1])
                mine[:STATUS_FIELDS] = torch.tensor([1, mine[1], KINDS.index(head.kind), *shape, label_sum, head.rows])
                if self.exchange.round_messages:  # backward first: e.g. its touched rows ride in the status
                    trainer = self.trainer or self.build(*shape)
                    loss = trainer.backward(head)
                    message = self.exchange.pack(mine, int(mine[2]))
            table, messages = self._gather(mine, message)
            ready = table[table[:, 0] == 1]
            if not len(ready):
                all_ended = bool((table[:, 1] == 1).all())
                if draining and not all_ended and self.on_checkpoint is not None:
                    self.on_checkpoint(self.rounds)  # every rank, this round: nobody holds a reader batch
                    self.next_checkpoint = self.rounds + self.every
                    continue
                if all_ended:
                    return
                wait_s = 0.02  # after a round in which nobody had data, every rank waits for some a little
                continue
            wait_s, done, self.rounds = 0.0, done + 1, self.rounds + 1
            trainer = self.trainer or self.build(int(ready[0, 3]), int(ready[0, 4]))
            if (widths := {(int(r[3]), int(r[4])) for r in ready}) != {self.widths}:
                raise ValueError(f"batches of input widths {sorted(widths)}; the model's: {self.widths}")
            n_batch, n_stream = int((ready[:, 2] == 0).sum()), int((ready[:, 2] == 1).sum())
            # adapt_batch_weight > 0: a batch rank's adapt gradients are averaged in with the stream ranks'
            adapt = n_stream + (n_batch if adapt_learns_batch(trainer.model) else 0)
            self.divisor.update(memory=n_batch, adapt=adapt, all=len(ready))
            self._observe(trainer.model, ready)
            if head is None:
                self._null_step(trainer, "batch" if n_batch else "stream", messages)
                continue
            popped = self.pending.popleft()
            micro = popped.batch
            if loss is None:  # no round messages: the exchange runs the backward (e.g. DDP exchanges inside it)
                started = time.perf_counter()
            loss = self.exchange.gradients(trainer, micro, loss, messages, self.divisor)
            trainer.apply(micro, loss, started)
            if self.sample_ids is not None and head.sample_id is not None:
                self.sample_ids.extend(head.sample_id.tolist())
            if self.on_batch_done is not None:
                for finished in popped.finished:
                    self.on_batch_done(self.rounds, finished)

    def result(self, rank: int, wall_s: float, cpu_s: float) -> RankResult:
        c = self.trainer.counters if self.trainer else TrainerStats()
        checksum, abs_sum = params_checksum(self.trainer.model) if self.trainer else ("", 0.0)
        return RankResult(
            rank,
            c.step,
            c.samples,
            dict(c.samples_by_kind),
            wall_s,
            c.train_s,
            checksum,
            abs_sum,
            self.null_steps,
            cpu_s,
            self.sample_ids,
        )
