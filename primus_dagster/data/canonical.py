"""The canonical sample schema every adapter normalises to, and the vectorised normaliser.

Canonical columns, in order:
``sample_id`` int64 (nullable when the source has no id), ``ts`` timestamp[us, UTC],
``label`` float32 (null = not yet labelled), ``dense`` fixed_size_list<float32>[n],
one int64 column per sparse feature, one ``list<int64>`` column per list feature (with a
``list<float32>`` ``<name>.weights`` column where the source maps its weights), ``source`` and
``kind`` (dictionary strings). String, binary and dictionary ids are hashed to int64 by
:func:`~primus_dagster.data.hashing.stable_hash64`; a missing dense value is NaN (the model's
transform fills it, :class:`~primus_dagster.training.features.DenseTransform`).

Data quality: the normaliser applies the source's ``quality`` policy (see
:class:`~primus_dagster.spec.sources.QualityPolicy`) -- every row that breaks a rule (NaN/+-inf
dense values, null labels, null or out-of-partition event times, ids that do not convert, Kafka
records missing fields) is counted per rule in :attr:`Normalizer.counts` and repaired, dropped, or
fails the read with :class:`DataQualityError` naming the file and column. Vectorised: a few Arrow
kernels and numpy passes per batch, no per-row Python.

Example::

    norm = Normalizer(source_spec)
    for batch in native_batches:
        yield norm(batch, where=uri, partition=start)   # no per-row Python work
    norm.take()                                          # {"dense_invalid": 3, "null_label": 1}
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.data.hashing import is_hashable_category, stable_hash64
from primus_dagster.spec.dataset import granularity_step
from primus_dagster.spec.sources import REPAIRS, ColumnMapping, QualityAction, SourceSpec

TS_TYPE = pa.timestamp("us", tz="UTC")
#: Canonical fields a reader may leave out (``fields=``): every trainer needs label, dense and sparse.
OPTIONAL_FIELDS = ("sample_id", "ts")
#: The canonical column of a list feature's pooling weights: ``<list name>`` + this.
WEIGHTS_SUFFIX = ".weights"
#: The canonical fields (sparse: every sparse feature column).
FIELDS = ("sample_id", "ts", "label", "dense", "sparse")
#: The serving layout's dense columns: ``dense.0``, ``dense.1``, ... (see :func:`split_dense_schema`).
DENSE_PART = "dense."


def split_dense_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its ``dense`` column (fixed-size list of float32, width n) as n float32 columns
    ``dense.0 .. dense.{n-1}`` in its place: the layout data executors serve (the normaliser's
    ``split_dense``). The dense matrix is then never interleaved on the serving path -- decoded columns
    go into the shared-memory slot as they are, and the reader's ``Batch.dense`` is a column-major view
    over them; ``Batch.columns`` interleaves it only when something asks for the canonical columns.

    >>> split_dense_schema(pa.schema([("label", pa.float32()), ("dense", pa.list_(pa.float32(), 2))])).names
    ['label', 'dense.0', 'dense.1']
    """
    index = schema.get_field_index("dense")
    if index < 0:
        return schema
    width = schema.field(index).type.list_size
    parts = [pa.field(f"{DENSE_PART}{i}", pa.float32()) for i in range(width)]
    fields = list(schema)
    return pa.schema([*fields[:index], *parts, *fields[index + 1 :]], metadata=schema.metadata)


def dense_parts(schema: pa.Schema) -> list[int] | None:
    """The indices of a split dense matrix's columns (``dense.0`` ...) in ``schema``; None when the
    schema has none (a canonical schema, or no dense feature)."""
    first = schema.get_field_index(f"{DENSE_PART}0")
    if first < 0:
        return None
    out = [first]
    while out[-1] + 1 < len(schema) and schema.field(out[-1] + 1).name == f"{DENSE_PART}{len(out)}":
        out.append(out[-1] + 1)
    return out


def join_dense_schema(schema: pa.Schema) -> pa.Schema:
    """The canonical schema of a split one (:func:`split_dense_schema` undone)."""
    parts = dense_parts(schema)
    if parts is None:
        return schema
    fields = list(schema)
    dense = pa.field("dense", pa.list_(pa.float32(), len(parts)))
    return pa.schema([*fields[: parts[0]], dense, *fields[parts[-1] + 1 :]], metadata=schema.metadata)


def join_dense(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of the split layout as canonical: its dense columns interleaved into the ``dense``
    fixed-size list (null -> NaN); a canonical batch as it is."""
    parts = dense_parts(batch.schema)
    if parts is None:
        return batch
    n = batch.num_rows
    columns = [batch.column(i) for i in parts]
    names = [f"{DENSE_PART}{i}" for i in range(len(parts))]
    matrix = pa.RecordBatch.from_arrays(columns, names=names).to_tensor(null_to_nan=True, row_major=True)
    values = pa.array(np.asarray(matrix).reshape(n * len(parts)))
    arrays = [*batch.columns[: parts[0]], pa.FixedSizeListArray.from_arrays(values, len(parts))]
    arrays += batch.columns[parts[-1] + 1 :]
    return pa.RecordBatch.from_arrays(arrays, schema=join_dense_schema(batch.schema))


def split_dense(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A canonical batch in the split layout (its ``dense`` column as ``dense.0`` ...); one copy of the
    dense values. A batch without a ``dense`` column, or already split, as it is."""
    index = batch.schema.get_field_index("dense")
    if index < 0:
        return batch
    dense = batch.column(index)
    width, n = dense.type.list_size, batch.num_rows
    values = dense.values.slice(dense.offset * width, n * width).to_numpy(zero_copy_only=False)
    matrix = np.asarray(values, dtype=np.float32).reshape(n, width)
    if dense.null_count:
        matrix = matrix.copy()
        matrix[dense.is_null().to_numpy(zero_copy_only=False)] = np.nan
    columns = [pa.array(np.ascontiguousarray(matrix[:, i])) for i in range(width)]
    arrays = [*batch.columns[:index], *columns, *batch.columns[index + 1 :]]
    return pa.RecordBatch.from_arrays(arrays, schema=split_dense_schema(batch.schema))


#: The data-quality rules, in the order they are checked (a ``fail`` names the first one broken).
QUALITY_RULES = tuple(REPAIRS)
_INT64_MAX = 2**63 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class PermanentDataError(ValueError):
    """Reading the same data again cannot help (a schema, type or data-quality failure): not retried."""


class SchemaMismatchError(PermanentDataError):
    """Native data does not fit the source's column mapping (missing column, wrong type)."""


class DataQualityError(PermanentDataError):
    """Rows break a data-quality rule whose action is ``fail``; the message names where, the column and the rule."""

    def __init__(self, message: str, rule: str, column: str):
        super().__init__(message)
        self.rule, self.column = rule, column


def is_permanent(exc: BaseException) -> bool:
    """True when ``exc`` or one of its causes is a :class:`PermanentDataError` (retrying cannot help).

    >>> is_permanent(SchemaMismatchError("f.parquet: column 'a' is missing"))
    True
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, PermanentDataError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def check_fields(fields: Iterable[str] | None) -> frozenset[str] | None:
    """``fields`` as a set (None: all); ValueError for unknown names or a required field left out.

    >>> sorted(check_fields(["label", "dense", "sparse", "ts"]))
    ['dense', 'label', 'sparse', 'ts']
    """
    if fields is None:
        return None
    chosen = frozenset(fields)
    unknown = chosen - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown canonical fields {sorted(unknown)}; choose from {list(FIELDS)}")
    missing = set(FIELDS) - set(OPTIONAL_FIELDS) - chosen
    if missing:
        raise ValueError(f"fields must include {sorted(missing)}; only {list(OPTIONAL_FIELDS)} may be left out")
    return chosen


def canonical_schema(
    mapping: ColumnMapping, dense_width: int, fields: frozenset[str] | None = None, constants: bool = True
) -> pa.Schema:
    """The canonical Arrow schema for a column mapping with ``dense_width`` dense features (none: no
    ``dense`` column, Arrow has no fixed-size list of 0); with ``fields`` (see :func:`check_fields`)
    only those, without ``constants`` no ``source``/``kind``."""
    out = [
        pa.field("sample_id", pa.int64()),
        pa.field("ts", TS_TYPE, nullable=False),
        pa.field("label", pa.float32()),
    ]
    if dense_width:
        out.append(pa.field("dense", pa.list_(pa.float32(), dense_width)))
    if fields is not None:
        out = [f for f in out if f.name in fields]
    out += [pa.field(name, pa.int64()) for name, _ in mapping.sparse_pairs()]
    for name, _ in mapping.list_pairs():
        out.append(pa.field(name, pa.list_(pa.int64()), nullable=False))
        if name in mapping.weights:
            out.append(pa.field(name + WEIGHTS_SUFFIX, pa.list_(pa.float32()), nullable=False))
    if constants:
        out += [
            pa.field("source", pa.dictionary(pa.int32(), pa.string()), nullable=False),
            pa.field("kind", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        ]
    return pa.schema(out)


def declared_schema(mapping: ColumnMapping) -> pa.Schema:
    """The canonical schema a source with column mapping ``mapping`` reads as, from the spec alone: the
    dense width is the number of dense columns (a single list column's width is only known from its data:
    a variable-size list here)."""
    dense = mapping.dense
    return canonical_schema(mapping, len(dense) if isinstance(dense, list) else -1)


def schema_hash(schema: pa.Schema) -> str:
    """Short stable hash of a schema's field names and types (for asset metadata)."""
    text = ";".join(f"{f.name}:{f.type}" for f in schema)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def native_columns(mapping: ColumnMapping, fields: frozenset[str] | None = None) -> list[str]:
    """The native columns a reader must project for this mapping (for ``fields`` only, when given)."""
    cols = [mapping.ts] if fields is None or "ts" in fields else []
    cols += [c for c in (mapping.label, mapping.id if fields is None or "sample_id" in fields else None) if c]
    cols += [mapping.dense] if isinstance(mapping.dense, str) else list(mapping.dense)
    cols += [native for _, native in mapping.sparse_pairs()]
    cols += [native for _, native in mapping.list_pairs()]
    cols += list(mapping.weights.values())
    return list(dict.fromkeys(cols))


_DONE = {"repair": "repaired", "drop": "dropped", "fail": "failed"}


def quality_summary(
    spec: SourceSpec, counts: Mapping[str, int], columns: Mapping[str, Sequence[str]] | None = None
) -> str:
    """One line for the run log: the rows of ``spec``'s source touched per rule, in which native ``columns``
    (``{rule: [column]}``, where known) and what was done to them.

    >>> quality_summary(spec, {"bad_id": 12, "null_label": 3}, {"bad_id": ["user_id"]})  # doctest: +SKIP
    'clicks: 12 rows bad_id in column user_id (repaired: sparse id -> 0, sample id -> null), 3 rows null_label (dropped)'
    """
    actions = spec.quality.actions(spec.kind)
    parts = []
    for rule, rows in sorted(counts.items()):
        action = actions.get(rule)  # None: undecodable_record, always skipped
        what = "skipped" if action is None else _DONE[action] + (f": {REPAIRS[rule]}" if action == "repair" else "")
        names = list((columns or {}).get(rule, ()))
        where = f" in column{'s' if len(names) > 1 else ''} {', '.join(names)}" if names else ""
        parts.append(f"{rows:,} row{'' if rows == 1 else 's'} {rule}{where} ({what})")
    return f"{spec.name}: " + ", ".join(parts)


class _Columns:
    """A native batch's columns by name (``RecordBatch.schema`` builds a new schema object per access:
    looked up once per batch, not once per column)."""

    __slots__ = ("batch", "index", "where")

    def __init__(self, batch: pa.RecordBatch, where: str):
        self.batch, self.where = batch, where
        self.index = {name: i for i, name in enumerate(batch.schema.names)}

    def __call__(self, name: str) -> pa.Array:
        index = self.index.get(name)
        if index is None:
            raise SchemaMismatchError(f"{self.where}: column {name!r} is missing (have {list(self.index)})")
        return self.batch.column(index)


def _column(batch: pa.RecordBatch | _Columns, name: str, where: str) -> pa.Array:
    columns = batch if isinstance(batch, _Columns) else _Columns(batch, where)
    return columns(name)


def _all_finite(values: np.ndarray) -> bool:
    """True when every value is finite (one pass)."""
    return bool(np.isfinite(values).all())


#: The units an integer event-time column may hold (``columns.ts_unit``), as Arrow names them.
EPOCH_UNITS = ("s", "ms", "us", "ns")


def _epochs(ints: pa.Array, unit: str, where: str) -> pa.Array:
    """Integer epochs in ``unit`` as ``TS_TYPE`` (nanoseconds truncated to microseconds)."""
    try:
        return ints.cast(pa.int64()).cast(pa.timestamp(unit, tz="UTC")).cast(TS_TYPE, safe=unit != "ns")
    except pa.ArrowInvalid as exc:  # out of the timestamp range in that unit
        raise SchemaMismatchError(
            f"{where}: the ts column read as epoch {unit} (columns.ts_unit) is out of the timestamp range ({exc}); "
            f"declare the unit its integers count in: one of {', '.join(EPOCH_UNITS)}"
        ) from exc


def _to_ts(array: pa.Array, where: str, unit: str = "ms") -> pa.Array:
    """The event-time column as ``TS_TYPE``: timestamps (naive ones read as UTC), or integer epochs in
    ``unit`` (``columns.ts_unit``; Kafka and JSON carry milliseconds)."""
    if pa.types.is_timestamp(array.type):
        if array.type.tz is None:
            array = array.cast(pa.timestamp(array.type.unit, tz="UTC"))
        return array.cast(TS_TYPE)
    if pa.types.is_integer(array.type):
        return _epochs(array, unit, where)
    raise SchemaMismatchError(
        f"{where}: ts column has type {array.type}; expected a timestamp or integer epochs (columns.ts_unit)"
    )


def _inside(ts: pa.Array, start: pa.Scalar, end: pa.Scalar) -> int:
    """How many of ``ts`` lie in ``[start, end)``."""
    return int(pc.sum(pc.and_(pc.greater_equal(ts, start), pc.less(ts, end))).as_py() or 0)


def _misread_times(native: pa.Array, column: str, unit: str, start: pa.Scalar, end: pa.Scalar) -> str:
    """Why most event times of a read fall outside its partition ``[start, end)``, and the fix: for
    integer epochs, the unit in which they would fall inside (if one does)."""
    rows = len(native) - native.null_count
    outside = rows - _inside(_to_ts(native, column, unit), start, end)
    span = f"[{start.as_py().isoformat()}, {end.as_py().isoformat()})"
    said = f"column {column!r}: {outside:,} of {rows:,} event times fall outside the partition {span}"
    if not pa.types.is_integer(native.type):
        return f"{said}: the timestamps are of another time -- is the file in its partition's directory?"
    fits = dict.fromkeys((u for u in EPOCH_UNITS if u != unit), 0)
    for other in fits:
        try:
            fits[other] = _inside(_epochs(native, other, column), start, end)
        except SchemaMismatchError:
            continue  # out of range in that unit: not it
    best = max(fits, key=lambda u: fits[u])
    if 2 * fits[best] > rows:
        return (
            f"{said} read as epoch {unit} (columns.ts_unit: {unit}); as epoch {best} {fits[best]:,} fall inside: "
            f"declare `ts_unit: {best}` in the source's columns"
        )
    return f"{said} read as epoch {unit} (columns.ts_unit: {unit}), and in no other epoch unit: is it the event time?"


def _numeric(array: pa.Array, target: pa.DataType, what: str, where: str) -> pa.Array:
    if array.type == target:
        return array
    if not (
        pa.types.is_integer(array.type)
        or pa.types.is_floating(array.type)
        or pa.types.is_boolean(array.type)
        or pa.types.is_null(array.type)
    ):
        hint = ""
        if what.startswith("dense column") and is_hashable_category(array.type):
            hint = ": a categorical column belongs in columns.sparse (its values are hashed to ids)"
        elif what.startswith("dense column") and _is_list(array.type):
            hint = ": a list of ids belongs in columns.lists"
        raise SchemaMismatchError(f"{where}: {what} has type {array.type}; expected a number{hint}")
    # Unsafe: a float of any size becomes a float32 (an overflow is +-inf, which the dense rule
    # catches), an int64 beyond 2^24 loses low bits as it must.
    return pc.cast(array, target, safe=False)


def _label(array: pa.Array, column: str, positive: str | None, where: str) -> pa.Array:
    """The label column as float32: numbers as they are; with ``columns.label_positive``, string labels
    as 1.0 where the value (surrounding whitespace trimmed) is that one, else 0.0 (a null stays null)."""
    what = f"label column {column!r}"
    if positive is None:
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type) or pa.types.is_dictionary(array.type):
            seen = pc.unique(pc.utf8_trim_whitespace(pc.cast(array, pa.string())).drop_null())[:3].to_pylist()
            raise SchemaMismatchError(
                f"{where}: {what} has type {array.type} (values such as {seen}); expected a number: declare which "
                "value is a positive in the source's columns, `label_positive: '<that value>'`"
            )
        return _numeric(array, pa.float32(), what, where)
    if not is_hashable_category(array.type):
        raise SchemaMismatchError(
            f"{where}: {what} has type {array.type}; columns.label_positive maps string labels: drop it for a "
            "numeric label"
        )
    text = pc.utf8_trim_whitespace(pc.cast(array, pa.string()))
    return pc.cast(pc.equal(text, pa.scalar(positive.strip())), pa.float32())


def _mask(array: pa.Array) -> np.ndarray:
    """A boolean Arrow array as numpy (null: False)."""
    if array.null_count:
        array = pc.fill_null(array, False)
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


def _ids(
    array: pa.Array, what: str, where: str, *, categories: bool = False
) -> tuple[pa.Array, np.ndarray | None, np.ndarray | None]:
    """``array`` as int64 (bad values null), the rows that are null, and the non-null rows that do not convert
    (NaN, not whole, out of int64 range); a mask is None where it has no row. ``categories``: strings,
    binaries and dictionaries of them are ids too, by :func:`~primus_dagster.data.hashing.stable_hash64`.
    Anything else: SchemaMismatchError."""
    kind = array.type
    nulls = _mask(array.is_null()) if array.null_count else None
    if categories and is_hashable_category(kind):
        return stable_hash64(array), nulls, None
    if not (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind) or pa.types.is_null(kind)
    ):
        expected = "an integer or a string (hashed to an id)" if categories else "an integer"
        hint = (
            "; it is a list column: map it in columns.lists (a categorical_list feature), not columns.sparse"
            if categories and _is_list(kind)
            else ""
        )
        raise SchemaMismatchError(f"{where}: {what} has type {kind}; expected {expected}{hint}")
    if kind == pa.int64():
        return array, nulls, None
    bad: pa.Array | None = None
    if pa.types.is_floating(kind):
        values = array.cast(pa.float64())
        whole = pc.and_(pc.equal(pc.floor(values), values), pc.is_finite(values))
        in_range = pc.and_(pc.greater_equal(values, -(2.0**63)), pc.less(values, 2.0**63))
        bad = pc.invert(pc.and_(whole, in_range))
    elif kind == pa.uint64():
        bad = pc.greater(array, pa.scalar(_INT64_MAX, pa.uint64()))
    if bad is not None and pc.any(bad).as_py():
        array = pc.if_else(bad, pa.nulls(len(array), kind), array)
        bad_rows = _mask(bad)
    else:
        bad_rows = None
    return pc.cast(array, pa.int64(), safe=False), nulls, bad_rows


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _list_parts(array: pa.Array, what: str, where: str) -> tuple[np.ndarray, pa.Array]:
    """A list column's offsets (int32, from 0; a null list is empty) and its values (those of the rows only)."""
    if not _is_list(array.type):
        raise SchemaMismatchError(
            f"{where}: {what} has type {array.type}; expected a list (list<int> or list<string>); "
            "a column of one id per row belongs in columns.sparse"
        )
    if pa.types.is_fixed_size_list(array.type):
        array = array.cast(pa.list_(array.type.value_type))
    if array.null_count:
        array = pc.if_else(array.is_null(), pa.scalar([], array.type), array)
    offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    if last - first > np.iinfo(np.int32).max:
        raise SchemaMismatchError(f"{where}: {what} holds more than 2^31 values in one batch: lower batch_rows")
    return (offsets - first).astype(np.int32), array.values.slice(first, last - first)


def _any(*masks: np.ndarray | None) -> np.ndarray | None:
    present = [m for m in masks if m is not None]
    if not present:
        return None
    out = present[0]
    for m in present[1:]:
        out = out | m
    return out


#: How many distinct breaking values of a column :class:`Normalizer` keeps per rule (``examples``).
QUALITY_EXAMPLES = 3


def _examples(values: pa.Array, rows: np.ndarray) -> list[str]:
    """A few distinct values of ``values`` at ``rows``, as text (null: ``"null"``)."""
    hits = values.take(pa.array(np.flatnonzero(rows)[: 16 * QUALITY_EXAMPLES]))
    text = [v if v is not None else "null" for v in pc.cast(hits, pa.string()).to_pylist()]
    return list(dict.fromkeys(text))[:QUALITY_EXAMPLES]


class _Rules:
    """The quality checks of one batch: the rows breaking each rule (a row counts once per rule, however
    many of its columns break it), a few breaking values per rule and column, the rows to drop; raises on
    ``fail``."""

    def __init__(self, actions: dict[str, QualityAction], n: int, where: str):
        self.actions, self.n, self.where = actions, n, where
        self.rows: dict[str, np.ndarray] = {}
        self.examples: dict[tuple[str, str], list[str]] = {}
        self.drop: np.ndarray | None = None

    def check(
        self, rule: str, rows: np.ndarray | None, column: str, detail: str = "", values: pa.Array | None = None
    ) -> bool:
        """Note ``rows`` (a boolean mask) under ``rule`` (and a few of ``values``, the column's, at them);
        True when they must be repaired."""
        if rows is None or not rows.any():
            return False
        examples = _examples(values, rows) if values is not None else []
        action = self.actions[rule]
        if action == "fail":
            hits, first = int(np.count_nonzero(rows)), int(np.argmax(rows))
            raise DataQualityError(
                f"{self.where}: column {column!r}: {hits} of {self.n} rows break the data-quality rule {rule}"
                f"{detail} (first: row {first} of the batch{', values ' + ', '.join(examples) if examples else ''}); "
                f"the source's quality.{rule} is 'fail' (repair would be: {REPAIRS[rule]})",
                rule,
                column,
            )
        self.examples.setdefault((rule, column), examples)
        seen = self.rows.get(rule)
        self.rows[rule] = rows if seen is None else seen | rows
        if action == "drop":
            self.drop = rows if self.drop is None else self.drop | rows
            return False
        return True

    def count(self, counts: Counter[str], examples: dict[tuple[str, str], list[str]]) -> None:
        for rule, rows in self.rows.items():
            counts[rule] += int(np.count_nonzero(rows))
        for key, values in self.examples.items():
            kept = examples.setdefault(key, [])
            kept += [v for v in values if v not in kept][: QUALITY_EXAMPLES - len(kept)]


class Normalizer:
    """Turns native record batches of one source into canonical record batches, applying its quality policy.

    ``split_dense``: the serving layout (:func:`split_dense_schema`): the dense matrix as one float32
    column per feature, which the decoder's columns usually are already -- no interleaving pass.

    ``fields`` (default: all): the canonical fields to produce -- ``sample_id`` and ``ts`` may be
    left out when no consumer reads them (a data executor serving trainers that only train), so
    their native columns are neither decoded nor copied, nor checked (the event-time rules then do
    not run: nothing served depends on the event time). ``constants=False``: no ``source``/``kind``
    columns (a :class:`~primus_dagster.data.batch.Batch` carries them in its metadata).

    :attr:`counts` holds the rows touched per quality rule since the last :meth:`take`.

    Example::

        norm = Normalizer(spec)
        out = norm(native, where="s3://b/part-0.parquet", partition=hour)
        norm.take()                        # {"null_label": 2}: rows repaired, dropped or failed
    """

    def __init__(
        self,
        spec: SourceSpec,
        dense_width: int | None = None,
        *,
        fields: Iterable[str] | None = None,
        constants: bool = True,
        split_dense: bool = False,
    ):
        self.spec = spec
        #: Produce the dense matrix as its columns ``dense.0`` ... (:func:`split_dense_schema`), not as the
        #: interleaved ``dense`` list: what a data executor serves.
        self.split_dense = split_dense
        self.mapping = spec.columns
        self.fields = check_fields(fields)
        self.constants = constants
        if dense_width is None and isinstance(self.mapping.dense, list):
            dense_width = len(self.mapping.dense)
        self.dense_width = dense_width
        self.actions = spec.quality.actions(spec.kind)
        self.kafka = spec.type == "kafka"  # nulls in a JSON record are missing fields
        self.step = granularity_step(spec.granularity)
        self.counts: Counter[str] = Counter()
        #: (rule, native column) -> a few distinct values breaking it, as text, since the last :meth:`take`.
        self.examples: dict[tuple[str, str], list[str]] = {}
        # A read whose event times mostly fall outside its partition fails (a misdeclared column, not stray
        # rows); a partition scan (the source asset's checks) turns it off and reports them in its checks.
        self.fail_on_misread_times = True
        self._source = pa.array([spec.name]).dictionary_encode()
        self._kind = pa.array([spec.kind]).dictionary_encode()
        self.schema: pa.Schema | None = self._schema(dense_width) if dense_width is not None else None
        self._split_schema: tuple[pa.Schema, pa.Schema] | None = None  # (schema, its split layout)

    def _schema(self, dense_width: int) -> pa.Schema:
        return canonical_schema(self.mapping, dense_width, self.fields, self.constants)

    def wants(self, field: str) -> bool:
        return self.fields is None or field in self.fields

    def broken_columns(self) -> dict[str, list[str]]:
        """The native columns whose values broke each rule since the last :meth:`take` (call it first)."""
        columns: dict[str, list[str]] = {}
        for rule, column in self.examples:
            columns.setdefault(rule, []).append(column)
        return {rule: sorted(set(names)) for rule, names in sorted(columns.items())}

    def take(self) -> dict[str, int]:
        """The rows touched per rule since the last call (only rules with rows), and reset."""
        out = {rule: n for rule, n in self.counts.items() if n}
        self.counts.clear()
        self.examples.clear()
        return out

    def _dense_matrix(
        self, batch: pa.RecordBatch | _Columns, n: int, where: str
    ) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
        """The dense values as an [n, width] float32 matrix (null -> NaN), the null mask (None: no null) and the
        column names (one per matrix column; a list column repeats its name)."""
        dense = self.mapping.dense
        if isinstance(dense, str):
            column = _column(batch, dense, where)
            if not (
                pa.types.is_list(column.type)
                or pa.types.is_fixed_size_list(column.type)
                or pa.types.is_large_list(column.type)
            ):
                raise SchemaMismatchError(f"{where}: dense column {dense!r} has type {column.type}; expected a list")
            width = self.dense_width
            values = _numeric(column.flatten(), pa.float32(), f"dense column {dense!r}", where)
            if width is None:
                width = len(values) // n if n else 0
                self.dense_width = width
                self.schema = self._schema(width)
            if len(values) != n * width:
                raise SchemaMismatchError(f"{where}: dense lists in {dense!r} are not all of length {width}")
            nulls = _mask(values.is_null()).reshape(n, width) if values.null_count else None
            matrix = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(n, width)
            return matrix, nulls, [dense] * width
        if not dense:  # no dense feature: a [n, 0] matrix
            return np.zeros((n, 0), dtype=np.float32), None, []
        columns = [
            _numeric(_column(batch, name, where), pa.float32(), f"dense column {name!r}", where) for name in dense
        ]
        nulls = None
        if any(c.null_count for c in columns):
            nulls = np.stack([_mask(c.is_null()) if c.null_count else np.zeros(n, bool) for c in columns], axis=1)
        # Arrow's row-major tensor conversion interleaves the columns in C++ (nulls -> NaN).
        tensor = pa.RecordBatch.from_arrays(columns, names=dense).to_tensor(null_to_nan=True, row_major=True)
        return np.asarray(tensor).reshape(n, len(dense)), nulls, list(dense)

    def _dense_parts(self, batch: _Columns, where: str) -> list[pa.Array] | None:
        """The split layout's dense columns as they are (cast to float32) when none has a null or a
        non-finite value -- the common case, no dense rule to apply and nothing interleaved; else None."""
        dense = self.mapping.dense
        if not isinstance(dense, list):
            return None
        columns = []
        for name in dense:
            column = _numeric(batch(name), pa.float32(), f"dense column {name!r}", where)
            if column.null_count or not _all_finite(column.to_numpy(zero_copy_only=False)):
                return None
            columns.append(column)
        return columns

    def _dense(
        self, batch: pa.RecordBatch | _Columns, n: int, where: str, rules: _Rules
    ) -> pa.Array | list[pa.Array] | None:
        """The ``dense`` column (None: no dense feature), or with :attr:`split_dense` its columns."""
        if self.split_dense and isinstance(batch, _Columns):
            parts = self._dense_parts(batch, where)
            if parts is not None:
                return parts or None
        out = self._dense_fixed(batch, n, where, rules)
        if out is None or not self.split_dense:
            return out
        width = out.type.list_size
        matrix = out.values.to_numpy(zero_copy_only=False).reshape(n, width)
        return [pa.array(np.ascontiguousarray(matrix[:, i])) for i in range(width)]

    def _dense_fixed(self, batch: pa.RecordBatch | _Columns, n: int, where: str, rules: _Rules) -> pa.Array | None:
        matrix, nulls, names = self._dense_matrix(batch, n, where)
        if not names:
            return None  # no dense feature: no dense column
        if nulls is None and _all_finite(matrix):  # the common case: one pass, no mask
            return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])
        finite = np.isfinite(matrix)
        invalid = ~finite
        if nulls is not None and self.kafka:  # a missing field, not an invalid value
            missing_rows = np.asarray(nulls.any(axis=1))
            invalid &= ~nulls
            rules.check("missing_field", missing_rows, names[int(np.argmax(nulls.any(axis=0)))])
        if invalid.any():
            rows = np.asarray(invalid.any(axis=1))
            column = names[int(np.argmax(invalid.any(axis=0)))]
            rules.check("dense_invalid", rows, column, " (NaN, +-inf or null)")
        if invalid.any():
            # repair (or rows about to be dropped): every non-finite value is missing (NaN), which the model's
            # transform fills (training.features.dense[].fill)
            matrix = np.where(finite, matrix, np.float32(np.nan))
        width = matrix.shape[1] if matrix.ndim == 2 else 0
        return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), width)

    def _id_column(
        self, batch: pa.RecordBatch | _Columns, native: str, what: str, where: str, rules: _Rules
    ) -> pa.Array:
        """An id column as int64 after the ``bad_id`` / ``missing_field`` rules; repaired values are null.
        Sparse columns and sample ids may hold strings: hashed by
        :func:`~primus_dagster.data.hashing.stable_hash64` (a sample id stays the same id on every read, so
        the exactly-once checks hold; two distinct strings share an id with a 64-bit hash's odds)."""
        column = _column(batch, native, where)
        ids, nulls, bad = _ids(column, f"{what} {native!r}", where, categories=True)
        if self.kafka:
            rules.check("missing_field", nulls, native)
            rules.check("bad_id", bad, native, " (NaN, not whole or out of int64 range)", values=column)
        else:
            rules.check(
                "bad_id", _any(nulls, bad), native, " (null, NaN, not whole or out of int64 range)", values=column
            )
        return ids

    def _list_columns(self, cols: _Columns, where: str, rules: _Rules) -> list[pa.Array]:
        """Each list column as ``list<int64>`` (ids hashed like sparse ones; a null id is ``bad_id``, a null
        list is empty), followed by its weights where mapped (``list<float32>``, one per id; missing -> 1)."""
        out = []
        for name, native in self.mapping.list_pairs():
            what = f"list column {native!r}"
            offsets, values = _list_parts(cols(native), what, where)
            ids, nulls, bad = _ids(values, f"the values of {what}", where, categories=True)
            if nulls is not None or bad is not None:
                rows_of_values = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
                broken = np.zeros(len(offsets) - 1, dtype=bool)
                broken[rows_of_values[_any(nulls, bad)]] = True
                rules.check("bad_id", broken, native, " (a null, NaN, not whole or out-of-range id in the list)")
            out.append(pa.ListArray.from_arrays(pa.array(offsets), pc.fill_null(ids, 0) if ids.null_count else ids))
            weights_native = self.mapping.weights.get(name)
            if weights_native is not None:
                w_what = f"weights column {weights_native!r}"
                w_offsets, w_values = _list_parts(cols(weights_native), w_what, where)
                if not np.array_equal(w_offsets, offsets):
                    raise SchemaMismatchError(
                        f"{where}: {w_what} does not hold one weight per id of {what} (its list lengths differ)"
                    )
                weights = _numeric(w_values, pa.float32(), w_what, where)
                weights = pc.fill_null(weights, 1.0) if weights.null_count else weights
                out.append(pa.ListArray.from_arrays(pa.array(offsets), weights))
        return out

    def _ts(self, batch: pa.RecordBatch | _Columns, where: str, partition: datetime | None, rules: _Rules) -> pa.Array:
        m = self.mapping
        native = _column(batch, m.ts, where)
        ts = _to_ts(native, where, m.ts_unit)
        start = pa.scalar(partition if partition is not None else _EPOCH, TS_TYPE)
        if ts.null_count and rules.check("null_ts", _mask(ts.is_null()), m.ts):
            ts = pc.fill_null(ts, start)
        if partition is not None and len(ts) > ts.null_count:
            end = pa.scalar(partition + self.step, TS_TYPE)
            bounds = pc.min_max(ts)  # compared in Arrow: a misread unit may lie beyond Python's datetimes
            if pc.less(bounds["min"], start).as_py() or pc.greater_equal(bounds["max"], end).as_py():
                rows = len(ts) - ts.null_count
                misread = self.fail_on_misread_times and 2 * (rows - _inside(ts, start, end)) > rows
                if misread:  # most rows: a misread column, not stray rows
                    raise SchemaMismatchError(f"{where}: " + _misread_times(native, m.ts, m.ts_unit, start, end))
                outside = _mask(pc.or_(pc.less(ts, start), pc.greater_equal(ts, end)))
                rules.check(
                    "ts_outside_partition",
                    outside,
                    m.ts,
                    f" (partition [{start.as_py().isoformat()}, {end.as_py().isoformat()}))",
                    values=ts,
                )
        return ts

    def __call__(self, batch: pa.RecordBatch, where: str = "", partition: datetime | None = None) -> pa.RecordBatch:
        """Normalise one native batch; ``where`` names the file/offsets for error messages, ``partition`` is
        the start of the partition the rows were read for (None: a live tail, no event-time check)."""
        where = where or self.spec.name
        n = batch.num_rows
        m = self.mapping
        rules = _Rules(self.actions, n, where)
        cols = _Columns(batch, where)
        arrays: list[pa.Array] = []
        if self.wants("sample_id"):
            if m.id:
                arrays.append(self._id_column(cols, m.id, "id column", where, rules))
            else:
                arrays.append(pa.nulls(n, pa.int64()))
        if self.wants("ts"):
            arrays.append(self._ts(cols, where, partition, rules))
        if m.label:
            label = _label(cols(m.label), m.label, m.label_positive, where)
            if label.null_count or not _all_finite(label.to_numpy()):  # (an inf is no NaN: checked below)
                unlabelled = pc.or_kleene(label.is_null(), pc.is_nan(label))
                if pc.any(unlabelled).as_py() and rules.check(
                    "null_label", _mask(unlabelled), m.label, " (null or NaN)"
                ):
                    label = pc.if_else(unlabelled, pa.scalar(0.0, pa.float32()), label)
        else:
            label = pa.nulls(n, pa.float32())
        dense = self._dense(cols, n, where, rules)
        sparse = []
        for _, native in m.sparse_pairs():
            ids = self._id_column(cols, native, "sparse column", where, rules)
            sparse.append(pc.fill_null(ids, 0) if ids.null_count else ids)
        parts = dense if isinstance(dense, list) else [] if dense is None else [dense]
        arrays += [label, *parts, *sparse, *self._list_columns(cols, where, rules)]
        if self.constants:
            zeros = pa.array(np.zeros(n, dtype=np.int32))
            arrays.append(pa.DictionaryArray.from_arrays(zeros, self._source.dictionary))
            arrays.append(pa.DictionaryArray.from_arrays(zeros, self._kind.dictionary))
        if self.schema is None:
            width = len(dense) if isinstance(dense, list) else dense.type.list_size if dense is not None else 0
            self.schema = self._schema(width)
        schema = self.schema
        if self.split_dense:
            if self._split_schema is None or self._split_schema[0] is not schema:
                self._split_schema = (schema, split_dense_schema(schema))
            schema = self._split_schema[1]
        out = pa.RecordBatch.from_arrays(arrays, schema=schema)
        rules.count(self.counts, self.examples)
        if rules.drop is not None:
            out = out.filter(pa.array(~rules.drop))
        return out
