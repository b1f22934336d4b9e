"""Listed files stay inside the data root: symlinks (and log / catalog paths) leading out fail the listing.

Real files, Delta tables and Iceberg tables in tmp_path, real symlinks (``os.symlink``): the adapters refuse
with :class:`PathOutsideRootError` naming the source, the link and its target; the planner reports it as a
listing failure of the partition (state ``error``). Ordinary relative paths, templates and symlinks that
stay inside the root keep working, and an absolute location is the explicit opt-out (its files must then
stay inside it).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.transforms import HourTransform

from primus_dagster.data.graph.planner import Planner
from primus_dagster.data.sources import PathOutsideRootError, SourceContext, TimeWindow, make_adapter
from primus_dagster.data.sources.delta import DeltaSource
from primus_dagster.data.sources.iceberg import IcebergSource, load_catalog_for
from primus_dagster.spec import parse_job_spec
from primus_dagster.spec.sources import DeltaSourceSpec, IcebergSourceSpec

from native_testkit import DENSE, SPARSE, T0, assert_same_rows, native_rows, read_all

HOUR = "dt=2024-03-01/hour=00"
COLUMNS = {"ts": "event_time", "label": "click", "id": "sample_id", "dense": DENSE, "sparse": SPARSE}


def job_text(where: str) -> str:
    return f"""
name: t
dataset:
  start: 2024-03-01
  streams:
    - name: s
      window: 1h
      sources:
        - {{name: src, type: parquet, {where}, columns: {json.dumps(COLUMNS)}}}
"""


def parquet_spec(where: str = "path: pq"):
    return parse_job_spec(job_text(where)).dataset.source("src")


def write_dir(directory: Path, rows: pa.Table, name: str = "part-0.parquet") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, directory / name)
    (directory / "_SUCCESS").touch()
    return directory / name


@pytest.fixture()
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    return root, outside


def refused(call, *needles: str) -> str:
    with pytest.raises(PathOutsideRootError) as info:
        call()
    text = str(info.value)
    assert "source 'src'" in text
    for needle in needles:
        assert needle in text, text
    return text


# ---- Parquet --------------------------------------------------------------------------------
def test_parquet_data_file_symlinked_out_of_the_root_fails_the_listing(dirs) -> None:
    root, outside = dirs
    secret = write_dir(outside, native_rows(T0, 5, 0), "secret.parquet")
    hour = write_dir(root / "pq" / HOUR, native_rows(T0, 10, 100))
    os.symlink(secret, hour.parent / "part-1.parquet")
    adapter = make_adapter(parquet_spec(), SourceContext(str(root)))
    refused(
        lambda: adapter.partitions(TimeWindow.hours_from(T0, 1)),
        f"symlink {hour.parent / 'part-1.parquet'} -> {secret}",
        "leaves the data root",
    )


@pytest.mark.parametrize("linked", ["pq", "pq/dt=2024-03-01", f"pq/{HOUR}"])
def test_parquet_directory_symlinked_out_of_the_root_fails_the_listing(dirs, linked: str) -> None:
    root, outside = dirs
    target = outside / "real"
    write_dir(target / Path(f"pq/{HOUR}").relative_to(linked), native_rows(T0, 10, 0))
    (root / linked).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, root / linked)
    adapter = make_adapter(parquet_spec(), SourceContext(str(root)))
    refused(lambda: adapter.partitions(TimeWindow.hours_from(T0, 1)), f"symlink {root / linked} -> {target}")


def test_the_planner_reports_a_symlink_out_as_a_listing_failure(dirs) -> None:
    root, outside = dirs
    hour = write_dir(root / "pq" / HOUR, native_rows(T0, 10, 0))
    os.symlink(write_dir(outside, native_rows(T0, 5, 50), "x.parquet"), hour.parent / "part-1.parquet")
    job = parse_job_spec(job_text("path: pq"))
    with Planner.for_job(job, SourceContext(str(root))) as planner:
        plan = planner.plan(TimeWindow.hours_from(T0, 1))
    (missing,) = plan.not_ready
    assert missing.state == "error" and len(plan.tasks) == 0
    assert missing.reason.startswith("listing failed: PathOutsideRootError: source 'src'")
    assert f"-> {outside / 'x.parquet'}" in missing.reason


def test_symlinks_inside_the_root_relative_paths_and_templates_still_work(dirs) -> None:
    root, _ = dirs
    rows = native_rows(T0, 30, 0)
    shared = write_dir(root / "shared", rows, "data.parquet")
    hour = root / "pq" / "20240301" / "00"
    hour.mkdir(parents=True)
    os.symlink(shared, hour / "part-0.parquet")  # a link that stays inside the root
    (hour / "_SUCCESS").touch()
    template = "layout: template, template: '{YYYY}{MM}{DD}/{HH}'"
    adapter = make_adapter(parquet_spec(f"path: ./pq/../pq, {template}"), SourceContext(str(root)))
    (part,) = adapter.partitions(TimeWindow.hours_from(T0, 1))
    assert part.ready and part.files == 1
    assert_same_rows(read_all(adapter, adapter.split(part)), rows)


def test_an_absolute_path_is_the_opt_out_and_its_files_stay_inside_it(dirs) -> None:
    root, outside = dirs
    rows = native_rows(T0, 20, 0)
    hour = write_dir(outside / "pq" / HOUR, rows)
    adapter = make_adapter(parquet_spec(f"path: {outside / 'pq'}"), SourceContext(str(root)))
    (part,) = adapter.partitions(TimeWindow.hours_from(T0, 1))  # outside the data root, explicitly
    assert_same_rows(read_all(adapter, adapter.split(part)), rows)
    os.symlink(write_dir(root, native_rows(T0, 5, 90), "r.parquet"), hour.parent / "part-1.parquet")
    refused(lambda: adapter.partitions(TimeWindow.hours_from(T0, 1)), "leaves the source location", "-> ")


@pytest.mark.parametrize("location", ["file://../x", "file://x", "../x"])
def test_resolve_refuses_relative_file_uris_and_dot_dot(location: str) -> None:
    with pytest.raises(PathOutsideRootError, match=r"the data root '/data'"):
        SourceContext("/data").resolve(location)


# ---- Delta ------------------------------------------------------------------------------------
def delta_rows(n: int, first: int) -> pa.Table:
    rows = native_rows(T0, n, first)
    rows = rows.append_column("dt", pa.array([T0.date().isoformat()] * n, pa.string()))
    return rows.append_column("hour", pa.array([0] * n, pa.int32()))


def delta_spec(uri: str) -> DeltaSourceSpec:
    return DeltaSourceSpec.model_validate({"name": "src", "type": "delta", "uri": uri, "columns": COLUMNS})


def write_delta(path: Path, rows: pa.Table) -> None:
    write_deltalake(str(path), rows, mode="append", partition_by=["dt", "hour"])


def test_delta_data_file_symlinked_out_fails_the_listing(dirs) -> None:
    root, outside = dirs
    write_delta(root / "delta" / "t", delta_rows(10, 0))
    (data,) = (root / "delta" / "t").rglob("*.parquet")
    moved = outside / "moved.parquet"
    shutil.move(data, moved)
    os.symlink(moved, data)
    source = DeltaSource(delta_spec("delta/t"), SourceContext(str(root)))
    refused(lambda: source.partitions(TimeWindow.hours_from(T0, 1)), f"symlink {data} -> {moved}")


def test_delta_table_behind_a_symlink_out_fails_before_its_log_is_read(dirs) -> None:
    root, outside = dirs
    write_delta(outside / "t", delta_rows(10, 0))
    os.symlink(outside, root / "delta")
    source = DeltaSource(delta_spec("delta/t"), SourceContext(str(root)))
    refused(lambda: source.partitions(TimeWindow.hours_from(T0, 1)), f"symlink {root / 'delta'} -> {outside}")


def test_delta_log_path_outside_the_root_fails_the_listing(dirs) -> None:
    root, outside = dirs
    table = root / "delta" / "t"
    write_delta(table, delta_rows(10, 0))
    stray = outside / "stray.parquet"
    pq.write_table(delta_rows(5, 500).drop_columns(["dt", "hour"]), stray)
    add = {
        "path": f"file://{stray}",
        "partitionValues": {"dt": T0.date().isoformat(), "hour": "0"},
        "size": stray.stat().st_size,
        "modificationTime": int(time.time() * 1000),
        "dataChange": True,
    }
    (table / "_delta_log" / "00000000000000000001.json").write_text(json.dumps({"add": add}) + "\n")
    source = DeltaSource(delta_spec("delta/t"), SourceContext(str(root)))
    refused(lambda: source.partitions(TimeWindow.hours_from(T0, 1)), f"{stray} resolves to {stray}, outside")


def test_delta_inside_the_root_and_an_absolute_file_uri_both_read(dirs) -> None:
    root, outside = dirs
    rows = delta_rows(12, 0)
    write_delta(root / "delta" / "t", rows)
    write_delta(outside / "t", rows)
    for uri in ("delta/t", f"file://{outside / 't'}"):
        source = DeltaSource(delta_spec(uri), SourceContext(str(root)))
        (part,) = source.partitions(TimeWindow.hours_from(T0, 1))
        assert_same_rows(read_all(source, source.split(part)), rows)


# ---- Iceberg ----------------------------------------------------------------------------------
def iceberg_spec(**catalog: object) -> IcebergSourceSpec:
    return IcebergSourceSpec.model_validate(
        {"name": "src", "type": "iceberg", "table": "primus.imp", "catalog": catalog, "columns": COLUMNS}
    )


def iceberg_with(spec: IcebergSourceSpec, ctx: SourceContext, files: list[Path]) -> None:
    catalog = load_catalog_for(spec, ctx)
    catalog.create_namespace_if_not_exists("primus")
    table = catalog.create_table(spec.table, schema=native_rows(T0, 1, 0).schema)
    with table.update_spec() as update:
        update.add_field("event_time", HourTransform(), "event_time_part")
    table.add_files([str(f) for f in files])
    assert isinstance(catalog, SqlCatalog)
    catalog.engine.dispose()


def test_iceberg_data_file_outside_the_root_fails_the_listing(dirs) -> None:
    root, outside = dirs
    spec, ctx = iceberg_spec(), SourceContext(str(root))
    stray = outside / "stray.parquet"
    pq.write_table(native_rows(T0, 8, 0), stray)
    iceberg_with(spec, ctx, [stray])
    with IcebergSource(spec, ctx) as source:
        refused(lambda: source.partitions(TimeWindow.hours_from(T0, 1)), f"{stray}", "outside the data root")


def test_iceberg_data_file_symlinked_out_fails_and_one_inside_reads(dirs) -> None:
    root, outside = dirs
    spec, ctx = iceberg_spec(), SourceContext(str(root))
    rows = native_rows(T0, 8, 0)
    data = root / "iceberg" / "warehouse" / "files"
    data.mkdir(parents=True)
    pq.write_table(rows, data / "a.parquet")
    iceberg_with(spec, ctx, [data / "a.parquet"])
    with IcebergSource(spec, ctx) as source:
        (part,) = source.partitions(TimeWindow.hours_from(T0, 1))
        assert_same_rows(read_all(source, source.split(part)), rows)
    moved = outside / "a.parquet"
    shutil.move(data / "a.parquet", moved)
    os.symlink(moved, data / "a.parquet")
    with IcebergSource(spec, ctx) as source:
        refused(lambda: source.partitions(TimeWindow.hours_from(T0, 1)), f"symlink {data / 'a.parquet'} -> {moved}")


def test_iceberg_properties_warehouse_resolves_inside_the_data_root(dirs) -> None:
    root, _ = dirs
    spec = iceberg_spec(properties={"warehouse": "wh3"})
    catalog = load_catalog_for(spec, SourceContext(str(root)))
    assert isinstance(catalog, SqlCatalog)
    assert catalog.properties["warehouse"] == f"file://{root}/wh3"  # not ./wh3 of the working directory
    catalog.engine.dispose()


def test_a_broken_symlink_fails_the_listing_instead_of_being_skipped(dirs) -> None:
    root, _ = dirs
    hour = write_dir(root / "pq" / HOUR, native_rows(T0, 10, 0))
    os.symlink(root / "gone.parquet", hour.parent / "part-1.parquet")
    adapter = make_adapter(parquet_spec(), SourceContext(str(root)))
    with pytest.raises(FileNotFoundError, match=r"source 'src': broken symlink .*part-1.parquet -> .*gone.parquet"):
        adapter.partitions(TimeWindow.hours_from(T0, 1))
