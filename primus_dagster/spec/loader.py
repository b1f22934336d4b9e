"""Load a JobSpec from YAML with errors that name the file, the key path and the line.

Whatever the file holds -- binary data, text that is not UTF-8, nothing, megabytes, hostile YAML (deep
nesting, alias bombs, ``!!python/object`` tags), duplicate keys, impossible dates, values out of range --
loading it either returns a valid :class:`JobSpec` or raises :class:`SpecError` with one line per problem::

    invalid job spec job.yaml: 2 problem(s)
      job.yaml:12: dataset.streams[0].window: duration must be positive, got '-1h'
      job.yaml:40: training.learning_rate: Input should be a finite number

A problem inside a YAML anchor is reported once, with the lines of the aliases that reuse it. Values of
secret-like keys (``storage_options``, passwords, tokens; see :mod:`primus_dagster.spec.redact`) are
never shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from primus_dagster.spec.job import JobSpec
from primus_dagster.spec.redact import is_secret_path, redact_text
from primus_dagster.spec.sources import SOURCE_TYPES
from primus_dagster.spec.yaml_reader import YamlProblem, YamlProblems, read_yaml

#: The largest spec file read (a job spec is a few KiB; this is a guard against the wrong file).
MAX_BYTES = 256 << 10
#: Problems listed in a message; the rest are counted.
MAX_SHOWN = 50

# Union members that pydantic adds to an error location; they are not keys of the YAML.
_TYPE_SEGMENT = re.compile(r"^(list|dict|str|int|float|bool|function-\w+|json-or-python|lax-or-strict|nullable)\b")
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Problem:
    """One problem of a spec: the key path (``dataset.streams[0].window``, or ``<file>``, ``<yaml>``,
    ``<root>``), what is wrong, and the 1-based line (and column) in the file when known."""

    path: str
    message: str
    line: int | None = None
    column: int | None = None

    @property
    def where(self) -> str:
        """``path (line N)``: the first item of :attr:`SpecError.problems`."""
        return f"{self.path} (line {self.line})" if self.line else self.path


class SpecError(ValueError):
    """A job spec could not be loaded.

    ``problems`` holds one ``(where, message)`` per error, ``where`` being ``key path (line N)``;
    ``details`` the same as :class:`Problem` objects. ``str()`` is the message for a user: a header
    naming the file, then one line per problem, ``file:line: key path: message``.
    """

    def __init__(self, source: str, problems: Sequence[tuple[str, str] | Problem]):
        self.source = source
        self.details = [p if isinstance(p, Problem) else Problem(p[0], p[1]) for p in problems]
        self.problems = [(p.where, p.message) for p in self.details]
        lines = [f"invalid job spec {source}: {len(self.details)} problem(s)"]
        for p in self.details[:MAX_SHOWN]:
            at = source if p.line is None else f"{source}:{p.line}" + ("" if p.column is None else f":{p.column}")
            lines.append(f"  {at}: {p.path}: {p.message}")
        if len(self.details) > MAX_SHOWN:
            lines.append(f"  ... and {len(self.details) - MAX_SHOWN} more problem(s)")
        super().__init__("\n".join(lines))


def _one_line(text: str, limit: int = 500) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _segment(part: Any, first: bool) -> str:
    if isinstance(part, int) and not isinstance(part, bool):
        return f"[{part}]"
    text = str(part)
    if _PLAIN_KEY.fullmatch(text):  # fullmatch: "$" would let a trailing newline through
        return text if first else f".{text}"
    shown = text if len(text) <= 40 else text[:40] + "..."
    return f"[{shown!r}]"


def _join(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += _segment(part, not out)
    return out or "<root>"


def format_location(loc: Iterable[Any]) -> str:
    """``('dataset','streams',1,'sources',0,'parquet','window')`` -> ``dataset.streams[1].sources[0].window``."""
    return _join(_drop_type_segments(loc))


def _drop_type_segments(loc: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    previous: Any = None
    for part in loc:
        if isinstance(part, str) and (
            (isinstance(previous, int) and part in SOURCE_TYPES) or _TYPE_SEGMENT.match(part) or part == "[key]"
        ):
            pass  # discriminated-union tag, union member or dict-key marker: not a key of the YAML
        else:
            out.append(part)
        previous = part
    return out


def _line_of(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


@dataclass
class _Located:
    path: str
    line: int | None
    anchor: tuple[int, tuple[Any, ...]]  # the deepest YAML node reached (by identity) and the keys past it
    alias_line: int | None = None  # where the path entered an alias, if it did


_KeyIndex = dict[int, dict[str, tuple[yaml.Node, yaml.Node]]]


def _keys_of(node: yaml.MappingNode, index: _KeyIndex) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """``key text -> (key node, value node)`` of a mapping node, built once per node (the last of duplicates,
    as PyYAML keeps it)."""
    keys = index.get(id(node))
    if keys is None:
        keys = index[id(node)] = {k.value: (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    return keys


def _locate(root: yaml.Node | None, loc: Sequence[Any], index: _KeyIndex) -> _Located:
    """The key path, line and YAML node of a pydantic error location, walking the composed YAML tree so
    that union members are told from keys, and the line is the key's own (not its value's)."""
    node, line, alias_line = root, None if root is None else _line_of(root), None
    deepest: yaml.Node | None = root
    parts: list[Any] = []
    rest: list[Any] = []
    for at, part in enumerate(loc):
        if node is None:
            rest = _drop_type_segments(loc[at:])
            break
        if isinstance(node, yaml.MappingNode):
            found = _keys_of(node, index).get(str(part))
            if found is not None:
                key, value = found
                parts.append(str(part))
                line = _line_of(key)
                if value.start_mark.index < key.start_mark.index and alias_line is None:
                    alias_line = line  # the value was defined before its key: an alias
                node = deepest = value
                continue
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            item = node.value[part]
            parts.append(part)
            line = _line_of(item)
            if item.start_mark.index < node.start_mark.index and alias_line is None:
                alias_line = line
            node = deepest = item
            continue
        if isinstance(part, str) and (part in SOURCE_TYPES or _TYPE_SEGMENT.match(part) or part == "[key]"):
            continue  # a union member / tag: the YAML node stays the same
        rest = _drop_type_segments(loc[at:])
        break
    return _Located(_join([*parts, *rest]), line, (id(deepest), tuple(map(str, rest))), alias_line)


def _show_input(value: Any) -> str | None:
    """A short, safe rendering of an offending input, or ``None`` for one not worth showing."""
    if isinstance(value, (dict, list, tuple, set)) or value is None:
        return None
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return "a number of more than 30 digits"
    if isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return redact_text(repr(value if len(value) <= 60 else value[:60] + "..."))
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    return type(value).__name__


def _validation_problems(err: ValidationError, root: yaml.Node | None) -> list[Problem]:
    found: dict[tuple[tuple[int, tuple[Any, ...]], str], _Located] = {}
    messages: dict[str, list[str]] = {}
    also: dict[str, set[int]] = {}
    order: list[_Located] = []
    index: _KeyIndex = {}
    for item in err.errors(include_url=False):
        loc = tuple(item["loc"])
        located = _locate(root, loc, index)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            key = str(loc[-1])
            message = (
                f"unknown key {key if len(key) <= 40 else key[:40] + '...'!r} (not allowed here; check its spelling)"
            )
        elif "[key]" in loc:
            message = f"invalid key: {message}"
        if item["type"] not in ("missing", "extra_forbidden") and "input" in item and not is_secret_path(loc):
            shown = _show_input(item["input"])
            if shown is not None and shown not in message:
                message += f" (got {shown})"
        message = _one_line(message)
        same = found.get((located.anchor, message))
        if same is not None:  # the same YAML node, reached again through an alias: report it once
            if located.alias_line:
                also.setdefault(same.path, set()).add(located.alias_line)
            continue
        found[(located.anchor, message)] = located
        if located.path not in messages:
            order.append(located)
            messages[located.path] = []
        if message not in messages[located.path]:
            messages[located.path].append(message)
    out = []
    for located in order:
        text = " | ".join(messages[located.path])
        lines = sorted(also.get(located.path, ()))
        if lines:
            text += f" (in an anchor also used at line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))})"
        out.append(Problem(located.path, text, located.line))
    return out


def _yaml_problems(problems: list[YamlProblem]) -> list[Problem]:
    return [Problem(_join(p.path) if p.path else "<yaml>", _one_line(p.message), p.line, p.column) for p in problems]


def parse_job_spec(text: str, source: str = "<string>") -> JobSpec:
    """Validate YAML text into a :class:`JobSpec`; raises :class:`SpecError` (never anything else)."""
    if len(text) > MAX_BYTES:
        raise SpecError(source, [Problem("<file>", f"{len(text):,} characters: a job spec is at most {MAX_BYTES:,}")])
    try:
        data, root, duplicates = read_yaml(text)
    except YamlProblems as exc:
        raise SpecError(source, _yaml_problems(exc.problems)) from None
    if root is None:
        raise SpecError(
            source, [Problem("<root>", "the file is empty: a job spec needs at least `name` and `dataset`")]
        )
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a single value", type(None): "null"}.get(type(data), type(data).__name__)
        raise SpecError(
            source,
            [Problem("<root>", f"expected a mapping of keys (name:, dataset:, ...), got {kind}", _line_of(root))],
        )
    problems = _yaml_problems(duplicates)
    try:
        job = JobSpec.model_validate(data)
    except ValidationError as exc:
        problems += _validation_problems(exc, root)
    if problems:
        raise SpecError(source, problems)
    return job


def _decode(raw: bytes, source: str) -> str:
    """UTF-8 text of a spec file (a UTF-8 BOM is dropped); :class:`SpecError` for anything else."""
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    nul = raw.find(b"\x00")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise SpecError(
            source,
            [Problem("<file>", "holds NUL bytes: a binary file, or text in UTF-16/32; a job spec is UTF-8 YAML", line)],
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        message = f"not UTF-8 text: byte 0x{raw[exc.start]:02x} cannot be decoded; save the file as UTF-8"
        raise SpecError(source, [Problem("<file>", message, line, column)]) from None


def load_job_spec(path: str | Path) -> JobSpec:
    """Read and validate a job spec YAML file; raises :class:`SpecError` (never anything else).

    >>> job = load_job_spec("examples/job.yaml")  # doctest: +SKIP
    """
    source = str(path)
    try:
        with Path(path).open("rb") as file:
            raw = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SpecError(source, [Problem("<file>", f"cannot read: {exc.strerror or type(exc).__name__}")]) from None
    except ValueError as exc:  # a path with a NUL character
        raise SpecError(source.replace("\x00", "\\0"), [Problem("<file>", f"cannot read: {exc}")]) from None
    if len(raw) > MAX_BYTES:
        raise SpecError(
            source, [Problem("<file>", f"larger than {MAX_BYTES:,} bytes: a job spec is a few KiB of YAML")]
        )
    return _factory_beside_spec(parse_job_spec(_decode(raw, source), source), Path(path))


def _factory_beside_spec(job: JobSpec, path: Path) -> JobSpec:
    """Relative factory files (``path/file.py:function``: ``training.model.factory`` and the MTRM towers'
    ``memory.factory`` / ``adapt.factory``) are read beside the spec file: made absolute, so trainer
    ranks and the Dagster code location find them from any directory."""
    model = job.training.model

    def beside(reference: str) -> str:
        module, _, function = reference.rpartition(":")
        if not module.endswith(".py") or Path(module).is_absolute():
            return reference
        return f"{(path.parent / module).resolve()}:{function}"

    update: dict[str, object] = {}
    if model.factory is not None:
        update["factory"] = beside(model.factory)
    for key in ("memory", "adapt"):
        tower = getattr(model, key)
        if tower is not None:
            update[key] = tower.model_copy(update={"factory": beside(tower.factory)})
    if not update:
        return job
    model = model.model_copy(update=update)
    return job.model_copy(update={"training": job.training.model_copy(update={"model": model})})


def job_spec_json_schema() -> str:
    """JSON Schema of the job spec, for editor validation of YAML files."""
    schema = JobSpec.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "primus_dagster JobSpec"
    return json.dumps(schema, indent=2, sort_keys=True)
