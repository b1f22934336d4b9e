"""Pick the adapter class for a source spec."""

from __future__ import annotations

from primus_dagster.data.sources.base import SourceAdapter, SourceContext
from primus_dagster.spec.sources import SourceSpec


def make_adapter(spec: SourceSpec, context: SourceContext) -> SourceAdapter:
    """The adapter for ``spec.type``; imports storage libraries only when needed.

    >>> adapter = make_adapter(job.dataset.source("impressions_parquet"), SourceContext("/data"))  # doctest: +SKIP
    """
    if spec.type == "parquet":
        from primus_dagster.data.sources.parquet import ParquetSource

        return ParquetSource(spec, context)
    if spec.type == "delta":
        from primus_dagster.data.sources.delta import DeltaSource

        return DeltaSource(spec, context)
    if spec.type == "iceberg":
        from primus_dagster.data.sources.iceberg import IcebergSource

        return IcebergSource(spec, context)
    if spec.type == "kafka":
        from primus_dagster.data.sources.kafka import KafkaSource

        return KafkaSource(spec, context)
    raise ValueError(f"source {spec.name!r}: unknown type {spec.type!r}")
