"""The sensors' pure parts, without Dagster or storage: what is new since the cursor, the window a sensor
watches (``streams[].window`` ending ``label_delay`` before now), what a training partition reads, and
the cursors' JSON."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from primus_dagster.dagster_defs.sensors import (
    BatchCursor,
    ListedPartition,
    StreamCursor,
    diff_partitions,
    partition_fingerprint,
    sensor_window,
    training_inputs,
)
from primus_dagster.data import Partition, ReadTask, TimeWindow
from primus_dagster.spec import parse_job_spec

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
JOB = parse_job_spec("""
name: pure
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 6h
      sources:
        - {name: imp, type: parquet, kind: batch, label_delay: 2h, path: imp, columns: {ts: t, dense: [d]}}
    - name: live
      window: 1h
      sources: [{name: ev, type: parquet, kind: stream, path: ev, columns: {ts: t, dense: [d]}}]
training: {mode: mixed, partition: hour, batch_lag: 1h}
""")


def listed(key: str, fingerprint: str, version: str = "v") -> ListedPartition:
    return ListedPartition("imp", key, T0, version, fingerprint)


def test_new_same_and_changed_partitions_and_pruning() -> None:
    seen = {"imp": {"2026-11-01-00:00": ["7", "aa"], "2026-11-01-01:00": ["7", "bb"]}}
    changes = diff_partitions(
        seen,
        [
            listed("2026-11-01-01:00", "bb", "9"),
            listed("2026-11-01-02:00", "cc", "9"),
            listed("2026-11-01-03:00", "dd"),
        ],
        keep_from={"imp": "2026-11-01-01:00"},
    )
    assert [p.key for p in changes.new] == ["2026-11-01-02:00", "2026-11-01-03:00"]
    assert changes.changed == []  # 01:00 has the same files: a new table version alone is no change
    assert sorted(changes.seen["imp"]) == ["2026-11-01-01:00", "2026-11-01-02:00", "2026-11-01-03:00"]  # 00:00 pruned
    again = diff_partitions(changes.seen, [listed("2026-11-01-02:00", "cx", "10")], {})
    assert again.new == [] and again.changed == [("9", listed("2026-11-01-02:00", "cx", "10"))]


def test_the_sensor_window_is_the_streams_window_of_complete_partitions() -> None:
    history, live = JOB.dataset.streams
    now = T0 + timedelta(hours=12, minutes=30)
    # imp: label_delay 2h, so the last complete hour ends at 10:00; the window is the 6 hours before.
    assert sensor_window(JOB, history, history.sources[0], now) == TimeWindow(
        T0 + timedelta(hours=4), T0 + timedelta(hours=10)
    )
    assert sensor_window(JOB, live, live.sources[0], now) == TimeWindow(
        T0 + timedelta(hours=11), T0 + timedelta(hours=12)
    )
    assert sensor_window(JOB, history, history.sources[0], T0 + timedelta(hours=1)) is None  # before the dataset


def test_a_training_window_reads_the_lagged_batch_hours_whose_labels_are_complete() -> None:
    inputs = training_inputs(JOB, TimeWindow(T0 + timedelta(hours=3), T0 + timedelta(hours=5)))
    # batch: hours 2-3 (lag 1h); hour 2 complete at 05:00 = the window end, hour 3 only at 06:00.
    assert inputs == {"imp": [T0 + timedelta(hours=2)], "ev": [T0 + timedelta(hours=3), T0 + timedelta(hours=4)]}


def test_the_fingerprint_follows_the_files() -> None:
    part = Partition("imp", T0, T0 + timedelta(hours=1), True, "x", detail={"files": [("a", 1), ("b", 2)]})
    reordered = Partition("imp", T0, T0 + timedelta(hours=1), True, "x", detail={"files": [("b", 2), ("a", 1)]})
    grown = Partition("imp", T0, T0 + timedelta(hours=1), True, "x", detail={"files": [("a", 1), ("b", 3)]})
    adapter = SimpleNamespace(split=lambda p: [ReadTask("imp", T0, "f1", size_bytes=5)])
    assert partition_fingerprint(adapter, part) == partition_fingerprint(adapter, reordered)
    assert partition_fingerprint(adapter, part) != partition_fingerprint(adapter, grown)
    table = Partition("imp", T0, T0 + timedelta(hours=1), True, "x", version="4")  # Delta / Iceberg: from split
    assert len(partition_fingerprint(adapter, table)) == 12


def test_cursors_round_trip() -> None:
    batch = BatchCursor(seen={"imp": {"2026-11-01-00:00": ["1", "aa"]}}, retrain=["b", "a", "a"])
    assert BatchCursor.parse(batch.dumps(), "s") == BatchCursor(seen=batch.seen, retrain=["a", "b"])
    stream = StreamCursor(requested={"0": 3}, observed={"0": 4}, pending_since=T0, next_start=T0 + timedelta(hours=1))
    assert StreamCursor.parse(stream.dumps(), "s") == stream
    assert BatchCursor.parse(None, "s") == BatchCursor() and StreamCursor.parse("", "s") == StreamCursor()
