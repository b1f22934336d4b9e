"""The pooled data plane under faults, on real executor processes, with process-table checks:

* an executor that outgrows its memory is OOM-killed by the local pool's RSS watchdog, comes back
  with its memory x ``oom_memory_factor`` (capped by ``max_memory``), its unfinished tasks are read
  again, and every row arrives exactly once;
* a trainer that fails mid-run leaves no process behind, and the teardown does not wait out the
  executors' drain (nobody will read what they buffered).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.spec import parse_job_spec
from tests.cluster.memkit import growing_pool, small_job
from tests.cluster.prockit import assert_no_orphans, child_pids, processes_with
from tests.data.executor.datakit import job_text, plan, write_tree

pytestmark = pytest.mark.integration

MiB = 1 << 20


def test_an_oom_killed_executor_restarts_with_more_memory_and_its_tasks_are_read_again(tmp_path: Path) -> None:
    # An idle executor holds ~140 MiB; with 400 MiB more it is above 384 MiB and below 768 MiB.
    pool = "max_replicas: 4, memory: 384Mi, oom_memory_factor: 3, max_memory: 768Mi, restart: on_failure"
    ids, spec, tasks = small_job(tmp_path, pool)
    trigger = tmp_path / "grow-now"
    factory = growing_pool(tmp_path, "data-0", ballast_mb=400, trigger=trigger)
    before = child_pids()
    got: Counter[int] = Counter()
    with PooledDataPlane(spec, tmp_path, tasks, token="t0k3n", heartbeat_s=0.2, pool_factory=factory) as plane:
        assert plane.pool is not None and plane.supervisor is not None
        with plane.reader(0, prefetch=2, refresh_s=0.1) as reader:
            for i, batch in enumerate(reader):
                assert batch.sample_id is not None
                got.update(batch.sample_id.tolist())
                if i == 5:
                    trigger.touch()  # data-0 starts to outgrow its 384 MiB, mid-job
                time.sleep(0.02)
        # under load the other executor may read the last task before the supervisor's next tick records
        # the kill: wait (bounded) for that event, not for a time
        deadline = time.monotonic() + 60
        while not any(d.state == "oom_killed" for d in plane.supervisor.decisions) and time.monotonic() < deadline:
            time.sleep(0.05)
        plane.raise_if_failed()
        summary = plane.summary()
        grown = plane.pool.status()[0]
        decisions = list(plane.supervisor.decisions)
        attempts = [plane.driver.task_info(t.task_id)["attempts"] for t in tasks]
    assert got == Counter(ids)  # nothing lost, nothing twice
    assert summary["oom_restarts"] == 1 and summary["error"] is None
    (decision,) = decisions
    assert (decision.executor_id, decision.state, decision.action) == ("data-0", "oom_killed", "restart")
    # 384 MiB x 3 = 1152 MiB, capped by max_memory: 768 MiB -- and with that it survived.
    assert decision.resources is not None and decision.resources.memory_bytes == 768 * MiB
    assert (grown.executor_id, grown.attempt, grown.resources.memory_bytes) == ("data-0", 1, 768 * MiB)
    assert grown.state in ("running", "succeeded", "stopped")
    assert max(attempts) >= 2  # the killed attempt's unfinished task(s) were leased and read again
    assert_no_orphans(str(spec), before)


def test_a_trainer_failing_mid_run_leaves_no_process_and_cuts_the_drain_short(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=2, files=6, rows=400)
    spec = tmp_path / "job.yaml"
    spec.write_text(job_text(batch_rows=50, buffer_batches=4, task_runners=1, lease="3s", replicas=2))
    tasks = plan(parse_job_spec(spec.read_text()), tmp_path, hours=2)
    before = child_pids()
    plane = PooledDataPlane(spec, tmp_path, tasks, token="t", heartbeat_s=0.2, cancel_grace_s=1.0)
    with pytest.raises(RuntimeError, match="trainer blew up"), plane:
        assert len(processes_with(str(spec))) == 2  # the two executors carry the run's spec path
        with plane.reader(0, prefetch=2, refresh_s=0.1) as reader:
            for i, _ in enumerate(reader):
                if i == 3:
                    raise RuntimeError("trainer blew up")  # executors hold full buffers now
    # After SIGTERM an executor serves its buffers for up to 10 s (--drain-s); nobody reads them
    # now, so the teardown of an unfinished job gives it cancel_grace_s, then SIGKILL.
    assert plane.pool is not None
    assert any(s.exit_code == -signal.SIGKILL for s in plane.pool.status())
    assert_no_orphans(str(spec), before)
