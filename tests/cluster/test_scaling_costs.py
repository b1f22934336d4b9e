"""The simulator's cost model (labelled simulation): scale-in drains and re-reads, resize = restart
where the backend replaces the pod, downtime is lost throughput, measurement noise is observed only;
the traces of ``bench/scaling_sim.py``; the worst hour."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from primus_dagster.cluster import (
    STARTUP_S,
    ControllerOptions,
    PartitionedLoad,
    PulledLoad,
    RampTrace,
    Resources,
    Role,
    ScalingController,
    SimulatedPool,
    Simulation,
    SpikeTrace,
    StepTrace,
)
from primus_dagster.cluster.pool import ExecutorStatus
from primus_dagster.spec import PoolSpec, ScalingSpec

GIB = 1 << 30
OFF = ScalingSpec.model_validate({"horizontal": {"enabled": False}, "vertical": {"enabled": False}})


def pool(n: int = 2, **kwargs: Any) -> tuple[SimulatedPool, list[float]]:
    now = [0.0]
    p = SimulatedPool(
        "data", PoolSpec(replicas=n, max_replicas=10, cpu=8, memory="16Gi"), clock=lambda: now[0], **kwargs
    )
    p.launch(n)
    p.start_now()
    return p, now


def test_stated_startup_figures() -> None:
    assert STARTUP_S["kubernetes"] == 90.0 and STARTUP_S["local"] < 5.0


def test_a_stopped_executor_drains_holding_its_cores_then_leaves() -> None:
    p, now = pool(startup_s=0.0, drain_s=10.0)
    p.stop("data-0")
    assert [s.state for s in p.status()] == ["stopped", "running"] and p.cpu[p.live].sum() == 16.0
    assert p.take_released() == [8.0] and p.take_released() == []  # its leased task went back
    now[0] = 10.0
    p.advance()
    assert [s.executor_id for s in p.status()] == ["data-1"]


def test_resize_is_a_restart_where_the_pod_is_replaced() -> None:
    p, now = pool(startup_s=90.0, resize_restarts=True)
    p.resize("data-0", Resources(4.0, 8 * GIB))
    assert p.status()[0].state == "starting" and p.status()[0].resources.cpu == 4.0
    now[0] = 90.0
    p.advance()
    assert p.status()[0].state == "running"
    in_place, _ = pool(startup_s=90.0)
    in_place.resize("data-0", Resources(4.0, 8 * GIB))
    assert in_place.status()[0].state == "running"


def pulled(n: int, appetite: float, **kwargs: Any) -> tuple[Simulation, dict[Role, PoolSpec]]:
    pools: dict[Role, PoolSpec] = {"data": PoolSpec(replicas=n, min_replicas=1, max_replicas=n, cpu=8, memory="16Gi")}
    model = PulledLoad(appetite=lambda t: appetite, seed=1, jitter=0.0)
    return Simulation(OFF, pools, model, dt=15.0, **kwargs), pools


def test_scale_in_re_reads_the_released_task_before_serving_new_rows() -> None:
    # 4 executors of 7800 rows/s; the trainers want 3 executors' worth. Stopping one gives its task
    # back: 30 s of its production read again, from the 3 left -- the trainers wait meanwhile.
    sim, _ = pulled(4, 3 * 7800.0, drain_s=10.0)
    sim.run(150.0)  # buffers full
    sim.pools["data"].stop("data-0")
    after = sim.run(150.0)
    assert sim.model.debt == pytest.approx(0.0)  # type: ignore[attr-defined]
    assert after.throughput_lost_pct() > 0.5
    # ... where a pool with no stop loses nothing.
    still, _ = pulled(4, 3 * 7800.0)
    still.run(150.0)
    assert still.run(150.0).throughput_lost_pct() == pytest.approx(0.0)


def test_rows_past_a_smaller_buffer_are_read_again_not_dropped() -> None:
    model = PulledLoad(appetite=lambda t: 0.0, seed=1, jitter=0.0)
    sim = Simulation(OFF, {"data": PoolSpec(replicas=2, max_replicas=2, cpu=8, memory="16Gi")}, model, dt=15.0)
    sim.run(60.0)
    full = model.buffered
    sim.pools["data"].stop("data-0")
    model.reread_s = 0.0
    sim.run(15.0)
    assert model.buffered == pytest.approx(full / 2) and model.debt == pytest.approx(0.0)  # re-read at once, idle pool


def test_oom_downtime_is_lost_throughput() -> None:
    pools: dict[Role, PoolSpec] = {"data": PoolSpec(replicas=4, min_replicas=4, max_replicas=4, cpu=4, memory="1Gi")}
    model = PartitionedLoad(mean_cpu=1.0, mean_rss=0.5 * GIB, rss_growth_bytes_per_s=5e6, seed=2)
    spec = ScalingSpec.model_validate({"horizontal": {"enabled": False}, "vertical": {"enabled": False}})
    result = Simulation(spec, pools, model, dt=15.0, startup_s=90.0).run(1800.0)
    assert result.oom_kills > 0 and result.throughput_lost_pct() > 5.0


def test_measurement_noise_changes_what_is_observed_not_what_happens() -> None:
    quiet, _ = pulled(4, 2 * 7800.0)
    noisy, _ = pulled(4, 2 * 7800.0, measurement_noise=0.2, seed=3)
    a, b = quiet.run(300.0), noisy.run(300.0)
    assert np.array_equal(a.served, b.served) and np.array_equal(
        a.pools["data"]["cores_used"], b.pools["data"]["cores_used"]
    )
    assert (
        quiet.controller.view("data", 285.0).mean_util["cpu"] != noisy.controller.view("data", 285.0).mean_util["cpu"]
    )


def test_worst_hour_is_the_worst_clock_hour() -> None:
    sim, _ = pulled(1, 2 * 7800.0)  # always half short
    result = sim.run(7200.0)
    assert result.worst_hour_lost_pct() == pytest.approx(50.0, abs=1.0)
    assert result.throughput_lost_pct() == pytest.approx(50.0, abs=1.0)


def test_traces() -> None:
    spikes = SpikeTrace(base=1.0, factor=3.0, duration_s=600.0, every_s=4 * 3600.0, seed=1)
    values = np.array([spikes(t) for t in np.arange(0, 86400.0, 15.0)])
    assert set(values.tolist()) == {1.0, 3.0} and (values == 3.0).sum() * 15.0 == 6 * 600.0
    assert StepTrace(1.0, 2.0, at_s=10.0)(9.9) == 1.0 and StepTrace(1.0, 2.0, at_s=10.0)(1e9) == 2.0
    assert RampTrace(0.2, 0.8, duration_s=100.0)(25.0) == pytest.approx(0.35)


def test_resizes_that_restart_roll_at_most_max_unavailable_of_the_pool() -> None:
    pools: dict[Role, PoolSpec] = {
        "data": PoolSpec(replicas=100, min_replicas=100, max_replicas=100, cpu=4, memory="8Gi")
    }
    spec = ScalingSpec.model_validate({"warmup": "0s", "horizontal": {"enabled": False}})
    ids = [f"data-{i}" for i in range(100)]

    def resizes(restarts: bool, starting: int = 0) -> int:
        controller = ScalingController(spec, pools, options=ControllerOptions(resize_restarts=restarts))
        statuses = [
            ExecutorStatus(e, "data", "starting" if i < starting else "running", Resources(4.0, 8 * GIB))
            for i, e in enumerate(ids)
        ]
        controller.update_status("data", statuses)
        for t in (0.0, 1.0, 2.0):  # 1 core of 4 and 2 GiB of 8: every executor wants less
            controller.observe_batch("data", ids, time=t, cpu=np.full(100, 1.0), rss_bytes=np.full(100, 2.0 * GIB))
        return sum(d.kind == "resize" for d in controller.tick(2.0))

    assert resizes(False) == 100 and resizes(True) == 5 and resizes(True, starting=3) == 2
