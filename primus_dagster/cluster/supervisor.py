"""Failover for an executor pool: restart policies, OOM memory bumps and the node blacklist.

:func:`restart_decision` is the pure rule (one finished executor -> restart it, fail the job, or
leave it); a :class:`Supervisor` applies it to a pool's statuses, once per finished attempt:

* ``restart: always`` restarts an executor whatever ended it (while the run is active),
  ``on_failure`` after a failure or an OOM kill, ``never`` never -- then a failure fails the job;
* an executor restarted ``max_restarts`` times fails the job at its next failure, with its last
  error;
* an OOM-killed executor restarts with its memory times ``oom_memory_factor``, up to
  ``max_memory`` (default four times the pool's memory);
* a node on which ``blacklist_after`` executor attempts failed gets no executor again (the pool
  places restarts and new executors elsewhere; a pool with every node blacklisted fails);
* an OOM kill that is the pool's own doing -- the attempt ran below the memory it started with
  because the pool's resize lowered it (``ExecutorStatus.resized_from``), or below the pool spec's
  ``memory`` (only scaling sizes an executor there) -- is not the node's or the executor's fault:
  it never counts toward the blacklist or ``max_restarts``, and the executor restarts (whatever the
  restart policy: the run must not end because scaling shrank it) with at least the memory it had
  before the resize and the spec's; one warning names the resize.

An executor the pool stopped on purpose (``stopped``: scale-in, the end of the run) is left alone.

Example::

    supervisor = Supervisor(pool, job.pools.data)
    while running:
        supervisor.check()          # raises ExecutorFailedError when the job must fail
        time.sleep(0.5)
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from primus_dagster.cluster.pool import ExecutorPool, ExecutorState, ExecutorStatus, Resources, memory_bytes
from primus_dagster.spec import PoolSpec

log = logging.getLogger(__name__)

_FAILED = ("failed", "oom_killed")


class ExecutorFailedError(RuntimeError):
    """An executor failed and its restart policy does not (or no longer) restart it."""

    def __init__(self, executor_id: str, message: str):
        super().__init__(message)
        self.executor_id = executor_id


@dataclass(frozen=True)
class RestartDecision:
    """What to do with one finished executor attempt, and why."""

    executor_id: str
    attempt: int
    state: ExecutorState  # how the attempt ended
    action: Literal["restart", "fail_job", "leave"]
    reason: str
    resources: Resources | None = None
    by_scaling: bool = False  # an OOM kill the pool's own sizing caused: blames neither node nor executor


def memory_cap(spec: PoolSpec) -> int:
    """``max_memory`` in bytes, default four times the pool's memory."""
    return memory_bytes(spec.max_memory) if spec.max_memory else 4 * memory_bytes(spec.memory)


def oom_by_scaling(status: ExecutorStatus, spec: PoolSpec) -> bool:
    """Whether an attempt's OOM kill is the pool's own doing (module docstring): it ran below the
    memory it started with (a lowering resize) or below the pool spec's ``memory``.

    >>> from primus_dagster.spec import PoolSpec
    >>> killed = ExecutorStatus("data-0", "data", "oom_killed", Resources(1, 256 << 20))
    >>> oom_by_scaling(killed, PoolSpec(memory="2Gi")), oom_by_scaling(killed, PoolSpec(memory="256Mi"))
    (True, False)
    """
    if status.state != "oom_killed":
        return False
    return status.shrunk_by_pool or status.resources.memory_bytes < memory_bytes(spec.memory)


def restart_decision(status: ExecutorStatus, spec: PoolSpec, restarts: int, *, run_active: bool) -> RestartDecision:
    """The rule of the module docstring for one finished attempt; ``restarts``: how often this
    executor was restarted before."""
    leave = RestartDecision(status.executor_id, status.attempt, status.state, "leave", f"{status.state}: nothing to do")
    if not status.finished or status.state == "stopped" or not run_active:
        return leave
    if oom_by_scaling(status, spec):
        before = status.resized_from.memory_bytes if status.resized_from is not None else 0
        memory = max(before, memory_bytes(spec.memory), status.resources.memory_bytes)
        shrunk = (
            f"after the pool's resize from {before >> 20} MiB" if before else "(sized below pools.memory by scaling)"
        )
        reason = (
            f"{status.executor_id} OOM-killed at {status.resources.memory_bytes >> 20} MiB {shrunk}: restarted with "
            f"{memory >> 20} MiB; the resize's doing, not counted against node {status.node or '?'} or max_restarts"
        )
        resources = Resources(status.resources.cpu, memory)
        return RestartDecision(
            status.executor_id, status.attempt, status.state, "restart", reason, resources, by_scaling=True
        )
    failed = status.state in _FAILED
    if not failed and spec.restart != "always":
        return leave
    error = status.last_error or f"{status.executor_id} {status.state} (exit code {status.exit_code})"
    if failed and spec.restart == "never":
        return RestartDecision(
            status.executor_id, status.attempt, status.state, "fail_job", f"restart policy never: {error}"
        )
    if restarts >= spec.max_restarts:
        return RestartDecision(
            status.executor_id,
            status.attempt,
            status.state,
            "fail_job",
            f"{status.executor_id} ended {restarts + 1} times (max_restarts {spec.max_restarts}): {error}",
        )
    resources = status.resources
    reason = f"restart policy {spec.restart}: {status.state}"
    if status.state == "oom_killed":
        grown = min(memory_cap(spec), int(resources.memory_bytes * spec.oom_memory_factor))
        reason += f"; memory {resources.memory_bytes >> 20} -> {grown >> 20} MiB"
        resources = Resources(resources.cpu, grown)
    return RestartDecision(status.executor_id, status.attempt, status.state, "restart", reason, resources)


class Supervisor:
    """Applies :func:`restart_decision` to ``pool`` (see the module docstring)."""

    def __init__(self, pool: ExecutorPool, spec: PoolSpec):
        self.pool = pool
        self.spec = spec
        self.restarts: Counter[str] = Counter()
        self.failures_by_node: Counter[str] = Counter()
        self.decisions: list[RestartDecision] = []
        #: OOM kills the pool's own sizing caused (:func:`oom_by_scaling`): restarted, blaming nothing.
        self.oom_kills_by_scaling: list[RestartDecision] = []
        self._handled: set[tuple[str, int]] = set()

    @property
    def blacklist(self) -> list[str]:
        """Nodes with ``blacklist_after`` or more failed attempts."""
        return sorted(n for n, count in self.failures_by_node.items() if count >= self.spec.blacklist_after)

    def check(self, *, run_active: bool = True) -> list[RestartDecision]:
        """Handle every attempt that finished since the last call; raises :class:`ExecutorFailedError`
        when one must fail the job (after the others were handled)."""
        taken: list[RestartDecision] = []
        failure: RestartDecision | None = None
        for status in self.pool.status():
            key = (status.executor_id, status.attempt)
            if not status.finished or key in self._handled:
                continue
            self._handled.add(key)
            decision = restart_decision(status, self.spec, self.restarts[status.executor_id], run_active=run_active)
            if status.state in _FAILED and status.node and not decision.by_scaling:
                self.failures_by_node[status.node] += 1
            if decision.action == "leave":
                continue
            taken.append(decision)
            log.warning("%s pool: %s %s (%s)", self.pool.role, decision.action, decision.executor_id, decision.reason)
            if decision.action == "fail_job":
                failure = failure or decision
                continue
            if decision.by_scaling:
                self.oom_kills_by_scaling.append(decision)
            else:
                self.restarts[status.executor_id] += 1
            self.pool.restart(status.executor_id, decision.resources, avoid_nodes=self.blacklist)
        self.decisions += taken
        if failure is not None:
            raise ExecutorFailedError(failure.executor_id, failure.reason)
        return taken
