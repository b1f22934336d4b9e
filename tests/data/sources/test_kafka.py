"""KafkaSource against the embedded tansu broker: offset search, readiness, split, read, bad records.

Reads run through both fetchers (the native wire client and kafka-python); the record-batch
parser and the wire client's fault handling are also tested with crafted batches and injected
broker errors.
"""

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
from primus_dagster.data.sources.kafka import KafkaConfigError, KafkaSource, json_schema, protocol, records, wire
from primus_dagster.data.sources.kafka.adapter import Fetcher
from primus_dagster.data.sources.kafka.decoding import JsonRecordDecoder
from primus_dagster.data.sources.kafka.records import CorruptBatchError, LegacyFormatError, RecordColumns
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


FETCHERS = ["native", "kafka-python"]


def source(stream: dict[str, Any], fetcher: Fetcher = "native", **extra: Any) -> KafkaSource:
    context = SourceContext(kafka_bootstrap_servers=stream["bootstrap"])
    return KafkaSource(make_spec(stream["topic"], **extra), context, fetcher=fetcher)


def read_ids(src: KafkaSource, tasks: list[ReadTask]) -> list[int]:
    return [i for t in tasks for b in src.read(t) for i in b.column("sample_id").to_pylist()]


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_partitions_give_exact_offset_ranges(stream: dict[str, Any], fetcher: Fetcher) -> None:
    with source(stream, fetcher) as src:
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


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_read_returns_the_produced_rows(stream: dict[str, Any], fetcher: Fetcher) -> None:
    with source(stream, fetcher, max_records_per_task=60, batch_rows=32) as src:
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
                assert label == (0.0 if sid % 7 == 0 else float(sid % 2))  # stream: null label -> 0, counted
                assert int(ts.timestamp() * 1000) == want[sid]
                assert dense[0] == float(sid) and dense[12] == pytest.approx(sid + 1.2)
                assert user == 1000 + sid % 13
            assert set(got["kind"]) == {"stream"} and set(got["source"]) == {"clicks_stream"}
            assert src.last_read_stats["bad_records"] == 0
            assert src.normalize.take() == {"null_label": sum(sid % 7 == 0 for sid in want)}
        assert src.stats["rows"] == 400 and src.stats["bad_records"] == 0


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_read_past_the_end_fails_clearly(stream: dict[str, Any], fetcher: Fetcher) -> None:
    src = KafkaSource(
        make_spec(stream["topic"]),
        SourceContext(kafka_bootstrap_servers=stream["bootstrap"]),
        poll_timeout_s=0.2,
        stall_timeout_s=0.5,
        fetcher=fetcher,
    )
    with src:
        task = ReadTask("clicks_stream", H0, f"{stream['topic']}:0", 190, 10_000)
        with pytest.raises(SourceReadError, match="no records after offset"):
            list(src.read(task))


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_corrupt_records_are_skipped_and_counted(kafka_broker: EmbeddedBroker, fetcher: Fetcher) -> None:
    topic = f"corrupt-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, topic, 1)
    bad_values = [
        b"not json at all",
        json.dumps({**sample(1000, H0_MS), "d3": "oops"}).encode(),  # string in a float field
        json.dumps({**sample(1001, H0_MS), "user_id": [17]}).encode(),  # a list in an id field (a string is hashed)
        b"[1, 2, 3]",
        b"null",
        b"",
        b'{"sample_id": 1002, "event_time": 1',  # truncated
        None,  # a tombstone (null value)
        json.dumps(sample(1003, H0_MS)).encode() + b"\n" + json.dumps(sample(1004, H0_MS)).encode(),
    ]
    prod = producer(kafka_broker.bootstrap_servers)
    good_ids, bad_offsets = [], []
    k = 0
    for i in range(120):
        ts = H0_MS + i * 1000
        if i % 13 == 7 and k < len(bad_values):
            value, k = bad_values[k], k + 1
            bad_offsets.append(prod.send(topic, value, key=b"k", timestamp_ms=ts).get(10).offset)
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
    with KafkaSource(make_spec(topic, batch_rows=50), context, fetcher=fetcher) as src:
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


def test_missing_topic_and_missing_bootstrap(kafka_broker: EmbeddedBroker, monkeypatch, tmp_path) -> None:
    context = SourceContext(kafka_bootstrap_servers=kafka_broker.bootstrap_servers)
    with KafkaSource(make_spec("no-such-topic"), context) as src:
        (part,) = src.partitions(TimeWindow.hours_from(H0, 1))
        assert not part.ready and "does not exist" in (part.reason or "")
    monkeypatch.delenv("PRIMUS_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path))  # no embedded broker recorded there
    with pytest.raises(KafkaConfigError, match=r"no Kafka bootstrap servers.*PRIMUS_KAFKA_BOOTSTRAP_SERVERS"):
        KafkaSource(make_spec("t"), SourceContext()).partitions(TimeWindow.hours_from(H0, 1))
    # Every entry point resolves the same way: the environment when neither the source nor the caller says.
    monkeypatch.setenv("PRIMUS_KAFKA_BOOTSTRAP_SERVERS", kafka_broker.bootstrap_servers)
    assert KafkaSource(make_spec("t"), SourceContext()).bootstrap_servers == kafka_broker.bootstrap_servers
    spec = make_spec("t", bootstrap_servers=kafka_broker.bootstrap_servers)
    assert KafkaSource(spec, SourceContext()).bootstrap_servers == kafka_broker.bootstrap_servers


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_interleaved_reads_use_separate_consumers(stream: dict[str, Any], fetcher: Fetcher) -> None:
    with source(stream, fetcher, batch_rows=16) as src:
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


# -- the native read path: both fetchers agree, protocol versions, faults ----------------------------------


def batches_of(src: KafkaSource, tasks: list[ReadTask]) -> list[dict[str, list[Any]]]:
    return [b.to_pydict() for t in tasks for b in src.read(t)]


def test_native_and_kafka_python_fetchers_yield_identical_batches(stream: dict[str, Any]) -> None:
    with source(stream, "native", batch_rows=48) as native, source(stream, "kafka-python", batch_rows=48) as kp:
        tasks = native.split(native.partition(H0))
        assert tasks == kp.split(kp.partition(H0))
        assert batches_of(native, tasks) == batches_of(kp, tasks)  # same rows, same batch boundaries


@pytest.mark.parametrize(("fetch_version", "metadata_version"), [(4, 1), (7, 4), (10, 7)])
def test_native_reads_with_each_protocol_version(
    stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch, fetch_version: int, metadata_version: int
) -> None:
    monkeypatch.setattr(protocol, "FETCH_VERSIONS", (fetch_version, fetch_version))
    monkeypatch.setattr(protocol, "METADATA_VERSIONS", (metadata_version, metadata_version))
    with source(stream) as src:
        ids = read_ids(src, src.split(src.partition(H0 + timedelta(hours=1))))
        assert sorted(ids) == sorted(i for _, _, i, ts in stream["rows"] if H0_MS + HOUR_MS <= ts < H0_MS + 2 * HOUR_MS)
        (client,) = src._wires
        assert (client.fetch_version, client.metadata_version) == (fetch_version, metadata_version)


def test_a_dropped_connection_is_reconnected_without_losing_or_repeating_records(
    stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = wire.PartitionReader.fetch
    fetches = 0

    def flaky(self: wire.PartitionReader, offset: int) -> wire.Fetched:
        nonlocal fetches
        fetches += 1
        if fetches in (2, 4):  # the socket dies under the client (a request may be in flight)
            for conn in self.client._conns.values():
                conn.sock.close()
        return original(self, offset)

    monkeypatch.setattr(wire.PartitionReader, "fetch", flaky)
    with source(stream, poll_max_bytes=2048) as src:  # small fetches: many of them per task
        tasks = src.split(src.partition(H0))
        ids = read_ids(src, tasks)
    assert fetches > 4
    assert sorted(ids) == sorted(i for _, _, i, ts in stream["rows"] if H0_MS <= ts < H0_MS + HOUR_MS)


def test_a_moved_leader_is_looked_up_again(stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    original, refresh = wire.WireClient.receive_fetch, wire.WireClient.refresh
    calls = {"errors": 0, "refresh": 0}

    def not_leader_once(self: wire.WireClient, pending: wire.Pending, topic: str, partition: int) -> Any:
        answer = original(self, pending, topic, partition)
        if calls["errors"] == 0:
            calls["errors"] += 1
            self.leaders.pop((topic, partition), None)
            raise wire.WireError("injected: NOT_LEADER_OR_FOLLOWER (6)", code=6, retriable=True)
        return answer

    def counting_refresh(self: wire.WireClient, topic: str) -> None:
        calls["refresh"] += 1
        refresh(self, topic)

    monkeypatch.setattr(wire.WireClient, "receive_fetch", not_leader_once)
    monkeypatch.setattr(wire.WireClient, "refresh", counting_refresh)
    with source(stream) as src:
        (task,) = [t for t in src.split(src.partition(H0)) if t.uri.endswith(":0")]
        ids = read_ids(src, [task])
    assert calls == {"errors": 1, "refresh": 2}  # the first lookup, then the one after the error
    assert len(ids) == len(set(ids)) == task.rows


def test_broker_errors_fail_the_task_clearly(stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(code: int, retriable: bool, log_start: int = -1) -> Any:
        def receive_fetch(self: wire.WireClient, pending: wire.Pending, topic: str, partition: int) -> Any:
            self.receive(pending)
            raise wire.WireError(f"{topic}:{partition}: injected {code}", code, retriable, log_start)

        return receive_fetch

    task = ReadTask("clicks_stream", H0, f"{stream['topic']}:0", 10, 60)
    src = KafkaSource(
        make_spec(stream["topic"]), SourceContext(kafka_bootstrap_servers=stream["bootstrap"]), stall_timeout_s=0.3
    )
    with src:
        monkeypatch.setattr(wire.WireClient, "receive_fetch", answer(protocol.OFFSET_OUT_OF_RANGE, False, 40))
        with pytest.raises(SourceReadError, match=r"offsets 10\.\.40 were deleted \(retention\)"):
            list(src.read(task))
        monkeypatch.setattr(wire.WireClient, "receive_fetch", answer(29, False))
        with pytest.raises(SourceReadError, match="injected 29"):
            list(src.read(task))
        monkeypatch.setattr(wire.WireClient, "receive_fetch", answer(5, True))  # retriable, for ever
        with pytest.raises(SourceReadError, match="injected 5"):
            list(src.read(task))
        monkeypatch.undo()
        # past the high watermark: Kafka answers OFFSET_OUT_OF_RANGE, tansu an empty fetch (a stall)
        beyond = ReadTask("clicks_stream", H0, f"{stream['topic']}:0", 10_000, 10_010)
        with pytest.raises(SourceReadError, match=r"OFFSET_OUT_OF_RANGE|no records after offset 10000"):
            list(src.read(beyond))
        assert read_ids(src, [task]) == [i for p, off, i, _ in sorted(stream["rows"]) if p == 0 and 10 <= off < 60]


def test_an_unreadable_response_fails_the_task(stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def garbled(version: int, payload: Any) -> Any:
        raise protocol.ProtocolError("injected: response ends early")

    with source(stream) as src:
        task = src.split(src.partition(H0))[0]
        monkeypatch.setattr(protocol, "decode_fetch", garbled)
        with pytest.raises(SourceReadError, match="unreadable Fetch v10 response: injected"):
            list(src.read(task))
        monkeypatch.undo()
        assert len(read_ids(src, [task])) == task.rows  # the connection was dropped, not reused mid-stream


def test_a_corrupt_batch_fails_the_task(stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    original = wire.WireClient.receive_fetch

    def flip_a_byte(self: wire.WireClient, pending: wire.Pending, topic: str, partition: int) -> Any:
        part = original(self, pending, topic, partition)
        data = bytearray(part.records)
        data[80] ^= 0xFF  # inside the first record of the first batch
        part.records = memoryview(bytes(data))
        return part

    monkeypatch.setattr(wire.WireClient, "receive_fetch", flip_a_byte)
    with source(stream) as src, pytest.raises(SourceReadError, match="fails its CRC-32C check"):
        list(src.read(src.split(src.partition(H0))[0]))


def test_unsupported_versions_fall_back_to_kafka_python(
    stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "FETCH_VERSIONS", (90, 99))
    with source(stream) as src:
        tasks = src.split(src.partition(H0))
        ids = read_ids(src, tasks)
        assert src.fetcher == "kafka-python"
    assert sorted(ids) == sorted(i for _, _, i, ts in stream["rows"] if H0_MS <= ts < H0_MS + HOUR_MS)


def test_legacy_message_format_falls_back_for_the_task(stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    original, seen = wire.read_batches, []

    def legacy_after_first(data: Any, start: int, stop: int, out: RecordColumns, check_crcs: bool = True) -> int:
        seen.append(start)
        if len(seen) > 1:
            raise LegacyFormatError("injected: message format v1")
        return original(data, start, stop, out, check_crcs)

    monkeypatch.setattr(wire, "read_batches", legacy_after_first)
    with source(stream, poll_max_bytes=2048, batch_rows=16) as src:
        task = src.split(src.partition(H0))[0]
        ids = read_ids(src, [task])
        assert src.fetcher == "native"  # only this task went through kafka-python
    assert len(ids) == len(set(ids)) == task.rows


def test_an_abandoned_read_leaves_no_stale_answer(stream: dict[str, Any]) -> None:
    with source(stream, batch_rows=8, poll_max_bytes=1024) as src:
        t0, t1 = src.split(src.partition(H0))[:2]
        reading = src.read(t0)
        next(reading)  # a fetch ahead is in flight now
        reading.close()
        assert (
            read_ids(src, [t1])
            == [i for p, off, i, _ in sorted(stream["rows"]) if f":{p}" == t1.uri[-2:]][t1.start : t1.stop]
        )


def test_an_unreachable_broker_fails_a_read() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{sock.getsockname()[1]}"
        src = KafkaSource(make_spec("t"), SourceContext(kafka_bootstrap_servers=bootstrap), stall_timeout_s=0.3)
        with pytest.raises(SourceReadError, match="no bootstrap server accepts connections"):
            list(src.read(ReadTask("clicks_stream", H0, "t:0", 0, 10)))


# -- record batches: parsed against kafka-python's own encoder ---------------------------------------------


def build_batch(
    values: list[bytes | None], base: int = 0, ts0: int = H0_MS, compression: int = 0, key: bytes | None = b"k"
) -> bytearray:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=ts0 + 1000 * i, key=key, value=value, headers=[("h", b"v")] if i % 2 else [])
    out = builder.build()
    out[0:8] = base.to_bytes(8, "big")  # the base offset is outside the CRC
    return out


def set_attributes(batch: bytearray, bits: int) -> bytearray:
    import crc32c

    attrs = int.from_bytes(batch[21:23], "big") | bits
    batch[21:23] = attrs.to_bytes(2, "big")
    batch[17:21] = crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    return batch


VALUES: list[bytes | None] = [json.dumps({"i": i, "pad": "x" * (i * 37 % 300)}).encode() for i in range(200)]
VALUES[7] = None


@pytest.mark.parametrize("compression", [0, 1])  # none, gzip
def test_read_batches_returns_values_offsets_and_timestamps(compression: int) -> None:
    data = bytes(build_batch(VALUES[:120], base=1000, compression=compression)) + bytes(
        build_batch(VALUES[120:], base=1120, ts0=H0_MS + 120_000, compression=compression)
    )
    cols = RecordColumns()
    assert records.read_batches(data, 1000, 2000, cols) == 1200
    assert cols.values == VALUES
    assert cols.offsets == list(range(1000, 1200))
    assert cols.timestamps == [H0_MS + 1000 * i for i in range(200)]
    part = RecordColumns()  # a range starting and ending inside batches
    assert records.read_batches(data, 1050, 1130, part) == 1130
    assert part.values == VALUES[50:130] and part.offsets == list(range(1050, 1130))


def test_read_batches_leaves_a_cut_batch_and_skips_control_batches() -> None:
    first, second = bytes(build_batch(VALUES[:10], base=0)), bytes(build_batch(VALUES[10:20], base=10))
    cols = RecordColumns()
    assert records.read_batches(first + second[:-5], 0, 100, cols) == 10  # the cut batch comes in the next fetch
    assert cols.offsets == list(range(10))
    control = bytes(set_attributes(build_batch([b"\x00\x00\x00\x00"], base=10), records.CONTROL))
    cols = RecordColumns()
    assert records.read_batches(control + bytes(build_batch(VALUES[:3], base=11)), 10, 100, cols) == 14
    assert cols.offsets == [11, 12, 13]


def test_read_batches_log_append_time() -> None:
    batch = set_attributes(build_batch(VALUES[:5], ts0=H0_MS), records.LOG_APPEND_TIME)
    max_ts = int.from_bytes(batch[35:43], "big")
    cols = RecordColumns()
    records.read_batches(bytes(batch), 0, 5, cols)
    assert cols.timestamps == [max_ts] * 5 and max_ts == H0_MS + 4000


def test_read_batches_rejects_corrupt_and_legacy_data() -> None:
    from kafka.record.memory_records import MemoryRecordsBuilder

    batch = build_batch(VALUES[:20])
    batch[200] ^= 0x01
    with pytest.raises(CorruptBatchError, match="CRC-32C"):
        records.read_batches(bytes(batch), 0, 20, RecordColumns())
    lying = build_batch(VALUES[:3])
    lying[61] = 0x7E  # the first record claims 63 bytes
    with pytest.raises(CorruptBatchError):
        records.read_batches(bytes(lying), 0, 3, RecordColumns(), check_crcs=False)
    too_many = build_batch(VALUES[:3])
    too_many[57:61] = (9).to_bytes(4, "big")  # the record count says 9
    with pytest.raises(CorruptBatchError, match="do not fit"):
        records.read_batches(bytes(too_many), 0, 9, RecordColumns(), check_crcs=False)
    legacy = MemoryRecordsBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    legacy.append(timestamp=5, key=None, value=b"{}")
    legacy.close()
    with pytest.raises(LegacyFormatError):
        records.read_batches(bytes(legacy.buffer()), 0, 1, RecordColumns())


def test_protocol_decodes_and_rejects_truncated_responses() -> None:
    assert protocol.pick_version((0, 17), protocol.FETCH_VERSIONS) == 10
    assert protocol.pick_version((11, 17), protocol.FETCH_VERSIONS) is None
    assert protocol.pick_version(None, protocol.FETCH_VERSIONS) is None
    body = b"\x00\x00\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\x00\x00\x00\x01"
    body += (3).to_bytes(4, "big") + (0).to_bytes(2, "big") + (42).to_bytes(8, "big") + (42).to_bytes(8, "big")
    body += (-1).to_bytes(4, "big", signed=True) + (4).to_bytes(4, "big") + b"abcd"
    fetched = protocol.decode_fetch(4, body).partitions[("t", 3)]
    assert (fetched.error, fetched.high_watermark, bytes(fetched.records)) == (0, 42, b"abcd")
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_fetch(4, body[:-2])


def test_decoder_fast_and_careful_paths_agree() -> None:
    decoder = JsonRecordDecoder(make_spec("t"))
    values: list[bytes | None] = [json.dumps(sample(i, H0_MS + i)).encode() for i in range(50)]
    timestamps = [H0_MS + i for i in range(50)]
    fast, bad = decoder.decode(values, timestamps)
    assert not bad and fast is not None and fast.num_rows == 50
    careful, bad = decoder.decode([b" " + values[0], *values[1:]], timestamps)  # a leading space: per-record path
    assert not bad and careful is not None and careful.equals(fast)
    mixed = [*values[:10], None, b"", b"[1]", b'{"sample_id": 1, "event_time": 2}\n{}', *values[10:]]
    table, bad = decoder.decode(mixed, [H0_MS] * len(mixed))
    assert [i for i, _ in bad] == [10, 11, 12, 13]
    assert table is not None and table.column("sample_id").to_pylist() == list(range(50))


def test_a_record_larger_than_a_json_block_is_decoded_not_counted_undecodable() -> None:
    """A valid 40 MB record (a long list or string field) between ordinary ones: pyarrow reads JSON in
    16 MB blocks, and a record straddling two used to count as ``undecodable_record``."""
    decoder = JsonRecordDecoder(make_spec("t"))
    big = sample(1, H0_MS + 1)
    big["padding"] = "x" * (40 << 20)  # a field the mapping does not use
    values = [json.dumps(sample(i, H0_MS + i) if i != 1 else big).encode() for i in range(3)]
    for chunk in (values, [b" " + values[0], *values[1:]]):  # the bulk path and the per-record path
        table, bad = decoder.decode(chunk, [H0_MS + i for i in range(3)])
        assert not bad and table is not None
        assert table.column("sample_id").to_pylist() == [0, 1, 2]


def test_compressed_topic_reads_the_same_through_both_fetchers(kafka_broker: EmbeddedBroker) -> None:
    from kafka import KafkaProducer

    topic = f"gzip-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, topic, 1)
    prod = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, compression_type="gzip", linger_ms=5)
    for i in range(150):
        prod.send(topic, json.dumps(sample(i, H0_MS + i)).encode(), timestamp_ms=H0_MS + i)
        if i % 40 == 0:
            prod.flush()
    prod.close()
    context = SourceContext(kafka_bootstrap_servers=kafka_broker.bootstrap_servers)
    task = ReadTask("clicks_stream", H0, f"{topic}:0", 5, 140)  # starts and stops inside compressed batches
    spec = make_spec(topic, batch_rows=32)
    with KafkaSource(spec, context) as native, KafkaSource(spec, context, fetcher="kafka-python") as kp:
        got = batches_of(native, [task])
        assert got == batches_of(kp, [task])
    assert [i for b in got for i in b["sample_id"]] == list(range(5, 140))


def test_the_spec_chooses_the_fetcher() -> None:
    context = SourceContext(kafka_bootstrap_servers="127.0.0.1:9")
    assert KafkaSource(make_spec("t"), context).fetcher == "native"
    assert KafkaSource(make_spec("t", fetcher="kafka-python"), context).fetcher == "kafka-python"
    assert KafkaSource(make_spec("t", fetcher="kafka-python"), context, fetcher="native").fetcher == "native"
    with pytest.raises(ValueError, match="fetcher"):
        make_spec("t", fetcher="librdkafka")
