"""A team's own module (``training.model.type: custom``, or an MTRM tower of ``training.model.memory`` /
``adapt``): :func:`build_module` builds it from its factory, :func:`checked_logits` checks what it returns,
:class:`CustomModel` puts it behind the :class:`~primus_dagster.training.models.protocol.RecModel` protocol.

Example::

    net = build_module("examples/models/deepfm.py:build", ModelContext(layout, {"fm_dim": 16}))
    logits = checked_logits(net(inputs), rows=len(inputs.dense), where="the DeepFM example")
"""

from __future__ import annotations

import torch
from torch import nn

from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.model_api import ModelContext, ModelFactoryError, ModelInputs, load_factory
from primus_dagster.training.models.hashing import FeatureHasher
from primus_dagster.training.models.protocol import Lists, RecModel


def build_module(reference: str, context: ModelContext, key: str = "training.model.factory") -> nn.Module:
    """The module the team's factory ``reference`` builds for ``context``, or a
    :class:`~.model_api.ModelFactoryError` naming the spec ``key`` and the factory."""
    factory = load_factory(reference)
    try:
        net = factory(context)
    except ModelFactoryError:
        raise
    except Exception as exc:
        raise ModelFactoryError(
            f"{key} {reference!r} raised {type(exc).__name__}: {exc} (params: {sorted(context.params) or 'none'})"
        ) from exc
    if not isinstance(net, nn.Module):
        raise ModelFactoryError(f"{key} {reference!r} returned {type(net).__name__}; expected a torch.nn.Module")
    return net


def checked_logits(out: object, rows: int, where: str) -> torch.Tensor:
    """A team module's output as logits ``[B]`` (``[B, 1]`` squeezed), or a
    :class:`~.model_api.ModelFactoryError` saying what ``where`` returned instead."""
    if isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[1] == 1:
        out = out.squeeze(1)
    if not isinstance(out, torch.Tensor) or out.shape != (rows,) or not out.is_floating_point():
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelFactoryError(
            f"{where} returned {shape} for a batch of {rows} rows; forward(inputs) must return float logits [B] "
            "or [B, 1]"
        )
    return out


class CustomModel(RecModel):
    """A team's own module (``training.model.type: custom``) behind the :class:`RecModel` protocol:
    the layout's dense transform and the :class:`FeatureHasher` run here, the module
    (:attr:`net`, built by ``training.model.factory``) gets :class:`~.model_api.ModelInputs` and
    returns logits (training/model_api.py has the protocol). ``kind`` reaches the module as
    ``inputs.kind``; serving calls it with ``"batch"``.

    Example::

        spec = ModelSpec(type="custom", factory="examples/models/deepfm.py:build", params={"fm_dim": 16})
        model = build_model(spec, layout=layout)
        logits = model(dense, sparse, "batch", lists)
    """

    model_type = "custom"

    def __init__(self, spec: ModelSpec, layout: FeatureLayout):
        super().__init__(spec, layout)
        self.hasher = FeatureHasher(layout)
        self.net = build_module(str(spec.factory), ModelContext(layout, dict(spec.params)))

    def logits(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists, kind: str) -> torch.Tensor:
        out = self.net(ModelInputs(dense, self.hasher(sparse, lists), kind))
        return checked_logits(out, dense.shape[0], f"the module of training.model.factory {self.spec.factory!r}")

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The module's own ``loss(logits, labels)`` (``training.loss: model``)."""
        own = getattr(self.net, "loss", None)
        if not callable(own):
            raise ModelFactoryError(
                f"training.loss is 'model' but the module of {self.spec.factory!r} ({type(self.net).__name__}) "
                "has no loss(logits, labels) method"
            )
        return own(logits, labels)
