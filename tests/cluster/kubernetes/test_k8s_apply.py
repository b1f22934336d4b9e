"""The deployment a team applies (``deploy/kubernetes/``, ``docs/kubernetes.md``), without a cluster.

No Kubernetes API server can run here (ENV_NOTES), so what a server would check is checked offline:

* every object ``kubectl apply -k`` sends, base and the docs' overlay, passes the Kubernetes schema
  (:mod:`k8s_schema`: the client's OpenAPI models, and ``kubernetes-validate`` for 1.29 and 1.37 where
  installed); rendered by the kustomize stand-in and, where ``kubectl`` is on PATH, by kubectl too;
* every ConfigMap, Secret, claim, service account and Service a pod names exists (or is one of the two
  Secrets the docs create by command);
* run pods, built by dagster-k8s itself (``construct_dagster_k8s_job``) from ``dagster.yaml`` and the
  ``primus-env`` ConfigMap, get every variable ``dagster.yaml`` reads, the data volume and the user;
* executor pods get the deployment's ``envFrom`` sources and the data volume (``pod_template_from_env``),
  through the real ``data_plane_setup`` and a **fake** ``CoreV1Api`` (``fake_core_v1.py``);
* the one namespace rule: a ``pools.namespace`` other than the step pod's is refused before anything
  is created (the fake API stands in for the cluster);
* the docs' walkthrough names only objects, files, jobs and partitions that exist.

With ``KUBECONFIG`` and ``PRIMUS_K8S_TEST_IMAGE`` (a pushed image of the Dockerfile) set, the
``kubernetes``-marked test runs the walkthrough's commands against that cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import DagsterRun, instance_for_test
from dagster_k8s import K8sRunLauncher, construct_dagster_k8s_job
from fake_core_v1 import FakeCoreV1Api
from k8s_schema import SchemaError, kustomize_build, validate
from kubernetes.client import ApiClient, V1Container, V1ObjectMeta, V1Pod, V1PodSpec
from test_k8s_deployment import dummy_kubeconfig, reference_env

import primus_dagster.cluster.kubernetes as k8s
import primus_dagster.cluster.kubernetes.backend as k8s_backend
from primus_dagster.cluster import PoolError, Resources
from primus_dagster.cluster.backends import data_plane_setup
from primus_dagster.cluster.kubernetes import (
    DataExecutorArgs,
    KubernetesPool,
    PoolRef,
    data_executor_container,
    executor_pod,
    pod_template_from_env,
    step_pod_owner,
)
from primus_dagster.spec import parse_job_spec
from tests.speckit import one_source_spec

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy" / "kubernetes"
DOCS = REPO / "docs" / "kubernetes.md"
IMAGE = "registry.example.com:5000/team/primus-dagster:0.1.0"
#: Created by the docs' commands, never in a file.
COMMAND_SECRETS = {"dagster-postgresql", "primus-secrets"}
KUBECTL = shutil.which("kubectl")


def by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def kubectl_kustomize(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [KUBECTL or "kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def walkthrough() -> str:
    """The bash block of the docs' "From an empty cluster to a materialised partition"."""
    text = DOCS.read_text()
    section = text.split("### From an empty cluster to a materialised partition", 1)[1]
    return section.split("```bash\n", 1)[1].split("\n```", 1)[0]


def overlay(tmp_path: Path, image: str = IMAGE) -> Path:
    """The docs' overlay, made by the docs' own commands in a copy of deploy/."""
    shutil.copytree(DEPLOY, tmp_path / "deploy" / "kubernetes")
    script = walkthrough()
    commands = script[script.index("mkdir -p deploy/overlays/team") : script.index("kubectl apply -k")]
    subprocess.run(["bash", "-euc", commands], cwd=tmp_path, env={**os.environ, "IMAGE": image}, check=True)
    return tmp_path / "deploy" / "overlays" / "team"


def single_node_patch() -> str:
    """The docs' command that makes the data volume ReadWriteOnce (one-node clusters)."""
    text = DOCS.read_text().split("append to the overlay before applying:", 1)[1]
    return text.split("```bash\n", 1)[1].split("\n```", 1)[0]


def pod_specs(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (o["metadata"]["name"], o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
    ]


def env_reads(node: Any) -> set[str]:
    """Every ``{env: NAME}`` of a Dagster config (the variables it reads)."""
    if isinstance(node, dict):
        found = {node["env"]} if set(node) == {"env"} else set()
        return found.union(*(env_reads(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(env_reads(v) for v in node))
    return set()


# ----------------------------------------------------------------- the manifests
def test_every_manifest_of_the_base_passes_the_kubernetes_schema() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    generated = {f for g in kustomization["configMapGenerator"] for f in g["files"]}
    # Every YAML file of deploy/kubernetes is applied: a resource or a generated ConfigMap's content.
    assert {p.name for p in DEPLOY.glob("*.yaml")} == {"kustomization.yaml", *kustomization["resources"], *generated}
    objects = kustomize_build(DEPLOY)
    kinds = by_kind(objects)
    for obj in objects:
        validate(obj)
        assert obj["metadata"]["namespace"] == "primus"
    for name in ("dagster-webserver", "dagster-daemon", "primus-code"):
        assert ("Deployment", name) in kinds
    assert ("StatefulSet", "dagster-postgresql") in kinds and ("Service", "dagster-postgresql") in kinds
    assert ("PersistentVolumeClaim", "primus-data") in kinds
    instance = kinds[("ConfigMap", "dagster-instance")]["data"]["dagster.yaml"]
    assert instance == (DEPLOY / "dagster.yaml").read_text()
    # No secret in any file: Secrets only by command.
    assert not [o for o in objects if o["kind"] == "Secret"]
    if KUBECTL:
        assert by_kind(kubectl_kustomize(DEPLOY)) == kinds


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda c, s: c.update(imagePullPolicyy="Always"), "unknown field 'imagePullPolicyy' of V1Container"),
        (lambda c, s: s.pop("selector"), "Invalid value for `selector`, must not be `None`"),
        (lambda c, s: s.update(replicas="1"), "spec.replicas: expected int"),
        (lambda c, s: c.update(ports=[{"name": "grpc"}]), "container_port"),
    ],
)
def test_the_schema_check_refuses_what_the_api_server_would(change: Any, match: str) -> None:
    deployment = by_kind(kustomize_build(DEPLOY))[("Deployment", "primus-code")]
    change(deployment["spec"]["template"]["spec"]["containers"][0], deployment["spec"])
    with pytest.raises(SchemaError, match=re.escape(match)):
        validate(deployment)


def test_the_docs_overlay_sets_the_image_of_every_pod_and_of_the_run_pods(tmp_path: Path) -> None:
    directory = overlay(tmp_path)
    objects = kustomize_build(directory)
    for obj in objects:
        validate(obj)
    images = {name: spec["containers"][0]["image"] for name, spec in pod_specs(objects)}
    assert images.pop("dagster-postgresql").startswith("postgres:16.")
    assert set(images.values()) == {IMAGE}
    assert by_kind(objects)[("ConfigMap", "primus-env")]["data"]["PRIMUS_IMAGE"] == IMAGE  # K8sRunLauncher job_image
    if KUBECTL:
        assert by_kind(kubectl_kustomize(directory)) == by_kind(objects)


@pytest.mark.skipif(KUBECTL is None, reason="the kustomize stand-in has no patches: needs kubectl")
def test_the_docs_single_node_patch_makes_the_data_volume_read_write_once(tmp_path: Path) -> None:
    directory = overlay(tmp_path)
    subprocess.run(["bash", "-euc", single_node_patch()], cwd=tmp_path, check=True)
    objects = kubectl_kustomize(directory)
    for obj in objects:
        validate(obj)
    assert by_kind(objects)[("PersistentVolumeClaim", "primus-data")]["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_every_name_a_pod_uses_exists() -> None:
    objects = kustomize_build(DEPLOY)
    kinds = by_kind(objects)
    for name, spec in pod_specs(objects):
        if "serviceAccountName" in spec:
            assert ("ServiceAccount", spec["serviceAccountName"]) in kinds, name
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in kinds, name
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in kinds, name
        for container in spec["containers"]:
            mounted = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounted <= {v["name"] for v in spec.get("volumes", [])} | {
                t["metadata"]["name"]
                for t in kinds.get(("StatefulSet", name), {}).get("spec", {}).get("volumeClaimTemplates", [])
            }
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert ("ConfigMap", source["configMapRef"]["name"]) in kinds
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in COMMAND_SECRETS
            for env in container.get("env", []):
                ref = env.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["name"] in COMMAND_SECRETS
                if "configMapKeyRef" in ref:
                    key = ref["configMapKeyRef"]
                    assert key["key"] in kinds[("ConfigMap", key["name"])]["data"]
    # The two Secrets are named in the ConfigMap that passes them on, and the docs create both.
    env = kinds[("ConfigMap", "primus-env")]["data"]
    assert {env["DAGSTER_K8S_PG_PASSWORD_SECRET"], env["PRIMUS_ENV_SECRET"]} == COMMAND_SECRETS
    for secret in COMMAND_SECRETS:
        assert f"create secret generic {secret}" in walkthrough()
    # Services select the pods of their workload.
    for (kind, name), service in kinds.items():
        if kind == "Service":
            workload = kinds.get(("Deployment", name)) or kinds[("StatefulSet", name)]
            assert service["spec"]["selector"].items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def test_the_deployments_get_every_variable_dagster_yaml_reads() -> None:
    kinds = by_kind(kustomize_build(DEPLOY))
    config = kinds[("ConfigMap", "primus-env")]["data"]
    reads = env_reads(yaml.safe_load((DEPLOY / "dagster.yaml").read_text()))
    assert {"DAGSTER_PG_HOST", "DAGSTER_PG_DB", "DAGSTER_PG_USERNAME", "DAGSTER_PG_PASSWORD"} <= reads
    assert config["DAGSTER_K8S_NAMESPACE"] == "primus"  # the kustomization's namespace
    for name in ("dagster-webserver", "dagster-daemon", "primus-code"):
        (container,) = kinds[("Deployment", name)]["spec"]["template"]["spec"]["containers"]
        got = {e["name"] for e in container["env"]}
        for source in container["envFrom"]:
            if "configMapRef" in source:
                got |= set(kinds[("ConfigMap", source["configMapRef"]["name"])]["data"])
        assert reads <= got, (name, reads - got)


# ----------------------------------------------------------------- run and executor pods
def test_run_pods_get_every_variable_dagster_yaml_reads_the_data_volume_and_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run pod dagster-k8s itself builds from the instance (no cluster: a dummy kubeconfig)."""
    kinds = by_kind(kustomize_build(DEPLOY))
    env = kinds[("ConfigMap", "primus-env")]["data"]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())["run_launcher"]
    config["config"].update(load_incluster_config=False, kubeconfig_file=str(dummy_kubeconfig(tmp_path / "kc")))
    with instance_for_test(overrides={"run_launcher": config}) as instance:
        launcher = instance.run_launcher
        assert isinstance(launcher, K8sRunLauncher)
        run = DagsterRun(job_name="ctr_demo_files_hour_job", run_id="0f1e2d3c-aaaa-bbbb-cccc-000000000000")
        context = launcher.get_container_context_for_run(run)
        namespace = context.namespace
        # What K8sRunLauncher._launch_k8s_job_with_args builds (labels aside).
        job = construct_dagster_k8s_job(
            job_config=context.get_k8s_job_config(job_image=None, run_launcher=launcher),
            args=["dagster", "api", "execute_run", "{}"],
            job_name="dagster-run-0f1e2d3c",
            pod_name="dagster-run-0f1e2d3c",
            component="run_worker",
            user_defined_k8s_config=context.run_k8s_config,
            labels={"dagster/job": run.job_name, "dagster/run-id": run.run_id},
            env_vars=[{"name": "DAGSTER_RUN_JOB_NAME", "value": run.job_name}],
        )
    body = ApiClient().sanitize_for_serialization(job)
    validate(body)
    pod = body["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert namespace == "primus" and container["image"] == env["PRIMUS_IMAGE"]  # the Job is created there
    got = {e["name"]: e for e in container["env"]}
    for source in container["envFrom"]:
        if "configMapRef" in source:
            got.update({key: {} for key in kinds[("ConfigMap", source["configMapRef"]["name"])]["data"]})
    reads = env_reads(yaml.safe_load((DEPLOY / "dagster.yaml").read_text()))
    assert reads <= set(got), reads - set(got)  # DAGSTER_PG_HOST/_DB/_USERNAME from primus-env
    password = got["DAGSTER_PG_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password == {"name": "dagster-postgresql", "key": "postgresql-password"}
    assert {"configMapRef": {"name": "primus-env"}} in container["envFrom"]
    assert {"secretRef": {"name": "primus-secrets"}} in container["envFrom"]
    assert {"name": "primus-data", "mountPath": "/data"} in container["volumeMounts"]
    claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
    assert claims["primus-data"] == "primus-data" and ("PersistentVolumeClaim", "primus-data") in kinds
    assert pod["serviceAccountName"] == "primus-dagster"
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["fsGroup"] == 10001


def test_executor_pods_get_the_deployments_env_sources_data_volume_and_user() -> None:
    env = by_kind(kustomize_build(DEPLOY))[("ConfigMap", "primus-env")]["data"]
    template = pod_template_from_env(env)
    container = data_executor_container(
        env["PRIMUS_IMAGE"],
        DataExecutorArgs(job_spec="/app/examples/job.yaml", data_root=env["PRIMUS_DATA_ROOT"]),
        **template,
    )
    ref = PoolRef(job="ctr-demo", run_id="0f1e2d3c-aaaa", role="data", namespace="primus", instance="a1b2c3d4")
    pod = executor_pod(
        ref, container, "data-0", index=0, attempt=0, resources=Resources(1.0, 2 << 30), driver="grpc://10.0.0.5:7000"
    )
    body = ApiClient().sanitize_for_serialization(pod)
    # generateName only (the server appends 5 characters): a name for the schema, as the server would give it.
    validate({**body, "metadata": {**body["metadata"], "name": body["metadata"]["generateName"] + "abcde"}})
    (spec,) = body["spec"]["containers"]
    assert spec["envFrom"] == [{"configMapRef": {"name": "primus-env"}}, {"secretRef": {"name": "primus-secrets"}}]
    assert spec["volumeMounts"] == [{"name": "primus-data", "mountPath": "/data"}]
    assert body["spec"]["volumes"] == [{"name": "primus-data", "persistentVolumeClaim": {"claimName": "primus-data"}}]
    assert spec["securityContext"]["runAsUser"] == 10001 and spec["securityContext"]["runAsNonRoot"] is True
    # The pool's own variables are env, which Kubernetes puts above envFrom: a ConfigMap cannot override them.
    assert {"PRIMUS_DRIVER", "PRIMUS_EXECUTOR_ID"} <= {e["name"] for e in spec["env"]}


def test_pod_template_from_env_adds_only_what_is_set() -> None:
    assert pod_template_from_env({}) == {}
    assert pod_template_from_env({"PRIMUS_ENV_SECRET": "s"}) == {"env_from_secrets": ("s",)}
    with pytest.raises(ValueError, match="PRIMUS_DATA_PVC='d' needs PRIMUS_DATA_ROOT"):
        pod_template_from_env({"PRIMUS_DATA_PVC": "d"})
    with pytest.raises(ValueError, match="not a valid ConfigMap"):
        data_executor_container("img:1", DataExecutorArgs(job_spec="/j.yaml"), env_from_config_maps=("Bad_Name",))


# ----------------------------------------------------------------- the one namespace rule
def step_pod(api: FakeCoreV1Api, namespace: str = "primus", name: str = "dagster-step-abc-xyz") -> str:
    step = V1PodSpec(containers=[V1Container(name="step", image="primus-dagster:dev")], restart_policy="Never")
    api.create_namespaced_pod(namespace, V1Pod(metadata=V1ObjectMeta(name=name), spec=step))
    return name


def test_the_pool_objects_are_owned_by_the_step_pod_in_its_own_namespace() -> None:
    api = FakeCoreV1Api()
    name = step_pod(api)
    for pools_namespace in (None, "primus"):
        owner = step_pod_owner(api, pools_namespace, pod_name=name, pod_namespace="primus")  # type: ignore[arg-type]
        assert owner is not None and owner.name == name and owner.kind == "Pod" and owner.uid.startswith("uid-")


def test_a_pools_namespace_other_than_the_runs_is_refused_before_any_lookup() -> None:
    api = FakeCoreV1Api()
    name = step_pod(api)
    with pytest.raises(
        PoolError,
        match=r"pools.namespace 'ml' is not the namespace this run's pod .* \('primus'\): owner references cannot cross namespaces",
    ):
        step_pod_owner(api, "ml", pod_name=name, pod_namespace="primus")  # type: ignore[arg-type]
    assert not [c for c in api.calls if c[0] == "read_namespaced_pod"]


def test_outside_a_cluster_there_is_no_owner_and_any_namespace_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(k8s_backend, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    monkeypatch.setenv("HOSTNAME", "laptop")
    assert step_pod_owner(FakeCoreV1Api(), "ml") is None  # type: ignore[arg-type]


def kubernetes_job(tmp_path: Path, namespace: str | None) -> Any:
    pools = "{backend: kubernetes, image: 'registry.example.com/primus:1', data: {replicas: 1}"
    pools += f", namespace: {namespace}}}" if namespace else "}"
    return parse_job_spec(one_source_spec("k8s-rule", f"pools: {pools}\n"))


def in_step_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: FakeCoreV1Api, env: dict[str, str]) -> None:
    """This process as a step pod in namespace primus: its service-account namespace, $HOSTNAME, the API."""
    (tmp_path / "namespace").write_text("primus")
    monkeypatch.setattr(k8s_backend, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "namespace")
    monkeypatch.setattr(k8s, "load_core_api", lambda: api)
    monkeypatch.setenv("HOSTNAME", step_pod(api))
    monkeypatch.setenv("PRIMUS_DRIVER_HOST", "10.0.0.5")
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_data_plane_setup_refuses_another_namespace_and_passes_the_env_sources_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeCoreV1Api()
    env = by_kind(kustomize_build(DEPLOY))[("ConfigMap", "primus-env")]["data"]
    in_step_pod(tmp_path, monkeypatch, api, env)
    with pytest.raises(PoolError, match="owner references cannot cross namespaces"):
        data_plane_setup(kubernetes_job(tmp_path, "ml"), run_id="r1")
    job = kubernetes_job(tmp_path, None)
    setup = data_plane_setup(job, run_id="r1")
    assert setup["driver_host"] == "10.0.0.5"
    # The factory's pool as the plane would build it: its pods carry the owner and the env sources.
    plane = type(
        "Plane",
        (),
        {
            "job": job,
            "location": "grpc://10.0.0.5:7000",
            "job_path": "/app/job.yaml",
            "data_root": "/data",
            "kafka_bootstrap": None,
            "trainers": 1,
            "token": None,
            "fields": None,
        },
    )()
    pool = setup["pool_factory"](plane)
    assert isinstance(pool, KubernetesPool) and pool.namespace == "primus"
    with pool:
        pool.launch(1)
        (pod,) = [p for p in api.pods("primus") if p["metadata"]["name"] != os.environ["HOSTNAME"]]
    assert pod["metadata"]["ownerReferences"][0]["name"] == os.environ["HOSTNAME"]
    assert pod["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": "primus-env"}},
        {"secretRef": {"name": "primus-secrets"}},
    ]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "primus-data"


# ----------------------------------------------------------------- the docs' walkthrough
SHOW_JOB = """
import json, definitions
job = definitions.defs.resolve_job_def("ctr_demo_files_hour_job")
print(json.dumps({"partitions": job.partitions_def.get_partition_keys()[:3],
                  "assets": sorted(k.to_user_string() for k in job.asset_layer.executable_asset_keys)}))
"""


def test_the_walkthrough_names_only_what_exists(tmp_path: Path) -> None:
    script = walkthrough()
    kinds = by_kind(kustomize_build(DEPLOY))
    aliases = {"deployment": "Deployment", "deploy": "Deployment", "statefulset": "StatefulSet", "svc": "Service"}
    named = re.findall(r"(?<=\s)(deployment|deploy|statefulset|svc)/([a-z0-9-]+)(?![\w/-])", script)
    assert {name for _, name in named} >= {"dagster-postgresql", "primus-code", "dagster-daemon", "dagster-webserver"}
    for kind, name in named:
        assert (aliases[kind], name) in kinds, f"{kind}/{name}"
    assert "docker build" in script and "docker push" in script and "kubectl apply -k" in script
    assert "-n primus" in script and "kubectl create namespace primus" in script
    # The commands' paths: the repository's, in the image (/app = the repository root, Dockerfile).
    assert (REPO / "Dockerfile").is_file()
    for path in re.findall(r"/app/(\S+)", script):
        assert (REPO / path).exists(), path
    daemon = kinds[("Deployment", "dagster-daemon")]["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"] for m in daemon["volumeMounts"]}
    workspace = re.search(r"-w (\S+)", script).group(1)  # type: ignore[union-attr]
    assert (
        str(Path(workspace).parent) in mounts
        and Path(workspace).name in kinds[("ConfigMap", "dagster-workspace")]["data"]
    )
    location = re.search(r"-l (\S+)", script).group(1)  # type: ignore[union-attr]
    assert (
        yaml.safe_load((DEPLOY / "workspace.yaml").read_text())["load_from"][0]["grpc_server"]["location_name"]
        == location
    )
    # The synthesised sources are the job spec's; the job and its partition are the code location's.
    spec = parse_job_spec((REPO / "examples" / "job.yaml").read_text())
    sources = re.search(r"--sources ((?:\w+ ?)+)", script).group(1).split()  # type: ignore[union-attr]
    assert set(sources) <= {s.name for stream in spec.dataset.streams for s in stream.sources}
    job, partition = re.search(r"-j (\w+) --tags '(.+?)'", script).groups()  # type: ignore[union-attr]
    code = SHOW_JOB.replace("ctr_demo_files_hour_job", job)
    shown = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=reference_env(tmp_path, None),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    out = json.loads(shown.stdout.strip().splitlines()[-1])
    assert json.loads(partition)["dagster/partition"] == out["partitions"][0]
    assert set(sources) <= set(out["assets"])
    assert f"dagster/job={job}" in script


@pytest.mark.kubernetes
@pytest.mark.skipif(
    not (os.environ.get("KUBECONFIG") and os.environ.get("PRIMUS_K8S_TEST_IMAGE")),
    reason="set KUBECONFIG and PRIMUS_K8S_TEST_IMAGE (a pushed image of the Dockerfile) to apply the deployment",
)
def test_the_walkthrough_materialises_a_partition_on_a_real_cluster(tmp_path: Path) -> None:
    """Steps 2-5 of the docs (the image is built and pushed already) against $KUBECONFIG's cluster; the
    namespace primus must not exist yet, and is deleted afterwards. ``PRIMUS_K8S_TEST_SINGLE_NODE=1``
    adds the docs' ReadWriteOnce patch (kind, k3s)."""
    shutil.copytree(DEPLOY, tmp_path / "deploy" / "kubernetes")
    script = walkthrough()
    commands = script[script.index("kubectl create namespace") : script.index("# The UI:")]
    if os.environ.get("PRIMUS_K8S_TEST_SINGLE_NODE"):  # kind, k3s: no ReadWriteMany storage
        commands = commands.replace("kubectl apply -k", f"{single_node_patch()}\nkubectl apply -k", 1)
    env = {**os.environ, "IMAGE": os.environ["PRIMUS_K8S_TEST_IMAGE"]}
    try:
        bash = ["bash", "-euo", "pipefail", "-c", commands]
        done = subprocess.run(bash, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "SUCCESS 2026-11-01-00:00" in done.stdout
    finally:
        subprocess.run(["kubectl", "delete", "namespace", "primus", "--wait=false"], capture_output=True, timeout=60)
