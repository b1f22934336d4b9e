"""The feature layout a model is built on, and the dense transforms' statistics.

:class:`FeatureLayout` resolves a job's declared features (``training.features``,
:mod:`primus_dagster.spec.features`) against the canonical columns the data carries: which dense
columns (in the order of the batch's ``dense`` vector) with which transform and fill, which id
columns (in :attr:`~primus_dagster.data.Batch.sparse` order) and list columns (``Batch.lists``) go
into which embedding table, and each table's rows and width. It is plain data (:meth:`to_dict`): it
travels to trainer ranks and into checkpoints, so a resumed or warm-started model is rebuilt on the
same layout.

:func:`fit_dense_stats` estimates the transforms' statistics (means, deviations, clip bounds) on
the first rows of training data; :class:`DenseTransform` applies them inside the model, as buffers
(saved with the weights: evaluation, warm starts and serving apply the same transform).

Example::

    layout = FeatureLayout.resolve(job.training, dense_names=["price", "age"], sparse_names=["user"],
                                   list_names=["genres"])
    stats = fit_dense_stats(layout, batches, max_rows=job.training.features.stats_rows)
    model = build_model(job.training.model, layout=layout, seed=0)
    model.dense_transform.load(stats)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from primus_dagster.data import Batch
from primus_dagster.spec.features import SHARED_TABLE, FeaturesSpec
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.spec.sources import ColumnMapping

TRANSFORMS = ("standardize", "log1p", "clip", "none")
_CLIP_QUANTILES = (0.01, 0.99)
_MIN_SCALE = 1e-6  # a constant column keeps scale 1: it stays 0 after centring


@dataclass(frozen=True)
class DenseColumn:
    """One dense input: its transform and its fill (``None``: the column's mean)."""

    name: str
    transform: str = "standardize"
    fill: float | None = None


@dataclass(frozen=True)
class IdColumn:
    """One id input (``pooling`` None: one id per row; ``sum`` / ``mean``: a pooled list) and its table."""

    name: str
    table: str = SHARED_TABLE
    pooling: str | None = None
    weighted: bool = False


@dataclass(frozen=True)
class FeatureLayout:
    """What a model reads (see the module docstring). ``tables``: name -> ``(buckets, dim)``."""

    dense: tuple[DenseColumn, ...]
    sparse: tuple[IdColumn, ...]
    lists: tuple[IdColumn, ...] = ()
    tables: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def n_dense(self) -> int:
        return len(self.dense)

    @property
    def n_sparse(self) -> int:
        return len(self.sparse)

    def table_names(self) -> list[str]:
        """Tables in use, in the order of their first feature (scalar ids first, then lists)."""
        return list(dict.fromkeys(c.table for c in (*self.sparse, *self.lists)))

    def table_features(self, table: str) -> tuple[list[int], list[IdColumn]]:
        """The features ``table`` holds: its id columns (indices into ``sparse``) and its lists, in order."""
        ids = [i for i, c in enumerate(self.sparse) if c.table == table]
        return ids, [c for c in self.lists if c.table == table]

    def embedding_width(self) -> int:
        """Width of all embeddings side by side: one table row per id column and per list."""
        return sum(self.tables[c.table][1] for c in (*self.sparse, *self.lists))

    @classmethod
    def plain(cls, model: ModelSpec, n_dense: int, n_sparse: int) -> FeatureLayout:
        """The layout of undeclared data: ``n_dense`` standardized columns and ``n_sparse`` ids in the
        shared table (names ``d0..`` / ``s0..``)."""
        return cls.resolve(
            TrainingSpec(model=model), [f"d{i}" for i in range(n_dense)], [f"s{i}" for i in range(n_sparse)], []
        )

    @classmethod
    def resolve(
        cls,
        training: TrainingSpec,
        dense_names: Sequence[str],
        sparse_names: Sequence[str],
        list_names: Sequence[str],
        weighted: Iterable[str] = (),
    ) -> FeatureLayout:
        """The layout of data with these canonical columns under ``training.features`` (undeclared
        columns take the defaults)."""
        features: FeaturesSpec = training.features
        model = training.model
        tables: dict[str, tuple[int, int]] = {SHARED_TABLE: (model.hash_buckets, model.embedding_dim)}
        tables.update({name: (t.buckets, t.dim) for name, t in features.tables.items()})
        dense = []
        for name in dense_names:
            d = features.dense_of(name)
            dense.append(DenseColumn(name, d.transform, None if d.fill == "mean" else float(d.fill)))
        sparse = []
        for name in sparse_names:
            c = features.categorical_of(name)
            if c.buckets is not None and c.dim is not None:
                tables[c.table_name()] = (c.buckets, c.dim)
            sparse.append(IdColumn(name, c.table_name()))
        weighted_names = set(weighted)
        lists = []
        for name in list_names:
            c = features.list_of(name)
            if c.buckets is not None and c.dim is not None:
                tables[c.table_name()] = (c.buckets, c.dim)
            lists.append(IdColumn(name, c.table_name(), c.pooling, name in weighted_names))
        used = {c.table for c in (*sparse, *lists)}
        return cls(tuple(dense), tuple(sparse), tuple(lists), {k: v for k, v in tables.items() if k in used})

    @classmethod
    def of_mapping(cls, training: TrainingSpec, columns: ColumnMapping) -> FeatureLayout | None:
        """The layout of a source's column mapping, before any data is read; None when ``columns.dense``
        is one list column (its width is known only from the data)."""
        if isinstance(columns.dense, str):
            return None
        sparse = [name for name, _ in columns.sparse_pairs()]
        lists = [name for name, _ in columns.list_pairs()]
        return cls.resolve(training, list(columns.dense), sparse, lists, columns.weights)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (checkpoints, rank plans); :meth:`from_dict` reads it back."""
        return {
            "dense": [asdict(c) for c in self.dense],
            "sparse": [asdict(c) for c in self.sparse],
            "lists": [asdict(c) for c in self.lists],
            "tables": {name: list(shape) for name, shape in self.tables.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureLayout:
        return cls(
            tuple(DenseColumn(**c) for c in data["dense"]),
            tuple(IdColumn(**c) for c in data["sparse"]),
            tuple(IdColumn(**c) for c in data.get("lists", ())),
            {name: (int(shape[0]), int(shape[1])) for name, shape in data["tables"].items()},
        )

    def check(self, batch: Batch) -> None:
        """ValueError naming the difference when ``batch`` does not carry this layout's columns."""
        have = (batch.dense.shape[1], batch.sparse_names, batch.list_names)
        want = (self.n_dense, [c.name for c in self.sparse], [c.name for c in self.lists])
        if have != want:
            raise ValueError(
                f"batch {batch.batch_id.key()} carries {have[0]} dense columns, ids {have[1]} and lists {have[2]}; "
                f"the model was built for {want[0]}, {want[1]} and {want[2]} (every source of a job must map "
                "the same canonical columns)"
            )


def _signed_log1p(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


@dataclass
class DenseStats:
    """Per dense column: clip bounds (``-inf``/``inf`` where none), centre, scale and the fill in the
    transformed space; ``rows``: how many rows they were estimated on."""

    lo: np.ndarray
    hi: np.ndarray
    center: np.ndarray
    scale: np.ndarray
    fill: np.ndarray
    rows: int = 0


def fit_dense_stats(layout: FeatureLayout, batches: Iterable[Batch], max_rows: int) -> DenseStats:
    """The transforms' statistics of ``layout``'s dense columns, on the first ``max_rows`` rows of
    ``batches`` (missing values left out). A column with no value keeps centre 0, scale 1."""
    parts, rows = [], 0
    for batch in batches:
        if rows >= max_rows:
            break
        take = batch.dense[: max_rows - rows].numpy().astype(np.float64)
        parts.append(take)
        rows += take.shape[0]
    n = layout.n_dense
    data = np.concatenate(parts) if parts else np.zeros((0, n))
    lo, hi = np.full(n, -np.inf), np.full(n, np.inf)
    center, scale, fill = np.zeros(n), np.ones(n), np.zeros(n)
    for j, column in enumerate(layout.dense):
        values = data[:, j][np.isfinite(data[:, j])]
        if column.transform == "clip" and values.size:
            lo[j], hi[j] = np.quantile(values, _CLIP_QUANTILES)
            values = np.clip(values, lo[j], hi[j])
        if column.transform == "log1p":
            values = _signed_log1p(values)
        if column.transform != "none" and values.size:
            center[j] = values.mean()
            deviation = values.std()
            scale[j] = deviation if deviation > _MIN_SCALE else 1.0
        if column.fill is not None:
            raw = np.clip(column.fill, lo[j], hi[j])
            raw = _signed_log1p(raw) if column.transform == "log1p" else raw
            fill[j] = (raw - center[j]) / scale[j]
        elif column.transform == "none" and values.size:
            fill[j] = values.mean()
    return DenseStats(lo, hi, center, scale, fill, rows)


class DenseTransform(nn.Module):
    """The dense columns' transforms inside the model: ``[B, n]`` raw values (NaN: missing) ->
    clipped, ``log1p``-ed, standardized values, missing ones replaced by their fill. Until
    :meth:`load` the statistics are the identity (centre 0, scale 1, fill 0)."""

    lo: torch.Tensor  # registered buffers (saved with the weights)
    hi: torch.Tensor
    center: torch.Tensor
    scale: torch.Tensor
    fill: torch.Tensor
    log_mask: torch.Tensor
    fitted_rows: torch.Tensor

    def __init__(self, layout: FeatureLayout):
        super().__init__()
        n = layout.n_dense
        self.register_buffer("lo", torch.full((n,), -float("inf")))
        self.register_buffer("hi", torch.full((n,), float("inf")))
        self.register_buffer("center", torch.zeros(n))
        self.register_buffer("scale", torch.ones(n))
        self.register_buffer("fill", torch.zeros(n))
        self.register_buffer("log_mask", torch.tensor([c.transform == "log1p" for c in layout.dense], dtype=torch.bool))
        self.register_buffer("fitted_rows", torch.zeros((), dtype=torch.int64))
        self.clips = any(c.transform == "clip" for c in layout.dense)
        self.logs = bool(self.log_mask.any())

    def load(self, stats: DenseStats) -> None:
        """Take ``stats`` (from :func:`fit_dense_stats`)."""
        for name in ("lo", "hi", "center", "scale", "fill"):
            getattr(self, name).copy_(torch.as_tensor(getattr(stats, name), dtype=torch.float32))
        self.fitted_rows.fill_(stats.rows)

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        if dense.shape[1] == 0:
            return dense
        x = dense
        if self.clips:
            x = torch.maximum(torch.minimum(x, self.hi), self.lo)  # NaN stays NaN
        if self.logs:
            x = torch.where(self.log_mask, torch.sign(x) * torch.log1p(torch.abs(x)), x)
        x = (x - self.center) / self.scale
        return torch.where(torch.isnan(x), self.fill, x)


def dense_names(mapping: ColumnMapping, width: int) -> list[str]:
    """The names of a source's ``width`` dense values: its ``columns.dense`` list, or ``col[i]`` for one
    list column."""
    if isinstance(mapping.dense, list):
        return list(mapping.dense)
    return [f"{mapping.dense}[{i}]" for i in range(width)]


@dataclass(frozen=True)
class ModelInit:
    """What a model is built from besides its spec: the layout and, for a fresh model, the dense
    statistics (a resumed or warm-started one has them in its weights). Plain data (:meth:`to_dict`)."""

    layout: FeatureLayout
    stats: DenseStats | None = None

    @classmethod
    def of_batch(cls, training: TrainingSpec, mapping: ColumnMapping, batch: Batch) -> ModelInit:
        """The layout of ``batch``'s columns (mapped by ``mapping``) under ``training.features``, no stats."""
        names = dense_names(mapping, batch.dense.shape[1])
        layout = FeatureLayout.resolve(training, names, batch.sparse_names, batch.list_names, mapping.weights)
        return cls(layout)

    def to_dict(self) -> dict[str, Any]:
        stats = None
        if self.stats is not None:
            s = self.stats
            stats = {k: getattr(s, k).tolist() for k in ("lo", "hi", "center", "scale", "fill")} | {"rows": s.rows}
        return {"layout": self.layout.to_dict(), "stats": stats}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelInit:
        raw = data.get("stats")
        stats = None
        if raw is not None:
            arrays = {k: np.asarray(raw[k], dtype=np.float64) for k in ("lo", "hi", "center", "scale", "fill")}
            stats = DenseStats(**arrays, rows=int(raw["rows"]))
        return cls(FeatureLayout.from_dict(data["layout"]), stats)

    @classmethod
    def of_checkpoint(cls, extra: Mapping[str, Any], model: ModelSpec) -> ModelInit:
        """The layout a checkpoint's model was built on (its ``extra``; the stats are in its weights);
        a checkpoint from before layouts: the plain layout of its widths."""
        if "layout" in extra:
            return cls(FeatureLayout.from_dict(extra["layout"]))
        return cls(FeatureLayout.plain(model, int(extra["n_dense"]), int(extra["n_sparse"])))
