"""End-to-end rows/s per core: Parquet -> data executors -> trainer-side reader, next to fair baselines.

Every reader reads the same synthetic Parquet files, the same columns -- the ones the model uses:
``click`` (label), ``d0..d12`` (dense), ``user_id, item_id, topic_id, device, hour_of_day``
(sparse); ``event_time`` and ``sample_id`` are in the files but no model reads them -- in batches of
``--batch-rows`` rows, and every reader's delivered row count is asserted equal to the expected
count (the files' footers; a mismatch ends the bench with an error, ``"rows_checked": true`` in
the JSON says it held). The readers, measured in one run, ``--repeat`` times, interleaved:

* **primus** -- the planner (DTGG) plans the window, the driver (Flight, loopback) hands the tasks to
  ``--workers`` executor processes, each with ``--task-runners`` reading threads (default: the spec's
  ``pools.data.task_runners``, one per core of ``pools.data.cpu``: 1; every other spec key at its default),
  in the product's local pool (``PooledDataPlane`` over a ``LocalPool``, ``_common.local_plane``: each
  executor pinned to its core, supervised by a watcher thread and a control thread of this process,
  counted with it; with ``fields=("label", "dense", "sparse")``: the trainer reads no ``ts``/``sample_id``,
  so the executors decode only the model's columns), each reads through the Parquet adapter,
  normalises to the canonical schema and serves; the ``RemoteReader`` in this process claims every
  batch (exactly-once ledger) and hands it over as a ``Batch`` with torch tensors (dense float32
  [B, 13], sparse int64 [B, 5], label float32 [B]; dense and sparse are column-major views over the
  served columns: the executors never interleave the dense matrix, ``docs/shared_memory.md``).
  The reader reads as a trainer does, at the reader's default prefetch (``reader_prefetch`` in the JSON).
  ``--transport shm`` (default): executors on this host, batches through shared-memory slots, Flight
  carries descriptors; ``--transport flight``: batches in the Flight stream (a reader on another host).
  **Counted**: this process (reader threads, claims, the driver serving the executors' RPCs, the
  consumer) + every executor process from the moment it announced it was ready until it exited
  (its start-up -- interpreter, imports, warm-up: about 0.4 CPU-s each -- is reported apart: per run as
  ``executor_startup_cpu_s``, per executor as ``executor_startup_cpu_s_per_executor``).
* **primus_in_process** -- the in-trainer plane (``InTrainerDataPlane``, ``pools.backend: in_trainer``): the
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

**List features** (``--lists N``, default 0: the shape above): the files get N more columns
``tags0 .. tags{N-1}``, each ``list<int64>`` (non-null; length uniform in 0..20, mean 10; ids in
``[0, 100000)``, log-uniform, i.e. Zipf-like with exponent 1), derived from each row's ``sample_id``
by a fixed hash, so every run writes the same files. The spec maps them in ``columns.lists``, so
every reader reads them too: primus through the plane (``Batch.lists``: jagged values + offsets),
the DataLoaders, ``tensors_1t`` and Ray Data as one (values int64 [N], offsets int64 [B + 1]) pair of
tensors per list, built from the Arrow ``ListArray``'s ``offsets`` and ``values`` buffers (no per-row
Python; the per-sample loader slices them per sample and concatenates them in its collate function),
and ``pyarrow``/``pyarrow_1t`` decode them. Every consumer touches each list's values (a sum).
Lists add bytes to every row, so compare runs with and without them per byte:
``"bytes_per_row"`` is the **Arrow** size of the columns every reader reads (``pyarrow.Table.nbytes``
of the files read with those columns, divided by the rows; Parquet's uncompressed size of the same
column chunks is ``"parquet_uncompressed_bytes_per_row"``), and ``"bytes_per_s_per_core"`` is each
reader's median rows/s per core times it. ``--compare-lists N`` writes both shapes (the same rows,
without and with N lists), measures every reader on both in one process (repeats interleaved, the
shapes' order alternating per repeat), prints the N-list result with the 0-list one under
``"no_lists"`` and ``"primus_bytes_per_core_ratio_vs_no_lists"`` (primus's bytes/s per core with the
lists / without; per repeat in ``"primus_bytes_per_core_ratios_per_repeat"``, every reader's in
``"bytes_per_core_ratio_vs_no_lists"``; the plain rows/s ratio is ``"primus_rows_per_core_ratio_vs_no_lists"``).

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
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate, get_worker_info

from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.data import InTrainerDataPlane, Planner, SourceContext, TimeWindow
from primus_dagster.data.reader.remote_reader import DEFAULT_PREFETCH as READER_PREFETCH
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.job import PoolsSpec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

from _common import PARQUET_DATASET, bench_dir, cpu_self, emit, local_plane, unrestarted

JOB = (
    """
name: bench-serve
pools: {data: {replicas: {workers}, task_runners: {runners}}, training: {replicas: 1}}
"""
    + PARQUET_DATASET
)
LABEL = "click"
DENSE = [f"d{i}" for i in range(13)]
SPARSE = ["user_id", "item_id", "topic_id", "device", "hour_of_day"]
COLUMNS = [LABEL, *DENSE, *SPARSE]  # what the model reads (no event_time, no sample_id)
FIELDS = ("label", "dense", "sparse")  # the same, as canonical fields of the data plane
LIST_PREFIX = "tags"  # --lists N: list<int64> columns tags0 .. tags{N-1}
LIST_MAX_LENGTH = 20  # lengths uniform in 0..20: mean 10
LIST_VOCAB = 100_000  # ids in [0, LIST_VOCAB), log-uniform (Zipf-like, exponent 1)

JaggedPair = tuple[torch.Tensor, torch.Tensor]  # (values int64 [N], offsets int64 [B + 1])
Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[JaggedPair, ...]]

# Arrow buffers are read-only; torch warns about that (once) -- the tensors are only read here.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class RowsMismatch(RuntimeError):
    """A reader delivered another number of rows than the files hold."""


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def list_names(lists: int) -> list[str]:
    return [f"{LIST_PREFIX}{k}" for k in range(lists)]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise over uint64 (wrapping)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def list_column(sample_id: np.ndarray, k: int) -> pa.ListArray:
    """List feature ``k`` of each row: a pure function of the row's ``sample_id`` (see the module docstring)."""
    seed = _mix(sample_id.astype(np.uint64) ^ _mix(np.full(1, k + 1, dtype=np.uint64)))
    lengths = (seed % np.uint64(LIST_MAX_LENGTH + 1)).astype(np.int64)
    offsets = np.zeros(len(sample_id) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    position = np.arange(offsets[-1], dtype=np.uint64) - np.repeat(offsets[:-1], lengths).astype(np.uint64)
    bits = _mix(np.repeat(seed, lengths) + position * np.uint64(0xD6E8FEB86659FD93))
    uniform = (bits >> np.uint64(11)).astype(np.float64) / float(1 << 53)  # [0, 1)
    ids = np.minimum(np.exp(uniform * np.log(LIST_VOCAB)).astype(np.int64) - 1, LIST_VOCAB - 1)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))


class ListWorld(SyntheticWorld):
    """The synthetic world with ``lists`` list<int64> columns appended to every hour (same rows otherwise)."""

    def __init__(self, config: WorldConfig, start: datetime, lists: int):
        super().__init__(config, start)
        self.lists = lists

    def hour(self, h: int) -> pa.Table:
        table = super().hour(h)
        sample_id = table.column("sample_id").to_numpy()
        for k, name in enumerate(list_names(self.lists)):
            table = table.append_column(
                pa.field(name, pa.list_(pa.int64()), nullable=False), [list_column(sample_id, k)]
            )
        return table


def list_tensors(array: pa.Array | pa.ChunkedArray) -> JaggedPair:
    """A ``list<int64>`` column (no nulls) as (values, offsets) tensors, from its Arrow buffers: row ``b``
    holds ``values[offsets[b]:offsets[b + 1]]`` (values zero-copy)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    offsets = array.offsets.to_numpy()
    first, last = int(offsets[0]), int(offsets[-1])
    values = array.values.slice(first, last - first).to_numpy()
    return torch.from_numpy(values), torch.from_numpy(np.subtract(offsets, first, dtype=np.int64))


def to_tensors(columns: dict[str, np.ndarray], lists: tuple[JaggedPair, ...] = ()) -> Tensors:
    """The trainer's tensors from one batch of columns: dense float32 [B, 13], sparse int64 [B, 5],
    label float32 [B] -- what ``Batch.dense / .sparse / .label`` hold -- and the list features' (values,
    offsets) pairs (``Batch.lists``), as given."""
    dense = np.stack([columns[c] for c in DENSE], axis=1).astype(np.float32, copy=False)
    sparse = np.stack([columns[c] for c in SPARSE], axis=1).astype(np.int64, copy=False)
    label = np.asarray(columns[LABEL]).astype(np.float32)
    return torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(label), lists


class ParquetBatches(IterableDataset):
    """Whole batches of the files, each worker reading its share (files i, i + W, ...)."""

    def __init__(self, files: list[str], batch_size: int, lists: Sequence[str] = ()):
        self.files, self.batch_size, self.lists = files, batch_size, list(lists)

    def __iter__(self) -> Iterator[Tensors]:
        info = get_worker_info()
        files = self.files if info is None else self.files[info.id :: info.num_workers]
        columns = COLUMNS + self.lists
        for path in files:
            parquet = pq.ParquetFile(path, memory_map=True)
            for batch in parquet.iter_batches(batch_size=self.batch_size, columns=columns, use_threads=False):
                yield to_tensors(
                    {name: batch.column(name).to_numpy() for name in COLUMNS},
                    tuple(list_tensors(batch.column(name)) for name in self.lists),
                )


class RowDataset(Dataset):
    """One sample per index, as a user would write it over columns loaded into numpy."""

    def __init__(self, files: list[str], rows: int, lists: Sequence[str] = ()):
        table = ds.dataset(files, format="parquet").head(rows, columns=COLUMNS + list(lists))
        self.dense = np.stack([table[c].to_numpy() for c in DENSE], axis=1).astype(np.float32)
        self.sparse = np.stack([table[c].to_numpy() for c in SPARSE], axis=1).astype(np.int64)
        self.label = table[LABEL].to_numpy().astype(np.float32)
        self.lists = [(values, offsets.numpy()) for values, offsets in map(list_tensors, (table[n] for n in lists))]

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> Tensors:
        lists = tuple(values[offsets[i] : offsets[i + 1]] for values, offsets in self.lists)
        return torch.from_numpy(self.dense[i]), torch.from_numpy(self.sparse[i]), torch.tensor(self.label[i]), lists


def collate_samples(samples: list[Tensors]) -> Tensors:
    """``default_collate`` for the dense, sparse and label samples; each list feature's samples
    concatenated, with offsets from their lengths."""
    dense, sparse, label = default_collate([s[:3] for s in samples])
    lists = []
    for parts in zip(*(s[3] for s in samples), strict=True):
        offsets = torch.zeros(len(parts) + 1, dtype=torch.int64)
        torch.cumsum(torch.tensor([len(p) for p in parts]), 0, out=offsets[1:])
        lists.append((torch.cat(parts), offsets))
    return dense, sparse, label, tuple(lists)


def run_primus(
    job_path, root, window, workers: int, startup: dict, shm: bool, in_process: bool = False
) -> tuple[int, float, float]:
    job = load_job_spec(job_path)
    tasks = list(Planner(job.dataset, SourceContext(str(root)), threads=4).plan(window).tasks)
    rows = 0
    plane: InTrainerDataPlane | PooledDataPlane
    if in_process:  # the executors start in this process: count from before they start
        plane = InTrainerDataPlane(job_path, root, tasks, executors=workers, trainers=1, fields=FIELDS)
        cpu0, wall0 = cpu_self(), time.perf_counter()
    else:
        plane = local_plane(job_path, root, tasks, executors=workers, trainers=1, shm=shm, fields=FIELDS)
    with plane:
        if not in_process:  # steady state: from the moment every executor is up (start-up reported apart)
            cpu0, wall0 = cpu_self(), time.perf_counter()
        with plane.reader(0) as reader:  # the trainers' own reader settings (prefetch READER_PREFETCH)
            for batch in reader:
                rows += batch.rows
                _ = batch.dense.sum()  # touch the tensor, as a training step would
                for jagged in batch.lists.values():
                    _ = jagged.values.sum()
        wall = time.perf_counter() - wall0
        cpu = cpu_self() - cpu0
        plane.wait_executors(30)
        if isinstance(plane, InTrainerDataPlane):
            return rows, cpu, wall
        unrestarted(plane)
        startup_cpu = plane.cpu_seconds() - plane.cpu_seconds(include_startup=False)
        startup.setdefault("executor_startup_cpu_s", []).append(round(startup_cpu, 3))
        startup.setdefault("executor_startup_cpu_s_per_executor", []).append(round(startup_cpu / workers, 3))
        startup.setdefault("reader_process_cpu_s", []).append(round(cpu, 3))  # reader, driver, claims
        startup.setdefault("executors_cpu_s", []).append(round(plane.cpu_seconds(include_startup=False), 3))
        cpu += plane.cpu_seconds(include_startup=False)
    return rows, cpu, wall


def run_pyarrow(files: list[str], columns: list[str], batch_size: int) -> tuple[int, float, float]:
    cpu0, wall0 = cpu_self(), time.perf_counter()
    rows = sum(
        b.num_rows for b in ds.dataset(files, format="parquet").to_batches(columns=columns, batch_size=batch_size)
    )
    return rows, cpu_self() - cpu0, time.perf_counter() - wall0


def run_pyarrow_1t(files: list[str], columns: list[str], batch_size: int) -> tuple[int, float, float]:
    cpu0, wall0 = cpu_self(), time.perf_counter()
    rows = 0
    for path in files:
        with pq.ParquetFile(path, memory_map=True) as parquet:
            for b in parquet.iter_batches(batch_size=batch_size, columns=columns, use_threads=False):
                rows += b.num_rows
    return rows, cpu_self() - cpu0, time.perf_counter() - wall0


def _drain(loader: Any) -> tuple[int, float, float]:
    cpu0, children0, wall0 = cpu_self(), cpu_children(), time.perf_counter()
    rows = 0
    for dense, _sparse, label, lists in loader:
        rows += len(label)
        _ = dense.sum()
        for values, _offsets in lists:
            _ = values.sum()
    wall = time.perf_counter() - wall0
    return rows, cpu_self() - cpu0 + cpu_children() - children0, wall


def run_tensors_1t(files: list[str], lists: list[str], batch_size: int) -> tuple[int, float, float]:
    return _drain(ParquetBatches(files, batch_size, lists))


def run_batched_dataloader(
    files: list[str], lists: list[str], workers: int, batch_size: int
) -> tuple[int, float, float]:
    return _drain(DataLoader(ParquetBatches(files, batch_size, lists), batch_size=None, num_workers=workers))


def run_per_sample_dataloader(
    files: list[str], lists: list[str], rows: int, workers: int, batch_size: int
) -> tuple[int, float, float]:
    dataset = RowDataset(files, rows, lists)  # loading is outside the timing
    collate = collate_samples if lists else None  # without lists: the default collate, as before
    return _drain(DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate))


class RayData:
    """Ray Data over the same files; started once and warmed up (see the module docstring)."""

    def __init__(self, files: list[str], workers: int, batch_size: int):
        import ray
        import ray.data
        from ray.data.collate_fn import ArrowBatchCollateFn

        class Collate(ArrowBatchCollateFn):  # Ray's recommended form (a plain function is deprecated)
            def __init__(self, lists: Sequence[str] = ()):
                super().__init__()
                self.lists = list(lists)

            def __call__(self, table: Any) -> Tensors:
                return to_tensors(
                    {name: table.column(name).to_numpy() for name in COLUMNS},
                    tuple(list_tensors(table.column(name)) for name in self.lists),
                )

        self.ray, self.batch_size, self.make_collate = ray, batch_size, Collate
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
        self.iterate(files[:1], [])  # warm-up: worker processes, imports, the first task

    def iterate(self, files: list[str], lists: list[str]) -> int:
        rows = 0
        dataset = self.ray.data.read_parquet(files).select_columns(COLUMNS + lists)  # pushed down into the read
        batches = dataset.iter_torch_batches(batch_size=self.batch_size, collate_fn=self.make_collate(lists))
        for dense, _sparse, label, jagged in batches:
            rows += len(label)
            _ = dense.sum()
            for values, _offsets in jagged:
                _ = values.sum()
        return rows

    def run(self, files: list[str], lists: list[str]) -> tuple[int, float, float]:
        before = _tree_cpu()
        cpu0, wall0 = cpu_self(), time.perf_counter()
        rows = self.iterate(files, lists)
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


def read_bytes(files: list[str], columns: list[str]) -> tuple[int, int]:
    """The Arrow bytes of ``columns`` read from ``files`` and their column chunks' uncompressed Parquet bytes."""
    arrow = parquet = 0
    wanted = set(columns)
    for path in files:
        arrow += pq.read_table(path, columns=columns, use_threads=False).nbytes
        metadata = pq.ParquetFile(path).metadata
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.path_in_schema.split(".")[0] in wanted:
                    parquet += chunk.total_uncompressed_size
    return arrow, parquet


def job_yaml(args: argparse.Namespace, lists: int) -> str:
    text = (
        JOB.replace("{workers}", str(args.workers))
        .replace("{batch_rows}", str(args.batch_rows))
        .replace("{runners}", str(args.task_runners))
    )
    if lists:  # map the list columns in columns.lists
        end = "hour_of_day]}"
        assert text.count(end) == 1, "the dataset template's columns changed: update serve.py"
        text = text.replace(end, f"hour_of_day], lists: [{', '.join(list_names(lists))}]}}")
    return text


@dataclass
class Shape:
    """One shape of the files (``lists`` list columns) and what every reader needs to read it."""

    lists: int
    root: Path
    job_path: Path
    window: TimeWindow
    files: list[str]
    expected: int
    arrow_bytes: int
    parquet_bytes: int
    startup: dict = field(default_factory=dict)

    @property
    def list_columns(self) -> list[str]:
        return list_names(self.lists)

    @property
    def columns(self) -> list[str]:
        return COLUMNS + self.list_columns


def write_shape(args: argparse.Namespace, root: Path, lists: int) -> Shape:
    """Write the files of one shape under ``root`` (the same rows for every ``lists``)."""
    root.mkdir(parents=True)
    job_path = root / "job.yaml"
    job_path.write_text(job_yaml(args, lists))
    job = load_job_spec(job_path)
    context = SourceContext(str(root))
    start = job.dataset.start
    config = WorldConfig(seed=5, rows_per_hour=args.rows_per_hour)
    world = ListWorld(config, start, lists) if lists else SyntheticWorld(config, start)
    write_world(job, context, world, range(args.hours), files_per_hour=args.files_per_hour, progress=False)
    window = TimeWindow(start, start + timedelta(hours=args.hours))
    files = [t.read.uri for t in Planner(job.dataset, context, threads=4).plan(window).tasks]
    arrow, parquet = read_bytes(files, COLUMNS + list_names(lists))
    return Shape(lists, root, job_path, window, files, expected_rows(files), arrow, parquet)


Reader = Callable[[], tuple[int, float, float]]


def shape_readers(shape: Shape, args: argparse.Namespace, ray_data: RayData | None) -> dict[str, tuple[Reader, int]]:
    files, lists, expected, batch = shape.files, shape.list_columns, shape.expected, args.batch_rows
    readers: dict[str, tuple[Reader, int]] = {
        "pyarrow": (lambda: run_pyarrow(files, shape.columns, batch), expected),
        "pyarrow_1t": (lambda: run_pyarrow_1t(files, shape.columns, batch), expected),
        "tensors_1t": (lambda: run_tensors_1t(files, lists, batch), expected),
        "primus": (
            lambda: run_primus(
                shape.job_path, shape.root, shape.window, args.workers, shape.startup, args.transport == "shm"
            ),
            expected,
        ),
        "primus_in_process": (
            lambda: run_primus(
                shape.job_path, shape.root, shape.window, args.workers, shape.startup, False, in_process=True
            ),
            expected,
        ),
        "batched_dataloader": (lambda: run_batched_dataloader(files, lists, args.workers, batch), expected),
        "per_sample_dataloader": (
            lambda: run_per_sample_dataloader(files, lists, args.per_sample_rows, args.workers, batch),
            min(args.per_sample_rows, expected),
        ),
    }
    if ray_data is not None:
        readers["ray_data"] = (lambda: ray_data.run(files, lists), expected)
    return readers


def result(shape: Shape, runs: dict[str, list[dict]], args: argparse.Namespace, notes: list[str]) -> dict:
    """The JSON of one shape's runs (see the module docstring)."""
    median = {
        name: round(statistics.median(r["rows_per_s_per_core"] for r in results)) for name, results in runs.items()
    }
    wall = {name: round(statistics.median(r["wall_rows_per_s"] for r in results)) for name, results in runs.items()}
    ours = median["primus"]
    bytes_per_row = shape.arrow_bytes / shape.expected

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

    return {
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
        "expected_rows": shape.expected,
        "columns": shape.columns,
        "lists": shape.lists,
        "bytes_per_row": round(bytes_per_row, 1),
        "bytes_per_row_basis": "arrow: pyarrow.Table.nbytes of the read columns / rows",
        "parquet_uncompressed_bytes_per_row": round(shape.parquet_bytes / shape.expected, 1),
        "bytes_per_s_per_core": {name: round(rate * bytes_per_row) for name, rate in median.items()},
        "workers": args.workers,
        "transport": args.transport,
        "reader_prefetch": READER_PREFETCH,
        "batch_rows": args.batch_rows,
        "repeat": args.repeat,
        "ratios_per_repeat": {
            name: per_repeat(name) for name in ("batched_dataloader", "ray_data", "pyarrow_1t", "tensors_1t", "pyarrow")
        },
        "notes": notes,
        **shape.startup,
        "detail": runs,
    }


def compare(with_lists: dict, without: dict, runs: dict[str, list[dict]], runs0: dict[str, list[dict]]) -> dict:
    """``with_lists`` (the N-list result) with the 0-list one under ``no_lists`` and the bytes/s-per-core ratios."""
    scale = with_lists["bytes_per_row"] / without["bytes_per_row"]  # rows/s ratio -> bytes/s ratio
    bytes_ratio = {
        name: round(rate / without["bytes_per_s_per_core"][name], 3)
        for name, rate in with_lists["bytes_per_s_per_core"].items()
    }
    per_repeat = [
        round(scale * a["rows_per_s_per_core"] / b["rows_per_s_per_core"], 3)
        for a, b in zip(runs["primus"], runs0["primus"], strict=True)
    ]
    return {
        "bench": "serve",
        "primus_bytes_per_core_ratio_vs_no_lists": bytes_ratio["primus"],
        "primus_bytes_per_core_ratios_per_repeat": per_repeat,
        "bytes_per_core_ratio_vs_no_lists": bytes_ratio,
        "primus_rows_per_core_ratio_vs_no_lists": round(
            with_lists["rows_per_s_per_core"] / without["rows_per_s_per_core"], 3
        ),
        **{key: value for key, value in with_lists.items() if key != "bench"},
        "no_lists": {key: value for key, value in without.items() if key != "bench"},
    }


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
    parser.add_argument(
        "--task-runners",
        type=int,
        default=PoolsSpec().data.task_runners,
        help="reading threads per executor (default: the spec's, pools.data.task_runners)",
    )
    parser.add_argument(
        "--per-sample-rows",
        type=int,
        default=100_000,
        help="rows the (slow, secondary) per-sample DataLoader reads; its rate does not depend on it",
    )
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions; figures are medians")
    parser.add_argument("--no-ray", action="store_true", help="skip Ray Data even when it is installed")
    parser.add_argument(
        "--lists",
        type=int,
        default=0,
        help="list<int64> columns tags0.. in the files, read by every reader (0: none, today's shape)",
    )
    parser.add_argument(
        "--compare-lists",
        type=int,
        default=0,
        metavar="N",
        help="measure 0 and N lists in this run (repeats interleaved); prints primus_bytes_per_core_ratio_vs_no_lists",
    )
    parser.add_argument(
        "--transport",
        choices=("shm", "flight"),
        default="shm",
        help="shm: batches through shared memory (co-located reader); flight: in the Flight stream",
    )
    args = parser.parse_args()
    if args.compare_lists and args.lists:
        parser.error("--compare-lists N measures 0 and N lists itself: leave --lists out")
    torch.set_num_threads(1)  # see the module docstring

    root = bench_dir("serve")
    shutil.rmtree(root, ignore_errors=True)
    if args.compare_lists:  # the same rows, without and with the lists, side by side
        shapes = [
            write_shape(args, root / "lists0", 0),
            write_shape(args, root / f"lists{args.compare_lists}", args.compare_lists),
        ]
    else:
        shapes = [write_shape(args, root, args.lists)]

    notes: list[str] = []
    ray_data: RayData | None = None
    if args.no_ray:
        notes.append("Ray Data skipped (--no-ray)")
    else:
        try:
            ray_data = RayData(shapes[0].files, args.workers, args.batch_rows)
        except ImportError:
            notes.append("Ray Data skipped: ray is not installed (pip install -c constraints.txt -e '.[bench]')")

    readers = [shape_readers(shape, args, ray_data) for shape in shapes]
    runs: list[dict[str, list[dict]]] = [{name: [] for name in r} for r in readers]
    try:
        for repeat in range(args.repeat):  # interleaved, so drifting background load hits every reader alike
            order = range(len(shapes)) if repeat % 2 == 0 else reversed(range(len(shapes)))  # shapes: ABBA...
            for s in order:
                tag = f" lists={shapes[s].lists}" if len(shapes) > 1 else ""
                for name, (run, want) in readers[s].items():
                    rows, cpu, wall = run()
                    if rows != want:
                        raise RowsMismatch(f"{name}{tag} delivered {rows:,} rows, expected {want:,}")
                    runs[s][name].append(
                        {
                            "rows": rows,
                            "cpu_s": round(cpu, 3),
                            "wall_s": round(wall, 3),
                            "rows_per_s_per_core": round(rows / cpu),
                            "wall_rows_per_s": round(rows / wall),
                        }
                    )
                    print(
                        f"[{repeat + 1}/{args.repeat}]{tag} {name:22s} rows={rows:,} cpu={cpu:.2f}s wall={wall:.2f}s -> "
                        f"{rows / cpu:,.0f} rows/s per core, {rows / wall:,.0f} rows/s wall",
                        flush=True,
                    )
    finally:
        if ray_data is not None:
            ray_data.close()
    results = [result(shape, r, args, notes) for shape, r in zip(shapes, runs, strict=True)]
    emit(compare(results[1], results[0], runs[1], runs[0]) if args.compare_lists else results[0])


if __name__ == "__main__":
    main()
