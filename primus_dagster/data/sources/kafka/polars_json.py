"""The Kafka JSON decoder's fast path: one polars ``read_ndjson`` per chunk, kept only where it provably gives
what the ``pyarrow.json`` path gives.

Why polars (measured on bench/source_scan.py's Criteo-shaped JSON records, CPU time per record; figures in
docs/data_plane.md, "Measured reasons in the code"): polars ``read_ndjson`` with the explicit schema takes
about half the time of ``pyarrow.json`` with the explicit schema (whatever its block size or threads), and
converts to Arrow without a copy. Also tried: msgspec typed decoding (fast to Python objects, slower than
pyarrow once columns are built), orjson (dicts only), pysimdjson (no faster than pyarrow), and DuckDB
``json_transform`` (the fastest, but it casts ``"7"`` to 7, ``1.5`` to 2 and ``true`` to 1 in silence, and its
strict variant rejects a missing key), so it cannot stand in for a decoder that counts those records undecodable.

polars with an explicit schema is as strict as pyarrow on number columns: a string, a boolean, an
object, a float in an integer column, an integer past int64 all fail the parse, and float64 values round
to the same bits (checked on 200 000 values from 1e-44 to 1e38 and 6 000 of 80 digits). It differs in
five places, each closed here (tests/data/sources/test_kafka_polars_json.py runs every case, and a
byte-level fuzz, through both paths and compares the answers):

* **duplicate keys**: pyarrow fails a record holding a key twice, polars keeps the first value. After the
  parse, the chunk must hold no key occurrence beyond the values polars returned: the count of ``:`` in
  the text (every object member has one) or, when other fields or nested objects add some, the count of
  the mapped names as keys (``"name"`` followed by ``:``) must equal the number of non-null values. Each
  non-null value comes from its own occurrence of its key, so equality leaves no room for a second one
  (nor for an explicit ``null`` of a mapped field: such chunks take the pyarrow path);
* **lone surrogate escapes** (``"\\ud800"``, in any field): pyarrow rejects them, polars reads them. A
  chunk with a ``\\u`` escape anywhere takes the pyarrow path (escapes in keys would also hide a key from
  the count above);
* **float32 columns**: polars parses to float64 and casts, pyarrow rounds the decimal to float32 at once.
  Rounding is monotonic and float32 midpoints are float64 values, so the two can differ only where the
  float64 nearest the decimal *is* a midpoint (a value of more than 9 significant digits, e.g. float64
  output lying halfway between two float32s). Float32 columns are read as float64 and cast by Arrow, and
  a chunk holding a value exactly halfway between two float32 values (or at the overflow threshold) takes
  the pyarrow path;
* **``-0``**: the integer literal ``-0`` reads as ``0.0`` in polars, ``-0.0`` in pyarrow; a chunk whose
  float columns hold a zero and whose text holds ``-0`` as a whole number takes the pyarrow path;
* **string columns**: polars turns a number, a boolean or an object into text where pyarrow fails (the
  failure the decoder switches an id field to strings on), so a schema with a string column (string or
  mixed ids) takes the pyarrow path; so does a name holding ``"``, ``\\``, ``/`` or a control character
  (it could be written escaped).

Everything polars rejects (bad JSON, ``NaN``, a UTF-8 error in an unmapped field, a wrong type, deep
nesting) goes to the pyarrow path unchanged, which decides what is undecodable as before: the fast path
only ever vouches for a whole chunk. A chunk it declines after parsing costs a wasted parse, so after one
it stands aside for 1, 2, 4, ... 64 chunks (a topic whose records carry explicit nulls of mapped fields
pays about 1/64 of a parse per chunk). The checks cost a small part of the parse on the bench's records
(most of it the ``-0`` search, run when a float column holds a zero, as a 0/1 label does).

Example::

    fast = PolarsJsonReader.for_schema(pa.schema([("ts", pa.int64()), ("d0", pa.float32())]))
    fast.read(b'{"ts":1,"d0":0.5}\\n{"ts":2}', rows=2)   # a pa.Table, or None: use the pyarrow path
"""

from __future__ import annotations

import re
import threading
from typing import Any

import numpy as np
import pyarrow as pa

#: The pyarrow types the fast path reads (the types of a source whose id fields are all integers).
_NUMBER_TYPES = (pa.int64(), pa.float32(), pa.float64())
#: The longest pause (in chunks) after a declined chunk.
MAX_PAUSE = 64
_UNSAFE_NAME = re.compile(r'["\\/\x00-\x1f\x7f]')
#: ``-0`` as a whole number (followed by what may follow a number in JSON).
_NEGATIVE_ZERO_INTEGER = re.compile(rb"-0[,}\] \t]")


def _supported(kind: pa.DataType) -> bool:
    return kind in _NUMBER_TYPES or (pa.types.is_list(kind) and kind.value_type in _NUMBER_TYPES)


def _polars_type(kind: pa.DataType) -> Any:
    """The polars type an Arrow type the fast path reads (:func:`_supported`) is parsed as: float32 as float64."""
    import polars as pl

    scalars = {pa.int64(): pl.Int64, pa.float32(): pl.Float64, pa.float64(): pl.Float64}
    return pl.List(scalars[kind.value_type]) if pa.types.is_list(kind) else scalars[kind]


def _float_arrays(column: pa.ChunkedArray) -> list[np.ndarray]:
    """The float64 values of a float or float-list column, chunk by chunk (nulls as NaN)."""
    chunks = [c.values if pa.types.is_large_list(c.type) or pa.types.is_list(c.type) else c for c in column.chunks]
    return [c.to_numpy(zero_copy_only=False) for c in chunks]


def float32_midpoints(values: np.ndarray) -> bool:
    """Whether a float64 value lies exactly halfway between two float32 values (the overflow threshold
    included), where rounding to float64 and then to float32 may differ from rounding the decimal to
    float32 at once. In float32's normal range that is a float64 whose 29 low bits are ``1`` then zeros;
    below it (subnormal float32 spacing 2**-149), an odd multiple of 2**-150."""
    bits = values.view(np.uint64)
    low = (bits & 0x1FFFFFFF) == 0x10000000
    exponent = (bits >> 52) & 0x7FF  # biased: float32's normal range starts at 2**-126 (897), 0x7FF is inf/NaN
    if low.any() and (low & (exponent >= 897) & (exponent < 0x7FF)).any():
        return True
    tiny = (exponent < 897) & ((bits << 1) != 0)  # not zero
    return bool(tiny.any() and (np.fmod(np.abs(values[tiny]) * 2.0**150, 2.0) == 1.0).any())


def count_byte(text: bytes, byte: int, block: int = 1 << 18) -> int:
    """How many times ``byte`` occurs in ``text``: numpy, a block at a time into one reused buffer.

    Measured reason: numpy's ``count_nonzero(text == byte)`` is several times faster than ``bytes.count``
    of one byte, but allocates a mask as large as the text, and inside a read (polars and Arrow allocating
    between) each such mask page-faults afresh, costing more system time than the count saves. By blocks:
    as fast as the whole-text mask and no fault (figures in docs/data_plane.md, "Measured reasons in the code").
    """
    view = np.frombuffer(text, np.uint8)
    mask = np.empty(min(block, len(view)), bool)
    total = 0
    for start in range(0, len(view), block):
        part = view[start : start + block]
        np.equal(part, byte, out=mask[: len(part)])
        total += int(np.count_nonzero(mask[: len(part)]))
    return total


def _rust_regex_literal(name: str) -> str:
    """``name`` as a literal in the regex syntax polars uses (Rust's ``regex``): non-word characters hex-escaped."""
    return "".join(c if c.isalnum() or c == "_" else f"\\x{{{ord(c):X}}}" for c in name)


class PolarsJsonReader:
    """Reads a chunk of newline-separated JSON objects into a table of ``schema`` with polars, or declines.

    Build it with :meth:`for_schema` (None when the schema is not one the fast path reads); polars is
    imported on the first :meth:`read`. Thread-safe: the pause counter and the stats are the only state.

    Example::

        fast = PolarsJsonReader.for_schema(decoder_schema)
        table = fast.read(b"\\n".join(values), rows=len(values)) if fast else None
        if table is None: ...                                # the pyarrow path
        fast.stats                                           # {"read": 12, "declined": 1, "skipped": 1}
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        # A mapped name as a key (no escape inside: checked), counted when other members add ":"s.
        self._keys = '"(?:' + "|".join(_rust_regex_literal(n) for n in schema.names) + ')"[ \\t]*:'
        self._polars_schema: dict[str, Any] | None = None
        value_types = [f.type.value_type if pa.types.is_list(f.type) else f.type for f in schema]
        self._float_columns = [i for i, kind in enumerate(value_types) if pa.types.is_floating(kind)]
        self._float32 = {i: value_types[i] == pa.float32() for i in self._float_columns}
        self._lock = threading.Lock()
        self._pause = 0  # chunks left to the pyarrow path
        self._next_pause = 1
        self.stats = {"read": 0, "declined": 0, "skipped": 0}

    @classmethod
    def for_schema(cls, schema: pa.Schema) -> PolarsJsonReader | None:
        """A reader of ``schema``, or None when a column is not a number or number-list column, or a
        name could be written with an escape (``"``, ``\\``, ``/``, control characters)."""
        if not all(_supported(field.type) for field in schema) or any(_UNSAFE_NAME.search(n) for n in schema.names):
            return None
        return cls(schema)

    def read(self, text: bytes, rows: int) -> pa.Table | None:
        """``text`` as a table of the schema, or None where the pyarrow path must decide (module docstring).

        The caller guarantees ``text`` is ``rows`` JSON values, one a line, each starting with ``{`` and
        ending with ``}``, no raw newline inside one (:meth:`.JsonRecordDecoder._joined_if_clean`).
        """
        with self._lock:
            if self._pause:
                self._pause -= 1
                self.stats["skipped"] += 1
                return None
        table = None
        if text.find(b"\\") < 0 or text.find(b"\\u") < 0:  # memchr first: most chunks have no backslash
            import polars as pl

            try:
                table = self._parse(pl, text, rows)
            except (Exception, pl.exceptions.PanicException):  # any refusal: the pyarrow path decides
                table = None
        with self._lock:
            if table is None:
                self.stats["declined"] += 1
                self._pause, self._next_pause = self._next_pause, min(self._next_pause * 2, MAX_PAUSE)
            else:
                self.stats["read"] += 1
                self._next_pause = 1
        return table

    def _parse(self, pl: Any, text: bytes, rows: int) -> pa.Table | None:
        """The parse and the duplicate-key check (module docstring); raises whatever polars raises."""
        if self._polars_schema is None:
            self._polars_schema = {field.name: _polars_type(field.type) for field in self.schema}
        frame = pl.read_ndjson(text, schema=self._polars_schema)
        if frame.height != rows:
            return None
        values = sum(rows - nulls for nulls in frame.null_count().row(0))
        if count_byte(text, 0x3A) != values:  # ":": other members, or a dup
            as_text = pl.Series([text], dtype=pl.Binary).cast(pl.String)  # a copy, only here
            if as_text.str.count_matches(self._keys).item() != values:
                return None
        table = frame.rechunk().to_arrow()  # polars parses in parallel pieces: one chunk a column (4x cheaper here)
        zero = False
        for i in self._float_columns:
            for floats in _float_arrays(table.column(i)):
                if self._float32[i] and float32_midpoints(floats):
                    return None
                zero = zero or bool((floats == 0).any())
        if zero and _NEGATIVE_ZERO_INTEGER.search(text):  # "-0" reads as 0.0 in polars, -0.0 in pyarrow
            return None
        return table.cast(self.schema)
