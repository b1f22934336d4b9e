"""The pure manifest builders: resources, labels, env, Flight ports, owner references, names, the token.

Objects are checked as the API server receives them (serialized by the official client).
"""

from __future__ import annotations

import base64
import itertools
import json
import re

import pytest
from fake_core_v1 import to_json

from primus_dagster.cluster import Resources
from primus_dagster.cluster.kubernetes import (
    CONTAINER_NAME,
    FLIGHT_PORT,
    ContainerTemplate,
    DataExecutorArgs,
    PoolRef,
    SecretRef,
    data_executor_container,
    dns_name,
    executor_pod,
    executor_service,
    label_value,
    owner_reference,
    token_secret,
    trainer_container,
)
from primus_dagster.cluster.kubernetes.manifests import (
    ENV_TOKEN,
    MAX_GENERATE_NAME,
    cpu_quantity,
    pod_name_prefix,
    resize_patch,
    service_name,
    token_secret_name,
)
from primus_dagster.data import ExecutorConfig
from primus_dagster.data.executor import TOKEN_ENV

TOKEN = "s3cret-token-value-0123456789"
RUN_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
OWNER = owner_reference("Pod", "dagster-step-abc", "uid-123")


def ref(job: str = "ctr", run_id: str = RUN_ID, role: str = "data") -> PoolRef:
    return PoolRef(job=job, run_id=run_id, role=role, namespace="ml", instance="a1b2c3d4")  # type: ignore[arg-type]


def data_pod(**kwargs) -> dict:
    template = data_executor_container("registry.example/primus:1.0", DataExecutorArgs(job_spec="/app/job.yaml"))
    defaults = dict(index=3, attempt=1, resources=Resources(1.5, 1536 << 20), driver="grpc://10.1.2.3:7000")
    pod = executor_pod(ref(), template, "data-3", **{**defaults, **kwargs})
    return to_json(pod)


def env_of(pod: dict) -> dict[str, dict]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def test_resources_are_requests_and_limits_with_in_place_resize_policy() -> None:
    container = data_pod()["spec"]["containers"][0]
    assert container["name"] == CONTAINER_NAME
    assert container["resources"] == {
        "requests": {"cpu": "1500m", "memory": "1536Mi"},
        "limits": {"cpu": "1500m", "memory": "1536Mi"},
    }
    assert {p["resourceName"]: p["restartPolicy"] for p in container["resizePolicy"]} == {
        "cpu": "NotRequired",
        "memory": "NotRequired",
    }
    assert cpu_quantity(2.0) == "2" and cpu_quantity(0.25) == "250m"
    with pytest.raises(ValueError):
        cpu_quantity(0.0001)
    patch = resize_patch(Resources(2.0, 4 << 30))
    assert patch["spec"]["containers"] == [
        {
            "name": CONTAINER_NAME,
            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        }
    ]


def test_labels_identify_job_run_role_executor_and_attempt() -> None:
    pod = data_pod()
    labels = pod["metadata"]["labels"]
    assert labels["primus-dagster.io/job"] == "ctr"
    assert labels["primus-dagster.io/run-id"] == RUN_ID
    assert labels["primus-dagster.io/role"] == "data"
    assert labels["primus-dagster.io/executor-id"] == "data-3"
    assert labels["primus-dagster.io/attempt"] == "1"
    assert labels["primus-dagster.io/pool"] == "a1b2c3d4"
    assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in labels.values())
    selector = dict(term.split("=") for term in ref().selector().split(","))
    assert selector.items() <= labels.items()
    assert pod["metadata"]["annotations"]["primus-dagster.io/executor-id"] == "data-3"


@pytest.mark.parametrize("value", ["x" * 100, "a b/c", "-lead", "trail.", "UPPER_ok", "", "ünïcode"])
def test_label_values_are_always_valid_and_distinct(value: str) -> None:
    out = label_value(value)
    assert len(out) <= 63 and LABEL_VALUE.match(out)
    assert out == label_value(value)  # deterministic
    assert label_value(value + "!") != out


def test_env_carries_driver_ids_pod_ip_and_the_token_only_by_secret_reference() -> None:
    pod = data_pod(token=SecretRef("ctr-token", "token"))
    env = env_of(pod)
    assert env["PRIMUS_DRIVER"]["value"] == "grpc://10.1.2.3:7000"
    assert env["PRIMUS_EXECUTOR_ID"]["value"] == "data-3"
    assert env["PRIMUS_EXECUTOR_INDEX"]["value"] == "3"
    assert env["PRIMUS_EXECUTOR_ATTEMPT"]["value"] == "1"
    assert env["PRIMUS_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert ENV_TOKEN == TOKEN_ENV  # the variable the data executor reads
    assert env[TOKEN_ENV] == {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": "ctr-token", "key": "token"}}}
    assert "value" not in env[TOKEN_ENV]
    assert env["OPENBLAS_NUM_THREADS"]["value"] == "1"  # the executor's defaults (EXECUTOR_ENV)
    tuned = data_executor_container("i:1", DataExecutorArgs(job_spec="/j.yaml"), env={"OPENBLAS_NUM_THREADS": "2"})
    assert tuned.env["OPENBLAS_NUM_THREADS"] == "2"  # the template's env wins
    # Executors get no API credentials and no service-link variables.
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["enableServiceLinks"] is False


def test_no_literal_token_anywhere_in_pod_or_service() -> None:
    template = data_executor_container(
        "registry.example/primus:1.0",
        DataExecutorArgs(job_spec="/app/job.yaml"),
        secret_env={"KAFKA_PASSWORD": SecretRef("kafka", "password")},
    )
    pod = executor_pod(
        ref(),
        template,
        "data-0",
        index=0,
        attempt=0,
        resources=Resources(1, 1 << 30),
        driver="grpc://d:1",
        token=SecretRef(token_secret_name(ref())),
        owner=OWNER,
        service=service_name(ref()),
    )
    text = json.dumps([to_json(pod), to_json(executor_service(ref(), template.ports, OWNER))])
    assert TOKEN not in text and base64.b64encode(TOKEN.encode()).decode() not in text
    assert env_of(to_json(pod))["KAFKA_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kafka", "key": "password"}
    with pytest.raises(ValueError, match="Secret reference"):
        ContainerTemplate(image="i", command=("x",), env={TOKEN_ENV: TOKEN})


def test_token_secret_holds_the_callers_token() -> None:
    secret = to_json(token_secret(ref(), TOKEN, OWNER))
    assert secret["metadata"]["name"] == token_secret_name(ref())
    assert secret["type"] == "Opaque" and secret["immutable"] is True
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    assert TOKEN not in json.dumps(secret)  # base64 only, never the plain value
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "dagster-step-abc", "uid": "uid-123"}
    ]


def test_flight_port_is_named_and_served_by_a_headless_service() -> None:
    pod = to_json(
        executor_pod(
            ref(),
            data_executor_container("img:1", DataExecutorArgs(job_spec="/j.yaml")),
            "data-0",
            index=0,
            attempt=0,
            resources=Resources(1, 1 << 30),
            driver="grpc://d:1",
            service=service_name(ref()),
        )
    )
    assert pod["spec"]["containers"][0]["ports"] == [
        {"name": "flight", "containerPort": FLIGHT_PORT, "protocol": "TCP"}
    ]
    assert pod["spec"]["hostname"] == "data-0" and pod["spec"]["subdomain"] == service_name(ref())
    service = to_json(executor_service(ref(), {"flight": FLIGHT_PORT}, OWNER))
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"] == [
        {"name": "flight", "port": FLIGHT_PORT, "targetPort": "flight", "protocol": "TCP"}
    ]
    # It selects every pod of the run and role (not one pool instance): DNS survives a retried step.
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert "primus-dagster.io/pool" not in service["spec"]["selector"]


def test_owner_references_and_restart_policy_never() -> None:
    pod = data_pod(owner=OWNER)
    assert pod["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "dagster-step-abc", "uid": "uid-123"}
    ]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "ownerReferences" not in data_pod()["metadata"]


def test_names_are_dns_labels_of_at_most_63_characters_deterministic_and_distinct() -> None:
    long_ref = ref(job="j" * 53, run_id="R" * 36)
    for executor_id in ("data-0", "Data_Executor/" + "x" * 80, "7"):
        prefix = pod_name_prefix(long_ref, executor_id, 12)
        assert prefix.endswith("-") and len(prefix) <= MAX_GENERATE_NAME  # + 5 server characters <= 63
        assert DNS_1035.match(prefix[:-1])
        assert prefix == pod_name_prefix(long_ref, executor_id, 12)
        assert prefix != pod_name_prefix(long_ref, executor_id, 13)
    for name in (service_name(long_ref), token_secret_name(long_ref), dns_name("9lives"), dns_name("a" * 200)):
        assert len(name) <= 63 and DNS_1035.match(name), name
    assert dns_name("ctr", "run", "data") == "ctr-run-data"  # valid names stay readable
    assert dns_name("x" * 80) != dns_name("x" * 81)  # cut names differ by their hash
    assert dns_name("CTR") != dns_name("ctr")


def test_avoided_nodes_become_a_node_affinity() -> None:
    pod = data_pod(avoid_nodes={"node-b", "node-a"})
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-a", "node-b"]}]}]
    assert "affinity" not in data_pod()["spec"]


def test_data_executor_command_uses_the_executors_own_flags() -> None:
    args = DataExecutorArgs(
        job_spec="/app/job.yaml", data_root="/data", trainers=2, kafka_bootstrap="k:9092", heartbeat_s=2
    )
    container = to_json(
        executor_pod(
            ref(),
            data_executor_container("img:1", args),
            "data-0",
            index=0,
            attempt=0,
            resources=Resources(1, 1 << 30),
            driver="grpc://d:1",
        )
    )["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "primus_dagster.data.executor"]
    argv = container["args"]
    flags = {a for a in argv if a.startswith("--")}
    reference = ExecutorConfig(
        driver="d",
        executor_id="e",
        job_spec="j",
        advertise="a",
        executor_index=0,
        trainers=2,
        kafka_bootstrap="k",
        heartbeat_s=1.0,
        shm=False,
    ).argv()
    assert flags <= {a for a in reference if a.startswith("--")}
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--driver"] == "$(PRIMUS_DRIVER)" and pairs["--executor-id"] == "$(PRIMUS_EXECUTOR_ID)"
    assert pairs["--advertise"] == "$(PRIMUS_POD_IP)" and pairs["--host"] == "0.0.0.0"
    assert pairs["--port"] == str(FLIGHT_PORT) and pairs["--trainers"] == "2"
    assert "--no-shm" in argv and "--token" not in argv
    # Every $(VAR) the arguments use is defined in the container's env (Kubernetes expands them).
    defined = {e["name"] for e in container["env"]}
    assert set(re.findall(r"\$\((\w+)\)", " ".join(argv))) <= defined


def test_trainer_runs_the_callers_command() -> None:
    template = trainer_container("img:1", ["python", "-m", "my.trainer"], ["--rank", "$(PRIMUS_EXECUTOR_INDEX)"])
    pod = to_json(
        executor_pod(
            ref(role="training"),
            template,
            "training-1",
            index=1,
            attempt=0,
            resources=Resources(4, 8 << 30),
            driver="grpc://d:1",
        )
    )
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "my.trainer"] and container["args"] == [
        "--rank",
        "$(PRIMUS_EXECUTOR_INDEX)",
    ]
    assert "ports" not in container
    assert pod["metadata"]["labels"]["primus-dagster.io/role"] == "training"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"image": ""}, "image"),
        ({"image": "has space"}, "image"),
        ({"command": ()}, "command"),
        ({"ports": {"flight-port-too-long": 1}}, "port name"),
        ({"ports": {"flight": 70000}}, "65535"),
        ({"env": {"PRIMUS_DRIVER": "x"}}, "set by the pool"),
        ({"env": {"1BAD": "x"}}, "variable name"),
    ],
)
def test_container_template_rejects_what_the_api_would(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ContainerTemplate(**{"image": "img:1", "command": ("x",), **kwargs})


def test_containers_run_without_privileges() -> None:
    context = data_pod()["spec"]["containers"][0]["securityContext"]
    assert context == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    template = ContainerTemplate(image="img:1", command=("x",), run_as_user=1000)
    pod = to_json(
        executor_pod(ref(), template, "data-0", index=0, attempt=0, resources=Resources(1, 1 << 30), driver="d")
    )
    context = pod["spec"]["containers"][0]["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == 1000
