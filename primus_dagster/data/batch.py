"""The one batch type of the data plane: :class:`Batch` (Arrow columns + metadata + tensors).

A :class:`Batch` is what travels from a data executor to a trainer and what every consumer of
data holds: the executor's buffers, the dataset server's streams, the reader's queues, the
trainer, evaluation and the benchmarks. It holds

* ``columns``: the canonical Arrow columns *without* the constant ``source``/``kind`` columns
  (they ride in the metadata; Flight streams cannot carry dictionary columns batch by batch);
* ``meta``: a :class:`BatchMeta` -- the batch's identity (task, first row, rows: its
  :class:`~primus_dagster.data.tasks.BatchId`), its stream, kind and source;
* the columns as torch tensors, converted once on first use by :func:`arrow_to_tensors`
  (zero-copy views over the Arrow buffers wherever the data allows).

With the shared-memory transport the Arrow buffers are an executor's slot, which stays
reserved for as long as any column or tensor view of the batch is alive.

Example::

    batch = Batch.from_arrow(canonical_record_batch)       # any canonical Arrow batch / table
    batch.dense.shape, batch.sparse.shape, batch.kind      # (B, n_dense), (B, n_sparse), "batch"
    head = batch.slice(0, 1024)                            # zero-copy, tensors too
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.data.canonical import WEIGHTS_SUFFIX, dense_parts, join_dense, join_dense_schema
from primus_dagster.data.tasks import BatchId

if TYPE_CHECKING:  # torch is imported on the first conversion: executor processes never need it
    import torch

#: Constant per batch: carried by :class:`BatchMeta`, not as columns.
CONSTANT_COLUMNS = ("source", "kind")
#: Canonical columns that are not sparse features.
_NOT_SPARSE = ("sample_id", "ts", "label", "dense", *CONSTANT_COLUMNS)


@dataclass(frozen=True)
class BatchMeta:
    """What travels beside each batch: its identity and where it belongs.

    >>> meta = BatchMeta("history:src/f.parquet", 0, 4096, "history", "batch", "src")
    >>> BatchMeta.decode(meta.encode()) == meta
    True
    """

    task_id: str
    first_row: int
    rows: int
    stream: str
    kind: str
    source: str

    @property
    def batch_id(self) -> BatchId:
        return BatchId(self.task_id, self.first_row, self.rows)

    def encode(self) -> bytes:
        """Compact JSON (UTF-8): the Flight ``app_metadata`` of this batch."""
        # A dict literal, not dataclasses.asdict (which deep-copies field by field): once per batch.
        data = {
            "task_id": self.task_id,
            "first_row": self.first_row,
            "rows": self.rows,
            "stream": self.stream,
            "kind": self.kind,
            "source": self.source,
        }
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | pa.Buffer | dict[str, Any]) -> BatchMeta:
        data = raw if isinstance(raw, dict) else json.loads(bytes(raw).decode())
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"bad batch metadata {data!r}: {exc}") from None


@dataclass(frozen=True)
class Jagged:
    """A list feature of a batch, TorchRec's jagged layout: row ``b`` holds
    ``values[offsets[b]:offsets[b + 1]]`` (no padding); ``weights`` (float32, like ``values``) or None.

    >>> import torch
    >>> j = Jagged(torch.tensor([7, 8, 9]), torch.tensor([0, 2, 2, 3]))
    >>> j.lengths().tolist(), j.slice(1, 3).values.tolist()
    ([2, 0, 1], [9])
    """

    values: torch.Tensor  # int64 [N]
    offsets: torch.Tensor  # int64 [B + 1], offsets[0] == 0
    weights: torch.Tensor | None = None

    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def slice(self, start: int, stop: int) -> Jagged:
        stop = max(start, min(stop, len(self.offsets) - 1))
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        weights = None if self.weights is None else self.weights[first:last]
        return Jagged(self.values[first:last], self.offsets[start : stop + 1] - first, weights)


@dataclass(frozen=True)
class BatchTensors:
    """The columns of a batch as torch tensors (see :func:`arrow_to_tensors`)."""

    dense: torch.Tensor
    sparse: torch.Tensor
    label: torch.Tensor
    ts: torch.Tensor | None  # None: the batch has no ts column (a reader that asked for fewer fields)
    sample_id: torch.Tensor | None
    lists: dict[str, Jagged] = field(default_factory=dict)  # list features by name, in schema order

    def slice(self, start: int, stop: int) -> BatchTensors:
        sid = None if self.sample_id is None else self.sample_id[start:stop]
        ts = None if self.ts is None else self.ts[start:stop]
        lists = {name: j.slice(start, stop) for name, j in self.lists.items()}
        return BatchTensors(self.dense[start:stop], self.sparse[start:stop], self.label[start:stop], ts, sid, lists)


class Batch:
    """One batch from executor to trainer (see the module docstring).

    Tensors (``dense``, ``sparse``, ``label``, ``ts``, ``sample_id``) are converted from
    ``columns`` on first access and kept; views over Arrow memory are read-only: clone before
    writing into them.

    A batch may hold its columns in the serving layout (``dense`` as ``dense.0`` ...:
    :func:`~primus_dagster.data.canonical.split_dense_schema`), as data executors serve them: then
    ``dense`` is a column-major view over them and ``columns`` interleaves the canonical ``dense``
    column on first access; ``wire`` is what the batch holds either way.
    """

    __slots__ = ("_columns", "_tensors", "meta", "wire")

    def __init__(self, columns: pa.RecordBatch, meta: BatchMeta):
        if meta.rows != columns.num_rows:
            raise ValueError(f"batch {meta.batch_id.key()}: metadata says {meta.rows} rows, got {columns.num_rows}")
        #: The Arrow columns as they travel (the serving layout, or canonical).
        self.wire = columns
        self._columns: pa.RecordBatch | None = None
        self.meta = meta
        self._tensors: BatchTensors | None = None

    @property
    def columns(self) -> pa.RecordBatch:
        """The canonical Arrow columns (without ``source``/``kind``)."""
        if self._columns is None:
            self._columns = join_dense(self.wire)
        return self._columns

    @property
    def schema(self) -> pa.Schema:
        """The canonical schema of :attr:`columns` (without building them)."""
        return _canonical_schema(self.wire.schema)

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_arrow(
        cls,
        data: pa.RecordBatch | pa.Table,
        *,
        kind: str | None = None,
        stream: str = "",
        source: str | None = None,
        batch_id: BatchId | None = None,
    ) -> Batch:
        """A batch of canonical Arrow data (with or without its ``source``/``kind`` columns).

        ``kind``/``source`` default to the data's constant columns (first row); ``batch_id`` to
        ``BatchId("", 0, rows)``. Dictionary columns other than the constant ones are decoded.
        """
        record_batch = _one_record_batch(data)
        kind = kind or _constant(record_batch, "kind")
        if kind is None:
            raise ValueError("kind not given and the data has no rows / no 'kind' column")
        source = source if source is not None else (_constant(record_batch, "source") or "")
        batch_id = batch_id or BatchId("", 0, record_batch.num_rows)
        meta = BatchMeta(batch_id.task_id, batch_id.first_row, batch_id.rows, stream, kind, source)
        return cls(_without_constants(record_batch), meta)

    @classmethod
    def from_tensors(
        cls,
        dense: torch.Tensor,
        sparse: torch.Tensor,
        label: torch.Tensor,
        *,
        kind: str,
        sparse_names: Sequence[str] | None = None,
        lists: Mapping[str, Jagged] | None = None,
    ) -> Batch:
        """A batch of in-memory tensors (tests, benchmarks): dense float32 [B, n], sparse int64
        [B, F] (columns ``sparse_names``, default ``s0..``), label float32 [B], list features
        ``lists`` (name -> :class:`Jagged`); ``ts`` is 0."""
        rows, width = int(dense.shape[0]), int(dense.shape[1])
        names = list(sparse_names) if sparse_names is not None else [f"s{i}" for i in range(int(sparse.shape[1]))]
        sparse_np = sparse.detach().cpu().numpy()
        columns = {
            "ts": pa.array(np.zeros(rows, dtype=np.int64), pa.timestamp("us", "UTC")),
            "label": pa.array(label.detach().cpu().numpy().astype(np.float32, copy=False)),
            **{name: pa.array(sparse_np[:, i].astype(np.int64, copy=False)) for i, name in enumerate(names)},
        }
        if width:  # no dense feature: no dense column
            values = pa.array(dense.detach().cpu().numpy().astype(np.float32, copy=False).ravel())
            columns = {
                "ts": columns["ts"],
                "label": columns["label"],
                "dense": pa.FixedSizeListArray.from_arrays(values, width),
                **{k: v for k, v in columns.items() if k not in ("ts", "label")},
            }
        for name, jagged in (lists or {}).items():
            offsets = pa.array(jagged.offsets.detach().cpu().numpy().astype(np.int32))
            columns[name] = pa.ListArray.from_arrays(offsets, pa.array(jagged.values.detach().cpu().numpy()))
            if jagged.weights is not None:
                weights = pa.array(jagged.weights.detach().cpu().numpy().astype(np.float32))
                columns[name + WEIGHTS_SUFFIX] = pa.ListArray.from_arrays(offsets, weights)
        return cls(pa.record_batch(columns), BatchMeta("", 0, rows, "", kind, ""))

    @classmethod
    def concat(cls, batches: Sequence[Batch]) -> Batch:
        """One batch of ``batches`` (same kind, stream and source as the first; one copy)."""
        if not batches:
            raise ValueError("concat of no batches")
        first = batches[0].meta
        table = pa.Table.from_batches([b.columns for b in batches])
        columns = _one_record_batch(table)
        meta = BatchMeta(first.task_id, first.first_row, columns.num_rows, first.stream, first.kind, first.source)
        return cls(columns, meta)

    # ----------------------------------------------------------------- identity
    @property
    def batch_id(self) -> BatchId:
        return self.meta.batch_id

    @property
    def rows(self) -> int:
        return self.meta.rows

    @property
    def kind(self) -> str:
        return self.meta.kind

    @property
    def stream(self) -> str:
        return self.meta.stream

    @property
    def source(self) -> str:
        return self.meta.source

    def canonical(self) -> pa.RecordBatch:
        """The canonical Arrow batch: ``columns`` plus the constant ``source``/``kind`` columns."""
        n = self.columns.num_rows
        dict_type = pa.dictionary(pa.int32(), pa.string())
        zeros = pa.array(np.zeros(n, dtype=np.int32))  # shared by both (arrays are immutable)
        arrays = [*self.columns.columns, _one_value(self.source, zeros), _one_value(self.kind, zeros)]
        fields = [
            *self.columns.schema,
            pa.field("source", dict_type, nullable=False),
            pa.field("kind", dict_type, nullable=False),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    def slice(self, start: int, stop: int) -> Batch:
        """Rows ``[start, stop)`` (zero-copy; already converted tensors are sliced, not reconverted)."""
        stop = min(stop, self.rows)
        meta = BatchMeta(
            self.meta.task_id, self.meta.first_row + start, stop - start, self.stream, self.kind, self.source
        )
        out = Batch(self.wire.slice(start, stop - start), meta)
        if self._tensors is not None:
            out._tensors = self._tensors.slice(start, stop)
        return out

    # ----------------------------------------------------------------- tensors
    @property
    def tensors(self) -> BatchTensors:
        if self._tensors is None:
            self._tensors = arrow_to_tensors(self.wire)
        return self._tensors

    @property
    def dense(self) -> torch.Tensor:
        """float32 [B, n_dense]; a missing value (or a null row) is NaN."""
        return self.tensors.dense

    @property
    def sparse(self) -> torch.Tensor:
        """int64 [B, n_sparse] raw ids in :attr:`sparse_names` order (null -> 0)."""
        return self.tensors.sparse

    @property
    def sparse_names(self) -> list[str]:
        return sparse_feature_names(self.wire.schema)

    @property
    def lists(self) -> dict[str, Jagged]:
        """The list features (``columns.lists``) by name: jagged ids (and weights), no padding."""
        return self.tensors.lists

    @property
    def list_names(self) -> list[str]:
        return list_feature_names(self.wire.schema)

    @property
    def label(self) -> torch.Tensor:
        """float32 [B]; not (yet) labelled -> NaN."""
        return self.tensors.label

    @property
    def ts(self) -> torch.Tensor | None:
        """int64 [B]: event time, µs since the epoch (UTC); None when the batch was served without
        it (``fields`` of the data plane left ``ts`` out)."""
        return self.tensors.ts

    @property
    def sample_id(self) -> torch.Tensor | None:
        """int64 [B] (null -> -1); None when the source has no ids."""
        return self.tensors.sample_id

    def __getstate__(self) -> tuple[bytes, BatchMeta]:
        # An Arrow IPC stream holds only this batch's rows; pickling the RecordBatch itself would
        # carry the whole parent buffers of a slice along.
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.columns.schema) as writer:
            writer.write_batch(self.columns)
        return sink.getvalue().to_pybytes(), self.meta

    def __setstate__(self, state: tuple[bytes, BatchMeta]) -> None:
        data, self.meta = state
        self.wire = pa.ipc.open_stream(data).read_next_batch()
        self._columns = None
        self._tensors = None

    def __repr__(self) -> str:
        return f"Batch({self.batch_id.key()}, rows={self.rows}, kind={self.kind}, stream={self.stream})"


# --------------------------------------------------------------------------- Arrow -> tensors
def sparse_feature_names(schema: pa.Schema) -> list[str]:
    """The sparse feature columns of a canonical schema: every integer column that is not canonical."""
    return [f.name for f in schema if f.name not in _NOT_SPARSE and pa.types.is_integer(f.type)]


def list_feature_names(schema: pa.Schema) -> list[str]:
    """The list feature columns of a canonical schema: every list of integers."""
    return [
        f.name
        for f in schema
        if (pa.types.is_list(f.type) or pa.types.is_large_list(f.type)) and pa.types.is_integer(f.type.value_type)
    ]


def _jagged(column: pa.Array, weights: pa.Array | None) -> Jagged:
    """A canonical ``list<int64>`` column (null lists: empty) as :class:`Jagged` (values zero-copy)."""
    native = column.offsets.to_numpy(zero_copy_only=False)
    first, last = int(native[0]), int(native[-1])
    offsets = np.subtract(native, first, dtype=np.int64)  # one new array (int32 -> int64, from 0)
    values = column.values.slice(first, last - first)
    w = None
    if weights is not None:
        w_offsets = weights.offsets.to_numpy(zero_copy_only=False)
        w = _torch(_numpy(weights.values.slice(int(w_offsets[0]), last - first), np.nan).astype(np.float32))
    return Jagged(_torch(_numpy(values, 0)), _torch(offsets), w)


class _Layout:
    """Where a canonical schema keeps each tensor's columns (column indices), worked out once per schema:
    a reader converts batch after batch of one schema, and looking the columns up by name through
    ``RecordBatch.schema`` (a new schema object on every access) cost about a third of a conversion."""

    __slots__ = ("dense", "dense_parts", "label", "lists", "sample_id", "schema", "sparse", "sparse_int64", "ts")

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.dense = schema.get_field_index("dense")
        self.dense_parts = dense_parts(schema)  # the serving layout's dense columns
        self.label = schema.get_field_index("label")
        self.ts = schema.get_field_index("ts")
        self.sample_id = schema.get_field_index("sample_id")
        names = sparse_feature_names(schema)
        self.sparse = [schema.get_field_index(n) for n in names]
        self.sparse_int64 = all(schema.field(i).type == pa.int64() for i in self.sparse)
        self.lists = [
            (schema.get_field_index(n), schema.get_field_index(n + WEIGHTS_SUFFIX)) for n in list_feature_names(schema)
        ]


_layouts = threading.local()


def _canonical_schema(schema: pa.Schema) -> pa.Schema:
    """The canonical schema of a batch's (maybe split) schema; the last one this thread asked for is kept."""
    if dense_parts(schema) is None:
        return schema
    last: tuple[pa.Schema, pa.Schema] | None = getattr(_layouts, "canonical", None)
    if last is None or not last[0].equals(schema):
        last = _layouts.canonical = (schema, join_dense_schema(schema))
    return last[1]


def _layout(schema: pa.Schema) -> _Layout:
    """The layout of ``schema``: the last one this thread used when it is the same schema."""
    last: _Layout | None = getattr(_layouts, "last", None)
    if last is None or not (last.schema is schema or last.schema.equals(schema)):
        last = _layouts.last = _Layout(schema)
    return last


def arrow_to_tensors(columns: pa.RecordBatch) -> BatchTensors:
    """The one Arrow -> torch converter: dense [B, n] (missing -> NaN), sparse [B, F] (null -> 0),
    label (null -> NaN), ts (µs; None without a ts column), sample_id (null -> -1; None without
    ids). No per-row Python work; views over the Arrow buffers where there are no nulls to fill.

    ``sparse`` is a view too when its columns lie at equal distances in one buffer (a batch read
    from an Arrow IPC stream: shared memory or Flight): then it is column-major ([B, F] with
    strides (1, distance)), not contiguous; otherwise the columns are stacked into a copy."""
    layout = _layout(columns.schema)
    rows = columns.num_rows
    if layout.dense_parts is not None:
        parts = [columns.column(i) for i in layout.dense_parts]
        dense = _strided_view(parts, np.float32)
        if dense is None:
            dense = np.stack([_numpy(a, np.nan) for a in parts], axis=1)
    elif layout.dense >= 0:
        dense = _dense(columns.column(layout.dense))
    else:  # no dense feature
        dense = np.zeros((rows, 0), dtype=np.float32)
    label = _numpy(columns.column(layout.label))
    ts = None
    if layout.ts >= 0:
        ts = columns.column(layout.ts).view(pa.int64()).to_numpy(zero_copy_only=False)
    sid = columns.column(layout.sample_id) if layout.sample_id >= 0 else None
    sample_id = None if sid is None or sid.null_count == len(sid) else _numpy(sid, -1)
    if layout.sparse:
        arrays = [columns.column(i) for i in layout.sparse]
        sparse = _strided_view(arrays, np.int64) if layout.sparse_int64 else None
        if sparse is None:
            sparse = np.stack([_numpy(a, 0) for a in arrays], axis=1)
    else:
        sparse = np.zeros((rows, 0), dtype=np.int64)
    lists = {}
    for index, w_index in layout.lists:
        weights = columns.column(w_index) if w_index >= 0 else None
        lists[layout.schema.field(index).name] = _jagged(columns.column(index), weights)
    import torch

    with warnings.catch_warnings():  # Arrow memory is read-only; torch warns once about that
        warnings.simplefilter("ignore", UserWarning)
        return BatchTensors(
            torch.from_numpy(dense),
            torch.from_numpy(sparse),
            torch.from_numpy(label),
            None if ts is None else torch.from_numpy(ts),
            None if sample_id is None else torch.from_numpy(sample_id),
            lists,
        )


def _strided_view(arrays: list[pa.Array], dtype: type[np.generic]) -> np.ndarray | None:
    """``np.stack(arrays, axis=1)`` without the copy: a [B, F] view with strides (itemsize, d) when the
    columns of ``dtype`` have no nulls and lie at one distance d from each other inside one parent
    buffer (an IPC body: a shared-memory slot or a Flight message); None otherwise."""
    n, size = len(arrays[0]), np.dtype(dtype).itemsize
    kind = pa.from_numpy_dtype(dtype)
    if n == 0 or any(a.type != kind or a.null_count for a in arrays):
        return None
    buffers = [a.buffers()[1] for a in arrays]
    parent = buffers[0].parent if buffers[0] is not None else None
    if parent is None:
        return None
    starts = [b.address + a.offset * size for a, b in zip(arrays, buffers, strict=True)]
    stride = starts[1] - starts[0] if len(starts) > 1 else n * size
    if stride < n * size or any(starts[i + 1] - starts[i] != stride for i in range(len(starts) - 1)):
        return None
    for b in buffers[1:]:  # every column inside the same parent buffer: the view covers valid memory only
        p = b.parent
        if p is None or p.address != parent.address or p.size != parent.size:
            return None
    offset = starts[0] - parent.address
    if offset < 0 or offset % size or offset + stride * (len(arrays) - 1) + n * size > parent.size:
        return None
    view = np.ndarray((n, len(arrays)), dtype=dtype, buffer=parent, offset=offset, strides=(size, stride))
    view.flags.writeable = False
    return view


def _numpy(array: pa.Array, fill: Any = None) -> np.ndarray:
    if array.null_count and fill is not None:
        array = pc.fill_null(array, pa.scalar(fill, array.type))
    return array.to_numpy(zero_copy_only=False)


def _dense(array: pa.Array) -> np.ndarray:
    width = array.type.list_size
    values = array.values.slice(array.offset * width, len(array) * width)
    out = values.to_numpy(zero_copy_only=False).reshape(len(array), width)
    if array.null_count:  # a null list: its row is NaN
        out = out.copy()
        out[array.is_null().to_numpy(zero_copy_only=False)] = np.nan
    return out


def _torch(array: np.ndarray) -> torch.Tensor:
    import torch

    with warnings.catch_warnings():  # Arrow memory is read-only; torch warns once about that
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


# --------------------------------------------------------------------------- canonical <-> columns
def _one_record_batch(data: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    if isinstance(data, pa.RecordBatch):
        return data
    batches = data.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=data.schema)


def _constant(batch: pa.RecordBatch, name: str) -> str | None:
    index = batch.schema.get_field_index(name)
    if index < 0 or batch.num_rows == 0:
        return None
    value = batch.column(index)[0].as_py()
    return None if value is None else str(value)


def _without_constants(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` without the constant columns, other dictionary columns decoded."""
    if not any(f.name in CONSTANT_COLUMNS or pa.types.is_dictionary(f.type) for f in batch.schema):
        return batch
    arrays, fields = [], []
    for column_field, column in zip(batch.schema, batch.columns, strict=True):
        if column_field.name in CONSTANT_COLUMNS:
            continue
        if pa.types.is_dictionary(column_field.type):
            column = pc.cast(column, column_field.type.value_type)
            column_field = column_field.with_type(column_field.type.value_type)
        arrays.append(column)
        fields.append(column_field)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _one_value(value: str, zeros: pa.Array) -> pa.DictionaryArray:
    # All-zero indices into a one-entry dictionary: valid by construction, so skip validation.
    return pa.DictionaryArray.from_arrays(zeros, pa.array([value]), safe=False)
