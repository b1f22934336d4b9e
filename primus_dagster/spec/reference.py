"""The job spec's reference page, generated from the pydantic models (the docs site's ``reference/spec.md``).

Every section is one model reached from :class:`JobSpec`, named by its key path (``training.model``,
``dataset.streams[].sources[]`` once per source ``type``); each row is one key with its type, default,
bounds and description. Nothing here is written by hand, so the page cannot drift from the loader.

Example::

    from primus_dagster.spec.reference import spec_reference_markdown

    print(spec_reference_markdown()[:200])
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from primus_dagster.spec.durations import format_duration
from primus_dagster.spec.job import JobSpec

_BOUNDS = (
    (annotated_types.Ge, "≥"),
    (annotated_types.Gt, ">"),
    (annotated_types.Le, "≤"),
    (annotated_types.Lt, "<"),
    (annotated_types.MinLen, "min length"),
    (annotated_types.MaxLen, "max length"),
)


@dataclass(frozen=True)
class Section:
    """One model of the spec at one key path."""

    path: str
    model: type[BaseModel]
    discriminator: str | None = None  # "type: kafka" for one member of a tagged union


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds (directly, in a list / dict / union, under Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _suffix(annotation: Any) -> str:
    """``[]`` for a list of models, ``.<name>`` for a dict of them, else nothing."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _suffix(typing.get_args(annotation)[0])
    if origin in (list, tuple):
        return "[]"
    if origin is dict:
        return ".<name>"
    if origin in (typing.Union, types.UnionType):
        return next((s for a in typing.get_args(annotation) if (s := _suffix(a))), "")
    return ""


def _discriminator(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("type")
    if field is None or typing.get_origin(field.annotation) is not Literal:
        return None
    values = typing.get_args(field.annotation)
    return f"type: {values[0]}" if len(values) == 1 else None


def sections() -> Iterator[Section]:
    """Every model reachable from JobSpec, breadth first, each once per key path."""
    queue = [Section("", JobSpec)]
    seen: set[tuple[str, type[BaseModel]]] = set()
    while queue:
        section = queue.pop(0)
        if (section.path, section.model) in seen:
            continue
        seen.add((section.path, section.model))
        yield section
        for name, field in section.model.model_fields.items():
            models = _models_in(field.annotation)
            path = f"{section.path}.{name}" if section.path else name
            path += _suffix(field.annotation)
            for model in models:
                tag = _discriminator(model) if len(models) > 1 else None
                queue.append(Section(path, model, tag))


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        names = dict.fromkeys(_type_name(a) for a in args if a is not type(None))
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping to {_type_name(args[1])}" if len(args) == 2 else "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    if annotation is dt.timedelta:
        return "duration (`30m`, `1h`, `7d`)"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _value(value: Any) -> str:
    if isinstance(value, dt.timedelta):
        return f"`{format_duration(value)}`"
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        return "; ".join(", ".join(f"{k}: {v}" for k, v in item.model_dump(mode="json").items()) for item in value)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dt.datetime | dt.date):
        return f"`{value.isoformat()}`"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return _value(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "none"
    return _value(field.default)


def _bounds(field: FieldInfo) -> str:
    parts = []
    for item in field.metadata:
        for kind, symbol in _BOUNDS:
            if isinstance(item, kind):
                parts.append(f"{symbol} {dataclasses.astuple(item)[0]}")
        pattern = getattr(item, "pattern", None)
        if pattern:
            parts.append(f"pattern `{pattern}`")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "top-level"


def _section_markdown(section: Section, anchors: dict[tuple[str, type[BaseModel]], str]) -> list[str]:
    anchor = anchors[(section.path, section.model)]
    title = f"`{section.path}`" if section.path else "The top level"
    if section.discriminator:
        title += f" (`{section.discriminator}`)"
    elif anchor != _anchor(section.path):
        title += f" ({section.model.__name__})"
    doc = (section.model.__doc__ or "").strip().split("\n\n")[0].replace("``", "`")
    lines = [f"## {title} {{#{anchor}}}", ""]
    if doc:
        lines += [" ".join(doc.split()), ""]
    lines += ["| key | type | default | bounds | what it does |", "|---|---|---|---|---|"]
    for name, field in section.model.model_fields.items():
        key = field.alias or name
        child = f"{section.path}.{name}" if section.path else name
        child += _suffix(field.annotation)
        below = ", ".join(
            f"[`{_discriminator(model) or child}`](#{anchors[(child, model)]})"
            for model in _models_in(field.annotation)
            if (child, model) in anchors
        )
        below = f"See {below}." if below else ""
        row = (
            f"`{key}`",
            _type_name(field.annotation),
            _default(field),
            _bounds(field),
            " ".join(part for part in ((field.description or "").replace("``", "`"), below) if part),
        )
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return [*lines, ""]


def spec_reference_markdown() -> str:
    """The whole reference page, Markdown."""
    lines = [
        "# Job spec reference",
        "",
        "Generated from the spec's pydantic models when the docs are built: every key the loader accepts,",
        "with its type, default and bounds. Unknown keys are errors. `primus-dagster spec-schema` exports the",
        "same models as a JSON Schema for editors; [The job spec](../job-spec.md) shows them in use.",
        "",
    ]
    anchors: dict[tuple[str, type[BaseModel]], str] = {}
    every = list(sections())
    for section in every:
        anchor = _anchor(section.path + (f" {section.discriminator}" if section.discriminator else ""))
        if anchor in anchors.values():
            anchor = _anchor(f"{section.path} {section.model.__name__}")
        anchors[(section.path, section.model)] = anchor
    for section in every:
        lines += _section_markdown(section, anchors)
    return "\n".join(lines)
