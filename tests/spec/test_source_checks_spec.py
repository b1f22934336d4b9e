"""The ``checks`` block of a source (bounds of its label-rate and freshness asset checks): defaults, clear errors."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_quality_spec import problems, source


def test_bounds_are_optional_and_parsed() -> None:
    assert source().checks.label_rate is None and source().checks.max_staleness is None
    checks = source(extra="checks: {label_rate: [0.01, 0.5], max_staleness: 15m}, ").checks
    assert checks.label_rate == (0.01, 0.5) and checks.max_staleness == timedelta(minutes=15)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ("checks: {label_rate: [0.5, 0.1]}, ", "needs lo <= hi, got [0.5, 0.1]"),
        ("checks: {label_rate: [0.1, 1.5]}, ", "checks.label_rate[1]"),
        ("checks: {label_rate: [0.1]}, ", "checks.label_rate[1]"),
        ("checks: {max_staleness: 0s}, ", "checks.max_staleness: duration must be positive"),
        ("checks: {max_staleness: 2h}, ", "checks.max_staleness 2h is longer than a partition of this hourly source"),
        ("checks: {stale: 1h}, ", "checks.stale: unknown key"),
    ],
)
def test_bad_bounds_are_named_with_their_line(extra: str, named: str) -> None:
    text = problems(extra=extra)
    assert named in text and "<string>:8:" in text


def test_a_daily_source_may_be_stale_up_to_a_day() -> None:
    daily = source(extra="granularity: day, checks: {max_staleness: 6h}, ")
    assert daily.checks.max_staleness == timedelta(hours=6)
