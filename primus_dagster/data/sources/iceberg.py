"""Iceberg source: partitions from the scan plan of a snapshot, tasks per data file.

The table lives in a pyiceberg catalog (default: a SqlCatalog on SQLite under the data root,
see :func:`load_catalog_for`). Tables are expected to be partitioned by ``hour(ts)`` or
``day(ts)``, but any layout works: every partition is the row filter
``start <= ts < end`` and a task reads its file through pyiceberg's Arrow reader with that
filter, at the snapshot the partition was listed at (delete files and schema evolution are
applied by pyiceberg).

Example::

    spec = IcebergSourceSpec(name="imp", type="iceberg", table="primus.impressions",
                             columns={"ts": "event_time", "label": "click", "dense": ["d0"]})
    with IcebergSource(spec, SourceContext(data_root="/data")) as source:
        for part in source.ready_partitions(TimeWindow.hours_from(start, 24)):
            for task in source.split(part):
                for batch in source.read(task):
                    ...
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.expressions import And, BooleanExpression, GreaterThanOrEqual, LessThan, Reference
from pyiceberg.expressions.literals import literal
from pyiceberg.io import pyarrow as iceberg_arrow
from pyiceberg.table import DataScan, FileScanTask, Table
from pyiceberg.types import LongType, NestedField, PrimitiveType, TimestampType, TimestamptzType

from primus_dagster.data.canonical import SchemaMismatchError, native_columns
from primus_dagster.data.sources.base import (
    Partition,
    ReadTask,
    SourceAdapter,
    SourceContext,
    SourceReadError,
    TimeWindow,
)
from primus_dagster.data.sources.parquet import open_parquet
from primus_dagster.spec.dataset import granularity_step
from primus_dagster.spec.redact import redact_text
from primus_dagster.spec.sources import IcebergCatalogSpec, IcebergSourceSpec

_MAX_CACHED_PARTITIONS = 4096
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICRO = timedelta(microseconds=1)


class IcebergTableNotFoundError(LookupError):
    """The source's table (or its namespace) does not exist in the catalog."""


def _local_url(location: str, context: SourceContext) -> str:
    resolved = context.resolve(location)
    return resolved if "://" in resolved else f"file://{os.path.abspath(resolved)}"


def catalog_properties(spec: IcebergSourceSpec | IcebergCatalogSpec, context: SourceContext) -> dict[str, str]:
    """The pyiceberg properties :func:`load_catalog_for` uses (defaults, then ``properties``)."""
    cat = spec.catalog if isinstance(spec, IcebergSourceSpec) else spec
    props: dict[str, str] = {}
    sql = cat.properties.get("type", "sql") == "sql"
    if cat.uri:
        props["uri"] = cat.uri
    elif sql:
        db = os.path.abspath(context.resolve("iceberg/catalog.db")) if "://" not in context.data_root else None
        if db is None:
            raise ValueError(f"catalog {cat.name!r}: data root {context.data_root!r} is a URL; set catalog.uri")
        props["uri"] = f"sqlite:///{db}"
    props.update(cat.properties)
    warehouse = warehouse_location(cat)
    if warehouse is not None:  # (properties.warehouse too: resolved inside the data root, never from the cwd)
        props["warehouse"] = _local_url(warehouse, context)
    return props


def warehouse_location(cat: IcebergCatalogSpec) -> str | None:
    """The warehouse as the spec writes it (``properties.warehouse``, else ``warehouse``), else ``iceberg/warehouse``
    (inside the data root) for the default SQL catalog; None: another catalog type's own default."""
    if cat.properties.get("type", "sql") == "sql":
        return cat.warehouse_location() or "iceberg/warehouse"
    return cat.warehouse_location()


def load_catalog_for(spec: IcebergSourceSpec | IcebergCatalogSpec, context: SourceContext) -> Catalog:
    """The pyiceberg catalog of a source: a SqlCatalog on SQLite by default, else by ``type``.

    Default: ``uri=sqlite:///<data_root>/iceberg/catalog.db`` and
    ``warehouse=file://<data_root>/iceberg/warehouse``; ``catalog.properties`` are merged over
    them, and a ``type`` property other than ``sql`` (``rest``, ``glue``, ``hive``, ...) goes
    through :func:`pyiceberg.catalog.load_catalog`.

    Example::

        catalog = load_catalog_for(spec, SourceContext(data_root="/data"))
        catalog.create_namespace_if_not_exists("primus")
        table = catalog.create_table("primus.impressions", schema=arrow_schema)
    """
    cat = spec.catalog if isinstance(spec, IcebergSourceSpec) else spec
    props = catalog_properties(spec, context)
    if props.get("type", "sql") != "sql":
        return load_catalog(cat.name, **props)
    props.pop("type", None)
    uri = props.get("uri", "")
    if uri.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(uri[len("sqlite:///") :]) or ".", exist_ok=True)
    return SqlCatalog(cat.name, **props)


def _rebatch(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Re-cut a stream of batches (same schema) into batches of exactly ``rows`` (the last shorter)."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if not pending and batch.num_rows == rows:
            yield batch
            continue
        pending.append(batch)
        count += batch.num_rows
        if count >= rows:
            table = pa.Table.from_batches(pending).combine_chunks()
            offset = 0
            while count - offset >= rows:
                yield table.slice(offset, rows).to_batches()[0]
                offset += rows
            rest = table.slice(offset)
            pending = rest.to_batches() if rest.num_rows else []
            count = rest.num_rows
    if count:
        yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]


def _ts_bound(field: NestedField, bounds: dict[int, bytes] | None) -> int | None:
    """A data file's bound of the ts column (from its lower or upper ``bounds``); None when not recorded."""
    raw = bounds.get(field.field_id) if bounds else None
    if raw is None:
        return None
    # timestamp(tz) (micros) or long (ms): primitive types, as checked by IcebergSource._ts_field
    return int(from_bytes(cast(PrimitiveType, field.field_type), raw))


class IcebergSource(SourceAdapter):
    """Adapter for an Iceberg table; partitions are ``[start, end)`` row filters on the ts column.

    Example::

        source = IcebergSource(spec, SourceContext(data_root="/data"))
        part = source.partition(datetime(2024, 1, 1, 5, tzinfo=timezone.utc))
        print(part.ready, part.version, part.files, part.rows)   # version = snapshot id
        batches = [b for t in source.split(part) for b in source.read(t)]
    """

    spec: IcebergSourceSpec

    def __init__(self, spec: IcebergSourceSpec, context: SourceContext):
        super().__init__(spec, context)
        self._catalog: Catalog | None = None
        self._table: Table | None = None
        self._tasks: OrderedDict[tuple[str, datetime], list[ReadTask]] = OrderedDict()
        self._last_plan: tuple[tuple[str | None, datetime], tuple[Table, DataScan, int, dict[str, FileScanTask]]] | None
        self._last_plan = None
        self._step = granularity_step(spec.granularity)
        # Data files stay inside the data root (a relative or default warehouse) or inside an absolute warehouse.
        self._guard = context.guard(spec.name, warehouse_location(spec.catalog) or ".")

    # ---- catalog and table -------------------------------------------------------------
    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog_for(self.spec, self.context)
        return self._catalog

    def _describe_catalog(self) -> str:
        uri = getattr(self._catalog, "properties", {}).get("uri") if self._catalog is not None else None
        return f"catalog {self.spec.catalog.name!r}" + (f" ({redact_text(uri)})" if uri else "")

    def table(self, refresh: bool = True) -> Table:
        """The cached table, refreshed to the catalog's current metadata when ``refresh``."""
        try:
            if self._table is None:
                self._table = self.catalog.load_table(self.spec.table)
            elif refresh:
                self._table.refresh()
        except (NoSuchTableError, NoSuchNamespaceError) as exc:
            raise IcebergTableNotFoundError(
                f"Iceberg table {self.spec.table!r} (source {self.spec.name!r}) not found in "
                f"{self._describe_catalog()}: {exc}"
            ) from exc
        return self._table

    def version(self) -> str | None:
        snapshot = self.table(refresh=True).current_snapshot()
        return None if snapshot is None else str(snapshot.snapshot_id)

    # ---- planning ----------------------------------------------------------------------
    def _ts_field(self, table: Table) -> NestedField:
        name = self.spec.columns.ts
        try:
            field = table.schema().find_field(name)
        except ValueError as exc:
            raise SchemaMismatchError(f"{self.spec.table}: ts column {name!r} is not in the table schema") from exc
        if not isinstance(field.field_type, (TimestamptzType, TimestampType, LongType)):
            raise SchemaMismatchError(
                f"{self.spec.table}: ts column {name!r} has type {field.field_type}; expected timestamptz"
            )
        return field

    def _literal(self, field: NestedField, when: datetime) -> int:
        micros = (when - _EPOCH) // _MICRO
        return micros // 1000 if isinstance(field.field_type, LongType) else micros  # long: epoch ms

    def _row_filter(self, table: Table, start: datetime, end: datetime) -> BooleanExpression:
        field = self._ts_field(table)
        ts = Reference(field.name)
        return And(
            GreaterThanOrEqual(term=ts, value=literal(self._literal(field, start))),
            LessThan(term=ts, value=literal(self._literal(field, end))),
        )

    def _plan(self, table: Table, snapshot_id: int, start: datetime, end: datetime) -> list[FileScanTask]:
        scan = table.scan(
            row_filter=self._row_filter(table, start, end),
            snapshot_id=snapshot_id,
            selected_fields=tuple(native_columns(self.spec.columns)),
        )
        return list(scan.plan_files())

    def _bucket(self, table: Table, snapshot_id: int, starts: list[datetime]) -> dict[datetime, list[ReadTask]]:
        """Plan once for all ``starts`` and assign each file to the partitions its ts bounds overlap."""
        field = self._ts_field(table)
        out: dict[datetime, list[ReadTask]] = {s: [] for s in starts}
        if not starts:
            return out
        limits = [(s, self._literal(field, s), self._literal(field, s + self._step)) for s in starts]
        for task in self._plan(table, snapshot_id, starts[0], starts[-1] + self._step):
            data = task.file
            self._guard.check(data.file_path)
            low_v = _ts_bound(field, data.lower_bounds)
            high_v = _ts_bound(field, data.upper_bounds)
            for start, lo, hi in limits:
                if (low_v is None or low_v < hi) and (high_v is None or high_v >= lo):
                    out[start].append(
                        ReadTask(
                            source=self.spec.name,
                            partition=start,
                            uri=data.file_path,
                            size_bytes=int(data.file_size_in_bytes),
                            rows=int(data.record_count),
                            version=str(snapshot_id),
                        )
                    )
        for tasks in out.values():
            tasks.sort(key=lambda t: t.uri)
        return out

    def _remember(self, snapshot_id: int, tasks: dict[datetime, list[ReadTask]]) -> None:
        for start, items in tasks.items():
            self._tasks[(str(snapshot_id), start)] = items
            self._tasks.move_to_end((str(snapshot_id), start))
        while len(self._tasks) > _MAX_CACHED_PARTITIONS:
            self._tasks.popitem(last=False)

    def partitions(self, window: TimeWindow) -> list[Partition]:
        table = self.table(refresh=True)
        starts = window.partition_starts(self.spec.granularity)
        snapshot = table.current_snapshot()
        location = f"{self.spec.catalog.name}:{self.spec.table}"
        if snapshot is None:
            return [
                Partition(
                    source=self.spec.name,
                    start=s,
                    end=s + self._step,
                    ready=False,
                    location=location,
                    reason="table has no snapshot yet (nothing committed)",
                )
                for s in starts
            ]
        listed = self._bucket(table, snapshot.snapshot_id, starts)
        self._remember(snapshot.snapshot_id, listed)
        version = str(snapshot.snapshot_id)
        out = []
        for start in starts:
            tasks = listed[start]
            span = f"{self.spec.columns.ts} in [{start:%Y-%m-%dT%H:%M}Z, {start + self._step:%Y-%m-%dT%H:%M}Z)"
            out.append(
                Partition(
                    source=self.spec.name,
                    start=start,
                    end=start + self._step,
                    ready=bool(tasks),
                    location=f"{location}?{span}",
                    version=version,
                    files=len(tasks),
                    bytes=sum(t.size_bytes for t in tasks),
                    rows=sum(t.rows or 0 for t in tasks),
                    reason=None if tasks else f"no data files with {span} in snapshot {version}",
                    detail={"snapshot_id": snapshot.snapshot_id},
                )
            )
        return out

    def split(self, partition: Partition) -> list[ReadTask]:
        if not partition.ready:  # nothing committed there (as ParquetSource: no tasks)
            return []
        cached = self._tasks.get((partition.version or "", partition.start))
        if cached is not None:
            return list(cached)
        table = self.table(refresh=partition.version is None)
        snapshot_id = self._snapshot_for(table, partition.version, partition.location)
        listed = self._bucket(table, snapshot_id, [partition.start])
        self._remember(snapshot_id, listed)
        return list(listed[partition.start])

    def _snapshot_for(self, table: Table, version: str | None, where: str) -> int:
        if version is None:
            snapshot = table.current_snapshot()
            if snapshot is None:
                raise SourceReadError(where, "table has no snapshot")
            return snapshot.snapshot_id
        snapshot_id = int(version)
        if table.snapshot_by_id(snapshot_id) is None:
            table = self.table(refresh=True)
            if table.snapshot_by_id(snapshot_id) is None:
                raise SourceReadError(where, f"snapshot {snapshot_id} of {self.spec.table} no longer exists (expired?)")
        return snapshot_id

    # ---- reading -----------------------------------------------------------------------
    def _scan_plan(self, task: ReadTask) -> tuple[Table, DataScan, int, dict[str, FileScanTask]]:
        """The scan of ``task``'s partition at its snapshot and its planned files by path; the last one is
        kept (a snapshot's plan does not change), so the files of a pack are planned once."""
        key = (task.version, task.partition)
        if self._last_plan is not None and self._last_plan[0] == key:
            return self._last_plan[1]
        snapshot_id = self._snapshot_for(self.table(refresh=False), task.version, task.uri)
        table = self.table(refresh=False)
        start = task.partition
        scan = table.scan(
            row_filter=self._row_filter(table, start, start + self._step),
            snapshot_id=snapshot_id,
            selected_fields=tuple(native_columns(self.spec.columns)),
        )
        plan = (table, scan, snapshot_id, {t.file.file_path: t for t in scan.plan_files()})
        self._last_plan = (key, plan)
        return plan

    def _native_batches(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        table, scan, snapshot_id, planned = self._scan_plan(task)
        start = task.partition
        matches = [planned[task.uri]] if task.uri in planned else []
        if not matches:
            raise SourceReadError(
                task.uri, f"file is not part of snapshot {snapshot_id} for partition {start:%Y-%m-%dT%H}"
            )
        direct = self._direct_reader(table, matches[0], scan.io, start)
        if direct is not None:
            yield from direct
            return
        arrow_scan = iceberg_arrow.ArrowScan(
            table_metadata=scan.table_metadata,
            io=scan.io,
            projected_schema=scan.projection(),
            row_filter=scan.row_filter,
            case_sensitive=scan.case_sensitive,
        )
        stream = getattr(arrow_scan, "_record_batches_from_scan_tasks_and_deletes", None)
        read_deletes = getattr(iceberg_arrow, "_read_all_delete_files", None)
        if stream is not None and read_deletes is not None:
            # Lazy per-batch generator; the public to_record_batches() materialises each file first.
            yield from stream(matches[:1], read_deletes(scan.io, matches[:1]))
        else:  # pragma: no cover - other pyiceberg versions
            yield from arrow_scan.to_record_batches(matches[:1])

    def _direct_reader(
        self, table: Table, task: FileScanTask, io: object, start: datetime
    ) -> Iterator[pa.RecordBatch] | None:
        """Stream a data file with bounded memory when nothing Iceberg-specific applies.

        Only for files without delete files whose columns map to the table schema's field
        ids (no renames since it was written); otherwise None and pyiceberg's reader is used.
        """
        if task.delete_files or not isinstance(io, iceberg_arrow.PyArrowFileIO):
            return None
        parquet = open_parquet(io.new_input(task.file.file_path).open())
        schema = table.schema()
        columns = native_columns(self.spec.columns)
        # Files written by Iceberg carry field ids; files registered with add_files rely on
        # the table's name mapping instead.
        mapping = table.name_mapping()
        mapped = {name: f.field_id for f in (mapping.root if mapping else []) for name in f.names}
        file_ids = {}
        for f in parquet.schema_arrow:
            raw = (f.metadata or {}).get(b"PARQUET:field_id")
            file_ids[f.name] = int(raw) if raw is not None else mapped.get(f.name)
        for name in columns:
            field = schema.find_field(name, case_sensitive=True) if name in schema.column_names else None
            if field is None or file_ids.get(name) != field.field_id:
                return None
        ts_field = self._ts_field(table)
        lo, hi = (pa.scalar(self._literal(ts_field, t)) for t in (start, start + self._step))
        ts_name = self.spec.columns.ts

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in parquet.iter_batches(batch_size=self.spec.batch_rows, columns=columns, use_threads=False):
                ts = batch.column(ts_name)
                raw = ts.cast(pa.int64()) if pa.types.is_timestamp(ts.type) else ts
                keep = pc.and_(pc.greater_equal(raw, lo), pc.less(raw, hi))
                yield batch.filter(keep) if not pc.all(keep).as_py() else batch

        return batches()

    def open_file(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """The native batches of one data file, its rows in the task's partition (delete files applied)."""
        return self._native_batches(task)

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        if task.members:
            yield from self.read_pack(task)
            return

        def normalised() -> Iterator[pa.RecordBatch]:
            native = self._native_batches(task)
            while True:
                try:
                    batch = next(native)
                except StopIteration:
                    return
                except (SourceReadError, IcebergTableNotFoundError, SchemaMismatchError):
                    raise
                except Exception as exc:  # any failure reading the file names it
                    raise SourceReadError(
                        task.uri, f"cannot read Iceberg data file (snapshot {task.version}): {exc}"
                    ) from exc
                yield self.normalize(batch, where=task.uri, partition=task.event_partition)

        yield from _rebatch(normalised(), self.spec.batch_rows)

    def close(self) -> None:
        engine = getattr(self._catalog, "engine", None)
        if engine is not None:
            engine.dispose()
        self._catalog = None
        self._table = None
        self._tasks.clear()
        self._last_plan = None
