"""The Kubernetes pool as the data pool of a ``PooledDataPlane`` (its ``pool_factory`` hook).

The plane serves the data driver and supervises its pool; with this factory its data executors are
pods of the job's ``pools.image`` in ``pools.namespace``, reading the spec at ``job_spec_path`` inside
the pod. They must reach the driver: ``driver`` is an address routable from the pods (the step pod's
IP and the driver's port), needed when the plane's own location is a loopback address.

Example::

    factory = kubernetes_pool_factory(context.run_id, job_spec_path="/app/examples/job.yaml",
                                      driver=f"grpc://{socket.gethostbyname(socket.gethostname())}:7000",
                                      owner=owner)
    with PooledDataPlane("job.yaml", "/data", tasks, token=token, pool_factory=factory) as plane:
        ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubernetes.client import CoreV1Api, V1OwnerReference

from primus_dagster.cluster.kubernetes.backend import KubernetesPool
from primus_dagster.cluster.pool import ExecutorPool

if TYPE_CHECKING:
    from primus_dagster.cluster.pooled_plane import PooledDataPlane


def kubernetes_pool_factory(
    run_id: str,
    *,
    job_spec_path: str | None = None,
    driver: str | None = None,
    owner: V1OwnerReference | None = None,
    api: CoreV1Api | None = None,
    **template: Any,
) -> Callable[[PooledDataPlane], ExecutorPool]:
    """A ``pool_factory`` making the plane's data pool a :class:`KubernetesPool` for run ``run_id``
    (``job_spec_path`` default: the plane's spec path, ``driver`` default: the plane's location)."""

    def make(plane: PooledDataPlane) -> ExecutorPool:
        return KubernetesPool.for_job(
            plane.job,
            "data",
            run_id=run_id,
            driver=driver or plane.location,
            job_spec_path=job_spec_path or plane.job_path,
            data_root=plane.data_root,
            kafka_bootstrap=plane.kafka_bootstrap,
            trainers=plane.trainers,
            token=plane.token,
            owner=owner,
            api=api,
            **template,
        )

    return make
