"""Recommendation models: hashed sparse embeddings, the single-tower baseline and MTRM.

The model protocol (every model built by :func:`build_model` follows it)::

    model.layout, model.n_dense, model.n_sparse, model.list_names   # what it reads
    model(dense, sparse, kind, lists) -> logits [B]  # training output for samples of ``kind``
    model.predict(dense, sparse, lists) -> logits [B]  # serving output

``dense`` is float32 [B, n_dense] raw values (NaN: missing; the model's :class:`DenseTransform`
standardizes, log-transforms or clips them with statistics it keeps as buffers, and fills the
missing ones), ``sparse`` int64 [B, n_sparse] raw ids (any int64, negative ones included; the model
hashes them into each feature's table), ``lists`` the list features by name as jagged ids
(:class:`~primus_dagster.data.batch.Jagged`; empty without list features), ``kind`` is ``"batch"``
(complete, delayed labels) or ``"stream"`` (fresh, partially labelled). Outputs are logits: apply
``torch.sigmoid`` for a CTR. Tables and transforms follow the
:class:`~primus_dagster.training.features.FeatureLayout` the model is built on.

* :class:`SingleTower` -- DLRM-style baseline; ``kind`` is ignored and ``predict == forward``.
* :class:`MTRM` -- mixture training recommendation model (Primus, ATC'25): a memory tower learns
  ``batch`` samples, an adapt tower learns ``stream`` samples and also reads the memory tower's hidden
  state and embeddings (detached: no gradient flows into the memory tower); serving uses the adapt tower.

:func:`model_inputs` turns a data-plane :class:`~primus_dagster.data.Batch` into these inputs.

The package, one concern a module (each imports only the ones above it):

* :mod:`.groups` -- ``KINDS`` and :class:`ParameterGroups`: what a model trains on which data kind (its
  declaration, which the trainer's loop and a group's exchange read);
* :mod:`.protocol` -- :class:`RecModel` (the protocol), :func:`model_inputs`, ``Lists``,
  :func:`made_up_rows`;
* :mod:`.hashing` -- the id hash (:func:`hash_ids`, :func:`table_salts`) and :class:`FeatureHasher`;
* :mod:`.tables` -- :class:`HashedEmbedding`, :class:`FeatureEmbeddings`, :func:`sparse_tables`;
* :mod:`.custom` -- a team's module: :func:`build_module`, :func:`checked_logits`, :class:`CustomModel`;
* :mod:`.towers` -- the towers (DLRM, memory, a team's) and :func:`~.towers.build_tower`;
* :mod:`.builtin` -- :class:`SingleTower`, :class:`MTRM`;
* :mod:`.losses` -- :func:`loss_function` (``training.loss``);
* :mod:`.building` -- :func:`build_model`, :func:`build_initial_model`, :func:`check_model`,
  :func:`model_summary`, :func:`custom_model_line`.

The tables' memory comes from :mod:`primus_dagster.training.huge_pages`.

Example::

    model = build_model(ModelSpec(type="mtrm"), n_dense=13, n_sparse=5, seed=0)
    dense, sparse, label = model_inputs(batch)
    loss = F.binary_cross_entropy_with_logits(model(dense, sparse, batch.kind, batch.lists), label)
    ctr = torch.sigmoid(model.predict(dense, sparse, batch.lists))
"""

from __future__ import annotations

from primus_dagster.training.huge_pages import huge_page_copy, huge_page_zeros
from primus_dagster.training.models.building import (
    build_initial_model,
    build_model,
    check_model,
    custom_model_line,
    model_summary,
)
from primus_dagster.training.models.builtin import MTRM, SingleTower
from primus_dagster.training.models.custom import CustomModel, build_module, checked_logits
from primus_dagster.training.models.groups import KINDS, ParameterGroups
from primus_dagster.training.models.hashing import HASH_LIMBS, HASH_PRIME, FeatureHasher, hash_ids, table_salts
from primus_dagster.training.models.losses import LossFunction, loss_function
from primus_dagster.training.models.protocol import (
    MAX_SPARSE_TABLES,
    NO_LISTS,
    Lists,
    RecModel,
    made_up_rows,
    model_inputs,
)
from primus_dagster.training.models.tables import (
    FeatureEmbeddings,
    HashedEmbedding,
    RowWindow,
    TablePlacement,
    placed,
    shard_rows,
    sparse_tables,
)
from primus_dagster.training.models.towers import CustomTower, DLRMTower, MemoryTower, build_tower

# Models logged before the package split pickled their towers by these names, as classes of the module
# primus_dagster.training.models: they still load (a registered model, the delayed final evaluation's).
_DLRMTower = DLRMTower
_MemoryTower = MemoryTower
_CustomTower = CustomTower

__all__ = [
    "HASH_LIMBS",
    "HASH_PRIME",
    "KINDS",
    "MAX_SPARSE_TABLES",
    "MTRM",
    "NO_LISTS",
    "CustomModel",
    "CustomTower",
    "DLRMTower",
    "FeatureEmbeddings",
    "FeatureHasher",
    "HashedEmbedding",
    "Lists",
    "LossFunction",
    "MemoryTower",
    "ParameterGroups",
    "RecModel",
    "RowWindow",
    "SingleTower",
    "TablePlacement",
    "build_initial_model",
    "build_model",
    "build_module",
    "build_tower",
    "check_model",
    "checked_logits",
    "custom_model_line",
    "hash_ids",
    "huge_page_copy",
    "huge_page_zeros",
    "loss_function",
    "made_up_rows",
    "model_inputs",
    "model_summary",
    "placed",
    "shard_rows",
    "sparse_tables",
    "table_salts",
]
