"""Which :class:`~primus_dagster.training.distributed.RankLauncher` starts a rank group's ranks, by
``pools.backend``: :func:`rank_launcher`.

* ``local`` / ``in_trainer`` -- None: the group's default, ranks ``spawn``-ed as children of the job
  process;
* ``kubernetes`` -- every rank a pod (:class:`~primus_dagster.cluster.kubernetes.trainers.TrainerPods`:
  ``pools.image``, ``pools.training`` resources, owned by this process's pod, with the deployment's env
  sources and data volume) that dials back to a
  :class:`~primus_dagster.training.distributed.DialBackLauncher` listening here on every address; the
  ranks dial this pod's address (``$PRIMUS_DRIVER_HOST``, as the data executors reach the driver), the
  channel key is fresh for the run and reaches the pods through a Secret.

The ranks write the run's checkpoints where the job process reads them (``$PRIMUS_HOME``): the pods need
it on a volume they share with the step's pod (the deployment's data volume, ``PRIMUS_HOME`` under it).

Example::

    launcher = rank_launcher(job, run_id=request.key())      # None for pools.backend local
    group = RankGroup(hooks, job.pools.training.replicas, launcher=launcher)
"""

from __future__ import annotations

import secrets
from typing import Any

from primus_dagster.spec import JobSpec
from primus_dagster.training.distributed import DialBackLauncher, RankLauncher


def rank_launcher(job: JobSpec, *, run_id: str, api: Any = None, **pods: Any) -> RankLauncher | None:
    """The launcher of ``job``'s rank groups (module docstring); ``run_id`` names and labels the pods;
    ``api``: a ``CoreV1Api`` (default: the in-cluster configuration, else the kubeconfig); ``pods``:
    further :class:`~primus_dagster.cluster.kubernetes.trainers.TrainerPods` settings (``master_port``,
    ``dial_timeout_s``, ``poll_s``)."""
    if job.pools.backend != "kubernetes":
        return None
    from primus_dagster.cluster.backends import driver_host
    from primus_dagster.cluster.kubernetes import load_core_api, pod_template_from_env, step_pod_owner
    from primus_dagster.cluster.kubernetes.trainers import TrainerPods

    api = api if api is not None else load_core_api()
    owner = step_pod_owner(api, job.pools.namespace)  # refuses a pools.namespace other than this pod's
    key = secrets.token_urlsafe(32)
    trainers = TrainerPods(job, run_id=run_id, key=key, api=api, owner=owner, **pods, **pod_template_from_env())
    return DialBackLauncher(
        trainers.start,
        authkey=key,
        host="0.0.0.0",
        advertise=driver_host(),
        rendezvous=trainers.rendezvous,
        release=trainers.release,
        dial_timeout_s=trainers.dial_timeout_s,
    )
