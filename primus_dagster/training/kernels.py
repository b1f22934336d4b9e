"""The trainer's per-row kernels, eager or compiled: summing a lookup's gradient per touched table row,
and the lazy Adam update of the touched rows.

Why compile them. On list features each table's backward pass and optimizer step are a dozen eager
passes over the touched rows (gathers, arithmetic, scatters; ``bench/train_throughput.py`` part 5),
where FBGEMM -- TorchRec's kernel -- does the same work in one fused C++ loop. ``torch.compile``
(inductor) fuses each kernel below into one loop from the same Python source, and both the row
gradients and the Adam update of the touched rows run several times faster than eager, the whole
multi-hot step markedly more samples per CPU-second (figures in docs/training.md, "Compiled kernels"
and "Measured reasons in the code").

What it costs: the first compile on a machine takes many seconds of CPU (inductor writes C++ and builds
it; the result is cached under the system temp directory), every later process a few seconds to trace
and load the cached code. So ``training.compile: auto`` (the default) trains eagerly and compiles in a
background thread once a run has taken ``training.compile_after_steps`` steps, then switches at the
next step: a short run never pays, a long run pays once and trains faster from then on. ``on``
compiles before the first step (waiting for it), ``off`` never compiles. ``data.deterministic`` runs
stay eager (the eager kernels are the bit-exact reference; a compiled scatter-add may sum in another
order on several threads), and so do GPU trainers (the kernels are built and warmed up for the CPU) and,
with ``auto``, the ranks of a multi-trainer group (each rank's compile would end at another step, and
the replicas must apply every update alike). A compile that fails (no C++ compiler, an unsupported
torch) is said once in the run log and the run goes on eagerly.

The eager code paths stay where they are (``row_sparse.RowSparseBag``, ``trainer.LazyAdam``: each
bit-exact with torch's own); they ask :func:`active` for the compiled kernel and use it when a
:class:`KernelSet` with one is active (:func:`using`, entered by the trainer around its steps).
``tests/training/test_kernels.py`` checks each compiled kernel against the eager path (to float
tolerance: the compiled loop may fuse a multiply and an add). Hashing is not compiled: its cost is the
int64 remainders, which a compiled loop does no faster (measured: no gain;
figures in docs/training.md, "Measured reasons in the code").

Example::

    policy = KernelPolicy.for_trainer("auto", 1000, device=torch.device("cpu"))
    with using(policy.current(step)):         # the trainer's step
        loss.backward(); optimizer.step()
    policy.after_step(step)                   # at step 1000: starts the background compile
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch

log = logging.getLogger(__name__)

CompileMode = Literal["auto", "on", "off"]


def row_grads_source(
    grad_out: torch.Tensor,
    ids: torch.Tensor,
    bag: torch.Tensor | None,
    scale: torch.Tensor | None,
    slot: torch.Tensor,
    n_touched: int,
) -> torch.Tensor:
    """The lookup's gradient summed per touched row ``[n_touched, dim]``: id ``i`` adds
    ``grad_out[bag[i]] * scale[i]`` (``bag`` None: row ``i`` of ``grad_out``; ``scale`` None: 1) to row
    ``slot[ids[i]]`` -- ``RowSparseBag``'s eager backward (``_id_grads`` + ``row_sums``) in one loop.
    (The bag of each id comes in computed: a search of the bags' starts inside the loop measured 2x slower.)"""
    rows = grad_out if bag is None else grad_out[bag]
    if scale is not None:
        rows = rows * scale.unsqueeze(1)
    out = torch.zeros(n_touched, grad_out.shape[1], dtype=grad_out.dtype, device=grad_out.device)
    return out.index_add(0, slot[ids], rows)


def adam_rows_source(
    param: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    rows: torch.Tensor,
    values: torch.Tensor,
    step_size: torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """``torch.optim.SparseAdam``'s update of the distinct ``rows`` (gradient ``values``), in place:
    ``m += (1 - b1)(g - m)``, ``v += (1 - b2)(g^2 - v)``, ``p -= step_size * m / (sqrt(v) + eps)``."""
    m = exp_avg[rows]
    m = m + (values - m) * (1 - beta1)
    exp_avg[rows] = m
    v = exp_avg_sq[rows]
    v = v + (values * values - v) * (1 - beta2)
    exp_avg_sq[rows] = v
    param[rows] = param[rows] - step_size * m / (v.sqrt() + eps)


@dataclass(frozen=True)
class KernelSet:
    """Which kernels a step runs: ``None`` fields take the eager path (:data:`EAGER` has only those)."""

    name: str
    row_grads: Callable[..., torch.Tensor] | None = None
    adam_rows: Callable[..., None] | None = None


EAGER = KernelSet("eager")
_local = threading.local()


def active() -> KernelSet:
    """The kernels of the step this thread is in (:data:`EAGER` outside any :func:`using`)."""
    kernels: KernelSet = getattr(_local, "kernels", EAGER)
    return kernels


@contextmanager
def using(kernels: KernelSet) -> Iterator[None]:
    """Run the body's backward passes and optimizer steps on ``kernels`` (this thread's: autograd runs a
    CPU backward on the thread that called it)."""
    previous = active()
    _local.kernels = kernels
    try:
        yield
    finally:
        _local.kernels = previous


def _no_recompile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (compiled and warmed up) run under ``torch.compiler.set_stance("eager_on_recompile")``: an
    input its compiled code does not cover runs eagerly instead of compiling again inside a step."""

    def call(*args: object) -> Any:
        with torch.compiler.set_stance("eager_on_recompile"):
            return fn(*args)

    return call


def compile_kernels() -> KernelSet:
    """Compile every kernel and run each once on made-up inputs of every form a step uses (so no
    step compiles); seconds on a machine that compiled them before, ~20 s of CPU the first time.
    Raises what the compiler raises."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no pool of compile workers left behind
    compiled = {
        name: torch.compile(source, dynamic=True)
        for name, source in (("grads", row_grads_source), ("adam", adam_rows_source))
    }
    # Made-up inputs in the forms a step passes: plain tensors (no views), every size >= 2 (0 and 1 are
    # specialised) and every size distinct (equal sizes would be assumed equal ever after: "duck sizing").
    bags, n_ids, dim, n_rows, n_touched = 3, 5, 4, 11, 7
    with torch.no_grad():  # backward passes and optimizer steps run without grad mode
        ids = torch.tensor([0, 2, 2, 6, 1], dtype=torch.int64)  # bucket ids in [0, n_rows)
        bag = torch.tensor([0, 0, 2, 2, 2], dtype=torch.int64)  # each id's bag (the second bag is empty)
        slot = torch.arange(n_rows, dtype=torch.int64) % n_touched
        for scale in (None, torch.full((n_ids,), 0.5)):  # sum; weighted or mean
            compiled["grads"](torch.ones(bags, dim), ids, bag, scale, slot, n_touched)
        compiled["grads"](torch.ones(n_ids, dim), ids, None, None, slot, n_touched)  # a plain lookup
        table = torch.zeros(n_rows, dim)
        rows, values = torch.tensor([1, 3, 6], dtype=torch.int64), torch.ones(3, dim)
        compiled["adam"](table, table.clone(), table.clone(), rows, values, torch.tensor(1e-3), 0.9, 0.999, 1e-8)
    return KernelSet(
        "compiled",
        row_grads=_no_recompile(compiled["grads"]),
        adam_rows=_no_recompile(compiled["adam"]),
    )


class _ProcessKernels:
    """The compiled kernels of this process, built at most once (one background thread at a time)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kernels: KernelSet | None = None
        self.error: str | None = None
        self.seconds = 0.0
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        with self.lock:
            if self.kernels is not None or self.error is not None or self.thread is not None:
                return
            self.thread = threading.Thread(target=self.build, name="primus-compile-kernels", daemon=True)
            self.thread.start()

    def build(self) -> None:
        started = time.perf_counter()
        try:
            kernels = compile_kernels()
        except Exception as exc:  # any compiler failure: train on eagerly, say why once
            self.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            log.warning("kernels: torch.compile failed (%s); training goes on with the eager kernels", self.error)
        else:
            self.seconds = time.perf_counter() - started
            self.kernels = kernels

    def wait(self) -> None:
        self.start()
        thread = self.thread
        if thread is not None:
            thread.join()


_PROCESS = _ProcessKernels()


class KernelPolicy:
    """When a trainer switches from the eager to the compiled kernels (module docstring): ``mode``
    ``auto`` compiles in the background after ``after_steps`` steps, ``on`` before the first step,
    ``off`` never; ``eager_reason`` (a deterministic run, a GPU for ``auto``) keeps it eager and says why.

    Example::

        policy = KernelPolicy.for_trainer("auto", 1000, device=torch.device("cpu"), deterministic=False)
        policy.current().name        # "eager" until step 1000 (+ the compile), then "compiled"
    """

    def __init__(self, mode: CompileMode, after_steps: int, eager_reason: str | None = None):
        self.mode, self.after_steps, self.eager_reason = mode, after_steps, eager_reason
        self.switched_at: int | None = None  # the first step on compiled kernels
        self._started = False

    @classmethod
    def for_trainer(
        cls,
        mode: CompileMode,
        after_steps: int,
        *,
        device: torch.device,
        deterministic: bool = False,
        replicas: int = 1,
    ) -> KernelPolicy:
        """The policy of a trainer on ``device``, one of ``replicas`` ranks: eager for a deterministic run and
        on a GPU (the kernels are compiled and warmed up for the CPU); ``auto`` also in a rank group (each
        rank's background compile ends at another step, and the replicas must apply every update bit for
        bit alike; ``on`` compiles every rank before its first step)."""
        reason = None
        if mode != "off" and deterministic:
            reason = "data.deterministic runs use the eager kernels"
        elif device.type != "cpu":
            reason = f"training.compile compiles the CPU kernels only (device {device})"
        elif mode == "auto" and replicas > 1:
            reason = f"training.compile auto keeps the {replicas} ranks' replicas on the eager kernels (on: compiled from the start)"
        if reason is not None:
            mode = "off"
        policy = cls(mode, after_steps, reason)
        if mode == "on":
            policy.start(0, wait=True)
        return policy

    def start(self, step: int, wait: bool = False) -> None:
        if self._started or self.mode == "off":
            return
        self._started = True
        log.info(
            "kernels: compiling the embedding kernels with torch.compile (%s, step %d)",
            "before the first step" if wait else "in the background",
            step,
        )
        if wait:
            _PROCESS.wait()
        else:
            _PROCESS.start()

    def after_step(self, step: int) -> None:
        """Called after every step: ``auto`` starts the compile when ``step`` reaches ``after_steps``."""
        if self.mode == "auto" and step >= self.after_steps:
            self.start(step)

    def current(self, step: int = 0) -> KernelSet:
        """The kernels of the next step (``step``: its number, for the run log's switch line)."""
        kernels = _PROCESS.kernels if self._started else None
        if kernels is None:
            return EAGER
        if self.switched_at is None:
            self.switched_at = step
            log.info("kernels: compiled (%.1f s to build) from step %d on", _PROCESS.seconds, step)
        return kernels

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a compile this policy started; whether compiled kernels are ready."""
        thread = _PROCESS.thread if self._started else None
        if thread is not None:
            thread.join(timeout)
        return _PROCESS.kernels is not None

    def describe(self) -> str:
        """One line for the run log and the stats: which kernels, and why."""
        if self.switched_at is not None:
            return f"compiled from step {self.switched_at}"
        if self.eager_reason is not None:
            return f"eager ({self.eager_reason})"
        if self._started and _PROCESS.error is not None:
            return f"eager (torch.compile failed: {_PROCESS.error})"
        if self.mode == "off":
            return "eager (training.compile off)"
        if self._started:
            return "compiled" if _PROCESS.kernels is not None else "eager (compiling)"
        return f"eager (compiled after {self.after_steps} steps)"
