"""Live tails of a Kafka topic: tasks from committed offsets to the high watermark, fixed when planned."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from primus_dagster.data.sources.base import ReadTask, SourceContext, SourceReadError
from primus_dagster.data.sources.kafka import FETCHERS, KafkaSource, TailOffsetError, TailPlan, plan_tail
from primus_dagster.devtools.kafka_broker import EmbeddedBroker, create_topic
from primus_dagster.spec.sources import KafkaSourceSpec

pytestmark = pytest.mark.integration

T0_MS = int(datetime(2026, 11, 28, 10, tzinfo=timezone.utc).timestamp() * 1000)


def spec(topic: str, **extra: Any) -> KafkaSourceSpec:
    return KafkaSourceSpec.model_validate(
        {
            "name": "live",
            "type": "kafka",
            "kind": "stream",
            "topic": topic,
            "columns": {"ts": "event_time", "label": "click", "id": "sample_id", "dense": ["d0"], "sparse": ["user"]},
            **extra,
        }
    )


class Stream:
    """A topic and a producer that remembers which id went where."""

    def __init__(self, bootstrap: str, partitions: int) -> None:
        from kafka import KafkaProducer

        self.bootstrap, self.partitions = bootstrap, partitions
        self.topic = f"live-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, self.topic, partitions)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
        self.next_id = 0
        self.placed: dict[int, tuple[int, int]] = {}  # sample id -> (partition, offset)

    def produce(self, n: int, bad_every: int = 0) -> list[int]:
        """``n`` records in several batches per partition; every ``bad_every``-th is not JSON. Returns good ids."""
        futures, good = [], []
        for k in range(n):
            i, self.next_id = self.next_id, self.next_id + 1
            row = {"sample_id": i, "event_time": T0_MS + i, "click": i % 2, "d0": i / 2, "user": i % 5}
            value = b"garbage" if bad_every and k % bad_every == bad_every - 1 else json.dumps(row).encode()
            futures.append(
                (i, value != b"garbage", self.producer.send(self.topic, value, partition=i % self.partitions))
            )
            if k % 23 == 0:
                self.producer.flush()
        self.producer.flush()
        for i, ok, future in futures:
            meta = future.get(10)
            self.placed[i] = (meta.partition, meta.offset)
            if ok:
                good.append(i)
        return good

    def source(self, **extra: Any) -> KafkaSource:
        return KafkaSource(spec(self.topic, **extra), SourceContext(kafka_bootstrap_servers=self.bootstrap))

    def close(self) -> None:
        self.producer.close()


@pytest.fixture
def stream(kafka_broker: EmbeddedBroker) -> Any:
    s = Stream(kafka_broker.bootstrap_servers, partitions=3)
    yield s
    s.close()


def read_ids(src: KafkaSource, tasks: list[ReadTask]) -> list[int]:
    return [i for t in tasks for b in src.read(t) for i in b.column("sample_id").to_pylist()]


def counts(stream: Stream, ids: list[int]) -> dict[int, int]:
    out = dict.fromkeys(range(stream.partitions), 0)
    for i in ids:
        out[stream.placed[i][0]] += 1
    return out


@pytest.mark.parametrize("fetcher", FETCHERS)
def test_consecutive_tails_read_everything_once(stream: Stream, fetcher: str) -> None:
    first = stream.produce(300)
    with KafkaSource(
        spec(stream.topic),
        SourceContext(kafka_bootstrap_servers=stream.bootstrap),
        fetcher=fetcher,  # type: ignore[arg-type]
    ) as src:
        assert src.high_watermarks() == counts(stream, first)  # exact, from a fetch
        assert src.watermarks() == {p: (0, n) for p, n in counts(stream, first).items()}
        plan = src.tail()
        assert plan.starts == dict.fromkeys(range(3), 0)
        assert plan.stops == plan.high_watermarks == plan.next_offsets == counts(stream, first)
        assert plan.lag == counts(stream, first) and plan.records == 300
        got = read_ids(src, plan.tasks)
        assert sorted(got) == first

        second = stream.produce(200)
        assert src.lag(plan.next_offsets) == counts(stream, second)
        plan2 = src.tail(plan.next_offsets)
        assert plan2.starts == plan.stops
        got2 = read_ids(src, plan2.tasks)
        assert sorted(got2) == second
        assert not set(got) & set(got2)

        caught_up = src.tail(plan2.next_offsets)
        assert caught_up.tasks == [] and caught_up.lag == dict.fromkeys(range(3), 0)


def test_the_stop_is_fixed_when_planned(stream: Stream) -> None:
    before = stream.produce(90)
    with stream.source(batch_rows=16) as src:
        plan = src.tail()
        later = stream.produce(60)  # arrives between planning and reading
        first_read = [b.to_pydict() for t in plan.tasks for b in src.read(t)]
        ids = [i for b in first_read for i in b["sample_id"]]
        assert sorted(ids) == before and not set(ids) & set(later)
        # a re-run of the same tasks (after a crash) yields exactly the same batches
        again = [ReadTask.from_json(t.to_json()) for t in plan.tasks]
        assert [b.to_pydict() for t in again for b in src.read(t)] == first_read
        assert src.lag(plan.next_offsets) == counts(stream, later)


def test_tail_tasks_split_and_per_partition_limits(stream: Stream) -> None:
    stream.produce(120)  # 40 per partition
    with stream.source(max_records_per_task=15) as src:
        tasks = src.tail_tasks({0: 5})
        assert [(t.uri.rsplit(":", 1)[1], t.start, t.stop) for t in tasks] == [
            ("0", 5, 20),
            ("0", 20, 35),
            ("0", 35, 40),
            ("1", 0, 15),
            ("1", 15, 30),
            ("1", 30, 40),
            ("2", 0, 15),
            ("2", 15, 30),
            ("2", 30, 40),
        ]
        assert len({t.task_id for t in tasks}) == len(tasks)
        capped = src.tail({0: 5, 1: 40}, max_records_per_partition=10)
        assert capped.stops == {0: 15, 1: 40, 2: 10}
        assert capped.lag == {0: 35, 1: 0, 2: 40}  # the lag is to the high watermark, not to the cap
        assert sorted(read_ids(src, capped.tasks)) == sorted(
            i for i, (p, off) in stream.placed.items() if (p == 0 and 5 <= off < 15) or (p == 2 and off < 10)
        )
        summary = capped.to_dict()
        assert summary["lag"] == {"0": 35, "1": 0, "2": 40} and len(summary["tasks"]) == len(capped.tasks)


def test_bad_records_in_a_tail_are_counted(stream: Stream) -> None:
    good = stream.produce(100, bad_every=10)
    with stream.source() as src:
        plan = src.tail()
        assert sorted(read_ids(src, plan.tasks)) == good
        assert src.stats["bad_records"] == 10 and src.stats["records"] == 100 and src.stats["rows"] == 90


def test_offsets_that_do_not_fit_the_topic(stream: Stream) -> None:
    stream.produce(30)
    with stream.source() as src:
        with pytest.raises(TailOffsetError, match="past the high watermark"):
            src.tail({0: 11})
        with pytest.raises(TailOffsetError, match=r"has no partitions \[7\]"):
            src.tail({7: 0})
    context = SourceContext(kafka_bootstrap_servers=stream.bootstrap)
    with KafkaSource(spec("no-such-topic"), context) as src, pytest.raises(SourceReadError, match="does not exist"):
        src.tail()


def test_offsets_deleted_by_retention_raise_or_are_skipped_and_reported() -> None:
    planned = datetime(2026, 11, 28, 10, 42, tzinfo=timezone.utc)
    args: dict[str, Any] = dict(
        source="live",
        topic="t",
        begins={0: 100, 1: 0},
        highs={0: 180, 1: 50},
        max_records_per_task=1000,
        planned_at=planned,
        granularity="hour",
    )
    with pytest.raises(TailOffsetError, match=r"offsets 60\.\.100 were deleted"):
        plan_tail(committed={0: 60, 1: 10}, **args)
    plan = plan_tail(committed={0: 60, 1: 10}, skip_deleted=True, **args)
    assert isinstance(plan, TailPlan)
    assert plan.skipped == {0: 40} and plan.starts == {0: 100, 1: 10} and plan.lag == {0: 80, 1: 40}
    assert [(t.uri, t.start, t.stop) for t in plan.tasks] == [("t:0", 100, 180), ("t:1", 10, 50)]
    assert all(t.partition == datetime(2026, 11, 28, 10, tzinfo=timezone.utc) for t in plan.tasks)


def test_four_partitions_read_by_two_executors_in_parallel(kafka_broker: EmbeddedBroker) -> None:
    stream = Stream(kafka_broker.bootstrap_servers, partitions=4)
    try:
        produced = stream.produce(400)
        with stream.source() as planner:
            tasks = planner.tail_tasks()
        halves: list[list[int]] = [[], []]

        def executor(k: int) -> None:  # each reads two of the four partitions with its own adapter
            with stream.source() as src:
                halves[k] = read_ids(src, tasks[k::2])

        threads = [threading.Thread(target=executor, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert {stream.placed[i][0] for i in halves[0]} == {0, 2} and {stream.placed[i][0] for i in halves[1]} == {1, 3}
        assert sorted(halves[0] + halves[1]) == produced
    finally:
        stream.close()
