"""What an executor pod's status means for its pool: a pure mapping of a ``V1Pod`` to an executor state.

The executor container's state decides, else the pod's phase:

* terminated with reason ``OOMKilled`` -> ``oom_killed``; exit code 0 -> ``succeeded``; any other
  exit -> ``failed`` with ``exit code N (reason): <termination message>`` (the pods log their last
  lines there on error);
* waiting -> ``starting`` with the waiting reason as ``message`` (``ImagePullBackOff`` may still
  resolve), except reasons that never resolve by themselves (``InvalidImageName``, ...) -> ``failed``;
* running -> ``running``; a resize the node cannot fit (``PodResizePending``/``Infeasible``) is
  reported in ``message``;
* a failed pod with a reason of its own (``Evicted``, ``DeadlineExceeded``) -> ``failed`` with it,
  but an eviction for memory pressure -> ``oom_killed`` (more memory is the cure there too);
* no container status: phase ``Pending`` -> ``starting`` (an ``Unschedulable`` reason in
  ``message``), ``Running`` -> ``running``, ``Succeeded`` -> ``succeeded``, ``Failed`` -> ``failed``,
  ``Unknown`` (node unreachable) -> ``running`` with a message;
* a pod being deleted that the pool did not stop -> ``failed`` (drained or preempted node).

Example::

    outcome = pod_outcome(api.read_namespaced_pod(name, namespace))
    outcome.state, outcome.exit_code, outcome.message      # ("oom_killed", 137, "OOMKilled (exit code 137)")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from primus_dagster.cluster.kubernetes.manifests import CONTAINER_NAME
from primus_dagster.cluster.pool import ExecutorState

#: Waiting reasons after which the container will never start without a change to the pod.
FATAL_WAITING = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerError", "RunContainerError"})


@dataclass(frozen=True)
class PodOutcome:
    """One pod as an executor state, with what explains it."""

    state: ExecutorState
    exit_code: int | None = None
    message: str | None = None
    node: str = ""
    ip: str = ""


def _container_status(pod: Any, container: str) -> Any:
    statuses = (pod.status.container_statuses if pod.status else None) or []
    return next((s for s in statuses if s.name == container), statuses[0] if statuses else None)


def _terminated(term: Any) -> tuple[ExecutorState, int | None, str | None]:
    code = term.exit_code
    reason = term.reason or "Error"
    if reason == "OOMKilled":
        return "oom_killed", code, f"OOMKilled (exit code {code})"
    if code == 0:
        return "succeeded", 0, None
    detail = (term.message or "").strip()
    return "failed", code, f"exit code {code} ({reason})" + (f": {detail}" if detail else "")


def _resize_problem(pod: Any) -> str | None:
    for cond in (pod.status.conditions if pod.status else None) or []:
        if cond.type == "PodResizePending" and cond.reason == "Infeasible":
            return f"resize infeasible: {cond.message or 'the node cannot fit it'}"
    if getattr(pod.status, "resize", None) == "Infeasible":  # clusters before 1.33
        return "resize infeasible: the node cannot fit it"
    return None


def _unschedulable(pod: Any) -> str | None:
    for cond in (pod.status.conditions if pod.status else None) or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason:
            return f"{cond.reason}: {cond.message}" if cond.message else cond.reason
    return None


def pod_outcome(pod: Any, container: str = CONTAINER_NAME) -> PodOutcome:
    """The state of the executor running in ``pod`` (a ``V1Pod``); see the module docstring."""
    status = pod.status
    node = (pod.spec.node_name if pod.spec else None) or ""
    ip = (status.pod_ip if status else None) or ""
    phase = (status.phase if status else None) or "Pending"
    cs = _container_status(pod, container)
    state: ExecutorState
    code: int | None = None
    message: str | None = None
    if phase == "Failed" and status.reason:  # the pod's own reason (Evicted, DeadlineExceeded) says more
        detail = status.message or ""
        memory = status.reason == "Evicted" and "memory" in detail.lower()
        state = "oom_killed" if memory else "failed"
        message = f"pod {status.reason}" + (f": {detail}" if detail else "")
    elif cs is not None and cs.state is not None and cs.state.terminated is not None:
        state, code, message = _terminated(cs.state.terminated)
    elif phase == "Failed":
        state, message = "failed", "pod Failed"
    elif phase == "Succeeded":
        state, code = "succeeded", 0
    elif cs is not None and cs.state is not None and cs.state.waiting is not None:
        waiting = cs.state.waiting
        state = "failed" if waiting.reason in FATAL_WAITING else "starting"
        message = f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
    elif phase == "Running" or (cs is not None and cs.state is not None and cs.state.running is not None):
        state, message = "running", _resize_problem(pod)
    elif phase == "Unknown":
        state, message = "running", "pod phase Unknown: its node stopped reporting"
    else:
        state, message = "starting", _unschedulable(pod)
    deleting = pod.metadata is not None and pod.metadata.deletion_timestamp is not None
    if deleting and state in ("starting", "running"):
        state, message = "failed", "pod deleted by the cluster (node drained, preempted or evicted)"
    return PodOutcome(state, code, message, node, ip)
