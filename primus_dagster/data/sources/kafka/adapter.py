"""The Kafka source adapter: time partitions as per-topic-partition offset ranges of JSON records.

Each record value is one JSON object (one sample) whose fields are named by the spec's column
mapping; the record timestamp is the event time (epoch ms) and fills ``ts`` when the JSON has
no such field. Time partitions map to offsets by a binary search over record timestamps
(:mod:`.offsets`), which assumes timestamps are **non-decreasing within a topic-partition**.
Reads use ``assign`` + ``seek`` (no consumer group, no commits) and decode in bulk
(:mod:`.decoding`); undecodable records are counted, never fatal.

Example::

    with KafkaSource(spec, SourceContext(kafka_bootstrap_servers="127.0.0.1:9092")) as src:
        part = src.partition(datetime(2026, 11, 29, 10, tzinfo=timezone.utc))
        batches = [b for t in src.split(part) for b in src.read(t)]
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from primus_dagster.data.canonical import SchemaMismatchError
from primus_dagster.data.sources.base import (
    Partition,
    ReadTask,
    SourceAdapter,
    SourceContext,
    SourceReadError,
    TimeWindow,
)
from primus_dagster.data.sources.kafka.decoding import JsonRecordDecoder
from primus_dagster.data.sources.kafka.offsets import PROBE_CONSUMER_CONFIG, OffsetSearch
from primus_dagster.spec.dataset import granularity_step
from primus_dagster.spec.sources import KafkaSourceSpec

log = logging.getLogger(__name__)

MAX_BAD_EXAMPLES = 10


class KafkaConfigError(ValueError):
    """The source cannot reach Kafka: no bootstrap servers configured, or none answers."""


def _accepts(server: str, timeout_s: float) -> bool:
    host, sep, port = server.strip().rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)) if sep else (port, 9092), timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat()


class KafkaSource(SourceAdapter):
    """Reads a Kafka topic of JSON samples, partitioned hourly/daily by record timestamp.

    Not safe for concurrent use from several threads except :meth:`partitions` (locked);
    overlapping :meth:`read` generators get a consumer each.

    Example::

        with KafkaSource(spec, SourceContext(kafka_bootstrap_servers="127.0.0.1:9092")) as src:
            part = src.partition(datetime(2026, 11, 29, 10, tzinfo=timezone.utc))
            part.detail["offsets"]                 # {"0": [120, 480], "1": [97, 455]}
            batches = [b for t in src.split(part) for b in src.read(t)]  # canonical Arrow batches
            src.last_read_stats["bad_records"]     # undecodable records skipped in the last task
    """

    spec: KafkaSourceSpec

    def __init__(
        self,
        spec: KafkaSourceSpec,
        context: SourceContext,
        poll_timeout_s: float = 5.0,
        stall_timeout_s: float = 30.0,
        connect_timeout_s: float = 20.0,
    ):
        super().__init__(spec, context)
        self.poll_timeout_s, self.stall_timeout_s = poll_timeout_s, stall_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._decoder = JsonRecordDecoder(spec)
        self.schema = self._decoder.schema
        self._lock = threading.Lock()
        self._probe: Any = None  # KafkaConsumer for offset search (small fetches)
        self._reader: Any = None  # KafkaConsumer for reads (poll_max_bytes fetches)
        self._reader_busy = False
        self._offset_search = OffsetSearch(poll_timeout_s)
        self.stats: dict[str, int] = {"tasks": 0, "records": 0, "rows": 0, "bad_records": 0}

    @property
    def probe_fetches(self) -> int:
        """Fetches issued by the offset search so far (all :meth:`partitions` calls)."""
        return self._offset_search.fetches

    @property
    def bootstrap_servers(self) -> str:
        servers = self.spec.bootstrap_servers or self.context.kafka_bootstrap_servers
        if not servers:
            raise KafkaConfigError(
                f"source {self.spec.name!r}: no Kafka bootstrap servers; set `bootstrap_servers` "
                "on the source or configure the Kafka resource (or start the embedded broker)"
            )
        return servers

    def _consumer(self, **overrides: Any) -> Any:
        from kafka import KafkaConsumer, errors

        config: dict[str, Any] = dict(
            bootstrap_servers=self.bootstrap_servers.split(","),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id=f"primus-{self.spec.name}",
            request_timeout_ms=30_000,
            fetch_max_bytes=self.spec.poll_max_bytes,
            max_partition_fetch_bytes=self.spec.poll_max_bytes,
        )
        if "bootstrap_timeout_ms" in KafkaConsumer.DEFAULT_CONFIG:  # kafka-python >= 3
            config["bootstrap_timeout_ms"] = int(self.connect_timeout_s * 1000)
        config.update(overrides)
        unreachable = tuple(e for e in (getattr(errors, "NoBrokersAvailable", None), errors.KafkaTimeoutError) if e)
        try:
            # A TCP check first: a KafkaConsumer that fails to bootstrap leaves its IO thread running.
            if not any(_accepts(server, self.connect_timeout_s) for server in config["bootstrap_servers"]):
                raise errors.KafkaTimeoutError("no bootstrap server accepts TCP connections")
            return KafkaConsumer(**config)
        except unreachable as exc:
            raise KafkaConfigError(
                f"source {self.spec.name!r}: no Kafka broker answers at {self.bootstrap_servers} ({exc})"
            ) from exc

    def partitions(self, window: TimeWindow) -> list[Partition]:
        """Offset ranges of each hour/day partition overlapping ``window`` (O(log N) fetches each)."""
        from kafka import TopicPartition

        step = granularity_step(self.spec.granularity)
        starts = window.partition_starts(self.spec.granularity)
        bounds = [int(t.timestamp() * 1000) for t in [*starts, starts[-1] + step]]
        topic = self.spec.topic
        with self._lock:
            if self._probe is None:
                self._probe = self._consumer(**PROBE_CONSUMER_CONFIG)
            ids = self._probe.partitions_for_topic(topic)
            if not ids:
                return [
                    Partition(self.spec.name, s, s + step, False, topic, reason=f"topic {topic!r} does not exist")
                    for s in starts
                ]
            offsets: dict[int, list[int]] = {}
            last_ts: dict[int, int | None] = {}
            for tp in (TopicPartition(topic, p) for p in sorted(ids)):
                offsets[tp.partition], last_ts[tp.partition] = self._offset_search.boundary_offsets(
                    self._probe, tp, bounds
                )
        out = []
        for i, start in enumerate(starts):
            end_ms = bounds[i + 1]
            ranges = {str(p): [row[i], row[i + 1]] for p, row in offsets.items()}
            behind = [p for p, ts in last_ts.items() if ts is None or ts < end_ms]
            latest = {p: "empty" if (ts := last_ts[p]) is None else _iso(ts) for p in behind[:5]}
            reason = (
                (
                    f"topic {topic!r}: partitions {behind[:5]} have no record at or after {_iso(end_ms)} "
                    f"(latest event times: {latest})"
                )
                if behind
                else None
            )
            rows = sum(e - s for s, e in ranges.values())
            out.append(
                Partition(
                    self.spec.name,
                    start,
                    start + step,
                    not behind,
                    topic,
                    files=len(ranges),
                    rows=rows,
                    reason=reason,
                    detail={"offsets": ranges},
                )
            )
        return out

    def offsets_for(self, partition: Partition) -> dict[int, tuple[int, int]]:
        """``{kafka partition: (start offset, stop offset)}`` of a time partition."""
        ranges = partition.detail.get("offsets")
        if ranges is None:
            ranges = self.partition(partition.start).detail["offsets"]
        return {int(p): (int(s), int(e)) for p, (s, e) in ranges.items()}

    def split(self, partition: Partition) -> list[ReadTask]:
        """One task per topic-partition range, chunked to ``max_records_per_task`` offsets."""
        chunk = self.spec.max_records_per_task
        tasks = []
        for p, (start, stop) in sorted(self.offsets_for(partition).items()):
            for s in range(start, stop, chunk):
                e = min(stop, s + chunk)
                tasks.append(ReadTask(self.spec.name, partition.start, f"{self.spec.topic}:{p}", s, e, rows=e - s))
        return tasks

    @contextmanager
    def _reading_consumer(self) -> Iterator[Any]:
        """The cached reader, or a private one when another read generator holds it."""
        with self._lock:
            shared, self._reader_busy = not self._reader_busy, True
        consumer = self._reader if shared else None
        try:
            if consumer is None:
                consumer = self._consumer(max_poll_records=min(self.spec.batch_rows, 65536))
                if shared:
                    self._reader = consumer
            yield consumer
        finally:
            if shared:
                self._reader_busy = False
            elif consumer is not None:
                consumer.close()

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """Canonical batches of the records in ``[task.start, task.stop)`` of one topic-partition.

        Undecodable records are skipped and counted in :attr:`last_read_stats` (``bad_records``,
        ``bad_examples`` with offsets and errors) and :attr:`stats`; broker errors, stalls and
        offsets lost to retention raise :class:`SourceReadError`.
        """
        from kafka.errors import KafkaError

        stats: dict[str, Any] = {"task": task.task_id, "records": 0, "rows": 0, "bad_records": 0, "bad_examples": []}
        self.last_read_stats = stats
        self.stats["tasks"] += 1
        try:
            yield from self._read(task, stats)
        except KafkaError as exc:
            raise SourceReadError(task.uri, f"Kafka error after {stats['records']} records: {exc}") from exc
        except SchemaMismatchError as exc:
            raise SourceReadError(task.uri, str(exc)) from exc
        if stats["bad_records"]:
            log.warning(
                "%s: skipped %d undecodable Kafka records of %d, e.g. %s",
                task.task_id,
                stats["bad_records"],
                stats["records"],
                stats["bad_examples"][:3],
            )

    def _read(self, task: ReadTask, stats: dict[str, Any]) -> Iterator[pa.RecordBatch]:
        from kafka import TopicPartition

        topic, _, p = task.uri.rpartition(":")
        tp, stop = TopicPartition(topic, int(p)), task.stop
        if stop is None:
            raise SourceReadError(task.uri, "a Kafka read task needs a stop offset")
        with self._reading_consumer() as consumer:
            consumer.assign([tp])
            begin = consumer.beginning_offsets([tp])[tp]
            if task.start < begin:
                raise SourceReadError(
                    task.uri,
                    f"offsets {task.start}..{begin} were deleted (retention); the range cannot be read exactly once",
                )
            consumer.seek(tp, task.start)
            chunk: list[Any] = []
            position, last_progress = task.start, time.monotonic()
            while position < stop:
                records = consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000)).get(tp, [])
                if not records:
                    if time.monotonic() - last_progress > self.stall_timeout_s:
                        raise SourceReadError(
                            task.uri,
                            f"no records after offset {position} in "
                            f"{self.stall_timeout_s:.0f}s (stop {stop}, high watermark "
                            f"{consumer.highwater(tp)})",
                        )
                    continue
                last_progress = time.monotonic()
                for r in records:
                    if r.offset >= stop:
                        position = stop
                        break
                    chunk.append(r)
                    position = r.offset + 1
                    if len(chunk) >= self.spec.batch_rows:
                        yield from self._decode(task, chunk, stats)
                        chunk = []
            if chunk:
                yield from self._decode(task, chunk, stats)

    def _decode(self, task: ReadTask, records: list[Any], stats: dict[str, Any]) -> Iterator[pa.RecordBatch]:
        """Bulk-decode one chunk of consumer records, count the undecodable ones, and yield the rest normalised."""
        table, bad = self._decoder.decode(records)
        for counter in (stats, self.stats):
            counter["records"] += len(records)
            counter["bad_records"] += len(bad)
        room = max(MAX_BAD_EXAMPLES - len(stats["bad_examples"]), 0)
        stats["bad_examples"] += [{"offset": records[i].offset, "error": err} for i, err in bad[:room]]
        if table is None:
            return
        where = f"{task.uri}@{records[0].offset}-{records[-1].offset}"
        for batch in table.to_batches():
            out = self.normalize(batch, where=where)
            stats["rows"] += out.num_rows
            self.stats["rows"] += out.num_rows
            yield out

    def close(self) -> None:
        """Close the cached consumers."""
        with self._lock:
            consumers, self._probe, self._reader = (self._probe, self._reader), None, None
        for consumer in consumers:
            if consumer is not None:
                consumer.close()
