"""Fixtures of the data driver tests: a settable clock and a task factory."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from primus_dagster.data.sources.base import ReadTask
from primus_dagster.data.tasks import DataTask

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_task(index: int, hour: int | None = None, stream: str = "history", **meta: object) -> DataTask:
    """Task ``index`` of partition ``T0 + hour`` (default: ``index`` hours)."""
    partition = T0 + timedelta(hours=index if hour is None else hour)
    read = ReadTask(
        source="events",
        partition=partition,
        uri=f"s3://bucket/events/part-{index:05d}.parquet",
        size_bytes=1000 + index,
        rows=4096,
    )
    task = DataTask.for_read(stream, "batch", read)
    if meta:
        task.meta.update(meta)
    return task


@pytest.fixture
def task_factory() -> Callable[..., DataTask]:
    return make_task
