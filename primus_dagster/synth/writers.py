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

Example::

    summary = write_world(job, SourceContext(data_root="/data"), world, range(24))
    print(summary.rows_total)
"""

from __future__ import annotations

import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.spec import JobSpec
from primus_dagster.spec.sources import DeltaSourceSpec, IcebergSourceSpec, KafkaSourceSpec, ParquetSourceSpec
from primus_dagster.synth.world import SyntheticWorld, shard_of

GROUND_TRUTH_COLUMNS = ("click_delay_s",)


@dataclass
class SourceStats:
    """What was written to one source, e.g. ``summary.sources["impressions_delta"].rows``."""

    name: str
    type: str
    kind: str
    rows: int = 0
    bytes: int = 0
    files: int = 0
    hours: int = 0
    seconds: float = 0.0


@dataclass
class WriteSummary:
    """Result of :func:`write_world`: per-source stats plus generation time.

    Example::

        summary = write_world(job, context, world, range(24), progress=False)
        print(summary.rows_total, json.dumps(summary.as_dict()))
    """

    sources: dict[str, SourceStats] = field(default_factory=dict)
    hours: int = 0
    world_rows: int = 0
    generate_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def rows_total(self) -> int:
        return sum(s.rows for s in self.sources.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "hours": self.hours,
            "world_rows": self.world_rows,
            "generate_seconds": round(self.generate_seconds, 3),
            "seconds": round(self.seconds, 3),
            "sources": {k: vars(v) for k, v in self.sources.items()},
        }


class _Writer:
    def write_hour(self, start: datetime, table: pa.Table) -> tuple[int, int]:
        """Write one hour; return ``(bytes, files)`` written."""
        raise NotImplementedError

    def close(self) -> None:
        pass


# -- parquet ----------------------------------------------------------------------------------
class _ParquetWriter(_Writer):
    """Hive (``dt=YYYY-MM-DD/hour=HH``) or templated directories, ``files_per_hour`` files, marker last."""

    def __init__(self, spec: ParquetSourceSpec, context: SourceContext, files_per_hour: int = 1):
        from primus_dagster.data.sources.parquet import partition_dir

        self.spec = spec
        self._partition_dir = partition_dir
        self.files_per_hour = max(1, files_per_hour)
        self.fs, self.root = fsspec.core.url_to_fs(context.resolve(spec.path).rstrip("/"), **spec.storage_options)
        self.root = self.root.rstrip("/")
        self.arrow_fs = (
            pafs.LocalFileSystem()
            if isinstance(self.fs, LocalFileSystem)
            else pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))
        )

    def _rm(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def write_hour(self, start: datetime, table: pa.Table) -> tuple[int, int]:
        daily = self.spec.granularity == "day"
        part_start = start.replace(hour=0) if daily else start
        directory = f"{self.root}/{self._partition_dir(self.spec, part_start)}"
        marker = f"{directory}/{self.spec.success_marker}" if self.spec.success_marker else None
        if marker:
            self._rm(marker)  # not ready while the hour is rewritten
        prefix = f"part-{start:%H}-" if daily else "part-"
        if daily:
            for name in self.fs.glob(f"{directory}/{prefix}*.parquet"):
                self.fs.rm(name)
        else:
            self._rm(directory)
        self.fs.makedirs(directory, exist_ok=True)
        n = table.num_rows
        bounds = np.linspace(0, n, self.files_per_hour + 1).astype(int)
        written = 0
        for i in range(self.files_per_hour):
            path = f"{directory}/{prefix}{i:05d}.parquet"
            pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), path, filesystem=self.arrow_fs)
            written += self.fs.size(path)
        if marker and (not daily or self._day_complete(directory)):
            with self.fs.open(marker, "wb"):
                pass
        return written, self.files_per_hour

    def _day_complete(self, directory: str) -> bool:
        names = {p.rsplit("/", 1)[-1][5:7] for p in self.fs.glob(f"{directory}/part-*.parquet")}
        return all(f"{h:02d}" in names for h in range(24))


# -- delta ------------------------------------------------------------------------------------
class _DeltaWriter(_Writer):
    """One commit per hour into a table partitioned by ``date_column`` (+ ``hour_column`` if hourly)."""

    def __init__(self, spec: DeltaSourceSpec, context: SourceContext):
        self.spec = spec
        self.uri = context.resolve(spec.uri)
        self.options = dict(spec.storage_options) or None
        self.hourly = spec.granularity == "hour"

    def write_hour(self, start: datetime, table: pa.Table) -> tuple[int, int]:
        from deltalake import DeltaTable, write_deltalake
        from deltalake.exceptions import TableNotFoundError

        spec, day = self.spec, f"{start:%Y-%m-%d}"
        n = table.num_rows
        table = table.append_column(pa.field(spec.date_column, pa.string()), pa.array([day] * n, pa.string()))
        if spec.hour_column:
            table = table.append_column(
                pa.field(spec.hour_column, pa.int32()), pa.array(np.full(n, start.hour, dtype=np.int32))
            )
        partition_by = [spec.date_column] + ([spec.hour_column] if self.hourly and spec.hour_column else [])
        predicate = f"{spec.date_column} = '{day}'"
        if spec.hour_column:
            predicate += f" AND {spec.hour_column} = {start.hour}"
        try:
            before = pa.table(DeltaTable(self.uri, storage_options=self.options).get_add_actions(flatten=True))
        except TableNotFoundError:
            before = None
        known: set[str] = set()
        existing = False
        if before is not None and before.num_rows:
            known = set(before.column("path").to_pylist())
            same = pc.equal(before.column(f"partition.{spec.date_column}").cast(pa.string()), day)
            if len(partition_by) > 1:
                same = pc.and_(
                    same, pc.equal(before.column(f"partition.{spec.hour_column}").cast(pa.int64()), start.hour)
                )
            existing = bool(pc.any(same).as_py())
        if existing:
            write_deltalake(
                self.uri,
                table,
                mode="overwrite",
                predicate=predicate,
                partition_by=partition_by,
                storage_options=self.options,
            )
        else:
            write_deltalake(self.uri, table, mode="append", partition_by=partition_by, storage_options=self.options)
        actions = pa.table(DeltaTable(self.uri, storage_options=self.options).get_add_actions(flatten=True))
        added = [
            size
            for path, size in zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist())
            if path not in known
        ]
        return int(sum(added)), len(added)


# -- iceberg ----------------------------------------------------------------------------------
class _IcebergWriter(_Writer):
    """One snapshot per hour into a table partitioned by hour(event_time) (day(event_time) if daily)."""

    def __init__(self, spec: IcebergSourceSpec, context: SourceContext, ts_column: str = "event_time"):
        from primus_dagster.data.sources.iceberg import load_catalog_for

        self.spec = spec
        self.ts_column = ts_column
        self.catalog = load_catalog_for(spec, context)
        self._table: Any = None

    def _load(self, schema: pa.Schema) -> Any:
        from pyiceberg.exceptions import NoSuchTableError
        from pyiceberg.transforms import DayTransform, HourTransform

        if self._table is not None:
            return self._table
        namespace = self.spec.table.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(namespace)
        try:
            self._table = self.catalog.load_table(self.spec.table)
        except NoSuchTableError:
            transform = HourTransform() if self.spec.granularity == "hour" else DayTransform()
            with self.catalog.create_table_transaction(self.spec.table, schema=schema) as txn:
                with txn.update_spec() as update:
                    update.add_field(self.ts_column, transform, f"{self.ts_column}_{self.spec.granularity}")
            self._table = self.catalog.load_table(self.spec.table)
        return self._table

    def write_hour(self, start: datetime, table: pa.Table) -> tuple[int, int]:
        from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

        iceberg_table = self._load(table.schema)
        end = start + timedelta(hours=1)
        hour_filter = And(
            GreaterThanOrEqual(self.ts_column, start.isoformat()), LessThan(self.ts_column, end.isoformat())
        )
        # One Parquet file per hour, registered with add_files: its partition value comes from the
        # column statistics, so no Arrow-side partition transform (pyiceberg-core) is needed, and
        # replacing the hour is a metadata-only delete of whole files.
        path = f"{iceberg_table.location().rstrip('/')}/data/{start:%Y-%m-%d-%H}-{uuid.uuid4().hex}.parquet"
        if table.num_rows:  # an empty file has no statistics to take the partition from
            with iceberg_table.io.new_output(path).create(overwrite=True) as stream:
                pq.write_table(table, stream)
        with iceberg_table.transaction() as tx:
            if any(True for _ in iceberg_table.scan(row_filter=hour_filter).plan_files()):
                tx.delete(hour_filter)
            if table.num_rows:
                tx.add_files([path], check_duplicate_files=False)
        return (len(iceberg_table.io.new_input(path)), 1) if table.num_rows else (0, 0)

    def close(self) -> None:
        close = getattr(self.catalog, "close", None)
        if callable(close):
            close()


# -- kafka ------------------------------------------------------------------------------------
def epoch_ms(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Timestamps as int64 epoch milliseconds (truncated)."""
    return pc.cast(column, pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())


def json_values(table: pa.Table) -> pa.Array:
    """One compact JSON object per row (timestamps as epoch milliseconds), built with Arrow kernels."""
    if not table.num_rows:
        return pa.array([], pa.string())
    pieces: list[Any] = []
    for i, name in enumerate(table.column_names):
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = epoch_ms(column)
        text = pc.cast(column, pa.string())
        if column.null_count:
            text = pc.fill_null(text, "null")
        pieces += [f'{"{" if i == 0 else ","}"{name}":', text]
    pieces.append("}")
    return pc.binary_join_element_wise(*pieces, "").combine_chunks()


class _KafkaWriter(_Writer):
    """JSON records keyed by user_id into partition ``user_id % partitions``, timestamp = event time."""

    def __init__(
        self,
        spec: KafkaSourceSpec,
        context: SourceContext,
        partitions: int = 4,
        key_column: str = "user_id",
        ts_column: str = "event_time",
    ):
        from kafka import KafkaAdminClient, KafkaProducer
        from kafka.admin import NewTopic
        from kafka.errors import TopicAlreadyExistsError

        bootstrap = spec.bootstrap_servers or context.kafka_bootstrap_servers
        if not bootstrap:
            raise ValueError(
                f"source {spec.name!r}: no Kafka bootstrap servers (set bootstrap_servers in the spec, "
                f"--kafka-bootstrap or PRIMUS_KAFKA_BOOTSTRAP_SERVERS)"
            )
        self.spec, self.key_column, self.ts_column = spec, key_column, ts_column
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="primus-synth")
        try:
            if spec.topic not in admin.list_topics():
                with suppress(TopicAlreadyExistsError):
                    admin.create_topics([NewTopic(spec.topic, num_partitions=partitions, replication_factor=1)])
        finally:
            admin.close()
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            client_id="primus-synth",
            acks=1,
            linger_ms=20,
            batch_size=512 * 1024,
            max_in_flight_requests_per_connection=1,  # keeps per-partition order on retries
        )
        deadline = time.monotonic() + 30
        while not (found := self.producer.partitions_for(spec.topic)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not found:
            raise RuntimeError(f"Kafka topic {spec.topic!r} has no partitions on {bootstrap}")
        self.partitions = len(found)
        self._errors: list[BaseException] = []

    def _on_error(self, exc: BaseException) -> None:
        self._errors.append(exc)

    def write_hour(self, start: datetime, table: pa.Table) -> tuple[int, int]:
        if not table.num_rows:
            return 0, 0
        values = json_values(table)
        keys = table.column(self.key_column).to_numpy()
        parts = (keys % self.partitions).tolist()
        key_bytes = pc.cast(table.column(self.key_column), pa.string()).cast(pa.binary()).to_pylist()
        ts_ms = epoch_ms(table.column(self.ts_column)).to_numpy().tolist()
        send, topic, on_error = self.producer.send, self.spec.topic, self._on_error
        for value, key, part, ts in zip(values.cast(pa.binary()).to_pylist(), key_bytes, parts, ts_ms):
            send(topic, value=value, key=key, partition=part, timestamp_ms=ts).add_errback(on_error)
        self.producer.flush()
        if self._errors:
            raise RuntimeError(f"Kafka topic {topic!r}: {len(self._errors)} record(s) failed: {self._errors[0]!r}")
        return int(pc.sum(pc.binary_length(values)).as_py()), 0

    def close(self) -> None:
        self.producer.flush()
        self.producer.close()


# -- driver -----------------------------------------------------------------------------------
def _make_writer(spec: Any, context: SourceContext, files_per_hour: int, kafka_partitions: int) -> _Writer:
    makers = {
        "parquet": lambda: _ParquetWriter(spec, context, files_per_hour),
        "delta": lambda: _DeltaWriter(spec, context),
        "iceberg": lambda: _IcebergWriter(spec, context),
        "kafka": lambda: _KafkaWriter(spec, context, partitions=kafka_partitions),
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
    writers: dict[str, _Writer] = {}
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
                    part = (
                        stream
                        if spec.kind == "stream"
                        else table.filter(pa.array(shards == batch_names.index(spec.name)))
                    )  # type: ignore[operator]
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
