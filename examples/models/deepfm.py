"""DeepFM (Guo et al., IJCAI 2017) written as a team would, plain PyTorch, on the custom-model protocol.

Point a job at it (``training.model``)::

    model:
      type: custom
      factory: ../models/deepfm.py:build        # relative to the spec file
      params: {fm_dim: 16, hidden: [128, 64]}

The factory gets the job's declared features (``ModelContext``: the dense columns and every id and
list feature with its table's ``buckets`` and ``dim``) and returns the module; ``forward`` gets
``ModelInputs``: ``inputs.dense`` [B, n_dense] (already transformed and filled) and
``inputs.sparse`` (TorchRec's ``KeyedJaggedTensor`` fields, each feature's ids already hashed into
``[0, buckets)`` of its table).

* **First order**: a weight per id (an ``nn.EmbeddingBag`` of width 1 per table) + a linear term
  of the dense columns.
* **Second order (FM)**: every id feature's vector, projected to ``fm_dim`` where its table is
  wider or narrower; ``0.5 * ((sum v)^2 - sum v^2)`` over the features.
* **Deep**: an MLP on the feature vectors and the dense columns.

As an MTRM tower (``training.model.memory`` / ``adapt: {factory: ..., params: ...}``): ``state``
is the memory state the adapt tower reads, and an adapt tower's deep part takes ``inputs.aux``
(``context.aux_dim`` wide) beside the feature vectors.

The tables are ``nn.EmbeddingBag(sparse=True)``: the trainer gives them the lazy sparse Adam (a
step updates only the rows it touched) and the multi-trainer exchange sends only those rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from primus_dagster.training.model_api import FeatureInfo, ModelContext, ModelInputs


def _bag(buckets: int, dim: int) -> nn.EmbeddingBag:
    bag = nn.EmbeddingBag(buckets, dim, mode="sum", sparse=True)
    nn.init.normal_(bag.weight, std=0.01)
    return bag


def _pool(table: nn.EmbeddingBag, feature: FeatureInfo, inputs: ModelInputs) -> torch.Tensor:
    """The feature's rows of ``table`` pooled per sample: [B, table width]."""
    ids = inputs.sparse[feature.name]
    if ids.weights is not None:  # weighted ids: a weighted sum
        return F.embedding_bag(ids.values, table.weight, ids.offsets[:-1], mode="sum",
                               per_sample_weights=ids.weights, sparse=True)  # fmt: skip
    return F.embedding_bag(ids.values, table.weight, ids.offsets[:-1], mode=feature.pooling, sparse=True)


class DeepFM(nn.Module):
    """Linear + factorisation machine + MLP over the declared features; logits [B].

    Example::

        model = DeepFM(context, fm_dim=16, hidden=[128, 64])
        logits = model(inputs)
    """

    def __init__(self, context: ModelContext, fm_dim: int = 16, hidden: Sequence[int] = (128, 64)):
        super().__init__()
        self.features = context.id_features
        if not self.features:
            raise ValueError("DeepFM needs at least one id or list feature (columns.sparse / columns.lists)")
        self.vectors = nn.ModuleDict({name: _bag(b, d) for name, (b, d) in context.tables.items()})
        self.weights = nn.ModuleDict({name: _bag(b, 1) for name, (b, _) in context.tables.items()})
        self.project = nn.ModuleDict(
            {f.name: nn.Linear(f.dim, fm_dim, bias=False) for f in self.features if f.dim != fm_dim}
        )
        n_dense = context.n_dense
        self.dense_linear = nn.Linear(n_dense, 1) if n_dense else None
        layers: list[nn.Module] = []
        width = len(self.features) * fm_dim + n_dense + context.aux_dim  # aux: an MTRM adapt tower's h_aux
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.deep = nn.Sequential(*layers)
        self.head = nn.Linear(width, 1)

    def _parts(self, inputs: ModelInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(first order + FM [B], the deep MLP's last hidden layer [B, H], the feature vectors [B, F * fm_dim])."""
        first = inputs.dense.new_zeros(inputs.batch_size)  # on the inputs' device (training.device)
        vectors = []
        for f in self.features:
            first = first + _pool(self.weights[f.table], f, inputs).squeeze(1)
            v = _pool(self.vectors[f.table], f, inputs)
            vectors.append(self.project[f.name](v) if f.name in self.project else v)
        if self.dense_linear is not None:
            first = first + self.dense_linear(inputs.dense).squeeze(1)
        stacked = torch.stack(vectors, dim=1)  # [B, F, fm_dim]
        fm = 0.5 * (stacked.sum(1).pow(2) - stacked.pow(2).sum(1)).sum(1)
        deep_in = [stacked.flatten(1), inputs.dense] + ([inputs.aux] if inputs.aux is not None else [])
        return first + fm, self.deep(torch.cat(deep_in, dim=1)), stacked.flatten(1)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        shallow, hidden, _ = self._parts(inputs)
        return shallow + self.head(hidden).squeeze(1)

    def state(self, inputs: ModelInputs) -> torch.Tensor:
        """As an MTRM memory tower (``training.model.memory``): what the adapt tower reads as ``h_aux``
        -- the deep part's last hidden layer and the feature vectors, as the built-in memory tower's."""
        _, hidden, vectors = self._parts(inputs)
        return torch.cat([hidden, vectors], dim=1)


def build(context: ModelContext) -> DeepFM:
    """The factory ``training.model.factory`` names; ``params``: ``fm_dim``, ``hidden``."""
    return DeepFM(context, **context.params)
