"""Reference code location: the sensors it runs and the schedule it offers.

``SENSORS``: the job's batch sensor (new and changed Parquet / Delta / Iceberg partitions) and a stream
sensor per Kafka source (offsets, lag, thresholds), both RUNNING as soon as the daemon is (``dagster
dev``, ``make dev``): sources and training partitions materialise by themselves as data lands.
``SCHEDULES``: the training schedule, STOPPED -- the clock-driven alternative to the sensors, for data
that lands on time; turn it on in the UI or with ``dagster schedule start`` (docs/automation.md).

Example::

    SENSORS = build_sensors(JOB, default_status=DefaultSensorStatus.STOPPED)   # start them by hand instead
"""

from dagster import DefaultSensorStatus, ScheduleDefinition, SensorDefinition

from primus_dagster.dagster_defs import build_schedules, build_sensors

from assets import JOB

SENSORS: list[SensorDefinition] = build_sensors(JOB, default_status=DefaultSensorStatus.RUNNING)
SCHEDULES: list[ScheduleDefinition] = build_schedules(JOB)
