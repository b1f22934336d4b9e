"""The one partitions helper of the glue: hourly / daily UTC partitions, and partitions covering a duration."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from dagster import DailyPartitionsDefinition, HourlyPartitionsDefinition

from primus_dagster.dagster_defs import partitions_covering, time_partitions

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def test_hourly_partitions_in_utc_end_exclusive() -> None:
    partitions = time_partitions("hour", T0, T0 + timedelta(hours=3))
    assert isinstance(partitions, HourlyPartitionsDefinition) and partitions.timezone == "UTC"
    assert partitions.get_partition_keys() == ["2026-11-01-00:00", "2026-11-01-01:00", "2026-11-01-02:00"]


def test_daily_partitions_open_ended() -> None:
    partitions = time_partitions("day", T0)
    assert isinstance(partitions, DailyPartitionsDefinition) and partitions.end is None
    assert partitions.get_first_partition_key() == "2026-11-01"


def test_unknown_granularity_is_an_error() -> None:
    with pytest.raises(ValueError, match="hour, day"):
        time_partitions("week", T0)


@pytest.mark.parametrize(
    "granularity,duration,count",
    [
        ("hour", timedelta(0), 0),
        ("hour", timedelta(minutes=90), 2),
        ("hour", timedelta(hours=2), 2),
        ("day", timedelta(hours=24), 1),
        ("day", timedelta(hours=25), 2),
    ],
)
def test_partitions_covering_rounds_up(granularity: str, duration: timedelta, count: int) -> None:
    assert partitions_covering(granularity, duration) == count
