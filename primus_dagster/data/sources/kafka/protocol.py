"""The three Kafka wire-protocol messages the native reader speaks: ApiVersions, Metadata and Fetch (bytes only, no I/O).

Versions: ApiVersions v0; Metadata v1–v7 and Fetch v4–v10, the non-flexible versions that
every broker since Kafka 2.1 answers (Kafka 4 keeps that baseline, KIP-896). Requests carry
header v1 (api key, version, correlation id, client id); responses header v0 (correlation
id). Fetches are sessionless (session id 0, epoch -1) and ``read_uncommitted``.

Example::

    body = encode_fetch(10, "events", [(0, 120, 16 << 20)], max_wait_ms=500, min_bytes=1, max_bytes=16 << 20)
    frame = encode_request(API_FETCH, 10, correlation_id=7, client_id="primus", body=body)
    response = decode_fetch(10, payload)           # payload: the response after its correlation id
    response.partitions[("events", 0)].high_watermark
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

API_FETCH, API_METADATA, API_VERSIONS = 1, 3, 18
FETCH_VERSIONS = (4, 10)
METADATA_VERSIONS = (1, 7)

ERROR_NAMES = {
    1: "OFFSET_OUT_OF_RANGE",
    2: "CORRUPT_MESSAGE",
    3: "UNKNOWN_TOPIC_OR_PARTITION",
    5: "LEADER_NOT_AVAILABLE",
    6: "NOT_LEADER_OR_FOLLOWER",
    7: "REQUEST_TIMED_OUT",
    13: "NETWORK_EXCEPTION",
    29: "TOPIC_AUTHORIZATION_FAILED",
    35: "UNSUPPORTED_VERSION",
    56: "KAFKA_STORAGE_ERROR",
    74: "FENCED_LEADER_EPOCH",
    75: "UNKNOWN_LEADER_EPOCH",
    78: "OFFSET_NOT_AVAILABLE",
}
# Errors that clear after a metadata refresh or a short wait (leader moves, elections, slow disks).
RETRIABLE = frozenset({3, 5, 6, 7, 13, 56, 74, 75, 78})
OFFSET_OUT_OF_RANGE = 1


def error_name(code: int) -> str:
    return f"{ERROR_NAMES.get(code, 'error')} ({code})"


class ProtocolError(ValueError):
    """A response that does not parse as the message and version asked for."""


Buffer = bytes | bytearray | memoryview


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: Buffer) -> None:
        self.data, self.pos = memoryview(data), 0

    def _unpack(self, fmt: struct.Struct) -> int:
        try:
            (value,) = fmt.unpack_from(self.data, self.pos)
        except struct.error as exc:
            raise ProtocolError(f"response ends at byte {len(self.data)} (reading at {self.pos})") from exc
        self.pos += fmt.size
        return int(value)

    def int8(self) -> int:
        return self._unpack(_I8)

    def int16(self) -> int:
        return self._unpack(_I16)

    def int32(self) -> int:
        return self._unpack(_I32)

    def int64(self) -> int:
        return self._unpack(_I64)

    def raw(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise ProtocolError(f"{n} bytes at {self.pos} overrun the response ({len(self.data)} bytes)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else bytes(self.raw(n)).decode()

    def bytes_(self) -> memoryview | None:
        n = self.int32()
        return None if n < 0 else self.raw(n)

    def int32s(self) -> list[int]:
        return [self.int32() for _ in range(max(self.int32(), 0))]


_I8, _I16, _I32, _I64 = (struct.Struct(f">{c}") for c in "bhiq")


def _string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    raw = value.encode()
    return _I16.pack(len(raw)) + raw


def encode_request(api_key: int, version: int, correlation_id: int, client_id: str, body: bytes) -> bytes:
    """One size-prefixed request frame (header v1 + body)."""
    payload = struct.pack(">hhi", api_key, version, correlation_id) + _string(client_id) + body
    return _I32.pack(len(payload)) + payload


def pick_version(supported: tuple[int, int] | None, ours: tuple[int, int]) -> int | None:
    """The highest version both sides speak, or None."""
    if supported is None:
        return None
    low, high = max(supported[0], ours[0]), min(supported[1], ours[1])
    return high if low <= high else None


def decode_api_versions(payload: Buffer) -> dict[int, tuple[int, int]]:
    """``{api key: (min version, max version)}`` of an ApiVersions v0 response."""
    r = _Reader(payload)
    code = r.int16()
    if code:
        raise ProtocolError(f"ApiVersions failed: {error_name(code)}")
    out = {}
    for _ in range(r.int32()):
        key, low, high = r.int16(), r.int16(), r.int16()
        out[key] = (low, high)
    return out


def encode_metadata(version: int, topics: list[str]) -> bytes:
    body = _I32.pack(len(topics)) + b"".join(_string(t) for t in topics)
    if version >= 4:
        body += _I8.pack(0)  # allow_auto_topic_creation: a reader never creates topics
    return body


@dataclass
class MetadataResponse:
    brokers: dict[int, tuple[str, int]]  # node id -> (host, port)
    topic_errors: dict[str, int]
    leaders: dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> (error code, leader node id)


def decode_metadata(version: int, payload: Buffer) -> MetadataResponse:
    r = _Reader(payload)
    if version >= 3:
        r.int32()  # throttle_time_ms
    brokers = {}
    for _ in range(r.int32()):
        node, host, port = r.int32(), r.string() or "", r.int32()
        r.string()  # rack
        brokers[node] = (host, port)
    if version >= 2:
        r.string()  # cluster_id
    r.int32()  # controller_id
    topic_errors, leaders = {}, {}
    for _ in range(r.int32()):
        code, name = r.int16(), r.string() or ""
        r.int8()  # is_internal
        topic_errors[name] = code
        for _ in range(r.int32()):
            p_code, index, leader = r.int16(), r.int32(), r.int32()
            if version >= 7:
                r.int32()  # leader_epoch
            r.int32s(), r.int32s()  # replicas, isr
            if version >= 5:
                r.int32s()  # offline replicas
            leaders[(name, index)] = (p_code, leader)
    return MetadataResponse(brokers, topic_errors, leaders)


def encode_fetch(
    version: int,
    topic: str,
    partitions: list[tuple[int, int, int]],
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
) -> bytes:
    """A sessionless ``read_uncommitted`` fetch of ``(partition, offset, partition max bytes)`` of one topic."""
    body = struct.pack(">iiiib", -1, max_wait_ms, min_bytes, max_bytes, 0)
    if version >= 7:
        body += struct.pack(">ii", 0, -1)  # no fetch session
    body += _I32.pack(1) + _string(topic) + _I32.pack(len(partitions))
    for partition, offset, partition_max in partitions:
        body += _I32.pack(partition)
        if version >= 9:
            body += _I32.pack(-1)  # current_leader_epoch: unknown
        body += _I64.pack(offset)
        if version >= 5:
            body += _I64.pack(-1)  # log_start_offset: only followers send it
        body += _I32.pack(partition_max)
    if version >= 7:
        body += _I32.pack(0)  # forgotten topics
    return body


@dataclass
class FetchedPartition:
    error: int
    high_watermark: int
    log_start_offset: int  # -1 before Fetch v5
    records: memoryview  # a view into the response: record batches, the last one possibly cut short


@dataclass
class FetchResponse:
    error: int = 0
    partitions: dict[tuple[str, int], FetchedPartition] = field(default_factory=dict)


def decode_fetch(version: int, payload: Buffer) -> FetchResponse:
    r = _Reader(payload)
    r.int32()  # throttle_time_ms
    out = FetchResponse()
    if version >= 7:
        out.error = r.int16()
        r.int32()  # session_id
    for _ in range(r.int32()):
        topic = r.string() or ""
        for _ in range(r.int32()):
            index, code, high = r.int32(), r.int16(), r.int64()
            r.int64()  # last_stable_offset
            log_start = r.int64() if version >= 5 else -1
            for _ in range(max(r.int32(), 0)):  # aborted transactions: kept, as read_uncommitted does
                r.int64(), r.int64()
            out.partitions[(topic, index)] = FetchedPartition(code, high, log_start, r.bytes_() or memoryview(b""))
    return out
