"""String categorical ids through a real ``primus-dagster train``: a sparse column of strings (as a team's
table holds user ids) is hashed to ids by the stable hash and trains; no type error at ``train``."""

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
