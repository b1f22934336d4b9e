"""The job contract: JobSpec -> DatasetSpec -> StreamSpec -> SourceSpec, loaded strictly from YAML."""

from primus_dagster.spec.automation import AutomationSpec
from primus_dagster.spec.dataset import DatasetSpec, JoinSpec, StreamSpec, granularity_step
from primus_dagster.spec.durations import format_duration, parse_duration
from primus_dagster.spec.job import (
    DataPlaneSpec,
    HorizontalScalingSpec,
    JobSpec,
    MetricSpec,
    ModelSpec,
    PoolSpec,
    PoolsSpec,
    ScalingSpec,
    TrackingSpec,
    TrainingSpec,
    VerticalScalingSpec,
)
from primus_dagster.spec.loader import Problem, SpecError, job_spec_json_schema, load_job_spec, parse_job_spec
from primus_dagster.spec.names import DAGSTER_RESERVED_NAMES, dagster_name_problem
from primus_dagster.spec.redact import REDACTED, is_secret_key, redact, redact_text
from primus_dagster.spec.sources import (
    SOURCE_TYPES,
    ColumnMapping,
    DeltaSourceSpec,
    IcebergCatalogSpec,
    IcebergSourceSpec,
    KafkaSourceSpec,
    ParquetSourceSpec,
    SourceSpec,
)

__all__ = [
    "DAGSTER_RESERVED_NAMES",
    "REDACTED",
    "SOURCE_TYPES",
    "AutomationSpec",
    "ColumnMapping",
    "DataPlaneSpec",
    "DatasetSpec",
    "DeltaSourceSpec",
    "HorizontalScalingSpec",
    "IcebergCatalogSpec",
    "IcebergSourceSpec",
    "JobSpec",
    "JoinSpec",
    "KafkaSourceSpec",
    "MetricSpec",
    "ModelSpec",
    "ParquetSourceSpec",
    "PoolSpec",
    "PoolsSpec",
    "Problem",
    "ScalingSpec",
    "SourceSpec",
    "SpecError",
    "StreamSpec",
    "TrackingSpec",
    "TrainingSpec",
    "VerticalScalingSpec",
    "dagster_name_problem",
    "format_duration",
    "granularity_step",
    "is_secret_key",
    "job_spec_json_schema",
    "load_job_spec",
    "parse_duration",
    "parse_job_spec",
    "redact",
    "redact_text",
]
