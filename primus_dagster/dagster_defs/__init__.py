"""Thin Dagster glue over the engine: source assets with blocking checks, the training asset, resources,
sensors and schedules.

Example::

    from primus_dagster.dagster_defs import build_definitions

    defs = build_definitions("examples/job.yaml")      # one asset per source + the training asset
    defs = build_definitions("examples/job.yaml", sensors=build_sensors(job), schedules=build_schedules(job))

The same as a Dagster component (:class:`PrimusJobComponent`, ``type: primus_dagster.PrimusJobComponent`` in a
``defs.yaml``)::

    dg scaffold defs primus_dagster.PrimusJobComponent my_job && dg check defs
"""

from primus_dagster.dagster_defs.component import PrimusJobComponent
from primus_dagster.dagster_defs.definitions import build_definitions
from primus_dagster.dagster_defs.executors import DEPLOYMENTS, deployment_executor
from primus_dagster.dagster_defs.live_asset import build_live_asset, live_asset_job, live_asset_name
from primus_dagster.dagster_defs.partitions import partitions_covering, time_partitions
from primus_dagster.dagster_defs.resources import (
    ExecutorPoolResource,
    KafkaResource,
    MlflowResource,
    PrimusStorageResource,
    default_resources,
)
from primus_dagster.dagster_defs.schedules import auc_final_job, build_schedules, training_asset_job
from primus_dagster.dagster_defs.sensors import build_batch_sensor, build_sensors, build_stream_sensor
from primus_dagster.dagster_defs.source_assets import build_source_asset, build_source_assets
from primus_dagster.dagster_defs.source_checks import (
    EVENT_TIMES_IN_PARTITION,
    FRESHNESS,
    LABEL_RATE_IN_RANGE,
    NO_UNREADABLE_FILES,
    NOT_EMPTY,
    SCHEMA_MATCHES_SPEC,
    SOURCE_CHECK_DESCRIPTIONS,
)
from primus_dagster.dagster_defs.training_asset import (
    AUC_CHECK_NAME,
    AUC_FINAL_CHECK_NAME,
    build_auc_final_check,
    build_training_asset,
    training_asset_name,
)

__all__ = [
    "AUC_CHECK_NAME",
    "AUC_FINAL_CHECK_NAME",
    "DEPLOYMENTS",
    "EVENT_TIMES_IN_PARTITION",
    "FRESHNESS",
    "LABEL_RATE_IN_RANGE",
    "NOT_EMPTY",
    "NO_UNREADABLE_FILES",
    "SCHEMA_MATCHES_SPEC",
    "SOURCE_CHECK_DESCRIPTIONS",
    "ExecutorPoolResource",
    "KafkaResource",
    "MlflowResource",
    "PrimusJobComponent",
    "PrimusStorageResource",
    "auc_final_job",
    "build_auc_final_check",
    "build_batch_sensor",
    "build_definitions",
    "build_live_asset",
    "build_schedules",
    "build_sensors",
    "build_source_asset",
    "build_source_assets",
    "build_stream_sensor",
    "build_training_asset",
    "default_resources",
    "deployment_executor",
    "live_asset_job",
    "live_asset_name",
    "partitions_covering",
    "time_partitions",
    "training_asset_job",
    "training_asset_name",
]
