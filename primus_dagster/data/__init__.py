"""The data plane's public API: what ``training``, the Dagster glue, the benchmarks and users import.

``spec -> DTGG plan -> data driver -> data executors -> Flight -> reader -> Batch`` (contracts:
``docs/data_plane.md``). Everything outside ``primus_dagster.data`` imports these names from
here (or from the ``sources`` / ``graph`` / ``driver`` / ``executor`` / ``reader`` / ``shm``
subpackages' ``__init__``), never from their modules; ``make lint`` checks it.

Example::

    from primus_dagster.data import Batch, DataPlane, InTrainerDataPlane, Planner, SourceContext, TimeWindow

    with Planner.for_job(job, SourceContext(data_root)) as planner:
        plan = planner.plan(TimeWindow.hours_from(start, 24))
    with InTrainerDataPlane("job.yaml", data_root, plan.tasks, executors=2) as plane:  # a DataPlane
        with plane.reader(0) as reader:
            for batch in reader:                      # Batch: Arrow columns, tensors, metadata
                logits = model(batch.dense, batch.sparse, batch.kind)
"""

from typing import TYPE_CHECKING, Any

from primus_dagster.data.batch import (
    Batch,
    BatchMeta,
    BatchTensors,
    Jagged,
    arrow_to_tensors,
    list_feature_names,
    sparse_feature_names,
)
from primus_dagster.data.canonical import (
    QUALITY_RULES,
    Normalizer,
    PermanentDataError,
    SchemaMismatchError,
    canonical_schema,
    declared_schema,
    native_columns,
    quality_summary,
    schema_hash,
)
from primus_dagster.data.driver import (
    DataAbortedError,
    DataDriver,
    DataFailedError,
    DriverAPI,
    DriverClient,
    DriverServer,
)
from primus_dagster.data.executor import EXECUTOR_ENV, ExecutorConfig, start_executor_process, wait_ready
from primus_dagster.data.in_trainer_plane import InTrainerDataPlane  # its modules load here anyway
from primus_dagster.data.plane import DataPlane, DataPlaneBase, DataPlaneStarter, reader_for
from primus_dagster.data.reader import ChooseQueue, QueueStat, RemoteReader, RoundRobin, batch_first
from primus_dagster.data.shm import sweep_dead_executors
from primus_dagster.data.sources import (
    Partition,
    PartitionNotReadyError,
    PartitionScan,
    ReadTask,
    SourceAdapter,
    SourceContext,
    SourceReadError,
    TimeWindow,
    make_adapter,
    scan_partition,
    scan_problems,
)
from primus_dagster.data.sources.base import PackFailure, pack_failure
from primus_dagster.data.task_batches import read_batches, task_batches
from primus_dagster.data.tasks import BatchId, DataTask, read_location
from primus_dagster.data.versions import source_versions

if TYPE_CHECKING:
    from primus_dagster.data.data_check import GATED_RULES, PartitionFindings, RuleFinding, scan_with_findings
    from primus_dagster.data.graph import ListingCache, NotReady, Plan, Planner, plan_report, render_plan
    from primus_dagster.data.sources.kafka import KafkaSource, TailOffsetError, TailPlan

# Loaded on first use (PEP 562): a data executor process imports this package but none of these (the
# planner, the data checks, the Kafka client stack): ~0.09 CPU-s of its start-up.
_LAZY = {
    "GATED_RULES": "primus_dagster.data.data_check",
    "PartitionFindings": "primus_dagster.data.data_check",
    "RuleFinding": "primus_dagster.data.data_check",
    "scan_with_findings": "primus_dagster.data.data_check",
    "ListingCache": "primus_dagster.data.graph",
    "NotReady": "primus_dagster.data.graph",
    "Plan": "primus_dagster.data.graph",
    "Planner": "primus_dagster.data.graph",
    "plan_report": "primus_dagster.data.graph",
    "render_plan": "primus_dagster.data.graph",
    "KafkaSource": "primus_dagster.data.sources.kafka",
    "TailOffsetError": "primus_dagster.data.sources.kafka",
    "TailPlan": "primus_dagster.data.sources.kafka",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "EXECUTOR_ENV",
    "GATED_RULES",
    "QUALITY_RULES",
    "Batch",
    "BatchId",
    "BatchMeta",
    "BatchTensors",
    "ChooseQueue",
    "DataAbortedError",
    "DataDriver",
    "DataFailedError",
    "DataPlane",
    "DataPlaneBase",
    "DataPlaneStarter",
    "DataTask",
    "DriverAPI",
    "DriverClient",
    "DriverServer",
    "ExecutorConfig",
    "InTrainerDataPlane",
    "Jagged",
    "KafkaSource",
    "ListingCache",
    "Normalizer",
    "NotReady",
    "PackFailure",
    "Partition",
    "PartitionFindings",
    "PartitionNotReadyError",
    "PartitionScan",
    "PermanentDataError",
    "Plan",
    "Planner",
    "QueueStat",
    "ReadTask",
    "RemoteReader",
    "RoundRobin",
    "RuleFinding",
    "SchemaMismatchError",
    "SourceAdapter",
    "SourceContext",
    "SourceReadError",
    "TailOffsetError",
    "TailPlan",
    "TimeWindow",
    "arrow_to_tensors",
    "batch_first",
    "canonical_schema",
    "declared_schema",
    "list_feature_names",
    "make_adapter",
    "native_columns",
    "pack_failure",
    "plan_report",
    "quality_summary",
    "read_batches",
    "read_location",
    "reader_for",
    "render_plan",
    "scan_partition",
    "scan_problems",
    "scan_with_findings",
    "schema_hash",
    "source_versions",
    "sparse_feature_names",
    "start_executor_process",
    "sweep_dead_executors",
    "task_batches",
    "wait_ready",
]
