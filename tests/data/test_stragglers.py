"""Straggler backup copies on real executor processes (a local pool, ``tests.data.planekit``): an
executor that serves far slower than its peer has its task copied to the idle one; the first copy to
finish is delivered, each row once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from primus_dagster.spec import parse_job_spec
from tests.data.executor.datakit import job_text, plan, write_tree
from tests.data.planekit import local_plane

pytestmark = pytest.mark.integration


def spec_file(tmp_path: Path, backup_after: float) -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        job_text(
            batch_rows=50,
            buffer_batches=2,
            task_runners=1,
            lease="20s",
            replicas=2,
            data_plane=f"backup_after: {backup_after}",
        )
    )
    return spec


@pytest.mark.parametrize("backup_after", [2.0, 0.0])
def test_a_straggler_task_is_copied_and_every_row_arrives_once(tmp_path: Path, backup_after: float) -> None:
    ids = write_tree(tmp_path, hours=2, files=6, rows=200)
    spec = spec_file(tmp_path, backup_after)
    tasks = plan(parse_job_spec(spec.read_text()), tmp_path, hours=2)
    got: Counter[int] = Counter()
    # executor 0 needs 150 ms a batch (a sick node), executor 1 a few ms
    with local_plane(spec, tmp_path, tasks, executors=2, heartbeat_s=0.1, slow_ms_per_batch={0: 150.0}) as plane:
        with plane.reader(0, prefetch=2, refresh_s=0.1) as reader:
            for batch in reader:
                assert batch.sample_id is not None
                got.update(batch.sample_id.tolist())
        plane.driver.raise_if_failed()
        status = plane.driver.status()
    assert got == Counter(ids)
    if backup_after:
        assert status["backups_started"] >= 1 and status["backups_won"] >= 1
    else:
        assert status["backups_started"] == 0
