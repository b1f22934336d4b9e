"""Load a JobSpec from YAML with errors that name the key path (and the YAML line)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from primus_dagster.spec.job import JobSpec
from primus_dagster.spec.sources import SOURCE_TYPES

# Union members that pydantic adds to an error location; they are not keys of the YAML.
_TYPE_SEGMENT = re.compile(r"^(list|dict|str|int|float|bool|function-\w+|json-or-python|lax-or-strict|nullable)\b")


class SpecError(ValueError):
    """A job spec could not be loaded; ``problems`` holds one ``(key_path, message)`` per error."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"invalid job spec {source}: {len(problems)} problem(s)"]
        lines += [f"  {path}: {message}" for path, message in problems]
        super().__init__("\n".join(lines))


def format_location(loc: Iterable[Any]) -> str:
    """``('dataset','streams',1,'sources',0,'parquet','window')`` -> ``dataset.streams[1].sources[0].window``."""
    out = ""
    previous: Any = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(previous, int) and part in SOURCE_TYPES:
            pass  # discriminated-union tag, not a key
        elif _TYPE_SEGMENT.match(str(part)):
            pass
        else:
            out += f".{part}" if out else str(part)
        previous = part
    return out or "<root>"


def _yaml_line(node: yaml.Node | None, path: list[Any]) -> int | None:
    """1-based line of the YAML node at ``path`` (or of its nearest existing parent)."""
    line = None
    for key in path:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return line


def _problems(err: ValidationError, root: yaml.Node | None, source: str) -> list[tuple[str, str]]:
    grouped: dict[str, list[str]] = {}
    lines: dict[str, int | None] = {}
    for item in err.errors():
        path = format_location(item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = f"unknown key {item['loc'][-1]!r} (not allowed here; check its spelling)"
        elif (
            "input" in item
            and item["type"] != "missing"
            and not isinstance(item["input"], (dict, list))
            and repr(item["input"]) not in message
        ):
            message += f" (got {item['input']!r})"
        grouped.setdefault(path, [])
        if message not in grouped[path]:
            grouped[path].append(message)
        keys = [p for p in item["loc"] if not (isinstance(p, str) and (p in SOURCE_TYPES or _TYPE_SEGMENT.match(p)))]
        lines[path] = _yaml_line(root, keys)
    out = []
    for path, messages in grouped.items():
        where = f"{path} (line {lines[path]})" if lines.get(path) else path
        out.append((where, " | ".join(messages)))
    return out


def parse_job_spec(text: str, source: str = "<string>") -> JobSpec:
    """Validate YAML text into a :class:`JobSpec`; raises :class:`SpecError`."""
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(source, [("<yaml>", str(exc).replace("\n", " "))]) from None
    if not isinstance(data, dict):
        raise SpecError(source, [("<root>", f"expected a mapping of keys, got {type(data).__name__}")])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, _problems(exc, root, source)) from None


def load_job_spec(path: str | Path) -> JobSpec:
    """Read and validate a job spec YAML file.

    >>> job = load_job_spec("examples/job.yaml")  # doctest: +SKIP
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(str(path), [("<file>", f"cannot read: {exc.strerror}")]) from None
    return parse_job_spec(text, str(path))


def job_spec_json_schema() -> str:
    """JSON Schema of the job spec, for editor validation of YAML files."""
    schema = JobSpec.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "primus_dagster JobSpec"
    return json.dumps(schema, indent=2, sort_keys=True)
