"""ScalingController: interval, cooldown, enabled flags, one strategy per tick, decisions, log, summary."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from primus_dagster.cluster import (
    ControllerOptions,
    ExecutorState,
    ExecutorStatus,
    Resources,
    Role,
    Sample,
    ScalingController,
    ScalingDecision,
)
from primus_dagster.spec import PoolSpec, ScalingSpec

GIB = 1 << 30
ALLOC = Resources(4.0, 8 * GIB)
DATA = PoolSpec(replicas=3, min_replicas=1, max_replicas=10, cpu=4, memory="8Gi")


def spec(**kwargs: Any) -> ScalingSpec:
    # Fixed steps and no warmup: these tests feed one sample and count executors (the proportional
    # steps and the warmup have their own tests in test_scaling_live_rules.py).
    base: dict[str, Any] = {
        "interval": "10s",
        "cooldown": "1s",
        "warmup": "0s",
        "horizontal": {"proportional": False},
        "vertical": {},
    }
    for key, value in kwargs.items():
        if isinstance(value, dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return ScalingSpec.model_validate(base)


CPU_ONLY = [{"name": "cpu", "weight": 1.0}]


def make(
    scaling: ScalingSpec, n: int = 3, pools: dict[Role, PoolSpec] | None = None, **options: Any
) -> ScalingController:
    controller = ScalingController(scaling, pools or {"data": DATA}, options=ControllerOptions(**options))
    controller.update_status("data", statuses(n))
    return controller


def statuses(
    n: int, resources: Resources = ALLOC, role: Role = "data", states: dict[str, ExecutorState] | None = None
) -> list[ExecutorStatus]:
    return [
        ExecutorStatus(f"{role}-{i}", role, (states or {}).get(f"{role}-{i}", "running"), resources) for i in range(n)
    ]


def feed(controller: ScalingController, t: float, cpu: list[float], role: Role = "data", **fields: Any) -> None:
    for i, used in enumerate(cpu):
        kwargs = {k: (v[i] if isinstance(v, list) else v) for k, v in fields.items()}
        alloc = kwargs.pop("allocated", ALLOC)
        controller.observe(Sample(t, f"{role}-{i}", role, alloc, cpu=used, **kwargs))


def kinds(decisions: list[ScalingDecision]) -> list[str]:
    return [d.kind for d in decisions]


HOT = [3.8, 3.8, 3.8]  # 95 % of 4 cores


# ----------------------------------------------------------------------------- interval, cooldown
def test_interval_key_spaces_the_ticks() -> None:
    for interval, expected in (("30s", []), ("5s", ["scale_out"])):
        controller = make(spec(interval=interval, horizontal={"metrics": CPU_ONLY}, vertical={"enabled": False}))
        feed(controller, 0.0, HOT)
        assert kinds(controller.tick(0.0)) == ["scale_out"]
        feed(controller, 10.0, HOT)
        assert kinds(controller.tick(10.0)) == expected
    assert controller.due(15.0) and not controller.due(14.0)


def test_cooldown_key_holds_a_pool_after_a_change() -> None:
    for cooldown, expected in (("60s", []), ("5s", ["scale_out"])):
        controller = make(spec(cooldown=cooldown, horizontal={"metrics": CPU_ONLY}, vertical={"enabled": False}))
        feed(controller, 0.0, HOT)
        assert kinds(controller.tick(0.0)) == ["scale_out"]
        feed(controller, 10.0, HOT)
        assert kinds(controller.tick(10.0)) == expected
    feed(controller, 70.0, HOT)
    assert kinds(controller.tick(70.0)) == ["scale_out"]


def test_horizontal_enabled_key() -> None:
    off = make(spec(horizontal={"enabled": False, "metrics": CPU_ONLY}, vertical={"enabled": False}))
    on = make(spec(horizontal={"enabled": True, "metrics": CPU_ONLY}, vertical={"enabled": False}))
    for controller in (off, on):
        feed(controller, 0.0, HOT)
    assert off.tick(0.0) == [] and kinds(on.tick(0.0)) == ["scale_out"]


def test_vertical_enabled_key() -> None:
    idle = [0.5, 0.5, 0.5]  # 4-core executors using half a core
    results = []
    for enabled in (False, True):
        controller = make(spec(horizontal={"enabled": False}, vertical={"enabled": enabled}))
        for t in (0.0, 1.0, 2.0):
            feed(controller, t, idle, rss_bytes=float(4 * GIB))
        results.append(controller.tick(2.0))
    assert results[0] == []
    assert kinds(results[1]) == ["resize"] * 3
    d = results[1][0]
    assert d.old == ALLOC and d.new == Resources(0.6, int(4.8 * GIB) + (1 << 20) - int(4.8 * GIB) % (1 << 20))
    assert d.inputs["demand_cpu"] == pytest.approx(0.5) and d.inputs["samples"] == 3


# ------------------------------------------------------------------------------------- metrics
def test_metric_aggregation_key_mean_vs_max() -> None:
    skewed = [3.8, 0.4, 0.4]  # one hot executor
    for aggregation, expected in (("mean", []), ("max", ["scale_out"])):
        metrics = [{"name": "cpu", "weight": 1.0, "aggregation": aggregation}]
        controller = make(spec(horizontal={"metrics": metrics}, vertical={"enabled": False}))
        feed(controller, 0.0, skewed)
        assert kinds(controller.tick(0.0)) == expected


def test_metric_weight_key() -> None:
    # cpu 0.95, memory 0.5: equal weights give 0.725 (< 0.8), cpu-heavy weights 0.905.
    for weights, expected in (((1, 1), []), ((9, 1), ["scale_out"])):
        metrics = [{"name": "cpu", "weight": weights[0]}, {"name": "memory", "weight": weights[1]}]
        controller = make(spec(horizontal={"metrics": metrics}, vertical={"enabled": False}))
        feed(controller, 0.0, HOT, rss_bytes=float(4 * GIB))
        assert kinds(controller.tick(0.0)) == expected


@pytest.mark.parametrize(
    ("name", "fields", "expected"),
    [
        ("io", {"io_bytes_per_s": 90e6}, ["scale_out"]),  # 0.9 of the 100 MB/s capacity
        ("io", {"io_bytes_per_s": 10e6}, ["scale_in"]),
        ("buffer_fill", {"buffer_fill": 0.9}, ["scale_out"]),
        ("memory", {"rss_bytes": float(7.5 * GIB)}, ["scale_out"]),
        ("cpu", {}, []),  # 0.4: between the thresholds
    ],
)
def test_metric_name_key_selects_the_signal(name: str, fields: dict[str, Any], expected: list[str]) -> None:
    controller = make(
        spec(horizontal={"metrics": [{"name": name, "weight": 1.0}]}, vertical={"enabled": False}), io_capacity=100e6
    )
    feed(controller, 0.0, [1.6, 1.6, 1.6], **fields)
    assert kinds(controller.tick(0.0)) == expected


def test_scale_down_threshold_and_step_through_the_controller() -> None:
    controller = make(
        spec(horizontal={"metrics": CPU_ONLY, "scale_down_threshold": 0.3, "step": 2}, vertical={"enabled": False}),
        n=6,
    )
    feed(controller, 0.0, [0.2, 0.2, 0.2, 0.2, 0.2, 0.1], rows_per_s=[50, 40, 30, 20, 10, 0])
    [d] = controller.tick(0.0)
    assert (d.kind, d.delta, d.replicas) == ("scale_in", -2, 6)
    assert d.executor_ids == ("data-5", "data-4")  # the least busy go


def test_stale_and_finished_executors_do_not_count() -> None:
    controller = make(spec(horizontal={"metrics": CPU_ONLY}, vertical={"enabled": False}), max_age_s=20.0)
    feed(controller, 0.0, HOT)
    view = controller.view("data", 30.0)
    assert view.replicas == 3 and view.fresh == 0 and view.load is None
    controller.update_status("data", statuses(3, states={"data-2": "failed"}))
    feed(controller, 30.0, [0.4, 0.4, 3.8])
    view = controller.view("data", 30.0)
    assert view.replicas == 2 and view.load == pytest.approx(0.1)


def test_scale_out_gives_new_executors_what_vertical_learnt() -> None:
    controller = make(spec(horizontal={"metrics": CPU_ONLY}, vertical={"enabled": False}), n=0)
    small, big = Resources(2.0, 4 * GIB), Resources(3.0, 6 * GIB)
    controller.update_status("data", [*statuses(2, small), ExecutorStatus("data-2", "data", "running", big)])
    feed(controller, 0.0, [1.9, 1.9, 2.9], allocated=[small, small, big])
    [d] = controller.tick(0.0)
    assert d.kind == "scale_out" and d.new == small
    empty = make(spec(), n=0, pools={"data": PoolSpec(replicas=1, min_replicas=1, cpu=2, memory="1Gi")})
    [d] = empty.tick(0.0)
    assert (d.kind, d.delta, d.new) == ("scale_out", 1, Resources(2.0, GIB))  # below min_replicas


# ---------------------------------------------------------------------------- vertical keys
def demand_after(decay: float, history: list[float]) -> float:
    controller = make(spec(horizontal={"enabled": False}, vertical={"history_decay": decay, "min_change": 0.0}), n=1)
    for t, used in enumerate(history):
        feed(controller, float(t), [used], rss_bytes=float(4 * GIB))
    [d] = controller.tick(float(len(history)))
    return d.inputs["demand_cpu"]


def test_history_decay_key() -> None:
    history = [3.0, 3.0, 3.0, 3.0, 1.0]
    slow, fast = demand_after(0.9, history), demand_after(0.2, history)
    assert fast < slow < 3.0
    assert fast == pytest.approx(np.average(history, weights=0.2 ** np.arange(4, -1, -1)))


@pytest.mark.parametrize(("headroom", "cpu"), [(0.0, 2.0), (0.5, 3.0)])
def test_headroom_key_through_the_controller(headroom: float, cpu: float) -> None:
    controller = make(spec(horizontal={"enabled": False}, vertical={"headroom": headroom}), n=1)
    for t in range(3):
        feed(controller, float(t), [2.0], rss_bytes=float(4 * GIB))
    [d] = controller.tick(3.0)
    assert d.new is not None and d.new.cpu == cpu


@pytest.mark.parametrize(("min_change", "expected"), [(0.1, ["resize"]), (0.5, [])])
def test_min_change_key_through_the_controller(min_change: float, expected: list[str]) -> None:
    # 2.8 cores * 1.2 = 3.4 of 4 (-15 %); memory 6.5 GiB * 1.2 = 7.8 GiB of 8 (-2.5 %).
    controller = make(spec(horizontal={"enabled": False}, vertical={"min_change": min_change}), n=1)
    for t in range(3):
        feed(controller, float(t), [2.8], rss_bytes=float(6.5 * GIB))
    assert kinds(controller.tick(3.0)) == expected


def test_vertical_waits_for_min_samples() -> None:
    controller = make(spec(horizontal={"enabled": False}), n=1, min_samples=3)
    for t in range(2):
        feed(controller, float(t), [0.5], rss_bytes=float(GIB))
    assert controller.tick(2.0) == []
    feed(controller, 11.0, [0.5], rss_bytes=float(GIB))
    assert kinds(controller.tick(12.0)) == ["resize"]


def test_memory_demand_never_below_the_latest_rss() -> None:
    controller = make(spec(horizontal={"enabled": False}, vertical={"history_decay": 0.9}), n=1)
    # 7.4 GiB * 1.2 = 8.9 GiB: 11 % over the 8 GiB allocation (at 7 GiB the 5 % change is below R_theta).
    for t, rss in enumerate([2.0, 2.0, 2.0, 7.4]):
        feed(controller, float(t), [3.5], rss_bytes=rss * GIB)
    [d] = controller.tick(4.0)
    assert d.new is not None and d.new.memory_bytes >= 1.2 * 7.4 * GIB > d.old.memory_bytes  # type: ignore[union-attr]
    assert "memory near its limit" in d.reason


def test_max_resizes_per_tick_puts_memory_increases_first() -> None:
    controller = make(spec(horizontal={"enabled": False}), n=4, max_resizes_per_tick=2)
    for t in range(3):
        feed(controller, float(t), [0.5, 0.5, 3.9, 3.9], rss_bytes=[GIB, GIB, 7.5 * GIB, 2 * GIB])
    decisions = controller.tick(3.0)
    assert [d.executor_ids[0] for d in decisions] == ["data-2", "data-0"]
    assert decisions[0].new.memory_bytes > ALLOC.memory_bytes  # type: ignore[union-attr]


# --------------------------------------------------------------------- one strategy per tick
def test_one_strategy_per_tick_and_they_take_turns() -> None:
    controller = make(spec(horizontal={"metrics": CPU_ONLY}))
    strategies = []
    for t in (0.0, 10.0, 20.0, 30.0):
        for dt in (-2.0, -1.0, 0.0):
            # Hot CPU (horizontal wants more executors) and RSS near the limit (vertical wants memory).
            feed(controller, t + dt, HOT, rss_bytes=float(7.8 * GIB))
        decisions = controller.tick(t)
        assert len({d.strategy for d in decisions}) == 1
        strategies.append(decisions[0].strategy)
    # The first contention goes to the resize that prevents an OOM kill, then they alternate.
    assert strategies == ["vertical", "horizontal", "vertical", "horizontal"]


def test_horizontal_goes_first_when_vertical_only_right_sizes() -> None:
    controller = make(spec(horizontal={"metrics": CPU_ONLY}))
    for t in range(3):
        feed(controller, float(t), HOT, rss_bytes=float(GIB))  # memory could shrink; CPU is hot
    assert kinds(controller.tick(3.0)) == ["scale_out"]
    feed(controller, 13.0, HOT, rss_bytes=float(GIB))
    assert set(kinds(controller.tick(13.0))) == {"resize"}


def test_memory_increase_ignores_the_cooldown_right_sizing_waits() -> None:
    controller = make(spec(cooldown="10m", horizontal={"metrics": CPU_ONLY}))
    for t in range(3):
        feed(controller, float(t), HOT, rss_bytes=float(GIB))
    assert kinds(controller.tick(3.0)) == ["scale_out"]  # the data pool now cools down for 10 min
    for t2 in (11.0, 12.0, 13.0):
        feed(controller, t2, HOT, rss_bytes=[GIB, GIB, 7.9 * GIB])
    [d] = controller.tick(13.0)
    assert (d.kind, d.executor_ids) == ("resize", ("data-2",))


# ------------------------------------------------------------------------------------- ratio
TRAINING = PoolSpec(replicas=2, min_replicas=1, max_replicas=4, cpu=4, memory="8Gi")


def two_pools(training: PoolSpec = TRAINING, trainers: int = 2) -> ScalingController:
    controller = make(
        spec(horizontal={"metrics": CPU_ONLY}, vertical={"enabled": False}), pools={"data": DATA, "training": training}
    )
    controller.update_status("training", statuses(trainers, role="training"))
    return controller


def test_waiting_trainers_get_more_data_executors() -> None:
    controller = two_pools()
    feed(controller, 0.0, [2.0, 2.0, 2.0], buffer_fill=0.05)
    feed(controller, 0.0, [1.0, 1.0], role="training", reader_wait=0.5)
    [d] = controller.tick(0.0)
    assert (d.role, d.kind, d.delta) == ("data", "scale_out", 1) and "trainers wait" in d.reason


def test_full_buffers_add_trainers_or_remove_data_executors() -> None:
    controller = two_pools()
    feed(controller, 0.0, [2.0, 2.0, 2.0], buffer_fill=1.0)
    feed(controller, 0.0, [3.8, 3.8], role="training", reader_wait=0.0)
    [d] = controller.tick(0.0)  # the training pool may grow; its own load (0.95) agrees
    assert (d.role, d.kind) == ("training", "scale_out")
    fixed = two_pools(PoolSpec(replicas=2, min_replicas=2, max_replicas=2))
    feed(fixed, 0.0, [1.0, 1.0, 1.0], buffer_fill=1.0)
    feed(fixed, 0.0, [1.0, 1.0], role="training", reader_wait=0.0)
    [d] = fixed.tick(0.0)
    assert (d.role, d.kind, d.delta) == ("data", "scale_in", -1)


def test_no_trainers_yet_and_full_buffers_start_trainers() -> None:
    controller = two_pools(PoolSpec(replicas=0, min_replicas=0, max_replicas=4), trainers=0)
    feed(controller, 0.0, [1.0, 1.0, 1.0], buffer_fill=1.0)
    [d] = controller.tick(0.0)
    assert (d.role, d.kind, d.delta, d.replicas) == ("training", "scale_out", 1, 0)


# ------------------------------------------------------------------------------------------ OOM
def test_oom_killed_executor_restarts_once_with_more_memory() -> None:
    controller = make(spec(interval="1h"), pools={"data": DATA.model_copy(update={"oom_memory_factor": 1.5})})
    assert controller.tick(0.0) == []
    controller.update_status("data", statuses(3, states={"data-1": "oom_killed"}))
    [d] = controller.tick(1.0)  # failover is not held back by the interval
    assert (d.kind, d.executor_ids, d.new) == ("oom_restart", ("data-1",), Resources(4.0, 12 * GIB))
    controller.update_status("data", statuses(3, states={"data-1": "oom_killed"}))
    assert controller.tick(2.0) == []  # the same attempt is handled once
    off = make(spec(), oom_restarts=False)
    off.update_status("data", statuses(3, states={"data-1": "oom_killed"}))
    assert off.tick(0.0) == []


# --------------------------------------------------------------------------- records, state
def test_decision_log_summary_and_metrics() -> None:
    controller = make(spec(horizontal={"metrics": CPU_ONLY}, vertical={"enabled": False}), log_size=2)
    for t in (0.0, 10.0, 20.0):
        feed(controller, t, HOT)
        controller.tick(t)
    assert len(controller.decision_log) == 2 and controller.actions["scale_out"] == 3
    summary = controller.summary()
    json.dumps(summary)
    assert summary["ticks"] == 3 and summary["actions"] == 3 and summary["actions_by_kind"] == {"scale_out": 3}
    data = summary["pools"]["data"]
    assert data["replicas_over_time"] == [[0.0, 3], [10.0, 3], [20.0, 3]]  # nothing applied the decisions
    assert data["util_mean"]["cpu"] == pytest.approx(0.95) and data["load_mean"] == pytest.approx(0.95)
    metrics = controller.last_metrics
    assert metrics["scaling/data/replicas"] == 3 and metrics["scaling/data/util_cpu"] == pytest.approx(0.95)
    assert metrics["scaling/actions_scale_out"] == 2.0  # counted before this tick's decision


def test_executors_that_leave_are_forgotten_and_rows_reused() -> None:
    controller = make(spec(), n=3)
    feed(controller, 0.0, [1.0, 1.0, 1.0])
    controller.update_status("data", statuses(2))
    assert controller.view("data", 0.0).replicas == 2
    assert controller.series.executors("data") == ["data-0", "data-1"]
    controller.update_status("data", [*statuses(2), ExecutorStatus("data-9", "data", "starting", ALLOC)])
    view = controller.view("data", 0.0)
    assert view.replicas == 3 and view.fresh == 2  # the newcomer has no sample yet


def test_observe_batch_matches_observe() -> None:
    one, many = make(spec(), n=3), make(spec(), n=3)
    rng = np.random.default_rng(1)
    for t in (0.0, 5.0, 10.0):
        cpu, rss, fill = rng.uniform(0, 4, 3), rng.uniform(1, 8, 3) * GIB, rng.uniform(0, 1, 3)
        feed(one, t, cpu.tolist(), rss_bytes=rss.tolist(), buffer_fill=fill.tolist())
        many.observe_batch("data", ["data-0", "data-1", "data-2"], time=t, cpu=cpu, rss_bytes=rss, buffer_fill=fill)
    assert one.view("data", 10.0) == many.view("data", 10.0)
    assert [d.as_dict() for d in one.tick(10.0)] == [d.as_dict() for d in many.tick(10.0)]


def test_unknown_pool_is_an_error() -> None:
    controller = make(spec())
    with pytest.raises(KeyError, match="no pool 'training'"):
        controller.update_status("training", [])


def test_a_large_pool_ticks_with_arrays() -> None:
    """20 000 executors in one pool: a tick decides from numpy state (the 10 M-core timing is in
    bench/scaling_sim.py; no timed assertion here)."""
    n = 20_000
    pools: dict[Role, PoolSpec] = {"data": PoolSpec(replicas=n, max_replicas=2 * n, cpu=4, memory="8Gi")}
    controller = ScalingController(spec(horizontal={"metrics": CPU_ONLY}), pools)
    controller.update_status("data", statuses(n))
    ids = [f"data-{i}" for i in range(n)]
    for t in (0.0, 1.0, 2.0):
        controller.observe_batch("data", ids, time=t, cpu=np.full(n, 3.9), rss_bytes=np.full(n, 2.0 * GIB))
    decisions = controller.tick(2.0)
    assert kinds(decisions) == ["scale_out"] and decisions[0].replicas == n


def test_max_memory_key_caps_vertical_memory() -> None:
    for max_memory, expected in (
        ("9Gi", 9 * GIB),
        (None, int(1.2 * 8.5 * GIB) + (1 << 20) - int(1.2 * 8.5 * GIB) % (1 << 20)),
    ):
        pool = DATA.model_copy(update={"max_memory": max_memory})
        controller = make(spec(horizontal={"enabled": False}), n=1, pools={"data": pool})
        for t in range(3):
            feed(controller, float(t), [3.5], rss_bytes=float(8.5 * GIB), allocated=Resources(4.0, 9 * GIB))
        decisions = controller.tick(3.0)
        if max_memory == "9Gi":
            assert decisions == []  # already at the cap: nothing to grow into
        else:
            [d] = decisions
            assert d.new is not None and d.new.memory_bytes == expected  # default cap: 4 x 8Gi
