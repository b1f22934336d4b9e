"""Rebalance vs forward shuffle with one deliberately slowed data executor.

The situation the shuffle exists for (``docs/data_plane.md``, Executors): a **synchronous trainer
group** -- like DDP, every step each of the ``--trainers`` T trainers trains on one batch and the
step ends when all of them are done, so the group's step rate is set by the trainer that waits
longest for data -- fed by ``--executors`` E data executors, one of which is slow.

* **forward** pins executor ``i`` to trainer ``i mod T``: the trainer paired with the slow
  executor gets only its other partners' batches, starves, and the whole group slows to its pace.
* **rebalance** lets every executor send each batch to the trainer whose buffer (in that
  executor) is emptiest: every trainer reads from every executor, so the fast executors' spare
  capacity covers the slow one's deficit for all trainers alike.

The model, and why it is built this way:

* Trainers: T threads in this process, each with its own trainer-side ``RemoteReader`` (the real
  transport -- Flight, or shared memory on one host -- claim at the driver, arrays out). A step = take one batch, "compute" for
  ``--step-ms`` (a sleep: GPU work does not compete for the host's CPUs, and on a 2-core box a
  CPU matmul would), then a ``threading.Barrier`` over all T (the all-reduce). A trainer whose
  reader has ended joins the barrier without a batch (DDP ``join``) until all have ended. The
  same once the driver has handed out every task: a trainer with no batch at hand then steps
  empty rather than wait. Waiting would deadlock the group at the end of the data: a reader ends
  only when the whole job is done, so the trainer whose executors ran out would wait for the
  job, while the job waits for the other trainer's executors to hand over their last batches,
  which that trainer -- its queue full, held at the barrier -- never takes. (Seen with forward and
  the shared-memory path, which counts a batch as served only once the reader took it; Flight's
  stream buffers usually give enough slack to hide it. A synchronous trainer needs an end-of-data
  signal per trainer, or this join rule, to be safe.) While tasks are still pending, starving
  trainers wait: that is the cost being measured.
* Executors: E real executor processes in the product's local pool (``PooledDataPlane`` over a
  ``LocalPool``, ``_common.local_plane``: supervised, each pinned round robin to one of the host's
  cores, batches through shared memory) reading the same synthetic Parquet files with the job spec's
  stream ``shuffle`` set per mode. On one small box the executors share
  its cores, so their capacities are not independent as on separate nodes: whatever CPU a slowed
  executor leaves idle would simply go to the others, and no executor would ever be short. So
  every executor is *paced* to at most one served batch per ``--base-ms`` (the executor's own
  per-batch budget, ``--slow-ms-per-batch``, serialised over its streams) and the slowed one to
  one per ``--base-ms + --slow-ms``. The pacing -- not this box's CPUs -- is then what limits an
  executor (``cpu_util`` in the detail shows the host had room), as on a real cluster.
* Headroom: E / base-ms batches/s of supply against T / step-ms of demand -- with the defaults
  (E=4, T=2, 25 ms vs 16 ms: 160 vs 125 batches/s) the executors have 28 % more capacity than
  the group needs, but no single executor can feed one trainer alone (40 < 62.5 batches/s).
  The slowed executor (``--slow-ms`` 100: 125 ms a batch, 5x slower) then leaves forward's
  starved trainer -- and with it the group -- at (40 + 8) / 62.5 = 0.77 of the unslowed rate,
  while rebalance still has 3 x 40 + 8 = 128 >= 125 batches/s. ``model_*`` in the JSON are these
  predictions for the given arguments.

Four configurations in one run, on the same files: {forward, rebalance} x {unslowed, slowed},
each ``--repeats`` times (median). Throughput = rows trained by the whole group / wall time from
the moment every executor is up to the last step. That includes the end of the data, where the
slowed executor still holds what it leased and buffered while the others are done and the group
trains at its pace: a real cost, not hidden here. ``steady_*`` give the rate between 10 % and 90 %
of the rows instead (no start, no tail), which is what a long-running stream job sees.

The tail led to two executor fixes. (1) An executor no longer leases a task while one of its
runners already waits for buffer room: a backpressured executor used to lease again as soon as
a slot freed, so a slow one ended up holding ``task_runners`` half-read tasks that idle
executors could have run. (2) Idle runners poll the driver at least every 0.25 s (was 1 s):
every reader waits until every executor has seen the job done, and executors idle since before
the end were up to a second late. Rebalance_ratio over Flight, median of 3, with the bench's
former ``buffer_batches: 4`` and 2 task runners: 0.81 with (1) alone, 0.84 with (2) alone, 0.91
with both. At the shipped defaults (``buffer_batches`` 8, one runner per core of ``cpu``; the bench
sets neither since the serving-path profile) the whole-run ratio is 0.85 and the steady one 1.01: the slowed
executor's larger buffers lengthen the tail (1.5 s). What the slowed executor still holds
at the end -- its T per-trainer buffers and the rest of one task -- only the driver could take
over (backup leases of running tasks for idle executors; the claim ledger already drops the
duplicates); a pull-based rebalance (one queue per executor, taken by whichever trainer stream
asks) would also halve what it buffers. Neither is done, so a much slower executor
(``--slow-ms`` 200+) lengthens the tail and lowers the whole-run ratio while the steady one
stays ~1.

Last line: {"bench": "shuffle", "rebalance_ratio": ..., "forward_ratio": ..., ...} -- ratio =
throughput with one executor slowed / without, per shuffle mode.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import threading
import time
from datetime import timedelta
from typing import Any

from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.data import Planner, SourceContext, TimeWindow
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.job import DataPlaneSpec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

from _common import COLUMNS, bench_dir, cpu_self, emit, local_plane, unrestarted

JOB = """
name: bench-shuffle
data: {{buffer_batches: {buffer}}}
pools: {{data: {{replicas: {executors}, max_replicas: 8}},
        training: {{replicas: {trainers}, max_replicas: {trainers}}}}}
dataset:
  start: 2026-11-01
  streams:
    - name: s
      window: 1h
      shuffle: {shuffle}
      sources:
        - name: src
          type: parquet
          kind: batch
          batch_rows: {batch_rows}
          path: parquet/impressions
          columns: {columns}
"""


class SyncGroup:
    """T trainer threads stepping in lock-step (see the module docstring)."""

    def __init__(self, plane: PooledDataPlane, trainers: int, step_s: float, prefetch: int):
        self.readers = [plane.reader(t, prefetch=prefetch, refresh_s=0.1) for t in range(trainers)]
        self.driver = plane.driver
        self.step_s = step_s
        self.drained = False  # the driver has handed out every task
        self.ended = [False] * trainers
        self.rows = [0] * trainers
        self.steps = 0
        self.progress: list[tuple[float, int]] = []  # (time, rows trained by the group) after each step
        self.done = False
        self.error: BaseException | None = None
        self.barrier = threading.Barrier(trainers, action=self._after_step)

    def _after_step(self) -> None:  # runs once per step, in one thread, while the others wait
        self.steps += 1
        self.progress.append((time.perf_counter(), sum(self.rows)))
        self.done = all(self.ended) or self.error is not None

    def _take(self, reader: Any) -> tuple[Any, bool]:
        """(next batch or None, whether the reader ended). Waits for the batch -- except once the
        driver has handed out every task: then a trainer without one steps empty (see the module
        docstring: waiting could deadlock the group)."""
        while True:
            try:
                batch = reader.next_batch(timeout=0.05)
                return batch, batch is None
            except TimeoutError:
                if not self.drained:
                    counts = self.driver.status()["counts"]
                    self.drained = counts["new"] + counts["pending"] == 0
                if self.drained:
                    return None, False

    def _trainer(self, t: int) -> None:
        reader = self.readers[t]
        while True:
            batch = None
            if not self.ended[t]:
                try:
                    batch, self.ended[t] = self._take(reader)
                except BaseException as exc:
                    self.error, self.ended[t] = exc, True
            if batch is not None:
                time.sleep(self.step_s)  # the training step
                self.rows[t] += batch.rows
            self.barrier.wait()  # the all-reduce: the step ends for everyone at once
            if self.done:
                return

    def run(self) -> float:
        """Train until every reader ended; the wall time."""
        start = time.perf_counter()
        self.progress.append((start, 0))
        threads = [threading.Thread(target=self._trainer, args=(t,), daemon=True) for t in range(len(self.readers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        for reader in self.readers:
            reader.close()
        if self.error is not None:
            raise self.error
        return wall

    def tail_s(self, low: float = 0.1, high: float = 0.9) -> float:
        """Seconds the last ``1 - high`` of the rows took beyond what the steady rate would need."""
        total = self.progress[-1][1]
        t_high = next(t for t, rows in self.progress if rows >= high * total)
        return self.progress[-1][0] - t_high - (1 - high) * total / self.steady_rate(low, high)

    def steady_rate(self, low: float = 0.1, high: float = 0.9) -> float:
        """Rows/s between ``low`` and ``high`` of the rows trained (no start-up, no tail)."""
        total = self.progress[-1][1]
        t0 = next(t for t, rows in self.progress if rows >= low * total)
        t1, r1 = next((t, rows) for t, rows in self.progress if rows >= high * total)
        r0 = next(rows for t, rows in self.progress if t == t0)
        return (r1 - r0) / (t1 - t0) if t1 > t0 else float("nan")


def run_once(job_path, root, tasks, args, slowed: bool) -> dict:
    slow = {i: args.base_ms for i in range(args.executors)}
    if slowed:
        slow[args.slow_executor] = args.base_ms + args.slow_ms
    with local_plane(
        job_path, root, tasks, executors=args.executors, trainers=args.trainers, slow_ms_per_batch=slow
    ) as plane:
        group = SyncGroup(plane, args.trainers, args.step_ms / 1000.0, args.prefetch)
        cpu0 = cpu_self() + plane.cpu_seconds()
        wall = group.run()
        cpu = cpu_self() + plane.cpu_seconds() - cpu0
        status = plane.driver.status()
        unrestarted(plane)
    rows = sum(group.rows)
    if not status["done"] or status["failed"]:
        raise RuntimeError(f"data job did not finish cleanly: {status['counts']}")
    return {
        "rows": rows,
        "wall_s": round(wall, 3),
        "rows_per_s": round(rows / wall),
        "steps": group.steps,
        "steady_rows_per_s": round(group.steady_rate()),
        "tail_s": round(group.tail_s(), 2),
        "rows_per_trainer": group.rows,
        "cpu_util": round(cpu / wall / args.cores, 2),
    }


def predicted(args: argparse.Namespace) -> dict[str, float]:
    """Steady group rate slowed / unslowed per mode, from the pacing alone (no overheads)."""
    demand = 1000.0 / args.step_ms  # batches/s one trainer consumes

    def rates(slowed: bool) -> list[float]:
        return [
            1000.0 / (args.base_ms + (args.slow_ms if slowed and i == args.slow_executor else 0.0))
            for i in range(args.executors)
        ]

    def forward(slowed: bool) -> float:  # the group steps at its worst-fed trainer's pace
        supply = [sum(r for i, r in enumerate(rates(slowed)) if i % args.trainers == t) for t in range(args.trainers)]
        return args.trainers * min(demand, *supply)

    def rebalance(slowed: bool) -> float:
        return min(args.trainers * demand, sum(rates(slowed)))

    return {"forward": forward(True) / forward(False), "rebalance": rebalance(True) / rebalance(False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executors", type=int, default=4)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=16.0, help="trainer compute per step")
    parser.add_argument("--base-ms", type=float, default=25.0, help="every executor: at most one batch per this")
    parser.add_argument("--slow-ms", type=float, default=100.0, help="extra per-batch time of the slowed executor")
    parser.add_argument("--slow-executor", type=int, default=0)
    parser.add_argument("--batch-rows", type=int, default=1024)
    parser.add_argument(
        "--buffer",
        type=int,
        default=DataPlaneSpec().buffer_batches,
        help="data.buffer_batches (per trainer, per executor; default: the spec's)",
    )
    parser.add_argument("--prefetch", type=int, default=4, help="reader queue (batches per trainer)")
    parser.add_argument("--hours", type=int, default=6)
    parser.add_argument("--rows-per-hour", type=int, default=160_000)
    parser.add_argument("--files-per-hour", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cores", type=int, default=2, help="host cores, for cpu_util")
    parser.add_argument("--modes", default="forward,rebalance", help="shuffle modes to run (both for the ratios)")
    args = parser.parse_args()

    root = bench_dir("shuffle")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    jobs = {}
    for mode in ("forward", "rebalance"):
        jobs[mode] = root / f"job-{mode}.yaml"
        jobs[mode].write_text(
            JOB.format(
                buffer=args.buffer,
                executors=args.executors,
                trainers=args.trainers,
                shuffle=mode,
                batch_rows=args.batch_rows,
                columns=COLUMNS,
            )
        )
    job = load_job_spec(jobs["forward"])
    context = SourceContext(str(root))
    start = job.dataset.start
    world = SyntheticWorld(WorldConfig(seed=11, rows_per_hour=args.rows_per_hour), start)
    write_world(job, context, world, range(args.hours), files_per_hour=args.files_per_hour, progress=False)
    window = TimeWindow(start, start + timedelta(hours=args.hours))
    tasks = list(Planner(job.dataset, context, threads=4).plan(window).tasks)

    runs: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        for mode in args.modes.split(","):
            for slowed in (False, True):
                name = f"{mode}_{'slowed' if slowed else 'unslowed'}"
                result = run_once(jobs[mode], root, tasks, args, slowed)
                runs.setdefault(name, []).append(result)
                print(
                    f"[{repeat}] {name:20s} rows={result['rows']:,} wall={result['wall_s']:.2f}s "
                    f"-> {result['rows_per_s']:,} rows/s (steady {result['steady_rows_per_s']:,}, "
                    f"tail +{result['tail_s']:.2f}s), "
                    f"per trainer {result['rows_per_trainer']}, cpu {result['cpu_util']:.0%}",
                    flush=True,
                )

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    modes = args.modes.split(",")
    ratios = {mode: median(f"{mode}_slowed", "rows_per_s") / median(f"{mode}_unslowed", "rows_per_s") for mode in modes}
    steady = {
        mode: median(f"{mode}_slowed", "steady_rows_per_s") / median(f"{mode}_unslowed", "steady_rows_per_s")
        for mode in modes
    }
    model = predicted(args)
    emit(
        {
            "bench": "shuffle",
            **{f"{mode}_ratio": round(ratios[mode], 3) for mode in modes},
            **{f"steady_{mode}_ratio": round(steady[mode], 3) for mode in modes},
            **{f"tail_s_{mode}_slowed": median(f"{mode}_slowed", "tail_s") for mode in modes},
            "model_rebalance_steady": round(model["rebalance"], 3),
            "model_forward_steady": round(model["forward"], 3),
            "rows_per_s": {name: median(name, "rows_per_s") for name in runs},
            "executors": args.executors,
            "trainers": args.trainers,
            "step_ms": args.step_ms,
            "base_ms": args.base_ms,
            "slow_ms": args.slow_ms,
            "batch_rows": args.batch_rows,
            "buffer_batches": args.buffer,
            "task_runners": job.pools.data.task_runners,  # the spec's default: the job leaves it out
            "tasks": len(tasks),
            "repeats": args.repeats,
            "detail": runs,
        }
    )


if __name__ == "__main__":
    main()
