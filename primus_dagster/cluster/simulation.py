"""A discrete-time simulation of a job's executor pools, driven by the real scaling controller.

Nothing runs: executors are rows of numpy arrays in a :class:`SimulatedPool` (an
:class:`~primus_dagster.cluster.pool.ExecutorPool`: launch / stop / restart / resize / status), a
load model says what each running executor uses every ``dt`` seconds, and the same
:class:`~primus_dagster.cluster.controller.ScalingController` as a live run turns those samples
into decisions, which :func:`apply_decision` executes on the simulated pools. Every step:

1. executors whose startup delay has passed start running;
2. the load model gives each running executor its CPU, RSS, buffer fill and reader wait, and the
   job's wanted vs served work (the gap is throughput lost);
3. an executor whose RSS exceeds its memory allocation is OOM-killed;
4. the controller observes the samples (and new statuses), ticks, and its decisions are applied.

Two load models:

* :class:`PulledLoad` -- data executors pull tasks into buffers that the trainers drain (the data
  plane of this project): the trainers' appetite (a trace, or trainers × rows/s each) is served
  from the data pool's capacity plus its buffers; a data pool short of capacity makes the trainers
  wait, a pool with spare capacity fills its buffers and idles.
* :class:`PartitionedLoad` -- each executor owns a fixed share of the load (stream partitions):
  its CPU need is its share plus noise, throttled at its allocation; its memory can grow.

Costs (the cost model; every figure stated, see ``docs/scaling.md``):

* **scale-out** takes ``startup_s`` from launch to serving: a stated figure per backend
  (:data:`STARTUP_S`: the local pool's start measured on this machine, a pod's scheduling and
  image pull);
* **scale-in** drains: a stopped executor keeps its cores ``drain_s`` (it serves what it buffered,
  reads nothing new), its leased task goes back and is read again from the start (``reread_s`` of
  its production, :class:`PulledLoad`), and rows buffered past the smaller pool's buffers are read
  again too, not dropped;
* **restarts and OOM kills** are downtime: the executor serves nothing until it runs again, and in
  :class:`PartitionedLoad` its partition's work is wanted meanwhile (throughput lost);
* **resize** is a restart where the backend replaces the pod (``resize_restarts``: Kubernetes);
* **measurement noise** (``measurement_noise``): one multiplicative factor per step and pool on
  what the controller observes (CPU, buffer fill, reader wait), not on what happens.

The simulation is a model, not a measurement: ``docs/scaling.md`` lists its assumptions.

Example::

    sim = Simulation(scaling, {"data": PoolSpec(replicas=900, ...), "training": ...},
                     PulledLoad(appetite=DiurnalTrace(peak=6.3e6, trough=2.1e6)), dt=15.0)
    result = sim.run(2 * 86400)
    result.mean_cpu_util("data"), result.throughput_lost_pct()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from primus_dagster.cluster.controller import ControllerOptions, ScalingController, apply_decision
from primus_dagster.cluster.policies import ScalingDecision
from primus_dagster.cluster.pool import (
    ExecutorState,
    ExecutorStatus,
    PoolError,
    Resources,
    Role,
    memory_bytes,
)
from primus_dagster.spec import PoolSpec, ScalingSpec

STARTING, RUNNING, OOM_KILLED, DRAINING = 0, 1, 2, 3
_STATE_NAMES: tuple[ExecutorState, ...] = ("starting", "running", "oom_killed", "stopped")

#: Seconds from launch to serving, per backend (stated figures, docs/scaling.md): ``local`` was
#: measured here (a ``LocalPool`` data executor's start to its first heartbeat, 1.2 s, rounded up);
#: ``kubernetes`` is a stated figure: ~30 s scheduling and node placement + ~60 s pulling a ~2 GB
#: image on a node without it cached.
STARTUP_S: dict[str, float] = {"local": 2.0, "kubernetes": 90.0}
#: Seconds a stopped executor drains (serves its buffer, reads nothing) before its cores are free.
DRAIN_S = 10.0


class SimulatedPool:
    """An :class:`~primus_dagster.cluster.pool.ExecutorPool` of simulated executors: an executor
    starts running ``startup_s`` after its launch (or restart), resizes in place at once (or, with
    ``resize_restarts``, restarts with the new size: the pod is replaced), and when stopped drains
    ``drain_s`` (status ``stopped``, its cores still held, serving nothing new) before it leaves
    the pool. ``clock`` is the simulation time. ``released``: the cores of executors whose leased
    task went back to the driver (stopped or replaced) since the load model last took them.

    Example::

        now = [0.0]
        pool = SimulatedPool("data", PoolSpec(replicas=2), startup_s=60, clock=lambda: now[0])
        ids = pool.launch(2)
        now[0] = 60.0; pool.advance()
        [s.state for s in pool.status()]           # ["running", "running"]
    """

    def __init__(
        self,
        role: Role,
        spec: PoolSpec,
        *,
        startup_s: float,
        clock: Callable[[], float],
        drain_s: float = 0.0,
        resize_restarts: bool = False,
    ):
        self.role: Role = role
        self.spec = spec
        self.startup_s = startup_s
        self.drain_s = drain_s
        self.resize_restarts = resize_restarts
        self.clock = clock
        self.released: list[float] = []
        self.default = Resources(spec.cpu, memory_bytes(spec.memory))
        self.ids: list[str] = []
        self.index = np.zeros(0, dtype=np.int64)  # launch order: the load model's key for an executor
        self.cpu = np.zeros(0)
        self.mem = np.zeros(0)
        self.state = np.zeros(0, dtype=np.int8)
        self.ready_at = np.zeros(0)
        self.started_at = np.zeros(0)
        self.attempt = np.zeros(0, dtype=np.int64)
        self.ran = np.zeros(0, dtype=bool)  # has served at least once (its partition is wanted)
        self.gone_at = np.zeros(0)  # draining: when it leaves
        self.launched = 0
        self.version = 0  # bumped on every change the controller must see in the statuses
        self.closed = False
        self._pos: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def _position(self, executor_id: str) -> int:
        if self._pos is None:
            self._pos = {e: i for i, e in enumerate(self.ids)}
        try:
            return self._pos[executor_id]
        except KeyError:
            raise PoolError(f"no executor {executor_id} in the simulated {self.role} pool") from None

    def _changed(self, layout: bool = False) -> None:
        self.version += 1
        if layout:
            self._pos = None

    def launch(self, count: int, resources: Resources | None = None, *, avoid_nodes: Sequence[str] = ()) -> list[str]:
        if self.closed:
            raise PoolError(f"{self.role} pool is closed")
        res = resources or self.default
        now = self.clock()
        new = [f"{self.role}-{self.launched + i}" for i in range(count)]
        self.ids += new
        self.index = np.append(self.index, np.arange(self.launched, self.launched + count))
        self.cpu = np.append(self.cpu, np.full(count, res.cpu))
        self.mem = np.append(self.mem, np.full(count, float(res.memory_bytes)))
        self.state = np.append(self.state, np.full(count, STARTING, dtype=np.int8))
        self.ready_at = np.append(self.ready_at, np.full(count, now + self.startup_s))
        self.started_at = np.append(self.started_at, np.full(count, now))
        self.attempt = np.append(self.attempt, np.zeros(count, dtype=np.int64))
        self.ran = np.append(self.ran, np.zeros(count, dtype=bool))
        self.gone_at = np.append(self.gone_at, np.full(count, np.inf))
        self.launched += count
        self._changed(layout=True)
        return new

    def start_now(self) -> None:
        """Every starting executor is running now (a job's initial executors)."""
        self.ready_at[self.state == STARTING] = self.clock()
        self.advance()

    def stop(self, executor_id: str) -> None:
        i = self._position(executor_id)
        if self.state[i] == DRAINING:
            raise PoolError(f"{executor_id} is already stopping")
        if self.state[i] == RUNNING:
            self.released.append(float(self.cpu[i]))
        if self.drain_s > 0:
            self.state[i] = DRAINING
            self.gone_at[i] = self.clock() + self.drain_s
            self._changed()
            return
        self._remove(np.array([i]))

    def _remove(self, positions: np.ndarray) -> None:
        keep = np.ones(len(self.ids), dtype=bool)
        keep[positions] = False
        self.ids = [e for e, k in zip(self.ids, keep.tolist(), strict=True) if k]
        for name in ("index", "cpu", "mem", "state", "ready_at", "started_at", "attempt", "ran", "gone_at"):
            setattr(self, name, getattr(self, name)[keep])
        self._changed(layout=True)

    def restart(self, executor_id: str, resources: Resources | None = None, *, avoid_nodes: Sequence[str] = ()) -> None:
        i = self._position(executor_id)
        if self.state[i] != OOM_KILLED:
            raise PoolError(f"{executor_id} is {_STATE_NAMES[self.state[i]]}: only a finished executor restarts")
        if resources is not None:
            self.cpu[i], self.mem[i] = resources.cpu, resources.memory_bytes
        now = self.clock()
        self.state[i] = STARTING
        self.ready_at[i] = now + self.startup_s
        self.started_at[i] = now
        self.attempt[i] += 1
        self._changed()

    def resize(self, executor_id: str, resources: Resources) -> None:
        i = self._position(executor_id)
        self.cpu[i], self.mem[i] = resources.cpu, resources.memory_bytes
        if self.resize_restarts and self.state[i] == RUNNING:  # the pod is replaced: a restart
            self.released.append(float(resources.cpu))
            self.state[i] = STARTING
            self.ready_at[i] = self.clock() + self.startup_s
            self.started_at[i] = self.clock()
        self._changed()

    def take_released(self) -> list[float]:
        """The cores of executors whose leased task went back since the last call (load models)."""
        released, self.released = self.released, []
        return released

    def status(self) -> list[ExecutorStatus]:
        return [
            ExecutorStatus(
                executor_id,
                self.role,
                _STATE_NAMES[state],
                Resources(float(cpu), int(mem)),
                attempt=int(attempt),
                node="sim",
                last_error="OOM-killed (simulated)" if state == OOM_KILLED else None,
            )
            for executor_id, state, cpu, mem, attempt in zip(
                self.ids, self.state.tolist(), self.cpu.tolist(), self.mem.tolist(), self.attempt.tolist(), strict=True
            )
        ]

    def cpu_seconds(self, include_startup: bool = True) -> float:
        """0.0: simulated executors use no CPU of this machine (the load model accounts for theirs)."""
        return 0.0

    def close(self) -> None:
        self.closed = True

    # ------------------------------------------------------------------------- simulation only
    def advance(self) -> None:
        """Executors whose startup delay has passed are running; drained ones leave."""
        now = self.clock()
        ready = (self.state == STARTING) & (self.ready_at <= now)
        if ready.any():
            self.state[ready] = RUNNING
            self.ran |= ready
            self._changed()
        gone = np.flatnonzero((self.state == DRAINING) & (self.gone_at <= now))
        if gone.size:
            self._remove(gone)

    @property
    def running(self) -> np.ndarray:
        return self.state == RUNNING

    @property
    def live(self) -> np.ndarray:
        """Executors that hold their cores: all but OOM-killed ones (draining ones included)."""
        return self.state != OOM_KILLED

    @property
    def wanted(self) -> np.ndarray:
        """Executors whose work is wanted: every one that has served and is not stopping."""
        return self.ran & (self.state != DRAINING)

    def oom_kill(self, positions: np.ndarray) -> None:
        if positions.size:
            self.released += self.cpu[positions].tolist()
            self.state[positions] = OOM_KILLED
            self._changed()


@dataclass
class Usage:
    """What the running executors of one pool use in one step (arrays aligned with them)."""

    cpu: np.ndarray
    rss_bytes: np.ndarray
    rows_per_s: np.ndarray
    buffer_fill: np.ndarray | None = None
    reader_wait: np.ndarray | None = None


@dataclass
class StepLoad:
    """One step of a load model: usage per pool, and the job's work wanted and served (any unit)."""

    usage: dict[Role, Usage]
    wanted: float
    served: float


class LoadModel(Protocol):
    """What the executors of the pools use at ``now`` (only running executors use anything)."""

    def step(self, now: float, dt: float, pools: Mapping[Role, SimulatedPool]) -> StepLoad: ...


@dataclass
class DiurnalTrace:
    """A daily load curve: a cosine from ``trough`` to ``peak`` (at ``peak_at_s`` into the day)
    times slow multiplicative noise (an AR(1) series through knots ``knot_s`` apart, relative sd
    about ``noise``), times ``1 + extra`` during each surge ``(start_s, duration_s, extra)``
    (seconds into every day).

    Example::

        trace = DiurnalTrace(peak=900.0, trough=300.0)
        trace(20 * 3600.0)          # about 900: the evening peak
    """

    peak: float
    trough: float
    period_s: float = 86400.0
    peak_at_s: float = 20 * 3600.0
    noise: float = 0.03
    knot_s: float = 300.0
    surges: tuple[tuple[float, float, float], ...] = ()
    seed: int = 0
    _knots: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        # An AR(1) series over 30 days of knots: smooth, bounded, reproducible.
        count = int(30 * 86400 / self.knot_s) + 2
        knots = np.zeros(count)
        for i in range(1, count):
            knots[i] = 0.8 * knots[i - 1] + rng.normal(0.0, self.noise * 0.6)
        self._knots = knots

    def __call__(self, t: float) -> float:
        mid, amp = (self.peak + self.trough) / 2, (self.peak - self.trough) / 2
        base = mid + amp * math.cos(2 * math.pi * (t - self.peak_at_s) / self.period_s)
        noise = float(np.interp(t / self.knot_s, np.arange(self._knots.size), self._knots))
        day_s = t % self.period_s
        surge = sum(extra for start, length, extra in self.surges if start <= day_s < start + length)
        return max(0.0, base * (1.0 + noise) * (1.0 + surge))


@dataclass
class SpikeTrace:
    """Bursty load: ``base`` times ``factor`` during spikes of ``duration_s``, one starting at a
    random time in each ``every_s`` period (uniform in its first half: they never overlap).

    >>> trace = SpikeTrace(base=100.0, factor=3.0, duration_s=600.0, every_s=4 * 3600.0, seed=0)
    >>> sorted({round(trace(t)) for t in range(0, 4 * 3600, 60)})
    [100, 300]
    """

    base: float
    factor: float = 3.0
    duration_s: float = 600.0
    every_s: float = 4 * 3600.0
    seed: int = 0
    _starts: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self._starts = rng.uniform(0.0, self.every_s / 2, 400)

    def __call__(self, t: float) -> float:
        k = int(t // self.every_s)
        start = k * self.every_s + self._starts[k % self._starts.size]
        return self.base * (self.factor if start <= t < start + self.duration_s else 1.0)


@dataclass
class StepTrace:
    """A permanent step: ``before`` until ``at_s``, ``after`` from then on.

    >>> StepTrace(100.0, 200.0, at_s=60.0)(59.0), StepTrace(100.0, 200.0, at_s=60.0)(60.0)
    (100.0, 200.0)
    """

    before: float
    after: float
    at_s: float

    def __call__(self, t: float) -> float:
        return self.before if t < self.at_s else self.after


@dataclass
class RampTrace:
    """A slow ramp from ``start`` to ``end`` over ``duration_s`` (then flat).

    >>> RampTrace(100.0, 300.0, duration_s=100.0)(50.0)
    200.0
    """

    start: float
    end: float
    duration_s: float

    def __call__(self, t: float) -> float:
        return self.start + (self.end - self.start) * min(1.0, max(0.0, t / self.duration_s))


def _per_executor(
    values: np.ndarray, index: np.ndarray, make: Callable[[int], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """``values`` grown (by ``make``) to cover launch ``index``; then its entries for ``index``."""
    need = int(index.max()) + 1 if index.size else 0
    if need > values.size:
        values = np.concatenate([values, make(need - values.size)])
    return values, values[index]


@dataclass
class PulledLoad:
    """Data executors pull work into buffers the trainers drain (see the module docstring).

    * ``appetite(t)``: rows/s the trainers could take at ``t`` (``math.inf``: a backlog); it is
      also capped by ``trainer_rows_per_s`` × running trainers when that is finite;
    * a data executor with ``c`` cores produces up to ``(c − idle_cpu) × rows_per_core_s`` rows/s
      and idles at ``idle_cpu`` cores; all executors run at the same busy fraction (they pull);
    * buffers hold ``buffer_s`` seconds of the pool's capacity; production beyond the trainers'
      take fills them, a shortfall drains them, and only an empty buffer makes the trainers wait;
    * a trainer uses ``trainer_busy_cpu`` of its cores while it trains, none while it waits;
    * RSS: ``rss_bytes[role]`` per executor (data: plus ``row_bytes`` per buffered row);
    * CPU jitter: multiplicative, relative sd ``jitter`` per executor and step;
    * re-reads (the cost model): an executor stopped, replaced or OOM-killed gives its leased task
      back, read again from its start: ``reread_s`` seconds of its production; rows buffered past
      a smaller pool's buffers are read again too. Re-reads are produced before new rows (``debt``).

    Example::

        PulledLoad(appetite=DiurnalTrace(peak=6.3e6, trough=2.1e6), rows_per_core_s=1000.0)
    """

    appetite: Callable[[float], float]
    rows_per_core_s: float = 1000.0
    trainer_rows_per_s: float = math.inf
    buffer_s: float = 10.0
    idle_cpu: float = 0.2
    trainer_busy_cpu: float = 0.9
    rss_bytes: Mapping[str, float] = field(
        default_factory=lambda: {"data": 6.0 * (1 << 30), "training": 8.0 * (1 << 30)}
    )
    row_bytes: float = 1024.0
    jitter: float = 0.03
    reread_s: float = 30.0
    seed: int = 0
    buffered: float = field(default=0.0, init=False)
    debt: float = field(default=0.0, init=False)
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def step(self, now: float, dt: float, pools: Mapping[Role, SimulatedPool]) -> StepLoad:
        data = pools["data"]
        run = data.running
        cores = data.cpu[run]
        capacity = np.maximum(cores - self.idle_cpu, 0.0) * self.rows_per_core_s
        cap = float(capacity.sum())
        appetite = self.appetite(now)
        training = pools.get("training")
        trainers = int(training.running.sum()) if training is not None else 0
        if math.isfinite(self.trainer_rows_per_s):
            appetite = min(appetite, trainers * self.trainer_rows_per_s)
        buffer_max = self.buffer_s * cap
        released = data.take_released()
        self.debt += sum(max(c - self.idle_cpu, 0.0) for c in released) * self.rows_per_core_s * self.reread_s
        self.debt += max(0.0, self.buffered - buffer_max)  # rows past the smaller buffers: read again
        self.buffered = min(self.buffered, buffer_max)
        repay = min(self.debt / dt, cap)  # re-reads first
        self.debt -= repay * dt
        fresh_cap = cap - repay
        if fresh_cap >= appetite:
            served = appetite
            produced = min(fresh_cap, appetite + (buffer_max - self.buffered) / dt)
        else:
            served = min(appetite, fresh_cap + self.buffered / dt)
            produced = fresh_cap
        self.buffered = min(buffer_max, max(0.0, self.buffered + (produced - served) * dt))
        busy = (produced + repay) / cap if cap > 0 else 0.0
        jitter = 1.0 + self.jitter * self._rng.standard_normal(cores.size)
        cpu = np.clip(self.idle_cpu + busy * np.maximum(cores - self.idle_cpu, 0.0) * jitter, 0.0, cores)
        fill = self.buffered / buffer_max if buffer_max > 0 else 0.0
        share = capacity / cap if cap > 0 else np.zeros_like(capacity)
        usage: dict[Role, Usage] = {
            "data": Usage(
                cpu=cpu,
                rss_bytes=self.rss_bytes["data"] + share * self.buffered * self.row_bytes,
                rows_per_s=share * (produced + repay),
                buffer_fill=np.full(cores.size, fill),
            )
        }
        wait = 1.0 - served / appetite if appetite > 0 else 0.0
        if training is not None:
            t_run = training.running
            t_cores = training.cpu[t_run]
            usage["training"] = Usage(
                cpu=t_cores * self.trainer_busy_cpu * (1.0 - wait),
                rss_bytes=np.full(t_cores.size, self.rss_bytes["training"]),
                rows_per_s=np.full(t_cores.size, served / trainers if trainers else 0.0),
                reader_wait=np.full(t_cores.size, wait),
            )
        return StepLoad(usage, wanted=appetite, served=served)


@dataclass
class PartitionedLoad:
    """Each data executor owns a fixed share of the load (see the module docstring).

    * executor ``i`` needs ``mean_cpu × s_i × (1 + n_i(t))`` cores: ``s_i`` lognormal (sd
      ``share_sigma``, mean 1: skew between partitions), ``n_i`` an AR(1) noise (sd ``noise``,
      step correlation ``noise_corr``); it uses at most its allocation (the rest is throttled:
      work wanted but not served, in core-seconds);
    * its RSS is ``mean_rss × r_i`` (lognormal, sd ``rss_sigma``) plus ``rss_growth_bytes_per_s``
      since its (re)start -- a growing executor is OOM-killed once past its memory;
    * downtime is lost throughput: an executor that has served and is down (OOM-killed, restarting,
      replaced by a resize) still owns its partition, whose work is wanted and not served.

    Example::

        PartitionedLoad(mean_cpu=5.0, mean_rss=8 << 30)
    """

    mean_cpu: float
    mean_rss: float
    share_sigma: float = 0.25
    noise: float = 0.10
    noise_corr: float = 0.9
    rss_sigma: float = 0.1
    rss_growth_bytes_per_s: float = 0.0
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)
    _share: np.ndarray = field(init=False, repr=False)
    _rss: np.ndarray = field(init=False, repr=False)
    _noise: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._share = self._rss = self._noise = np.zeros(0)

    def _lognormal(self, sigma: float) -> Callable[[int], np.ndarray]:
        return lambda n: self._rng.lognormal(-(sigma**2) / 2, sigma, n)

    def step(self, now: float, dt: float, pools: Mapping[Role, SimulatedPool]) -> StepLoad:
        data = pools["data"]
        data.take_released()
        owners = data.running | data.wanted
        index_all = data.index[owners]
        self._share, _ = _per_executor(self._share, index_all, self._lognormal(self.share_sigma))
        self._rss, _ = _per_executor(self._rss, index_all, self._lognormal(self.rss_sigma))
        self._noise, _ = _per_executor(self._noise, index_all, np.zeros)
        innovation = self.noise * math.sqrt(1 - self.noise_corr**2)
        self._noise = self.noise_corr * self._noise + innovation * self._rng.standard_normal(self._noise.size)
        need_all = np.maximum(self.mean_cpu * self._share[index_all] * (1.0 + self._noise[index_all]), 0.0)
        run = data.running
        index = data.index[run]
        need = np.maximum(self.mean_cpu * self._share[index] * (1.0 + self._noise[index]), 0.0)
        cpu = np.minimum(need, data.cpu[run])
        rss = self.mean_rss * self._rss[index] + self.rss_growth_bytes_per_s * (now - data.started_at[run])
        usage: dict[Role, Usage] = {"data": Usage(cpu=cpu, rss_bytes=rss, rows_per_s=cpu)}
        return StepLoad(usage, wanted=float(need_all.sum()) * dt, served=float(cpu.sum()) * dt)


@dataclass
class SimulationResult:
    """Per-step records of a run: ``times``, per pool ``replicas`` (live: starting + running),
    ``running``, ``cores_allocated`` (live), ``cores_used``, ``memory_allocated`` and
    ``memory_used`` (bytes); the job's ``wanted`` / ``served`` work; every decision; OOM kills.

    Example::

        result.mean_cpu_util("data"), result.cores_mean("data"), result.throughput_lost_pct()
    """

    times: np.ndarray
    pools: dict[Role, dict[str, np.ndarray]]
    wanted: np.ndarray
    served: np.ndarray
    decisions: list[ScalingDecision]
    oom_kills: int

    def _window(self, since: float) -> np.ndarray:
        return self.times >= since

    def mean_cpu_util(self, role: Role, since: float = 0.0) -> float:
        """Cores used / cores allocated, summed over the steps from ``since``."""
        w, p = self._window(since), self.pools[role]
        return float(p["cores_used"][w].sum() / max(p["cores_allocated"][w].sum(), 1e-12))

    def mean_memory_util(self, role: Role, since: float = 0.0) -> float:
        w, p = self._window(since), self.pools[role]
        return float(p["memory_used"][w].sum() / max(p["memory_allocated"][w].sum(), 1e-12))

    def cores_mean(self, role: Role, since: float = 0.0) -> float:
        """Mean cores allocated (live executors) over the steps from ``since``."""
        return float(self.pools[role]["cores_allocated"][self._window(since)].mean())

    def throughput_lost_pct(self, since: float = 0.0) -> float:
        """Work wanted but not served, in % of the work wanted."""
        w = self._window(since)
        return float(100.0 * (1.0 - self.served[w].sum() / max(self.wanted[w].sum(), 1e-12)))

    def worst_hour_lost_pct(self, window_s: float = 3600.0) -> float:
        """The largest :meth:`throughput_lost_pct` over the consecutive ``window_s`` windows of the run."""
        if not self.times.size:
            return 0.0
        bins = ((self.times - self.times[0]) // window_s).astype(np.int64)
        wanted = np.bincount(bins, weights=self.wanted)
        served = np.bincount(bins, weights=self.served)
        lost = np.where(wanted > 0, 1.0 - served / np.maximum(wanted, 1e-12), 0.0)
        return float(100.0 * max(0.0, lost.max()))

    def first_time(self, role: Role, running: int) -> float | None:
        """The first time ``running`` executors of ``role`` were running, if ever."""
        hits = np.flatnonzero(self.pools[role]["running"] >= running)
        return float(self.times[hits[0]]) if hits.size else None

    def actions(self, kinds: Sequence[str] = ("scale_out", "scale_in", "resize", "oom_restart")) -> int:
        return sum(d.kind in kinds for d in self.decisions)


_RECORDS = ("replicas", "running", "cores_allocated", "cores_used", "memory_allocated", "memory_used")


class Simulation:
    """Pools of :class:`SimulatedPool`, a load model and a :class:`ScalingController`, stepped
    every ``dt`` seconds (module docstring). The pools start with their spec's ``replicas``
    running; ``startup_s``: seconds from launch to running (one value or per role).

    Example::

        sim = Simulation(scaling, {"data": PoolSpec(replicas=4, max_replicas=8)},
                         PartitionedLoad(mean_cpu=0.5, mean_rss=1 << 30), dt=10.0)
        result = sim.run(3600.0)
    """

    def __init__(
        self,
        scaling: ScalingSpec,
        pools: Mapping[Role, PoolSpec],
        model: LoadModel,
        *,
        dt: float = 15.0,
        startup_s: float | Mapping[Role, float] = 60.0,
        options: ControllerOptions | None = None,
        drain_s: float = 0.0,
        resize_restarts: bool = False,
        measurement_noise: float = 0.0,
        seed: int = 0,
    ):
        self.now = 0.0
        self.dt = dt
        self.model = model
        self.measurement_noise = measurement_noise
        self._rng = np.random.default_rng(seed)
        options = options or ControllerOptions()
        if resize_restarts and not options.resize_restarts:  # the controller knows a resize is a restart
            options = replace(options, resize_restarts=True)
        self.controller = ScalingController(scaling, pools, clock=lambda: self.now, options=options)
        self.pools: dict[Role, SimulatedPool] = {}
        for role, spec in pools.items():
            delay = startup_s if isinstance(startup_s, (int, float)) else startup_s[role]
            pool = SimulatedPool(
                role,
                spec,
                startup_s=float(delay),
                clock=lambda: self.now,
                drain_s=drain_s,
                resize_restarts=resize_restarts,
            )
            pool.launch(spec.replicas)
            pool.start_now()
            self.pools[role] = pool
        self._seen = dict.fromkeys(self.pools, -1)
        self.decisions: list[ScalingDecision] = []
        self.oom_kills = 0

    def run(self, duration: float) -> SimulationResult:
        """Step from the current time for ``duration`` seconds."""
        steps = round(duration / self.dt)
        records = {role: {name: np.zeros(steps) for name in _RECORDS} for role in self.pools}
        times, wanted, served = np.zeros(steps), np.zeros(steps), np.zeros(steps)
        start = self.now
        for k in range(steps):
            self.now = start + k * self.dt
            times[k] = self.now
            for pool in self.pools.values():
                pool.advance()
            load = self.model.step(self.now, self.dt, self.pools)
            wanted[k], served[k] = load.wanted, load.served
            for role, pool in self.pools.items():
                self._observe(role, pool, load.usage.get(role), records[role], k)
            for role, pool in self.pools.items():
                if pool.version != self._seen[role]:
                    self.controller.update_status(role, pool.status())
                    self._seen[role] = pool.version
            for decision in self.controller.tick(self.now):
                self.decisions.append(decision)
                apply_decision(self.pools, decision)
        self.now = start + steps * self.dt
        return SimulationResult(times, records, wanted, served, self.decisions, self.oom_kills)

    def _observe(
        self, role: Role, pool: SimulatedPool, usage: Usage | None, rec: dict[str, np.ndarray], k: int
    ) -> None:
        live = pool.live
        rec["replicas"][k] = live.sum()
        rec["cores_allocated"][k] = pool.cpu[live].sum()
        rec["memory_allocated"][k] = pool.mem[live].sum()
        run = np.flatnonzero(pool.running)
        rec["running"][k] = run.size
        if usage is None or run.size == 0:
            return
        rec["cores_used"][k] = usage.cpu.sum()
        rec["memory_used"][k] = usage.rss_bytes.sum()
        killed = usage.rss_bytes > pool.mem[run]
        if killed.any():
            pool.oom_kill(run[killed])
            self.oom_kills += int(killed.sum())
        alive = ~killed
        ids = [pool.ids[i] for i in run[alive].tolist()]

        noise = 1.0
        if self.measurement_noise:  # one factor for the pool this step: what is observed, not what happens
            noise = max(0.0, 1.0 + self.measurement_noise * float(self._rng.standard_normal()))

        def pick(values: np.ndarray | None) -> np.ndarray | None:
            return None if values is None else np.clip(values[alive] * noise, 0.0, 1.0)

        self.controller.observe_batch(
            role,
            ids,
            time=self.now,
            cpu=usage.cpu[alive] * noise,
            rss_bytes=usage.rss_bytes[alive],
            rows_per_s=usage.rows_per_s[alive],
            buffer_fill=pick(usage.buffer_fill),
            reader_wait=pick(usage.reader_wait),
        )
