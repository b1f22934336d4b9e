"""The training job with N trainers: ``pools.training.replicas: N > 1`` (``train_window`` dispatches here).

Same job as :mod:`~primus_dagster.training.job` -- plan, MLflow run (started or resumed by run key),
the phases of the mode, checkpoints, next-hour evaluation, the logged model -- with the training of
each phase done by a group of N rank processes (``spawn``, gloo on loopback; ``distributed.py``):

* **Data.** One data plane per phase, the same :class:`PooledDataPlane` (or ``hooks.data_plane``) as
  one trainer's, made with ``trainers=N`` on a driver made for N (``DataDriver.for_job(data,
  trainers=N)``, or restored from the checkpoint's snapshot); rank ``r`` reads trainer ``r``'s
  batches with its own :class:`RemoteReader` over Flight. ``data.shuffle`` decides, in the data
  executors, which trainer gets a batch, as it does for any group of trainers.
* **Rounds.** The ranks step in lock-step rounds (:class:`~primus_dagster.training.distributed.RankLoop`)
  with the row-sparse gradient exchange; ``step`` is the round count, the same on every rank.
* **Checkpoints.** Once ``checkpoint_every_steps`` rounds have passed, the ranks stop pulling and
  finish the reader batches they hold; at the first round in which no rank holds one -- the same
  round on every rank, decided from the round's all-gathered status -- every rank reports its
  consumed batches at the driver barrier ``step``, the ranks all-gather their counters, and rank 0
  saves model + optimizer (identical on every rank) + the barrier snapshot + the counters of every
  rank; the parent logs it to MLflow. So a checkpoint covers whole reader batches of every rank.
  Also at the end of each phase.
* **Resume.** A run key whose run did not finish resumes from its latest checkpoint: every rank loads
  the same file (model, Adam state, its own counters), the driver restored from the snapshot serves
  exactly the batches the checkpoint had not seen. ``warm_start`` loads a finished run's weights.
* **The parent** (``primus-dagster train`` or the training asset's step) runs the plane, spawns the
  ranks, forwards their trained reader batches to ``hooks.on_batch`` (a checkpoint is logged only
  after every rank's batches up to it were handed over), logs progress and checkpoints, and at the
  end evaluates rank 0's model on the next hours and logs it with ``mlflow.pytorch``.
* **What it tells.** The same run log as one trainer's (:class:`~primus_dagster.training.progress.Heartbeat`
  stage lines: planning, tasks planned, the MLflow run, inputs, executors and ranks starting, first
  progress, checkpoints, evaluation, the model; a heartbeat when a stage is silent), the consumed
  sources as MLflow dataset inputs (``log_source_inputs``) and each phase's data-quality counts
  (``job._record_quality``: result, metadata, MLflow metrics ``data_quality.<source>.<rule>``).
* **Pool keys.** ``pools.training.cpu``: ``ceil(cpu)`` torch threads per rank, pinned to as many
  cores of their own when the machine has ``N * ceil(cpu)`` (else unpinned); ``memory``: a rank
  whose RSS exceeds it is killed (the group fails, see restart); ``restart: on_failure`` with
  ``max_restarts``: a failed group starts again from the latest checkpoint (its trained batches
  after that checkpoint are trained again -- an audit log through ``on_batch`` shows them twice),
  ``never``: the first failure fails the job. A failed rank fails the job with its traceback; every
  rank process is stopped (terminate, then kill) and the data plane closed, whatever happened.

Example::

    job = load_job_spec("job.yaml")          # pools: {training: {replicas: 2}}
    result = train_window(TrainingRequest(job, "job.yaml", "/data", window))   # -> run_multi_trainer_job
    result.stats["trainers"], [r["params_checksum"] for r in result.stats["ranks"]]
"""

from __future__ import annotations

import logging
import math
import os
import queue as queue_mod
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from primus_dagster.cluster.backends import data_plane_starter
from primus_dagster.cluster.pool import memory_bytes
from primus_dagster.data import DriverClient, NotReady, RemoteReader, SourceContext
from primus_dagster.ports import free_port
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.checkpoint import Checkpoint, checkpoint_name, load_checkpoint, save_checkpoint
from primus_dagster.training.distributed import RankLoop, params_checksum, pin_cores, serve_rank
from primus_dagster.training.job import (
    RUN_KIND_TAG,
    RunHooks,
    TrainingRequest,
    TrainingResult,
    TrainingRun,
    _record_quality,
    driver_for,
    evaluate_and_log,
    load_resume,
    load_warm_start,
    run_params,
    training_result,
)
from primus_dagster.training.models import build_model
from primus_dagster.training.modes import Phase, phase_index, phase_tasks, phases
from primus_dagster.training.planning import NoTrainingDataError, plan_training_tasks, planned_line
from primus_dagster.training.priority import LoadingPriority, MixturePriority
from primus_dagster.training.progress import Heartbeat
from primus_dagster.training.tracking import MlflowTracker
from primus_dagster.training.trainer import Trainer, TrainerStats

log = logging.getLogger(__name__)

RankHook = Callable[[int, int], None]
"""``(rank, round)``, called in every rank process before each round (fault injection, audits);
module-level functions only: it is pickled into the spawned ranks."""

_COUNTERS = ("steps", "samples", "samples_batch", "samples_stream", "null_steps")


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


class _Rank:
    """One rank of a phase's group: its loop's hooks (init, checkpoints, batches, progress)."""

    def __init__(self, rank: int, plan: RankPlan, reader: RemoteReader, out: Any):
        self.rank, self.plan, self.reader, self.out = rank, plan, reader, out
        self.spec = TrainingSpec.model_validate_json(plan.spec_json)
        self.init = load_checkpoint(plan.init_path) if plan.init_path else None
        self.loop = RankLoop(self.spec, lambda wait_s: reader.next_batch(timeout=wait_s))
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
        try:
            trainer.model.load_state_dict(init.model_state)
            trainer.optimizer.load_state_dict(init.optimizer_state)
        except (RuntimeError, ValueError) as exc:
            if self.plan.init_kind == "warm":
                raise ValueError(
                    f"cannot warm-start from run key {self.plan.warm_key!r}: its model does not fit this "
                    f"job's (was training.model or the columns changed?): {exc}"
                ) from exc
            raise
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
        model_state, optimizer_state = trainer.state()
        stats = {
            "step": rounds,
            "samples": total["samples"],
            "samples_batch": total["samples_by_kind"]["batch"],
            "samples_stream": total["samples_by_kind"]["stream"],
            "trainer_steps": total["steps"],
            "trainers": self.plan.world_size,
        }
        ck = Checkpoint(
            step=rounds,
            samples=total["samples"],
            model_state=model_state,
            optimizer_state=optimizer_state,
            data_snapshot=snapshot,
            source_versions=self.plan.versions,
            phase=self.plan.phase,
            extra={
                "phase_done": phase_done,
                "samples_by_kind": total["samples_by_kind"],
                "mode": self.spec.mode,
                "window": self.plan.window,
                "n_dense": trainer.model.n_dense,
                "n_sparse": trainer.model.n_sparse,
                "trainers": self.plan.world_size,
                "ranks": ranks,
                "stats": stats,
            },
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


def rank_main(rank: int, init_method: str, plan: RankPlan, out: Any) -> None:
    """One rank process of a phase's group (the target :func:`run_multi_trainer_job` spawns)."""
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


@dataclass
class _JobState:
    """The parent's view of the job across phases and group restarts."""

    init_path: Path | None = None
    init_kind: str | None = None
    latest: dict[str, Any] | None = None  # the last logged checkpoint's message (step, path, phase_done, stats)
    ranks: list[dict[str, Any]] = field(default_factory=list)  # the last group's rank results
    trained: int = 0  # samples trained by this process's groups
    train_wall_s: float = 0.0
    progress: dict[int, dict[str, Any]] = field(default_factory=dict)
    last_report: float = 0.0


class _Group:
    """Spawn a phase's ranks, serve their messages, stop them whatever happens (parent side)."""

    def __init__(self, cfg: TrainingRequest, run: TrainingRun, hooks: RunHooks, state: _JobState, plane: Any):
        self.cfg, self.run, self.hooks, self.state, self.plane = cfg, run, hooks, state, plane
        self.memory = memory_bytes(cfg.job.pools.training.memory)
        self.world = cfg.job.pools.training.replicas
        self.marks: dict[int, int] = {}  # rank -> the last checkpoint round whose batches it has sent
        self.pending: list[dict[str, Any]] = []
        self.results: dict[int, dict[str, Any]] = {}
        self.errors: dict[int, tuple[float, str]] = {}
        self.progressed = False  # a rank's first progress message came (its stage line was logged)

    def run_group(self, plan: RankPlan, phase: Phase) -> None:
        ctx = mp.get_context("spawn")
        out: Any = ctx.Queue()
        init = f"tcp://127.0.0.1:{free_port()}"
        procs = [
            ctx.Process(target=rank_main, args=(r, init, plan, out), name=f"trainer-rank-{r}", daemon=True)
            for r in range(plan.world_size)
        ]
        started = time.perf_counter()
        try:
            for proc in procs:
                proc.start()
            self._serve(out, procs, phase)
            for proc in procs:
                proc.join(30)
        finally:
            _stop(procs)
        self.state.train_wall_s += time.perf_counter() - started
        self.state.ranks = [self.results[r] for r in range(plan.world_size)]
        self.state.trained += sum(r["samples_trained"] for r in self.state.ranks)

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
            rank = min(self.errors, key=lambda r: self.errors[r][0])  # the first to fail is the cause
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
        tracker = self.run.tracker
        tracker.log_checkpoint(directory, step, keep_last=self.run.spec.checkpoint_keep_last)
        tracker.log_metrics({"checkpoint_step": step}, step)
        self.run.checkpoints.append(step)
        previous, self.state.latest = self.state.latest, info
        self.state.init_path, self.state.init_kind = directory, "resume"
        if previous is not None and Path(previous["path"]) != directory:
            shutil.rmtree(previous["path"], ignore_errors=True)
        log.info(
            "checkpoint at step %d (%s samples over %d trainers, phase %s%s)",
            step,
            info["samples"],
            info["trainers"],
            phase.name,
            ", done" if info["phase_done"] else "",
        )
        if self.run.beat is not None:
            self.run.beat.quiet_stage(f"phase {phase.name}: training (step {step})")

    def _progress(self, rank: int, stats: dict[str, Any], phase: Phase) -> None:
        state = self.state
        state.progress[rank] = stats
        now = time.monotonic()
        if now - state.last_report < 2.0:
            return
        state.last_report = now
        seen = list(state.progress.values())
        step = max(int(s["rounds"]) for s in seen)
        losses = [float(s["loss"]) for s in seen if s["loss"] == s["loss"]]
        metrics = {
            "loss": sum(losses) / len(losses) if losses else float("nan"),
            "samples_per_s": sum(float(s["samples_per_s"]) for s in seen),
            "samples": sum(int(s["samples"]) for s in seen),
            "train_auc": float(state.progress.get(0, seen[0])["train_auc"]),
        }
        self.run.tracker.log_metrics(metrics, step)
        if self.cfg.progress is not None:
            self.cfg.progress({"phase": phase.name, "step": step, "trainers": len(seen), **metrics})
            if self.run.beat is not None:
                self.run.beat.touch()

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
                    f"{self.cfg.job.pools.training.memory}: killed"
                )


def _stop(procs: list[Any]) -> None:
    """Terminate the rank processes still alive, kill those that do not stop, reap them all."""
    for proc in procs:
        if proc.pid is not None and proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + 5.0
    for proc in procs:
        if proc.pid is None:
            continue
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def _cores(cpu: float, world: int) -> list[list[int] | None]:
    """``ceil(cpu)`` cores of its own per rank when there are enough, else no pinning."""
    per = max(1, math.ceil(cpu))
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(available) < per * world:
        return [None] * world
    return [available[r * per : (r + 1) * per] for r in range(world)]


def run_multi_trainer_job(
    cfg: TrainingRequest, hooks: RunHooks | None = None, *, rank_hook: RankHook | None = None
) -> TrainingResult:
    """Train ``cfg.job``'s model on ``cfg.window`` with ``pools.training.replicas`` trainers (module
    docstring). ``rank_hook(rank, round)`` runs in every rank before each round (tests inject faults)."""
    with Heartbeat() as beat:  # a line in the run log at least every few seconds, whatever the stage
        return _train_window(cfg, hooks or RunHooks(), rank_hook, beat)


def _train_window(cfg: TrainingRequest, hooks: RunHooks, rank_hook: RankHook | None, beat: Heartbeat) -> TrainingResult:
    started = time.perf_counter()
    job, spec = cfg.job, cfg.job.training
    world = job.pools.training.replicas
    torch.set_num_threads(spec.threads)  # this process: evaluation
    context = SourceContext(str(cfg.data_root), kafka_bootstrap_servers=cfg.kafka_bootstrap)
    skipped: list[NotReady] = []
    if cfg.tasks is None:
        names = [source.name for _, source in job.dataset.all_sources()]
        beat.stage("planning window %s: listing %d source(s) (%s)", cfg.window, len(names), ", ".join(names))
    tasks = cfg.tasks if cfg.tasks is not None else plan_training_tasks(job, context, cfg.window, skipped)
    beat.stage(planned_line(job, tasks, skipped))
    executors = cfg.executors or job.pools.data.replicas or 1
    tracker = cfg.tracker or MlflowTracker(job.tracking.tracking_uri, job.tracking.experiment)
    tags = {"primus.job": job.name, RUN_KIND_TAG: "window", "primus.trainers": str(world), **cfg.tags}
    beat.stage("MLflow: opening the run %s", cfg.key())
    tracker.start(cfg.key(), params={**run_params(job, cfg.window, executors), "trainers": world}, tags=tags)
    run = TrainingRun(cfg, tracker, tasks)
    run.beat = beat
    state = _JobState()
    status = "FAILED"
    try:
        log.info("MLflow run %s %s: %s", tracker.run_id, "resumed" if tracker.resumed else "started", tracker.run_url)
        inputs = tracker.log_source_inputs(run.consumed)
        log.info("MLflow: %d source dataset(s) recorded as the run's inputs (partitions, versions, offsets)", inputs)
        resume = load_resume(tracker, run)
        warm_from, cold_start = load_warm_start(tracker, run) if resume is None and cfg.warm_start else (None, None)
        start = resume if resume is not None else run.warm
        if start is not None:
            state.init_path = save_checkpoint(start, run.workdir / "init")
            state.init_kind = "resume" if resume is not None else "warm"
            if resume is not None:
                state.latest = {
                    "step": resume.step,
                    "path": str(state.init_path),
                    "phase": resume.phase,
                    **resume.extra,
                }
        _run_phases(cfg, run, hooks, state, executors, rank_hook)
        if state.init_path is None or state.init_kind != "resume":
            raise NoTrainingDataError(f"job {job.name}: the window {cfg.window} produced no batches")
        final = load_checkpoint(state.init_path)
        model = build_model(spec.model, int(final.extra["n_dense"]), int(final.extra["n_sparse"]), seed=spec.seed)
        model.load_state_dict(final.model_state)
        if cfg.evaluate:
            beat.stage("evaluating the model on the %d hour(s) after the window", spec.eval_hours)
        evaluation = evaluate_and_log(cfg, context, model, tracker, final.step)
        beat.stage("logging the model to MLflow")
        model_uri = tracker.log_model(model)
        log.info("model logged: %s (%.1f s since the start)", model_uri, time.perf_counter() - started)
        stats = {
            **(final.extra.get("stats") or {}),
            "loss": _mean_loss(state.ranks),
            "samples_per_s": round(state.trained / state.train_wall_s, 1) if state.train_wall_s else 0.0,
            "trainers": world,
            "ranks": state.ranks or final.extra.get("ranks", []),
        }
        status = "FINISHED"
        return training_result(run, model_uri, stats, evaluation, resume, warm_from, cold_start, started, skipped)
    except KeyboardInterrupt:  # a cancelled run (SIGINT / SIGTERM through the CLI): MLflow says KILLED
        status = "KILLED"
        raise
    finally:
        tracker.finish(status)
        shutil.rmtree(run.workdir, ignore_errors=True)


def _mean_loss(ranks: list[dict[str, Any]]) -> float:
    losses = [float(r["loss"]) for r in ranks if r["loss"] == r["loss"]]
    return sum(losses) / len(losses) if losses else float("nan")


def _run_phases(
    cfg: TrainingRequest,
    run: TrainingRun,
    hooks: RunHooks,
    state: _JobState,
    executors: int,
    rank_hook: RankHook | None,
) -> None:
    """The phases from the latest checkpoint on; a failed group starts again from the latest
    checkpoint while ``pools.training`` allows restarts."""
    job, pool = cfg.job, cfg.job.pools.training
    all_phases, restarts = phases(job.training.mode), 0
    while True:
        latest = state.latest
        first = 0
        if latest is not None:
            first = phase_index(job.training.mode, latest["phase"]) + (1 if latest.get("phase_done") else 0)
        try:
            for phase in all_phases[first:]:
                if not phase_tasks(run.tasks, phase):
                    log.info("phase %s: no tasks, skipped", phase.name)
                    continue
                resume = load_checkpoint(state.init_path) if state.latest is not None and state.init_path else None
                driver = driver_for(cfg, run, phase, resume, trainers=pool.replicas)
                _run_phase_group(cfg, run, hooks, state, phase, driver, executors, rank_hook)
            return
        except RankFailedError as exc:
            if pool.restart == "never" or restarts >= pool.max_restarts:
                raise
            restarts += 1
            where = f"the checkpoint at step {state.latest['step']}" if state.latest else "the start"
            log.warning(
                "%s\nrestarting the trainer group from %s (restart %d of %d)", exc, where, restarts, pool.max_restarts
            )


def _run_phase_group(
    cfg: TrainingRequest,
    run: TrainingRun,
    hooks: RunHooks,
    state: _JobState,
    phase: Phase,
    driver: Any,
    executors: int,
    rank_hook: RankHook | None,
) -> None:
    job, world = cfg.job, cfg.job.pools.training.replicas
    driver.loading_policy = LoadingPriority(job.kind_weights()) if phase.prioritised else None
    token = secrets.token_hex(16)
    start_plane = hooks.data_plane or data_plane_starter(job, run_id=cfg.key())
    run.stage(
        "phase %s: %d task(s) to read; starting %d data executor(s)",
        phase.name,
        sum(driver.backlog_by_kind().values()),
        executors,
    )
    with start_plane(
        cfg.job_path,
        cfg.data_root,
        driver=driver,
        executors=executors,
        trainers=world,
        token=token,
        kafka_bootstrap=cfg.kafka_bootstrap,
    ) as plane:
        plan = RankPlan(
            location=plane.location,
            token=token,
            spec_json=job.training.model_dump_json(exclude_unset=True),  # defaults re-derived in the ranks
            phase=phase.name,
            prioritised=phase.prioritised,
            kind_weights=job.kind_weights(),
            world_size=world,
            threads=max(1, math.ceil(job.pools.training.cpu)),
            cores=_cores(job.pools.training.cpu, world),
            checkpoint_dir=str(run.workdir / "checkpoints"),
            versions=dict(run.versions),
            window=[cfg.window.start.isoformat(), cfg.window.end.isoformat()],
            init_path=None if state.init_path is None else str(state.init_path),
            init_kind=state.init_kind,
            warm_key=cfg.warm_start,
            record_batches=hooks.on_batch is not None,
            parent_pid=os.getpid(),
            rank_hook=rank_hook,
        )
        run.stage("phase %s: data executors up; starting %d trainer rank(s)", phase.name, world)
        _Group(cfg, run, hooks, state, plane).run_group(plan, phase)
        summary = getattr(plane, "summary", None)
        if summary is not None:
            run.data_pools[phase.name] = summary()
        plane.driver.raise_if_failed()
    _record_quality(run, phase, driver)
