"""Scaling that never hurts, as pure logic (no process): vertical memory from peaks, floors that only
rise after an OOM kill, honest blame for kills the pool's own resize caused, no decisions from stalls,
a trainer wait that cannot blow the load up, bounded scale-in steps; the pool's errors as one line."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import pytest

from primus_dagster import cli
from primus_dagster.cluster import (
    ControllerOptions,
    ExecutorStatus,
    PoolError,
    Resources,
    Role,
    Sample,
    ScalingController,
)
from primus_dagster.cluster.supervisor import ExecutorFailedError, Supervisor, oom_by_scaling, restart_decision
from primus_dagster.data import DataAbortedError
from primus_dagster.spec import PoolSpec, ScalingSpec

MiB = 1 << 20
GIB = 1 << 30


def scaling(**kwargs: Any) -> ScalingSpec:
    base: dict[str, Any] = {"interval": "5s", "cooldown": "1s", "warmup": "0s"}
    return ScalingSpec.model_validate({**base, **kwargs})


def data_pool(**kwargs: Any) -> PoolSpec:
    return PoolSpec(**{"replicas": 2, "min_replicas": 1, "max_replicas": 4, "cpu": 1, "memory": "2Gi", **kwargs})


def running(n: int, memory: int = 2 * GIB, role: Role = "data", **kwargs: Any) -> list[ExecutorStatus]:
    return [ExecutorStatus(f"{role}-{i}", role, "running", Resources(1.0, memory), **kwargs) for i in range(n)]


def observe(controller: ScalingController, t: float, ids: list[str], *, cpu: float, rss: int, role: Role = "data"):
    for executor_id in ids:
        controller.observe(Sample(t, executor_id, role, Resources(1.0, 2 * GIB), cpu=cpu, rss_bytes=rss))


def resizes(decisions: list[Any]) -> dict[str, int]:
    return {d.executor_ids[0]: d.new.memory_bytes for d in decisions if d.kind == "resize"}


# ----------------------------------------------------------------------------- vertical from peaks
def test_memory_is_sized_from_the_peak_rss_not_the_mean_of_the_heartbeats() -> None:
    """The failed run: heartbeats said ~195 MiB, the kernel's high-water mark 332 MiB. The new limit
    covers the peak with the headroom (the mean-based 256 MiB killed both executors)."""
    controller = ScalingController(
        scaling(horizontal={"enabled": False}), {"data": data_pool(min_replicas=2, max_replicas=2)}
    )
    ids = ["data-0", "data-1"]
    for t in range(4):
        controller.update_status("data", running(2, rss_peak_bytes=332 * MiB), now=float(t))
        observe(controller, float(t), ids, cpu=0.46, rss=195 * MiB)
    decisions = controller.tick(4.0)
    assert resizes(decisions) and all(m >= 1.2 * 332 * MiB for m in resizes(decisions).values())


def test_a_shrink_never_goes_below_the_pools_peak_and_new_executors_start_at_it() -> None:
    """Executors of a pool pull the same task kinds: one executor's peak floors every shrink (it never
    pushes an executor up), and a scale-out starts at it -- no resize (a second start on pods) after."""
    controller = ScalingController(scaling(horizontal={"enabled": False}), {"data": data_pool()})
    for t in range(4):
        controller.update_status("data", running(2), now=float(t))
        observe(controller, float(t), ["data-0"], cpu=0.2, rss=100 * MiB)
        observe(controller, float(t), ["data-1"], cpu=0.2, rss=600 * MiB)
    sizes = resizes(controller.tick(4.0))
    assert sizes["data-0"] == sizes["data-1"] >= 1.2 * 600 * MiB
    grow = ScalingController(scaling(vertical={"enabled": True}), {"data": data_pool()})
    for t in range(4):
        grow.update_status("data", running(2), now=float(t))
        observe(grow, float(t), ["data-0", "data-1"], cpu=0.99, rss=600 * MiB)
    outs = [d for d in grow.tick(4.0) if d.kind == "scale_out"]
    assert outs and outs[0].new is not None and 1.2 * 600 * MiB <= outs[0].new.memory_bytes < 2 * GIB


def test_after_an_oom_kill_the_executors_memory_floor_only_rises() -> None:
    controller = ScalingController(
        scaling(horizontal={"enabled": False}), {"data": data_pool(min_replicas=1, max_replicas=1, replicas=1)}
    )
    killed = ExecutorStatus("data-0", "data", "oom_killed", Resources(1.0, 512 * MiB))
    controller.update_status("data", [killed], now=0.0)
    restarted = ExecutorStatus("data-0", "data", "running", Resources(1.0, 2 * GIB), attempt=1)
    for t in range(1, 6):
        controller.update_status("data", [restarted], now=float(t))
        observe(controller, float(t), ["data-0"], cpu=0.5, rss=100 * MiB)
    assert resizes(controller.tick(6.0)).get("data-0", 2 * GIB) == 2 * GIB  # 120 MiB would do; it keeps 2 GiB


# ----------------------------------------------------------------------------- honest blame
def test_an_oom_kill_below_a_memory_the_pool_lowered_blames_neither_node_nor_executor() -> None:
    spec = data_pool(max_restarts=0, restart="never", blacklist_after=1)
    shrunk = ExecutorStatus(
        "data-0", "data", "oom_killed", Resources(1.0, 300 * MiB), node="cpu0", resized_from=Resources(1.0, 2 * GIB)
    )
    assert oom_by_scaling(shrunk, spec)
    decision = restart_decision(shrunk, spec, restarts=0, run_active=True)
    assert (decision.action, decision.by_scaling) == ("restart", True)
    assert decision.resources == Resources(1.0, 2 * GIB)  # at least what it had before the resize
    assert "after the pool's resize from 2048 MiB" in decision.reason
    own = ExecutorStatus("data-0", "data", "oom_killed", Resources(1.0, 2 * GIB), node="cpu0")
    assert not oom_by_scaling(own, spec)
    assert restart_decision(own, spec, restarts=0, run_active=True).action == "fail_job"


class _Pool:
    """The two calls a Supervisor makes, on fixed statuses (no process: the rule is what is tested)."""

    role: Role = "data"

    def __init__(self, statuses: list[ExecutorStatus]):
        self.statuses = statuses
        self.restarted: list[tuple[str, Resources | None]] = []

    def status(self) -> list[ExecutorStatus]:
        return self.statuses

    def restart(self, executor_id: str, resources: Resources | None = None, *, avoid_nodes: Any = ()) -> None:
        self.restarted.append((executor_id, resources))


def test_the_supervisor_restarts_kills_by_resize_without_counting_them(caplog: pytest.LogCaptureFixture) -> None:
    lowered = Resources(1.0, 2 * GIB)
    pool = _Pool(
        [
            ExecutorStatus(
                f"data-{i}", "data", "oom_killed", Resources(1.0, 300 * MiB), node=f"cpu{i}", resized_from=lowered
            )
            for i in range(2)
        ]
    )
    supervisor = Supervisor(pool, data_pool(max_restarts=0, blacklist_after=1))  # type: ignore[arg-type]
    with caplog.at_level("WARNING"):
        supervisor.check()
    assert supervisor.blacklist == [] and sum(supervisor.restarts.values()) == 0
    assert [r for _, r in pool.restarted] == [lowered, lowered]
    assert len(supervisor.oom_kills_by_scaling) == 2
    named = [r for r in caplog.records if "after the pool's resize" in r.getMessage()]
    assert len(named) == 2 and len(caplog.records) == 2  # one warning per kill, and it names the resize


# ----------------------------------------------------------------------------- stalls and the wait term
def _with_trainer(**options: Any) -> ScalingController:
    pools = {
        "data": data_pool(replicas=4, max_replicas=8),
        "training": PoolSpec(replicas=1, min_replicas=1, max_replicas=1),
    }
    return ScalingController(scaling(), pools, options=ControllerOptions(fixed_roles=("training",), **options))


def _trainer(controller: ScalingController, t: float, wait: float) -> None:
    controller.observe(Sample(t, "training-0", "training", Resources(1.0, 2 * GIB), reader_wait=wait))


def test_the_trainer_wait_cannot_make_a_half_idle_pool_s_load_five() -> None:
    controller = _with_trainer()
    controller.update_status("data", running(4), now=0.0)
    controller.update_status("training", running(1, role="training"), now=0.0)
    observe(controller, 0.0, [f"data-{i}" for i in range(4)], cpu=0.55, rss=GIB)
    _trainer(controller, 0.0, 0.9)
    assert controller.views(0.0)["data"].load == pytest.approx(0.55 / 0.5)  # at most doubled, not 5.5
    observe(controller, 1.0, [f"data-{i}" for i in range(4)], cpu=0.95, rss=GIB)
    _trainer(controller, 1.0, 0.9)
    assert controller.views(1.0)["data"].load == pytest.approx(0.95 / 0.1)  # busy: a capacity shortfall


def test_a_stall_after_a_lost_executor_is_not_load_and_holds_scale_in() -> None:
    controller = _with_trainer(recovery_s=60.0)
    ids = [f"data-{i}" for i in range(4)]
    statuses = running(4)
    statuses[0] = ExecutorStatus("data-0", "data", "failed", Resources(1.0, 2 * GIB))
    controller.update_status("data", statuses, now=0.0)
    controller.update_status("training", running(1, role="training"), now=0.0)
    for t in (1.0, 6.0):
        observe(controller, t, ids, cpu=0.1, rss=GIB)
        _trainer(controller, t, 0.9)  # waiting on the lost executor's leased tasks
        assert controller.tick(t) == []  # neither a scale-out from the stall nor a scale-in from the idle CPU
    observe(controller, 70.0, ids, cpu=0.1, rss=GIB)
    _trainer(controller, 70.0, 0.0)
    controller.update_status("data", running(4), now=70.0)
    assert [d.kind for d in controller.tick(70.0)] == ["scale_in"]  # recovered: the idle pool shrinks


def test_with_no_task_pending_only_trainers_that_are_the_bottleneck_shrink_the_pool() -> None:
    """The end of a phase (no task waits for an executor): a stop sends its task to be read again. The
    trainers never wait and the buffers are full -- they are the bottleneck, the executors left have the
    time -- so the pool shrinks; with buffers draining (the executors only just keep up) it does not."""
    ids = [f"data-{i}" for i in range(4)]
    for fill, kinds in ((1.0, ["scale_in"]), (0.5, [])):
        controller = _with_trainer(recovery_s=0.0)
        controller.pending_tasks = 0
        controller.update_status("data", running(4), now=0.0)
        controller.update_status("training", running(1, role="training"), now=0.0)
        for executor_id in ids:
            controller.observe(
                Sample(0.0, executor_id, "data", Resources(1.0, 2 * GIB), cpu=0.05, rss_bytes=GIB, buffer_fill=fill)
            )
        _trainer(controller, 0.0, 0.0)
        decisions = [d for d in controller.tick(0.0) if d.kind in ("scale_in", "scale_out")]
        assert [d.kind for d in decisions] == kinds, (fill, decisions)
        assert all("fewer data executors" in d.reason for d in decisions)


def test_a_scale_in_stops_at_most_a_tenth_of_the_pool_at_once() -> None:
    pools = {"data": PoolSpec(replicas=100, min_replicas=1, max_replicas=100, cpu=1, memory="2Gi")}
    controller = ScalingController(scaling(vertical={"enabled": False}), pools)
    ids = [f"data-{i}" for i in range(100)]
    controller.update_status("data", running(100), now=0.0)
    observe(controller, 0.0, ids, cpu=0.05, rss=GIB)
    (decision,) = controller.tick(0.0)
    assert (decision.kind, decision.delta, len(decision.executor_ids)) == ("scale_in", -10, 10)


def test_a_busy_pool_whose_trainers_never_wait_is_not_short() -> None:
    """CPU at 99 % while the trainers never wait: the pool keeps up (it fills buffers or reads released
    tasks again); adding executors would be undone next."""
    controller = _with_trainer()
    ids = [f"data-{i}" for i in range(4)]
    controller.update_status("data", running(4), now=0.0)
    controller.update_status("training", running(1, role="training"), now=0.0)
    for executor_id in ids:
        controller.observe(
            Sample(0.0, executor_id, "data", Resources(1.0, 2 * GIB), cpu=0.99, rss_bytes=GIB, buffer_fill=0.5)
        )
    _trainer(controller, 0.0, 0.0)
    assert [d for d in controller.tick(0.0) if d.kind == "scale_out"] == []


def test_a_cpu_busy_pool_is_not_grown_past_the_cores_it_can_be_placed_on() -> None:
    """The local pool on 2 cores: two busy 1-core executors already hold them; a third would share them."""
    controller = _with_trainer()
    controller.host_cores["data"] = 2.0
    ids = ["data-0", "data-1"]
    controller.update_status("data", running(2), now=0.0)
    controller.update_status("training", running(1, role="training"), now=0.0)
    observe(controller, 0.0, ids, cpu=0.98, rss=GIB)
    _trainer(controller, 0.0, 0.4)
    assert [d for d in controller.tick(0.0) if d.kind == "scale_out"] == []
    # not CPU-bound (executors that wait on the transport): more executors are more streams
    for executor_id in ids:
        controller.observe(
            Sample(10.0, executor_id, "data", Resources(1.0, 2 * GIB), cpu=0.05, rss_bytes=GIB, buffer_fill=1.0)
        )
    _trainer(controller, 10.0, 0.4)
    assert [d.kind for d in controller.tick(10.0)] == ["scale_out"]


def test_memory_grows_between_scaling_ticks_from_the_pools_high_water_mark() -> None:
    controller = ScalingController(scaling(interval="60s", horizontal={"enabled": False}), {"data": data_pool()})
    for t in range(4):
        controller.update_status("data", running(2, memory=512 * MiB), now=float(t))
        observe(controller, float(t), ["data-0", "data-1"], cpu=0.5, rss=300 * MiB)
    controller.tick(4.0)  # a scaling tick: nothing to do yet
    controller.update_status("data", running(2, memory=512 * MiB, rss_peak_bytes=500 * MiB), now=5.0)
    grown = resizes(controller.tick(5.0))  # 55 s before the next scaling tick
    assert set(grown) == {"data-0", "data-1"} and min(grown.values()) >= 1.2 * 500 * MiB


@pytest.fixture(scope="module")
def _cli_error_imports() -> None:
    """The modules the command line's error path imports, imported before the test (MLflow's import
    sets environment variables of its own)."""
    importlib.import_module("primus_dagster.training.failed_tasks")


@pytest.mark.parametrize(
    "error",
    [
        DataAbortedError("data pool: every node is blacklisted (['cpu0', 'cpu1'])"),
        PoolError("data pool: every node is blacklisted (['cpu0', 'cpu1'])"),
        ExecutorFailedError("data-0", "data-0 failed (exit 3) | a log line | another"),
    ],
    ids=["DataAbortedError", "PoolError", "ExecutorFailedError"],
)
def test_an_aborted_data_plane_and_every_pool_error_end_as_one_line(
    error: Exception, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, _cli_error_imports: None
) -> None:
    """The failed run printed ``DataAbortedError: data pool: every node is blacklisted`` as a traceback;
    the command line reports it (and every pool error) as one line, exit 1."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # what the command sets: restored after the test

    def fail(args: argparse.Namespace) -> int:
        raise error

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=fail)
    assert cli.main([], parser) == 1
    err = capsys.readouterr().err
    assert err == f"error: {error}\n" and "Traceback" not in err
