"""``training.loss``: the loss of a model's logits against the labels (:func:`loss_function`).

Example::

    loss = loss_function("bce", model)(model(dense, sparse, "batch"), label)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from primus_dagster.training.models.custom import CustomModel
from primus_dagster.training.models.protocol import RecModel

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _brier(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(torch.sigmoid(logits), labels)


def loss_function(name: str, model: RecModel) -> LossFunction:
    """``training.loss`` as a function of ``(logits, labels)``: ``bce``, ``mse`` (of the sigmoid) or
    ``model`` (:meth:`CustomModel.loss`)."""
    if name == "bce":
        return F.binary_cross_entropy_with_logits
    if name == "mse":
        return _brier
    if name == "model" and isinstance(model, CustomModel):
        return model.loss
    raise ValueError(f"training.loss {name!r} does not apply to a {model.model_type!r} model")
