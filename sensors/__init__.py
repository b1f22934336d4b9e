"""Reference code location: the sensors it runs and the schedule it offers.

``SENSORS``: the job's batch sensor (new and changed Parquet / Delta / Iceberg partitions) and a stream
sensor per Kafka source (offsets, lag, thresholds), both RUNNING as soon as the daemon is (``dagster
dev``, ``make dev``): sources and training partitions materialise by themselves as data lands. With
``PRIMUS_SENSORS=stopped`` in the environment the deployment starts with them stopped (to look around
or backfill by hand first); start them in the UI or with ``dagster sensor start``.
``SCHEDULES``: the training schedule, STOPPED -- the clock-driven alternative to the sensors, for data
that lands on time; turn it on in the UI or with ``dagster schedule start`` (docs/automation.md).

Example::

    SENSORS = build_sensors(JOB, default_status=DefaultSensorStatus.STOPPED)   # start them by hand instead
"""

import os

from dagster import DefaultSensorStatus, ScheduleDefinition, SensorDefinition

from primus_dagster.dagster_defs import build_schedules, build_sensors

from assets import JOB

SENSORS_ENV = "PRIMUS_SENSORS"


def default_sensor_status() -> DefaultSensorStatus:
    """``running`` (unset) or ``stopped`` from ``$PRIMUS_SENSORS``."""
    value = os.environ.get(SENSORS_ENV, "running").strip().lower()
    statuses = {"running": DefaultSensorStatus.RUNNING, "stopped": DefaultSensorStatus.STOPPED}
    if value not in statuses:
        raise ValueError(f"${SENSORS_ENV}={value!r}: choose running or stopped")
    return statuses[value]


SENSORS: list[SensorDefinition] = build_sensors(JOB, default_status=default_sensor_status())
SCHEDULES: list[ScheduleDefinition] = build_schedules(JOB)
