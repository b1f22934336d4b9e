"""The Flight dataset server in process: streams end cleanly, tokens, tickets, slow serving."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow.flight as fl
import pytest

from primus_dagster.data.executor import DataExecutor
from primus_dagster.data.flight_auth import bearer_options
from primus_dagster.data.flight_protocol import decode_ticket, encode_ticket, split_meta
from primus_dagster.data.reader.remote_reader import RemoteReader
from tests.data.executor.datakit import FakeDriver, job_spec, plan, write_tree


def read_stream(location: str, trainer: int, token: str | None = None) -> list[tuple[list[int], dict]]:
    client = fl.connect(location)
    try:
        reader = client.do_get(fl.Ticket(encode_ticket(trainer)), bearer_options(token))
        out = []
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return out
            out.append((chunk.data.column("sample_id").to_pylist(), json.loads(bytes(chunk.app_metadata))))
    finally:
        client.close()


def test_do_get_streams_each_trainer_until_done(tmp_path: Path) -> None:
    ids = write_tree(tmp_path, hours=2, files=2, rows=120)
    job = job_spec(batch_rows=50, trainers=2, buffer_batches=2)
    driver = FakeDriver(plan(job, tmp_path))
    with DataExecutor(driver, job, "data-0", str(tmp_path), heartbeat_s=0.05) as executor:
        assert executor.location.startswith("grpc://127.0.0.1:")
        results: dict[int, list] = {}
        threads = [
            threading.Thread(target=lambda t=t: results.__setitem__(t, read_stream(executor.location, t)))
            for t in (0, 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads), "streams must end once the driver is done"
    got = [i for t in (0, 1) for ids_, _ in results[t] for i in ids_]
    assert sorted(got) == sorted(ids)
    assert results[0] and results[1]  # rebalance fed both trainers
    meta = results[0][0][1]
    assert set(meta) == {"task_id", "first_row", "rows", "stream", "kind", "source"}
    assert meta["kind"] == "batch" and meta["stream"] == "history" and meta["source"] == "src"
    assert all(r.state == "succeeded" for r in driver.tasks.values())


def test_token_is_required_and_checked(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=20)
    job = job_spec(batch_rows=10)
    driver = FakeDriver(plan(job, tmp_path, hours=1))
    with DataExecutor(driver, job, "data-0", str(tmp_path), token="s3cret", heartbeat_s=0.05) as executor:
        for bad in (None, "wrong"):
            with pytest.raises(fl.FlightUnauthenticatedError):
                read_stream(executor.location, 0, bad)
        reader = RemoteReader(driver, 0, [executor.location], token="nope")
        with pytest.raises(RuntimeError, match="rejected the token"):
            reader.next_batch(timeout=10)
        reader.close()
        got = read_stream(executor.location, 0, "s3cret")
    assert sorted(i for ids_, _ in got for i in ids_) == list(range(20))


def test_bad_tickets_are_rejected(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=5)
    job = job_spec()
    with DataExecutor(
        FakeDriver(plan(job, tmp_path, hours=1)), job, "data-0", str(tmp_path), heartbeat_s=0.05
    ) as executor:
        client = fl.connect(executor.location)
        for ticket in (b"nope", b'{"trainer": 7}', b'{"trainer": "0"}'):
            with pytest.raises(fl.FlightServerError, match="bad ticket"):
                client.do_get(fl.Ticket(ticket)).read_all()
        client.close()
    with pytest.raises(ValueError, match=r"0\.\.1"):
        decode_ticket(b'{"trainer": 2}', 2)
    with pytest.raises(ValueError, match="app_metadata"):
        split_meta(None)


def test_slow_ms_per_batch_slows_serving(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=100)
    job = job_spec(batch_rows=10)
    with DataExecutor(
        FakeDriver(plan(job, tmp_path, hours=1)), job, "data-0", str(tmp_path), heartbeat_s=0.05, slow_ms_per_batch=30
    ) as executor:
        start = time.monotonic()
        got = read_stream(executor.location, 0)
        elapsed = time.monotonic() - start
    assert len(got) == 10 and elapsed >= 0.3


def test_empty_job_ends_streams_with_no_batches(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=5)
    job = job_spec()
    driver = FakeDriver(plan(job, tmp_path, hours=1))
    driver.claimed = {t: {0} for t in driver.claimed}  # everything already claimed: nothing to serve
    with DataExecutor(driver, job, "data-0", str(tmp_path), heartbeat_s=0.05) as executor:
        assert read_stream(executor.location, 0) == []
