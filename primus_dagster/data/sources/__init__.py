"""Source adapters: Parquet files, Delta Lake, Iceberg and Kafka, behind one protocol."""

from primus_dagster.data.sources.base import (
    ListingGuard,
    Partition,
    PartitionNotReadyError,
    ReadTask,
    SourceAdapter,
    SourceContext,
    SourceReadError,
    TimeWindow,
)
from primus_dagster.data.sources.registry import make_adapter
from primus_dagster.data.sources.scan import PartitionScan, scan_partition, scan_problems
from primus_dagster.spec.sources import PathOutsideRootError

__all__ = [
    "ListingGuard",
    "Partition",
    "PartitionNotReadyError",
    "PartitionScan",
    "PathOutsideRootError",
    "ReadTask",
    "SourceAdapter",
    "SourceContext",
    "SourceReadError",
    "TimeWindow",
    "make_adapter",
    "scan_partition",
    "scan_problems",
]
