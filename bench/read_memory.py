"""Peak RSS while reading one hourly partition of >= 1 M rows, relative to its Arrow size.

The partition is written first (by this process); each adapter then reads it in a fresh
child process that imports the suite, records its RSS, streams the partition through the
adapter (list, split, read, normalise; batches dropped after counting) and reports its peak
RSS (``VmHWM``). ``arrow_bytes`` is the canonical Arrow size of the whole partition
(sum of the normalised batches' ``nbytes``): what a whole-table load would hold at least.

Last line: {"bench": "read_memory", "peak_rss_bytes": ..., "arrow_bytes": ..., "ratio": ...}
(the Parquet adapter; Delta and Iceberg are in "detail").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

from _common import bench_dir, emit, one_source_job, vm_hwm


def child(kind: str, root: str) -> None:
    import psutil

    from primus_dagster.data import SourceContext, make_adapter

    job = one_source_job(kind)
    adapter = make_adapter(job.dataset.source(f"src_{kind}"), SourceContext(root))
    rss_before = psutil.Process().memory_info().rss
    part = adapter.partition(job.dataset.start)
    rows = arrow = 0
    for task in adapter.split(part):
        for batch in adapter.read(task):
            rows += batch.num_rows
            arrow += batch.nbytes
    peak = vm_hwm()
    print(json.dumps({"rows": rows, "arrow_bytes": arrow, "peak_rss_bytes": peak, "rss_before_read": rss_before}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    from primus_dagster.data import SourceContext
    from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

    root = bench_dir("read_memory")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    detail = {}
    for kind in ("parquet", "delta", "iceberg"):
        job = one_source_job(kind)
        probe = SyntheticWorld(WorldConfig(seed=3), job.dataset.start)
        rows_per_hour = args.rows / probe.traffic_multiplier(0) * 1.02  # Poisson noise: stay above --rows
        world = SyntheticWorld(WorldConfig(seed=3, rows_per_hour=rows_per_hour), job.dataset.start)
        write_world(job, SourceContext(str(root)), world, range(1), progress=False)
        out = (
            subprocess.run(
                [sys.executable, __file__, "--child", kind, str(root)], check=True, capture_output=True, text=True
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        detail[kind] = json.loads(out)
        d = detail[kind]
        d["ratio"] = round(d["peak_rss_bytes"] / d["arrow_bytes"], 3)
        print(
            f"{kind:8s} rows={d['rows']:,} arrow={d['arrow_bytes'] / 2**20:.0f} MiB "
            f"peak RSS={d['peak_rss_bytes'] / 2**20:.0f} MiB (before read {d['rss_before_read'] / 2**20:.0f} MiB) "
            f"ratio={d['ratio']}"
        )
    p = detail["parquet"]
    emit(
        {
            "bench": "read_memory",
            "peak_rss_bytes": p["peak_rss_bytes"],
            "arrow_bytes": p["arrow_bytes"],
            "ratio": p["ratio"],
            "rows": p["rows"],
            "detail": detail,
        }
    )


if __name__ == "__main__":
    main()
