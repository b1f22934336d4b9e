"""Kafka record batches (message format v2) to plain columns: values, offsets and timestamps, no per-record objects.

The reader's hot loop: one pass over the bytes of a fetch response, decoding only the varints
that locate each value (length, timestamp delta, offset delta, key length, value length) and
skipping keys and headers by the record length. Compressed batches are decompressed with
``kafka.codec``; CRC-32C is checked per batch with the native ``crc32c`` package. Control
batches (transaction markers) are skipped; records of aborted transactions are kept, as a
``read_uncommitted`` consumer keeps them. A trailing batch cut short by the fetch size is left
for the next fetch. Legacy message formats (v0/v1) raise :class:`LegacyFormatError` so the
caller can fall back to kafka-python.

Example::

    cols = RecordColumns()
    next_offset = read_batches(fetched.records, start=120, stop=480, out=cols)
    cols.values[0], cols.offsets[0], cols.timestamps[0]   # b'{"sample_id": …}', 120, 1793491200057
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

HEADER = struct.Struct(">qiibIhiqqqhii")  # base offset … record count: the 61-byte v2 batch header
CRC_START = 21  # the CRC covers the bytes from the attributes to the end of the batch
COMPRESSION_MASK = 0x07
LOG_APPEND_TIME = 0x08
CONTROL = 0x20


class CorruptBatchError(ValueError):
    """A record batch fails its CRC check or its records do not fit in it."""


class LegacyFormatError(ValueError):
    """The fetched data holds message format v0/v1 (Kafka < 0.11) message sets."""


@dataclass
class RecordColumns:
    """Values, offsets and timestamps (epoch ms) of consecutive records, one list each."""

    values: list[bytes | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def take(self, n: int) -> RecordColumns:
        """Remove and return the first ``n`` records."""
        head = RecordColumns(self.values[:n], self.offsets[:n], self.timestamps[:n])
        del self.values[:n], self.offsets[:n], self.timestamps[:n]
        return head

    def extend(self, other: RecordColumns) -> None:
        self.values += other.values
        self.offsets += other.offsets
        self.timestamps += other.timestamps


def _codecs() -> dict[int, Callable[[bytes], bytes]]:
    from kafka import codec

    return {1: codec.gzip_decode, 2: codec.snappy_decode, 3: codec.lz4_decode, 4: codec.zstd_decode}


def _crc32c(data: memoryview) -> int:
    import crc32c

    return int(crc32c.crc32c(data))


def _uvarint(buf: bytes, p: int) -> tuple[int, int]:
    """An unsigned varint at ``p`` and the position after it."""
    value = shift = 0
    while True:
        b = buf[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        shift += 7
        if shift > 63:
            raise CorruptBatchError(f"varint longer than 10 bytes at {p}")


def _scan(
    buf: bytes, count: int, base: int, first_ts: int, fixed_ts: int | None, start: int, stop: int, out: RecordColumns
) -> None:
    """Append the records of one batch's record section with offsets in ``[start, stop)``."""
    values, offsets, timestamps = out.values, out.offsets, out.timestamps
    uvarint = _uvarint
    p, end = 0, len(buf)
    for _ in range(count):
        # Record: length, attributes, timestamp delta, offset delta, key, value, headers (zigzag varints).
        # The one- and two-byte cases of each varint are inlined: this loop runs once per record.
        b = buf[p]
        if b < 0x80:
            u, p = b, p + 1
        elif (b2 := buf[p + 1]) < 0x80:
            u, p = (b & 0x7F) | (b2 << 7), p + 2
        else:
            u, p = uvarint(buf, p)
        length = (u >> 1) ^ -(u & 1)
        record_end = p + length
        if length < 0 or record_end > end:
            raise CorruptBatchError(f"record of {length} bytes at {p} overruns its batch ({end} bytes)")
        q = p + 1  # attributes: unused
        b = buf[q]
        if b < 0x80:
            u, q = b, q + 1
        elif (b2 := buf[q + 1]) < 0x80:
            u, q = (b & 0x7F) | (b2 << 7), q + 2
        else:
            u, q = uvarint(buf, q)
        ts_delta = (u >> 1) ^ -(u & 1)
        b = buf[q]
        if b < 0x80:
            u, q = b, q + 1
        elif (b2 := buf[q + 1]) < 0x80:
            u, q = (b & 0x7F) | (b2 << 7), q + 2
        else:
            u, q = uvarint(buf, q)
        offset_delta = (u >> 1) ^ -(u & 1)
        b = buf[q]
        if b < 0x80:
            u, q = b, q + 1
        elif (b2 := buf[q + 1]) < 0x80:
            u, q = (b & 0x7F) | (b2 << 7), q + 2
        else:
            u, q = uvarint(buf, q)
        key_len = (u >> 1) ^ -(u & 1)
        if key_len > 0:
            q += key_len
        b = buf[q]
        if b < 0x80:
            u, q = b, q + 1
        elif (b2 := buf[q + 1]) < 0x80:
            u, q = (b & 0x7F) | (b2 << 7), q + 2
        else:
            u, q = uvarint(buf, q)
        value_len = (u >> 1) ^ -(u & 1)
        if q + value_len > record_end:
            raise CorruptBatchError(f"value of {value_len} bytes at {q} overruns its record (ends at {record_end})")
        p = record_end
        offset = base + offset_delta
        if offset < start:
            continue
        if offset >= stop:
            return
        values.append(buf[q : q + value_len] if value_len >= 0 else None)
        offsets.append(offset)
        timestamps.append(first_ts + ts_delta if fixed_ts is None else fixed_ts)


def read_batches(
    data: bytes | bytearray | memoryview, start: int, stop: int, out: RecordColumns, check_crcs: bool = True
) -> int:
    """Append the records with offsets in ``[start, stop)`` of the complete batches in ``data`` to ``out``.

    Returns the offset to fetch next: past the last complete batch (``start`` when there is
    none), or ``stop`` once a record at or after ``stop`` was seen.
    """
    view = memoryview(data)
    pos, size, next_offset = 0, len(data), start
    codecs: dict[int, Callable[[bytes], bytes]] | None = None
    while pos + 17 <= size:
        if view[pos + 16] < 2:  # the magic byte sits at 16 in every message format
            raise LegacyFormatError(f"message format v{view[pos + 16]}; only v2 (Kafka >= 0.11) is read natively")
        if pos + HEADER.size > size:
            break
        (base, length, _, _, crc, attrs, last_delta, first_ts, max_ts, _, _, _, count) = HEADER.unpack_from(view, pos)
        end = pos + 12 + length
        if end > size:
            break  # cut short by the fetch size: the next fetch starts at this batch
        if check_crcs and _crc32c(view[pos + CRC_START : end]) != crc:
            raise CorruptBatchError(f"record batch at offset {base} fails its CRC-32C check")
        batch_next = base + last_delta + 1
        if batch_next > start and not attrs & CONTROL:
            records = bytes(view[pos + HEADER.size : end])  # the one copy: bytes index faster than views
            if attrs & COMPRESSION_MASK:
                codecs = codecs or _codecs()
                decode = codecs.get(attrs & COMPRESSION_MASK)
                if decode is None:
                    raise CorruptBatchError(f"record batch at offset {base}: unknown compression {attrs & 7}")
                records = bytes(decode(records))
            fixed_ts = max_ts if attrs & LOG_APPEND_TIME else None
            try:
                _scan(records, count, base, first_ts, fixed_ts, start, stop, out)
            except IndexError as exc:
                raise CorruptBatchError(f"record batch at offset {base}: {count} records do not fit in it") from exc
        next_offset = max(next_offset, batch_next)
        pos = end
        if next_offset >= stop:
            return stop
    return next_offset
