"""Shared helpers of the benchmarks: one-source job specs over the synthetic world, the plane of
executor processes they measure."""

from __future__ import annotations

import contextlib
import json
import resource
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus_dagster.spec import JobSpec, parse_job_spec

if TYPE_CHECKING:  # imported where used: the benches that measure no plane do not load it
    from primus_dagster.cluster.pooled_plane import PooledDataPlane
    from primus_dagster.data import DataTask

COLUMNS = (
    "{ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, "
    "d12], sparse: [user_id, item_id, topic_id, device, hour_of_day]}"
)

LOCATIONS = {
    "parquet": "path: parquet/impressions",
    "delta": "uri: delta/impressions",
    "iceberg": "table: bench.impressions",
    "kafka": "topic: bench-events\n          max_records_per_task: 1000000",
}


def one_source_job(kind: str, start: str = "2026-11-01", batch_rows: int = 65536) -> JobSpec:
    """A job whose only source is of ``kind``; it receives the whole synthetic world."""
    role = "stream" if kind == "kafka" else "batch"
    return parse_job_spec(
        f"""
name: bench-{kind}
dataset:
  start: {start}
  streams:
    - name: s
      window: 1h
      sources:
        - name: src_{kind}
          type: {kind}
          kind: {role}
          batch_rows: {batch_rows}
          {LOCATIONS[kind]}
          columns: {COLUMNS}
""",
        f"<bench {kind}>",
    )


# The dataset of the Parquet benchmarks (serve, train_throughput): one batch source, hourly files.
PARQUET_DATASET = f"""
dataset:
  start: 2026-11-01
  streams:
    - name: s
      window: 1h
      sources:
        - name: src
          type: parquet
          kind: batch
          batch_rows: {{batch_rows}}
          path: parquet/impressions
          columns: {COLUMNS}
"""


# Decodes the Parquet files given as arguments over and over until killed; prints "decoding" first.
_DECODER_LOOP = """
import sys, pyarrow.parquet as pq
print("decoding", flush=True)
while True:
    for path in sys.argv[1:]:
        for _ in pq.ParquetFile(path).iter_batches(65536, use_threads=False):
            pass
"""


@contextlib.contextmanager
def decoding_beside(files: list[str]) -> Iterator[None]:
    """Another process decodes ``files`` in a loop (a data executor's work without the executor) for
    the duration of the block: what data work on another core does to this process's CPU per unit of
    work (shared caches, memory bandwidth). It has started decoding when the block begins."""
    decoder = subprocess.Popen([sys.executable, "-c", _DECODER_LOOP, *files], stdout=subprocess.PIPE, text=True)
    try:
        assert decoder.stdout is not None
        if decoder.stdout.readline().strip() != "decoding":  # returns at once if the process died
            raise RuntimeError(f"the decoding process ended before it started (exit code {decoder.wait(10)})")
        yield
    finally:
        decoder.kill()
        decoder.wait(30)


def local_plane(
    job_path: str | Path, root: str | Path, tasks: Iterable[DataTask], *, executors: int, **kwargs: Any
) -> PooledDataPlane:
    """The plane of ``executors`` data executor processes on this machine that the benches measure: the
    product's :class:`PooledDataPlane` over a ``LocalPool`` (the driver on loopback Flight, batches
    through shared memory unless ``shm=False``; each executor pinned to ``ceil(pools.data.cpu)`` cores,
    supervised by a watcher thread and a control thread of this process; no autoscaler). ``kwargs`` go
    to the plane (``trainers``, ``shm``, ``fields``, ``slow_ms_per_batch``, ...)."""
    from primus_dagster.cluster.pooled_plane import PooledDataPlane, local_data_pool

    return PooledDataPlane(job_path, root, tasks, executors=executors, pool_factory=local_data_pool, **kwargs)


def unrestarted(plane: PooledDataPlane) -> None:
    """RuntimeError if an executor of ``plane`` was restarted or the pool failed (an OOM kill, a crash):
    its figures would count the restart."""
    summary = plane.summary()
    if summary["restarts"] or summary["error"]:
        raise RuntimeError(f"the data pool restarted executors ({summary['restarts']}): {summary['error']}")


def cpu_self() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def emit(result: dict) -> None:
    """Print the benchmark's one JSON line (the last line of its output)."""
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


def bench_dir(name: str) -> Path:
    path = Path(".primus") / "bench" / name
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def vm_hwm() -> int:
    """Peak RSS of this process image (``VmHWM``). Not ``ru_maxrss``: Linux carries that across
    fork+exec, so a child would report its parent's peak."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
