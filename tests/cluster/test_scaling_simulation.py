"""The scaling simulator: simulated pools, load models, and the real controller driving them."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from primus_dagster.cluster import (
    DiurnalTrace,
    PartitionedLoad,
    PoolError,
    PulledLoad,
    Resources,
    Role,
    ScalingDecision,
    SimulatedPool,
    Simulation,
    apply_decision,
)
from primus_dagster.spec import PoolSpec, ScalingSpec

GIB = float(1 << 30)


def scaling(**kwargs: Any) -> ScalingSpec:
    return ScalingSpec.model_validate(kwargs)


def test_simulated_pool_lifecycle() -> None:
    now = [0.0]
    pool = SimulatedPool("data", PoolSpec(replicas=2, cpu=2, memory="1Gi"), startup_s=30.0, clock=lambda: now[0])
    ids = pool.launch(2)
    assert ids == ["data-0", "data-1"] and [s.state for s in pool.status()] == ["starting", "starting"]
    now[0] = 30.0
    pool.advance()
    assert [s.state for s in pool.status()] == ["running", "running"]
    pool.resize("data-1", Resources(1.0, 1 << 29))
    assert pool.status()[1].resources == Resources(1.0, 1 << 29)
    pool.oom_kill(np.array([1]))
    assert pool.status()[1].state == "oom_killed"
    pool.restart("data-1", Resources(1.0, 1 << 30))
    status = pool.status()[1]
    assert (status.state, status.attempt, status.resources.memory_bytes) == ("starting", 1, 1 << 30)
    with pytest.raises(PoolError):
        pool.restart("data-0")  # running: only a finished executor restarts
    pool.stop("data-0")
    assert [s.executor_id for s in pool.status()] == ["data-1"] and pool.launch(1) == ["data-2"]
    with pytest.raises(PoolError):
        pool.stop("data-0")
    pool.close()
    with pytest.raises(PoolError):
        pool.launch(1)


def test_apply_decision_executes_each_kind() -> None:
    pool = SimulatedPool("data", PoolSpec(replicas=1, cpu=2, memory="1Gi"), startup_s=0.0, clock=lambda: 0.0)
    pools: dict[Any, SimulatedPool] = {"data": pool}
    apply_decision(pools, ScalingDecision("scale_out", "data", "r", delta=2, new=Resources(3.0, 1 << 30)))
    assert len(pool) == 2 and pool.cpu.tolist() == [3.0, 3.0]
    apply_decision(pools, ScalingDecision("resize", "data", "r", executor_ids=("data-1",), new=Resources(1.0, 1 << 30)))
    assert pool.cpu.tolist() == [3.0, 1.0]
    pool.oom_kill(np.array([0]))
    apply_decision(
        pools, ScalingDecision("oom_restart", "data", "r", executor_ids=("data-0",), new=Resources(3.0, 2 << 30))
    )
    assert pool.status()[0].attempt == 1 and pool.mem[0] == 2 << 30
    apply_decision(pools, ScalingDecision("scale_in", "data", "r", delta=-2, executor_ids=("data-0", "data-1")))
    assert len(pool) == 0


def test_diurnal_trace_shape() -> None:
    plain = DiurnalTrace(peak=900.0, trough=300.0, noise=0.0)
    trace = DiurnalTrace(peak=900.0, trough=300.0, noise=0.0, surges=((3600.0, 600.0, 0.5),))
    assert plain(20 * 3600.0) == pytest.approx(900.0) and plain(8 * 3600.0) == pytest.approx(300.0)
    assert trace(3500.0) == plain(3500.0)
    assert trace(3700.0) == pytest.approx(1.5 * plain(3700.0))
    assert trace(86400.0 + 3700.0) == pytest.approx(1.5 * plain(3700.0))  # every day
    noisy = DiurnalTrace(peak=900.0, trough=300.0, seed=1)
    values = np.array([noisy(t) for t in np.arange(0, 86400, 600.0)])
    assert values.min() > 250 and values.max() < 1000


def test_replicas_key_sets_the_initial_pool() -> None:
    sim = Simulation(
        scaling(horizontal={"enabled": False}),
        {"data": PoolSpec(replicas=5, max_replicas=8)},
        PartitionedLoad(0.5, GIB),
    )
    assert len(sim.pools["data"]) == 5 and sim.pools["data"].running.all()


def growing_job(vertical: bool) -> Simulation:
    """One 2 GiB executor whose RSS starts near 1 GiB and grows 1 MiB/s (it would pass 2 GiB after ~17 min)."""
    spec = scaling(interval="30s", cooldown="2m", horizontal={"enabled": False}, vertical={"enabled": vertical})
    pool = PoolSpec(replicas=1, min_replicas=1, max_replicas=1, cpu=2, memory="2Gi", max_memory="16Gi")
    model = PartitionedLoad(mean_cpu=1.0, mean_rss=GIB, rss_sigma=0.0, share_sigma=0.0, rss_growth_bytes_per_s=1 << 20)
    return Simulation(spec, {"data": pool}, model, dt=10.0)


def test_growing_executor_is_resized_before_it_would_be_oom_killed() -> None:
    """An executor whose RSS keeps growing is resized up before its memory would have it killed, never killed."""
    sim = growing_job(vertical=True)
    result = sim.run(3600.0)
    assert result.oom_kills == 0
    grows = [d for d in result.decisions if d.kind == "resize" and d.new.memory_bytes > d.old.memory_bytes]  # type: ignore[union-attr]
    assert len(grows) >= 2
    # (Vertical first shrinks the 2 GiB to what ~1 GiB needs; then memory follows the growth.)
    assert all(d.inputs["rss_bytes"] < d.old.memory_bytes for d in grows)  # type: ignore[union-attr]  # still fit
    # Memory used never reached what was allocated, and the allocation follows the growth.
    p = result.pools["data"]
    assert (p["memory_used"] < p["memory_allocated"]).all()
    assert p["memory_allocated"][-1] > GIB + 3590 * (1 << 20) > 2 * p["memory_allocated"][0]


def test_without_vertical_the_executor_is_oom_killed_and_restarted_bigger() -> None:
    result = growing_job(vertical=False).run(3600.0)
    assert result.oom_kills >= 1
    restart = next(d for d in result.decisions if d.kind == "oom_restart")
    assert restart.old is not None and restart.new == Resources(2.0, int(1.5 * restart.old.memory_bytes))
    assert not any(d.kind == "resize" for d in result.decisions)


def test_load_that_doubles_then_halves_scales_out_then_in_within_bounds() -> None:
    def appetite(t: float) -> float:
        # rows/s: half an executor's worth, then 2.5 executors' (past the 2 it starts with: an
        # exactly busy pool with full buffers and trainers that never wait is left alone)
        return 2.5 * 7800.0 if 600 <= t < 1800 else 0.5 * 7800.0

    spec = scaling(
        interval="30s",
        cooldown="60s",
        horizontal={"metrics": [{"name": "cpu", "weight": 1.0}], "step": 1},
        vertical={"enabled": False},
    )
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=2, min_replicas=1, max_replicas=4, cpu=8, memory="16Gi"),
        "training": PoolSpec(replicas=1, min_replicas=1, max_replicas=1, cpu=8, memory="16Gi"),
    }
    result = Simulation(spec, pools, PulledLoad(appetite=appetite), dt=10.0, startup_s=30.0).run(3600.0)
    replicas = result.pools["data"]["replicas"]
    times = result.times
    assert replicas.min() >= 1 and replicas.max() <= 4
    # (The first seconds fill the empty buffers at full CPU: that alone may add an executor.)
    assert replicas[(times >= 1200) & (times < 1800)].max() > replicas[(times >= 300) & (times < 600)].max()
    assert replicas[times >= 3000].max() < replicas[(times >= 1200) & (times < 1800)].max()  # in afterwards
    kinds = [d.kind for d in result.decisions]
    assert "scale_out" in kinds and "scale_in" in kinds
    # Changes of one pool are at least a cooldown apart.
    data_times = [d.time for d in result.decisions if d.role == "data"]
    assert all(b - a >= 60.0 for a, b in itertools.pairwise(data_times))
    assert result.throughput_lost_pct() < 10.0


def test_dynamic_pool_saves_cores_over_a_fixed_one() -> None:
    trace = DiurnalTrace(peak=0.9 * 40 * 7800.0, trough=0.3 * 40 * 7800.0, seed=3)
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=40, min_replicas=1, max_replicas=40, cpu=8, memory="16Gi"),
        "training": PoolSpec(replicas=2, min_replicas=2, max_replicas=2, cpu=8, memory="16Gi"),
    }

    def run(enabled: bool) -> Any:
        spec = scaling(
            horizontal={"enabled": enabled, "metrics": [{"name": "cpu", "weight": 1.0}]}, vertical={"enabled": False}
        )
        return Simulation(spec, pools, PulledLoad(appetite=trace), dt=30.0).run(86400.0)

    fixed, dynamic = run(False), run(True)
    assert fixed.actions() == 0 and dynamic.actions() > 0
    assert dynamic.cores_mean("data") < 0.9 * fixed.cores_mean("data")
    assert dynamic.mean_cpu_util("data") > fixed.mean_cpu_util("data")


def test_vertical_raises_utilisation_of_over_provisioned_executors() -> None:
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=20, min_replicas=20, max_replicas=20, cpu=10, memory="16Gi")
    }

    def run(enabled: bool) -> Any:
        spec = scaling(horizontal={"enabled": False}, vertical={"enabled": enabled})
        return Simulation(spec, pools, PartitionedLoad(mean_cpu=5.0, mean_rss=8 * GIB, seed=2)).run(2 * 3600.0)

    before, after = run(False), run(True)
    assert before.mean_cpu_util("data", 3600) == pytest.approx(0.5, abs=0.05)
    assert after.mean_cpu_util("data", 3600) > 0.7
    assert after.cores_mean("data", 3600) < 0.75 * before.cores_mean("data", 3600)
    assert after.oom_kills == 0 and after.throughput_lost_pct(3600) < 2.0


def test_trainers_scale_out_progressively_to_the_maximum() -> None:
    spec = scaling(
        interval="10s",
        cooldown="10s",
        horizontal={"metrics": [{"name": "cpu", "weight": 1.0}], "step": 5},
        vertical={"enabled": False},
    )
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=10, min_replicas=10, max_replicas=10, cpu=8, memory="16Gi"),
        "training": PoolSpec(replicas=0, min_replicas=0, max_replicas=20, cpu=8, memory="16Gi"),
    }
    model = PulledLoad(appetite=lambda t: math.inf, trainer_rows_per_s=3000.0)
    result = Simulation(spec, pools, model, dt=1.0, startup_s=5.0).run(300.0)
    outs = [d for d in result.decisions if d.role == "training" and d.kind == "scale_out"]
    assert [d.delta for d in outs] == [5, 5, 5, 5] and [d.target for d in outs] == [5, 10, 15, 20]
    reached = result.first_time("training", 20)
    assert reached is not None and reached <= outs[-1].time + 5.0 + 1.0
    assert result.pools["training"]["running"].max() == 20  # never past max_replicas
