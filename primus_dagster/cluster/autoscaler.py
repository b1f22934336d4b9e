"""The live autoscaler of a data plane: heartbeats in, the controller's decisions applied to the pool.

Each control tick of a :class:`~primus_dagster.cluster.pooled_plane.PooledDataPlane`, a
:class:`DataPoolAutoscaler` turns the data executors' heartbeat metrics (``cpu``, ``rss_bytes``,
``buffer_fill``, ``rows_per_s``, see ``DataExecutor.metrics``) into controller samples, gives the
:class:`~primus_dagster.cluster.controller.ScalingController` the pool's statuses, and applies the
decisions it returns (:func:`~primus_dagster.cluster.controller.apply_decision`): scale out, scale in
(a stopped executor's leased tasks are read again elsewhere; the claim ledger keeps delivery exactly
once), resize. OOM restarts are left to the plane's supervisor. A scaling action the pool cannot carry
out -- a resize it will not apply in place because it would kill the executor
(:class:`~primus_dagster.cluster.pool.ResizeNotApplied`), a launch that fails -- is logged as one warning
and skipped: scaling is an optimisation, and the run goes on with the pool it has. The executors'
peak RSS (the pool's ``rss_peak_bytes``) sizes vertical scaling's memory, and a pool that lost an
executor is *recovering* for the job's ``data.lease`` (its leased tasks may wait that long): its
trainers' wait is not load then, and it is not scaled in. On a local pool the machine's cores bound a
CPU-busy pool's scale-out (``ScalingController.host_cores``): more busy executors on the same cores add
only their start-up and their share of the cores.

The trainers are the controller's ``training`` pool, observed but never changed (``fixed_roles``):
their reader-wait fraction is measured by :class:`TrainerWait` from the plane's readers (the share
of control ticks at which a reader that has started training had an empty queue: the trainer is
waiting for data, or is about to), so the data/trainer ratio rule and the demand load
``L_u / (1 − w)`` run live. Every decision is logged with its
inputs and kept for the run's summary and metrics, and every scaling tick adds a point to a bounded
:class:`ScalingTimeline` (replicas, mean CPU and memory utilisation, the decision if any) for
time-series metrics.

Example::

    scaler = DataPoolAutoscaler(job)
    with PooledDataPlane("job.yaml", "/data", tasks, token=token, controller=scaler) as plane:
        ...
    scaler.summary()          # {"actions": 2, "applied": [...], "timeline": [{"t_s": 0.3, ...}, ...], ...}
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from primus_dagster.cluster.controller import ControllerOptions, ScalingController, apply_decision
from primus_dagster.cluster.metrics import Sample, sample_from_heartbeat
from primus_dagster.cluster.policies import ScalingDecision
from primus_dagster.cluster.pool import ExecutorStatus, PoolError, Resources, memory_bytes
from primus_dagster.spec import JobSpec, PoolSpec

if TYPE_CHECKING:
    from primus_dagster.cluster.pooled_plane import PooledDataPlane

log = logging.getLogger(__name__)

TIMELINE_POINTS = 500


class ScalingTimeline:
    """The scaling ticks of a run as a compact, bounded time series (run metadata, MLflow metrics).

    One point per scaling tick of the controller::

        {"t_s": 12.3,             # seconds since the plane started
         "replicas": 2,           # live executors the tick saw
         "target_replicas": 3,    # after this tick's decision (= replicas without one)
         "cpu_util": 0.41,        # mean CPU utilisation of the fresh samples (None: no sample)
         "memory_util": 0.12,     # mean RSS / memory allocation (None: no sample)
         "load": 0.33,            # L_u of the horizontal rule (None: no signal)
         "decision": "scale_out"} # kinds decided at this tick, comma-joined ("resize", ...), or None

    At most ``max_points`` are kept: when full, every other point without a decision is dropped
    and from then on only every ``stride``-th plain tick is recorded (the stride doubles at each
    compaction); points with a decision are kept (halved likewise only if they alone overflow).
    The first and the latest tick are always there.
    """

    def __init__(self, max_points: int = TIMELINE_POINTS):
        if max_points < 4:
            raise ValueError(f"max_points must be >= 4, got {max_points}")
        self.max_points = max_points
        self._lock = threading.Lock()
        self.points: list[dict[str, Any]] = []
        self.stride = 1
        self._plain_ticks = 0
        self._tail: dict[str, Any] | None = None

    def add(
        self,
        t_s: float,
        replicas: int,
        cpu_util: float | None,
        memory_util: float | None,
        load: float | None,
        decisions: Sequence[ScalingDecision] = (),
    ) -> None:
        """One tick; plain ticks (no decision) are sampled every ``stride`` ticks."""
        kinds = list(dict.fromkeys(d.kind for d in decisions))
        target = replicas + sum(d.delta for d in decisions if d.kind in ("scale_out", "scale_in"))
        point = {
            "t_s": round(t_s, 3),
            "replicas": int(replicas),
            "target_replicas": int(target),
            "cpu_util": _round(cpu_util),
            "memory_util": _round(memory_util),
            "load": _round(load),
            "decision": ",".join(kinds) or None,
        }
        with self._lock:
            self._tail = None
            if not kinds:
                self._plain_ticks += 1
                if (self._plain_ticks - 1) % self.stride:
                    self._tail = point  # not sampled, but shown while it is the latest tick
                    return
            self._append(point)

    def _append(self, point: dict[str, Any]) -> None:
        self.points.append(point)
        if len(self.points) >= self.max_points:  # one place left for the latest (unsampled) tick
            self._compact()

    def _compact(self) -> None:
        first, *middle, last = self.points
        plain = [i for i, p in enumerate(middle) if p["decision"] is None]
        drop = set(plain[1::2])
        middle = [p for i, p in enumerate(middle) if i not in drop]
        while len(middle) + 2 >= self.max_points:
            middle = middle[::2]
        self.points = [first, *middle, last]
        self.stride *= 2

    def as_list(self) -> list[dict[str, Any]]:
        with self._lock:
            points = self.points if self._tail is None else [*self.points, self._tail]
            return [dict(p) for p in points]


def _pending_tasks(plane: PooledDataPlane) -> int | None:
    """Tasks of the plane's driver that no executor has leased (None: the driver does not say)."""
    try:
        busy = sum(plane.driver.backlog_by_kind().values())
        running = sum(plane.driver.running_by_kind().values())
    except AttributeError:
        return None
    return max(0, int(busy) - int(running))


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


class TrainerWait:
    """A trainer's reader-wait fraction from its reader's queue, sampled at every control tick.

    ``observe(queue_sizes, yielded)``: the batches in the reader's queues and how many it has
    handed the trainer so far. Until the first batch is handed over the trainer is starting (not
    counted); then each observation with empty queues counts as waiting. ``take()`` returns the
    fraction since the last ``take`` (None: no observation) and starts a new window.

    >>> wait = TrainerWait()
    >>> for sizes in ([0], [3], [0], [0]):
    ...     wait.observe(sizes, yielded=1)
    >>> wait.take()
    0.75
    """

    def __init__(self) -> None:
        self.empty = 0
        self.seen = 0

    def observe(self, queue_sizes: Sequence[int], yielded: int) -> None:
        if yielded <= 0:
            return
        self.seen += 1
        self.empty += not any(queue_sizes)

    def take(self) -> float | None:
        if not self.seen:
            return None
        fraction = self.empty / self.seen
        self.empty = self.seen = 0
        return fraction


class DataPoolAutoscaler:
    """Scales a plane's data pool with the job's ``scaling`` policies (see the module docstring).

    ``on_decision`` is called with every applied decision (the training asset logs them to the run).
    """

    def __init__(
        self,
        job: JobSpec,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_decision: Callable[[ScalingDecision], None] | None = None,
        options: ControllerOptions | None = None,
    ):
        # The supervisor restarts OOM-killed executors; local CPU is whole cores (affinity); the
        # trainers are the run's: observed (their wait), never scaled; a lost executor's tasks may wait
        # for their lease (data.lease): that long the pool is recovering.
        options = options or ControllerOptions(
            oom_restarts=False,
            cpu_quantum=1.0,
            fixed_roles=("training",),
            recovery_s=job.data.lease.total_seconds(),
        )
        self.job = job
        trainers = job.pools.training
        self.training_pool = PoolSpec(
            replicas=trainers.replicas,
            min_replicas=trainers.replicas,
            max_replicas=max(1, trainers.replicas),
            cpu=trainers.cpu,
            memory=trainers.memory,
        )
        self.controller = ScalingController(
            job.scaling, {"data": job.pools.data, "training": self.training_pool}, clock, options=options
        )
        self.waits: dict[int, TrainerWait] = {}
        self.on_decision = on_decision
        self.applied: list[ScalingDecision] = []
        self.skipped: list[tuple[ScalingDecision, str]] = []  # decisions the pool could not carry out, why
        self.timeline = ScalingTimeline()
        self._t0: float | None = None
        self._failures = 0  # failed or OOM-killed attempts the supervisor handled, seen so far

    def control(self, plane: PooledDataPlane, now: float) -> None:
        """One tick: observe, decide, apply (called by the plane's control thread)."""
        if plane.pool is None:
            return
        statuses = plane.pool.status()
        allocated = {s.executor_id: s.resources for s in statuses if not s.finished}
        for executor_id, report in plane.driver.executors().items():
            if executor_id in allocated and report.metrics:
                sample = sample_from_heartbeat(executor_id, "data", report.metrics, allocated[executor_id], now=now)
                self.controller.observe(sample)
        if self._t0 is None:
            self._t0 = plane.started_at
        decisions_seen = plane.supervisor.decisions if plane.supervisor is not None else []
        failures = sum(d.state in ("failed", "oom_killed") for d in decisions_seen)
        if failures > self._failures:  # the supervisor restarted a lost executor: its tasks may wait a lease
            self._failures = failures
            self.controller.disrupted("data", now)
        trainer_statuses = self._observe_trainers(plane, now)
        self.controller.pending_tasks = _pending_tasks(plane)
        cpus = getattr(plane.pool, "cpus", None)  # a local pool places its executors on this machine's cores
        if cpus:
            self.controller.host_cores["data"] = float(len(cpus))
        ticks = self.controller.ticks
        decisions = self.controller.tick(now, {"data": statuses, "training": trainer_statuses})
        for decision in decisions:
            log.info("scaling: %s", decision.describe())
            try:
                apply_decision({"data": plane.pool}, decision)
            except PoolError as exc:  # an optional action the pool cannot do: the run goes on without it
                log.warning("scaling: %s not applied: %s", decision.kind, exc)
                self.skipped.append((decision, str(exc)))
                continue
            self.applied.append(decision)
            if self.on_decision is not None:
                self.on_decision(decision)
        if self.controller.ticks > ticks:  # a scaling tick (not only failover): one timeline point
            _, replicas, load, util = self.controller.history["data"][-1]
            self.timeline.add(now - self._t0, replicas, util.get("cpu"), util.get("memory"), load, decisions)

    def _observe_trainers(self, plane: PooledDataPlane, now: float) -> list[ExecutorStatus]:
        """Sample the plane's readers' queues; at a due scaling tick, one ``training`` sample per
        reader with its wait fraction. The statuses of the trainers that have a reader."""
        due = self.controller.due(now)
        resources = Resources(self.training_pool.cpu, memory_bytes(self.training_pool.memory))
        statuses = []
        for trainer_id, reader in plane.readers().items():  # none made in this process: no wait signal
            wait = self.waits.setdefault(trainer_id, TrainerWait())
            try:
                stats = reader.queue_stats()
                yielded = int(reader.stats.get("yielded", 0))
            except Exception:  # a closed reader: no more observations
                continue
            wait.observe([stat.size for stat in stats.values()], yielded)
            executor_id = f"trainer-{trainer_id}"
            statuses.append(ExecutorStatus(executor_id, "training", "running", resources))
            fraction = wait.take() if due else None
            if fraction is not None:
                self.controller.observe(Sample(now, executor_id, "training", resources, reader_wait=fraction))
        return statuses

    def summary(self) -> dict[str, Any]:
        """The controller's summary, the decisions applied here and the timeline (JSON-able)."""
        return {
            **self.controller.summary(),
            "applied": [d.as_dict() for d in self.applied],
            "not_applied": [{**d.as_dict(), "why": why} for d, why in self.skipped],
            "timeline": self.timeline.as_list(),
        }
