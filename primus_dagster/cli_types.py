"""The argument types every command line of the suite shares (``primus-dagster``, its ``synth``
subcommand, ``primus-dagster-dev``): integer ranges, the window bound, ISO times, seconds -- each an
argparse ``type=`` that refuses a bad value at parse time (exit 2 with the usage line).

Example::

    parser.add_argument("--hours", type=window_hours, default=24)
    parser.add_argument("--executors", type=int_range(1, 64, "the most pools.data.replicas takes"))
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from datetime import datetime, timezone

#: The longest window a command plans, trains, lists or writes, in hours (a leap year): planning lists
#: every partition of every source of the window before anything else happens, so a window of a million
#: hours would run for minutes before its first line; split longer spans into several windows.
MAX_WINDOW_HOURS = 24 * 366
#: Why: said by the error and the ``--help`` of every option bounded by :data:`MAX_WINDOW_HOURS`.
WINDOW_LIMIT_WHY = (
    f"no window is longer than {MAX_WINDOW_HOURS // 24} days, as planning lists every partition of every source "
    "before anything else: split a longer span into several windows"
)


def int_range(low: int, high: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse ``type=``: an integer in ``[low, high]`` (``high`` None: no upper bound), else an
    :class:`argparse.ArgumentTypeError` saying the bound (and ``why``, the reason of the upper one)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}{f': {why}' if why else ''}")
        return value

    parse.__name__ = "int"  # what argparse would call the type
    return parse


#: ``--hours`` of every command: 1 to :data:`MAX_WINDOW_HOURS`.
window_hours = int_range(1, MAX_WINDOW_HOURS, WINDOW_LIMIT_WHY)


def positive_seconds(text: str) -> float:
    """An argparse ``type=``: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, got {text!r}")
    return value


def iso_time(text: str) -> datetime:
    """An argparse ``type=``: an ISO date or time (``2026-11-01``, ``2026-11-01T06:00``, an offset or
    ``Z``; naive is UTC) between 1970 and 3000 (the times a spec may hold), in UTC."""
    from primus_dagster.spec.dataset import EARLIEST, LATEST

    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))  # Python 3.10 reads no "Z"
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not an ISO date or time: {text!r} ({exc}); e.g. 2026-11-01 or 2026-11-01T06:00 (UTC)"
        ) from None
    value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    if not EARLIEST <= value < LATEST:
        raise argparse.ArgumentTypeError(
            f"{text!r} is outside {EARLIEST:%Y-%m-%d} .. {LATEST:%Y-%m-%d}, the times a job spec may hold"
        )
    return value
