"""The held-out evaluation reports the time its rows cover: a daily source's partition is a whole day, so an
evaluation asked for one hour after the window says it scored the day."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from primus_dagster.data import DataTask, TimeWindow
from primus_dagster.data.sources.base import ReadTask
from primus_dagster.spec import parse_job_spec
from primus_dagster.training.evaluation import scored_window

JOB = """
name: t
dataset:
  start: 2026-11-01
  streams:
    - name: s
      sources:
        - {name: daily, type: parquet, path: d, granularity: day, columns: {ts: t, label: y, dense: [a]}}
        - {name: hourly, type: parquet, path: h, columns: {ts: t, label: y, dense: [a]}}
"""
DAY = datetime(2026, 11, 2, tzinfo=timezone.utc)


def _task(source: str, partition: datetime) -> DataTask:
    return DataTask.for_read("s", "batch", ReadTask(source, partition, f"file:///{source}/{partition:%Y%m%d%H}"))


def test_a_daily_partition_scores_its_whole_day_and_hourly_ones_their_hours() -> None:
    job = parse_job_spec(JOB)
    assert scored_window(job, [_task("daily", DAY)]) == TimeWindow(DAY, DAY + timedelta(days=1))
    hours = [_task("hourly", DAY + timedelta(hours=h)) for h in (0, 1)]
    assert scored_window(job, hours) == TimeWindow(DAY, DAY + timedelta(hours=2))
