"""Kafka record values (one JSON object each) decoded in bulk into Arrow tables of a spec's native columns.

Values are parsed against an explicit schema of the mapped fields only (:func:`json_schema`); unmapped
fields are ignored. A chunk of one-line objects whose id fields are read as integers first goes to one
polars parse (:mod:`.polars_json`, 2x faster), kept only where it provably gives what ``pyarrow.json``
gives; anything it declines (an undecodable record, string ids, a chunk it cannot vouch for) is parsed with
``pyarrow.json`` as below, which alone decides what is undecodable. A chunk that fails to parse is bisected
until the undecodable records are isolated, so one bad record costs O(log N) re-parses and never the chunk.
The record timestamp (event time, epoch ms) fills ``ts`` when the JSON has no such field.

Field types follow the source's column mapping: ``ts``, ``id`` int64, ``label`` float64, dense
float32 (or ``list<float32>``), a ``lists`` field ``list<int64>`` or ``list<string>``, a ``weights``
field ``list<float32>``. Categorical ids (``sparse`` fields and the values of ``lists`` fields) may be
JSON integers or JSON strings, and each value keeps its own JSON type: an integer is that id, a
string is hashed by :func:`~primus_dagster.data.hashing.stable_hash64` (by the normaliser, or here
where a chunk mixes both) -- the ids a Parquet column of those integers or strings gives, whatever
else the chunk holds. (Hashing the decimal text of the integers of a mixed field instead would give
the same value another id in a chunk that happens to hold a string, so it is not done.)

How, without per-record Python work: every id field is first read as integers -- the schema
and cost of an integer topic are exactly those of a spec without string ids. When ``pyarrow.json``
reports that an id field holds the other JSON type (``Column(/user_id) changed from number to
string``), the decoder switches that field to strings (``pa.string()``, ``list<string>``) and parses
again; the choice sticks for the decoder's later chunks. A field found holding both (within one
chunk, or switched a second time) is *mixed*: before each parse one bulk ``re.sub`` over the chunk's
text renames the key of its string values (``"user_id":"u7"`` -> ``"user_id\\u0000":"u7"``; for a
list, the lists whose first element is a string), the two columns are parsed side by side and merged
into int64 ids (strings hashed). A single list holding both integers and strings (``[1, "a"]``)
stays undecodable, as does an id of any other JSON type (a float, a boolean, an object).

A missing or null field is null, as before: the normaliser applies ``missing_field`` to dense,
sparse and id fields and reads a null list as empty (no id), which is what a missing ``lists`` field
means here too. A missing ``weights`` field of a present list is filled with weight 1 per id (the
normaliser's repair of a missing weight); a record whose weights and ids lists differ in length is
undecodable (counted, never the batch's failure).

Example::

    decoder = JsonRecordDecoder(spec)
    table, bad = decoder.decode(values, timestamps)  # native-column table (None if none decoded)
    bad                                              # [(index in values, error), ...]
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from primus_dagster.data.canonical import native_columns
from primus_dagster.data.hashing import stable_hash64
from primus_dagster.data.sources.kafka.polars_json import PolarsJsonReader, count_byte
from primus_dagster.spec.sources import ColumnMapping, KafkaSourceSpec

#: How an id field's JSON values are read: integers, strings, or both (:data:`SHADOW` column beside).
IdKind = Literal["int", "string", "mixed"]
#: Suffix of the column a mixed id field's string values are parsed into (a NUL: no real field's name).
SHADOW = "\x00"
_CONFLICT = re.compile(r"Column\((.+)\) changed from (number|string) to (number|string) in row")


def id_fields(mapping: ColumnMapping) -> dict[str, bool]:
    """The native fields whose ids may be JSON integers or strings, each with whether it is a list field.

    The ``sparse`` and ``lists`` fields of ``mapping``, less any that is also its ts, label, id or dense column.
    """
    dense = [mapping.dense] if isinstance(mapping.dense, str) else mapping.dense
    fixed = {mapping.ts, mapping.label, mapping.id, *dense}
    out: dict[str, bool] = {}
    for native, is_list in [(n, False) for _, n in mapping.sparse_pairs()] + [
        (n, True) for _, n in mapping.list_pairs()
    ]:
        if native not in fixed:
            out.setdefault(native, is_list)
    return out


def json_schema(spec: KafkaSourceSpec, kinds: Mapping[str, IdKind] | None = None) -> pa.Schema:
    """Explicit schema for decoding the JSON records of ``spec`` (only mapped fields).

    ``kinds``: how each id field (:func:`id_fields`) is read -- ``int`` (the default: int64,
    ``list<int64>``), ``string`` (``string``, ``list<string>``) or ``mixed`` (the int column, then
    ``<name>`` + :data:`SHADOW` of the strings).
    """
    m = spec.columns
    ids = id_fields(m)
    kinds = dict(kinds or {})
    unknown = sorted(set(kinds) - set(ids))
    if unknown:
        raise ValueError(f"{unknown} are not id fields of source {spec.name!r} (those are {sorted(ids)})")
    types: dict[str, pa.DataType] = {m.ts: pa.int64()}
    if m.label:
        types.setdefault(m.label, pa.float64() if m.label_positive is None else pa.string())
    if m.id:
        types.setdefault(m.id, pa.int64())
    dense = [m.dense] if isinstance(m.dense, str) else m.dense
    for name in dense:
        types.setdefault(name, pa.list_(pa.float32()) if isinstance(m.dense, str) else pa.float32())
    for _, native in m.sparse_pairs():
        types.setdefault(native, pa.int64())
    for _, native in m.list_pairs():
        types.setdefault(native, pa.list_(pa.int64()))
    for native in m.weights.values():
        types.setdefault(native, pa.list_(pa.float32()))
    fields: list[tuple[str, pa.DataType]] = []
    for name in native_columns(m):
        kind = kinds.get(name, "int")
        strings = pa.list_(pa.string()) if ids.get(name) else pa.string()
        fields.append((name, strings if kind == "string" else types[name]))
        if kind == "mixed":
            fields.append((name + SHADOW, strings))
    return pa.schema(fields)


def _is_strings(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or (pa.types.is_list(kind) and pa.types.is_string(kind.value_type))


def hashed_ids(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A ``string`` or ``list<string>`` column as ``int64`` / ``list<int64>`` ids (stable_hash64; nulls stay)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_list(column.type):
        return stable_hash64(column)
    mask = column.is_null() if column.null_count else None
    return pa.ListArray.from_arrays(column.offsets, stable_hash64(column.values), mask=mask)


def _mask(array: pa.Array) -> np.ndarray:
    """A boolean Arrow array as numpy (null: False)."""
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)


def _indices(keep: Sequence[int], good: list[tuple[int, int, pa.Table]]) -> np.ndarray:
    """The indices in the decoded values of the rows of the good chunks' tables, concatenated in order."""
    return np.concatenate([np.asarray(keep[lo:hi], dtype=np.int64) for lo, hi, _ in good])


@dataclass(frozen=True)
class _Plan:
    """How to parse a chunk: each id field's kind, the explicit schema, and the rewrites and merges of mixed fields."""

    kinds: Mapping[str, IdKind]
    parse_options: pj.ParseOptions
    #: (pattern, replacement) run over the text before parsing: a mixed field's string values to its shadow key.
    rewrites: tuple[tuple[re.Pattern[bytes], bytes], ...]
    mixed: tuple[str, ...]
    #: The polars fast path of a clean chunk (None: a schema it does not read, e.g. string ids).
    fast: PolarsJsonReader | None


def _shadow_rewrite(name: str, is_list: bool) -> tuple[re.Pattern[bytes], bytes]:
    """The bulk rewrite moving ``name``'s string values (lists starting with a string) to its shadow key.

    Matches the key only where a JSON key can stand: its opening quote unescaped (inside a string it
    would be ``\\"``), followed by ``:`` and a string (or ``[`` and a string).
    """
    key = json.dumps(name, ensure_ascii=False).encode()
    shadow = json.dumps(name + SHADOW, ensure_ascii=False).encode()
    opening = rb'\[\s*"' if is_list else rb'"'
    pattern = re.compile(re.escape(key) + rb"\s*:\s*" + opening)
    replacement = shadow + (b':["' if is_list else b':"')
    return pattern, replacement.replace(b"\\", b"\\\\")  # a template: backslashes doubled


def check_weights(table: pa.Table, weights: Sequence[tuple[str, str]]) -> tuple[pa.Table, np.ndarray | None]:
    """``table`` with missing weights lists of present ids lists filled with 1.0 per id, and the rows whose
    weights and ids lists differ in length (None: none); ``weights``: ``(ids column, weights column)`` pairs."""
    broken: np.ndarray | None = None
    for ids_name, weights_name in weights:
        ids, weights_column = table.column(ids_name).combine_chunks(), table.column(weights_name).combine_chunks()
        ids_len = pc.fill_null(pc.list_value_length(ids), 0).to_numpy().astype(np.int64)
        if weights_column.null_count:
            missing = _mask(pc.and_(weights_column.is_null(), ids.is_valid()))
            if missing.any():  # weight 1 per id, as the normaliser repairs a missing weight
                offsets = np.concatenate([[0], np.cumsum(np.where(missing, ids_len, 0))]).astype(np.int32)
                ones = pa.array(np.ones(int(offsets[-1]), np.float32))
                filled = pa.ListArray.from_arrays(pa.array(offsets), ones, mask=pa.array(~missing))
                weights_column = pc.coalesce(weights_column, filled)
                table = table.set_column(table.schema.get_field_index(weights_name), weights_name, weights_column)
        differ = pc.fill_null(pc.list_value_length(weights_column), 0).to_numpy().astype(np.int64) != ids_len
        if differ.any():
            broken = differ if broken is None else broken | differ
    return table, broken


def fill_ts(
    table: pa.Table, ts_column: str, rows: np.ndarray, timestamps: Sequence[int] | Callable[[], Sequence[int]]
) -> pa.Table:
    """``table`` with its null ``ts_column`` values filled from the record timestamps (``rows``: each table
    row's index in the records; ``timestamps``: theirs, epoch ms, or a function giving them)."""
    ts = table.schema.get_field_index(ts_column)
    stamps = timestamps() if callable(timestamps) else timestamps
    record_ts = pa.array(np.asarray(stamps, dtype=np.int64)[rows])
    return table.set_column(ts, ts_column, pc.coalesce(table.column(ts), record_ts))


#: The largest JSON block pyarrow reads (an int32 count of bytes): records up to this size decode.
MAX_BLOCK_BYTES = 2**31 - 1


class JsonRecordDecoder:
    """Decodes chunks of consumer records of one Kafka source; holds its schema and parse options.

    ``schema``: the schema of a topic whose ids are integers (the first parse of every id field);
    :attr:`id_kinds` says how each id field is read now (module docstring). ``fast=False`` leaves out the
    polars fast path (:mod:`.polars_json`): ``pyarrow.json`` only, the reference it is tested against.

    Example::

        decoder = JsonRecordDecoder(spec)
        decoder.schema                                  # pa.schema([("event_time", pa.int64()), ...])
        table, bad = decoder.decode([r.value for r in records], [r.timestamp for r in records])
        decoder.id_kinds                                # {"user_id": "string", "genres": "string"}
        decoder.fast_stats                              # {"read": 3, "declined": 0, "skipped": 0}
    """

    def __init__(self, spec: KafkaSourceSpec, fast: bool = True) -> None:
        self.spec = spec
        self._fast = fast
        self.schema = json_schema(spec)
        self.ts_column = spec.columns.ts
        self._id_fields = id_fields(spec.columns)
        self._pointers = {f"/{name}/[]" if is_list else f"/{name}": name for name, is_list in self._id_fields.items()}
        lists = dict(spec.columns.list_pairs())
        self._weights = [(lists[name], native) for name, native in spec.columns.weights.items()]
        # One thread: the reader's figure of merit is rows per CPU-second, and executors run one reader per core.
        self._read_options = pj.ReadOptions(use_threads=False, block_size=16 << 20)
        self._lock = threading.Lock()
        self._switches: dict[str, int] = {}
        self._plan = self._make_plan({})

    @property
    def fast_stats(self) -> dict[str, int]:
        """Chunks the polars fast path read, declined (parsed by pyarrow after it) and left to pyarrow unasked
        while it paused, under the current plan (all zero where it does not apply: string ids, ``fast=False``)."""
        fast = self._plan.fast
        return dict(fast.stats) if fast is not None else {"read": 0, "declined": 0, "skipped": 0}

    @property
    def id_kinds(self) -> dict[str, IdKind]:
        """How each id field is read now: ``int``, ``string`` or ``mixed`` (module docstring)."""
        return {name: self._plan.kinds.get(name, "int") for name in self._id_fields}

    def _make_plan(self, kinds: Mapping[str, IdKind]) -> _Plan:
        schema = json_schema(self.spec, kinds)
        mixed = tuple(name for name, kind in kinds.items() if kind == "mixed")
        return _Plan(
            kinds=dict(kinds),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
            rewrites=tuple(_shadow_rewrite(name, self._id_fields[name]) for name in mixed),
            mixed=mixed,
            fast=PolarsJsonReader.for_schema(schema) if self._fast else None,
        )

    def _adapted(self, plan: _Plan, error: str) -> _Plan | None:
        """The plan after ``error`` (a parse error under ``plan``), when it is an id field holding the other
        JSON type: that field switched to it, or mixed on its second switch; None for any other error."""
        found = _CONFLICT.search(error)
        name = self._pointers.get(found.group(1)) if found else None
        if name is None:
            return None
        with self._lock:
            if self._plan is not plan:  # another thread adapted meanwhile: try its plan first
                return self._plan
            kind = plan.kinds.get(name, "int")
            if kind == "mixed":  # a list holding both, or a conflict of the shadow column: undecodable
                return None
            self._switches[name] = self._switches.get(name, 0) + 1
            new: IdKind = "mixed" if self._switches[name] > 1 else ("string" if kind == "int" else "int")
            self._plan = self._make_plan({**plan.kinds, name: new})
            return self._plan

    def _read(self, text: bytes, plan: _Plan) -> pa.Table:
        """``text`` parsed under ``plan``; a mixed field's two columns merged into int64 ids."""
        for pattern, replacement in plan.rewrites:
            text = pattern.sub(replacement, text)
        options = self._read_options
        if len(text) > options.block_size:
            # A record longer than a block "straddles" it and would read as undecodable: take the whole
            # text as one block where the longest record needs it (JSON blocks are int32-sized).
            longest = max(map(len, text.split(b"\n")))
            if longest >= options.block_size:
                options = pj.ReadOptions(use_threads=False, block_size=min(len(text) + 1, MAX_BLOCK_BYTES))
        table = pj.read_json(io.BytesIO(text), read_options=options, parse_options=plan.parse_options)
        for name in plan.mixed:
            ints, strings = table.column(name), table.column(name + SHADOW)
            merged = pc.coalesce(ints.combine_chunks(), hashed_ids(strings))
            table = table.set_column(table.schema.get_field_index(name), name, merged)
            table = table.drop_columns([name + SHADOW])
        return table

    def _parse(self, text: bytes) -> pa.Table:
        """``text`` parsed under the current plan, adapting it (for good) while id fields hold the other type."""
        plan = self._plan
        while True:
            try:
                return self._read(text, plan)
            except pa.ArrowInvalid as exc:
                adapted = self._adapted(plan, str(exc))
                if adapted is None:
                    raise
                plan = adapted

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
            table = self._parse(joined if joined is not None else b"\n".join(lines[lo:hi]))
            if table.num_rows != hi - lo:
                raise ValueError(f"{table.num_rows} JSON values in {hi - lo} records (several objects in one?)")
            good.append((lo, hi, table))
        except (pa.ArrowException, ValueError) as exc:
            if hi - lo == 1:
                bad.append((lo, self._explained(str(exc).splitlines()[0])[:300]))
                return
            mid = (lo + hi) // 2
            self._parse_isolating(lines, lo, mid, good, bad)
            self._parse_isolating(lines, mid, hi, good, bad)

    def _explained(self, error: str) -> str:
        """A parse error with its fix where the cause is a declaration: a text label without
        ``columns.label_positive`` (every record of such a stream fails the same way)."""
        label = self.spec.columns.label
        if (
            label
            and self.spec.columns.label_positive is None
            and f"Column(/{label}) changed from number to string" in error
        ):
            return (
                f"label field {label!r} holds text, not a number: declare its positive value "
                f"(columns.label_positive: '<that value>', e.g. '>50K'); {error}"
            )
        return error

    @staticmethod
    def _joined_if_clean(values: Sequence[bytes | None]) -> bytes | None:
        """``values`` newline-joined when each is one line that starts with ``{`` and ends with ``}`` (else None).

        The common case, checked without a Python loop over the records (:func:`.polars_json.count_byte`
        counts the newlines).
        """
        n = len(values)
        if not n or None in values:
            return None
        joined = b"\n".join(values)  # type: ignore[arg-type]  # no None: checked above
        if count_byte(joined, 0x0A) != n - 1 or joined.find(b"\r") >= 0:
            return None
        text = np.frombuffer(joined, np.uint8)
        lengths = np.fromiter(map(len, values), np.int64, n)  # type: ignore[arg-type]
        if not lengths.all():
            return None
        ends = np.cumsum(lengths + 1) - 1  # where the newline after each value is (or would be)
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

    @staticmethod
    def _concat(tables: list[pa.Table]) -> pa.Table:
        """The chunks' tables as one; an id field read as strings in one chunk and as ints in another is
        hashed where it is strings (the ids the normaliser would give each)."""
        if len(tables) > 1 and any(not t.schema.equals(tables[0].schema) for t in tables[1:]):
            for i in range(tables[0].num_columns):
                if len({t.schema.field(i).type for t in tables}) > 1:
                    tables = [
                        t.set_column(i, t.schema.field(i).name, hashed_ids(t.column(i)))
                        if _is_strings(t.schema.field(i).type)
                        else t
                        for t in tables
                    ]
        return pa.concat_tables(tables).combine_chunks()

    def decode(
        self, values: Sequence[bytes | None], timestamps: Sequence[int] | Callable[[], Sequence[int]]
    ) -> tuple[pa.Table | None, list[tuple[int, str]]]:
        """The decoded values as one table (``None`` when none decodes) and the sorted ``(index, error)`` of the rest.

        ``timestamps`` (the record timestamps, epoch ms; or a function giving them, called only when some
        JSON value has no ``ts``) fill ``ts`` where the JSON has none.
        """
        bad: list[tuple[int, str]] = []
        good: list[tuple[int, int, pa.Table]] = []
        bad_lines: list[tuple[int, str]] = []
        joined = self._joined_if_clean(values)
        if joined is not None:
            keep: Sequence[int] = range(len(values))
            fast = self._plan.fast
            table = fast.read(joined, len(values)) if fast is not None else None
            if table is not None:
                good.append((0, len(values), table))
            else:
                self._parse_isolating(values, 0, len(values), good, bad_lines, joined)  # type: ignore[arg-type]
        else:
            keep, lines = self._lines(values, bad)
            if lines:
                self._parse_isolating(lines, 0, len(lines), good, bad_lines)
        bad += [(keep[j], err) for j, err in bad_lines]
        if not good:
            return None, sorted(bad)
        table = self._concat([t for _, _, t in good])
        rows: np.ndarray | None = None  # the table's rows' indices in values, once needed
        if self._weights:
            table, broken = check_weights(table, self._weights)
            if broken is not None:
                rows = _indices(keep, good)
                bad += [(int(i), "weights and ids lists differ in length") for i in rows[broken]]
                table, rows = table.filter(pa.array(~broken)), rows[~broken]
                if not table.num_rows:
                    return None, sorted(bad)
        if table.column(self.ts_column).null_count:  # the record timestamp fills a missing ts
            rows = _indices(keep, good) if rows is None else rows
            table = fill_ts(table, self.ts_column, rows, timestamps)
        return table, sorted(bad)
