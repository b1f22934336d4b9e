"""The autoscaler's scaling timeline: one point per scaling tick, bounded, changes kept; and what a
tick of :class:`DataPoolAutoscaler` adds to it (a fake plane, no processes)."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace
from typing import Any

import pytest

from primus_dagster.cluster import Resources, ScalingDecision
from primus_dagster.cluster.autoscaler import DataPoolAutoscaler, ScalingTimeline
from primus_dagster.cluster.pool import ExecutorStatus
from primus_dagster.data.driver.api import ExecutorReport
from primus_dagster.spec import parse_job_spec
from tests.data.executor.datakit import job_text


def scale_out(t: float, delta: int = 1) -> ScalingDecision:
    return ScalingDecision("scale_out", "data", "load", t, delta=delta, replicas=2)


def test_points_carry_the_tick_and_the_decision() -> None:
    timeline = ScalingTimeline()
    timeline.add(0.5, 2, 0.9123456, 0.25, 0.8, [scale_out(0.5, 2)])
    timeline.add(1.0, 4, None, None, None)
    assert timeline.as_list() == [
        {
            "t_s": 0.5,
            "replicas": 2,
            "target_replicas": 4,
            "cpu_util": 0.9123,
            "memory_util": 0.25,
            "load": 0.8,
            "decision": "scale_out",
        },
        {
            "t_s": 1.0,
            "replicas": 4,
            "target_replicas": 4,
            "cpu_util": None,
            "memory_util": None,
            "load": None,
            "decision": None,
        },
    ]
    json.dumps(timeline.as_list())  # JSON-able (run metadata)


def test_a_long_run_is_downsampled_keeping_every_change_and_both_ends() -> None:
    timeline = ScalingTimeline(max_points=500)
    changes = {t for t in range(0, 20_000, 97)}  # 207 ticks with a decision
    for t in range(20_000):
        timeline.add(float(t), 3, 0.5, 0.5, 0.5, [scale_out(float(t))] if t in changes else [])
        assert len(timeline.as_list()) <= 500
    points = timeline.as_list()
    times = [p["t_s"] for p in points]
    assert times == sorted(times) and times[0] == 0.0 and times[-1] == 19_999.0
    assert {int(p["t_s"]) for p in points if p["decision"]} == changes
    assert len(points) > 250  # downsampled, not emptied: plain ticks still cover the run
    plain = [t for t, p in zip(times, points, strict=True) if p["decision"] is None]
    assert max(b - a for a, b in itertools.pairwise(plain)) <= 2 * timeline.stride


def test_too_many_changes_are_halved_too() -> None:
    timeline = ScalingTimeline(max_points=10)
    for t in range(100):
        timeline.add(float(t), 1, 0.5, 0.5, 0.5, [scale_out(float(t))])
    assert len(timeline.as_list()) <= 10 and timeline.as_list()[-1]["t_s"] == 99.0
    with pytest.raises(ValueError, match="max_points"):
        ScalingTimeline(max_points=2)


class FakeDriver:
    def __init__(self) -> None:
        self.reports: dict[str, ExecutorReport] = {}

    def executors(self) -> dict[str, ExecutorReport]:
        return self.reports


class FakePool:
    role = "data"

    def __init__(self) -> None:
        self.statuses = [ExecutorStatus(f"data-{i}", "data", "running", Resources(1.0, 1 << 30)) for i in range(2)]
        self.launched: list[int] = []

    def status(self) -> list[ExecutorStatus]:
        return list(self.statuses)

    def launch(self, count: int, resources: Any = None, **_: Any) -> list[str]:
        self.launched.append(count)
        n = len(self.statuses)
        self.statuses += [ExecutorStatus(f"data-{n + i}", "data", "running", resources) for i in range(count)]
        return [s.executor_id for s in self.statuses[n:]]


def test_each_scaling_tick_of_the_autoscaler_adds_a_point() -> None:
    scaling = """scaling:
  interval: 1s
  cooldown: 5s
  warmup: 0s
  horizontal: {metrics: [{name: cpu, weight: 1}], scale_up_threshold: 0.8, scale_down_threshold: 0.1, proportional: false}
  vertical: {enabled: false}"""
    job = parse_job_spec(job_text(replicas=2, data_pool="max_replicas: 4", top_level=scaling))
    scaler = DataPoolAutoscaler(job)
    driver, pool = FakeDriver(), FakePool()
    plane = SimpleNamespace(
        pool=pool, driver=driver, started_at=100.0, readers=dict, supervisor=None
    )  # no trainer reader here
    for t in (100.2, 100.5, 101.2, 102.2):  # 100.5: within the interval, no scaling tick
        driver.reports = {
            s.executor_id: ExecutorReport(s.executor_id, "", metrics={"cpu": 0.95, "rss_bytes": 1 << 28})
            for s in pool.statuses
        }
        scaler.control(plane, t)  # type: ignore[arg-type]
    timeline = scaler.summary()["timeline"]
    assert [p["t_s"] for p in timeline] == [0.2, 1.2, 2.2]
    assert [(p["replicas"], p["target_replicas"], p["decision"]) for p in timeline] == [
        (2, 3, "scale_out"),  # 0.95 busy of 1 core > 0.8
        (3, 3, None),  # cooling down
        (3, 3, None),
    ]
    assert timeline[0]["cpu_util"] == 0.95 and timeline[0]["memory_util"] == 0.25
    assert pool.launched == [1]
