"""Reference deployment: sensors and schedules.

None yet: the sensors that turn new partitions / Kafka offsets into runs, and the
hourly/daily schedules, arrive with the sensors-and-schedules work on the roadmap.
"""

SENSORS: list = []
SCHEDULES: list = []
