"""Parquet adapter against real files on disk: layouts, markers, row groups, corrupt files."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from primus_dagster.data.canonical import SchemaMismatchError
from primus_dagster.data.sources import SourceContext, SourceReadError, TimeWindow, make_adapter, scan_partition
from primus_dagster.data.sources.parquet import open_parquet
from primus_dagster.spec import parse_job_spec

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def native(start: datetime, n: int, first_id: int) -> pa.Table:
    rng = np.random.default_rng(first_id)
    ts = [start + timedelta(seconds=int(s)) for s in np.sort(rng.integers(0, 3600, n))]
    return pa.table(
        {
            "sample_id": pa.array(np.arange(first_id, first_id + n), pa.int64()),
            "event_time": pa.array(ts, pa.timestamp("us", tz="UTC")),
            "click": pa.array(rng.integers(0, 2, n), pa.int32()),
            "user_id": pa.array(rng.integers(0, 100, n), pa.int64()),
            "d0": pa.array(rng.random(n), pa.float32()),
            "d1": pa.array(rng.random(n), pa.float32()),
        }
    )


def spec_for(layout: str = "hive", extra: str = "", granularity: str = "hour"):
    text = f"""
name: t
dataset:
  start: 2026-11-01
  streams:
    - name: s
      window: {"1d" if granularity == "day" else "1h"}
      sources:
        - name: src
          type: parquet
          granularity: {granularity}
          path: pq
          layout: {layout}
          {extra}
          columns: {{ts: event_time, label: click, id: sample_id, dense: [d0, d1], sparse: [user_id]}}
"""
    return parse_job_spec(text).dataset.source("src")


def write_hour(root: Path, rel: str, tables: list[pa.Table], marker: bool = True, **kw) -> list[Path]:
    directory = root / "pq" / rel
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, table in enumerate(tables):
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(table, path, **kw)
        paths.append(path)
    if marker:
        (directory / "_SUCCESS").touch()
    return paths


def test_hive_layout_lists_ready_hours_and_reads_all_rows(tmp_path: Path) -> None:
    tables = [native(T0, 100, 0), native(T0, 50, 1000)]
    write_hour(tmp_path, "dt=2026-11-01/hour=00", tables)
    write_hour(tmp_path, "dt=2026-11-01/hour=01", [native(T0 + timedelta(hours=1), 10, 5000)], marker=False)
    adapter = make_adapter(spec_for(), SourceContext(str(tmp_path)))
    parts = adapter.partitions(TimeWindow.hours_from(T0, 3))
    assert [p.ready for p in parts] == [True, False, False]
    assert "_SUCCESS" in parts[1].reason and "does not exist" in parts[2].reason
    assert parts[0].files == 2 and parts[0].bytes > 0
    assert [p.start for p in adapter.ready_partitions(TimeWindow.hours_from(T0, 3))] == [T0]

    tasks = adapter.split(parts[0])
    assert len(tasks) == 2
    got = pa.Table.from_batches([b for t in tasks for b in adapter.read(t)])
    assert sorted(got["sample_id"].to_pylist()) == sorted(
        tables[0]["sample_id"].to_pylist() + tables[1]["sample_id"].to_pylist()
    )
    assert got.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert got.schema.field("dense").type == pa.list_(pa.float32(), 2)
    first = got.slice(0, 1).to_pylist()[0]
    assert first["source"] == "src" and first["kind"] == "batch"
    np.testing.assert_allclose(first["dense"], [tables[0]["d0"][0].as_py(), tables[0]["d1"][0].as_py()])


def test_template_layout_and_daily_granularity(tmp_path: Path) -> None:
    write_hour(tmp_path, "20261101/05", [native(T0 + timedelta(hours=5), 20, 0)])
    adapter = make_adapter(spec_for("template", "template: '{YYYY}{MM}{DD}/{HH}'"), SourceContext(str(tmp_path)))
    part = adapter.partition(T0 + timedelta(hours=5))
    assert part.ready and part.files == 1

    write_hour(tmp_path, "dt=2026-11-02", [native(T0 + timedelta(days=1), 30, 0)])
    daily = make_adapter(spec_for(granularity="day"), SourceContext(str(tmp_path)))
    parts = daily.partitions(TimeWindow(T0, T0 + timedelta(days=2)))
    assert [p.ready for p in parts] == [False, True]
    assert scan_partition(daily, parts[1]).rows == 30


def test_no_marker_configured_means_ready(tmp_path: Path) -> None:
    write_hour(tmp_path, "dt=2026-11-01/hour=00", [native(T0, 5, 0)], marker=False)
    adapter = make_adapter(spec_for(extra="success_marker: null"), SourceContext(str(tmp_path)))
    assert adapter.partition(T0).ready


def test_row_group_split(tmp_path: Path) -> None:
    write_hour(tmp_path, "dt=2026-11-01/hour=00", [native(T0, 10_000, 0)], row_group_size=1000)
    adapter = make_adapter(
        spec_for(extra="split_row_groups: true\n          target_task_bytes: 30000"), SourceContext(str(tmp_path))
    )
    tasks = adapter.split(adapter.partition(T0))
    assert len(tasks) > 2
    assert tasks[0].start == 0 and tasks[-1].stop == 10
    assert all(a.stop == b.start for a, b in itertools.pairwise(tasks))
    ids = [i for t in tasks for b in adapter.read(t) for i in b.column("sample_id").to_pylist()]
    assert sorted(ids) == list(range(10_000))


def test_corrupt_file_is_named_and_others_still_read(tmp_path: Path) -> None:
    paths = write_hour(tmp_path, "dt=2026-11-01/hour=00", [native(T0, 100, 0), native(T0, 70, 1000)])
    data = paths[0].read_bytes()
    paths[0].write_bytes(data[: len(data) // 2] + b"garbage" * 10)  # truncated, footer gone
    adapter = make_adapter(spec_for(), SourceContext(str(tmp_path)))
    part = adapter.partition(T0)
    with pytest.raises(SourceReadError, match=str(paths[0])):
        list(adapter.read(adapter.split(part)[0]))
    scan = scan_partition(adapter, part)
    assert scan.rows == 70
    assert [uri for uri, _ in scan.errors] == [str(paths[0])]


def test_corrupt_page_inside_a_valid_footer(tmp_path: Path) -> None:
    (path,) = write_hour(tmp_path, "dt=2026-11-01/hour=00", [native(T0, 5000, 0)], compression="snappy")
    data = bytearray(path.read_bytes())
    for i in range(200, 2000):  # smash column chunk bytes, keep the footer intact
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    adapter = make_adapter(spec_for(), SourceContext(str(tmp_path)))
    scan = scan_partition(adapter, adapter.partition(T0))
    assert scan.errors and scan.errors[0][0] == str(path)


def test_missing_column_is_a_schema_error_naming_the_file(tmp_path: Path) -> None:
    (path,) = write_hour(tmp_path, "dt=2026-11-01/hour=00", [native(T0, 5, 0).drop_columns(["d1"])])
    adapter = make_adapter(spec_for(), SourceContext(str(tmp_path)))
    with pytest.raises(SchemaMismatchError, match=rf"{path}.*'d1'"):
        list(adapter.read(adapter.split(adapter.partition(T0))[0]))


def test_reads_stream_in_bounded_batches(tmp_path: Path) -> None:
    write_hour(tmp_path, "dt=2026-11-01/hour=00", [native(T0, 20_000, 0)], row_group_size=4096)
    spec = spec_for().model_copy(update={"batch_rows": 1000})
    adapter = make_adapter(spec, SourceContext(str(tmp_path)))
    sizes = [b.num_rows for t in adapter.split(adapter.partition(T0)) for b in adapter.read(t)]
    assert max(sizes) <= 1000 and sum(sizes) == 20_000


def _rss_file_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("RssFile:")[1].split()[0]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_open_parquet_streams_row_groups_and_drops_mapped_pages(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    table = pa.table({"a": rng.random(2_000_000, np.float32), "b": rng.random(2_000_000, np.float32)})
    path = tmp_path / "big.parquet"  # 16 MB of incompressible floats, 3 row groups of 700 000 rows at most
    pq.write_table(table, path, row_group_size=700_000, compression="none", use_dictionary=False)
    with open_parquet(str(path)) as parquet:
        before, peak, sizes, parts = _rss_file_bytes(), 0, [], []
        for batch in parquet.iter_batches(batch_size=65_536, use_threads=False):
            peak = max(peak, _rss_file_bytes() - before)
            sizes.append(batch.num_rows)
            parts.append(batch)
        assert pa.Table.from_batches(parts).equals(table)
        assert sizes.count(700_000 % 65_536) == 2  # batches end at each row group's end
        assert peak < 4 * 2**20  # the file's 16 MB of mapped pages do not stay resident
        assert sum(b.num_rows for b in parquet.iter_batches(row_groups=[2], use_threads=False)) == 600_000
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(pa.ArrowInvalid):
        open_parquet(str(tmp_path / "empty.parquet"))


def test_fsspec_memory_filesystem() -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    with fs.open("/bucket/pq/dt=2026-11-01/hour=00/part-0.parquet", "wb") as handle:
        pq.write_table(native(T0, 42, 0), handle)
    fs.touch("/bucket/pq/dt=2026-11-01/hour=00/_SUCCESS")
    spec = spec_for().model_copy(update={"path": "memory://bucket/pq"})
    adapter = make_adapter(spec, SourceContext("/unused"))
    assert scan_partition(adapter, adapter.partition(T0)).rows == 42
