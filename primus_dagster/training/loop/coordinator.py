"""What differs between one trainer and a group of them: the :class:`Coordinator` of the phase loop.

:class:`~primus_dagster.training.loop.phase_loop.PhaseLoop` trains in *rounds*: each round every trainer of
the group says what it holds (:class:`RoundStatus`: a micro-batch of some kind, or nothing; whether its
data ended), the coordinator makes that the group's :class:`Round` (every trainer's status, in rank order),
and then every trainer steps -- with its micro-batch, or a null step -- and the coordinator turns the
trainers' gradients into the group's. One trainer is a group of one (:class:`Solo`: nothing to agree on,
nothing to exchange); a lock-step group of processes is
:class:`~primus_dagster.training.distributed.lockstep.LockStep`; a group that shards its tables is a
coordinator of its own, on the same loop.

Example (the loop calls these, in this order, each round)::

    status = RoundStatus.of(head, ended)                 # this trainer's micro-batch (or None)
    loss = trainer.backward(head)                        # when it holds one and coordinator.backward_first
    round = coordinator.agree(status, trainer, head)     # every trainer's status (and exchange messages)
    loss = coordinator.gradients(trainer, head, loss, round)     # the group's gradients
    trainer.apply(head, loss, started)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from primus_dagster.data import Batch
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.checkpoint import Checkpoint
from primus_dagster.training.features import ModelInit
from primus_dagster.training.loop.context import RankCounters
from primus_dagster.training.models import ParameterGroups, build_initial_model, model_inputs
from primus_dagster.training.shard_state import ShardedInfo
from primus_dagster.training.trainer import Trainer


class TableShards(Protocol):
    """A group whose tables are sharded: how each rank saves its rows into a checkpoint and takes its rows
    of one (collectives: every rank at once)."""

    def save(self, trainer: Trainer, staging: Path) -> ShardedInfo:
        """Write this rank's rows of every sharded table, and their Adam moments, into ``staging`` (the
        same folder on every rank); what is sharded."""
        ...

    def localize(self, trainer: Trainer, checkpoint: Checkpoint, directory: Path) -> Checkpoint:
        """``checkpoint`` (loaded from ``directory`` without merging its shards) as this rank holds it: its
        rows of every sharded table and of their moments -- from the shards, resharded to this group, or
        from a whole table of a checkpoint that has none."""
        ...


@dataclass(frozen=True)
class RoundStatus:
    """One trainer's state at a round: ``ready`` -- it holds a micro-batch of ``kind`` with ``rows`` rows,
    input ``widths`` (dense, ids) and ``label_sum`` (what the model observes of its labels); ``ended`` --
    its data ended."""

    ready: bool
    ended: bool
    kind: str = ""
    widths: tuple[int, int] = (0, 0)
    label_sum: float = 0.0
    rows: int = 0

    @classmethod
    def of(cls, head: Batch | None, ended: bool) -> RoundStatus:
        """The status of a trainer holding ``head`` (None: nothing this round)."""
        if head is None:
            return cls(False, ended)
        label_sum = float(model_inputs(head)[2].sum())
        return cls(True, ended, head.kind, (int(head.dense.shape[1]), int(head.sparse.shape[1])), label_sum, head.rows)


@dataclass(frozen=True)
class Round:
    """The group's round: every trainer's :class:`RoundStatus` in rank order, and ``messages`` -- what a
    coordinator's exchange carries with them (its own format; None: nothing)."""

    statuses: tuple[RoundStatus, ...]
    messages: Sequence[torch.Tensor] | None = None

    @property
    def ready(self) -> list[RoundStatus]:
        return [s for s in self.statuses if s.ready]

    @property
    def all_ended(self) -> bool:
        return all(s.ended for s in self.statuses)

    @property
    def widths(self) -> tuple[int, int]:
        """The input widths of the lowest ready rank (what a model built this round is built on)."""
        return next(s.widths for s in self.statuses if s.ready)

    def divisor(self, groups: ParameterGroups) -> dict[str, int]:
        """For each parameter group, the ready trainers whose micro-batch trains it (0: nobody, the group
        keeps ``grad=None``): each gradient is averaged over the trainers that made it."""
        counts = dict.fromkeys(groups.names, 0)
        for status in self.ready:
            for group in groups.trained_by(status.kind):
                counts[group] += 1
        return counts


class Coordinator(Protocol):
    """One trainer's side of its group (module docstring). ``rank`` / ``world``: its place and the group's
    size; ``backward_first``: the loop runs a ready trainer's backward *before* :meth:`agree` (its
    gradients then ride with its status), else :meth:`gradients` runs it; ``barrier_wait_s``: how long it
    waits at a checkpoint barrier for the others (the one that saves waits; the others only report);
    ``table_shards``: how a group with sharded tables checkpoints them (None: every rank holds every row);
    with it, building the model and applying its start are collectives, so the loop builds on every trainer
    before the first round."""

    rank: int
    world: int
    backward_first: bool
    barrier_wait_s: float
    table_shards: TableShards | None

    def poll_s(self, idle: bool) -> float | None:
        """How long the loop waits for its next reader batch (None: until one comes or the data ends);
        ``idle``: nobody held data last round."""
        ...

    def build(self, spec: TrainingSpec, init: ModelInit, *, device: torch.device, deterministic: bool) -> Trainer:
        """The model on ``init`` (``spec.seed``: the same on every trainer) and its trainer
        (``observe_labels=False``: the loop adds the group's label counts)."""
        ...

    def before_round(self, rounds: int) -> None:
        """Called before every round (e.g. a trainer process checks that its job process lives)."""
        ...

    def agree(self, status: RoundStatus, trainer: Trainer | None, micro: Batch | None) -> Round:
        """This trainer's ``status`` in, the group's round out (a collective: every trainer calls it each
        round). ``trainer``: this trainer's (built when it is ready), with its gradients when
        ``backward_first``; ``micro``: the micro-batch it holds (None: none)."""
        ...

    def gradients(self, trainer: Trainer, micro: Batch, loss: torch.Tensor | None, round: Round) -> torch.Tensor:
        """A ready trainer, after :meth:`agree`: set its parameters' gradients to the group's; the loss
        (``loss``: of the backward before :meth:`agree`, else None: run it here)."""
        ...

    def null_gradients(self, trainer: Trainer, round: Round) -> None:
        """A trainer without data this round (its gradients zeroed): take part in the exchange and set the
        group's gradients."""
        ...

    def gather(self, mine: RankCounters) -> list[RankCounters]:
        """Every trainer's counters, in rank order (a collective, at checkpoints)."""
        ...

    def describe(self, rounds: int) -> dict[str, Any]:
        """What it measured over ``rounds`` rounds (exchange seconds, bytes a round), for the trainer's result."""
        ...

    def close(self) -> None: ...


class Solo:
    """The coordinator of one trainer: a group of one, which agrees with itself and exchanges nothing.

    Example::

        loop = PhaseLoop(context, Solo(), reader, sink)
        loop.run()
    """

    rank, world = 0, 1
    backward_first = True
    barrier_wait_s = 30.0
    table_shards: TableShards | None = None

    def poll_s(self, idle: bool) -> float | None:
        return None  # its reader's next batch (nobody waits for it)

    def build(self, spec: TrainingSpec, init: ModelInit, *, device: torch.device, deterministic: bool) -> Trainer:
        model = build_initial_model(spec.model, init, seed=spec.seed)
        return Trainer(model, spec, observe_labels=False, device=device, deterministic=deterministic)

    def before_round(self, rounds: int) -> None:
        pass

    def agree(self, status: RoundStatus, trainer: Trainer | None, micro: Batch | None) -> Round:
        return Round((status,))

    def gradients(self, trainer: Trainer, micro: Batch, loss: torch.Tensor | None, round: Round) -> torch.Tensor:
        return loss if loss is not None else trainer.backward(micro)

    def null_gradients(self, trainer: Trainer, round: Round) -> None:
        raise AssertionError("one trainer steps only with data of its own")

    def gather(self, mine: RankCounters) -> list[RankCounters]:
        return [mine]

    def describe(self, rounds: int) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass
