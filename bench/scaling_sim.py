"""Scaling policies replayed in SIMULATION: the paper's unified-resources experiments at sizes no test machine holds.

Every figure but (d) comes from :mod:`primus_dagster.cluster.simulation`: simulated executors, a
load model, and the real :class:`~primus_dagster.cluster.controller.ScalingController` and
policies deciding (the code a live run uses). Nothing here is a measurement of a cluster; the
models and their assumptions are in ``docs/scaling.md``. (d) is a real measurement of the
controller's CPU time on this machine.

(a) **Horizontal**, paper: 900 fixed 8-core data executors + 8 trainers vs dynamic, −23.3 % cores,
    CPU utilisation about 50 % -> 80 %. Model: :class:`PulledLoad`. The trainers' appetite is a
    diurnal cosine (:class:`DiurnalTrace`): peak = 90 % of what 900 executors can produce (a
    competent fixed deployment sized for the peak with a 10 % margin), trough = a third of the
    peak (web diurnal peak:trough is typically 2-4x), 3 % slow noise, one +50 % surge of 30 min a
    day (10:00, a flash sale). Executors: 8 cores, 0.2 idle, 1000 rows/s per busy core, 10 s of buffer, 60 s
    from launch to serving. Two simulated days, 15 s steps. Fixed: the same job with both
    strategies disabled. Dynamic: ``interval`` 30 s and ``cooldown`` 2 m (the spec defaults),
    thresholds 0.8 / 0.3 (defaults), ``metrics: [{name: cpu, weight: 1}]`` (see the doc: a full
    data buffer means backpressure, which the ratio rule reads), ``step: 8`` (~1 % of the pool: the
    steepest slope of the trace needs ~71 executors an hour, 8 per 2 min allows 240), pool
    bounds 1..900, training pool fixed at 8 (so the ratio rule can only shrink the data pool).
    ``cores_saved_pct`` = 1 − mean cores allocated (dynamic) / (fixed); ``mean_cpu_util_*`` =
    cores used / cores allocated (starting executors count as allocated); ``throughput_lost_pct``
    = rows the trainers wanted and did not get (dynamic run; the fixed run's beside it).
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

Last line: {"bench": "scaling_sim", "simulated": true, "cores_saved_pct", "mean_cpu_util_fixed",
"mean_cpu_util_dynamic", "throughput_lost_pct", "actions", "vertical_util_before",
"vertical_util_after", "scaleout_s_to_400", "tick_s_at_10m_cores", ...}
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np

from primus_dagster.cluster import (
    DiurnalTrace,
    ExecutorStatus,
    PartitionedLoad,
    PulledLoad,
    Resources,
    Role,
    ScalingController,
    Simulation,
)
from primus_dagster.spec import MetricSpec, PoolSpec, ScalingSpec

from _common import emit

GIB = float(1 << 30)


def scaling(**kwargs: Any) -> ScalingSpec:
    """A ScalingSpec from the nested dict form a job YAML would hold."""
    return ScalingSpec.model_validate(kwargs)


def horizontal(days: float) -> dict[str, Any]:
    n, cores, idle, per_core = 900, 8.0, 0.2, 1000.0
    full = n * (cores - idle) * per_core
    trace = DiurnalTrace(peak=0.9 * full, trough=0.3 * full, surges=((10 * 3600.0, 1800.0, 0.5),), seed=1)
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=n, min_replicas=1, max_replicas=n, cpu=cores, memory="16Gi"),
        "training": PoolSpec(replicas=8, min_replicas=8, max_replicas=8, cpu=16, memory="64Gi"),
    }

    def run(enabled: bool) -> Any:
        spec = scaling(
            interval="30s",
            cooldown="2m",
            horizontal={"enabled": enabled, "metrics": [MetricSpec(name="cpu", weight=1.0)], "step": 8},
            vertical={"enabled": False},
        )
        model = PulledLoad(appetite=trace, idle_cpu=idle, rows_per_core_s=per_core, seed=2)
        return Simulation(spec, pools, model, dt=15.0, startup_s=60.0).run(days * 86400)

    fixed, dynamic = run(False), run(True)
    replicas = dynamic.pools["data"]["replicas"]
    return {
        "cores_fixed": round(fixed.cores_mean("data"), 1),
        "cores_dynamic": round(dynamic.cores_mean("data"), 1),
        "cores_saved_pct": round(100 * (1 - dynamic.cores_mean("data") / fixed.cores_mean("data")), 2),
        "mean_cpu_util_fixed": round(fixed.mean_cpu_util("data"), 4),
        "mean_cpu_util_dynamic": round(dynamic.mean_cpu_util("data"), 4),
        "throughput_lost_pct": round(dynamic.throughput_lost_pct(), 3),
        "throughput_lost_pct_fixed": round(fixed.throughput_lost_pct(), 3),
        "actions": dynamic.actions(),
        "data_executors_min_mean_max": [int(replicas.min()), round(float(replicas.mean()), 1), int(replicas.max())],
    }


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
    parser.add_argument("--days", type=float, default=2.0, help="(a): simulated days")
    parser.add_argument("--hours", type=float, default=6.0, help="(b): simulated hours")
    parser.add_argument("--executors", type=int, default=1_249_000, help="(d): data executors (8 cores each)")
    parser.add_argument("--trainers", type=int, default=1_000, help="(d): trainers (8 cores each)")
    args = parser.parse_args()

    started = time.perf_counter()
    a = horizontal(args.days)
    print(
        f"(a) horizontal [simulated] cores {a['cores_fixed']:.0f} fixed -> {a['cores_dynamic']:.0f} dynamic "
        f"(-{a['cores_saved_pct']:.1f} %, paper -23.3 %); CPU util {a['mean_cpu_util_fixed']:.1%} -> "
        f"{a['mean_cpu_util_dynamic']:.1%} (paper 50 % -> 80 %); throughput lost {a['throughput_lost_pct']:.2f} % "
        f"(fixed {a['throughput_lost_pct_fixed']:.2f} %); {a['actions']} actions; data executors min/mean/max "
        f"{a['data_executors_min_mean_max']}"
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
            "metric": "cores_saved_pct",
            "value": a["cores_saved_pct"],
            "baseline": a["cores_fixed"],
            "ratio": round(a["cores_dynamic"] / a["cores_fixed"], 4),
            "cores_saved_pct": a["cores_saved_pct"],
            "mean_cpu_util_fixed": a["mean_cpu_util_fixed"],
            "mean_cpu_util_dynamic": a["mean_cpu_util_dynamic"],
            "throughput_lost_pct": a["throughput_lost_pct"],
            "actions": a["actions"],
            "vertical_util_before": b["vertical_util_before"],
            "vertical_util_after": b["vertical_util_after"],
            "scaleout_s_to_400": c["scaleout_s_to_400"],
            "tick_s_at_10m_cores": d["tick_s"],
            "tick_measured": True,
            "wall_s": round(time.perf_counter() - started, 1),
            "detail": {"horizontal": a, "vertical": b, "scale_out": c, "tick": d},
        }
    )


if __name__ == "__main__":
    main()
