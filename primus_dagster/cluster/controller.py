"""The scaling controller: samples and pool statuses in, one strategy's decisions per tick out.

A :class:`ScalingController` is fed executor :class:`~primus_dagster.cluster.metrics.Sample` s
(:meth:`~ScalingController.observe`, or :meth:`~ScalingController.observe_batch` for many at once)
and the pools' current :class:`~primus_dagster.cluster.pool.ExecutorStatus` lists
(:meth:`~ScalingController.update_status`). :meth:`~ScalingController.tick` returns the
:class:`~primus_dagster.cluster.policies.ScalingDecision` s of this tick:

* ``oom_restart`` for every executor newly found OOM-killed (failover: every call, no cooldown);
* between scaling ticks, vertical scaling's memory increases (every call: an RSS growing faster than
  the interval must not outrun them; an increase cannot flap);
* at most every ``scaling.interval``, the decisions of **one** strategy (``horizontal`` or
  ``vertical``; ``enabled: false`` turns one off): the one that wants to act; when both do, they
  take turns (the one that did not act last goes), and the very first contention goes to vertical
  if it would raise some executor's memory (an OOM kill is near, and more executors do not help a
  process that outgrows its memory), else to horizontal;
* a pool that changed waits ``scaling.cooldown`` before its next change (memory increases
  excepted: they only ever grow, so they cannot flap);
* only steady-state samples count: an executor's samples from its first ``scaling.warmup``
  seconds (start-up: CPU of imports, empty buffers) are kept but not decided on;
* the data pool's load is ``L_u / (1 − w)`` where the trainers report a reader-wait fraction ``w``
  (at most 0.9): what the pool would need to serve all the trainers want; while trainers wait
  (``w ≥ ratio.wait_high``) the load rule never removes data executors, and while the trainers
  report and the data buffers are full (``ratio.fill_full``: the pool is ahead, busy or not) it
  never adds any;
* ``fixed_roles`` (:class:`ControllerOptions`) are observed but never changed (a live run's
  trainers: their wait feeds the ratio rule, their number is the run's);
* vertical scaling sizes the CPU of a pool only where horizontal scaling does not (its replicas
  fixed, or horizontal disabled): executors that pull work use whatever CPU the pool is short of,
  so their CPU "demand" measures the pool's size, not theirs -- horizontal scaling's signal.

It never touches a pool: an applier executes the decisions against an
:class:`~primus_dagster.cluster.pool.ExecutorPool`. Per-executor state lives in numpy arrays so
that a tick over 1.25 M executors takes well under a second (``bench/scaling_sim.py``).
``docs/scaling.md`` explains the rules.

Example::

    controller = ScalingController(job.scaling, {"data": job.pools.data, "training": job.pools.training})
    controller.update_status("data", data_pool.status())
    controller.observe(sample_from_heartbeat(executor_id, "data", report.metrics, allocated, now=t))
    for decision in controller.tick():
        apply(decision)                      # launch / stop / resize / restart on the pool
    controller.summary()                     # {"actions": 3, "actions_by_kind": {...}, "pools": {...}}
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from primus_dagster.cluster.metrics import DEFAULT_IO_CAPACITY, METRIC_NAMES, MetricsStore, Sample, aggregate
from primus_dagster.cluster.policies import (
    RatioRule,
    ScalingDecision,
    horizontal_decision,
    oom_restart_decision,
    ratio_decision,
    vertical_allocation,
    weighted_load,
)
from primus_dagster.cluster.pool import FINISHED_STATES, ExecutorPool, ExecutorStatus, Resources, Role, memory_bytes
from primus_dagster.cluster.supervisor import memory_cap
from primus_dagster.spec import PoolSpec, ScalingSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerOptions:
    """Knobs of the controller that are not job-spec keys (defaults in ``docs/scaling.md``).

    * ``io_capacity``: bytes/s of one executor that count as ``io`` utilisation 1;
    * ``ratio``: thresholds of the data/training ratio rule;
    * ``max_age_s``: samples older than this are stale and ignored (default 3 × ``interval``);
    * ``min_samples``: samples of an executor before vertical scaling resizes it;
    * ``max_resizes_per_tick``: resizes in one tick (memory increases first, then the largest);
    * ``cpu_quantum`` / ``memory_quantum``: allocation granularity (0.1 core; 1 MiB) --
      the local backend pins whole cores, so use 1.0 there;
    * ``min_cpu`` / ``min_memory_bytes``: vertical floor; ``cpu_cap_factor``: vertical CPU cap as a
      multiple of the pool's ``cpu`` (memory is capped by the pool's ``max_memory``);
    * ``oom_restarts``: emit ``oom_restart`` decisions (turn off where a
      :class:`~primus_dagster.cluster.supervisor.Supervisor` already restarts OOM-killed executors);
    * ``log_size`` / ``history_ticks``: bounds of the decision log and the per-tick history;
    * ``series_samples`` / ``series_age_s``: the per-executor series :meth:`ScalingController.observe` keeps;
    * ``fixed_roles``: pools observed but never scaled or resized;
    * ``resize_restarts``: a resize restarts the executor (Kubernetes replaces the pod): then at
      most ``max_unavailable`` of a pool (at least one executor) is starting at a time, resizes
      included (a rolling update), and only memory increases may exceed it;
    * ``recovery_s``: after an executor of a pool failed or was OOM-killed, the pool is *recovering*
      this long: its trainers' wait is a stall, not load, and it is not
      scaled in (default 2 × ``cooldown``; the live autoscaler uses the job's ``data.lease``, how
      long a killed executor's leased tasks may wait for their lease to expire);
    * ``busy_wait_cap`` / ``wait_cap``: the largest trainer wait the demand ``L_u / (1 − w)`` takes
      while the data pool is CPU-busy (its CPU utilisation at least ``scale_up_threshold``: the wait is
      a capacity shortfall, the fluid demand ``1 / (1 − w)`` holds) and while it is not (the wait is a
      stall or the transport: at most doubling) -- a wait cannot make a half-idle pool's load 5.5;
    * ``max_scale_in_fraction``: a scale-in stops at most this share of the pool's live executors at
      once (at least ``step``): the executors left read the released tasks again, and a bounded step
      keeps those re-reads within their spare capacity and buffers (a tuned setting, chosen on the
      simulator's tuning traces, docs/scaling.md).

    Example::

        ScalingController(job.scaling, pools, options=ControllerOptions(cpu_quantum=1.0, oom_restarts=False))
    """

    io_capacity: float = DEFAULT_IO_CAPACITY
    ratio: RatioRule = field(default_factory=RatioRule)
    max_age_s: float | None = None
    min_samples: int = 3
    max_resizes_per_tick: int = 1024
    cpu_quantum: float = 0.1
    memory_quantum: int = 1 << 20
    min_cpu: float = 0.1
    min_memory_bytes: int = 256 << 20
    cpu_cap_factor: float = 4.0
    oom_restarts: bool = True
    log_size: int = 1000
    history_ticks: int = 4096
    series_samples: int = 32
    series_age_s: float = 600.0
    fixed_roles: tuple[Role, ...] = ()
    resize_restarts: bool = False
    max_unavailable: float = 0.05
    recovery_s: float | None = None
    busy_wait_cap: float = 0.9
    wait_cap: float = 0.5
    max_scale_in_fraction: float = 0.1


_FLOAT_FIELDS = (
    "alloc_cpu",
    "alloc_mem",
    "t_last",
    "t_first",
    "cpu",
    "rss",
    "io",
    "fill",
    "wait",
    "rps",
    "ew_cpu",
    "ew_mem",
    "ew_den",
    "peak",  # the largest RSS seen of the executor in this run (samples and the pool's high-water mark)
    "floor_mem",  # vertical never goes below it: the allocation it was restarted with after an OOM kill
    "oom_pending",  # 1: OOM-killed, its floor is set from its next live allocation
)
_NAN_FIELDS = ("io", "fill", "wait", "t_first")


class _PoolState:
    """Per-executor arrays of one pool; a row per executor id, reused after it leaves."""

    def __init__(self, role: Role, spec: PoolSpec, capacity: int = 64):
        self.role = role
        self.spec = spec
        self.default = Resources(spec.cpu, memory_bytes(spec.memory))
        self.rows: dict[str, int] = {}
        self.ids: list[str | None] = []
        self.free: list[int] = []
        self.arrays: dict[str, np.ndarray] = {}
        for name in _FLOAT_FIELDS:
            self.arrays[name] = np.zeros(capacity)
        self.n = np.zeros(capacity, dtype=np.int64)
        self.live = np.zeros(capacity, dtype=bool)
        self.running = np.zeros(capacity, dtype=bool)

    def col(self, name: str) -> np.ndarray:
        """The used part of one per-executor array (a view)."""
        return self.arrays[name][: len(self.ids)]

    @property
    def size(self) -> int:
        return len(self.ids)

    def _grow(self) -> None:
        capacity = 2 * len(self.n)
        for name, array in self.arrays.items():
            self.arrays[name] = np.resize(array, capacity)
        self.n = np.resize(self.n, capacity)
        self.live = np.resize(self.live, capacity)
        self.running = np.resize(self.running, capacity)

    def row(self, executor_id: str) -> int:
        row = self.rows.get(executor_id)
        return row if row is not None else int(self.rows_of([executor_id])[0])

    def rows_of(self, executor_ids: Sequence[str]) -> np.ndarray:
        """The rows of ``executor_ids``, new rows (reset) for ids not seen before."""
        known = self.rows.get
        rows = np.fromiter(
            (r if (r := known(e)) is not None else -1 for e in executor_ids), np.int64, len(executor_ids)
        )
        missing = np.flatnonzero(rows < 0)
        if missing.size:
            new = []
            for i in missing.tolist():
                executor_id = executor_ids[i]
                row = self.rows.get(executor_id)  # an id twice in one call
                if row is None:
                    if self.free:
                        row = self.free.pop()
                        self.ids[row] = executor_id
                    else:
                        row = len(self.ids)
                        self.ids.append(executor_id)
                    self.rows[executor_id] = row
                    new.append(row)
                rows[i] = row
            while len(self.ids) > len(self.n):
                self._grow()
            self._reset(np.array(new, dtype=np.int64))
        return rows

    def _reset(self, rows: np.ndarray) -> None:
        for name in _FLOAT_FIELDS:
            self.arrays[name][rows] = np.nan if name in _NAN_FIELDS else 0.0
        self.arrays["t_last"][rows] = -np.inf
        self.arrays["alloc_cpu"][rows] = self.default.cpu
        self.arrays["alloc_mem"][rows] = self.default.memory_bytes
        self.n[rows] = 0
        self.live[rows] = False
        self.running[rows] = False

    def release(self, rows: np.ndarray) -> None:
        for row in rows.tolist():
            executor_id = self.ids[row]
            if executor_id is not None:
                del self.rows[executor_id]
                self.ids[row] = None
                self.free.append(row)
                self.live[row] = False
                self.running[row] = False
                self.n[row] = 0


@dataclass(frozen=True)
class PoolView:
    """What one tick sees of a pool: live executors, the per-metric aggregates of the fresh
    samples (by each metric's spec aggregation for ``load``; ``mean`` in ``mean_util``), the load,
    the mean buffer fill and reader wait."""

    role: Role
    replicas: int
    fresh: int
    load: float | None
    mean_util: dict[str, float | None]
    buffer_fill: float | None
    reader_wait: float | None
    cores_allocated: float
    cores_used: float
    running: int = 0


@dataclass
class _ResizePlan:
    """The resize candidates of one pool, aligned arrays."""

    role: Role
    rows: np.ndarray
    priority: np.ndarray
    demand_cpu: np.ndarray
    demand_mem: np.ndarray
    cur_cpu: np.ndarray
    cur_mem: np.ndarray
    new_cpu: np.ndarray
    new_mem: np.ndarray
    grow_mem: np.ndarray


class ScalingController:
    """Decides scaling actions from samples and statuses (see the module docstring).

    Example::

        controller = ScalingController(job.scaling, {"data": job.pools.data}, clock=lambda: sim_time)
        controller.update_status("data", statuses)
        controller.observe_batch("data", ids, time=t, cpu=cpu_used, rss_bytes=rss, buffer_fill=fill)
        decisions = controller.tick(t)
    """

    def __init__(
        self,
        scaling: ScalingSpec,
        pools: Mapping[Role, PoolSpec],
        clock: Callable[[], float] = time.monotonic,
        *,
        options: ControllerOptions | None = None,
    ):
        self.scaling = scaling
        self.pools = dict(pools)
        self.clock = clock
        self.options = options or ControllerOptions()
        self.interval = scaling.interval.total_seconds()
        self.warmup = scaling.warmup.total_seconds()
        self.cooldown = scaling.cooldown.total_seconds()
        self.max_age = self.options.max_age_s if self.options.max_age_s is not None else 3 * self.interval
        self._state = {role: _PoolState(role, spec) for role, spec in self.pools.items()}
        self._memory_cap = {role: memory_cap(spec) for role, spec in self.pools.items()}
        self._cool_until: dict[Role, float] = dict.fromkeys(self.pools, -math.inf)
        self._last_tick = -math.inf
        self._last_strategy: str | None = None
        self._pending_oom: dict[tuple[str, int], ExecutorStatus] = {}
        self._handled_oom: set[tuple[str, int]] = set()
        #: The largest RSS of any executor of the pool in this run: every executor may get its heaviest task.
        self._pool_peak: dict[Role, float] = dict.fromkeys(self.pools, 0.0)
        self._disrupted: dict[Role, float] = dict.fromkeys(self.pools, -math.inf)  # last failure or OOM kill
        self.recovery_s = self.options.recovery_s if self.options.recovery_s is not None else 2 * self.cooldown
        self.series = MetricsStore(self.options.series_samples, self.options.series_age_s, self.options.io_capacity)
        self.decision_log: deque[ScalingDecision] = deque(maxlen=self.options.log_size)
        self.actions: Counter[str] = Counter()
        self.ticks = 0
        self.history: dict[Role, deque[tuple[float, int, float | None, dict[str, float | None]]]] = {
            role: deque(maxlen=self.options.history_ticks) for role in self.pools
        }
        self.last_metrics: dict[str, float] = {}
        #: Per pool, the cores its executors can be placed on where that is known and small (the local
        #: pool: this machine's); set by the caller: a CPU-busy pool is not grown past them.
        self.host_cores: dict[Role, float] = {}
        #: Tasks no data executor has leased yet (None: unknown, or an unbounded stream); set by the
        #: caller before a tick: with none waiting, the ratio rule adds no data executor, and only the
        #: ratio rule removes one -- the trainers are the bottleneck, the executors left have the spare
        #: time to read the stopped one's task again; the load rule leaves them to end by themselves.
        self.pending_tasks: int | None = None

    # ------------------------------------------------------------------------------------- input
    def _pool(self, role: Role) -> _PoolState:
        try:
            return self._state[role]
        except KeyError:
            raise KeyError(f"no pool {role!r} under this controller (pools: {sorted(self._state)})") from None

    def observe(self, sample: Sample) -> None:
        """One executor sample (kept in :attr:`series` too)."""
        st = self._pool(sample.role)
        row = st.row(sample.executor_id)
        a = st.arrays
        decay = self.scaling.vertical.history_decay
        a["alloc_cpu"][row] = sample.allocated.cpu
        a["alloc_mem"][row] = sample.allocated.memory_bytes
        if st.n[row] == 0:
            a["t_first"][row] = sample.time
        a["t_last"][row] = sample.time
        a["cpu"][row] = sample.cpu
        a["rss"][row] = sample.rss_bytes
        a["io"][row] = np.nan if sample.io_bytes_per_s is None else sample.io_bytes_per_s
        a["fill"][row] = np.nan if sample.buffer_fill is None else sample.buffer_fill
        a["wait"][row] = np.nan if sample.reader_wait is None else sample.reader_wait
        a["rps"][row] = sample.rows_per_s
        a["ew_cpu"][row] = a["ew_cpu"][row] * decay + sample.cpu
        a["ew_mem"][row] = a["ew_mem"][row] * decay + sample.rss_bytes
        a["ew_den"][row] = a["ew_den"][row] * decay + 1.0
        a["peak"][row] = max(a["peak"][row], sample.rss_bytes)
        self._pool_peak[sample.role] = max(self._pool_peak[sample.role], sample.rss_bytes)
        st.n[row] += 1
        self.series.add(sample)

    def observe_batch(
        self,
        role: Role,
        executor_ids: Sequence[str],
        *,
        time: float,
        cpu: np.ndarray,
        rss_bytes: np.ndarray,
        io_bytes_per_s: np.ndarray | None = None,
        buffer_fill: np.ndarray | None = None,
        rows_per_s: np.ndarray | None = None,
        reader_wait: np.ndarray | None = None,
    ) -> None:
        """Samples of many executors of ``role`` at ``time`` as arrays aligned with ``executor_ids``
        (unique; fills and waits clipped to 0..1); allocations come from :meth:`update_status`.
        Not kept in :attr:`series`."""
        st = self._pool(role)
        rows = st.rows_of(executor_ids)
        a = st.arrays
        decay = self.scaling.vertical.history_decay
        cpu = np.asarray(cpu, dtype=float)
        rss = np.asarray(rss_bytes, dtype=float)
        first = rows[st.n[rows] == 0]
        a["t_first"][first] = time
        a["t_last"][rows] = time
        a["cpu"][rows] = cpu
        a["rss"][rows] = rss
        a["io"][rows] = np.nan if io_bytes_per_s is None else io_bytes_per_s
        for name, values in (("fill", buffer_fill), ("wait", reader_wait)):
            a[name][rows] = np.nan if values is None else np.clip(values, 0.0, 1.0)
        a["rps"][rows] = 0.0 if rows_per_s is None else rows_per_s
        a["ew_cpu"][rows] = a["ew_cpu"][rows] * decay + cpu
        a["ew_mem"][rows] = a["ew_mem"][rows] * decay + rss
        a["ew_den"][rows] = a["ew_den"][rows] * decay + 1.0
        a["peak"][rows] = np.maximum(a["peak"][rows], rss)
        if rss.size:
            self._pool_peak[role] = max(self._pool_peak[role], float(rss.max()))
        st.n[rows] += 1

    def update_status(self, role: Role, statuses: Sequence[ExecutorStatus], now: float | None = None) -> None:
        """The pool's current executors (all of them: one missing here has left the pool); ``now``
        (default the clock) dates a failure or restart among them (the pool is recovering)."""
        st = self._pool(role)
        count = len(statuses)
        rows = st.rows_of([s.executor_id for s in statuses])
        seen = np.zeros(st.size, dtype=bool)
        seen[rows] = True
        if count < len(st.rows):
            st.release(np.array([r for r in st.rows.values() if not seen[r]], dtype=np.int64))
        states = np.array([s.state for s in statuses], dtype=object)
        st.live[: st.size] = False
        st.live[rows] = ~np.isin(states, list(FINISHED_STATES))
        st.running[: st.size] = False
        st.running[rows] = states == "running"
        resources = [s.resources for s in statuses]
        st.arrays["alloc_cpu"][rows] = np.fromiter((r.cpu for r in resources), float, count)
        st.arrays["alloc_mem"][rows] = np.fromiter((r.memory_bytes for r in resources), float, count)
        a = st.arrays
        peaks = np.fromiter((s.rss_peak_bytes for s in statuses), float, count)
        a["peak"][rows] = np.maximum(a["peak"][rows], peaks)
        if count:
            self._pool_peak[role] = max(self._pool_peak[role], float(peaks.max()))
        killed = np.flatnonzero(states == "oom_killed")
        for i in killed.tolist():
            status = statuses[i]
            key = (status.executor_id, status.attempt)
            if key not in self._handled_oom:
                self._pending_oom[key] = status
        a["oom_pending"][rows[killed]] = 1.0
        # After an OOM kill the executor's floor only rises: never below what it was restarted with.
        floor_now = rows[st.live[rows] & (a["oom_pending"][rows] > 0)]
        a["floor_mem"][floor_now] = np.maximum(a["floor_mem"][floor_now], a["alloc_mem"][floor_now])
        a["oom_pending"][floor_now] = 0.0
        if killed.size or np.any(states == "failed"):
            self.disrupted(role, self.clock() if now is None else now)
        if len(self.series):
            for executor_id in self.series.executors(role):
                if executor_id not in st.rows:
                    self.series.remove(executor_id)

    # -------------------------------------------------------------------------------------- views
    def view(self, role: Role, now: float) -> PoolView:
        """What a tick at ``now`` sees of pool ``role``."""
        st = self._pool(role)
        live = st.live[: st.size]
        fresh = self._steady(st, now)
        cpu = st.col("cpu")[fresh]
        values = {
            "cpu": cpu / st.col("alloc_cpu")[fresh],
            "memory": st.col("rss")[fresh] / st.col("alloc_mem")[fresh],
            "io": st.col("io")[fresh] / self.options.io_capacity,
            "buffer_fill": st.col("fill")[fresh],
        }
        spec = self.scaling.horizontal
        load = weighted_load((m.weight, aggregate(values[m.name], m.aggregation)) for m in spec.metrics)
        replicas = int(live.sum())
        wait = aggregate(st.col("wait")[fresh], "mean")
        if wait is None and replicas == 0:
            wait = 0.0  # no trainer at all never waits: an idle data pool with full buffers wants trainers
        return PoolView(
            role=role,
            replicas=replicas,
            fresh=int(fresh.sum()),
            load=load,
            mean_util={name: aggregate(values[name], "mean") for name in METRIC_NAMES},
            buffer_fill=aggregate(values["buffer_fill"], "mean"),
            reader_wait=wait,
            cores_allocated=float(st.col("alloc_cpu")[live].sum()),
            cores_used=float(cpu.sum()),
            running=int(st.running[: st.size].sum()),
        )

    def _steady(self, st: _PoolState, now: float) -> np.ndarray:
        """Live executors with a fresh sample taken after their ``warmup`` (steady state)."""
        t_last = st.col("t_last")
        return (
            st.live[: st.size]
            & (st.n[: st.size] > 0)
            & (now - t_last <= self.max_age)
            & (t_last - st.col("t_first") >= self.warmup)
        )

    def disrupted(self, role: Role, now: float) -> None:
        """An executor of pool ``role`` failed or was OOM-killed at ``now`` (seen in its statuses, or told
        by the caller: a supervisor that restarted it before any status showed it finished)."""
        self._disrupted[role] = max(self._disrupted[role], now)

    def recovering(self, role: Role, now: float) -> bool:
        """Whether pool ``role`` had an executor fail or get OOM-killed within ``recovery_s``:
        its trainers' wait is then a stall (a killed executor's tasks wait for their lease), not load."""
        return now - self._disrupted[role] < self.recovery_s

    def wait_cap(self, data: PoolView) -> float:
        """The largest trainer wait the demand and the ratio rule take for the data pool ``data``:
        ``busy_wait_cap`` while its CPU is busy (at least ``scale_up_threshold``), else ``wait_cap``."""
        cpu = data.mean_util.get("cpu")
        busy = cpu is not None and cpu >= self.scaling.horizontal.scale_up_threshold
        return self.options.busy_wait_cap if busy else self.options.wait_cap

    def views(self, now: float) -> dict[Role, PoolView]:
        """Every pool's :meth:`view`; the data pool's load as demand, ``L_u / (1 − w)`` with ``w`` capped
        by :meth:`wait_cap`, and no demand term while the pool is :meth:`recovering` (module docstring)."""
        views = {role: self.view(role, now) for role in self.pools}
        data, training = views.get("data"), views.get("training")
        if data is not None and training is not None and data.load is not None and training.fresh:
            wait = training.reader_wait
            if wait is not None and wait > 0 and not self.recovering("data", now):
                views["data"] = replace(data, load=data.load / (1.0 - min(wait, self.wait_cap(data))))
        return views

    # --------------------------------------------------------------------------------------- tick
    def due(self, now: float) -> bool:
        """Whether a tick at ``now`` would decide scaling (``interval`` since the last one)."""
        return now - self._last_tick >= self.interval

    def tick(
        self, now: float | None = None, statuses: Mapping[Role, Sequence[ExecutorStatus]] | None = None
    ) -> list[ScalingDecision]:
        """This tick's decisions (module docstring); ``statuses``: pools' statuses to take first."""
        now = self.clock() if now is None else now
        for role, pool_statuses in (statuses or {}).items():
            self.update_status(role, pool_statuses, now)
        decisions = self._oom_decisions(now)
        if self.due(now):
            self._last_tick = now
            self.ticks += 1
            views = self.views(now)
            chosen = self._decide(views, now)
            for role in {d.role for d in chosen}:
                self._cool_until[role] = now + self.cooldown
            self._record_tick(now, views)
            decisions += chosen
        elif self.scaling.vertical.enabled:
            # Between scaling ticks, memory only grows, at once: an executor's RSS can outgrow a tick's
            # reaction (the pool's high-water mark arrives with every status); growth cannot flap.
            decisions += self._vertical(set(self.pools), now)[0]
        for decision in decisions:
            log.info("%s", decision.describe())
            self.decision_log.append(decision)
            self.actions[decision.kind] += 1
        return decisions

    def _decide(self, views: Mapping[Role, PoolView], now: float) -> list[ScalingDecision]:
        cooling = {role for role, until in self._cool_until.items() if now < until}
        horizontal = self._horizontal(views, cooling, now) if self.scaling.horizontal.enabled else []
        if self.scaling.vertical.enabled:
            vertical, urgent = self._vertical(cooling, now)
        else:
            vertical, urgent = [], False
        if horizontal and vertical:
            # Both want to act: they take turns, so neither starves (in a large pool some executor may
            # want more memory at nearly every tick); the first contention goes to an OOM-preventing resize.
            if self._last_strategy == "horizontal" or (self._last_strategy is None and urgent):
                horizontal = []
            else:
                vertical = []
        chosen = horizontal or vertical
        if chosen:
            self._last_strategy = "horizontal" if horizontal else "vertical"
        return chosen

    def _horizontal(self, views: Mapping[Role, PoolView], cooling: set[Role], now: float) -> list[ScalingDecision]:
        spec = self.scaling.horizontal
        recovering = "data" in views and self.recovering("data", now)
        if "data" in views and "training" in views and not recovering:
            data, training = views["data"], views["training"]
            ratio = ratio_decision(
                buffer_fill=data.buffer_fill,
                trainer_wait=training.reader_wait,
                data_replicas=data.replicas,
                training_replicas=training.replicas,
                data_pool=self.pools["data"],
                training_pool=self.pools["training"],
                step=spec.step,
                scale_up_threshold=spec.scale_up_threshold,
                data_load=data.load,
                rule=self.options.ratio,
                now=now,
                proportional=spec.proportional,
                data_running=data.running,
                pending_tasks=self.pending_tasks,
            )
            if ratio is not None and ratio.kind == "scale_out" and ratio.role == "data":
                # Trainers wait on a CPU-busy pool: the demand (L_u / (1 − w)) may ask for more than the
                # ratio rule's doubling -- one step to it, so the new executors start together.
                load = horizontal_decision(
                    "data",
                    data.replicas,
                    data.load,
                    spec,
                    self.pools["data"],
                    now=now,
                    running=data.running,
                    allow_scale_in=False,
                )
                if load is not None and load.kind == "scale_out" and load.delta > ratio.delta:
                    ratio = replace(
                        load, reason=f"{ratio.reason}; {load.reason}", inputs={**ratio.inputs, **load.inputs}
                    )
            if ratio is not None and ratio.kind == "scale_out":
                ratio = self._within_cores(ratio, data)
            if ratio is not None and ratio.role not in self.options.fixed_roles:
                # The rule couples the two pools: while it holds, the load rule moves neither.
                return [] if ratio.role in cooling else [self._complete(ratio)]
        out = []
        trainers = views.get("training")
        reporting = trainers is not None and trainers.fresh > 0 and trainers.reader_wait is not None
        wait = (trainers.reader_wait or 0.0) if trainers is not None else 0.0
        waiting = reporting and wait >= self.options.ratio.wait_high
        data_fill = views["data"].buffer_fill if "data" in views else None
        # The data pool is ahead -- its buffers are full, or the trainers never wait -- whatever its CPU: a
        # busy pool that keeps up is filling buffers or reading released tasks again, not short.
        full = data_fill is not None and data_fill >= self.options.ratio.fill_full
        ahead = reporting and not waiting and (full or wait <= self.options.ratio.wait_low)
        for role, v in views.items():
            if role in cooling or role in self.options.fixed_roles:
                continue
            inputs = {f"u_{k}": u for k, u in v.mean_util.items() if u is not None}
            decision = horizontal_decision(
                role,
                v.replicas,
                v.load,
                spec,
                self.pools[role],
                now=now,
                inputs=inputs,
                running=v.running,
                # Tasks running out (none pending): a stop only sends its task to be read again, and
                # without the trainers as the bottleneck (the ratio rule, above) nothing has time for it.
                allow_scale_in=not (role == "data" and (waiting or self.pending_tasks == 0))
                and not self.recovering(role, now),
                allow_scale_out=not (role == "data" and ahead),
            )
            if decision is not None and decision.kind == "scale_out":
                decision = self._within_cores(decision, v)
            if decision is not None:
                out.append(self._complete(decision))
        return out

    def _within_cores(self, decision: ScalingDecision, view: PoolView) -> ScalingDecision | None:
        """A scale-out of a CPU-busy pool no larger than :attr:`host_cores` hold: more executors on the
        same busy cores add no throughput, only their start-up and their share of the cores. A pool whose
        CPU is not busy (it waits on the transport, a slow store) may grow past them."""
        cores = self.host_cores.get(decision.role)
        cpu = view.mean_util.get("cpu")
        if cores is None or cpu is None or cpu < self.scaling.horizontal.scale_up_threshold:
            return decision
        room = math.floor(cores / max(self.pools[decision.role].cpu, 1e-9) + 1e-9) - view.replicas
        if room <= 0:
            return None
        return decision if decision.delta <= room else replace(decision, delta=room)

    def _complete(self, decision: ScalingDecision) -> ScalingDecision:
        """Resources of new executors (the pool's median allocation: what vertical scaling learnt,
        else the spec's); the executors a scale-in stops (the least busy; unsampled ones first)."""
        st = self._pool(decision.role)
        live = np.flatnonzero(st.live[: st.size])
        if decision.kind == "scale_out":
            if live.size:
                new = Resources(float(np.median(st.col("alloc_cpu")[live])), int(np.median(st.col("alloc_mem")[live])))
            else:
                new = st.default
            if self._pool_sized(st, decision.role):
                # Sized as vertical scaling sizes the pool (its peak with the headroom): no resize after
                # the start, which is a second start where a resize replaces the pod.
                floor = float(np.max(st.col("floor_mem")[live], initial=0.0))
                new = Resources(new.cpu, int(max(self._pool_memory_need(decision.role), floor)))
            return replace(decision, new=new)
        # At most max_scale_in_fraction of the pool at once: the rest read the released tasks again.
        k = min(
            -decision.delta,
            max(self.scaling.horizontal.step, math.ceil(self.options.max_scale_in_fraction * live.size)),
        )
        busy = np.where(st.n[live] > 0, st.col("rps")[live], -1.0)
        pick = live[np.argsort(busy, kind="stable")[:k]] if k < live.size else live
        ids = tuple(str(st.ids[r]) for r in pick)
        return replace(decision, executor_ids=ids, delta=-len(ids))

    def _vertical(self, cooling: set[Role], now: float) -> tuple[list[ScalingDecision], bool]:
        """Resize decisions (at most ``max_resizes_per_tick``: memory increases first, then by size
        of change), and whether any is a memory increase."""
        plans = [
            plan
            for role, st in self._state.items()
            if role not in self.options.fixed_roles and (plan := self._resizes(st, role in cooling, now))
        ]
        if not plans:
            return [], False
        limit = self.options.max_resizes_per_tick
        priority = np.concatenate([p.priority for p in plans])
        cut = -np.partition(-priority, limit - 1)[limit - 1] if priority.size > limit else -np.inf
        out: list[ScalingDecision] = []
        urgent = False
        spec = self.scaling.vertical
        for plan in plans:
            st = self._state[plan.role]
            keep = np.flatnonzero(plan.priority >= cut)
            for i in keep[np.argsort(-plan.priority[keep], kind="stable")].tolist():
                if len(out) >= limit:
                    break
                row = int(plan.rows[i])
                grow = bool(plan.grow_mem[i])
                urgent = urgent or grow
                reason = (
                    f"demand {plan.demand_cpu[i]:.2f} cpu, {int(plan.demand_mem[i]) >> 20} MiB "
                    f"(+{spec.headroom:g} headroom, R_theta {spec.min_change:g})"
                )
                out.append(
                    ScalingDecision(
                        "resize",
                        plan.role,
                        reason + ("; memory near its limit" if grow else ""),
                        now,
                        executor_ids=(str(st.ids[row]),),
                        old=Resources(float(plan.cur_cpu[i]), int(plan.cur_mem[i])),
                        new=Resources(round(float(plan.new_cpu[i]), 6), int(plan.new_mem[i])),
                        inputs={
                            "demand_cpu": float(plan.demand_cpu[i]),
                            "demand_memory": float(plan.demand_mem[i]),
                            "cpu_used": float(st.arrays["cpu"][row]),
                            "rss_bytes": float(st.arrays["rss"][row]),
                            "samples": float(st.n[row]),
                        },
                    )
                )
        return out, urgent

    def _resizes(self, st: _PoolState, cooling: bool, now: float) -> _ResizePlan | None:
        """The executors of one pool that vertical scaling would resize (only memory increases
        while the pool cools down)."""
        spec = self.scaling.vertical
        opts = self.options
        rows = np.flatnonzero(self._steady(st, now) & (st.n[: st.size] >= opts.min_samples))
        if rows.size == 0:
            return None
        a = st.arrays
        den = a["ew_den"][rows]
        demand_cpu = a["ew_cpu"][rows] / den
        # Memory cannot be throttled, only killed: its demand is its peak in this run (samples and the
        # pool's high-water mark), never a mean, never below the latest RSS.
        demand_mem = np.maximum.reduce([a["ew_mem"][rows] / den, a["rss"][rows], a["peak"][rows]])
        cur_cpu, cur_mem = a["alloc_cpu"][rows], a["alloc_mem"][rows]
        pool = self.pools[st.role]
        new_cpu, ch_cpu = vertical_allocation(
            demand_cpu,
            cur_cpu,
            headroom=spec.headroom,
            min_change=spec.min_change,
            floor=opts.min_cpu,
            cap=opts.cpu_cap_factor * pool.cpu,
            quantum=opts.cpu_quantum,
        )
        if self.scaling.horizontal.enabled and pool.min_replicas < pool.max_replicas:
            new_cpu, ch_cpu = cur_cpu, np.zeros(rows.size, dtype=bool)  # horizontal sizes this pool's CPU
        new_mem, ch_mem = vertical_allocation(
            demand_mem,
            cur_mem,
            headroom=spec.headroom,
            min_change=spec.min_change,
            floor=self._memory_floor(st, rows, cur_mem),
            cap=self._memory_cap[st.role],
            quantum=opts.memory_quantum,
        )
        grow_mem = ch_mem & (new_mem > cur_mem)
        sel = np.flatnonzero(grow_mem if cooling else (ch_cpu | ch_mem))
        if opts.resize_restarts and sel.size:
            # A rolling update: what is starting already counts against max_unavailable.
            live = st.live[: st.size]
            budget = max(1, math.floor(opts.max_unavailable * int(live.sum()))) - int(
                (live & ~st.running[: st.size]).sum()
            )
            rest = sel[~grow_mem[sel]]
            rest = rest[np.argsort(-np.abs(new_mem[rest] - cur_mem[rest]), kind="stable")][: max(0, budget)]
            sel = np.sort(np.concatenate([sel[grow_mem[sel]], rest]))
        if sel.size == 0:
            return None
        change = np.maximum(
            np.abs(new_cpu[sel] - cur_cpu[sel]) / cur_cpu[sel], np.abs(new_mem[sel] - cur_mem[sel]) / cur_mem[sel]
        )
        return _ResizePlan(
            role=st.role,
            rows=rows[sel],
            priority=change + np.where(grow_mem[sel], 1e6, 0.0),
            demand_cpu=demand_cpu[sel],
            demand_mem=demand_mem[sel],
            cur_cpu=cur_cpu[sel],
            cur_mem=cur_mem[sel],
            new_cpu=new_cpu[sel],
            new_mem=new_mem[sel],
            grow_mem=grow_mem[sel],
        )

    def _pool_memory_need(self, role: Role) -> float:
        """The pool's peak RSS with the headroom, quantised and clipped to the floor and the cap."""
        need, _ = vertical_allocation(
            self._pool_peak[role],
            0.0,
            headroom=self.scaling.vertical.headroom,
            min_change=0.0,
            floor=self.options.min_memory_bytes,
            cap=self._memory_cap[role],
            quantum=self.options.memory_quantum,
        )
        return float(need)

    def _pool_sized(self, st: _PoolState, role: Role) -> bool:
        """Whether vertical scaling sizes the memory of ``role``'s new executors: it is enabled there
        and some executor of the pool has the steady history a resize needs (``min_samples``)."""
        if not self.scaling.vertical.enabled or role in self.options.fixed_roles or self._pool_peak[role] <= 0:
            return False
        return bool(np.any(st.n[: st.size] >= self.options.min_samples))

    def _memory_floor(self, st: _PoolState, rows: np.ndarray, current: np.ndarray) -> np.ndarray:
        """Per executor, the least memory vertical scaling gives it: ``min_memory_bytes``, what it was
        restarted with after an OOM kill, and -- for a decrease -- the pool's peak RSS with the headroom
        (any executor of the pool may get the heaviest task kind next; it never pushes one up)."""
        floor = np.maximum(float(self.options.min_memory_bytes), st.arrays["floor_mem"][rows])
        return np.maximum(floor, np.minimum(self._pool_memory_need(st.role), current))

    def _oom_decisions(self, now: float) -> list[ScalingDecision]:
        out = []
        for key, status in list(self._pending_oom.items()):
            del self._pending_oom[key]
            self._handled_oom.add(key)
            if not self.options.oom_restarts:
                continue
            decision = oom_restart_decision(status, self.pools[status.role], self._memory_cap[status.role], now=now)
            if decision is not None:
                out.append(decision)
        return out

    # ------------------------------------------------------------------------------------ records
    def _record_tick(self, now: float, views: Mapping[Role, PoolView]) -> None:
        metrics: dict[str, float] = {}
        for role, v in views.items():
            self.history[role].append((now, v.replicas, v.load, v.mean_util))
            metrics[f"scaling/{role}/replicas"] = float(v.replicas)
            metrics[f"scaling/{role}/cores_allocated"] = v.cores_allocated
            if v.load is not None:
                metrics[f"scaling/{role}/load"] = v.load
            for name, u in v.mean_util.items():
                if u is not None:
                    metrics[f"scaling/{role}/util_{name}"] = u
        for kind in ("scale_out", "scale_in", "resize", "oom_restart"):
            metrics[f"scaling/actions_{kind}"] = float(self.actions[kind])
        self.last_metrics = metrics

    def summary(self) -> dict[str, Any]:
        """Actions by kind, replicas over time and mean utilisation per pool (JSON-able; for run
        metadata and MLflow)."""
        pools: dict[str, Any] = {}
        for role, rows in self.history.items():
            replicas = [r for _, r, _, _ in rows]
            loads = [load for _, _, load, _ in rows if load is not None]
            util: dict[str, float] = {}
            for name in METRIC_NAMES:
                values = [v for _, _, _, u in rows if (v := u.get(name)) is not None]
                if values:
                    util[name] = round(float(np.mean(values)), 4)
            pools[role] = {
                "replicas": replicas[-1] if replicas else None,
                "replicas_min": min(replicas, default=None),
                "replicas_max": max(replicas, default=None),
                "replicas_mean": round(float(np.mean(replicas)), 3) if replicas else None,
                "load_mean": round(float(np.mean(loads)), 4) if loads else None,
                "util_mean": util,
                "replicas_over_time": [[round(t, 3), r] for t, r, _, _ in rows],
            }
        return {
            "ticks": self.ticks,
            "actions": int(sum(self.actions.values())),
            "actions_by_kind": dict(self.actions),
            "pools": pools,
        }


def apply_decision(pools: Mapping[Role, ExecutorPool], decision: ScalingDecision) -> None:
    """Execute one decision on its pool (any :class:`~primus_dagster.cluster.pool.ExecutorPool`: the
    live autoscaler and the simulator apply decisions alike)."""
    pool = pools[decision.role]
    if decision.kind == "scale_out":
        pool.launch(decision.delta, decision.new)
    elif decision.kind == "scale_in":
        for executor_id in decision.executor_ids:
            pool.stop(executor_id)
    elif decision.kind == "resize":
        assert decision.new is not None
        pool.resize(decision.executor_ids[0], decision.new)
    else:
        pool.restart(decision.executor_ids[0], decision.new)
