"""Source versions of a set of tasks: table versions and Kafka offset ranges."""

from __future__ import annotations

from datetime import datetime, timezone

from primus_dagster.data.sources.base import ReadTask
from primus_dagster.data.tasks import DataTask
from primus_dagster.data.versions import source_versions

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def test_versions_and_offsets_per_source() -> None:
    tasks = [
        DataTask.for_read("h", "batch", ReadTask("delta", T0, "/d/part-0.parquet", version="12")),
        DataTask.for_read("h", "batch", ReadTask("delta", T0, "/d/part-1.parquet", version="12")),
        DataTask.for_read("h", "batch", ReadTask("pq", T0, "/p/part-0.parquet", 0, 2, rows=100)),
        DataTask.for_read("l", "stream", ReadTask("kafka", T0, "events:0", 0, 500, rows=500)),
        DataTask.for_read("l", "stream", ReadTask("kafka", T0, "events:0", 500, 900, rows=400)),
        DataTask.for_read("l", "stream", ReadTask("kafka", T0, "events:1", 40, 70, rows=30)),
    ]
    assert source_versions(tasks) == {
        "delta": {"versions": ["12"]},
        "kafka": {"offsets": {"events:0": [0, 900], "events:1": [40, 70]}},
    }
