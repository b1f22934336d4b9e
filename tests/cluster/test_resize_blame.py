"""A resize below what the executors need costs the run nothing but restarts, on real executor processes.

Every data executor of a pooled plane is resized just above the peak RSS it has reached, then grows
past it (memory growth injected from outside the product: ``tests/cluster/memkit.py``'s
``sitecustomize`` on the executors' ``PYTHONPATH``), so the pool's watchdog kills every one of them. The
resize is forced by a stand-in for a policy gone wrong (``ShrinkBelowNeed``, the plane's controller;
no real policy does it any more, ``tests/cluster/test_scaling_safety.py``). The pool is strict --
``max_restarts: 0``, ``blacklist_after: 1`` -- so that before, the first kill failed the run and every
node ended blacklisted. Now: the run completes with every row once, no node is blacklisted, no restart
is counted, and exactly one warning per executor names the resize. The test waits on the reader's end
and the plane's state (the shrink first, with a bound), never on a time.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from primus_dagster.cluster import Resources
from primus_dagster.cluster.pooled_plane import PooledDataPlane
from tests.cluster.memkit import growing_pool, small_job
from tests.cluster.prockit import assert_no_orphans, child_pids

pytestmark = pytest.mark.integration

MiB = 1 << 20


class ShrinkBelowNeed:
    """The plane's controller: once every executor runs and has a measured peak, resize each to its
    peak + 48 MiB (below what it will need), then let them grow (``trigger``)."""

    def __init__(self, trigger: Path):
        self.trigger = trigger
        self.resized: dict[str, int] = {}
        self.done = threading.Event()

    def control(self, plane: PooledDataPlane, now: float) -> None:
        if self.done.is_set() or plane.pool is None:
            return
        statuses = plane.pool.status()
        if len(statuses) < 2 or any(s.state != "running" or s.rss_peak_bytes == 0 for s in statuses):
            return
        for status in statuses:
            memory = status.rss_peak_bytes + 48 * MiB
            plane.pool.resize(status.executor_id, Resources(status.resources.cpu, memory))
            self.resized[status.executor_id] = memory
        self.trigger.touch()
        self.done.set()

    def summary(self) -> dict[str, Any]:
        return {"resized": dict(self.resized)}


def test_every_executor_resized_below_its_need_the_run_completes_and_no_node_is_blamed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pool = "max_replicas: 4, memory: 1Gi, restart: on_failure, max_restarts: 0, blacklist_after: 1"
    ids, spec, tasks = small_job(tmp_path, pool)
    trigger = tmp_path / "grow-now"
    controller = ShrinkBelowNeed(trigger)
    factory = growing_pool(tmp_path, None, ballast_mb=192, trigger=trigger)
    before = child_pids()
    got: Counter[int] = Counter()
    with (
        caplog.at_level(logging.WARNING, logger="primus_dagster.cluster"),
        PooledDataPlane(
            spec, tmp_path, tasks, token="t0k3n", heartbeat_s=0.2, pool_factory=factory, controller=controller
        ) as plane,
    ):
        assert plane.supervisor is not None
        # Both executors up and measured, then shrunk, before anything is read: a run that ends first
        # (a loaded machine, a small job) would leave nothing to shrink.
        assert controller.done.wait(timeout=120), plane.summary()
        with plane.reader(0, prefetch=2, refresh_s=0.1) as reader:
            for batch in reader:
                assert batch.sample_id is not None
                got.update(batch.sample_id.tolist())
        plane.raise_if_failed()
        summary = plane.summary()
        supervisor = plane.supervisor
    assert got == Counter(ids)  # the run completed: nothing lost, nothing twice
    assert summary["error"] is None and summary["blacklisted_nodes"] == []
    assert summary["restarts"] == 0 and sum(supervisor.restarts.values()) == 0
    killed = {d.executor_id for d in supervisor.oom_kills_by_scaling}
    assert killed == set(controller.resized) and summary["oom_kills_from_resize"] == 2
    for decision in supervisor.oom_kills_by_scaling:
        assert decision.resources is not None and decision.resources.memory_bytes == 1 << 30  # back to 1 GiB
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for executor_id in killed:
        named = [w for w in warnings if f"{executor_id} OOM-killed" in w]
        assert len(named) == 1 and "after the pool's resize from 1024 MiB" in named[0], warnings
    assert not [w for w in warnings if "above its memory allocation" in w], warnings  # not said twice
    assert_no_orphans(str(spec), before)
