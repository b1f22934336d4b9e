"""A popularity prior, and the guard that a trained model must beat it (and chance).

:class:`PopularityPrior` is the trivial baseline a recommendation model has to beat: for each scalar
categorical feature (the columns of :attr:`Batch.sparse <primus_dagster.data.Batch.sparse>`, named by
``Batch.sparse_names``) it keeps, per raw id, the label sum and the row count of the *training* rows
(labelled rows only: a NaN label -- not labelled yet -- is skipped), and scores a row by its id's
smoothed positive rate ``(pos + a * global_rate) / (count + a)`` (``a`` = ``smoothing``, 10 by
default; an id never seen in training scores the global rate). Scored on held-out rows,
:func:`prior_aucs` gives each feature's AUC and the best one: :class:`BaselineVerdict`. And
:func:`verdict` says whether a model's AUC is good enough: above chance by a margin (0.5 + 0.01) and
not below the best popularity prior.

The counts are exact, per raw id: sorted unique ids with their label sums and counts, merged with
the ids of new batches by one ``np.unique`` (+ ``np.bincount``) whenever the ids waiting to be merged
outnumber the ones merged (at least 2**18 of them), so each row is sorted O(log rows) times, and
scoring is a ``np.searchsorted``. Not hashed into buckets: a collision would mix the rates of two ids
(a 10-million-id catalogue in 2**20 buckets puts ~10 ids in each), and the prior would be weaker than
the one a team computes with a ``GROUP BY`` -- a bar set too low. Memory: ~24 bytes per distinct id
of each feature, plus the rows waiting to be merged.

Pure numpy: tensors are accepted (and converted), torch is never imported here.

Example::

    prior = PopularityPrior()
    for batch in read_batches(job, context, training_tasks):
        prior.update(batch)
    prior.score(held_out_batch)["item_id"]            # each row's item like-rate on the training rows
    baseline = prior_aucs(prior, read_batches(job, context, held_out_tasks), max_rows=1_000_000)
    baseline.popularity_feature, baseline.popularity_auc, baseline.aucs
    ok, reason = verdict(model_auc, baseline)        # (False, "below the popularity prior on ...")
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from primus_dagster.data import Batch

__all__ = [
    "CHANCE_MARGIN",
    "DEFAULT_SMOOTHING",
    "BaselineVerdict",
    "PopularityPrior",
    "PriorScores",
    "prior_aucs",
    "verdict",
    "verdict_text",
]

#: ``a`` of the smoothed rate ``(pos + a * global_rate) / (count + a)``: an id seen ``a`` times is half
#: its own rate, half the global one.
DEFAULT_SMOOTHING = 10.0
#: A model whose AUC is at or below ``0.5 + CHANCE_MARGIN`` is "no better than chance".
CHANCE_MARGIN = 0.01
_MIN_MERGE = 1 << 18  # ids waiting before a merge, at the least


def _numpy(values: Any, dtype: type) -> np.ndarray:
    """``values`` (a numpy array, a torch tensor or a sequence) as a numpy array of ``dtype``."""
    if hasattr(values, "detach"):  # a torch tensor (duck-typed: torch is not imported here)
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)


class _FeatureCounts:
    """Label sums and counts per distinct id of one feature: sorted ``ids`` + ``pos`` + ``count``, and
    the ids (with labels) of the rows not merged yet."""

    __slots__ = ("count", "ids", "pending", "pending_rows", "pos")

    def __init__(self) -> None:
        self.ids: np.ndarray = np.zeros(0, dtype=np.int64)
        self.pos: np.ndarray = np.zeros(0, dtype=np.float64)
        self.count: np.ndarray = np.zeros(0, dtype=np.float64)
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.pending_rows = 0

    def add(self, ids: np.ndarray, labels: np.ndarray) -> None:
        self.pending.append((ids, labels))
        self.pending_rows += len(ids)
        if self.pending_rows >= max(_MIN_MERGE, len(self.ids)):
            self.merge()

    def merge(self) -> None:
        if not self.pending:
            return
        ids = np.concatenate([self.ids, *(i for i, _ in self.pending)])
        pos = np.concatenate([self.pos, *(y for _, y in self.pending)])
        count = np.concatenate([self.count, np.ones(self.pending_rows, dtype=np.float64)])
        self.ids, inverse = np.unique(ids, return_inverse=True)
        self.pos = np.bincount(inverse, weights=pos, minlength=len(self.ids))
        self.count = np.bincount(inverse, weights=count, minlength=len(self.ids))
        self.pending, self.pending_rows = [], 0


class PopularityPrior:
    """Per feature and raw id, the smoothed positive rate of the training rows (module docstring).

    >>> import numpy as np
    >>> prior = PopularityPrior(smoothing=0.0)
    >>> prior.update_arrays(["item"], np.array([[1], [1], [2], [3]]), np.array([1.0, 1.0, 0.0, np.nan]))
    3
    >>> prior.global_rate, prior.rate("item", np.array([1, 2, 9])).tolist()
    (0.6666666666666666, [1.0, 0.0, 0.6666666666666666])
    """

    def __init__(self, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if smoothing < 0:
            raise ValueError(f"smoothing must be >= 0, got {smoothing}")
        self.smoothing = float(smoothing)
        self.rows = 0  # labelled training rows counted
        self.positives = 0.0  # their label sum
        self._features: dict[str, _FeatureCounts] = {}

    @property
    def features(self) -> list[str]:
        """The features seen in training, in the order they first came."""
        return list(self._features)

    @property
    def global_rate(self) -> float:
        """The positive rate of every labelled training row (NaN before any)."""
        return self.positives / self.rows if self.rows else float("nan")

    def update(self, batch: Batch) -> int:
        """Count the labelled rows of a training ``batch``; returns how many were labelled."""
        return self.update_arrays(batch.sparse_names, batch.sparse, batch.label)

    def update_arrays(self, names: Sequence[str], sparse: Any, labels: Any) -> int:
        """Count rows given as arrays (numpy or torch): ``sparse`` int64 [B, len(names)] raw ids,
        ``labels`` [B] (NaN: unlabelled, skipped). Returns how many rows were labelled."""
        y = _numpy(labels, np.float64).reshape(-1)
        ids = _numpy(sparse, np.int64).reshape(len(y), len(names))
        labelled = ~np.isnan(y)
        taken = int(labelled.sum())
        if taken == 0:
            return 0
        if taken < len(y):
            y, ids = y[labelled], ids[labelled]
        self.rows += taken
        self.positives += float(y.sum())
        for column, name in enumerate(names):
            self._features.setdefault(name, _FeatureCounts()).add(np.ascontiguousarray(ids[:, column]), y)
        return taken

    def fit(self, batches: Iterable[Batch], max_rows: int | None = None) -> PopularityPrior:
        """Count ``batches`` (at most ``max_rows`` labelled rows; stops pulling batches there); ``self``."""
        if max_rows is not None and self.rows >= max_rows:
            return self
        for batch in batches:
            if max_rows is not None and self.rows + batch.rows > max_rows:
                batch = batch.slice(0, max_rows - self.rows)
            self.update(batch)
            if max_rows is not None and self.rows >= max_rows:
                break
        return self

    def rate(self, feature: str, ids: Any) -> np.ndarray:
        """The smoothed positive rate of each id in ``ids`` for ``feature`` (float64; an id -- or a
        feature -- never seen in training: the global rate)."""
        ids = _numpy(ids, np.int64).reshape(-1)
        g = self.global_rate
        counts = self._features.get(feature)
        if counts is None:
            return np.full(len(ids), g, dtype=np.float64)
        counts.merge()
        out = np.full(len(ids), g, dtype=np.float64)
        if len(counts.ids) == 0:
            return out
        where = np.minimum(np.searchsorted(counts.ids, ids), len(counts.ids) - 1)
        seen = counts.ids[where] == ids
        a = self.smoothing
        hit = where[seen]
        denominator = counts.count[hit] + a
        out[seen] = (counts.pos[hit] + a * g) / np.where(denominator > 0, denominator, 1.0)
        return out

    def score(self, batch: Batch) -> dict[str, np.ndarray]:
        """Each row's smoothed rate, per sparse feature of ``batch`` (``Batch.sparse_names``)."""
        sparse = _numpy(batch.sparse, np.int64).reshape(batch.rows, -1)
        return {name: self.rate(name, sparse[:, i]) for i, name in enumerate(batch.sparse_names)}

    def __repr__(self) -> str:
        return f"PopularityPrior(rows={self.rows}, features={self.features}, global_rate={self.global_rate:.4f})"


@dataclass
class BaselineVerdict:
    """The popularity prior on held-out rows: the best feature's AUC (``popularity_auc``, on
    ``popularity_feature``) and every feature's (``aucs``; NaN where the rows have one class only),
    with the training rows it was counted on and the held-out rows it was scored on."""

    popularity_auc: float
    popularity_feature: str
    aucs: dict[str, float] = field(default_factory=dict)
    train_rows: int = 0
    eval_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PriorScores:
    """The prior's scores of held-out rows, gathered as the rows go by (:meth:`watch`), so that the
    model and the prior are scored on the very same rows in one read.

    Labels as the model's evaluation reads them: an unlabelled (NaN) held-out row is a negative.
    """

    def __init__(self, prior: PopularityPrior) -> None:
        self.prior = prior
        self.rows = 0
        self._labels: list[np.ndarray] = []
        self._scores: dict[str, list[np.ndarray]] = {}

    def observe(self, batch: Batch) -> None:
        """Score ``batch`` and keep its scores and labels."""
        if batch.rows == 0:
            return
        y = _numpy(batch.label, np.float64).reshape(-1)
        self._labels.append(np.nan_to_num(y, nan=0.0))
        for name, scores in self.prior.score(batch).items():
            self._scores.setdefault(name, []).append(scores)
        self.rows += batch.rows

    def watch(self, batches: Iterable[Batch], max_rows: int | None = None) -> Iterator[Batch]:
        """``batches`` cut at ``max_rows`` rows (the last one sliced), each observed before it is
        yielded; no batch is pulled past ``max_rows``."""
        rows = 0
        if max_rows is not None and max_rows <= 0:
            return
        for batch in batches:
            if max_rows is not None and rows + batch.rows > max_rows:
                batch = batch.slice(0, max_rows - rows)
            self.observe(batch)
            rows += batch.rows
            yield batch
            if max_rows is not None and rows >= max_rows:
                return

    def baseline(self) -> BaselineVerdict | None:
        """Per-feature AUCs and the best feature; None without a feature whose AUC is a number (no
        sparse features, no held-out rows, one class only, or a prior without training rows)."""
        if not self._labels or self.prior.rows == 0:
            return None
        from primus_dagster.training.metrics import auc  # sklearn; loaded when a prior is scored

        y = np.concatenate(self._labels)
        aucs = {name: auc(y, np.concatenate(parts)) for name, parts in self._scores.items()}
        finite = {name: value for name, value in aucs.items() if not math.isnan(value)}
        if not finite:
            return None
        best = max(finite, key=lambda name: finite[name])  # the first of equal ones
        return BaselineVerdict(finite[best], best, aucs, train_rows=self.prior.rows, eval_rows=self.rows)


def prior_aucs(
    prior: PopularityPrior, eval_batches: Iterable[Batch], max_rows: int | None = None
) -> BaselineVerdict | None:
    """Score ``prior`` on the first ``max_rows`` rows of ``eval_batches``: each feature's AUC and the best
    (:class:`BaselineVerdict`); None when no feature has an AUC (see :meth:`PriorScores.baseline`)."""
    scores = PriorScores(prior)
    for _ in scores.watch(eval_batches, max_rows):
        pass
    return scores.baseline()


def verdict(
    model_auc: float | None, baseline: BaselineVerdict | None, margin: float = CHANCE_MARGIN
) -> tuple[bool, str]:
    """Whether a model's AUC is good enough to promote, and why: not when it is at or below
    ``0.5 + margin`` ("no better than chance") or below the popularity prior's AUC. Without a
    ``baseline`` (a model with no sparse features; no training rows) only the chance guard applies.

    >>> verdict(0.70, BaselineVerdict(0.72, "item_id"))
    (False, 'below the popularity prior on feature item_id: 0.7000 < 0.7200')
    >>> verdict(0.505, None)
    (False, 'no better than chance: AUC 0.5050 <= 0.5 + 0.01')
    """
    if model_auc is None or math.isnan(model_auc):
        return False, "no AUC (no held-out rows with both labels)"
    if model_auc <= 0.5 + margin:
        return False, f"no better than chance: AUC {model_auc:.4f} <= 0.5 + {margin:g}"
    if baseline is None:
        return True, f"AUC {model_auc:.4f} > 0.5 + {margin:g} (no popularity prior: chance is the only bar)"
    if model_auc < baseline.popularity_auc:
        return False, (
            f"below the popularity prior on feature {baseline.popularity_feature}: "
            f"{model_auc:.4f} < {baseline.popularity_auc:.4f}"
        )
    return True, (
        f"AUC {model_auc:.4f} >= the popularity prior on feature {baseline.popularity_feature} "
        f"({baseline.popularity_auc:.4f}) and > 0.5 + {margin:g}"
    )


def verdict_text(model_auc: float | None, baseline: BaselineVerdict | None, margin: float = CHANCE_MARGIN) -> str:
    """One line: the AUC, the prior and the verdict (what ``primus-dagster train`` prints after
    ``quality:``).

    >>> verdict_text(0.712, BaselineVerdict(0.703, "item_id"))
    'AUC 0.7120 vs popularity prior 0.7030 (feature item_id): ok'
    >>> verdict_text(0.69, BaselineVerdict(0.703, "item_id"))
    'AUC 0.6900 vs popularity prior 0.7030 (feature item_id): BELOW BASELINE: below the popularity prior on feature item_id: 0.6900 < 0.7030'
    """
    ok, reason = verdict(model_auc, baseline, margin)
    shown = "n/a" if model_auc is None or math.isnan(model_auc) else f"{model_auc:.4f}"
    if baseline is None:
        head = f"AUC {shown} (no popularity prior)"
    else:
        head = f"AUC {shown} vs popularity prior {baseline.popularity_auc:.4f} (feature {baseline.popularity_feature})"
    return f"{head}: ok" if ok else f"{head}: BELOW BASELINE: {reason}"
