"""The Kafka source adapter: time partitions and live tails as per-topic-partition offset ranges of JSON records.

Each record value is one JSON object (one sample) whose fields are named by the spec's column
mapping; the record timestamp is the event time (epoch ms) and fills ``ts`` when the JSON has
no such field. Time partitions map to offsets by a binary search over record timestamps
(:mod:`.offsets`), which assumes timestamps are **non-decreasing within a topic-partition**.
:meth:`KafkaSource.tail` plans open-ended ranges instead: from committed offsets to the current
high watermarks (:mod:`.tail`). Reads fetch record batches straight from the partition leaders
(:mod:`.wire`, no consumer group, no commits), or through kafka-python when the broker speaks
none of the native client's protocol versions or the source uses SASL, and decode values in bulk
(:mod:`.decoding`); undecodable records are counted, never fatal. Every client takes the source's
security keys through :mod:`.security` (one rule; a TLS source shakes hands before a consumer starts,
so a certificate problem fails at once, naming the broker and the cause).

Example::

    with KafkaSource(spec, SourceContext(kafka_bootstrap_servers="127.0.0.1:9092")) as src:
        part = src.partition(datetime(2026, 11, 29, 10, tzinfo=timezone.utc))
        batches = [b for t in src.split(part) for b in src.read(t)]
        plan = src.tail({0: 1200, 1: 1187})          # committed offsets -> tasks up to the high watermarks
        plan.lag, [b for t in plan.tasks for b in src.read(t)]
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Protocol

import pyarrow as pa

from primus_dagster.broker_discovery import KAFKA_ENV, default_bootstrap_servers
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
from primus_dagster.data.sources.kafka.protocol import OFFSET_OUT_OF_RANGE
from primus_dagster.data.sources.kafka.records import CorruptBatchError, LegacyFormatError, RecordColumns
from primus_dagster.data.sources.kafka.security import (
    KafkaConfigError,
    client_security_config,
    split_server,
    tls_problem,
)
from primus_dagster.data.sources.kafka.tail import TailOffsetError, TailPlan, plan_tail
from primus_dagster.data.sources.kafka.wire import Fetched, PartitionReader, WireClient, WireError, WireUnsupportedError
from primus_dagster.spec.dataset import granularity_step
from primus_dagster.spec.sources import KafkaSourceSpec

log = logging.getLogger(__name__)

MAX_BAD_EXAMPLES = 10
Fetcher = Literal["native", "kafka-python"]
__all__ = ["MAX_BAD_EXAMPLES", "Fetcher", "KafkaConfigError", "KafkaSource"]
_TOLD_SASL: set[str] = set()  # sources whose switch to kafka-python for SASL was logged (once a process)


def _unreachable(server: str, timeout_s: float, context: ssl.SSLContext | None) -> str | None:
    """Why ``server`` cannot be used (no TCP connection; with ``context``, a failed TLS handshake), or None."""
    if context is not None:
        return tls_problem(server, context, timeout_s)
    try:
        socket.create_connection(split_server(server), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        return f"{server.strip()}: {exc}"
    return None


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat()


@dataclass
class _Progress:
    """Where a task's read has got to: the next offset to fetch and the records fetched but not yet decoded."""

    position: int
    stop: int
    chunk: RecordColumns = field(default_factory=RecordColumns)


class _RangeReader(Protocol):
    def fetch(self, offset: int) -> Fetched: ...

    def close(self) -> None: ...


class _PollReader:
    """The kafka-python read path: ``assign`` + ``seek`` + ``poll``, capped so nothing past ``stop`` is unpacked."""

    def __init__(self, consumer: Any, tp: Any, start: int, stop: int, poll_timeout_s: float, max_records: int):
        self.consumer, self.tp, self.stop = consumer, tp, stop
        self.poll_ms, self.max_records = int(poll_timeout_s * 1000), max_records
        consumer.assign([tp])
        consumer.seek(tp, start)
        self.position = start

    def fetch(self, offset: int) -> Fetched:
        if offset != self.position:
            self.consumer.seek(self.tp, offset)
        # max_records: kafka-python unpacks records lazily, so none past the stop is turned into an object.
        limit = max(1, min(self.stop - offset, self.max_records))
        records = self.consumer.poll(timeout_ms=self.poll_ms, max_records=limit).get(self.tp, [])
        if records and records[-1].offset >= self.stop:  # offsets can skip (compaction, transaction markers)
            records = [r for r in records if r.offset < self.stop]
            next_offset = self.stop
        elif records:
            next_offset = records[-1].offset + 1
        else:
            next_offset = max(offset, min(self.consumer.position(self.tp), self.stop))
        self.position = next_offset
        columns = RecordColumns([r.value for r in records], [r.offset for r in records], [r.timestamp for r in records])
        return Fetched(columns, next_offset, self.consumer.highwater(self.tp))

    def close(self) -> None:
        return None


class KafkaSource(SourceAdapter):
    """Reads a Kafka topic of JSON samples, partitioned hourly/daily by record timestamp, or its live tail.

    Not safe for concurrent use from several threads except :meth:`partitions`, :meth:`tail` and
    :meth:`watermarks` (locked); overlapping :meth:`read` generators get a connection each.
    ``fetcher`` (default: the spec's ``fetcher``, itself ``native``): ``"native"`` reads with
    :class:`.wire.WireClient` and falls back to kafka-python when the broker speaks none of its
    versions; ``"kafka-python"`` forces the fallback.

    Example::

        with KafkaSource(spec, SourceContext(kafka_bootstrap_servers="127.0.0.1:9092")) as src:
            part = src.partition(datetime(2026, 11, 29, 10, tzinfo=timezone.utc))
            part.detail["offsets"]                 # {"0": [120, 480], "1": [97, 455]}
            batches = [b for t in src.split(part) for b in src.read(t)]  # canonical Arrow batches
            src.last_read_stats["bad_records"]     # undecodable records skipped in the last task
            src.high_watermarks()                  # {0: 1250, 1: 1190}
            plan = src.tail({0: 1200, 1: 1187})    # TailPlan: tasks [1200, 1250) and [1187, 1190), lag
    """

    spec: KafkaSourceSpec

    def __init__(
        self,
        spec: KafkaSourceSpec,
        context: SourceContext,
        poll_timeout_s: float = 5.0,
        stall_timeout_s: float = 30.0,
        connect_timeout_s: float = 20.0,
        fetcher: Fetcher | None = None,
    ):
        super().__init__(spec, context)
        fetcher = fetcher or spec.fetcher
        if fetcher not in ("native", "kafka-python"):
            raise ValueError(f"fetcher must be 'native' or 'kafka-python', not {fetcher!r}")
        self.poll_timeout_s, self.stall_timeout_s = poll_timeout_s, stall_timeout_s
        self.connect_timeout_s = connect_timeout_s
        if fetcher == "native" and spec.security_protocol.startswith("SASL_"):
            if spec.name not in _TOLD_SASL:
                _TOLD_SASL.add(spec.name)
                log.info(
                    "source %r: security_protocol %s: reading through kafka-python (the native fetch client "
                    "speaks PLAINTEXT and SSL, not SASL)",
                    spec.name,
                    spec.security_protocol,
                )
            fetcher = "kafka-python"
        self.fetcher: Fetcher = fetcher
        self._security: dict[str, Any] | None = None  # kafka-python security kwargs, built on first connect
        self._decoder = JsonRecordDecoder(spec)
        self.schema = self._decoder.schema
        self._lock = threading.Lock()
        self._probe: Any = None  # KafkaConsumer for offset search (small fetches)
        self._readers: list[Any] = []  # idle kafka-python consumers for reads (poll_max_bytes fetches)
        self._wires: list[WireClient] = []  # idle native clients
        self._offset_search = OffsetSearch(poll_timeout_s)
        self.stats: dict[str, int] = {"tasks": 0, "records": 0, "rows": 0, "bad_records": 0}

    @property
    def probe_fetches(self) -> int:
        """Fetches issued by the offset search so far (all :meth:`partitions` calls)."""
        return self._offset_search.fetches

    @property
    def bootstrap_servers(self) -> str:
        # One resolution for every entry point: the source, the caller's context, then the environment
        # ($PRIMUS_KAFKA_BOOTSTRAP_SERVERS) and a running embedded broker (broker_discovery).
        servers = self.spec.bootstrap_servers or self.context.kafka_bootstrap_servers or default_bootstrap_servers()
        if not servers:
            raise KafkaConfigError(
                f"source {self.spec.name!r}: no Kafka bootstrap servers: set `bootstrap_servers` on the source, "
                f"pass --kafka-bootstrap / configure the Kafka resource, or set {KAFKA_ENV} "
                "(no embedded broker is running either: `primus-dagster-dev broker --detach` starts one)"
            )
        return servers

    def _security_config(self) -> dict[str, Any]:
        """The source's security keyword arguments (:func:`.security.client_security_config`), built once:
        every client shares one SSL context."""
        if self._security is None:
            self._security = client_security_config(self.spec, self.spec.name)
        return self._security

    def _ssl_context(self) -> ssl.SSLContext | None:
        context = self._security_config().get("ssl_context")
        return context if isinstance(context, ssl.SSLContext) else None

    def _new_wire(self, timeout_s: float) -> WireClient:
        servers = self.bootstrap_servers.split(",")
        return WireClient(servers, f"primus-{self.spec.name}", timeout_s=timeout_s, ssl_context=self._ssl_context())

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
        security = self._security_config()
        config.update(security)
        unreachable = tuple(e for e in (getattr(errors, "NoBrokersAvailable", None), errors.KafkaTimeoutError) if e)
        # A TCP check first (a TLS handshake for a TLS source): a KafkaConsumer that fails to bootstrap
        # leaves its IO thread running, and kafka-python retries a failed handshake until it times out.
        problems = [_unreachable(s, self.connect_timeout_s, self._ssl_context()) for s in config["bootstrap_servers"]]
        if all(problems):
            tls = [p for p in problems if p and p.startswith("TLS handshake")]
            raise KafkaConfigError(
                f"source {self.spec.name!r}: "
                + ("; ".join(tls) if tls else f"no Kafka broker answers at {self.bootstrap_servers} ({problems[0]})")
            )
        try:
            return KafkaConsumer(**config)
        except unreachable as exc:
            spec = self.spec
            sasl = (
                f"; the SASL {spec.sasl_mechanism} login as {spec.sasl_username!r} may have been refused: check the "
                f"user and the password in ${spec.sasl_password_env}"
                if spec.security_protocol.startswith("SASL_")
                else ""
            )
            raise KafkaConfigError(
                f"source {spec.name!r}: no Kafka broker answers at {self.bootstrap_servers} ({exc}{sasl})"
            ) from exc

    def _probe_consumer(self) -> Any:
        """The offset-search consumer (call with the lock held)."""
        if self._probe is None:
            self._probe = self._consumer(**PROBE_CONSUMER_CONFIG)
            if self.fetcher == "native" and self._offset_search.wire is None:
                self._offset_search.wire = self._new_wire(timeout_s=30.0)
        return self._probe

    def partitions(self, window: TimeWindow) -> list[Partition]:
        """Offset ranges of each hour/day partition overlapping ``window`` (O(log N) fetches each)."""
        from kafka import TopicPartition

        step = granularity_step(self.spec.granularity)
        starts = window.partition_starts(self.spec.granularity)
        bounds = [int(t.timestamp() * 1000) for t in [*starts, starts[-1] + step]]
        topic = self.spec.topic
        with self._lock:
            self._probe_consumer()
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

    # -- live tails ------------------------------------------------------------------------------------

    def watermarks(self) -> dict[int, tuple[int, int]]:
        """``{kafka partition: (first retained offset, high watermark)}`` now; the watermark comes from a fetch.

        ``end_offsets`` is not used for the watermark: some brokers (tansu) under-report it by up to a batch.
        """
        from kafka import TopicPartition

        topic = self.spec.topic
        with self._lock:
            probe = self._probe_consumer()
            ids = probe.partitions_for_topic(topic)
            if not ids:
                raise SourceReadError(topic, f"topic {topic!r} does not exist")
            out = {}
            for p in sorted(ids):
                begin, high, _ = self._offset_search.tail(probe, TopicPartition(topic, p))
                out[p] = (begin, high)
        return out

    def high_watermarks(self) -> dict[int, int]:
        """``{kafka partition: high watermark}`` now: the offset the next produced record will get."""
        return {p: high for p, (_, high) in self.watermarks().items()}

    def offsets_at(self, moment: datetime) -> dict[int, int]:
        """``{kafka partition: first offset whose record timestamp is at or after moment}`` (the high
        watermark where every record is older): where a reader that has everything before ``moment``
        continues."""
        from kafka import TopicPartition

        bound = int(moment.timestamp() * 1000)
        with self._lock:
            probe = self._probe_consumer()
            ids = probe.partitions_for_topic(self.spec.topic)
            if not ids:
                raise SourceReadError(self.spec.topic, f"topic {self.spec.topic!r} does not exist")
            return {
                p: self._offset_search.boundary_offsets(probe, TopicPartition(self.spec.topic, p), [bound])[0][0]
                for p in sorted(ids)
            }

    def tail(
        self,
        from_offsets: dict[int, int] | None = None,
        max_records_per_partition: int | None = None,
        skip_deleted: bool = False,
        until: dict[int, int] | None = None,
        planned_at: datetime | None = None,
    ) -> TailPlan:
        """Plan reading from ``from_offsets`` (committed offsets; default: the first retained) to the high watermarks.

        The stops are fixed now: re-reading a planned task reads exactly the same records, and
        records produced after planning are left to the next tail. ``until`` caps the stops (the
        stops of an earlier plan: re-planning a killed run's tail reads the same records) and
        ``planned_at`` (default now) is the time the plan is dated. See :func:`.tail.plan_tail` for
        the offset checks (:class:`.tail.TailOffsetError`) and ``skip_deleted``.
        """
        marks = self.watermarks()
        begins, highs = {p: b for p, (b, _) in marks.items()}, {p: h for p, (_, h) in marks.items()}
        if until is not None:
            short = {p: (stop, highs[p]) for p, stop in until.items() if p in highs and stop > highs[p]}
            if short:
                raise TailOffsetError(
                    f"topic {self.spec.topic!r}: planned stops past the high watermarks {short} "
                    "(was the topic re-created?)"
                )
            highs = {p: min(h, until.get(p, h)) for p, h in highs.items()}
        return plan_tail(
            self.spec.name,
            self.spec.topic,
            begins,
            highs,
            from_offsets,
            self.spec.max_records_per_task,
            planned_at or datetime.now(timezone.utc),
            self.spec.granularity,
            max_records_per_partition=max_records_per_partition,
            skip_deleted=skip_deleted,
        )

    def tail_tasks(self, from_offsets: dict[int, int] | None = None) -> list[ReadTask]:
        """The read tasks of :meth:`tail` (offsets ``[committed, high watermark)``, split to ``max_records_per_task``)."""
        return self.tail(from_offsets).tasks

    def lag(self, from_offsets: dict[int, int] | None = None) -> dict[int, int]:
        """``{kafka partition: records between the committed offset and the high watermark}``."""
        return self.tail(from_offsets).lag

    # -- reads -----------------------------------------------------------------------------------------

    def _wire(self) -> WireClient:
        with self._lock:
            if self._wires:
                return self._wires.pop()
        return self._new_wire(timeout_s=30.0)

    def _kafka_python(self) -> Any:
        with self._lock:
            if self._readers:
                return self._readers.pop()
        return self._consumer(max_poll_records=min(self.spec.batch_rows, 65536))

    def _range_reader(self, task: ReadTask, tp: Any, start: int, stop: int, native: bool) -> tuple[_RangeReader, Any]:
        """A reader of ``[start, stop)`` and the pooled connection it holds (returned by :meth:`_release`)."""
        if native:
            wire = self._wire()
            reader = PartitionReader(
                wire, tp.topic, tp.partition, stop, self.spec.poll_max_bytes, retry_s=self.stall_timeout_s
            )
            return reader, wire
        consumer = self._kafka_python()
        consumer.assign([tp])
        begin = consumer.beginning_offsets([tp])[tp]
        if start < begin:
            self._release(consumer, ok=True)
            raise SourceReadError(
                task.uri, f"offsets {start}..{begin} were deleted (retention); the range cannot be read exactly once"
            )
        return _PollReader(consumer, tp, start, stop, self.poll_timeout_s, self.spec.batch_rows), consumer

    def _release(self, held: Any, ok: bool) -> None:
        """Back to the pool when healthy, else closed."""
        if ok:
            with self._lock:
                (self._wires if isinstance(held, WireClient) else self._readers).append(held)
        else:
            held.close()

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
        except (KafkaError, WireError) as exc:
            raise SourceReadError(task.uri, f"Kafka error after {stats['records']} records: {exc}") from exc
        except CorruptBatchError as exc:
            raise SourceReadError(task.uri, f"corrupt record batch after {stats['records']} records: {exc}") from exc
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
        native = self.fetcher == "native"
        progress = _Progress(task.start, stop)
        while progress.position < stop:
            reader, held = self._range_reader(task, tp, progress.position, stop, native)
            ok = False
            try:
                yield from self._read_range(task, reader, progress, stats)
                ok = True
            except WireUnsupportedError as exc:
                log.info("%s: %s; reading through kafka-python", task.uri, exc)
                self.fetcher, native = "kafka-python", False
            except LegacyFormatError as exc:
                log.info("%s: %s; reading this task through kafka-python", task.uri, exc)
                native = False
            except WireError as exc:
                if exc.code == OFFSET_OUT_OF_RANGE and 0 <= progress.position < exc.log_start:
                    raise SourceReadError(
                        task.uri,
                        f"offsets {progress.position}..{exc.log_start} were deleted (retention); "
                        "the range cannot be read exactly once",
                    ) from exc
                raise
            finally:
                reader.close()
                self._release(held, ok)
        while progress.chunk:
            yield from self._decode(task, progress.chunk.take(self.spec.batch_rows), stats)

    def _read_range(
        self, task: ReadTask, reader: _RangeReader, progress: _Progress, stats: dict[str, Any]
    ) -> Iterator[pa.RecordBatch]:
        """Fetch from ``progress.position`` to the stop into ``progress.chunk``, decoding every full ``batch_rows``.

        ``progress`` survives an exception, so another reader can continue where this one stopped.
        """
        batch_rows, last_progress, stop = self.spec.batch_rows, time.monotonic(), progress.stop
        while progress.position < stop:
            fetched = reader.fetch(progress.position)
            if fetched.next_offset <= progress.position:
                if time.monotonic() - last_progress > self.stall_timeout_s:
                    raise SourceReadError(
                        task.uri,
                        f"no records after offset {progress.position} in {self.stall_timeout_s:.0f}s "
                        f"(stop {stop}, high watermark {fetched.high_watermark})",
                    )
                continue
            progress.chunk.extend(fetched.columns)
            progress.position, last_progress = fetched.next_offset, time.monotonic()
            while len(progress.chunk) >= batch_rows:
                yield from self._decode(task, progress.chunk.take(batch_rows), stats)

    def _decode(self, task: ReadTask, records: RecordColumns, stats: dict[str, Any]) -> Iterator[pa.RecordBatch]:
        """Bulk-decode one chunk of records, count the undecodable ones, and yield the rest normalised."""
        table, bad = self._decoder.decode(records.values, records.timestamps)
        for counter in (stats, self.stats):
            counter["records"] += len(records)
            counter["bad_records"] += len(bad)
        if bad:  # skipped whatever the policy; counted beside the quality rules
            self.normalize.counts["undecodable_record"] += len(bad)
        room = max(MAX_BAD_EXAMPLES - len(stats["bad_examples"]), 0)
        stats["bad_examples"] += [{"offset": records.offsets[i], "error": err} for i, err in bad[:room]]
        if table is None:
            return
        where = f"{task.uri}@{records.offsets[0]}-{records.offsets[-1]}"
        for batch in table.to_batches():
            out = self.normalize(batch, where=where, partition=task.event_partition)
            stats["rows"] += out.num_rows
            self.stats["rows"] += out.num_rows
            yield out

    def close(self) -> None:
        """Close the cached consumers and connections."""
        with self._lock:
            held = [self._probe, self._offset_search.wire, *self._readers, *self._wires]
            self._probe, self._offset_search.wire, self._readers, self._wires = None, None, [], []
        for item in held:
            if item is not None:
                item.close()
