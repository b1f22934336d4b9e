"""``primus-dagster validate --data``: bad declarations are named before training -- epoch seconds
left as the default milliseconds, a string column mapped dense, a list column mapped as one id --
each with the column, the file and the fix; a spec that fits its data passes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from primus_dagster.cli import main

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
