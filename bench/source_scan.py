"""Rows/s per core of each source adapter, next to plain ``pyarrow.dataset`` on the same files and a bare Kafka loop.

All four adapters read the same synthetic world (``--hours`` hours of ``--rows-per-hour``
rows; Kafka gets ``--kafka-hours`` of them because producing through kafka-python is slow).
"Per core" = rows / CPU seconds of this process (all its threads), so thread pools do not
inflate the figure; the Kafka broker's own CPU is not counted. Each adapter does the whole
job a trainer needs: list partitions, split, read, normalise to the canonical schema
(stack 13 dense columns into one fixed-size list, cast ids, build timestamps). The baseline
decodes the same Parquet files and columns with ``pyarrow.dataset`` and does nothing else.

Kafka (the adapter on its default client, confluent-kafka) is measured side by side with the loops
a competent user would write on the same topic and offset ranges, interleaved repeats, medians:
the peer, confluent-kafka's batched ``consume`` (assign at the range's start, up to 65536 messages a
call) with one ``pyarrow.json`` decode of the batch's values against the source's mapped fields
(``kafka_confluent_raw_per_s``); the same loop with polars ``read_ndjson`` (explicit schema, to Arrow)
as the decoder instead (``kafka_confluent_polars_per_s``; the adapter decodes with polars where it can
vouch for the result, :mod:`primus_dagster.data.sources.kafka.polars_json`); and the bare kafka-python
loop (assign + seek + poll to the range's end, values collected, nothing decoded:
``kafka_raw_consume_per_s``). ``kafka_ratio_vs_confluent`` = adapter rows per CPU-second / the
confluent + pyarrow loop's (goal >= 0.8; the adapter also plans the hour's offsets, normalises to the
canonical schema and counts quality rules), ``kafka_ratio_vs_confluent_polars`` and
``kafka_ratio_vs_raw`` the same against the other loops. The user loops run with Python's cyclic
collector on, as users write them; the adapter pauses it while it takes records out of the client
(:class:`~primus_dagster.data.sources.kafka.clients.GcPause`). ``detail.kafka_costs_us_per_row`` splits
a read's CPU: the consume loop alone, values kept, nothing decoded (``consume_only``), the adapter's
planning (adapter created, partitions listed and split: ``adapter_plan``), and the decode alone of one
65536-record chunk of the topic's values with each decoder (``decode_*``).
``kafka_parallel_speedup`` = wall-clock rows/s of two reader processes, each reading half of the
topic's partitions, over one reading all. ``--kafka-only`` skips the file adapters (their keys are
then absent).

Last line: {"bench": "source_scan", "parquet_rows_per_s": ..., "pyarrow_rows_per_s": ...,
"ratio": ..., "delta_rows_per_s": ..., "iceberg_rows_per_s": ..., "kafka_rows_per_s": ...,
"kafka_confluent_raw_per_s": ..., "kafka_ratio_vs_confluent": ..., "kafka_confluent_polars_per_s": ...,
"kafka_ratio_vs_confluent_polars": ..., "kafka_raw_consume_per_s": ..., "kafka_ratio_vs_raw": ...,
"kafka_parallel_speedup": ...}
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import time
from datetime import timedelta
from multiprocessing.queues import Queue
from typing import Any

import pyarrow.dataset as ds

from primus_dagster.data import ReadTask, SourceContext, TimeWindow, make_adapter, native_columns
from primus_dagster.spec import SourceSpec
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


def raw_consume(bootstrap: str, ranges: list[tuple[str, int, int]]) -> int:
    """The bare kafka-python loop a competent user writes: assign + seek + poll to the range's end, values kept."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    values: list[bytes] = []
    for uri, start, stop in ranges:
        topic, _, p = uri.rpartition(":")
        tp = TopicPartition(topic, int(p))
        consumer.assign([tp])
        consumer.seek(tp, start)
        position = start
        while position < stop:
            for record in consumer.poll(timeout_ms=1000).get(tp, []):
                if record.offset >= stop:
                    position = stop
                    break
                values.append(record.value)
                position = record.offset + 1
    consumer.close()
    return len(values)


def _polars_schema(spec: SourceSpec) -> dict[str, Any]:
    """The source's mapped fields (:func:`json_schema`) as the polars schema a user would write."""
    import polars as pl

    from primus_dagster.data.sources.kafka import json_schema

    return dict(pl.DataFrame(json_schema(spec).empty_table()).schema)  # type: ignore[arg-type]


def raw_confluent(
    bootstrap: str, ranges: list[tuple[str, int, int]], spec: SourceSpec, decoder: str | None = "pyarrow"
) -> int:
    """The confluent-kafka loop a competent user writes: assign at the range's start, batched ``consume``,
    one decode per batch of the values (the source's mapped fields only): ``pyarrow.json`` (``decoder=
    "pyarrow"``, the peer), polars ``read_ndjson`` (``"polars"``), or none (``None``: values kept); rows."""
    import io

    import polars as pl
    import pyarrow.json as pj
    from confluent_kafka import Consumer, TopicPartition

    from primus_dagster.data.sources.kafka import json_schema

    options = pj.ParseOptions(explicit_schema=json_schema(spec), unexpected_field_behavior="ignore")
    polars_schema = _polars_schema(spec)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-raw", "enable.auto.commit": False})
    rows = 0
    for uri, start, stop in ranges:
        topic, _, p = uri.rpartition(":")
        consumer.assign([TopicPartition(topic, int(p), start)])
        position = start
        while position < stop:
            messages = consumer.consume(num_messages=min(65536, stop - position), timeout=1.0)
            values = [m.value() for m in messages if m.error() is None and m.offset() < stop]
            if not values:
                continue
            position = messages[-1].offset() + 1
            if decoder == "pyarrow":
                rows += pj.read_json(io.BytesIO(b"\n".join(values)), parse_options=options).num_rows
            elif decoder == "polars":
                rows += pl.read_ndjson(b"\n".join(values), schema=polars_schema).to_arrow().num_rows
            else:
                rows += len(values)
        consumer.unassign()
    consumer.close()
    return rows


def topic_values(bootstrap: str, ranges: list[tuple[str, int, int]], n: int) -> list[bytes]:
    """The first ``n`` record values of ``ranges`` (the decoders' sample)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-sample", "enable.auto.commit": False})
    values: list[bytes] = []
    for uri, start, stop in ranges:
        topic, _, p = uri.rpartition(":")
        consumer.assign([TopicPartition(topic, int(p), start)])
        position = start
        while position < stop and len(values) < n:
            messages = consumer.consume(num_messages=min(65536, stop - position), timeout=1.0)
            values += [m.value() for m in messages if m.error() is None and m.offset() < stop]
            position = messages[-1].offset() + 1 if messages else position
        consumer.unassign()
    consumer.close()
    return values[:n]


def decode_costs(spec: SourceSpec, values: list[bytes], repeat: int) -> dict[str, float]:
    """CPU microseconds per record of one decode of ``values`` (least of ``repeat``) with each decoder."""
    import io

    import polars as pl
    import pyarrow.json as pj

    from primus_dagster.data.sources.kafka import JsonRecordDecoder, json_schema

    options = pj.ParseOptions(explicit_schema=json_schema(spec), unexpected_field_behavior="ignore")
    polars_schema = _polars_schema(spec)
    adapter = JsonRecordDecoder(spec)  # type: ignore[arg-type]
    stamps = [0] * len(values)
    decoders = {
        "decode_pyarrow_json": lambda: pj.read_json(io.BytesIO(b"\n".join(values)), parse_options=options),
        "decode_polars_read_ndjson": lambda: pl.read_ndjson(b"\n".join(values), schema=polars_schema).to_arrow(),
        "decode_adapter": lambda: adapter.decode(values, stamps),
    }
    out = {}
    for name, decode in decoders.items():
        best = min(_timed(lambda d=decode: d() and len(values))[1] for _ in range(repeat))
        out[name] = round(best / len(values) * 1e6, 3)
    return out


def _executor(spec: SourceSpec, context: SourceContext, inbox: Queue, outbox: Queue) -> None:
    """One reader process (a data executor's read loop): read the tasks it is sent, report rows and times."""
    adapter = make_adapter(spec, context)
    while (tasks := inbox.get()) is not None:
        cpu0, t0 = time.process_time(), time.monotonic()
        rows = sum(batch.num_rows for task in tasks for batch in adapter.read(ReadTask.from_dict(task)))
        outbox.put((rows, t0, time.monotonic(), time.process_time() - cpu0))
    adapter.close()


def parallel_read(spec: SourceSpec, context: SourceContext, window: TimeWindow, repeat: int) -> dict[str, Any]:
    """Wall-clock rows/s of one reader process over all topic-partitions vs two, each reading half of them.

    The processes start once and wait for work, so start-up is not timed; one and two readers
    alternate, medians over ``repeat`` rounds. Tasks go round-robin, so each of two readers
    gets two of the topic's four partitions.
    """
    with make_adapter(spec, context) as planner:
        tasks = [t.to_dict() for p in planner.ready_partitions(window) for t in planner.split(p)]
    ctx = mp.get_context("spawn")
    inboxes, outbox = [ctx.Queue() for _ in range(2)], ctx.Queue()
    procs = [ctx.Process(target=_executor, args=(spec, context, q, outbox), daemon=True) for q in inboxes]
    for proc in procs:
        proc.start()
    walls: dict[int, list[float]] = {1: [], 2: []}
    rows = 0
    try:
        for _ in range(repeat):
            for n in (1, 2):
                for i in range(n):
                    inboxes[i].put(tasks[i::n])
                done = [outbox.get(timeout=600) for _ in range(n)]
                rows = sum(d[0] for d in done)
                walls[n].append(max(d[2] for d in done) - min(d[1] for d in done))
    finally:
        for q in inboxes:
            q.put(None)
        for proc in procs:
            proc.join(timeout=30)
    one, two = rows / statistics.median(walls[1]), rows / statistics.median(walls[2])
    return {
        "partitions": len({t["uri"] for t in tasks}),
        "rows": rows,
        "one_executor_rows_per_s": round(one),
        "two_executors_rows_per_s": round(two),
        "speedup": round(two / one, 3),
        "wall_s": {str(n): [round(w, 3) for w in ws] for n, ws in walls.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=8)
    parser.add_argument("--rows-per-hour", type=int, default=250_000)
    parser.add_argument("--kafka-hours", type=int, default=1)
    parser.add_argument("--kafka-rows-per-hour", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5, help="best of N scans per reader (least CPU)")
    parser.add_argument("--kafka-only", action="store_true", help="skip the Parquet, Delta and Iceberg adapters")
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
    detail: dict[str, Any] = {}

    if not args.kafka_only:
        scan_files(jobs, context, world, window, args.repeat, results, detail)
    kafka(jobs, root, start, args, results, detail)
    files = (
        {}
        if args.kafka_only
        else {
            "parquet_rows_per_s": round(results["parquet"]),
            "pyarrow_rows_per_s": round(results["pyarrow"]),
            "ratio": round(results["parquet"] / results["pyarrow"], 3),
            "delta_rows_per_s": round(results["delta"]),
            "iceberg_rows_per_s": round(results["iceberg"]),
        }
    )
    emit(
        {
            "bench": "source_scan",
            **files,
            "kafka_rows_per_s": round(results["kafka"]),
            "kafka_confluent_raw_per_s": round(results["kafka_confluent_raw"]),
            "kafka_ratio_vs_confluent": round(results["kafka"] / results["kafka_confluent_raw"], 3),
            "kafka_confluent_polars_per_s": round(results["kafka_confluent_polars"]),
            "kafka_ratio_vs_confluent_polars": round(results["kafka"] / results["kafka_confluent_polars"], 3),
            "kafka_raw_consume_per_s": round(results["kafka_raw"]),
            "kafka_ratio_vs_raw": round(results["kafka"] / results["kafka_raw"], 3),
            "kafka_parallel_speedup": detail["kafka_parallel"]["speedup"],
            "unit": "rows per CPU-second of the reading process",
            "detail": detail,
        }
    )


def scan_files(
    jobs: dict[str, Any],
    context: SourceContext,
    world: SyntheticWorld,
    window: TimeWindow,
    repeat: int,
    results: dict[str, float],
    detail: dict[str, Any],
) -> None:
    """The Parquet, Delta and Iceberg adapters and plain ``pyarrow.dataset`` on the same files: best of ``repeat``."""
    hours = range(int((window.end - window.start).total_seconds() // 3600))
    for kind in ("parquet", "delta", "iceberg"):
        write_world(jobs[kind], context, world, hours, progress=False)

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
        for _ in range(repeat):
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


def kafka(
    jobs: dict[str, Any],
    root: Any,
    start: Any,
    args: argparse.Namespace,
    results: dict[str, float],
    detail: dict[str, Any],
) -> None:
    """The Kafka adapter next to the confluent-kafka + pyarrow (and + polars) loops and the bare kafka-python loop,
    interleaved; then the costs apart (consume alone, planning, each decoder)."""
    from primus_dagster.devtools.kafka_broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        kctx = SourceContext(str(root), broker.bootstrap_servers)
        kworld = SyntheticWorld(WorldConfig(seed=11, rows_per_hour=args.kafka_rows_per_hour), start)
        # One extra hour so the measured hours are complete (the stream moved past them).
        write_world(jobs["kafka"], kctx, kworld, range(args.kafka_hours + 1), progress=False)
        kwindow = TimeWindow(start, start + timedelta(hours=args.kafka_hours))
        kspec = jobs["kafka"].dataset.source("src_kafka")
        with make_adapter(kspec, kctx) as planner:
            ranges = [(t.uri, t.start, t.stop) for p in planner.ready_partitions(kwindow) for t in planner.split(p)]

        def kafka_adapter() -> int:
            with make_adapter(kspec, kctx) as adapter:  # the whole job: list, split, read, normalise
                return scan_adapter(adapter, kwindow)

        def kafka_plan() -> int:
            with make_adapter(kspec, kctx) as adapter:  # what the job does before reading
                return len([t for p in adapter.ready_partitions(kwindow) for t in adapter.split(p)])

        bootstrap = broker.bootstrap_servers
        loops = {
            "kafka": kafka_adapter,
            "kafka_confluent_raw": lambda: raw_confluent(bootstrap, ranges, kspec),
            "kafka_confluent_polars": lambda: raw_confluent(bootstrap, ranges, kspec, "polars"),
            "kafka_raw": lambda: raw_consume(bootstrap, ranges),
        }
        # Interleaved repeats on the same topic and ranges; medians of rows per CPU-second.
        runs: dict[str, list[tuple[int, float, float]]] = {name: [] for name in loops}
        consume_only, plan_cpu = [], []
        for _ in range(args.repeat):
            for name, loop in loops.items():
                runs[name].append(_timed(loop))
            consume_only.append(_timed(lambda: raw_confluent(bootstrap, ranges, kspec, None)))
            plan_cpu.append(_timed(kafka_plan)[1])
        for name, measured in runs.items():
            rows = measured[0][0]
            per_s = [r / cpu for r, cpu, _ in measured]
            results[name] = statistics.median(per_s)
            detail[name] = {
                "rows": rows,
                "cpu_s": [round(cpu, 3) for _, cpu, _ in measured],
                "wall_s": [round(wall, 3) for _, _, wall in measured],
                "rows_per_cpu_s": [round(x) for x in per_s],
            }
            print(f"{name:9s} rows={rows:,} -> {results[name]:,.0f} rows/s per core (median of {len(per_s)})")
        for peer in ("kafka_confluent_raw", "kafka_confluent_polars", "kafka_raw"):
            ratios = [a[0] / a[1] / (b[0] / b[1]) for a, b in zip(runs["kafka"], runs[peer], strict=True)]
            detail[f"kafka_ratio_vs_{peer.removeprefix('kafka_')}_per_repeat"] = [round(r, 3) for r in ratios]
        rows = runs["kafka"][0][0]
        detail["kafka_costs_us_per_row"] = {
            "adapter": round(1e6 / results["kafka"], 3),
            "consume_only": round(statistics.median(cpu / r * 1e6 for r, cpu, _ in consume_only), 3),
            "adapter_plan": round(statistics.median(plan_cpu) / rows * 1e6, 3),
            **decode_costs(kspec, topic_values(bootstrap, ranges, 65536), args.repeat),
        }
        print(f"kafka costs (CPU us per row): {detail['kafka_costs_us_per_row']}")
        detail["kafka_parallel"] = parallel_read(kspec, kctx, kwindow, args.repeat)
        print(f"kafka parallel: {detail['kafka_parallel']}")


if __name__ == "__main__":
    main()
