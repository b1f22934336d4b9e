"""The reference Dagster code location: ``dagster dev`` (workspace.yaml) or ``-m definitions``.

Example::

    dagster asset materialize -m definitions --select impressions_parquet --partition 2026-11-01-00:00
    dg launch -m definitions --assets impressions_parquet --partition 2026-11-01-00:00
    PRIMUS_DEPLOYMENT=kubernetes dagster dev     # steps as Kubernetes Jobs (docs/kubernetes.md)
"""

from primus_dagster.dagster_defs import build_definitions

from assets import EXTRA_ASSETS, JOB, JOB_SPEC_PATH
from resources import EXECUTOR, RESOURCES
from sensors import SCHEDULES, SENSORS

defs = build_definitions(
    JOB,
    job_path=JOB_SPEC_PATH,
    resources=RESOURCES,
    sensors=SENSORS,
    schedules=SCHEDULES,
    extra_assets=EXTRA_ASSETS,
    executor=EXECUTOR,
)
