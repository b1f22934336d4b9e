"""Integer event times through a real ``primus-dagster train``: epoch seconds read as the default
milliseconds fail the run with the column, the file and the unit that would fit (never exit 0 on
repaired times); declared ``ts_unit: s`` they train."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # the job tests' small world
from jobkit import make_job, train_one_hour

pytestmark = pytest.mark.integration


def as_epoch_seconds(directory: Path) -> int:
    """Rewrite every Parquet file below ``directory`` with ``event_time`` as int64 epoch seconds."""
    files = sorted(directory.rglob("*.parquet"))
    for path in files:
        table = pq.read_table(path)
        index = table.schema.get_field_index("event_time")
        seconds = pc.cast(pc.divide(table.column(index).cast(pa.int64()), 1_000_000), pa.int64())
        pq.write_table(table.set_column(index, "event_time", seconds), path)
    return len(files)


def test_epoch_seconds_fail_by_default_and_train_once_declared(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="batch", model="single", hours=1)
    assert as_epoch_seconds(tmp_path / "parquet" / "impressions") > 0
    failed = train_one_hour(env)
    assert failed.returncode != 0, failed.stderr[-2000:]
    assert "column 'event_time'" in failed.stderr and "read as epoch ms" in failed.stderr
    assert "declare `ts_unit: s` in the source's columns" in failed.stderr
    assert ".parquet" in failed.stderr  # the file is named
    assert "Traceback" not in failed.stderr

    text = env["job_path"].read_text()
    env["job_path"].write_text(
        text.replace("columns: &cols {ts: event_time,", "columns: &cols {ts: event_time, ts_unit: s,")
    )
    trained = train_one_hour(env)
    assert trained.returncode == 0, trained.stderr[-2000:]
