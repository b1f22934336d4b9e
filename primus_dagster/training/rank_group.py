"""A rank group: the :class:`~primus_dagster.training.window.PhaseTrainer` of a job with
``pools.training.replicas: N > 1`` -- each phase trained by N rank processes in lock-step rounds.

* **Data.** The phase's data plane is made with ``trainers=N`` on a driver made for N; rank ``r``
  reads trainer ``r``'s batches with its own :class:`RemoteReader` over Flight. ``data.shuffle``
  decides, in the data executors, which trainer gets a batch, as it does for any group of trainers.
* **Rounds.** The ranks step in lock-step rounds (:class:`~primus_dagster.training.distributed.RankLoop`)
  with the row-sparse gradient exchange; ``step`` is the round count, the same on every rank.
* **Checkpoints.** Once ``checkpoint_every_steps`` rounds have passed, the ranks stop pulling and
  finish the reader batches they hold; at the first round in which no rank holds one -- the same
  round on every rank, decided from the round's all-gathered status -- every rank reports its
  consumed batches at the driver barrier ``step``, the ranks all-gather their counters, and rank 0
  saves model + optimizer (identical on every rank) + the barrier snapshot + the counters of every
  rank; the parent logs it to MLflow. So a checkpoint covers whole reader batches of every rank.
  Also at the end of each phase.
* **Resume.** Every rank loads the run's latest checkpoint (model, Adam state, its own counters); the
  driver restored from its snapshot serves exactly the batches it had not seen. A warm start loads a
  finished run's weights.
* **The parent** (this process) spawns the ranks (:mod:`~primus_dagster.training.distributed.launch`),
  forwards their trained reader batches to ``hooks.on_batch`` (a checkpoint is logged only after
  every rank's batches up to it were handed over), logs progress and checkpoints; the window skeleton
  evaluates and logs the final checkpoint's model.
* **Pool keys.** ``pools.training.cpu``: ``ceil(cpu)`` torch threads per rank, pinned to as many
  cores of their own when the machine has ``N * ceil(cpu)`` (else unpinned); ``memory``: a rank
  whose RSS exceeds it is killed (the group fails); ``restart: on_failure`` with ``max_restarts``: the
  skeleton starts a failed group again from the latest checkpoint (its trained batches after that
  checkpoint are trained again -- an audit log through ``on_batch`` shows them twice), ``never``: the
  first failure fails the job. A failed rank fails the job with its traceback; every rank process is
  stopped (terminate, then kill) and the data plane closed, whatever happened.

Example::

    job = load_job_spec("job.yaml")          # pools: {training: {replicas: 2}}
    result = train_window(TrainingRequest(job, "job.yaml", "/data", window))   # trains with a RankGroup
    result.stats["trainers"], [r["params_checksum"] for r in result.stats["ranks"]]
"""

from __future__ import annotations

import logging
import math
import os
import queue as queue_mod
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

from primus_dagster.cluster.pool import memory_bytes
from primus_dagster.data import DataPlane, DriverClient, RemoteReader
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.checkpoint import (
    Checkpoint,
    checkpoint_name,
    load_checkpoint,
    load_weights,
    save_checkpoint,
    trainer_checkpoint,
)
from primus_dagster.training.distributed import (
    RankLoop,
    RankProcesses,
    first_failure,
    params_checksum,
    pin_cores,
    serve_rank,
)
from primus_dagster.training.features import ModelInit
from primus_dagster.training.models import RecModel, build_initial_model
from primus_dagster.training.modes import Phase
from primus_dagster.training.planning import NoTrainingDataError
from primus_dagster.training.priority import MixturePriority
from primus_dagster.training.run_state import RankHook, RunHooks, TrainingRun
from primus_dagster.training.trainer import Trainer, TrainerStats

log = logging.getLogger(__name__)


class RankFailedError(RuntimeError):
    """A trainer rank failed (raised, died, or went over its memory); the message names it and
    carries its traceback."""


@dataclass(frozen=True)
class RankPlan:
    """What every rank of one phase's group gets (pickled into the spawned processes)."""

    location: str  # the data driver's Flight address
    token: str
    spec_json: str  # TrainingSpec
    phase: str
    prioritised: bool
    world_size: int
    threads: int
    cores: list[list[int] | None]  # per rank
    checkpoint_dir: str
    versions: dict[str, Any]
    window: list[str]
    init_path: str | None  # the checkpoint every rank starts from
    init_kind: str | None  # "resume" (model, optimizer, counters) | "warm" (model, optimizer)
    warm_key: str | None
    record_batches: bool  # send every trained reader batch to the parent (hooks.on_batch)
    parent_pid: int
    rank_hook: RankHook | None = None
    collective_timeout_s: float = 300.0
    progress_s: float = 2.0
    kind_weights: dict[str, float] = field(default_factory=dict)  # w_i per kind (JobSpec.kind_weights)
    model_init: dict[str, Any] | None = None  # ModelInit.to_dict(): the layout and fresh dense statistics


class _Rank:
    """One rank of a phase's group: its loop's hooks (init, checkpoints, batches, progress)."""

    def __init__(self, rank: int, plan: RankPlan, reader: RemoteReader, out: Any):
        self.rank, self.plan, self.reader, self.out = rank, plan, reader, out
        self.spec = TrainingSpec.model_validate_json(plan.spec_json)
        self.init = load_checkpoint(plan.init_path) if plan.init_path else None
        self.loop = RankLoop(self.spec, lambda wait_s: reader.next_batch(timeout=wait_s))
        self.loop.init = ModelInit.from_dict(plan.model_init) if plan.model_init is not None else None
        self.loop.every = self.spec.checkpoint_every_steps
        if self.init is not None and plan.init_kind == "resume":
            self.loop.rounds = self.init.step
        self.loop.next_checkpoint = self.loop.rounds + self.loop.every
        self.loop.on_build = self._apply_init
        self.loop.on_checkpoint = lambda rounds: self.checkpoint(phase_done=False)
        self.loop.before_round = self._before_round
        if plan.record_batches:
            self.loop.on_batch_done = lambda rounds, batch: out.put((rank, "batch", (rounds, batch)))
        self.samples0, self._last_progress = 0, time.monotonic()

    def _apply_init(self, trainer: Trainer) -> None:
        init = self.init
        if init is None:
            return
        warm_key = self.plan.warm_key if self.plan.init_kind == "warm" else None
        load_weights(trainer.model, trainer.optimizer, init, warm_key=warm_key)
        if self.plan.init_kind == "resume":
            ranks = init.extra.get("ranks")
            if ranks is None:  # a checkpoint of one trainer: its counters are rank 0's
                by_kind = init.extra.get("samples_by_kind") or {}
                ranks = [{"steps": init.step, "samples": init.samples, "samples_by_kind": by_kind, "null_steps": 0}]
            mine: list[dict[str, Any]] = ranks[self.rank : self.rank + 1]
            if self.rank == 0:  # a smaller group than the checkpoint's: rank 0 carries the rest
                mine += ranks[self.plan.world_size :]
            own = _summed(mine)
            trainer.counters = TrainerStats(
                step=own["steps"], samples=own["samples"], samples_by_kind=own["samples_by_kind"]
            )
            self.loop.null_steps = own["null_steps"]
        self.samples0 = trainer.counters.samples

    def _before_round(self, rounds: int) -> None:
        if os.getppid() != self.plan.parent_pid:
            raise RuntimeError(f"trainer rank {self.rank}: the job process {self.plan.parent_pid} is gone")
        if self.plan.rank_hook is not None:
            self.plan.rank_hook(self.rank, rounds)
        now = time.monotonic()
        trainer = self.loop.trainer
        if trainer is not None and now - self._last_progress >= self.plan.progress_s:
            self._last_progress = now
            stats = {**trainer.stats(), "rounds": rounds, "train_auc": trainer.recent_auc()}
            self.out.put((self.rank, "progress", stats))

    def checkpoint(self, *, phase_done: bool) -> None:
        """Collective: every rank at the same round (module docstring). Rank 0 saves and tells the
        parent; the others tell the parent their batches up to here were sent (a "mark")."""
        loop, rounds = self.loop, self.loop.rounds
        snapshot = None
        if not phase_done:
            snapshot = self.reader.barrier(rounds, wait_s=120.0 if self.rank == 0 else 0.0)
            if self.rank == 0 and snapshot is None:
                raise RuntimeError(f"no driver barrier snapshot at round {rounds} within 120 s")
        c = loop.trainer.counters if loop.trainer is not None else TrainerStats()
        mine = [c.step, c.samples, c.samples_by_kind.get("batch", 0), c.samples_by_kind.get("stream", 0)]
        gathered = [torch.empty(5, dtype=torch.int64) for _ in range(self.plan.world_size)]
        dist.all_gather(gathered, torch.tensor([*mine, loop.null_steps], dtype=torch.int64))
        if self.rank != 0 or loop.trainer is None:
            self.out.put((self.rank, "mark", rounds))
            return
        ranks = [
            {
                "steps": int(g[0]),
                "samples": int(g[1]),
                "samples_by_kind": {"batch": int(g[2]), "stream": int(g[3])},
                "null_steps": int(g[4]),
            }
            for g in gathered
        ]
        total = _summed(ranks)
        trainer = loop.trainer
        stats = {
            "step": rounds,
            "samples": total["samples"],
            "samples_batch": total["samples_by_kind"]["batch"],
            "samples_stream": total["samples_by_kind"]["stream"],
            "trainer_steps": total["steps"],
            "trainers": self.plan.world_size,
            "kernels": trainer.kernels.describe(),  # rank 0's (every rank takes the same: kernels.KernelPolicy)
        }
        ck = trainer_checkpoint(
            *trainer.state(),
            step=rounds,
            samples=total["samples"],
            samples_by_kind=total["samples_by_kind"],
            phase=self.plan.phase,
            phase_done=phase_done,
            snapshot=snapshot,
            versions=self.plan.versions,
            mode=self.spec.mode,
            window=self.plan.window,
            layout=trainer.model.layout,
            stats=stats,
            trainers=self.plan.world_size,
            ranks=ranks,
        )
        directory = save_checkpoint(ck, Path(self.plan.checkpoint_dir) / checkpoint_name(rounds))
        info = {"step": rounds, "path": str(directory), "phase": self.plan.phase, "phase_done": phase_done}
        self.out.put((0, "checkpoint", {**info, **stats}))

    def finish(self) -> None:
        """The end of the phase: build the model from the start checkpoint when no batch came (so
        the phase's checkpoint still says it is done), then the phase's checkpoint."""
        if self.loop.trainer is None and self.init is not None:
            self.loop.build(int(self.init.extra["n_dense"]), int(self.init.extra["n_sparse"]))
        self.checkpoint(phase_done=True)

    def result(self, wall_s: float, cpu_s: float) -> dict[str, Any]:
        loop, trainer = self.loop, self.loop.trainer
        c = trainer.counters if trainer is not None else TrainerStats()
        checksum = params_checksum(trainer.model)[0] if trainer is not None else ""
        trained = c.samples - self.samples0
        rounds = max(
            1, loop.rounds - (self.init.step if self.init is not None and self.plan.init_kind == "resume" else 0)
        )
        return {
            "rank": self.rank,
            "steps": c.step,
            "samples": c.samples,
            "samples_by_kind": dict(c.samples_by_kind),
            "null_steps": loop.null_steps,
            "loss": c.loss_ema,
            "samples_trained": trained,
            "wall_s": round(wall_s, 3),
            "cpu_s": round(cpu_s, 3),
            "train_s": round(c.train_s, 3),
            "exchange_s": round(loop.exchange_s, 3),
            "exchange_bytes_per_step": round(loop.bytes_sent / rounds),
            "params_checksum": checksum,
        }


def _summed(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    by_kind: dict[str, int] = {}
    for r in ranks:
        for kind, n in (r.get("samples_by_kind") or {}).items():
            by_kind[kind] = by_kind.get(kind, 0) + int(n)
    return {
        "steps": sum(int(r["steps"]) for r in ranks),
        "samples": sum(int(r["samples"]) for r in ranks),
        "samples_by_kind": {"batch": by_kind.get("batch", 0), "stream": by_kind.get("stream", 0)},
        "null_steps": sum(int(r.get("null_steps", 0)) for r in ranks),
    }


def rank_main(rank: int, init_method: str, out: Any, plan: RankPlan) -> None:
    """One rank process of a phase's group (the target :class:`RankGroup` spawns)."""
    pin_cores(plan.cores[rank])

    def body() -> dict[str, Any]:
        started, cpu0 = time.perf_counter(), time.process_time()
        spec = TrainingSpec.model_validate_json(plan.spec_json)
        chooser = MixturePriority(plan.kind_weights, seed=spec.seed + rank) if plan.prioritised else None
        with (
            DriverClient(plan.location, token=plan.token) as client,
            RemoteReader(client, rank, token=plan.token, choose_queue=chooser) as reader,
        ):
            state = _Rank(rank, plan, reader, out)
            state.loop.run()
            state.finish()
        return state.result(time.perf_counter() - started, time.process_time() - cpu0)

    serve_rank(rank, plan.world_size, init_method, plan.threads, out, body, timeout_s=plan.collective_timeout_s)


class _Group:
    """Spawn a phase's ranks, serve their messages, stop them whatever happens (parent side)."""

    def __init__(self, group: RankGroup, run: TrainingRun, plane: DataPlane):
        self.run, self.hooks, self.group, self.plane = run, group.hooks, group, plane
        self.memory = memory_bytes(run.job.pools.training.memory)
        self.world = group.trainers
        self.marks: dict[int, int] = {}  # rank -> the last checkpoint round whose batches it has sent
        self.pending: list[dict[str, Any]] = []
        self.results: dict[int, dict[str, Any]] = {}
        self.errors: dict[int, tuple[float, str]] = {}
        self.progressed = False  # a rank's first progress message came (its stage line was logged)

    def run_group(self, plan: RankPlan, phase: Phase) -> None:
        started = time.perf_counter()
        with RankProcesses(rank_main, plan.world_size, plan, name="trainer-rank") as ranks:  # stopped whatever happens
            self._serve(ranks.out, ranks.procs, phase)
            ranks.join(30)
        self.group.train_wall_s += time.perf_counter() - started
        self.group.ranks = [self.results[r] for r in range(plan.world_size)]
        self.group.trained += sum(r["samples_trained"] for r in self.group.ranks)

    def _serve(self, out: Any, procs: list[Any], phase: Phase) -> None:
        world, quiet_since, next_check = len(procs), None, 0.0
        while len(self.results) < world or self.pending:
            if time.monotonic() >= next_check:  # memory, also while messages keep coming
                self._check_memory(procs)
                next_check = time.monotonic() + 0.2
            try:
                rank, kind, payload = out.get(timeout=0.2)
            except queue_mod.Empty:
                if self.errors:
                    break  # quiet after an error: the others lost their peer, or will
                if len(self.results) == world:  # every rank is done: nothing more will come
                    steps = [c["step"] for c in self.pending]
                    raise RankFailedError(f"checkpoints at steps {steps}: not every rank confirmed them") from None
                gone = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode is not None and r not in self.results}
                if gone:  # a rank exited without a word: give its last messages a moment
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 2.0:
                        rank, code = min(gone.items())
                        raise RankFailedError(f"trainer rank {rank} died with exit code {code}") from None
                continue
            self._handle(rank, kind, payload, phase)
        if self.errors:
            rank = first_failure(self.errors)  # the first to fail is the cause
            raise RankFailedError(
                f"trainer rank {rank} failed (failed ranks: {sorted(self.errors)}):\n{self.errors[rank][1]}"
            )

    def _handle(self, rank: int, kind: str, payload: Any, phase: Phase) -> None:
        if not self.progressed and kind in ("batch", "progress", "mark", "checkpoint"):
            # a short phase may end before a rank's first progress report: any training message counts
            self.progressed = True
            self.run.stage("phase %s: training (first progress from rank %d)", phase.name, rank)
        if kind == "batch":
            if self.hooks.on_batch is not None:
                step, batch = payload
                self.hooks.on_batch(step, batch)
        elif kind == "progress":
            self._progress(rank, payload, phase)
        elif kind == "mark":
            self.marks[rank] = payload
        elif kind == "checkpoint":
            self.marks[rank] = payload["step"]
            self.pending.append(payload)
        elif kind == "ok":
            self.results[rank] = payload
        elif kind == "error":
            self.errors[rank] = payload
        # a checkpoint is logged once every rank's batches up to it were handed to on_batch
        while self.pending and len(self.marks) == self.world and min(self.marks.values()) >= self.pending[0]["step"]:
            self._log_checkpoint(self.pending.pop(0), phase)

    def _log_checkpoint(self, info: dict[str, Any], phase: Phase) -> None:
        """Every rank's batches up to this checkpoint were handed to ``on_batch``: log it."""
        if info["phase_done"]:
            self.plane.driver.raise_if_failed()  # a failed data job must not be marked done
        step, directory = int(info["step"]), Path(info["path"])
        previous = self.run.latest
        what = f"{info['samples']} samples over {info['trainers']} trainers"
        self.group.step = step
        self.run.log_checkpoint(directory, step, phase.name, phase_done=bool(info["phase_done"]), what=what)
        if info["phase_done"]:  # the phase's final counts, as one trainer logs them (progress is every 2 s)
            self._publish(phase, step, int(info["samples"]))
        if previous is not None and previous.path != directory:
            shutil.rmtree(previous.path, ignore_errors=True)

    def _progress(self, rank: int, stats: dict[str, Any], phase: Phase) -> None:
        state = self.group
        state.progress[rank] = stats
        now = time.monotonic()
        if now - state.last_report < 2.0:
            return
        state.last_report = now
        seen = list(state.progress.values())
        self._publish(phase, max(int(s["rounds"]) for s in seen), sum(int(s["samples"]) for s in seen))

    def _publish(self, phase: Phase, step: int, samples: int) -> None:
        """A progress point of the group: the ranks' latest loss, speed and train AUC, and ``samples``."""
        state = self.group
        seen = list(state.progress.values())
        losses = [float(s["loss"]) for s in seen if s["loss"] == s["loss"]]
        metrics = {
            "loss": sum(losses) / len(losses) if losses else float("nan"),
            "samples_per_s": sum(float(s["samples_per_s"]) for s in seen),
            "samples": samples,
            "train_auc": float(state.progress.get(0, seen[0])["train_auc"]) if seen else float("nan"),
        }
        self.run.publish_progress(phase.name, step, metrics, {"trainers": self.world})

    def _check_memory(self, procs: list[Any]) -> None:
        for rank, proc in enumerate(procs):
            if proc.pid is None or proc.exitcode is not None:
                continue
            try:
                rss = psutil.Process(proc.pid).memory_info().rss
            except psutil.Error:
                continue
            if rss > self.memory:
                proc.kill()
                raise RankFailedError(
                    f"trainer rank {rank}: RSS {rss / 2**20:.0f} MiB above pools.training.memory "
                    f"{self.run.job.pools.training.memory}: killed"
                )


def _cores(cpu: float, world: int) -> list[list[int] | None]:
    """``ceil(cpu)`` cores of its own per rank when there are enough, else no pinning."""
    per = max(1, math.ceil(cpu))
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(available) < per * world:
        return [None] * world
    return [available[r * per : (r + 1) * per] for r in range(world)]


class RankGroup:
    """The N ranks that train each phase of a window run (module docstring).

    Example::

        group = RankGroup(RunHooks(), world=2)
        result = train_window(request, trainer=group)      # what train_window picks for replicas: 2
        result.stats["ranks"][1]["samples_trained"]
    """

    restartable = True

    def __init__(self, hooks: RunHooks, world: int):
        self.hooks, self.trainers = hooks, world
        self.ranks: list[dict[str, Any]] = []  # the last group's rank results
        self.trained = 0  # samples trained by this process's groups
        self.train_wall_s = 0.0
        self.progress: dict[int, dict[str, Any]] = {}
        self.last_report = 0.0
        self.final: Checkpoint | None = None
        self.step = 0  # the latest checkpoint's round

    def describe(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {"trainers": self.trainers}, {"primus.trainers": str(self.trainers)}

    def begin(self, run: TrainingRun, resume: Checkpoint | None) -> None:
        pass  # the ranks load the run's latest checkpoint (or the warm start) themselves

    def train_phase(self, run: TrainingRun, phase: Phase, plane: DataPlane) -> None:
        job, world = run.job, self.trainers
        if run.latest is not None:
            init_path, init_kind = str(run.latest.path), "resume"
        elif run.warm_path is not None:
            init_path, init_kind = str(run.warm_path), "warm"
        else:
            init_path, init_kind = None, None
        window = run.request.window
        plan = RankPlan(
            location=plane.location,
            token=plane.token or "",
            spec_json=job.training.model_dump_json(exclude_unset=True),  # defaults re-derived in the ranks
            phase=phase.name,
            prioritised=phase.prioritised,
            kind_weights=job.kind_weights(),
            world_size=world,
            threads=max(1, math.ceil(job.pools.training.cpu)),
            cores=_cores(job.pools.training.cpu, world),
            checkpoint_dir=str(run.workdir / "checkpoints"),
            versions=dict(run.versions),
            window=[window.start.isoformat(), window.end.isoformat()],
            init_path=init_path,
            init_kind=init_kind,
            warm_key=run.request.warm_start,
            record_batches=self.hooks.on_batch is not None,
            parent_pid=os.getpid(),
            rank_hook=self.hooks.rank_hook,
            model_init=run.model_init.to_dict() if run.model_init is not None else None,
        )
        run.stage("phase %s: data executors up; starting %d trainer rank(s)", phase.name, world)
        _Group(self, run, plane).run_group(plan, phase)

    def end_phase(self, run: TrainingRun, phase: Phase) -> None:
        pass  # the ranks closed the phase with its checkpoint

    def final_model(self, run: TrainingRun) -> tuple[RecModel, int]:
        if run.latest is None:
            raise NoTrainingDataError(f"job {run.job.name}: the window {run.request.window} produced no batches")
        final = self.final = load_checkpoint(run.latest.path)
        spec = run.spec
        model = build_initial_model(spec.model, ModelInit.of_checkpoint(final.extra, spec.model), seed=spec.seed)
        model.load_state_dict(final.model_state)
        return model, final.step

    def stats(self, run: TrainingRun) -> dict[str, Any]:
        assert self.final is not None  # final_model came first
        losses = [float(r["loss"]) for r in self.ranks if r["loss"] == r["loss"]]
        return {
            **(self.final.extra.get("stats") or {}),
            "loss": sum(losses) / len(losses) if losses else float("nan"),
            "samples_per_s": round(self.trained / self.train_wall_s, 1) if self.train_wall_s else 0.0,
            "trainers": self.trainers,
            "ranks": self.ranks or self.final.extra.get("ranks", []),
        }
