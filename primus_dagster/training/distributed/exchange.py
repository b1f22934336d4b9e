"""The gradient exchange: how a ready rank's gradients become the group's in a round.

:class:`~primus_dagster.training.distributed.lockstep.LockStep` coordinates the rounds; a
:class:`GradientExchange` builds the model's trainer and turns the round's messages into the
group's gradients (package docstring: *Averaging*). :class:`RowSparseExchange` is the one
the training job runs. What a micro-batch of a kind trains is the model's own declaration
(:meth:`~primus_dagster.training.models.RecModel.parameter_groups`): the exchange knows no model. The
round's status row (``STATUS_FIELDS`` float64 fields, then the rows touched per table, ``MAX_TABLES`` of
them) heads every rank's message: both the coordinator and the exchange read it.

Example (a strategy of one's own: the loop calls these, in this order)::

    class MyExchange:                       # satisfies GradientExchange
        round_messages = True               # a ready rank's message rides with its status
        backward_first = True               # backward before the round's all-gather
        sent, seconds = 0, 0.0
        def build(self, spec, init, *, deterministic): ...  # -> Trainer (same seed on every rank)
        def pack(self, status, kind, micro): ...             # -> this rank's message, or None
        def gradients(self, trainer, micro, loss, messages, divisor): ...   # -> loss
        def null_gradients(self, trainer, kind, messages, divisor): ...
        def reset_counters(self): ...
        def close(self): ...

    loop = PhaseLoop(context, LockStep(MyExchange()), reader, sink)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeAlias

import torch
import torch.distributed as dist
from torch import nn

from primus_dagster.data import Batch
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.features import ModelInit
from primus_dagster.training.loop import TableShards
from primus_dagster.training.models import (
    KINDS,
    MAX_SPARSE_TABLES,
    ParameterGroups,
    RecModel,
    build_initial_model,
    sparse_tables,
)
from primus_dagster.training.trainer import Trainer, coalesced_rows

# KINDS (models): a micro-batch's kind, by its index in the status row
RoundMessages: TypeAlias = (
    Sequence[torch.Tensor] | None
)  # every rank's round message, in rank order; None: statuses only
Divisor: TypeAlias = Mapping[str, int]  # parameter group -> ranks that trained it this round (0: nobody)
# a round's status row: ready, ended, kind, n_dense, n_sparse, label sum, rows; then rows touched per table
STATUS_FIELDS, MAX_TABLES = 7, MAX_SPARSE_TABLES
HEADER_BYTES = 8 * (STATUS_FIELDS + MAX_TABLES)  # the status row at the head of a round's message (float64)


class GradientExchange(Protocol):
    """One rank's side of the gradient exchange in a :class:`~.lockstep.LockStep` group's rounds.

    ``round_messages``: True -- :meth:`pack` makes a ready rank's round message (which heads with the
    status row; the coordinator sends it through its :class:`~.mesh.ByteAllGather`): with
    ``backward_first``, after its backward, with its gradients (row-sparse); without, before any
    forward (the sharded exchange: the rows it will look up). False -- the round's all-gather carries the
    status rows only. Without ``backward_first`` the gradients are exchanged during :meth:`gradients`,
    after the round's all-gather (e.g. inside a ``DistributedDataParallel`` backward).
    ``divisor``: for each parameter group of the model (:class:`~primus_dagster.training.models.ParameterGroups`)
    the number of ranks that trained it this round (0: nobody; the group keeps ``grad=None``). ``sent``: bytes this rank put into the
    exchange; ``seconds``: seconds spent in it outside the loop's all-gather (which the loop counts).
    """

    round_messages: bool
    backward_first: bool
    sent: int
    table_shards: TableShards | None  # sharded tables' checkpoints (None: every rank holds every row)

    @property
    def seconds(self) -> float: ...

    def build(self, spec: TrainingSpec, init: ModelInit, *, deterministic: bool) -> Trainer:
        """The model on ``init`` (``spec.seed``: the same on every rank) and its trainer
        (``observe_labels=False``: the loop adds the group's label counts; ``deterministic``: the run is
        ``data.deterministic``)."""
        ...

    def pack(self, status: torch.Tensor, kind: int, micro: Batch) -> torch.Tensor | None:
        """A ready rank's round message (``round_messages`` only), uint8, headed by ``status`` (float64,
        ``HEADER_BYTES``); ``micro``: its micro-batch; None: the status alone."""
        ...

    def gradients(
        self, trainer: Trainer, micro: Batch, loss: torch.Tensor | None, messages: RoundMessages, divisor: Divisor
    ) -> torch.Tensor:
        """A ready rank, after the round's all-gather: set the parameters' gradients to the group's;
        the loss. ``loss``: of the backward before the gather (``round_messages``), else None (run the
        backward of ``micro`` here); ``messages``: every rank's, in rank order (None: status only)."""
        ...

    def null_gradients(self, trainer: Trainer, kind: str, messages: RoundMessages, divisor: Divisor) -> None:
        """A rank without data this round (its gradients were zeroed): take part in the exchange and
        leave the group's gradients; ``kind``: one that some ready rank trains."""
        ...

    def reset_counters(self) -> None:
        """Zero ``sent`` and ``seconds`` (after a warm-up)."""
        ...

    def close(self) -> None:
        """Release what it holds of its own (connections); the coordinator calls it at the end."""
        ...


def parameter_groups(model: RecModel) -> dict[int, str]:
    """``id(parameter) -> group`` whose gradients are averaged together (the model's own
    :meth:`~primus_dagster.training.models.RecModel.parameter_groups`)."""
    groups = model.parameter_groups()
    return {id(p): groups.group_of(name) for name, p in model.named_parameters()}


class RowSparseExchange:
    """The ``row_sparse`` gradient exchange (package docstring), a :class:`GradientExchange`: after
    backward, :meth:`pack` makes this rank's message of the round -- the status row, then its
    gradients -- and after the round's :meth:`~.mesh.PeerMesh.all_gather`, :meth:`apply` sums every
    rank's gradients into the group's.

    A message (bytes): the status row (float64 ``[STATUS_FIELDS + MAX_TABLES]``: ready, ended, kind,
    n_dense, n_sparse, label sum, rows, then the rows touched per table), then, from a ready rank, for
    every sparse table (``nn.Embedding(sparse=True)``) of the groups its kind trains its touched rows
    (int64, coalesced here, ascending: the lazy SparseAdam's own sort and segment sum), then the flat
    dense gradients of those groups (float32, zeros where this rank has none), then the tables' gradient
    rows (float32). :meth:`apply`: every group ``g`` that ``divisor[g]`` ranks trained gets the sum of
    their gradients in rank order divided by ``divisor[g]`` -- dense parameters as dense tensors, tables
    as one *coalesced* sparse gradient (the ranks' rows merged by the same sort and segment sum), which
    the optimizer takes as it is; the other groups ``grad=None``. The same bytes on every rank give the
    same gradients. ``sent``: bytes of this rank's messages; ``pack_s`` / ``apply_s``: seconds spent
    making them, applying them (the loop's ``mesh_s``: exchanging them, waiting for the peers included).

    Built without a model, :meth:`build` makes it (and indexes it in a group of more than one: a group
    of one exchanges nothing, it is a single trainer); ``RowSparseExchange(model)`` indexes ``model``.

    Example::

        exchange = RowSparseExchange(model)
        loss = trainer.backward(micro_batch)
        messages = mesh.all_gather(exchange.pack(status, 0, micro_batch))  # status: float64 [STATUS_FIELDS + MAX_TABLES]
        exchange.apply(messages, {"memory": 2, "adapt": 0, "all": 2})
        trainer.apply(micro_batch, loss, started)
    """

    round_messages = True
    backward_first = True  # its message carries the gradients of the backward before the round
    table_shards: TableShards | None = None

    def __init__(self, model: RecModel | None = None):
        self.group: dict[int, str] = {}
        self.tables: list[nn.Parameter] = []
        self.dense: dict[str, list[nn.Parameter]] = {}
        self.active = False  # indexed a model: packs and applies messages
        self.groups = ParameterGroups.one()  # what a micro-batch of each kind trains (the model's declaration)
        self.sent, self.pack_s, self.apply_s = 0, 0.0, 0.0
        if model is not None:
            self.index(model)

    def index(self, model: RecModel) -> None:
        """Sort ``model``'s parameters into tables and dense groups: the messages' layout."""
        self.groups = model.parameter_groups()
        self.group = parameter_groups(model)
        self.tables = sparse_tables(model)
        sparse = {id(p) for p in self.tables}
        self.dense = {}
        for p in model.parameters():
            if id(p) not in sparse:
                self.dense.setdefault(self.group[id(p)], []).append(p)
        if len(self.tables) > MAX_TABLES:
            raise ValueError(f"{len(self.tables)} sparse embedding tables; at most {MAX_TABLES}")
        self.active = True

    def build(self, spec: TrainingSpec, init: ModelInit, *, deterministic: bool = False) -> Trainer:
        """The model with sparse embedding gradients (the default) and its trainer."""
        model = build_initial_model(spec.model, init, seed=spec.seed)
        if dist.get_world_size() > 1:
            self.index(model)
        return Trainer(model, spec, observe_labels=False, replicas=dist.get_world_size(), deterministic=deterministic)

    @property
    def seconds(self) -> float:
        return self.pack_s + self.apply_s

    def reset_counters(self) -> None:
        self.sent, self.pack_s, self.apply_s = 0, 0.0, 0.0

    def close(self) -> None:
        pass  # its messages go through the coordinator's mesh

    def gradients(
        self, trainer: Trainer, micro: Batch, loss: torch.Tensor | None, messages: RoundMessages, divisor: Divisor
    ) -> torch.Tensor:
        """The group's gradients from the round's messages (backward ran before the gather)."""
        if loss is None:
            raise ValueError("the row-sparse exchange packs the gradients of a backward before the round")
        if self.active and messages is not None:
            self.apply(messages, divisor)
        return loss

    def null_gradients(self, trainer: Trainer, kind: str, messages: RoundMessages, divisor: Divisor) -> None:
        """No forward: the status went out alone; the group's gradients from the others' messages."""
        if self.active and messages is not None:
            self.apply(messages, divisor)

    def _tables_of(self, kind: int) -> list[int]:
        groups = self.groups.trained_by(KINDS[kind])
        return [i for i, p in enumerate(self.tables) if self.group[id(p)] in groups]

    def pack(self, status: torch.Tensor, kind: int, micro: Batch | None = None) -> torch.Tensor | None:
        """This ready rank's message (uint8), after its backward: ``status`` (float64; the rows touched
        per table are written into it) and the gradients of what ``kind`` trains. None in a group of
        one: nothing to exchange (the round sends the status alone)."""
        if not self.active:
            return None
        started = time.perf_counter()
        rows, values = [], []
        for i in self._tables_of(kind):
            p = self.tables[i]
            if p.grad is None:
                r, v = torch.empty(0, dtype=torch.int64), p.new_empty(0, p.shape[1])
            else:
                r, v = coalesced_rows(p.grad)
            status[STATUS_FIELDS + i] = r.numel()
            rows.append(r)
            values.append(v.contiguous())
        dense = [
            p.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1)
            for g in self.groups.trained_by(KINDS[kind])
            for p in self.dense.get(g, [])
        ]
        parts = [status, *rows, *dense, *values]
        message = torch.cat([t.reshape(-1).view(torch.uint8) for t in parts])
        self.sent += message.numel()
        self.pack_s += time.perf_counter() - started
        return message

    def apply(self, messages: Sequence[torch.Tensor], divisor: Mapping[str, int]) -> None:
        """Set every parameter's gradient to the group's from the round's ``messages`` (rank order)."""
        started = time.perf_counter()
        dense: dict[str, list[torch.Tensor]] = {}
        rows: dict[int, list[torch.Tensor]] = {}
        values: dict[int, list[torch.Tensor]] = {}
        for message in messages:
            status = message[:HEADER_BYTES].view(torch.float64)
            if status[0] != 1:
                continue
            kind, offset = int(status[2]), HEADER_BYTES
            tables = [(i, int(status[STATUS_FIELDS + i])) for i in self._tables_of(kind)]
            for i, n in tables:
                rows.setdefault(i, []).append(message[offset : offset + 8 * n].view(torch.int64))
                offset += 8 * n
            for g in self.groups.trained_by(KINDS[kind]):
                n = 4 * sum(p.numel() for p in self.dense.get(g, []))
                dense.setdefault(g, []).append(message[offset : offset + n].view(torch.float32))
                offset += n
            for i, n in tables:
                width = self.tables[i].shape[1]
                values.setdefault(i, []).append(message[offset : offset + 4 * n * width].view(torch.float32))
                values[i][-1] = values[i][-1].view(n, width)
                offset += 4 * n * width
            if offset != message.numel():
                raise ValueError(f"a round's message of {message.numel()} bytes; its status describes {offset}")
        for g, params in self.dense.items():
            if not divisor.get(g, 0):
                for p in params:
                    p.grad = None
                continue
            total = functools.reduce(torch.add, dense[g]) / divisor[g]  # rank order: the same everywhere
            offset = 0
            for p in params:
                p.grad = total[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        for i, p in enumerate(self.tables):
            d = divisor.get(self.group[id(p)], 0)
            if not d or not sum(r.numel() for r in rows.get(i, [])):
                p.grad = None
                continue
            if len(rows[i]) == 1:
                r, v = rows[i][0], values[i][0]
            else:  # rows of several ranks: merged, each row's values summed in rank order
                merged = torch.sparse_coo_tensor(
                    torch.cat(rows[i]).reshape(1, -1), torch.cat(values[i]), p.shape, check_invariants=False
                )
                r, v = coalesced_rows(merged)
            p.grad = torch.sparse_coo_tensor(
                r.reshape(1, -1), v / d, p.shape, is_coalesced=True, check_invariants=False
            )
        self.apply_s += time.perf_counter() - started
