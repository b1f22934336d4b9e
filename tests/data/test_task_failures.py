"""A task that fails on a corrupt file: retried up to ``max_attempts``, then reported with its file
and error; the other tasks complete and deliver every row exactly once; the job fails only past
``failed_task_threshold``.

Real Parquet trees in ``tmp_path`` with one corrupt file, the real :class:`DataDriver`; the
integration tests run real executor processes in a local pool (``tests.data.planekit``: driver over
Flight, trainer-side ``RemoteReader``) and executors as threads of this process
(:class:`InTrainerDataPlane`), the others an in-process :class:`DataExecutor`.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from primus_dagster.data import InTrainerDataPlane
from primus_dagster.data.driver import DataDriver, DataFailedError
from primus_dagster.data.executor import DataExecutor
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import parse_job_spec
from tests.data.executor.datakit import T0, plan, write_tree
from tests.data.planekit import local_plane, read_everything

ROWS = 200  # rows per file
BATCH_ROWS = 50


def job_text(max_attempts: int, threshold: float, trainers: int = 1) -> str:
    return f"""
name: task-failures
pools:
  data: {{replicas: 2, task_runners: 2}}
  training: {{replicas: {trainers}, max_replicas: {trainers}}}
data: {{buffer_batches: 4, lease: 10s, max_attempts: {max_attempts}, failed_task_threshold: {threshold}}}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 2h
      shuffle: rebalance
      sources:
        - name: src
          type: parquet
          path: pq
          batch_rows: {BATCH_ROWS}
          columns: {{ts: event_time, label: click, id: sample_id, dense: [d0, d1], sparse: [user_id]}}
"""


def tree(
    tmp_path: Path, max_attempts: int, threshold: float, hours: int = 2, files: int = 3
) -> tuple[Path, list[DataTask], list[list[int]]]:
    """The job spec, its tasks (one per file, chronological) and each task's sample ids."""
    ids = write_tree(tmp_path, hours=hours, files=files, rows=ROWS)
    spec = tmp_path / "job.yaml"
    spec.write_text(job_text(max_attempts, threshold))
    tasks = plan(parse_job_spec(spec.read_text()), tmp_path, hours=hours)
    assert len(tasks) == hours * files
    # write_tree numbers the rows file after file, in the same (hour, file) order as the plan.
    return spec, tasks, [ids[i * ROWS : (i + 1) * ROWS] for i in range(len(tasks))]


def garbage(path: str) -> None:
    Path(path).write_bytes(b"\x00not a parquet file\xff" * 64)


def truncate(path: str) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])  # the footer is gone


def corrupt_second_row_group(path: str) -> int:
    """Rewrite the file with row groups of ``2 * BATCH_ROWS`` rows and break the page header of the
    second one: the read yields the first row group's batches, then fails. Returns those rows."""
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=2 * BATCH_ROWS)
    meta = pq.read_metadata(path)
    column = meta.row_group(1).column(0)
    offset = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(Path(path).read_bytes())
    data[offset : offset + 16] = b"\xff" * 16
    Path(path).write_bytes(bytes(data))
    return meta.row_group(0).num_rows


@pytest.mark.integration
@pytest.mark.parametrize("in_process", [False, True], ids=["executor-processes", "executors-in-process"])
def test_corrupt_file_is_retried_then_reported_and_the_rest_is_delivered_once(tmp_path: Path, in_process: bool) -> None:
    spec, tasks, ids = tree(tmp_path, max_attempts=3, threshold=0.5)  # 1 of 6 failing < 50 %
    bad = 1
    garbage(tasks[bad].read.uri)
    with (InTrainerDataPlane if in_process else local_plane)(spec, tmp_path, tasks, executors=2, trainers=1) as plane:
        got = read_everything(plane)
        codes = plane.wait_executors(30)
        driver = plane.driver
        status = driver.status()
        info = driver.task_info(tasks[bad].task_id)
        report = driver.failure_report()
        others = [driver.task_info(t.task_id) for i, t in enumerate(tasks) if i != bad]
        driver.raise_if_failed()  # within the threshold: no error
    # Retried up to max_attempts, then failed, with the file and the error.
    assert info["state"] == "failed"
    assert info["attempts"] == 3 and info["failures"] == 3
    assert tasks[bad].read.uri in info["error"] and "magic bytes" in info["error"]
    assert [(r["task_id"], r["uri"], r["attempts"], r["failures"]) for r in report] == [
        (tasks[bad].task_id, tasks[bad].read.uri, 3, 3)
    ]
    assert tasks[bad].read.uri in report[0]["error"]
    # The others ran once each and delivered every row exactly once; nothing of the corrupt file.
    assert all(o["state"] == "succeeded" and o["attempts"] == 1 and o["rows"] == ROWS for o in others)
    expected = Counter(i for k, task_ids in enumerate(ids) if k != bad for i in task_ids)
    assert Counter(got) == expected
    # The job is done and not failed; the executors stopped by themselves.
    assert status["done"] and not status["failed"]
    assert status["counts"]["succeeded"] == len(tasks) - 1 and status["counts"]["failed"] == 1
    assert codes == [0, 0]


@pytest.mark.integration
@pytest.mark.parametrize("in_process", [False, True], ids=["executor-processes", "executors-in-process"])
def test_failures_past_the_threshold_fail_the_job_naming_the_file(tmp_path: Path, in_process: bool) -> None:
    spec, tasks, ids = tree(tmp_path, max_attempts=2, threshold=0.1)  # 1 of 6 failing > 10 %
    # The last task handed out: the job fails while the reader is reading. (With the first one the
    # executors can be gone before the reader connects, which trips a start-up race in RemoteReader:
    # a fetcher failing at once reads ``_discovery_done`` before __init__ has set it.)
    bad = len(tasks) - 1
    truncate(tasks[bad].read.uri)
    with (InTrainerDataPlane if in_process else local_plane)(spec, tmp_path, tasks, executors=2, trainers=1) as plane:
        got = read_everything(plane)
        codes = plane.wait_executors(30)
        status = plane.driver.status()
        info = plane.driver.task_info(tasks[bad].task_id)
        with pytest.raises(DataFailedError) as failed:
            plane.driver.raise_if_failed()
    assert status["failed"] and not status["done"]
    assert info["state"] == "failed" and info["attempts"] == 2 and info["failures"] == 2
    message = str(failed.value)
    assert tasks[bad].read.uri in message and "magic bytes" in message and "1 of 6 tasks failed" in message
    assert [(r["uri"], r["failures"]) for r in failed.value.report] == [(tasks[bad].read.uri, 2)]
    assert [r["uri"] for r in status["failed_tasks"]] == [tasks[bad].read.uri]
    # The executors stopped (exit 0 once the driver said the job failed), and what was delivered
    # before that was delivered once, none of it from the corrupt file.
    assert codes == [0, 0]
    assert max(Counter(got).values(), default=1) == 1
    assert not set(got) & set(ids[bad])
    assert set(got) <= {i for task_ids in ids for i in task_ids}


def run_in_process(driver: DataDriver, spec: Path, data_root: Path, timeout: float = 20.0) -> list[int]:
    """One in-process executor (no Flight); every batch it hands over is claimed as a reader would
    (a refused claim, i.e. a duplicate, is dropped). The sample ids yielded."""
    job = parse_job_spec(spec.read_text())
    got: list[int] = []
    with DataExecutor(driver, job, "data-0", str(data_root), serve=False, heartbeat_s=0.05) as executor:
        deadline = time.monotonic() + timeout
        while not executor.finished():
            assert time.monotonic() < deadline, f"executor did not finish: {driver.status()['counts']}"
            item = executor.take(0, timeout=0.2)
            if item is not None and driver.claim("trainer-0", item.meta.batch_id):
                got += item.columns.column("sample_id").to_pylist()
    return got


def test_a_task_failing_mid_file_never_delivers_a_batch_twice(tmp_path: Path) -> None:
    spec, tasks, ids = tree(tmp_path, max_attempts=3, threshold=0.5, hours=1, files=3)
    bad = 2
    prefix = corrupt_second_row_group(tasks[bad].read.uri)
    driver = DataDriver(max_attempts=3, failed_task_threshold=0.5, lease_s=10)
    driver.add_tasks(tasks)
    got = run_in_process(driver, spec, tmp_path)
    info = driver.task_info(tasks[bad].task_id)
    assert info["state"] == "failed" and info["attempts"] == 3 and info["failures"] == 3
    assert tasks[bad].read.uri in info["error"] and "thrift" in info["error"].lower()
    # Each attempt reads the readable row group, then fails; what it buffered but had not handed
    # over is dropped with it. So of the corrupt file exactly the batches claimed before a failure
    # were delivered -- once (re-runs skip claimed batches) and only from the readable prefix.
    claimed = info["claimed"]
    assert set(claimed) <= set(range(0, prefix, BATCH_ROWS))
    delivered_bad = [i for first in claimed for i in ids[bad][first : first + BATCH_ROWS]]
    assert Counter(got) == Counter([*ids[0], *ids[1], *delivered_bad])
    assert driver.status()["done"] and not driver.status()["failed"]


@pytest.mark.parametrize(("threshold", "job_fails"), [(0.25, False), (0.24, True)])
def test_the_job_fails_only_past_the_threshold(tmp_path: Path, threshold: float, job_fails: bool) -> None:
    spec, tasks, ids = tree(tmp_path, max_attempts=2, threshold=threshold, hours=2, files=2)  # 1 of 4 = 25 %
    bad = 3  # the last task: the others are handed out (and succeed) before it fails for good
    garbage(tasks[bad].read.uri)
    driver = DataDriver(max_attempts=2, failed_task_threshold=threshold, lease_s=10)
    driver.add_tasks(tasks)
    got = run_in_process(driver, spec, tmp_path)
    status = driver.status()
    good = Counter(i for k, task_ids in enumerate(ids) if k != bad for i in task_ids)
    assert driver.task_info(tasks[bad].task_id)["failures"] == 2
    assert status["failed"] is job_fails and status["done"] is not job_fails
    if job_fails:  # the executor stopped at once: a task still running then is left unfinished
        assert max(Counter(got).values(), default=1) == 1 and set(got) <= set(good)
        with pytest.raises(DataFailedError, match=re.escape(tasks[bad].read.uri)):
            driver.raise_if_failed()
    else:
        assert Counter(got) == good
        driver.raise_if_failed()


def test_planned_partitions_are_where_the_tree_put_them(tmp_path: Path) -> None:
    """Guard for the helpers above: tasks follow write_tree's (hour, file) order."""
    _, tasks, ids = tree(tmp_path, max_attempts=1, threshold=0.0, hours=2, files=2)
    assert [t.partition for t in tasks] == sorted(t.partition for t in tasks)
    assert tasks[0].partition == T0
    for task, task_ids in zip(tasks, ids, strict=True):
        assert pq.read_table(task.read.uri, columns=["sample_id"]).column(0).to_pylist() == task_ids
