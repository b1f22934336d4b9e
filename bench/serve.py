"""End-to-end rows/s per core: Parquet -> data executors -> Flight -> trainer-side reader.

Three readers of the same synthetic Parquet files, measured in one run:

* **primus** — the planner (DTGG) plans the window, the driver (Flight, loopback) hands the tasks
  to ``--workers`` executor processes, each reads through the Parquet adapter, normalises to the
  canonical schema and serves over Arrow Flight; the trainer-side ``RemoteReader`` in this process
  claims every batch and turns it into torch tensors (dense [B, 13], sparse [B] x 5, label [B]).
  ``--transport shm`` (default): the executors are on this host, so the batches themselves travel
  through shared memory and Flight carries only their descriptors; ``--transport flight``: the
  batches travel in the Flight stream (as to a reader on another host).
* **pyarrow** — ``pyarrow.dataset`` decoding the same files and columns into batches of the same
  size, nothing else: the hardware ceiling.
* **dataloader** — what a user would otherwise write: a map-style ``torch.utils.data.Dataset``
  holding the same rows (loaded with pyarrow, as numpy arrays) whose ``__getitem__`` returns one
  sample's tensors, batched by ``DataLoader(batch_size, num_workers=--workers)`` with the default
  collate.

"Per core" = rows / CPU seconds of every process involved (this one, executors, DataLoader
workers) in steady state: the executors' one-time start-up (interpreter + imports, about a
second of CPU each) is reported separately as ``executor_startup_cpu_s``, as the DataLoader's
worker start-up is inside its figure (it is cheaper: fork). Wall-clock rows/s are reported too.
torch runs single-threaded here: the consumers' "touch" (a sum over the batch) is tiny, and with
torch's default OpenMP pool the pool's spinning threads billed about 0.4 CPU-s to whichever
pipeline ran it -- a cost of the measurement, not of the data path.

All three read batches of ``--batch-rows`` rows (pyarrow too: its own default would be 131072;
measured here, 65536 and 131072 give the same ratios within noise). The three readers run
``--repeat`` times, interleaved, and the figures are medians (this machine's background load
drifts by more than the differences measured).

Last line: {"bench": "serve", "rows_per_s_per_core": ..., "pyarrow_rows_per_s_per_core": ...,
"dataloader_rows_per_s_per_core": ..., "ratio_vs_pyarrow": ..., "ratio_vs_dataloader": ...}
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import time
from datetime import timedelta

import numpy as np
import pyarrow.dataset as ds
import torch
from torch.utils.data import DataLoader, Dataset

from primus_dagster.data import LocalDataPlane, Planner, SourceContext, TimeWindow, native_columns
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


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class RowDataset(Dataset):
    """One sample per index, as a user would write it over columns loaded into numpy."""

    def __init__(self, files: list[str], columns: list[str], rows: int):
        table = ds.dataset(files, format="parquet").head(rows, columns=columns)
        self.dense = np.stack([table[f"d{i}"].to_numpy() for i in range(13)], axis=1).astype(np.float32)
        self.sparse = np.stack(
            [table[c].to_numpy() for c in ("user_id", "item_id", "topic_id", "device", "hour_of_day")], axis=1
        ).astype(np.int64)
        self.label = table["click"].to_numpy().astype(np.float32)

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.dense[i]), torch.from_numpy(self.sparse[i]), torch.tensor(self.label[i])


def run_primus(job_path, root, window, workers: int, startup: dict, shm: bool) -> tuple[int, float, float]:
    job = load_job_spec(job_path)
    tasks = list(Planner(job.dataset, SourceContext(str(root)), threads=4).plan(window).tasks)
    rows = 0
    with LocalDataPlane(job_path, root, tasks, executors=workers, trainers=1, shm=shm) as plane:
        # Steady state: from the moment every executor is up (start-up is reported separately).
        cpu0, wall0 = cpu_self(), time.perf_counter()
        with plane.reader(0, prefetch=16) as reader:
            for batch in reader:
                rows += batch.rows
                _ = batch.dense.sum()  # touch the tensor, as a training step would
        wall = time.perf_counter() - wall0
        cpu = cpu_self() - cpu0
        plane.wait_executors(30)
        startup["executor_startup_cpu_s"] = round(plane.cpu_seconds() - plane.cpu_seconds(include_startup=False), 3)
        startup["reader_process_cpu_s"] = round(cpu, 3)  # reader, driver, claims
        startup["executors_cpu_s"] = round(plane.cpu_seconds(include_startup=False), 3)
        cpu += plane.cpu_seconds(include_startup=False)
    return rows, cpu, wall


def run_pyarrow(files: list[str], columns: list[str], batch_size: int) -> tuple[int, float, float]:
    cpu0, wall0 = cpu_self(), time.perf_counter()
    rows = sum(
        b.num_rows for b in ds.dataset(files, format="parquet").to_batches(columns=columns, batch_size=batch_size)
    )
    return rows, cpu_self() - cpu0, time.perf_counter() - wall0


def run_dataloader(
    files: list[str], columns: list[str], rows: int, workers: int, batch_size: int
) -> tuple[int, float, float]:
    dataset = RowDataset(files, columns, rows)
    cpu0, children0, wall0 = cpu_self(), cpu_children(), time.perf_counter()
    seen = 0
    for dense, _sparse, label in DataLoader(dataset, batch_size=batch_size, num_workers=workers):
        seen += len(label)
        _ = dense.sum()
    wall = time.perf_counter() - wall0
    return seen, cpu_self() - cpu0 + cpu_children() - children0, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=16)
    parser.add_argument("--rows-per-hour", type=int, default=500_000)
    parser.add_argument("--files-per-hour", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="executor processes = DataLoader workers")
    parser.add_argument("--batch-rows", type=int, default=65536, help="rows per batch, for all three readers")
    parser.add_argument("--task-runners", type=int, default=1, help="reading threads per executor")
    parser.add_argument(
        "--dataloader-rows",
        type=int,
        default=200_000,
        help="rows the (slow) DataLoader baseline reads; its rate does not depend on it",
    )
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions; figures are medians")
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
    source = job.dataset.source("src")
    columns = native_columns(source.columns)
    files = [t.read.uri for t in Planner(job.dataset, context, threads=4).plan(window).tasks]

    runs: dict[str, list[dict]] = {"pyarrow": [], "primus": [], "dataloader": []}
    startup: dict = {}
    for repeat in range(args.repeat):  # interleaved, so drifting background load hits every reader alike
        for name, run in (
            ("pyarrow", lambda: run_pyarrow(files, columns, args.batch_rows)),
            ("primus", lambda: run_primus(job_path, root, window, args.workers, startup, args.transport == "shm")),
            ("dataloader", lambda: run_dataloader(files, columns, args.dataloader_rows, args.workers, args.batch_rows)),
        ):
            rows, cpu, wall = run()
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
                f"[{repeat + 1}/{args.repeat}] {name:10s} rows={rows:,} cpu={cpu:.2f}s wall={wall:.2f}s -> "
                f"{rows / cpu:,.0f} rows/s per core, {rows / wall:,.0f} rows/s wall"
            )
    median = {name: statistics.median(r["rows_per_s_per_core"] for r in results) for name, results in runs.items()}
    ours, arrow, loader = (round(median[k]) for k in ("primus", "pyarrow", "dataloader"))
    emit(
        {
            "bench": "serve",
            "rows_per_s_per_core": ours,
            "pyarrow_rows_per_s_per_core": arrow,
            "dataloader_rows_per_s_per_core": loader,
            "ratio_vs_pyarrow": round(ours / arrow, 3),
            "ratio_vs_dataloader": round(ours / loader, 2),
            "workers": args.workers,
            "transport": args.transport,
            "batch_rows": args.batch_rows,
            "repeat": args.repeat,
            "ratios_per_repeat": [
                round(p["rows_per_s_per_core"] / a["rows_per_s_per_core"], 3)
                for p, a in zip(runs["primus"], runs["pyarrow"], strict=True)
            ],
            **startup,
            "detail": runs,
        }
    )


if __name__ == "__main__":
    main()
