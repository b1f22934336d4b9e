"""Argument ranges of every ``primus-dagster`` command: an argparse error at parse time (exit 2, the
usage line, the bound and why), never a traceback, and never after the command started working."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from primus_dagster.cli import EXIT_CODES, MAX_EXECUTORS, MAX_PLANNER_THREADS, build_parser, main
from primus_dagster.cli_types import MAX_WINDOW_HOURS
from primus_dagster.synth.cli import main as synth_main

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "job.yaml")
MISSING = "no-such-spec.yaml"  # the spec is never opened: the arguments are refused first
WHY = "no window is longer than 366 days, as planning lists every partition of every source before anything else"

REFUSED = [
    # (argv, the option argparse names, what the message says)
    (["plan", MISSING, "--hours", "0"], "--hours", "must be at least 1, got 0"),
    (["plan", MISSING, "--hours", "-1"], "--hours", "must be at least 1, got -1"),
    (["plan", MISSING, "--hours", "1000000"], "--hours", f"must be at most {MAX_WINDOW_HOURS}, got 1000000: {WHY}"),
    (["plan", MISSING, "--hours", "two"], "--hours", "expected an integer, got 'two'"),
    (["plan", MISSING, "--start", "2026-13-01"], "--start", "not an ISO date or time: '2026-13-01' (month must be"),
    (["plan", MISSING, "--start", "1969-12-31"], "--start", "'1969-12-31' is outside 1970-01-01 .. 3000-01-01"),
    (["plan", MISSING, "--threads", "0"], "--threads", "must be at least 1, got 0"),
    (
        ["plan", MISSING, "--threads", "257"],
        "--threads",
        "must be at most 256, got 257: the most data.planner_threads takes",
    ),
    (["train", MISSING, "--hours", "0"], "--hours", "must be at least 1, got 0"),
    (["train", MISSING, "--hours", "1000000"], "--hours", f"must be at most {MAX_WINDOW_HOURS}, got 1000000"),
    (["train", MISSING, "--start", "2026-02-30"], "--start", "not an ISO date or time: '2026-02-30'"),
    (["train", MISSING, "--executors", "-3"], "--executors", "must be at least 1, got -3"),
    (["train", MISSING, "--executors", "0"], "--executors", "must be at least 1, got 0"),
    (["partitions", MISSING, "--source", "s", "--count", "0"], "--count", "must be at least 1, got 0"),
    (
        ["partitions", MISSING, "--source", "s", "--count", "8785"],
        "--count",
        "must be at most 8784, got 8785: a listing",
    ),
    (["partitions", MISSING, "--source", "s", "--start", "yesterday"], "--start", "not an ISO date or time"),
    (["validate", MISSING, "--data", "--hours", "-5"], "--hours", "must be at least 1, got -5"),
    (["validate", MISSING, "--data", "--start", "2026-11-01T25:00"], "--start", "not an ISO date or time"),
    (["live", MISSING, "--executors", "-1"], "--executors", "must be at least 1, got -1"),
    (["live", MISSING, "--follow", "0"], "--follow", "must be a finite number of seconds above 0, got '0'"),
    (["live", MISSING, "--follow", "nan"], "--follow", "must be a finite number of seconds above 0, got 'nan'"),
    (["synth", "--hours", "0"], "--hours", "must be at least 1, got 0"),
    (["synth", "--hours", str(MAX_WINDOW_HOURS + 1)], "--hours", f"must be at most {MAX_WINDOW_HOURS}"),
    (["synth", "--days", "0"], "--days", "must be at least 1, got 0"),
    (["synth", "--days", "367"], "--days", f"must be at most 366, got 367: {WHY}"),
    (["synth", "--start", "2026-13-01"], "--start", "not an ISO date or time: '2026-13-01'"),
    (["synth", "--kafka-partitions", "0"], "--kafka-partitions", "must be at least 1, got 0"),
    (["synth", "--files-per-hour", "-2"], "--files-per-hour", "must be at least 1, got -2"),
    (["synth", "--seed", "-1"], "--seed", "seed must be >= 0, got -1"),
    (["synth", "--users", "0"], "--users", "users, items and topics must be >= 1, got '0'"),
    (["synth", "--base-ctr", "1.5"], "--base-ctr", "base_ctr must be in (0, 1), got '1.5'"),
    (["synth", "--rows-per-hour", "inf"], "--rows-per-hour", "must be a finite number, got 'inf'"),
    (["synth", "--n-dense", "1.5"], "--n-dense", "expected an int, got '1.5'"),
    (["synth", "--mean-click-delay", "0s"], "--mean-click-delay", "mean_click_delay must be > 0, got '0s'"),
]


@pytest.mark.parametrize(("argv", "option", "message"), REFUSED, ids=[" ".join(r[0]) for r in REFUSED])
def test_an_argument_out_of_range_is_an_argparse_error(
    argv: list[str], option: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: primus-dagster {argv[0]} ")
    assert f"primus-dagster {argv[0]}: error: argument {option}: {message}" in err
    assert "Traceback" not in err and MISSING not in err.split("error:", 1)[1]  # refused before the spec is read


def test_the_synth_program_refuses_the_same_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        synth_main(["--hours", "-1"])
    assert caught.value.code == 2
    assert "primus-dagster synth: error: argument --hours: must be at least 1, got -1" in capsys.readouterr().err


def test_the_bounds_themselves_are_accepted_and_starts_are_utc() -> None:
    parser = build_parser()
    args = parser.parse_args(["plan", EXAMPLE, "--hours", str(MAX_WINDOW_HOURS), "--threads", str(MAX_PLANNER_THREADS)])
    assert (args.hours, args.threads) == (MAX_WINDOW_HOURS, MAX_PLANNER_THREADS) == (24 * 366, 256)
    args = parser.parse_args(["train", EXAMPLE, "--hours", "1", "--executors", str(MAX_EXECUTORS)])
    assert (args.hours, args.executors) == (1, MAX_EXECUTORS)
    assert parser.parse_args(["synth", "--days", "366"]).days == 366
    assert parser.parse_args(["live", EXAMPLE, "--follow", "0.5"]).follow == 0.5
    six = datetime(2026, 11, 1, 6, tzinfo=timezone.utc)
    for text in ("2026-11-01T06:00", "2026-11-01T06:00Z", "2026-11-01T07:00+01:00", "2026-11-01 06:00:00"):
        start = parser.parse_args(["plan", EXAMPLE, "--start", text]).start
        assert start == six and start.tzinfo == timezone.utc, text
    assert parser.parse_args(["plan", EXAMPLE]).start is None  # the dataset start, read with the spec


def test_help_states_the_window_bound_its_reason_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("plan", "train", "partitions", "validate", "live", "synth"):
        with pytest.raises(SystemExit) as caught:
            main([command, "--help"])
        assert caught.value.code == 0
        out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
        assert " ".join(EXIT_CODES.split()) in out, command
        if command in ("plan", "train", "validate", "synth"):
            assert f"1 to {MAX_WINDOW_HOURS}" in out, command
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert WHY in " ".join(capsys.readouterr().out.split())
    for code in ("0 done", "1 a failure at run time", "2 bad input", "3 train --fail-below-baseline", "128 + N"):
        assert code in " ".join(EXIT_CODES.split())


def test_a_huge_window_is_refused_at_once_by_the_console_script(tmp_path: Path) -> None:
    """The installed command, as a user runs it: exit 2, the usage line and the bound, no traceback; the
    spec (which exists) is never planned -- the error comes from the argument alone."""
    script = Path(sys.executable).parent / "primus-dagster"
    done = subprocess.run(
        [str(script), "plan", EXAMPLE, "--hours", "1000000", "--data-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("usage: primus-dagster plan ")
    assert f"error: argument --hours: must be at most {MAX_WINDOW_HOURS}, got 1000000: {WHY}" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == "" and list(tmp_path.iterdir()) == []
