"""String columns through a real ``primus-dagster train``: a sparse column of strings (as a team's table holds
user ids) is hashed to ids by the stable hash and trains; a string label column (as a census table holds
">50K" / "<=50K") trains once its positive value is declared (``columns.label_positive``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # the job tests' small world
from jobkit import make_job, train_one_hour

pytestmark = pytest.mark.integration


def test_a_string_sparse_column_trains(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="batch", model="single", hours=1)
    for path in sorted((tmp_path / "parquet" / "impressions").rglob("*.parquet")):
        table = pq.read_table(path)
        index = table.schema.get_field_index("user_id")
        as_text = pc.binary_join_element_wise("u-", pc.cast(table.column(index), pa.string()), "")
        pq.write_table(table.set_column(index, "user_id", as_text.cast(pa.large_string())), path)
    done = train_one_hour(env, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["samples"] > 0


def test_a_string_label_trains_with_its_positive_value_declared(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="batch", model="single", hours=1)
    for path in sorted((tmp_path / "parquet").rglob("*.parquet")):  # every source and the evaluation hour
        table = pq.read_table(path)
        index = table.schema.get_field_index("click")
        as_text = pc.if_else(pc.greater(table.column(index), 0.5), " >50K", "<=50K")
        pq.write_table(table.set_column(index, "click", as_text), path)
    refused = train_one_hour(env)
    assert refused.returncode == 1 and "['<=50K', '>50K']); expected a number" in refused.stderr, refused.stderr[-2000:]
    assert "label_positive: '<that value>'" in refused.stderr
    text = env["job_path"].read_text()
    env["job_path"].write_text(text.replace("label: click,", "label: click, label_positive: '>50K',"))
    done = train_one_hour(env, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["samples"] > 0 and result["eval_rows"] > 0 and 0 < result["eval_positives"] < result["eval_rows"]
