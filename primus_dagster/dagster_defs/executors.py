"""How a run executes its steps, by deployment: ``deployment_executor``.

Chosen by ``$PRIMUS_DEPLOYMENT`` (or the argument):

* ``local`` (the default): Dagster's ``multi_or_in_process_executor`` set to ``in_process`` -- a run's steps
  one after another in its run worker, which is already a process of its own; the training step's data
  executors and trainers are processes of the executor pool either way. A step process costs more than the
  steps of this location (importing Dagster, torch and pyarrow again: docs/automation.md, "Measured reasons in the code") and a run
  rarely has two steps to overlap (a source job's three file sources do: they run one after another). A run
  still stops on Terminate (its step is interrupted, its pool's processes stopped); what it gives up is a
  step's isolation: a step that crashes its process (a segfault, the kernel's OOM killer) takes the run
  worker with it. Run config brings step processes back for one run: ``execution: config: multiprocess:
  {max_concurrent: 2}``.
* ``kubernetes``: dagster-k8s's ``k8s_job_executor`` (each step a Kubernetes Job, owner-referenced to its
  run's pod; docs/kubernetes.md).

Example::

    defs = build_definitions(job, executor=deployment_executor())          # $PRIMUS_DEPLOYMENT, else local
    defs = build_definitions(job, executor=deployment_executor("kubernetes"))
"""

import os
from typing import Any

from dagster import ExecutorDefinition, Field, Permissive, Selector, multi_or_in_process_executor
from dagster_k8s import k8s_job_executor

#: The deployments :func:`deployment_executor` knows.
DEPLOYMENTS = ("local", "kubernetes")

#: ``execution: config:`` of a local run: ``in_process`` unless the run asks for ``multiprocess`` (Dagster
#: validates either against its own executor's schema).
LOCAL_EXECUTION = Field(
    Selector(
        {"in_process": Field(Permissive(), default_value={}), "multiprocess": Field(Permissive(), default_value={})}
    ),
    default_value={"in_process": {}},
    description="in_process (the default: every step in the run worker) or multiprocess (a process per step)",
)


def _owner_references_on(config: dict[str, Any] | None) -> dict[str, Any]:
    # Step Jobs owned by the run's pod: deleting the run's Job removes its steps (and their executor pods).
    return {"enable_owner_references": True, **(config or {})}


def _as_given(config: dict[str, Any]) -> dict[str, Any]:
    return config


def deployment_executor(deployment: str | None = None) -> ExecutorDefinition:
    """The executor of ``deployment`` (default ``$PRIMUS_DEPLOYMENT``, else ``local``): for ``local``, Dagster's
    ``multi_or_in_process_executor`` defaulting to ``in_process`` (module docstring); for ``kubernetes``,
    ``k8s_job_executor`` with owner references. Run config still reaches either (``execution: config:
    {max_concurrent: 4}`` for the k8s executor, ``{multiprocess: {}}`` for the local one)."""
    deployment = deployment or os.environ.get("PRIMUS_DEPLOYMENT") or "local"
    if deployment == "kubernetes":
        return k8s_job_executor.configured(_owner_references_on)
    if deployment == "local":
        return multi_or_in_process_executor.configured(_as_given, config_schema=LOCAL_EXECUTION)
    raise ValueError(f"PRIMUS_DEPLOYMENT={deployment!r}: expected one of {', '.join(DEPLOYMENTS)}")
