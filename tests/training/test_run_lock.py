"""One run per run key (``primus_dagster.training.run_lock``): a second run fails at once naming the
first, a killed holder releases, and two ``primus-dagster train`` of one window cannot both train.

Child processes that hold a lock print a line once they hold it and then wait on their stdin; the
tests wait on that line (bounded by a deadline), never on time.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import mlflow
import psutil
import pytest
from jobkit import dev_train_command, make_job

from primus_dagster.training.run_lock import RunInProgressError, RunLock

KEY, URI, EXPERIMENT = "train-test/2026-11-01T00/2026-11-01T03", "sqlite:////nowhere/mlflow.db", "train-test"
LINE_TIMEOUT_S = 60.0

HOLDER = """
import os, sys
from primus_dagster.training.run_lock import RunLock
lock = RunLock(*sys.argv[1:4]).acquire()
lock.record_run("run-of-the-child")
if len(sys.argv) > 4:  # a forked grandchild that outlives the holder
    ready, tell = os.pipe()
    pid = os.fork()
    if pid == 0:  # past the fork hooks here
        os.write(tell, b"x")
        sys.stdin.read()
        os._exit(0)
    os.read(ready, 1)
    print("grandchild", pid, flush=True)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin (or kills us)
"""


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))  # the lock files go there (children inherit it)
    return tmp_path / "home"


def read_until(proc: subprocess.Popen[bytes], text: str, timeout_s: float = LINE_TIMEOUT_S) -> str:
    """What ``proc`` printed on stdout up to and including the first line holding ``text``; fails when the
    process ends or ``timeout_s`` passes first."""
    assert proc.stdout is not None
    fd, seen = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    while text.encode() not in seen or not seen.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, f"no line with {text!r} within {timeout_s:g} s; printed: {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"the process ended (rc {proc.wait(10)}) before printing {text!r}; printed: {seen!r}"
            seen += chunk
    return seen.decode()


@pytest.fixture
def holder() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start holder processes with ``start(*args)``; all are ended after the test (stdin closed, then killed)."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def start_holder(procs: list[subprocess.Popen[bytes]], *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, KEY, URI, EXPERIMENT, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    procs.append(proc)
    return proc


def test_a_second_lock_of_one_key_fails_naming_the_first_and_is_free_once_released(home: Path) -> None:
    first = RunLock(KEY, URI, EXPERIMENT).acquire()
    first.record_run("abc123")
    with pytest.raises(RunInProgressError) as refused:
        RunLock(KEY, URI, EXPERIMENT).acquire()
    message = str(refused.value)
    assert f"run {KEY!r}" in message and f"experiment {EXPERIMENT!r}" in message
    assert f"pid {os.getpid()} on host {socket.gethostname()}, started 20" in message
    assert "MLflow run abc123" in message and str(first.path) in message
    assert isinstance(refused.value, RuntimeError)  # the CLI's one-line error branch
    first.release()
    assert not first.path.exists()  # a released lock leaves nothing behind
    with RunLock(KEY, URI, EXPERIMENT) as again:
        assert again.held
    assert list((home / "locks").iterdir()) == []


def test_other_keys_stores_and_experiments_do_not_conflict() -> None:
    with RunLock(KEY, URI, EXPERIMENT):
        for other in [("train-test/other", URI, EXPERIMENT), (KEY, "sqlite:////else.db", EXPERIMENT), (KEY, URI, "x")]:
            with RunLock(*other) as lock:
                assert lock.held


def test_the_lock_is_released_when_the_run_raises_or_is_interrupted() -> None:
    for error in (RuntimeError("a failed run"), KeyboardInterrupt()):
        with pytest.raises(type(error)), RunLock(KEY, URI, EXPERIMENT):
            raise error
        with RunLock(KEY, URI, EXPERIMENT) as lock:
            assert lock.held


def test_a_lock_held_by_another_process_refuses_naming_it_until_it_ends(holder: list) -> None:
    child = start_holder(holder)
    read_until(child, "held")
    with pytest.raises(RunInProgressError, match=rf"pid {child.pid} on host .*MLflow run run-of-the-child"):
        RunLock(KEY, URI, EXPERIMENT).acquire()
    assert child.stdin is not None
    child.stdin.close()  # the holder ends normally: its lock goes with it
    assert child.wait(30) == 0
    with RunLock(KEY, URI, EXPERIMENT) as lock:
        assert lock.held


def test_a_sigkilled_holder_never_blocks_the_run_that_resumes_it(holder: list, home: Path) -> None:
    child = start_holder(holder)
    read_until(child, "held")
    with pytest.raises(RunInProgressError):
        RunLock(KEY, URI, EXPERIMENT).acquire()
    child.send_signal(signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL  # its lock file is left behind, unlocked
    assert len(list((home / "locks").iterdir())) == 1
    with RunLock(KEY, URI, EXPERIMENT) as lock:
        assert lock.held
    assert list((home / "locks").iterdir()) == []


def test_a_child_forked_from_the_holder_does_not_keep_the_lock(holder: list) -> None:
    child = start_holder(holder, "fork")
    printed = read_until(child, "held")
    grandchild = psutil.Process(int(re.search(r"grandchild (\d+)", printed)[1]))  # type: ignore[index]
    try:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        assert grandchild.is_running()  # alive, with a copy of the holder's descriptors but not its lock
        with RunLock(KEY, URI, EXPERIMENT) as lock:
            assert lock.held
    finally:
        assert child.stdin is not None
        child.stdin.close()  # the grandchild's stdin: it ends
        try:
            grandchild.wait(30)
        except psutil.TimeoutExpired:
            grandchild.kill()


@pytest.mark.integration
def test_a_second_train_of_one_window_exits_1_naming_the_first_which_finishes(tmp_path: Path, home: Path) -> None:
    env = make_job(tmp_path / "job", mode="mixed", model="single", every=8, rows_per_hour=1000)
    # The first holds its trainer after its first batch until the second was refused (the test removes the
    # file): mid-training, its lock held, exactly as long as the second takes, then it trains on to the end.
    pause = tmp_path / "hold-the-first"
    pause.touch()
    first = subprocess.Popen(
        [*dev_train_command(env, tmp_path / "samples.bin", slow_executors_ms=0), "--pause-while", str(pause)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    training, first_log = threading.Event(), []

    def drain() -> None:  # the first's run log, read all along (a full pipe would stall it)
        assert first.stderr is not None
        for line in first.stderr:
            first_log.append(line)
            if ": training (first step" in line:
                training.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert training.wait(120), "the first run did not start training:\n" + "".join(first_log)[-3000:]
        command = [str(Path(sys.executable).parent / "primus-dagster"), "train", str(env["job_path"]), "--hours", "3"]
        command += ["--data-root", str(env["root"]), "--executors", "2", "--no-eval"]
        second = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert first.poll() is None, "the first run ended while it was held"
        pause.unlink()
        out, _ = first.communicate(timeout=240)
    finally:
        pause.unlink(missing_ok=True)
        if first.poll() is None:
            first.kill()
            first.communicate(timeout=30)
        reader.join(30)
    assert first.returncode == 0, "".join(first_log)[-3000:]
    run_id = json.loads(out.strip().splitlines()[-1])["mlflow_run_id"]

    assert second.returncode == 1, second.stderr[-3000:]
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert errors[0].startswith(f"error: run '{KEY}' ")
    assert f"pid {first.pid} on host {socket.gethostname()}, started " in errors[0]
    assert f"MLflow run {run_id}" in errors[0]

    # one MLflow run of the window, trained by the first alone; its lock is gone with it
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    experiment = client.get_experiment_by_name(env["job"].tracking.experiment)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`primus.run_key` = '{KEY}'")
    assert [(r.info.run_id, r.info.status) for r in runs] == [(run_id, "FINISHED")]
    assert list((home / "locks").iterdir()) == []
