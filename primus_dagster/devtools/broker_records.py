"""The embedded broker's records on disk: saved when a detached broker stops, replayed when one starts.

tansu 0.6, the embedded broker, keeps its log in memory; its persistent engines (S3, Postgres) need a
server this machine does not run, and the build has no SQLite engine. So the demo's stream would be
gone with the broker. :func:`save_records` reads every record of every topic, in offset order, with
its key, value, headers and timestamp, into one Parquet file per topic under ``directory`` (plus
``topics.json``: each topic's partition count and high watermarks); :func:`replay_records` creates
the topics in a fresh broker and produces the records back, partition by partition, in order, so each
record gets **the offset it had** -- checked record by record from the delivery reports, since the
suite's checkpoints, Dagster metadata and sensor cursors name offsets. A replay that would give other
offsets (the topic already holds records, a partition did not start at offset 0) fails naming the topic
and partition; nothing is replayed silently somewhere else.

What is not kept: records produced after the last save when the broker is killed rather than stopped
(``primus-dagster-dev broker --stop`` and the demo save; a SIGKILL or a reboot does not), consumer
group offsets (the suite keeps its own in checkpoints). A development convenience only: a real
deployment points the suite at a real Kafka.

Example::

    save_records("127.0.0.1:9092", ".primus/broker_records")     # {"events": 120000}
    replay_records("127.0.0.1:40321", ".primus/broker_records")  # {"events": 120000}, same offsets
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FORMAT = 1
MANIFEST = "topics.json"
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp_ms", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", _HEADERS),
    ]
)


class BrokerRecordsError(RuntimeError):
    """The broker's records could not be saved or replayed as they were (names topic, partition, file)."""


def has_saved_records(directory: str | Path) -> bool:
    """True when ``directory`` holds a save of :func:`save_records`."""
    return (Path(directory) / MANIFEST).is_file()


def _deadline_for(records: int, timeout_s: float) -> float:
    # a fixed floor plus time per record: 100 k demo records take a few seconds, never minutes
    return time.monotonic() + timeout_s + records / 20_000


def save_records(bootstrap_servers: str, directory: str | Path, timeout_s: float = 30.0) -> dict[str, int]:
    """Every record of every topic of the broker into ``directory`` (replaced whole, atomically); the
    records saved per topic. Topics whose name starts with ``__`` (the broker's own) are left out."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    target = Path(directory)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "primus-broker-records",
            "enable.auto.commit": False,
            "enable.partition.eof": True,  # the end of each partition, as a fetch reports it
            "socket.timeout.ms": int(timeout_s * 1000),
        }
    )
    try:
        try:
            metadata = consumer.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerRecordsError(f"cannot list the topics of {bootstrap_servers}: {exc}") from exc
        topics = {name: sorted(t.partitions) for name, t in metadata.topics.items() if not name.startswith("__")}
        assignment = []
        for topic, partitions in sorted(topics.items()):
            for partition in partitions:
                # the listed end may under-report (tansu: "start of the last batch + 1"): only the low end is
                # used; the records are read up to the end a fetch reports (partition EOF)
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
                if low != 0 and high > low:
                    raise BrokerRecordsError(
                        f"{topic}[{partition}] starts at offset {low}, not 0: a replay could not give its records "
                        "their offsets"
                    )
                assignment.append(TopicPartition(topic, partition, 0))
        listed = sum(consumer.get_watermark_offsets(tp, timeout=timeout_s)[1] for tp in assignment)
        rows, highs = _consume_all(consumer, assignment, _deadline_for(listed, timeout_s))
    finally:
        consumer.close()
    staging = target.with_name(f"{target.name}.saving")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for topic in topics:
        pq.write_table(_table(rows.get(topic, [])), staging / f"{topic}.parquet")
    manifest = {
        "format": FORMAT,
        "saved_at": time.time(),
        "topics": {
            t: {"partitions": len(ps), "highs": {str(p): h for p, h in highs[t].items()}} for t, ps in topics.items()
        },
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
    old = target.with_name(f"{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return {topic: _total(highs[topic]) for topic in topics}


def _total(highs: dict[int, int]) -> int:
    return sum(highs.values())


def _consume_all(
    consumer: Any, assignment: list[Any], deadline: float
) -> tuple[dict[str, list[tuple[Any, ...]]], dict[str, dict[int, int]]]:
    """Every record of ``assignment`` (from offset 0 to each partition's end), by topic, and the highs."""
    from confluent_kafka import KafkaError

    rows: dict[str, list[tuple[Any, ...]]] = {}
    highs: dict[str, dict[int, int]] = {}
    for tp in assignment:
        highs.setdefault(tp.topic, {})[tp.partition] = 0
    if not assignment:
        return rows, highs
    consumer.assign(assignment)
    remaining = {(tp.topic, tp.partition) for tp in assignment}
    while remaining:
        if time.monotonic() > deadline:
            missing = ", ".join(f"{t}[{p}]" for t, p in sorted(remaining))
            raise BrokerRecordsError(f"the records of {missing} were not all read in time")
        for message in consumer.consume(num_messages=10_000, timeout=0.5):
            topic, partition, error = message.topic(), message.partition(), message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    remaining.discard((topic, partition))
                    continue
                raise BrokerRecordsError(f"reading {topic}[{partition}]: {error}")
            offset = message.offset()
            if offset != highs[topic][partition]:
                raise BrokerRecordsError(
                    f"{topic}[{partition}]: offset {offset} follows {highs[topic][partition] - 1}: a replay could not "
                    "give its records their offsets"
                )
            headers = [(k, v if v is None else bytes(v)) for k, v in (message.headers() or [])]
            rows.setdefault(topic, []).append(
                (partition, offset, message.timestamp()[1], message.key(), message.value(), headers)
            )
            highs[topic][partition] = offset + 1
    return rows, highs


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in SCHEMA]
    headers = [[{"key": k, "value": v} for k, v in h] for h in columns[5]]
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns[:5], SCHEMA, strict=False)]
    table = pa.Table.from_arrays([*arrays, pa.array(headers, type=_HEADERS)], schema=SCHEMA)
    return table.sort_by([("partition", "ascending"), ("offset", "ascending")])


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BrokerRecordsError(f"{path}: not a save of the broker's records ({exc})") from exc
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != FORMAT
        or not isinstance(manifest.get("topics"), dict)
    ):
        raise BrokerRecordsError(f"{path}: not a save of the broker's records in format {FORMAT}")
    return manifest


def replay_records(
    bootstrap_servers: str,
    directory: str | Path,
    timeout_s: float = 30.0,
    on_topic: Callable[[str, int], None] | None = None,
) -> dict[str, int]:
    """Create the saved topics in the broker and produce their records back with their offsets (checked);
    the records replayed per topic. ``on_topic(topic, records)`` after each topic (progress)."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    source = Path(directory)
    manifest = _read_manifest(source)
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    existing = admin.list_topics(timeout=timeout_s).topics
    wanted = [NewTopic(t, int(m["partitions"]), 1) for t, m in manifest["topics"].items() if t not in existing]
    for topic, future in (admin.create_topics(wanted, operation_timeout=timeout_s) if wanted else {}).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerRecordsError(f"cannot create topic {topic} on {bootstrap_servers}: {exc}") from exc
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "linger.ms": 20,
            "max.in.flight.requests.per.connection": 1,  # with retries, in order: the offsets must match
            "enable.idempotence": False,
            "queue.buffering.max.messages": 200_000,
        }
    )
    replayed: dict[str, int] = {}
    for topic in manifest["topics"]:
        path = source / f"{topic}.parquet"
        try:
            table = pq.read_table(path, schema=SCHEMA)
        except (OSError, pa.ArrowException) as exc:
            raise BrokerRecordsError(f"{path}: cannot read the saved records of {topic} ({exc})") from exc
        _replay_topic(producer, topic, table, timeout_s)
        replayed[topic] = table.num_rows
        if on_topic is not None:
            on_topic(topic, table.num_rows)
    return replayed


def _replay_topic(producer: Any, topic: str, table: pa.Table, timeout_s: float) -> None:
    """Produce ``table``'s records to ``topic`` in order; raise unless each got its saved offset."""
    wrong: list[str] = []

    def delivered(err: Any, message: Any, expected: int, partition: int) -> None:
        if err is not None:
            wrong.append(f"{topic}[{partition}] offset {expected}: {err}")
        elif message.offset() != expected:
            wrong.append(f"{topic}[{partition}] offset {expected} came back as {message.offset()}")

    deadline = _deadline_for(table.num_rows, timeout_s)
    for row in table.to_pylist():
        partition, offset = row["partition"], row["offset"]
        while True:
            try:
                producer.produce(
                    topic,
                    value=row["value"],
                    key=row["key"],
                    partition=partition,
                    timestamp=row["timestamp_ms"],
                    headers=[(h["key"], h["value"]) for h in row["headers"]] or None,
                    on_delivery=lambda err, msg, o=offset, p=partition: delivered(err, msg, o, p),
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                if time.monotonic() > deadline:
                    raise BrokerRecordsError(f"replaying {topic} did not finish in time") from None
                producer.poll(0.1)
        if wrong:
            break
    left = producer.flush(max(deadline - time.monotonic(), 1.0))
    if left:
        raise BrokerRecordsError(f"replaying {topic}: {left} record(s) not delivered in time")
    if wrong:
        raise BrokerRecordsError(
            f"replaying {topic} would change offsets ({wrong[0]}; {len(wrong)} such): the broker already "
            "holds records of it, or the save is not contiguous"
        )
