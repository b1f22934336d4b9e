"""The interface every synthetic-world writer implements: write one hour of rows to one source.

One writer per source format (:mod:`.parquet`, :mod:`.delta`, :mod:`.iceberg`, :mod:`.kafka`);
:func:`~primus_dagster.synth.writers.write_world` makes one per source of a job spec, hands each
its share of every hour and closes them all at the end.

Example::

    writer: SourceWriter = ParquetWriter(spec, SourceContext(data_root="/data"))
    try:
        nbytes, files = writer.write_hour(datetime(2026, 11, 1, 5, tzinfo=timezone.utc), hour_table)
    finally:
        writer.close()
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa


class SourceWriter:
    """Writes whole hours of synthetic rows to one source; :meth:`close` releases its clients."""

    def write_hour(self, start: datetime, table: pa.Table) -> tuple[int, int]:
        """Write one hour; return ``(bytes, files)`` written."""
        raise NotImplementedError

    def close(self) -> None:
        pass
