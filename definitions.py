"""The reference Dagster code location: ``dagster dev`` (workspace.yaml) or ``-m definitions``.

dagster asset materialize -m definitions --select impressions_parquet --partition 2026-11-01-00:00
"""

from dagster import Definitions

from assets import source_assets
from resources import RESOURCES
from sensors import SCHEDULES, SENSORS

defs = Definitions(assets=source_assets, resources=RESOURCES, sensors=SENSORS, schedules=SCHEDULES)
