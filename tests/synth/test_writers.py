"""Writing the synthetic world to parquet / delta / iceberg / kafka sources of a job spec."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.spec import JobSpec, parse_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, shard_of, write_world

COLUMNS = "{ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2], sparse: [user_id, item_id]}"
SPEC = f"""
name: synth-test
dataset:
  start: 2026-11-01
  streams:
    - name: history
      sources:
        - {{name: pq, type: parquet, kind: batch, path: parquet/imp, columns: {COLUMNS}}}
        - {{name: dl, type: delta, kind: batch, uri: delta/imp, columns: {COLUMNS}}}
        - {{name: ice, type: iceberg, kind: batch, table: synth.imp, columns: {COLUMNS}}}
    - name: live
      window: 1h
      sources:
        - {{name: ev, type: kafka, kind: stream, topic: TOPIC, columns: {COLUMNS}}}
"""
BATCH = ["pq", "dl", "ice"]


def make_job(topic: str = "synth-events") -> JobSpec:
    return parse_job_spec(SPEC.replace("TOPIC", topic))


def make_world(job: JobSpec) -> SyntheticWorld:
    return SyntheticWorld(WorldConfig(seed=5, users=300, items=100, topics=6, rows_per_hour=600), job.dataset.start)


def world_rows(world: SyntheticWorld, hours: range) -> pa.Table:
    table = pa.concat_tables([world.hour(h) for h in hours]).drop_columns(["click_delay_s"])
    return table.sort_by("sample_id")


def read_parquet(root: Path) -> pa.Table:
    files = sorted(root.glob("dt=*/hour=*/part-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("sample_id")


def read_delta(uri: Path) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(str(uri)).to_pyarrow_table().drop_columns(["dt", "hour"]).sort_by("sample_id")


def read_iceberg(job: JobSpec, root: Path) -> pa.Table:
    from primus_dagster.data.sources.iceberg import load_catalog_for

    catalog = load_catalog_for(job.dataset.source("ice"), SourceContext(str(root)))
    return catalog.load_table("synth.imp").scan().to_arrow().sort_by("sample_id")


@pytest.fixture
def written(tmp_path: Path) -> tuple[JobSpec, SyntheticWorld, Path, object]:
    job = make_job()
    world = make_world(job)
    summary = write_world(
        job, SourceContext(str(tmp_path)), world, range(3), sources=BATCH, progress=False, files_per_hour=2
    )
    return job, world, tmp_path, summary


def test_parquet_layout_and_markers(written: tuple) -> None:
    _, _, root, summary = written
    for hour in ("00", "01", "02"):
        directory = root / "parquet/imp/dt=2026-11-01" / f"hour={hour}"
        names = sorted(p.name for p in directory.iterdir())
        assert names == ["_SUCCESS", "part-00000.parquet", "part-00001.parquet"]
        marker = os.stat(directory / "_SUCCESS").st_mtime_ns
        assert all(os.stat(directory / n).st_mtime_ns <= marker for n in names)  # marker written last
        assert (directory / "_SUCCESS").stat().st_size == 0
    stats = summary.sources["pq"]
    assert stats.files == 6 and stats.hours == 3 and stats.bytes > 0
    assert "click_delay_s" not in pq.read_schema(root / "parquet/imp/dt=2026-11-01/hour=00/part-00000.parquet").names


def test_batch_shards_are_disjoint_and_their_union_is_the_world(written: tuple) -> None:
    job, world, root, summary = written
    expected = world_rows(world, range(3))
    parts = {
        "pq": read_parquet(root / "parquet/imp"),
        "dl": read_delta(root / "delta/imp"),
        "ice": read_iceberg(job, root),
    }
    ids = {name: set(t.column("sample_id").to_pylist()) for name, t in parts.items()}
    assert not (ids["pq"] & ids["dl"]) and not (ids["pq"] & ids["ice"]) and not (ids["dl"] & ids["ice"])
    union = pa.concat_tables([t.select(expected.column_names).cast(expected.schema) for t in parts.values()])
    assert union.sort_by("sample_id").equals(expected)
    for index, name in enumerate(BATCH):
        assert np.all(shard_of(parts[name].column("sample_id"), 3) == index)
        assert summary.sources[name].rows == parts[name].num_rows
    assert summary.world_rows == expected.num_rows
    assert "ev" not in summary.sources


def test_writing_one_source_alone_gives_the_same_shard(tmp_path: Path, written: tuple) -> None:
    job, world, root, _ = written
    write_world(job, SourceContext(str(tmp_path / "alone")), world, range(3), sources=["pq"], progress=False)
    assert read_parquet(tmp_path / "alone/parquet/imp").equals(read_parquet(root / "parquet/imp"))


def test_rewriting_an_hour_does_not_duplicate(written: tuple) -> None:
    job, world, root, _ = written
    from deltalake import DeltaTable

    version = DeltaTable(str(root / "delta/imp")).version()
    write_world(job, SourceContext(str(root)), world, range(1, 2), sources=BATCH, progress=False)
    assert DeltaTable(str(root / "delta/imp")).version() == version + 1  # one commit per hour
    expected = world_rows(world, range(3))
    total = 0
    for table in (read_parquet(root / "parquet/imp"), read_delta(root / "delta/imp"), read_iceberg(job, root)):
        ids = table.column("sample_id").to_numpy()
        assert len(np.unique(ids)) == len(ids)
        total += len(ids)
    assert total == expected.num_rows
    assert (root / "parquet/imp/dt=2026-11-01/hour=01/_SUCCESS").exists()


def test_adapters_see_the_written_partitions(written: tuple) -> None:
    from primus_dagster.data.sources import make_adapter
    from primus_dagster.data.sources.base import TimeWindow

    job, _world, root, summary = written
    window = TimeWindow.hours_from(job.dataset.start, 4)
    for name in BATCH:
        with make_adapter(job.dataset.source(name), SourceContext(str(root))) as adapter:
            parts = adapter.partitions(window)
            assert [p.ready for p in parts][:3] == [True, True, True], name
            assert not parts[3].ready, name
            rows = sum(b.num_rows for p in parts[:3] for t in adapter.split(p) for b in adapter.read(t))
        assert rows == summary.sources[name].rows, name


def test_daily_parquet_marker_waits_for_the_whole_day(tmp_path: Path) -> None:
    spec = SPEC.replace(
        "path: parquet/imp,", "path: daily, granularity: day, layout: template, template: '{YYYY}{MM}{DD}',"
    )
    job = parse_job_spec(spec.replace("TOPIC", "t"))
    world = SyntheticWorld(WorldConfig(seed=1, users=50, items=20, topics=3, rows_per_hour=30), job.dataset.start)
    context = SourceContext(str(tmp_path))
    write_world(job, context, world, range(23), sources=["pq"], progress=False)
    day = tmp_path / "daily/20261101"
    assert not (day / "_SUCCESS").exists() and len(list(day.glob("part-*.parquet"))) == 23
    write_world(job, context, world, range(23, 24), sources=["pq"], progress=False)
    assert (day / "_SUCCESS").exists()
    write_world(job, context, world, range(5, 6), sources=["pq"], progress=False)  # rewrite one hour
    assert (day / "_SUCCESS").exists() and len(list(day.glob("part-*.parquet"))) == 24


def test_unknown_source_is_an_error(tmp_path: Path) -> None:
    job = make_job()
    with pytest.raises(KeyError, match="nope"):
        write_world(job, SourceContext(str(tmp_path)), make_world(job), range(1), sources=["nope"], progress=False)


@pytest.mark.integration
def test_kafka_stream_copy(tmp_path: Path, kafka_broker: object) -> None:
    from kafka import KafkaConsumer, TopicPartition

    topic = f"synth-{uuid.uuid4().hex[:8]}"
    job = make_job(topic)
    world = make_world(job)
    bootstrap = kafka_broker.bootstrap_servers  # type: ignore[attr-defined]
    summary = write_world(
        job,
        SourceContext(str(tmp_path), bootstrap),
        world,
        range(2),
        sources=["ev"],
        progress=False,
        kafka_partitions=3,
    )
    expected = world_rows(world, range(2))
    stream_clicks = int(
        pa.concat_tables([world.stream_copy(world.hour(h)) for h in range(2)]).column("click").to_numpy().sum()
    )
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
    assert len(partitions) == 3
    consumer.assign(partitions)
    consumer.seek_to_beginning()
    records, last = [], {}
    for message in consumer:
        value = json.loads(message.value)
        assert message.timestamp == value["event_time"]
        assert message.partition == value["user_id"] % 3 and int(message.key) == value["user_id"]
        assert last.get(message.partition, 0) <= message.timestamp  # event-time order per partition
        last[message.partition] = message.timestamp
        records.append(value)
        if len(records) == expected.num_rows:
            break
    consumer.close()
    assert len(records) == expected.num_rows == summary.sources["ev"].rows
    assert "click_delay_s" not in records[0]
    assert sorted(r["sample_id"] for r in records) == expected.column("sample_id").to_pylist()
    assert sum(r["click"] for r in records) == stream_clicks < int(expected.column("click").to_numpy().sum())
