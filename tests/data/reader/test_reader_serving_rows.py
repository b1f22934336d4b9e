"""The serving buffers' rows per kind: executors report theirs with heartbeats, the reader counts its
queues' (``QueueStat.rows``) -- what the mixture prioritisation's ``q_i`` is made of."""

from __future__ import annotations

from pathlib import Path

from primus_dagster.data.driver import DataDriver
from primus_dagster.data.executor import DataExecutor
from primus_dagster.data.reader import RemoteReader
from tests.data.executor.datakit import job_spec, plan, wait_until, write_tree


def test_executor_heartbeats_and_reader_queues_carry_rows_per_kind(tmp_path: Path) -> None:
    write_tree(tmp_path, rel="pq", hours=1, files=2, rows=100)
    write_tree(tmp_path, rel="live", hours=1, files=1, rows=100, first_id=10_000)
    job = job_spec(batch_rows=25, stream_source=True, buffer_batches=4, task_runners=1)
    driver = DataDriver(lease_s=4.0)
    driver.add_tasks(plan(job, tmp_path, hours=1))
    with DataExecutor(driver, job, "data-0", str(tmp_path), heartbeat_s=0.05) as executor:
        # nobody reads yet: the buffer fills (4 batches of 25 rows) and the heartbeats say so
        assert wait_until(lambda: sum(driver.buffered_rows_by_kind().values()) == 100)
        metrics = executor.metrics()
        assert metrics["buffered_rows.batch"] + metrics["buffered_rows.stream"] == 100
        reader = RemoteReader(driver, 0, [executor.location], prefetch=2)
        assert wait_until(lambda: sum(s.size for s in reader.queue_stats().values()) >= 2)
        stats = reader.queue_stats()
        assert all(s.rows == 25 * s.size for s in stats.values()), stats
        rows = sum(batch.rows for batch in reader)
        reader.close()
    assert rows == 300
    assert all(s.rows == 0 and s.size == 0 for s in reader.queue_stats().values())
