"""What one trainer did in a phase loop: :class:`RankResult`, and :func:`params_checksum` of its model.

Example::

    result = loop.result(wall_s, cpu_s)
    result.samples_trained, result.params_checksum      # replicas of a group: the same checksum
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class RankResult:
    """One trainer's counters (since its start: a resumed rank's include what it trained before), the
    samples it trained in this loop, its time and a checksum of its final parameters."""

    rank: int
    steps: int
    samples: int
    samples_by_kind: dict[str, int]
    wall_s: float  # of the loop
    train_s: float  # inside its own optimiser steps in the loop (null steps excluded)
    params_checksum: str  # sha256 of the concatenated float32 parameter bytes ("" without a model)
    params_abs_sum: float  # float64 sum of |p|
    null_steps: int = 0  # rounds it took part in without data of its own
    cpu_s: float = 0.0  # CPU seconds of its process in the loop (all its threads)
    samples_trained: int = 0  # in this loop
    loss: float = float("nan")  # smoothed, at the end
    extra: dict[str, float] = field(default_factory=dict)  # what its coordinator measured (exchange seconds...)

    def as_dict(self) -> dict[str, Any]:
        """Its fields, what its coordinator measured among them (JSON-able: the run's ``stats["ranks"]``)."""
        fields = asdict(self)
        return {**fields, **fields.pop("extra")}


def params_checksum(model: nn.Module) -> tuple[str, float]:
    """(sha256 of the float32 parameter bytes in order, float64 sum of their absolute values).

    Read in blocks of :data:`_CHECKSUM_BLOCK` values: a rank's tables are most of its memory, and a
    whole-table copy here would take it past the plan (``training/memory_plan.py``) at the end of every loop."""
    digest, abs_sum = hashlib.sha256(), 0.0
    for p in model.parameters():
        flat = p.detach().reshape(-1)
        for block in flat.split(_CHECKSUM_BLOCK):
            values = block.to(torch.float32).contiguous().cpu()
            digest.update(memoryview(values.numpy()))  # the tensor's own bytes: no copy
            abs_sum += float(values.abs().sum(dtype=torch.float64))
    return digest.hexdigest(), abs_sum


_CHECKSUM_BLOCK = 1 << 20
