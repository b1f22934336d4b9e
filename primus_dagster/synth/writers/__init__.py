"""Write hours of the synthetic world to the sources of a job spec.

Every ``kind: batch`` source gets a disjoint shard of each hour (``shard_of(sample_id, B)``
with ``B`` the number of batch sources of the whole spec, shard ``i`` for the i-th batch source
in spec order), with complete labels, so the union of the batch sources is the world. Every
``kind: stream`` source gets the stream copy of all rows (clicks later than the stream label
window are 0). ``click_delay_s`` is ground truth and is never written.

Re-writing an hour that is already there:

* parquet: the hour's directory is replaced (marker removed first, files rewritten, marker
  written last); in a daily directory only the hour's ``part-HH-*`` files are replaced, and
  the marker is written once all 24 hours are present;
* delta: a predicate overwrite (``dt = '…' AND hour = H``) replaces exactly that hour in one
  commit; new hours are plain appends (one commit per hour either way);
* iceberg: each hour is one Parquet file registered with ``add_files`` (the partition value
  comes from its statistics, so pyiceberg-core is not needed); an existing hour is removed by
  a metadata-only delete (event-time range filter) in the same transaction;
* kafka: append-only, so re-writing an hour produces the records again (consumers that need
  exactly-once deduplicate by ``sample_id``).

One writer per format, each in its module (:mod:`.parquet`, :mod:`.delta`, :mod:`.iceberg`,
:mod:`.kafka`) behind :class:`~.base.SourceWriter`; :mod:`.summary` holds what was written.

Example::

    summary = write_world(job, SourceContext(data_root="/data"), world, range(24))
    print(summary.rows_total)
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.spec import JobSpec
from primus_dagster.synth.world import SyntheticWorld, shard_of
from primus_dagster.synth.writers.base import SourceWriter
from primus_dagster.synth.writers.delta import DeltaWriter
from primus_dagster.synth.writers.iceberg import IcebergWriter
from primus_dagster.synth.writers.kafka import KafkaWriter, epoch_ms, json_values
from primus_dagster.synth.writers.parquet import ParquetWriter
from primus_dagster.synth.writers.summary import SourceStats, WriteSummary

__all__ = [
    "GROUND_TRUTH_COLUMNS",
    "DeltaWriter",
    "IcebergWriter",
    "KafkaWriter",
    "ParquetWriter",
    "SourceStats",
    "SourceWriter",
    "WriteSummary",
    "epoch_ms",
    "json_values",
    "write_world",
]

GROUND_TRUTH_COLUMNS = ("click_delay_s",)


def _make_writer(spec: Any, context: SourceContext, files_per_hour: int, kafka_partitions: int) -> SourceWriter:
    makers = {
        "parquet": lambda: ParquetWriter(spec, context, files_per_hour),
        "delta": lambda: DeltaWriter(spec, context),
        "iceberg": lambda: IcebergWriter(spec, context),
        "kafka": lambda: KafkaWriter(spec, context, partitions=kafka_partitions),
    }
    if spec.type in makers:
        return makers[spec.type]()
    raise ValueError(f"source {spec.name!r}: no synthetic writer for type {spec.type!r}")


def _progress(enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]synth[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
    )


def write_world(
    job: JobSpec,
    context: SourceContext,
    world: SyntheticWorld,
    hours: range,
    sources: list[str] | None = None,
    progress: bool = True,
    files_per_hour: int = 1,
    kafka_partitions: int = 4,
) -> WriteSummary:
    """Write ``hours`` (relative to ``world.start``) of the world to the spec's sources.

    ``sources`` restricts the writing to a subset by name; the batch shards stay those of the
    whole spec, so writing sources one at a time gives the same data as writing them together.
    """
    pairs = [s for _, s in job.dataset.all_sources()]
    known = [s.name for s in pairs]
    if unknown := sorted(set(sources or ()) - set(known)):
        raise KeyError(f"unknown source(s) {unknown}; known: {known}")
    batch_names = [s.name for s in pairs if s.kind == "batch"]
    chosen = [s for s in pairs if sources is None or s.name in sources]
    summary = WriteSummary(sources={s.name: SourceStats(s.name, s.type, s.kind) for s in chosen})
    began = time.perf_counter()
    writers: dict[str, SourceWriter] = {}
    try:
        for spec in chosen:
            writers[spec.name] = _make_writer(spec, context, files_per_hour, kafka_partitions)
        with _progress(progress) as bar:
            task = bar.add_task("", total=len(hours))
            for h in hours:
                start = world.hour_start(h)
                bar.update(task, description=f"{start:%Y-%m-%d %H}:00")
                t0 = time.perf_counter()
                table = world.hour(h)
                stream = world.stream_copy(table) if any(s.kind == "stream" for s in chosen) else None
                summary.generate_seconds += time.perf_counter() - t0
                summary.world_rows += table.num_rows
                shards = shard_of(table.column("sample_id"), len(batch_names)) if batch_names else None
                for spec in chosen:
                    if spec.kind == "stream":
                        assert stream is not None  # made above whenever a stream source is chosen
                        part = stream
                    else:
                        part = table.filter(pa.array(shards == batch_names.index(spec.name)))
                    part = part.drop_columns([c for c in GROUND_TRUTH_COLUMNS if c in part.column_names])
                    t1 = time.perf_counter()
                    nbytes, files = writers[spec.name].write_hour(start, part)
                    stats = summary.sources[spec.name]
                    stats.seconds += time.perf_counter() - t1
                    stats.rows, stats.bytes = stats.rows + part.num_rows, stats.bytes + nbytes
                    stats.files, stats.hours = stats.files + files, stats.hours + 1
                summary.hours += 1
                bar.advance(task)
    finally:
        for writer in writers.values():
            writer.close()
    summary.seconds = time.perf_counter() - began
    return summary
