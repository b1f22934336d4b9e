"""The trainer: one optimiser step per ``batch_size`` rows, routed by the batch's kind.

A reader batch (an executor's batch, often tens of thousands of rows) is cut into micro-batches of
``TrainingSpec.batch_size``; each is one step of ``training.loss`` (BCE with logits by default;
:func:`~primus_dagster.training.models.loss_function`) of ``model(dense, sparse, kind)`` and the label
(plus the model's ``auxiliary_loss``, if any) with Adam. The model decides what a kind trains
(MTRM: ``batch`` -> memory tower, and the adapt tower too with ``adapt_batch_weight`` > 0;
``stream`` -> adapt tower; the single tower learns both). Checkpoints are taken between reader batches only, so
a checkpoint always covers whole batches -- what the data driver's barrier snapshot records.

Example::

    trainer = Trainer(build_model(spec.model, n_dense=13, n_sparse=5), spec)
    for batch in reader:
        trainer.train(batch)
    trainer.stats()        # {"step": ..., "samples": ..., "samples_per_s": ..., "loss": ...}
"""

from __future__ import annotations

import ctypes
import math
import sys
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from primus_dagster.data import Batch
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training import kernels
from primus_dagster.training.device import to_device
from primus_dagster.training.huge_pages import huge_page_copy, huge_page_zeros, on_huge_pages
from primus_dagster.training.models import RecModel, loss_function, model_inputs, sparse_tables
from primus_dagster.training.row_sparse import sorted_row_sums

_ALLOCATOR_TUNED = False


def keep_freed_memory() -> None:
    """Make glibc keep freed memory for reuse (once per process; a no-op elsewhere).

    Every step allocates the embedding tables' gradients afresh (``zero_grad(set_to_none=True)``:
    MTRM relies on ``None`` grads so that Adam leaves the untrained tower alone) -- 6.4 MB for
    100 000 x 16 floats. With glibc's defaults those come from ``mmap`` or a trimmed heap and
    are page-faulted in anew every step (measured: a third of a step; figures in docs/training.md,
    "Measured reasons in the code"); a high mmap and trim threshold keeps them on the heap.
    """
    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED or not sys.platform.startswith("linux"):
        return
    _ALLOCATOR_TUNED = True
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: allocations below 1 GiB from the heap
        libc.mallopt(-1, 1 << 31)  # M_TRIM_THRESHOLD: do not give freed heap top back below 2 GiB
    except (OSError, AttributeError):  # not glibc (musl, ...): keep the defaults
        pass


class LazyAdam(torch.optim.SparseAdam):
    ROW_STATE = ("exp_avg", "exp_avg_sq")  # its state per table row (a sharded table's shards hold these)

    """:class:`torch.optim.SparseAdam` -- the same update to the last bit, the same state and
    ``state_dict`` -- with the row bookkeeping done by gathers and row writes.

    torch's version coalesces the gradient with the generic sparse ``coalesce``, then reads the moments
    through ``sparse_mask`` and writes them and the parameter with dense += sparse additions: most of a
    step on the TorchRec shape (profiled with ``bench/train_throughput.py --only-torchrec``); here well
    under half of that (figures in docs/training.md, "Measured reasons in the code"):

    * the duplicate ids' rows are summed by ``coalesce``'s own sort and an ``embedding_bag`` segment
      sum -- in the sorted order, as ``coalesce`` (that sort, then a running sum) adds them;
    * the touched rows of both moments are gathered with ``index_select``, updated with SparseAdam's
      arithmetic op for op, and written back as 16-byte words (:func:`_copy_rows`);
    * the parameter gets one ``index_add_`` of the (unique) rows;
    * the moments live on 2 MB pages (:func:`~primus_dagster.training.huge_pages.huge_page_zeros`), as
      the tables do.

    tests/training/test_model_speed_equivalence.py checks parameters and moments bit for bit against
    ``torch.optim.SparseAdam``. A parameter that is not a 2-D table takes torch's path.
    """

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            eps, lr, maximize = group["eps"], float(group["lr"]), group.get("maximize", False)
            for param in group["params"]:
                if param.grad is None:
                    continue
                if not param.grad.is_sparse:
                    raise RuntimeError("SparseAdam does not support dense gradients, please consider Adam instead")
                state = self.state[param]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = _zeros_like(param)
                    state["exp_avg_sq"] = _zeros_like(param)
                state["step"] += 1
                grad = -param.grad if maximize else param.grad
                args = (state["exp_avg"], state["exp_avg_sq"], state["step"], lr, beta1, beta2, eps)
                if param.dim() == 2 and grad.sparse_dim() == 1 and grad.dense_dim() == 1:
                    _lazy_adam_rows(param, grad, *args)
                else:
                    torch.optim._functional.sparse_adam(
                        [param],
                        [grad],
                        [args[0]],
                        [args[1]],
                        [args[2]],
                        eps=eps,
                        beta1=beta1,
                        beta2=beta2,
                        lr=lr,
                        maximize=False,
                    )
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for state in self.state.values():  # the moments of a restored table back on 2 MB pages
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state and not on_huge_pages(state[key]):
                    state[key] = huge_page_copy(state[key])


def _zeros_like(param: torch.Tensor) -> torch.Tensor:
    """SparseAdam's zero moments; a large CPU table's on 2 MB pages."""
    if param.device.type == "cpu" and param.is_contiguous():
        return huge_page_zeros(tuple(param.shape), param.dtype)
    return torch.zeros_like(param, memory_format=torch.preserve_format)


def coalesced_rows(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique row ids ascending, summed rows) of a row-sparse gradient: what ``grad.coalesce()`` holds,
    bit for bit (coalesce's own sort, then an in-order segment sum), without building the coalesced
    tensor. :class:`LazyAdam` updates these rows; the multi-trainer exchange
    (:class:`~primus_dagster.training.distributed.RowSparseExchange`) sends them and merges the ranks'.

    Example::

        rows, values = coalesced_rows(table.weight.grad)    # ids ascending, values[i]: row rows[i]'s sum
    """
    ids, values = grad._indices()[0], grad._values()
    # strictly ascending ids are coalesced in all but the flag, which autograd's accumulation into .grad
    # drops (RowSparseBag's gradients arrive so): one comparison pass instead of a sort
    if grad.is_coalesced() or bool((ids[1:] > ids[:-1]).all()):
        return ids, values
    return sorted_row_sums(ids, values)


def _copy_rows(dst: torch.Tensor, rows: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[rows] = src`` for 2-D tables. ``index_copy_`` moves element by element; viewed as 16-byte
    complex values, the same bytes move in 4x fewer elements (a copy: no arithmetic, no rounding)."""
    if dst.dtype == torch.float32 and src.dtype == torch.float32 and dst.shape[1] % 4 == 0:
        try:  # views only: a layout they refuse (strides, offset) takes the plain copy
            wide_dst, wide_src = dst.view(torch.complex128), src.view(torch.complex128)
        except RuntimeError:
            pass
        else:
            wide_dst.index_copy_(0, rows, wide_src)
            return
    dst.index_copy_(0, rows, src)


def _lazy_adam_rows(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """SparseAdam's update of the rows of the 2-D ``param`` that the row-sparse ``grad`` names (in place)."""
    rows, values = coalesced_rows(grad)
    if values.numel() == 0:
        return
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    compiled = kernels.active().adam_rows
    if compiled is not None:  # the same update as one fused loop (training/kernels.py)
        # the forms the kernel was compiled for (else a step would run it eagerly): plain tensors, not a
        # Parameter (detach: the same storage) nor views of other tensors (the gradient's indices are one)
        rows, values = (t if t._base is None else t.clone() for t in (rows, values))
        step_tensor = torch.tensor(step_size, device=param.device)
        compiled(param.detach(), exp_avg, exp_avg_sq, rows, values, step_tensor, beta1, beta2, eps)
        return
    # torch.optim's SparseAdam, op by op: old <- old + (1 - b) * (new - old); param += -step_size * m / (sqrt(v) + eps)
    m = exp_avg.index_select(0, rows)
    m.add_(values.sub(m).mul_(1 - beta1))
    _copy_rows(exp_avg, rows, m)
    v = exp_avg_sq.index_select(0, rows)
    v.add_(values.pow(2).sub_(v).mul_(1 - beta2))
    _copy_rows(exp_avg_sq, rows, v)
    # rows are distinct: gather, add, scatter back (the same sums as index_add_, in about 2/3 of its time)
    _copy_rows(param, rows, param.index_select(0, rows).add_(m.div_(v.sqrt_().add_(eps)).mul_(-step_size)))


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad for embedding tables with sparse gradients (``training.embedding_optimizer:
    row_wise_adagrad``; FBGEMM's and TorchRec's ``EXACT_ROWWISE_ADAGRAD``): one accumulated value a row,
    ``sum_r += mean(g_r^2)``, then ``w_r -= lr * g_r / (sqrt(sum_r) + eps)`` for the rows a step touched.
    Its state is 1/dim of the table, against Adam's two moments a value.

    Example::

        opt = RowWiseAdagrad([table.weight], lr=0.01)
        loss.backward(); opt.step()                        # table.weight.grad: row-sparse
    """

    ROW_STATE = ("sum",)

    def __init__(self, params: Any, lr: float, eps: float = 1e-8):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps = float(group["lr"]), float(group["eps"])
            for param in group["params"]:
                if param.grad is None:
                    continue
                if not param.grad.is_sparse or param.dim() != 2:
                    raise RuntimeError("row-wise Adagrad takes 2-D tables with sparse gradients")
                state = self.state[param]
                if len(state) == 0:
                    state["step"] = 0
                    state["sum"] = torch.zeros(param.shape[0], dtype=param.dtype, device=param.device)
                state["step"] += 1
                rows, values = coalesced_rows(param.grad)
                if values.numel() == 0:
                    continue
                total = state["sum"]
                total.index_add_(0, rows, values.pow(2).mean(1))
                scale = total.index_select(0, rows).sqrt_().add_(eps).reciprocal_().mul_(-lr)
                _copy_rows(param, rows, param.index_select(0, rows).add_(values * scale.unsqueeze(1)))
        return loss


class RecOptimizer:
    """Adam for the dense parameters and, for embedding tables with sparse gradients (a step updates only
    the rows its batch touched), a lazy :class:`torch.optim.SparseAdam` (:class:`LazyAdam`, its faster
    equal; ``embedding_optimizer: adam``) or :class:`RowWiseAdagrad` (``row_wise_adagrad``), behind one
    ``zero_grad`` / ``step`` / ``state_dict``. Parameters whose grad is None (MTRM's untrained
    tower) are skipped by both, and so are ``stepped_elsewhere`` (tables whose optimiser runs in their
    backward: TorchRec's fused ones). A parameter learns at ``lr x model.lr_scale(name)`` where the model
    has one (:meth:`~primus_dagster.training.models.RecModel.lr_scale`; MTRM's memory tower).

    Example::

        opt = RecOptimizer(model, lr=1e-3)
        opt.zero_grad(); loss.backward(); opt.step()
    """

    def __init__(
        self,
        model: nn.Module,
        lr: float,
        embedding_optimizer: str = "adam",
        *,
        stepped_elsewhere: Collection[nn.Parameter] = (),
    ):
        sparse_ids = {id(p) for p in sparse_tables(model)}
        elsewhere = {id(p) for p in stepped_elsewhere}  # e.g. TorchRec's fused tables: updated in their backward
        scale_of = getattr(model, "lr_scale", None)
        # one parameter group per learning rate (RecModel.lr_scale: MTRM's memory tower may learn faster)
        groups: dict[str, dict[float, list[nn.Parameter]]] = {"dense": {}, "sparse": {}}
        for name, param in model.named_parameters():
            if id(param) in elsewhere:
                continue
            scale = float(scale_of(name)) if callable(scale_of) else 1.0
            groups["sparse" if id(param) in sparse_ids else "dense"].setdefault(scale, []).append(param)

        def param_groups(part: str) -> list[dict[str, Any]]:
            return [{"params": params, "lr": lr * scale} for scale, params in groups[part].items()]

        # fused: one kernel over every dense tensor (a fraction of the per-tensor loop's time on the CPU for the
        # built-in towers' MLPs; docs/training.md, "Compiled kernels"); the same state and state_dict
        self.parts: dict[str, torch.optim.Optimizer] = {
            "dense": torch.optim.Adam(param_groups("dense"), lr=lr, fused=True)
        }
        if groups["sparse"]:
            tables = {"adam": LazyAdam, "row_wise_adagrad": RowWiseAdagrad}
            if embedding_optimizer not in tables:
                raise ValueError(f"embedding optimizer {embedding_optimizer!r}; expected one of {sorted(tables)}")
            self.parts["sparse"] = tables[embedding_optimizer](param_groups("sparse"), lr=lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts.values():
            part.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for part in self.parts.values():
            part.step()

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self.parts.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.parts):
            raise ValueError(
                f"optimizer state has parts {sorted(state)}, this model needs {sorted(self.parts)} "
                "(was training.model.sparse_embeddings changed?)"
            )
        for name, part in self.parts.items():
            part.load_state_dict(state[name])


@dataclass
class TrainerStats:
    """Counters of a trainer (restored from checkpoints with the model)."""

    step: int = 0
    samples: int = 0
    samples_by_kind: dict[str, int] = field(default_factory=lambda: {"batch": 0, "stream": 0})
    loss_ema: float = float("nan")
    train_s: float = 0.0  # seconds inside optimiser steps (this process, since start or restore)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "samples": self.samples,
            "samples_batch": self.samples_by_kind.get("batch", 0),
            "samples_stream": self.samples_by_kind.get("stream", 0),
            "loss": self.loss_ema,
            "train_s": round(self.train_s, 3),
        }


class Trainer:
    """Adam on ``training.loss``; ``module`` is what runs forward (e.g. a DDP wrapper of ``model``);
    ``device``: where the model and each batch go (training/device.py; the model is moved there);
    ``deterministic``: the run is ``data.deterministic``; ``replicas``: the trainers of a rank group
    this one is among (both choose the kernels: :mod:`~primus_dagster.training.kernels`,
    ``training.compile``); ``optimizer``: its own (default: a :class:`RecOptimizer` of ``model``)."""

    def __init__(
        self,
        model: RecModel,
        spec: TrainingSpec,
        *,
        module: nn.Module | None = None,
        observe_labels: bool = True,
        device: torch.device | None = None,
        deterministic: bool = False,
        replicas: int = 1,
        optimizer: RecOptimizer | None = None,
    ):
        keep_freed_memory()
        self.device = device if device is not None else torch.device("cpu")
        if self.device.type != "cpu":
            model.to(self.device)  # before the optimiser: its state is created beside the parameters
        self.model = model
        self.module = module if module is not None else model
        # the model observes the labels it learns from (MTRM's label-delay calibration); the phase loop
        # tells it every trainer's of a round itself (observe_labels=False), so the replicas agree
        self.observe_labels = observe_labels
        self.spec = spec
        self.optimizer = (
            optimizer if optimizer is not None else RecOptimizer(model, spec.learning_rate, spec.embedding_optimizer)
        )
        self.loss_fn = loss_function(spec.loss, model)
        self.counters = TrainerStats()
        self._last_loss = float("nan")
        self._recent: deque[tuple[torch.Tensor, torch.Tensor]] = deque(maxlen=50)  # (logits, labels) of steps
        self.kernels = kernels.KernelPolicy.for_trainer(
            spec.compile, spec.compile_after_steps, device=self.device, deterministic=deterministic, replicas=replicas
        )

    @property
    def step(self) -> int:
        return self.counters.step

    def train_step(self, batch: Batch) -> float:
        """One optimiser step on ``batch`` (whatever its size); returns the loss."""
        started = time.perf_counter()
        loss = self.backward(batch)
        return self.apply(batch, loss, started)

    def backward(self, batch: Batch, loss_scale: float = 1.0) -> torch.Tensor:
        """The first half of :meth:`train_step`: gradients of ``batch``'s loss, not applied yet (a
        trainer group exchanges them in between, ``distributed``); the loss. ``loss_scale``: the gradients
        are of ``loss_scale`` times the loss (a group whose tables step inside the backward averages so)."""
        self.module.train()
        dense, sparse, label = model_inputs(batch)
        dense, sparse, label, lists = to_device(self.device, dense, sparse, label, batch.lists)
        self.optimizer.zero_grad(set_to_none=True)
        # a module wrapping the model (DDP) is called with the list features only where there are some
        logits = self.module(dense, sparse, batch.kind, lists) if lists else self.module(dense, sparse, batch.kind)
        loss = self.loss_fn(logits, label)
        extra = self.model.auxiliary_loss(dense, sparse, batch.kind, label, lists)  # MTRM: adapt_batch_weight
        if extra is not None:
            loss = loss + extra
        self._recent.append((logits.detach(), label))
        if self.observe_labels:
            self.model.observe_labels(batch.kind, float(label.sum()), label.numel())
        with kernels.using(self.kernels.current(self.counters.step + 1)):
            (loss if loss_scale == 1.0 else loss * loss_scale).backward()
        return loss

    def apply(self, batch: Batch, loss: torch.Tensor, started: float) -> float:
        """The second half of :meth:`train_step`: the optimiser step and the counters (``started``:
        ``time.perf_counter()`` before :meth:`backward`); the loss."""
        with kernels.using(self.kernels.current(self.counters.step + 1)):
            self.optimizer.step()
        value = float(loss.detach())
        c = self.counters
        c.train_s += time.perf_counter() - started
        c.step += 1
        c.samples += batch.rows
        c.samples_by_kind[batch.kind] = c.samples_by_kind.get(batch.kind, 0) + batch.rows
        c.loss_ema = value if c.loss_ema != c.loss_ema else 0.98 * c.loss_ema + 0.02 * value  # NaN check
        self._last_loss = value
        self.kernels.after_step(c.step)
        return value

    def train(self, batch: Batch) -> int:
        """Train on a whole reader batch in micro-batches of ``batch_size`` rows; the steps taken.
        (The phase loop merges small reader batches first: training/coalesce.py.)"""
        size = self.spec.batch_size
        steps = 0
        for start in range(0, batch.rows, size):
            self.train_step(batch.slice(start, start + size))
            steps += 1
        return steps

    def recent_auc(self) -> float:
        """Progressive-validation AUC of the last 50 steps: each batch scored *before* the model
        learnt from it (the standard online-learning measure; NaN with one class only)."""
        if not self._recent:
            return float("nan")
        from primus_dagster.training.metrics import auc

        return auc(torch.cat([y for _, y in self._recent]).cpu(), torch.cat([x for x, _ in self._recent]).cpu())

    def stats(self) -> dict[str, Any]:
        out = self.counters.to_dict()
        out["samples_per_s"] = round(self.counters.samples / self.counters.train_s, 1) if self.counters.train_s else 0.0
        out["last_loss"] = self._last_loss
        out["kernels"] = self.kernels.describe()
        return out

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model state, optimizer state) for a checkpoint (tensors on the training device; ``torch.load``
        of a checkpoint maps them to the CPU)."""
        return self.model.state_dict(), self.optimizer.state_dict()

    def restore(
        self,
        model_state: dict[str, Any],
        optimizer_state: dict[str, Any],
        *,
        step: int,
        samples: int,
        samples_by_kind: dict[str, int] | None = None,
    ) -> None:
        """Continue from a checkpoint."""
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(optimizer_state)
        self.counters = TrainerStats(
            step=step, samples=samples, samples_by_kind=dict(samples_by_kind or {"batch": 0, "stream": 0})
        )
