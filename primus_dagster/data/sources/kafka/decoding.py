"""Kafka record values (one JSON object each) decoded in bulk into Arrow tables of a spec's native columns.

Values are parsed with ``pyarrow.json`` against an explicit schema of the mapped fields only
(:func:`json_schema`); unmapped fields are ignored. A chunk that fails to parse is bisected
until the undecodable records are isolated, so one bad record costs O(log N) re-parses and
never the chunk. The record timestamp (event time, epoch ms) fills ``ts`` when the JSON has no
such field.

Example::

    decoder = JsonRecordDecoder(spec)
    table, bad = decoder.decode(consumer_records)   # native-column table (None if none decoded)
    bad                                             # [(index in consumer_records, error), ...]
"""

from __future__ import annotations

import io
from typing import Any

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
        table, bad = decoder.decode(records)
    """

    def __init__(self, spec: KafkaSourceSpec) -> None:
        self.schema = json_schema(spec)
        self.ts_column = spec.columns.ts
        self._parse_options = pj.ParseOptions(explicit_schema=self.schema, unexpected_field_behavior="ignore")

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

    def decode(self, records: list[Any]) -> tuple[pa.Table | None, list[tuple[int, str]]]:
        """The decoded records as one table (``None`` when none decodes) and the sorted ``(index, error)`` of the rest."""
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
        if not good:
            return None, bad
        table = pa.concat_tables([t for _, _, t in good]).combine_chunks()
        rows = np.concatenate([np.asarray(keep[lo:hi], dtype=np.int64) for lo, hi, _ in good])
        record_ts = pa.array(np.fromiter((r.timestamp for r in records), np.int64, len(records))[rows])
        ts = table.schema.get_field_index(self.ts_column)  # the record timestamp fills a missing ts
        table = table.set_column(ts, self.ts_column, pc.coalesce(table.column(ts), record_ts))
        return table, bad
