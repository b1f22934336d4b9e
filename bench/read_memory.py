"""RSS growth while streaming one hourly partition, at 1 M and 4 M rows: does memory stay flat?

For each partition size (``--sizes``, default 1 M and 4 M rows) the partition is written first
(by this process, into its own directory: Parquet, Delta and Iceberg, one hour each, plus a
small warm-up hour); each (size, source type) is then read in a **fresh child process** that

1. imports the suite, builds the adapter and reads the small warm-up hour through it (lazy
   imports, first-call allocations, the Arrow allocator's first arenas: constant costs that
   are not the partition's);
2. runs ``gc.collect()``, resets the process's peak RSS (``echo 5 > /proc/self/clear_refs``,
   Linux >= 4.0) and records the **baseline**: ``VmRSS`` now (interpreter + imports + warm-up);
3. lists, splits and streams the big partition through the adapter (read, normalise; batches
   dropped after counting), sampling ``RssAnon`` / ``RssFile`` and Arrow's allocated bytes
   after every batch;
4. reports ``VmHWM`` (peak RSS since the reset). **growth = VmHWM - baseline**: what reading the
   partition adds over an interpreter that is already running, independent of its ~130 MB.

``VmHWM`` counts file-backed pages too; the per-batch samples split the peak into anonymous
(``peak_anon_growth``: what the process allocates) and file-backed (``peak_file_growth``)
memory, ``arrow_peak_bytes`` is the Arrow memory pool's peak and ``anon_growth_by_rows`` the
anonymous growth every 16 batches. Streaming means growth does not follow the partition's size:
the goal is ``growth_ratio_4m_1m`` = growth(4 M) / growth(1 M) <= 1.2. ``arrow_bytes`` is the
partition's canonical Arrow size (what a whole-table load would hold at least), for scale.

How the adapters keep it flat (``open_parquet``, ``StreamingParquetFile``): a local file is
memory-mapped and read zero-copy, but the pages decoding touched are dropped from the process
after every batch (``MADV_DONTNEED``; they stay in the page cache, clean and reclaimable), so
the file-backed part of the peak is a batch's pages, not the file; files are read one row group
at a time and the Arrow pool's freed pages go back to the OS between groups (without that,
allocator retention grows the anonymous part by ~15-25 MiB from 1 M to 4 M rows). Remote files
(and Iceberg's) go through a 1 MiB buffered stream, read the same way.

The what-if ``parquet+wholemap`` (this bench only: the previous ``open_parquet``, a plain
``ParquetFile(path, memory_map=True)`` whose pages stay mapped until the file is closed,
batches across row groups) is measured next to it: ``wholemap_*`` keys, and
``read_cpu_ratio_vs_wholemap_4m`` (read CPU of the adapter / of the what-if; one run, noisy at
this size: ``bench/source_scan.py`` and ``bench/serve.py`` measure the read speed).

Last line: {"bench": "read_memory", "rss_growth_1m_bytes", "rss_growth_4m_bytes",
"growth_ratio_4m_1m" (Parquet, VmHWM), "anon_growth_*" (Parquet, anonymous only),
"delta_growth_ratio_4m_1m", "iceberg_growth_ratio_4m_1m", "wholemap_*" (the what-if),
"peak_rss_bytes", "arrow_bytes", "ratio" (peak RSS / Arrow size at 1 M, the old figure, with
the interpreter), "detail": {size: {kind: ...}}}.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from _common import bench_dir, emit, one_source_job, vm_hwm

KINDS = ("parquet", "delta", "iceberg")
WARMUP_ROWS = 20_000
WHOLEMAP = "parquet+wholemap"  # the what-if: the whole file stays mapped (see whole_map_reads)


def proc_status(*keys: str) -> dict[str, int]:
    """The ``kB`` fields ``keys`` of ``/proc/self/status``, in bytes."""
    out = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in keys:
                out[name] = int(value.split()[0]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def whole_map_reads() -> None:
    """What-if (this process only): local Parquet files opened as before the streaming reads --
    one memory map per file, resident until the file is closed, batches across row groups."""
    import pyarrow.parquet as pq

    from primus_dagster.data.sources import delta, parquet

    def open_whole(source: Any) -> pq.ParquetFile:
        return pq.ParquetFile(source, memory_map=isinstance(source, str), pre_buffer=False)

    parquet.open_parquet = delta.open_parquet = open_whole


def child(kind: str, root: str) -> None:
    import pyarrow as pa

    from primus_dagster.data import SourceContext, make_adapter

    if kind.endswith("+wholemap"):
        kind = kind.removesuffix("+wholemap")
        whole_map_reads()

    job = one_source_job(kind)
    adapter = make_adapter(job.dataset.source(f"src_{kind}"), SourceContext(root))
    start = job.dataset.start
    warm_rows = 0
    for task in adapter.split(adapter.partition(start + timedelta(hours=1))):
        for batch in adapter.read(task):
            warm_rows += batch.num_rows
    del batch
    gc.collect()
    reset = reset_peak_rss()
    base = proc_status("VmRSS", "RssAnon", "RssFile")
    baseline = base["VmRSS"]
    arrow_base = pa.total_allocated_bytes()
    cpu0 = time.process_time()
    part = adapter.partition(start)
    tasks = adapter.split(part)
    rows = arrow = batches = 0
    peak_anon = peak_file = arrow_peak = 0
    anon_by_rows = []  # (rows read, anon growth) every 16 batches: does it plateau?
    for task in tasks:
        for batch in adapter.read(task):
            rows += batch.num_rows
            arrow += batch.nbytes
            batches += 1
            now = proc_status("RssAnon", "RssFile")
            peak_anon = max(peak_anon, now["RssAnon"])
            peak_file = max(peak_file, now["RssFile"])
            arrow_peak = max(arrow_peak, pa.total_allocated_bytes())
            if batches % 16 == 0:
                anon_by_rows.append((rows, now["RssAnon"] - base["RssAnon"]))
    cpu_s = time.process_time() - cpu0
    peak = vm_hwm()
    print(
        json.dumps(
            {
                "rows": rows,
                "tasks": len(tasks),
                "batches": batches,
                "arrow_bytes": arrow,
                "warmup_rows": warm_rows,
                "hwm_reset": reset,
                "baseline_rss_bytes": baseline,
                "peak_rss_bytes": peak,
                "rss_growth_bytes": peak - baseline if reset else None,
                "peak_anon_growth": peak_anon - base["RssAnon"],
                "peak_file_growth": peak_file - base["RssFile"],
                "arrow_peak_bytes": arrow_peak - arrow_base,
                "arrow_pool": pa.default_memory_pool().backend_name,
                "read_cpu_s": round(cpu_s, 3),
                "anon_growth_by_rows": anon_by_rows,
            }
        )
    )


def write_partition(root: Path, kind: str, rows: int) -> None:
    """One hour of >= ``rows`` rows (hour 0) and a small warm-up hour (hour 1) of ``kind``."""
    from primus_dagster.data import SourceContext
    from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

    job = one_source_job(kind)
    context = SourceContext(str(root))
    probe = SyntheticWorld(WorldConfig(seed=3), job.dataset.start)
    for hour, want in ((0, rows), (1, WARMUP_ROWS)):
        per_hour = want / probe.traffic_multiplier(hour) * 1.02  # Poisson noise: stay above `want`
        world = SyntheticWorld(WorldConfig(seed=3 + hour, rows_per_hour=per_hour), job.dataset.start)
        write_world(job, context, world, range(hour, hour + 1), progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000], help="rows per partition")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    base = bench_dir("read_memory")
    shutil.rmtree(base, ignore_errors=True)
    detail: dict[str, dict[str, dict]] = {}
    mib = 2**20
    for rows in args.sizes:
        label = f"{rows / 1e6:g}m"
        root = base / label
        root.mkdir(parents=True)
        for kind in KINDS:
            write_partition(root, kind, rows)
        for kind in (*KINDS, WHOLEMAP):
            out = subprocess.run(
                [sys.executable, __file__, "--child", kind, str(root)], check=True, capture_output=True, text=True
            )
            d = json.loads(out.stdout.strip().splitlines()[-1])
            d["ratio"] = round(d["peak_rss_bytes"] / d["arrow_bytes"], 3)
            detail.setdefault(label, {})[kind] = d
            print(
                f"{label:4s} {kind:17s} rows={d['rows']:,} in {d['tasks']} task(s), {d['batches']} batches, "
                f"{d['read_cpu_s']:.2f} CPU-s; arrow={d['arrow_bytes'] / mib:.0f} MiB; baseline RSS "
                f"{d['baseline_rss_bytes'] / mib:.0f} MiB, peak {d['peak_rss_bytes'] / mib:.0f} MiB: growth "
                f"{d['rss_growth_bytes'] / mib:.1f} MiB (anon {d['peak_anon_growth'] / mib:.1f}, file "
                f"{d['peak_file_growth'] / mib:.1f}; Arrow pool {d['arrow_peak_bytes'] / mib:.1f})",
                flush=True,
            )
        shutil.rmtree(root, ignore_errors=True)

    small, large = (f"{r / 1e6:g}m" for r in (args.sizes[0], args.sizes[-1]))

    def ratio(kind: str, key: str = "rss_growth_bytes") -> float:
        return round(detail[large][kind][key] / detail[small][kind][key], 3)

    p_small, p_large = detail[small]["parquet"], detail[large]["parquet"]
    emit(
        {
            "bench": "read_memory",
            f"rss_growth_{small}_bytes": p_small["rss_growth_bytes"],
            f"rss_growth_{large}_bytes": p_large["rss_growth_bytes"],
            f"growth_ratio_{large}_{small}": ratio("parquet"),
            "goal_growth_ratio": 1.2,
            f"anon_growth_{small}_bytes": p_small["peak_anon_growth"],
            f"anon_growth_{large}_bytes": p_large["peak_anon_growth"],
            f"anon_growth_ratio_{large}_{small}": ratio("parquet", "peak_anon_growth"),
            f"file_growth_{large}_bytes": p_large["peak_file_growth"],
            **{f"{kind}_growth_ratio_{large}_{small}": ratio(kind) for kind in KINDS if kind != "parquet"},
            **{
                f"{kind}_rss_growth_{label}_bytes": detail[label][kind]["rss_growth_bytes"]
                for kind in KINDS
                if kind != "parquet"
                for label in (small, large)
            },
            f"wholemap_growth_ratio_{large}_{small}": ratio(WHOLEMAP),
            f"wholemap_rss_growth_{large}_bytes": detail[large][WHOLEMAP]["rss_growth_bytes"],
            f"read_cpu_ratio_vs_wholemap_{large}": round(
                p_large["read_cpu_s"] / detail[large][WHOLEMAP]["read_cpu_s"], 3
            ),
            "peak_rss_bytes": p_small["peak_rss_bytes"],
            "arrow_bytes": p_small["arrow_bytes"],
            "ratio": p_small["ratio"],
            "rows": p_small["rows"],
            "detail": detail,
        }
    )


if __name__ == "__main__":
    main()
