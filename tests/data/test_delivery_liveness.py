"""Real executor processes (a local pool, ``tests.data.planekit``), two faults,
each sample trained exactly once:

* a client holding the Flight token takes 3 batches of trainer 0's stream and drops them: the driver's
  end-of-run audit finds them unclaimed and has them served again;
* one executor is SIGSTOPped mid-run: it loses its leases after ``data.lease``, its tasks are read by the
  other executor, the run log names it, and the reader ends within a bound instead of waiting for SIGCONT.

The bounds are generous and scale with the machine's load; the tests wait on events (claims, task states,
the reader's end), not on wall time.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pyarrow.flight as fl
import pytest

from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.data.flight_auth import bearer_options
from primus_dagster.data.flight_protocol import encode_ticket, split_meta
from primus_dagster.data.reader.remote_reader import RemoteReader
from primus_dagster.spec import parse_job_spec
from tests.bounds import load_scaled
from tests.data.executor.datakit import job_text, plan, write_tree
from tests.data.planekit import executor_pid, kill_executor, local_plane, local_pool

pytestmark = pytest.mark.integration

TOKEN = "s3cret-delivery"
LEASE_S = 2.0


def bound(seconds: float) -> float:
    """``seconds`` on an idle machine, longer on a loaded one (load per core above 1), at most 240 s."""
    return load_scaled(seconds, cap=240.0)


def wait_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + bound(seconds)
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {bound(seconds):.0f}s"
        time.sleep(0.02)


def world(tmp_path: Path) -> tuple[Path, list, list[int]]:
    ids = write_tree(tmp_path, hours=2, files=3, rows=300)
    spec = tmp_path / "job.yaml"
    spec.write_text(job_text(batch_rows=50, buffer_batches=2, task_runners=2, lease=f"{LEASE_S:g}s", replicas=2))
    return spec, plan(parse_job_spec(spec.read_text()), tmp_path, hours=2), ids


def read_all(reader: RemoteReader, seconds: float) -> Counter[int]:
    """Every sample id ``reader`` yields until the data ends; fails if that takes longer than the bound."""
    got: Counter[int] = Counter()
    ended = threading.Event()

    def consume() -> None:
        for batch in reader:
            assert batch.sample_id is not None
            got.update(batch.sample_id.tolist())
        ended.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    assert ended.wait(bound(seconds)), f"the reader did not end within {bound(seconds):.0f}s"
    thread.join(5)
    return got


def drop_batches(location: str, count: int) -> int:
    """A client with the token takes ``count`` batches of trainer 0's stream and drops them; their rows."""
    client = fl.connect(location)
    try:
        stream = client.do_get(fl.Ticket(encode_ticket(0)), bearer_options(TOKEN))
        rows = 0
        for _ in range(count):
            chunk = stream.read_chunk()
            split_meta(chunk.app_metadata)  # a real batch of the data plane
            rows += chunk.data.num_rows
        stream.cancel()
        return rows
    finally:
        client.close()


def test_batches_a_client_took_and_dropped_are_served_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec, tasks, ids = world(tmp_path)
    with local_plane(spec, tmp_path, tasks, executors=2, token=TOKEN, heartbeat_s=0.2) as plane:
        wait_for(lambda: len(plane.driver.executors()) == 2, 30, "both executors registering")
        location = sorted(r.address for r in plane.driver.executors().values())[0]
        assert drop_batches(location, 3) == 150  # before any trainer reads: they reach no reader
        with caplog.at_level(logging.WARNING, logger="primus_dagster.data.driver.state"), plane.reader(0) as reader:
            got = read_all(reader, 60)
        plane.raise_if_failed()
        status = plane.driver.status()
        reopened = [plane.driver.task_info(t.task_id) for t in tasks]
    assert got == Counter(ids)  # every sample once: the dropped ones too
    assert status["done"] and status["claimed_batches"] == len(ids) // 50
    audited = [info for info in reopened if info["error"] and "never claimed" in info["error"]]
    assert audited and all(info["state"] == "succeeded" for info in audited)
    assert any("delivery audit" in r.getMessage() for r in caplog.records)


def serving(plane: PooledDataPlane, tasks: list, executor_id: str) -> bool:
    """The reader has claimed a few batches and ``executor_id`` holds the lease of a running task."""
    if plane.driver.status()["claimed_batches"] < 4:
        return False
    infos = (plane.driver.task_info(t.task_id) for t in tasks)
    return any(i["state"] == "running" and i["owner"] == executor_id for i in infos)


def test_a_sigstopped_executor_loses_its_leases_and_the_run_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec, tasks, ids = world(tmp_path)
    slow = {0: 20.0, 1: 20.0}  # a few seconds of serving: the stop lands mid-run
    plane = local_plane(spec, tmp_path, tasks, executors=2, heartbeat_s=0.2, slow_ms_per_batch=slow)
    try:
        with plane, caplog.at_level(logging.WARNING), plane.reader(0, refresh_s=0.1) as reader:
            victim = psutil.Process(executor_pid(plane, 1))
            wait_for(lambda: serving(plane, tasks, "data-1"), 60, "data-1 serving a leased task")
            kill_executor(plane, 1, signal.SIGSTOP)
            got = read_all(reader, 90)
            status = plane.driver.status()
            assert victim.status() == psutil.STATUS_STOPPED  # still frozen: the run did not wait for it
        # The plane's close killed it at once: silent, it would not act on SIGTERM.
        assert local_pool(plane).executor("data-1").exit_code == -signal.SIGKILL
    finally:
        if plane.pool is not None and local_pool(plane).executor("data-1").exit_code is None:
            kill_executor(plane, 1, signal.SIGCONT)  # the test failed: let the plane's close stop it as any other
        plane.close()
    assert got == Counter(ids)
    assert status["done"] and "data-1" in status["silent_executors"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("executor data-1 is silent" in m for m in messages), messages
    assert any("executor grpc://" in m and "is silent and the data is done" in m for m in messages), messages
