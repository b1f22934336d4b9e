"""A fake ``kubernetes.client.CoreV1Api`` for the pool tests: no Kubernetes API server can run on these
machines (no kube-apiserver, kwok or envtest installs here; see ENV_NOTES), so the API is simulated.

What it does as a server would: every body goes through the real client's serializer and every answer
back through its deserializer (camelCase field names, types); names, ``generateName``, label values,
owner references, env vars and duplicate names are validated (422 / 409 as the API answers);
``generateName`` gets 5 characters appended; deletion leaves a pod terminating (``deletionTimestamp``)
until the next observation; strategic-merge patches of container resources merge by name; and it
plays scheduler + kubelet: each read or list advances every pod one step (scheduled on a node its
affinity allows -> running with a pod IP -> the outcome of its script, see :data:`SCRIPTS`).

In-place resize is one of ``resize_mode``: ``subresource`` (Kubernetes >= 1.33: ``pods/resize``;
a patch of the pod's resources is refused), ``legacy`` (1.27-1.32 with the feature gate: no
subresource, the pod patch works), ``none`` (neither), ``forbidden`` (RBAC denies ``pods/resize``).
``refuse_memory_decrease`` answers 422 to a memory decrease as 1.33 does.

Every call is recorded as ``(resource, verb)`` in :attr:`FakeCoreV1Api.verbs` (checked against the
shipped RBAC Role) and as ``(method, name)`` in :attr:`FakeCoreV1Api.calls`.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from kubernetes.client import ApiClient, ApiException

# The shell scripts the shared suite runs (``sh -c SCRIPT``) and what Kubernetes reports for each:
# (exit code, reason, termination message) or None for "keeps running". A real cluster runs the script.
RUN = "sleep 3600"
FAIL = "echo boom >&2; exit 3"
OOM = "head -c 1g /dev/zero | tail"
FAIL_FIRST = 'if [ "$PRIMUS_EXECUTOR_ATTEMPT" = 0 ]; then echo first >&2; exit 3; fi; sleep 3600'
SCRIPTS: dict[str, Callable[[dict[str, str]], tuple[int, str, str] | None]] = {
    RUN: lambda env: None,
    FAIL: lambda env: (3, "Error", "boom\n"),
    OOM: lambda env: (137, "OOMKilled", ""),
    FAIL_FIRST: lambda env: (3, "Error", "first\n") if env.get("PRIMUS_EXECUTOR_ATTEMPT") == "0" else None,
}

NODES = ("node-a", "node-b", "node-c")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_STRATEGIC = "application/strategic-merge-patch+json"
_CLIENT = ApiClient()

RESOURCE_OF = {"pod": "pods", "service": "services", "secret": "secrets"}


class _Response:
    """What ``ApiClient.deserialize`` reads: a body."""

    def __init__(self, data: Any):
        self.data = json.dumps(data)


def to_json(obj: Any) -> Any:
    """A client model as the JSON the API server would receive."""
    return _CLIENT.sanitize_for_serialization(obj)


def from_json(data: Any, type_name: str) -> Any:
    return _CLIENT.deserialize(_Response(data), type_name)


def api_error(status: int, reason: str, message: str) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "reason": reason, "code": status})
    return exc


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _validate_meta(meta: dict[str, Any], kind: str, namespace: str) -> None:
    name = meta.get("name")
    if name is None:
        raise api_error(422, "Invalid", f"{kind}: metadata.name: Required value")
    pattern = _DNS_1035 if kind == "service" else _DNS_LABEL
    if len(name) > 63 or not pattern.match(name):
        raise api_error(422, "Invalid", f"{kind} {name!r}: metadata.name: Invalid value")
    if meta.get("namespace") not in (None, namespace):
        raise api_error(400, "BadRequest", "the namespace of the provided object does not match the request")
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, short = key.rpartition("/")
        if (
            len(short) > 63
            or not _LABEL_NAME.match(short)
            or (prefix and not _DNS_LABEL.match(prefix.replace(".", "-")))
        ):
            raise api_error(422, "Invalid", f"metadata.labels: Invalid value: {key!r}")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise api_error(422, "Invalid", f"metadata.labels: Invalid value: {value!r}")
    for ref in meta.get("ownerReferences") or []:
        if not all(ref.get(k) for k in ("apiVersion", "kind", "name", "uid")):
            raise api_error(422, "Invalid", "metadata.ownerReferences: apiVersion, kind, name and uid are required")


def _validate_pod(pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        raise api_error(422, "Invalid", "spec.restartPolicy: Unsupported value")
    for c in spec["containers"]:
        if not c.get("image"):
            raise api_error(422, "Invalid", "spec.containers[0].image: Required value")
        for env in c.get("env") or []:
            if not _ENV_NAME.match(env["name"]):
                raise api_error(422, "Invalid", f"env {env['name']!r}: Invalid value")
            if "value" in env and "valueFrom" in env:
                raise api_error(422, "Invalid", "env: may not have both value and valueFrom")
        for port in c.get("ports") or []:
            if len(port.get("name", "")) > 15:
                raise api_error(422, "Invalid", "ports[].name: must be no more than 15 characters")


class FakeCoreV1Api:
    """The subset of ``CoreV1Api`` the pool calls (see the module docstring)."""

    def __init__(self, *, resize_mode: str = "subresource", refuse_memory_decrease: bool = False):
        self.resize_mode = resize_mode
        self.refuse_memory_decrease = refuse_memory_decrease
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, namespace, name) -> JSON
        self.calls: list[tuple[str, str]] = []
        self.verbs: set[tuple[str, str]] = set()
        self.failures: dict[str, ApiException] = {}
        self._suffix = itertools.count(1)
        self._ip = itertools.count(2)
        self._placement = itertools.count()
        self._uid = itertools.count(1)

    # ----------------------------------------------------------------- test controls
    def fail_next(self, method: str, status: int, reason: str, message: str = "") -> None:
        """The next call of ``method`` raises this API error."""
        self.failures[method] = api_error(status, reason, message or reason)

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The stored pods (JSON), terminating ones included."""
        return [o for (k, ns, _), o in self.objects.items() if k == "pod" and namespace in (None, ns)]

    def remove_pod(self, namespace: str, name: str) -> None:
        """A pod vanishes as after a node loss and garbage collection (outside the pool)."""
        del self.objects[("pod", namespace, name)]

    # ----------------------------------------------------------------- bookkeeping
    def _record(self, method: str, name: str, resource: str, verb: str) -> None:
        self.calls.append((method, name))
        self.verbs.add((resource, verb))
        failure = self.failures.pop(method, None)
        if failure is not None:
            raise failure

    def _create(self, kind: str, namespace: str, body: Any, type_name: str) -> Any:
        data = to_json(body)
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._suffix):05d}"
        self._record(f"create_namespaced_{kind}", meta.get("name", ""), RESOURCE_OF[kind], "create")
        _validate_meta(meta, kind, namespace)
        key = (kind, namespace, meta["name"])
        if key in self.objects:
            raise api_error(409, "AlreadyExists", f'{RESOURCE_OF[kind]} "{meta["name"]}" already exists')
        meta.update(namespace=namespace, uid=f"uid-{next(self._uid)}", creationTimestamp=_now(), resourceVersion="1")
        if kind == "pod":
            _validate_pod(data)
            data["status"] = {"phase": "Pending"}
        self.objects[key] = data
        return from_json(copy.deepcopy(data), type_name)

    def _get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.objects[(kind, namespace, name)]
        except KeyError:
            raise api_error(404, "NotFound", f'{RESOURCE_OF[kind]} "{name}" not found') from None

    # ----------------------------------------------------------------- scheduler + kubelet
    def _observe(self) -> None:
        for key, pod in list(self.objects.items()):
            if key[0] == "pod":
                self._advance(key, pod)

    def _advance(self, key: tuple[str, str, str], pod: dict[str, Any]) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
        if meta.get("deletionTimestamp"):
            del self.objects[key]
            return
        if status["phase"] != "Pending":
            if status["phase"] == "Running":
                self._run_script(pod)
            return
        if not spec.get("nodeName"):
            avoid: set[str] = set()
            affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
            required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
            for term in required.get("nodeSelectorTerms") or []:
                for field in term.get("matchFields") or []:
                    if field["key"] == "metadata.name" and field["operator"] == "NotIn":
                        avoid.update(field["values"])
            allowed = [n for n in NODES if n not in avoid]
            if not allowed:
                status["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes available",
                    }
                ]
                return
            spec["nodeName"] = allowed[next(self._placement) % len(allowed)]
            status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
            return
        container = spec["containers"][0]
        status.update(
            phase="Running",
            podIP=f"10.0.0.{next(self._ip)}",
            containerStatuses=[
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": _now()}},
                    "resources": copy.deepcopy(container.get("resources")),
                }
            ],
        )

    def _run_script(self, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        script = (container.get("args") or [""])[-1]
        env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
        outcome = SCRIPTS.get(script, lambda env: None)(env)
        if outcome is None:
            return
        code, reason, message = outcome
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        pod["status"]["containerStatuses"][0]["state"] = {
            "terminated": {"exitCode": code, "reason": reason, "message": message, "finishedAt": _now()}
        }

    # ----------------------------------------------------------------- pods
    def create_namespaced_pod(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        return self._create("pod", namespace, body, "V1Pod")

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self._record("read_namespaced_pod", name, "pods", "get")
        self._observe()
        return from_json(copy.deepcopy(self._get("pod", namespace, name)), "V1Pod")

    def list_namespaced_pod(self, namespace: str, label_selector: str | None = None, **kwargs: Any) -> Any:
        self._record("list_namespaced_pod", label_selector or "", "pods", "list")
        self._observe()
        items = [p for p in self.pods(namespace) if _matches(p["metadata"].get("labels") or {}, label_selector)]
        return from_json(
            {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": copy.deepcopy(items)}, "V1PodList"
        )

    def delete_namespaced_pod(
        self, name: str, namespace: str, grace_period_seconds: int | None = None, **kw: Any
    ) -> Any:
        self._record("delete_namespaced_pod", name, "pods", "delete")
        pod = self._get("pod", namespace, name)
        pod["metadata"]["deletionTimestamp"] = _now()
        pod["metadata"]["deletionGracePeriodSeconds"] = grace_period_seconds
        return None

    def delete_collection_namespaced_pod(
        self, namespace: str, label_selector: str | None = None, grace_period_seconds: int | None = None, **kw: Any
    ) -> Any:
        self._record("delete_collection_namespaced_pod", label_selector or "", "pods", "deletecollection")
        for pod in self.pods(namespace):
            if _matches(pod["metadata"].get("labels") or {}, label_selector):
                pod["metadata"]["deletionTimestamp"] = _now()
                pod["metadata"]["deletionGracePeriodSeconds"] = grace_period_seconds
        return None

    def _apply_resources(self, namespace: str, name: str, body: dict[str, Any]) -> Any:
        pod = self._get("pod", namespace, name)
        containers = {c["name"]: c for c in pod["spec"]["containers"]}
        for patch in body["spec"]["containers"]:
            if patch["name"] not in containers:
                raise api_error(422, "Invalid", f"spec.containers: container {patch['name']!r} not found")
            new = patch["resources"]
            if new.get("requests") != new.get("limits"):
                raise api_error(422, "Invalid", "Pod QOS Class may not change as a result of resizing")
            old = containers[patch["name"]]["resources"]
            if self.refuse_memory_decrease and _mebibytes(new["limits"]["memory"]) < _mebibytes(
                old["limits"]["memory"]
            ):
                raise api_error(
                    422,
                    "Invalid",
                    "spec.containers[0].resources.limits[memory]: Forbidden: memory limits cannot be decreased",
                )
            containers[patch["name"]]["resources"] = copy.deepcopy(new)
        return from_json(copy.deepcopy(pod), "V1Pod")

    def patch_namespaced_pod_resize(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        self._record("patch_namespaced_pod_resize", name, "pods/resize", "patch")
        assert kwargs.get("_content_type") == _STRATEGIC, "a resize is a strategic-merge patch"
        if self.resize_mode == "forbidden":
            raise api_error(403, "Forbidden", 'pods "x" is forbidden: cannot patch resource "pods/resize"')
        if self.resize_mode != "subresource":
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return self._apply_resources(namespace, name, body)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        self._record("patch_namespaced_pod", name, "pods", "patch")
        assert kwargs.get("_content_type") == _STRATEGIC, "containers merge by name only in a strategic-merge patch"
        self._get("pod", namespace, name)
        if self.resize_mode != "legacy":
            raise api_error(
                422,
                "Invalid",
                "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`, ...",
            )
        return self._apply_resources(namespace, name, body)

    # ----------------------------------------------------------------- services and secrets
    def create_namespaced_service(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        return self._create("service", namespace, body, "V1Service")

    def delete_namespaced_service(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self._record("delete_namespaced_service", name, "services", "delete")
        self._get("service", namespace, name)
        del self.objects[("service", namespace, name)]

    def create_namespaced_secret(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        return self._create("secret", namespace, body, "V1Secret")

    def delete_namespaced_secret(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self._record("delete_namespaced_secret", name, "secrets", "delete")
        self._get("secret", namespace, name)
        del self.objects[("secret", namespace, name)]


def _mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    match = re.match(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)?$", quantity)
    assert match, quantity
    return float(match.group(1)) * units.get(match.group(2) or "", 1 / (1 << 20))
