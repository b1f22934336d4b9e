"""Executor pools: the contract every backend (local processes, Kubernetes pods) implements.

A pool runs the executors of one role -- ``data`` (data executors) or ``training`` (trainers) --
of one job run. It launches executors with a :class:`Resources` allocation, stops and resizes
them, and reports each one's :class:`ExecutorStatus`. Restart policies, the blacklist and the
scaling controller work on this contract only, so they are the same for every backend.

Example::

    pool = LocalPool(role="data", spec=job.pools.data, command=executor_command)
    ids = pool.launch(2)                                   # two executors, the spec's cpu/memory
    pool.resize(ids[0], Resources(cpu=2.0, memory_bytes=4 << 30))
    [s.state for s in pool.status()]                       # ["running", "running"]
    pool.cpu_seconds()                                     # 0.8: CPU its executors used (0.0: not measured)
    pool.close()                                           # nothing outlives the run
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

Role = Literal["data", "training"]
ExecutorState = Literal["starting", "running", "succeeded", "failed", "oom_killed", "stopped"]
#: States after which an executor runs no more (it may be restarted as a new attempt).
FINISHED_STATES: frozenset[str] = frozenset({"succeeded", "failed", "oom_killed", "stopped"})

_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)?$")
_BINARY = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def memory_bytes(quantity: str) -> int:
    """Bytes of a Kubernetes-style memory quantity (``512Mi``, ``2Gi``, ``1073741824``).

    >>> memory_bytes("2Gi"), memory_bytes("1.5Mi"), memory_bytes("4096")
    (2147483648, 1572864, 4096)
    """
    match = _QUANTITY.match(quantity)
    if match is None:
        raise ValueError(f"bad memory quantity {quantity!r}: expected a number with an optional Ki/Mi/Gi/Ti suffix")
    return int(float(match.group(1)) * _BINARY[match.group(2)])


def memory_quantity(n_bytes: int) -> str:
    """The largest whole binary unit for ``n_bytes`` (``Mi`` precision at least).

    >>> memory_quantity(2 << 30), memory_quantity(1536 << 20)
    ('2Gi', '1536Mi')
    """
    for unit, size in (("Gi", 1 << 30), ("Mi", 1 << 20)):
        if n_bytes % size == 0:
            return f"{n_bytes // size}{unit}"
    return f"{-(-n_bytes // (1 << 20))}Mi"


@dataclass(frozen=True)
class Resources:
    """What one executor is allocated: CPU cores and memory."""

    cpu: float
    memory_bytes: int

    def scaled(self, cpu: float = 1.0, memory: float = 1.0) -> Resources:
        return Resources(self.cpu * cpu, int(self.memory_bytes * memory))


def lowered_from(before: Resources | None, old: Resources, new: Resources) -> Resources | None:
    """An executor's ``resized_from`` after its pool resizes it from ``old`` to ``new``: the largest
    allocation a memory-lowering resize came from, while its memory stays below it (None once back up).

    >>> gib = 1 << 30
    >>> lowered_from(None, Resources(1, 2 * gib), Resources(1, gib)).memory_bytes >> 30
    2
    >>> lowered_from(Resources(1, 2 * gib), Resources(1, gib), Resources(1, 2 * gib)) is None
    True
    """
    if new.memory_bytes < old.memory_bytes:
        return old if before is None or old.memory_bytes > before.memory_bytes else before
    if before is not None and new.memory_bytes >= before.memory_bytes:
        return None
    return before


@dataclass
class ExecutorStatus:
    """One executor as its pool sees it. ``attempt`` counts restarts of the same executor id;
    ``node`` is where it runs (the host for local processes, the Kubernetes node); ``rss_peak_bytes``:
    the current attempt's peak RSS where the backend measures it (the local pool: the kernel's
    high-water mark), else 0; ``resized_from``: the attempt's allocation before the pool's own resize
    lowered its memory (None: never lowered) -- an OOM kill below it is the pool's doing, not the
    node's or the executor's (:func:`~primus_dagster.cluster.supervisor.restart_decision`)."""

    executor_id: str
    role: Role
    state: ExecutorState
    resources: Resources
    attempt: int = 0
    node: str = ""
    address: str = ""
    exit_code: int | None = None
    last_error: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    rss_peak_bytes: int = 0
    resized_from: Resources | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def shrunk_by_pool(self) -> bool:
        """The pool's own resize lowered this attempt's memory below what it started with."""
        return self.resized_from is not None and self.resized_from.memory_bytes > self.resources.memory_bytes


class PoolError(RuntimeError):
    """A pool cannot do what was asked (no capacity, a backend error, an executor out of restarts)."""


class ResizeNotApplied(PoolError):
    """A resize the pool would not apply in place because it would kill the running executor (a memory
    limit below what the attempt already used); the executor keeps its allocation. Not a failure of
    the run: the applier logs it and goes on."""


class ExecutorPool(Protocol):
    """What every backend implements (see the module docstring)."""

    role: Role

    def launch(self, count: int, resources: Resources | None = None, *, avoid_nodes: Sequence[str] = ()) -> list[str]:
        """Start ``count`` new executors (default resources: the pool spec's), on no node of
        ``avoid_nodes`` (the supervisor's blacklist); their ids."""
        ...

    def stop(self, executor_id: str) -> None:
        """Stop one executor (gracefully, then forcibly); its state becomes ``stopped``."""
        ...

    def restart(self, executor_id: str, resources: Resources | None = None, *, avoid_nodes: Sequence[str] = ()) -> None:
        """Start a finished executor again under the same id (a new attempt), optionally resized,
        on no node of ``avoid_nodes``."""
        ...

    def resize(self, executor_id: str, resources: Resources) -> None:
        """Give a running executor new resources: in place where the backend can, else by
        replacing it (a restart under the same id). A memory limit below what the running attempt
        already used is not applied in place (:class:`ResizeNotApplied`): it would kill it."""
        ...

    def status(self) -> list[ExecutorStatus]:
        """Every executor launched and not removed, in launch order."""
        ...

    def cpu_seconds(self, include_startup: bool = True) -> float:
        """CPU seconds (user + system) every attempt of every executor used so far, or 0.0 where the
        backend does not measure them; without ``include_startup``, only what each attempt used after
        it was ready (its start-up -- interpreter, imports -- left out)."""
        ...

    def close(self) -> None:
        """Stop every executor and release everything the pool created (idempotent)."""
        ...
