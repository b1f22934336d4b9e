"""The Kubernetes backend of the executor pools: pods for data executors and trainers.

* :mod:`.manifests` -- pure builders of the ``kubernetes.client`` objects (pods, the headless
  Service, the token Secret), names, labels, resources;
* :mod:`.pod_status` -- a pod's status as an executor state (``OOMKilled`` -> ``oom_killed``, ...);
* :mod:`.backend` -- :class:`KubernetesPool`, the :class:`~primus_dagster.cluster.pool.ExecutorPool`
  that applies them through ``CoreV1Api``;
* :mod:`.plane` -- :func:`kubernetes_pool_factory`, the pool as a ``PooledDataPlane``'s data pool;
  :func:`pod_template_from_env`, the deployment's env sources and data volume for the executor pods;
* :mod:`.trainers` -- :class:`TrainerPods`: the ranks of a trainer group as pods that dial back to the
  step (``pools.training.replicas > 1``).

Deployment, RBAC and what is tested where: ``docs/kubernetes.md``.

Example::

    from primus_dagster.cluster.kubernetes import KubernetesPool
    with KubernetesPool.for_job(job, "data", run_id=run_id, driver=driver_url, job_spec_path="/app/job.yaml") as pool:
        pool.wait_for(pool.launch(job.pools.data.replicas))
"""

from primus_dagster.cluster.kubernetes.backend import (
    KubernetesPool,
    api_reason,
    default_namespace,
    in_cluster_namespace,
    load_core_api,
    pod_owner,
    step_pod_owner,
)
from primus_dagster.cluster.kubernetes.manifests import (
    CONTAINER_NAME,
    FLIGHT_PORT,
    FLIGHT_PORT_NAME,
    ContainerTemplate,
    DataExecutorArgs,
    PoolRef,
    RankRendezvous,
    SecretRef,
    data_executor_container,
    dns_name,
    executor_pod,
    executor_service,
    label_value,
    owner_reference,
    token_secret,
    trainer_container,
    trainer_rank_container,
    trainer_rank_pod,
)
from primus_dagster.cluster.kubernetes.plane import kubernetes_pool_factory, pod_template_from_env
from primus_dagster.cluster.kubernetes.pod_status import PodOutcome, pod_outcome
from primus_dagster.cluster.kubernetes.trainers import PodRank, TrainerPods

__all__ = [
    "CONTAINER_NAME",
    "FLIGHT_PORT",
    "FLIGHT_PORT_NAME",
    "ContainerTemplate",
    "DataExecutorArgs",
    "KubernetesPool",
    "PodOutcome",
    "PodRank",
    "PoolRef",
    "RankRendezvous",
    "SecretRef",
    "TrainerPods",
    "api_reason",
    "data_executor_container",
    "default_namespace",
    "dns_name",
    "executor_pod",
    "executor_service",
    "in_cluster_namespace",
    "kubernetes_pool_factory",
    "label_value",
    "load_core_api",
    "owner_reference",
    "pod_outcome",
    "pod_owner",
    "pod_template_from_env",
    "step_pod_owner",
    "token_secret",
    "trainer_container",
    "trainer_rank_container",
    "trainer_rank_pod",
]
