"""Dagster time partitions of the spec's granularities (``hour`` / ``day``, UTC), for the source and training assets.

The length of one partition is the spec's :func:`~primus_dagster.spec.granularity_step`; this module
only maps a granularity onto Dagster's partitions definition and counts partitions in a duration.

Example::

    partitions = time_partitions("hour", job.dataset.start)       # HourlyPartitionsDefinition, UTC
    partitions.get_first_partition_key()                           # "2026-11-01-00:00"
    partitions_covering("hour", timedelta(minutes=90))             # 2
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from dagster import DailyPartitionsDefinition, HourlyPartitionsDefinition, TimeWindowPartitionsDefinition

from primus_dagster.spec import granularity_step

_DEFINITION_AND_KEY_FORMAT: dict[str, tuple[type[TimeWindowPartitionsDefinition], str]] = {
    "hour": (HourlyPartitionsDefinition, "%Y-%m-%d-%H:%M"),
    "day": (DailyPartitionsDefinition, "%Y-%m-%d"),
}


def time_partitions(granularity: str, start: datetime, end: datetime | None = None) -> TimeWindowPartitionsDefinition:
    """Hourly or daily partitions in UTC from ``start`` to ``end`` (exclusive; None: open-ended)."""
    if granularity not in _DEFINITION_AND_KEY_FORMAT:
        raise ValueError(f"granularity {granularity!r} has no Dagster partitions; expected one of hour, day")
    definition, key_format = _DEFINITION_AND_KEY_FORMAT[granularity]
    return definition(
        start_date=start.strftime(key_format), end_date=end.strftime(key_format) if end else None, timezone="UTC"
    )


def partitions_covering(granularity: str, duration: timedelta) -> int:
    """How many partitions of ``granularity`` it takes to cover ``duration`` (rounded up)."""
    return math.ceil(duration / granularity_step(granularity))
