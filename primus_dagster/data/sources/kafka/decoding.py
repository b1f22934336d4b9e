"""Kafka record values (one JSON object each) decoded in bulk into Arrow tables of a spec's native columns.

Values are parsed with ``pyarrow.json`` against an explicit schema of the mapped fields only
(:func:`json_schema`); unmapped fields are ignored. A chunk that fails to parse is bisected
until the undecodable records are isolated, so one bad record costs O(log N) re-parses and
never the chunk. The record timestamp (event time, epoch ms) fills ``ts`` when the JSON has no
such field.

Example::

    decoder = JsonRecordDecoder(spec)
    table, bad = decoder.decode(values, timestamps)  # native-column table (None if none decoded)
    bad                                              # [(index in values, error), ...]
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from primus_dagster.data.canonical import native_columns
from primus_dagster.spec.sources import KafkaSourceSpec


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


class JsonRecordDecoder:
    """Decodes chunks of consumer records of one Kafka source; holds its schema and parse options.

    Example::

        decoder = JsonRecordDecoder(spec)
        decoder.schema                                  # pa.schema([("event_time", pa.int64()), ...])
        table, bad = decoder.decode([r.value for r in records], [r.timestamp for r in records])
    """

    def __init__(self, spec: KafkaSourceSpec) -> None:
        self.schema = json_schema(spec)
        self.ts_column = spec.columns.ts
        self._parse_options = pj.ParseOptions(explicit_schema=self.schema, unexpected_field_behavior="ignore")
        # One thread: the reader's figure of merit is rows per CPU-second, and executors run one reader per core.
        self._read_options = pj.ReadOptions(use_threads=False, block_size=16 << 20)

    def _parse_isolating(
        self,
        lines: Sequence[bytes],
        lo: int,
        hi: int,
        good: list[tuple[int, int, pa.Table]],
        bad: list[tuple[int, str]],
        joined: bytes | None = None,
    ) -> None:
        """Parse ``lines[lo:hi]`` in bulk (``joined``: already newline-joined); on failure bisect to the bad records."""
        try:
            text = joined if joined is not None else b"\n".join(lines[lo:hi])
            table = pj.read_json(io.BytesIO(text), read_options=self._read_options, parse_options=self._parse_options)
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

    @staticmethod
    def _joined_if_clean(values: Sequence[bytes | None]) -> bytes | None:
        """``values`` newline-joined when each is one line that starts with ``{`` and ends with ``}`` (else None).

        The common case, checked without a Python loop over the records.
        """
        n = len(values)
        if not n or None in values:
            return None
        joined = b"\n".join(values)  # type: ignore[arg-type]  # no None: checked above
        if joined.count(b"\n") != n - 1 or b"\r" in joined:
            return None
        lengths = np.fromiter(map(len, values), np.int64, n)  # type: ignore[arg-type]
        if not lengths.all():
            return None
        ends = np.cumsum(lengths + 1) - 1  # where the newline after each value is (or would be)
        text = np.frombuffer(joined, np.uint8)
        if not ((text[ends - lengths] == 0x7B) & (text[ends - 1] == 0x7D)).all():
            return None
        return joined

    def _lines(self, values: Sequence[bytes | None], bad: list[tuple[int, str]]) -> tuple[list[int], list[bytes]]:
        """Indices and cleaned text of the values that look like one JSON object; the rest go to ``bad``."""
        keep: list[int] = []
        lines: list[bytes] = []
        for i, value in enumerate(values):
            # One JSON object per record: pyarrow.json crashes (segfault) on a leading top-level
            # `null` and reads a trailing one as an extra all-null row, so check the braces first.
            text = value.strip() if value else b""
            if text[:1] != b"{" or text[-1:] != b"}":
                bad.append((i, "not a JSON object" if text else "empty record"))
                continue
            if b"\n" in text or b"\r" in text:  # raw newlines are only legal as JSON whitespace
                text = text.replace(b"\r", b" ").replace(b"\n", b" ")
            keep.append(i)
            lines.append(text)
        return keep, lines

    def decode(
        self, values: Sequence[bytes | None], timestamps: Sequence[int]
    ) -> tuple[pa.Table | None, list[tuple[int, str]]]:
        """The decoded values as one table (``None`` when none decodes) and the sorted ``(index, error)`` of the rest.

        ``timestamps`` (the record timestamps, epoch ms) fill ``ts`` where the JSON has none.
        """
        bad: list[tuple[int, str]] = []
        good: list[tuple[int, int, pa.Table]] = []
        bad_lines: list[tuple[int, str]] = []
        joined = self._joined_if_clean(values)
        if joined is not None:
            keep: Sequence[int] = range(len(values))
            self._parse_isolating(values, 0, len(values), good, bad_lines, joined)  # type: ignore[arg-type]
        else:
            keep, lines = self._lines(values, bad)
            if lines:
                self._parse_isolating(lines, 0, len(lines), good, bad_lines)
        bad = sorted(bad + [(keep[j], err) for j, err in bad_lines])
        if not good:
            return None, bad
        table = pa.concat_tables([t for _, _, t in good]).combine_chunks()
        ts = table.schema.get_field_index(self.ts_column)  # the record timestamp fills a missing ts
        if table.column(ts).null_count:
            rows = np.concatenate([np.asarray(keep[lo:hi], dtype=np.int64) for lo, hi, _ in good])
            record_ts = pa.array(np.asarray(timestamps, dtype=np.int64)[rows])
            table = table.set_column(ts, self.ts_column, pc.coalesce(table.column(ts), record_ts))
        return table, bad
