"""The canonical sample schema every adapter normalises to, and the vectorised normaliser.

Canonical columns, in order:
``sample_id`` int64 (nullable when the source has no id), ``ts`` timestamp[us, UTC],
``label`` float32 (null = not yet labelled), ``dense`` fixed_size_list<float32>[n],
one int64 column per sparse feature, ``source`` and ``kind`` (dictionary strings).

Example::

    norm = Normalizer(source_spec)
    for batch in native_batches:
        yield norm(batch)            # no per-row Python work
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.spec.sources import ColumnMapping, SourceSpec

TS_TYPE = pa.timestamp("us", tz="UTC")
#: Canonical fields a reader may leave out (``fields=``): every trainer needs label, dense and sparse.
OPTIONAL_FIELDS = ("sample_id", "ts")
#: The canonical fields (sparse: every sparse feature column).
FIELDS = ("sample_id", "ts", "label", "dense", "sparse")


class SchemaMismatchError(ValueError):
    """Native data does not fit the source's column mapping (missing column, wrong type)."""


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
    """The canonical Arrow schema for a column mapping with ``dense_width`` dense features; with
    ``fields`` (see :func:`check_fields`) only those, without ``constants`` no ``source``/``kind``."""
    out = [
        pa.field("sample_id", pa.int64()),
        pa.field("ts", TS_TYPE, nullable=False),
        pa.field("label", pa.float32()),
        pa.field("dense", pa.list_(pa.float32(), dense_width)),
    ]
    if fields is not None:
        out = [f for f in out if f.name in fields]
    out += [pa.field(name, pa.int64()) for name, _ in mapping.sparse_pairs()]
    if constants:
        out += [
            pa.field("source", pa.dictionary(pa.int32(), pa.string()), nullable=False),
            pa.field("kind", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        ]
    return pa.schema(out)


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
    return list(dict.fromkeys(cols))


def _column(batch: pa.RecordBatch, name: str, where: str) -> pa.Array:
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise SchemaMismatchError(f"{where}: column {name!r} is missing (have {batch.schema.names})")
    return batch.column(index)


def _to_ts(array: pa.Array, where: str) -> pa.Array:
    if pa.types.is_timestamp(array.type):
        if array.type.tz is None:
            array = array.cast(pa.timestamp(array.type.unit, tz="UTC"))
        return array.cast(TS_TYPE)
    if pa.types.is_integer(array.type):  # epoch milliseconds, as Kafka and JSON carry it
        return pc.multiply(array.cast(pa.int64()), 1000).cast(TS_TYPE)
    raise SchemaMismatchError(f"{where}: ts column has type {array.type}; expected a timestamp or epoch ms")


def _numeric(array: pa.Array, target: pa.DataType, what: str, where: str) -> pa.Array:
    if array.type == target:
        return array
    if not (
        pa.types.is_integer(array.type)
        or pa.types.is_floating(array.type)
        or pa.types.is_boolean(array.type)
        or pa.types.is_null(array.type)
    ):
        raise SchemaMismatchError(f"{where}: {what} has type {array.type}; expected a number")
    return array.cast(target)


class Normalizer:
    """Turns native record batches of one source into canonical record batches.

    ``fields`` (default: all): the canonical fields to produce -- ``sample_id`` and ``ts`` may be
    left out when no consumer reads them (a data executor serving trainers that only train), so
    their native columns are neither decoded nor copied. ``constants=False``: no ``source``/``kind``
    columns (a :class:`~primus_dagster.data.batch.Batch` carries them in its metadata).
    """

    def __init__(
        self,
        spec: SourceSpec,
        dense_width: int | None = None,
        *,
        fields: Iterable[str] | None = None,
        constants: bool = True,
    ):
        self.spec = spec
        self.mapping = spec.columns
        self.fields = check_fields(fields)
        self.constants = constants
        if dense_width is None and isinstance(self.mapping.dense, list):
            dense_width = len(self.mapping.dense)
        self.dense_width = dense_width
        self._source = pa.array([spec.name]).dictionary_encode()
        self._kind = pa.array([spec.kind]).dictionary_encode()
        self.schema: pa.Schema | None = self._schema(dense_width) if dense_width is not None else None

    def _schema(self, dense_width: int) -> pa.Schema:
        return canonical_schema(self.mapping, dense_width, self.fields, self.constants)

    def wants(self, field: str) -> bool:
        return self.fields is None or field in self.fields

    def _dense(self, batch: pa.RecordBatch, n: int, where: str) -> pa.Array:
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
            return pa.FixedSizeListArray.from_arrays(values, width)
        columns = [
            _numeric(_column(batch, name, where), pa.float32(), f"dense column {name!r}", where) for name in dense
        ]
        # Arrow's row-major tensor conversion interleaves the columns in C++ (nulls -> NaN).
        matrix = pa.RecordBatch.from_arrays(columns, names=dense).to_tensor(null_to_nan=True, row_major=True)
        return pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(matrix).reshape(-1)), len(dense))

    def __call__(self, batch: pa.RecordBatch, where: str = "") -> pa.RecordBatch:
        """Normalise one native batch; ``where`` names the file/offsets for error messages."""
        where = where or self.spec.name
        n = batch.num_rows
        m = self.mapping
        arrays: list[pa.Array] = []
        if self.wants("sample_id"):
            arrays.append(
                _numeric(_column(batch, m.id, where), pa.int64(), f"id column {m.id!r}", where)
                if m.id
                else pa.nulls(n, pa.int64())
            )
        if self.wants("ts"):
            arrays.append(_to_ts(_column(batch, m.ts, where), where))
        label = (
            _numeric(_column(batch, m.label, where), pa.float32(), f"label column {m.label!r}", where)
            if m.label
            else pa.nulls(n, pa.float32())
        )
        dense = self._dense(batch, n, where)
        sparse = [
            _numeric(_column(batch, native, where), pa.int64(), f"sparse column {native!r}", where)
            for _, native in m.sparse_pairs()
        ]
        arrays += [label, dense, *sparse]
        if self.constants:
            zeros = pa.array(np.zeros(n, dtype=np.int32))
            arrays.append(pa.DictionaryArray.from_arrays(zeros, self._source.dictionary))
            arrays.append(pa.DictionaryArray.from_arrays(zeros, self._kind.dictionary))
        if self.schema is None:
            self.schema = self._schema(dense.type.list_size)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
