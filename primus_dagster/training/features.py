"""Model inputs from canonical batches: :class:`Features` (torch tensors, no per-row Python work).

Example::

    feats = features_from_batch(train_batch)          # a TrainBatch from the RemoteReader
    feats = features_from_arrow(record_batch)         # any canonical Arrow batch / table
    logits = model(feats.dense, feats.sparse, feats.kind)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from primus_dagster.data.executor.wire import BatchMeta
from primus_dagster.data.train_batch import TrainBatch, to_train_batch

KINDS = ("batch", "stream")


@dataclass
class Features:
    """One batch as model inputs: ``dense`` float32 [B, n_dense] (missing -> 0), ``sparse`` int64
    [B, n_sparse] raw ids (hashed by the model), ``label`` float32 [B] (unlabelled -> 0: a stream
    row without a click yet is a negative until it is corrected), ``kind`` batch | stream,
    ``sample_id`` int64 [B] or None."""

    dense: torch.Tensor
    sparse: torch.Tensor
    label: torch.Tensor
    kind: str
    sample_id: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.label.shape[0])

    def slice(self, start: int, stop: int) -> "Features":
        sid = None if self.sample_id is None else self.sample_id[start:stop]
        return Features(self.dense[start:stop], self.sparse[start:stop], self.label[start:stop], self.kind, sid)


def _tensor(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # views over read-only Arrow memory
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _clean(values: torch.Tensor) -> torch.Tensor:
    """NaN -> 0 (a copy only when there is a NaN: read-only Arrow views stay views)."""
    return torch.nan_to_num(values, nan=0.0) if bool(torch.isnan(values).any()) else values


def features_from_batch(batch: TrainBatch) -> Features:
    """Features of a claimed reader batch (torch or numpy framework)."""
    dense, label = batch.dense, batch.label
    if isinstance(dense, np.ndarray):
        dense, label = _tensor(dense), _tensor(label)
    sparse = batch.sparse_matrix()
    if isinstance(sparse, np.ndarray):
        sparse = _tensor(sparse)
    sid = batch.sample_id
    if isinstance(sid, np.ndarray):
        sid = _tensor(sid)
    if batch.kind not in KINDS:
        raise ValueError(f"batch {batch.batch_id.key()} has kind {batch.kind!r}; expected one of {KINDS}")
    return Features(_clean(dense), sparse, _clean(label), batch.kind, sid)


def features_from_arrow(data: pa.RecordBatch | pa.Table, kind: str | None = None) -> Features:
    """Features of canonical Arrow data; ``kind`` defaults to the data's ``kind`` column (first row)."""
    batch = data.combine_chunks().to_batches()[0] if isinstance(data, pa.Table) else data
    if kind is None:
        if batch.num_rows == 0 or "kind" not in batch.schema.names:
            raise ValueError("kind not given and the data has no rows / no 'kind' column")
        kind = str(batch.column(batch.schema.get_field_index("kind"))[0])
    meta = BatchMeta("local", 0, batch.num_rows, stream="local", kind=kind, source="local")
    return features_from_batch(to_train_batch(batch, meta, "torch"))
