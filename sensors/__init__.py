"""Reference code location: sensors and schedules.

None yet: the sensors that turn new partitions / Kafka offsets into runs, and the
hourly/daily schedules, arrive with the sensors-and-schedules work on the roadmap.

Example::

    SENSORS = [my_partition_sensor]     # handed to build_definitions in definitions.py
"""

from dagster import ScheduleDefinition, SensorDefinition

SENSORS: list[SensorDefinition] = []
SCHEDULES: list[ScheduleDefinition] = []
