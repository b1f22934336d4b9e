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

:func:`pod_template_from_env` gives the executor pods what the deployment's run pods get from their
environment (``deploy/kubernetes/config.yaml``): the same ``envFrom`` ConfigMap and Secret (data root,
object-store credentials) and the data volume mounted at the data root.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kubernetes.client import (
    CoreV1Api,
    V1OwnerReference,
    V1PersistentVolumeClaimVolumeSource,
    V1Volume,
    V1VolumeMount,
)

from primus_dagster.cluster.kubernetes.backend import KubernetesPool
from primus_dagster.cluster.pool import ExecutorPool

if TYPE_CHECKING:
    from primus_dagster.cluster.pooled_plane import PooledDataPlane

#: ConfigMap of the suite's settings, ``envFrom`` in run, step and executor pods.
ENV_CONFIG_MAP = "PRIMUS_ENV_CONFIG_MAP"
#: Secret of the suite's secret settings (object-store credentials), ``envFrom`` likewise.
ENV_SECRET = "PRIMUS_ENV_SECRET"
#: PersistentVolumeClaim holding the data root, mounted at ``$PRIMUS_DATA_ROOT``.
ENV_DATA_PVC = "PRIMUS_DATA_PVC"
ENV_DATA_ROOT = "PRIMUS_DATA_ROOT"
#: Run the executor containers as this non-root user (the image's ``primus``, 10001).
ENV_RUN_AS_USER = "PRIMUS_POD_RUN_AS_USER"
DATA_VOLUME = "primus-data"


def pod_template_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """:class:`~.manifests.ContainerTemplate` fields for the executor pods, from the step pod's
    environment (default ``os.environ``): ``$PRIMUS_ENV_CONFIG_MAP`` / ``$PRIMUS_ENV_SECRET`` as
    ``envFrom``, the claim ``$PRIMUS_DATA_PVC`` mounted at ``$PRIMUS_DATA_ROOT`` (both or neither),
    ``$PRIMUS_POD_RUN_AS_USER`` as the user. Unset variables add nothing.

    Example::

        pod_template_from_env({"PRIMUS_ENV_CONFIG_MAP": "primus-env", "PRIMUS_DATA_PVC": "primus-data",
                               "PRIMUS_DATA_ROOT": "/data"})
        # {'env_from_config_maps': ('primus-env',), 'volumes': (V1Volume(...),), 'volume_mounts': (...)}
    """
    env = os.environ if environ is None else environ
    template: dict[str, Any] = {}
    if env.get(ENV_CONFIG_MAP):
        template["env_from_config_maps"] = (env[ENV_CONFIG_MAP],)
    if env.get(ENV_SECRET):
        template["env_from_secrets"] = (env[ENV_SECRET],)
    claim, root = env.get(ENV_DATA_PVC), env.get(ENV_DATA_ROOT)
    if claim:
        if not root or not root.startswith("/"):
            raise ValueError(f"{ENV_DATA_PVC}={claim!r} needs {ENV_DATA_ROOT}, an absolute path to mount it at")
        source = V1PersistentVolumeClaimVolumeSource(claim_name=claim)
        template["volumes"] = (V1Volume(name=DATA_VOLUME, persistent_volume_claim=source),)
        template["volume_mounts"] = (V1VolumeMount(name=DATA_VOLUME, mount_path=root),)
    if env.get(ENV_RUN_AS_USER):
        template["run_as_user"] = int(env[ENV_RUN_AS_USER])
    return template


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
            fields=plane.fields,
            token=plane.token,
            owner=owner,
            api=api,
            **template,
        )

    return make
