"""The data pool's scaling timeline reaches MLflow as metrics (replicas and utilisation over time)."""

from __future__ import annotations

from types import SimpleNamespace

from primus_dagster.training.window import log_pool_timeline


class _Points:
    def __init__(self) -> None:
        self.points: list[tuple[str, float, int]] = []

    def log_metric_points(self, points) -> None:
        self.points += list(points)


def test_timeline_points_become_metrics_with_steps_in_seconds_since_the_run_started() -> None:
    tracker = _Points()
    timeline = [
        {
            "t_s": 0.5,
            "replicas": 1,
            "target_replicas": 2,
            "cpu_util": 0.9,
            "memory_util": None,
            "load": 0.85,
            "decision": "scale_out",
        },
        {
            "t_s": 31.2,
            "replicas": 2,
            "target_replicas": 2,
            "cpu_util": None,
            "memory_util": 0.2,
            "load": None,
            "decision": None,
        },
        {
            "t_s": 62.0,
            "replicas": 2,
            "target_replicas": 1,
            "cpu_util": 0.1,
            "memory_util": 0.2,
            "load": 0.12,
            "decision": "scale_in,resize",
        },
    ]
    log_pool_timeline(SimpleNamespace(tracker=tracker), timeline, offset_s=10.0)
    by_name: dict[str, list[tuple[int, float]]] = {}
    for name, value, step in tracker.points:
        by_name.setdefault(name, []).append((step, value))
    assert by_name["data_replicas"] == [(10, 1.0), (41, 2.0), (72, 2.0)]
    assert by_name["data_target_replicas"] == [(10, 2.0), (41, 2.0), (72, 1.0)]
    assert by_name["data_cpu_util"] == [(10, 0.9), (72, 0.1)]  # no sample: no point
    assert by_name["data_memory_util"] == [(41, 0.2), (72, 0.2)]
    assert by_name["data_load"] == [(10, 0.85), (72, 0.12)]
    assert by_name["data_scaling_decisions"] == [(10, 1.0), (72, 3.0)]  # a running count
