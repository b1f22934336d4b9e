"""The shared-memory fast path: slot lifecycle, no leaked files, fallbacks, and end to end."""

from __future__ import annotations

import errno
import gc
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from primus_dagster.data import BatchMeta
from primus_dagster.data.driver import DataDriver, DriverServer
from primus_dagster.data.executor import DataExecutor, ExecutorConfig, start_executor_process, wait_ready
from primus_dagster.data.flight_protocol import encode_ticket, parse_ticket, split_meta, with_shm
from primus_dagster.data.reader.remote_reader import RemoteReader
from primus_dagster.data.shm.slot_reader import ShmClient, ShmError, connect_shm, is_local
from primus_dagster.data.shm.slots import (
    FREE,
    LOCK_NAME,
    PROBE_NAME,
    RECEIVED,
    SENT,
    ShmDir,
    SlotPool,
    remove_if_dead,
    sweep_stale,
)
from tests.data.executor.datakit import FakeDriver, job_spec, job_text, plan, wait_until, write_tree

META = {LOCK_NAME, PROBE_NAME}


@pytest.fixture
def shm_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A private root for executor directories (on tmpfs when there is one); must end up empty."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    root = base / f"primus-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    monkeypatch.setenv("PRIMUS_SHM_DIR", str(root))
    monkeypatch.delenv("PRIMUS_SHM", raising=False)
    try:
        yield root
        gc.collect()
        assert sorted(p.name for p in root.iterdir()) == [], "leaked shared-memory files"
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def batch(n: int = 1000, first: int = 0) -> pa.RecordBatch:
    dense = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 3, dtype=np.float32)), 3)
    return pa.RecordBatch.from_pydict({"sample_id": pa.array(np.arange(first, first + n)), "dense": dense})


def slot_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in META) if directory.exists() else []


# ----------------------------------------------------------------------------- unit: slots and leases
def test_write_read_release_reuse_and_close(shm_root: Path) -> None:
    shm = ShmDir()
    assert shm.path.parent == shm_root and (shm.path / PROBE_NAME).read_text() == shm.nonce
    pool = SlotPool(shm, max_slots=2, max_inflight=2)
    client = ShmClient(shm.path)
    desc, slot = pool.put(batch(1000))  # type: ignore[misc]
    assert slot.state() == SENT and slot_files(shm.path) == [desc["file"]] and pool.inflight() == 1
    got = client.read(desc)
    assert slot_files(shm.path) == []  # the reader unlinked the file once it had mapped it
    assert slot.state() == RECEIVED and pool.received(slot, desc["seq"]) and pool.inflight() == 0
    assert got.equals(batch(1000))
    view = got.column("dense").values.to_numpy()  # a zero-copy view keeps the slot reserved
    assert view.base is not None
    del got
    gc.collect()
    assert slot.state() == RECEIVED
    del view
    gc.collect()
    assert slot.state() == FREE
    desc2, slot2 = pool.put(batch(500, first=7))  # type: ignore[misc]
    assert slot2 is slot and desc2["file"] == desc["file"] and desc2["seq"] == desc["seq"] + 1  # reused
    kept = client.read(desc2)
    pool.close()
    shm.close()
    assert not shm.path.exists()
    assert kept.column("sample_id").to_pylist() == list(range(7, 507))  # still mapped after both closed
    client.close()


def test_held_batches_exhaust_the_pool_then_inline(shm_root: Path) -> None:
    shm = ShmDir()
    pool = SlotPool(shm, max_slots=2, max_inflight=4)
    client = ShmClient(shm.path)
    held = [client.read(pool.put(batch(100, first=i * 100))[0]) for i in range(2)]  # type: ignore[index]
    assert pool.put(batch(100)) is None and pool.inline_batches == 1  # no free slot: send inline
    assert pool.shm_batches == 2
    del held
    gc.collect()
    assert pool.put(batch(100)) is not None
    pool.close()
    shm.close()


def test_a_larger_batch_replaces_a_free_slot(shm_root: Path) -> None:
    shm = ShmDir()
    pool = SlotPool(shm, max_slots=1)
    client = ShmClient(shm.path)
    first, _ = pool.put(batch(10))  # type: ignore[misc]
    small = client.read(first)
    del small
    gc.collect()
    big_desc, big_slot = pool.put(batch(200_000))  # type: ignore[misc]
    assert big_desc["slot"] == first["slot"] and big_desc["file"] != first["file"]
    assert big_slot.size >= big_desc["length"]
    assert client.read(big_desc).num_rows == 200_000
    pool.close()
    shm.close()


def test_batches_go_into_a_fitting_slot_without_a_dry_run(shm_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first batch, a free slot sized for the largest batch is written at once; a batch that
    does not fit it is sized (the IPC dry run) and gets a larger slot -- either way the same bytes."""
    import primus_dagster.data.shm.slots as slots

    sized: list[int] = []
    real = slots.ipc_size
    monkeypatch.setattr(slots, "ipc_size", lambda b: sized.append(b.num_rows) or real(b))
    shm = ShmDir()
    pool = SlotPool(shm, max_slots=1)
    client = ShmClient(shm.path)
    for n, first in ((1000, 0), (900, 5), (50_000, 9)):
        desc, _ = pool.put(batch(n, first))  # type: ignore[misc]
        assert desc["length"] == real(batch(n, first))
        got = client.read(desc)
        assert got.equals(batch(n, first))
        del got
        gc.collect()
    assert sized == [1000, 50_000]  # the first batch and the one too large for the slot; not the 900
    pool.close()
    shm.close()


def test_a_new_slot_fits_the_largest_batch_so_far(shm_root: Path) -> None:
    # A task's short last batch must not get a small slot that the next full batch replaces again.
    shm = ShmDir()
    pool = SlotPool(shm, max_slots=2)
    client = ShmClient(shm.path)
    big_desc, _ = pool.put(batch(100_000))  # type: ignore[misc]
    held = client.read(big_desc)  # the reader holds it: the next batch needs a new slot
    small_desc, small_slot = pool.put(batch(10))  # type: ignore[misc]
    assert small_desc["slot"] != big_desc["slot"] and small_slot.size >= big_desc["length"]
    assert held.num_rows == 100_000
    pool.close()
    shm.close()


def test_no_space_falls_back_inline(shm_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shm = ShmDir()
    pool = SlotPool(shm)

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert pool.put(batch()) is None and pool.put(batch()) is None
    assert slot_files(shm.path) == []  # the half-created file is gone
    pool.close()
    shm.close()


def test_reader_rejects_stale_or_missing_slots(shm_root: Path) -> None:
    shm = ShmDir()
    pool = SlotPool(shm)
    client = ShmClient(shm.path)
    desc, _ = pool.put(batch())  # type: ignore[misc]
    with pytest.raises(ShmError, match="does not hold batch"):
        client.read({**desc, "seq": desc["seq"] + 5})
    with pytest.raises(ShmError, match="gone"):  # e.g. the executor ended the stream and removed it
        ShmClient(shm.path).read({**desc, "file": "s0-9-9", "slot": 9})
    with pytest.raises(ValueError, match="slot name"):
        client.read({**desc, "file": "../etc"})
    pool.close()
    shm.close()


# ----------------------------------------------------------------------------- unit: directories, sweeping
def test_dead_owner_directories_are_swept(shm_root: Path) -> None:
    code = (
        "import sys, time; from primus_dagster.data.shm.slots import ShmDir, SlotPool; import pyarrow as pa;"
        "d = ShmDir(); p = SlotPool(d); p.put(pa.record_batch({'x': pa.array(range(100))}));"
        "print(d.path, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PRIMUS_SHM_DIR": str(shm_root)},
    )
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().strip())
    live = ShmDir()
    assert len(slot_files(path)) == 1
    assert not remove_if_dead(path) and sweep_stale(shm_root) == []  # its owner is alive: kept
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert path.exists()  # SIGKILL: nobody cleaned up ...
    assert sweep_stale(shm_root) == [path.name] and not path.exists()  # ... until the next sweep
    assert live.path.exists()  # never a live owner's
    live.close()


def test_a_new_executor_directory_sweeps_stale_ones(shm_root: Path) -> None:
    stale = shm_root / "primus-data-1-dead"
    stale.mkdir()
    (stale / LOCK_NAME).touch()  # nobody holds the lock: a dead owner
    (stale / "s0-0-0").write_bytes(b"x" * 100)
    fresh = ShmDir()
    assert not stale.exists()
    fresh.close()


# ----------------------------------------------------------------------------- wire
def test_ticket_and_metadata() -> None:
    assert parse_ticket(encode_ticket(1, shm=True), 2) == (1, True)
    assert parse_ticket(encode_ticket(1), 2) == (1, False)
    with pytest.raises(ValueError, match="shm"):
        parse_ticket(b'{"trainer": 0, "shm": "yes"}', 1)
    meta = BatchMeta("t", 0, 10, "s", "batch", "src")
    desc = {"slot": 0, "file": "s0-0-0", "seq": 1, "length": 99}
    assert split_meta(with_shm(meta.encode(), desc)) == (meta, desc)
    assert split_meta(meta.encode()) == (meta, None)
    assert is_local("grpc://127.0.0.1:1") and is_local("grpc+tcp://localhost:1") and is_local("grpc://[::1]:1")
    assert is_local("grpc+unix:///tmp/s") and not is_local("grpc://10.1.2.3:1") and not is_local("grpc://example:1")


# ----------------------------------------------------------------------------- with a Flight server
def run_executor(tmp_path: Path, **kw: object) -> tuple[list[int], FakeDriver, DataExecutor]:
    ids = write_tree(tmp_path, hours=2, files=2, rows=120)
    job = job_spec(batch_rows=25, buffer_batches=2)
    driver = FakeDriver(plan(job, tmp_path))
    return ids, driver, DataExecutor(driver, job, "data-0", str(tmp_path), heartbeat_s=0.05, **kw)  # type: ignore[arg-type]


def test_reader_gets_everything_through_shared_memory(shm_root: Path, tmp_path: Path) -> None:
    ids, driver, executor = run_executor(tmp_path)
    with executor:
        assert executor.server is not None and executor.server.shm is not None
        directory = executor.server.shm.path
        with RemoteReader(driver, 0, [executor.location]) as reader:
            got = [i for b in reader for i in b.sample_id.tolist()]
        assert executor.server.shm_batches_sent == executor.server.batches_sent > 0
        assert slot_files(directory) == []  # every slot file was unlinked
    assert sorted(got) == ids and not directory.exists()
    assert all(first for _, _, first in driver.claims)  # each batch claimed once
    assert all(r.state == "succeeded" for r in driver.tasks.values())


def test_batches_outlive_the_stream_and_the_executor(shm_root: Path, tmp_path: Path) -> None:
    ids, driver, executor = run_executor(tmp_path)
    with executor, RemoteReader(driver, 0, [executor.location], prefetch=64) as reader:
        held = list(reader)
    gc.collect()
    assert sorted(int(i) for b in held for i in b.sample_id) == ids  # still readable: mappings live on
    assert all(float(b.dense.sum()) >= 0 for b in held)


def test_fallback_when_the_reader_or_the_executor_says_no(
    shm_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, driver, executor = run_executor(tmp_path)
    with executor:
        with RemoteReader(driver, 0, [executor.location], shm=False) as reader:
            got = [i for b in reader for i in b.sample_id.tolist()]
        assert executor.server is not None and executor.server.shm_batches_sent == 0
    assert sorted(got) == ids
    monkeypatch.setenv("PRIMUS_SHM", "0")
    ids, driver, executor = run_executor(tmp_path / "b")
    with executor:
        assert executor.server is not None and executor.server.shm is None
        client = fl.connect(executor.location)
        assert connect_shm(executor.location, client, fl.FlightCallOptions()) is None  # shm-info refused
        client.close()
        monkeypatch.delenv("PRIMUS_SHM")
        with RemoteReader(driver, 0, [executor.location]) as reader:
            got = [i for b in reader for i in b.sample_id.tolist()]
    assert sorted(got) == ids
    ids, driver, executor = run_executor(tmp_path / "c", shm=False)
    with executor:
        assert executor.server is not None and executor.server.shm is None
        client = fl.connect(executor.location)
        with pytest.raises(fl.FlightServerError, match="no shared memory"):
            client.do_get(fl.Ticket(encode_ticket(0, shm=True))).read_all()
        client.close()


def test_reader_close_mid_stream_leaks_nothing_and_loses_nothing(shm_root: Path, tmp_path: Path) -> None:
    ids, driver, executor = run_executor(tmp_path, slow_ms_per_batch=20)
    with executor:
        assert executor.server is not None and executor.server.shm is not None
        directory = executor.server.shm.path
        first = RemoteReader(driver, 0, [executor.location])
        part = [first.next_batch(timeout=10) for _ in range(3)]
        first.close()
        assert wait_until(executor.server.idle, 10)
        assert slot_files(directory) == []  # the executor unlinked what the reader had not mapped
        with RemoteReader(driver, 0, [executor.location]) as second:
            rest = [b for b in second]
    claimed = [i for b in part + rest if b is not None for i in b.sample_id.tolist()]
    assert sorted(claimed) == ids  # batches in flight at the close were served again, none twice


READER_THEN_SIGKILL = """
import os, signal, sys
import pyarrow.flight as fl
from primus_dagster.data.shm.slot_reader import connect_shm
from primus_dagster.data.flight_protocol import encode_ticket, split_meta
client = fl.connect(sys.argv[1])
shm = connect_shm(sys.argv[1], client, fl.FlightCallOptions())
stream = client.do_get(fl.Ticket(encode_ticket(0, shm=True)))
held = [shm.read(split_meta(stream.read_chunk().app_metadata)[1]) for _ in range(2)]
print(sum(b.num_rows for b in held), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_reader_sigkill_leaks_nothing(shm_root: Path, tmp_path: Path) -> None:
    ids, driver, executor = run_executor(tmp_path, slow_ms_per_batch=10)
    with executor:
        assert executor.server is not None and executor.server.shm is not None
        directory = executor.server.shm.path
        proc = subprocess.run(
            [sys.executable, "-c", READER_THEN_SIGKILL, executor.location],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        assert proc.returncode == -signal.SIGKILL and int(proc.stdout) == 50, proc.stderr
        assert wait_until(executor.server.idle, 10)  # the executor saw the stream cancelled ...
        assert slot_files(directory) == []  # ... and unlinked the slot files the reader had not mapped
        with RemoteReader(driver, 0, [executor.location]) as reader:
            rest = [i for b in reader for i in b.sample_id.tolist()]
    # The two batches the dead reader had received count as served (as with plain Flight: the
    # transport delivered them); everything it had not received was served again.
    assert len(rest) == len(ids) - 50 and len(set(rest)) == len(rest)


def test_executor_sigkill_directory_is_removed_by_the_reader(shm_root: Path, tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=2, rows=200)
    spec = tmp_path / "job.yaml"
    spec.write_text(job_text(batch_rows=20, buffer_batches=4))
    job = job_spec(batch_rows=20, buffer_batches=4)
    driver = DataDriver(max_attempts=5, lease_s=2.0, trainers=1)
    driver.add_tasks(plan(job, tmp_path, hours=1))
    with DriverServer(driver) as server:
        config = ExecutorConfig(
            driver=server.location,
            executor_id="data-0",
            job_spec=str(spec),
            data_root=str(tmp_path),
            slow_ms_per_batch=50,
            linger_s=0.2,
        )
        proc = start_executor_process(config)
        try:
            address = wait_ready(proc, 30)
            directory = next(shm_root.iterdir())
            assert directory.name.startswith(f"primus-data-{proc.pid}-")
            reader = RemoteReader(driver, 0, [address], max_retries=1, prefetch=64)
            assert reader.next_batch(timeout=20) is not None
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            assert wait_until(lambda: not directory.exists(), 15), "the reader removes a dead executor's files"
            reader.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            assert proc.stdout is not None
            proc.stdout.close()


def test_shm_info_action(shm_root: Path, tmp_path: Path) -> None:
    _, _, executor = run_executor(tmp_path)
    with executor:
        client = fl.connect(executor.location)
        info = json.loads(next(iter(client.do_action(fl.Action("shm-info", b"")))).body.to_pybytes())
        assert Path(info["dir"]).parent == shm_root and (Path(info["dir"]) / PROBE_NAME).read_text() == info["nonce"]
        with pytest.raises(fl.FlightServerError, match="unknown action"):
            list(client.do_action(fl.Action("nope", b"")))
        client.close()
