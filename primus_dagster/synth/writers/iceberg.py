"""Synthetic hours written to an Iceberg table, one snapshot per hour.

Each hour is one Parquet file registered with ``add_files`` (the partition value comes from
its statistics, so pyiceberg-core is not needed); an existing hour is removed by a
metadata-only delete (event-time range filter) in the same transaction. The table is created
on first write, partitioned by hour(event_time) (day(event_time) if daily).

Example::

    writer = IcebergWriter(spec, SourceContext(data_root="/data"))
    try:
        nbytes, files = writer.write_hour(datetime(2026, 11, 1, 5, tzinfo=timezone.utc), hour_table)
    finally:
        writer.close()
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.spec.sources import IcebergSourceSpec
from primus_dagster.synth.writers.base import SourceWriter


class IcebergWriter(SourceWriter):
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
            transform: HourTransform | DayTransform = (
                HourTransform() if self.spec.granularity == "hour" else DayTransform()
            )
            with (
                self.catalog.create_table_transaction(self.spec.table, schema=schema) as txn,
                txn.update_spec() as update,
            ):
                update.add_field(self.ts_column, transform, f"{self.ts_column}_{self.spec.granularity}")
            self._table = self.catalog.load_table(self.spec.table)
        return self._table

    def write_hour(self, start: datetime, table: pa.Table) -> tuple[int, int]:
        from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan, Reference
        from pyiceberg.expressions.literals import literal

        iceberg_table = self._load(table.schema)
        end = start + timedelta(hours=1)
        ts = Reference(self.ts_column)
        hour_filter = And(
            GreaterThanOrEqual(term=ts, value=literal(start.isoformat())),
            LessThan(term=ts, value=literal(end.isoformat())),
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
