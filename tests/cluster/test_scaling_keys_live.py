"""Every ``scaling.*`` key changes what the live autoscaler does: one test per key, each run through
:class:`DataPoolAutoscaler` (the code a ``primus-dagster train`` runs) on a fake plane -- a pool
whose executors report heartbeats, a driver with pending tasks, a trainer reader whose queue is
empty (waiting) or full -- with the spec's defaults but for the key under test, two values of which
give different decisions. Plus the live rules: steady-state samples only, the trainers' wait, the
ratio rule with full buffers, no task left, the pool ahead."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from primus_dagster.cluster import ControllerOptions, Resources
from primus_dagster.cluster.autoscaler import DataPoolAutoscaler, TrainerWait
from primus_dagster.cluster.pool import ExecutorStatus
from primus_dagster.data.driver.api import ExecutorReport
from primus_dagster.spec import ScalingSpec, parse_job_spec
from tests.data.executor.datakit import job_text

GIB = 1 << 30


class FakePool:
    role = "data"

    def __init__(self, n: int, cores: float = 1.0) -> None:
        self.statuses = [ExecutorStatus(f"data-{i}", "data", "running", Resources(cores, GIB)) for i in range(n)]
        self.resized: list[tuple[str, Resources]] = []

    def status(self) -> list[ExecutorStatus]:
        return list(self.statuses)

    def launch(self, count: int, resources: Any = None, **_: Any) -> list[str]:
        n = len(self.statuses)
        new = [
            ExecutorStatus(f"data-{n + i}", "data", "running", resources or Resources(1.0, GIB)) for i in range(count)
        ]
        self.statuses += new
        return [s.executor_id for s in new]

    def stop(self, executor_id: str) -> None:
        self.statuses = [s for s in self.statuses if s.executor_id != executor_id]

    def resize(self, executor_id: str, resources: Resources) -> None:
        self.resized.append((executor_id, resources))
        self.statuses = [
            s if s.executor_id != executor_id else ExecutorStatus(executor_id, "data", "running", resources)
            for s in self.statuses
        ]


class FakeReader:
    def __init__(self, queued: int) -> None:
        self.queued = queued
        self.stats = {"yielded": 1}

    def queue_stats(self) -> dict[str, Any]:
        return {"batch": SimpleNamespace(size=self.queued)}


class FakeDriver:
    def __init__(self, pool: FakePool, metrics: dict[str, float], pending: int) -> None:
        self.pool, self.metrics, self.pending = pool, metrics, pending
        self.per_executor: dict[str, dict[str, float]] = {}  # overrides of some executors' metrics

    def executors(self) -> dict[str, ExecutorReport]:
        return {
            s.executor_id: ExecutorReport(
                s.executor_id, "", metrics={**self.metrics, **self.per_executor.get(s.executor_id, {})}
            )
            for s in self.pool.statuses
        }

    def backlog_by_kind(self) -> dict[str, int]:
        return {"batch": self.pending + 2}

    def running_by_kind(self) -> dict[str, int]:
        return {"batch": 2}


def run(
    scaling: dict[str, Any],
    *,
    cpu: float = 0.5,
    rss: float = 0.3,
    fill: float | None = 0.5,
    queued: int | None = None,
    pending: int = 10,
    seconds: float = 60.0,
    n: int = 2,
    pool: str = "min_replicas: 1, max_replicas: 10, memory: 1Gi",
    cores: float = 1.0,
    options: ControllerOptions | None = None,
) -> tuple[DataPoolAutoscaler, FakePool]:
    """``seconds`` of 0.25 s control ticks of an autoscaler with ``scaling`` (merged into the
    defaults); executors at ``cpu`` of their ``cores`` and ``rss`` of 1 GiB, buffers ``fill`` full; a trainer
    reader with ``queued`` batches (None: no trainer reader, 0: the trainer waits)."""
    job = parse_job_spec(job_text(replicas=n, data_pool=pool, top_level=yaml.safe_dump({"scaling": scaling})))
    scaler = DataPoolAutoscaler(job, options=options)
    fake = FakePool(n, cores)
    metrics = {"cpu": cpu * cores, "rss_bytes": rss * GIB}
    if fill is not None:
        metrics["buffer_fill"] = fill
    readers = {} if queued is None else {0: FakeReader(queued)}
    plane = SimpleNamespace(
        pool=fake, driver=FakeDriver(fake, metrics, pending), started_at=0.0, readers=lambda: readers, supervisor=None
    )
    for k in range(int(seconds / 0.25) + 1):
        scaler.control(plane, k * 0.25)  # type: ignore[arg-type]
    return scaler, fake


def kinds(scaler: DataPoolAutoscaler) -> list[str]:
    return [d.kind for d in scaler.applied]


def first(scaler: DataPoolAutoscaler, kind: str) -> Any:
    return next(d for d in scaler.applied if d.kind == kind)


NO_VERTICAL = {"vertical": {"enabled": False}}


def test_the_defaults_are_the_live_ones() -> None:
    spec = ScalingSpec()
    assert (spec.interval.total_seconds(), spec.cooldown.total_seconds(), spec.warmup.total_seconds()) == (5, 10, 5)
    assert [(m.name, m.weight) for m in spec.horizontal.metrics] == [("cpu", 1.0)] and spec.horizontal.proportional


def test_interval_key() -> None:
    ticks = {iv: run({"interval": iv, **NO_VERTICAL})[0].controller.ticks for iv in ("5s", "20s")}
    assert ticks == {"5s": 13, "20s": 4}


def test_cooldown_key() -> None:
    # The trainer waits on every tick; a changed pool waits the cooldown before the next scale-out.
    outs = {cd: kinds(run({"cooldown": cd, **NO_VERTICAL}, queued=0)[0]).count("scale_out") for cd in ("10s", "60s")}
    assert outs["10s"] > outs["60s"] == 1


def test_warmup_key_keeps_start_up_samples_out_of_decisions() -> None:
    early = first(run({"warmup": "5s", **NO_VERTICAL}, cpu=0.95)[0], "scale_out")
    late = first(run({"warmup": "30s", **NO_VERTICAL}, cpu=0.95)[0], "scale_out")
    assert early.time == 5.0 and late.time == 30.0
    # Start-up samples (idle CPU, empty buffers) alone decide nothing.
    assert run({"warmup": "30s", **NO_VERTICAL}, cpu=0.05, seconds=25.0)[0].applied == []


def test_horizontal_enabled_key() -> None:
    assert "scale_out" in kinds(run({"horizontal": {"enabled": True}, **NO_VERTICAL}, cpu=0.95)[0])
    assert kinds(run({"horizontal": {"enabled": False}, **NO_VERTICAL}, cpu=0.95)[0]) == []


def test_metrics_name_key() -> None:
    hot_cpu_little_memory = {"cpu": 0.95, "rss": 0.1}
    by_cpu = run({"horizontal": {"metrics": [{"name": "cpu", "weight": 1}]}, **NO_VERTICAL}, **hot_cpu_little_memory)
    by_mem = run({"horizontal": {"metrics": [{"name": "memory", "weight": 1}]}, **NO_VERTICAL}, **hot_cpu_little_memory)
    assert kinds(by_cpu[0])[0] == "scale_out" and kinds(by_mem[0])[0] == "scale_in"


def test_metrics_weight_key() -> None:
    light = run(
        {"horizontal": {"metrics": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 0}]}, **NO_VERTICAL},
        cpu=0.9,
        rss=0.05,
    )
    heavy = run(
        {"horizontal": {"metrics": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 3}]}, **NO_VERTICAL},
        cpu=0.9,
        rss=0.05,
    )
    assert kinds(light[0])[0] == "scale_out" and kinds(heavy[0])[0] == "scale_in"  # L_u 0.9 vs 0.26


def test_metrics_aggregation_key() -> None:
    # One executor at 95 % CPU, one at 30 %: mean 0.625 (nothing to do), max 0.95 (scale out).
    def decide(aggregation: str) -> list[str]:
        scaling = {"horizontal": {"metrics": [{"name": "cpu", "weight": 1, "aggregation": aggregation}]}}
        job = parse_job_spec(
            job_text(
                replicas=2,
                data_pool="min_replicas: 1, max_replicas: 10, memory: 1Gi",
                top_level=yaml.safe_dump({"scaling": {**scaling, **NO_VERTICAL}}),
            )
        )
        scaler = DataPoolAutoscaler(job)
        fake = FakePool(2)
        driver = FakeDriver(fake, {"cpu": 0.3, "rss_bytes": 0.3 * GIB}, 10)
        driver.per_executor["data-0"] = {"cpu": 0.95}
        plane = SimpleNamespace(pool=fake, driver=driver, started_at=0.0, readers=dict, supervisor=None)
        for k in range(60):
            scaler.control(plane, k * 0.25)  # type: ignore[arg-type]
        return kinds(scaler)

    assert decide("mean") == [] and decide("max")[:1] == ["scale_out"]


def test_scale_up_threshold_key() -> None:
    assert kinds(run({"horizontal": {"scale_up_threshold": 0.8}, **NO_VERTICAL}, cpu=0.9)[0])[:1] == ["scale_out"]
    assert kinds(run({"horizontal": {"scale_up_threshold": 0.95}, **NO_VERTICAL}, cpu=0.9)[0]) == []


def test_scale_down_threshold_key() -> None:
    assert kinds(run({"horizontal": {"scale_down_threshold": 0.3}, **NO_VERTICAL}, cpu=0.2, n=4)[0])[:1] == ["scale_in"]
    assert kinds(run({"horizontal": {"scale_down_threshold": 0.1}, **NO_VERTICAL}, cpu=0.2, n=4)[0]) == []


def test_step_key() -> None:
    fixed = {"proportional": False}
    one = first(run({"horizontal": {**fixed, "step": 1}, **NO_VERTICAL}, cpu=0.95)[0], "scale_out")
    three = first(run({"horizontal": {**fixed, "step": 3}, **NO_VERTICAL}, cpu=0.95)[0], "scale_out")
    assert (one.delta, three.delta) == (1, 3)
    # Proportional: the least step.
    least = first(run({"horizontal": {"step": 4}, **NO_VERTICAL}, cpu=0.85)[0], "scale_out")
    assert least.delta == 4


def test_proportional_key_sizes_the_step_from_the_measurement() -> None:
    sized = first(run({"horizontal": {"proportional": True}, **NO_VERTICAL}, cpu=0.95, n=4)[0], "scale_out")
    fixed = first(run({"horizontal": {"proportional": False}, **NO_VERTICAL}, cpu=0.95, n=4)[0], "scale_out")
    assert sized.delta == 2 and fixed.delta == 1  # ceil(4 x 0.95 / 0.75) = 6
    unbounded = ControllerOptions(
        oom_restarts=False, cpu_quantum=1.0, fixed_roles=("training",), max_scale_in_fraction=1
    )
    shrink = first(
        run({"horizontal": {"proportional": True}, **NO_VERTICAL}, cpu=0.1, n=8, options=unbounded)[0], "scale_in"
    )
    assert shrink.delta == -6  # to ceil(8 x 0.1 / 0.75) = 2
    # At the defaults at most a tenth of the pool (at least step) stops at once: its tasks are read again.
    assert first(run({"horizontal": {"proportional": True}, **NO_VERTICAL}, cpu=0.1, n=8)[0], "scale_in").delta == -1


def vertical(**keys: Any) -> Resources:
    """The first resize's new resources: memory at 95 % of 1 GiB, horizontal off."""
    scaler, _ = run({"horizontal": {"enabled": False}, "vertical": keys}, rss=0.95, cpu=0.5)
    return first(scaler, "resize").new


def test_vertical_enabled_key() -> None:
    assert "resize" in kinds(run({"horizontal": {"enabled": False}}, rss=0.95)[0])
    assert kinds(run({"horizontal": {"enabled": False}, "vertical": {"enabled": False}}, rss=0.95)[0]) == []


def test_vertical_headroom_key() -> None:
    assert vertical(headroom=0.2).memory_bytes < vertical(headroom=0.5).memory_bytes


def test_vertical_min_change_key() -> None:
    # 95 % of 1 GiB + 20 % headroom: a 14 % change -- done at min_change 0.1, skipped at 0.5.
    assert vertical(min_change=0.1).memory_bytes > GIB
    assert "resize" not in kinds(run({"horizontal": {"enabled": False}, "vertical": {"min_change": 0.5}}, rss=0.95)[0])


def test_vertical_history_decay_key() -> None:
    # A fixed pool of 4-core executors using 1 core, then 3 from 4.5 s; the first resize (5 s) sizes
    # the CPU from the history weighed by history_decay: a slow decay remembers the 1-core past.
    def first_cpu(decay: float) -> float:
        job = parse_job_spec(
            job_text(
                replicas=1,
                data_pool="min_replicas: 1, max_replicas: 1, cpu: 4, memory: 1Gi",
                top_level=yaml.safe_dump(
                    {"scaling": {"horizontal": {"enabled": False}, "vertical": {"history_decay": decay, "headroom": 0}}}
                ),
            )
        )
        scaler = DataPoolAutoscaler(job)
        fake = FakePool(1, cores=4.0)
        metrics = {"cpu": 1.0, "rss_bytes": 0.5 * GIB}
        plane = SimpleNamespace(
            pool=fake, driver=FakeDriver(fake, metrics, 10), started_at=0.0, readers=dict, supervisor=None
        )
        for k in range(24):
            if k == 18:
                metrics["cpu"] = 3.0
            scaler.control(plane, k * 0.25)  # type: ignore[arg-type]
        return float(first(scaler, "resize").inputs["demand_cpu"])

    fast, slow = first_cpu(0.3), first_cpu(0.95)
    assert fast > 2.5 > 1.5 > slow


# ---------------------------------------------------------------------------------- the live rules
def test_trainer_wait_is_the_share_of_ticks_with_an_empty_queue_after_the_first_batch() -> None:
    wait = TrainerWait()
    wait.observe([0], yielded=0)  # starting: not counted
    assert wait.take() is None
    for sizes in ([0, 0], [2, 0], [0, 0], [0, 0]):
        wait.observe(sizes, yielded=5)
    assert wait.take() == 0.75 and wait.take() is None


def test_a_waiting_trainer_scales_the_pool_out_even_with_full_buffers_and_idle_cpu() -> None:
    """The live case of criterion 1: executors that serve slowly sit on full buffers at low CPU."""
    scaler, pool = run(NO_VERTICAL, cpu=0.05, fill=1.0, queued=0, seconds=6.0)
    out = first(scaler, "scale_out")
    assert "trainers wait" in out.reason and out.inputs["trainer_wait"] == 1.0 and out.delta == 2  # 2 / (1 - 0.5)
    assert len(pool.statuses) == 4
    # The trainers are observed, never scaled.
    assert all(d.role == "data" for d in scaler.applied)


def test_no_task_left_for_a_new_executor_means_no_scale_out() -> None:
    assert kinds(run(NO_VERTICAL, cpu=0.05, fill=0.0, queued=0, pending=0, seconds=30.0)[0]) == []


def test_a_trainer_that_is_the_bottleneck_scales_the_pool_in() -> None:
    scaler, pool = run(NO_VERTICAL, cpu=0.05, fill=1.0, queued=8, n=4, seconds=6.0)
    d = first(scaler, "scale_in")
    assert "fewer data executors" in d.reason and d.inputs["trainer_wait"] == 0.0
    assert d.delta == -1 and len(pool.statuses) == 3  # to 1 (the target), a tenth of the pool (at least step) at once


def test_a_busy_pool_that_is_ahead_is_not_grown() -> None:
    # CPU 95 % but full buffers and a trainer that never waits: more executors would add nothing.
    assert "scale_out" not in kinds(run(NO_VERTICAL, cpu=0.95, fill=1.0, queued=8, seconds=30.0)[0])
    # Without the trainer's report (no reader) the same busy pool grows: the load rule alone.
    assert "scale_out" in kinds(run(NO_VERTICAL, cpu=0.95, fill=0.5, queued=None, seconds=30.0)[0])


def test_the_load_is_the_demand_when_the_trainer_waits() -> None:
    # CPU 50 % and the trainer waiting half the time: L_u / (1 - w) = 1.0 > 0.8.
    scaler, _ = run(NO_VERTICAL, cpu=0.5, fill=0.5, queued=None, seconds=6.0)
    assert scaler.applied == []
    controller = run(NO_VERTICAL, cpu=0.5, fill=0.5, queued=0, seconds=6.0)[0].controller
    loads = [load for _, _, load, _ in controller.history["data"] if load is not None]
    assert loads[0] == pytest.approx(0.5 / (1 - 0.5))  # a half-idle pool: wait 1.0 counts as 0.5 (at most doubled)
    controller = run(NO_VERTICAL, cpu=0.9, fill=0.5, queued=0, seconds=6.0)[0].controller
    loads = [load for _, _, load, _ in controller.history["data"] if load is not None]
    assert loads[0] == pytest.approx(0.9 / (1 - 0.9))  # CPU-busy: a capacity shortfall, wait 1.0 counts as 0.9


def test_vertical_leaves_the_cpu_of_a_horizontally_scaled_pool_alone() -> None:
    quiet = {"horizontal": {"scale_up_threshold": 0.99, "scale_down_threshold": 0.01}}
    scaler, _ = run(quiet, cpu=0.2, rss=0.95, cores=4.0, pool="min_replicas: 1, max_replicas: 10, cpu: 4, memory: 1Gi")
    resize = first(scaler, "resize")
    assert resize.new.cpu == resize.old.cpu == 4.0 and resize.new.memory_bytes > GIB
    fixed_pool = run(quiet, cpu=0.2, rss=0.95, cores=4.0, pool="min_replicas: 2, max_replicas: 2, cpu: 4, memory: 1Gi")
    assert first(fixed_pool[0], "resize").new.cpu == 1.0  # 0.8 core used, whole cores
