"""The Kubernetes executor pool: the executors of one role of one run as pods, through ``CoreV1Api``.

:class:`KubernetesPool` implements :class:`~primus_dagster.cluster.pool.ExecutorPool` with the objects
of :mod:`.manifests`, applied through an injected ``kubernetes.client.CoreV1Api`` (default: the
in-cluster configuration, else ``$KUBECONFIG`` / ``~/.kube/config``):

* ``launch`` creates the token Secret (when given a token) and the headless Service once, then one
  pod per executor; it returns once the API accepted them (``status`` says ``starting`` until they
  run; :meth:`KubernetesPool.wait_for` waits);
* ``status`` lists the pool's pods by label (one API call) and maps each executor's current attempt
  with :func:`.pod_status.pod_outcome` (``OOMKilled`` -> ``oom_killed``, a non-zero exit -> ``failed``
  with its message);
* ``stop`` deletes the pod with a grace period (SIGTERM, SIGKILL after it); ``restart`` creates a new
  pod for a finished executor (attempt + 1, the finished pod is kept for its logs until ``close``);
* ``resize`` patches the running pod's resources in place where the cluster can: the ``pods/resize``
  subresource (Kubernetes >= 1.33), else a patch of the pod itself (1.27-1.32 with
  ``InPlacePodVerticalScaling``); when the API refuses (no such subresource, a validation error,
  RBAC), the executor is replaced by a new attempt with the new resources. A refusal that says the
  cluster cannot resize at all is remembered (:attr:`KubernetesPool.supports_in_place_resize`);
* ``close`` deletes every pod of the pool instance (label selector), its Service and Secret; idempotent;
* ``cpu_seconds`` is 0.0: the pods' CPU is not measured from here.

Blacklisted nodes (``avoid_nodes``) accumulate: no later pod of the pool is scheduled there. API
errors become :class:`~primus_dagster.cluster.pool.PoolError` naming the object and the API's reason
(for Secrets only the status and reason: their bodies are never echoed).

Example::

    pool = KubernetesPool.for_job(job, "data", run_id=context.run_id, driver="grpc://10.0.0.5:7000",
                                  job_spec_path="/app/examples/job.yaml", data_root="/data", token=token,
                                  owner=step_pod_owner(api, job.pools.namespace), api=api)
    with pool:
        ids = pool.launch(2)
        pool.wait_for(ids)                               # both running
        pool.resize(ids[0], Resources(cpu=2.0, memory_bytes=4 << 30))
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import urllib3
from kubernetes.client import ApiException, CoreV1Api, V1OwnerReference

from primus_dagster.cluster.kubernetes.manifests import (
    ENV_TOKEN,
    FLIGHT_PORT_NAME,
    LABEL_ATTEMPT,
    LABEL_EXECUTOR,
    ContainerTemplate,
    DataExecutorArgs,
    PoolRef,
    SecretRef,
    data_executor_container,
    executor_pod,
    executor_service,
    label_value,
    owner_reference,
    resize_patch,
    service_name,
    token_secret,
    token_secret_name,
    trainer_container,
)
from primus_dagster.cluster.kubernetes.pod_status import pod_outcome
from primus_dagster.cluster.pool import (
    FINISHED_STATES,
    ExecutorStatus,
    PoolError,
    Resources,
    Role,
    lowered_from,
    memory_bytes,
)
from primus_dagster.spec import JobSpec, PoolSpec

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)


def _kubeconfig() -> str | None:
    # Read now: the client's own default is $KUBECONFIG as it was when the client was imported.
    return os.environ.get("KUBECONFIG") or None


def load_core_api() -> CoreV1Api:
    """A ``CoreV1Api`` from the in-cluster configuration, else the kubeconfig (``$KUBECONFIG``)."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        try:
            kubernetes.config.load_kube_config(config_file=_kubeconfig())
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise PoolError(
                f"no Kubernetes API configuration: not inside a cluster and no usable kubeconfig ({exc})"
            ) from None
    return CoreV1Api()


def in_cluster_namespace() -> str | None:
    """The namespace of the pod this process runs in (its service account's), None outside a cluster."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


def default_namespace() -> str:
    """The namespace this process runs in (in a cluster), else the kubeconfig context's, else ``default``."""
    own = in_cluster_namespace()
    if own is not None:
        return own
    try:
        _, active = kubernetes.config.list_kube_config_contexts(config_file=_kubeconfig())
        return str(active["context"].get("namespace") or "default")
    except (kubernetes.config.ConfigException, OSError, KeyError, TypeError):
        return "default"


def api_reason(exc: ApiException, *, echo: bool = True) -> str:
    """``status reason: message`` of an API error (the message only with ``echo``)."""
    reason, message = exc.reason, ""
    if echo and exc.body:
        try:
            body = json.loads(exc.body)
        except (TypeError, ValueError):
            body = None
        if isinstance(body, dict):
            reason = body.get("reason") or reason
            message = body.get("message") or ""
    return f"{exc.status} {reason}" + (f": {message}" if message else "")


def pod_owner(api: CoreV1Api, namespace: str, name: str) -> V1OwnerReference:
    """An owner reference to pod ``name`` (in a Dagster step: ``$HOSTNAME``, the step's own pod)."""
    try:
        pod = api.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        raise PoolError(f"cannot read owner pod {namespace}/{name}: {api_reason(exc)}") from None
    return owner_reference("Pod", name, pod.metadata.uid)


def step_pod_owner(
    api: CoreV1Api,
    pools_namespace: str | None,
    *,
    pod_name: str | None = None,
    pod_namespace: str | None = None,
) -> V1OwnerReference | None:
    """The owner of a run's pool objects: the pod this process runs in (a Dagster step's), if any.

    **One namespace rule.** Kubernetes owner references never cross namespaces: a namespaced owner
    must live in its dependents' namespace, else the garbage collector takes it as absent and deletes
    the dependents. So inside a cluster ``pools.namespace`` must be unset or the namespace of this pod
    (``pod_namespace``, default the service account's); another one is refused with a PoolError naming
    both. Outside a cluster (no service-account namespace) or without a pod name (``pod_name``, default
    ``$HOSTNAME``) there is no owner, and ``close()`` alone removes what the pool created.

    Example::

        owner = step_pod_owner(load_core_api(), job.pools.namespace)  # None on a laptop with a kubeconfig
    """
    pod_namespace = pod_namespace or in_cluster_namespace()
    pod_name = pod_name or os.environ.get("HOSTNAME")
    if pod_namespace is None or not pod_name:
        return None
    if pools_namespace and pools_namespace != pod_namespace:
        raise PoolError(
            f"pools.namespace {pools_namespace!r} is not the namespace this run's pod {pod_name} runs in "
            f"({pod_namespace!r}): owner references cannot cross namespaces, so the executor pods would be "
            f"garbage-collected at once. Remove pools.namespace, or run the Dagster runs in {pools_namespace!r} "
            "(DAGSTER_K8S_NAMESPACE)"
        )
    return pod_owner(api, pod_namespace, pod_name)


@dataclass
class _Executor:
    executor_id: str
    index: int
    resources: Resources
    attempt: int = 0
    pod: str | None = None  # the current attempt's pod
    stopped: bool = False
    error: str | None = None  # why the current attempt has no pod
    resized_from: Resources | None = None  # the allocation before a resize lowered its memory


class KubernetesPool:
    """Executors of one role of one run as pods (see the module docstring); thread-safe.

    ``spec`` gives the default resources; ``template`` the container; ``driver`` the data driver's
    address; ``token`` a Flight token to put in a Secret this pool creates, or ``token_secret`` an
    existing Secret holding it, in the pods' ``token_env`` (a trainer rank's channel key:
    ``PRIMUS_RANK_CHANNEL_KEY``); ``owner`` the object whose deletion garbage-collects the pods."""

    def __init__(
        self,
        role: Role,
        spec: PoolSpec,
        template: ContainerTemplate,
        *,
        job: str,
        run_id: str,
        driver: str,
        namespace: str | None = None,
        api: CoreV1Api | None = None,
        token: str | None = None,
        token_secret: SecretRef | None = None,
        owner: V1OwnerReference | None = None,
        id_prefix: str | None = None,
        service: bool = True,
        grace_s: float | None = None,
        token_env: str = ENV_TOKEN,
    ):
        if token is not None and token_secret is not None:
            raise ValueError("give the token (the pool puts it in a Secret) or a Secret holding it, not both")
        self.role = role
        self.spec = spec
        self.template = template
        self.driver = driver
        self.namespace = namespace or default_namespace()
        self.api = api if api is not None else load_core_api()
        self.owner = owner
        self.id_prefix = id_prefix or role
        self.default_resources = Resources(spec.cpu, memory_bytes(spec.memory))
        self.grace_s = template.termination_grace_s if grace_s is None else grace_s
        self.token_env = token_env
        self.ref = PoolRef(job=job, run_id=run_id, role=role, namespace=self.namespace, instance=secrets.token_hex(4))
        self.service_name = service_name(self.ref) if service else None
        self._token = token
        self.token_ref = SecretRef(token_secret_name(self.ref)) if token is not None else token_secret
        self.avoid_nodes: set[str] = set()
        #: Whether the cluster resized a pod in place (None: not tried yet; False: it cannot).
        self.supports_in_place_resize: bool | None = None
        self._lock = threading.RLock()
        self._executors: dict[str, _Executor] = {}
        self._next_index = 0
        self._secret_created = False
        self._service_created = False
        self._closed = False

    @classmethod
    def for_job(
        cls,
        job: JobSpec,
        role: Role,
        *,
        run_id: str,
        driver: str,
        job_spec_path: str,
        data_root: str = ".",
        kafka_bootstrap: str | None = None,
        trainers: int | None = None,
        trainer_command: Sequence[str] | None = None,
        fields: Sequence[str] | None = None,
        token: str | None = None,
        token_secret: SecretRef | None = None,
        owner: V1OwnerReference | None = None,
        api: CoreV1Api | None = None,
        **template: Any,
    ) -> KubernetesPool:
        """The ``role`` pool of ``job``: image, namespace, CPU and memory from ``job.pools``; data
        executors read the spec at ``job_spec_path`` inside the image (or a mounted volume) and serve
        ``trainers`` readers (default ``pools.training.replicas``) the canonical ``fields`` (None:
        all), trainers run ``trainer_command`` (the ranks of a trainer group:
        :class:`~.trainers.TrainerPods`); ``template``: further :class:`ContainerTemplate` fields."""
        pools = job.pools
        if pools.backend != "kubernetes" or pools.image is None:
            raise PoolError(
                f"pools.backend is {pools.backend!r}: a Kubernetes pool needs backend kubernetes and pools.image"
            )
        spec = pools.data if role == "data" else pools.training
        if role == "data":
            args = DataExecutorArgs(
                job_spec=job_spec_path,
                data_root=data_root,
                trainers=trainers,
                kafka_bootstrap=kafka_bootstrap,
                fields=tuple(fields) if fields is not None else None,
            )
            container = data_executor_container(pools.image, args, **template)
        elif trainer_command:
            container = trainer_container(pools.image, trainer_command, **template)
        else:
            raise ValueError("a training pool needs trainer_command")
        return cls(
            role,
            spec,
            container,
            job=job.name,
            run_id=run_id,
            driver=driver,
            namespace=pools.namespace,
            api=api,
            token=token,
            token_secret=token_secret,
            owner=owner,
        )

    # ----------------------------------------------------------------- the pool contract
    def launch(self, count: int, resources: Resources | None = None, *, avoid_nodes: Sequence[str] = ()) -> list[str]:
        """Create ``count`` executor pods (not on ``avoid_nodes``); returns once the API accepted them."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        ids: list[str] = []
        with self._lock:
            self._check_open()
            self.avoid_nodes.update(avoid_nodes)
            self._ensure_shared()
            for _ in range(count):
                executor = _Executor(
                    f"{self.id_prefix}-{self._next_index}", self._next_index, resources or self.default_resources
                )
                self._create_pod(executor)
                self._next_index += 1
                self._executors[executor.executor_id] = executor
                ids.append(executor.executor_id)
        return ids

    def stop(self, executor_id: str, grace_s: float | None = None) -> None:
        """Delete the executor's pod with a grace period (SIGTERM, then SIGKILL); it is ``stopped``."""
        with self._lock:
            executor = self._get(executor_id)
            if executor.pod is not None and not executor.stopped:
                self._delete_pod(executor.pod, grace_s)
            executor.stopped = True

    def restart(self, executor_id: str, resources: Resources | None = None, *, avoid_nodes: Sequence[str] = ()) -> None:
        """A new pod (attempt + 1) for a finished executor, with ``resources`` or its last ones."""
        with self._lock:
            self._check_open()
            executor = self._get(executor_id)
            state = self._current_state(executor)
            if state not in FINISHED_STATES:
                raise PoolError(f"{executor_id} is {state}: only a finished executor restarts")
            self.avoid_nodes.update(avoid_nodes)
            self._new_attempt(executor, resources or executor.resources)

    def resize(self, executor_id: str, resources: Resources) -> None:
        """In place where the cluster can, else by replacing the pod (see the module docstring)."""
        with self._lock:
            self._check_open()
            executor = self._get(executor_id)
            state = self._current_state(executor)
            if state in FINISHED_STATES:
                raise PoolError(f"{executor_id} is {state}: restart it with the new resources instead")
            assert executor.pod is not None  # an unfinished executor has a pod
            lowered = lowered_from(executor.resized_from, executor.resources, resources)
            if self._resize_in_place(executor.pod, resources):
                executor.resized_from = lowered
                log.info(
                    "%s: resized in place to %s cores, %d MiB", executor_id, resources.cpu, resources.memory_bytes >> 20
                )
                executor.resources = resources
                return
            log.info("%s: replacing pod %s to resize it (in place refused)", executor_id, executor.pod)
            self._delete_pod(executor.pod, None)
            self._new_attempt(executor, resources)
            executor.resized_from = lowered

    def status(self) -> list[ExecutorStatus]:
        """Every executor's current attempt, from one list of the pool's pods."""
        with self._lock:
            executors = sorted(self._executors.values(), key=lambda e: e.index)
            live = any(not e.stopped for e in executors)
            pods = self._list_pods() if live else []
            recorded = {e.pod for e in executors}
            by_attempt: dict[tuple[str, str], Any] = {}
            for pod in pods:
                labels = pod.metadata.labels or {}
                key = (labels.get(LABEL_EXECUTOR, ""), labels.get(LABEL_ATTEMPT, ""))
                ours = pod.metadata.name in recorded  # a ghost pod (its create answer lost) never shadows ours
                if key not in by_attempt or ours:
                    by_attempt[key] = pod
            return [self._status(e, by_attempt.get((label_value(e.executor_id), str(e.attempt)))) for e in executors]

    def cpu_seconds(self, include_startup: bool = True) -> float:
        """0.0: the pods' CPU is not measured from here (their containers' usage is the cluster's
        metrics pipeline's to report; the executors' own CPU load reaches the autoscaler through their
        heartbeats)."""
        return 0.0

    def executor(self, executor_id: str) -> ExecutorStatus:
        """One executor's status."""
        for status in self.status():
            if status.executor_id == executor_id:
                return status
        raise PoolError(f"{self.role} pool has no executor {executor_id!r}")

    def wait_for(
        self,
        executor_ids: Sequence[str],
        states: Collection[str] = ("running",),
        timeout_s: float = 300.0,
        poll_s: float = 1.0,
    ) -> list[ExecutorStatus]:
        """Poll until every executor of ``executor_ids`` is in one of ``states``; PoolError when one
        finishes in another state or at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            current = {s.executor_id: s for s in self.status()}
            missing = [i for i in executor_ids if i not in current]
            if missing:
                raise PoolError(f"{self.role} pool has no executor {missing[0]!r}")
            chosen = [current[i] for i in executor_ids]
            if all(s.state in states for s in chosen):
                return chosen
            for s in chosen:
                if s.finished and s.state not in states:
                    raise PoolError(
                        f"{s.executor_id} ended {s.state} while waiting for {sorted(states)}: {s.last_error}"
                    )
            if time.monotonic() >= deadline:
                summary = ", ".join(f"{s.executor_id}={s.state}" for s in chosen)
                raise PoolError(f"timed out after {timeout_s:g}s waiting for {sorted(states)}: {summary}")
            time.sleep(poll_s)

    def close(self, grace_s: float | None = None) -> None:
        """Delete every pod of this pool (label selector), its Service and Secret; idempotent. A failed
        deletion raises PoolError after the others were tried (call again to retry)."""
        with self._lock:
            if self._closed:
                return
            errors: list[str] = []

            def attempt(*args: Any, **kwargs: Any) -> None:
                try:
                    self._call(*args, **kwargs)
                except PoolError as exc:
                    errors.append(str(exc))

            selector, ns = self.ref.selector(), self.namespace
            grace = self._grace(grace_s)
            attempt(
                "delete",
                "pods",
                selector,
                self.api.delete_collection_namespaced_pod,
                ns,
                label_selector=selector,
                grace_period_seconds=grace,
            )
            if self._service_created and self.service_name is not None:
                name = self.service_name
                attempt("delete", "service", name, self.api.delete_namespaced_service, name, ns, tolerate=(404,))
            if self._secret_created and self.token_ref is not None:
                name = self.token_ref.name
                attempt(
                    "delete", "secret", name, self.api.delete_namespaced_secret, name, ns, tolerate=(404,), echo=False
                )
            for executor in self._executors.values():
                executor.stopped = True
            if errors:
                raise PoolError("; ".join(errors))
            self._closed = True

    def __enter__(self) -> KubernetesPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- API calls
    def _call(
        self,
        action: str,
        kind: str,
        name: str,
        method: Any,
        *args: Any,
        tolerate: Sequence[int] = (),
        echo: bool = True,
        **kwargs: Any,
    ) -> Any:
        try:
            return method(*args, **kwargs)
        except ApiException as exc:
            if exc.status in tolerate:
                return None
            raise PoolError(
                f"{self.role} pool: cannot {action} {kind} {self.namespace}/{name}: {api_reason(exc, echo=echo)}"
            ) from None
        except _TRANSPORT_ERRORS as exc:
            raise PoolError(
                f"{self.role} pool: cannot {action} {kind} {self.namespace}/{name}: {type(exc).__name__}: {exc}"
            ) from None

    def _grace(self, grace_s: float | None) -> int:
        return max(0, round(self.grace_s if grace_s is None else grace_s))

    def _ensure_shared(self) -> None:
        if self._token is not None and not self._secret_created:
            body = token_secret(self.ref, self._token, self.owner)
            name = body.metadata.name
            self._call("create", "secret", name, self.api.create_namespaced_secret, self.namespace, body, echo=False)
            self._secret_created, self._token = True, None
        if self.service_name is not None and not self._service_created:
            ports = self.template.ports
            body = executor_service(self.ref, ports, self.owner)
            name = self.service_name
            created = self._call(
                "create", "service", name, self.api.create_namespaced_service, self.namespace, body, tolerate=(409,)
            )
            if created is None:
                # Left by an earlier pool of this run and role (a retried step): take it over with our owner.
                self._call(
                    "delete", "service", name, self.api.delete_namespaced_service, name, self.namespace, tolerate=(404,)
                )
                self._call("create", "service", name, self.api.create_namespaced_service, self.namespace, body)
            self._service_created = True

    def _create_pod(self, executor: _Executor) -> None:
        body = executor_pod(
            self.ref,
            self.template,
            executor.executor_id,
            index=executor.index,
            attempt=executor.attempt,
            resources=executor.resources,
            driver=self.driver,
            token=self.token_ref,
            owner=self.owner,
            avoid_nodes=self.avoid_nodes,
            service=self.service_name,
            token_env=self.token_env,
        )
        name = f"{body.metadata.generate_name}*"
        created = self._call("create", "pod", name, self.api.create_namespaced_pod, self.namespace, body)
        executor.pod, executor.error, executor.stopped = created.metadata.name, None, False
        log.info("%s: pod %s (attempt %d)", executor.executor_id, executor.pod, executor.attempt)

    def _new_attempt(self, executor: _Executor, resources: Resources) -> None:
        executor.attempt += 1
        executor.resources, executor.resized_from = resources, None
        try:
            self._create_pod(executor)
        except PoolError as exc:
            executor.pod, executor.error, executor.stopped = None, str(exc), False
            raise

    def _delete_pod(self, name: str, grace_s: float | None) -> None:
        self._call(
            "delete",
            "pod",
            name,
            self.api.delete_namespaced_pod,
            name,
            self.namespace,
            grace_period_seconds=self._grace(grace_s),
            tolerate=(404,),
        )

    def _list_pods(self) -> list[Any]:
        selector = self.ref.selector()
        listed = self._call(
            "list", "pods", selector, self.api.list_namespaced_pod, self.namespace, label_selector=selector
        )
        return list(listed.items or [])

    def _current_state(self, executor: _Executor) -> str:
        if executor.stopped:
            return "stopped"
        if executor.pod is None:
            return "failed"
        pod = self._call(
            "read", "pod", executor.pod, self.api.read_namespaced_pod, executor.pod, self.namespace, tolerate=(404,)
        )
        return "failed" if pod is None else pod_outcome(pod).state

    def _resize_in_place(self, pod: str, resources: Resources) -> bool:
        """Whether the API took the in-place resize (see the module docstring)."""
        if self.supports_in_place_resize is False:
            return False
        body = resize_patch(resources)
        subresource = getattr(self.api, "patch_namespaced_pod_resize", None)
        if subresource is not None:
            try:
                subresource(pod, self.namespace, body, _content_type=STRATEGIC_MERGE)
                self.supports_in_place_resize = True
                return True
            except ApiException as exc:
                if exc.status == 403:  # no RBAC on pods/resize: in place is not for this pool
                    self.supports_in_place_resize = False
                    log.warning("%s pool: in-place resize not allowed (%s)", self.role, api_reason(exc))
                    return False
                if exc.status in (400, 409, 422):  # this change refused (a memory decrease on 1.33)
                    log.info("%s pool: in-place resize of %s refused (%s)", self.role, pod, api_reason(exc))
                    return False
                if exc.status not in (404, 405):  # 404/405: no subresource, a cluster before 1.33
                    raise PoolError(
                        f"{self.role} pool: cannot resize pod {self.namespace}/{pod}: {api_reason(exc)}"
                    ) from None
            except _TRANSPORT_ERRORS as exc:
                raise PoolError(f"{self.role} pool: cannot resize pod {self.namespace}/{pod}: {exc}") from None
        try:
            self.api.patch_namespaced_pod(pod, self.namespace, body, _content_type=STRATEGIC_MERGE)
        except ApiException as exc:
            if exc.status in (400, 403, 404, 405, 422):  # pod resources are immutable on this cluster
                self.supports_in_place_resize = False
                log.info("%s pool: no in-place resize on this cluster (%s)", self.role, api_reason(exc))
                return False
            raise PoolError(f"{self.role} pool: cannot resize pod {self.namespace}/{pod}: {api_reason(exc)}") from None
        except _TRANSPORT_ERRORS as exc:
            raise PoolError(f"{self.role} pool: cannot resize pod {self.namespace}/{pod}: {exc}") from None
        self.supports_in_place_resize = True
        return True

    # ----------------------------------------------------------------- bookkeeping
    def _check_open(self) -> None:
        if self._closed:
            raise PoolError(f"{self.role} pool is closed")

    def _get(self, executor_id: str) -> _Executor:
        try:
            return self._executors[executor_id]
        except KeyError:
            raise PoolError(f"{self.role} pool has no executor {executor_id!r}") from None

    def _status(self, executor: _Executor, pod: Any) -> ExecutorStatus:
        node = ip = ""
        labels: dict[str, str] = {}
        exit_code: int | None = None
        last_error: str | None = None
        if pod is not None:
            outcome = pod_outcome(pod)
            node, ip, labels = outcome.node, outcome.ip, dict(pod.metadata.labels or {})
            state, exit_code, last_error = outcome.state, outcome.exit_code, outcome.message
        if executor.stopped:
            state = "stopped"
        elif pod is None:
            state = "failed"
            last_error = (
                executor.error or f"pod {executor.pod} of {executor.executor_id} is gone (deleted outside the pool)"
            )
        port = self.template.ports.get(FLIGHT_PORT_NAME)
        address = f"grpc://{ip}:{port}" if ip and port else ip
        return ExecutorStatus(
            executor_id=executor.executor_id,
            role=self.role,
            state=state,
            resources=executor.resources,
            attempt=executor.attempt,
            node=node,
            address=address,
            exit_code=exit_code,
            last_error=last_error,
            labels=labels,
            resized_from=executor.resized_from,
        )
