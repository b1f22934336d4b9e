"""Trainer ranks as pods: what starts the ranks of a trainer group on Kubernetes.

With ``pools.backend: kubernetes`` and ``pools.training.replicas: N > 1`` the ranks of each start of the
group (a phase, a restart) are N pods of a :class:`~.backend.KubernetesPool` of the ``training`` role:
image ``pools.image``, resources ``pools.training`` (requests = limits), owned by the step's pod,
``restartPolicy: Never`` (a failed group is started again by the trainer's restart policy, as new pods),
on the run's headless training Service. Each runs the dial-back rank
(:func:`~.manifests.trainer_rank_container`) and reaches the step's rank channel; rank 0's stable name
``<prefix>-0.<service>.<namespace>.svc`` is the rendezvous. Every start gets pods of its own
(``<prefix>`` is new each time: a name never points at the terminating pod of a start before) and its own
channel-key Secret; :meth:`TrainerPods.release` deletes them, the Service and the Secret.

:class:`TrainerPods` gives a dial-back launcher its three hooks: :meth:`~TrainerPods.rendezvous` (each
rank's torchrun variables, for a new start), :meth:`~TrainerPods.start` (the pod of one rank, as a
:class:`PodRank` handle) and :meth:`~TrainerPods.release`. A :class:`PodRank` has no pid here (its memory
limit is the kubelet's to enforce); its exit code is read from its pod's status (one ``list`` call for the
group at most every ``poll_s``): the container's exit code, ``-15`` / ``-9`` once the launcher terminated
or killed it and the pod is gone, ``-9`` for a pod the cluster removed or evicted, ``1`` for one that failed
without running (an image that cannot be pulled).

Example::

    pods = TrainerPods(job, run_id=run_id, key=key, api=load_core_api(), owner=owner)
    launcher = DialBackLauncher(pods.start, authkey=key, host="0.0.0.0", advertise=driver_host(),
                                rendezvous=pods.rendezvous, release=pods.release)
"""

from __future__ import annotations

import logging
import secrets
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes.client import ApiException, CoreV1Api, V1OwnerReference

from primus_dagster.cluster.kubernetes.backend import KubernetesPool, default_namespace, load_core_api
from primus_dagster.cluster.kubernetes.manifests import (
    ENV_RANK_CHANNEL,
    ENV_RANK_CHANNEL_KEY,
    LABEL_EXECUTOR,
    RENDEZVOUS_PORT,
    PoolRef,
    RankRendezvous,
    label_value,
    rank_executor_id,
    rank_master_addr,
    trainer_rank_container,
)
from primus_dagster.cluster.kubernetes.pod_status import pod_outcome
from primus_dagster.cluster.pool import PoolError
from primus_dagster.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass
class _Start:
    """One start of the group: its pod name prefix, its rendezvous, its pool (made by rank 0's start)."""

    prefix: str
    world_size: int
    master_addr: str
    pool: KubernetesPool | None = None
    pods: dict[str, list[Any]] = field(default_factory=dict)  # executor label -> its pods, as last listed
    listed_at: float = float("-inf")


class PodRank:
    """The :class:`~primus_dagster.training.distributed.RankHandle` of one rank pod (module docstring).

    Example::

        rank = pods.start(1, environment)
        rank.exitcode                 # None while its pod runs; the container's exit code after
        rank.terminate(); rank.join(5)
    """

    pid = None

    def __init__(self, pods: TrainerPods, start: _Start, rank: int):
        self._pods, self._start, self.rank = pods, start, rank
        self.executor_id = rank_executor_id(start.prefix, rank)
        self._stopped_with: int | None = None  # -SIGTERM / -SIGKILL once we deleted the pod
        self._told = False

    @property
    def pool(self) -> KubernetesPool | None:
        """The pool of the group's start this rank belongs to."""
        return self._start.pool

    @property
    def exitcode(self) -> int | None:
        pods = self._pods.observe(self._start).get(label_value(self.executor_id), [])
        if self._stopped_with is not None:
            return None if pods else self._stopped_with  # gone: reaped
        if not pods:
            return -signal.SIGKILL  # removed by the cluster (a lost node, an eviction)
        outcome = pod_outcome(pods[-1])
        if outcome.state in ("starting", "running"):
            return None
        if outcome.state != "succeeded" and not self._told:
            self._told = True
            log.warning("trainer rank %d (pod %s): %s", self.rank, pods[-1].metadata.name, outcome.message)
        if outcome.exit_code is not None:
            return outcome.exit_code
        return -signal.SIGKILL if pods[-1].metadata.deletion_timestamp is not None else 1

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        """Delete the pod with the pool's grace period (SIGTERM, then SIGKILL)."""
        if self._stopped_with is None and self._start.pool is not None:
            self._start.pool.stop(self.executor_id)
            self._stopped_with = -signal.SIGTERM

    def kill(self) -> None:
        """Delete the pod at once (grace period 0)."""
        pool = self._start.pool
        if pool is None:
            return
        if self._stopped_with is None:
            pool.stop(self.executor_id, grace_s=0)
        else:  # terminated already: the pool deleted it once; delete it again without a grace period
            self._pods.delete_now(pool, self.executor_id)
        self._stopped_with = -signal.SIGKILL

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(max(0.01, self._pods.poll_s))


class TrainerPods:
    """Starts the ranks of a trainer group of ``job`` as pods (module docstring); ``key``: the rank
    channel's key (put in a Secret per start, never in a manifest); ``owner``: the step's pod (their
    garbage collection); ``master_port``: rank 0's rendezvous port; ``dial_timeout_s``: how long a rank pod
    may take to reach the channel (its scheduling and image pull included); ``poll_s``: the least time
    between two looks at the pods; ``template``: further :class:`~.manifests.ContainerTemplate` fields (the
    deployment's env sources and data volume: :func:`~.plane.pod_template_from_env`). The API server is
    ``api`` (default: loaded at the first start).

    Example::

        pods = TrainerPods(job, run_id="ctr/2026-11-01T00/2026-11-02T00", key=key, api=api)
        envs = pods.rendezvous(2)            # a new start: rank 0 at trainer-<hex>-0.<service>.<ns>.svc
        handles = [pods.start(r, {**envs[r], "PRIMUS_RANK_CHANNEL": "10.0.0.5:41234"}) for r in range(2)]
        ...
        pods.release()                       # the pods, the Service, the key's Secret
    """

    def __init__(
        self,
        job: JobSpec,
        *,
        run_id: str,
        key: str,
        api: CoreV1Api | None = None,
        owner: V1OwnerReference | None = None,
        master_port: int = RENDEZVOUS_PORT,
        dial_timeout_s: float = 300.0,
        poll_s: float = 1.0,
        **template: Any,
    ):
        if job.pools.backend != "kubernetes" or job.pools.image is None:
            raise PoolError(
                f"pools.backend is {job.pools.backend!r}: trainer pods need backend kubernetes and pools.image"
            )
        if not key:
            raise ValueError("trainer pods need the rank channel's key")
        self.job, self.run_id, self._key, self.owner = job, run_id, key, owner
        self.namespace = job.pools.namespace or default_namespace()
        self.ref = PoolRef(job=job.name, run_id=run_id, role="training", namespace=self.namespace)
        self.master_port, self.dial_timeout_s, self.poll_s = master_port, dial_timeout_s, poll_s
        self.template = template
        self._api = api
        self._start: _Start | None = None

    @property
    def api(self) -> CoreV1Api:
        if self._api is None:
            self._api = load_core_api()
        return self._api

    def rendezvous(self, world_size: int) -> list[dict[str, str]]:
        """A new start of the group: each rank's torchrun variables (rank 0's stable name, the port)."""
        if self._start is not None and self._start.pool is not None:
            raise PoolError("the trainer pods of the start before are not released")
        prefix = f"trainer-{secrets.token_hex(3)}"
        start = self._start = _Start(prefix, world_size, rank_master_addr(self.ref, prefix))
        return [
            {
                "RANK": str(r),
                "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": start.master_addr,
                "MASTER_PORT": str(self.master_port),
            }
            for r in range(world_size)
        ]

    def start(self, rank: int, environment: Mapping[str, str]) -> PodRank:
        """Create rank ``rank``'s pod (ranks start in order, 0 first: rank r is executor ``<prefix>-r``)."""
        start = self._start
        if start is None:
            raise PoolError("trainer pods: call rendezvous() for a new start first")
        if start.pool is None:
            if rank != 0:
                raise PoolError(f"trainer pods start with rank 0, not {rank}")
            rendezvous = RankRendezvous(
                start.world_size,
                start.master_addr,
                environment[ENV_RANK_CHANNEL],
                self.master_port,
                self.dial_timeout_s,
            )
            container = trainer_rank_container(self.job.pools.image or "", rendezvous, **self.template)
            start.pool = KubernetesPool(
                "training",
                self.job.pools.training,
                container,
                job=self.job.name,
                run_id=self.run_id,
                driver=rendezvous.channel,
                namespace=self.namespace,
                api=self.api,
                token=self._key,
                owner=self.owner,
                id_prefix=start.prefix,
                token_env=ENV_RANK_CHANNEL_KEY,
            )
        ids = start.pool.launch(1)
        if ids != [rank_executor_id(start.prefix, rank)]:
            raise PoolError(f"trainer pods start in rank order: rank {rank} got executor {ids}")
        return PodRank(self, start, rank)

    def release(self) -> None:
        """Delete every pod of the last start, the Service and the key's Secret (the pool's ``close``)."""
        start, self._start = self._start, None
        if start is not None and start.pool is not None:
            start.pool.close()

    def observe(self, start: _Start) -> dict[str, list[Any]]:
        """The pods of ``start`` by executor label, listed at most every ``poll_s`` (one call for the group;
        a failed call keeps the last answer: a rank is not declared dead on an API hiccup)."""
        pool = start.pool
        if pool is None:
            return {}
        if time.monotonic() - start.listed_at >= self.poll_s:
            selector = pool.ref.selector()
            try:
                listed = self.api.list_namespaced_pod(self.namespace, label_selector=selector)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                log.warning("trainer pods: cannot list pods %s in %s: %s", selector, self.namespace, exc)
                return start.pods
            pods: dict[str, list[Any]] = {}
            for pod in listed.items or []:
                pods.setdefault((pod.metadata.labels or {}).get(LABEL_EXECUTOR, ""), []).append(pod)
            start.pods, start.listed_at = pods, time.monotonic()
        return start.pods

    def delete_now(self, pool: KubernetesPool, executor_id: str) -> None:
        """Delete an executor's pods without a grace period (a terminated rank that did not stop)."""
        selector = pool.ref.selector(**{LABEL_EXECUTOR: label_value(executor_id)})
        try:
            self.api.delete_collection_namespaced_pod(self.namespace, label_selector=selector, grace_period_seconds=0)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("trainer pods: cannot delete pods %s in %s: %s", selector, self.namespace, exc)
