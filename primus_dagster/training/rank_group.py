"""A rank group: the :class:`~primus_dagster.training.phase_trainer.PhaseTrainer` of a job with
``pools.training.replicas: N > 1`` -- each phase trained by N rank processes in lock-step rounds.

* **Data.** The phase's data plane is made with ``trainers=N`` on a driver made for N; rank ``r`` reads
  trainer ``r``'s batches with its own :class:`RemoteReader` over Flight. ``data.shuffle`` decides, in
  the data executors, which trainer gets a batch, as it does for any group of trainers (with
  ``data.deterministic``: a fixed one per batch, so the group's order is the plan's).
* **Training.** Every rank trains with the one :class:`~primus_dagster.training.loop.PhaseLoop` under the
  :class:`~primus_dagster.training.distributed.LockStep` coordinator (the row-sparse gradient exchange);
  checkpoints, resume and warm start are the loop's. Its news goes to the job process on a queue, where
  the same :class:`~primus_dagster.training.loop.RunSink` as one trainer's applies the same rules (a
  checkpoint is logged once every rank's batches up to it were handed to ``on_batch``).
* **The parent** (this process) starts the ranks (:mod:`~primus_dagster.training.distributed.launch`: by
  default ``spawn``-ed children; a :class:`~primus_dagster.training.distributed.DialBackLauncher` has them
  started elsewhere, as plain processes or pods, and they dial back), serves their news, watches their
  memory (ranks with a pid here) and their exits; the window skeleton evaluates and logs the final
  checkpoint's model.
* **Pool keys.** ``pools.training.cpu``: ``ceil(cpu)`` torch threads per rank, pinned to as many cores
  of their own when the machine has ``N * ceil(cpu)`` (else unpinned); ``memory``: a rank whose RSS
  exceeds it is killed (the group fails); ``restart: on_failure`` with ``max_restarts``: a failure is a
  restartable :class:`~primus_dagster.training.phase_trainer.TrainerFailedError`, and the skeleton
  starts the group again from the latest checkpoint (its trained batches after that checkpoint are
  trained again -- an audit log through ``on_batch`` shows them twice); ``never``: the first failure
  fails the job. A failed rank fails the group with its traceback; every rank process is stopped
  (terminate, then kill) and the data plane closed, whatever happened.

Example::

    job = load_job_spec("job.yaml")          # pools: {training: {replicas: 2}}
    result = train_window(TrainingRequest(job, "job.yaml", "/data", window))   # trains with a RankGroup
    result.stats["trainers"], [r["params_checksum"] for r in result.stats["ranks"]]
"""

from __future__ import annotations

import math
import os
import queue as queue_mod
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from primus_dagster.cluster.pool import memory_bytes
from primus_dagster.data import Batch, DataPlane, DriverClient, RemoteReader
from primus_dagster.training.distributed import (
    ChannelError,
    DMPExchange,
    LockStep,
    RankLauncher,
    RankProcesses,
    ShardedExchange,
    first_failure,
    pin_cores,
    serve_rank,
)
from primus_dagster.training.loop import (
    PhaseContext,
    PhaseLoop,
    ProgressPoint,
    RankResult,
    RunSink,
    SavedCheckpoint,
    phase_context,
)
from primus_dagster.training.modes import Phase
from primus_dagster.training.phase_trainer import LoopPhaseTrainer, TrainerFailedError
from primus_dagster.training.rank_launchers import rank_launcher
from primus_dagster.training.run_state import RankHook, RunHooks, TrainingRun


@dataclass(frozen=True)
class RankPlan:
    """What every rank of one phase's group gets (pickled into the spawned processes)."""

    location: str  # the data driver's Flight address
    token: str
    context: PhaseContext
    threads: int
    cores: list[list[int] | None]  # per rank
    record_batches: bool  # send every trained reader batch to the parent (hooks.on_batch)
    parent_pid: int | None  # the job process, for ranks that are its children (others watch their channel)
    rank_hook: RankHook | None = None
    collective_timeout_s: float = 300.0


class QueueSink:
    """A rank's :class:`~primus_dagster.training.loop.LoopSink`: its news on the queue to the job process,
    as ``(rank, kind, payload)``.

    Example::

        loop = PhaseLoop(context, LockStep(), reader, QueueSink(out, wants_batches=True))
    """

    def __init__(self, out: Any, wants_batches: bool):
        self.out, self.wants_batches = out, wants_batches

    def batch_trained(self, rank: int, step: int, batch: Batch) -> None:
        self.out.put((rank, "batch", (step, batch)))

    def progress(self, point: ProgressPoint) -> None:
        self.out.put((point.rank, "progress", point))

    def checkpoint(self, rank: int, step: int, saved: SavedCheckpoint | None) -> None:
        self.out.put((rank, "checkpoint", (step, saved)))


def rank_main(rank: int, init_method: str, out: Any, plan: RankPlan) -> None:
    """One rank process of a phase's group (the target :class:`RankGroup` spawns)."""
    pin_cores(plan.cores[rank])
    context = plan.context

    def body() -> RankResult:
        ordered: dict[str, Any] = {"deterministic": True} if context.deterministic else {}
        with (
            DriverClient(plan.location, token=plan.token) as client,
            RemoteReader(client, rank, token=plan.token, choose_queue=context.mixture(rank), **ordered) as reader,
        ):
            exchange = None
            if context.sharding == "row_wise":  # a custom model's TorchRec tables: TorchRec's DMP shards them
                exchange = (
                    DMPExchange(note=lambda line: out.put((rank, "log", line)))
                    if context.spec.model.type == "custom"
                    else ShardedExchange(timeout_s=plan.collective_timeout_s)
                )
            coordinator = LockStep(exchange, timeout_s=plan.collective_timeout_s, parent_pid=plan.parent_pid)
            sink = QueueSink(out, plan.record_batches)
            loop = PhaseLoop(context, coordinator, reader, sink, rank_hook=plan.rank_hook)
            loop.run()
            loop.finish()
            # a failing rank leaves its peer sockets to its exit: its error is reported first, then the peers see it gone
            coordinator.close()
        return loop.result()

    serve_rank(rank, context.world, init_method, plan.threads, out, body, timeout_s=plan.collective_timeout_s)


class _Group:
    """Spawn a phase's ranks, hand their news to the run's sink, stop them whatever happens (parent side)."""

    def __init__(
        self,
        run: TrainingRun,
        sink: RunSink,
        world: int,
        addresses: Sequence[str] | None = None,
        launcher: RankLauncher | None = None,
    ):
        self.run, self.sink, self.world, self.addresses, self.launcher = run, sink, world, addresses, launcher
        self.memory = memory_bytes(run.job.pools.training.memory)
        self.results: dict[int, RankResult] = {}
        self.errors: dict[int, tuple[float, str]] = {}

    def run_group(self, plan: RankPlan) -> list[RankResult]:
        ranks = RankProcesses(
            rank_main, self.world, plan, name="trainer-rank", addresses=self.addresses, launcher=self.launcher
        )
        try:
            ranks.start()  # stops those started when one cannot be
        except ChannelError as exc:  # a rank that never reached us (a pod not scheduled, a wrong key)
            raise TrainerFailedError(str(exc), restartable=True) from None
        try:
            self._serve(ranks.out, ranks.procs)
            ranks.join(30)
        finally:  # stopped whatever happens
            ranks.stop()
        return [self.results[r] for r in range(self.world)]

    def _serve(self, out: Any, procs: list[Any]) -> None:
        quiet_since, next_check = None, 0.0
        while len(self.results) < self.world or self.sink.pending:
            if time.monotonic() >= next_check:  # memory, also while messages keep coming
                self._check_memory(procs)
                next_check = time.monotonic() + 0.2
            try:
                rank, kind, payload = out.get(timeout=0.2)
            except queue_mod.Empty:
                if self.errors:
                    break  # quiet after an error: the others lost their peer, or will
                if len(self.results) == self.world:  # every rank is done: nothing more will come
                    steps = [c.step for c in self.sink.pending]
                    raise TrainerFailedError(
                        f"checkpoints at steps {steps}: not every rank confirmed them", restartable=True
                    ) from None
                gone = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode is not None and r not in self.results}
                if gone:  # a rank exited without a word: give its last messages a moment
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 2.0:
                        rank, code = min(gone.items())
                        raise TrainerFailedError(f"trainer rank {rank} {_died(code)}", restartable=True) from None
                continue
            self._handle(rank, kind, payload)
        if self.errors:
            # A rank that died without a word (a signal, an OOM kill) is the cause: its peers' errors only
            # say that it is gone. Its exit code comes a moment after their errors.
            silent = [r for r in range(self.world) if r not in self.errors and r not in self.results]
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and any(procs[r].exitcode is None for r in silent):
                time.sleep(0.05)
            dead = {r: procs[r].exitcode for r in silent if procs[r].exitcode not in (None, 0)}
            if dead:
                rank, code = min(dead.items())
                raise TrainerFailedError(
                    f"trainer rank {rank} {_died(code)}; ranks {sorted(self.errors)} then lost their peer",
                    restartable=True,
                )
            rank = first_failure(self.errors)  # the first to fail is the cause
            raise TrainerFailedError(
                f"trainer rank {rank} failed (failed ranks: {sorted(self.errors)}):\n{self.errors[rank][1]}",
                restartable=True,
            )

    def _handle(self, rank: int, kind: str, payload: Any) -> None:
        if kind == "batch":
            step, batch = payload
            self.sink.batch_trained(rank, step, batch)
        elif kind == "progress":
            self.sink.progress(payload)
        elif kind == "checkpoint":
            step, saved = payload
            self.sink.checkpoint(rank, step, saved)
        elif kind == "ok":
            self.results[rank] = payload
        elif kind == "error":
            self.errors[rank] = payload
        elif kind == "log":  # a rank's line for the run log
            self.run.stage("%s", payload)

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
                raise TrainerFailedError(
                    f"trainer rank {rank}: RSS {rss / 2**20:.0f} MiB above pools.training.memory "
                    f"{self.run.job.pools.training.memory}: killed",
                    restartable=True,
                )


def _died(code: int | None) -> str:
    """How a rank process ended, for a message: ``died with exit code -9 (SIGKILL)``."""
    if code is not None and code < 0:
        try:
            return f"died with exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"died with exit code {code}"


def _cores(cpu: float, world: int) -> list[list[int] | None]:
    """``ceil(cpu)`` cores of its own per rank when there are enough, else no pinning."""
    per = max(1, math.ceil(cpu))
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(available) < per * world:
        return [None] * world
    return [available[r * per : (r + 1) * per] for r in range(world)]


class RankGroup(LoopPhaseTrainer):
    """The N ranks that train each phase of a window run (module docstring).

    ``addresses``: per rank, the address it listens on for its peers (default loopback; distinct loopback
    addresses stand for distinct hosts in tests: :class:`~primus_dagster.training.distributed.RankProcesses`);
    ``launcher``: how the ranks start (default: :func:`~primus_dagster.training.rank_launchers.rank_launcher`
    of the job's ``pools.backend`` -- pods on Kubernetes --, else ``spawn``-ed children of this process on
    ``addresses``; a :class:`~primus_dagster.training.distributed.DialBackLauncher` takes its addresses itself).

    Example::

        group = RankGroup(RunHooks(), world=2)
        result = train_window(request, trainer=group)      # what phase_trainer picks for replicas: 2
        result.stats["ranks"][1]["samples_trained"]
    """

    def __init__(
        self,
        hooks: RunHooks,
        world: int,
        addresses: Sequence[str] | None = None,
        launcher: RankLauncher | None = None,
    ):
        super().__init__()
        if addresses is not None and launcher is not None:
            raise ValueError("give the rank addresses to the launcher")
        self.hooks, self.trainers, self.addresses, self.launcher = hooks, world, addresses, launcher
        self._chosen = launcher is not None or addresses is not None

    def train_phase(self, run: TrainingRun, phase: Phase, plane: DataPlane) -> None:
        job, world = run.job, self.trainers
        if not self._chosen:  # once per run: pods on Kubernetes (built here, where the run id is known)
            self.launcher, self._chosen = rank_launcher(job, run_id=run.request.key()), True
        context = phase_context(run, phase, world)
        children = self.launcher is None or self.launcher.children
        plan = RankPlan(
            location=plane.location,
            token=plane.token or "",
            context=context,
            threads=max(1, math.ceil(job.pools.training.cpu)),
            cores=_cores(job.pools.training.cpu, world) if children else [None] * world,
            record_batches=self.hooks.on_batch is not None,
            parent_pid=os.getpid() if children else None,
            rank_hook=self.hooks.rank_hook,
        )
        sink = RunSink(run, self.hooks, phase, plane, world, progress_s=context.progress_s)
        run.stage("phase %s: data executors up; starting %d trainer rank(s)", phase.name, world)
        results = _Group(run, sink, world, self.addresses, self.launcher).run_group(plan)
        self.record(sink.last, results)
