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
from dataclasses import dataclass, field
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

STARTING, RUNNING, OOM_KILLED = 0, 1, 2
_STATE_NAMES: tuple[ExecutorState, ...] = ("starting", "running", "oom_killed")


class SimulatedPool:
    """An :class:`~primus_dagster.cluster.pool.ExecutorPool` of simulated executors: an executor
    starts running ``startup_s`` after its launch (or restart), resizes in place at once, and
    leaves the pool when stopped. ``clock`` is the simulation time.

    Example::

        now = [0.0]
        pool = SimulatedPool("data", PoolSpec(replicas=2), startup_s=60, clock=lambda: now[0])
        ids = pool.launch(2)
        now[0] = 60.0; pool.advance()
        [s.state for s in pool.status()]           # ["running", "running"]
    """

    def __init__(self, role: Role, spec: PoolSpec, *, startup_s: float, clock: Callable[[], float]):
        self.role: Role = role
        self.spec = spec
        self.startup_s = startup_s
        self.clock = clock
        self.default = Resources(spec.cpu, memory_bytes(spec.memory))
        self.ids: list[str] = []
        self.index = np.zeros(0, dtype=np.int64)  # launch order: the load model's key for an executor
        self.cpu = np.zeros(0)
        self.mem = np.zeros(0)
        self.state = np.zeros(0, dtype=np.int8)
        self.ready_at = np.zeros(0)
        self.started_at = np.zeros(0)
        self.attempt = np.zeros(0, dtype=np.int64)
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
        self.launched += count
        self._changed(layout=True)
        return new

    def start_now(self) -> None:
        """Every starting executor is running now (a job's initial executors)."""
        self.ready_at[self.state == STARTING] = self.clock()
        self.advance()

    def stop(self, executor_id: str) -> None:
        i = self._position(executor_id)
        del self.ids[i]
        for name in ("index", "cpu", "mem", "state", "ready_at", "started_at", "attempt"):
            setattr(self, name, np.delete(getattr(self, name), i))
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
        self._changed()

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

    def close(self) -> None:
        self.closed = True

    # ------------------------------------------------------------------------- simulation only
    def advance(self) -> None:
        """Executors whose startup delay has passed are running."""
        ready = (self.state == STARTING) & (self.ready_at <= self.clock())
        if ready.any():
            self.state[ready] = RUNNING
            self._changed()

    @property
    def running(self) -> np.ndarray:
        return self.state == RUNNING

    @property
    def live(self) -> np.ndarray:
        return self.state != OOM_KILLED

    def oom_kill(self, positions: np.ndarray) -> None:
        if positions.size:
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
    * CPU jitter: multiplicative, relative sd ``jitter`` per executor and step.

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
    seed: int = 0
    buffered: float = field(default=0.0, init=False)
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
        self.buffered = min(self.buffered, buffer_max)
        if cap >= appetite:
            served = appetite
            produced = min(cap, appetite + (buffer_max - self.buffered) / dt)
        else:
            served = min(appetite, cap + self.buffered / dt)
            produced = cap
        self.buffered = min(buffer_max, max(0.0, self.buffered + (produced - served) * dt))
        busy = produced / cap if cap > 0 else 0.0
        jitter = 1.0 + self.jitter * self._rng.standard_normal(cores.size)
        cpu = np.clip(self.idle_cpu + busy * np.maximum(cores - self.idle_cpu, 0.0) * jitter, 0.0, cores)
        fill = self.buffered / buffer_max if buffer_max > 0 else 0.0
        share = capacity / cap if cap > 0 else np.zeros_like(capacity)
        usage: dict[Role, Usage] = {
            "data": Usage(
                cpu=cpu,
                rss_bytes=self.rss_bytes["data"] + share * self.buffered * self.row_bytes,
                rows_per_s=share * produced,
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
      since its (re)start -- a growing executor is OOM-killed once past its memory.

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
        run = data.running
        index = data.index[run]
        self._share, share = _per_executor(self._share, index, self._lognormal(self.share_sigma))
        self._rss, rss_factor = _per_executor(self._rss, index, self._lognormal(self.rss_sigma))
        self._noise, _ = _per_executor(self._noise, index, np.zeros)
        innovation = self.noise * math.sqrt(1 - self.noise_corr**2)
        self._noise = self.noise_corr * self._noise + innovation * self._rng.standard_normal(self._noise.size)
        need = np.maximum(self.mean_cpu * share * (1.0 + self._noise[index]), 0.0)
        cpu = np.minimum(need, data.cpu[run])
        rss = self.mean_rss * rss_factor + self.rss_growth_bytes_per_s * (now - data.started_at[run])
        usage: dict[Role, Usage] = {"data": Usage(cpu=cpu, rss_bytes=rss, rows_per_s=cpu)}
        return StepLoad(usage, wanted=float(need.sum()) * dt, served=float(cpu.sum()) * dt)


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
    ):
        self.now = 0.0
        self.dt = dt
        self.model = model
        self.controller = ScalingController(scaling, pools, clock=lambda: self.now, options=options)
        self.pools: dict[Role, SimulatedPool] = {}
        for role, spec in pools.items():
            delay = startup_s if isinstance(startup_s, (int, float)) else startup_s[role]
            pool = SimulatedPool(role, spec, startup_s=float(delay), clock=lambda: self.now)
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

        def pick(values: np.ndarray | None) -> np.ndarray | None:
            return None if values is None else values[alive]

        self.controller.observe_batch(
            role,
            ids,
            time=self.now,
            cpu=usage.cpu[alive],
            rss_bytes=usage.rss_bytes[alive],
            rows_per_s=usage.rows_per_s[alive],
            buffer_fill=pick(usage.buffer_fill),
            reader_wait=pick(usage.reader_wait),
        )
