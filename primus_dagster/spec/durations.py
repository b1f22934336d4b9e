"""Duration strings used throughout the job spec (``30m``, ``1h``, ``24h``, ``7d``)."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: The longest duration a spec may hold (100 years): longer ones are mistakes, and timestamps a window
#: away from a dataset date must stay representable.
MAX_DURATION = timedelta(days=36500)
_MAX_DIGITS = 30  # a duration's number is short; a longer one is a mistake (and slow to convert)


def parse_duration(value: Any) -> timedelta:
    """Parse ``"90m"``, ``"1h"``, ``"2d"`` (or a number of seconds) into a timedelta.

    >>> parse_duration("1h")
    datetime.timedelta(seconds=3600)
    """
    if isinstance(value, timedelta):
        return _bounded(value, value)
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '1h', got {value!r}")
    if isinstance(value, (int, float)):
        return _seconds(value, value)
    if isinstance(value, str) and len(value) <= _MAX_DIGITS + 4:
        match = _DURATION_RE.match(value)
        if match:
            return _seconds(float(match.group(1)) * _UNIT_SECONDS[match.group(2)], value)
    raise ValueError(f"expected a duration such as '30m', '1h', '24h' or '7d', got {_show(value)}")


def _show(value: Any) -> str:
    """A short repr of ``value`` (a huge int has no repr past 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return "a number of more than 30 digits"
    text = repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:40] + "...")
    return text


def _seconds(seconds: float, value: Any) -> timedelta:
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, got {_show(value)}")
    if abs(seconds) > MAX_DURATION.total_seconds():
        raise ValueError(f"duration {_show(value)} is too long: at most {format_duration(MAX_DURATION)}")
    return timedelta(seconds=seconds)


def _bounded(parsed: timedelta, value: Any) -> timedelta:
    if abs(parsed) > MAX_DURATION:
        raise ValueError(f"duration {_show(value)} is too long: at most {format_duration(MAX_DURATION)}")
    return parsed


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
        raise ValueError(f"duration must be positive, got {_show(value)}")
    return parsed


def _non_negative(value: Any) -> timedelta:
    parsed = parse_duration(value)
    if parsed < timedelta(0):
        raise ValueError(f"duration must not be negative, got {_show(value)}")
    return parsed


_DURATION_SCHEMA = WithJsonSchema(
    {"type": "string", "pattern": r"^\d+(\.\d+)?(s|m|h|d|w)$", "examples": ["30m", "1h", "24h"]}
)
_SERIALIZE = PlainSerializer(format_duration, return_type=str)

PositiveDuration = Annotated[timedelta, BeforeValidator(_positive), _SERIALIZE, _DURATION_SCHEMA]
"""A strictly positive duration (window lengths, slides, lease times)."""

NonNegativeDuration = Annotated[timedelta, BeforeValidator(_non_negative), _SERIALIZE, _DURATION_SCHEMA]
"""A duration that may be zero (label delay, lateness)."""
