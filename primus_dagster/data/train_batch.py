"""A claimed batch as arrays for the trainer: :class:`TrainBatch` and :func:`to_train_batch`.

The arrays are views over the Arrow buffers wherever possible (no per-row Python work, no copy for
columns without nulls); with the shared-memory transport those buffers are the executor's
shared-memory slot, kept alive -- and the slot reserved -- for as long as any view is.

Example::

    tb = to_train_batch(record_batch, meta, framework="numpy")
    tb.dense.shape, tb.sparse_matrix().shape      # (B, n_dense), (B, n_sparse)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.data.executor.wire import BatchMeta
from primus_dagster.data.tasks import BatchId

_CANONICAL = ("sample_id", "ts", "label", "dense", "source", "kind")


@dataclass
class TrainBatch:
    """One claimed batch as arrays: ``dense`` float32 [B, n] (a zero-copy view when the Arrow values
    have no nulls), ``sparse`` name -> int64 [B] (null -> 0), ``label`` float32 [B] (null -> NaN),
    ``ts`` int64 [B] (µs since the epoch, UTC), ``sample_id`` int64 [B] (null -> -1; None when the
    source has no ids). Arrays are numpy or torch (``framework``); views over Arrow memory are
    read-only: clone before writing into them. ``record_batch``: the Arrow batch the arrays view
    (from a reader: as it came over the wire, without the constant ``source``/``kind`` columns)."""

    dense: Any
    sparse: dict[str, Any]
    label: Any
    ts: Any
    sample_id: Any | None
    batch_id: BatchId
    kind: str
    stream: str
    source: str
    record_batch: pa.RecordBatch = field(repr=False)

    @property
    def rows(self) -> int:
        return self.batch_id.rows

    def sparse_matrix(self) -> Any:
        """The sparse ids as one int64 [B, F] matrix (column order of ``sparse``; one copy)."""
        columns = list(self.sparse.values())
        if not columns:
            return np.zeros((self.rows, 0), dtype=np.int64)
        if isinstance(columns[0], np.ndarray):
            return np.stack(columns, axis=1)
        import torch

        return torch.stack(columns, dim=1)


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


def _torch(array: np.ndarray) -> Any:
    import torch

    with warnings.catch_warnings():  # Arrow memory is read-only; torch warns once about that
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def to_train_batch(batch: pa.RecordBatch, meta: BatchMeta, framework: str = "torch") -> TrainBatch:
    """Arrays of a canonical batch; every sparse id column (int64, not a canonical column) is a feature."""
    names = batch.schema.names
    dense = _dense(batch.column(names.index("dense")))
    label = _numpy(batch.column(names.index("label")))
    ts = batch.column(names.index("ts")).view(pa.int64()).to_numpy(zero_copy_only=False)
    sid = batch.column(names.index("sample_id")) if "sample_id" in names else None
    sample_id = None if sid is None or sid.null_count == len(sid) else _numpy(sid, -1)
    sparse = {
        name: _numpy(batch.column(i), 0)
        for i, name in enumerate(names)
        if name not in _CANONICAL and pa.types.is_integer(batch.schema.field(i).type)
    }
    if framework == "torch":
        dense, label, ts = _torch(dense), _torch(label), _torch(ts)
        sample_id = None if sample_id is None else _torch(sample_id)
        sparse = {k: _torch(v) for k, v in sparse.items()}
    elif framework != "numpy":
        raise ValueError(f"framework must be 'torch' or 'numpy', got {framework!r}")
    return TrainBatch(dense, sparse, label, ts, sample_id, meta.batch_id, meta.kind, meta.stream, meta.source, batch)
