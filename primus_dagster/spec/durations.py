"""Duration strings used throughout the job spec (``30m``, ``1h``, ``24h``, ``7d``)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: Any) -> timedelta:
    """Parse ``"90m"``, ``"1h"``, ``"2d"`` (or a number of seconds) into a timedelta.

    >>> parse_duration("1h")
    datetime.timedelta(seconds=3600)
    """
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '1h', got {value!r}")
    if isinstance(value, (int, float)):
        return timedelta(seconds=value)
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])
    raise ValueError(f"expected a duration such as '30m', '1h', '24h' or '7d', got {value!r}")


def format_duration(value: timedelta) -> str:
    """Inverse of :func:`parse_duration` for whole units (``timedelta(hours=24)`` -> ``"1d"``)."""
    seconds = int(value.total_seconds())
    for unit in ("w", "d", "h", "m"):
        if seconds and seconds % _UNIT_SECONDS[unit] == 0:
            return f"{seconds // _UNIT_SECONDS[unit]}{unit}"
    return f"{seconds}s"


def duration_default(text: str) -> Any:
    """The default of a duration field, kept as the text a user writes: ``Field(default=duration_default("30m"))``.

    The model validates it like any input (``validate_default``), and the JSON schema shows ``"30m"``
    rather than the ``"PT30M"`` a :class:`~datetime.timedelta` default would give. It is typed ``Any``
    because it is an input of validation, not yet the field's ``timedelta``; a malformed text fails here,
    when the model class is defined.
    """
    parse_duration(text)
    return text


def _positive(value: Any) -> timedelta:
    parsed = parse_duration(value)
    if parsed <= timedelta(0):
        raise ValueError(f"duration must be positive, got {value!r}")
    return parsed


def _non_negative(value: Any) -> timedelta:
    parsed = parse_duration(value)
    if parsed < timedelta(0):
        raise ValueError(f"duration must not be negative, got {value!r}")
    return parsed


_DURATION_SCHEMA = WithJsonSchema(
    {"type": "string", "pattern": r"^\d+(\.\d+)?(s|m|h|d|w)$", "examples": ["30m", "1h", "24h"]}
)
_SERIALIZE = PlainSerializer(format_duration, return_type=str)

PositiveDuration = Annotated[timedelta, BeforeValidator(_positive), _SERIALIZE, _DURATION_SCHEMA]
"""A strictly positive duration (window lengths, slides, lease times)."""

NonNegativeDuration = Annotated[timedelta, BeforeValidator(_non_negative), _SERIALIZE, _DURATION_SCHEMA]
"""A duration that may be zero (label delay, lateness)."""
