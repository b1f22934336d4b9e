"""A pod's status as an executor state: OOM kills, exits, waiting reasons, evictions, scheduling, resizes."""

from __future__ import annotations

from typing import Any

import pytest
from fake_core_v1 import from_json

from primus_dagster.cluster.kubernetes import pod_outcome


def pod(phase: str, state: dict[str, Any] | None = None, **status: Any) -> Any:
    data: dict[str, Any] = {
        "metadata": {"name": "p", "labels": {}},
        "spec": {"containers": [{"name": "executor", "image": "i"}], "nodeName": "node-a"},
        "status": {"phase": phase, "podIP": "10.0.0.7", **status},
    }
    if state is not None:
        data["status"]["containerStatuses"] = [
            {"name": "executor", "image": "i", "imageID": "", "ready": False, "restartCount": 0, "state": state}
        ]
    return from_json(data, "V1Pod")


def terminated(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "message": message}}


@pytest.mark.parametrize(
    "the_pod,state,code,message",
    [
        (pod("Failed", terminated(137, "OOMKilled")), "oom_killed", 137, "OOMKilled (exit code 137)"),
        (pod("Succeeded", terminated(0, "Completed")), "succeeded", 0, None),
        (pod("Failed", terminated(3, "Error", "boom\n")), "failed", 3, "exit code 3 (Error): boom"),
        (pod("Failed", terminated(1, "Error")), "failed", 1, "exit code 1 (Error)"),
        # restartPolicy Never: the container's termination decides even before the phase follows
        (pod("Running", terminated(137, "OOMKilled")), "oom_killed", 137, "OOMKilled (exit code 137)"),
        (pod("Running", {"running": {}}), "running", None, None),
        (pod("Pending", {"waiting": {"reason": "ContainerCreating"}}), "starting", None, "ContainerCreating"),
        (
            pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "back-off pulling"}}),
            "starting",
            None,
            "ImagePullBackOff: back-off pulling",
        ),
        (pod("Pending", {"waiting": {"reason": "InvalidImageName"}}), "failed", None, "InvalidImageName"),
        (
            pod(
                "Failed",
                terminated(137, "Error"),
                reason="Evicted",
                message="The node was low on resource: memory. Container executor was using 3Gi, request is 2Gi.",
            ),
            "oom_killed",
            None,
            "pod Evicted: The node was low on resource: memory. Container executor was using 3Gi, request is 2Gi.",
        ),
        (
            pod("Failed", reason="Evicted", message="The node was low on resource: ephemeral-storage."),
            "failed",
            None,
            "pod Evicted: The node was low on resource: ephemeral-storage.",
        ),
        (pod("Failed"), "failed", None, "pod Failed"),
        (pod("Unknown"), "running", None, "pod phase Unknown: its node stopped reporting"),
        (
            pod(
                "Pending",
                conditions=[
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
                ],
            ),
            "starting",
            None,
            "Unschedulable: 0/3 nodes",
        ),
        (
            pod(
                "Running",
                {"running": {}},
                conditions=[
                    {
                        "type": "PodResizePending",
                        "status": "True",
                        "reason": "Infeasible",
                        "message": "Node didn't have enough capacity",
                    }
                ],
            ),
            "running",
            None,
            "resize infeasible: Node didn't have enough capacity",
        ),
    ],
)
def test_pod_outcome(the_pod: Any, state: str, code: int | None, message: str | None) -> None:
    outcome = pod_outcome(the_pod)
    assert (outcome.state, outcome.exit_code, outcome.message) == (state, code, message)
    assert outcome.node == "node-a" and outcome.ip == "10.0.0.7"


def test_a_pod_deleted_by_the_cluster_is_failed() -> None:
    the_pod = pod("Running", {"running": {}})
    the_pod.metadata.deletion_timestamp = "2026-11-01T00:00:00Z"
    outcome = pod_outcome(the_pod)
    assert outcome.state == "failed" and "deleted by the cluster" in (outcome.message or "")


def test_a_pod_without_status_is_starting() -> None:
    bare = from_json({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "executor", "image": "i"}]}}, "V1Pod")
    assert pod_outcome(bare).state == "starting"
