"""Rows/s per core of each source adapter, next to plain ``pyarrow.dataset`` on the same files.

All four adapters read the same synthetic world (``--hours`` hours of ``--rows-per-hour``
rows; Kafka gets ``--kafka-hours`` of them because producing through kafka-python is slow).
"Per core" = rows / CPU seconds of this process (all its threads), so thread pools do not
inflate the figure; the Kafka broker's own CPU is not counted. Each adapter does the whole
job a trainer needs: list partitions, split, read, normalise to the canonical schema
(stack 13 dense columns into one fixed-size list, cast ids, build timestamps). The baseline
decodes the same Parquet files and columns with ``pyarrow.dataset`` and does nothing else.

Last line: {"bench": "source_scan", "parquet_rows_per_s": ..., "pyarrow_rows_per_s": ...,
"ratio": ..., "delta_rows_per_s": ..., "iceberg_rows_per_s": ..., "kafka_rows_per_s": ...}
"""

from __future__ import annotations

import argparse
import shutil
import time
from datetime import timedelta

import pyarrow.dataset as ds

from primus_dagster.data import SourceContext, TimeWindow, make_adapter, native_columns
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

from _common import bench_dir, emit, one_source_job


def _timed(fn) -> tuple[int, float, float]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    rows = fn()
    return rows, time.process_time() - cpu0, time.perf_counter() - wall0


def scan_adapter(adapter, window: TimeWindow) -> int:
    rows = 0
    for part in adapter.ready_partitions(window):
        for task in adapter.split(part):
            for batch in adapter.read(task):
                rows += batch.num_rows
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=8)
    parser.add_argument("--rows-per-hour", type=int, default=250_000)
    parser.add_argument("--kafka-hours", type=int, default=1)
    parser.add_argument("--kafka-rows-per-hour", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5, help="best of N scans per reader (least CPU)")
    args = parser.parse_args()

    root = bench_dir("source_scan")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    context = SourceContext(str(root))
    jobs = {kind: one_source_job(kind) for kind in ("parquet", "delta", "iceberg", "kafka")}
    start = jobs["parquet"].dataset.start
    world = SyntheticWorld(WorldConfig(seed=11, rows_per_hour=args.rows_per_hour), start)
    window = TimeWindow(start, start + timedelta(hours=args.hours))
    results: dict[str, float] = {}
    detail: dict[str, dict] = {}

    for kind in ("parquet", "delta", "iceberg"):
        write_world(jobs[kind], context, world, range(args.hours), progress=False)

    readers = {
        kind: (lambda k=kind: scan_adapter(make_adapter(jobs[k].dataset.source(f"src_{k}"), context), window))
        for kind in ("parquet", "delta", "iceberg")
    }
    parquet_adapter = make_adapter(jobs["parquet"].dataset.source("src_parquet"), context)
    files = [name for p in parquet_adapter.ready_partitions(window) for name, _ in p.detail["files"]]
    columns = native_columns(jobs["parquet"].dataset.source("src_parquet").columns)

    def pyarrow_scan() -> int:
        dataset = ds.dataset(files, format="parquet")
        return sum(b.num_rows for b in dataset.to_batches(columns=columns, batch_size=65536))

    readers = {"pyarrow": pyarrow_scan, **readers}
    for name, reader in readers.items():
        best = None
        for _ in range(args.repeat):
            rows, cpu, wall = _timed(reader)
            if best is None or cpu < best[1]:
                best = (rows, cpu, wall)
        rows, cpu, wall = best
        results[name] = rows / cpu
        detail[name] = {
            "rows": rows,
            "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3),
            "wall_rows_per_s": round(rows / wall),
        }
        print(f"{name:8s} rows={rows:,} cpu={cpu:.2f}s wall={wall:.2f}s -> {rows / cpu:,.0f} rows/s per core")

    from primus_dagster.devtools.kafka_broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        kctx = SourceContext(str(root), broker.bootstrap_servers)
        kworld = SyntheticWorld(WorldConfig(seed=11, rows_per_hour=args.kafka_rows_per_hour), start)
        # One extra hour so the measured hours are complete (the stream moved past them).
        write_world(jobs["kafka"], kctx, kworld, range(args.kafka_hours + 1), progress=False)
        kwindow = TimeWindow(start, start + timedelta(hours=args.kafka_hours))
        adapter = make_adapter(jobs["kafka"].dataset.source("src_kafka"), kctx)
        rows, cpu, wall = _timed(lambda: scan_adapter(adapter, kwindow))
        adapter.close()
        results["kafka"] = rows / cpu
        detail["kafka"] = {
            "rows": rows,
            "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3),
            "wall_rows_per_s": round(rows / wall),
        }
        print(f"kafka    rows={rows:,} cpu={cpu:.2f}s wall={wall:.2f}s -> {rows / cpu:,.0f} rows/s per core")

    emit(
        {
            "bench": "source_scan",
            "parquet_rows_per_s": round(results["parquet"]),
            "pyarrow_rows_per_s": round(results["pyarrow"]),
            "ratio": round(results["parquet"] / results["pyarrow"], 3),
            "delta_rows_per_s": round(results["delta"]),
            "iceberg_rows_per_s": round(results["iceberg"]),
            "kafka_rows_per_s": round(results["kafka"]),
            "unit": "rows per CPU-second of the reading process",
            "detail": detail,
        }
    )


if __name__ == "__main__":
    main()
