"""The two Kafka clients a source reads through: confluent-kafka (librdkafka, the default) and kafka-python.

Each client gives the adapter two things of the same shape:

* a **probe** (:class:`ConfluentProbe`, :class:`KafkaPythonProbe`) for the offset search (:mod:`.offsets`)
  and the tails (:mod:`.tail`): the topic's partition ids, the listed first / end offsets, one small
  fetch of ``(offset, timestamp)`` pairs with the high watermark that fetch reported (the true one:
  tansu under-reports ``ListOffsets(latest)`` by up to a batch), and ``offsets_for_times``;
* a **range reader** (:class:`ConfluentRangeReader`, :class:`KafkaPythonRangeReader`): assign + seek to
  the planned start, then bounded batched reads (librdkafka's ``consume(num_messages, timeout)``,
  kafka-python's ``poll(max_records)``) of at most the records left before the stop; whatever a fetch
  returns past the stop is dropped. The values, offsets and timestamps are taken out of the client's
  record objects (C-level ``map`` calls) with Python's cyclic collector paused (:class:`GcPause`), the
  record objects dropped, and the values handed to one bulk decode per batch (:mod:`.decoding`).

No consumer group is joined and nothing is committed (librdkafka wants a ``group.id``; with ``assign``
and no commits it is only a name): the offsets are the driver's. Every wait is bounded (a timeout on each
call; the adapter's stall deadline over a task). librdkafka's log goes to this module's logger, its
errors (a refused SASL login, a TLS failure) are kept and named when a call times out.

Example::

    client = ConfluentClient.connect(servers, "primus-clicks", security={}, connect_timeout_s=10)
    probe = ConfluentProbe(client, "clicks", poll_timeout_s=5)
    probe.partition_ids(), probe.list_offsets(0), probe.fetch(0, 120), probe.highwater(0)
    reader = ConfluentRangeReader(client, "clicks", 0, start=120, stop=480)
    fetched = reader.fetch(120, want=64, timeout_s=5)   # Fetched(values, offsets, timestamps, next_offset)
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, ClassVar, Protocol

log = logging.getLogger(__name__)
#: librdkafka's own log lines (connection retries, TLS and SASL failures), at debug level here.
rdkafka_log = logging.getLogger(f"{__name__}.librdkafka")

# Probes only need offsets and timestamps: small fetches, and no CRC pass over whole batches.
PROBE_RECORDS = 64
PROBE_FETCH_BYTES = 64 * 1024
# What a read takes out of each record object, without a Python-level loop.
_SECOND = itemgetter(1)  # of librdkafka's (timestamp type, timestamp)
_VALUE, _OFFSET, _TIMESTAMP = attrgetter("value"), attrgetter("offset"), attrgetter("timestamp")  # kafka-python's
KAFKA_PYTHON_PROBE_CONFIG: dict[str, Any] = dict(
    max_poll_records=PROBE_RECORDS,
    fetch_max_wait_ms=100,
    fetch_max_bytes=PROBE_FETCH_BYTES,
    max_partition_fetch_bytes=PROBE_FETCH_BYTES,
    check_crcs=False,
)


class GcPause:
    """Process-wide pauses of Python's cyclic garbage collector, nested and shared by threads.

    Measured reason: a librdkafka ``consume`` of 65 536 records builds 65 536 ``Message`` objects the
    collector tracks, and every collection it triggers meanwhile walks the young objects, and now and then
    the whole heap. On bench/source_scan.py's topic, consuming and taking the values out cost markedly less
    CPU a record paused than with the collector running -- more so in a process that has also imported
    torch, and most when the records are dropped inside the pause rather than outliving it (figures in
    docs/data_plane.md, "Measured reasons in the code") -- the collector being the largest single cost of a
    read after the JSON decode. The readers take what they need out of the records and
    drop them before the pause ends, so the collector never sees them. Nothing allocated while paused
    forms a reference cycle the adapter keeps; the collector runs again at its next threshold.
    It is enabled again when the last pause ends, and only if it was enabled when the first began
    (a caller's ``gc.disable()`` is kept). A pause lasts one ``consume`` / ``poll`` call and the copying
    after it: at most the source's ``poll_timeout_s`` where the broker has nothing to send.

    Example::

        with GC_PAUSE.paused():
            messages = consumer.consume(num_messages=65536, timeout=5)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The collector off for the ``with`` block (and any pause overlapping it in another thread)."""
        with self._lock:
            if not self._depth:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if not self._depth and self._was_enabled:
                    gc.enable()


GC_PAUSE = GcPause()


class KafkaClientError(RuntimeError):
    """A broker or client error during a read or a probe (the message names the partition and the cause)."""


class TimestampLookupUnsupported(KafkaClientError):
    """The client or the broker cannot answer ``offsets_for_times`` (an old broker, a failed request)."""


class OffsetOutOfRangeError(KafkaClientError):
    """The planned offset is no longer (or not yet) in the partition: deleted by retention, or past its end."""


@dataclass
class Fetched:
    """One bounded read: the values, offsets and timestamps (epoch ms) of the records below the stop, in
    offset order, and the next offset to read (past skipped offsets: compaction, transaction markers)."""

    values: list[bytes | None]
    offsets: list[int]
    timestamps: list[int]
    next_offset: int

    @classmethod
    def empty(cls, next_offset: int) -> Fetched:
        return cls([], [], [], next_offset)


class RangeReader(Protocol):
    """Reads ``[start, stop)`` of one topic-partition (see the module docstring)."""

    def fetch(self, offset: int, want: int, timeout_s: float) -> Fetched: ...

    def high_watermark(self) -> int | None: ...

    def close(self) -> None: ...


class Probe(Protocol):
    """What :class:`.offsets.OffsetSearch` asks of a client, for one topic."""

    topic: str

    def partition_ids(self) -> list[int] | None: ...

    def list_offsets(self, partition: int) -> tuple[int, int]: ...

    def fetch(self, partition: int, offset: int) -> list[tuple[int, int]]: ...

    def highwater(self, partition: int) -> int | None: ...

    def offsets_for_times(self, partition: int, ts_ms: int) -> int | None: ...


# -- confluent-kafka (librdkafka) ----------------------------------------------------------------------------


class ConfluentClient:
    """One librdkafka consumer (assign only, never subscribed or committed) and the errors it reported.

    ``connect`` only builds it (librdkafka connects in the background); the adapter checks the
    broker answers first (:func:`.security.tls_problem` / a TCP connect), so a wrong address or CA fails at once.
    """

    def __init__(self, consumer: Any, servers: str, timeout_s: float) -> None:
        self.consumer, self.servers, self.timeout_s = consumer, servers, timeout_s
        self.errors: list[str] = []  # the last few errors librdkafka reported (error_cb)
        self._lock = threading.Lock()

    @classmethod
    def connect(
        cls,
        servers: str,
        client_id: str,
        security: dict[str, str],
        connect_timeout_s: float,
        overrides: dict[str, Any] | None = None,
    ) -> ConfluentClient:
        """A consumer of ``servers`` with ``security`` (:func:`.security.librdkafka_security_config`)."""
        from confluent_kafka import Consumer

        holder: list[ConfluentClient] = []

        def on_error(err: Any) -> None:  # librdkafka's thread: keep the cause for a clear message
            if holder:
                holder[0]._record(str(err.str() if hasattr(err, "str") else err))

        timeout_ms = max(1000, int(connect_timeout_s * 1000))
        config: dict[str, Any] = {
            "bootstrap.servers": servers,
            "group.id": client_id,
            "client.id": client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",  # a planned offset that is gone is an error, never silently moved
            "allow.auto.create.topics": False,
            "fetch.wait.max.ms": 10,  # at a partition's end: tansu answers a connection's requests in turn
            "socket.connection.setup.timeout.ms": timeout_ms,
            "socket.timeout.ms": max(timeout_ms, 10_000),
            "log.connection.close": False,
            "error_cb": on_error,
            "logger": rdkafka_log,
            **(overrides or {}),
            **security,
        }
        from confluent_kafka import KafkaException

        try:
            consumer = Consumer(config)
        except KafkaException as exc:  # a setting librdkafka refuses (the message names it, never its value)
            raise KafkaClientError(
                f"librdkafka refused the consumer settings: {exc.args[0] if exc.args else exc}"
            ) from exc
        client = cls(consumer, servers, connect_timeout_s)
        holder.append(client)
        return client

    def _record(self, message: str) -> None:
        with self._lock:
            self.errors = [*self.errors[-4:], message]

    def last_error(self) -> str | None:
        """The last error librdkafka reported (a refused login, a failed handshake), if any."""
        with self._lock:
            return self.errors[-1] if self.errors else None

    def partition_ids(self, topic: str) -> list[int] | None:
        """The topic's partition ids (None: no such topic); raises :class:`KafkaClientError` when no broker answers."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            metadata = self.consumer.list_topics(topic, timeout=self.timeout_s)
        except KafkaException as exc:
            cause = self.last_error() or str(exc.args[0] if exc.args else exc)
            raise KafkaClientError(cause) from exc
        found = metadata.topics.get(topic)
        if found is None or (found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        if found.error is not None:
            raise KafkaClientError(f"topic {topic!r}: {found.error.str()}")
        return sorted(found.partitions) or None

    def watermarks(self, topic: str, partition: int, cached: bool = False) -> tuple[int, int]:
        """``(low, high)`` from the broker (``cached``: as the last fetch response reported them)."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.timeout_s, cached=cached
            )
        except KafkaException as exc:
            raise KafkaClientError(f"{topic}:{partition}: listing offsets failed: {exc.args[0]}") from exc
        return int(low), int(high)

    def close(self) -> None:
        self.consumer.close()


def _message_error(topic: str, partition: int, err: Any) -> KafkaClientError:
    from confluent_kafka import KafkaError

    text = f"{topic}:{partition}: {err.str()}"
    if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        return OffsetOutOfRangeError(text)
    return KafkaClientError(text)


def _split_messages(topic: str, partition: int, messages: list[Any]) -> tuple[list[Any], int | None]:
    """The data messages of a ``consume`` answer and the end offset of a partition-EOF event among them."""
    from confluent_kafka import KafkaError, Message

    if not any(map(Message.error, messages)):  # the common case, checked without a Python loop
        return messages, None
    data, eof = [], None
    for m in messages:
        err = m.error()
        if err is None:
            data.append(m)
        elif err.code() == KafkaError._PARTITION_EOF:
            eof = m.offset()
        else:
            raise _message_error(topic, partition, err)
    return data, eof


class ConfluentProbe:
    """The offset search's client on librdkafka: small fetches through a consumer that queues few records."""

    # Few records queued, no back-off before the next fetch (librdkafka's default waits 1 s once the
    # queue is full), and short broker-side waits: a probe at the partition's end answers at once.
    PROBE_CONFIG: ClassVar[dict[str, Any]] = {
        "max.partition.fetch.bytes": PROBE_FETCH_BYTES,
        "queued.min.messages": PROBE_RECORDS,
        "fetch.queue.backoff.ms": 0,
        "fetch.wait.max.ms": 10,
    }

    def __init__(self, client: ConfluentClient, topic: str, poll_timeout_s: float) -> None:
        self.client, self.topic, self.poll_timeout_s = client, topic, poll_timeout_s
        self._highs: dict[int, int] = {}

    def partition_ids(self) -> list[int] | None:
        return self.client.partition_ids(self.topic)

    def list_offsets(self, partition: int) -> tuple[int, int]:
        return self.client.watermarks(self.topic, partition)

    def fetch(self, partition: int, offset: int) -> list[tuple[int, int]]:
        """``(offset, timestamp)`` of the records at and after ``offset`` that one fetch returns."""
        from confluent_kafka import TopicPartition

        consumer = self.client.consumer
        consumer.assign([TopicPartition(self.topic, partition, offset)])
        first = consumer.poll(self.poll_timeout_s)  # returns at the first record or the partition's end
        if first is None:  # neither: the broker did not answer (an empty answer would be the end event)
            consumer.unassign()
            cause = self.client.last_error()
            raise KafkaClientError(
                f"{self.topic}:{partition}: no answer to a fetch at offset {offset} in {self.poll_timeout_s:.0f}s"
                + (f" ({cause})" if cause else "")
            )
        messages = [first]
        if first.error() is None:
            # More of what that fetch brought, no wait (a wider window costs more Python than it saves probes).
            messages += consumer.consume(PROBE_RECORDS - 1, timeout=0)
        consumer.unassign()  # no fetch left running in the background (tansu answers one request at a time)
        data, eof = _split_messages(self.topic, partition, messages)
        out = [(m.offset(), m.timestamp()[1]) for m in data if m.offset() >= offset]
        self._highs[partition] = eof if eof is not None else self.client.watermarks(self.topic, partition, True)[1]
        return out

    def highwater(self, partition: int) -> int | None:
        return self._highs.get(partition)

    def offsets_for_times(self, partition: int, ts_ms: int) -> int | None:
        """The broker's first offset whose timestamp is ``>= ts_ms`` (None: no such record); raises
        :class:`TimestampLookupUnsupported` when the broker does not answer."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            (answer,) = self.client.consumer.offsets_for_times(
                [TopicPartition(self.topic, partition, ts_ms)], timeout=self.client.timeout_s
            )
        except KafkaException as exc:
            raise TimestampLookupUnsupported(f"{self.topic}:{partition}: {exc.args[0]}") from exc
        if answer.error is not None:
            raise TimestampLookupUnsupported(f"{self.topic}:{partition}: {answer.error}")
        return None if answer.offset < 0 else int(answer.offset)


class ConfluentRangeReader:
    """``[start, stop)`` of one topic-partition through librdkafka: assign at the start, batched ``consume``."""

    def __init__(self, client: ConfluentClient, topic: str, partition: int, start: int, stop: int) -> None:
        from confluent_kafka import TopicPartition

        self.client, self.topic, self.partition, self.stop = client, topic, partition, stop
        client.consumer.assign([TopicPartition(topic, partition, start)])

    def fetch(self, offset: int, want: int, timeout_s: float) -> Fetched:
        """Up to ``want`` records from ``offset`` (the reader's position), waiting at most ``timeout_s``."""
        from confluent_kafka import Message

        stop = self.stop
        with GC_PAUSE.paused():  # the Message objects never meet the collector (GcPause)
            messages = self.client.consumer.consume(num_messages=max(1, min(want, stop - offset)), timeout=timeout_s)
            if not messages:
                return Fetched.empty(offset)
            data, eof = _split_messages(self.topic, self.partition, messages)
            next_offset = offset
            if data:
                last = data[-1].offset()
                if last >= stop:  # offsets can skip (compaction, transaction markers): past the stop is dropped
                    data = [m for m in data if m.offset() < stop]
                    next_offset = stop
                else:
                    next_offset = last + 1
            if eof is not None:  # everything below the partition's end was delivered
                next_offset = max(next_offset, min(eof, stop))
            offsets: list[int] = list(map(Message.offset, data))  # type: ignore[arg-type]  # data messages have one
            fetched = Fetched(
                list(map(Message.value, data)), offsets, list(map(_SECOND, map(Message.timestamp, data))), next_offset
            )
            del messages, data
        return fetched

    def high_watermark(self) -> int | None:
        try:
            return self.client.watermarks(self.topic, self.partition, cached=True)[1]
        except KafkaClientError:
            return None

    def close(self) -> None:
        """Stop fetching (no prefetch past the stop; the consumer goes back to the pool idle)."""
        self.client.consumer.unassign()


# -- kafka-python ---------------------------------------------------------------------------------------------


class KafkaPythonProbe:
    """The offset search's client on a kafka-python consumer (:data:`KAFKA_PYTHON_PROBE_CONFIG`)."""

    def __init__(self, consumer: Any, topic: str, poll_timeout_s: float) -> None:
        self.consumer, self.topic, self.poll_timeout_s = consumer, topic, poll_timeout_s

    def _tp(self, partition: int) -> Any:
        from kafka import TopicPartition

        return TopicPartition(self.topic, partition)

    def partition_ids(self) -> list[int] | None:
        ids = self.consumer.partitions_for_topic(self.topic)
        return sorted(ids) if ids else None

    def list_offsets(self, partition: int) -> tuple[int, int]:
        tp = self._tp(partition)
        self.consumer.assign([tp])
        return self.consumer.beginning_offsets([tp])[tp], self.consumer.end_offsets([tp])[tp]

    def fetch(self, partition: int, offset: int) -> list[tuple[int, int]]:
        tp = self._tp(partition)
        if tp not in self.consumer.assignment():
            self.consumer.assign([tp])
        self.consumer.seek(tp, offset)
        records = self.consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000)).get(tp, [])
        return [(r.offset, r.timestamp) for r in records if r.offset >= offset]

    def highwater(self, partition: int) -> int | None:
        high = self.consumer.highwater(self._tp(partition))
        return None if high is None else int(high)

    def offsets_for_times(self, partition: int, ts_ms: int) -> int | None:
        """As :meth:`ConfluentProbe.offsets_for_times`."""
        from kafka.errors import KafkaError

        tp = self._tp(partition)
        try:
            answer = self.consumer.offsets_for_times({tp: ts_ms}).get(tp)
        except KafkaError as exc:  # an old broker (UnsupportedVersionError), a timeout
            raise TimestampLookupUnsupported(f"{self.topic}:{partition}: {exc}") from exc
        return None if answer is None else int(answer.offset)


class KafkaPythonRangeReader:
    """``[start, stop)`` through kafka-python: ``assign`` + ``seek`` + ``poll``, capped so nothing past the stop
    is unpacked (kafka-python unpacks records lazily)."""

    def __init__(self, consumer: Any, topic: str, partition: int, start: int, stop: int) -> None:
        from kafka import TopicPartition

        self.consumer, self.tp, self.stop = consumer, TopicPartition(topic, partition), stop
        consumer.assign([self.tp])
        consumer.seek(self.tp, start)
        self.position = start

    def fetch(self, offset: int, want: int, timeout_s: float) -> Fetched:
        if offset != self.position:
            self.consumer.seek(self.tp, offset)
        limit = max(1, min(self.stop - offset, want))
        with GC_PAUSE.paused():  # the records never meet the collector (GcPause)
            records = self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=limit).get(self.tp, [])
            if records and records[-1].offset >= self.stop:  # offsets can skip (compaction, transaction markers)
                records = [r for r in records if r.offset < self.stop]
                next_offset = self.stop
            elif records:
                next_offset = records[-1].offset + 1
            else:
                next_offset = max(offset, min(self.consumer.position(self.tp), self.stop))
            fetched = Fetched(
                list(map(_VALUE, records)), list(map(_OFFSET, records)), list(map(_TIMESTAMP, records)), next_offset
            )
            del records
        self.position = next_offset
        return fetched

    def high_watermark(self) -> int | None:
        high = self.consumer.highwater(self.tp)
        return None if high is None else int(high)

    def close(self) -> None:
        """Nothing to stop: kafka-python fetches only inside ``poll``."""
        return None
