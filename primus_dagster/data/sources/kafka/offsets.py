"""Offsets of time boundaries in a Kafka topic-partition: the broker's ``offsets_for_times``, checked.

A boundary (an hour's start, epoch ms) maps to the **first offset whose record timestamp is at or after
it**, which is what Kafka's ``ListOffsets`` by timestamp answers (the earliest such offset, however the
timestamps are ordered). Each answer is checked against the records it points at: the record at the
answer must be at or after the boundary and the record before it older (one small fetch); an answer of
"none" needs the partition's last record to be older. A broker that fails the check ignores record
timestamps there (the embedded tansu broker answers its first offset to every question), and the
search falls back, for the rest of the source's life, to a **search over record timestamps**
(interpolation with bisection steps, O(log N) fetches a boundary), saying so once in the run log (a warning naming the topic). The
fallback assumes timestamps are non-decreasing within a topic-partition; on brokers that implement
``offsets_for_times`` nothing is assumed.

Either way a record belongs to the partition (hour) whose offset range holds it; a record whose
timestamp lies outside that hour (out of order) is read with it and counted by the normaliser as
``ts_outside_partition`` (docs/data_plane.md). High watermarks come from a fetch, not from the listed
end offset, which tansu under-reports. Boundaries that have a record at or after them are final and
cached, so a second listing only re-reads the tails.

Example::

    search = OffsetSearch(poll_timeout_s=5.0)
    row, last_ts = search.boundary_offsets(probe, 0, [h10_ms, h11_ms])  # probe: a .clients.Probe
    row                                        # [120, 480]: first offsets with ts >= 10:00 and >= 11:00
    search.fetches, search.broker_timestamps   # fetches issued so far; False once the fallback is in use
"""

from __future__ import annotations

import logging

from primus_dagster.data.sources.kafka.clients import Probe, TimestampLookupUnsupported

log = logging.getLogger(__name__)

#: How many records before its estimate an interpolation guess probes (one probe returns dozens).
_LEAD = 8
#: Up to how many probe windows away the local rate of a probe's records guides the next guess.
_NEAR = 16


class OffsetSearch:
    """Finds the first offset at or after each time boundary of a topic-partition.

    Holds the cache of final boundaries (``(kafka partition, epoch ms) -> offset``), the number of
    fetches issued and whether the broker's timestamp lookups are trusted (``broker_timestamps``: None
    until the first check, False once one failed); the probe is passed in by its owner, so the cache
    outlives it.

    Example::

        search = OffsetSearch(poll_timeout_s=5.0)
        begin, high, last_ts = search.tail(probe, 0)    # begin offset, high watermark, last event time
        search.boundary(probe, 0, h10_ms, begin, high)  # first offset with ts >= h10_ms (high: none)
    """

    def __init__(self, poll_timeout_s: float) -> None:
        self.poll_timeout_s = poll_timeout_s
        self.boundaries: dict[tuple[int, int], int] = {}  # (partition, epoch ms) -> first offset with ts >= it
        self.fetches = 0
        self.broker_timestamps: bool | None = None
        self._seen: dict[tuple[int, int], list[tuple[int, int]]] = {}  # this listing's fetches

    def fetch(self, probe: Probe, partition: int, offset: int) -> list[tuple[int, int]]:
        """``(offset, timestamp)`` of the records at and after ``offset`` returned by one fetch (a fetch of the
        same offset within one :meth:`boundary_offsets` call is answered again: records below the high
        watermark do not change)."""
        key = (partition, offset)
        if key in self._seen:
            return self._seen[key]
        self.fetches += 1
        records = probe.fetch(partition, offset)
        if records:
            self._seen[key] = records
        return records

    def tail(self, probe: Probe, partition: int) -> tuple[int, int, int | None]:
        """``(begin offset, true high watermark, timestamp of the last record or None)``.

        The listed end may under-report (tansu: "start of last batch + 1"); a fetch's high watermark is exact.
        """
        begin, end = probe.list_offsets(partition)
        if end <= begin:
            return begin, begin, None
        back = 1
        while True:
            start = max(begin, end - back)
            records = self.fetch(probe, partition, start)
            high = probe.highwater(partition)
            if high is not None and records and records[-1][0] < high - 1:
                records = self.fetch(probe, partition, high - 1) or records  # the fetch stopped short of the end
            if records:
                return begin, max(high or 0, records[-1][0] + 1), records[-1][1]
            if start == begin:
                return begin, max(high or begin, begin), None
            back *= 8

    def search(
        self,
        probe: Probe,
        partition: int,
        target_ms: int,
        lo: int,
        hi: int,
        hint: tuple[int, int] | None = None,
    ) -> int:
        """First offset in ``[lo, hi]`` whose record timestamp is >= ``target_ms`` (``hi``: none).

        A guided search over record timestamps: event times grow about linearly with offsets over a
        short stretch, so each guess extrapolates from the records the last probe returned (their local
        rate) or interpolates between the nearest records seen on either side, aiming a few records
        early so that the answer lies inside the next probe's records. It starts at ``lo`` (the previous
        boundary: often the answer already) and takes a bisection step whenever two guesses in a row did
        not halve the range, so it never needs much more than the O(log N) fetches of a binary search.
        ``hint``: ``(offset, timestamp)`` of a known record (the partition's last).
        """
        below: tuple[int, int] | None = None  # the nearest record before lo seen (older than the target)
        above = hint if hint is not None and hint[1] >= target_ms else None  # a record at/after the answer
        mid, slow = lo, -1  # the first probe (at lo) is not expected to halve the range
        while lo < hi:
            width = hi - lo
            records = [r for r in self.fetch(probe, partition, mid) if r[0] < hi]
            local: float | None = None
            if not records:  # no record in [mid, hi)
                hi = mid
            else:
                for i, (off, ts) in enumerate(records):
                    if ts >= target_ms:
                        if i > 0 or off == lo:  # the previous record is older and nothing lies between
                            return off
                        hi, above = off, (off, ts)
                        break
                else:
                    lo, below = records[-1][0] + 1, records[-1]
                (first, first_ts), (last, last_ts) = records[0], records[-1]
                if last_ts > first_ts:  # the local rate (offsets per ms) of the records just seen
                    rate = (last - first) / (last_ts - first_ts)
                    edge, gap = (last, target_ms - last_ts) if lo > last else (first, target_ms - first_ts)
                    if abs(gap * rate) <= _NEAR * max(len(records), 1):  # near: the local rate is the better guide
                        local = edge + gap * rate
            slow = slow + 1 if (hi - lo) * 2 > width else 0
            estimate = local
            if estimate is None and below is not None and above is not None and above[1] > below[1]:
                estimate = below[0] + (target_ms - below[1]) / (above[1] - below[1]) * (above[0] - below[0])
            if slow >= 2 or estimate is None:
                mid, slow = (lo + hi) // 2, 0
            else:
                mid = min(max(lo, int(estimate) - _LEAD), hi - 1)
        return lo

    def _distrust(self, probe: Probe, why: str) -> None:
        if self.broker_timestamps is not False:
            log.warning(
                "topic %r: the broker's offsets_for_times does not match the record timestamps (%s); hour "
                "boundaries come from a binary search over record timestamps instead (it assumes timestamps "
                "do not go backwards within a partition)",
                probe.topic,
                why,
            )
        self.broker_timestamps = False

    def from_broker(
        self, probe: Probe, partition: int, target_ms: int, lo: int, hi: int, last_ts: int | None
    ) -> int | None:
        """The broker's answer for ``target_ms`` (``hi`` when no record is at or after it), checked against the
        records; None when the broker cannot be trusted (then :attr:`broker_timestamps` is False)."""
        try:
            answer = probe.offsets_for_times(partition, target_ms)
        except TimestampLookupUnsupported as exc:
            self._distrust(probe, f"no answer: {exc}")
            return None
        if answer is None or answer >= hi:
            if last_ts is not None and last_ts >= target_ms:
                self._distrust(probe, f"no offset for ts {target_ms}, but the last record has ts {last_ts}")
                return None
            return hi
        if answer < lo:
            self._distrust(probe, f"offset {answer} for ts {target_ms} lies before the previous boundary {lo}")
            return None
        records = self.fetch(probe, partition, answer - 1 if answer > lo else answer)
        at = [ts for off, ts in records if off == answer]
        before = [ts for off, ts in records if off < answer]
        if not at or at[0] < target_ms or (before and before[-1] >= target_ms):
            seen = f"ts {at[0]}" if at else "no record"
            self._distrust(probe, f"asked for ts >= {target_ms}, got offset {answer} holding {seen}")
            return None
        self.broker_timestamps = True
        return answer

    def boundary(
        self, probe: Probe, partition: int, target_ms: int, lo: int, hi: int, last_ts: int | None = None
    ) -> int:
        """The boundary's offset in ``[lo, hi]``: from the cache, from the broker, or by :meth:`search`."""
        cached = self.boundaries.get(key := (partition, target_ms))
        if cached is not None and lo <= cached <= hi:
            return cached
        off = (
            self.from_broker(probe, partition, target_ms, lo, hi, last_ts)
            if self.broker_timestamps is not False
            else None
        )
        if off is None:
            hint = (hi - 1, last_ts) if last_ts is not None and hi > lo else None
            off = self.search(probe, partition, target_ms, lo, hi, hint)
        if off < hi:  # a record at/after target exists: final
            self.boundaries[key] = off
        return off

    def boundary_offsets(self, probe: Probe, partition: int, bounds_ms: list[int]) -> tuple[list[int], int | None]:
        """First offset at or after each of the ascending ``bounds_ms``, and the last record's timestamp."""
        self._seen = {}
        try:
            begin, high, last_ts = self.tail(probe, partition)
            self._seen = {}  # the tail's fetches may stop at an under-reported end: not reused
            offsets, lo = [], begin
            for bound in bounds_ms:
                lo = self.boundary(probe, partition, bound, lo, high, last_ts)
                offsets.append(lo)
        finally:
            self._seen = {}
        return offsets, last_ts
