"""Scaling policies replayed in SIMULATION: the paper's unified-resources experiments at sizes no test machine holds.

Every figure but (d) comes from :mod:`primus_dagster.cluster.simulation`: simulated executors, a
load model, and the real :class:`~primus_dagster.cluster.controller.ScalingController` and
policies deciding (the code a live run uses). Nothing here is a measurement of a cluster; the
models and their assumptions are in ``docs/scaling.md``. (d) is a real measurement of the
controller's CPU time on this machine.

(a) **Horizontal, five traces, the spec's defaults** (``ScalingSpec()``: interval 5 s, cooldown
    10 s, warmup 5 s, CPU load with the trainers' wait, thresholds 0.8 / 0.3, proportional steps,
    vertical on). Paper: 900 fixed 8-core data executors + 8 trainers vs dynamic, −23.3 % cores,
    CPU utilisation about 50 % -> 80 %. Model: :class:`PulledLoad` (8 cores, 0.2 idle, 1000
    rows/s per busy core, 10 s of buffer), the trainers' appetite a trace in units of ``full`` =
    what 900 executors produce:

    * ``diurnal``: a cosine from 0.3 to 0.9 full (peak at 20:00), 3 % slow noise, one +50 % surge
      of 30 min a day (10:00); two days;
    * ``bursty``: 0.25 full with 3x spikes of 10 min, one at a random time every 4 h; one day;
    * ``step``: 0.3 full, then 0.6 full for good from 6 h; 12 h;
    * ``ramp``: 0.2 -> 0.85 full over a day;
    * ``noisy``: the diurnal trace, what the controller observes (CPU, buffer fill, reader wait)
      times one factor per step with relative sd 5 % (pool-wide measurement noise); two days;
    * harder ones: ``bursty_2h`` (the 3x spikes of 10 min every ~2 h), ``step_double`` (0.45 -> 0.9
      full for good at 6 h: the load doubles onto nearly the whole fleet; 12 h), ``ramp_wide`` (0.3 ->
      0.9 full over 12 h).

    Two baselines: ``fixed``, 900 executors (sized above every trace's peak: the paper's setup), and
    ``static peak``, a fixed fleet of exactly what each trace's own peak needs (``ceil(max appetite /
    one executor's rows/s)``): what a team runs without an autoscaler, the fair one
    (``cores_saved_vs_static_peak_pct``; the static-peak fleet is simulated too, its loss reported).
    Random traces are drawn with ``--seed`` (default 100: the reported seeds; the controller's tuned
    settings, ``ControllerOptions.max_scale_in_fraction`` among them, were chosen on seeds 0, 20 and
    40, docs/scaling.md).

    The cost model (:mod:`primus_dagster.cluster.simulation`): scale-out takes 90 s from launch to
    serving (a pod: ~30 s scheduling + ~60 s image pull, a stated figure; the local pool's measured
    start is 1.2 s); a stopped executor drains 10 s holding its cores, its leased task is read again
    (30 s of its production) and rows past the smaller buffers are read again; a resize replaces the
    pod (a restart: 90 s down, at most 5 % of the pool starting at once); OOM kills and restarts are
    downtime. Fixed: the same job with both strategies disabled. ``cores_saved_pct`` = 1 − mean cores
    allocated (dynamic) / (fixed), starting and draining executors counted; ``throughput_lost_pct`` =
    rows the trainers wanted and did not get; ``worst_hour_lost_pct`` = the same over the worst
    clock hour; ``actions`` = scale-outs + scale-ins + resizes + OOM restarts. 15 s steps.
(b) **Vertical**, paper: 400 x 10-core data executors, −1600 cores, utilisation 50 % -> 80 %.
    Model: :class:`PartitionedLoad`: each executor owns a share of the stream, needs 5 cores on
    average (the paper's starting 50 %; lognormal skew sd 0.25, AR(1) noise sd 10 %), 8 GiB RSS
    of 16 GiB. Six hours, 15 s steps; spec defaults (``history_decay`` 0.7, ``headroom`` 0.2,
    ``min_change`` 0.1), horizontal off. Utilisation before = the run with vertical disabled,
    after = with it, both over the last three hours; ``vertical_throttled_pct`` is CPU wanted
    beyond the allocation.
(c) **Progressive trainer scale-out**, paper Fig. 7: 0 -> 400 trainers scaling every 10 s. Model:
    :class:`PulledLoad` with a backlog (the trainers take all they can: 5000 rows/s each), a data
    pool fixed at 1.2x what 400 trainers need, trainers 30 s from launch to training. Controller:
    ``interval`` and ``cooldown`` 10 s, ``step`` 40 (10 % of the target), training pool 0..400;
    the ratio rule adds trainers while data buffers are full and trainers never wait.
    ``scaleout_s_to_400`` = first time 400 trainers are running.
(d) **Controller tick at 10 M cores**: 1,249,000 data executors + 1,000 trainers of 8 cores, three
    rounds of samples before each of three ticks (the first at 50 % CPU and 40 % buffer fill, the next two at 94 % and 95 %: a load the
    horizontal rule acts on); the
    slowest ``tick``'s wall time, with ``update_status`` (all 1.25 M statuses) and ``observe_batch``
    (one round) beside it -- measured on this machine, not simulated.

Last line: {"bench": "scaling_sim", "simulated": true, "traces": {name: {"cores_saved_pct",
"cores_saved_vs_static_peak_pct", "throughput_lost_pct", "worst_hour_lost_pct", "actions"}}, "defaults":
"spec", "seed", "tick_s_at_10m_cores",
"vertical_util_before", "vertical_util_after", "scaleout_s_to_400", ...}
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from primus_dagster.cluster import (
    STARTUP_S,
    DiurnalTrace,
    ExecutorStatus,
    PartitionedLoad,
    PulledLoad,
    RampTrace,
    Resources,
    Role,
    ScalingController,
    Simulation,
    SpikeTrace,
    StepTrace,
)
from primus_dagster.cluster.simulation import DRAIN_S
from primus_dagster.spec import MetricSpec, PoolSpec, ScalingSpec

from _common import emit

GIB = float(1 << 30)


def scaling(**kwargs: Any) -> ScalingSpec:
    """A ScalingSpec from the nested dict form a job YAML would hold."""
    return ScalingSpec.model_validate(kwargs)


EXECUTOR_ROWS_PER_S = (8.0 - 0.2) * 1000.0  # one 8-core data executor of (a), 0.2 cores idle


def traces(seed: int) -> dict[str, Callable[[float], float]]:
    """The appetite traces of (a), in rows/s (``full`` = 900 executors' output), random ones drawn with ``seed``."""
    full = 900 * EXECUTOR_ROWS_PER_S
    diurnal = DiurnalTrace(peak=0.9 * full, trough=0.3 * full, surges=((10 * 3600.0, 1800.0, 0.5),), seed=1 + seed)
    return {
        "diurnal": diurnal,
        "bursty": SpikeTrace(base=0.25 * full, factor=3.0, duration_s=600.0, every_s=4 * 3600.0, seed=3 + seed),
        "step": StepTrace(0.3 * full, 0.6 * full, at_s=6 * 3600.0),
        "ramp": RampTrace(0.2 * full, 0.85 * full, duration_s=86400.0),
        "noisy": diurnal,
        "bursty_2h": SpikeTrace(base=0.25 * full, factor=3.0, duration_s=600.0, every_s=2 * 3600.0, seed=13 + seed),
        "step_double": StepTrace(0.45 * full, 0.9 * full, at_s=6 * 3600.0),
        "ramp_wide": RampTrace(0.3 * full, 0.9 * full, duration_s=12 * 3600.0),
    }


DURATION_DAYS = {
    "diurnal": 2.0,
    "bursty": 1.0,
    "step": 0.5,
    "ramp": 1.0,
    "noisy": 2.0,
    "bursty_2h": 1.0,
    "step_double": 0.5,
    "ramp_wide": 0.5,
}
NOISE = {"noisy": 0.05}
DT = 15.0


def static_peak_executors(trace: Callable[[float], float], duration: float) -> int:
    """The fixed fleet a trace's own peak needs: ``ceil(max appetite / one executor's rows/s)`` over its steps."""
    peak = max(trace(k * DT) for k in range(round(duration / DT)))
    return math.ceil(peak / EXECUTOR_ROWS_PER_S - 1e-9)


def horizontal(days: float, seed: int) -> dict[str, Any]:
    """(a): every trace, fixed (900, and the trace's own peak) vs the spec's defaults (``days`` scales the
    durations)."""
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=900, min_replicas=1, max_replicas=900, cpu=8.0, memory="16Gi"),
        "training": PoolSpec(replicas=8, min_replicas=8, max_replicas=8, cpu=16, memory="64Gi"),
    }
    fixed_spec = scaling(horizontal={"enabled": False}, vertical={"enabled": False})
    out: dict[str, Any] = {}
    for name, trace in traces(seed).items():
        duration = DURATION_DAYS[name] * days / 2.0 * 86400.0

        def run(
            spec: ScalingSpec,
            trace: Callable[[float], float] = trace,
            name: str = name,
            duration: float = duration,
            executors: int = 900,
        ) -> Any:
            model = PulledLoad(appetite=trace, idle_cpu=0.2, rows_per_core_s=1000.0, seed=2 + seed)
            sized = {**pools, "data": pools["data"].model_copy(update={"replicas": executors})}
            sim = Simulation(
                spec,
                sized,
                model,
                dt=DT,
                startup_s=STARTUP_S["kubernetes"],
                drain_s=DRAIN_S,
                resize_restarts=True,
                measurement_noise=NOISE.get(name, 0.0),
            )
            return sim.run(duration)

        peak_n = static_peak_executors(trace, duration)
        fixed, dynamic, peak = run(fixed_spec), run(ScalingSpec()), run(fixed_spec, executors=peak_n)
        replicas = dynamic.pools["data"]["replicas"]
        out[name] = {
            "cores_saved_pct": round(100 * (1 - dynamic.cores_mean("data") / fixed.cores_mean("data")), 2),
            "cores_saved_vs_static_peak_pct": round(
                100 * (1 - dynamic.cores_mean("data") / peak.cores_mean("data")), 2
            ),
            "throughput_lost_pct": round(dynamic.throughput_lost_pct(), 3),
            "worst_hour_lost_pct": round(dynamic.worst_hour_lost_pct(), 2),
            "actions": dynamic.actions(),
            "actions_by_kind": {k: dynamic.actions((k,)) for k in ("scale_out", "scale_in", "resize", "oom_restart")},
            "cores_fixed": round(fixed.cores_mean("data"), 1),
            "cores_static_peak": round(peak.cores_mean("data"), 1),
            "static_peak_executors": peak_n,
            "throughput_lost_pct_static_peak": round(peak.throughput_lost_pct(), 3),
            "cores_dynamic": round(dynamic.cores_mean("data"), 1),
            "mean_cpu_util_fixed": round(fixed.mean_cpu_util("data"), 4),
            "mean_cpu_util_dynamic": round(dynamic.mean_cpu_util("data"), 4),
            "throughput_lost_pct_fixed": round(fixed.throughput_lost_pct(), 3),
            "oom_kills": dynamic.oom_kills,
            "hours": round(duration / 3600.0, 1),
            "data_executors_min_mean_max": [int(replicas.min()), round(float(replicas.mean()), 1), int(replicas.max())],
        }
    return out


def vertical(hours: float) -> dict[str, Any]:
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=400, min_replicas=400, max_replicas=400, cpu=10, memory="16Gi")
    }

    def run(enabled: bool, decay: float = 0.7) -> Any:
        spec = scaling(
            interval="30s",
            cooldown="2m",
            horizontal={"enabled": False},
            vertical={"enabled": enabled, "history_decay": decay},
        )
        model = PartitionedLoad(mean_cpu=5.0, mean_rss=8 * GIB, seed=3)
        return Simulation(spec, pools, model, dt=15.0).run(hours * 3600)

    before, after, smooth = run(False), run(True), run(True, decay=0.9)
    since = hours * 3600 / 2
    return {
        "vertical_util_before": round(before.mean_cpu_util("data", since), 4),
        "vertical_util_after": round(after.mean_cpu_util("data", since), 4),
        "vertical_cores_before": round(before.cores_mean("data", since), 1),
        "vertical_cores_after": round(after.cores_mean("data", since), 1),
        "vertical_memory_util_before": round(before.mean_memory_util("data", since), 4),
        "vertical_memory_util_after": round(after.mean_memory_util("data", since), 4),
        "vertical_throttled_pct": round(after.throughput_lost_pct(since), 3),
        "vertical_throttled_pct_before": round(before.throughput_lost_pct(since), 3),
        "vertical_resizes": after.actions(("resize",)),
        "vertical_oom_kills": after.oom_kills,
        "vertical_decay_0.9": {
            "util_after": round(smooth.mean_cpu_util("data", since), 4),
            "throttled_pct": round(smooth.throughput_lost_pct(since), 3),
            "resizes": smooth.actions(("resize",)),
        },
    }


def scale_out() -> dict[str, Any]:
    trainers, per_trainer, cores, idle = 400, 5000.0, 8.0, 0.2
    data_n = math.ceil(1.2 * trainers * per_trainer / ((cores - idle) * 1000.0))
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=data_n, min_replicas=data_n, max_replicas=data_n, cpu=cores, memory="16Gi"),
        "training": PoolSpec(replicas=0, min_replicas=0, max_replicas=trainers, cpu=8, memory="32Gi"),
    }
    spec = scaling(
        interval="10s",
        cooldown="10s",
        horizontal={"metrics": [MetricSpec(name="cpu", weight=1.0)], "step": 40},
        vertical={"enabled": False},
    )
    model = PulledLoad(appetite=lambda t: math.inf, trainer_rows_per_s=per_trainer, idle_cpu=idle, seed=4)
    result = Simulation(spec, pools, model, dt=1.0, startup_s={"data": 60.0, "training": 30.0}).run(900.0)
    steps = [(round(d.time, 1), d.target) for d in result.decisions if d.role == "training" and d.kind == "scale_out"]
    return {
        "scaleout_s_to_400": result.first_time("training", trainers),
        "scaleout_data_executors": data_n,
        "scaleout_steps": steps,
    }


def tick_at_scale(data_n: int, trainers: int) -> dict[str, Any]:
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=data_n, min_replicas=1, max_replicas=2 * data_n, cpu=8, memory="16Gi"),
        "training": PoolSpec(replicas=trainers, min_replicas=1, max_replicas=2 * trainers, cpu=8, memory="32Gi"),
    }
    controller = ScalingController(scaling(interval="30s", cooldown="1m"), pools)
    rng = np.random.default_rng(5)
    ids: dict[Role, list[str]] = {
        "data": [f"data-{i}" for i in range(data_n)],
        "training": [f"training-{i}" for i in range(trainers)],
    }
    out: dict[str, Any] = {"executors": data_n + trainers, "cores": 8 * (data_n + trainers)}
    statuses = {
        role: [
            ExecutorStatus(e, role, "running", Resources(8.0, int((16 if role == "data" else 32) * GIB))) for e in names
        ]
        for role, names in ids.items()
    }
    t0 = time.perf_counter()
    for role, pool_statuses in statuses.items():
        controller.update_status(role, pool_statuses)
    out["update_status_s"] = round(time.perf_counter() - t0, 3)

    def observe(now: float, cpu_mean: float, fill: float) -> float:
        t = time.perf_counter()
        controller.observe_batch(
            "data",
            ids["data"],
            time=now,
            cpu=rng.normal(cpu_mean, 0.5, data_n).clip(0, 8),
            rss_bytes=rng.normal(6 * GIB, 0.5 * GIB, data_n),
            buffer_fill=rng.uniform(fill - 0.05, fill + 0.05, data_n),
            rows_per_s=rng.uniform(5000, 8000, data_n),
        )
        controller.observe_batch(
            "training",
            ids["training"],
            time=now,
            cpu=rng.normal(6.0, 0.5, trainers),
            rss_bytes=np.full(trainers, 12 * GIB),
            reader_wait=rng.uniform(0.0, 0.05, trainers),
        )
        return time.perf_counter() - t

    observe_s: list[float] = []
    ticks: list[dict[str, Any]] = []
    for now, cpu_mean, fill in ((30.0, 4.0, 0.4), (100.0, 7.5, 0.95), (170.0, 7.5, 0.95)):
        observe_s += [observe(now - dt, cpu_mean, fill) for dt in (20.0, 10.0, 0.0)]
        t = time.perf_counter()
        decisions = controller.tick(now)
        elapsed = time.perf_counter() - t
        ticks.append(
            {"s": round(elapsed, 4), "decisions": len(decisions), "kinds": sorted({d.kind for d in decisions})}
        )
    out["observe_batch_s"] = round(max(observe_s), 3)
    out["ticks"] = ticks
    out["tick_s"] = max(t["s"] for t in ticks)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--days", type=float, default=2.0, help="(a): 2 = the documented durations; 1 halves them")
    parser.add_argument("--hours", type=float, default=6.0, help="(b): simulated hours")
    parser.add_argument("--executors", type=int, default=1_249_000, help="(d): data executors (8 cores each)")
    parser.add_argument("--trainers", type=int, default=1_000, help="(d): trainers (8 cores each)")
    parser.add_argument("--seed", type=int, default=100, help="(a): the random traces' seed (tuned on 0, 20, 40)")
    args = parser.parse_args()

    started = time.perf_counter()
    a = horizontal(args.days, args.seed)
    for name, t in a.items():
        print(
            f"(a) {name:11s} [simulated] cores {t['cores_fixed']:.0f} fixed -> {t['cores_dynamic']:.0f} dynamic "
            f"(-{t['cores_saved_pct']:.1f} %; vs the static peak fleet {t['cores_static_peak']:.0f}: "
            f"-{t['cores_saved_vs_static_peak_pct']:.1f} %, which loses {t['throughput_lost_pct_static_peak']:.2f} %); CPU util {t['mean_cpu_util_fixed']:.1%} -> "
            f"{t['mean_cpu_util_dynamic']:.1%}; throughput lost {t['throughput_lost_pct']:.2f} % (worst hour "
            f"{t['worst_hour_lost_pct']:.2f} %); {t['actions']} actions {t['actions_by_kind']}; data executors "
            f"min/mean/max {t['data_executors_min_mean_max']}"
        )
    b = vertical(args.hours)
    print(
        f"(b) vertical   [simulated] CPU util {b['vertical_util_before']:.1%} -> {b['vertical_util_after']:.1%} "
        f"(paper 50 % -> 80 %); cores {b['vertical_cores_before']:.0f} -> {b['vertical_cores_after']:.0f} "
        f"(paper -1600 of 4000); memory util {b['vertical_memory_util_before']:.1%} -> "
        f"{b['vertical_memory_util_after']:.1%}; throttled {b['vertical_throttled_pct']:.2f} % of CPU wanted; "
        f"{b['vertical_resizes']} resizes, {b['vertical_oom_kills']} OOM kills"
    )
    c = scale_out()
    print(
        f"(c) scale-out  [simulated] 0 -> 400 trainers running after {c['scaleout_s_to_400']} s "
        f"(decisions at {[t for t, _ in c['scaleout_steps']]})"
    )
    d = tick_at_scale(args.executors, args.trainers)
    print(
        f"(d) tick       [measured]  {d['executors']:,} executors / {d['cores']:,} cores: tick {d['tick_s']:.3f} s "
        f"(max of {d['ticks']}); update_status "
        f"{d['update_status_s']} s, observe_batch {d['observe_batch_s']} s per round"
    )
    emit(
        {
            "bench": "scaling_sim",
            "simulated": True,
            "traces": {
                name: {
                    k: t[k]
                    for k in (
                        "cores_saved_pct",
                        "cores_saved_vs_static_peak_pct",
                        "throughput_lost_pct",
                        "worst_hour_lost_pct",
                        "actions",
                    )
                }
                for name, t in a.items()
            },
            "defaults": "spec",
            "seed": args.seed,
            "tick_s_at_10m_cores": d["tick_s"],
            "tick_measured": True,
            "metric": "cores_saved_pct",
            "value": a["diurnal"]["cores_saved_pct"],
            "baseline": a["diurnal"]["cores_fixed"],
            "ratio": round(a["diurnal"]["cores_dynamic"] / a["diurnal"]["cores_fixed"], 4),
            "noisy_actions_vs_clean": round(a["noisy"]["actions"] / max(1, a["diurnal"]["actions"]), 3),
            "scaleout_s_pod": STARTUP_S["kubernetes"],
            "scaleout_s_local": STARTUP_S["local"],  # measured 1.2 s here, rounded up
            "vertical_util_before": b["vertical_util_before"],
            "vertical_util_after": b["vertical_util_after"],
            "scaleout_s_to_400": c["scaleout_s_to_400"],
            "wall_s": round(time.perf_counter() - started, 1),
            "detail": {"horizontal": a, "vertical": b, "scale_out": c, "tick": d},
        }
    )


if __name__ == "__main__":
    main()
