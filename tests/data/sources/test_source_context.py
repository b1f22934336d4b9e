"""Where source locations resolve: relative paths stay inside the data root; absolute paths and URLs are allowed."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from primus_dagster.data.sources import ReadTask, SourceContext
from primus_dagster.data.sources.kafka import plan_tail

T0 = datetime(2026, 11, 1, 5, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "location, resolved",
    [
        ("parquet/clicks", "/data/parquet/clicks"),
        ("a/../b", "/data/a/../b"),  # stays inside
        (".", "/data/."),
        ("/elsewhere/clicks", "/elsewhere/clicks"),  # absolute paths: allowed, explicitly
        ("s3://bucket/clicks", "s3://bucket/clicks"),  # URLs too
        ("file:///x/../y", "file:///x/../y"),
    ],
)
def test_resolve(location: str, resolved: str) -> None:
    assert SourceContext("/data/").resolve(location) == resolved


@pytest.mark.parametrize("location", ["..", "../secrets", "a/../../etc/passwd", "./../x"])
def test_relative_paths_cannot_escape_the_data_root(location: str) -> None:
    with pytest.raises(ValueError, match=r"leaves the data root '/data'"):
        SourceContext("/data").resolve(location)


def test_a_live_tail_task_has_no_event_time_partition() -> None:
    plan = plan_tail("s", "topic", {0: 0}, {0: 10}, None, 100, T0, "hour")
    (task,) = plan.tasks
    assert task.open_partition and task.event_partition is None
    assert ReadTask.from_json(task.to_json()) == task
    closed = ReadTask("s", T0, "topic:0", 0, 10)
    assert closed.event_partition == T0 and "open_partition" not in closed.to_dict()
