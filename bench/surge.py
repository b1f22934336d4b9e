"""Stream surge: the mixture prioritisation keeps the stream fresh without starving batch data (Primus Fig. 11).

A replay of the data plane on a simulated clock, with the real pieces where the decisions are made:
the real :class:`~primus_dagster.data.driver.DataDriver` (leases, heartbeats, completions) with the
real :class:`~primus_dagster.training.priority.LoadingPriority` as its loading policy, the real
:class:`~primus_dagster.training.priority.MixturePriority` as the reader's ``choose_queue``, and the
weights ``w_i`` from a real :class:`~primus_dagster.spec.JobSpec` (``dataset.streams[].weight``,
:meth:`JobSpec.kind_weights`). The data executors, the reader's fetchers and the trainer are
simulated (labelled costs, not measured ones) with the data plane's behaviour: each executor runs
one task runner that leases a task only while its serving buffer (one FIFO, both kinds) has room,
reads ``LOAD_ROWS_S`` rows/s into batches of ``BATCH_ROWS`` rows, blocks while the buffer is full,
completes a task once every batch went to the reader and heartbeats its buffered rows per kind every
``HEARTBEAT_S``; the reader pulls each executor's buffer head into a per-kind queue of ``PREFETCH``
batches (head-of-line blocking: a full queue stops that executor's stream); the trainer takes
``TRAIN_ROWS_S`` rows/s -- the bottleneck, as when prioritisation matters.

Why a replay and not the real processes with the embedded Kafka broker: the machines here have 2
cores shared by several jobs; a real run would measure the machine's noise (a stalled executor
process, a slow broker poll) as much as the policy, and a 3-minute surge would not fit in the time
limit. The replay is deterministic, runs three policies side by side on identical arrivals in a
few seconds, and the policy code under test is the production code.

Workload: a batch backlog (files of ``BATCH_TASK_ROWS`` rows, 24 h-delayed data aligned on the
training time: file ``j`` is due at ``j * BATCH_TASK_ROWS / BATCH_DUE_ROWS_S`` seconds, the order the
planner's ``order_at`` gives it) and a Kafka stream of ``STREAM_ROWS_S`` rows/s cut into one offset-
range task per second. Over the middle third of the run (``surge_s``) the stream's arrival rate triples. Demand before
the surge is below the trainer's rate; during the surge it is above it, so somebody must wait.

Policies (same arrivals, same costs):

* ``prioritised``: driver leases by ``LoadingPriority`` and the reader serves by ``MixturePriority``
  (``p_i = w_i * sigmoid(q_i)``, ``q_i`` from the serving buffers' rows, gain 1);
* ``static``: the same with gain 0 (``q_i = 0``: fixed shares ``w_i / sum w``), the ablation of ``q``;
* ``loading_only`` / ``serving_only``: one of the two halves, the other side FIFO;
* ``fifo``: no prioritisation -- the driver hands out tasks chronologically (by due time: earliest
  deadline first) and the reader serves the queue whose head arrived first.

Two scenarios: ``aligned`` (the headline: batch files due along the run, as ``batch_lag: 24h`` in
mode ``mixed`` orders them) and ``old_backlog`` (every batch file older than the stream, e.g. a
backlog being caught up: chronological hand-out then loads no stream task until the batch is done).
Measured attribution: in ``aligned`` the whole gain comes from the serving side (``serving_only``
equals ``prioritised``; the stream's tasks are due before the batch files anyway, so the loading
side picks what chronological hand-out picks); in ``old_backlog`` FIFO and ``serving_only`` train no
stream row for 135 s, and the loading side alone brings the stream back (``prioritised`` there is
identical to ``aligned``).

Bound on the stream's loading lag with prioritisation (stated before the run, checked after it).
While the stream's buffered share ``x`` can reach the share it needs, ``s = 3 * STREAM_ROWS_S /
TRAIN_ROWS_S``, the stream never waits for a loader beyond one task: the largest share the policy
gives it, ``w_s * sigmoid(gain) / (w_s * sigmoid(gain) + w_b * sigmoid(-gain))`` (``x -> 1``), is
0.84 here, above ``s = 0.6``. A stream row then waits at most: the rest of its one-second task
interval (1 s) + one lease round (a runner frees room when the trainer takes one of its batches:
``E * BATCH_ROWS / TRAIN_ROWS_S``) + reading its task (``3 * STREAM_ROWS_S / LOAD_ROWS_S``) + the
rows ahead of it in the serving buffers (``E * BUFFER_BATCHES * BATCH_ROWS + 2 * PREFETCH *
BATCH_ROWS`` over ``TRAIN_ROWS_S``) + one heartbeat of staleness in ``q`` (``HEARTBEAT_S``). With the
defaults: 1 + 0.51 + 1.5 + 3.07 + 0.5 = 6.6 s (``lag_bound_s`` in the output). Without prioritisation
nothing gives the stream more than its turn once it falls behind (the trainer takes whichever batch
reached the reader first), so its lag grows through the surge and after it.

Batch is never starved: with weights ``w`` and gain ``g`` the batch's loading and serving shares
stay above ``share_floor`` (``w_b * sigmoid(-g) / (w_b * sigmoid(-g) + w_s * sigmoid(g))`` = 0.16
here); the output's ``batch_share_min_window`` is the smallest batch share of trained rows over
``WINDOW_S``-second windows of the whole run.

Weights: the bench's spec gives the stream ``weight: 2`` (the operator protects the fresh data, as
Primus sets ``w_i`` by hand); the gain is the policies' default (1). The output's ``equal_weights``
block runs the same three policies with both weights at 1, for the record: there ``q`` alone lifts
the stream from the static 44 % to 55 % of the trained rows during the surge (p95 lag 9.8 s against
static's 16.5 s), but a stream needing 60 % keeps a backlog until its ``q`` is high enough (``q``
grows with the rows waiting: a proportional controller), so its lag stays about FIFO's (8.6 s), not
below it. The FIFO baseline serves the reader queue whose head came first; the reader's own default
without a policy, ``batch_first``, would serve the stream later still.

Run: ``python bench/surge.py [--quick]``; prints one JSON object last (shares are of trained rows;
lags are row-weighted percentiles over the rows trained in each phase).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from primus_dagster.data.driver import DataDriver, ExecutorReport
from primus_dagster.data.driver.api import BUFFERED_ROWS
from primus_dagster.data.reader.queue_policy import QueueStat
from primus_dagster.data.sources.base import ReadTask
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import JobSpec, parse_job_spec
from primus_dagster.training.priority import LoadingPriority, MixturePriority, share_floor, sigmoid

from _common import cpu_self, emit

# Simulated costs (rows per second) and data-plane shape.
TRAIN_ROWS_S = 1000.0  # the trainer: the bottleneck
LOAD_ROWS_S = 400.0  # one executor's task runner
EXECUTORS = 4
BATCH_ROWS = 128
BUFFER_BATCHES = 4  # per executor (data.buffer_batches)
PREFETCH = 4  # reader queue, per kind
HEARTBEAT_S = 0.5
DT = 0.01
WINDOW_S = 5.0
# Workload.
STREAM_ROWS_S = 200.0  # x3 during the surge
BATCH_DUE_ROWS_S = 500.0
BATCH_TASK_ROWS = 2000
GAIN = 1.0  # the policies' default
BACKLOG_S = 86_400.0  # scenario "backlog": every batch file is due a day before the run
STREAM_WEIGHT = 2.0  # the operator protects the stream (Primus: w_i set by hand)
T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)

SPEC = """
name: surge
dataset:
  start: 2026-11-01
  streams:
    - name: history
      weight: 1.0
      sources:
        - {name: impressions_day, type: parquet, kind: batch, path: parquet/impressions, columns: {ts: event_time, label: click, dense: [d0], sparse: [user_id]}}
    - name: live
      weight: 2.0
      sources:
        - {name: events, type: kafka, kind: stream, topic: events, columns: {ts: event_time, label: click, dense: [d0], sparse: [user_id]}}
training: {mode: mixed, batch_lag: 24h}
"""


@dataclass
class Piece:
    """One batch in the simulated plane: its task, rows and the arrival time of its rows (mean)."""

    task_id: str
    kind: str
    rows: int
    arrived: float
    in_queue_at: float = 0.0


@dataclass
class Run:
    """One task being read by an executor."""

    task: DataTask
    arrived: tuple[float, float]  # the task's rows arrived uniformly over [start, end)
    total: int
    read: float = 0.0
    made: int = 0  # rows already cut into batches
    outstanding: int = 0  # batches buffered, not yet taken by the reader
    done_reading: bool = False


@dataclass
class Executor:
    eid: str
    buffer: deque[Piece] = field(default_factory=deque)
    run: Run | None = None
    held: Piece | None = None  # a batch blocked on a full buffer


@dataclass
class Trace:
    lags: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: {"before": [], "surge": [], "after": []})
    rows: dict[str, dict[str, int]] = field(
        default_factory=lambda: {p: {"batch": 0, "stream": 0} for p in ("before", "surge", "after")}
    )
    windows: dict[int, dict[str, int]] = field(default_factory=dict)
    batch_due_lag_end: float = 0.0


def phase_of(t: float, surge: tuple[float, float]) -> str:
    return "before" if t < surge[0] else "surge" if t < surge[1] else "after"


def percentile(samples: list[tuple[float, int]], q: float) -> float | None:
    """Row-weighted percentile of ``(lag, rows)`` samples (None without samples: no stream row trained)."""
    if not samples:
        return None
    ordered = sorted(samples)
    total = sum(n for _, n in ordered)
    need, seen = q * total, 0
    for lag, n in ordered:
        seen += n
        if seen >= need:
            return lag
    return ordered[-1][0]


def read_task(name: str, kind: str, index: int, rows: int, due: float) -> DataTask:
    partition = T0 + timedelta(seconds=due)
    read = ReadTask(source=name, partition=partition, uri=f"{name}/{index:06d}", rows=rows)
    task = DataTask.for_read("live" if kind == "stream" else "history", kind, read)  # type: ignore[arg-type]
    task.meta["order_at"] = partition.isoformat()  # due time: the planner's order_at of a lagged batch task
    return task


#: policy -> (the driver leases by LoadingPriority, the reader serves by MixturePriority, q is live)
POLICIES: dict[str, tuple[bool, bool, bool]] = {
    "prioritised": (True, True, True),
    "static": (True, True, False),
    "loading_only": (True, False, True),
    "serving_only": (False, True, True),
    "fifo": (False, False, False),
}


def simulate(
    job: JobSpec, policy: str, duration: float, surge: tuple[float, float], gain: float = GAIN, backlog: bool = False
) -> Trace:
    """One run of the replay under ``policy`` (a key of :data:`POLICIES`). ``backlog``: the batch
    files are all older than the stream (due before the run starts) instead of aligned on it."""
    clock = [0.0]
    weights = job.kind_weights()
    steer_loading, steer_serving, live_q = POLICIES[policy]
    gain = gain if live_q else 0.0
    loading = LoadingPriority(weights, gain=gain) if steer_loading else None
    driver = DataDriver(lease_s=30.0, clock=lambda: clock[0], loading_policy=loading)
    arrivals: dict[str, tuple[float, float]] = {}
    batch_tasks = int(duration * BATCH_DUE_ROWS_S * 1.5 / BATCH_TASK_ROWS)  # more than the run can train
    tasks = []
    for j in range(batch_tasks):
        due = j * BATCH_TASK_ROWS / BATCH_DUE_ROWS_S - (BACKLOG_S if backlog else 0.0)
        task = read_task("impressions_day", "batch", j, BATCH_TASK_ROWS, due)
        arrivals[task.task_id] = (due, due)  # lag of batch rows: behind their due time
        tasks.append(task)
    driver.add_tasks(tasks)
    execs = [Executor(f"data-{i}") for i in range(EXECUTORS)]
    runs: dict[str, Run] = {}
    queues: dict[str, deque[Piece]] = {"batch": deque(), "stream": deque()}
    queue_rows = {"batch": 0, "stream": 0}
    received = {"batch": 0, "stream": 0}

    def buffered(kind_of: Executor) -> dict[str, float]:
        out = {"batch": 0.0, "stream": 0.0}
        for piece in kind_of.buffer:
            out[piece.kind] += piece.rows
        return out

    def heartbeat(ex: Executor) -> None:
        rows = buffered(ex)
        metrics = {f"{BUFFERED_ROWS}{k}": v for k, v in rows.items()}
        running = [ex.run.task.task_id] if ex.run is not None and not ex.run.done_reading else []
        driver.heartbeat(ExecutorReport(ex.eid, "", running=running, metrics=metrics))

    reader_stats = lambda: {  # noqa: E731
        k: QueueStat(k, len(q), PREFETCH, received[k], clock[0] - q[0].in_queue_at if q else 0.0, queue_rows[k])
        for k, q in queues.items()
    }
    if not steer_serving:
        choose = None
    else:
        choose = MixturePriority(
            weights,
            seed=0,
            backlog_fn=driver.serving_rows_by_kind,
            queue_rows=True,
            gain=gain,
        )

    trace = Trace()
    stream_carry, stream_index, budget = 0.0, 0, 0.0
    next_hb, next_cut = 0.0, 1.0
    steps = round(duration / DT)
    for step in range(steps):
        now = clock[0] = step * DT
        rate = STREAM_ROWS_S * (3.0 if surge[0] <= now < surge[1] else 1.0)
        stream_carry += rate * DT
        if now + 1e-9 >= next_cut:  # the Kafka follower cuts one offset-range task per second
            rows = int(stream_carry)
            stream_carry -= rows
            if rows:
                task = read_task("events", "stream", stream_index, rows, next_cut - 1.0)
                arrivals[task.task_id] = (next_cut - 1.0, next_cut)
                driver.add_tasks([task])
                stream_index += 1
            next_cut += 1.0
        if now + 1e-9 >= next_hb:
            for ex in execs:
                heartbeat(ex)
            next_hb += HEARTBEAT_S
        # executors: lease while the buffer has room, read, cut batches, block on a full buffer
        for ex in execs:
            if ex.held is not None and len(ex.buffer) < BUFFER_BATCHES:
                ex.buffer.append(ex.held)
                ex.held = None
            if ex.run is None and ex.held is None and len(ex.buffer) < BUFFER_BATCHES:
                leases = driver.lease(ex.eid, 1)
                if leases:
                    task = leases[0].task
                    ex.run = runs[task.task_id] = Run(task, arrivals[task.task_id], task.read.rows or 0)
            run = ex.run
            if run is None or ex.held is not None:
                continue
            run.read = min(run.total, run.read + LOAD_ROWS_S * DT)
            while ex.held is None and (run.read - run.made >= BATCH_ROWS or (run.read >= run.total > run.made)):
                n = min(BATCH_ROWS, run.total - run.made)
                start, end = run.arrived
                mid = start + (end - start) * (run.made + n / 2) / run.total
                piece = Piece(run.task.task_id, run.task.kind, n, mid)
                run.made += n
                run.outstanding += 1
                if len(ex.buffer) < BUFFER_BATCHES:
                    ex.buffer.append(piece)
                else:
                    ex.held = piece
            if run.made >= run.total:
                run.done_reading = True
                ex.run = None
        # reader fetchers: each executor's buffer head into its kind's queue (head-of-line blocking)
        moved = True
        while moved:  # the fetchers take turns (a fixed order would starve the last executor's stream)
            moved = False
            for i in range(EXECUTORS):
                ex = execs[(step + i) % EXECUTORS]
                if ex.buffer and len(queues[ex.buffer[0].kind]) < PREFETCH:
                    piece = ex.buffer.popleft()
                    piece.in_queue_at = now
                    queues[piece.kind].append(piece)
                    queue_rows[piece.kind] += piece.rows
                    received[piece.kind] += 1
                    moved = True
                    task_run = runs[piece.task_id]
                    task_run.outstanding -= 1
                    if task_run.done_reading and task_run.outstanding == 0:
                        driver.complete(ex.eid, piece.task_id, task_run.total, math.ceil(task_run.total / BATCH_ROWS))
        # trainer
        budget = min(budget + TRAIN_ROWS_S * DT, 2 * BATCH_ROWS)
        while budget >= BATCH_ROWS and any(queues.values()):
            if choose is None:  # FIFO: the queue whose head came first
                kind = min((k for k in queues if queues[k]), key=lambda k: queues[k][0].in_queue_at)
            else:
                kind = choose(reader_stats())
            piece = queues[kind].popleft()
            queue_rows[kind] -= piece.rows
            budget -= piece.rows
            phase = phase_of(now, surge)
            trace.rows[phase][kind] += piece.rows
            window = trace.windows.setdefault(int(now // WINDOW_S), {"batch": 0, "stream": 0})
            window[kind] += piece.rows
            if kind == "stream":
                trace.lags[phase].append((now - piece.arrived, piece.rows))
            else:
                trace.batch_due_lag_end = now - piece.arrived
    return trace


def lag_bound_s() -> float:
    """The stated bound on the stream's p95 loading lag with prioritisation (see the module docstring)."""
    lease_round = EXECUTORS * BATCH_ROWS / TRAIN_ROWS_S
    read = 3 * STREAM_ROWS_S / LOAD_ROWS_S
    ahead = (EXECUTORS * BUFFER_BATCHES * BATCH_ROWS + 2 * PREFETCH * BATCH_ROWS) / TRAIN_ROWS_S
    return 1.0 + lease_round + read + ahead + HEARTBEAT_S


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summary(trace: Trace) -> dict[str, object]:
    """Per phase: the stream's lag p95 / max (None: no stream row trained), the batch share of the
    trained rows, rows trained per kind; the smallest batch share of any window."""
    shares = {}
    for phase, rows in trace.rows.items():
        total = rows["batch"] + rows["stream"]
        shares[phase] = round(rows["batch"] / total, 4) if total else None
    windows = [w["batch"] / (w["batch"] + w["stream"]) for w in trace.windows.values() if w["batch"] + w["stream"]]
    return {
        "stream_lag_p95_s": {p: _rounded(percentile(s, 0.95)) for p, s in trace.lags.items()},
        "stream_lag_max_s": {p: _rounded(max((lag for lag, _ in s), default=None)) for p, s in trace.lags.items()},
        "batch_share": shares,
        "batch_share_min_window": round(min(windows), 4),
        "batch_behind_due_s_at_end": round(trace.batch_due_lag_end, 2),
        "rows_trained": trace.rows,
    }


def spec_with(stream_weight: float) -> JobSpec:
    text = SPEC.replace("name: live\n      weight: 2.0", f"name: live\n      weight: {stream_weight}")
    return parse_job_spec(text, "<bench surge>")


def compare(
    job: JobSpec, duration: float, surge: tuple[float, float], gain: float, backlog: bool = False
) -> dict[str, dict[str, object]]:
    """Every policy on identical arrivals."""
    return {p: summary(simulate(job, p, duration, surge, gain, backlog)) for p in POLICIES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run (20 s before/during/after)")
    parser.add_argument("--gain", type=float, default=GAIN, help="gain of q_i (default: the policies' default)")
    parser.add_argument("--stream-weight", type=float, default=STREAM_WEIGHT, help="dataset.streams[live].weight")
    args = parser.parse_args()
    phase_s = 20.0 if args.quick else 60.0
    duration, surge = 3 * phase_s, (phase_s, 2 * phase_s)
    job = spec_with(args.stream_weight)
    weights = job.kind_weights()
    started, cpu0 = time.perf_counter(), cpu_self()
    results = compare(job, duration, surge, args.gain)
    equal = compare(spec_with(1.0), duration, surge, args.gain)  # the default weights, for the record
    backlog = compare(job, duration, surge, args.gain, backlog=True)  # batch files all older than the stream
    for name, runs in (("configured", results), ("equal weights", equal), ("old backlog", backlog)):
        for policy, result in runs.items():
            print(f"{name:14s} {policy:12s} {result}", flush=True)
    bound = lag_bound_s()
    lag = {p: r["stream_lag_p95_s"]["surge"] for p, r in results.items()}  # type: ignore[index]
    prio = results["prioritised"]
    ws, wb = weights["stream"], weights["batch"]
    max_share = ws * sigmoid(args.gain) / (ws * sigmoid(args.gain) + wb * sigmoid(-args.gain))
    emit(
        {
            "bench": "surge",
            "metric": "stream_lag_p95_s_during_surge",
            "value": lag["prioritised"],
            "baseline": lag["fifo"],
            "ratio": round(lag["fifo"] / lag["prioritised"], 2) if lag["prioritised"] else None,
            "stream_lag_p95_s_prioritised": lag["prioritised"],
            "stream_lag_p95_s_fifo": lag["fifo"],
            "stream_lag_p95_s_static": lag["static"],
            "lag_bound_s": round(bound, 2),
            "within_bound": bool(lag["prioritised"] < bound),
            "batch_share_during_surge": prio["batch_share"]["surge"],  # type: ignore[index]
            "batch_share": prio["batch_share"],
            "batch_share_min_window": prio["batch_share_min_window"],
            "batch_share_floor": round(share_floor(weights, "batch", args.gain), 4),
            "stream_share_max": round(max_share, 4),
            "stream_share_needed_in_surge": round(3 * STREAM_ROWS_S / TRAIN_ROWS_S, 4),
            "weights": weights,
            "gain": args.gain,
            "policies": results,
            "equal_weights": {p: {k: r[k] for k in ("stream_lag_p95_s", "batch_share")} for p, r in equal.items()},
            "old_backlog": {p: {k: r[k] for k in ("stream_lag_p95_s", "batch_share")} for p, r in backlog.items()},
            "surge_s": [surge[0], surge[1]],
            "duration_s": duration,
            "simulated": "executors, reader fetchers and trainer are simulated costs; driver and policies are real",
            "wall_s": round(time.perf_counter() - started, 2),
            "cpu_s": round(cpu_self() - cpu0, 2),
        }
    )


if __name__ == "__main__":
    main()
