"""Packs of small files (``docs/data_plane.md``, Packs).

The DTGG packs a partition's small files into one task (``data.pack_bytes`` / ``data.open_cost_bytes``,
Spark's rule); a pack is read as one stream of full batches across its files; a file of it that cannot
be read is named and given up alone while the others are delivered exactly once -- also when an
executor is SIGKILLed mid-serving or the plane is restored from a barrier snapshot. Real Parquet files
in ``tmp_path``; the integration tests run real executor processes (a local pool, ``tests.data.planekit``).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from primus_dagster.data.canonical import DataQualityError
from primus_dagster.data.driver import DataDriver
from primus_dagster.data.graph import PackRule, Planner, TaskBlock
from primus_dagster.data.sources import ReadTask, SourceContext, SourceReadError, TimeWindow, make_adapter
from primus_dagster.data.sources.base import pack_failure
from primus_dagster.data.task_batches import read_batches
from primus_dagster.data.tasks import DataTask, read_location
from primus_dagster.spec import SpecError, load_job_spec, parse_job_spec
from tests.data.executor.datakit import T0, native
from tests.data.planekit import kill_mid_serving, local_plane, read_everything

ROWS = 5  # rows per file
BATCH_ROWS = 16


def job_yaml(data: str = "", quality: str = "") -> str:
    return f"""
name: packs
data: {{lease: 3s, buffer_batches: 4, max_attempts: 2, failed_task_threshold: 0.2{data}}}
pools: {{data: {{replicas: 2, task_runners: 1}}, training: {{replicas: 1}}}}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 3h
      sources:
        - name: src
          type: parquet
          path: pq
          batch_rows: {BATCH_ROWS}
          columns: {{ts: event_time, label: click, id: sample_id, dense: [d0, d1], sparse: [user_id]}}
          {quality}
"""


def world(root: Path, hours: int = 2, files: int = 20, data: str = "", quality: str = "") -> dict:
    """``files`` Parquet files of ``ROWS`` rows an hour, the job and its plan (packs at the spec's defaults
    unless ``data`` says otherwise); the files in plan order and their sample ids."""
    next_id = 0
    paths: list[Path] = []
    ids: dict[str, list[int]] = {}
    for h in range(hours):
        start = T0 + timedelta(hours=h)
        directory = root / "pq" / f"dt={start:%Y-%m-%d}" / f"hour={start:%H}"
        directory.mkdir(parents=True, exist_ok=True)
        for f in range(files):
            path = directory / f"part-{f:05d}.parquet"
            pq.write_table(native(start, ROWS, next_id), path)
            ids[str(path)] = list(range(next_id, next_id + ROWS))
            paths.append(path)
            next_id += ROWS
        (directory / "_SUCCESS").touch()
    job_path = root / "job.yaml"
    job_path.write_text(job_yaml(data, quality))
    job = load_job_spec(job_path)
    context = SourceContext(str(root))
    with Planner.for_job(job, context) as planner:
        tasks = list(planner.plan(TimeWindow.hours_from(T0, hours)).tasks)
    return {"root": root, "job_path": job_path, "job": job, "context": context, "tasks": tasks, "ids": ids}


def torn(path: str | Path) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])  # the footer is gone


def block_of(sizes: list[int], spans: dict[int, tuple[int, int]] | None = None, versions: list[str] | None = None):
    tasks = [
        ReadTask(
            "src",
            T0,
            f"/d/part-{i:03d}.parquet",
            *(spans or {}).get(i, (0, None)),
            size,
            10,
            (versions or ["1"] * len(sizes))[i],
        )
        for i, size in enumerate(sizes)
    ]
    return TaskBlock.from_tasks(T0, "1", tasks)


# -- planning ------------------------------------------------------------------------------------


def test_the_pack_rule_keeps_order_and_spark_s_costs() -> None:
    rule = PackRule(pack_bytes=100, open_cost_bytes=10)
    assert list(block_of([5] * 14).pack_cuts(rule)) == [0, 6, 12, 14]  # 6 x (5 + 10) = 90; a 7th: 105
    assert list(block_of([5, 5, 95, 5, 5]).pack_cuts(rule)) == [0, 2, 3, 5]  # a big file stays alone
    assert list(block_of([5, 5, 5, 5], spans={1: (0, 3)}).pack_cuts(rule)) == [0, 1, 2, 4]  # a row-group range
    assert list(block_of([5, 5, 5, 5], versions=["1", "1", "2", "2"]).pack_cuts(rule)) == [0, 2, 4]
    assert list(block_of([5] * 3).pack_cuts(PackRule(0, 10))) == [0, 1, 2, 3]  # pack_bytes 0: a task a file
    assert list(block_of([]).pack_cuts(rule)) == [0]
    block = block_of([5] * 3)
    pack = block.read_pack(0, 3, "src")
    assert [m[0] for m in pack.members] == [block.uri(i) for i in range(3)] and pack.uri == block.uri(0)
    assert pack.size_bytes == 15 and pack.rows == 30 and pack.version == "1"
    assert pack.task_id == f"src/{T0:%Y%m%dT%H}/{block.uri(0)}+2"
    assert block.read_pack(1, 2, "src") == block.read_task(1, "src")  # one file is no pack


def test_planner_packs_each_partition_s_small_files_by_the_spec(tmp_path: Path) -> None:
    env = world(tmp_path, hours=2, files=20)
    tasks = env["tasks"]
    assert len(tasks) == 2 and all(len(t.read.members) == 20 for t in tasks)  # defaults: 128 MiB, 4 MiB a file
    assert [m[0] for t in tasks for m in t.read.members] == list(env["ids"])  # every file once, in order
    assert [t.task_id for t in tasks] == sorted(t.task_id for t in tasks)
    assert all(t.units == 20 and t.size_bytes == sum(m[1] for m in t.read.members) for t in tasks)
    # pack_bytes / open_cost_bytes: 7 files a pack (each costs a few kB over the 1 MB to open it); 0: a task a file
    small = world(tmp_path / "small", data=", pack_bytes: 8000000, open_cost_bytes: 1000000")["tasks"]
    assert [len(t.read.members) for t in small] == [7, 7, 6] * 2
    off = world(tmp_path / "off", data=", pack_bytes: 0")["tasks"]
    assert len(off) == 40 and not any(t.read.members for t in off)


def test_a_pack_travels_as_json_and_keeps_its_id_without_a_file(tmp_path: Path) -> None:
    (task, _) = world(tmp_path)["tasks"]
    payload = task.to_dict()
    assert isinstance(payload["read"]["members"], str)  # one compact JSON text: snapshots stay small and fast
    assert DataTask.from_json(task.to_json()) == task
    second = task.read.members[1][0]
    smaller = task.without([task.read.uri, second])
    assert smaller.task_id == task.task_id and len(smaller.read.members) == 18 and smaller.units == 18
    assert smaller.read.uri == task.read.members[2][0] and smaller.size_bytes < task.size_bytes
    assert read_location(task.read).startswith(f"{task.read.uri} and 19 more file(s)")


# -- reading ---------------------------------------------------------------------------------------


def read_pack(env: dict, task: DataTask) -> tuple[list[pa.RecordBatch], object]:
    adapter = make_adapter(env["job"].dataset.source("src"), env["context"])
    return list(adapter.read(task.read)), adapter


def test_a_pack_reads_its_files_rows_in_full_batches(tmp_path: Path) -> None:
    env = world(tmp_path, hours=1, files=20)
    (task,) = env["tasks"]
    batches, adapter = read_pack(env, task)
    assert [b.num_rows for b in batches] == [16] * 6 + [4]  # 100 rows across 20 files
    got = [i for b in batches for i in b.column("sample_id").to_pylist()]
    assert got == [i for ids in env["ids"].values() for i in ids]
    # the same canonical rows as the files read one by one
    singles = [b for member in task.read.member_tasks() for b in adapter.read(member)]
    assert pa.Table.from_batches(batches).equals(pa.Table.from_batches(singles))
    again, _ = read_pack(env, task)
    assert [b.num_rows for b in again] == [b.num_rows for b in batches]  # the same batches on every read


def test_a_file_of_another_native_schema_ends_a_batch_early(tmp_path: Path) -> None:
    env = world(tmp_path, hours=1, files=10)
    (task,) = env["tasks"]
    odd = task.read.members[4][0]
    table = pq.read_table(odd)
    pq.write_table(
        table.set_column(table.schema.get_field_index("d0"), "d0", table.column("d0").cast(pa.float64())), odd
    )
    batches, _ = read_pack(env, task)
    assert [b.num_rows for b in batches] == [16, 4, 5, 16, 9]  # files 0-3, file 4 (float64 d0), files 5-9
    assert sum(b.num_rows for b in batches) == 50


def test_quality_counts_of_a_pack_name_the_file(tmp_path: Path) -> None:
    env = world(tmp_path, hours=1, files=10)
    (task,) = env["tasks"]
    bad = task.read.members[6][0]
    table = pq.read_table(bad)
    d0 = np.array(table.column("d0").to_pylist(), dtype=np.float32)
    d0[[0, 2]] = np.inf
    pq.write_table(table.set_column(table.schema.get_field_index("d0"), "d0", pa.array(d0)), bad)
    _, adapter = read_pack(env, task)
    assert adapter.normalize.take() == {"dense_invalid": 2}
    assert adapter.last_read_stats["quality_places"] == {bad: {"dense_invalid": 2}}


def test_a_torn_file_is_named_and_a_read_without_it_repeats_the_batches_before(tmp_path: Path) -> None:
    env = world(tmp_path, hours=1, files=20)
    (task,) = env["tasks"]
    bad = task.read.members[11][0]
    torn(bad)
    adapter = make_adapter(env["job"].dataset.source("src"), env["context"])
    served: list[pa.RecordBatch] = []
    with pytest.raises(SourceReadError) as raised:
        for batch in adapter.read(task.read):
            served.append(batch)
    failure = pack_failure(raised.value)
    assert failure is not None and failure.member == bad and bad in str(raised.value)
    assert 0 < failure.served_members <= 11 and len(served) == 3  # 3 x 16 rows of the first 11 files' 55
    without = list(adapter.read(task.without([bad]).read))
    assert [b.equals(s) for b, s in zip(without, served, strict=False)] == [True] * 3  # the same ids name the same rows
    got = [i for b in without for i in b.column("sample_id").to_pylist()]
    assert got == [i for path, ids in env["ids"].items() if path != bad for i in ids]


def test_a_quality_failure_is_pinned_on_its_file_with_its_type(tmp_path: Path) -> None:
    env = world(tmp_path, hours=1, files=10, quality="quality: {dense_invalid: fail}")
    (task,) = env["tasks"]
    bad = task.read.members[7][0]
    table = pq.read_table(bad)
    d1 = np.array(table.column("d1").to_pylist(), dtype=np.float32)
    d1[3] = np.nan
    pq.write_table(table.set_column(table.schema.get_field_index("d1"), "d1", pa.array(d1)), bad)
    with pytest.raises(DataQualityError) as raised:  # the type callers tell errors apart by
        read_pack(env, task)
    failure = pack_failure(raised.value)
    assert failure is not None and failure.member == bad and str(raised.value).startswith(bad)


def test_read_batches_reads_a_pack_without_the_file_that_fails(tmp_path: Path) -> None:
    env = world(tmp_path, hours=1, files=20)
    (task,) = env["tasks"]
    bad = task.read.members[3][0]
    torn(bad)
    errors: list[tuple[str, Exception]] = []
    got = [
        i
        for batch in read_batches(
            env["job"], env["context"], [task], on_error=lambda t, e: errors.append((t.task_id, e))
        )
        for i in batch.sample_id.tolist()
    ]
    assert got == [i for path, ids in env["ids"].items() if path != bad for i in ids]
    assert [(t, pack_failure(e).member) for t, e in errors] == [(task.task_id, bad)]  # type: ignore[union-attr]


# -- the data plane (real executor processes) --------------------------------------------------


def expected(env: dict, leave_out: str | None = None) -> Counter[int]:
    return Counter(i for path, ids in env["ids"].items() if path != leave_out for i in ids)


@pytest.mark.integration
def test_a_torn_file_in_a_pack_is_given_up_alone_and_the_rest_delivered_once(tmp_path: Path) -> None:
    env = world(tmp_path, hours=3, files=20)  # 60 files in 3 packs: one torn file is under 20 %
    bad = env["tasks"][1].read.members[8][0]
    torn(bad)
    with local_plane(env["job_path"], env["root"], env["tasks"], executors=2) as plane:
        got = read_everything(plane)
        assert plane.wait_executors(30) == [0, 0]
        status = plane.driver.status()
        report = plane.driver.failure_report()
        info = plane.driver.task_info(env["tasks"][1].task_id)
    assert Counter(got) == expected(env, leave_out=bad)
    assert status["done"] and not status["failed"] and status["counts"]["succeeded"] == 3
    (row,) = report
    assert row["where"] == bad and row["task_id"] == env["tasks"][1].task_id and row["failures"] == 2
    assert "magic bytes" in row["error"] and bad in row["error"]
    assert list(info["given_up"]) == [bad] and info["failures"] == 0


@pytest.mark.integration
def test_sigkill_of_an_executor_serving_packs_loses_and_repeats_nothing(tmp_path: Path) -> None:
    env = world(tmp_path, hours=3, files=40, data=", pack_bytes: 7000000, open_cost_bytes: 1000000")
    assert len(env["tasks"]) > 6 and all(len(t.read.members) > 1 for t in env["tasks"])
    got: list[int] = []
    with local_plane(
        env["job_path"], env["root"], env["tasks"], executors=2, slow_ms_per_batch={0: 30}, heartbeat_s=0.2
    ) as dp:
        running = kill_mid_serving(dp, lambda batch: got.extend(batch.sample_id.tolist()), claims=6)
        status = dp.driver.status()
    assert running > 0
    assert status["done"] and not status["failed"]
    assert Counter(got) == expected(env) and len(got) == sum(expected(env).values())


@pytest.mark.integration
def test_restore_from_a_barrier_replays_exactly_the_unseen_batches_of_packs(tmp_path: Path) -> None:
    env = world(tmp_path, hours=3, files=40, data=", pack_bytes: 7000000, open_cost_bytes: 1000000")
    bad = env["tasks"][2].read.members[3][0]
    torn(bad)  # given up before or after the barrier: the snapshot keeps what the driver decided
    before: list[int] = []
    lost: list[int] = []
    with local_plane(env["job_path"], env["root"], env["tasks"], executors=1) as dp, dp.reader(0) as reader:
        for _ in range(8):
            before.extend(reader.next_batch(timeout=30).sample_id.tolist())
        snapshot = reader.barrier(1, wait_s=10)
        assert snapshot is not None
        for _ in range(4):  # trained after the checkpoint, then the run crashes: thrown away
            lost.extend(reader.next_batch(timeout=30).sample_id.tolist())
    restored = DataDriver.restore(json.loads(json.dumps(snapshot)))
    after: list[int] = []
    with local_plane(env["job_path"], env["root"], driver=restored, executors=2) as dp:
        after = read_everything(dp)
        status = dp.driver.status()
        report = dp.driver.failure_report()
    assert lost and status["done"] and not status["failed"]
    assert len(after) == len(set(after)) and not set(before) & set(after)
    assert Counter(before) + Counter(after) == expected(env, leave_out=bad)
    assert [r["where"] for r in report] == [bad]


def test_the_pack_keys_have_defaults_and_refuse_bad_values_by_name() -> None:
    job = parse_job_spec(job_yaml())
    assert (job.data.pack_bytes, job.data.open_cost_bytes) == (128 * 2**20, 4 * 2**20)  # Spark's defaults
    for key in ("pack_bytes", "open_cost_bytes"):
        with pytest.raises(SpecError, match=rf"data\.{key}"):
            parse_job_spec(job_yaml(f", {key}: -1"))
