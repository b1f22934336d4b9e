"""examples/movielens/convert.py: MovieLens-100k (from the recbole wheel) as daily Hive Parquet plus Delta."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from datetime import date, datetime, timezone
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "movielens" / "convert.py"
SPEC = REPO / "examples" / "movielens" / "job.yaml"
ROWS = 100_000
FIRST, LAST = date(1997, 9, 20), date(1998, 4, 22)

if importlib.util.find_spec("recbole") is None:
    pytest.skip("recbole is not installed (make setup installs it)", allow_module_level=True)


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("movielens_convert", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def convert() -> ModuleType:
    return _module()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, convert: ModuleType) -> tuple[Path, dict, pa.Table, pa.Table]:
    """(out, the summary it printed, the Parquet shard, the Delta shard), each shard sorted by sample_id."""
    from deltalake import DeltaTable

    out = tmp_path_factory.mktemp("data_root") / "movielens"  # where the spec's relative paths point
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert convert.main(["--out", str(out), "--json"]) == 0
    summary = json.loads(printed.getvalue().strip().splitlines()[-1])
    files = sorted((out / "parquet/ratings").glob("dt=*/part-0.parquet"))
    parquet = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("sample_id")
    delta = DeltaTable(str(out / "delta/ratings")).to_pyarrow_table().sort_by("sample_id")
    return out, summary, parquet, delta


def test_all_ratings_in_two_disjoint_shards(written: tuple) -> None:
    _, summary, parquet, delta = written
    assert summary["rows"] == ROWS == parquet.num_rows + delta.num_rows
    assert summary["parquet_rows"] == parquet.num_rows and summary["delta_rows"] == delta.num_rows
    ids = np.concatenate([parquet["sample_id"].to_numpy(), delta["sample_id"].to_numpy()])
    assert np.array_equal(np.sort(ids), np.arange(ROWS))
    assert 0.4 * ROWS < parquet.num_rows < 0.6 * ROWS
    assert (summary["first_day"], summary["last_day"], summary["days"]) == ("1997-09-20", "1998-04-22", 215)
    assert summary["empty_days"] == ["1997-12-11", "1997-12-16"]


def test_daily_hive_partitions(written: tuple) -> None:
    out, _, _, delta = written
    root = out / "parquet/ratings"
    days = sorted(p.name for p in root.iterdir())
    assert len(days) == 215 and days[0] == f"dt={FIRST}" and days[-1] == f"dt={LAST}"
    for name in (days[0], "dt=1997-12-11", days[-1]):
        assert sorted(p.name for p in (root / name).iterdir()) == ["_SUCCESS", "part-0.parquet"]
    assert pq.read_metadata(root / "dt=1997-12-11/part-0.parquet").num_rows == 0  # no ratings that day
    for name in days[::20]:  # every row lies in its day's directory
        ts = pq.read_table(root / name / "part-0.parquet")["timestamp"]
        if len(ts):
            found = set(pc.strftime(pc.cast(ts, pa.timestamp("s", tz="UTC")), format="%Y-%m-%d").to_pylist())
            assert found == {name[3:]}, name
    dt = pc.strftime(pc.cast(delta["timestamp"], pa.timestamp("s", tz="UTC")), format="%Y-%m-%d")
    assert delta["dt"].equals(dt)  # the Delta partition column is the UTC day


def test_types(written: tuple, convert: ModuleType) -> None:
    _, _, parquet, delta = written
    for table in (parquet, delta.drop_columns(["dt"])):
        assert table.column_names == convert.SCHEMA.names
        for field in convert.SCHEMA:
            kind = table.schema.field(field.name).type
            assert kind == field.type or (pa.types.is_list(kind) and kind.value_type == pa.string()), field.name
    for column in ("user_id", "item_id", "gender", "occupation", "zip_code"):
        assert parquet.schema.field(column).type == pa.string()
    assert set(pc.unique(parquet["gender"]).to_pylist()) == {"M", "F"}
    genres = pc.list_flatten(parquet["genres"])
    assert {"Action", "Children's", "Film-Noir", "Sci-Fi"} <= set(pc.unique(genres).to_pylist())
    lengths = pc.list_value_length(parquet["genres"]).to_numpy()
    assert lengths.min() >= 1 and lengths.max() <= 6
    ts = parquet["timestamp"].to_numpy()
    lo, hi = (int(datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp()) for d in (FIRST, LAST))
    assert ts.min() >= lo and ts.max() < hi + 86_400
    liked, rating = parquet["liked"].to_numpy(), parquet["rating"].to_numpy()
    assert np.array_equal(liked, (rating >= 4).astype(np.int32))
    years = parquet["release_year"]
    assert pc.min(years).as_py() >= 1920 and pc.max(years).as_py() <= 1998
    ages = parquet["age"].to_numpy()
    assert ages.min() >= 7 and ages.max() <= 73


def test_counts_use_only_earlier_ratings(written: tuple, convert: ModuleType) -> None:
    _, _, parquet, delta = written
    table = pa.concat_tables([parquet, delta.drop_columns(["dt"]).cast(parquet.schema)]).sort_by("sample_id")
    ts = table["timestamp"].to_numpy()
    assert np.all(np.diff(ts) >= 0)  # sample_id follows time
    for key, count in (("item_id", "item_rating_count"), ("user_id", "user_rating_count")):
        keys = table[key].combine_chunks().dictionary_encode().indices.to_numpy()
        counts = table[count].to_numpy()
        rng = np.random.default_rng(0)
        for row in rng.choice(len(ts), size=300, replace=False):  # brute force on a sample
            assert counts[row] == np.sum((keys == keys[row]) & (ts < ts[row])), (key, row)
        first = np.unique(keys, return_index=True)[1]
        assert np.all(counts[first] == 0)  # a key's first rating has no history
        # never the row itself or a later one: at most the ratings strictly before
        order = np.lexsort((ts, keys))
        same = keys[order][1:] == keys[order][:-1]
        assert np.all(np.diff(counts[order])[same] >= 0)
    assert np.array_equal(convert.count_before(np.array([3, 3, 3, 1]), np.array([5, 5, 7, 1])), [0, 0, 2, 0])


def test_the_spec_reads_both_sources(written: tuple) -> None:
    from primus_dagster.data.sources import make_adapter
    from primus_dagster.data.sources.base import SourceContext, TimeWindow
    from primus_dagster.spec import load_job_spec

    out, _, parquet, delta = written
    job = load_job_spec(SPEC)
    assert job.dataset.start == datetime(1997, 9, 20, tzinfo=timezone.utc)
    context = SourceContext(str(out.parent))
    window = TimeWindow.hours_from(job.dataset.start, 24 * 10)
    end_s = int(window.end.timestamp())
    for name, shard in (("ratings_parquet", parquet), ("ratings_delta", delta)):
        with make_adapter(job.dataset.source(name), context) as adapter:
            parts = adapter.partitions(window)
            assert all(p.ready for p in parts), name
            batches = [b for p in parts for t in adapter.split(p) for b in adapter.read(t)]
        assert sum(b.num_rows for b in batches) == int(np.sum(shard["timestamp"].to_numpy() < end_s)), name
        assert pa.types.is_list(batches[0].schema.field("genres").type) and len(batches[0].column("dense")[0]) == 4
