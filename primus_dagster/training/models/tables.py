"""Hashed embedding tables: :class:`HashedEmbedding` (one table, its id and list features),
:class:`FeatureEmbeddings` (every table of a layout) and :func:`sparse_tables` (the tables with sparse
gradients a model holds).

**Where a table's rows live.** Built as it is, a model holds every row of its tables. Built under
:func:`placed` with a :class:`TablePlacement` of ``world`` > 1 -- a group of trainers that shards its
tables row-wise -- each table holds only its rank's contiguous share of the rows (``torch.chunk``'s split,
what a ``DTensor`` sharded on rows holds) and is *sharded*: before a step its
:class:`RowWindow` is set to the rows the step looks up, fetched from their owners, and the lookups read
the window (its gradient is the rows' gradient, sent back to the owners:
:mod:`primus_dagster.training.distributed.sharded`). A row's initial value is the same under any
placement (:func:`initial_rows`: seeded blocks of rows), so one trainer, a replicated group and a sharded
one start from the same tables.

Example::

    emb = FeatureEmbeddings(layout, sparse=True)
    out = emb(sparse, lists)                                 # [B, layout.embedding_width()]
    with placed(TablePlacement(rank=1, world=2)):
        shard = HashedEmbedding(n_features=5, buckets=100_000, dim=16, sparse=True)   # rows 50 000..99 999
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from primus_dagster.data import Jagged
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.huge_pages import huge_page_zeros
from primus_dagster.training.models.hashing import hash_ids, table_salts
from primus_dagster.training.models.protocol import NO_LISTS
from primus_dagster.training.row_sparse import row_sparse_bag

#: Rows of one seeded block of a table's initial values (:func:`initial_rows`).
INIT_BLOCK_ROWS = 1 << 16
INIT_STD = 0.01


@dataclass(frozen=True)
class TablePlacement:
    """The rows of every table a process holds: rank ``rank``'s share of ``world`` contiguous ranges.

    Example::

        TablePlacement(rank=1, world=3).rows(10)      # (4, 8): torch.chunk's split, ceil(10 / 3) rows a rank
    """

    rank: int
    world: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} out of range for a group of {self.world}")

    def rows(self, buckets: int) -> tuple[int, int]:
        """``[start, end)`` of this rank's rows of a table of ``buckets`` rows."""
        return shard_rows(buckets, self.world, self.rank)


def shard_rows(buckets: int, world: int, rank: int) -> tuple[int, int]:
    """``[start, end)`` of rank ``rank``'s rows of a table of ``buckets`` rows split over ``world`` ranks
    as ``torch.chunk`` (and a ``DTensor`` with ``Shard(0)``) splits them: ``ceil(buckets / world)`` rows a
    rank, the last ones fewer (or none)."""
    chunk = -(-buckets // world)
    start = min(rank * chunk, buckets)
    return start, min(start + chunk, buckets)


_PLACEMENT: contextvars.ContextVar[TablePlacement | None] = contextvars.ContextVar("table_placement", default=None)


@contextlib.contextmanager
def placed(placement: TablePlacement | None) -> Iterator[None]:
    """Tables built inside hold ``placement``'s rows (None, or a group of one: every row)."""
    token = _PLACEMENT.set(placement if placement is not None and placement.world > 1 else None)
    try:
        yield
    finally:
        _PLACEMENT.reset(token)


def initial_rows(seed: int, buckets: int, start: int, end: int, dim: int) -> torch.Tensor:
    """Rows ``[start, end)`` of a table of ``buckets`` x ``dim`` initial values, ``N(0, INIT_STD)``: block
    ``b`` of :data:`INIT_BLOCK_ROWS` rows is drawn from a generator seeded with ``seed + b``, so a row's value
    does not depend on which rows a process holds. On 2 MB pages (:mod:`~primus_dagster.training.huge_pages`)."""
    out = huge_page_zeros((end - start, dim))
    for block in range(start // INIT_BLOCK_ROWS, -(-end // INIT_BLOCK_ROWS)):
        lo = block * INIT_BLOCK_ROWS
        hi = min(lo + INIT_BLOCK_ROWS, buckets)
        values = torch.empty(hi - lo, dim).normal_(0.0, INIT_STD, generator=torch.Generator().manual_seed(seed + block))
        a, b = max(lo, start), min(hi, end)
        out[a - start : b - start] = values[a - lo : b - lo]
    return out


@dataclass
class RowWindow:
    """The rows of a sharded table one step looks up: ``ids`` (ascending, distinct) and their ``rows``
    (``[len(ids), dim]``; a leaf that requires grad when the step trains the table)."""

    ids: torch.Tensor
    rows: torch.Tensor

    def positions(self, buckets: torch.Tensor) -> torch.Tensor:
        """Each bucket's place in the window (every bucket must be in it)."""
        return torch.searchsorted(self.ids, buckets.contiguous())


class HashedEmbedding(nn.Module):
    """``n_features`` id columns and ``len(poolings)`` list features hashed into one table of ``buckets``
    rows of size ``dim``.

    The id of feature f is split into three limbs l_j and hashed with per-feature salts:
    ``bucket = ((a0_f*l0 + a1_f*l1 + a2_f*l2 + b_f) mod (2^31-1)) mod buckets`` -- all int64,
    non-negative, no overflow, negative ids included. A list feature's ids hash the same way (salts of
    feature ``n_features + k``) and its rows pool (``sum`` / ``mean``, weighted when the list has
    weights) with ``embedding_bag`` over the jagged values: no padding. ``sparse``: the table's
    gradient holds only the rows a batch touched (for ``torch.optim.SparseAdam``); dense otherwise (DDP).

    Example::

        emb = HashedEmbedding(n_features=5, buckets=100_000, dim=16)
        out = emb(torch.tensor([[7, -3, 2**40, 0, 1]]))     # [1, 5 * 16]
    """

    salts: torch.Tensor  # registered buffer

    def __init__(self, n_features: int, buckets: int, dim: int, sparse: bool = False, poolings: Sequence[str] = ()):
        super().__init__()
        if n_features < 0 or buckets < 1 or dim < 1:
            raise ValueError(f"need n_features >= 0, buckets >= 1, dim >= 1; got {n_features}, {buckets}, {dim}")
        self.n_features, self.buckets, self.dim = n_features, buckets, dim
        self.poolings = tuple(poolings)
        self.placement = _PLACEMENT.get()  # None: every row here
        self.row_start, self.row_end = self.placement.rows(buckets) if self.placement is not None else (0, buckets)
        if self.placement is not None and not sparse:
            raise ValueError("a sharded table needs sparse gradients (training.model.sparse_embeddings: true)")
        seed = int(torch.randint(0, 2**62, (1,)))  # from the model's seed (build_model): the same everywhere
        weight = initial_rows(seed, buckets, self.row_start, self.row_end, dim)
        # sparse: gradients of the touched rows only
        self.table = nn.Embedding(self.row_end - self.row_start, dim, sparse=sparse, _weight=weight)
        self.window: RowWindow | None = None  # a sharded table's rows of the step (not part of its state)
        self.register_buffer("salts", table_salts(n_features + len(self.poolings)), persistent=False)

    @property
    def sharded(self) -> bool:
        """It holds a share of the rows; its lookups read the step's :class:`RowWindow`."""
        return self.placement is not None

    def needed_buckets(self, sparse: torch.Tensor, lists: Sequence[Jagged] = ()) -> torch.Tensor:
        """The distinct buckets (ascending) a forward of these inputs looks up."""
        parts = [self.bucket_ids(sparse).reshape(-1)] if self.n_features else []
        for k, jagged in enumerate(lists):
            f = self.n_features + k
            parts.append(self._buckets(jagged.values.unsqueeze(1), self.salts[:, f : f + 1]).squeeze(1))
        return torch.unique(torch.cat(parts)) if parts else torch.zeros(0, dtype=torch.int64)

    @property
    def width(self) -> int:
        return (self.n_features + len(self.poolings)) * self.dim

    def bucket_ids(self, sparse: torch.Tensor) -> torch.Tensor:
        """Bucket index in [0, buckets) of every id: LongTensor [B, F] -> LongTensor [B, F]."""
        if sparse.dim() != 2 or sparse.shape[1] != self.n_features:
            raise ValueError(f"sparse ids must be [B, {self.n_features}], got {list(sparse.shape)}")
        return self._buckets(sparse, self.salts[:, : self.n_features])

    def _buckets(self, ids: torch.Tensor, salts: torch.Tensor) -> torch.Tensor:
        return hash_ids(ids, salts, self.buckets)

    def pooled(self, k: int, jagged: Jagged) -> torch.Tensor:
        """List feature ``k``'s rows pooled: [B, dim]."""
        f = self.n_features + k
        buckets = self._buckets(jagged.values.unsqueeze(1), self.salts[:, f : f + 1]).squeeze(1)
        starts = jagged.offsets[:-1]
        mode, weights = self.poolings[k], jagged.weights
        if weights is None:
            return self._bag(buckets, starts, mode, None)
        # per-sample weights need mode sum; a weighted mean divides by each row's weight sum
        total = self._bag(buckets, starts, "sum", weights)
        if mode == "mean":
            rows = torch.repeat_interleave(torch.arange(len(starts), device=starts.device), jagged.lengths())
            norm = torch.zeros(len(starts), dtype=weights.dtype, device=weights.device).index_add_(0, rows, weights)
            total = total / torch.where(norm == 0, torch.ones_like(norm), norm).unsqueeze(1)
        return total

    def _bag(
        self, buckets: torch.Tensor, starts: torch.Tensor | None, mode: str, weights: torch.Tensor | None
    ) -> torch.Tensor:
        """The rows of ``buckets`` pooled into the bags at ``starts`` (None: each alone). A sparse table's
        gradient comes coalesced (:mod:`.row_sparse`); a dense one's is torch's own; a sharded one reads the
        step's window (its gradient is the window's)."""
        if self.placement is not None:
            window = self.window
            if window is None:
                raise RuntimeError("a sharded table was looked up outside a step: its rows were not fetched")
            return row_sparse_bag(window.rows, window.positions(buckets), starts, mode, weights)
        if self.table.sparse:
            return row_sparse_bag(self.table.weight, buckets, starts, mode, weights)
        if starts is None:
            return self.table(buckets)
        return F.embedding_bag(buckets, self.table.weight, starts, mode=mode, per_sample_weights=weights)

    def forward(self, sparse: torch.Tensor, lists: Sequence[Jagged] = ()) -> torch.Tensor:
        """LongTensor [B, F] raw ids (and this table's list features) -> float [B, width]."""
        pooled = [self.pooled(k, j) for k, j in enumerate(lists)]
        if not self.n_features and pooled:  # a table of lists only: no empty lookup
            return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)
        out = self._bag(self.bucket_ids(sparse), None, "sum", None).reshape(sparse.shape[0], self.n_features * self.dim)
        return torch.cat([out, *pooled], dim=1) if pooled else out


class FeatureEmbeddings(nn.Module):
    """Every id and list feature of a :class:`~primus_dagster.training.features.FeatureLayout`, each in
    its table (one :class:`HashedEmbedding` per table): ``(sparse [B, F], lists) -> [B, width]``,
    table by table in the layout's order, a table's id columns before its lists.

    Example::

        emb = FeatureEmbeddings(FeatureLayout.plain(ModelSpec(), n_dense=0, n_sparse=3), sparse=True)
        emb(torch.zeros(4, 3, dtype=torch.int64), {}).shape       # [4, 3 * 16]
    """

    def __init__(self, layout: FeatureLayout, sparse: bool):
        super().__init__()
        self.tables = nn.ModuleDict()
        self.columns: dict[str, list[int]] = {}  # table -> its id columns (indices into sparse)
        self.list_names: dict[str, list[str]] = {}
        for name in layout.table_names():
            ids, lists = layout.table_features(name)
            buckets, dim = layout.tables[name]
            self.tables[name] = HashedEmbedding(len(ids), buckets, dim, sparse, [str(c.pooling) for c in lists])
            self.columns[name] = ids
            self.list_names[name] = [c.name for c in lists]
        self.n_sparse = layout.n_sparse
        self.width = layout.embedding_width()

    def parts(self, sparse: torch.Tensor, lists: Mapping[str, Jagged] = NO_LISTS) -> list[torch.Tensor]:
        """Each table's output ``[B, its width]``, in order (:meth:`forward` concatenates them; a tower that
        concatenates more beside them takes these, to copy the rows once)."""
        out = []
        for name, table in self.tables.items():
            ids = self.columns[name]
            chosen = sparse if len(ids) == self.n_sparse else sparse[:, ids]  # all of them (the default): no copy
            out.append(table(chosen, [lists[n] for n in self.list_names[name]]))
        return out

    def needed_buckets(self, sparse: torch.Tensor, lists: Mapping[str, Jagged] = NO_LISTS) -> dict[str, torch.Tensor]:
        """Per table, the distinct buckets a forward of these inputs looks up."""
        out = {}
        for name, table in self.tables.items():
            assert isinstance(table, HashedEmbedding)
            ids = self.columns[name]
            chosen = sparse if len(ids) == self.n_sparse else sparse[:, ids]
            out[name] = table.needed_buckets(chosen, [lists[n] for n in self.list_names[name]])
        return out

    def forward(self, sparse: torch.Tensor, lists: Mapping[str, Jagged] = NO_LISTS) -> torch.Tensor:
        parts = self.parts(sparse, lists)
        if not parts:
            return sparse.new_zeros((sparse.shape[0], 0), dtype=torch.float32)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def sparse_tables(model: nn.Module) -> list[nn.Parameter]:
    """The embedding tables with sparse gradients (``nn.Embedding`` / ``nn.EmbeddingBag`` built with
    ``sparse=True``), in parameter order: the lazy sparse Adam and the row-sparse exchange take these."""
    ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.sparse}
    return [p for p in model.parameters() if id(p) in ids]
