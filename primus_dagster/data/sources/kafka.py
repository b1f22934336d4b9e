"""Kafka source: time partitions as per-topic-partition offset ranges of JSON records.

Each record value is one JSON object (one sample) whose fields are named by the spec's column
mapping; the record timestamp is the event time (epoch ms) and fills ``ts`` when the JSON has
no such field. Time partitions map to offsets by a binary search over record timestamps,
which assumes timestamps are **non-decreasing within a topic-partition** (true for
producer-assigned event times of an ordered stream and for LogAppendTime topics). The
broker's ``offsets_for_times`` is not used: the embedded tansu broker ignores timestamps there.

Reads use ``assign`` + ``seek`` (no consumer group, no commits), decode JSON in bulk with
``pyarrow.json`` and isolate undecodable records by bisection (counted, never fatal).
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from primus_dagster.data.canonical import SchemaMismatchError, native_columns
from primus_dagster.data.sources.base import (
    Partition,
    ReadTask,
    SourceAdapter,
    SourceContext,
    SourceReadError,
    TimeWindow,
)
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


def json_schema(spec: KafkaSourceSpec) -> pa.Schema:
    """Explicit schema for decoding the JSON records of ``spec`` (only mapped fields)."""
    m = spec.columns
    types: dict[str, pa.DataType] = {m.ts: pa.int64()}
    if m.label:
        types.setdefault(m.label, pa.float64())
    if m.id:
        types.setdefault(m.id, pa.int64())
    dense = [m.dense] if isinstance(m.dense, str) else m.dense
    for name in dense:
        types.setdefault(name, pa.list_(pa.float32()) if isinstance(m.dense, str) else pa.float32())
    for _, native in m.sparse_pairs():
        types.setdefault(native, pa.int64())
    return pa.schema([(name, types[name]) for name in native_columns(m)])


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
        self.schema = json_schema(spec)
        self._parse_options = pj.ParseOptions(explicit_schema=self.schema, unexpected_field_behavior="ignore")
        self._lock = threading.Lock()
        self._probe: Any = None  # KafkaConsumer for offset search (small fetches)
        self._reader: Any = None  # KafkaConsumer for reads (poll_max_bytes fetches)
        self._reader_busy = False
        self._boundaries: dict[tuple[int, int], int] = {}  # (partition, epoch ms) -> first offset with ts >= it
        self.probe_fetches = 0
        self.stats: dict[str, int] = {"tasks": 0, "records": 0, "rows": 0, "bad_records": 0}

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
        from kafka import KafkaConsumer, errors  # noqa: PLC0415

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

    def _fetch(self, tp: Any, offset: int) -> list[tuple[int, int]]:
        """``(offset, timestamp)`` of the records at and after ``offset`` returned by one fetch."""
        consumer = self._probe
        if tp not in consumer.assignment():
            consumer.assign([tp])
        consumer.seek(tp, offset)
        self.probe_fetches += 1
        records = consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000)).get(tp, [])
        return [(r.offset, r.timestamp) for r in records if r.offset >= offset]

    def _tail(self, tp: Any) -> tuple[int, int, int | None]:
        """``(begin offset, true high watermark, timestamp of the last record or None)``.

        ``end_offsets`` may under-report (tansu: "start of last batch + 1"); a fetch's high watermark is exact.
        """
        consumer = self._probe
        consumer.assign([tp])
        begin = consumer.beginning_offsets([tp])[tp]
        end = consumer.end_offsets([tp])[tp]
        if end <= begin:
            return begin, begin, None
        back = 1
        while True:
            start = max(begin, end - back)
            records = self._fetch(tp, start)
            high = consumer.highwater(tp)
            if high is not None and records and records[-1][0] < high - 1:
                records = self._fetch(tp, high - 1) or records  # the fetch stopped short of the end
            if records:
                return begin, max(high or 0, records[-1][0] + 1), records[-1][1]
            if start == begin:
                return begin, max(high or begin, begin), None
            back *= 8

    def _search(self, tp: Any, target_ms: int, lo: int, hi: int) -> int:
        """First offset in ``[lo, hi]`` whose record timestamp is >= ``target_ms`` (``hi``: none)."""
        while lo < hi:
            mid = (lo + hi) // 2
            records = [r for r in self._fetch(tp, mid) if r[0] < hi]
            if not records:  # no record in [mid, hi)
                hi = mid
                continue
            for i, (off, ts) in enumerate(records):
                if ts >= target_ms:
                    if i > 0:  # the previous record is older and nothing lies between
                        return off
                    hi = off
                    break
            else:
                lo = records[-1][0] + 1
        return lo

    def _boundary(self, tp: Any, target_ms: int, lo: int, hi: int) -> int:
        cached = self._boundaries.get(key := (tp.partition, target_ms))
        if cached is not None and lo <= cached <= hi:
            return cached
        off = self._search(tp, target_ms, lo, hi)
        if off < hi:  # a record at/after target exists: final under the ordering assumption
            self._boundaries[key] = off
        return off

    def partitions(self, window: TimeWindow) -> list[Partition]:
        """Offset ranges of each hour/day partition overlapping ``window`` (O(log N) fetches each)."""
        from kafka import TopicPartition  # noqa: PLC0415

        step = granularity_step(self.spec.granularity)
        starts = window.partition_starts(self.spec.granularity)
        bounds = [int(t.timestamp() * 1000) for t in [*starts, starts[-1] + step]]
        topic = self.spec.topic
        with self._lock:
            if self._probe is None:
                # Probes only need offsets and timestamps: small fetches, and no CRC pass over whole
                # batches (pure-Python CRC32C costs ~25 ms per probe without the `crc32c` package).
                self._probe = self._consumer(
                    max_poll_records=64,
                    fetch_max_wait_ms=100,
                    fetch_max_bytes=64 * 1024,
                    max_partition_fetch_bytes=64 * 1024,
                    check_crcs=False,
                )
            ids = self._probe.partitions_for_topic(topic)
            if not ids:
                return [
                    Partition(self.spec.name, s, s + step, False, topic, reason=f"topic {topic!r} does not exist")
                    for s in starts
                ]
            offsets: dict[int, list[int]] = {}
            last_ts: dict[int, int | None] = {}
            for tp in (TopicPartition(topic, p) for p in sorted(ids)):
                begin, high, last = self._tail(tp)
                last_ts[tp.partition] = last
                row, lo = [], begin
                for bound in bounds:
                    lo = self._boundary(tp, bound, lo, high)
                    row.append(lo)
                offsets[tp.partition] = row
        out = []
        for i, start in enumerate(starts):
            end_ms = bounds[i + 1]
            ranges = {str(p): [row[i], row[i + 1]] for p, row in offsets.items()}
            behind = [p for p, ts in last_ts.items() if ts is None or ts < end_ms]
            latest = {p: _iso(last_ts[p]) if last_ts[p] is not None else "empty" for p in behind[:5]}
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
        from kafka.errors import KafkaError  # noqa: PLC0415

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
        from kafka import TopicPartition  # noqa: PLC0415

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

    def _parse_isolating(
        self, lines: list[bytes], lo: int, hi: int, good: list[tuple[int, int, pa.Table]], bad: list[tuple[int, str]]
    ) -> None:
        """Parse ``lines[lo:hi]`` in bulk; on failure bisect until the bad records are isolated."""
        try:
            table = pj.read_json(io.BytesIO(b"\n".join(lines[lo:hi])), parse_options=self._parse_options)
            if table.num_rows != hi - lo:
                raise ValueError(f"{table.num_rows} JSON values in {hi - lo} records (several objects in one?)")
            good.append((lo, hi, table))
        except (pa.ArrowException, ValueError) as exc:
            if hi - lo == 1:
                bad.append((lo, str(exc).splitlines()[0][:300]))
                return
            mid = (lo + hi) // 2
            self._parse_isolating(lines, lo, mid, good, bad)
            self._parse_isolating(lines, mid, hi, good, bad)

    def _decode(self, task: ReadTask, records: list[Any], stats: dict[str, Any]) -> Iterator[pa.RecordBatch]:
        """Bulk-decode one chunk of consumer records and yield it normalised."""
        bad: list[tuple[int, str]] = []
        keep: list[int] = []
        lines: list[bytes] = []
        for i, record in enumerate(records):
            # One JSON object per record: pyarrow.json crashes (segfault) on a leading top-level
            # `null` and reads a trailing one as an extra all-null row, so check the braces first.
            text = record.value.strip() if record.value else b""
            if text[:1] != b"{" or text[-1:] != b"}":
                bad.append((i, "not a JSON object" if text else "empty record"))
                continue
            if b"\n" in text or b"\r" in text:  # raw newlines are only legal as JSON whitespace
                text = text.replace(b"\r", b" ").replace(b"\n", b" ")
            keep.append(i)
            lines.append(text)
        good: list[tuple[int, int, pa.Table]] = []
        bad_lines: list[tuple[int, str]] = []
        if lines:
            self._parse_isolating(lines, 0, len(lines), good, bad_lines)
        bad = sorted(bad + [(keep[j], err) for j, err in bad_lines])
        for counter in (stats, self.stats):
            counter["records"] += len(records)
            counter["bad_records"] += len(bad)
        room = max(MAX_BAD_EXAMPLES - len(stats["bad_examples"]), 0)
        stats["bad_examples"] += [{"offset": records[i].offset, "error": err} for i, err in bad[:room]]
        if not good:
            return
        table = pa.concat_tables([t for _, _, t in good]).combine_chunks()
        rows = np.concatenate([np.asarray(keep[lo:hi], dtype=np.int64) for lo, hi, _ in good])
        record_ts = pa.array(np.fromiter((r.timestamp for r in records), np.int64, len(records))[rows])
        ts = table.schema.get_field_index(self.spec.columns.ts)  # the record timestamp fills a missing ts
        table = table.set_column(ts, self.spec.columns.ts, pc.coalesce(table.column(ts), record_ts))
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
