"""``primus-dagster synth``: write hours of the synthetic world to the sources of a job spec.

Example::

    primus-dagster synth --spec examples/job.yaml --days 2 --rows-per-hour 50000
    primus-dagster synth --hours 3 --sources impressions_parquet impressions_delta --seed 11
    primus-dagster synth --schema realistic --days 2        # examples/realistic/job.yaml's sources

``--schema`` picks the shape of the rows: ``ctr`` (the default) is the world's native columns
(:func:`~primus_dagster.synth.world.world_schema`), ``realistic`` the same world in a real team's shape
(:mod:`primus_dagster.synth.realistic`: string ids and demographics, a ``genres`` list, epoch-second
``event_ts``, raw-scale numbers, label ``liked``).

Every number is checked when the arguments are parsed (exit 2 with the usage line): ``--hours`` at most
:data:`~primus_dagster.cli_types.MAX_WINDOW_HOURS`, ``--days`` at most a 24th of it, counts at least 1, each world knob as
:class:`~primus_dagster.synth.world.WorldConfig` checks it (and finite). The argument types here
(``int_range``, ``window_hours``, ``iso_time``) are shared with
the ``primus-dagster`` commands (:mod:`primus_dagster.cli_types`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import fields
from datetime import datetime, timedelta, timezone
from typing import Any

from primus_dagster.broker_discovery import default_bootstrap_servers
from primus_dagster.cli_types import MAX_WINDOW_HOURS, WINDOW_LIMIT_WHY, int_range, iso_time, window_hours
from primus_dagster.synth.realistic import RealisticWorld, realistic_schema
from primus_dagster.synth.world import SyntheticWorld, WorldConfig
from primus_dagster.synth.writers import WriteSummary, write_world

#: The spec ``--spec`` defaults to, per ``--schema``.
DEFAULT_SPECS = {"ctr": "examples/job.yaml", "realistic": "examples/realistic/job.yaml"}


def _knob_type(name: str, kind: type) -> Callable[[str], Any]:
    """The argparse ``type=`` of the :class:`WorldConfig` knob ``name``: parsed as ``kind`` (a duration
    string for ``str``), finite when a float, not negative for ``seed``, and as :class:`WorldConfig` checks it."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an' if kind is int else 'a'} {kind.__name__}, got {text!r}"
            ) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if name == "seed" and value < 0:  # numpy's generators take non-negative seeds only
            raise argparse.ArgumentTypeError(f"seed must be >= 0, got {value}")
        try:
            WorldConfig(**{name: value})
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None
        return value

    parse.__name__ = kind.__name__
    return parse


def _default_data_root() -> str:
    from primus_dagster import paths

    return str(paths.data_root())  # $PRIMUS_DATA_ROOT, else <$PRIMUS_HOME or ./.primus>/data


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``synth`` options (and one flag per :class:`WorldConfig` knob) to ``parser``."""
    parser.add_argument(
        "--spec",
        default=None,
        help=f"job spec YAML (default: {DEFAULT_SPECS['ctr']}; with --schema realistic {DEFAULT_SPECS['realistic']})",
    )
    parser.add_argument(
        "--schema",
        choices=sorted(DEFAULT_SPECS),
        default="ctr",
        help="shape of the rows: ctr, the world's native columns; realistic, the same world as a real team's "
        "table (string ids, a genres list, epoch-second event_ts, raw-scale numbers, label liked) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--data-root",
        default=_default_data_root(),
        help="where relative source locations resolve (default: $PRIMUS_DATA_ROOT or ./.primus/data)",
    )
    span = parser.add_mutually_exclusive_group()
    span.add_argument(
        "--days",
        type=int_range(1, MAX_WINDOW_HOURS // 24, WINDOW_LIMIT_WHY),
        default=None,
        help=f"days to write, 1 to {MAX_WINDOW_HOURS // 24} (default: 1): {WINDOW_LIMIT_WHY}",
    )
    span.add_argument(
        "--hours",
        type=window_hours,
        default=None,
        help=f"hours to write, 1 to {MAX_WINDOW_HOURS} (alternative to --days)",
    )
    parser.add_argument(
        "--start",
        type=iso_time,
        default=None,
        help="first hour, ISO UTC (e.g. 2026-11-01 or 2026-11-01T06:00); default: the spec's dataset.start",
    )
    parser.add_argument(
        "--sources",
        nargs="+",
        default=None,
        metavar="NAME",
        help="only these sources (batch shards stay those of the whole spec)",
    )
    parser.add_argument(
        "--kafka-bootstrap",
        default=os.environ.get("PRIMUS_KAFKA_BOOTSTRAP_SERVERS"),
        help="Kafka host:port list for stream sources without bootstrap_servers "
        "(default: $PRIMUS_KAFKA_BOOTSTRAP_SERVERS, else a running `primus-dagster-dev broker --detach`)",
    )
    parser.add_argument(
        "--kafka-partitions",
        type=int_range(1),
        default=4,
        help="partitions of a topic created here, at least 1 (default: 4)",
    )
    parser.add_argument(
        "--files-per-hour", type=int_range(1), default=1, help="Parquet files per hour, at least 1 (default: 1)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    world = parser.add_argument_group("world", "knobs of the synthetic world (see docs/synthetic_world.md)")
    defaults = WorldConfig()
    for f in fields(WorldConfig):
        default = getattr(defaults, f.name)
        kind: Any = str if isinstance(default, timedelta) else type(default)
        shown = f"{default.total_seconds():g}s" if isinstance(default, timedelta) else default
        world.add_argument(
            _flag(f.name),
            dest=f"world_{f.name}",
            type=_knob_type(f.name, kind),
            default=None,
            metavar=kind.__name__.upper() if kind is not str else "DURATION",
            help=f"{WorldConfig.HELP.get(f.name, f.name)} (default: {shown})",
        )


def world_config_from_args(args: argparse.Namespace) -> WorldConfig:
    """The :class:`WorldConfig` of the parsed flags (unset flags keep the defaults)."""
    values = {
        f.name: getattr(args, f"world_{f.name}")
        for f in fields(WorldConfig)
        if getattr(args, f"world_{f.name}", None) is not None
    }
    return WorldConfig(**values)


def _parse_start(value: str | datetime) -> datetime:
    """``--start`` as parsed (:func:`iso_time`), or the text of a namespace built elsewhere."""
    if isinstance(value, datetime):
        return value
    value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _realistic_problem(sources: list[Any]) -> str | None:
    """Why the realistic rows cannot be written to ``sources`` (None: they can): an Iceberg source (its
    writer partitions by a timestamp column, the realistic event time is integer seconds), or a mapped
    column the realistic rows lack."""
    from primus_dagster.data import native_columns

    have = set(realistic_schema().names)
    for source in sources:
        if missing := [c for c in native_columns(source.columns) if c not in have]:
            return (
                f"source {source.name!r} maps columns {missing} that --schema realistic does not write "
                f"(it writes {sorted(have - {'click_delay_s'})}); see examples/realistic/job.yaml"
            )
    if iceberg := [s.name for s in sources if s.type == "iceberg"]:
        return (
            f"--schema realistic writes no Iceberg sources (its event time is epoch seconds): {iceberg}; "
            f"leave them out with --sources"
        )
    return None


def print_summary(summary: WriteSummary, data_root: str) -> None:
    """A table of rows, bytes and seconds per source."""
    from rich.table import Table

    from primus_dagster.console import report_console

    table = Table(
        title=f"synthetic world: {summary.hours} hour(s), {summary.world_rows:,} impressions "
        f"(generated in {summary.generate_seconds:.2f}s) -> {data_root}"
    )
    for column in ("source", "type", "kind", "rows", "MB", "files", "seconds", "rows/s"):
        table.add_column(column, justify="left" if column in ("source", "type", "kind") else "right", no_wrap=True)
    for s in summary.sources.values():
        rate = f"{s.rows / s.seconds:,.0f}" if s.seconds > 0 else "-"
        table.add_row(
            s.name,
            s.type,
            s.kind,
            f"{s.rows:,}",
            f"{s.bytes / 2**20:.1f}",
            str(s.files or "-"),
            f"{s.seconds:.2f}",
            rate,
        )
    report_console().print(table)


def run(args: argparse.Namespace) -> int:
    """Run ``primus-dagster synth`` with parsed ``args``; returns the exit code."""
    from primus_dagster.data.sources.base import SourceContext
    from primus_dagster.spec import load_job_spec

    schema = getattr(args, "schema", "ctr")
    job = load_job_spec(args.spec or DEFAULT_SPECS[schema])
    try:
        config = world_config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = _parse_start(args.start) if args.start else job.dataset.start
    hours = args.hours if args.hours is not None else 24 * (args.days if args.days is not None else 1)
    if hours <= 0:
        print("error: --hours/--days must be positive", file=sys.stderr)
        return 2
    chosen = [s for _, s in job.dataset.all_sources() if args.sources is None or s.name in args.sources]
    if schema == "realistic" and (problem := _realistic_problem(chosen)):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    bootstrap = args.kafka_bootstrap
    if bootstrap is None and any(s.type == "kafka" and not s.bootstrap_servers for s in chosen):
        bootstrap = default_bootstrap_servers()
        if bootstrap is None:
            names = [s.name for s in chosen if s.type == "kafka"]
            print(
                f"error: Kafka source(s) {names} need bootstrap servers: pass --kafka-bootstrap, set "
                f"PRIMUS_KAFKA_BOOTSTRAP_SERVERS, start `primus-dagster-dev broker --detach`, or leave them out "
                f"with --sources",
                file=sys.stderr,
            )
            return 2
    data_root = str(args.data_root)
    try:
        world = RealisticWorld(config, start) if schema == "realistic" else SyntheticWorld(config, start)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = write_world(
        job,
        SourceContext(data_root, bootstrap),
        world,
        range(hours),
        sources=args.sources,
        progress=not args.no_progress,
        files_per_hour=args.files_per_hour,
        kafka_partitions=args.kafka_partitions,
    )
    if args.json:
        print(json.dumps(summary.as_dict()))
    else:
        print_summary(summary, data_root)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m primus_dagster.synth.cli``)."""
    parser = argparse.ArgumentParser(
        prog="primus-dagster synth", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
