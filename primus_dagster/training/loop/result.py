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
    """(sha256 of the float32 parameter bytes in order, float64 sum of their absolute values)."""
    flat = [p.detach().to(torch.float32).contiguous().cpu() for p in model.parameters()]
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in flat)).hexdigest()
    return digest, float(sum(float(t.abs().sum(dtype=torch.float64)) for t in flat))
