"""Where the serving path's CPU goes: ``bench/serve.py``'s one-hot shape taken apart, step by step.

``bench/serve.py`` measures the data plane end to end against ``tensors_1t`` (one thread decoding the
files and building the trainer's tensors). This bench measures, in one process and on the same files,
what each step of the default path (executor processes, shared memory) costs by itself, so that the
gap between the two has names (``docs/data_plane.md``, "Where the serving path's time goes", reads the figures):

* ``decode`` -- the executor's reader alone: the Parquet adapter's ``open_file`` (memory-mapped,
  ``iter_batches`` of ``batch_rows``, one thread, the model's columns only), every batch dropped at once;
* ``decode_holding`` -- the same while the last ``buffer_batches + shm_inflight`` (8 + 4) batches stay
  alive, as an executor's buffers and slots in flight keep them: the working set no longer fits the
  caches;
* ``normalize`` -- the executor's ``Normalizer`` (the served fields, dense kept as its columns) on
  every batch;
* ``slot_copy`` / ``slot_copy_holding`` -- writing every normalised batch into a shared-memory slot
  (``SlotPool.put`` into reused slots, the executor's copy), in the two passes;
* ``slot_copy_fresh_ms_per_batch`` -- the same copy into a newly made slot (``posix_fallocate``, map,
  first touch, unmap): what a batch costs while a stream still grows its slots (a short run);
* ``flight_messages`` -- a Flight ``DoGet`` stream of one empty batch with a batch's metadata and
  shared-memory descriptor per batch, server and client in this process: the stream's share;
* ``decode_beside_decoder`` -- ``decode`` while another process decodes the same files on another core
  (``_common.decoding_beside``): what running two executors side by side does to each one's CPU;
* ``tensors_1t``, ``primus`` (with ``primus_reader_process`` and ``primus_executors``) -- the
  end-to-end figures of ``bench/serve.py``, measured in this run (executor start-up excluded as there).

The executor's steps allocate from the executor's Arrow memory pool (jemalloc), the end-to-end
readers from the default one, as in ``bench/serve.py``.

``explained_executor_cpu_s`` = decode_holding + normalize + slot_copy_holding + flight_messages: the
executors' work measured step by step on one core; ``executors_unexplained_cpu_s`` is what the
executor processes spent beyond it (leases and completions, the hand-over between their threads,
running beside each other). ``primus_cpu_s_for_ratio_0_8`` = tensors_1t / 0.8: what the whole path
may spend for ``ratio_vs_tensors_1t`` 0.8. CPU seconds per pass over all the rows, medians of
``--repeat`` interleaved passes.

Last line: {"bench": "serve_breakdown", "cpu_s": {...}, "explained_executor_cpu_s": ...,
"executors_unexplained_cpu_s": ..., "primus_cpu_s_for_ratio_0_8": ..., ...}
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import torch

from primus_dagster.data import Planner, SourceContext
from primus_dagster.data.batch import BatchMeta
from primus_dagster.data.flight_protocol import with_shm
from primus_dagster.data.shm.slots import FREE, ShmDir, SlotPool
from primus_dagster.data.sources import SourceAdapter, make_adapter
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.job import PoolsSpec

from _common import bench_dir, cpu_self, decoding_beside, emit
from serve import FIELDS, Shape, run_primus, run_tensors_1t, write_shape

HOLD = 8 + 4  # data.buffer_batches (bench/serve.py's job, the default) + the shared-memory slots in flight


@contextlib.contextmanager
def executor_pool() -> Iterator[None]:
    """Arrow allocates from the pool an executor process uses (jemalloc where built in:
    ``primus_dagster.data.executor.process.use_jemalloc``) for the duration of the block."""
    before = pa.default_memory_pool()
    if "jemalloc" in pa.supported_memory_backends():
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)


def executor_adapter(shape: Shape, tasks: list[DataTask]) -> SourceAdapter:
    """The tasks' source adapter as a serving executor holds it: the model's fields, no constant
    columns, the dense matrix kept as its columns."""
    job = load_job_spec(shape.job_path)
    adapter = make_adapter(job.dataset.source(tasks[0].read.source), SourceContext(str(shape.root)))
    adapter.project(FIELDS, constants=False).normalize.split_dense = True
    return adapter


def executor_passes(shape: Shape, tasks: list[DataTask], hold: int) -> dict[str, float]:
    """One pass over every task as an executor makes it, each step's CPU summed apart."""
    adapter = executor_adapter(shape, tasks)
    shm = ShmDir()
    pool = SlotPool(shm)
    kept: deque[pa.RecordBatch] = deque(maxlen=max(1, hold))
    spent = {"decode": 0.0, "normalize": 0.0, "slot_copy": 0.0}
    try:
        for task in tasks:
            natives = iter(adapter.open_file(task.read))
            while True:
                t0 = cpu_self()
                native = next(natives, None)
                t1 = cpu_self()
                spent["decode"] += t1 - t0
                if native is None:
                    break
                out = adapter.normalize(native, where=task.read.uri, partition=task.read.event_partition)
                t2 = cpu_self()
                put = pool.put(out)
                assert put is not None, "no shared memory for the slot"
                put[1].header[0] = FREE  # the reader is done with it: the slot is reused
                spent["normalize"] += t2 - t1
                spent["slot_copy"] += cpu_self() - t2
                if hold:
                    kept.append(out)
    finally:
        pool.close()
        shm.close()
    return spent


def task_rows(tasks: list[DataTask]) -> list[int]:
    """Rows per task (one file each here), from the footers."""
    return [pq.ParquetFile(task.read.uri).metadata.num_rows for task in tasks]


def decode_only(shape: Shape, tasks: list[DataTask]) -> float:
    adapter = executor_adapter(shape, tasks)
    cpu0 = cpu_self()
    for task in tasks:
        for _ in adapter.open_file(task.read):
            pass
    return cpu_self() - cpu0


def fresh_slot_copy_ms(shape: Shape, tasks: list[DataTask], batches: int = 16) -> float:
    """CPU milliseconds per batch written into a slot made for it (and given back after)."""
    adapter = executor_adapter(shape, tasks)
    outs = []
    for task in tasks:
        outs += [adapter.normalize(b, where=task.read.uri) for b in adapter.open_file(task.read)]
        if len(outs) >= batches:
            break
    shm = ShmDir()
    try:
        cpu0 = cpu_self()
        for out in outs[:batches]:
            pool = SlotPool(shm)
            assert pool.put(out) is not None
            pool.close()
        return (cpu_self() - cpu0) / len(outs[:batches]) * 1000
    finally:
        shm.close()


class _Descriptors(fl.FlightServerBase):
    """Streams ``n`` empty batches, each with a served batch's metadata and slot descriptor."""

    def __init__(self, n: int, schema: pa.Schema):
        super().__init__("grpc://127.0.0.1:0")
        self.n, self.schema = n, schema

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        empty = pa.RecordBatch.from_arrays([pa.array([], f.type) for f in self.schema], schema=self.schema)

        def messages():
            for i in range(self.n):
                meta = BatchMeta(f"src:2026-11-01T{i % 24:02d}:00:part-{i}.parquet", 0, 65536, "s", "batch", "src")
                desc = {"slot": i % 4, "file": f"s0-{i % 4}-{i}", "seq": i + 1, "length": 6_300_000}
                yield empty, with_shm(meta.encode(), desc)

        return fl.GeneratorStream(self.schema, messages())


def flight_messages(n: int, schema: pa.Schema) -> float:
    server = _Descriptors(n, schema)
    client = fl.connect(f"grpc://127.0.0.1:{server.port}")
    try:
        cpu0 = cpu_self()
        reader = client.do_get(fl.Ticket(b"0"))
        got = 0
        while True:
            try:
                reader.read_chunk()
            except StopIteration:
                break
            got += 1
        assert got == n, f"{got} of {n} messages"
        return cpu_self() - cpu0
    finally:
        client.close()
        server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=16)
    parser.add_argument("--rows-per-hour", type=int, default=500_000)
    parser.add_argument("--files-per-hour", type=int, default=4)
    parser.add_argument("--batch-rows", type=int, default=65536)
    parser.add_argument("--workers", type=int, default=2, help="executor processes of the end-to-end run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    args.task_runners, args.lists = PoolsSpec().data.task_runners, 0  # serve.py's defaults: its job template reads them
    torch.set_num_threads(1)
    root = bench_dir("serve_breakdown")
    shutil.rmtree(root, ignore_errors=True)
    shape = write_shape(args, Path(root), 0)
    job = load_job_spec(shape.job_path)
    tasks = list(Planner(job.dataset, SourceContext(str(shape.root)), threads=4).plan(shape.window).tasks)
    batches = sum(-(-rows // args.batch_rows) for rows in task_rows(tasks))
    runs: dict[str, list[float]] = {}
    startup: dict = {}

    def record(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)

    for _ in range(args.repeat):  # interleaved: drifting background load hits every step alike
        rows, cpu, _wall = run_tensors_1t(shape.files, [], args.batch_rows)
        assert rows == shape.expected
        record("tensors_1t", cpu)
        rows, cpu, _wall = run_primus(shape.job_path, shape.root, shape.window, args.workers, startup, True)
        assert rows == shape.expected
        record("primus", cpu)
        record("primus_reader_process", startup["reader_process_cpu_s"][-1])
        record("primus_executors", startup["executors_cpu_s"][-1])
        with executor_pool():
            for hold, suffix in ((0, ""), (HOLD, "_holding")):
                for step, spent in executor_passes(shape, tasks, hold).items():
                    record(step + suffix, spent)
            record("decode_alone", decode_only(shape, tasks))  # paired with the next one
            with decoding_beside(shape.files):
                record("decode_beside_decoder", decode_only(shape, tasks))
            record("slot_copy_fresh_ms_per_batch", fresh_slot_copy_ms(shape, tasks))
        record("flight_messages", flight_messages(batches, pa.schema([pa.field("label", pa.float32())])))
    cpu = {name: round(statistics.median(values), 3) for name, values in runs.items()}
    explained = cpu["decode_holding"] + cpu["normalize_holding"] + cpu["slot_copy_holding"] + cpu["flight_messages"]
    emit(
        {
            "bench": "serve_breakdown",
            "rows": shape.expected,
            "tasks": len(tasks),
            "batches": batches,
            "cpu_s": cpu,
            "explained_executor_cpu_s": round(explained, 3),
            "executors_unexplained_cpu_s": round(cpu["primus_executors"] - explained, 3),
            "primus_cpu_s_for_ratio_0_8": round(cpu["tensors_1t"] / 0.8, 3),
            "ratio_vs_tensors_1t": round(cpu["tensors_1t"] / cpu["primus"], 3),
            "runs": {name: [round(v, 3) for v in values] for name, values in runs.items()},
        }
    )


if __name__ == "__main__":
    main()
