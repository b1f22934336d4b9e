"""Scaling policies as pure functions: L_u, horizontal, the ratio rule, vertical demand/allocation, OOM."""

from __future__ import annotations

import json

import numpy as np
import pytest

from primus_dagster.cluster import (
    ExecutorStatus,
    RatioRule,
    Resources,
    ScalingDecision,
    ew_demand,
    ew_update,
    horizontal_decision,
    load_metric,
    oom_memory,
    oom_restart_decision,
    ratio_decision,
    vertical_allocation,
    weighted_load,
)
from primus_dagster.spec import MetricSpec, PoolSpec, ScalingSpec
from primus_dagster.spec.job import HorizontalScalingSpec

GIB = 1 << 30


def hspec(**kwargs: object) -> HorizontalScalingSpec:
    return ScalingSpec.model_validate({"horizontal": kwargs}).horizontal


POOL = PoolSpec(replicas=4, min_replicas=2, max_replicas=10)


# ----------------------------------------------------------------------------------------- L_u
def test_load_metric_normalises_weights() -> None:
    u = {"cpu": 0.9, "memory": 0.3, "buffer_fill": 0.6}
    ones = [MetricSpec(name="cpu", weight=1), MetricSpec(name="memory", weight=1)]
    halves = [MetricSpec(name="cpu", weight=0.5), MetricSpec(name="memory", weight=0.5)]
    assert load_metric(u, ones) == load_metric(u, halves) == pytest.approx(0.6)
    # Weights change the load: 3:1 for cpu.
    assert load_metric(u, [MetricSpec(name="cpu", weight=3), MetricSpec(name="memory", weight=1)]) == 0.75


def test_load_metric_drops_unreported_metrics_and_zero_weights() -> None:
    metrics = [MetricSpec(name="buffer_fill", weight=0.5), MetricSpec(name="cpu", weight=0.5)]
    assert load_metric({"cpu": 0.8, "buffer_fill": None}, metrics) == 0.8  # a trainer has no buffer
    assert load_metric({"cpu": 0.8}, [MetricSpec(name="cpu", weight=0)]) is None
    assert load_metric({}, metrics) is None
    assert weighted_load([(1.0, 0.2), (0.0, 1.0), (1.0, None)]) == 0.2


# ---------------------------------------------------------------------------------- horizontal
def test_scale_out_above_the_up_threshold_by_step() -> None:
    d = horizontal_decision("data", 4, 0.85, hspec(), POOL)
    assert d is not None and (d.kind, d.delta, d.target) == ("scale_out", 1, 5)
    assert d.inputs["load"] == 0.85 and d.inputs["scale_up_threshold"] == 0.8
    assert horizontal_decision("data", 4, 0.8, hspec(), POOL) is None  # strictly above


def test_step_key_sets_the_size_of_a_change() -> None:
    fixed = {"step": 3, "proportional": False}
    out = horizontal_decision("data", 4, 0.95, hspec(**fixed), POOL)
    inn = horizontal_decision("data", 9, 0.05, hspec(**fixed), POOL)
    assert out is not None and out.delta == 3
    assert inn is not None and inn.delta == -3
    # ... never past the bounds.
    assert horizontal_decision("data", 9, 0.95, hspec(**fixed), POOL).delta == 1  # type: ignore[union-attr]
    assert horizontal_decision("data", 3, 0.05, hspec(**fixed), POOL).delta == -1  # type: ignore[union-attr]


def test_scale_up_threshold_key() -> None:
    assert horizontal_decision("data", 4, 0.75, hspec(scale_up_threshold=0.8), POOL) is None
    d = horizontal_decision("data", 4, 0.75, hspec(scale_up_threshold=0.7), POOL)
    assert d is not None and d.kind == "scale_out"


def test_scale_down_threshold_key() -> None:
    assert horizontal_decision("data", 4, 0.35, hspec(scale_down_threshold=0.3), POOL) is None
    d = horizontal_decision("data", 4, 0.35, hspec(scale_down_threshold=0.4, proportional=False), POOL)
    assert d is not None and (d.kind, d.delta) == ("scale_in", -1)


def test_bounds_min_and_max_replicas() -> None:
    assert horizontal_decision("data", 10, 0.99, hspec(), POOL) is None  # at max_replicas
    assert horizontal_decision("data", 2, 0.01, hspec(), POOL) is None  # at min_replicas
    below = horizontal_decision("data", 0, None, hspec(), POOL)
    above = horizontal_decision("data", 13, 0.5, hspec(), POOL)
    assert below is not None and (below.kind, below.delta) == ("scale_out", 2)
    assert above is not None and (above.kind, above.delta) == ("scale_in", -3)
    assert horizontal_decision("data", 4, None, hspec(), POOL) is None  # no signal, within bounds


def test_scale_in_that_would_be_undone_is_skipped() -> None:
    # 2 executors at 0.45 load -> 1 executor at 0.9 > 0.8: the next tick would scale out again.
    spec = hspec(scale_down_threshold=0.5)
    assert horizontal_decision("data", 2, 0.45, spec, PoolSpec(replicas=2, min_replicas=1, max_replicas=4)) is None
    d = horizontal_decision("data", 3, 0.45, spec, PoolSpec(replicas=3, min_replicas=1, max_replicas=4))
    assert d is not None and d.inputs["projected_load"] == pytest.approx(0.675)


# ------------------------------------------------------------------------------------------ ratio
def ratio(**kwargs: object) -> ScalingDecision | None:
    base: dict[str, object] = {
        "data_replicas": 4,
        "training_replicas": 2,
        "data_pool": PoolSpec(replicas=4, min_replicas=1, max_replicas=8),
        "training_pool": PoolSpec(replicas=2, min_replicas=1, max_replicas=2),
        "step": 2,
        "scale_up_threshold": 0.8,
    }
    return ratio_decision(**{**base, **kwargs})  # type: ignore[arg-type]


def test_waiting_trainers_with_unfilled_buffers_get_more_data_executors() -> None:
    d = ratio(buffer_fill=0.1, trainer_wait=0.4)
    assert d is not None and (d.role, d.kind, d.delta) == ("data", "scale_out", 2)
    assert d.inputs["trainer_wait"] == 0.4
    # Full buffers and waiting trainers: the executors serve slower than the trainers take --
    # more executors are more streams; but not when no task waits for a new executor.
    full = ratio(buffer_fill=0.95, trainer_wait=0.4)
    assert full is not None and (full.kind, full.delta) == ("scale_out", 2)
    assert ratio(buffer_fill=0.95, trainer_wait=0.4, pending_tasks=0) is None
    assert ratio(buffer_fill=0.1, trainer_wait=0.4, pending_tasks=3).inputs["pending_tasks"] == 3  # type: ignore[union-attr]
    assert ratio(buffer_fill=None, trainer_wait=0.4) is None


def test_full_buffers_and_idle_free_trainers_shrink_data_or_grow_training() -> None:
    d = ratio(buffer_fill=0.97, trainer_wait=0.0)
    assert d is not None and (d.role, d.kind, d.delta) == ("data", "scale_in", -2)
    grow = ratio(buffer_fill=0.97, trainer_wait=0.0, training_pool=PoolSpec(replicas=2, max_replicas=3))
    assert grow is not None and (grow.role, grow.kind, grow.delta) == ("training", "scale_out", 1)
    # Not while the data pool is at its minimum, nor when the smaller pool would be overloaded.
    assert ratio(buffer_fill=0.97, trainer_wait=0.0, data_replicas=1) is None
    assert ratio(buffer_fill=0.97, trainer_wait=0.0, data_load=0.5) is None  # 0.5 * 4 / 2 = 1.0
    assert ratio(buffer_fill=0.97, trainer_wait=0.0, data_load=0.3) is not None


def test_ratio_rule_thresholds() -> None:
    assert ratio(buffer_fill=0.5, trainer_wait=0.05) is None
    d = ratio(buffer_fill=0.5, trainer_wait=0.05, rule=RatioRule(wait_high=0.05))
    assert d is not None and d.kind == "scale_out"


# --------------------------------------------------------------------------------------- vertical
def test_ew_demand_weighs_recent_samples_more() -> None:
    history = [1.0, 1.0, 1.0, 5.0]
    assert ew_demand(history, 0.5) == pytest.approx((0.125 + 0.25 + 0.5 + 5.0) / 1.875)
    # history_decay: a smaller ratio forgets the past faster.
    assert ew_demand(history, 0.2) > ew_demand(history, 0.7) > ew_demand(history, 0.95) > 1.0
    with pytest.raises(ValueError):
        ew_demand([], 0.5)


def test_ew_update_is_the_running_form_of_ew_demand() -> None:
    values = np.array([[1.0, 3.0], [2.0, 1.0], [8.0, 1.0], [4.0, 2.0]])
    num, den = np.zeros(2), np.zeros(2)
    for row in values:
        num, den = ew_update(num, den, row, 0.7)
    assert (num / den).tolist() == pytest.approx([ew_demand(values[:, 0], 0.7), ew_demand(values[:, 1], 0.7)])


def alloc(demand: float, current: float, headroom: float = 0.2, min_change: float = 0.1) -> tuple[float, bool]:
    new, changed = vertical_allocation(
        demand, current, headroom=headroom, min_change=min_change, floor=0.1, cap=16.0, quantum=0.1
    )
    return float(new), bool(changed)


def test_headroom_key() -> None:
    assert alloc(2.0, 8.0, headroom=0.2) == (pytest.approx(2.4), True)
    assert alloc(2.0, 8.0, headroom=0.5) == (pytest.approx(3.0), True)


def test_min_change_key_is_r_theta() -> None:
    # 3.0 * 1.2 = 3.6 vs 4.0: a 10 % change.
    assert alloc(3.0, 4.0, min_change=0.05) == (pytest.approx(3.6), True)
    assert alloc(3.0, 4.0, min_change=0.15) == (4.0, False)  # unchanged: no flapping
    assert alloc(3.4, 4.0, min_change=0.0) == (pytest.approx(4.1), True)


def test_vertical_allocation_floor_cap_quantum_vectorised() -> None:
    new, changed = vertical_allocation(
        np.array([0.01, 40.0, 2.01]),
        np.array([1.0, 8.0, 1.0]),
        headroom=0.0,
        min_change=0.1,
        floor=0.5,
        cap=16.0,
        quantum=0.5,
    )
    assert new.tolist() == [0.5, 16.0, 2.5] and changed.tolist() == [True, True, True]
    # Already at the cap: nothing to do.
    new, changed = vertical_allocation(40.0, 16.0, headroom=0.2, min_change=0.1, floor=0.5, cap=16.0, quantum=0.5)
    assert float(new) == 16.0 and not bool(changed)


# -------------------------------------------------------------------------------------------- OOM
def test_oom_memory_grows_by_factor_up_to_the_cap() -> None:
    assert oom_memory(2 * GIB, 1.5, 8 * GIB) == 3 * GIB
    assert oom_memory(7 * GIB, 1.5, 8 * GIB) == 8 * GIB
    assert oom_memory(9 * GIB, 1.5, 8 * GIB) == 9 * GIB  # never shrinks


def oom(attempt: int = 0) -> ExecutorStatus:
    return ExecutorStatus("data-3", "data", "oom_killed", Resources(2.0, 2 * GIB), attempt=attempt)


def test_oom_restart_decision_uses_factor_cap_restart_and_max_restarts() -> None:
    d = oom_restart_decision(oom(), PoolSpec(oom_memory_factor=2.0), cap=16 * GIB, now=5.0)
    assert d is not None and d.kind == "oom_restart" and d.strategy == "failover"
    assert d.executor_ids == ("data-3",) and d.new == Resources(2.0, 4 * GIB) and d.old == Resources(2.0, 2 * GIB)
    capped = oom_restart_decision(oom(), PoolSpec(oom_memory_factor=2.0), cap=3 * GIB)
    assert capped is not None and capped.new == Resources(2.0, 3 * GIB)
    assert oom_restart_decision(oom(), PoolSpec(restart="never"), cap=16 * GIB) is None
    assert oom_restart_decision(oom(attempt=3), PoolSpec(max_restarts=3), cap=16 * GIB) is None
    assert oom_restart_decision(oom(attempt=2), PoolSpec(max_restarts=3), cap=16 * GIB) is not None
    running = ExecutorStatus("d", "data", "running", Resources(1.0, GIB))
    assert oom_restart_decision(running, PoolSpec(), cap=16 * GIB) is None


def test_decisions_log_as_json() -> None:
    d = ScalingDecision(
        "resize",
        "data",
        "demand",
        12.5,
        executor_ids=("data-1",),
        old=Resources(4.0, 8 * GIB),
        new=Resources(2.4, 5 * GIB),
        inputs={"demand_cpu": np.float64(2.0)},
    )
    record = json.loads(json.dumps(d.as_dict()))
    assert record["kind"] == "resize" and record["new"] == {"cpu": 2.4, "memory_bytes": 5 * GIB}
    assert record["inputs"] == {"demand_cpu": 2.0} and d.strategy == "vertical"
    assert "data-1" in d.describe() and "2.4 cpu" in d.describe()
