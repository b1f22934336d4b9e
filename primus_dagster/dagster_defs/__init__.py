"""Thin Dagster glue over the engine: source assets, resources, definitions."""

from primus_dagster.dagster_defs.definitions import build_definitions
from primus_dagster.dagster_defs.resources import KafkaResource, PrimusStorageResource, default_resources
from primus_dagster.dagster_defs.source_assets import build_source_asset, build_source_assets, partitions_def_for

__all__ = [
    "KafkaResource", "PrimusStorageResource", "build_definitions", "build_source_asset",
    "build_source_assets", "default_resources", "partitions_def_for",
]
