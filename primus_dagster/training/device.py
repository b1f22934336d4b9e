"""Where a trainer computes: ``training.device`` (``auto | cpu | cuda | cuda:N``) resolved on this machine.

``cpu`` (the default) trains as before: the model, its optimiser state and the batches stay in host
memory, and nothing is copied. ``cuda`` / ``cuda:N`` puts the model, its optimiser state, every batch
and the evaluation on that GPU (``cuda``: the current one, device 0); the checkpoints and the
registered model are written from host copies, so they load anywhere. ``auto`` takes ``cuda`` where
CUDA is available and the CPU elsewhere, and says which in the run log.

A device the machine does not have is a :class:`DeviceError` (one line, at ``validate`` and at the
start of a run), never a CUDA traceback in the middle of one. Multi-trainer jobs train on the CPU: the
rank exchange packs gradients in host memory (``spec/job.py`` refuses ``cuda`` there, ``auto`` picks
the CPU and says why).

Example::

    device, line = resolve_device("auto")    # (device(type='cpu'), 'auto -> cpu (CUDA is not available ...)')
    dense, sparse, label, lists = to_device(device, dense, sparse, label, lists)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from primus_dagster.data import Jagged


class DeviceError(ValueError):
    """``training.device`` names a device this machine does not have."""


def resolve_device(setting: str, *, trainers: int = 1) -> tuple[torch.device, str]:
    """``(device, what the run log says about it)`` for ``training.device`` ``setting`` on this machine
    with ``trainers`` trainer processes; :class:`DeviceError` when ``setting`` needs a GPU that is not
    there."""
    if setting == "cpu":
        return torch.device("cpu"), "cpu"
    available = torch.cuda.is_available()
    if setting == "auto":
        if trainers > 1:
            return torch.device("cpu"), f"auto -> cpu ({trainers} trainers: the rank exchange runs on the CPU)"
        if not available:
            return torch.device("cpu"), "auto -> cpu (CUDA is not available on this machine)"
        return _cuda(0), f"auto -> cuda:0 ({torch.cuda.get_device_name(0)})"
    kind, _, index_text = setting.partition(":")
    if kind != "cuda" or (index_text and not index_text.isdigit()):
        raise DeviceError(f"training.device {setting!r}: expected auto, cpu, cuda or cuda:N")
    if not available:
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        raise DeviceError(
            f"training.device is {setting!r}, but CUDA is not available on this machine ({build}): "
            "use device: auto (falls back to the CPU) or cpu"
        )
    index, count = int(index_text or 0), torch.cuda.device_count()
    if index >= count:
        raise DeviceError(
            f"training.device is {setting!r}, but this machine has {count} CUDA device(s) (0..{count - 1})"
        )
    device = _cuda(index)
    return device, f"{setting} -> {device} ({torch.cuda.get_device_name(index)})"


def _cuda(index: int) -> torch.device:
    return torch.device("cuda", index)


def jagged_to(jagged: Jagged, device: torch.device) -> Jagged:
    """``jagged`` with its tensors on ``device`` (copied asynchronously from pinned memory where possible)."""
    weights = None if jagged.weights is None else jagged.weights.to(device, non_blocking=True)
    return Jagged(jagged.values.to(device, non_blocking=True), jagged.offsets.to(device, non_blocking=True), weights)


def to_device(
    device: torch.device,
    dense: torch.Tensor,
    sparse: torch.Tensor,
    label: torch.Tensor,
    lists: Mapping[str, Jagged],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Mapping[str, Jagged]]:
    """A batch's model inputs on ``device``; on the CPU the same objects (no copy, no new dict)."""
    if device.type == "cpu":
        return dense, sparse, label, lists
    moved = {name: jagged_to(j, device) for name, j in lists.items()}
    dense, sparse, label = (t.to(device, non_blocking=True) for t in (dense, sparse, label))
    return dense, sparse, label, moved
