"""Scaling metrics: heartbeat -> Sample, utilisations, bounded per-executor series, pool aggregates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from primus_dagster.cluster import (
    ExecutorSeries,
    ExecutorStatus,
    MetricsStore,
    Resources,
    Sample,
    ScalingController,
    aggregate,
    sample_from_heartbeat,
)
from primus_dagster.spec import PoolSpec, ScalingSpec

GIB = 1 << 30
ALLOC = Resources(cpu=4.0, memory_bytes=8 * GIB)


def sample(executor_id: str, t: float, cpu: float = 1.0, **kwargs: float) -> Sample:
    return Sample(t, executor_id, "data", ALLOC, cpu=cpu, **kwargs)


def test_heartbeat_metrics_become_a_sample() -> None:
    heartbeat = {
        "rows_per_s": 1200.0,
        "batches_per_s": 3.0,
        "cpu": 3.0,
        "rss_bytes": float(2 * GIB),
        "buffer_fill": 0.25,
        "tasks_running": 2.0,
    }
    s = sample_from_heartbeat("data-0", "data", heartbeat, ALLOC, now=7.0, io_bytes_per_s=50e6)
    assert (s.time, s.executor_id, s.role, s.allocated) == (7.0, "data-0", "data", ALLOC)
    assert (s.cpu, s.rss_bytes, s.buffer_fill, s.rows_per_s, s.io_bytes_per_s) == (3.0, 2 * GIB, 0.25, 1200.0, 50e6)
    assert s.reader_wait is None
    assert s.utilisation("cpu") == 0.75
    assert s.utilisation("memory") == 0.25
    assert s.utilisation("buffer_fill") == 0.25
    assert s.utilisation("io", io_capacity=100e6) == 0.5


def test_heartbeat_gaps_and_garbage_are_not_reported_or_zero() -> None:
    s = sample_from_heartbeat("t0", "training", {"cpu": math.nan, "buffer_fill": 3.0}, ALLOC, now=0.0, reader_wait=-1)
    assert s.cpu == 0.0 and s.rss_bytes == 0.0 and s.rows_per_s == 0.0
    assert s.buffer_fill == 1.0  # clipped to 0..1
    assert s.reader_wait == 0.0
    assert s.io_bytes_per_s is None and s.utilisation("io") is None
    bare = sample_from_heartbeat("t1", "training", {}, ALLOC, now=0.0)
    assert bare.buffer_fill is None and bare.utilisation("buffer_fill") is None
    # A trainer may send its reader wait in the heartbeat itself.
    assert sample_from_heartbeat("t2", "training", {"reader_wait": 0.4}, ALLOC, now=0.0).reader_wait == 0.4


def test_aggregate_mean_max_and_nothing() -> None:
    assert aggregate(np.array([0.2, np.nan, 0.6]), "mean") == pytest.approx(0.4)
    assert aggregate(np.array([0.2, np.nan, 0.6]), "max") == 0.6
    assert aggregate(np.array([np.nan]), "mean") is None
    assert aggregate(np.array([]), "max") is None


def test_series_is_bounded_by_count_and_age() -> None:
    series = ExecutorSeries(max_samples=3, max_age_s=100.0)
    for t in range(5):
        series.add(sample("d0", float(t), cpu=float(t)))
    assert [s.time for s in series] == [2.0, 3.0, 4.0]
    assert series.values("cpu").tolist() == [2.0, 3.0, 4.0]
    series.add(sample("d0", 200.0))  # the others are now older than 100 s
    assert [s.time for s in series] == [200.0]
    assert series.latest is not None and series.latest.time == 200.0
    with pytest.raises(ValueError):
        ExecutorSeries(max_samples=0)


def test_store_aggregates_latest_fresh_samples_per_pool() -> None:
    store = MetricsStore(max_samples=4, max_age_s=60.0)
    store.add(sample("d0", 0.0, cpu=4.0))  # superseded by the next one
    store.add(sample("d0", 10.0, cpu=1.0, buffer_fill=0.5))
    store.add(sample("d1", 10.0, cpu=3.0, buffer_fill=1.0))
    store.add(Sample(10.0, "t0", "training", ALLOC, cpu=4.0, reader_wait=0.5))
    assert store.pool_utilisation("data", "cpu", "mean", now=10.0) == pytest.approx(0.5)
    assert store.pool_utilisation("data", "cpu", "max", now=10.0) == pytest.approx(0.75)
    assert store.pool_utilisation("data", "buffer_fill", "mean", now=10.0) == pytest.approx(0.75)
    assert store.pool_utilisation("training", "buffer_fill", "mean", now=10.0) is None
    assert store.pool_utilisation("training", "cpu", "mean", now=10.0) == 1.0
    assert sorted(store.executors("data")) == ["d0", "d1"]
    # Samples older than max_age_s are stale: not aggregated, pruned.
    store.add(sample("d2", 100.0, cpu=2.0))
    assert store.pool_utilisation("data", "cpu", "mean", now=100.0) == pytest.approx(0.5)
    store.prune(100.0)
    assert sorted(store.executors()) == ["d2"]
    store.remove("d2")
    assert len(store) == 0 and store.latest("d2") is None


def test_controller_pool_view_agrees_with_the_store() -> None:
    """The controller's numpy state and the plain per-executor series give the same aggregates."""
    controller = ScalingController(ScalingSpec(), {"data": PoolSpec(replicas=3, max_replicas=8)})
    controller.update_status("data", [ExecutorStatus(f"d{i}", "data", "running", ALLOC) for i in range(3)])
    rng = np.random.default_rng(0)
    for t in (0.0, 10.0, 20.0):
        for i in range(3):
            controller.observe(
                sample(
                    f"d{i}",
                    t,
                    cpu=float(rng.uniform(0, 4)),
                    rss_bytes=float(rng.uniform(1, 8) * GIB),
                    buffer_fill=float(rng.uniform()),
                    io_bytes_per_s=float(rng.uniform(0, 2e8)),
                )
            )
    view = controller.view("data", now=20.0)
    for name in ("cpu", "memory", "buffer_fill", "io"):
        assert view.mean_util[name] == pytest.approx(controller.series.pool_utilisation("data", name, "mean", 20.0))
    assert view.replicas == view.fresh == 3
