"""Trainer ranks as pods (``cluster/kubernetes/trainers.py``, the rank pod builders of ``manifests.py``).

No Kubernetes API server can run here, so the API is the FAKE ``CoreV1Api`` of ``fake_core_v1.py``
throughout: the manifests of a two-trainer group are checked against the Kubernetes schema (1.29 and 1.37,
``k8s_schema.validate``); :class:`TrainerPods` is driven against the fake (pods with the rank's env, deleted
when stopped, a failed pod's exit code read from its status, everything deleted on release); and in
:class:`ProcessKubelet` the fake's kubelet runs each pod's container as a local process (its env resolved as
the kubelet would: ``$(VAR)`` references, the downward API with a loopback address per pod, the key from the
Secret; the cluster's DNS by the pod's IP), so two trainer pods dial back to a real rank channel and all-reduce.
What only a real cluster shows: scheduling, DNS of the headless Service, image pulls, the kubelet's signals.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fake_core_v1 import FakeCoreV1Api, to_json
from k8s_schema import validate

from primus_dagster.cluster import Resources
from primus_dagster.cluster.kubernetes import (
    PoolRef,
    RankRendezvous,
    SecretRef,
    TrainerPods,
    executor_service,
    owner_reference,
    token_secret,
    trainer_rank_container,
    trainer_rank_pod,
)
from primus_dagster.cluster.kubernetes.manifests import (
    DIAL_BACK_MODULE,
    ENV_RANK_ADDR,
    ENV_RANK_CHANNEL,
    ENV_RANK_CHANNEL_KEY,
    rank_master_addr,
    service_name,
    token_secret_name,
)
from primus_dagster.cluster.pooled_plane import PooledDataPlane, local_data_pool
from primus_dagster.ports import free_port
from primus_dagster.spec import JobSpec, load_job_spec
from primus_dagster.training import rank_group
from primus_dagster.training.distributed import DialBackLauncher, RankProcesses, collect_results, serve_rank
from primus_dagster.training.distributed import channel as rank_channel
from primus_dagster.training.distributed.mesh import RANK_ADDR_ENV
from primus_dagster.training.rank_launchers import rank_launcher
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.window import train_window

REPO = Path(__file__).resolve().parents[3]
HERE = str(Path(__file__).resolve().parent)
TRAINING_TESTS = str(REPO / "tests" / "training")
if TRAINING_TESTS not in sys.path:
    sys.path.insert(0, TRAINING_TESTS)

from jobkit import expected_ids, make_job  # noqa: E402 - tests/training on sys.path first

KEY = "rank-channel-key-never-in-a-manifest-77"
OWNER = owner_reference("Pod", "dagster-step-abc", "uid-123")
RUN_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
IMAGE = "registry.example/primus:3"


def k8s_job(tmp_path: Path) -> JobSpec:
    path = tmp_path / "job.yaml"
    text = (REPO / "examples" / "job.yaml").read_text()
    text = text.replace("backend: local", f"backend: kubernetes\n  image: {IMAGE}\n  namespace: ml")
    text = text.replace(
        "training: {replicas: 1, min_replicas: 1, max_replicas: 1}", "training: {replicas: 2, cpu: 1.5, memory: 3Gi}"
    )
    path.write_text(text)
    return load_job_spec(path)


def env_of(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def test_the_rank_pods_use_the_names_the_ranks_read() -> None:
    assert DIAL_BACK_MODULE == rank_channel.DIAL_BACK_MODULE
    assert (ENV_RANK_CHANNEL, ENV_RANK_CHANNEL_KEY) == (rank_channel.CHANNEL_ENV, rank_channel.CHANNEL_KEY_ENV)
    assert ENV_RANK_ADDR == RANK_ADDR_ENV


def test_a_two_trainer_groups_manifests_pass_the_kubernetes_schema() -> None:
    ref = PoolRef(job="ctr", run_id=RUN_ID, role="training", namespace="ml", instance="a1b2c3d4")
    rendezvous = RankRendezvous(2, rank_master_addr(ref, "trainer-1a2b3c"), "10.0.0.5:41234")
    template = trainer_rank_container(IMAGE, rendezvous, run_as_user=10001)
    key = SecretRef(token_secret_name(ref))
    pods = [
        to_json(
            trainer_rank_pod(
                ref, template, "trainer-1a2b3c", r, attempt=0, resources=Resources(1.5, 3 << 30), key=key, owner=OWNER
            )
        )
        for r in range(2)
    ]
    service = to_json(executor_service(ref, template.ports, OWNER))
    secret = to_json(token_secret(ref, KEY, OWNER))
    for obj in [*pods, service, secret]:
        meta = obj["metadata"]
        # generateName only (the server appends 5 characters): a name for the schema, as the server would give it
        validate({**obj, "metadata": {**meta, "name": meta.get("name") or meta["generateName"] + "abcde"}})
    assert (
        rendezvous.master_addr
        == f"trainer-1a2b3c-0.{service_name(ref)}.ml.svc"
        == "trainer-1a2b3c-0.ctr-0f1e2d3c-training.ml.svc"
    )
    for rank, pod in enumerate(pods):
        spec, (container,) = pod["spec"], pod["spec"]["containers"]
        env = env_of(pod)
        assert container["image"] == IMAGE and container["command"] == ["python", "-m", DIAL_BACK_MODULE]
        assert container["args"] == ["--channel", "$(PRIMUS_RANK_CHANNEL)", "--rank", "$(RANK)", "--timeout-s", "300"]
        assert env["PRIMUS_EXECUTOR_INDEX"]["value"] == str(rank) and env["RANK"]["value"] == "$(PRIMUS_EXECUTOR_INDEX)"
        assert env["WORLD_SIZE"]["value"] == "2" and env["MASTER_ADDR"]["value"] == rendezvous.master_addr
        assert env["MASTER_PORT"]["value"] == "29500" and env[ENV_RANK_CHANNEL]["value"] == "10.0.0.5:41234"
        assert env[ENV_RANK_ADDR]["value"] == "$(PRIMUS_POD_IP)"
        assert env[ENV_RANK_CHANNEL_KEY]["valueFrom"] == {"secretKeyRef": {"name": key.name, "key": "token"}}
        names = [e["name"] for e in container["env"]]
        for i, var in enumerate(container["env"]):  # $(VAR) in a value expands only a variable defined before it
            assert set(re.findall(r"\$\((\w+)\)", var.get("value", ""))) <= set(names[:i]), var
        assert set(re.findall(r"\$\((\w+)\)", " ".join(container["args"]))) <= set(names)
        assert spec["hostname"] == f"trainer-1a2b3c-{rank}" and spec["subdomain"] == service["metadata"]["name"]
        assert container["resources"] == {
            "requests": {"cpu": "1500m", "memory": "3Gi"},
            "limits": {"cpu": "1500m", "memory": "3Gi"},
        }
        assert container["ports"] == [{"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"}]
        assert spec["restartPolicy"] == "Never" and pod["metadata"]["ownerReferences"] == [to_json(OWNER)]
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    text = json.dumps([*pods, service])
    assert KEY not in text and base64.b64encode(KEY.encode()).decode() not in text  # the key only in its Secret


@pytest.mark.parametrize(
    ("env", "match"),
    [({"RANK": "1"}, "set by the trainer rank pod"), ({ENV_RANK_CHANNEL_KEY: KEY}, "set by the pool")],
)
def test_a_rank_template_cannot_set_the_ranks_variables(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        trainer_rank_container(IMAGE, RankRendezvous(2, "m", "10.0.0.5:1"), env=env)


def _finish(fake: FakeCoreV1Api, name: str, code: int, reason: str, message: str) -> None:
    """The kubelet reports the container of pod ``name`` terminated."""
    pod = next(p for p in fake.pods() if p["metadata"]["name"] == name)
    pod["status"]["phase"] = "Failed"
    pod["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"exitCode": code, "reason": reason, "message": message, "finishedAt": "2026-11-01T00:00:00Z"}
    }


def test_trainer_pods_start_stop_and_report_exit_codes_through_the_api(tmp_path: Path) -> None:
    """Against the FAKE API server: each rank a pod of the training pool with its rendezvous and the key by
    Secret reference; a failed pod's exit code from its status; stopped pods reaped; release removes all."""
    job = k8s_job(tmp_path)
    fake = FakeCoreV1Api()
    pods = TrainerPods(job, run_id=RUN_ID, key=KEY, api=fake, owner=OWNER, poll_s=0)
    envs = pods.rendezvous(2)
    assert [e["RANK"] for e in envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"2"}
    prefix = envs[0]["MASTER_ADDR"].split(".")[0].rsplit("-", 1)[0]
    assert envs[0]["MASTER_ADDR"] == f"{prefix}-0.{service_name(pods.ref)}.ml.svc" and prefix.startswith("trainer-")
    handles = [pods.start(r, {**envs[r], ENV_RANK_CHANNEL: "10.0.0.5:41234"}) for r in range(2)]
    created = sorted(fake.pods("ml"), key=lambda p: p["metadata"]["name"])
    assert [p["spec"]["hostname"] for p in created] == [f"{prefix}-0", f"{prefix}-1"]
    pool = handles[0].pool
    assert pool is not None and pool.token_ref is not None
    for rank, pod in enumerate(created):  # what the pool created is what the builder builds
        built = to_json(
            trainer_rank_pod(
                pool.ref,
                pool.template,
                prefix,
                rank,
                attempt=0,
                resources=pool.default_resources,
                key=pool.token_ref,
                owner=OWNER,
            )
        )
        assert (
            pod["spec"]["containers"] == built["spec"]["containers"]
            and pod["metadata"]["labels"] == built["metadata"]["labels"]
        )
        assert env_of(pod)["MASTER_ADDR"]["value"] == envs[0]["MASTER_ADDR"]
    secret = fake.objects[("secret", "ml", pool.token_ref.name)]
    assert base64.b64decode(secret["data"]["token"]).decode() == KEY and KEY not in json.dumps(created)
    assert [h.pid for h in handles] == [None, None] and [h.exitcode for h in handles] == [None, None]
    _finish(fake, created[1]["metadata"]["name"], 3, "Error", "boom")
    assert handles[1].exitcode == 3 and not handles[1].is_alive() and handles[0].is_alive()
    handles[0].terminate()
    handles[0].join(5)
    assert handles[0].exitcode == -signal.SIGTERM  # deleted with the grace period, and gone
    assert ("delete_namespaced_pod", created[0]["metadata"]["name"]) in fake.calls
    fake.remove_pod("ml", created[1]["metadata"]["name"])
    pods.release()
    fake._observe()
    assert fake.objects == {}  # the pods, the Service and the key's Secret
    envs = pods.rendezvous(2)  # the next start: pods of its own, rank 0 at a new name
    assert not envs[0]["MASTER_ADDR"].startswith(f"{prefix}-0.")
    lost = pods.start(0, {**envs[0], ENV_RANK_CHANNEL: "10.0.0.5:41235"})
    fake.remove_pod("ml", fake.pods("ml")[0]["metadata"]["name"])  # a lost node
    assert lost.exitcode == -signal.SIGKILL
    pods.release()


def test_the_kubernetes_backend_gets_trainer_pods_that_dial_back_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIMUS_DRIVER_HOST", "10.0.0.5")
    monkeypatch.setenv("PRIMUS_ENV_CONFIG_MAP", "primus-env")
    job = k8s_job(tmp_path)
    launcher = rank_launcher(job, run_id=RUN_ID, api=FakeCoreV1Api())
    assert isinstance(launcher, DialBackLauncher) and not launcher.children
    assert (launcher.host, launcher.advertise) == ("0.0.0.0", "10.0.0.5")
    pods = launcher.start_rank.__self__  # type: ignore[attr-defined]
    assert isinstance(pods, TrainerPods) and pods.template == {"env_from_config_maps": ("primus-env",)}
    assert launcher.rendezvous == pods.rendezvous and launcher.dial_timeout_s == pods.dial_timeout_s
    local = load_job_spec(REPO / "examples" / "job.yaml")
    assert rank_launcher(local, run_id=RUN_ID) is None  # spawned children, as before


# ----------------------------------------------------------------- pods run as local processes


def all_reduce_rank(rank: int, init_method: str, out: Any, world: int) -> None:
    """Sum ``rank + 1`` over the group (gloo); the result, the rank's peer address and rendezvous host."""

    def body() -> tuple[float, str, str]:
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        return float(value.item()), os.environ[RANK_ADDR_ENV], os.environ["MASTER_ADDR"]

    serve_rank(rank, world, init_method, 1, out, body, timeout_s=60)


class ProcessKubelet(FakeCoreV1Api):
    """The FAKE API server whose kubelet runs each pod's container as a process on this machine: the env
    resolved as a kubelet does (``$(VAR)`` from the variables before it, the downward API -- the pod IP is
    ``127.0.0.<index + 1>``, so each pod stands for a host --, Secret references from the stored Secret),
    ``$(VAR)`` in the args expanded, the cluster's DNS standing in by writing a pod's name as its IP; the
    container's exit code as its status; a deleted pod's process terminated."""

    def __init__(self) -> None:
        super().__init__()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.names: dict[str, str] = {}  # <hostname>.<subdomain>.<namespace>.svc -> pod IP

    def create_namespaced_pod(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        created = super().create_namespaced_pod(namespace, body, **kwargs)
        pod = self.objects[("pod", namespace, created.metadata.name)]
        self.processes[created.metadata.name] = self._run(pod, namespace)
        return created

    def _run(self, pod: dict[str, Any], namespace: str) -> subprocess.Popen[bytes]:
        container, spec = pod["spec"]["containers"][0], pod["spec"]
        env: dict[str, str] = {}
        for var in container["env"]:
            source = var.get("valueFrom")
            if source is None:
                env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), var["value"])
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                ip = f"127.0.0.{int(env['PRIMUS_EXECUTOR_INDEX']) + 1}"
                env[var["name"]] = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": namespace}.get(
                    path, ip
                )
            else:
                ref = source["secretKeyRef"]
                data = self.objects[("secret", namespace, ref["name"])]["data"]
                env[var["name"]] = base64.b64decode(data[ref["key"]]).decode()
        self.names[f"{spec['hostname']}.{spec['subdomain']}.{namespace}.svc"] = env["PRIMUS_POD_IP"]
        env = {k: self.names.get(v, v) for k, v in env.items()}
        args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container.get("args") or []]
        command = [sys.executable if c == "python" else c for c in container["command"]]
        path = os.pathsep.join([HERE, *filter(None, [os.environ.get("PYTHONPATH")])])
        return subprocess.Popen([*command, *args], env={**os.environ, **env, "PYTHONPATH": path})

    def _run_script(self, pod: dict[str, Any]) -> None:
        process = self.processes.get(pod["metadata"]["name"])
        code = process.poll() if process is not None else None
        if code is None:
            return
        code = 128 - code if code < 0 else code  # a signal, as the kubelet reports it
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        pod["status"]["containerStatuses"][0]["state"] = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "finishedAt": "2026-11-01T00:00:00Z",
            }
        }

    def _stop_deleted(self) -> None:
        for (kind, _, name), obj in self.objects.items():
            if kind == "pod" and obj["metadata"].get("deletionTimestamp") and name in self.processes:
                grace = obj["metadata"].get("deletionGracePeriodSeconds")
                process = self.processes[name]
                if process.poll() is None and grace == 0:
                    process.kill()
                elif process.poll() is None:
                    process.terminate()

    def delete_namespaced_pod(
        self, name: str, namespace: str, grace_period_seconds: int | None = None, **kw: Any
    ) -> Any:
        super().delete_namespaced_pod(name, namespace, grace_period_seconds, **kw)
        self._stop_deleted()

    def delete_collection_namespaced_pod(
        self, namespace: str, label_selector: str | None = None, grace_period_seconds: int | None = None, **kw: Any
    ) -> Any:
        super().delete_collection_namespaced_pod(namespace, label_selector, grace_period_seconds, **kw)
        self._stop_deleted()

    def reap(self) -> list[int | None]:
        """Every process stopped and waited for; their exit codes."""
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait(30)
        return [p.returncode for p in self.processes.values()]


@pytest.fixture
def kubelet() -> Iterator[ProcessKubelet]:
    api = ProcessKubelet()
    yield api
    api.reap()


@pytest.mark.integration
def test_two_trainer_pods_dial_back_to_the_step_and_all_reduce(tmp_path: Path, kubelet: ProcessKubelet) -> None:
    """Two trainer pods (run as processes by the FAKE API's kubelet, one "host" each) read their rendezvous
    from their manifests, dial back to the step's rank channel with the key of their Secret, and all-reduce;
    release deletes them, the Service and the Secret."""
    job = k8s_job(tmp_path)
    pods = TrainerPods(job, run_id=RUN_ID, key=KEY, api=kubelet, master_port=free_port(), dial_timeout_s=60, poll_s=0)
    launcher = DialBackLauncher(
        pods.start, authkey=KEY, rendezvous=pods.rendezvous, release=pods.release, dial_timeout_s=60
    )
    with RankProcesses(all_reduce_rank, 2, 2, launcher=launcher) as ranks:
        assert [p.pid for p in ranks.procs] == [None, None]  # pods: nothing to watch here but their status
        results = collect_results(ranks, timeout_s=60)
    assert [value for value, _, _ in results] == [3.0, 3.0]
    assert [address for _, address, _ in results] == ["127.0.0.1", "127.0.0.2"]  # each pod's own IP
    assert {master for _, _, master in results} == {"127.0.0.1"}  # rank 0's name, as the cluster resolves it
    assert kubelet.reap() == [0, 0]
    kubelet._observe()
    assert kubelet.objects == {}


@pytest.mark.integration
def test_a_kubernetes_job_trains_a_window_on_two_trainer_pods_every_sample_once(
    tmp_path: Path, kubelet: ProcessKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train_window`` of a job with ``pools.backend: kubernetes`` and ``pools.training.replicas: 2``, the
    trainer its own choice: two rank pods (run as processes by the FAKE API's kubelet: the API server and the
    rendezvous port are the only things set here; the data executors local, through ``hooks.data_plane``)
    dial back to this process; every sample trained exactly once across them, identical replicas, the
    checkpoints logged by the job process; after the run no pod, Service or Secret is left."""
    env = make_job(tmp_path, mode="mixed", model="single", every=4, hours=1)
    text = env["job_path"].read_text()
    pools = f"backend: kubernetes, image: '{IMAGE}', namespace: ml, data: {{replicas: 2, task_runners: 1}}"
    old = "pools: {data: {replicas: 2, task_runners: 1}, training: {replicas: 1}}"
    assert old in text
    env["job_path"].write_text(text.replace(old, f"pools: {{{pools}, training: {{replicas: 2, restart: never}}}}"))
    job = load_job_spec(env["job_path"])
    monkeypatch.setenv("PRIMUS_DRIVER_HOST", "127.0.0.1")  # the step pod's address, where the ranks dial back
    chosen = functools.partial(rank_launcher, api=kubelet, master_port=free_port(), poll_s=0.05)
    monkeypatch.setattr(rank_group, "rank_launcher", chosen)
    trained: Counter = Counter()
    hooks = RunHooks(
        on_batch=lambda step, batch, trainer: trained.update(batch.sample_id.tolist()),
        data_plane=functools.partial(PooledDataPlane, pool_factory=local_data_pool, driver_host="127.0.0.1"),
    )
    request = TrainingRequest(job, env["job_path"], env["root"], env["window"], executors=1, evaluate=False)
    result = train_window(request, hooks)
    assert trained == expected_ids(env)  # each sample exactly once across the two rank pods
    ranks = result.stats["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["samples"] > 0 for r in ranks)
    assert ranks[0]["params_checksum"] == ranks[1]["params_checksum"] and result.checkpoints
    created = [name for method, name in kubelet.calls if method == "create_namespaced_pod"]
    assert created and len(created) % 2 == 0  # two rank pods per start of the group (a phase)
    assert set(kubelet.reap()) == {0}
    kubelet._observe()
    assert kubelet.objects == {}
