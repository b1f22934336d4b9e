"""Offsets of time boundaries in a Kafka topic-partition, found by binary search over record timestamps.

The search assumes record timestamps are **non-decreasing within a topic-partition** (true for
producer-assigned event times of an ordered stream and for LogAppendTime topics). The broker's
``offsets_for_times`` is not used: the embedded tansu broker ignores timestamps there. High
watermarks come from a fetch, not from ``end_offsets``, which tansu under-reports. Boundaries
that have a record at or after them are final and cached, so a second listing only re-reads the
tails. Probe fetches go through the native client (:mod:`.wire`) when one is given: kafka-python
unpacks a whole producer batch (often a thousand records) into objects to return the few
records after a probed offset, the native scan only walks it.

Example::

    search = OffsetSearch(poll_timeout_s=5.0)
    probe = KafkaConsumer(**PROBE_CONSUMER_CONFIG, bootstrap_servers=["127.0.0.1:9092"])
    row, last_ts = search.boundary_offsets(probe, TopicPartition("events", 0), [h10_ms, h11_ms])
    row                                        # [120, 480]: first offsets with ts >= 10:00 and >= 11:00
    search.fetches                             # fetches issued so far
"""

from __future__ import annotations

import logging
from typing import Any

from primus_dagster.data.sources.kafka.records import LegacyFormatError, RecordColumns, read_batches
from primus_dagster.data.sources.kafka.wire import WireClient, WireError

log = logging.getLogger(__name__)

# Probes only need offsets and timestamps: small fetches, and no CRC pass over whole batches
# (pure-Python CRC32C costs ~25 ms per probe without the `crc32c` package).
PROBE_CONSUMER_CONFIG: dict[str, Any] = dict(
    max_poll_records=64,
    fetch_max_wait_ms=100,
    fetch_max_bytes=64 * 1024,
    max_partition_fetch_bytes=64 * 1024,
    check_crcs=False,
)


class OffsetSearch:
    """Finds the first offset at or after each time boundary of a topic-partition, O(log N) fetches each.

    Holds the cache of final boundaries (``(kafka partition, epoch ms) -> offset``) and the number
    of fetches issued; the probe consumer is passed in by its owner, so the cache outlives it.

    Example::

        search = OffsetSearch(poll_timeout_s=5.0)
        begin, high, last_ts = search.tail(probe, tp)   # begin offset, high watermark, last event time
        search.boundary(probe, tp, h10_ms, begin, high) # first offset with ts >= h10_ms (high: none)
    """

    def __init__(self, poll_timeout_s: float, wire: WireClient | None = None) -> None:
        self.poll_timeout_s = poll_timeout_s
        self.wire = wire  # native probe fetches when set; kafka-python's consumer otherwise
        self.boundaries: dict[tuple[int, int], int] = {}  # (partition, epoch ms) -> first offset with ts >= it
        self.fetches = 0
        self._highs: dict[tuple[str, int], int] = {}  # high watermark of the last native fetch

    def _fetch_native(self, wire: WireClient, tp: Any, offset: int) -> list[tuple[int, int]]:
        cfg = PROBE_CONSUMER_CONFIG
        pending = wire.send_fetch(
            tp.topic, tp.partition, offset, cfg["max_partition_fetch_bytes"], cfg["fetch_max_wait_ms"]
        )
        part = wire.receive_fetch(pending, tp.topic, tp.partition)
        self._highs[(tp.topic, tp.partition)] = part.high_watermark
        cols = RecordColumns()
        read_batches(part.records, offset, offset + cfg["max_poll_records"], cols, check_crcs=False)
        return list(zip(cols.offsets, cols.timestamps, strict=True))

    def fetch(self, consumer: Any, tp: Any, offset: int) -> list[tuple[int, int]]:
        """``(offset, timestamp)`` of the records at and after ``offset`` returned by one fetch."""
        self.fetches += 1
        if self.wire is not None:
            try:
                return self._fetch_native(self.wire, tp, offset)
            except (WireError, LegacyFormatError) as exc:
                log.info("offset search: native fetch failed (%s); probing through kafka-python", exc)
                self.wire.close()
                self.wire = None
        if tp not in consumer.assignment():
            consumer.assign([tp])
        consumer.seek(tp, offset)
        records = consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000)).get(tp, [])
        self._highs.pop((tp.topic, tp.partition), None)
        return [(r.offset, r.timestamp) for r in records if r.offset >= offset]

    def highwater(self, consumer: Any, tp: Any) -> int | None:
        """The high watermark seen by the last :meth:`fetch` of ``tp``."""
        high = self._highs.get((tp.topic, tp.partition))
        return high if high is not None else consumer.highwater(tp)

    def tail(self, consumer: Any, tp: Any) -> tuple[int, int, int | None]:
        """``(begin offset, true high watermark, timestamp of the last record or None)``.

        ``end_offsets`` may under-report (tansu: "start of last batch + 1"); a fetch's high watermark is exact.
        """
        consumer.assign([tp])
        begin = consumer.beginning_offsets([tp])[tp]
        end = consumer.end_offsets([tp])[tp]
        if end <= begin:
            return begin, begin, None
        back = 1
        while True:
            start = max(begin, end - back)
            records = self.fetch(consumer, tp, start)
            high = self.highwater(consumer, tp)
            if high is not None and records and records[-1][0] < high - 1:
                records = self.fetch(consumer, tp, high - 1) or records  # the fetch stopped short of the end
            if records:
                return begin, max(high or 0, records[-1][0] + 1), records[-1][1]
            if start == begin:
                return begin, max(high or begin, begin), None
            back *= 8

    def search(self, consumer: Any, tp: Any, target_ms: int, lo: int, hi: int) -> int:
        """First offset in ``[lo, hi]`` whose record timestamp is >= ``target_ms`` (``hi``: none)."""
        while lo < hi:
            mid = (lo + hi) // 2
            records = [r for r in self.fetch(consumer, tp, mid) if r[0] < hi]
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

    def boundary(self, consumer: Any, tp: Any, target_ms: int, lo: int, hi: int) -> int:
        """:meth:`search`, answered from the cache when a final boundary in ``[lo, hi]`` is known."""
        cached = self.boundaries.get(key := (tp.partition, target_ms))
        if cached is not None and lo <= cached <= hi:
            return cached
        off = self.search(consumer, tp, target_ms, lo, hi)
        if off < hi:  # a record at/after target exists: final under the ordering assumption
            self.boundaries[key] = off
        return off

    def boundary_offsets(self, consumer: Any, tp: Any, bounds_ms: list[int]) -> tuple[list[int], int | None]:
        """First offset at or after each of the ascending ``bounds_ms``, and the last record's timestamp."""
        begin, high, last_ts = self.tail(consumer, tp)
        offsets, lo = [], begin
        for bound in bounds_ms:
            lo = self.boundary(consumer, tp, bound, lo, high)
            offsets.append(lo)
        return offsets, last_ts
