"""IcebergSource against real Iceberg tables in a SQLite SqlCatalog under tmp_path.

Data files are written with pyarrow and committed with ``Table.add_files`` (one snapshot per
call): pyiceberg's ``append`` into an ``hour(ts)``-partitioned table needs the optional
``pyiceberg-core`` package, which the adapter itself does not.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.memory import InMemoryCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import DataScan, Table
from pyiceberg.transforms import DayTransform, HourTransform

from primus_dagster.data.graph import TaskBlock
from primus_dagster.data.sources.base import (
    SourceContext,
    TimeWindow,
)
from primus_dagster.data.sources.iceberg import (
    IcebergSource,
    IcebergTableNotFoundError,
    load_catalog_for,
)
from primus_dagster.spec.sources import IcebergSourceSpec

from native_testkit import DENSE, SPARSE, T0, assert_corrupt_file_fails_alone, assert_same_rows, native_rows, read_all

_files = itertools.count()


def make_spec(
    table: str = "primus.imp", granularity: str = "hour", batch_rows: int = 65536, **catalog: object
) -> IcebergSourceSpec:
    return IcebergSourceSpec.model_validate(
        {
            "name": "imp_iceberg",
            "type": "iceberg",
            "table": table,
            "granularity": granularity,
            "batch_rows": batch_rows,
            "catalog": catalog,
            "columns": {"ts": "event_time", "label": "click", "id": "sample_id", "dense": DENSE, "sparse": SPARSE},
        }
    )


def create_table(spec: IcebergSourceSpec, ctx: SourceContext, transform: object) -> Table:
    catalog = load_catalog_for(spec, ctx)
    catalog.create_namespace_if_not_exists(spec.table.split(".")[0])
    table = catalog.create_table(spec.table, schema=native_rows(T0, 1, 0).schema)
    with table.update_spec() as update:
        update.add_field("event_time", transform, "event_time_part")
    return table


def commit(table: Table, parts: list[pa.Table]) -> list[str]:
    """Write each part to its own Parquet file under the warehouse and commit them as one snapshot."""
    base = table.location().removeprefix("file://")
    paths = []
    for part in parts:
        path = f"{base}/data/f{next(_files):04d}.parquet"
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, path)
        paths.append(path)
    table.add_files(paths)
    return paths


@pytest.fixture()
def hourly(tmp_path: Path) -> tuple[IcebergSourceSpec, SourceContext, Table, dict[int, pa.Table]]:
    """Hours 0, 1 and 3 (not 2); two commits, so two files per hour."""
    spec, ctx = make_spec(), SourceContext(data_root=str(tmp_path))
    table = create_table(spec, ctx, HourTransform())
    written: dict[int, list[pa.Table]] = {0: [], 1: [], 3: []}
    for k in range(2):
        parts = [native_rows(T0 + timedelta(hours=h), 40 + h, 10_000 * k + 1000 * h) for h in written]
        for h, part in zip(written, parts, strict=True):
            written[h].append(part)
        commit(table, parts)
    return spec, ctx, table, {h: pa.concat_tables(ts) for h, ts in written.items()}


def test_default_catalog_is_sqlite_under_the_data_root(tmp_path: Path) -> None:
    ctx = SourceContext(data_root=str(tmp_path / "root"))
    catalog = load_catalog_for(make_spec(), ctx)
    assert isinstance(catalog, SqlCatalog) and catalog.name == "primus"
    assert catalog.properties["uri"] == f"sqlite:///{tmp_path}/root/iceberg/catalog.db"
    assert catalog.properties["warehouse"] == f"file://{tmp_path}/root/iceberg/warehouse"
    assert (tmp_path / "root" / "iceberg").is_dir()
    other = load_catalog_for(
        make_spec(name="mem", properties={"type": "in-memory", "warehouse": f"file://{tmp_path}/m"}), ctx
    )
    assert isinstance(other, InMemoryCatalog) and other.name == "mem"
    custom = load_catalog_for(make_spec(warehouse="wh2", properties={"echo": "false"}), ctx)
    assert custom.properties["warehouse"] == f"file://{tmp_path}/root/wh2" and custom.properties["echo"] == "false"


def test_partitions_list_files_rows_version_and_readiness(hourly) -> None:
    spec, ctx, table, written = hourly
    source = IcebergSource(spec, ctx)
    parts = source.partitions(TimeWindow.hours_from(T0, 4))
    snapshot = str(table.current_snapshot().snapshot_id)
    assert source.version() == snapshot and all(p.version == snapshot for p in parts)
    assert [p.start for p in parts] == [T0 + timedelta(hours=h) for h in range(4)]
    assert [p.ready for p in parts] == [True, True, False, True]
    assert [p.files for p in parts] == [2, 2, 0, 2]
    assert [p.rows for p in parts] == [written[h].num_rows if h in written else 0 for h in range(4)]
    for part in parts:
        sizes = [Path(t.uri).stat().st_size for t in source.split(part)] if part.ready else []
        assert part.bytes == sum(sizes)
    assert snapshot in parts[2].reason
    assert source.split(parts[2]) == []


def test_split_and_read_return_exactly_the_written_rows(hourly) -> None:
    spec, ctx, _table, written = hourly
    source = IcebergSource(spec.model_copy(update={"batch_rows": 16}), ctx)
    part = source.partition(T0 + timedelta(hours=1))
    tasks = source.split(part)
    assert len(tasks) == 2 and {t.version for t in tasks} == {part.version}
    assert sum(t.rows for t in tasks) == part.rows and sum(t.size_bytes for t in tasks) == part.bytes
    batches = [b for t in tasks for b in source.read(t)]
    assert [b.num_rows for b in batches] == [16, 16, 9, 16, 16, 9]  # 41 rows per file, rebatched
    assert batches[0].schema == source.normalize.schema
    assert_same_rows(pa.Table.from_batches(batches), written[1])
    fresh = IcebergSource(spec, ctx)  # as on a data executor: re-plans at the pinned snapshot
    assert fresh.split(part) == tasks


@pytest.mark.parametrize("direct", [True, False], ids=["direct-parquet", "pyiceberg-reader"])
def test_both_read_paths_agree(hourly, monkeypatch, direct: bool) -> None:
    """Files with delete files or renamed columns go through pyiceberg's reader; both give the rows."""
    spec, ctx, _, written = hourly
    source = IcebergSource(spec, ctx)
    used: list[bool] = []
    original = source._direct_reader

    def spy(*args):
        reader = original(*args) if direct else None
        used.append(reader is not None)
        return reader

    monkeypatch.setattr(source, "_direct_reader", spy)
    part = source.partition(T0 + timedelta(hours=1))
    assert_same_rows(read_all(source, source.split(part)), written[1])
    assert used and all(u == direct for u in used)


def test_daily_table(tmp_path: Path) -> None:
    spec, ctx = make_spec(table="primus.daily", granularity="day"), SourceContext(data_root=str(tmp_path))
    table = create_table(spec, ctx, DayTransform())
    days = [native_rows(T0 + timedelta(days=d), 30, 1000 * d, span_s=86_400) for d in (0, 2)]
    commit(table, days)
    commit(table, [native_rows(T0, 5, 5000, span_s=86_400)])
    source = IcebergSource(spec, ctx)
    parts = source.partitions(TimeWindow(T0, T0 + timedelta(days=3)))
    assert [(p.ready, p.files, p.rows) for p in parts] == [(True, 2, 35), (False, 0, 0), (True, 1, 30)]
    assert parts[0].end - parts[0].start == timedelta(days=1)
    assert_same_rows(read_all(source, source.split(parts[2])), days[1])


def test_hourly_source_over_a_daily_table_filters_rows(tmp_path: Path) -> None:
    spec, ctx = make_spec(table="primus.coarse"), SourceContext(data_root=str(tmp_path))
    table = create_table(spec, ctx, DayTransform())
    rows = native_rows(T0, 200, 0, span_s=4 * 3600)
    commit(table, [rows])
    source = IcebergSource(spec, ctx)
    part = source.partition(T0 + timedelta(hours=2))
    assert part.ready and part.files == 1
    hour = T0 + timedelta(hours=2)
    mask = [hour <= t < hour + timedelta(hours=1) for t in rows.column("event_time").to_pylist()]
    assert_same_rows(read_all(source, source.split(part)), rows.filter(pa.array(mask)))


def test_reading_is_pinned_to_the_listed_snapshot(hourly) -> None:
    spec, ctx, table, written = hourly
    source = IcebergSource(spec, ctx)
    part = source.partition(T0)
    tasks = source.split(part)
    commit(table, [native_rows(T0, 25, 99_000)])
    assert_same_rows(read_all(source, tasks), written[0])
    newer = source.partition(T0)
    assert newer.version != part.version and (newer.files, newer.rows) == (3, written[0].num_rows + 25)
    assert IcebergSource(spec, ctx).split(part) == tasks  # re-planned at the old snapshot


def test_missing_table_names_identifier_and_catalog(tmp_path: Path) -> None:
    ctx = SourceContext(data_root=str(tmp_path))
    for ident in ("primus.nope", "nons.nope"):
        source = IcebergSource(make_spec(table=ident), ctx)
        with pytest.raises(IcebergTableNotFoundError, match=rf"{ident}.*catalog 'primus'.*catalog\.db"):
            source.partitions(TimeWindow.hours_from(T0, 1))


def test_corrupt_file_fails_alone_and_names_the_file(hourly) -> None:
    spec, ctx, _table, written = hourly
    source = IcebergSource(spec, ctx)
    assert_corrupt_file_fails_alone(source, source.partition(T0), written[0])


def test_read_recuts_filtered_batches_to_exact_sizes(tmp_path: Path) -> None:
    """An hourly source over a daily table keeps a few rows of each batch it reads from the file (the
    rows of the hours are shuffled through it): ``read`` joins them into batches of exactly
    ``batch_rows``, the last one shorter."""
    spec, ctx = make_spec(table="primus.recut", batch_rows=16), SourceContext(data_root=str(tmp_path))
    table = create_table(spec, ctx, DayTransform())
    rows = native_rows(T0, 400, 0, span_s=4 * 3600)
    rows = rows.take(np.random.default_rng(7).permutation(rows.num_rows))
    commit(table, [rows])
    source = IcebergSource(spec, ctx)
    hour = T0 + timedelta(hours=2)
    batches = [b for t in source.split(source.partition(hour)) for b in source.read(t)]
    mask = [hour <= t < hour + timedelta(hours=1) for t in rows.column("event_time").to_pylist()]
    expected = rows.filter(pa.array(mask))
    full, rest = divmod(expected.num_rows, 16)
    assert full >= 3 and [b.num_rows for b in batches] == [16] * full + ([rest] if rest else [])
    assert_same_rows(pa.Table.from_batches(batches), expected)


def test_a_pack_of_a_partition_s_files_reads_their_rows_in_full_batches(hourly, monkeypatch) -> None:
    spec, ctx, _table, written = hourly
    source = IcebergSource(spec.model_copy(update={"batch_rows": 16}), ctx)
    part = source.partition(T0 + timedelta(hours=1))
    files = source.split(part)
    pack = TaskBlock.from_tasks(part.start, part.version, files).read_pack(0, len(files), spec.name)
    plans: list[int] = []
    plan_files = DataScan.plan_files
    monkeypatch.setattr(DataScan, "plan_files", lambda scan: plans.append(1) or plan_files(scan))
    batches = list(IcebergSource(spec.model_copy(update={"batch_rows": 16}), ctx).read(pack))
    assert len(plans) == 1  # the partition's scan is planned once for the pack's files
    assert [b.num_rows for b in batches] == [16] * 5 + [2]  # 2 files of 41 rows: batches across the files
    assert_same_rows(pa.Table.from_batches(batches), written[1])
