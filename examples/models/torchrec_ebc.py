"""A TorchRec model on the custom-model protocol: an ``EmbeddingBagCollection`` over the declared
tables, the ``KeyedJaggedTensor`` of each batch, an MLP on the pooled embeddings and the dense columns.

Needs TorchRec (``pip install -c constraints.txt -e '.[bench]'`` then ``pip install -c
constraints.txt --no-deps torchrec==1.8.0``)::

    model:
      type: custom
      factory: ../models/torchrec_ebc.py:build
      params: {hidden: [128, 64]}

* One ``EmbeddingBagConfig`` per declared table (its ``buckets`` rows of ``dim``), naming the features
  that table holds; the ids of ``inputs.sparse`` are already hashed into ``[0, buckets)``, so
  ``inputs.sparse.to_kjt()`` goes straight into the collection.
* A table's pooling is its list features' (``sum`` / ``mean``; a scalar id pools the same either way).
  Weighted lists pool unweighted here (the collection is not ``is_weighted``).
* The unsharded collection holds ``nn.EmbeddingBag`` modules; marked ``sparse`` they get the trainer's
  lazy sparse Adam (a step updates only the rows it touched) and the multi-trainer row-sparse exchange.
* With ``training.sharding: row_wise`` (and ``embedding_optimizer: row_wise_adagrad``) on 2 or more
  ranks, TorchRec's ``DistributedModelParallel`` shards the collection's tables row-wise across the
  ranks instead (docs/training.md, *TorchRec models under DMP*); the logged model is the unsharded one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.modules.embedding_configs import PoolingType

from primus_dagster.training.model_api import ModelContext, ModelInputs

_POOLING = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}


def table_configs(context: ModelContext) -> list[EmbeddingBagConfig]:
    """One config per declared table, with the features it holds and their pooling."""
    configs = []
    for table, (buckets, dim) in context.tables.items():
        features = [f for f in context.id_features if f.table == table]
        poolings = {f.pooling for f in features if f.kind == "list"} or {"sum"}
        if len(poolings) > 1:
            raise ValueError(f"table {table!r} holds lists pooled {sorted(poolings)}: one pooling per TorchRec table")
        configs.append(
            EmbeddingBagConfig(
                name=table,
                embedding_dim=dim,
                num_embeddings=buckets,
                feature_names=[f.name for f in features],
                pooling=_POOLING[poolings.pop()],
            )
        )
    return configs


class EBCTower(nn.Module):
    """``EmbeddingBagCollection`` -> concat with dense -> MLP -> logit.

    Example::

        model = EBCTower(context, hidden=[128, 64])
        logits = model(inputs)        # [B]
    """

    def __init__(self, context: ModelContext, hidden: Sequence[int] = (128, 64)):
        super().__init__()
        self.keys = [f.name for f in context.id_features]
        self.ebc = EmbeddingBagCollection(tables=table_configs(context), device=torch.device("cpu"))
        for bag in self.ebc.embedding_bags.values():
            bag.sparse = True  # sparse gradients: the lazy sparse Adam and the row-sparse exchange
            nn.init.normal_(bag.weight, std=0.01)
        width = sum(f.dim for f in context.id_features) + context.n_dense
        layers: list[nn.Module] = []
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.mlp = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        pooled = self.ebc(inputs.sparse.to_kjt())  # KeyedTensor: every feature's pooled row
        embeddings = torch.cat([pooled[key] for key in self.keys], dim=1)
        return self.mlp(torch.cat([embeddings, inputs.dense], dim=1)).squeeze(1)


def build(context: ModelContext) -> EBCTower:
    """The factory ``training.model.factory`` names; ``params``: ``hidden``."""
    return EBCTower(context, **context.params)
