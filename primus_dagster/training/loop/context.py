"""What every trainer of a phase is given (:class:`PhaseContext`) and what it counts (:class:`RankCounters`).

A :class:`PhaseContext` is plain data: the job process builds it (:func:`phase_context`) and it is pickled
as it is into trainer processes, so one trainer in the job's process and a rank of a group start a phase
from the same facts -- the training spec, the phase, the feature layout, the checkpoint to start from,
what checkpoints record about the run. :class:`RankCounters` are one trainer's counters as checkpoints keep
them (a list, one entry per rank); :func:`checkpoint_record` builds the one checkpoint record of a phase
from them, whoever trains it.

Example::

    context = phase_context(run, phase, world=2)
    context.spec.batch_size, context.start_counters(rank=1).samples
    chooser = context.mixture(rank=0)             # the mixture prioritisation of a prioritised phase, or None
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.checkpoint import Checkpoint, trainer_checkpoint
from primus_dagster.training.features import ModelInit
from primus_dagster.training.modes import Phase
from primus_dagster.training.priority import MixturePriority
from primus_dagster.training.run_state import TrainingRun
from primus_dagster.training.shard_state import ShardedInfo, strip_sharded
from primus_dagster.training.trainer import Trainer

#: Seconds between two progress points of a trainer (MLflow metrics, the progress line).
PROGRESS_EVERY_S = 2.0
KINDS_COUNTED = ("batch", "stream")


@dataclass
class RankCounters:
    """One trainer's counters as a checkpoint keeps them: optimiser ``steps`` (null steps apart),
    ``samples`` (and per kind), ``null_steps`` (rounds of a group it took part in without data) and
    ``batches`` (reader batches it trained in the checkpoint's phase: what a deterministic mixture
    replays on resume).

    Example::

        RankCounters(steps=10, samples=10_240).to_dict()["samples_by_kind"]      # {"batch": 0, "stream": 0}
    """

    steps: int = 0
    samples: int = 0
    samples_by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS_COUNTED, 0))
    null_steps: int = 0
    batches: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "samples": self.samples,
            "samples_by_kind": {kind: int(self.samples_by_kind.get(kind, 0)) for kind in KINDS_COUNTED},
            "null_steps": self.null_steps,
            "batches": self.batches,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankCounters:
        by_kind = data.get("samples_by_kind") or {}
        return cls(
            steps=int(data.get("steps", 0)),
            samples=int(data.get("samples", 0)),
            samples_by_kind={kind: int(by_kind.get(kind, 0)) for kind in KINDS_COUNTED},
            null_steps=int(data.get("null_steps", 0)),
            batches=int(data.get("batches", 0)),
        )

    def to_tensor(self) -> torch.Tensor:
        """int64 ``[steps, samples, samples per kind..., null_steps, batches]`` (what a group all-gathers)."""
        by_kind = [self.samples_by_kind.get(kind, 0) for kind in KINDS_COUNTED]
        return torch.tensor([self.steps, self.samples, *by_kind, self.null_steps, self.batches], dtype=torch.int64)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> RankCounters:
        v = [int(x) for x in values.tolist()]
        n = len(KINDS_COUNTED)
        return cls(v[0], v[1], dict(zip(KINDS_COUNTED, v[2 : 2 + n], strict=True)), v[2 + n], v[3 + n])

    @staticmethod
    def summed(ranks: Sequence[RankCounters]) -> RankCounters:
        """The group's counters: every field summed over ``ranks``."""
        return RankCounters(
            steps=sum(r.steps for r in ranks),
            samples=sum(r.samples for r in ranks),
            samples_by_kind={kind: sum(r.samples_by_kind.get(kind, 0) for r in ranks) for kind in KINDS_COUNTED},
            null_steps=sum(r.null_steps for r in ranks),
            batches=sum(r.batches for r in ranks),
        )


def checkpoint_ranks(checkpoint: Checkpoint) -> tuple[dict[str, Any], ...]:
    """The per-rank counters a checkpoint holds (``extra["ranks"]``); a checkpoint that has none (one
    trainer, before they were recorded) holds one rank's: its own step and samples."""
    ranks = checkpoint.extra.get("ranks")
    if ranks:
        return tuple(dict(r) for r in ranks)
    by_kind = checkpoint.extra.get("samples_by_kind") or {}
    return (RankCounters(checkpoint.step, checkpoint.samples, dict(by_kind)).to_dict(),)


@dataclass(frozen=True)
class TrainerStart:
    """The checkpoint a phase's trainers start from: ``resume`` -- this run's (model, optimizer, counters,
    rounds) -- or ``warm`` -- another run's final model and optimizer (``warm_key``: its run key, named when
    it does not fit). ``step`` / ``phase`` / ``phase_done`` / ``ranks``: its round, where it was taken and its
    per-rank counters (a resume)."""

    path: str
    kind: Literal["resume", "warm"]
    warm_key: str | None = None
    step: int = 0
    phase: str = ""
    phase_done: bool = False
    ranks: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class PhaseContext:
    """What every trainer of one phase gets (module docstring): picklable, the same in every process.

    ``spec_json``: the training spec (defaults re-derived where it is read); ``world``: the trainers of
    the group; ``checkpoint_dir``: where rank 0 saves the phase's checkpoints; ``model_init``: the feature
    layout (and fresh dense statistics) the model is built on; ``data_quality`` / ``data_quality_places``:
    the finished phases' counts, which checkpoints carry for a resume; ``sharding``: how a group holds the
    tables (``replicated`` / ``row_wise``: the run's memory plan).
    """

    spec_json: str
    phase: str
    prioritised: bool
    deterministic: bool
    kind_weights: dict[str, float]
    world: int
    versions: dict[str, Any]
    window: list[str]
    checkpoint_dir: str
    model_init: dict[str, Any] | None = None
    start: TrainerStart | None = None
    data_quality: dict[str, Any] = field(default_factory=dict)
    data_quality_places: dict[str, Any] = field(default_factory=dict)
    progress_s: float = PROGRESS_EVERY_S
    sharding: str = "replicated"

    @classmethod
    def outside_run(
        cls,
        spec: TrainingSpec,
        world: int,
        *,
        kind_weights: Mapping[str, float] | None = None,
        init: ModelInit | None = None,
    ) -> PhaseContext:
        """A phase that is not part of a window run (a benchmark's group, a library user's loop): ``spec``'s
        mode as its one phase (prioritised in ``mixed`` mode, by ``kind_weights``), the model on ``init``
        (None: the plain layout of the first batch's widths), no run facts for checkpoints to carry, no
        progress points.

        Example::

            loop = PhaseLoop(PhaseContext.outside_run(spec, world=2), LockStep(), reader, sink, checkpoint_every=0)
        """
        return cls(
            spec_json=spec.model_dump_json(),
            phase=spec.mode,
            prioritised=spec.mode == "mixed",
            deterministic=False,
            kind_weights=dict(kind_weights or {}),
            world=world,
            versions={},
            window=[],
            checkpoint_dir="",
            model_init=init.to_dict() if init is not None else None,
            progress_s=float("inf"),
        )

    @functools.cached_property
    def spec(self) -> TrainingSpec:
        return TrainingSpec.model_validate_json(self.spec_json)

    @functools.cached_property
    def init(self) -> ModelInit | None:
        return ModelInit.from_dict(self.model_init) if self.model_init is not None else None

    def resumes_here(self) -> bool:
        """The start is this run's checkpoint taken inside this phase (not at its end)."""
        start = self.start
        return start is not None and start.kind == "resume" and start.phase == self.phase and not start.phase_done

    def start_counters(self, rank: int) -> RankCounters:
        """Rank ``rank``'s counters at the start: its entry of the start checkpoint's ranks (rank 0 also
        takes those of ranks beyond this group, so a smaller group keeps every sample counted); zeros for a
        fresh or warm start. ``batches`` count only inside the checkpoint's phase."""
        start = self.start
        if start is None or start.kind != "resume":
            return RankCounters()
        ranks = [RankCounters.from_dict(r) for r in start.ranks]
        mine = ranks[rank : rank + 1] + (ranks[self.world :] if rank == 0 else [])
        counters = RankCounters.summed(mine)
        if not self.resumes_here():
            counters.batches = 0
        return counters

    def mixture(self, rank: int, backlog_fn: Callable[[], Mapping[str, float]] | None = None) -> MixturePriority | None:
        """The mixture prioritisation rank ``rank`` reads a prioritised phase with (None for others):
        ``deterministic`` -- the seed and ``w_i`` alone, replayed past the batches this rank trained
        before the start checkpoint; else ``q_i`` weighs the serving buffers -- the rows the executors
        hold (``backlog_fn``, where this process sees them cheaply: the driver in process) and the
        reader's own queue -- or, without ``backlog_fn``, the reader's queues alone."""
        if not self.prioritised:
            return None
        seed = self.spec.seed + rank
        if self.deterministic:
            mixture = MixturePriority(self.kind_weights, seed=seed, deterministic=True)
            mixture.skip(self.start_counters(rank).batches)
            return mixture
        return MixturePriority(self.kind_weights, seed=seed, backlog_fn=backlog_fn, queue_rows=backlog_fn is not None)


def phase_context(run: TrainingRun, phase: Phase, world: int) -> PhaseContext:
    """The context of ``phase`` of ``run`` for a group of ``world`` trainers: it starts from the run's
    latest checkpoint (a resume, or the previous phase's end), else from the warm start, else fresh."""
    start = None
    if run.latest is not None:
        latest = run.latest
        start = TrainerStart(
            str(latest.path), "resume", None, latest.step, latest.phase, latest.phase_done, latest.ranks
        )
    elif run.warm_path is not None:
        start = TrainerStart(str(run.warm_path), "warm", run.request.warm_start)
    window = run.request.window
    return PhaseContext(
        spec_json=run.spec.model_dump_json(exclude_unset=True),  # defaults re-derived where it is read
        phase=phase.name,
        prioritised=phase.prioritised,
        deterministic=run.job.data.deterministic,
        kind_weights=run.job.kind_weights(),
        world=world,
        versions=dict(run.versions),
        window=[window.start.isoformat(), window.end.isoformat()],
        checkpoint_dir=str(run.workdir / "checkpoints"),
        model_init=run.model_init.to_dict() if run.model_init is not None else None,
        start=start,
        data_quality={k: dict(v) for k, v in run.data_quality.items()},
        data_quality_places=run.quality_places,
        sharding=run.memory_plan.sharding if run.memory_plan is not None else "replicated",
    )


def checkpoint_record(
    context: PhaseContext,
    trainer: Trainer,
    rounds: int,
    ranks: Sequence[RankCounters],
    snapshot: dict[str, Any] | None,
    *,
    phase_done: bool,
    sharded: ShardedInfo | None = None,
) -> Checkpoint:
    """The checkpoint of a phase at round ``rounds``: the model and optimizer of ``trainer`` (the same
    on every rank; ``sharded``: but for the sharded tables, which the ranks saved as shards), every rank's
    counters and their sums, the driver's barrier ``snapshot``, the run's source versions and window, the
    finished phases' quality counts."""
    total = RankCounters.summed(ranks)
    model_state, optimizer_state = trainer.state()
    shards: dict[str, Any] = {}
    if sharded is not None:
        model_state, optimizer_state = strip_sharded(model_state, optimizer_state, sharded)
        shards = {"sharded": sharded.to_dict()}
    stats = {
        "step": rounds,
        "samples": total.samples,
        "samples_batch": total.samples_by_kind["batch"],
        "samples_stream": total.samples_by_kind["stream"],
        "trainer_steps": total.steps,
        "trainers": len(ranks),
        "kernels": trainer.kernels.describe(),  # rank 0's (every rank takes the same: kernels.KernelPolicy)
    }
    return trainer_checkpoint(
        model_state,
        optimizer_state,
        step=rounds,
        samples=total.samples,
        samples_by_kind=total.samples_by_kind,
        phase=context.phase,
        phase_done=phase_done,
        snapshot=snapshot,
        versions=context.versions,
        mode=context.spec.mode,
        window=context.window,
        layout=trainer.model.layout,
        stats=stats,
        data_quality=context.data_quality,
        data_quality_places=context.data_quality_places,
        trainers=len(ranks),
        ranks=[r.to_dict() for r in ranks],
        **shards,
    )
