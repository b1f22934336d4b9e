"""End-to-end rows/s per core: Parquet -> data executors -> trainer-side reader, next to fair baselines.

Every reader reads the same synthetic Parquet files, the same columns -- the ones the model uses:
``click`` (label), ``d0..d12`` (dense), ``user_id, item_id, topic_id, device, hour_of_day``
(sparse); ``event_time`` and ``sample_id`` are in the files but no model reads them -- in batches of
``--batch-rows`` rows, and every reader's delivered row count is asserted equal to the expected
count (the files' footers; a mismatch ends the bench with an error, ``"rows_checked": true`` in
the JSON says it held). The readers, measured in one run, ``--repeat`` times, interleaved:

* **primus** -- the planner (DTGG) plans the window, the driver (Flight, loopback) hands the tasks to
  ``--workers`` executor processes (``DirectDataPlane(fields=("label", "dense", "sparse"))``: the
  trainer reads no ``ts``/``sample_id``, so the executors decode only the model's columns), each
  reads through the Parquet adapter, normalises to the canonical schema and serves; the
  ``RemoteReader`` in this process claims every batch (exactly-once ledger) and hands it over as a
  ``Batch`` with torch tensors (dense float32 [B, 13], sparse int64 [B, 5], label float32 [B]).
  ``--transport shm`` (default): executors on this host, batches through shared-memory slots, Flight
  carries descriptors; ``--transport flight``: batches in the Flight stream (a reader on another host).
  **Counted**: this process (reader threads, claims, the driver serving the executors' RPCs, the
  consumer) + every executor process from the moment it announced it was ready until it exited
  (its start-up -- interpreter and imports, about a second of CPU each -- is reported apart as
  ``executor_startup_cpu_s``).
* **primus_in_process** -- the same plane with ``DirectDataPlane(executors_in_process=True)``: the
  ``--workers`` executors are threads of this process (a trainer co-located with its data), the
  reader takes their batches by calling them -- the same driver, leases, exactly-once claims,
  normaliser and ``Batch`` tensors, without the executor processes, the Flight stream and the copy
  into a slot. **Counted**: this process (there is no other).
* **batched_dataloader** -- what a competent user writes: a ``torch.utils.data.IterableDataset`` whose
  workers each read a share of the files (``ParquetFile.iter_batches``, the same columns and batch
  size, one thread) and turn every record batch into the same three tensors (``np.stack`` of the
  dense and sparse columns, label as float32) -- whole batches, no per-sample ``__getitem__`` --
  through ``DataLoader(batch_size=None, num_workers=--workers)``. **Counted**: this process + its
  DataLoader worker processes (fork; reaped when the epoch ends, ``RUSAGE_CHILDREN``).
* **ray_data** (when ``ray`` is installed: ``pip install -c constraints.txt -e '.[bench]'``) --
  ``ray.data.read_parquet(files).select_columns(...).iter_torch_batches(batch_size=..., collate_fn=...)``
  (the projection is pushed down into the read), the collate function (an ``ArrowBatchCollateFn``;
  measured here, no slower than a ``NumpyBatchCollateFn``) building the same three tensors. Ray is started once
  (``ray.init(num_cpus=--workers)``) and warmed up on one file before any measurement, so its
  start-up is not timed. **Counted**: this process + every process of the Ray session (all
  descendants of this process: GCS, raylet, workers, ...) over the iteration, summed from their
  ``/proc`` CPU times. Not installed: skipped, ``ratio_vs_ray_data`` is null and ``notes`` says why.
* **pyarrow_1t** -- ``pyarrow.parquet.ParquetFile.iter_batches(use_threads=False)`` over the files,
  the same columns and batch size, nothing else (no tensors): one core's decode ceiling (measured
  here: faster per core than ``pyarrow.dataset`` with ``use_threads=False``). **Counted**: this process.
* **tensors_1t** (reference: the per-core ceiling of any reader that delivers these tensors) -- the
  ``batched_dataloader``'s dataset iterated in this process, no DataLoader, no worker: decode with one
  thread (as ``pyarrow_1t``) plus the same three tensors, nothing else. Every reader that hands a
  trainer tensors does at least this work, so ``tensors_1t_vs_pyarrow_1t`` bounds what
  ``ratio_vs_pyarrow_1t`` can reach, and ``ratio_vs_tensors_1t`` is the serving path's distance from
  that bound (what the executor processes, the shared-memory hand-over, the exactly-once claims and
  the RPCs cost). **Counted**: this process.
* **pyarrow** -- ``pyarrow.dataset(...).to_batches(columns, batch_size)`` with its default threads.
  **Counted**: this process (all its threads).
* **per_sample_dataloader** (secondary, ``--per-sample-rows`` rows) -- the naive loader kept for
  reference: a map-style ``Dataset`` over numpy arrays whose ``__getitem__`` returns one sample,
  ``DataLoader(batch_size, num_workers=--workers)`` with the default collate. Counted like
  ``batched_dataloader``.

"Per core" = rows / CPU seconds (user + system) of everything counted above. Every consumer
touches the dense tensor (a sum, as a training step would read it). torch runs single-threaded
(with its default OpenMP pool the pool's spinning threads billed about 0.4 CPU-s to whichever
pipeline ran it). Figures are medians over the repeats; ratios are of medians (per repeat in
``ratios_per_repeat``). Wall-clock rows/s are reported too.

Last line: {"bench": "serve", "ratio_vs_batched_dataloader": ..., "ratio_vs_ray_data": ...,
"ratio_vs_pyarrow_1t": ..., "rows_checked": true, ...}
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import psutil
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from primus_dagster.data import DirectDataPlane, Planner, SourceContext, TimeWindow
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

from _common import PARQUET_DATASET, bench_dir, cpu_self, emit

JOB = (
    """
name: bench-serve
data: {buffer_batches: 8, lease: 30s}
pools: {data: {replicas: {workers}, max_replicas: 8, task_runners: {runners}}, training: {replicas: 1}}
"""
    + PARQUET_DATASET
)
LABEL = "click"
DENSE = [f"d{i}" for i in range(13)]
SPARSE = ["user_id", "item_id", "topic_id", "device", "hour_of_day"]
COLUMNS = [LABEL, *DENSE, *SPARSE]  # what the model reads (no event_time, no sample_id)
FIELDS = ("label", "dense", "sparse")  # the same, as canonical fields of the data plane

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class RowsMismatch(RuntimeError):
    """A reader delivered another number of rows than the files hold."""


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def to_tensors(columns: dict[str, np.ndarray]) -> Tensors:
    """The trainer's tensors from one batch of columns: dense float32 [B, 13], sparse int64 [B, 5],
    label float32 [B] -- what ``Batch.dense / .sparse / .label`` hold."""
    dense = np.stack([columns[c] for c in DENSE], axis=1).astype(np.float32, copy=False)
    sparse = np.stack([columns[c] for c in SPARSE], axis=1).astype(np.int64, copy=False)
    label = np.asarray(columns[LABEL]).astype(np.float32)
    return torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(label)


class ParquetBatches(IterableDataset):
    """Whole batches of the files, each worker reading its share (files i, i + W, ...)."""

    def __init__(self, files: list[str], batch_size: int):
        self.files, self.batch_size = files, batch_size

    def __iter__(self) -> Iterator[Tensors]:
        info = get_worker_info()
        files = self.files if info is None else self.files[info.id :: info.num_workers]
        for path in files:
            parquet = pq.ParquetFile(path, memory_map=True)
            for batch in parquet.iter_batches(batch_size=self.batch_size, columns=COLUMNS, use_threads=False):
                yield to_tensors({name: batch.column(name).to_numpy() for name in COLUMNS})


class RowDataset(Dataset):
    """One sample per index, as a user would write it over columns loaded into numpy."""

    def __init__(self, files: list[str], rows: int):
        table = ds.dataset(files, format="parquet").head(rows, columns=COLUMNS)
        self.dense = np.stack([table[c].to_numpy() for c in DENSE], axis=1).astype(np.float32)
        self.sparse = np.stack([table[c].to_numpy() for c in SPARSE], axis=1).astype(np.int64)
        self.label = table[LABEL].to_numpy().astype(np.float32)

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> Tensors:
        return torch.from_numpy(self.dense[i]), torch.from_numpy(self.sparse[i]), torch.tensor(self.label[i])


def run_primus(
    job_path, root, window, workers: int, startup: dict, shm: bool, in_process: bool = False
) -> tuple[int, float, float]:
    job = load_job_spec(job_path)
    tasks = list(Planner(job.dataset, SourceContext(str(root)), threads=4).plan(window).tasks)
    rows = 0
    plane = DirectDataPlane(
        job_path, root, tasks, executors=workers, trainers=1, shm=shm, fields=FIELDS, executors_in_process=in_process
    )
    if in_process:  # the executors start in this process: count from before they start
        cpu0, wall0 = cpu_self(), time.perf_counter()
    with plane:
        if not in_process:  # steady state: from the moment every executor is up (start-up reported apart)
            cpu0, wall0 = cpu_self(), time.perf_counter()
        with plane.reader(0, prefetch=16) as reader:
            for batch in reader:
                rows += batch.rows
                _ = batch.dense.sum()  # touch the tensor, as a training step would
        wall = time.perf_counter() - wall0
        cpu = cpu_self() - cpu0
        plane.wait_executors(30)
        if in_process:
            return rows, cpu, wall
        startup.setdefault("executor_startup_cpu_s", []).append(
            round(plane.cpu_seconds() - plane.cpu_seconds(include_startup=False), 3)
        )
        startup.setdefault("reader_process_cpu_s", []).append(round(cpu, 3))  # reader, driver, claims
        startup.setdefault("executors_cpu_s", []).append(round(plane.cpu_seconds(include_startup=False), 3))
        cpu += plane.cpu_seconds(include_startup=False)
    return rows, cpu, wall


def run_pyarrow(files: list[str], batch_size: int) -> tuple[int, float, float]:
    cpu0, wall0 = cpu_self(), time.perf_counter()
    rows = sum(
        b.num_rows for b in ds.dataset(files, format="parquet").to_batches(columns=COLUMNS, batch_size=batch_size)
    )
    return rows, cpu_self() - cpu0, time.perf_counter() - wall0


def run_pyarrow_1t(files: list[str], batch_size: int) -> tuple[int, float, float]:
    cpu0, wall0 = cpu_self(), time.perf_counter()
    rows = 0
    for path in files:
        with pq.ParquetFile(path, memory_map=True) as parquet:
            for b in parquet.iter_batches(batch_size=batch_size, columns=COLUMNS, use_threads=False):
                rows += b.num_rows
    return rows, cpu_self() - cpu0, time.perf_counter() - wall0


def _drain(loader: Any) -> tuple[int, float, float]:
    cpu0, children0, wall0 = cpu_self(), cpu_children(), time.perf_counter()
    rows = 0
    for dense, _sparse, label in loader:
        rows += len(label)
        _ = dense.sum()
    wall = time.perf_counter() - wall0
    return rows, cpu_self() - cpu0 + cpu_children() - children0, wall


def run_tensors_1t(files: list[str], batch_size: int) -> tuple[int, float, float]:
    return _drain(ParquetBatches(files, batch_size))


def run_batched_dataloader(files: list[str], workers: int, batch_size: int) -> tuple[int, float, float]:
    return _drain(DataLoader(ParquetBatches(files, batch_size), batch_size=None, num_workers=workers))


def run_per_sample_dataloader(files: list[str], rows: int, workers: int, batch_size: int) -> tuple[int, float, float]:
    dataset = RowDataset(files, rows)  # loading is outside the timing
    return _drain(DataLoader(dataset, batch_size=batch_size, num_workers=workers))


class RayData:
    """Ray Data over the same files; started once and warmed up (see the module docstring)."""

    def __init__(self, files: list[str], workers: int, batch_size: int):
        import ray
        import ray.data
        from ray.data.collate_fn import ArrowBatchCollateFn

        class Collate(ArrowBatchCollateFn):  # Ray's recommended form (a plain function is deprecated)
            def __call__(self, table: Any) -> Tensors:
                return to_tensors({name: table.column(name).to_numpy() for name in COLUMNS})

        self.ray, self.files, self.batch_size, self.collate = ray, files, batch_size, Collate()
        ray.init(
            num_cpus=workers,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=2 << 30,
            configure_logging=False,
        )
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        self.iterate(files[:1])  # warm-up: worker processes, imports, the first task

    def iterate(self, files: list[str]) -> int:
        rows = 0
        dataset = self.ray.data.read_parquet(files).select_columns(COLUMNS)  # pushed down into the read
        batches = dataset.iter_torch_batches(batch_size=self.batch_size, collate_fn=self.collate)
        for dense, _sparse, label in batches:
            rows += len(label)
            _ = dense.sum()
        return rows

    def run(self) -> tuple[int, float, float]:
        before = _tree_cpu()
        cpu0, wall0 = cpu_self(), time.perf_counter()
        rows = self.iterate(self.files)
        wall = time.perf_counter() - wall0
        cpu = cpu_self() - cpu0 + _tree_cpu_delta(before)
        return rows, cpu, wall

    def close(self) -> None:
        self.ray.shutdown()


def _tree_cpu() -> dict[int, float]:
    """CPU seconds of every descendant of this process (the Ray session's processes), by pid."""
    out = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        out[proc.pid] = times.user + times.system
    return out


def _tree_cpu_delta(before: dict[int, float]) -> float:
    """CPU the descendants used since ``before`` (new processes: all of theirs)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in _tree_cpu().items())


def expected_rows(files: list[str]) -> int:
    return sum(pq.ParquetFile(path).metadata.num_rows for path in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=16)
    parser.add_argument("--rows-per-hour", type=int, default=500_000)
    parser.add_argument("--files-per-hour", type=int, default=4)
    parser.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="executor processes = DataLoader workers = Ray CPUs (default: the cores, at most 2)",
    )
    parser.add_argument("--batch-rows", type=int, default=65536, help="rows per batch, for every reader")
    parser.add_argument("--task-runners", type=int, default=1, help="reading threads per executor")
    parser.add_argument(
        "--per-sample-rows",
        type=int,
        default=100_000,
        help="rows the (slow, secondary) per-sample DataLoader reads; its rate does not depend on it",
    )
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions; figures are medians")
    parser.add_argument("--no-ray", action="store_true", help="skip Ray Data even when it is installed")
    parser.add_argument(
        "--transport",
        choices=("shm", "flight"),
        default="shm",
        help="shm: batches through shared memory (co-located reader); flight: in the Flight stream",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # see the module docstring

    root = bench_dir("serve")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    job_path = root / "job.yaml"
    job_path.write_text(
        JOB.replace("{workers}", str(args.workers))
        .replace("{batch_rows}", str(args.batch_rows))
        .replace("{runners}", str(args.task_runners))
    )
    job = load_job_spec(job_path)
    context = SourceContext(str(root))
    start = job.dataset.start
    world = SyntheticWorld(WorldConfig(seed=5, rows_per_hour=args.rows_per_hour), start)
    write_world(job, context, world, range(args.hours), files_per_hour=args.files_per_hour, progress=False)
    window = TimeWindow(start, start + timedelta(hours=args.hours))
    files = [t.read.uri for t in Planner(job.dataset, context, threads=4).plan(window).tasks]
    expected = expected_rows(files)

    notes: list[str] = []
    ray_data: RayData | None = None
    if args.no_ray:
        notes.append("Ray Data skipped (--no-ray)")
    else:
        try:
            ray_data = RayData(files, args.workers, args.batch_rows)
        except ImportError:
            notes.append("Ray Data skipped: ray is not installed (pip install -c constraints.txt -e '.[bench]')")

    readers: dict[str, tuple[Callable[[], tuple[int, float, float]], int]] = {
        "pyarrow": (lambda: run_pyarrow(files, args.batch_rows), expected),
        "pyarrow_1t": (lambda: run_pyarrow_1t(files, args.batch_rows), expected),
        "tensors_1t": (lambda: run_tensors_1t(files, args.batch_rows), expected),
        "primus": (
            lambda: run_primus(job_path, root, window, args.workers, startup, args.transport == "shm"),
            expected,
        ),
        "primus_in_process": (
            lambda: run_primus(job_path, root, window, args.workers, startup, False, in_process=True),
            expected,
        ),
        "batched_dataloader": (lambda: run_batched_dataloader(files, args.workers, args.batch_rows), expected),
        "per_sample_dataloader": (
            lambda: run_per_sample_dataloader(files, args.per_sample_rows, args.workers, args.batch_rows),
            min(args.per_sample_rows, expected),
        ),
    }
    if ray_data is not None:
        readers["ray_data"] = (ray_data.run, expected)
    runs: dict[str, list[dict]] = {name: [] for name in readers}
    startup: dict = {}
    try:
        for repeat in range(args.repeat):  # interleaved, so drifting background load hits every reader alike
            for name, (run, want) in readers.items():
                rows, cpu, wall = run()
                if rows != want:
                    raise RowsMismatch(f"{name} delivered {rows:,} rows, expected {want:,}")
                runs[name].append(
                    {
                        "rows": rows,
                        "cpu_s": round(cpu, 3),
                        "wall_s": round(wall, 3),
                        "rows_per_s_per_core": round(rows / cpu),
                        "wall_rows_per_s": round(rows / wall),
                    }
                )
                print(
                    f"[{repeat + 1}/{args.repeat}] {name:22s} rows={rows:,} cpu={cpu:.2f}s wall={wall:.2f}s -> "
                    f"{rows / cpu:,.0f} rows/s per core, {rows / wall:,.0f} rows/s wall",
                    flush=True,
                )
    finally:
        if ray_data is not None:
            ray_data.close()
    median = {
        name: round(statistics.median(r["rows_per_s_per_core"] for r in results)) for name, results in runs.items()
    }
    wall = {name: round(statistics.median(r["wall_rows_per_s"] for r in results)) for name, results in runs.items()}
    ours = median["primus"]

    def ratio(name: str, digits: int = 3) -> float | None:
        return round(ours / median[name], digits) if name in median else None

    def in_process_ratio(name: str) -> float:
        return round(median["primus_in_process"] / median[name], 3)

    def per_repeat(name: str) -> list[float] | None:
        if name not in runs:
            return None
        return [
            round(p["rows_per_s_per_core"] / b["rows_per_s_per_core"], 3)
            for p, b in zip(runs["primus"], runs[name], strict=True)
        ]

    emit(
        {
            "bench": "serve",
            "ratio_vs_batched_dataloader": ratio("batched_dataloader"),
            "ratio_vs_ray_data": ratio("ray_data"),
            "ratio_vs_pyarrow_1t": ratio("pyarrow_1t"),
            "rows_checked": True,
            "ratio_vs_tensors_1t": ratio("tensors_1t"),
            "in_process_ratio_vs_pyarrow_1t": in_process_ratio("pyarrow_1t"),
            "in_process_ratio_vs_tensors_1t": in_process_ratio("tensors_1t"),
            "in_process_ratio_vs_batched_dataloader": in_process_ratio("batched_dataloader"),
            "tensors_1t_vs_pyarrow_1t": round(median["tensors_1t"] / median["pyarrow_1t"], 3),
            "ratio_vs_pyarrow": ratio("pyarrow"),
            "ratio_vs_per_sample_dataloader": ratio("per_sample_dataloader", 1),
            "rows_per_s_per_core": ours,
            "in_process_rows_per_s_per_core": median["primus_in_process"],
            "batched_dataloader_rows_per_s_per_core": median["batched_dataloader"],
            "ray_data_rows_per_s_per_core": median.get("ray_data"),
            "pyarrow_1t_rows_per_s_per_core": median["pyarrow_1t"],
            "tensors_1t_rows_per_s_per_core": median["tensors_1t"],
            "pyarrow_rows_per_s_per_core": median["pyarrow"],
            "per_sample_dataloader_rows_per_s_per_core": median["per_sample_dataloader"],
            "wall_rows_per_s": wall,
            "expected_rows": expected,
            "columns": COLUMNS,
            "workers": args.workers,
            "transport": args.transport,
            "batch_rows": args.batch_rows,
            "repeat": args.repeat,
            "ratios_per_repeat": {
                name: per_repeat(name)
                for name in ("batched_dataloader", "ray_data", "pyarrow_1t", "tensors_1t", "pyarrow")
            },
            "notes": notes,
            **startup,
            "detail": runs,
        }
    )


if __name__ == "__main__":
    main()
