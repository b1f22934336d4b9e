"""KafkaSource against the embedded tansu broker: offset search, readiness, split, read, bad records."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pytest

from primus_dagster.data.sources.base import ReadTask, SourceContext, SourceReadError, TimeWindow
from primus_dagster.data.sources.kafka import KafkaConfigError, KafkaSource, json_schema
from primus_dagster.devtools.kafka_broker import EmbeddedBroker, create_topic
from primus_dagster.spec.sources import KafkaSourceSpec

pytestmark = pytest.mark.integration

H0 = datetime(2026, 11, 28, 10, tzinfo=timezone.utc)
H0_MS = int(H0.timestamp() * 1000)
HOUR_MS = 3_600_000
DENSE = [f"d{i}" for i in range(13)]
PARTS = 3


def make_spec(topic: str, **extra: Any) -> KafkaSourceSpec:
    return KafkaSourceSpec.model_validate(
        {
            "name": "clicks_stream",
            "type": "kafka",
            "kind": "stream",
            "topic": topic,
            "columns": {
                "ts": "event_time",
                "label": "click",
                "id": "sample_id",
                "dense": DENSE,
                "sparse": ["user_id", "item_id"],
            },
            **extra,
        }
    )


def sample(i: int, ts_ms: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "sample_id": i,
        "event_time": ts_ms,
        "click": None if i % 7 == 0 else i % 2,
        "user_id": 1000 + i % 13,
        "item_id": 5000 + i,
        "extra": {"ignored": [1, 2]},
    }
    row.update({d: float(i) + j / 10 for j, d in enumerate(DENSE)})
    return row


def producer(bootstrap: str) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)


@pytest.fixture(scope="module")
def stream(kafka_broker: EmbeddedBroker) -> Iterator[dict[str, Any]]:
    """~600 samples in hours 0, 1 and 3 (hour 2 empty), 3 partitions, partition 2 empty in hour 1.

    Yields the topic, and per produced record its (partition, offset, id, ts, label).
    """
    topic = f"clicks-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, topic, PARTS)
    times = []
    for hour, n in ((0, 250), (1, 150), (3, 200)):
        times += [H0_MS + hour * HOUR_MS + (k * (HOUR_MS - 1)) // (n - 1) for k in range(n)]  # hits both edges
    prod = producer(kafka_broker.bootstrap_servers)
    futures = []
    for i, ts in enumerate(times):
        part = i % PARTS
        if part == 2 and H0_MS + HOUR_MS <= ts < H0_MS + 2 * HOUR_MS:
            part = i % 2
        futures.append(
            (i, ts, part, prod.send(topic, json.dumps(sample(i, ts)).encode(), partition=part, timestamp_ms=ts))
        )
        if i % 37 == 0:
            prod.flush()  # many record batches
    prod.flush()
    rows = [(f.get(10).partition, f.get(10).offset, i, ts) for i, ts, _, f in futures]
    prod.close()
    yield {"topic": topic, "rows": rows, "bootstrap": kafka_broker.bootstrap_servers}


def expected_ranges(rows: list[tuple[int, int, int, int]], start_ms: int, end_ms: int) -> dict[str, list[int]]:
    out = {}
    for p in range(PARTS):
        mine = sorted((off, ts) for part, off, _, ts in rows if part == p)
        first = next((off for off, ts in mine if ts >= start_ms), mine[-1][0] + 1)
        last = next((off for off, ts in mine if ts >= end_ms), mine[-1][0] + 1)
        out[str(p)] = [first, last]
    return out


def source(stream: dict[str, Any], **extra: Any) -> KafkaSource:
    return KafkaSource(make_spec(stream["topic"], **extra), SourceContext(kafka_bootstrap_servers=stream["bootstrap"]))


def test_partitions_give_exact_offset_ranges(stream: dict[str, Any]) -> None:
    with source(stream) as src:
        parts = src.partitions(TimeWindow.hours_from(H0 - timedelta(hours=1), 6))
        first_fetches = src.probe_fetches
        assert [p.start for p in parts] == [H0 + timedelta(hours=h) for h in range(-1, 5)]
        for h, part in zip(range(-1, 5), parts, strict=True):
            want = expected_ranges(stream["rows"], H0_MS + h * HOUR_MS, H0_MS + (h + 1) * HOUR_MS)
            assert part.detail["offsets"] == want, f"hour {h}"
            assert part.rows == sum(e - s for s, e in want.values())
            assert part.files == PARTS and part.location == stream["topic"]
            assert src.offsets_for(part) == {int(p): tuple(r) for p, r in want.items()}
        assert [p.rows for p in parts] == [0, 250, 150, 0, 200, 0]
        assert parts[2].detail["offsets"]["2"][0] == parts[2].detail["offsets"]["2"][1]  # empty in hour 1
        # hours up to 2 are complete (every partition has hour-3 data); hour 3 is the open one
        assert [p.ready for p in parts] == [True, True, True, True, False, False]
        assert parts[4].reason and "no record at or after" in parts[4].reason
        # O(log N) probes per boundary: 3 partitions x 7 boundaries, ~200 records each
        assert first_fetches <= PARTS * (2 + 7 * (math.ceil(math.log2(250)) + 2))
        # boundaries with data after them are cached; a second listing only re-reads the tails
        again = src.partitions(TimeWindow.hours_from(H0 - timedelta(hours=1), 6))
        assert [p.detail for p in again] == [p.detail for p in parts]
        assert src.probe_fetches - first_fetches < first_fetches / 2


def test_partition_and_ready_partitions(stream: dict[str, Any]) -> None:
    with source(stream) as src:
        part = src.partition(H0 + timedelta(hours=2))  # no data at all in hour 2
        assert part.ready and part.rows == 0
        assert src.split(part) == []
        assert [p.start for p in src.ready_partitions(TimeWindow.hours_from(H0, 5))] == [
            H0 + timedelta(hours=h) for h in range(3)
        ]


def test_daily_granularity(stream: dict[str, Any]) -> None:
    with source(stream, granularity="day") as src:
        (day,) = src.partitions(TimeWindow.hours_from(H0, 1))
        assert day.rows == 600 and not day.ready
        assert day.start == H0.replace(hour=0)


def test_split_chunks(stream: dict[str, Any]) -> None:
    with source(stream, max_records_per_task=40) as src:
        part = src.partition(H0)
        tasks = src.split(part)
        ranges = src.offsets_for(part)
        for p, (start, stop) in ranges.items():
            mine = [t for t in tasks if t.uri == f"{stream['topic']}:{p}"]
            assert [(t.start, t.stop) for t in mine] == [(s, min(s + 40, stop)) for s in range(start, stop, 40)]
        assert sum(t.rows or 0 for t in tasks) == 250
        assert ReadTask.from_json(tasks[0].to_json()) == tasks[0]


def test_read_returns_the_produced_rows(stream: dict[str, Any]) -> None:
    with source(stream, max_records_per_task=60, batch_rows=32) as src:
        for hour, n in ((0, 250), (1, 150)):
            part = src.partition(H0 + timedelta(hours=hour))
            batches = [b for t in src.split(part) for b in src.read(t)]
            assert all(b.num_rows <= 32 for b in batches)
            table = pa.Table.from_batches(batches)
            assert table.schema == src.normalize.schema
            lo, hi = H0_MS + hour * HOUR_MS, H0_MS + (hour + 1) * HOUR_MS
            want = {i: ts for _, _, i, ts in stream["rows"] if lo <= ts < hi}
            got = table.to_pydict()
            assert sorted(got["sample_id"]) == sorted(want) and len(want) == n
            columns = (got["sample_id"], got["label"], got["ts"], got["dense"], got["user_id"])
            for sid, label, ts, dense, user in zip(*columns, strict=True):
                assert label == (None if sid % 7 == 0 else float(sid % 2))
                assert int(ts.timestamp() * 1000) == want[sid]
                assert dense[0] == float(sid) and dense[12] == pytest.approx(sid + 1.2)
                assert user == 1000 + sid % 13
            assert set(got["kind"]) == {"stream"} and set(got["source"]) == {"clicks_stream"}
            assert src.last_read_stats["bad_records"] == 0
        assert src.stats["rows"] == 400 and src.stats["bad_records"] == 0


def test_read_past_the_end_fails_clearly(stream: dict[str, Any]) -> None:
    src = KafkaSource(
        make_spec(stream["topic"]),
        SourceContext(kafka_bootstrap_servers=stream["bootstrap"]),
        poll_timeout_s=0.2,
        stall_timeout_s=0.5,
    )
    with src:
        task = ReadTask("clicks_stream", H0, f"{stream['topic']}:0", 190, 10_000)
        with pytest.raises(SourceReadError, match="no records after offset"):
            list(src.read(task))


def test_corrupt_records_are_skipped_and_counted(kafka_broker: EmbeddedBroker) -> None:
    topic = f"corrupt-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, topic, 1)
    bad_values = [
        b"not json at all",
        json.dumps({**sample(1000, H0_MS), "d3": "oops"}).encode(),  # string in a float field
        json.dumps({**sample(1001, H0_MS), "user_id": "u-17"}).encode(),  # string in an id field
        b"[1, 2, 3]",
        b"null",
        b"",
        b'{"sample_id": 1002, "event_time": 1',  # truncated
        json.dumps(sample(1003, H0_MS)).encode() + b"\n" + json.dumps(sample(1004, H0_MS)).encode(),
    ]
    prod = producer(kafka_broker.bootstrap_servers)
    good_ids, bad_offsets = [], []
    k = 0
    for i in range(120):
        ts = H0_MS + i * 1000
        if i % 15 == 7 and k < len(bad_values):
            value, k = bad_values[k], k + 1
            bad_offsets.append(prod.send(topic, value, timestamp_ms=ts).get(10).offset)
            continue
        row = sample(i, ts)
        if i == 30:
            del row["event_time"]  # ts falls back to the record timestamp
        value = json.dumps(row, indent=2 if i == 31 else None).encode()  # pretty-printed JSON is fine
        prod.send(topic, value, timestamp_ms=ts).get(10)
        good_ids.append(i)
    prod.send(topic, json.dumps(sample(999, H0_MS + HOUR_MS)).encode(), timestamp_ms=H0_MS + HOUR_MS).get(10)
    prod.close()
    assert k == len(bad_values)

    context = SourceContext(kafka_bootstrap_servers=kafka_broker.bootstrap_servers)
    with KafkaSource(make_spec(topic, batch_rows=50), context) as src:
        part = src.partition(H0)
        assert part.ready and part.rows == 120
        (task,) = src.split(part)
        table = pa.Table.from_batches(list(src.read(task)))
        got = table.to_pydict()
        assert got["sample_id"] == good_ids
        by_id = dict(zip(got["sample_id"], got["ts"], strict=True))
        assert int(by_id[30].timestamp()) == H0_MS // 1000 + 30
        stats = src.last_read_stats
        assert stats["bad_records"] == len(bad_values) and stats["records"] == 120
        assert stats["rows"] == len(good_ids)
        assert sorted(e["offset"] for e in stats["bad_examples"]) == bad_offsets
        assert all(e["error"] for e in stats["bad_examples"])


def test_missing_topic_and_missing_bootstrap(kafka_broker: EmbeddedBroker) -> None:
    context = SourceContext(kafka_bootstrap_servers=kafka_broker.bootstrap_servers)
    with KafkaSource(make_spec("no-such-topic"), context) as src:
        (part,) = src.partitions(TimeWindow.hours_from(H0, 1))
        assert not part.ready and "does not exist" in (part.reason or "")
    with pytest.raises(KafkaConfigError, match="bootstrap"):
        KafkaSource(make_spec("t"), SourceContext()).partitions(TimeWindow.hours_from(H0, 1))
    spec = make_spec("t", bootstrap_servers=kafka_broker.bootstrap_servers)
    assert KafkaSource(spec, SourceContext()).bootstrap_servers == kafka_broker.bootstrap_servers


def test_interleaved_reads_use_separate_consumers(stream: dict[str, Any]) -> None:
    with source(stream, batch_rows=16) as src:
        t0, t1 = src.split(src.partition(H0))[:2]
        a, b = src.read(t0), src.read(t1)
        ids: list[int] = []
        for x, y in zip(a, b, strict=False):  # both generators are open at once
            ids += x.column("sample_id").to_pylist() + y.column("sample_id").to_pylist()
        ids += [i for rest in (a, b) for batch in rest for i in batch.column("sample_id").to_pylist()]
        assert len(ids) == len(set(ids)) == (t0.rows or 0) + (t1.rows or 0)


def test_unreachable_broker_is_a_clear_error() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        bootstrap = f"127.0.0.1:{sock.getsockname()[1]}"
        src = KafkaSource(make_spec("t"), SourceContext(kafka_bootstrap_servers=bootstrap), connect_timeout_s=1)
        with pytest.raises(KafkaConfigError, match="no Kafka broker answers"):
            src.partitions(TimeWindow.hours_from(H0, 1))


def test_json_schema_types() -> None:
    spec = KafkaSourceSpec.model_validate(
        {
            "name": "s",
            "type": "kafka",
            "topic": "t",
            "columns": {"ts": "t", "label": "y", "dense": "feats", "sparse": {"user": "uid"}},
        }
    )
    assert json_schema(spec) == pa.schema(
        [("t", pa.int64()), ("y", pa.float64()), ("feats", pa.list_(pa.float32())), ("uid", pa.int64())]
    )


def test_registry_import_name() -> None:
    from primus_dagster.data.sources import kafka

    assert kafka.KafkaSource.__name__ == "KafkaSource"
