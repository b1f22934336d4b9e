"""The Kafka source adapter: time partitions and live tails as per-topic-partition offset ranges of JSON records.

Each record value is one JSON object (one sample) whose fields are named by the spec's column
mapping; the record timestamp is the event time (epoch ms) and fills ``ts`` when the JSON has
no such field. Time partitions map to offsets through the broker's ``offsets_for_times``, each
answer checked against the records, or by a binary search over record timestamps on a broker
that ignores them (:mod:`.offsets`; said once in the run log). :meth:`KafkaSource.tail` plans
open-ended ranges instead: from committed offsets to the current high watermarks (:mod:`.tail`).
Reads go through confluent-kafka (librdkafka: assign at the planned offset, batched ``consume``)
or, when the spec's ``fetcher`` says so, kafka-python (:mod:`.clients`; no consumer group, no
commits), and decode the values of each batch in one bulk call (:mod:`.decoding`: polars where it
provably reads what ``pyarrow.json`` reads, :mod:`.polars_json`, else ``pyarrow.json``), or,
with ``format: avro``, with fastavro (:mod:`.avro`: an inline schema or a schema registry); undecodable
records are counted, never fatal (a schema registry that does not answer fails the read task). Every
client takes the source's security keys through :mod:`.security` (one rule; the broker is checked
first -- a TCP connect, for a TLS source a handshake -- so a wrong address or certificate fails at
once, naming the broker and the cause).

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
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

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
from primus_dagster.data.sources.kafka.avro import AvroRecordDecoder, SchemaRegistryError
from primus_dagster.data.sources.kafka.clients import (
    KAFKA_PYTHON_PROBE_CONFIG,
    ConfluentClient,
    ConfluentProbe,
    ConfluentRangeReader,
    Fetched,
    KafkaClientError,
    KafkaPythonProbe,
    KafkaPythonRangeReader,
    OffsetOutOfRangeError,
    Probe,
    RangeReader,
)
from primus_dagster.data.sources.kafka.decoding import JsonRecordDecoder
from primus_dagster.data.sources.kafka.offsets import OffsetSearch
from primus_dagster.data.sources.kafka.security import (
    KafkaConfigError,
    client_security_config,
    librdkafka_security_config,
    split_server,
    tls_problem,
)
from primus_dagster.data.sources.kafka.tail import TailOffsetError, TailPlan, plan_tail
from primus_dagster.spec.dataset import granularity_step
from primus_dagster.spec.sources import KafkaSourceSpec

log = logging.getLogger(__name__)

MAX_BAD_EXAMPLES = 10
Fetcher = Literal["confluent-kafka", "kafka-python"]
FETCHERS: tuple[Fetcher, ...] = ("confluent-kafka", "kafka-python")
__all__ = ["FETCHERS", "MAX_BAD_EXAMPLES", "Fetcher", "KafkaConfigError", "KafkaSource"]


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
class _Chunk:
    """Records fetched but not yet decoded: their values, offsets and timestamps (epoch ms), in offset order."""

    values: list[bytes | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.values)

    def extend(self, fetched: Fetched) -> None:
        self.values += fetched.values
        self.offsets += fetched.offsets
        self.timestamps += fetched.timestamps

    def take(self, n: int) -> _Chunk:
        """The first ``n`` records, removed from this chunk."""
        if n >= len(self.values):
            head = _Chunk(self.values, self.offsets, self.timestamps)
            self.values, self.offsets, self.timestamps = [], [], []
            return head
        head = _Chunk(self.values[:n], self.offsets[:n], self.timestamps[:n])
        del self.values[:n], self.offsets[:n], self.timestamps[:n]
        return head


@dataclass
class _Progress:
    """Where a task's read has got to: the next offset to fetch and the records fetched but not yet decoded."""

    position: int
    stop: int
    chunk: _Chunk = field(default_factory=_Chunk)


class KafkaSource(SourceAdapter):
    """Reads a Kafka topic of JSON samples, partitioned hourly/daily by record timestamp, or its live tail.

    Not safe for concurrent use from several threads except :meth:`partitions`, :meth:`tail` and
    :meth:`watermarks` (locked); overlapping :meth:`read` generators get a consumer each.
    ``fetcher`` (default: the spec's ``fetcher``, itself ``confluent-kafka``): the client every probe
    and read of this source goes through, ``"confluent-kafka"`` (librdkafka) or ``"kafka-python"``.

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
        if fetcher not in FETCHERS:
            raise ValueError(f"fetcher must be 'confluent-kafka' (the default) or 'kafka-python', not {fetcher!r}")
        self.poll_timeout_s, self.stall_timeout_s = poll_timeout_s, stall_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.fetcher: Fetcher = fetcher
        self._security: dict[str, Any] | None = None  # kafka-python security kwargs, built on first connect
        # format avro: Avro values (a registry's lookups bounded by connect_timeout_s), else JSON objects
        self._decoder: JsonRecordDecoder | AvroRecordDecoder = (
            AvroRecordDecoder(spec, timeout_s=connect_timeout_s) if spec.format == "avro" else JsonRecordDecoder(spec)
        )
        self.schema = self._decoder.schema
        self._lock = threading.Lock()
        self._probe: Probe | None = None  # the offset search's client (small fetches)
        self._probe_client: Any = None  # what it holds: a ConfluentClient or a KafkaConsumer
        self._readers: list[Any] = []  # idle read clients (poll_max_bytes fetches)
        self._offset_search = OffsetSearch(poll_timeout_s)
        self.stats: dict[str, int] = {"tasks": 0, "records": 0, "rows": 0, "bad_records": 0}

    @property
    def probe_fetches(self) -> int:
        """Fetches issued by the offset search so far (all :meth:`partitions` calls)."""
        return self._offset_search.fetches

    @property
    def broker_timestamps(self) -> bool | None:
        """Whether the broker's ``offsets_for_times`` answers are used (None: not asked yet; False: the
        binary-search fallback, for a broker that ignores record timestamps)."""
        return self._offset_search.broker_timestamps

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
        """The source's kafka-python security keyword arguments (:func:`.security.client_security_config`),
        built once: every kafka-python client shares one SSL context."""
        if self._security is None:
            self._security = client_security_config(self.spec, self.spec.name)
        return self._security

    def _ssl_context(self) -> ssl.SSLContext | None:
        context = self._security_config().get("ssl_context")
        return context if isinstance(context, ssl.SSLContext) else None

    def _check_brokers(self) -> None:
        """A TCP connect (a TLS handshake for a TLS source) to the bootstrap servers; raises when none answers.

        Before any client starts: a kafka-python consumer that fails to bootstrap leaves its IO thread
        running and retries a failed handshake until it times out, librdkafka retries in the background.
        """
        servers = self.bootstrap_servers.split(",")
        problems = [_unreachable(s, self.connect_timeout_s, self._ssl_context()) for s in servers]
        if all(problems):
            tls = [p for p in problems if p and p.startswith("TLS handshake")]
            raise KafkaConfigError(
                f"source {self.spec.name!r}: "
                + ("; ".join(tls) if tls else f"no Kafka broker answers at {self.bootstrap_servers} ({problems[0]})")
            )

    def _unanswered(self, cause: object) -> KafkaConfigError:
        """The error of a broker that accepted the connection but answered nothing (a refused login, a timeout)."""
        spec = self.spec
        sasl = (
            f"; the SASL {spec.sasl_mechanism} login as {spec.sasl_username!r} may have been refused: check the "
            f"user and the password in ${spec.sasl_password_env}"
            if spec.security_protocol.startswith("SASL_")
            else ""
        )
        return KafkaConfigError(
            f"source {spec.name!r}: no Kafka broker answers at {self.bootstrap_servers} ({cause}{sasl})"
        )

    def _consumer(self, **overrides: Any) -> Any:
        """A kafka-python consumer of the source (no group, no commits)."""
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
        config.update(self._security_config())
        unreachable = tuple(e for e in (getattr(errors, "NoBrokersAvailable", None), errors.KafkaTimeoutError) if e)
        self._check_brokers()
        try:
            return KafkaConsumer(**config)
        except unreachable as exc:
            raise self._unanswered(exc) from exc

    def _confluent(self, overrides: dict[str, Any] | None = None) -> ConfluentClient:
        """A librdkafka consumer of the source (assign only: no group joined, no commits)."""
        security = librdkafka_security_config(self.spec, self.spec.name)
        self._check_brokers()
        # librdkafka's ranges: fetch.max.bytes >= message.max.bytes (1 MB) and <= 2^31 - 1 - 512 (a response
        # must fit receive.message.max.bytes), max.partition.fetch.bytes <= 1e9.
        fetch_bytes = min(max(self.spec.poll_max_bytes, 1_000_000), 2**31 - 1 - 512)
        config: dict[str, Any] = {
            "max.partition.fetch.bytes": min(self.spec.poll_max_bytes, 1_000_000_000),
            "fetch.max.bytes": fetch_bytes,
            "receive.message.max.bytes": max(fetch_bytes + 512, 100_000_000),
            **(overrides or {}),
        }
        try:
            return ConfluentClient.connect(
                self.bootstrap_servers, f"primus-{self.spec.name}", security, self.connect_timeout_s, config
            )
        except KafkaClientError as exc:
            raise KafkaConfigError(f"source {self.spec.name!r}: {exc}") from exc

    def _probe_client_locked(self) -> Probe:
        """The offset search's client (call with the lock held)."""
        if self._probe is None:
            topic = self.spec.topic
            if self.fetcher == "confluent-kafka":
                client = self._confluent(dict(ConfluentProbe.PROBE_CONFIG))
                self._probe, self._probe_client = ConfluentProbe(client, topic, self.poll_timeout_s), client
            else:
                consumer = self._consumer(**KAFKA_PYTHON_PROBE_CONFIG)
                self._probe, self._probe_client = KafkaPythonProbe(consumer, topic, self.poll_timeout_s), consumer
        return self._probe

    @contextmanager
    def _probing(self) -> Iterator[Probe]:
        """The offset search's client, under the lock; a broker error while probing names the topic and the cause."""
        with self._lock:
            probe = self._probe_client_locked()
            try:
                yield probe
            except KafkaClientError as exc:
                raise SourceReadError(
                    self.spec.topic, f"listing the offsets of topic {self.spec.topic!r}: {exc}"
                ) from exc

    def _partition_ids(self, probe: Probe) -> list[int] | None:
        """The topic's partition ids (None: no such topic); a broker that answers nothing is a config error."""
        try:
            return probe.partition_ids()
        except KafkaClientError as exc:
            raise self._unanswered(exc) from exc

    def partitions(self, window: TimeWindow) -> list[Partition]:
        """Offset ranges of each hour/day partition overlapping ``window`` (:mod:`.offsets`)."""
        step = granularity_step(self.spec.granularity)
        starts = window.partition_starts(self.spec.granularity)
        bounds = [int(t.timestamp() * 1000) for t in [*starts, starts[-1] + step]]
        topic = self.spec.topic
        with self._probing() as probe:
            ids = self._partition_ids(probe)
            if not ids:
                return [
                    Partition(self.spec.name, s, s + step, False, topic, reason=f"topic {topic!r} does not exist")
                    for s in starts
                ]
            offsets: dict[int, list[int]] = {}
            last_ts: dict[int, int | None] = {}
            for p in ids:
                offsets[p], last_ts[p] = self._offset_search.boundary_offsets(probe, p, bounds)
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

        The listed end offset is not used for the watermark: some brokers (tansu) under-report it by up to a batch.
        """
        topic = self.spec.topic
        with self._probing() as probe:
            ids = self._partition_ids(probe)
            if not ids:
                raise SourceReadError(topic, f"topic {topic!r} does not exist")
            out = {}
            for p in ids:
                begin, high, _ = self._offset_search.tail(probe, p)
                out[p] = (begin, high)
        return out

    def high_watermarks(self) -> dict[int, int]:
        """``{kafka partition: high watermark}`` now: the offset the next produced record will get."""
        return {p: high for p, (_, high) in self.watermarks().items()}

    def offsets_at(self, moment: datetime) -> dict[int, int]:
        """``{kafka partition: first offset whose record timestamp is at or after moment}`` (the high
        watermark where every record is older): where a reader that has everything before ``moment``
        continues."""
        bound = int(moment.timestamp() * 1000)
        with self._probing() as probe:
            ids = self._partition_ids(probe)
            if not ids:
                raise SourceReadError(self.spec.topic, f"topic {self.spec.topic!r} does not exist")
            return {p: self._offset_search.boundary_offsets(probe, p, [bound])[0][0] for p in ids}

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

    def _read_client(self) -> Any:
        """An idle read client from the pool, or a new one (a ConfluentClient or a kafka-python consumer)."""
        with self._lock:
            if self._readers:
                return self._readers.pop()
        if self.fetcher == "confluent-kafka":
            return self._confluent()
        return self._consumer(max_poll_records=min(self.spec.batch_rows, 65536))

    def _range_reader(self, task: ReadTask, client: Any, topic: str, partition: int) -> RangeReader:
        """A reader of ``[task.start, task.stop)`` on ``client``; offsets deleted by retention raise at once."""
        start, stop = task.start, int(task.stop or 0)
        if isinstance(client, ConfluentClient):
            begin = client.watermarks(topic, partition)[0]
        else:
            from kafka import TopicPartition

            tp = TopicPartition(topic, partition)
            client.assign([tp])
            begin = client.beginning_offsets([tp])[tp]
        if start < begin:
            raise SourceReadError(
                task.uri, f"offsets {start}..{begin} were deleted (retention); the range cannot be read exactly once"
            )
        if isinstance(client, ConfluentClient):
            return ConfluentRangeReader(client, topic, partition, start, stop)
        return KafkaPythonRangeReader(client, topic, partition, start, stop)

    def _release(self, held: Any, ok: bool) -> None:
        """Back to the pool when healthy, else closed."""
        if ok:
            with self._lock:
                self._readers.append(held)
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
        except OffsetOutOfRangeError as exc:
            raise SourceReadError(
                task.uri, f"offset out of range after {stats['records']} records (retention, or past the end): {exc}"
            ) from exc
        except (KafkaError, KafkaClientError) as exc:
            raise SourceReadError(task.uri, f"Kafka error after {stats['records']} records: {exc}") from exc
        except (SchemaMismatchError, SchemaRegistryError) as exc:
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
        topic, _, p = task.uri.rpartition(":")
        if task.stop is None:
            raise SourceReadError(task.uri, "a Kafka read task needs a stop offset")
        progress = _Progress(task.start, task.stop)
        if progress.position >= progress.stop:
            return
        client = self._read_client()
        ok = False
        try:
            reader = self._range_reader(task, client, topic, int(p))
            yield from self._read_range(task, reader, progress, stats)
            reader.close()
            ok = True
        finally:
            self._release(client, ok)

    def _read_range(
        self, task: ReadTask, reader: RangeReader, progress: _Progress, stats: dict[str, Any]
    ) -> Iterator[pa.RecordBatch]:
        """Fetch from ``progress.position`` to the stop, decoding every ``batch_rows`` records (and the rest).

        Every wait is bounded: each fetch by ``poll_timeout_s``, a task without progress by ``stall_timeout_s``.
        """
        batch_rows, stop = self.spec.batch_rows, progress.stop
        deadline = time.monotonic() + self.stall_timeout_s
        while progress.position < stop:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SourceReadError(
                    task.uri,
                    f"no records after offset {progress.position} in {self.stall_timeout_s:.0f}s "
                    f"(stop {stop}, high watermark {reader.high_watermark()})",
                )
            want = batch_rows - len(progress.chunk)  # a fetch fills the batch being built, never more
            fetched = reader.fetch(progress.position, want, min(self.poll_timeout_s, left))
            if fetched.next_offset <= progress.position:
                continue
            progress.chunk.extend(fetched)
            progress.position, deadline = fetched.next_offset, time.monotonic() + self.stall_timeout_s
            while len(progress.chunk) >= batch_rows:
                yield from self._decode(task, progress.chunk.take(batch_rows), stats)
        if progress.chunk:
            yield from self._decode(task, progress.chunk.take(len(progress.chunk)), stats)

    def _decode(self, task: ReadTask, chunk: _Chunk, stats: dict[str, Any]) -> Iterator[pa.RecordBatch]:
        """Bulk-decode one chunk of records, count the undecodable ones, and yield the rest normalised."""
        offsets = chunk.offsets
        table, bad = self._decoder.decode(chunk.values, chunk.timestamps)
        for counter in (stats, self.stats):
            counter["records"] += len(chunk)
            counter["bad_records"] += len(bad)
        if bad:  # skipped whatever the policy; counted beside the quality rules
            self.normalize.counts["undecodable_record"] += len(bad)
        room = max(MAX_BAD_EXAMPLES - len(stats["bad_examples"]), 0)
        stats["bad_examples"] += [{"offset": offsets[i], "error": err} for i, err in bad[:room]]
        if table is None:
            return
        where = f"{task.uri}@{offsets[0]}-{offsets[-1]}"
        for batch in table.to_batches():
            out = self.normalize(batch, where=where, partition=task.event_partition)
            stats["rows"] += out.num_rows
            self.stats["rows"] += out.num_rows
            yield out

    def close(self) -> None:
        """Close the cached consumers."""
        with self._lock:
            held = [self._probe_client, *self._readers]
            self._probe, self._probe_client, self._readers = None, None, []
        for item in held:
            if item is not None:
                item.close()
