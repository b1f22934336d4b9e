"""LocalPool and Supervisor on real processes: placement, limits, exits, restart policies, blacklist,
CPU seconds with and without start-ups, signals, log directories."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from primus_dagster.cluster import PoolError, Resources
from primus_dagster.cluster.local import LaunchRequest, LocalPool
from primus_dagster.cluster.pool import ResizeNotApplied
from primus_dagster.cluster.supervisor import ExecutorFailedError, Supervisor, restart_decision
from primus_dagster.spec import PoolSpec

pytestmark = pytest.mark.integration

# Behaviour per attempt: "sleep" (runs until stopped), "exit0", "fail" (exit 3 after a message),
# "grow" (allocates 400 MiB, then sleeps). Modes are "a,b,c": attempt i uses the i-th (the last repeats).
WORKER = """
import os, sys, time
modes = sys.argv[1].split(",")
mode = modes[min(int(sys.argv[2]), len(modes) - 1)]
print("threads", os.environ.get("OMP_NUM_THREADS"), flush=True)
if mode == "exit0":
    sys.exit(0)
if mode == "fail":
    print("disk on fire", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "grow":
    hog = bytearray(400 << 20)
time.sleep(120)
"""


def launcher(modes: str) -> Callable[[LaunchRequest], subprocess.Popen[str]]:
    def launch(request: LaunchRequest) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", WORKER, modes, str(request.attempt)],
            env={**os.environ, **request.env},
            stdout=subprocess.PIPE,
            stderr=request.stderr,
            text=True,
        )

    return launch


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def spec(**kwargs: object) -> PoolSpec:
    return PoolSpec(**{"replicas": 1, "min_replicas": 0, "max_replicas": 4, "memory": "256Mi", **kwargs})


def test_processes_get_cores_threads_and_leave_nothing_behind() -> None:
    pool = LocalPool("data", spec(cpu=1.0), launcher("sleep"), cpus=[0])
    ids = pool.launch(2)
    assert ids == ["data-0", "data-1"]
    pids = [pool.pid(i) for i in ids]
    assert all(psutil.Process(pid).cpu_affinity() == [0] for pid in pids)
    assert [s.state for s in pool.status()] == ["running", "running"]
    assert pool.executor("data-0").node == "cpu0"
    pool.resize("data-0", Resources(cpu=1.0, memory_bytes=512 << 20))
    assert pool.executor("data-0").resources.memory_bytes == 512 << 20
    pool.stop("data-1", grace_s=2)
    assert pool.executor("data-1").state == "stopped"
    pool.close(grace_s=2)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    assert pool.cpu_seconds() >= 0.0


def test_an_executor_above_its_memory_is_oom_killed_and_a_failure_keeps_its_error() -> None:
    with LocalPool("data", spec(memory="128Mi"), launcher("grow")) as pool:
        (grower,) = pool.launch(1)
        wait_for(lambda: pool.executor(grower).state == "oom_killed")
        assert "above its memory allocation 128 MiB" in (pool.executor(grower).last_error or "")
    with LocalPool("data", spec(), launcher("fail")) as pool:
        (failing,) = pool.launch(1)
        wait_for(lambda: pool.executor(failing).state == "failed")
        status = pool.executor(failing)
        assert status.exit_code == 3 and "disk on fire" in (status.last_error or "")


def test_a_memory_limit_below_what_the_executor_already_used_is_not_applied_in_place() -> None:
    """The watcher reports each attempt's peak RSS (the kernel's high-water mark); a resize below it would
    kill the executor the next time it needs that much, so it is refused and the executor keeps its
    allocation; a lower limit above the peak applies, and is remembered as a resize's doing."""
    with LocalPool("data", spec(memory="1Gi"), launcher("grow")) as pool:
        (grower,) = pool.launch(1)
        wait_for(lambda: pool.executor(grower).rss_peak_bytes >= 400 << 20)
        peak = pool.executor(grower).rss_peak_bytes
        with pytest.raises(ResizeNotApplied, match=r"below the \d+ MiB its running attempt already used"):
            pool.resize(grower, Resources(cpu=1.0, memory_bytes=256 << 20))
        status = pool.executor(grower)
        assert (status.state, status.resources.memory_bytes, status.resized_from) == ("running", 1 << 30, None)
        pool.resize(grower, Resources(cpu=1.0, memory_bytes=peak + (64 << 20)))
        status = pool.executor(grower)
        assert status.shrunk_by_pool and status.resized_from == Resources(1.0, 1 << 30)
        pool.resize(grower, Resources(cpu=1.0, memory_bytes=1 << 30))
        assert pool.executor(grower).resized_from is None and pool.executor(grower).state == "running"


def test_on_failure_restarts_until_max_restarts_then_fails_the_job_with_the_last_error() -> None:
    with LocalPool("data", spec(restart="on_failure", max_restarts=2), launcher("fail")) as pool:
        supervisor = Supervisor(pool, pool.spec)
        pool.launch(1)
        with pytest.raises(ExecutorFailedError, match=r"ended 3 times \(max_restarts 2\).*disk on fire"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                supervisor.check()
                time.sleep(0.05)
        assert supervisor.restarts["data-0"] == 2 and pool.executor("data-0").attempt == 2


def test_never_fails_at_once_and_always_restarts_after_success() -> None:
    with LocalPool("data", spec(restart="never"), launcher("fail")) as pool:
        supervisor = Supervisor(pool, pool.spec)
        pool.launch(1)
        wait_for(lambda: pool.executor("data-0").finished)
        with pytest.raises(ExecutorFailedError, match="restart policy never"):
            supervisor.check()
    with LocalPool("data", spec(restart="always"), launcher("exit0,sleep")) as pool:
        supervisor = Supervisor(pool, pool.spec)
        pool.launch(1)
        wait_for(lambda: pool.executor("data-0").finished)
        assert [d.action for d in supervisor.check()] == ["restart"]
        assert pool.executor("data-0").state == "running" and pool.executor("data-0").attempt == 1
        assert supervisor.check(run_active=False) == []
    with LocalPool("data", spec(restart="on_failure"), launcher("exit0")) as pool:
        supervisor = Supervisor(pool, pool.spec)
        pool.launch(1)
        wait_for(lambda: pool.executor("data-0").finished)
        assert supervisor.check() == []  # a success is not restarted on_failure


def test_an_oom_killed_executor_comes_back_with_more_memory_up_to_the_cap() -> None:
    with LocalPool(
        "data", spec(memory="128Mi", oom_memory_factor=2.0, max_memory="1Gi"), launcher("grow,sleep")
    ) as pool:
        supervisor = Supervisor(pool, pool.spec)
        pool.launch(1)
        wait_for(lambda: pool.executor("data-0").state == "oom_killed")
        (decision,) = supervisor.check()
        assert decision.action == "restart" and decision.resources == Resources(1.0, 256 << 20)
        assert pool.executor("data-0").resources.memory_bytes == 256 << 20
    capped = pool.executor("data-0")
    capped.resources = Resources(1.0, 768 << 20)
    capped.state = "oom_killed"
    assert restart_decision(capped, pool.spec, 0, run_active=True).resources == Resources(1.0, 1 << 30)


def test_a_node_with_repeated_failures_is_blacklisted() -> None:
    with LocalPool(
        "data", spec(restart="on_failure", max_restarts=3, blacklist_after=1), launcher("fail,sleep"), cpus=[0, 1]
    ) as pool:
        supervisor = Supervisor(pool, pool.spec)
        pool.launch(1)
        first_node = pool.executor("data-0").node
        wait_for(lambda: pool.executor("data-0").finished)
        supervisor.check()
        assert supervisor.blacklist == [first_node]
        restarted = pool.executor("data-0")
        assert restarted.state == "running" and restarted.node != first_node
        assert pool.launch(1, avoid_nodes=supervisor.blacklist) and pool.executor("data-1").node != first_node


def test_cpu_key_sets_the_cores_and_thread_counts_of_an_executor() -> None:
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        pytest.skip("needs two usable cores")
    with LocalPool("data", spec(cpu=2.0), launcher("sleep"), cpus=usable[:2]) as pool:
        (wide,) = pool.launch(1)
        assert psutil.Process(pool.pid(wide)).cpu_affinity() == usable[:2]
        (narrow,) = pool.launch(1, Resources(cpu=1.0, memory_bytes=256 << 20))
        assert len(psutil.Process(pool.pid(narrow)).cpu_affinity()) == 1
        proc = psutil.Process(pool.pid(wide))
        assert proc.environ().get("OMP_NUM_THREADS") == "2"


def test_a_pool_with_every_node_blacklisted_fails_the_job() -> None:
    with LocalPool(
        "data", spec(restart="on_failure", max_restarts=3, blacklist_after=1), launcher("fail"), cpus=[0]
    ) as pool:
        supervisor = Supervisor(pool, pool.spec)
        pool.launch(1)
        wait_for(lambda: pool.executor("data-0").finished)
        with pytest.raises(PoolError, match=r"every node is blacklisted \(\['cpu0'\]\)"):
            supervisor.check()


# Spends CPU before it announces it is ready (an executor's start-up: interpreter, imports), then sleeps.
STARTUP_WORKER = """
import time
while time.process_time() < 0.3:
    pass
print("ready", flush=True)
time.sleep(120)
"""


def ready_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def startup_launcher(request: LaunchRequest) -> subprocess.Popen[str]:
    env = {**os.environ, **request.env}
    return subprocess.Popen(
        [sys.executable, "-c", STARTUP_WORKER], env=env, stdout=subprocess.PIPE, stderr=request.stderr, text=True
    )


def test_cpu_seconds_keep_each_attempts_start_up_apart_and_a_signal_is_a_crash() -> None:
    with LocalPool("data", spec(), startup_launcher, ready=ready_line) as pool:
        (executor,) = pool.launch(1)
        assert pool.executor(executor).address == "ready"
        startup = pool.cpu_seconds() - pool.cpu_seconds(include_startup=False)
        assert startup >= 0.25 and pool.cpu_seconds(include_startup=False) < 0.25  # it sleeps once ready (clock ticks)
        pool.send_signal(executor, signal.SIGKILL)
        wait_for(lambda: pool.executor(executor).state == "failed")
        assert pool.executor(executor).exit_code == -signal.SIGKILL
        pool.restart(executor)  # its second start-up adds to the first
        assert pool.cpu_seconds() - pool.cpu_seconds(include_startup=False) >= 0.5
        pool.send_signal(executor, signal.SIGSTOP)  # a frozen process: alive, stopped
        wait_for(lambda: psutil.Process(pool.pid(executor)).status() == psutil.STATUS_STOPPED)
        pool.send_signal(executor, signal.SIGCONT)
        pool.close(grace_s=2)
        assert pool.executor(executor).state == "stopped"
        pool.send_signal(executor, signal.SIGKILL)  # exited: nothing to signal, no error


def test_a_log_directory_left_by_a_killed_pool_is_removed_by_the_next_one() -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    root = Path(tempfile.gettempdir())
    stale = root / f"primus-data-{int(gone.stdout)}-left"
    stale.mkdir()
    mine = Path(tempfile.mkdtemp(prefix=f"primus-data-{os.getpid()}-", dir=root))  # a live pool's: kept
    try:
        with LocalPool("data", spec(), launcher("sleep")) as pool:
            assert not stale.exists() and mine.is_dir()
            assert pool.log_dir.name.startswith(f"primus-data-{os.getpid()}-")
        assert not pool.log_dir.exists()  # its own, removed at close
    finally:
        mine.rmdir()
        if stale.exists():
            stale.rmdir()
