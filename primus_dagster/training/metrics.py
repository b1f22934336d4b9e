"""AUC and log loss of a model's serving output (``model.predict``) on held-out batches.

Example::

    result = evaluate(model, read_batches(job, context, held_out_tasks), max_rows=100_000)
    print(result.auc, result.log_loss, result.to_dict())
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from primus_dagster.data import Batch
from primus_dagster.training.device import to_device
from primus_dagster.training.models import RecModel, model_inputs

ArrayLike = np.ndarray | torch.Tensor | Sequence[float]
_EPS = 1e-7


def _numpy(values: ArrayLike) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)


def auc(labels: ArrayLike, scores: ArrayLike) -> float:
    """ROC AUC of binary ``labels`` (0/1) against ``scores``; NaN when fewer than two classes are present."""
    y, s = _numpy(labels), _numpy(scores)
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.shape[0]} vs {s.shape[0]}")
    if np.unique(y).size < 2:
        return float("nan")
    return float(roc_auc_score(y, s))


def log_loss(labels: ArrayLike, probabilities: ArrayLike) -> float:
    """Mean binary cross-entropy, probabilities clipped to [1e-7, 1 - 1e-7]; NaN for no rows."""
    y, p = _numpy(labels), _numpy(probabilities)
    if y.shape != p.shape:
        raise ValueError(f"labels and probabilities differ in length: {y.shape[0]} vs {p.shape[0]}")
    if y.size == 0:
        return float("nan")
    p = np.clip(p, _EPS, 1.0 - _EPS)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


@dataclass
class EvalResult:
    """Metrics of one evaluation: ``ctr`` = positives / rows (the empirical click-through rate)."""

    auc: float
    log_loss: float
    rows: int
    positives: int
    ctr: float

    def to_dict(self) -> dict:
        return asdict(self)


def _device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def evaluate(model: RecModel, batches: Iterable[Batch], *, max_rows: int | None = None) -> EvalResult:
    """Evaluate ``sigmoid(model.predict(dense, sparse))`` over ``batches`` (at most ``max_rows`` rows).

    Runs in eval mode without gradients and restores the model's previous train/eval mode.
    Raises ValueError when there are no rows to evaluate.
    """
    was_training = model.training
    device = _device(model)
    labels: list[torch.Tensor] = []
    probs: list[torch.Tensor] = []
    rows = 0
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches if max_rows is None or max_rows > 0 else ():
                if max_rows is not None and rows + batch.rows > max_rows:
                    batch = batch.slice(0, max_rows - rows)
                if batch.rows:
                    dense, sparse, label, lists = to_device(device, *model_inputs(batch), batch.lists)
                    logits = model.predict(dense, sparse, lists) if lists else model.predict(dense, sparse)
                    probs.append(torch.sigmoid(logits.float()).cpu())
                    labels.append(label.float().cpu())
                    rows += batch.rows
                if max_rows is not None and rows >= max_rows:
                    break  # without pulling another batch from the iterable
    finally:
        model.train(was_training)
    if rows == 0:
        raise ValueError(f"no evaluation rows (max_rows={max_rows}): the held-out batches are empty")
    y = torch.cat(labels).numpy()
    p = torch.cat(probs).numpy()
    positives = int((y > 0.5).sum())
    return EvalResult(auc=auc(y, p), log_loss=log_loss(y, p), rows=rows, positives=positives, ctr=positives / rows)
