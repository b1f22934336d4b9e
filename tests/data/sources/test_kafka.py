"""KafkaSource against the embedded tansu broker: offset search, readiness, split, read, bad records.

The key reads and faults run through both clients (confluent-kafka, the default, and kafka-python);
the broker's ``offsets_for_times`` and its check are also tested against an in-memory partition,
since tansu ignores timestamps there.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pytest

from primus_dagster.data.sources.base import ReadTask, SourceContext, SourceReadError, TimeWindow
from primus_dagster.data.sources.kafka import FETCHERS, KafkaConfigError, KafkaSource, OffsetSearch, json_schema
from primus_dagster.data.sources.kafka.adapter import Fetcher
from primus_dagster.data.sources.kafka.clients import (
    ConfluentClient,
    ConfluentRangeReader,
    KafkaClientError,
    KafkaPythonRangeReader,
    OffsetOutOfRangeError,
)
from primus_dagster.data.sources.kafka.decoding import JsonRecordDecoder
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


def source(stream: dict[str, Any], fetcher: Fetcher = "confluent-kafka", **extra: Any) -> KafkaSource:
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


# -- both clients agree; faults on each ---------------------------------------------------------------------


def batches_of(src: KafkaSource, tasks: list[ReadTask]) -> list[dict[str, list[Any]]]:
    return [b.to_pydict() for t in tasks for b in src.read(t)]


def test_confluent_and_kafka_python_fetchers_yield_identical_batches(stream: dict[str, Any]) -> None:
    with (
        source(stream, "confluent-kafka", batch_rows=48) as rd,
        source(stream, "kafka-python", batch_rows=48) as kp,
    ):
        tasks = rd.split(rd.partition(H0))
        assert tasks == kp.split(kp.partition(H0))
        assert batches_of(rd, tasks) == batches_of(kp, tasks)  # same rows, same batch boundaries


def test_the_tansu_broker_ignores_timestamps_and_the_fallback_is_told_once(
    stream: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """tansu answers ``offsets_for_times`` with its first offset whatever the timestamp: the check of the
    first answer that disagrees with the records switches to the binary search, with one warning."""
    caplog.set_level(logging.WARNING, logger="primus_dagster.data.sources.kafka.offsets")
    with source(stream) as src:
        parts = src.partitions(TimeWindow.hours_from(H0, 3))
        assert src.broker_timestamps is False
        src.partitions(TimeWindow.hours_from(H0 + timedelta(hours=1), 2))
        assert parts[0].detail["offsets"] == expected_ranges(stream["rows"], H0_MS, H0_MS + HOUR_MS)
    told = [r.getMessage() for r in caplog.records if "offsets_for_times does not match" in r.getMessage()]
    assert len(told) == 1 and repr(stream["topic"]) in told[0] and "binary search" in told[0]


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_records_outside_the_planned_hour_are_kept_and_counted(stream: dict[str, Any], fetcher: Fetcher) -> None:
    """A record belongs to the hour its offset range was planned for; one whose timestamp lies outside is
    read with it and counted as ``ts_outside_partition`` (the normaliser's rule, docs/data_plane.md)."""
    with source(stream, fetcher) as src:
        hour0 = src.offsets_for(src.partition(H0))[0]
        hour1 = src.offsets_for(src.partition(H0 + timedelta(hours=1)))[0]
        task = ReadTask("clicks_stream", H0, f"{stream['topic']}:0", hour0[0], hour1[1])  # planned for hour 0
        ids = read_ids(src, [task])
        assert len(ids) == hour1[1] - hour0[0]
        assert src.normalize.take().get("ts_outside_partition") == hour1[1] - hour1[0]


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_broker_errors_fail_the_task_clearly(
    stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch, fetcher: Fetcher
) -> None:
    reader = ConfluentRangeReader if fetcher == "confluent-kafka" else KafkaPythonRangeReader

    def failing(error: Exception) -> Any:
        def fetch(self: Any, offset: int, want: int, timeout_s: float) -> Any:
            raise error

        return fetch

    task = ReadTask("clicks_stream", H0, f"{stream['topic']}:0", 10, 60)
    src = KafkaSource(
        make_spec(stream["topic"]),
        SourceContext(kafka_bootstrap_servers=stream["bootstrap"]),
        stall_timeout_s=0.3,
        poll_timeout_s=0.1,
        fetcher=fetcher,
    )
    with src:
        monkeypatch.setattr(reader, "fetch", failing(OffsetOutOfRangeError("t:0: injected out of range")))
        with pytest.raises(SourceReadError, match=r"offset out of range after 0 records .*injected out of range"):
            list(src.read(task))
        monkeypatch.setattr(reader, "fetch", failing(KafkaClientError("t:0: injected broker error")))
        with pytest.raises(SourceReadError, match="Kafka error after 0 records: t:0: injected broker error"):
            list(src.read(task))
        monkeypatch.undo()
        # past the high watermark: Kafka answers OFFSET_OUT_OF_RANGE, tansu an empty fetch (a stall)
        beyond = ReadTask("clicks_stream", H0, f"{stream['topic']}:0", 10_000, 10_010)
        started = time.monotonic()
        with pytest.raises(SourceReadError, match=r"offset out of range|no records after offset 10000"):
            list(src.read(beyond))
        assert time.monotonic() - started < 5  # bounded
        assert read_ids(src, [task]) == [i for p, off, i, _ in sorted(stream["rows"]) if p == 0 and 10 <= off < 60]


def test_offsets_deleted_by_retention_fail_before_reading(
    stream: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kafka

    task = ReadTask("clicks_stream", H0, f"{stream['topic']}:0", 10, 60)
    monkeypatch.setattr(ConfluentClient, "watermarks", lambda self, topic, partition, cached=False: (40, 200))
    monkeypatch.setattr(kafka.KafkaConsumer, "beginning_offsets", lambda self, tps: dict.fromkeys(tps, 40))
    for fetcher in FETCHERS:
        with source(stream, fetcher) as src, pytest.raises(SourceReadError, match=r"offsets 10\.\.40 were deleted"):
            list(src.read(task))


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_an_abandoned_read_leaves_no_stale_answer(stream: dict[str, Any], fetcher: Fetcher) -> None:
    with source(stream, fetcher, batch_rows=8, poll_max_bytes=1024) as src:
        t0, t1 = src.split(src.partition(H0))[:2]
        reading = src.read(t0)
        next(reading)  # a fetch ahead is in flight now
        reading.close()
        assert (
            read_ids(src, [t1])
            == [i for p, off, i, _ in sorted(stream["rows"]) if f":{p}" == t1.uri[-2:]][t1.start : t1.stop]
        )


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_an_unreachable_broker_fails_a_read(fetcher: Fetcher) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{sock.getsockname()[1]}"
        src = KafkaSource(
            make_spec("t"), SourceContext(kafka_bootstrap_servers=bootstrap), stall_timeout_s=0.3, fetcher=fetcher
        )
        started = time.monotonic()
        with pytest.raises(KafkaConfigError, match=f"no Kafka broker answers at {bootstrap}"):
            list(src.read(ReadTask("clicks_stream", H0, "t:0", 0, 10)))
        assert time.monotonic() - started < 5


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


def test_the_record_timestamps_are_only_asked_for_when_a_ts_is_missing() -> None:
    decoder = JsonRecordDecoder(make_spec("t"))
    asked: list[int] = []

    def stamps() -> list[int]:
        asked.append(1)
        return [H0_MS + 7, H0_MS + 8]

    rows = [sample(0, H0_MS), sample(1, H0_MS)]
    table, _ = decoder.decode([json.dumps(r).encode() for r in rows], stamps)
    assert table is not None and not asked
    del rows[1]["event_time"]
    table, _ = decoder.decode([json.dumps(r).encode() for r in rows], stamps)
    assert table is not None and asked == [1] and table.column("event_time").to_pylist() == [H0_MS, H0_MS + 8]


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
    with KafkaSource(spec, context) as rd, KafkaSource(spec, context, fetcher="kafka-python") as kp:
        got = batches_of(rd, [task])
        assert got == batches_of(kp, [task])
    assert [i for b in got for i in b["sample_id"]] == list(range(5, 140))


def test_the_spec_chooses_the_fetcher() -> None:
    context = SourceContext(kafka_bootstrap_servers="127.0.0.1:9")
    assert KafkaSource(make_spec("t"), context).fetcher == "confluent-kafka"
    assert KafkaSource(make_spec("t", fetcher="kafka-python"), context).fetcher == "kafka-python"
    assert (
        KafkaSource(make_spec("t", fetcher="kafka-python"), context, fetcher="confluent-kafka").fetcher
        == "confluent-kafka"
    )
    with pytest.raises(ValueError, match="fetcher"):
        make_spec("t", fetcher="librdkafka")
    with pytest.raises(
        ValueError, match=r"'native' .* was removed: use 'confluent-kafka' \(the default\) or 'kafka-python'"
    ):
        make_spec("t", fetcher="native")


# -- offsets_for_times, checked: a broker that implements it, one that ignores timestamps -------------------


class FakeProbe:
    """An in-memory partition 0 of ``timestamps`` (any order) and a broker whose ``offsets_for_times`` is
    Kafka's (the earliest offset with ts >= the asked one) or, with ``ignores``, answers offset 0 always."""

    topic = "fake"

    def __init__(self, timestamps: list[int], ignores: bool = False) -> None:
        self.ts, self.ignores, self.asked = timestamps, ignores, 0

    def partition_ids(self) -> list[int]:
        return [0]

    def list_offsets(self, partition: int) -> tuple[int, int]:
        return 0, len(self.ts)

    def fetch(self, partition: int, offset: int) -> list[tuple[int, int]]:
        return [(o, self.ts[o]) for o in range(offset, min(offset + 4, len(self.ts)))]

    def highwater(self, partition: int) -> int:
        return len(self.ts)

    def offsets_for_times(self, partition: int, ts_ms: int) -> int | None:
        self.asked += 1
        if self.ignores:
            return 0
        return next((o for o, ts in enumerate(self.ts) if ts >= ts_ms), None)


def test_hour_boundaries_come_from_the_broker_with_out_of_order_timestamps() -> None:
    # hour 0: offsets 0-39, with offset 20 an hour-1 record arriving early and offset 45 a late hour-0 one
    ts = [H0_MS + i * 1000 for i in range(40)] + [H0_MS + HOUR_MS + i * 1000 for i in range(40)]
    ts[20], ts[45] = H0_MS + HOUR_MS + 5, H0_MS + 5
    probe, search = FakeProbe(ts), OffsetSearch(poll_timeout_s=1)
    row, last = search.boundary_offsets(probe, 0, [H0_MS, H0_MS + HOUR_MS, H0_MS + 2 * HOUR_MS])
    assert row == [0, 20, 80] and last == ts[-1]  # the broker's rule: the earliest offset at or after each bound
    assert search.broker_timestamps is True and probe.asked == 3
    assert search.fetches <= 2 + 3  # the tail, then one check per boundary: no binary search


def test_a_broker_that_ignores_timestamps_falls_back_to_the_binary_search(caplog: pytest.LogCaptureFixture) -> None:
    ts = [H0_MS + i * 60_000 for i in range(200)]  # in order: 60 in hour 0, 60 in hour 1, ...
    probe, search = FakeProbe(ts, ignores=True), OffsetSearch(poll_timeout_s=1)
    with caplog.at_level(logging.WARNING):
        row, _ = search.boundary_offsets(probe, 0, [H0_MS + h * HOUR_MS for h in range(4)])
        search.boundary_offsets(probe, 0, [H0_MS + 5 * HOUR_MS])
    assert row == [0, 60, 120, 180] and search.broker_timestamps is False
    assert probe.asked == 2  # the first answer holds (offset 0 is right for hour 0); the second does not
    assert len([r for r in caplog.records if "'fake'" in r.getMessage()]) == 1


@pytest.mark.parametrize("seed", range(6))
def test_the_fallback_search_finds_each_boundary_in_few_fetches(seed: int) -> None:
    """The search over record timestamps (in order, at a rate that changes over the day, some equal) finds
    what a scan finds, in about as many fetches as a binary search at worst."""
    import random

    rng = random.Random(seed)
    ts, t = [], H0_MS - rng.randrange(HOUR_MS)
    for i in range(rng.randrange(2_000, 40_000)):
        t += rng.choice([0, 1, 2]) * (1 + (i // 3000) % 5) * rng.randrange(1, 400)
        ts.append(t)
    bounds = [H0_MS + h * HOUR_MS for h in range(-1, 8)]
    probe, search = FakeProbe(ts, ignores=True), OffsetSearch(poll_timeout_s=1)
    row, _ = search.boundary_offsets(probe, 0, bounds)
    assert row == [next((o for o, x in enumerate(ts) if x >= b), len(ts)) for b in bounds]
    assert search.fetches <= 2 + 2 + len(bounds) * (math.ceil(math.log2(len(ts))) + 2)
