"""The model protocol every model implements: :class:`RecModel` and its inputs.

:func:`model_inputs` turns a data-plane batch into ``(dense, sparse, label)``, :data:`Lists` is a batch's
list features by name, :data:`KINDS` the sample kinds a model is called with, :func:`made_up_rows` the
rows the protocol checks run a model on (the package docstring states the protocol).

Example::

    dense, sparse, label = model_inputs(batch)
    logits = model(dense, sparse, batch.kind, batch.lists)      # any RecModel
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from primus_dagster.data import Batch, Jagged
from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.features import DenseTransform, FeatureLayout
from primus_dagster.training.models.groups import KINDS, ParameterGroups

MAX_SPARSE_TABLES = 64  # tables with sparse gradients in one model: a row of the exchange's status header each

Lists = Mapping[str, Jagged]  # a batch's list features by name (Batch.lists)
#: No list features: the default ``lists`` of the models and their parts (never mutated).
NO_LISTS: Lists = {}


def _zero_nan(values: torch.Tensor) -> torch.Tensor:
    """NaN -> 0 (a copy only when there is a NaN: read-only Arrow views stay views)."""
    return torch.nan_to_num(values, nan=0.0) if bool(torch.isnan(values).any()) else values


def model_inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dense, sparse, label)`` as the models read them: a missing dense value stays NaN (the model's
    :class:`~primus_dagster.training.features.DenseTransform` fills it), an unlabelled row is a
    negative (a stream row without a click yet, until it is corrected). List features:
    ``batch.lists``."""
    if batch.kind not in KINDS:
        raise ValueError(f"batch {batch.batch_id.key()} has kind {batch.kind!r}; expected one of {KINDS}")
    return batch.dense, batch.sparse, _zero_nan(batch.label)


def made_up_rows(layout: FeatureLayout, rows: int = 2) -> tuple[torch.Tensor, torch.Tensor, dict[str, Jagged]]:
    """``rows`` rows of zeros in ``layout``'s shape (dense, ids, one id per list): what the protocol
    checks run a model on."""
    offsets = torch.arange(rows + 1, dtype=torch.int64)
    lists = {
        c.name: Jagged(torch.zeros(rows, dtype=torch.int64), offsets, torch.ones(rows) if c.weighted else None)
        for c in layout.lists
    }
    return torch.zeros(rows, layout.n_dense), torch.zeros(rows, layout.n_sparse, dtype=torch.int64), lists


def _check_inputs(model: RecModel, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists) -> None:
    if dense.dim() != 2 or dense.shape[1] != model.n_dense:
        raise ValueError(f"dense must be [B, {model.n_dense}], got {list(dense.shape)}")
    if sparse.dim() != 2 or sparse.shape[1] != model.n_sparse or sparse.shape[0] != dense.shape[0]:
        raise ValueError(f"sparse must be [{dense.shape[0]}, {model.n_sparse}], got {list(sparse.shape)}")
    if list(lists) != model.list_names:
        raise ValueError(f"list features must be {model.list_names}, got {list(lists)}")


class RecModel(nn.Module):
    """What every model built by :func:`~primus_dagster.training.models.build_model` is (the protocol in
    the docstring of :mod:`primus_dagster.training.models`).

    Subclasses implement :meth:`logits` on *transformed* dense values: ``forward`` checks the inputs
    and applies :attr:`dense_transform` (the layout's transforms, statistics saved with the weights).

    Example::

        class Linear(RecModel):
            def __init__(self, spec: ModelSpec, layout: FeatureLayout):
                super().__init__(spec, layout)
                self.head = nn.Linear(layout.n_dense, 1)

            def logits(self, dense, sparse, lists, kind):
                return self.head(dense).squeeze(-1)
    """

    model_type: str

    def __init__(self, spec: ModelSpec, layout: FeatureLayout):
        super().__init__()
        if layout.n_dense + layout.n_sparse + len(layout.lists) == 0:
            raise ValueError("need some input features: the layout has no dense, id or list column")
        self.spec, self.layout = spec, layout
        self.n_dense, self.n_sparse = layout.n_dense, layout.n_sparse
        self.list_names = [c.name for c in layout.lists]
        self.dense_transform = DenseTransform(layout)

    def logits(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists, kind: str) -> torch.Tensor:
        """Training logits [B] of transformed ``dense``."""
        raise NotImplementedError

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, kind: str, lists: Lists = NO_LISTS) -> torch.Tensor:
        """Training logits [B] for samples of ``kind`` (``dense``: raw values, NaN where missing)."""
        _check_inputs(self, dense, sparse, lists)
        return self.logits(self.dense_transform(dense), sparse, lists, kind)

    def predict(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists = NO_LISTS) -> torch.Tensor:
        """Serving logits [B]."""
        return self.forward(dense, sparse, "batch", lists)

    def lr_scale(self, name: str) -> float:
        """The factor on ``training.learning_rate`` for the parameter called ``name`` (1: the same rate)."""
        return 1.0

    def parameter_groups(self) -> ParameterGroups:
        """Which of its parameters a micro-batch of each kind trains (:mod:`.groups`): here, all of them by
        every kind. A model with parts per data kind declares them (:class:`~.builtin.MTRM`)."""
        return ParameterGroups.one()

    def observe_labels(self, kind: str, label_sum: float, count: int) -> None:
        """The trainer tells the model the labels of each micro-batch it trains (their sum and count; a
        group tells every replica every rank's, in rank order). Nothing to keep here; MTRM's
        label-delay calibration counts them."""

    def auxiliary_loss(
        self, dense: torch.Tensor, sparse: torch.Tensor, kind: str, label: torch.Tensor, lists: Lists = NO_LISTS
    ) -> torch.Tensor | None:
        """A loss the trainer adds to ``BCE(model(dense, sparse, kind), label)`` (None: nothing)."""
        return None
