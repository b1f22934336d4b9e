"""TorchRec tables sharded by TorchRec: the :class:`DMPExchange` of a lock-step group whose custom model
(``training.model.type: custom``) holds its tables in TorchRec ``EmbeddingBagCollection`` modules
(``training.sharding: row_wise``).

At the model's build every rank wraps it in ``torchrec.distributed.DistributedModelParallel`` over the
group's gloo process group: TorchRec's planner (``EmbeddingShardingPlanner``, a CPU ``Topology``) shards
every table row-wise with the fused CPU kernel, its row-wise Adagrad applied inside the backward
(``apply_optimizer_in_backward``); each rank holds about 1/N of every table's rows and of their optimiser
state. The plan per table goes to the run log. The dense parameters stay whole on every rank
(data-parallel): their gradients are all-reduced each round and stepped by the trainer's usual Adam.

* **Rounds.** The sharded lookups are collectives, so every rank runs a forward and a backward every round
  the group steps: a ready rank its micro-batch, the others the model's made-up rows with every id masked
  (no row is read or updated). TorchRec's row-wise sharding on gloo wants the same batch size on every
  rank, so each lookup's input is padded to ``training.batch_size`` rows of empty bags and its output cut
  back. A ready rank's loss is divided by the ranks that trained this round: the tables' gradients (summed
  over the ranks by TorchRec) and the all-reduced dense gradients are then the group's average, as in the
  replicated exchange.
* **Checkpoints** keep the format of :mod:`~primus_dagster.training.shard_state`: every rank writes its rows
  of every table and of its row-wise Adagrad sums as ``torch.distributed.checkpoint`` shards, so the
  registered model is whole (merged without a process group) and a resume on any number of ranks -- or on
  one replicated trainer with ``row_wise_adagrad`` -- takes its own rows back.
* **Limits.** TorchRec's fused CPU kernels have no Adam: the tables need ``training.embedding_optimizer:
  row_wise_adagrad``. A model with tables of another kind beside its collections is refused, naming them.

TorchRec is imported when such a model is built, not before.

Example (in every rank, after ``init_process_group``)::

    coordinator = LockStep(DMPExchange(note=print))
    loop = PhaseLoop(context, coordinator, reader, sink)
    loop.run()
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from primus_dagster.data import Batch
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.checkpoint import Checkpoint
from primus_dagster.training.distributed.exchange import Divisor, RoundMessages
from primus_dagster.training.features import ModelInit
from primus_dagster.training.loop import TableShards
from primus_dagster.training.models import ParameterGroups, RecModel, build_initial_model, made_up_rows, sparse_tables
from primus_dagster.training.shard_state import SHARDS_DIR, ShardedInfo, model_key, moment_key
from primus_dagster.training.trainer import RecOptimizer, Trainer

EPS = 1e-8  # the row-wise Adagrad's, as training/trainer.py's RowWiseAdagrad
MOMENT = "sum"  # the shards' name of a table's row-wise Adagrad state (RowWiseAdagrad.ROW_STATE)


def torchrec_collections(model: nn.Module) -> dict[str, nn.Module]:
    """The model's TorchRec ``EmbeddingBagCollection`` modules by path (none where TorchRec was never
    imported: such a model cannot hold one)."""
    if "torchrec" not in sys.modules:
        return {}
    from torchrec import EmbeddingBagCollection

    return {path: m for path, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)}


def _copy_into(sharded: Any, whole: torch.Tensor) -> None:
    """This rank's part of ``whole`` into the ``ShardedTensor`` ``sharded`` (in place: its storage is the
    fused kernel's)."""
    with torch.no_grad():
        for shard in sharded.local_shards():
            index = tuple(
                slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes, strict=True)
            )
            shard.tensor.copy_(whole[index])


class _EqualStride:
    """Forward hooks of one sharded collection: its input padded to ``stride`` rows of empty bags (every
    id dropped when ``masked``: a rank without data), its output cut back to the rows of the batch."""

    def __init__(self, stride: int):
        self.stride, self.masked, self._rows = stride, False, 0

    def before(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        from torchrec import KeyedJaggedTensor

        features, rest = args[0], args[1:]
        keys, rows = features.keys(), features.stride()
        if rows > self.stride:
            raise ValueError(f"a lookup of {rows} rows; the group pads every lookup to {self.stride}")
        self._rows = rows
        lengths = features.lengths().view(len(keys), rows)
        values, weights = features.values(), features.weights_or_none()
        if self.masked:
            lengths, values = torch.zeros_like(lengths), values[:0]
            weights = weights[:0] if weights is not None else None
        pad = lengths.new_zeros(len(keys), self.stride - rows)
        padded = KeyedJaggedTensor(
            keys=keys, values=values, lengths=torch.cat([lengths, pad], 1).reshape(-1), weights=weights,
            stride=self.stride,
        )  # fmt: skip
        return (padded, *rest)

    def after(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        from torchrec import KeyedTensor

        if hasattr(output, "wait"):  # a lazy awaitable of the pooled embeddings
            output = output.wait()
        values = output.values()
        cut = values[: self._rows] if output.key_dim() == 1 else values[:, : self._rows]
        return KeyedTensor(keys=output.keys(), length_per_key=output.length_per_key(), values=cut,
                           key_dim=output.key_dim())  # fmt: skip


class DMPOptimizer(RecOptimizer):
    """The trainer's optimiser under ``DistributedModelParallel``: the usual Adam for the dense parameters
    and DMP's fused optimiser (``dmp.fused_optimizer``) for the sharded tables, whose update runs inside
    the backward. ``state_dict`` has the layout of a replicated trainer's with ``row_wise_adagrad`` (a
    ``sparse`` part, one entry a table); the tables' sums are not in it: the shards hold them
    (:meth:`DMPExchange.save`).

    Example::

        optimizer = DMPOptimizer(model, 1e-3, dmp.fused_optimizer, tables)
        trainer = Trainer(model, spec, module=dmp, optimizer=optimizer)
    """

    def __init__(self, model: nn.Module, lr: float, fused: Any, tables: Mapping[str, nn.Parameter]):
        super().__init__(model, lr, stepped_elsewhere=list(tables.values()))
        self.fused, self.lr, self.tables = fused, lr, list(tables)
        self.steps = 0

    def step(self) -> None:
        super().step()
        self.fused.step()  # its update ran in the backward: this sets its learning rate
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["sparse"] = {
            "state": {i: {"step": self.steps} for i in range(len(self.tables))},
            "param_groups": [{"lr": self.lr, "eps": EPS, "params": list(range(len(self.tables)))}],
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dense = {k: v for k, v in state.items() if k != "sparse"}
        super().load_state_dict(dense)
        entries = (state.get("sparse") or {}).get("state", {})
        if any(torch.is_tensor(v) for entry in entries.values() for v in entry.values()):
            raise ValueError(
                "the tables' optimiser state of a DistributedModelParallel trainer loads through "
                "DMPExchange.localize (its rows of every table), not as whole tensors"
            )
        self.steps = max((int(entry.get("step", 0)) for entry in entries.values()), default=0)


class DMPExchange:
    """The exchange of a lock-step group whose custom model's tables TorchRec shards (module docstring), a
    :class:`~.exchange.GradientExchange` and its checkpoints' :class:`~primus_dagster.training.loop.TableShards`.
    ``note(line)``: where the plan per table goes (the run log); ``sent`` / ``seconds``: bytes and seconds
    of the dense all-reduce (TorchRec's own exchanges are inside the forward and backward).

    Example::

        coordinator = LockStep(DMPExchange(note=log.info), timeout_s=300)
    """

    round_messages = False  # the round's all-gather carries the status rows alone
    backward_first = False  # every rank's forward is a collective: it runs in gradients / null_gradients

    def __init__(self, *, note: Callable[[str], None] | None = None):
        self.note = note
        self.table_shards: TableShards | None = self
        self.rank, self.world = 0, 1
        self.sent, self.seconds = 0, 0.0
        self.groups = ParameterGroups.one()
        self.dense: dict[str, list[nn.Parameter]] = {}
        self.tables: dict[str, tuple[int, int]] = {}  # parameter name -> the whole table's (rows, dim)
        self.hooks: list[_EqualStride] = []
        self.model: RecModel | None = None
        self.dmp: Any = None

    def reset_counters(self) -> None:
        self.sent, self.seconds = 0, 0.0

    def close(self) -> None:
        pass  # its collectives go through the default process group

    # ------------------------------------------------------------------------------------- build
    def build(self, spec: TrainingSpec, init: ModelInit, *, deterministic: bool = False) -> Trainer:
        """The model (the same seed on every rank), its tables sharded by DMP, and its trainer."""
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        model = build_initial_model(spec.model, init, seed=spec.seed)
        collections = torchrec_collections(model)
        names = {id(p): n for n, p in model.named_parameters()}
        in_collections = {id(p) for m in collections.values() for p in m.parameters()}
        foreign = [names[id(p)] for p in sparse_tables(model) if id(p) not in in_collections]
        if not collections or foreign:
            what = f"tables of its own ({', '.join(foreign)})" if foreign else "no TorchRec EmbeddingBagCollection"
            raise ValueError(
                "training.sharding row_wise shards a custom model's TorchRec EmbeddingBagCollection tables "
                f"(DistributedModelParallel); the model has {what}: set training.sharding: replicated for it"
            )
        if spec.embedding_optimizer != "row_wise_adagrad":
            raise ValueError(
                f"training.embedding_optimizer {spec.embedding_optimizer!r}: TorchRec's fused CPU tables have no "
                "Adam; set training.embedding_optimizer: row_wise_adagrad for a TorchRec model sharded row-wise"
            )
        whole = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in in_collections}
        self.tables = {n: (int(w.shape[0]), int(w.shape[1])) for n, w in whole.items()}
        self.dmp = self._shard(model, collections, spec)
        state = model.state_dict()
        for name, tensor in whole.items():
            _copy_into(state[name], tensor)  # DMP initialises its shards afresh: the seed's rows, as a replica's
        self.model, self.groups = model, model.parameter_groups()
        fused = {n: p for n, p in model.named_parameters() if n in self.tables}
        self.dense = {}
        for name, param in model.named_parameters():
            if name not in self.tables:
                self.dense.setdefault(self.groups.group_of(name), []).append(param)
        optimizer = DMPOptimizer(model, spec.learning_rate, self.dmp.fused_optimizer, fused)
        return Trainer(
            model, spec, module=self.dmp, observe_labels=False, replicas=self.world, deterministic=deterministic,
            optimizer=optimizer,
        )  # fmt: skip

    def _shard(self, model: RecModel, collections: Mapping[str, nn.Module], spec: TrainingSpec) -> Any:
        from torchrec.distributed import DistributedModelParallel
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
        from torchrec.distributed.types import ShardingEnv
        from torchrec.optim import RowWiseAdagrad
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

        class RowWiseSharder(EmbeddingBagCollectionSharder):
            """TorchRec's sharder, offering row-wise sharding on the CPU too (its lookups on gloo need an
            equal batch on every rank: :class:`_EqualStride`)."""

            def sharding_types(self, compute_device_type: str) -> list[str]:
                return ["row_wise"]

        for module in collections.values():
            apply_optimizer_in_backward(RowWiseAdagrad, module.parameters(), {"lr": spec.learning_rate, "eps": EPS})
        tables = [c.name for m in collections.values() for c in m.embedding_bag_configs()]  # type: ignore[operator]
        constraints = {t: ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["fused"]) for t in tables}
        sharders: list[Any] = [RowWiseSharder()]
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=self.world, compute_device="cpu"), constraints=constraints
        )
        group = dist.group.WORLD
        plan = planner.collective_plan(model, sharders, group)
        dmp = DistributedModelParallel(
            model, env=ShardingEnv.from_process_group(group), device=torch.device("cpu"), plan=plan,
            sharders=sharders, init_data_parallel=False,
        )  # fmt: skip
        for path in collections:
            sharded = model.get_submodule(path)
            hook = _EqualStride(spec.batch_size)
            self.hooks.append(hook)
            sharded.register_forward_pre_hook(hook.before)
            sharded.register_forward_hook(hook.after)
        if self.rank == 0 and self.note is not None:
            for path, module_plan in plan.plan.items():
                for table, p in module_plan.items():
                    rows = ""
                    if p.sharding_spec is not None:
                        rows = ", ".join(
                            f"rank {s.placement.rank()}: rows {s.shard_offsets[0]}-{s.shard_offsets[0] + s.shard_sizes[0]}"
                            for s in p.sharding_spec.shards
                        )
                    self.note(
                        f"torchrec: DistributedModelParallel sharded {path} table {table}: {p.sharding_type} "
                        f"({p.compute_kernel}) over ranks {p.ranks}; {rows}"
                    )
        return dmp

    # ------------------------------------------------------------------------------------ a round
    def pack(self, status: torch.Tensor, kind: int, micro: Batch) -> torch.Tensor | None:
        return None  # the status alone

    def gradients(
        self, trainer: Trainer, micro: Batch, loss: torch.Tensor | None, messages: RoundMessages, divisor: Divisor
    ) -> torch.Tensor:
        """A ready rank: its forward and backward (the tables step in it), the dense gradients all-reduced."""
        trained = [divisor.get(g, 0) for g in self.groups.trained_by(micro.kind)]
        ranks = max(trained, default=1) or 1
        for hook in self.hooks:
            hook.masked = False
        loss = trainer.backward(micro, loss_scale=1.0 / ranks)
        self._dense(divisor)
        return loss

    def null_gradients(self, trainer: Trainer, kind: str, messages: RoundMessages, divisor: Divisor) -> None:
        """A rank without data: the lookups' collectives on made-up rows with every id masked, a backward of
        zero, the dense all-reduce."""
        model = trainer.model
        dense, sparse, lists = made_up_rows(model.layout, 1)
        for hook in self.hooks:
            hook.masked = True
        try:
            trainer.module.train()
            logits = trainer.module(dense, sparse, kind, lists) if lists else trainer.module(dense, sparse, kind)
            (logits.sum() * 0.0).backward()
        finally:
            for hook in self.hooks:
                hook.masked = False
        self._dense(divisor)

    def _dense(self, divisor: Divisor) -> None:
        """The dense gradients summed over the ranks (each already divided by the ranks that trained)."""
        started = time.perf_counter()
        for group, params in self.dense.items():
            if not divisor.get(group, 0):
                for p in params:
                    p.grad = None
                continue
            flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in params])
            dist.all_reduce(flat)
            self.sent += 4 * flat.numel()
            offset = 0
            for p in params:
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        self.seconds += time.perf_counter() - started

    # ------------------------------------------------------------------------------- checkpoints
    def _sharded_state(self) -> dict[str, tuple[Any, Any]]:
        """Per table parameter: its weight and its row-wise Adagrad sums, as this rank's ``ShardedTensor``s."""
        assert self.model is not None and self.dmp is not None
        weights = self.model.state_dict()
        fused = self.dmp.fused_optimizer.state_dict()["state"]
        out = {}
        for name in self.tables:
            (moment,) = [v for k, v in fused[name].items() if k.endswith("momentum1")]
            out[name] = (weights[name], moment)
        return out

    def save(self, trainer: Trainer, staging: Path) -> ShardedInfo:
        """Every rank's rows of every table and of their row-wise Adagrad sums into ``staging`` (collective;
        the layout of :mod:`~primus_dagster.training.shard_state`)."""
        tensors: dict[str, Any] = {}
        for name, (weight, moment) in self._sharded_state().items():
            tensors[model_key(name)] = weight
            tensors[moment_key(name, MOMENT)] = moment
        if self.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)  # what a killed attempt left
        dist.barrier()
        import torch.distributed.checkpoint as dcp  # where a checkpoint needs it (see sharded.py)

        dcp.save(tensors, checkpoint_id=str(staging))
        index = {name: i for i, name in enumerate(self.tables)}
        return ShardedInfo(dict(self.tables), index, (MOMENT,))

    def localize(self, trainer: Trainer, checkpoint: Checkpoint, directory: Path) -> Checkpoint:
        """Load ``checkpoint``'s tables and their sums into this rank's shards -- from its shards (collective;
        any group size) or cut out of its whole tables (one trainer's, a replicated group's) -- and the
        checkpoint with this rank's sharded tables in their place, for the model's ``load_state_dict``."""
        info = ShardedInfo.of(checkpoint.extra)
        model_state = dict(checkpoint.model_state)
        optimizer_state = dict(checkpoint.optimizer_state)
        sparse = optimizer_state.get("sparse")
        entries = dict(sparse["state"]) if sparse is not None else {}
        mine = self._sharded_state()
        if info is not None:
            missing = sorted(set(self.tables) - set(info.tables))
            if missing:
                raise ValueError(f"the checkpoint's sharded tables {sorted(info.tables)} lack {missing}")
            if info.moments != (MOMENT,):
                raise ValueError(
                    f"the checkpoint's tables carry {list(info.moments)} (lazy Adam); TorchRec's fused tables take "
                    "row-wise Adagrad sums: resume with the checkpoint's training.embedding_optimizer and sharding"
                )
            wanted: dict[str, Any] = {}
            for name, (weight, moment) in mine.items():
                wanted[model_key(name)] = weight
                if entries.get(info.optimizer_index[name]) is not None:  # it took a step: its sums
                    wanted[moment_key(name, MOMENT)] = moment
            import torch.distributed.checkpoint as dcp

            dcp.load(wanted, checkpoint_id=str(directory / SHARDS_DIR))
        else:
            for i, (name, (weight, moment)) in enumerate(mine.items()):
                if name not in model_state:
                    raise ValueError(f"the checkpoint has no table {name!r}")
                _copy_into(weight, model_state[name])
                entry = entries.get(i) or {}
                if "exp_avg" in entry:
                    raise ValueError(
                        f"the checkpoint's table {name!r} carries lazy Adam moments; TorchRec's fused tables take "
                        "row-wise Adagrad sums: resume with training.embedding_optimizer: row_wise_adagrad"
                    )
                if MOMENT in entry:
                    _copy_into(moment, entry[MOMENT])
        for name, (weight, _) in mine.items():
            model_state[name] = weight  # loaded in place already: the model loads it onto itself
        if sparse is not None:
            stripped = {i: {k: v for k, v in e.items() if not torch.is_tensor(v)} for i, e in entries.items()}
            optimizer_state["sparse"] = {**sparse, "state": stripped}
        return dataclasses.replace(checkpoint, model_state=model_state, optimizer_state=optimizer_state)
