"""``primus-dagster``: the command line of the suite.

primus-dagster validate examples/job.yaml
primus-dagster spec-schema --out .primus/jobspec.schema.json
primus-dagster spec-reference --out spec.md
primus-dagster synth --spec examples/job.yaml --days 1
primus-dagster partitions examples/job.yaml --source impressions_parquet --start 2026-11-01 --hours 3
primus-dagster plan examples/job.yaml --start 2026-11-01 --hours 24 [--json]
primus-dagster train examples/job.yaml --start 2026-11-01 --hours 24 [--json] [--fail-below-baseline] [--strict]
primus-dagster live examples/job.yaml [--follow 10]

Development tools (the embedded broker, the demo) are ``primus-dagster-dev``.

Every number and date is checked as the arguments are parsed (exit 2 with the usage line): ``--hours``
1 to :data:`~primus_dagster.cli_types.MAX_WINDOW_HOURS` (8784, a leap year), ``--count`` as many
partitions, ``--executors`` and ``--threads`` within what the spec keys they override allow,
``--start`` a valid ISO date or time between 1970 and 3000. Exit codes (:data:`EXIT_CODES`, printed at
the end of every ``--help``): 0 done, 1 a failure at run time (a source partition that failed to list,
no ready data, failed data tasks, a checkpoint that did not fit on the disk), 2 bad input (arguments,
spec, model, data that does not fit its declaration), 3 ``train --fail-below-baseline`` on a model that
does not learn, 128 + N cancelled by signal N.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from primus_dagster import paths
from primus_dagster.cli_types import (
    MAX_WINDOW_HOURS,
    WINDOW_LIMIT_WHY,
    int_range,
    iso_time,
    positive_seconds,
    window_hours,
)
from primus_dagster.spec import (
    DataPlaneSpec,
    JobSpec,
    PoolSpec,
    SpecError,
    job_spec_json_schema,
    load_job_spec,
    spec_reference_markdown,
)
from primus_dagster.synth.cli import add_arguments as synth_arguments

if TYPE_CHECKING:
    from primus_dagster.data import NotReady, TimeWindow
    from primus_dagster.training.evaluation import NextHourEvaluation
    from primus_dagster.training.run_state import RunHooks

#: What the exit code of a ``primus-dagster`` command says (the epilog of every ``--help``).
EXIT_CODES = """exit codes:
  0        done
  1        a failure at run time: a source partition that failed to list (plan, partitions and
           validate --data print each with its source, partition and error; train names the
           sources and errors and trains nothing), no ready data in the window, failed data tasks,
           a data pool that failed (an executor out of restarts, every node blacklisted),
           data that does not fit its spec read while training, a full disk (a checkpoint that
           could not be written: the same command resumes from the previous one)
  2        bad input: an argument out of range (with the usage line), an invalid job spec, an
           unknown source, a custom model that cannot be built, a model that does not fit
           pools.training.memory, data that does not fit its declaration (validate --data)
  3        train --fail-below-baseline: the model does not learn (the 'quality:' line says why)
  128 + N  cancelled by signal N (130: SIGINT, 143: SIGTERM)"""


def _cmd_validate(args: argparse.Namespace) -> int:
    """Exit 0: valid; 2: invalid, one line per problem (``main`` prints the :class:`SpecError`); 1: the
    validator itself failed -- a bug, still reported in one line, never as a traceback."""
    try:
        job = load_job_spec(args.spec)
    except SpecError:
        raise
    except Exception as exc:  # a bug of ours, not of the file (its text may hold a value of the file)
        print(
            f"error: validating {args.spec} failed unexpectedly ({type(exc).__name__}): a bug of primus-dagster, "
            "please report it with the file",
            file=sys.stderr,
        )
        return 1
    _check_device(args, job)
    _check_memory(args, job)
    if job.training.model.factories():
        _check_custom_model(args, job)
    for advice in job.advisories():
        print(f"{args.spec}: warning: {advice}", file=sys.stderr)
    sources = [f"{s.name} ({s.type}, {s.kind}, per {s.granularity})" for _, s in job.dataset.all_sources()]
    print(f"{args.spec}: job {job.name!r} is valid; sources: " + ", ".join(sources))  # after every check passed
    return _check_data(args, job) if args.data else 0


def _check_device(args: argparse.Namespace, job: JobSpec) -> None:
    """``training.device`` on this machine: a GPU that is not here raises
    :class:`~primus_dagster.training.device.DeviceError` (exit 2); ``auto`` says what it takes."""
    from primus_dagster.training.device import resolve_device

    _, line = resolve_device(job.training.device, trainers=job.pools.training.replicas)
    if job.training.device != "cpu":
        print(f"{args.spec}: device: {line}")


def _check_memory(args: argparse.Namespace, job: JobSpec) -> None:
    """The trainers' memory and table sharding on the layout the spec's first source maps
    (:mod:`~primus_dagster.training.memory_plan`): one line, or a
    :class:`~primus_dagster.training.memory_plan.MemoryPlanError` naming the fix (exit 2)."""
    from primus_dagster.cluster.pool import memory_bytes
    from primus_dagster.training.features import FeatureLayout
    from primus_dagster.training.memory_plan import plan_memory

    layout = FeatureLayout.of_mapping(job.training, next(s for _, s in job.dataset.all_sources()).columns)
    if layout is None:
        print(f"{args.spec}: memory: the layout is known only from the data: checked at the start of training")
        return
    pool = job.pools.training
    plan = plan_memory(job.training, pool, layout, limit_bytes=memory_bytes(pool.memory))
    print(f"{args.spec}: {plan.line()}")


def _check_custom_model(args: argparse.Namespace, job: JobSpec) -> None:
    """Build a team's model (``type: custom``, or an MTRM over a team's towers) on the layout the spec's
    first source maps and run two made-up rows (:func:`~primus_dagster.training.models.check_model`); a
    broken factory raises :class:`~primus_dagster.training.model_api.ModelFactoryError` (exit 2)."""
    from primus_dagster.training.features import FeatureLayout
    from primus_dagster.training.models import check_model, custom_model_line

    layout = FeatureLayout.of_mapping(job.training, next(s for _, s in job.dataset.all_sources()).columns)
    if layout is None:
        print(f"{args.spec}: model: the dense width is known only from the data (columns.dense is a list column): "
              "the custom model is checked at the start of training")  # fmt: skip
        return
    model = check_model(job.training.model, layout, job.training.loss)
    print(f"{args.spec}: model: {custom_model_line(model)}; built and ran on two rows")


def _check_data(args: argparse.Namespace, job: JobSpec) -> int:
    """``--data``: read each source's first batch in the window; exit 2 naming every source whose
    columns do not fit its declaration (column, file, fix), else 1 when a source's partitions failed to
    list (each printed with its source, partition and error)."""
    from primus_dagster.data import Planner
    from primus_dagster.data.data_check import check_source_data
    from primus_dagster.data.sources import SourceContext, TimeWindow

    context = SourceContext(str(args.data_root), args.kafka_bootstrap)
    window = TimeWindow.hours_from(_start(args, job), args.hours)
    checks = list(check_source_data(job, context, window))
    for check in checks:
        print(check.line(), file=sys.stderr if check.problem else sys.stdout)
    failed: list[NotReady] = []
    if any(not c.where and c.problem is None for c in checks):  # a source with nothing to check: listed?
        with Planner.for_job(job, context) as planner:
            failed = [n for n in planner.plan(window).not_ready if n.state == "error"]
    bad = [c.source for c in checks if c.problem]
    if bad:
        print(f"{args.spec}: the data of {', '.join(bad)} does not fit the spec", file=sys.stderr)
    if _print_failed_listings(failed, window):
        return 2 if bad else 1
    return 2 if bad else 0


def _cmd_spec_schema(args: argparse.Namespace) -> int:
    return _print_or_write(job_spec_json_schema(), args.out)


def _cmd_spec_reference(args: argparse.Namespace) -> int:
    return _print_or_write(spec_reference_markdown(), args.out)


def _print_or_write(text: str, out: str | None) -> int:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
        print(f"wrote {out}")
    else:
        print(text)
    return 0


def _start(args: argparse.Namespace, job: JobSpec) -> datetime:
    """``--start`` (parsed by :func:`~primus_dagster.cli_types.iso_time`; text from a namespace built
    elsewhere is parsed here), else the dataset's start."""
    if args.start is None:
        return job.dataset.start
    if isinstance(args.start, datetime):
        return args.start
    value = datetime.fromisoformat(args.start)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def _print_failed_listings(not_ready: Iterable[NotReady], window: TimeWindow) -> int:
    """Print the partitions whose listing failed (state ``error``: listing or splitting failed, or a
    ready partition was empty) on stderr, one line per source and error with its partitions; their count."""
    groups: dict[tuple[str, str], set[datetime]] = {}
    for n in not_ready:
        if n.state == "error":
            groups.setdefault((n.source, " ".join(n.reason.split())), set()).add(n.partition)
    count = sum(len(parts) for parts in groups.values())
    if not count:
        return 0
    sources = sorted({source for source, _ in groups})
    print(f"error: {count} partition(s) of source(s) {sources} in window {window} failed to list:", file=sys.stderr)
    for (source, reason), parts in sorted(groups.items(), key=lambda item: (item[0][0], min(item[1]))):
        first, last = min(parts), max(parts)
        when = f"{first:%Y-%m-%dT%H:%M}Z"
        if len(parts) > 1:
            when = f"{len(parts)} partitions {when} .. {last:%Y-%m-%dT%H:%M}Z"
        print(f"  {source} {when}: {reason}", file=sys.stderr)
    return count


def _cmd_partitions(args: argparse.Namespace) -> int:
    from primus_dagster.data.sources import SourceContext, TimeWindow, make_adapter
    from primus_dagster.spec.dataset import granularity_step

    job = load_job_spec(args.spec)
    source = job.dataset.source(args.source)
    start = _start(args, job)
    window = TimeWindow(start, start + granularity_step(source.granularity) * args.count)
    context = SourceContext(str(args.data_root), args.kafka_bootstrap)
    try:
        with make_adapter(source, context) as adapter:
            parts = adapter.partitions(window)
    except Exception as exc:  # what the planner reports as a failed listing (a broker down, no table)
        message = f"listing source {source.name!r} in window {window} failed: {type(exc).__name__}: {exc}"
        print(f"error: {' '.join(message.split())}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "partition": p.key,
                        "ready": p.ready,
                        "files": p.files,
                        "bytes": p.bytes,
                        "version": p.version,
                        "reason": p.reason,
                    }
                    for p in parts
                ]
            )
        )
        return 0
    for p in parts:
        state = "ready" if p.ready else f"NOT READY ({p.reason})"
        print(f"{p.key}  files={p.files:<5} bytes={p.bytes or 0:<12} version={p.version or '-':<20} {state}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from primus_dagster.data.graph import Planner, plan_report, render_plan
    from primus_dagster.data.sources import SourceContext, TimeWindow

    job = load_job_spec(args.spec)
    context = SourceContext(str(args.data_root), args.kafka_bootstrap)
    with Planner.for_job(job, context, **({"threads": args.threads} if args.threads else {})) as planner:
        plan = planner.plan(TimeWindow.hours_from(_start(args, job), args.hours))
    print(json.dumps(plan_report(plan)) if args.json else render_plan(plan), flush=True)
    return 1 if _print_failed_listings(plan.not_ready, plan.window) else 0


def _cmd_synth(args: argparse.Namespace) -> int:
    from primus_dagster.synth.cli import run

    return run(args)


class _StderrHandler(logging.StreamHandler):
    """A stream handler that writes each line to ``sys.stderr`` as it is then (replaced or redirected
    since the handler was added: a later command in the same process, ``contextlib.redirect_stderr``),
    never to a stream that has since been closed."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the current sys.stderr


def _log_to_stderr() -> None:
    """The suite's INFO log lines (planning, executors, checkpoints) on stderr, once."""
    logger = logging.getLogger("primus_dagster")
    if not any(getattr(h, "primus_cli", False) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.primus_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # Printed once, here: mlflow.pytorch calls logging.basicConfig() when imported, and a root handler
    # would print every line a second time.
    logger.propagate = False


def train_command(args: argparse.Namespace, hooks: RunHooks | None = None) -> int:
    """``primus-dagster train``; ``hooks`` lets ``primus-dagster-dev train`` observe and inject faults."""
    from primus_dagster.data.sources import TimeWindow
    from primus_dagster.training.failed_tasks import FAILED_TASKS_NAMED, failed_tasks_text
    from primus_dagster.training.progress import progress_line
    from primus_dagster.training.run_state import TrainingRequest
    from primus_dagster.training.tracking import MlflowTracker
    from primus_dagster.training.window import train_window

    _log_to_stderr()
    job = load_job_spec(args.spec)
    start = _start(args, job)

    def progress(p: dict) -> None:
        print(progress_line(p), file=sys.stderr, flush=True)

    tracker = MlflowTracker(args.tracking_uri or job.tracking.tracking_uri, job.tracking.experiment)
    result = train_window(
        TrainingRequest(
            job,
            args.spec,
            args.data_root,
            TimeWindow.hours_from(start, args.hours),
            kafka_bootstrap=args.kafka_bootstrap,
            executors=args.executors,
            run_key=args.run_key,
            tracker=tracker,
            progress=progress,
            evaluate=not args.no_eval,
            warm_start=args.warm_start,
            strict=getattr(args, "strict", False),
            complete_window=getattr(args, "strict", False),
        ),
        hooks,
    )
    meta = result.metadata()
    if args.json:
        print(json.dumps(meta, default=str), flush=True)
    else:
        for key, value in meta.items():
            if key == "failed_tasks":  # tasks given up below the threshold: where and why, not a repr
                value = failed_tasks_text(value, FAILED_TASKS_NAMED) or "none"
            print(f"{key:>20}: {value}")
        sys.stdout.flush()
    ok, line = train_quality(result.evaluation)
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)  # --json: stdout stays one object
    if getattr(args, "fail_below_baseline", False) and not ok:
        return BELOW_BASELINE_EXIT
    return 0


#: ``primus-dagster train --fail-below-baseline``'s exit code for a model that does not learn.
BELOW_BASELINE_EXIT = 3


def train_quality(evaluation: NextHourEvaluation | None) -> tuple[bool, str]:
    """The verdict ``primus-dagster train`` prints after training, and whether it is ok: the model's AUC
    against chance (0.5 + 0.01) and the popularity prior of its training rows
    (:func:`~primus_dagster.training.baseline.verdict`), e.g. ``quality: AUC 0.7120 vs popularity prior
    0.7030 (feature item_id): ok``. Not evaluated (``--no-eval``, no held-out rows) is not ok."""
    if evaluation is None:
        return False, "quality: not evaluated (no held-out rows after the window, or --no-eval): no verdict"
    ok, _ = evaluation.verdict()
    return ok, f"quality: {evaluation.verdict_text()}"


def live_command(args: argparse.Namespace, hooks: RunHooks | None = None) -> int:
    """``primus-dagster live``: one live increment (the stream since the newest model), or ``--follow``."""
    import time

    from primus_dagster.broker_discovery import default_bootstrap_servers
    from primus_dagster.training.live import LiveIncrement, run_live_increment
    from primus_dagster.training.tracking import MlflowTracker

    _log_to_stderr()
    job = load_job_spec(args.spec)
    tracker = MlflowTracker(args.tracking_uri or job.tracking.tracking_uri, job.tracking.experiment)
    increment = LiveIncrement(
        job,
        args.spec,
        args.data_root,
        kafka_bootstrap=args.kafka_bootstrap or default_bootstrap_servers(),
        executors=args.executors,
        tracker=tracker,
    )
    while True:
        result = run_live_increment(increment, hooks)
        meta = result.metadata()
        if args.json:
            print(json.dumps(meta, default=str), flush=True)
        else:
            model = result.training.model_uri if result.training else "none (nothing new)"
            print(f"{result.records:,} new record(s); {result.start.why}; model: {model}", flush=True)
        if args.follow is None:
            return 0
        time.sleep(args.follow)


def build_parser(prog: str = "primus-dagster", description: str | None = __doc__) -> argparse.ArgumentParser:
    """The parser with every command; ``primus-dagster-dev`` adds its own to the same parser."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_commands(sub)
    return parser


def _spec_max(model: Any, name: str) -> int:
    """The upper bound (``le``) of the spec key ``name`` of ``model``: an option that overrides the key
    takes the same values."""
    return next(int(bound.le) for bound in model.model_fields[name].metadata if getattr(bound, "le", None) is not None)


#: ``--executors`` (overrides ``pools.data.replicas``) and ``--threads`` (overrides ``data.planner_threads``).
MAX_EXECUTORS = _spec_max(PoolSpec, "replicas")
MAX_PLANNER_THREADS = _spec_max(DataPlaneSpec, "planner_threads")


def add_commands(sub: argparse._SubParsersAction) -> dict[str, argparse.ArgumentParser]:
    """Add the suite's commands to ``sub``; the parser of each, by name (each ``--help`` ends with
    :data:`EXIT_CODES`)."""
    parsers: dict[str, argparse.ArgumentParser] = {}

    def add_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("epilog", EXIT_CODES)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        parsers[name] = sub.add_parser(name, **kwargs)
        return parsers[name]

    p = add_parser("validate", help="validate a job spec YAML file")
    p.add_argument("spec")
    p.add_argument(
        "--data",
        action="store_true",
        help="also read each source's first batch in the window (--start, --hours): name every column its "
        "declared feature cannot take (types, list or scalar, the event time's unit) with file and fix; exit 2",
    )
    p.add_argument("--start", type=iso_time, help="window start of --data (ISO, UTC); default: the dataset start")
    p.add_argument(
        "--hours", type=window_hours, default=24, help=f"window length of --data in hours, 1 to {MAX_WINDOW_HOURS}"
    )
    _data_arguments(p, json=False)
    p.set_defaults(func=_cmd_validate)

    p = add_parser("spec-schema", help="print (or write) the JSON Schema of the job spec")
    p.add_argument("--out", help="write to this file instead of stdout")
    p.set_defaults(func=_cmd_spec_schema)

    p = add_parser("spec-reference", help="print (or write) the job spec's reference page (Markdown, every key)")
    p.add_argument("--out", help="write to this file instead of stdout")
    p.set_defaults(func=_cmd_spec_reference)

    p = add_parser("partitions", help="list a source's partitions and whether they are ready")
    p.add_argument("spec")
    p.add_argument("--source", required=True)
    p.add_argument("--start", type=iso_time, help="first partition (ISO, UTC); default: the dataset start")
    p.add_argument(
        "--count",
        type=int_range(1, MAX_WINDOW_HOURS, "a listing takes at most as many partitions as a window has hours"),
        default=24,
        help=f"number of partitions, 1 to {MAX_WINDOW_HOURS}",
    )
    _data_arguments(p)
    p.set_defaults(func=_cmd_partitions)

    p = add_parser("plan", help="DTGG: the task graph of a window, task counts, partitions not ready")
    _window_arguments(p)
    p.add_argument(
        "--threads",
        type=int_range(1, MAX_PLANNER_THREADS, "the most data.planner_threads takes"),
        default=None,
        help=f"listing threads, 1 to {MAX_PLANNER_THREADS}; default: data.planner_threads",
    )
    _data_arguments(p)
    p.set_defaults(func=_cmd_plan)

    p = add_parser("synth", help="write the synthetic CTR world to the spec's sources")
    synth_arguments(p)
    p.set_defaults(func=_cmd_synth)

    p = add_parser("train", help="train the job's model on a window (resumes its MLflow run if unfinished)")
    _window_arguments(p)
    _data_arguments(p, json=False)
    _executors_argument(p)
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI; default: the spec's, else SQLite")
    p.add_argument("--run-key", default=None, help="MLflow run to start or resume; default: <job>/<window>")
    p.add_argument(
        "--warm-start",
        default=None,
        metavar="RUN_KEY",
        help="continue from the final model of this finished run (e.g. the previous window's)",
    )
    p.add_argument("--no-eval", action="store_true", help="skip the next-hour evaluation")
    p.add_argument(
        "--fail-below-baseline",
        action="store_true",
        help=(
            "exit with code 3 (after training and logging the model) when the model does not learn: its "
            "next-hour AUC is at or below 0.5 + 0.01, below the popularity prior of its training rows, or "
            "not evaluated at all; the 'quality:' line printed after training says which"
        ),
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help=(
            "the whole window or nothing: fail the run (exit 1) before it starts when partitions inside the "
            "window are not ready, naming them, and on the first data task given up, naming the files (as "
            "data.allow_failed_tasks: false does); without it, partitions not ready are skipped and tasks "
            "given up below data.failed_task_threshold are reported (run log, result, MLflow), and the run "
            "goes on without their rows"
        ),
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=train_command)

    p = add_parser("live", help="train the newest model on the stream records since it and publish it (live increment)")
    p.add_argument("spec")
    _data_arguments(p)
    _executors_argument(p)
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI; default: the spec's, else SQLite")
    p.add_argument(
        "--follow",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="repeat every SECONDS (a number above 0) until interrupted",
    )
    p.set_defaults(func=live_command)
    return parsers


def _window_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec")
    p.add_argument("--start", type=iso_time, help="window start (ISO, UTC); default: the dataset start")
    p.add_argument(
        "--hours",
        type=window_hours,
        default=24,
        help=f"window length in hours, 1 to {MAX_WINDOW_HOURS}: {WINDOW_LIMIT_WHY}",
    )


def _executors_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--executors",
        type=int_range(1, MAX_EXECUTORS, "the most pools.data.replicas takes"),
        default=None,
        help=f"data executors, 1 to {MAX_EXECUTORS:,}; default: pools.data.replicas",
    )


def _data_arguments(p: argparse.ArgumentParser, json: bool = True) -> None:
    p.add_argument("--data-root", default=paths.data_root())
    p.add_argument("--kafka-bootstrap", default=None)
    if json:
        p.add_argument("--json", action="store_true")


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """Run one command; errors a user can fix are a message and exit code 2 (bad input) or 1.

    Called as the program (``argv`` None: the console script, ``python -m``), the process then ends
    at once through :func:`exit_without_teardown`; called with ``argv`` (tests, other programs) it
    returns the exit code."""
    code = _run(argv, parser)
    if argv is None:
        exit_without_teardown(code)
    return code


def exit_without_teardown(code: int) -> NoReturn:
    """End the process with ``code`` without the interpreter's module teardown.

    After a command, freeing the thousands of modules and hundreds of thousands of objects that torch,
    MLflow, pyarrow and scikit-learn bring costs seconds of CPU, and more of wall time, after the result is
    printed (measured: ``Py_FinalizeEx`` -> ``finalize_modules``, all of it in ``free``; figures in
    docs/automation.md, "Measured reasons in the code").
    What an orderly exit does before that still happens, in its order: ``threading._shutdown`` (the
    thread pools' exit hooks, then non-daemon threads joined -- the interpreter's own first step at
    exit), the ``atexit`` handlers (logging, multiprocessing's children, temp-folder finalizers,
    MLflow's), stdout and stderr flushed; then ``os._exit``."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None or threading.current_thread() is not threading.main_thread():
        sys.exit(code)  # not CPython's layout, or not the main thread: the ordinary exit
    shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing left to say
            stream.flush()
    os._exit(code)


def _run(argv: list[str] | None, parser: argparse.ArgumentParser | None) -> int:
    # MLflow decides at import whether to send usage telemetry: off unless the user said otherwise.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    args = (parser or build_parser()).parse_args(argv)
    restore_signals = _cancel_on_signals()
    try:
        return int(args.func(args) or 0)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyError as exc:  # unknown source names and the like
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a live increment with nothing to follow, or committed offsets the topic lost
        from primus_dagster.data import TailOffsetError
        from primus_dagster.data.canonical import PermanentDataError
        from primus_dagster.data.sources.kafka.security import KafkaConfigError
        from primus_dagster.training.device import DeviceError
        from primus_dagster.training.live import NotLiveError
        from primus_dagster.training.memory_plan import MemoryPlanError
        from primus_dagster.training.model_api import ModelFactoryError
        from primus_dagster.training.tracking import TrackingUriError

        if isinstance(exc, PermanentDataError | KafkaConfigError):  # data that does not fit its spec, read
            print(f"error: {exc}", file=sys.stderr)  # in this process; a Kafka it cannot reach or configure
            return 1
        # a custom model that cannot be built or breaks the protocol; a training.device this machine lacks; a
        # model that does not fit pools.training.memory; a tracking URI MLflow cannot use
        if isinstance(exc, ModelFactoryError | DeviceError | MemoryPlanError | TrackingUriError):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if not isinstance(exc, (NotLiveError, TailOffsetError)):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a job that cannot run or failed (no ready data, failed tasks past the threshold)
        from primus_dagster.cluster import PoolError
        from primus_dagster.cluster.supervisor import ExecutorFailedError
        from primus_dagster.data.driver import DataAbortedError, DataFailedError
        from primus_dagster.training.failed_tasks import FailedTasksError
        from primus_dagster.training.planning import NoTrainingDataError
        from primus_dagster.training.run_lock import RunInProgressError
        from primus_dagster.training.window import MissingPredecessorError

        # an aborted data plane (its pool failed: every node blacklisted, an executor out of restarts) and
        # every pool error are one line too
        known = (NoTrainingDataError, DataFailedError, DataAbortedError, FailedTasksError, RunInProgressError)
        known += (MissingPredecessorError,)  # a warm start from a run that never finished
        if not isinstance(exc, (*known, PoolError, ExecutorFailedError)):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a disk that filled up (a checkpoint, an artifact copy): one line, not a traceback
        from primus_dagster.training.checkpoint import DISK_FULL_ERRNOS

        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        print(f"error: {_disk_full_line(exc, _tracking_uri_of(args))}", file=sys.stderr)
        return 1
    except Exception as exc:  # the MLflow store on a full disk: its SQL store raises errors of its own
        from primus_dagster.spec import redact_text
        from primus_dagster.training.tracking import store_full_reason

        reason = store_full_reason(exc)
        if reason is None:
            raise
        uri = _tracking_uri_of(args)
        where = redact_text(uri) if uri else "the default MLflow store"
        print(f"error: writing to {where} failed: {reason}; {_free_where_runs_write(uri)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM: a cancelled run; the with-blocks stopped the executors
        signum = exc.signum if isinstance(exc, Cancelled) else signal.SIGINT
        print(f"cancelled ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum
    finally:
        restore_signals()


def _tracking_uri_of(args: argparse.Namespace) -> str | None:
    """The MLflow store a command wrote to: ``--tracking-uri``, else its spec's, else the default."""
    if getattr(args, "tracking_uri", None):
        return str(args.tracking_uri)
    with contextlib.suppress(SpecError, OSError, AttributeError, TypeError):
        return load_job_spec(args.spec).tracking.tracking_uri
    return None


def _disk_full_line(exc: OSError, tracking_uri: str | None = None) -> str:
    """What a full disk stopped: a checkpoint's own message (it names the checkpoint, the file and the
    free space), else the file (when known), the error and the free space there; with no file named,
    the free space of every filesystem the run writes to (``tracking_uri``'s store among them)."""
    from primus_dagster.training.checkpoint import CheckpointWriteError, free_space_text

    if isinstance(exc, CheckpointWriteError):
        return str(exc)
    reason = os.strerror(exc.errno or errno.ENOSPC)
    if exc.filename:
        return f"writing {exc.filename} failed: {reason}; {free_space_text(str(exc.filename))}"
    return f"a write failed (the file is not known): {reason}; {_free_where_runs_write(tracking_uri)}"


def _free_where_runs_write(tracking_uri: str | None) -> str:
    """The free space of each filesystem a run writes to -- the MLflow store, the temporary directory,
    the current one, PRIMUS_HOME -- the fullest first (a full one is named whichever of them it is)."""
    import shutil
    import tempfile

    from primus_dagster.paths import primus_home
    from primus_dagster.training.checkpoint import free_space_text
    from primus_dagster.training.tracking import local_store_folders

    places = [(str(folder), "the MLflow store") for folder in local_store_folders(tracking_uri)]
    places += [
        (tempfile.gettempdir(), "TMPDIR"),
        (os.getcwd(), "the current directory"),
        (str(primus_home()), "PRIMUS_HOME"),
    ]
    seen: dict[int, tuple[int, str]] = {}
    for path, label in places:
        where = Path(path).absolute()
        while not where.exists() and where != where.parent:
            where = where.parent
        try:
            device, free = where.stat().st_dev, shutil.disk_usage(where).free
        except OSError:
            continue
        if device not in seen:
            seen[device] = (free, f"{free_space_text(where)} ({label})")
    return ", ".join(text for _, text in sorted(seen.values())) or "free space unknown"


class Cancelled(KeyboardInterrupt):
    """The command was asked to stop by ``signum`` (SIGTERM, SIGINT): raised in the main thread so
    that every ``with`` block unwinds -- the data plane stops its executors, MLflow ends the run."""

    def __init__(self, signum: int):
        super().__init__(f"cancelled by {signal.Signals(signum).name}")
        self.signum = signum


def _cancel_on_signals() -> Callable[[], None]:
    """SIGTERM (Kubernetes, process supervisors) and SIGINT (Ctrl-C, a Dagster run cancellation)
    raise :class:`Cancelled` in the main thread -- once: a second signal while the first unwinds is
    ignored, so it cannot cut the teardown short. Python's default for SIGTERM ends the process at
    once and leaves its executor processes behind. Returns what restores the previous handlers (a
    no-op outside the main thread, where handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    cancelling: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if cancelling:
            print(f"{signal.Signals(signum).name} ignored: already cancelling", file=sys.stderr, flush=True)
            return
        cancelling.append(signum)
        raise Cancelled(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


if __name__ == "__main__":
    sys.exit(main())
