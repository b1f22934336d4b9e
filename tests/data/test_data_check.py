"""``primus-dagster validate --data``: bad declarations are named before training -- epoch seconds
left as the default milliseconds, a string column mapped dense, a list column mapped as one id --
each with the column, the file and the fix; a spec that fits its data passes. And the source checks'
whole-partition scan (``scan_with_findings``): each file's rows with ids that are not whole, null event
times or event times outside the partition, counted with a few of the values; whole floats and strings
are ids."""

from __future__ import annotations

import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from primus_dagster.cli import main
from primus_dagster.data import Normalizer, PartitionFindings, SourceContext, make_adapter, scan_with_findings
from primus_dagster.spec import parse_job_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # the job tests' small world
from jobkit import make_job


def rewrite(directory: Path, change) -> None:
    for path in sorted(directory.rglob("*.parquet")):
        pq.write_table(change(pq.read_table(path)), path)


def validate(env: dict, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["validate", str(env["job_path"]), "--data", "--data-root", str(env["root"]), "--hours", "1"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def with_columns(env: dict, columns: str) -> None:
    text, count = re.subn(r"columns: &cols \{.*\}", lambda _: f"columns: &cols {columns}", env["job_path"].read_text())
    assert count == 1
    env["job_path"].write_text(text)


def test_a_spec_that_fits_its_data_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = make_job(tmp_path, mode="batch", model="single", hours=1, rows_per_hour=300)
    code, text = validate(env, capsys)
    assert code == 0, text
    assert "imp: ok (" in text and "events: ok (" in text


def test_bad_declarations_are_named_with_column_file_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = make_job(tmp_path, mode="batch", model="single", hours=1, rows_per_hour=300)

    def bad(table: pa.Table) -> pa.Table:
        index = table.schema.get_field_index("event_time")
        seconds = pc.cast(pc.divide(table.column(index).cast(pa.int64()), 1_000_000), pa.int64())
        table = table.set_column(index, "event_time", seconds)
        table = table.append_column(
            "gender", pa.array(["f", "m"] * (table.num_rows // 2) + ["f"] * (table.num_rows % 2))
        )
        return table.append_column("genres", pa.array([["a", "b"]] * table.num_rows, pa.list_(pa.string())))

    rewrite(tmp_path / "parquet", bad)
    # 1. epoch seconds left as the default milliseconds
    code, text = validate(env, capsys)
    assert code == 2 and "column 'event_time'" in text and "declare `ts_unit: s`" in text and ".parquet" in text
    assert "Traceback" not in text
    # 2. a string column mapped dense
    with_columns(
        env, "{ts: event_time, ts_unit: s, label: click, id: sample_id, dense: [d0, gender], sparse: [user_id]}"
    )
    code, text = validate(env, capsys)
    assert code == 2 and "dense column 'gender' has type string" in text and "belongs in columns.sparse" in text
    assert ".parquet" in text
    # 3. a list column mapped as one id
    with_columns(
        env, "{ts: event_time, ts_unit: s, label: click, id: sample_id, dense: [d0], sparse: [user_id, genres]}"
    )
    code, text = validate(env, capsys)
    assert code == 2 and "sparse column 'genres' has type list<" in text and "columns.lists" in text
    # fixed: strings as ids, the list as a list feature, the unit declared
    with_columns(
        env,
        "{ts: event_time, ts_unit: s, label: click, id: sample_id, dense: [d0], sparse: [user_id, gender], lists: [genres]}",
    )
    code, text = validate(env, capsys)
    assert code == 0, text


# -- scan_with_findings: the whole partition, each file's rows that break a gated rule ----------------

HOUR = datetime(2026, 11, 1, tzinfo=timezone.utc)
SCAN_JOB = """
name: t
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 1h
      sources:
        - name: clicks
          type: parquet
          path: pq
          columns: {ts: event_time, label: click, dense: [d0], sparse: [user_id, country]}
training: {partition: hour}
"""


def hour_file(root: Path, name: str, **columns: pa.Array) -> Path:
    """A Parquet file of 6 good rows of the first hour, with ``columns`` replacing the good ones."""
    directory = root / "pq" / "dt=2026-11-01" / "hour=00"
    directory.mkdir(parents=True, exist_ok=True)
    good = {
        "event_time": pa.array([HOUR + timedelta(minutes=i) for i in range(6)], pa.timestamp("us", tz="UTC")),
        "click": pa.array([0, 1, 0, 0, 1, 0], pa.int32()),
        "d0": pa.array([0.5] * 6, pa.float32()),
        "user_id": pa.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        "country": pa.array(["de", "fr", "de", "us", "fr", "de"]),
    }
    path = directory / name
    pq.write_table(pa.table({**good, **columns}), path)
    (directory / "_SUCCESS").touch()
    return path


def scan_hour(root: Path) -> PartitionFindings:
    source = parse_job_spec(SCAN_JOB).dataset.source("clicks")
    with make_adapter(source, SourceContext(str(root))) as adapter:
        return scan_with_findings(adapter, adapter.partition(HOUR))


def test_whole_floats_and_string_ids_are_ids(tmp_path: Path) -> None:
    hour_file(tmp_path, "a.parquet")
    hour_file(tmp_path, "b.parquet", user_id=pa.array([7, 8, 9, 10, 11, 12], pa.uint64()))
    found = scan_hour(tmp_path)
    assert found.scan.rows == 12 and not found.scan.errors
    assert found.rule_findings == [] and found.schema_errors == found.read_errors == []


def test_each_file_s_broken_rows_are_counted_with_example_values(tmp_path: Path) -> None:
    ids = hour_file(tmp_path, "a.parquet", user_id=pa.array([3.5, 1.0, 3.5, None, float("nan"), 0.25]))
    late = [HOUR + timedelta(minutes=59), None, HOUR + timedelta(minutes=61), HOUR - timedelta(seconds=1)] + [HOUR] * 2
    times = hour_file(tmp_path, "b.parquet", event_time=pa.array(late, pa.timestamp("us", tz="UTC")))
    found = scan_hour(tmp_path)

    (bad_id,) = found.of("bad_id")
    assert (bad_id.uri, bad_id.rows, bad_id.action, bad_id.error) == (str(ids), 5, "repair", None)
    assert bad_id.examples == {"user_id": ["3.5", "null", "nan"]}  # distinct, at most QUALITY_EXAMPLES
    assert bad_id.line().startswith(f"{ids}: 5 row(s) with an id that is not a whole int64")
    assert "column 'user_id', e.g. 3.5, null, nan" in bad_id.line()

    null_ts, outside = found.of("null_ts", "ts_outside_partition")
    assert (null_ts.uri, null_ts.rows, null_ts.action, null_ts.examples) == (str(times), 1, "drop", {"event_time": []})
    assert (outside.uri, outside.rows) == (str(times), 2)
    assert outside.examples == {"event_time": ["2026-11-01 01:01:00.000000Z", "2026-10-31 23:59:59.000000Z"]}
    assert "outside the partition [2026-11-01T00:00:00+00:00, 2026-11-01T01:00:00+00:00)" in outside.line()
    assert outside.as_json()["path"] == str(times) and outside.as_json()["columns"] == outside.examples
    assert found.scan.quality["bad_id"] == 5 and found.scan.quality["null_ts"] == 1
    assert found.scan.rows == 11  # the null event time dropped (quality.null_ts: drop), the others kept


def test_normaliser_examples_are_distinct_bounded_and_reset_by_take() -> None:
    source = parse_job_spec(SCAN_JOB).dataset.source("clicks")
    norm = Normalizer(source)
    batch = pa.record_batch(
        {
            "event_time": pa.array([HOUR] * 6, pa.timestamp("us", tz="UTC")),
            "click": pa.array([0] * 6, pa.int32()),
            "d0": pa.array([0.5] * 6, pa.float32()),
            "user_id": pa.array([0.5, 0.5, 1.5, 2.5, 3.5, 4.0]),
            "country": pa.array(["de"] * 6),
        }
    )
    norm(batch, where="f.parquet", partition=HOUR)
    norm(batch, where="f.parquet", partition=HOUR)
    assert norm.examples == {("bad_id", "user_id"): ["0.5", "1.5", "2.5"]}
    assert norm.take() == {"bad_id": 10} and norm.examples == {}
