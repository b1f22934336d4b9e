"""MTRM's and the single tower's towers: :class:`DLRMTower` (the single tower, MTRM's adapt tower),
:class:`MemoryTower` (MTRM's memory tower), :class:`CustomTower` (a team's module as a tower) and
:func:`build_tower` (MTRM's ``memory`` / ``adapt`` tower of a spec). Every tower takes
``(dense, sparse, lists, ...)`` with ``dense`` already transformed and returns logits ``[B]``.

Example::

    tower = DLRMTower(spec, layout)
    logits = tower(dense, sparse, lists)                     # [B]
"""

from __future__ import annotations

import torch
from torch import nn

from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.features import DenseTransform, FeatureLayout
from primus_dagster.training.model_api import ModelContext, ModelFactoryError, ModelInputs
from primus_dagster.training.models.custom import build_module, checked_logits
from primus_dagster.training.models.hashing import FeatureHasher
from primus_dagster.training.models.protocol import Lists, made_up_rows
from primus_dagster.training.models.tables import FeatureEmbeddings


def _mlp(in_dim: int, hidden: list[int]) -> tuple[nn.Sequential, int]:
    """Linear + ReLU per hidden size; returns the MLP and its output width."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    return nn.Sequential(*layers), in_dim


class DLRMTower(nn.Module):
    """Bottom MLP on dense (-> embedding_dim) ++ embeddings [++ aux] -> top MLP -> logit: the single
    tower, and MTRM's built-in adapt tower (``aux_dim``: the width of the memory tower's ``h_aux``).

    Example::

        tower = DLRMTower(spec, layout, aux_dim=memory.state_dim)
        logits = tower(dense, sparse, lists, aux=memory.state(dense, sparse, lists))     # [B]
    """

    def __init__(self, spec: ModelSpec, layout: FeatureLayout, aux_dim: int = 0):
        super().__init__()
        self.embedding = FeatureEmbeddings(layout, spec.sparse_embeddings)
        n_dense = layout.n_dense
        self.bottom = nn.Sequential(nn.Linear(n_dense, spec.embedding_dim), nn.ReLU()) if n_dense else None
        width = (spec.embedding_dim if n_dense else 0) + self.embedding.width + aux_dim
        self.top, width = _mlp(width, list(spec.adapt_hidden))
        self.head = nn.Linear(width, 1)

    def forward(
        self,
        dense: torch.Tensor,
        sparse: torch.Tensor,
        lists: Lists,
        aux: torch.Tensor | None = None,
        kind: str = "batch",  # the tower interface (CustomTower passes it on); a built-in tower takes all alike
    ) -> torch.Tensor:
        parts = self.embedding.parts(sparse, lists)
        if self.bottom is not None:
            parts.insert(0, self.bottom(dense))
        if aux is not None:
            parts.append(aux)
        return self.head(self.top(torch.cat(parts, dim=1))).squeeze(-1)


class MemoryTower(nn.Module):
    """Embeddings ++ dense -> MLP (memory_hidden) -> h_mem -> logit: MTRM's built-in memory tower.

    Example::

        tower = MemoryTower(spec, layout)
        h_aux = tower.state(dense, sparse, lists)                # [B, tower.state_dim]
    """

    def __init__(self, spec: ModelSpec, layout: FeatureLayout):
        super().__init__()
        self.embedding = FeatureEmbeddings(layout, spec.sparse_embeddings)
        self.mlp, self.hidden_dim = _mlp(layout.n_dense + self.embedding.width, list(spec.memory_hidden))
        self.head = nn.Linear(self.hidden_dim, 1)
        self.state_dim = self.hidden_dim + self.embedding.width  # the width of state(): h_aux

    def hidden(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists) -> torch.Tensor:
        return self.mlp(torch.cat([dense, self.embedding(sparse, lists)], dim=1))

    def state(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists) -> torch.Tensor:
        """``h_mem ++ embeddings`` [B, hidden_dim + embedding width]: what the adapt tower reads."""
        emb = self.embedding(sparse, lists)
        return torch.cat([self.mlp(torch.cat([dense, emb], dim=1)), emb], dim=1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists, kind: str = "batch") -> torch.Tensor:
        return self.head(self.hidden(dense, sparse, lists)).squeeze(-1)


class CustomTower(nn.Module):
    """A team's module as one of MTRM's towers, with the built-in towers' interface
    ``(dense, sparse, lists, aux, kind) -> logits [B]`` (``dense`` transformed; ``sparse`` / ``lists``
    raw ids, hashed here by the tower's own :class:`FeatureHasher`, as a custom model's are);
    :meth:`state` is the module's ``state(inputs)``, or its logit ``[B, 1]``.

    Example::

        tower = CustomTower(build_module(reference, context), layout, where=f"the memory tower {reference!r}")
        logits = tower(dense, sparse, lists, kind="batch")       # [B]
    """

    state_dim: int = 0  # the width of state(): set when it is built as a memory tower (build_tower)

    def __init__(self, net: nn.Module, layout: FeatureLayout, where: str):
        super().__init__()
        self.net, self.hasher, self.where = net, FeatureHasher(layout), where

    def _inputs(
        self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists, kind: str, aux: torch.Tensor | None
    ) -> ModelInputs:
        return ModelInputs(dense, self.hasher(sparse, lists), kind, aux)

    def forward(
        self,
        dense: torch.Tensor,
        sparse: torch.Tensor,
        lists: Lists,
        aux: torch.Tensor | None = None,
        kind: str = "batch",
    ) -> torch.Tensor:
        return checked_logits(self.net(self._inputs(dense, sparse, lists, kind, aux)), dense.shape[0], self.where)

    def state(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists) -> torch.Tensor:
        own = getattr(self.net, "state", None)
        if not callable(own):
            return self(dense, sparse, lists).unsqueeze(1)
        out = own(self._inputs(dense, sparse, lists, "batch", None))
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != dense.shape[0]:
            shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ModelFactoryError(f"{self.where}: state(inputs) returned {shape}; expected [B, H]")
        return out


def build_tower(
    spec: ModelSpec, layout: FeatureLayout, role: str, aux_dim: int = 0
) -> MemoryTower | DLRMTower | CustomTower:
    """MTRM's ``role`` tower (``memory`` / ``adapt``): the built-in one, or the team's module of
    ``spec.memory`` / ``spec.adapt``."""
    tower = getattr(spec, role)
    if tower is None:
        return MemoryTower(spec, layout) if role == "memory" else DLRMTower(spec, layout, aux_dim=aux_dim)
    key = f"training.model.{role}.factory"
    context = ModelContext(layout, dict(tower.params), role=role, aux_dim=aux_dim)
    custom = CustomTower(
        build_module(tower.factory, context, key), layout, f"the {role} tower of {key} {tower.factory!r}"
    )
    if role == "memory":
        dense, sparse, lists = made_up_rows(layout)
        try:
            with torch.no_grad():  # the width of its state, for the adapt tower's context
                custom.state_dim = int(custom.state(DenseTransform(layout)(dense), sparse, lists).shape[1])
        except ModelFactoryError:
            raise
        except Exception as exc:
            raise ModelFactoryError(f"{custom.where} failed on 2 made-up rows: {type(exc).__name__}: {exc}") from exc
    return custom
