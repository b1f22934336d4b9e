"""Row-wise sharded embedding tables: the :class:`ShardedExchange` of a lock-step group (``training.sharding:
row_wise``).

Every rank holds its share of every built-in table's rows and of their optimiser state -- a contiguous
range, ``torch.chunk``'s split (:class:`~primus_dagster.training.models.TablePlacement`) -- and every
dense parameter whole. A round goes in three exchanges over the ranks' byte mesh
(:class:`~.mesh.PeerMesh`, gloo across hosts), every rank taking part whether it holds data or not:

1. **Requests**, with the round's status rows (:class:`~primus_dagster.training.distributed.LockStep`'s
   all-gather). A rank with a micro-batch works out, per table its kind reads (trains, or reads without a
   gradient: MTRM's stream samples read the memory tower's tables), the distinct rows it looks up, split
   by their owners.
2. **Rows.** Each owner answers with its rows; the asking rank sets each table's
   :class:`~primus_dagster.training.models.RowWindow` and runs its forward and backward, the lookups
   reading the window.
3. **Gradients.** Each rank sends every owner the gradient rows of the tables its kind trains and every
   other rank its dense gradients. An owner sums each row's gradients in rank order (as the replicated
   exchange sums them), divides by the ranks that trained the table's group this round and hands its lazy
   SparseAdam one coalesced sparse gradient of its own rows; a table some rank touched anywhere takes an
   optimiser step on every shard, so the shards' Adam step counts stay the table's. The dense gradients are
   averaged as the replicated exchange averages them. Every rank ends the round with the same dense
   parameters and its own rows updated exactly as a replica's would be.

Only the built-in hashed tables shard (:class:`~primus_dagster.training.models.HashedEmbedding`); a
team's module with tables of its own is refused, naming them.

Example (in every rank, after ``init_process_group``)::

    coordinator = LockStep(ShardedExchange())
    loop = PhaseLoop(context, coordinator, reader, sink)
    loop.run()
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from primus_dagster.data import Batch
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.checkpoint import Checkpoint
from primus_dagster.training.distributed.exchange import HEADER_BYTES, Divisor, RoundMessages
from primus_dagster.training.distributed.mesh import ByteAllGather, PeerMesh
from primus_dagster.training.features import ModelInit
from primus_dagster.training.loop import TableShards
from primus_dagster.training.models import (
    FeatureEmbeddings,
    HashedEmbedding,
    ParameterGroups,
    RecModel,
    RowWindow,
    TablePlacement,
    build_initial_model,
    huge_page_zeros,
    model_inputs,
    shard_rows,
    sparse_tables,
)
from primus_dagster.training.row_sparse import sorted_row_sums
from primus_dagster.training.shard_state import SHARDS_DIR, ShardedInfo, model_key, moment_key
from primus_dagster.training.trainer import Trainer, coalesced_rows

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class ShardedTable:
    """One sharded table of the model: its embeddings module and name there, the table, its parameter's
    name and its parameter group."""

    embeddings: FeatureEmbeddings
    name: str
    table: HashedEmbedding
    parameter: str
    group: str


def sharded_tables(model: RecModel) -> list[ShardedTable]:
    """The model's built-in tables, in parameter order; ValueError naming a table of a team's module (it
    cannot shard)."""
    groups = model.parameter_groups()
    found: list[ShardedTable] = []
    for path, module in model.named_modules():
        if isinstance(module, FeatureEmbeddings):
            for name, table in module.tables.items():
                assert isinstance(table, HashedEmbedding)
                parameter = f"{path}.tables.{name}.table.weight"
                found.append(ShardedTable(module, name, table, parameter, groups.group_of(parameter)))
    built_in = {id(t.table.table.weight) for t in found}
    names = {id(p): n for n, p in model.named_parameters()}
    foreign = [names[id(p)] for p in sparse_tables(model) if id(p) not in built_in]
    if foreign:
        raise ValueError(
            f"training.sharding row_wise shards the built-in hashed tables; the model has tables of its own "
            f"({', '.join(foreign)}): set training.sharding: replicated for it"
        )
    return found


def _bytes(*parts: torch.Tensor) -> torch.Tensor:
    return torch.cat([p.contiguous().reshape(-1).view(torch.uint8) for p in parts]) if parts else _EMPTY


_EMPTY = torch.zeros(0, dtype=torch.uint8)


class ShardedExchange:
    """The row-wise sharded exchange of a :class:`~.lockstep.LockStep` group (module docstring), a
    :class:`~.exchange.GradientExchange`: its round message (:meth:`pack`) carries a ready rank's asks with
    its status; after the round's all-gather :meth:`gradients` / :meth:`null_gradients` answer, train and
    exchange the gradients.
    ``sent``: bytes this rank sent; ``seconds``: seconds in the exchanges (waiting for the peers included).

    Example::

        coordinator = LockStep(ShardedExchange(), timeout_s=300)
    """

    round_messages = True  # its asks ride with the status
    backward_first = False  # the rows come before the forward

    def __init__(self, *, timeout_s: float = 300.0, gloo: bool = False):
        self.timeout_s, self.gloo = timeout_s, gloo
        self.mesh: ByteAllGather | None = None
        self.tables: list[ShardedTable] = []
        self.groups = ParameterGroups.one()
        self.dense: dict[str, list[nn.Parameter]] = {}
        self.rank, self.world = 0, 1
        self.sent, self.comm_s = 0, 0.0
        self._mesh_1d: DeviceMesh | None = None  # the group as a device mesh (checkpoints' DTensors)
        self.table_shards: TableShards | None = self  # it checkpoints its own tables (save, localize)
        self._asked: tuple[list[torch.Tensor], list[list[int]], set[str]] = ([], [], set())  # pack's, this round
        self._message = _EMPTY

    @property
    def seconds(self) -> float:
        return self.comm_s

    def reset_counters(self) -> None:
        self.sent, self.comm_s = 0, 0.0

    def build(self, spec: TrainingSpec, init: ModelInit, *, deterministic: bool = False) -> Trainer:
        """The model with this rank's rows of every table, and its trainer."""
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        placement = TablePlacement(self.rank, self.world)
        model = build_initial_model(spec.model, init, seed=spec.seed, placement=placement)
        self.index(model)
        return Trainer(model, spec, observe_labels=False, replicas=self.world, deterministic=deterministic)

    def index(self, model: RecModel) -> None:
        """The model's sharded tables and its dense parameters by group: the messages' layout."""
        self.tables = sharded_tables(model)
        self.groups = model.parameter_groups()
        tables = {id(t.table.table.weight) for t in self.tables}
        self.dense = {}
        for name, param in model.named_parameters():
            if id(param) not in tables:
                self.dense.setdefault(self.groups.group_of(name), []).append(param)

    def _exchange(self, messages: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.mesh is None:
            self.mesh = PeerMesh.connect(self.timeout_s, gloo=self.gloo)
        started = time.perf_counter()
        self.sent += sum(m.numel() for r, m in enumerate(messages) if r != self.rank)
        received = self.mesh.all_to_all(messages)
        self.comm_s += time.perf_counter() - started
        return received

    def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
            self.mesh = None

    # ------------------------------------------------------------------------------- checkpoints
    def _distributed(self, tensor: torch.Tensor, table: HashedEmbedding) -> DTensor:
        """This rank's rows of a table (or of its moments) as a ``DTensor`` sharded on rows."""
        # DTensor and torch.distributed.checkpoint are imported where a checkpoint needs them, not with this
        # module: importing them is most of a rank's start-up after torch itself (docs/training.md)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard

        if self._mesh_1d is None:
            self._mesh_1d = init_device_mesh("cpu", (self.world,))
        shape = torch.Size((table.buckets, table.dim)[: tensor.dim()])  # a table, or one value a row
        stride = (table.dim, 1) if tensor.dim() == 2 else (1,)
        return DTensor.from_local(
            tensor.detach(), self._mesh_1d, [Shard(0)], run_check=False, shape=shape, stride=stride
        )

    def _sparse_index(self, trainer: Trainer) -> dict[int, int]:
        """``id(parameter)`` -> its index in the sparse optimizer's ``state_dict``."""
        sparse = trainer.optimizer.parts["sparse"]
        return {id(p): i for i, p in enumerate(p for group in sparse.param_groups for p in group["params"])}

    def save(self, trainer: Trainer, staging: Path) -> ShardedInfo:
        """Every rank's rows of every table and of its Adam moments into ``staging`` (collective; module
        docstring of :mod:`~primus_dagster.training.shard_state`)."""
        index, optimizer = self._sparse_index(trainer), trainer.optimizer.parts["sparse"]
        moments: tuple[str, ...] = type(optimizer).ROW_STATE  # type: ignore[attr-defined]
        tensors: dict[str, DTensor] = {}
        for t in self.tables:
            weight = t.table.table.weight
            tensors[model_key(t.parameter)] = self._distributed(weight, t.table)
            state = optimizer.state.get(weight, {})
            # a table steps on every shard at once: its moments are on every rank, or (no step yet) on none
            for moment in moments if moments[0] in state else ():
                tensors[moment_key(t.parameter, moment)] = self._distributed(state[moment], t.table)
        import torch.distributed.checkpoint as dcp

        if self.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)  # what a killed attempt left
        dist.barrier()
        dcp.save(tensors, checkpoint_id=str(staging))
        tables = {t.parameter: (t.table.buckets, t.table.dim) for t in self.tables}
        return ShardedInfo(tables, {t.parameter: index[id(t.table.table.weight)] for t in self.tables}, moments)

    def localize(self, trainer: Trainer, checkpoint: Checkpoint, directory: Path) -> Checkpoint:
        """``checkpoint`` as this rank holds it: its rows of every table and of their moments, loaded from
        the checkpoint's shards (collective; any group size: they reshard) or cut out of a checkpoint's
        whole tables (one trainer's, a replicated group's)."""
        info = ShardedInfo.of(checkpoint.extra)
        model_state = dict(checkpoint.model_state)
        optimizer_state = dict(checkpoint.optimizer_state)
        sparse = optimizer_state.get("sparse")
        sparse_state = dict(sparse["state"]) if sparse is not None else {}
        index = self._sparse_index(trainer)
        if info is not None:
            missing = sorted(set(t.parameter for t in self.tables) - set(info.tables))
            if missing:
                raise ValueError(f"the checkpoint's sharded tables {sorted(info.tables)} lack {missing}")
            local: dict[str, torch.Tensor] = {}
            wanted: dict[str, DTensor] = {}
            for t in self.tables:
                n_rows = t.table.row_end - t.table.row_start
                keys = [(model_key(t.parameter), (n_rows, t.table.dim))]
                if sparse_state.get(info.optimizer_index[t.parameter]) is not None:  # it took a step: its moments
                    width = () if info.moments == ("sum",) else (t.table.dim,)
                    keys += [(moment_key(t.parameter, m), (n_rows, *width)) for m in info.moments]
                # loaded in place: the rows into the table itself, the moments into the 2 MB pages the
                # optimizer keeps them on (a copy of a rank's shards would take it past its memory plan)
                local[keys[0][0]] = t.table.table.weight.detach()
                for key, shape in keys[1:]:
                    local[key] = huge_page_zeros(shape)
                for key, _ in keys:
                    wanted[key] = self._distributed(local[key], t.table)
            import torch.distributed.checkpoint as dcp

            dcp.load(wanted, checkpoint_id=str(directory / SHARDS_DIR))
        for t in self.tables:
            rows = slice(t.table.row_start, t.table.row_end)
            if info is not None:
                model_state[t.parameter] = local[model_key(t.parameter)]
            elif t.parameter in model_state:
                model_state[t.parameter] = model_state[t.parameter][rows].clone()
            else:
                raise ValueError(f"the checkpoint has no table {t.parameter!r}")
            i = info.optimizer_index[t.parameter] if info is not None else index[id(t.table.table.weight)]
            entry = sparse_state.get(i)
            if entry is not None:
                names = info.moments if info is not None else [k for k, v in entry.items() if torch.is_tensor(v)]
                moments = {
                    m: local[moment_key(t.parameter, m)] if info is not None else entry[m][rows].clone() for m in names
                }
                sparse_state[i] = {**entry, **moments}
        if sparse is not None:
            optimizer_state["sparse"] = {**sparse, "state": sparse_state}
        return dataclasses.replace(checkpoint, model_state=model_state, optimizer_state=optimizer_state)

    # ------------------------------------------------------------------------------------ a round
    def gradients(
        self, trainer: Trainer, micro: Batch, loss: torch.Tensor | None, messages: RoundMessages, divisor: Divisor
    ) -> torch.Tensor:
        """A ready rank: fetch its rows, train the micro-batch, exchange the gradients; the loss."""
        self._fetch(messages, micro)
        loss = trainer.backward(micro)
        self._gradients(micro.kind, divisor)
        return loss

    def null_gradients(self, trainer: Trainer, kind: str, messages: RoundMessages, divisor: Divisor) -> None:
        """A rank without data: serve the others' rows, take its share of the group's gradients."""
        self._fetch(messages, None)
        self._gradients(None, divisor)

    def _owners(self, table: HashedEmbedding, ids: torch.Tensor) -> list[int]:
        """Where ``ids`` (ascending) split between the owners: the cut points, ``world + 1`` of them."""
        bounds = torch.tensor(
            [shard_rows(table.buckets, self.world, r)[0] for r in range(self.world)] + [table.buckets]
        )
        return torch.searchsorted(ids, bounds).tolist()

    def pack(self, status: torch.Tensor, kind: int, micro: Batch) -> torch.Tensor:
        """A ready rank's round message: its status, then per table the rows it will look up (every
        kind it reads: trains, or reads without a gradient), split by owner -- exchange 1 rides with the
        coordinator's status."""
        reads = {*self.groups.trained_by(micro.kind), *self.groups.reads.get(micro.kind, ())}
        _, sparse, _ = model_inputs(micro)
        per_module: dict[int, dict[str, torch.Tensor]] = {}  # FeatureEmbeddings -> its tables' buckets
        for t in self.tables:
            if t.group in reads and id(t.embeddings) not in per_module:
                per_module[id(t.embeddings)] = t.embeddings.needed_buckets(sparse, micro.lists)
        none = torch.zeros(0, dtype=torch.int64)
        needed = [per_module[id(t.embeddings)][t.name] if t.group in reads else none for t in self.tables]
        cuts = [self._owners(t.table, ids) for t, ids in zip(self.tables, needed, strict=True)]
        counts = torch.tensor([c[o + 1] - c[o] for c in cuts for o in range(self.world)], dtype=torch.int64)
        self._asked = (needed, cuts, reads)
        self._message = torch.cat([status.view(torch.uint8), _bytes(counts, *needed)])
        return self._message

    def _fetch(self, messages: RoundMessages, micro: Batch | None) -> None:
        """Exchange 2: answer every rank's asks of this one's rows (its round message), take the rows of
        this rank's own asks, set the windows."""
        if messages is None:  # a group of one: its own message
            messages = [self._message] if micro is not None else [_EMPTY]
        answers = []
        n_tables = len(self.tables)
        for message in messages:  # every rank's, in rank order
            served: list[torch.Tensor] = []
            if message.numel() > HEADER_BYTES and message[:HEADER_BYTES].view(torch.float64)[0] == 1:
                words = message[HEADER_BYTES:].view(torch.int64)
                counts = words[: n_tables * self.world].view(n_tables, self.world)
                offset = n_tables * self.world
                for i, t in enumerate(self.tables):
                    row = counts[i].tolist()
                    mine = words[offset + sum(row[: self.rank]) : offset + sum(row[: self.rank + 1])]
                    served.append(t.table.table.weight.detach().index_select(0, mine - t.table.row_start))
                    offset += sum(row)
            answers.append(_bytes(*served))
        got = self._exchange(answers)  # the rows of this rank's asks, from every owner in rank order
        for t in self.tables:
            t.table.window = None
        if micro is None:
            return
        needed, cuts, reads = self._asked
        trained = set(self.groups.trained_by(micro.kind))
        offsets = [0] * self.world
        for t, ids, c in zip(self.tables, needed, cuts, strict=True):
            parts = []
            for owner in range(self.world):
                n = (c[owner + 1] - c[owner]) * t.table.dim
                parts.append(
                    got[owner][offsets[owner] : offsets[owner] + 4 * n].view(torch.float32).view(-1, t.table.dim)
                )
                offsets[owner] += 4 * n
            if t.group in reads:
                fetched = torch.cat(parts)  # a copy: the received bytes are not the window's to keep
                t.table.window = RowWindow(ids, fetched.requires_grad_(t.group in trained))

    def _gradients(self, kind: str | None, divisor: Mapping[str, int]) -> None:
        """Exchange 3: the trained tables' gradient rows to their owners, the dense gradients to everyone;
        every parameter's gradient set to the group's."""
        trained = self.groups.trained_by(kind) if kind is not None else ()
        grads: list[tuple[torch.Tensor, torch.Tensor]] = []  # per table: (ids ascending, gradient rows)
        for t in self.tables:
            window, t.table.window = t.table.window, None
            grad = window.rows.grad if window is not None and t.group in trained else None
            if grad is None:
                grads.append((torch.zeros(0, dtype=torch.int64), torch.zeros(0, t.table.dim)))
                continue
            positions, values = coalesced_rows(grad)
            grads.append((window.ids.index_select(0, positions), values))  # type: ignore[union-attr]
        sent_rows = torch.tensor([len(ids) for ids, _ in grads], dtype=torch.int64)  # touched, per table
        flags = torch.tensor([int(g in trained) for g in self.dense], dtype=torch.int64)
        dense = [
            p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel())
            for g in self.dense
            if g in trained
            for p in self.dense[g]
        ]
        cuts = [self._owners(t.table, ids) for t, (ids, _) in zip(self.tables, grads, strict=True)]
        messages = []
        for owner in range(self.world):
            owned_counts = torch.tensor([c[owner + 1] - c[owner] for c in cuts], dtype=torch.int64)
            owned = [ids[c[owner] : c[owner + 1]] for (ids, _), c in zip(grads, cuts, strict=True)]
            owned_values = [v[c[owner] : c[owner + 1]] for (_, v), c in zip(grads, cuts, strict=True)]
            messages.append(_bytes(owned_counts, sent_rows, flags, *owned, *dense, *owned_values))
        self._apply(self._exchange(messages), divisor)

    def _apply(self, received: Sequence[torch.Tensor], divisor: Mapping[str, int]) -> None:
        n_tables, n_groups = len(self.tables), len(self.dense)
        got_ids: list[list[torch.Tensor]] = [[] for _ in self.tables]
        got_values: list[list[torch.Tensor]] = [[] for _ in self.tables]
        touched = [0] * n_tables
        dense_parts: dict[str, list[torch.Tensor]] = {}
        for message in received:  # rank order
            head = message[: 8 * (2 * n_tables + n_groups)].view(torch.int64).tolist()
            counts, sent_rows, flags = head[:n_tables], head[n_tables : 2 * n_tables], head[2 * n_tables :]
            offset = 8 * len(head)
            for i, n in enumerate(counts):
                got_ids[i].append(message[offset : offset + 8 * n].view(torch.int64))
                offset += 8 * n
                touched[i] += sent_rows[i]
            for g, flag in zip(self.dense, flags, strict=True):
                if flag:
                    n = 4 * sum(p.numel() for p in self.dense[g])
                    dense_parts.setdefault(g, []).append(message[offset : offset + n].view(torch.float32))
                    offset += n
            for i, (t, n) in enumerate(zip(self.tables, counts, strict=True)):
                size = 4 * n * t.table.dim
                got_values[i].append(message[offset : offset + size].view(torch.float32).view(n, t.table.dim))
                offset += size
            if offset != message.numel():
                raise ValueError(f"a round's message of {message.numel()} bytes; its header describes {offset}")
        for g, params in self.dense.items():
            d = divisor.get(g, 0)
            if not d or g not in dense_parts:
                for p in params:
                    p.grad = None
                continue
            total = dense_parts[g][0].clone()
            for part in dense_parts[g][1:]:
                total += part
            total /= d
            offset = 0
            for p in params:
                p.grad = total[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        for i, t in enumerate(self.tables):
            weight, d = t.table.table.weight, divisor.get(t.group, 0)
            if not d or not touched[i]:
                weight.grad = None
                continue
            ids = torch.cat(got_ids[i])
            if ids.numel():
                ids, sums = sorted_row_sums(ids, torch.cat(got_values[i]))
            else:
                sums = torch.zeros(0, t.table.dim)
            local = (ids - t.table.row_start).reshape(1, -1)
            weight.grad = torch.sparse_coo_tensor(
                local, sums / d, weight.shape, is_coalesced=True, check_invariants=False
            )
