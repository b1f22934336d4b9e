"""Synthetic hours written to a Delta Lake table, one commit per hour.

The table is partitioned by ``date_column`` (plus ``hour_column`` if hourly). Re-writing an
hour that is already there is a predicate overwrite (``dt = '…' AND hour = H``) that replaces
exactly that hour in one commit; new hours are plain appends.

Example::

    writer = DeltaWriter(spec, SourceContext(data_root="/data"))
    nbytes, files = writer.write_hour(datetime(2026, 11, 1, 5, tzinfo=timezone.utc), hour_table)
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.spec.sources import DeltaSourceSpec
from primus_dagster.synth.writers.base import SourceWriter


class DeltaWriter(SourceWriter):
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
            for path, size in zip(
                actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=False
            )
            if path not in known
        ]
        return int(sum(added)), len(added)
