"""Synthetic hours written as Parquet files in hive (``dt=YYYY-MM-DD/hour=HH``) or templated directories.

Re-writing an hour replaces it: the success marker is removed first, the files are rewritten
and the marker is written last; in a daily directory only the hour's ``part-HH-*`` files are
replaced, and the marker is written once all 24 hours are present.

Example::

    writer = ParquetWriter(spec, SourceContext(data_root="/data"), files_per_hour=4)
    nbytes, files = writer.write_hour(datetime(2026, 11, 1, 5, tzinfo=timezone.utc), hour_table)
"""

from __future__ import annotations

from datetime import datetime

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.spec.sources import ParquetSourceSpec
from primus_dagster.synth.writers.base import SourceWriter


class ParquetWriter(SourceWriter):
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
