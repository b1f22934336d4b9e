"""MovieLens-100k converted the way a team would hold it: daily Hive Parquet plus a Delta table.

The data set ships inside the ``recbole`` wheel (``recbole/dataset_example/ml-100k/``, RecBole's atomic
files: ``ml-100k.inter`` user, item, rating, timestamp; ``ml-100k.user`` age, gender, occupation, zip;
``ml-100k.item`` title, release year, genres). ``make setup`` installs it (``pip install --no-deps
recbole``, pinned in constraints.txt); the package is never imported, only its files are read.

Every rating becomes one row, in time order:

========================  =====================  ===========================================================
column                    type                   what
========================  =====================  ===========================================================
``sample_id``             int64                  position in time order (timestamp, user, item), 0..99 999
``timestamp``             int64                  epoch **seconds** (``columns.ts_unit: s``)
``user_id``, ``item_id``  string                 MovieLens' ids as strings (``"196"``)
``rating``                int32                  1..5: the label's source, never a feature
``liked``                 int32                  label: ``rating >= 4`` (55 % of the rows)
``age``                   int64                  raw years (7..73)
``gender``                string                 ``M`` / ``F``
``occupation``            string                 21 values (``student``, ``engineer``, …)
``zip_code``              string                 795 values, a few not numeric (``T8H1N``)
``title``                 string                 the movie's title
``release_year``          int64, nullable        null for the two items without one
``genres``                list<string>           1-6 of 19 genres (``["Animation", "Children's", "Comedy"]``)
``item_rating_count``     int64                  ratings of the item strictly **before** this one's timestamp
``user_rating_count``     int64                  ratings by the user strictly before this one's timestamp
========================  =====================  ===========================================================

The two counts are causal (only earlier ratings: a rating in the same second is not counted), so
they leak nothing of the row's own or later labels.

Layout under ``--out`` (default ``<data root>/movielens``, where ``examples/movielens/job.yaml``'s
relative paths resolve): the rows are split into two disjoint shards by
``shard_of(sample_id, 2)`` (as ``primus-dagster synth`` splits its batch sources, in spec order), so
the union of the two sources is the data set:

* ``parquet/ratings/dt=YYYY-MM-DD/part-0.parquet`` and an empty ``_SUCCESS`` (shard 0): every day
  from 1997-09-20 to 1998-04-22, an empty file on a day without ratings (1997-12-11, 1997-12-16);
* ``delta/ratings``: a Delta table partitioned by ``dt`` (YYYY-MM-DD) (shard 1), one commit; a day
  without rows has no partition.

Re-running replaces both. About 2 s on one core.

Example::

    .venv/bin/python examples/movielens/convert.py                     # into <data root>/movielens
    .venv/bin/python examples/movielens/convert.py --out /tmp/ml --json
    .venv/bin/primus-dagster validate examples/movielens/job.yaml
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

DAY_S = 86_400
PARQUET_DIR = "parquet/ratings"
DELTA_DIR = "delta/ratings"
SHARDS = 2  # parquet (shard 0), delta (shard 1): the batch sources of examples/movielens/job.yaml, in order

SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("rating", pa.int32(), nullable=False),
        pa.field("liked", pa.int32(), nullable=False),
        pa.field("age", pa.int64()),
        pa.field("gender", pa.string()),
        pa.field("occupation", pa.string()),
        pa.field("zip_code", pa.string()),
        pa.field("title", pa.string()),
        pa.field("release_year", pa.int64()),
        pa.field("genres", pa.list_(pa.string())),
        pa.field("item_rating_count", pa.int64(), nullable=False),
        pa.field("user_rating_count", pa.int64(), nullable=False),
    ]
)
"""The columns of both tables (the Delta table adds its partition column ``dt``)."""


def find_ml100k() -> Path:
    """The directory of ml-100k inside the installed ``recbole`` package (found, not imported).

    Example::

        find_ml100k() / "ml-100k.inter"    # .venv/lib/python3.11/site-packages/recbole/dataset_example/…
    """
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "recbole is not installed: `make setup`, or `.venv/bin/pip install -c constraints.txt --no-deps recbole`"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "dataset_example" / "ml-100k"
    if not (folder / "ml-100k.inter").exists():
        raise FileNotFoundError(f"{folder}: no ml-100k.inter in this recbole")
    return folder


def read_atomic(path: Path, types: dict[str, pa.DataType] | None = None) -> pa.Table:
    """One RecBole atomic file (tab-separated, header ``name:type``) as a table; columns are strings
    unless ``types`` says otherwise.

    Example::

        read_atomic(find_ml100k() / "ml-100k.user").column_names   # ['user_id', 'age', 'gender', …]
    """
    with path.open(encoding="utf-8") as handle:
        names = [field.split(":", 1)[0] for field in handle.readline().rstrip("\n").split("\t")]
    types = types or {}
    return pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(skip_rows=1, column_names=names),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pacsv.ConvertOptions(
            column_types={n: types.get(n, pa.string()) for n in names}, strings_can_be_null=False
        ),
    )


def count_before(keys: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """For each row, the rows with the same key and a strictly earlier ``ts`` (vectorised: one sort).

    >>> count_before(np.array([1, 1, 2, 1]), np.array([10, 10, 5, 30])).tolist()
    [0, 0, 0, 2]
    """
    n = len(keys)
    if not n:
        return np.zeros(0, np.int64)
    order = np.lexsort((ts, keys))  # by key, then time
    k, t, idx = keys[order], ts[order], np.arange(n)
    new_key = np.r_[True, k[1:] != k[:-1]]
    key_start = np.maximum.accumulate(np.where(new_key, idx, 0))
    tie_start = np.maximum.accumulate(np.where(new_key | np.r_[True, t[1:] != t[:-1]], idx, 0))
    out = np.empty(n, np.int64)
    out[order] = tie_start - key_start
    return out


def _lookup(keys: pa.ChunkedArray, side: pa.Table, key: str) -> pa.Table:
    """The rows of ``side`` whose ``key`` equals each of ``keys`` (a left join by index; list columns too)."""
    index = pc.index_in(keys, value_set=side.column(key).combine_chunks())
    return side.drop_columns([key]).take(index)


def ratings(folder: Path) -> pa.Table:
    """All ratings of ml-100k in ``folder`` as :data:`SCHEMA`, in time order (module docstring).

    Example::

        table = ratings(find_ml100k())
        table.num_rows, table["genres"].type             # 100000, list<item: string>
    """
    inter = read_atomic(folder / "ml-100k.inter", {"rating": pa.float64(), "timestamp": pa.float64()})
    users = read_atomic(folder / "ml-100k.user")
    items = read_atomic(folder / "ml-100k.item")
    year = items.column("release_year")
    items = items.set_column(
        items.schema.get_field_index("release_year"),
        "release_year",
        pc.if_else(pc.match_substring_regex(year, r"^\d{4}$"), year, pa.scalar(None, pa.string())).cast(pa.int64()),
    )
    items = items.set_column(items.schema.get_field_index("class"), "genres", pc.split_pattern(items["class"], " "))
    items = items.rename_columns({"movie_title": "title"})
    rows = pa.Table.from_arrays(
        [
            inter["user_id"],
            inter["item_id"],
            pc.cast(inter["rating"], pa.int32()),
            pc.cast(inter["timestamp"], pa.int64()),
        ],
        names=["user_id", "item_id", "rating", "timestamp"],
    )
    order = np.lexsort(
        (
            pc.cast(rows["item_id"], pa.int64()).to_numpy(),
            pc.cast(rows["user_id"], pa.int64()).to_numpy(),
            rows["timestamp"].to_numpy(),
        )
    )
    rows = rows.take(pa.array(order))
    ts = rows["timestamp"].to_numpy()
    user = _lookup(rows["user_id"], users, "user_id")
    item = _lookup(rows["item_id"], items, "item_id")
    codes = {c: rows[c].combine_chunks().dictionary_encode().indices.to_numpy() for c in ("user_id", "item_id")}
    columns: dict[str, Any] = {
        "sample_id": np.arange(len(ts), dtype=np.int64),
        "timestamp": ts,
        "user_id": rows["user_id"],
        "item_id": rows["item_id"],
        "rating": rows["rating"],
        "liked": pc.cast(pc.greater_equal(rows["rating"], 4), pa.int32()),
        "age": pc.cast(user["age"], pa.int64()),
        "gender": user["gender"],
        "occupation": user["occupation"],
        "zip_code": user["zip_code"],
        "title": item["title"],
        "release_year": item["release_year"],
        "genres": item["genres"],
        "item_rating_count": count_before(codes["item_id"], ts),
        "user_rating_count": count_before(codes["user_id"], ts),
    }
    return pa.Table.from_pydict(columns, schema=SCHEMA)


def day_slices(ts: np.ndarray, first: int, last: int) -> list[tuple[date, int, int]]:
    """``(UTC day, first row, end row)`` in the time-sorted epoch seconds ``ts`` of every day from day
    ``first`` to day ``last`` (days since 1970-01-01, inclusive); a day without rows is an empty range.

    >>> day_slices(np.array([0, 10, 2 * DAY_S]), 0, 2)
    [(datetime.date(1970, 1, 1), 0, 2), (datetime.date(1970, 1, 2), 2, 2), (datetime.date(1970, 1, 3), 2, 3)]
    """
    every = np.arange(first, last + 2)
    bounds = np.searchsorted(ts // DAY_S, every)
    epoch = date(1970, 1, 1)
    return [(epoch + timedelta(days=int(d)), int(bounds[i]), int(bounds[i + 1])) for i, d in enumerate(every[:-1])]


def write_parquet(table: pa.Table, root: Path, days: list[tuple[date, int, int]]) -> int:
    """``root/dt=YYYY-MM-DD/part-0.parquet`` then ``_SUCCESS`` for every day (``table`` sorted by time);
    returns the files written.

    Example::

        write_parquet(table, Path("/tmp/ml/parquet/ratings"), day_slices(ts, first, last))   # 215
    """
    shutil.rmtree(root, ignore_errors=True)
    for day, lo, hi in days:
        directory = root / f"dt={day:%Y-%m-%d}"
        directory.mkdir(parents=True)
        pq.write_table(table.slice(lo, hi - lo), directory / "part-0.parquet")
        (directory / "_SUCCESS").touch()
    return len(days)


def write_delta(table: pa.Table, uri: Path) -> int:
    """A Delta table partitioned by ``dt`` (the UTC day of ``timestamp``; one commit); returns its version.

    Example::

        write_delta(table, Path("/tmp/ml/delta/ratings"))    # 0
    """
    from deltalake import DeltaTable, write_deltalake

    shutil.rmtree(uri, ignore_errors=True)
    dt = pc.strftime(pc.cast(table["timestamp"], pa.timestamp("s", tz="UTC")), format="%Y-%m-%d")
    write_deltalake(str(uri), table.append_column("dt", dt), partition_by=["dt"], mode="overwrite")
    return int(DeltaTable(str(uri)).version())


def convert(out: Path, folder: Path | None = None) -> dict[str, Any]:
    """Write both tables under ``out``; returns what was written (rows, days, the shards' rows).

    Example::

        summary = convert(Path("/tmp/ml"))
        summary["rows"], summary["parquet_rows"] + summary["delta_rows"]      # 100000, 100000
    """
    from primus_dagster.synth import shard_of

    table = ratings(folder or find_ml100k())
    shard = shard_of(table["sample_id"], SHARDS)
    parquet = table.filter(pa.array(shard == 0))
    delta = table.filter(pa.array(shard == 1))
    ts = table["timestamp"].to_numpy()
    first, last = int(ts[0]) // DAY_S, int(ts[-1]) // DAY_S
    days = day_slices(ts, first, last)
    covered = day_slices(parquet["timestamp"].to_numpy(), first, last)  # every day, rows of the shard or none
    files = write_parquet(parquet, out / PARQUET_DIR, covered)
    version = write_delta(delta, out / DELTA_DIR)
    return {
        "out": str(out),
        "rows": table.num_rows,
        "liked_rate": round(float(pc.mean(table["liked"]).as_py()), 4),
        "first_day": f"{days[0][0]:%Y-%m-%d}",
        "last_day": f"{days[-1][0]:%Y-%m-%d}",
        "days": len(days),
        "empty_days": [f"{d:%Y-%m-%d}" for d, lo, hi in days if lo == hi],
        "parquet_rows": parquet.num_rows,
        "parquet_files": files,
        "delta_rows": delta.num_rows,
        "delta_version": version,
    }


def _default_out() -> Path:
    from primus_dagster import paths

    return Path(paths.data_root()) / "movielens"


def main(argv: list[str] | None = None) -> int:
    """``python examples/movielens/convert.py [--out DIR] [--ml100k DIR] [--json]``; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write (default: <data root>/movielens, where examples/movielens/job.yaml reads)",
    )
    parser.add_argument("--ml100k", type=Path, default=None, help="ml-100k folder (default: the one in recbole)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args(argv)
    try:
        summary = convert(args.out or _default_out(), args.ml100k)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"ml-100k: {summary['rows']:,} ratings ({summary['liked_rate']:.1%} liked), {summary['first_day']}.."
            f"{summary['last_day']} ({summary['days']} days; none on {', '.join(summary['empty_days']) or '-'}) -> "
            f"{summary['out']}: parquet {summary['parquet_rows']:,} rows in {summary['parquet_files']} days, "
            f"delta {summary['delta_rows']:,} rows (version {summary['delta_version']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
