"""Pure builders of the Kubernetes objects an executor pool creates: pods, a headless Service, the token Secret.

Every builder returns an official ``kubernetes.client`` model (``V1Pod``, ``V1Service``, ``V1Secret``)
and calls no API (``backend.KubernetesPool`` applies them), in the manner of dagster-k8s's
``construct_dagster_k8s_job``. What the objects carry:

* **names**: DNS-1035 labels of at most 63 characters (:func:`dns_name`: lower case, a letter first;
  a name that had to be changed or cut ends in a hash of the original, so it stays deterministic and
  two inputs never meet); a pod gets ``generateName`` (a prefix of at most 58 characters to which
  the API server appends 5), so a retried Dagster step never collides with the pods of the attempt
  before it that are still terminating;
* **labels** (values made valid by :func:`label_value`): job, run id, role, pool instance, executor
  id and attempt, selected by :meth:`PoolRef.selector`;
* **env**: the driver address, the executor's id / index / attempt, its pod IP and namespace (downward
  API) and the Flight token *from a Secret reference* (``valueFrom.secretKeyRef``; a literal token is
  refused); whole ConfigMaps and Secrets as ``envFrom`` (the data root, object-store credentials), below
  the pool's own variables (Kubernetes lets ``env`` win over ``envFrom``);
* **resources**: requests = limits = the :class:`Resources` allocation (Guaranteed QoS, which an
  in-place resize keeps), with ``resizePolicy: NotRequired`` for CPU and memory;
* **ports**: the Flight port as the named container port ``flight``; the headless Service of a pool
  selects its pods (``<executor>.<service>`` resolves to a pod);
* **owner references** to a given owner (the Dagster step's pod), so nothing outlives the run;
* ``restartPolicy: Never``: the pool restarts executors itself (a new attempt, maybe resized).

A trainer rank's pod is an executor pod of the ``training`` role whose container is
:func:`trainer_rank_container`: ``python -m primus_dagster.training.distributed.dial_back``, which dials
back to the step's rank channel, with torchrun's rendezvous (``RANK`` = the executor index, ``WORLD_SIZE``,
``MASTER_ADDR`` = rank 0's stable name through the headless Service, ``MASTER_PORT``), its peer address (the
pod IP) and the channel key from a Secret reference (:func:`trainer_rank_pod`).

Example::

    ref = PoolRef(job="ctr", run_id=run_id, role="data", namespace="ml", instance="a1b2c3d4")
    template = data_executor_container("registry/primus:1.0", DataExecutorArgs(job_spec="/app/job.yaml"))
    pod = executor_pod(ref, template, "data-0", index=0, attempt=0, resources=Resources(2.0, 4 << 30),
                       driver="grpc://driver.ml.svc:7000", token=SecretRef(token_secret_name(ref)))
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import (
    V1Affinity,
    V1Capabilities,
    V1ConfigMapEnvSource,
    V1Container,
    V1ContainerPort,
    V1ContainerResizePolicy,
    V1EnvFromSource,
    V1EnvVar,
    V1EnvVarSource,
    V1NodeAffinity,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectFieldSelector,
    V1ObjectMeta,
    V1OwnerReference,
    V1Pod,
    V1PodSpec,
    V1ResourceRequirements,
    V1SeccompProfile,
    V1Secret,
    V1SecretEnvSource,
    V1SecretKeySelector,
    V1SecurityContext,
    V1Service,
    V1ServicePort,
    V1ServiceSpec,
)

from primus_dagster.cluster.pool import Resources, Role, memory_quantity
from primus_dagster.data import EXECUTOR_ENV, ExecutorConfig

MAX_NAME = 63
#: The API server appends 5 random characters to a ``generateName`` prefix.
MAX_GENERATE_NAME = MAX_NAME - 5
CONTAINER_NAME = "executor"
FLIGHT_PORT = 8815
FLIGHT_PORT_NAME = "flight"
EXECUTOR_MODULE = "primus_dagster.data.executor"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
APP = "primus-dagster"
_PREFIX = "primus-dagster.io"
LABEL_JOB = f"{_PREFIX}/job"
LABEL_RUN = f"{_PREFIX}/run-id"
LABEL_ROLE = f"{_PREFIX}/role"
LABEL_POOL = f"{_PREFIX}/pool"
LABEL_EXECUTOR = f"{_PREFIX}/executor-id"
LABEL_ATTEMPT = f"{_PREFIX}/attempt"
#: Annotations keep the raw values where a label value had to be made valid.
ANNOTATION_RUN = f"{_PREFIX}/run-id"
ANNOTATION_EXECUTOR = f"{_PREFIX}/executor-id"

ENV_DRIVER = "PRIMUS_DRIVER"
#: The variable the data executor reads its token from (``primus_dagster.data.executor.TOKEN_ENV``).
ENV_TOKEN = "PRIMUS_DATA_TOKEN"
#: What a trainer rank runs and reads (``primus_dagster.training.distributed.channel``: the same names).
DIAL_BACK_MODULE = "primus_dagster.training.distributed.dial_back"
ENV_RANK_CHANNEL = "PRIMUS_RANK_CHANNEL"
ENV_RANK_CHANNEL_KEY = "PRIMUS_RANK_CHANNEL_KEY"
#: The address a rank's peers reach it at (``primus_dagster.training.distributed.mesh.RANK_ADDR_ENV``).
ENV_RANK_ADDR = "PRIMUS_RANK_ADDR"
#: torchrun's rendezvous variables (``init_method="env://"``).
RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
RENDEZVOUS_PORT = 29500
RENDEZVOUS_PORT_NAME = "rendezvous"
ENV_EXECUTOR_ID = "PRIMUS_EXECUTOR_ID"
ENV_EXECUTOR_INDEX = "PRIMUS_EXECUTOR_INDEX"
ENV_ATTEMPT = "PRIMUS_EXECUTOR_ATTEMPT"
ENV_ROLE = "PRIMUS_ROLE"
ENV_RUN_ID = "PRIMUS_RUN_ID"
ENV_JOB = "PRIMUS_JOB"
ENV_SERVICE = "PRIMUS_SERVICE"
ENV_POD_NAME = "PRIMUS_POD_NAME"
ENV_POD_IP = "PRIMUS_POD_IP"
ENV_NAMESPACE = "PRIMUS_NAMESPACE"
RESERVED_ENV = frozenset(
    {
        ENV_DRIVER,
        ENV_TOKEN,
        ENV_EXECUTOR_ID,
        ENV_EXECUTOR_INDEX,
        ENV_ATTEMPT,
        ENV_ROLE,
        ENV_RUN_ID,
        ENV_JOB,
        ENV_SERVICE,
        ENV_POD_NAME,
        ENV_POD_IP,
        ENV_NAMESPACE,
        ENV_RANK_CHANNEL_KEY,
    }
)
TOKEN_KEY = "token"

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HASH = 8


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH]


def dns_name(*parts: str, max_length: int = MAX_NAME) -> str:
    """``parts`` joined by ``-`` as a DNS-1035 label of at most ``max_length`` characters.

    Lower-case letters, digits and ``-``, a letter first (``p-`` is put in front otherwise). A name
    that had to change (characters replaced, a prefix added, cut to length) ends in ``-`` and 8 hex
    digits of the original's SHA-256: deterministic, and two different inputs stay apart.

    >>> dns_name("ctr", "run1", "data-0"), dns_name("CTR", "run1")
    ('ctr-run1-data-0', 'ctr-run1-24063a2f')
    """
    if max_length < 2 * _HASH:
        raise ValueError(f"max_length must be at least {2 * _HASH}, got {max_length}")
    raw = "-".join(parts)
    name = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", raw.lower())).strip("-")
    if not name[:1].isalpha():
        name = f"p-{name}".rstrip("-")
    if name == raw and len(name) <= max_length:
        return name
    head = name[: max_length - _HASH - 1].rstrip("-")
    return f"{head}-{_digest(raw)}"


def label_value(value: str) -> str:
    """``value`` as a valid label value (at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at both ends);
    a value that had to change ends in a hash of the original.

    >>> label_value("data-0"), label_value("a b")
    ('data-0', 'a-b-c8687a08')
    """
    if len(value) <= MAX_NAME and _LABEL_VALUE.match(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-_.")
    head = cleaned[: MAX_NAME - _HASH - 1].rstrip("-_.")
    return f"{head}-{_digest(value)}" if head else _digest(value)


def cpu_quantity(cpu: float) -> str:
    """CPU cores as a Kubernetes quantity: whole cores plain, else millicores.

    >>> cpu_quantity(2.0), cpu_quantity(0.25), cpu_quantity(1.5)
    ('2', '250m', '1500m')
    """
    millis = round(cpu * 1000)
    if millis < 1:
        raise ValueError(f"cpu must be at least 0.001 cores, got {cpu}")
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def resource_requirements(resources: Resources) -> V1ResourceRequirements:
    """Requests = limits (Guaranteed QoS; the memory limit is what the kernel's OOM killer enforces)."""
    amounts = {"cpu": cpu_quantity(resources.cpu), "memory": memory_quantity(resources.memory_bytes)}
    return V1ResourceRequirements(requests=dict(amounts), limits=dict(amounts))


def resize_patch(resources: Resources) -> dict[str, Any]:
    """Strategic-merge patch body of an in-place resize (the ``pods/resize`` subresource, or the pod
    itself on clusters before Kubernetes 1.33); containers merge by name."""
    amounts = {"cpu": cpu_quantity(resources.cpu), "memory": memory_quantity(resources.memory_bytes)}
    return {
        "spec": {
            "containers": [{"name": CONTAINER_NAME, "resources": {"requests": dict(amounts), "limits": dict(amounts)}}]
        }
    }


@dataclass(frozen=True)
class SecretRef:
    """A key of a Secret in the pool's namespace (the value never appears in a manifest)."""

    name: str
    key: str = TOKEN_KEY


@dataclass(frozen=True)
class PoolRef:
    """Which job, run and role the objects of one pool belong to, the namespace they go to, and the
    pool's ``instance`` (an id of one pool object: a retried step's new pool never touches the pods of
    the pool before it)."""

    job: str
    run_id: str
    role: Role
    namespace: str = "default"
    instance: str = "0"

    @property
    def run_short(self) -> str:
        """The run id's first 8 characters, for names (labels carry the whole id)."""
        return self.run_id[:8]

    def run_labels(self) -> dict[str, str]:
        """The labels of everything of this run and role (any pool instance)."""
        return {
            LABEL_NAME: APP,
            LABEL_MANAGED_BY: APP,
            LABEL_JOB: label_value(self.job),
            LABEL_RUN: label_value(self.run_id),
            LABEL_ROLE: self.role,
        }

    def labels(self) -> dict[str, str]:
        """The labels of everything this pool instance creates."""
        return {**self.run_labels(), LABEL_POOL: label_value(self.instance)}

    def selector(self, **extra: str) -> str:
        """Equality label selector of this pool instance's objects, narrowed by ``extra`` labels."""
        return ",".join(f"{k}={v}" for k, v in {**self.labels(), **extra}.items())


def service_name(ref: PoolRef) -> str:
    """The pool's headless Service (stable per run and role: ``<executor>.<service>`` survives restarts)."""
    return dns_name(ref.job, ref.run_short, ref.role)


def token_secret_name(ref: PoolRef) -> str:
    """The Secret a pool creates for the token it was given."""
    return dns_name(ref.job, ref.run_short, ref.role, ref.instance, "token")


def pod_name_prefix(ref: PoolRef, executor_id: str, attempt: int) -> str:
    """``generateName`` of an executor attempt's pod (at most 58 characters, ending in ``-``)."""
    return dns_name(ref.job, ref.run_short, executor_id, str(attempt), max_length=MAX_GENERATE_NAME - 1) + "-"


def owner_reference(kind: str, name: str, uid: str, api_version: str = "v1") -> V1OwnerReference:
    """An owner in the pool's namespace (e.g. the Dagster step's ``Pod``): deleting it garbage-collects
    the pool's objects. No ``blockOwnerDeletion`` (that needs rights on the owner's finalizers)."""
    return V1OwnerReference(api_version=api_version, kind=kind, name=name, uid=uid)


def _metadata(
    ref: PoolRef,
    *,
    name: str | None = None,
    generate_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    owner: V1OwnerReference | None = None,
    annotations: Mapping[str, str] | None = None,
) -> V1ObjectMeta:
    return V1ObjectMeta(
        name=name,
        generate_name=generate_name,
        namespace=ref.namespace,
        labels={**ref.labels(), **(labels or {})},
        annotations={ANNOTATION_RUN: ref.run_id, **(annotations or {})},
        owner_references=[owner] if owner is not None else None,
    )


@dataclass(frozen=True)
class ContainerTemplate:
    """What every executor container of a pool runs; per-executor values come in as environment
    variables (``$(PRIMUS_EXECUTOR_ID)`` in ``command`` / ``args`` is expanded by Kubernetes).

    ``env`` holds plain values only; secrets go in ``secret_env`` (variable -> :class:`SecretRef`);
    ``env_from_config_maps`` / ``env_from_secrets`` name ConfigMaps / Secrets whose every key becomes a
    variable (``envFrom``: what the deployment's run pods get, e.g. ``primus-env`` and ``primus-secrets``).
    ``volumes`` / ``volume_mounts`` are ``V1Volume`` / ``V1VolumeMount`` objects (a data root on a
    shared volume, the job spec from a ConfigMap). Containers never escalate privileges, drop every
    capability and use the runtime's seccomp profile; ``run_as_user`` also makes them run as that
    non-root user (what a namespace enforcing the ``restricted`` Pod Security Standard requires)."""

    image: str
    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    ports: Mapping[str, int] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, SecretRef] = field(default_factory=dict)
    env_from_config_maps: tuple[str, ...] = ()
    env_from_secrets: tuple[str, ...] = ()
    image_pull_policy: str | None = None
    working_dir: str | None = None
    service_account: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[Any, ...] = ()
    volume_mounts: tuple[Any, ...] = ()
    termination_grace_s: int = 30
    run_as_user: int | None = None

    def __post_init__(self) -> None:
        if not self.image or any(c.isspace() for c in self.image):
            raise ValueError(f"image must be a non-empty reference without spaces, got {self.image!r}")
        if not self.command:
            raise ValueError("command must not be empty")
        for name, port in self.ports.items():
            if len(name) > 15 or not _PORT_NAME.match(name) or not any(c.isalpha() for c in name):
                raise ValueError(f"port name {name!r}: at most 15 lower-case letters, digits and '-', with a letter")
            if not 0 < port < 65536:
                raise ValueError(f"port {name}: {port} is not in 1..65535")
        for name in (*self.env, *self.secret_env):
            if not _ENV_NAME.match(name):
                raise ValueError(f"env {name!r} is not a valid variable name")
            if name in RESERVED_ENV:
                raise ValueError(f"env {name} is set by the pool (the token only ever from a Secret reference)")
        for source in (*self.env_from_config_maps, *self.env_from_secrets):
            if len(source) > 253 or not _SUBDOMAIN.match(source):
                raise ValueError(f"envFrom source {source!r} is not a valid ConfigMap / Secret name")


@dataclass(frozen=True)
class DataExecutorArgs:
    """The ``python -m primus_dagster.data.executor`` flags of a data executor pod; the per-executor
    ones (driver, id, index, advertised address) are expanded from the pod's environment."""

    job_spec: str
    data_root: str = "."
    trainers: int | None = None
    kafka_bootstrap: str | None = None
    port: int = FLIGHT_PORT
    heartbeat_s: float | None = None
    drain_s: float = 10.0
    linger_s: float = 2.0
    log_level: str = "INFO"
    fields: tuple[str, ...] | None = None  # the canonical fields the trainers read (None: all)

    def argv(self) -> list[str]:
        """The arguments (no token: it comes from ``$PRIMUS_DATA_TOKEN``); shared memory is off,
        since readers never share a pod's memory. The executor's own :meth:`ExecutorConfig.argv`
        with the per-pod values as ``$(VAR)`` references the container runtime expands."""
        config = ExecutorConfig(
            driver=f"$({ENV_DRIVER})",
            executor_id=f"$({ENV_EXECUTOR_ID})",
            job_spec=self.job_spec,
            data_root=self.data_root,
            host="0.0.0.0",
            port=self.port,
            advertise=f"$({ENV_POD_IP})",
            trainers=self.trainers,
            kafka_bootstrap=self.kafka_bootstrap,
            heartbeat_s=self.heartbeat_s,
            drain_s=self.drain_s,
            linger_s=self.linger_s,
            log_level=self.log_level,
            shm=False,
            fields=self.fields,
        )
        return [*config.argv(), "--executor-index", f"$({ENV_EXECUTOR_INDEX})"]


def data_executor_container(
    image: str, args: DataExecutorArgs, *, python: str = "python", **template: Any
) -> ContainerTemplate:
    """The container of a data executor: ``python -m primus_dagster.data.executor`` serving Flight on
    the named port ``flight``; ``template``: further :class:`ContainerTemplate` fields (its ``env`` over
    the executor's defaults, ``EXECUTOR_ENV``)."""
    env = {**EXECUTOR_ENV, **template.pop("env", {})}
    return ContainerTemplate(
        image=image,
        command=(python, "-m", EXECUTOR_MODULE),
        args=tuple(args.argv()),
        ports={FLIGHT_PORT_NAME: args.port},
        env=env,
        **template,
    )


def trainer_container(
    image: str,
    command: Sequence[str],
    args: Sequence[str] = (),
    *,
    ports: Mapping[str, int] | None = None,
    **template: Any,
) -> ContainerTemplate:
    """The container of a trainer: the caller's command (it reads ``$PRIMUS_EXECUTOR_INDEX`` as its
    rank, ``$PRIMUS_DRIVER``, and reaches its peers as ``<executor-id>.$PRIMUS_SERVICE``)."""
    return ContainerTemplate(image=image, command=tuple(command), args=tuple(args), ports=dict(ports or {}), **template)


@dataclass(frozen=True)
class RankRendezvous:
    """How the ranks of one start of a trainer group meet: ``world_size`` ranks, rank 0 at ``master_addr``
    (its stable name: :func:`rank_master_addr`) on ``master_port``, the step's rank channel at ``channel``
    (``HOST:PORT``, the step pod's IP); ``dial_timeout_s``: how long a rank may take to reach it.

    Example::

        rendezvous = RankRendezvous(2, rank_master_addr(ref, "trainer-1a2b3c"), "10.0.0.5:41234")
        template = trainer_rank_container("registry/primus:1.0", rendezvous)   # its env, command and port
    """

    world_size: int
    master_addr: str
    channel: str
    master_port: int = RENDEZVOUS_PORT
    dial_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port {self.master_port} is not in 1..65535")
        host, _, port = self.channel.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"the rank channel {self.channel!r} is not HOST:PORT")


def rank_executor_id(prefix: str, rank: int) -> str:
    """The executor id (and, as a DNS label, the hostname) of rank ``rank`` of a group started with ``prefix``."""
    return f"{prefix}-{rank}"


def rank_master_addr(ref: PoolRef, prefix: str) -> str:
    """Rank 0's stable DNS name: ``<rank-0 hostname>.<headless Service>.<namespace>.svc`` (the pods set
    ``hostname`` and ``subdomain``; the Service publishes them before they are ready).

    >>> rank_master_addr(PoolRef("ctr", "0f1e2d3c-aa", "training", "ml"), "trainer-1a2b3c")
    'trainer-1a2b3c-0.ctr-0f1e2d3c-training.ml.svc'
    """
    return f"{dns_name(rank_executor_id(prefix, 0))}.{service_name(ref)}.{ref.namespace}.svc"


def trainer_rank_container(
    image: str, rendezvous: RankRendezvous, *, python: str = "python", **template: Any
) -> ContainerTemplate:
    """The container of a trainer rank: ``python -m primus_dagster.training.distributed.dial_back
    --channel $(PRIMUS_RANK_CHANNEL) --rank $(RANK)``, with torchrun's rendezvous in its env (``RANK`` is
    the pod's executor index, so rank r is executor ``<prefix>-r``), its peer address ``PRIMUS_RANK_ADDR``
    = the pod IP, the rank channel, and the rendezvous port as the named port ``rendezvous``. The channel
    key is no part of it: the pool puts it in the pod from a Secret reference (``token_env``).
    ``template``: further :class:`ContainerTemplate` fields (an ``env`` of its own may not set these)."""
    env = dict(template.pop("env", {}))
    taken = sorted(set(env) & {*RENDEZVOUS_ENV, ENV_RANK_ADDR, ENV_RANK_CHANNEL})
    if taken:
        raise ValueError(f"env {', '.join(taken)}: set by the trainer rank pod")
    env.update(
        {
            "RANK": f"$({ENV_EXECUTOR_INDEX})",
            "WORLD_SIZE": str(rendezvous.world_size),
            "MASTER_ADDR": rendezvous.master_addr,
            "MASTER_PORT": str(rendezvous.master_port),
            # $(VAR) in a value expands to a variable defined before it: the pool's come first
            ENV_RANK_ADDR: f"$({ENV_POD_IP})",
            ENV_RANK_CHANNEL: rendezvous.channel,
        }
    )
    args = ("--channel", f"$({ENV_RANK_CHANNEL})", "--rank", "$(RANK)", "--timeout-s", f"{rendezvous.dial_timeout_s:g}")
    return ContainerTemplate(
        image=image,
        command=(python, "-m", DIAL_BACK_MODULE),
        args=args,
        ports={RENDEZVOUS_PORT_NAME: rendezvous.master_port},
        env=env,
        **template,
    )


def trainer_rank_pod(
    ref: PoolRef,
    template: ContainerTemplate,
    prefix: str,
    rank: int,
    *,
    attempt: int,
    resources: Resources,
    key: SecretRef,
    owner: V1OwnerReference | None = None,
    avoid_nodes: Collection[str] = (),
) -> V1Pod:
    """The pod of rank ``rank`` (executor ``<prefix>-<rank>``, index ``rank``) of a trainer group whose
    container is ``template`` (:func:`trainer_rank_container`): an executor pod of the ``training`` role,
    on the pool's headless Service (hostname ``<prefix>-<rank>``), the channel key from ``key``,
    ``PRIMUS_DRIVER`` the rank channel too. What :class:`~.backend.KubernetesPool` creates for it."""
    if ref.role != "training":
        raise ValueError(f"a trainer rank pod belongs to the training role, not {ref.role!r}")
    return executor_pod(
        ref,
        template,
        rank_executor_id(prefix, rank),
        index=rank,
        attempt=attempt,
        resources=resources,
        driver=template.env[ENV_RANK_CHANNEL],
        token=key,
        owner=owner,
        avoid_nodes=avoid_nodes,
        service=service_name(ref),
        token_env=ENV_RANK_CHANNEL_KEY,
    )


def _field_env(name: str, path: str) -> V1EnvVar:
    return V1EnvVar(name=name, value_from=V1EnvVarSource(field_ref=V1ObjectFieldSelector(field_path=path)))


def _secret_env(name: str, ref: SecretRef) -> V1EnvVar:
    selector = V1SecretKeySelector(name=ref.name, key=ref.key)
    return V1EnvVar(name=name, value_from=V1EnvVarSource(secret_key_ref=selector))


def executor_pod(
    ref: PoolRef,
    template: ContainerTemplate,
    executor_id: str,
    *,
    index: int,
    attempt: int,
    resources: Resources,
    driver: str,
    token: SecretRef | None = None,
    owner: V1OwnerReference | None = None,
    avoid_nodes: Collection[str] = (),
    service: str | None = None,
    token_env: str = ENV_TOKEN,
) -> V1Pod:
    """The pod of attempt ``attempt`` of executor ``executor_id`` (see the module docstring);
    ``avoid_nodes``: node names it must not be scheduled on (the blacklist); ``service``: the
    pool's headless Service (its pod's DNS name is ``<executor>.<service>``); ``token_env``: the
    variable the token's Secret reference goes in (a trainer rank's channel key:
    ``PRIMUS_RANK_CHANNEL_KEY``)."""
    if token_env not in (ENV_TOKEN, ENV_RANK_CHANNEL_KEY):
        raise ValueError(f"token_env must be {ENV_TOKEN} or {ENV_RANK_CHANNEL_KEY}, got {token_env!r}")
    env = [
        V1EnvVar(name=ENV_DRIVER, value=driver),
        V1EnvVar(name=ENV_EXECUTOR_ID, value=executor_id),
        V1EnvVar(name=ENV_EXECUTOR_INDEX, value=str(index)),
        V1EnvVar(name=ENV_ATTEMPT, value=str(attempt)),
        V1EnvVar(name=ENV_ROLE, value=ref.role),
        V1EnvVar(name=ENV_RUN_ID, value=ref.run_id),
        V1EnvVar(name=ENV_JOB, value=ref.job),
        _field_env(ENV_POD_NAME, "metadata.name"),
        _field_env(ENV_NAMESPACE, "metadata.namespace"),
        _field_env(ENV_POD_IP, "status.podIP"),
    ]
    if service is not None:
        env.append(V1EnvVar(name=ENV_SERVICE, value=service))
    if token is not None:
        env.append(_secret_env(token_env, token))
    env += [V1EnvVar(name=k, value=v) for k, v in template.env.items()]
    env += [_secret_env(k, secret) for k, secret in template.secret_env.items()]
    container = V1Container(
        name=CONTAINER_NAME,
        image=template.image,
        image_pull_policy=template.image_pull_policy,
        command=list(template.command),
        args=list(template.args) or None,
        working_dir=template.working_dir,
        env=env,
        env_from=[V1EnvFromSource(config_map_ref=V1ConfigMapEnvSource(name=n)) for n in template.env_from_config_maps]
        + [V1EnvFromSource(secret_ref=V1SecretEnvSource(name=n)) for n in template.env_from_secrets]
        or None,
        ports=[V1ContainerPort(name=n, container_port=p, protocol="TCP") for n, p in template.ports.items()] or None,
        resources=resource_requirements(resources),
        resize_policy=[
            V1ContainerResizePolicy(resource_name="cpu", restart_policy="NotRequired"),
            V1ContainerResizePolicy(resource_name="memory", restart_policy="NotRequired"),
        ],
        # A failed executor's last log lines become its termination message: the job's error.
        termination_message_policy="FallbackToLogsOnError",
        volume_mounts=list(template.volume_mounts) or None,
        security_context=V1SecurityContext(
            allow_privilege_escalation=False,
            capabilities=V1Capabilities(drop=["ALL"]),
            seccomp_profile=V1SeccompProfile(type="RuntimeDefault"),
            run_as_non_root=True if template.run_as_user is not None else None,
            run_as_user=template.run_as_user,
        ),
    )
    affinity = None
    if avoid_nodes:
        avoid = V1NodeSelectorRequirement(key="metadata.name", operator="NotIn", values=sorted(avoid_nodes))
        affinity = V1Affinity(
            node_affinity=V1NodeAffinity(
                required_during_scheduling_ignored_during_execution=V1NodeSelector(
                    node_selector_terms=[V1NodeSelectorTerm(match_fields=[avoid])]
                )
            )
        )
    spec = V1PodSpec(
        containers=[container],
        restart_policy="Never",
        hostname=dns_name(executor_id),
        subdomain=service,
        service_account_name=template.service_account,
        # Executors never call the Kubernetes API unless given an account for it.
        automount_service_account_token=None if template.service_account else False,
        enable_service_links=False,
        node_selector=dict(template.node_selector) or None,
        affinity=affinity,
        termination_grace_period_seconds=template.termination_grace_s,
        volumes=list(template.volumes) or None,
    )
    labels = {LABEL_EXECUTOR: label_value(executor_id), LABEL_ATTEMPT: str(attempt)}
    metadata = _metadata(
        ref,
        generate_name=pod_name_prefix(ref, executor_id, attempt),
        labels=labels,
        owner=owner,
        annotations={ANNOTATION_EXECUTOR: executor_id},
    )
    return V1Pod(api_version="v1", kind="Pod", metadata=metadata, spec=spec)


def executor_service(ref: PoolRef, ports: Mapping[str, int], owner: V1OwnerReference | None = None) -> V1Service:
    """The headless Service of a pool's executors (every pool instance of the run and role): DNS for
    each pod, and the Flight endpoints by their named port. Not-ready pods are published, since
    executors have no readiness probe and announce themselves to the driver."""
    spec = V1ServiceSpec(
        cluster_ip="None",
        selector=ref.run_labels(),
        publish_not_ready_addresses=True,
        ports=[V1ServicePort(name=n, port=p, target_port=n, protocol="TCP") for n, p in ports.items()] or None,
    )
    metadata = _metadata(ref, name=service_name(ref), owner=owner)
    return V1Service(api_version="v1", kind="Service", metadata=metadata, spec=spec)


def token_secret(ref: PoolRef, token: str, owner: V1OwnerReference | None = None, key: str = TOKEN_KEY) -> V1Secret:
    """The Secret holding the Flight token under ``key`` (base64 in ``data``, immutable). Never log
    this object: its data is the secret."""
    data = {key: base64.b64encode(token.encode()).decode()}
    metadata = _metadata(ref, name=token_secret_name(ref), owner=owner)
    return V1Secret(api_version="v1", kind="Secret", metadata=metadata, type="Opaque", data=data, immutable=True)
