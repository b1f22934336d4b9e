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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.spec.sources import ColumnMapping, SourceSpec

TS_TYPE = pa.timestamp("us", tz="UTC")


class SchemaMismatchError(ValueError):
    """Native data does not fit the source's column mapping (missing column, wrong type)."""


def canonical_schema(mapping: ColumnMapping, dense_width: int) -> pa.Schema:
    """The canonical Arrow schema for a column mapping with ``dense_width`` dense features."""
    fields = [
        pa.field("sample_id", pa.int64()),
        pa.field("ts", TS_TYPE, nullable=False),
        pa.field("label", pa.float32()),
        pa.field("dense", pa.list_(pa.float32(), dense_width)),
    ]
    fields += [pa.field(name, pa.int64()) for name, _ in mapping.sparse_pairs()]
    fields += [
        pa.field("source", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("kind", pa.dictionary(pa.int32(), pa.string()), nullable=False),
    ]
    return pa.schema(fields)


def schema_hash(schema: pa.Schema) -> str:
    """Short stable hash of a schema's field names and types (for asset metadata)."""
    text = ";".join(f"{f.name}:{f.type}" for f in schema)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def native_columns(mapping: ColumnMapping) -> list[str]:
    """The native columns a reader must project for this mapping."""
    cols = [mapping.ts]
    cols += [c for c in (mapping.label, mapping.id) if c]
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
    """Turns native record batches of one source into canonical record batches."""

    def __init__(self, spec: SourceSpec, dense_width: int | None = None):
        self.spec = spec
        self.mapping = spec.columns
        if dense_width is None and isinstance(self.mapping.dense, list):
            dense_width = len(self.mapping.dense)
        self.dense_width = dense_width
        self._source = pa.array([spec.name]).dictionary_encode()
        self._kind = pa.array([spec.kind]).dictionary_encode()
        self.schema: pa.Schema | None = canonical_schema(self.mapping, dense_width) if dense_width is not None else None

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
                self.schema = canonical_schema(self.mapping, width)
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
        sample_id = (
            _numeric(_column(batch, m.id, where), pa.int64(), f"id column {m.id!r}", where)
            if m.id
            else pa.nulls(n, pa.int64())
        )
        ts = _to_ts(_column(batch, m.ts, where), where)
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
        zeros = pa.array(np.zeros(n, dtype=np.int32))
        source = pa.DictionaryArray.from_arrays(zeros, self._source.dictionary)
        kind = pa.DictionaryArray.from_arrays(zeros, self._kind.dictionary)
        if self.schema is None:
            self.schema = canonical_schema(m, dense.type.list_size)
        return pa.RecordBatch.from_arrays([sample_id, ts, label, dense, *sparse, source, kind], schema=self.schema)
