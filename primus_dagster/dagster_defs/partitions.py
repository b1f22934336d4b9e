"""Dagster time partitions of the spec's granularities (``hour`` / ``day``, UTC), for the source and training assets.

The length of one partition is the spec's :func:`~primus_dagster.spec.granularity_step`; this module
only maps a granularity onto Dagster's partitions definition and counts partitions in a duration.

Example::

    partitions = time_partitions("hour", job.dataset.start)       # HourlyPartitionsDefinition, UTC
    partitions.get_first_partition_key()                           # "2026-11-01-00:00"
    partitions_covering("hour", timedelta(minutes=90))             # 2
    partitioned_check_spec("not_empty", partitions, asset=key, blocking=True)   # evaluations per partition
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from dagster import (
    AssetCheckSpec,
    DailyPartitionsDefinition,
    HourlyPartitionsDefinition,
    PartitionsDefinition,
    PreviewWarning,
    TimeWindowPartitionsDefinition,
)

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


@contextmanager
def partitioned_checks() -> Iterator[None]:
    """Where checks partitioned as their asset are defined, so that each evaluation is recorded against the
    partition it checked (not "Partition -" in the check history). Dagster 1.13 (pinned in constraints.txt)
    marks a check's ``partitions_def`` as a preview and warns at every definitions load; the warning is
    silenced in this block only, and the behaviour is asserted by the source, training asset and schedule tests.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PreviewWarning)
        yield


def partitioned_check_spec(name: str, partitions: PartitionsDefinition | None, **kwargs: Any) -> AssetCheckSpec:
    """An ``AssetCheckSpec`` partitioned as its asset (:func:`partitioned_checks`)."""
    with partitioned_checks():
        return AssetCheckSpec(name, partitions_def=partitions, **kwargs)
