"""The Kubernetes pool's API calls: launch, status, OOM mapping, restart, resize in place and by replacement, close.

The ``cluster`` fixture is a FAKE ``CoreV1Api`` (``fake_core_v1.py``) because no Kubernetes API server can
run on these machines; it round-trips every object through the official client's (de)serializer and
plays scheduler and kubelet. With ``KUBECONFIG`` set, the shared tests (those taking ``cluster``) also
run against that real cluster (kind, k3s): namespace ``$PRIMUS_K8S_TEST_NAMESPACE`` (default
``default``), image ``$PRIMUS_K8S_TEST_IMAGE`` (default ``busybox:1.36``, it runs ``sh -c SCRIPT``).
Tests that need to inject faults or pick the cluster's resize support use the fake alone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from fake_core_v1 import FAIL, FAIL_FIRST, OOM, RUN, FakeCoreV1Api
from kubernetes.client import CoreV1Api

from primus_dagster.cluster import ExecutorPool, PoolError, Resources
from primus_dagster.cluster.kubernetes import (
    ContainerTemplate,
    KubernetesPool,
    default_namespace,
    load_core_api,
    owner_reference,
    pod_owner,
)
from primus_dagster.spec import PoolSpec, parse_job_spec

REPO = Path(__file__).resolve().parents[3]
TOKEN = "flight-token-do-not-echo-4242"
MIB = 1 << 20
# Opt-in: the real-cluster variants run only where a cluster is configured.
real_cluster = pytest.mark.skipif(
    not os.environ.get("KUBECONFIG"), reason="set KUBECONFIG to run the pool suite against a real cluster"
)


@dataclass
class Cluster:
    api: Any
    namespace: str
    image: str
    fake: FakeCoreV1Api | None
    poll_s: float
    timeout_s: float


@pytest.fixture(params=["fake", pytest.param("real", marks=real_cluster)])
def cluster(request: pytest.FixtureRequest) -> Cluster:
    if request.param == "fake":
        fake = FakeCoreV1Api()
        return Cluster(fake, "ml", "busybox:1.36", fake, 0.0, 5.0)
    kubernetes.config.load_kube_config()
    namespace = os.environ.get("PRIMUS_K8S_TEST_NAMESPACE", "default")
    image = os.environ.get("PRIMUS_K8S_TEST_IMAGE", "busybox:1.36")
    return Cluster(CoreV1Api(), namespace, image, None, 1.0, 240.0)


@pytest.fixture
def make_pool() -> Iterator[Callable[..., KubernetesPool]]:
    made: list[KubernetesPool] = []

    def make(
        cluster: Cluster, script: str = RUN, *, memory: str = "64Mi", cpu: float = 0.1, **kwargs: Any
    ) -> KubernetesPool:
        spec = PoolSpec(replicas=1, min_replicas=0, max_replicas=8, cpu=cpu, memory=memory)
        template = ContainerTemplate(
            image=cluster.image, command=("sh", "-c"), args=(script,), ports={"flight": 8815}, termination_grace_s=1
        )
        kwargs.setdefault("run_id", str(uuid.uuid4()))
        pool = KubernetesPool(
            "data",
            spec,
            template,
            job="primus-test",
            driver="grpc://driver.ml.svc:7000",
            namespace=cluster.namespace,
            api=cluster.api,
            **kwargs,
        )
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


def wait(pool: KubernetesPool, cluster: Cluster, ids: list[str], *states: str) -> list[Any]:
    return pool.wait_for(ids, states or ("running",), timeout_s=cluster.timeout_s, poll_s=cluster.poll_s)


def run_pods(cluster: Cluster, pool: KubernetesPool, **labels: str) -> list[Any]:
    """The pool's pods that are not being deleted."""
    selector = pool.ref.selector(**labels)
    pods = cluster.api.list_namespaced_pod(cluster.namespace, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def gone(cluster: Cluster, pool: KubernetesPool) -> bool:
    """Whether no pod of the pool is left (a real cluster takes the grace period to delete them)."""
    import time

    deadline = time.monotonic() + cluster.timeout_s
    while cluster.api.list_namespaced_pod(cluster.namespace, label_selector=pool.ref.selector()).items:
        if time.monotonic() > deadline:
            return False
        time.sleep(cluster.poll_s)
    return True


# ----------------------------------------------------------------- the shared suite (fake, and a real cluster)
def test_launch_runs_labeled_pods_and_close_removes_them(cluster: Cluster, make_pool) -> None:
    pool = make_pool(cluster)
    ids = pool.launch(2)
    assert ids == ["data-0", "data-1"]
    statuses = wait(pool, cluster, ids)
    for status in statuses:
        assert status.role == "data" and status.attempt == 0 and status.node
        assert status.resources == Resources(0.1, 64 * MIB)
        assert status.address.startswith("grpc://") and status.address.endswith(":8815")
        assert status.labels["primus-dagster.io/executor-id"] == status.executor_id
    pods = run_pods(cluster, pool)
    assert sorted(p.metadata.labels["primus-dagster.io/executor-id"] for p in pods) == ids
    for pod in pods:
        assert pod.spec.restart_policy == "Never"
        assert pod.spec.containers[0].resources.limits == {"cpu": "100m", "memory": "64Mi"}
    pool.close()
    assert gone(cluster, pool)
    assert [s.state for s in pool.status()] == ["stopped", "stopped"]
    pool.close()  # idempotent
    with pytest.raises(PoolError, match="closed"):
        pool.launch(1)


def test_a_failed_exit_is_reported_with_its_message(cluster: Cluster, make_pool) -> None:
    pool = make_pool(cluster, FAIL)
    [status] = wait(pool, cluster, pool.launch(1), "failed")
    assert status.exit_code == 3
    assert status.last_error is not None and "exit code 3" in status.last_error and "boom" in status.last_error


def test_an_oom_kill_is_reported_as_oom_killed(cluster: Cluster, make_pool) -> None:
    pool = make_pool(cluster, OOM, memory="64Mi")
    [status] = wait(pool, cluster, pool.launch(1), "oom_killed")
    assert status.finished and status.exit_code == 137 and "OOMKilled" in (status.last_error or "")


def test_restart_recreates_a_finished_executor_as_its_next_attempt(cluster: Cluster, make_pool) -> None:
    pool = make_pool(cluster, FAIL_FIRST)
    [executor_id] = pool.launch(1)
    [failed] = wait(pool, cluster, [executor_id], "failed")
    assert failed.attempt == 0
    bigger = Resources(0.2, 96 * MIB)
    pool.restart(executor_id, bigger)
    [running] = wait(pool, cluster, [executor_id])
    assert (running.attempt, running.resources, running.last_error) == (1, bigger, None)
    [pod] = run_pods(cluster, pool, **{"primus-dagster.io/attempt": "1"})
    assert pod.spec.containers[0].resources.limits == {"cpu": "200m", "memory": "96Mi"}
    assert len(run_pods(cluster, pool)) == 2  # the failed attempt's pod stays for its logs until close
    with pytest.raises(PoolError, match="only a finished executor restarts"):
        pool.restart(executor_id)


def test_resize_gives_a_running_executor_new_resources(cluster: Cluster, make_pool) -> None:
    pool = make_pool(cluster)
    [executor_id] = pool.launch(1)
    wait(pool, cluster, [executor_id])
    bigger = Resources(0.2, 128 * MIB)
    pool.resize(executor_id, bigger)
    [status] = wait(pool, cluster, [executor_id])
    assert status.resources == bigger
    # In place (same attempt) where the cluster can, else a replacement (next attempt).
    assert status.attempt == (0 if pool.supports_in_place_resize else 1)
    [pod] = run_pods(cluster, pool, **{"primus-dagster.io/attempt": str(status.attempt)})
    assert pod.spec.containers[0].resources.requests == {"cpu": "200m", "memory": "128Mi"}


def test_stop_deletes_one_pod_gracefully(cluster: Cluster, make_pool) -> None:
    pool = make_pool(cluster)
    ids = pool.launch(2)
    wait(pool, cluster, ids)
    pool.stop(ids[0])
    assert [s.state for s in pool.status()] == ["stopped", "running"]
    assert [p.metadata.labels["primus-dagster.io/executor-id"] for p in run_pods(cluster, pool)] == [ids[1]]
    pool.stop(ids[0])  # stopping twice is fine
    with pytest.raises(PoolError, match="no executor 'data-9'"):
        pool.stop("data-9")


# ----------------------------------------------------------------- the fake alone
@pytest.fixture
def fake() -> Cluster:
    api = FakeCoreV1Api()
    return Cluster(api, "ml", "busybox:1.36", api, 0.0, 5.0)


@pytest.mark.parametrize(
    "mode,in_place,method",
    [
        ("subresource", True, "patch_namespaced_pod_resize"),  # Kubernetes >= 1.33
        ("legacy", True, "patch_namespaced_pod"),  # 1.27-1.32 with InPlacePodVerticalScaling
        ("none", False, None),  # pod resources immutable: replace
        ("forbidden", False, None),  # no RBAC on pods/resize: replace
    ],
)
def test_resize_in_place_or_by_replacement(
    mode: str, in_place: bool, method: str | None, fake: Cluster, make_pool
) -> None:
    assert fake.fake is not None
    fake.fake.resize_mode = mode
    pool = make_pool(fake)
    [executor_id] = pool.launch(1)
    wait(pool, fake, [executor_id])
    [before] = run_pods(fake, pool)
    pool.resize(executor_id, Resources(0.5, 256 * MIB))
    [status] = wait(pool, fake, [executor_id])
    assert pool.supports_in_place_resize is in_place
    assert status.resources == Resources(0.5, 256 * MIB)
    [after] = run_pods(fake, pool)
    assert after.spec.containers[0].resources.limits == {"cpu": "500m", "memory": "256Mi"}
    if in_place:
        assert after.metadata.name == before.metadata.name and status.attempt == 0
        assert (method, before.metadata.name) in fake.fake.calls
    else:
        assert after.metadata.name != before.metadata.name and status.attempt == 1
        assert ("delete_namespaced_pod", before.metadata.name) in fake.fake.calls
        # The refusal is remembered: the next resize replaces at once, without asking again.
        calls = len(fake.fake.calls)
        pool.resize(executor_id, Resources(1.0, 256 * MIB))
        assert not any(m.startswith("patch") for m, _ in fake.fake.calls[calls:])
        assert pool.status()[0].attempt == 2


def test_a_refused_memory_decrease_replaces_but_in_place_stays_on(fake: Cluster, make_pool) -> None:
    assert fake.fake is not None
    fake.fake.refuse_memory_decrease = True
    pool = make_pool(fake, memory="256Mi")
    [executor_id] = pool.launch(1)
    wait(pool, fake, [executor_id])
    pool.resize(executor_id, Resources(0.1, 128 * MIB))  # 1.33 refuses a memory decrease in place
    assert pool.status()[0].attempt == 1 and pool.supports_in_place_resize is not False
    wait(pool, fake, [executor_id])
    pool.resize(executor_id, Resources(0.3, 128 * MIB))  # CPU alone: in place again
    assert pool.status()[0].attempt == 1 and pool.supports_in_place_resize is True


def test_token_secret_service_and_owner_references(fake: Cluster, make_pool) -> None:
    assert fake.fake is not None
    owner = owner_reference("Pod", "dagster-step-xyz", "uid-owner")
    pool = make_pool(fake, token=TOKEN, owner=owner)
    ids = pool.launch(2)
    kinds = sorted(kind for kind, _, _ in fake.fake.objects)
    assert kinds == ["pod", "pod", "secret", "service"]
    for (kind, _, _), obj in fake.fake.objects.items():
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": "dagster-step-xyz", "uid": "uid-owner"}
        ], kind
    secret_name = pool.token_ref.name if pool.token_ref else ""
    for pod in fake.fake.pods():
        [token_env] = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "PRIMUS_DATA_TOKEN"]
        assert token_env == {
            "name": "PRIMUS_DATA_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": secret_name, "key": "token"}},
        }
        assert TOKEN not in str(pod)
        assert pod["spec"]["subdomain"] == pool.service_name
    pool.launch(1)  # the Secret and the Service are created once
    assert [m for m, _ in fake.fake.calls].count("create_namespaced_secret") == 1
    assert [m for m, _ in fake.fake.calls].count("create_namespaced_service") == 1
    assert pool._token is None  # the pool keeps no copy once the Secret holds it
    pool.close()
    fake.fake._observe()  # terminating pods go
    assert fake.fake.objects == {}
    assert len(ids) == 2


def test_api_errors_name_the_object_and_the_reason_never_a_secret(fake: Cluster, make_pool) -> None:
    assert fake.fake is not None
    pool = make_pool(fake, token=TOKEN)
    fake.fake.fail_next("create_namespaced_secret", 422, "Invalid", f"data[token]: Invalid value: {TOKEN!r}")
    with pytest.raises(PoolError) as err:
        pool.launch(1)
    assert "secret ml/" in str(err.value) and "422 Invalid" in str(err.value) and TOKEN not in str(err.value)
    fake.fake.fail_next("create_namespaced_pod", 403, "Forbidden", 'pods is forbidden: User "x" cannot create pods')
    with pytest.raises(PoolError) as err:
        pool.launch(1)
    message = str(err.value)
    assert (
        "cannot create pod ml/primus-test-" in message
        and "403 Forbidden" in message
        and "cannot create pods" in message
    )
    assert pool.status() == []  # an executor whose pod the API refused is not recorded
    assert pool.launch(1) == ["data-0"]


def test_a_pod_deleted_outside_the_pool_is_failed(fake: Cluster, make_pool) -> None:
    assert fake.fake is not None
    pool = make_pool(fake)
    [executor_id] = pool.launch(1)
    wait(pool, fake, [executor_id])
    fake.fake.remove_pod("ml", run_pods(fake, pool)[0].metadata.name)
    [status] = pool.status()
    assert status.state == "failed" and "deleted outside the pool" in (status.last_error or "")
    pool.restart(executor_id)
    assert wait(pool, fake, [executor_id])[0].attempt == 1


def test_avoided_nodes_accumulate_into_node_affinity(fake: Cluster, make_pool) -> None:
    assert fake.fake is not None
    pool = make_pool(fake, FAIL)
    [executor_id] = pool.launch(1, avoid_nodes=["node-a"])
    [status] = wait(pool, fake, [executor_id], "failed")
    assert status.node != "node-a"
    pool.restart(executor_id, avoid_nodes=["node-b"])
    [status] = wait(pool, fake, [executor_id], "failed")
    assert status.node == "node-c"
    pool.restart(executor_id, avoid_nodes=["node-c"])
    [status] = pool.status()
    assert status.state == "starting" and "Unschedulable" in (status.last_error or "")


def test_resize_of_a_finished_executor_is_refused(fake: Cluster, make_pool) -> None:
    pool = make_pool(fake, FAIL)
    [executor_id] = pool.launch(1)
    wait(pool, fake, [executor_id], "failed")
    with pytest.raises(PoolError, match="restart it with the new resources"):
        pool.resize(executor_id, Resources(1, 128 * MIB))


def test_status_is_one_list_call_for_the_whole_pool(fake: Cluster, make_pool) -> None:
    assert fake.fake is not None
    pool = make_pool(fake)
    pool.launch(5)
    calls = len(fake.fake.calls)
    assert len(pool.status()) == 5
    assert [m for m, _ in fake.fake.calls[calls:]] == ["list_namespaced_pod"]


def test_a_retried_step_takes_over_the_service_and_leaves_the_old_pool_alone(fake: Cluster, make_pool) -> None:
    assert fake.fake is not None
    run_id = str(uuid.uuid4())
    first = make_pool(fake, run_id=run_id)
    first.launch(1)
    second = make_pool(fake, run_id=run_id)  # a retried step: same run and role, a new pool
    [executor_id] = second.launch(1)
    assert executor_id == "data-0"  # same id; pod names differ (generateName)
    assert len({p["metadata"]["name"] for p in fake.fake.pods()}) == 2
    assert ("delete_namespaced_service", second.service_name) in fake.fake.calls
    first.close()
    assert [s.state for s in wait(second, fake, [executor_id])] == ["running"]


def test_a_failed_close_raises_and_can_be_retried(fake: Cluster, make_pool) -> None:
    assert fake.fake is not None
    pool = make_pool(fake)
    pool.launch(1)
    fake.fake.fail_next("delete_collection_namespaced_pod", 500, "InternalError", "etcd timeout")
    with pytest.raises(PoolError, match="500 InternalError: etcd timeout"):
        pool.close()
    pool.close()
    fake.fake._observe()
    assert fake.fake.objects == {}


def test_for_job_takes_image_namespace_and_resources_from_the_spec(fake: Cluster) -> None:
    text = (REPO / "examples" / "job.yaml").read_text()
    job = parse_job_spec(
        text.replace("backend: local", "backend: kubernetes\n  image: registry.example/primus:2\n  namespace: ml")
    )
    pool = KubernetesPool.for_job(
        job,
        "data",
        run_id="run-1",
        driver="grpc://d:7000",
        job_spec_path="/app/job.yaml",
        data_root="/data",
        api=fake.api,
    )
    try:
        assert pool.namespace == "ml" and pool.template.image == "registry.example/primus:2"
        assert pool.default_resources == Resources(job.pools.data.cpu, 2 << 30)
        assert pool.template.command == ("python", "-m", "primus_dagster.data.executor")
        pool.launch(1)
        [pod] = fake.fake.pods("ml") if fake.fake else []
        assert pod["metadata"]["labels"]["primus-dagster.io/job"] == job.name
        trainers = KubernetesPool.for_job(
            job,
            "training",
            run_id="run-1",
            driver="d",
            job_spec_path="/j",
            trainer_command=["python", "t.py"],
            api=fake.api,
        )
        assert trainers.template.command == ("python", "t.py") and trainers.role == "training"
        with pytest.raises(ValueError, match="trainer_command"):
            KubernetesPool.for_job(job, "training", run_id="r", driver="d", job_spec_path="/j", api=fake.api)
    finally:
        pool.close()
    local = parse_job_spec(text)
    with pytest.raises(PoolError, match="backend kubernetes"):
        KubernetesPool.for_job(local, "data", run_id="r", driver="d", job_spec_path="/j", api=fake.api)


def test_token_and_token_secret_are_exclusive(fake: Cluster) -> None:
    from primus_dagster.cluster.kubernetes import SecretRef

    template = ContainerTemplate(image="i:1", command=("sh",))
    with pytest.raises(ValueError, match="not both"):
        KubernetesPool(
            "data",
            PoolSpec(),
            template,
            job="j",
            run_id="r",
            driver="d",
            api=fake.api,
            token="t",
            token_secret=SecretRef("s"),
        )
    pool = KubernetesPool(
        "data",
        PoolSpec(),
        template,
        job="j",
        run_id="r",
        driver="d",
        namespace="ml",
        api=fake.api,
        token_secret=SecretRef("mine", "k"),
    )
    pool.launch(1)
    pool.close()
    assert fake.fake is not None and not any(m == "create_namespaced_secret" for m, _ in fake.fake.calls)
    assert ("delete_namespaced_secret", "mine") not in fake.fake.calls  # not ours to delete


def test_pod_owner_reads_the_owner_uid(fake: Cluster, make_pool) -> None:
    pool = make_pool(fake)
    pool.launch(1)
    name = run_pods(fake, pool)[0].metadata.name
    owner = pod_owner(fake.api, "ml", name)
    assert (owner.kind, owner.name, owner.api_version) == ("Pod", name, "v1") and owner.uid.startswith("uid-")
    with pytest.raises(PoolError, match="404"):
        pod_owner(fake.api, "ml", "nope")


def test_default_api_and_namespace_come_from_the_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(PoolError, match="no Kubernetes API configuration"):
        load_core_api()
    assert default_namespace() == "default"
    config = tmp_path / "config"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "team-ml"}}],
                "current-context": "c",
                "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert isinstance(load_core_api(), CoreV1Api)  # no request is made
    assert default_namespace() == "team-ml"


def test_rbac_role_grants_every_call_the_pool_makes(make_pool) -> None:
    used: set[tuple[str, str]] = set()
    for mode in ("subresource", "legacy", "none"):
        api = FakeCoreV1Api(resize_mode=mode)
        cluster = Cluster(api, "ml", "busybox:1.36", api, 0.0, 5.0)
        pool = make_pool(cluster, FAIL_FIRST, token=TOKEN)
        [executor_id] = pool.launch(1)
        wait(pool, cluster, [executor_id], "failed")
        pool.restart(executor_id)
        wait(pool, cluster, [executor_id])
        pool.resize(executor_id, Resources(0.2, 64 * MIB))
        pool.stop(executor_id)
        pool.close()
        used |= api.verbs
    docs = list(yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "rbac.yaml").read_text()))
    [role] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "primus-dagster-pools"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert used <= granted, used - granted
    assert ("secrets", "get") not in granted and ("secrets", "list") not in granted  # never reads Secrets


def test_the_pool_has_every_method_of_the_contract() -> None:
    import inspect

    for name in ("launch", "stop", "restart", "resize", "status", "close"):
        ours = list(inspect.signature(getattr(KubernetesPool, name)).parameters)
        contract = list(inspect.signature(getattr(ExecutorPool, name)).parameters)
        assert ours[: len(contract)] == contract, name
