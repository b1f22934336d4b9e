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

Example::

    model = build_model(ModelSpec(type="mtrm"), n_dense=13, n_sparse=5, seed=0)
    dense, sparse, label = model_inputs(batch)
    loss = F.binary_cross_entropy_with_logits(model(dense, sparse, batch.kind, batch.lists), label)
    ctr = torch.sigmoid(model.predict(dense, sparse, batch.lists))
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from primus_dagster.data import Batch, Jagged
from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.features import DenseStats, DenseTransform, FeatureLayout, ModelInit
from primus_dagster.training.model_api import ModelContext, ModelFactoryError, ModelInputs, SparseFeatures, load_factory
from primus_dagster.training.row_sparse import row_sparse_bag

KINDS = ("batch", "stream")
MAX_SPARSE_TABLES = 64  # tables with sparse gradients in one model: a row of the exchange's status header each


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


HASH_PRIME = (1 << 31) - 1  # Mersenne prime modulus of the hash; products of 22-bit limbs and 31-bit salts fit int64
HASH_LIMBS = ((0, 22), (22, 22), (44, 20))  # (shift, bits): a bijection of int64 onto three non-negative limbs
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _one_limb(ids: torch.Tensor) -> bool:
    """Every id in [0, 2^22): its limbs 1 and 2 are 0 (ids of up to 4 M values -- most vocabularies; one
    ``aminmax`` decides; the hash is the same either way, ~half the time of the 3-limb path)."""
    low, high = torch.aminmax(ids)
    return int(low) >= 0 and int(high) < (1 << HASH_LIMBS[0][1])


_HUGE_PAGE = 2 << 20


def huge_page_zeros(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Zeros of ``shape`` in memory that Linux is asked to back with transparent huge pages
    (``MADV_HUGEPAGE``: used where THP is in ``madvise`` or ``always`` mode), or plain zeros (below
    2 MB, or where that is not available).

    For embedding tables and their optimiser state, far larger than the caches: a training step reads
    and writes ~50 000 random rows of each, and with 4 KB pages nearly every one of those also misses
    the TLB. 2 MB pages made the row gathers and writes of a step ~25 % cheaper (issue 11). The values
    are the same; only the memory under them differs (an anonymous mapping, 2 MB-aligned).
    """
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes < _HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(shape, dtype=dtype)
    try:
        region = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError, AttributeError):
        return torch.zeros(shape, dtype=dtype)
    offset = -torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr() % _HUGE_PAGE
    # a storage of exactly the table (what torch.save writes); it keeps the mapping alive; anonymous memory is 0.
    # set_ rather than .view(shape): a tensor of its own, not a view (torch.compile'd kernels take it as the
    # plain tensor they were compiled for: training/kernels.py)
    flat = torch.frombuffer(region, dtype=dtype, count=count, offset=offset)
    strides = [math.prod(shape[k + 1 :]) for k in range(len(shape))]  # row-major, as .view(shape) has
    return torch.empty(0, dtype=dtype).set_(flat.untyped_storage(), 0, shape, strides)


def huge_page_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of a CPU ``tensor`` in :func:`huge_page_zeros` memory (the tensor itself when it is
    smaller than 2 MB or not on the CPU)."""
    if tensor.device.type != "cpu" or tensor.numel() * tensor.element_size() < _HUGE_PAGE:
        return tensor
    return huge_page_zeros(tuple(tensor.shape), tensor.dtype).copy_(tensor)


def _salt(feature: int, k: int) -> int:
    """A fixed salt in [1, P-1] for coefficient ``k`` of feature ``feature`` (no RNG involved)."""
    return 1 + _splitmix64(feature * 8 + k) % (HASH_PRIME - 1)


def table_salts(count: int) -> torch.Tensor:
    """The hash's salts of ``count`` features of one table: int64 [4, count], rows a0, a1, a2, b."""
    return torch.tensor([[_salt(f, k) for f in range(count)] for k in range(4)], dtype=torch.int64).reshape(4, count)


def hash_ids(ids: torch.Tensor, salts: torch.Tensor, buckets: int) -> torch.Tensor:
    """Bucket in ``[0, buckets)`` of every raw id (int64, any value) of ``ids`` [..., F] under the
    salts [4, F] of its feature (:func:`table_salts`; :class:`HashedEmbedding` documents the hash)."""
    ids = ids.to(torch.int64)
    if ids.numel() and _one_limb(ids):
        h = ids * salts[0] + salts[3]  # the upper limbs are 0: the same sum, 2 ops instead of 12
    else:
        h = salts[3].expand_as(ids)
        for k, (shift, bits) in enumerate(HASH_LIMBS):
            limb = torch.bitwise_and(ids >> shift, (1 << bits) - 1)  # arithmetic shift, then mask: >= 0
            h = h + limb * salts[k]  # < 2^22 * 2^31 each: the sum stays far below 2^63
    return torch.remainder(torch.remainder(h, HASH_PRIME), buckets)


Lists = Mapping[str, Jagged]  # a batch's list features by name (Batch.lists)
_NO_LISTS: Lists = {}


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
        self.table = nn.Embedding(buckets, dim, sparse=sparse)  # sparse: gradients of the touched rows only
        nn.init.normal_(self.table.weight, mean=0.0, std=0.01)
        self.table.weight.data = huge_page_copy(self.table.weight.data)  # the same values, on 2 MB pages
        self.register_buffer("salts", table_salts(n_features + len(self.poolings)), persistent=False)

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
        gradient comes coalesced (:mod:`.row_sparse`); a dense one's is torch's own."""
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

    def parts(self, sparse: torch.Tensor, lists: Mapping[str, Jagged] = _NO_LISTS) -> list[torch.Tensor]:
        """Each table's output ``[B, its width]``, in order (:meth:`forward` concatenates them; a tower that
        concatenates more beside them takes these, to copy the rows once)."""
        out = []
        for name, table in self.tables.items():
            ids = self.columns[name]
            chosen = sparse if len(ids) == self.n_sparse else sparse[:, ids]  # all of them (the default): no copy
            out.append(table(chosen, [lists[n] for n in self.list_names[name]]))
        return out

    def forward(self, sparse: torch.Tensor, lists: Mapping[str, Jagged] = _NO_LISTS) -> torch.Tensor:
        parts = self.parts(sparse, lists)
        if not parts:
            return sparse.new_zeros((sparse.shape[0], 0), dtype=torch.float32)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _mlp(in_dim: int, hidden: list[int]) -> tuple[nn.Sequential, int]:
    """Linear + ReLU per hidden size; returns the MLP and its output width."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    return nn.Sequential(*layers), in_dim


def _check_inputs(model: RecModel, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists) -> None:
    if dense.dim() != 2 or dense.shape[1] != model.n_dense:
        raise ValueError(f"dense must be [B, {model.n_dense}], got {list(dense.shape)}")
    if sparse.dim() != 2 or sparse.shape[1] != model.n_sparse or sparse.shape[0] != dense.shape[0]:
        raise ValueError(f"sparse must be [{dense.shape[0]}, {model.n_sparse}], got {list(sparse.shape)}")
    if list(lists) != model.list_names:
        raise ValueError(f"list features must be {model.list_names}, got {list(lists)}")


class _DLRMTower(nn.Module):
    """Bottom MLP on dense (-> embedding_dim) ++ embeddings [++ aux] -> top MLP -> logit."""

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
        kind: str = "batch",  # the tower interface (_CustomTower passes it on); a built-in tower takes all alike
    ) -> torch.Tensor:
        parts = self.embedding.parts(sparse, lists)
        if self.bottom is not None:
            parts.insert(0, self.bottom(dense))
        if aux is not None:
            parts.append(aux)
        return self.head(self.top(torch.cat(parts, dim=1))).squeeze(-1)


class _MemoryTower(nn.Module):
    """Embeddings ++ dense -> MLP (memory_hidden) -> h_mem -> logit."""

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


class _CustomTower(nn.Module):
    """A team's module as one of MTRM's towers, with the built-in towers' interface
    ``(dense, sparse, lists, aux, kind) -> logits [B]`` (``dense`` transformed; ``sparse`` / ``lists``
    raw ids, hashed here by the tower's own :class:`FeatureHasher`, as a custom model's are);
    :meth:`state` is the module's ``state(inputs)``, or its logit ``[B, 1]``."""

    state_dim: int = 0  # the width of state(): set when it is built as a memory tower (_tower)

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


def made_up_rows(layout: FeatureLayout, rows: int = 2) -> tuple[torch.Tensor, torch.Tensor, dict[str, Jagged]]:
    """``rows`` rows of zeros in ``layout``'s shape (dense, ids, one id per list): what the protocol
    checks run a model on."""
    offsets = torch.arange(rows + 1, dtype=torch.int64)
    lists = {
        c.name: Jagged(torch.zeros(rows, dtype=torch.int64), offsets, torch.ones(rows) if c.weighted else None)
        for c in layout.lists
    }
    return torch.zeros(rows, layout.n_dense), torch.zeros(rows, layout.n_sparse, dtype=torch.int64), lists


def _tower(
    spec: ModelSpec, layout: FeatureLayout, role: str, aux_dim: int = 0
) -> _MemoryTower | _DLRMTower | _CustomTower:
    """MTRM's ``role`` tower (``memory`` / ``adapt``): the built-in one, or the team's module of
    ``spec.memory`` / ``spec.adapt``."""
    tower = getattr(spec, role)
    if tower is None:
        return _MemoryTower(spec, layout) if role == "memory" else _DLRMTower(spec, layout, aux_dim=aux_dim)
    key = f"training.model.{role}.factory"
    context = ModelContext(layout, dict(tower.params), role=role, aux_dim=aux_dim)
    custom = _CustomTower(
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


class RecModel(nn.Module):
    """What every model built by :func:`build_model` is (the protocol in the module docstring).

    Subclasses implement :meth:`logits` on *transformed* dense values: ``forward`` checks the inputs
    and applies :attr:`dense_transform` (the layout's transforms, statistics saved with the weights)."""

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

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, kind: str, lists: Lists = _NO_LISTS) -> torch.Tensor:
        """Training logits [B] for samples of ``kind`` (``dense``: raw values, NaN where missing)."""
        _check_inputs(self, dense, sparse, lists)
        return self.logits(self.dense_transform(dense), sparse, lists, kind)

    def predict(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists = _NO_LISTS) -> torch.Tensor:
        """Serving logits [B]."""
        return self.forward(dense, sparse, "batch", lists)

    def lr_scale(self, name: str) -> float:
        """The factor on ``training.learning_rate`` for the parameter called ``name`` (1: the same rate)."""
        return 1.0

    def auxiliary_loss(
        self, dense: torch.Tensor, sparse: torch.Tensor, kind: str, label: torch.Tensor, lists: Lists = _NO_LISTS
    ) -> torch.Tensor | None:
        """A loss the trainer adds to ``BCE(model(dense, sparse, kind), label)`` (None: nothing)."""
        return None


class SingleTower(RecModel):
    """DLRM-style baseline: one tower learns every kind; ``predict == forward``.

    Example::

        model = SingleTower(ModelSpec(type="single"), FeatureLayout.plain(ModelSpec(), n_dense=13, n_sparse=5))
        logits = model(dense, sparse, "batch")            # [B]
    """

    model_type = "single"

    def __init__(self, spec: ModelSpec, layout: FeatureLayout):
        super().__init__(spec, layout)
        self.tower = _DLRMTower(spec, layout)

    def logits(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists, kind: str) -> torch.Tensor:
        return self.tower(dense, sparse, lists)


class MTRM(RecModel):
    """Mixture training recommendation model: ``memory`` tower (batch) + ``adapt`` tower (stream, serving).

    ``forward(.., "batch")`` -> memory head logits (gradients reach the memory tower only);
    ``forward(.., "stream")`` -> adapt head logits on the detached memory state ``h_aux`` (gradients
    reach the adapt tower only); ``predict`` -> the adapt tower, shifted by :meth:`delay_offset`.
    With ``spec.adapt_batch_weight`` w > 0, a batch sample also trains the adapt tower
    (:meth:`auxiliary_loss`: w x its BCE on the same detached ``h_aux``; the memory tower still gets no
    gradient from the adapt tower).

    **Label-delay calibration.** The adapt tower learns stream labels, which miss the clicks that
    arrive after the stream's label window, so its probabilities run low (ranking, AUC, is not
    affected). :meth:`observe` counts the positives of each kind the trainer sees; ``predict`` adds
    ``logit(rate_batch) - logit(rate_stream)`` once both kinds have ``_MIN_OBSERVED`` samples: the
    complete-label rate of the batch data over the stream's observed rate.

    Example::

        model = MTRM(ModelSpec(type="mtrm"), FeatureLayout.plain(ModelSpec(), n_dense=13, n_sparse=5))
        loss = F.binary_cross_entropy_with_logits(model(dense, sparse, "stream"), label)
        ctr = torch.sigmoid(model.predict(dense, sparse))
    """

    model_type = "mtrm"
    label_sums: torch.Tensor  # registered buffers
    label_counts: torch.Tensor

    def __init__(self, spec: ModelSpec, layout: FeatureLayout):
        super().__init__(spec, layout)
        # h_aux: the built-in memory tower's hidden state and its embeddings of the sample's ids (see
        # memory_state), or a team tower's state(inputs); either tower may be a team's (spec.memory / adapt)
        memory = _tower(spec, layout, "memory")
        assert isinstance(memory, _MemoryTower | _CustomTower)
        self.memory: _MemoryTower | _CustomTower = memory
        self.adapt = _tower(spec, layout, "adapt", aux_dim=memory.state_dim)
        # [batch, stream] label sums and counts (float64: exact far beyond a day of samples)
        self.register_buffer("label_sums", torch.zeros(2, dtype=torch.float64))
        self.register_buffer("label_counts", torch.zeros(2, dtype=torch.float64))

    def observe(self, kind: str, labels: torch.Tensor) -> None:
        """Count the labels of a trained batch of ``kind`` (for :meth:`delay_offset`)."""
        index = _KIND_INDEX.get(kind)
        if index is not None:
            self.label_sums[index] += float(labels.sum())
            self.label_counts[index] += labels.numel()

    def delay_offset(self) -> float:
        """``logit(batch positive rate) - logit(adapt tower's positive rate)``; 0 until both kinds were
        seen. The adapt tower's rate is the stream's, or with ``adapt_batch_weight`` w the w-weighted
        mixture ``(sum_stream + w sum_batch) / (n_stream + w n_batch)`` of the labels it learnt."""
        if bool((self.label_counts < _MIN_OBSERVED).any()):
            return 0.0
        w = self.spec.adapt_batch_weight
        sums, counts = self.label_sums, self.label_counts
        adapt_rate = (sums[1] + w * sums[0]) / (counts[1] + w * counts[0])
        rates = torch.stack([sums[0] / counts[0], adapt_rate]).clamp(1e-6, 1 - 1e-6)
        logits = torch.log(rates / (1 - rates))
        return float(logits[0] - logits[1])

    def memory_state(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists = _NO_LISTS) -> torch.Tensor:
        """h_aux [B, memory_hidden[-1] + embedding width], without gradient (of transformed ``dense``):
        the memory tower's hidden state and its embeddings of the sample's ids. The embeddings, learnt
        on every batch sample's complete labels, carry the long-term user/item knowledge the adapt
        tower's own table (stream samples only) learns more slowly; with them the adapt tower gained
        AUC over the hidden state alone on the bench's tuning seeds (docs/training.md)."""
        with torch.no_grad():
            return self.memory.state(dense, sparse, lists)

    def lr_scale(self, name: str) -> float:
        """``spec.memory_lr_scale`` for the memory tower's parameters, 1 for the adapt tower's. The
        memory tower learns only the batch samples, once each; at the adapt tower's rate it stayed
        under-trained after one pass (its own AUC below the single tower's), and the adapt tower reads
        its state. 3x raised both towers' AUC in every world of the quality bench (docs/training.md);
        the default stays 1 (a faster memory tower is also a faster-moving ``h_aux``)."""
        return self.spec.memory_lr_scale if name.startswith("memory.") else 1.0

    def auxiliary_loss(
        self, dense: torch.Tensor, sparse: torch.Tensor, kind: str, label: torch.Tensor, lists: Lists = _NO_LISTS
    ) -> torch.Tensor | None:
        """On a batch sample with ``spec.adapt_batch_weight`` w > 0: w x the adapt tower's BCE on the
        detached ``h_aux`` (the stream-only adapt tower had to relearn the long-term affinity from the
        stream's incomplete labels; a single tower learns it from both copies in one table). None else."""
        w = self.spec.adapt_batch_weight
        if kind != "batch" or w == 0:
            return None
        x = self.dense_transform(dense)
        logits = self.adapt(x, sparse, lists, self.memory_state(x, sparse, lists), kind="batch")
        return w * F.binary_cross_entropy_with_logits(logits, label)

    def logits(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists, kind: str) -> torch.Tensor:
        if kind == "batch":
            return self.memory(dense, sparse, lists, kind="batch")
        if kind == "stream":
            return self.adapt(dense, sparse, lists, self.memory_state(dense, sparse, lists), kind="stream")
        raise ValueError(f"MTRM got samples of kind {kind!r}; expected 'batch' or 'stream'")

    def predict(self, dense: torch.Tensor, sparse: torch.Tensor, lists: Lists = _NO_LISTS) -> torch.Tensor:
        return self.forward(dense, sparse, "stream", lists) + self.delay_offset()


class FeatureHasher(nn.Module):
    """A batch's raw ids -> :class:`~.model_api.SparseFeatures`: every id and list feature of
    ``layout``, its ids hashed into ``[0, buckets)`` of the feature's table -- the same buckets the
    built-in models' :class:`HashedEmbedding` picks (salts per table, its id columns before its lists).

    Example::

        hasher = FeatureHasher(layout)
        features = hasher(batch.sparse, batch.lists)      # features["user_id"].values: [B] buckets
    """

    def __init__(self, layout: FeatureLayout):
        super().__init__()
        self.order = [c.name for c in (*layout.sparse, *layout.lists)]
        self.parts: list[tuple[int, list[int], list[str]]] = []  # per table: buckets, id columns, lists
        for index, name in enumerate(layout.table_names()):
            ids, lists = layout.table_features(name)
            self.parts.append((layout.tables[name][0], ids, [c.name for c in lists]))
            self.register_buffer(f"salts_{index}", table_salts(len(ids) + len(lists)), persistent=False)
        self.sparse_names = [c.name for c in layout.sparse]

    def forward(self, sparse: torch.Tensor, lists: Lists = _NO_LISTS) -> SparseFeatures:
        rows = sparse.shape[0]
        ones = torch.arange(rows + 1, dtype=torch.int64, device=sparse.device)  # the offsets of one id per row
        out: dict[str, Jagged] = {}
        for index, (buckets, ids, list_names) in enumerate(self.parts):
            salts: torch.Tensor = getattr(self, f"salts_{index}")
            if ids:
                hashed = hash_ids(sparse[:, ids], salts[:, : len(ids)], buckets)
                for k, column in enumerate(ids):
                    out[self.sparse_names[column]] = Jagged(hashed[:, k].contiguous(), ones)
            for k, name in enumerate(list_names):
                f = len(ids) + k
                jagged = lists[name]
                values = hash_ids(jagged.values.unsqueeze(1), salts[:, f : f + 1], buckets).squeeze(1)
                out[name] = Jagged(values, jagged.offsets, jagged.weights)
        return SparseFeatures({name: out[name] for name in self.order}, rows)


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


def custom_model_line(model: RecModel) -> str:
    """``custom, factory <factory>: <class>, N parameters, T sparse table(s)`` -- or, for an MTRM over a
    team's towers, ``mtrm, memory <factory>: <class>, adapt built in, ...`` (run log, ``validate``)."""
    params = sum(p.numel() for p in model.parameters())
    tail = f"{params:,} parameters, {len(sparse_tables(model))} sparse table(s)"
    if isinstance(model, MTRM):
        parts = []
        for role in ("memory", "adapt"):
            tower = getattr(model.spec, role)
            net = getattr(getattr(model, role), "net", None)
            parts.append(f"{role} built in" if tower is None else f"{role} {tower.factory}: {type(net).__name__}")
        return f"mtrm, {', '.join(parts)}; {tail}"
    net = type(getattr(model, "net", model)).__name__
    return f"custom, factory {model.spec.factory}: {net}, {tail}"


def sparse_tables(model: nn.Module) -> list[nn.Parameter]:
    """The embedding tables with sparse gradients (``nn.Embedding`` / ``nn.EmbeddingBag`` built with
    ``sparse=True``), in parameter order: the lazy sparse Adam and the row-sparse exchange take these."""
    ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.sparse}
    return [p for p in model.parameters() if id(p) in ids]


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


def check_model(spec: ModelSpec, layout: FeatureLayout, loss: str = "bce") -> RecModel:
    """Build the model of ``spec`` on ``layout`` and run one forward and backward on two made-up rows,
    or raise :class:`~.model_api.ModelFactoryError` naming what breaks the protocol (a custom
    model's factory, its output, its loss, its tables). The built model is returned."""
    model = build_model(spec, layout=layout)
    rows = 2
    dense, sparse, lists = made_up_rows(layout, rows)
    factories = spec.factories()
    where = (
        "the module of "
        + ", ".join(f"training.model.{'' if k == 'model' else k + '.'}factory {v!r}" for k, v in factories.items())
        if factories
        else "the model"
    )
    try:
        for kind in KINDS if isinstance(model, MTRM) else ("batch",):  # MTRM: each tower
            logits = model(dense, sparse, kind, lists)
            value = loss_function(loss, model)(logits, torch.zeros(rows))
            extra = model.auxiliary_loss(dense, sparse, kind, torch.zeros(rows), lists)
            (value if extra is None else value + extra).backward()
    except ModelFactoryError:
        raise
    except Exception as exc:
        raise ModelFactoryError(
            f"{where} failed on a batch of {rows} rows ({layout.n_dense} dense, ids {[c.name for c in layout.sparse]}, "
            f"lists {[c.name for c in layout.lists]}): {type(exc).__name__}: {exc}"
        ) from exc
    if value.dim() != 0:
        raise ModelFactoryError(f"{where}: its loss returned shape {list(value.shape)}; expected a scalar")
    model.zero_grad(set_to_none=True)  # the made-up rows leave nothing behind
    tables = len(sparse_tables(model))
    if tables > MAX_SPARSE_TABLES:
        raise ModelFactoryError(
            f"{where} has {tables} sparse embedding tables; the multi-trainer exchange takes at most "
            f"{MAX_SPARSE_TABLES} (share tables between features)"
        )
    return model


_KIND_INDEX = {"batch": 0, "stream": 1}
_MIN_OBSERVED = 1000  # samples of each kind before the calibration applies


def build_model(
    spec: ModelSpec,
    n_dense: int | None = None,
    n_sparse: int | None = None,
    seed: int = 0,
    *,
    layout: FeatureLayout | None = None,
    stats: DenseStats | None = None,
) -> RecModel:
    """The model of ``spec.type`` on ``layout`` (or, without one, on ``n_dense`` standardized columns
    and ``n_sparse`` ids in the shared table), initialised deterministically from ``seed`` (global RNG
    untouched); ``stats``: the dense transforms' statistics (:func:`~.features.fit_dense_stats`).

    Example::

        model = build_model(job.training.model, layout=layout, seed=job.training.seed)
        model = build_model(ModelSpec(type="single"), n_dense=13, n_sparse=5)
    """
    classes: dict[str, type[RecModel]] = {"single": SingleTower, "mtrm": MTRM, "custom": CustomModel}
    if spec.type not in classes:
        raise ValueError(f"unknown model type {spec.type!r}; expected one of {sorted(classes)}")
    if layout is None:
        if n_dense is None or n_sparse is None:
            raise ValueError("build_model needs a layout, or n_dense and n_sparse")
        if n_dense < 0 or n_sparse < 0:
            raise ValueError(f"need some input features, got n_dense={n_dense}, n_sparse={n_sparse}")
        layout = FeatureLayout.plain(spec, n_dense, n_sparse)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = classes[spec.type](spec, layout)
    if stats is not None:
        model.dense_transform.load(stats)
    return model


def build_initial_model(spec: ModelSpec, init: ModelInit, seed: int = 0) -> RecModel:
    """:func:`build_model` on ``init``'s layout and statistics."""
    return build_model(spec, seed=seed, layout=init.layout, stats=init.stats)


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def model_summary(model: nn.Module) -> dict:
    """Parameter counts, e.g. ``{"type": "mtrm", "params": N, "memory_params": M, "adapt_params": A, ...}``."""
    summary = {
        "type": getattr(model, "model_type", type(model).__name__),
        "params": _count(model),
        "n_dense": getattr(model, "n_dense", None),
        "n_sparse": getattr(model, "n_sparse", None),
        "lists": getattr(model, "list_names", []),
        "tables": {name: list(shape) for name, shape in model.layout.tables.items()}
        if isinstance(model, RecModel)
        else {},
    }
    if isinstance(model, MTRM):
        summary.update(memory_params=_count(model.memory), adapt_params=_count(model.adapt))
    return summary
