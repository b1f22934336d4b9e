"""DeltaSource against real Delta tables written with deltalake in tmp_path."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from primus_dagster.data.graph import TaskBlock
from primus_dagster.data.sources.base import (
    SourceContext,
    SourceReadError,
    TimeWindow,
)
from primus_dagster.data.sources.delta import (
    DeltaLogError,
    DeltaSource,
    DeltaTableNotFoundError,
    UnsupportedDeltaFeatureError,
    broken_log_entry,
    check_reader_protocol,
)
from primus_dagster.spec.sources import DeltaSourceSpec

from native_testkit import DENSE, SPARSE, T0, assert_corrupt_file_fails_alone, assert_same_rows, read_all
from native_testkit import native_rows as base_rows


def native_rows(start: datetime, n: int, first_id: int, daily: bool = False) -> pa.Table:
    """Native rows inside the hour (or day) at ``start``, plus the Delta partition columns."""
    table = base_rows(start, n, first_id, span_s=86_400 if daily else 3_600)
    table = table.append_column("dt", pa.array([start.date().isoformat()] * n, pa.string()))
    if not daily:
        table = table.append_column("hour", pa.array([start.hour] * n, pa.int32()))
    return table


def make_spec(
    uri: str, granularity: str = "hour", batch_rows: int = 65536, dense: list[str] = DENSE
) -> DeltaSourceSpec:
    return DeltaSourceSpec.model_validate(
        {
            "name": "imp_delta",
            "type": "delta",
            "uri": uri,
            "granularity": granularity,
            "batch_rows": batch_rows,
            "columns": {"ts": "event_time", "label": "click", "id": "sample_id", "dense": dense, "sparse": SPARSE},
        }
    )


def append(path: Path, table: pa.Table, daily: bool = False, **kwargs: object) -> None:
    write_deltalake(str(path), table, mode="append", partition_by=["dt"] if daily else ["dt", "hour"], **kwargs)


@pytest.fixture()
def hourly(tmp_path: Path) -> tuple[Path, dict[int, pa.Table]]:
    """Hours 0, 1 and 3 (not 2); two appends, so two files per hour; versions 0 and 1."""
    path = tmp_path / "imp"
    written: dict[int, list[pa.Table]] = {0: [], 1: [], 3: []}
    for k in range(2):
        parts = [native_rows(T0 + timedelta(hours=h), 40 + h, 10_000 * k + 1000 * h) for h in written]
        for h, part in zip(written, parts, strict=True):
            written[h].append(part)
        append(path, pa.concat_tables(parts))
    return path, {h: pa.concat_tables(ts) for h, ts in written.items()}


def test_partitions_list_files_rows_version_and_readiness(hourly, tmp_path: Path) -> None:
    path, written = hourly
    source = DeltaSource(make_spec("imp"), SourceContext(data_root=str(tmp_path)))
    parts = source.partitions(TimeWindow.hours_from(T0, 4))
    assert [p.start for p in parts] == [T0 + timedelta(hours=h) for h in range(4)]
    assert [p.ready for p in parts] == [True, True, False, True]
    assert all(p.version == "1" for p in parts) and source.version() == "1"
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    for part, hour in zip(parts, range(4), strict=True):
        mine = [a for a in actions if a["partition.hour"] == hour]
        assert part.files == len(mine) == (0 if hour == 2 else 2)
        assert part.bytes == sum(a["size_bytes"] for a in mine)
        assert part.rows == (written[hour].num_rows if hour in written else 0)
    assert "hour=2" in parts[2].reason and "version 1" in parts[2].reason
    assert source.split(parts[2]) == []


def test_split_and_read_return_exactly_the_written_rows(hourly, tmp_path: Path) -> None:
    path, written = hourly
    source = DeltaSource(make_spec(str(path), batch_rows=16), SourceContext())
    part = source.partition(T0 + timedelta(hours=1))
    tasks = source.split(part)
    assert len(tasks) == 2 and {t.version for t in tasks} == {"1"}
    assert all(Path(t.uri).is_file() and t.uri.startswith(str(path)) for t in tasks)
    assert sum(t.rows for t in tasks) == part.rows and sum(t.size_bytes for t in tasks) == part.bytes
    batches = [b for t in tasks for b in source.read(t)]
    assert max(b.num_rows for b in batches) <= 16 and len(batches) > 2
    assert batches[0].schema == source.normalize.schema
    assert_same_rows(pa.Table.from_batches(batches), written[1])
    # a fresh adapter (as on a data executor) splits the same partition from its pinned version
    again = DeltaSource(make_spec(str(path)), SourceContext()).split(part)
    assert again == tasks


def test_daily_table(tmp_path: Path) -> None:
    path = tmp_path / "daily"
    days = [native_rows(T0 + timedelta(days=d), 30, 1000 * d, daily=True) for d in (0, 2)]
    for _ in range(2):
        append(path, pa.concat_tables(days).slice(0, 30), daily=True)  # day 0 twice (two files)
    append(path, days[1], daily=True)
    source = DeltaSource(make_spec(str(path), granularity="day"), SourceContext())
    parts = source.partitions(TimeWindow(T0, T0 + timedelta(days=3)))
    assert [(p.ready, p.files, p.rows) for p in parts] == [(True, 2, 60), (False, 0, 0), (True, 1, 30)]
    assert parts[0].end - parts[0].start == timedelta(days=1) and parts[0].version == "2"
    table = read_all(source, source.split(parts[2]))
    assert_same_rows(table, days[1])


def test_reading_is_pinned_to_the_listed_version(hourly) -> None:
    path, written = hourly
    source = DeltaSource(make_spec(str(path)), SourceContext())
    part = source.partition(T0)
    tasks = source.split(part)
    append(path, native_rows(T0, 25, 99_000))  # a third file in hour 0, version 2
    assert_same_rows(read_all(source, tasks), written[0])
    newer = source.partition(T0)
    assert (newer.version, newer.files, newer.rows) == ("2", 3, written[0].num_rows + 25)
    assert part.version == "1" and len(source.split(part)) == 2  # cached listing of version 1
    fresh = DeltaSource(make_spec(str(path)), SourceContext())
    assert fresh.split(part) == tasks  # re-listed at version 1, not the current version 2


def test_missing_table_names_the_uri(tmp_path: Path) -> None:
    source = DeltaSource(make_spec("nowhere/imp"), SourceContext(data_root=str(tmp_path)))
    with pytest.raises(DeltaTableNotFoundError, match=str(tmp_path / "nowhere" / "imp")):
        source.partitions(TimeWindow.hours_from(T0, 1))


@pytest.mark.parametrize(
    "config,feature",
    [
        ({"delta.enableDeletionVectors": "true"}, "deletionVectors"),
        ({"delta.columnMapping.mode": "name"}, "columnMapping"),
    ],
)
def test_unsupported_reader_features_are_refused(tmp_path: Path, config: dict, feature: str) -> None:
    path = tmp_path / "feat"
    append(path, native_rows(T0, 5, 0), configuration=config)
    source = DeltaSource(make_spec(str(path)), SourceContext())
    with pytest.raises(UnsupportedDeltaFeatureError, match=feature):
        source.partitions(TimeWindow.hours_from(T0, 1))


def test_reader_protocol_check() -> None:
    check_reader_protocol("t", 1, None)
    check_reader_protocol("t", 3, ["timestampNtz", "variantType", "v2Checkpoint"])
    check_reader_protocol("t", 2, None, {"delta.columnMapping.mode": "none"})
    with pytest.raises(UnsupportedDeltaFeatureError, match="deletionVectors"):
        check_reader_protocol("t", 3, ["deletionVectors"])
    with pytest.raises(UnsupportedDeltaFeatureError, match="someFutureFeature"):
        check_reader_protocol("t", 3, ["someFutureFeature"])
    with pytest.raises(UnsupportedDeltaFeatureError, match="minReaderVersion=4"):
        check_reader_protocol("t", 4, None)


def test_corrupt_file_fails_alone_and_names_the_file(hourly) -> None:
    path, written = hourly
    source = DeltaSource(make_spec(str(path)), SourceContext())
    assert_corrupt_file_fails_alone(source, source.partition(T0), written[0])
    _, bad = source.split(source.partition(T0))
    Path(bad.uri).unlink()
    with pytest.raises(SourceReadError, match="vacuumed"):
        list(source.read(bad))


def test_column_added_later_reads_as_null_in_older_files_repaired_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "evolve"
    old = native_rows(T0, 10, 0)
    append(path, old)
    new = native_rows(T0, 10, 100)
    append(path, new.append_column("d13", pa.array(np.ones(10, np.float32))), schema_mode="merge")
    source = DeltaSource(make_spec(str(path), dense=[*DENSE, "d13"]), SourceContext())
    table = read_all(source, source.split(source.partition(T0))).sort_by("sample_id")
    extra = table.column("dense").combine_chunks().flatten().to_numpy().reshape(-1, 14)[:, 13]
    assert np.isnan(extra[:10]).all() and (extra[10:] == 1).all()  # dense_invalid: repair (null -> missing)
    assert source.normalize.take() == {"dense_invalid": 10}


def test_a_corrupt_log_entry_is_named_with_the_table(hourly) -> None:
    path, _ = hourly
    entry = sorted((path / "_delta_log").glob("*.json"))[-1]
    entry.write_text('{"add": {"path": "part-broken.parquet", "size": \n')
    source = DeltaSource(make_spec(str(path)), SourceContext())
    with pytest.raises(DeltaLogError) as caught:
        source.partitions(TimeWindow.hours_from(T0, 1))
    message = str(caught.value)
    assert f"{path}/_delta_log/{entry.name} line 1: not valid JSON" in message
    assert "source 'imp_delta'" in message and "delta-rs:" in message


def test_broken_log_entry_finds_the_first_bad_line() -> None:
    good = b'{"commitInfo": {}}\n{"add": {"path": "a.parquet"}}\n'
    assert broken_log_entry([("1.json", good), ("0.json", good)]) is None
    assert broken_log_entry([("1.json", good + b"[1]\n")]) == "1.json line 3: not a JSON object (a list)"
    assert broken_log_entry([("1.json", b"\xff")]).startswith("1.json: not UTF-8")  # type: ignore[union-attr]


def test_a_log_that_parses_but_delta_rs_refuses_names_its_newest_entry(hourly) -> None:
    path, _ = hourly
    entry = sorted((path / "_delta_log").glob("*.json"))[-1]
    entry.write_text('{"add": {"path": "x.parquet"}}\n')  # JSON, but not a valid add action
    with pytest.raises(DeltaLogError, match=f"newest entry {path}/_delta_log/{entry.name}"):
        DeltaSource(make_spec(str(path)), SourceContext()).partitions(TimeWindow.hours_from(T0, 1))


def test_a_pack_of_a_partition_s_files_reads_their_rows_in_full_batches(hourly) -> None:
    path, written = hourly
    source = DeltaSource(make_spec(str(path), batch_rows=16), SourceContext())
    part = source.partition(T0 + timedelta(hours=1))
    files = source.split(part)
    pack = TaskBlock.from_tasks(part.start, part.version, files).read_pack(0, len(files), source.spec.name)
    assert [m[0] for m in pack.members] == [t.uri for t in files] and pack.version == "1"
    batches = list(source.read(pack))
    assert [b.num_rows for b in batches] == [16] * 5 + [2]  # 2 files of 41 rows: batches across the files
    assert_same_rows(pa.Table.from_batches(batches), written[1])
    assert pa.Table.from_batches(batches).equals(read_all(source, files))
