"""The state of sharded tables in a checkpoint: which entries are sharded, how they are named, how the whole
state is put back together.

A checkpoint of a group whose tables are sharded by rows keeps in ``model.pt`` what every rank holds alike
(the dense parameters and their Adam state, each sharded table's Adam step count) and, in its ``shards/``
folder, the tables and their two Adam moments as ``torch.distributed.checkpoint`` files: every rank writes
its rows (a ``DTensor`` sharded on rows), and a group of any size loads its own rows back -- a resume on 1,
2 or 3 ranks reshards. :class:`ShardedInfo` (in the checkpoint's ``extra["sharded"]``) names them;
:func:`merge_shards` puts the whole, unsharded state together without a process group (a registered model,
one trainer resuming a group's run).

Example::

    info = ShardedInfo({"memory.embedding.tables.shared.table.weight": (100_000, 16)}, {...: 0})
    model_state, optimizer_state = strip_sharded(model_state, optimizer_state, info)     # for model.pt
    full_model, full_optimizer = merge_shards(directory / "shards", model_state, optimizer_state, info)
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SHARDS_DIR = "shards"


def model_key(parameter: str) -> str:
    """The shards' key of a sharded table's rows."""
    return f"model/{parameter}"


def moment_key(parameter: str, moment: str) -> str:
    """The shards' key of one of a sharded table's Adam moments."""
    return f"optimizer/{parameter}/{moment}"


@dataclass(frozen=True)
class ShardedInfo:
    """The sharded tables of a checkpoint: ``tables`` -- parameter name -> the whole table's shape;
    ``optimizer_index`` -- parameter name -> its index in the sparse optimizer's state (``state_dict``);
    ``moments`` -- the optimizer's state per row (lazy Adam: ``exp_avg``, ``exp_avg_sq``; row-wise Adagrad:
    ``sum``), which the shards hold for every table that took a step."""

    tables: Mapping[str, tuple[int, int]]
    optimizer_index: Mapping[str, int]
    moments: tuple[str, ...] = ("exp_avg", "exp_avg_sq")

    def to_dict(self) -> dict[str, Any]:
        return {
            "tables": {name: list(shape) for name, shape in self.tables.items()},
            "optimizer_index": dict(self.optimizer_index),
            "moments": list(self.moments),
        }

    @classmethod
    def of(cls, extra: Mapping[str, Any]) -> ShardedInfo | None:
        """A checkpoint's (its ``extra``), or None when nothing in it is sharded."""
        data = extra.get("sharded")
        if not data:
            return None
        tables = {str(k): (int(v[0]), int(v[1])) for k, v in data["tables"].items()}
        moments = tuple(str(m) for m in data.get("moments", ("exp_avg", "exp_avg_sq")))
        return cls(tables, {str(k): int(v) for k, v in data["optimizer_index"].items()}, moments)


def strip_sharded(
    model_state: Mapping[str, Any], optimizer_state: Mapping[str, Any], info: ShardedInfo
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The states without what the shards hold: the tables, and their moments (each keeps its step count)."""
    model = {k: v for k, v in model_state.items() if k not in info.tables}
    optimizer = dict(optimizer_state)
    if "sparse" in optimizer:
        sparse = {"param_groups": optimizer["sparse"]["param_groups"], "state": dict(optimizer["sparse"]["state"])}
        for index in info.optimizer_index.values():
            entry = sparse["state"].get(index)
            if entry is not None:
                sparse["state"][index] = {k: v for k, v in entry.items() if k not in info.moments}
        optimizer["sparse"] = sparse
    return model, optimizer


def merge_shards(
    shards: Path, model_state: Mapping[str, Any], optimizer_state: Mapping[str, Any], info: ShardedInfo
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole states: ``model.pt``'s with the tables and moments of the ``shards`` folder put back (read
    without a process group, ``torch.distributed.checkpoint``'s own conversion)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix=".merge-", dir=shards.parent) as scratch:
        whole = Path(scratch) / "whole.pt"
        dcp_to_torch_save(str(shards), str(whole))
        tensors: dict[str, torch.Tensor] = torch.load(whole, map_location="cpu", weights_only=True)
    model = dict(model_state)
    for name in info.tables:
        model[name] = tensors[model_key(name)]
    optimizer = copy.copy(dict(optimizer_state))
    if "sparse" in optimizer:
        sparse = {"param_groups": optimizer["sparse"]["param_groups"], "state": dict(optimizer["sparse"]["state"])}
        for name, index in info.optimizer_index.items():
            entry = sparse["state"].get(index)
            if entry is not None:  # a table that took an optimiser step
                sparse["state"][index] = {**entry, **{m: tensors[moment_key(name, m)] for m in info.moments}}
        optimizer["sparse"] = sparse
    return model, optimizer
