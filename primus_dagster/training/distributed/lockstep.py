"""The coordinator of a lock-step group of trainer processes: :class:`LockStep` (package docstring: *Rounds,
not* ``Join``).

Each round every rank's status row -- and, with the row-sparse exchange, its gradients in the same message
-- goes to every other rank in one all-gather (:class:`~.mesh.PeerMesh`, or gloo); the
:class:`~.exchange.GradientExchange` makes the group's gradients of what the round's ready ranks trained.

Example (in every rank, after ``init_process_group``)::

    coordinator = LockStep(RowSparseExchange(), timeout_s=300)
    loop = PhaseLoop(context, coordinator, reader, sink)
    loop.run()
    loop.finish()
    coordinator.close()
"""

from __future__ import annotations

import os
import time
from typing import Any, Literal

import torch
import torch.distributed as dist

from primus_dagster.data import Batch
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.distributed.exchange import (
    HEADER_BYTES,
    MAX_TABLES,
    STATUS_FIELDS,
    GradientExchange,
    RowSparseExchange,
)
from primus_dagster.training.distributed.mesh import ByteAllGather, PeerMesh
from primus_dagster.training.features import ModelInit
from primus_dagster.training.loop import RankCounters, Round, RoundStatus
from primus_dagster.training.models import KINDS
from primus_dagster.training.trainer import Trainer


class LockStep:
    """One rank's side of a lock-step group (a :class:`~primus_dagster.training.loop.Coordinator`):
    ``exchange`` -- how the gradients become the group's (default :class:`~.exchange.RowSparseExchange`);
    ``transport="gloo"``: the round messages over gloo (:class:`~.mesh.GlooBytes`) instead of the peer
    sockets; ``parent_pid``: the job process, checked before every round (a rank outliving it stops);
    ``timeout_s``: the bound on every wait for the peers.

    A rank polls its reader without waiting (a short wait after a round in which nobody had data): a rank
    waiting for data that depends on the others' steps would deadlock the group (package docstring).

    Example::

        loop = PhaseLoop(context, LockStep(), reader, sink)      # after init_process_group
    """

    def __init__(
        self,
        exchange: GradientExchange | None = None,
        *,
        timeout_s: float = 300.0,
        transport: Literal["auto", "gloo"] = "auto",
        parent_pid: int | None = None,
    ):
        self.exchange: GradientExchange = exchange if exchange is not None else RowSparseExchange()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.backward_first = self.exchange.backward_first
        self.table_shards = self.exchange.table_shards
        self.barrier_wait_s = 120.0 if self.rank == 0 else 0.0  # rank 0 saves: it waits for the others' reports
        self.timeout_s, self.transport, self.parent_pid = timeout_s, transport, parent_pid
        self.mesh: ByteAllGather | None = None  # round messages in a group of more than one go through it
        self.mesh_s = 0.0  # seconds in mesh.all_gather (waiting for the peers included)

    def poll_s(self, idle: bool) -> float | None:
        return 0.02 if idle else 0.0

    def build(self, spec: TrainingSpec, init: ModelInit, *, device: torch.device, deterministic: bool) -> Trainer:
        if device.type != "cpu":
            raise ValueError(f"a group of trainers trains on the CPU (its exchange packs host memory); got {device}")
        return self.exchange.build(spec, init, deterministic=deterministic)

    def before_round(self, rounds: int) -> None:
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            raise RuntimeError(f"trainer rank {self.rank}: the job process {self.parent_pid} is gone")

    def agree(self, status: RoundStatus, trainer: Trainer | None, micro: Batch | None) -> Round:
        if self.mesh is None and self.world > 1:  # the status rows (and the exchange's messages, if any)
            self.mesh = PeerMesh.connect(self.timeout_s, gloo=self.transport == "gloo")
        mine = torch.zeros(STATUS_FIELDS + MAX_TABLES, dtype=torch.float64)
        mine[1] = float(status.ended)
        message = None
        if status.ready:
            kind = KINDS.index(status.kind)
            fields = [1, float(status.ended), kind, *status.widths, status.label_sum, status.rows]
            mine[:STATUS_FIELDS] = torch.tensor(fields, dtype=torch.float64)
            if self.exchange.round_messages and micro is not None:  # what its exchange sends with the status
                message = self.exchange.pack(mine, kind, micro)
        table, messages = self._gather(mine, message)
        return Round(tuple(_status(row) for row in table.tolist()), messages)

    def _gather(
        self, mine: torch.Tensor, message: torch.Tensor | None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The round's status table ``[world, STATUS_FIELDS + MAX_TABLES]`` and, through the mesh, every
        rank's message (``message``: this rank's; None: its status alone)."""
        if self.mesh is None:
            rows = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(rows, mine)
            return torch.stack(rows), None
        started = time.perf_counter()
        messages = self.mesh.all_gather(mine.view(torch.uint8) if message is None else message)
        self.mesh_s += time.perf_counter() - started
        return torch.stack([m[:HEADER_BYTES].view(torch.float64) for m in messages]), messages

    def gradients(self, trainer: Trainer, micro: Batch, loss: torch.Tensor | None, round: Round) -> torch.Tensor:
        divisor = round.divisor(trainer.model.parameter_groups())
        return self.exchange.gradients(trainer, micro, loss, round.messages, divisor)

    def null_gradients(self, trainer: Trainer, round: Round) -> None:
        kinds = {s.kind for s in round.ready}
        kind = "batch" if "batch" in kinds else "stream"  # one that some ready rank trains
        self.exchange.null_gradients(trainer, kind, round.messages, round.divisor(trainer.model.parameter_groups()))

    def gather(self, mine: RankCounters) -> list[RankCounters]:
        local = mine.to_tensor()
        gathered = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(gathered, local)
        return [RankCounters.from_tensor(g) for g in gathered]

    def describe(self, rounds: int) -> dict[str, Any]:
        """Seconds of the gradient exchange (packing, the round's all-gather, applying) and the bytes this
        rank sent a round."""
        return {
            "exchange_s": round(self.exchange.seconds + self.mesh_s, 3),
            "exchange_bytes_per_step": round(self.exchange.sent / max(1, rounds)),
        }

    def reset_counters(self) -> None:
        """Zero the exchange's bytes and seconds (after a warm-up)."""
        self.mesh_s = 0.0
        self.exchange.reset_counters()

    def close(self) -> None:
        """Close the peer connections, the exchange's too (also closed when the process exits)."""
        if self.mesh is not None:
            self.mesh.close()
            self.mesh = None
        self.exchange.close()


def _status(row: list[float]) -> RoundStatus:
    if row[0] != 1:
        return RoundStatus(False, bool(row[1]))
    return RoundStatus(True, bool(row[1]), KINDS[int(row[2])], (int(row[3]), int(row[4])), row[5], int(row[6]))
