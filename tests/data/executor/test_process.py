"""Executor processes + Flight + RemoteReader against the real DataDriver served over Flight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from primus_dagster.data.driver import DataDriver, DriverClient, DriverServer
from primus_dagster.data.executor import ExecutorConfig, start_executor_process, wait_ready
from primus_dagster.data.executor.process import parse_args
from primus_dagster.data.reader.remote_reader import RemoteReader
from tests.data.executor.datakit import job_spec, job_text, plan, write_tree

pytestmark = pytest.mark.integration
TOKEN = "s3cret-token"


def stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout:
            proc.stdout.close()
    assert not any(psutil.pid_exists(p.pid) and psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE for p in procs)


def read_trainer(location: str, trainer: int, out: dict[int, list[int]], errors: list[BaseException]) -> None:
    try:
        with (
            DriverClient(location, token=TOKEN) as client,
            RemoteReader(client, trainer, token=TOKEN, refresh_s=0.1, prefetch=64) as reader,
        ):
            out[trainer] = [i for batch in reader for i in batch.sample_id.tolist()]
    except BaseException as exc:
        errors.append(exc)


def setup(tmp_path: Path, lease: str, batch_rows: int, rows: int) -> tuple[list[int], DataDriver, Path]:
    ids = write_tree(tmp_path, hours=2, files=3, rows=rows)
    (tmp_path / "job.yaml").write_text(job_text(batch_rows=batch_rows, trainers=2, lease=lease))
    job = job_spec(batch_rows=batch_rows, trainers=2, lease=lease)
    driver = DataDriver(max_attempts=5, lease_s=job.data.lease.total_seconds(), trainers=2)
    driver.add_tasks(plan(job, tmp_path))
    return ids, driver, tmp_path / "job.yaml"


def config(server: DriverServer, tmp_path: Path, spec: Path, i: int, **kw: object) -> ExecutorConfig:
    return ExecutorConfig(
        driver=server.location, executor_id=f"data-{i}", job_spec=str(spec), data_root=str(tmp_path), linger_s=0.5, **kw
    )  # type: ignore[arg-type]


def test_two_executor_processes_deliver_every_sample_once(tmp_path: Path) -> None:
    ids, driver, spec = setup(tmp_path, "4s", batch_rows=50, rows=300)
    procs: list[subprocess.Popen] = []
    with DriverServer(driver, token=TOKEN) as server:
        try:
            procs = [start_executor_process(config(server, tmp_path, spec, i), token=TOKEN) for i in range(2)]
            addresses = [wait_ready(p, timeout=30) for p in procs]
            assert all(a.startswith("grpc://127.0.0.1:") for a in addresses)
            out: dict[int, list[int]] = {}
            errors: list[BaseException] = []
            threads = [threading.Thread(target=read_trainer, args=(server.location, t, out, errors)) for t in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not errors, errors
            got = out[0] + out[1]
            assert sorted(got) == ids  # every sample once, across both trainers
            assert out[0] and out[1]
            assert [p.wait(20) for p in procs] == [0, 0]  # exit by themselves once the driver is done
            status = driver.status()
            assert status["done"] and status["counts"]["succeeded"] == 6
        finally:
            stop_all(procs)


def test_killed_executor_is_replaced_without_loss_or_duplicates(tmp_path: Path) -> None:
    ids, driver, spec = setup(tmp_path, "2s", batch_rows=50, rows=300)
    procs: list[subprocess.Popen] = []
    with DriverServer(driver, token=TOKEN) as server:
        try:
            victim = start_executor_process(
                config(server, tmp_path, spec, 0, slow_ms_per_batch=40, heartbeat_s=0.2), token=TOKEN
            )
            procs.append(victim)
            wait_ready(victim, timeout=30)
            out: dict[int, list[int]] = {}
            errors: list[BaseException] = []
            threads = [threading.Thread(target=read_trainer, args=(server.location, t, out, errors)) for t in (0, 1)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 20
            while driver.status()["claimed_batches"] < 10 and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(victim.pid, signal.SIGKILL)  # mid-stream, tasks half served
            victim.wait(10)
            survivor = start_executor_process(config(server, tmp_path, spec, 1, heartbeat_s=0.2), token=TOKEN)
            procs.append(survivor)
            wait_ready(survivor, timeout=30)
            for t in threads:
                t.join(60)
            assert not errors, errors
            got = out[0] + out[1]
            assert len(got) == len(set(got)) and sorted(got) == ids
            assert survivor.wait(20) == 0
            assert driver.status()["done"]
            infos = [driver.task_info(t.task_id) for t in plan(job_spec(), tmp_path)]
            assert any(i["attempts"] >= 2 and i["owner"] == "data-1" for i in infos)  # re-leased after the kill
        finally:
            stop_all(procs)


def test_sigterm_stops_an_executor_cleanly(tmp_path: Path) -> None:
    _, driver, spec = setup(tmp_path, "4s", batch_rows=50, rows=300)
    with DriverServer(driver, token=TOKEN) as server:
        proc = start_executor_process(config(server, tmp_path, spec, 0, drain_s=0.5), token=TOKEN)
        try:
            wait_ready(proc, timeout=30)
            time.sleep(0.3)  # it leases and fills its buffers; nobody reads
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
        finally:
            stop_all([proc])
        assert driver.status()["counts"]["succeeded"] == 0


def test_command_line_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ExecutorConfig(
        driver="grpc://127.0.0.1:1",
        executor_id="data-2",
        job_spec="j.yaml",
        data_root="/d",
        trainers=3,
        executor_index=5,
        slow_ms_per_batch=2.5,
    )
    monkeypatch.setenv("PRIMUS_DATA_TOKEN", "from-env")
    parsed, token = parse_args(cfg.argv())
    assert parsed == cfg and token == "from-env"
    assert parse_args([*cfg.argv(), "--token", "flag"])[1] == "flag"
    assert "from-env" not in cfg.argv()


def test_an_executor_process_does_not_import_pandas() -> None:
    """pyarrow's one look for pandas (its first conversion of a Python object) finds none in an executor
    (a quarter of its start-up); pandas used explicitly afterwards still works."""
    code = (
        "import sys, pyarrow as pa\n"
        "from primus_dagster.data.executor.process import without_pandas_lookup\n"
        "without_pandas_lookup()\n"
        "pa.array(['x']); pa.scalar(1.5); pa.array([1, None])\n"
        "assert 'pandas' not in sys.modules, 'pandas imported'\n"
        "import pandas\n"
        "assert pa.table({'a': [1, 2]}).to_pandas()['a'].sum() == 3\n"
        "assert pa.array(pandas.Series([1, 2])).type == pa.int64()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_executor_starts_with_one_blas_thread_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numpy's OpenBLAS pool would spin one thread per core at an executor's start (it does no linear
    algebra): the child gets ``OPENBLAS_NUM_THREADS=1``; a value in the caller's environment wins. The
    "interpreter" started is a script that prints what the executor would have read."""
    interpreter = tmp_path / "python"
    interpreter.write_text('#!/bin/sh\nprintf "%s\\n" "${OPENBLAS_NUM_THREADS-unset}"\n')
    interpreter.chmod(0o755)
    config = ExecutorConfig(driver="grpc://127.0.0.1:1", executor_id="data-0", job_spec="/j.yaml")

    def started_with(env: dict[str, str] | None = None) -> str:
        proc = start_executor_process(config, python=str(interpreter), env=env)
        out, _ = proc.communicate(timeout=60)
        return out.strip()

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert started_with() == "1"
    assert started_with({"PATH": os.environ["PATH"]}) == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    assert started_with() == "4"
