"""Kubernetes objects (plain dicts, as ``kubectl apply`` sends them) checked against the API's schema, with
no API server (none can run here).

Two checks, both offline:

* the official client's models (``kubernetes.client``, generated from the Kubernetes OpenAPI spec):
  every field must be one the model declares, of its declared type, recursively, and each model is
  built from its fields, so its required fields and enums are enforced (client-side validation);
* ``kubernetes-validate`` (the OpenAPI JSON schemas of each Kubernetes release) in strict mode for
  :data:`VERSIONS` when it is installed (``pip install -c constraints.txt kubernetes-validate``).

``kustomize_build`` renders a kustomization the way ``kubectl kustomize`` does for the subset of
kustomize the deployment uses (resources, namespace, labels, ConfigMap generators with fixed names,
images); where ``kubectl`` is on PATH the tests compare both renders.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml

#: The oldest and newest release the deployment claims (the pool's in-place resize needs >= 1.33 only).
VERSIONS = ("1.29.0", "1.37.0")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}


class SchemaError(AssertionError):
    """An object the API server would refuse: unknown field, wrong type, missing required field."""


def _check(value: Any, type_name: str, path: str) -> Any:
    """``value`` checked against the client type ``type_name``; returns it as the client's model."""
    if type_name == "object":
        return value  # IntOrString and free-form fields
    if type_name in _PRIMITIVES:
        ok = isinstance(value, _PRIMITIVES[type_name]) and not (type_name == "int" and isinstance(value, bool))
        if not ok:
            raise SchemaError(f"{path}: expected {type_name}, got {value!r}")
        return value
    if match := re.fullmatch(r"list\[(.+)\]", type_name):
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected a list, got {value!r}")
        return [_check(item, match.group(1), f"{path}[{i}]") for i, item in enumerate(value)]
    if match := re.fullmatch(r"dict[(\[]str, (.+)[)\]]", type_name):
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected a mapping, got {value!r}")
        return {k: _check(v, match.group(1), f"{path}.{k}") for k, v in value.items()}
    model = getattr(kubernetes.client, type_name)
    if not isinstance(value, dict):
        raise SchemaError(f"{path}: expected a {type_name} object, got {value!r}")
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    kwargs = {}
    for key, item in value.items():
        if key not in by_json:
            raise SchemaError(f"{path}: unknown field {key!r} of {type_name}")
        attr = by_json[key]
        kwargs[attr] = _check(item, model.openapi_types[attr], f"{path}.{key}")
    try:
        return model(**kwargs)
    except ValueError as exc:
        raise SchemaError(f"{path}: {exc}") from None


def model_name(obj: dict[str, Any]) -> str:
    """The client model of a manifest: ``apps/v1`` ``Deployment`` -> ``V1Deployment``."""
    version = str(obj.get("apiVersion", "")).rsplit("/", 1)[-1]
    return f"{version[:1].upper()}{version[1:]}{obj.get('kind', '')}"


def validate(obj: dict[str, Any]) -> None:
    """Raise :class:`SchemaError` unless ``obj`` is a valid Kubernetes object (see the module docstring)."""
    name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
    if not hasattr(kubernetes.client, model_name(obj)):
        raise SchemaError(f"{name}: no such kind {obj.get('apiVersion')} {obj.get('kind')}")
    _check(obj, model_name(obj), name)
    try:
        import kubernetes_validate
    except ImportError:
        return
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise SchemaError(f"{name} (Kubernetes {version}): {exc.message} at {list(exc.path)}") from None


def load_all(path: Path) -> list[dict[str, Any]]:
    """The documents of a YAML file (empty ones dropped)."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _image(image: str, rules: list[dict[str, Any]]) -> str:
    name, _, tag = image.partition(":")
    for rule in rules:
        if rule["name"] == name:
            return f"{rule.get('newName', name)}:{rule.get('newTag', tag)}"
    return image


def _containers(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = obj.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or spec
    for key in ("initContainers", "containers"):
        yield from pod.get(key) or []


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` renders, for the subset of kustomize the deployment uses
    (a stand-in for kubectl, which CI may lack; the tests compare the two where kubectl exists)."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objects: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = (directory / resource).resolve()
        objects += kustomize_build(path) if path.is_dir() else load_all(path)
    for generator in spec.get("configMapGenerator", []):
        data = {Path(f).name: (directory / f).read_text() for f in generator.get("files", [])}
        data.update(literal.split("=", 1) for literal in generator.get("literals", []))
        if generator.get("behavior") == "merge":
            target = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == generator["name"])
            target.setdefault("data", {}).update(data)
        else:
            objects.append(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
            )
    for obj in objects:
        meta = obj.setdefault("metadata", {})
        if spec.get("namespace"):
            meta["namespace"] = spec["namespace"]
            for subject in obj.get("subjects", []) if obj["kind"] == "RoleBinding" else []:
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = spec["namespace"]
        for label in spec.get("labels", []):
            meta.setdefault("labels", {}).update(label["pairs"])
        for container in _containers(obj):
            container["image"] = _image(container["image"], spec.get("images", []))
    return objects
