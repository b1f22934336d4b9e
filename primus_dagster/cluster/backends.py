"""Which pool runs a job's data executors: ``pools.backend`` turned into a ``PooledDataPlane`` setup
(with the job's ``scaling`` policies as a :class:`~.autoscaler.DataPoolAutoscaler` unless both
strategies are disabled).

* ``local`` -- :class:`~primus_dagster.cluster.local.LocalPool` processes; the driver listens on
  loopback;
* ``in_trainer`` -- no pool: :func:`data_plane_starter` starts an
  :class:`~primus_dagster.data.InTrainerDataPlane`, whose executors are threads of the trainer's
  process; there is nothing for :func:`data_plane_setup` to set up;
* ``kubernetes`` -- :class:`~primus_dagster.cluster.kubernetes.KubernetesPool` pods of
  ``pools.image`` in ``pools.namespace``, owned by this process's pod when it runs in one
  (``$HOSTNAME``; ``pools.namespace`` must then be that pod's: ``step_pod_owner``), with the
  deployment's ``envFrom`` sources and data volume (``pod_template_from_env``); the driver listens
  on this pod's address (``$PRIMUS_DRIVER_HOST``, default the address ``$HOSTNAME`` resolves to) so
  the executor pods reach it.

Example::

    setup = data_plane_setup(job, run_id=context.run_id)
    with PooledDataPlane("job.yaml", "/data", tasks, token=token, **setup) as plane:
        ...
"""

from __future__ import annotations

import functools
import os
import socket
from typing import Any

from primus_dagster.cluster.autoscaler import DataPoolAutoscaler
from primus_dagster.cluster.pooled_plane import PooledDataPlane, local_data_pool
from primus_dagster.data import DataPlaneStarter, InTrainerDataPlane
from primus_dagster.spec import JobSpec

DRIVER_HOST_ENV = "PRIMUS_DRIVER_HOST"


def driver_host() -> str:
    """The address pods reach this process at (the data driver, the trainer ranks' channel):
    ``$PRIMUS_DRIVER_HOST``, else the address this host's name resolves to (a pod's IP)."""
    return os.environ.get(DRIVER_HOST_ENV) or socket.gethostbyname(socket.gethostname())


def data_plane_setup(job: JobSpec, *, run_id: str) -> dict[str, Any]:
    """The ``pool_factory`` and ``driver_host`` keyword arguments of a ``PooledDataPlane`` for
    ``job``'s backend (``run_id`` names and labels the Kubernetes objects of the run)."""
    if job.pools.backend == "in_trainer":
        raise ValueError(f"job {job.name}: pools.backend in_trainer runs no executor pool (see data_plane_starter)")
    scaling = job.scaling
    controller = DataPoolAutoscaler(job) if scaling.horizontal.enabled or scaling.vertical.enabled else None
    if job.pools.backend == "local":
        return {"pool_factory": local_data_pool, "driver_host": "127.0.0.1", "controller": controller}
    from primus_dagster.cluster.kubernetes import load_core_api, pod_template_from_env, step_pod_owner
    from primus_dagster.cluster.kubernetes.plane import kubernetes_pool_factory

    api = load_core_api()
    owner = step_pod_owner(api, job.pools.namespace)  # refuses a pools.namespace other than this pod's
    return {
        "pool_factory": kubernetes_pool_factory(run_id, owner=owner, api=api, **pod_template_from_env()),
        "driver_host": driver_host(),
        "controller": controller,
    }


def data_plane_starter(job: JobSpec, *, run_id: str) -> DataPlaneStarter:
    """What starts ``job``'s data plane for a run (a :class:`~primus_dagster.data.DataPlaneStarter`):
    a :class:`PooledDataPlane` on the pool of its ``pools.backend``, or for ``in_trainer`` an
    :class:`~primus_dagster.data.InTrainerDataPlane` (its executors in this process).

    Example::

        start = data_plane_starter(job, run_id=context.run_id)
        with start("job.yaml", "/data", driver=driver, executors=2, trainers=1, token=token) as plane:
            ...
    """
    if job.pools.backend == "in_trainer":
        return InTrainerDataPlane
    return functools.partial(PooledDataPlane, **data_plane_setup(job, run_id=run_id))
