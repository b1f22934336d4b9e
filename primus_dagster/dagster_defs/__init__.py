"""Thin Dagster glue over the engine: source assets, the training asset, resources, definitions."""

from primus_dagster.dagster_defs.definitions import build_definitions
from primus_dagster.dagster_defs.resources import (
    ExecutorPoolResource,
    KafkaResource,
    MlflowResource,
    PrimusStorageResource,
    default_resources,
)
from primus_dagster.dagster_defs.source_assets import build_source_asset, build_source_assets, partitions_def_for
from primus_dagster.dagster_defs.training_asset import build_training_asset, training_asset_name

__all__ = [
    "ExecutorPoolResource",
    "KafkaResource",
    "MlflowResource",
    "PrimusStorageResource",
    "build_definitions",
    "build_source_asset",
    "build_source_assets",
    "build_training_asset",
    "default_resources",
    "partitions_def_for",
    "training_asset_name",
]
