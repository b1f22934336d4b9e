"""Reference code location: the resources, on embedded defaults unless the environment says otherwise.

``storage``: data root ``$PRIMUS_DATA_ROOT`` (else ``$PRIMUS_HOME/data``) with its nested ``kafka``:
``$PRIMUS_KAFKA_BOOTSTRAP_SERVERS``, else the embedded broker started by ``primus-dagster-dev broker
--detach``; ``mlflow``: ``$MLFLOW_TRACKING_URI``, else the spec's, else SQLite under ``$PRIMUS_HOME``;
``executor_pool``: local processes. Variables that are set go in as ``EnvVar``.

``EXECUTOR``: how a run executes its steps, chosen by ``$PRIMUS_DEPLOYMENT``: ``local`` (the default:
Dagster's multiprocess executor) or ``kubernetes`` (dagster-k8s's ``k8s_job_executor``: each step a
Kubernetes Job, owner-referenced to its run's pod; docs/kubernetes.md).

Example::

    RESOURCES = {**default_resources(), "executor_pool": ExecutorPoolResource(data_executors=4)}
"""

import os
from typing import Any

from dagster import ExecutorDefinition
from dagster_k8s import k8s_job_executor

from primus_dagster.dagster_defs import default_resources

RESOURCES = default_resources()


def _owner_references_on(config: dict[str, Any] | None) -> dict[str, Any]:
    # Step Jobs owned by the run's pod: deleting the run's Job removes its steps (and their executor pods).
    return {"enable_owner_references": True, **(config or {})}


def deployment_executor(deployment: str | None = None) -> ExecutorDefinition | None:
    """The executor of ``deployment`` (default ``$PRIMUS_DEPLOYMENT``, else ``local``); None: Dagster's default.
    Run config still reaches the k8s executor (``execution: config: {max_concurrent: 4}``)."""
    deployment = deployment or os.environ.get("PRIMUS_DEPLOYMENT") or "local"
    if deployment == "kubernetes":
        return k8s_job_executor.configured(_owner_references_on)
    if deployment == "local":
        return None
    raise ValueError(f"PRIMUS_DEPLOYMENT={deployment!r}: expected 'local' or 'kubernetes'")


EXECUTOR = deployment_executor()
