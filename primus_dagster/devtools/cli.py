"""``primus-dagster-dev``: every ``primus-dagster`` command plus the development tools.

primus-dagster-dev broker --detach [--if-saved] | --status | --stop [--discard]
                                                           # the embedded broker; --stop saves its records, --detach replays them
primus-dagster-dev demo                                    # `make demo`
primus-dagster-dev dev [--port 3000] [--mlflow-port 5000]   # `make dev`: dagster dev, a served MLflow, the saved stream
primus-dagster-dev train SPEC ... --record-samples F --slow-executors-ms MS
                                                           # train with test hooks (audit log, slow executors)
primus-dagster-dev train SPEC ... --slow-pool-executors-ms MS --slow-trainer-ms MS
                                                           # the job's own pool (and autoscaler), slowed
primus-dagster-dev train SPEC ... --pause-while FILE        # the trainer waits after its first batch while FILE exists
primus-dagster-dev check-model-load --tracking-uri URI --model NAME [--alias champion] [--venv DIR]
                                                           # load a registered model in a fresh venv
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus_dagster import cli, paths
from primus_dagster.devtools import model_load
from primus_dagster.devtools.trained_sample_ids import TrainedSampleIdsLog
from primus_dagster.training.run_state import RunHooks


def _cmd_broker(args: argparse.Namespace) -> int:
    from primus_dagster.devtools.broker_records import has_saved_records
    from primus_dagster.devtools.kafka_broker import EmbeddedBroker

    state_file = str(args.state_file)
    records = None if args.discard else args.records_dir
    if args.stop:
        running = EmbeddedBroker.read_state(state_file) is not None
        EmbeddedBroker.stop_detached(state_file, records_dir=records)
        saved = f"; its records saved in {records}" if running and records is not None else ""
        print(f"embedded broker stopped{saved}" if running else "no embedded broker running")
        return 0
    if args.status:
        state = EmbeddedBroker.read_state(state_file)
        print(json.dumps(state) if state else "no embedded broker running")
        return 0 if state else 1
    if args.detach:
        if args.if_saved and EmbeddedBroker.read_state(state_file) is None and not has_saved_records(args.records_dir):
            print(f"no saved broker records in {args.records_dir}: no embedded broker started")
            return 0
        state = EmbeddedBroker.start_detached(state_file, records_dir=records)
        replayed = state.get("replayed") or {}
        again = f"; replayed {sum(replayed.values())} saved record(s) of {len(replayed)} topic(s)" if replayed else ""
        print(
            f"embedded broker on {state['bootstrap_servers']} (pid {state['pid']}){again}; "
            f"stop it with `primus-dagster-dev broker --stop` (saves its records in {args.records_dir})"
        )
        return 0
    with EmbeddedBroker() as broker:
        print(f"embedded broker on {broker.bootstrap_servers}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            broker.wait()
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    from primus_dagster.devtools.dev import run_dev

    return run_dev(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from primus_dagster.devtools.demo import run_demo

    return run_demo(args)


def slow_data_plane(ms_per_batch: float) -> Any:
    """A factory of :class:`PooledDataPlane` s on the local pool (executor processes on this machine,
    supervised; no autoscaler, whatever the job's ``pools.backend`` and ``scaling``) whose every
    executor sleeps ``ms_per_batch`` per served batch."""
    from primus_dagster.cluster.pooled_plane import PooledDataPlane

    def start(*args: Any, executors: int = 2, **kwargs: Any) -> PooledDataPlane:
        return PooledDataPlane(*args, executors=executors, slow_ms_per_batch=ms_per_batch, **kwargs)

    return start


def slow_pool_plane(ms_per_batch: float) -> Any:
    """A factory of the job's own data plane (``pools.backend``: its pool and its autoscaler) whose
    every executor, those the autoscaler adds included, sleeps ``ms_per_batch`` per served batch."""
    from primus_dagster.cluster.backends import data_plane_setup
    from primus_dagster.cluster.pooled_plane import PooledDataPlane
    from primus_dagster.spec import load_job_spec

    def start(job_path: str, data_root: str, **kwargs: Any) -> PooledDataPlane:
        setup = data_plane_setup(load_job_spec(job_path), run_id="dev-slow-pool")
        return PooledDataPlane(
            job_path,
            data_root,
            slow_ms_per_batch=ms_per_batch,
            pool_factory=setup["pool_factory"],
            driver_host=setup["driver_host"],
            controller=setup["controller"],
            **kwargs,
        )

    return start


def _slow_trainer(hook: Any, ms_per_batch: float) -> Any:
    """``on_batch`` that sleeps ``ms_per_batch`` per trained batch (a slower trainer), then calls ``hook``."""

    def on_batch(step: int, batch: Any, trainer: int) -> None:
        time.sleep(ms_per_batch / 1000.0)
        if hook is not None:
            hook(step, batch, trainer)

    return on_batch


def _pause_while(hook: Any, path: str, poll_s: float = 0.05) -> Callable[[int, Any, int], None]:
    """``on_batch`` that calls ``hook``, then holds the trainer while ``path`` exists (a test removes it once it
    has seen what it waits for: the run is mid-training, its lock held, for exactly as long as needed)."""

    def on_batch(step: int, batch: Any, trainer: int) -> None:
        if hook is not None:
            hook(step, batch, trainer)
        while os.path.exists(path):
            time.sleep(poll_s)

    return on_batch


def _cmd_train(args: argparse.Namespace) -> int:
    hooks = RunHooks()
    if args.slow_executors_ms:
        hooks.data_plane = slow_data_plane(args.slow_executors_ms)
    if args.slow_pool_executors_ms:
        hooks.data_plane = slow_pool_plane(args.slow_pool_executors_ms)
    with contextlib.ExitStack() as stack:
        if args.record_samples:
            samples = stack.enter_context(TrainedSampleIdsLog(args.record_samples))
            hooks.on_batch = lambda step, batch, trainer: samples.append(step, batch.sample_id)
        if args.slow_trainer_ms:
            hooks.on_batch = _slow_trainer(hooks.on_batch, args.slow_trainer_ms)
        if args.pause_while:
            hooks.on_batch = _pause_while(hooks.on_batch, args.pause_while)
        return cli.train_command(args, hooks)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="primus-dagster-dev", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    commands = cli.add_commands(sub)

    train = commands["train"]
    train.add_argument("--record-samples", default=None, help="append the sample ids of every step to this file")
    train.add_argument(
        "--slow-executors-ms", type=float, default=0.0, help="fault injection: executors sleep per batch"
    )
    train.add_argument(
        "--slow-pool-executors-ms",
        type=float,
        default=0.0,
        help="fault injection: the job's own pool (with its autoscaler), every executor sleeping per batch",
    )
    train.add_argument(
        "--slow-trainer-ms", type=float, default=0.0, help="fault injection: the trainer sleeps per trained batch"
    )
    train.add_argument(
        "--pause-while",
        default=None,
        metavar="FILE",
        help="test hook: after each trained batch the trainer waits while FILE exists (removing it lets it go on)",
    )
    train.set_defaults(func=_cmd_train)

    p = sub.add_parser("broker", help="embedded Kafka-compatible broker (tests and the demo only)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--detach", action="store_true", help="start in the background, record it in the state file")
    group.add_argument("--stop", action="store_true", help="stop the background broker")
    group.add_argument("--status", action="store_true")
    p.add_argument("--state-file", default=paths.broker_state_file())
    p.add_argument(
        "--records-dir",
        type=Path,
        default=paths.broker_records_dir(),
        help="--stop saves every record here, --detach replays them with their offsets (default: %(default)s)",
    )
    p.add_argument("--discard", action="store_true", help="neither save (--stop) nor replay (--detach) records")
    p.add_argument("--if-saved", action="store_true", help="--detach only when a saved set of records exists")
    p.set_defaults(func=_cmd_broker)

    p = sub.add_parser("dev", help="`make dev`: dagster dev with a served MLflow and the demo's saved stream")
    p.add_argument("--port", type=int, default=3000, help="the Dagster UI's port (default: %(default)s)")
    p.add_argument("--mlflow-port", type=int, default=5000, help="the MLflow server's port, if free (%(default)s)")
    p.add_argument("--workspace", type=Path, default=Path("workspace.yaml"), help="(default: %(default)s)")
    p.add_argument("--startup-timeout-s", type=float, default=120.0, help="how long MLflow may take to answer")
    p.add_argument("dagster_args", nargs="*", help="more arguments for `dagster dev` (after --)")
    p.set_defaults(func=_cmd_dev)

    p = sub.add_parser("demo", help="the reference job on embedded defaults, end to end (see README)")
    p.add_argument("--spec", default="examples/job.yaml")
    p.add_argument("--rows-per-hour", type=int, default=2000)
    p.add_argument(
        "--hours",
        type=int,
        default=0,
        help="besides the source partitions the training partition reads: every source's first HOURS hours",
    )
    p.add_argument("--no-train", action="store_true", help="skip the training asset")
    p.set_defaults(func=_cmd_demo)

    model_load.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, build_parser())


if __name__ == "__main__":
    sys.exit(main())
