"""DTGG task planning vs the naive loader, on a synthetic metastore with RPC latency.

**Metastore** (``metastore://``, an fsspec ``AbstractFileSystem`` registered by this file):
``warehouse/{impressions,clicks}/dt=YYYY-MM-DD/hour=HH/part-NNNNN.parquet`` plus a
``_SUCCESS`` marker in every hour, for ``--days`` × 24 (+1, for the slide) hours × 2 sources ×
``--files-per-hour`` files. Nothing is stored: names and sizes are computed from the path.
**Cost model** (each call sleeps, releasing the GIL like a blocking RPC):

* ``ls(dir)`` — a directory listing RPC (HDFS ``listStatus`` / S3 ``ListObjectsV2``), which
  returns names *and* sizes: ``--latency-ms`` per call (default 2 ms, a NameNode RPC);
* ``info(path)`` / ``size(path)`` — a per-file metadata RPC (HDFS ``getFileInfo`` / S3
  ``HEAD``): ``--stat-latency-ms`` per call (default 0.2 ms, a warm NameNode metadata hit;
  S3 HEADs cost 10-30 ms, so the default is the naive loader's best case).

``time.sleep`` overshoots short sleeps (~0.05-0.1 ms here); the bench calibrates the real
per-call cost first and prints the expected naive time from it.

**Job**: two streams (``history``, ``fresh``) that both read the same two Parquet sources
(``impressions``, ``clicks``) under different source names — the case fusion is for.

**Naive** (the loader a user would write, :func:`naive_plan`): for each stream, for each
source, for each hour of the window: ``fs.ls(dir, detail=False)`` (1 listing RPC), skip the
hour unless ``_SUCCESS`` is listed, then ``fs.size(file)`` for every data file (1 stat RPC
each), one task ``(hour, stream, source, path, size)`` per file; single thread, no cache; a
source read by two streams is scanned twice; finally the tasks are sorted chronologically.
RPCs: streams × sources × hours × (1 + files_per_hour).

**DTGG**: ``Planner`` over the real :class:`ParquetSource` adapters (``fs.ls(dir,
detail=True)``: 1 RPC per partition, sizes included), fused sources listed once, with 1 and
with 4 listing threads, each with a fresh cache. Then the window slides by one hour and the
4-thread planner re-plans with its warm cache (only the new hour is listed). DTGG's output is
the ordered, lazy ``TaskSequence``; the cost of materialising every ``DataTask`` object from
it is reported separately (``materialise_s``). Ablation (in "detail"): the naive loop taking
sizes from ``ls(detail=True)`` instead of per-file ``size`` RPCs, to show how much of the gain
is the listing API alone (the rest: fusion, threads, cache). ``peak_rss_bytes``: VmHWM of a child process
that plans >= ``--rss-files`` (default 1 M) files of the same job on a zero-latency metastore
and then streams every DataTask of the plan.

Last line: {"bench": "dtgg", "files", "tasks", "naive_s", "dtgg_1t_s", "dtgg_4t_s",
"speedup_1t", "speedup_4t", "slide_replan_ratio", "peak_rss_bytes", ...}
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import fsspec
from fsspec import AbstractFileSystem

from primus_dagster.data import ListingCache, Planner, SourceContext, TimeWindow
from primus_dagster.spec import DatasetSpec, parse_job_spec

from _common import emit, vm_hwm

START = datetime(2026, 11, 1, tzinfo=timezone.utc)
SOURCES = ("impressions", "clicks")
HOUR = timedelta(hours=1)


class MetastoreFS(AbstractFileSystem):
    """A lazily generated hive tree with per-RPC latency (see the module docstring)."""

    protocol = "metastore"
    root_marker = ""
    # fsspec caches one instance per thread: count the RPCs of all of them together.
    calls: ClassVar[Counter[str]] = Counter()
    _lock = threading.Lock()

    def __init__(
        self,
        days: str = "20",
        files_per_hour: str = "500",
        latency_ms: str = "2",
        stat_latency_ms: str = "0.2",
        extra_hours: str = "1",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.hours = int(days) * 24 + int(extra_hours)
        self.files_per_hour = int(files_per_hour)
        self.latency = float(latency_ms) / 1000
        self.stat_latency = float(stat_latency_ms) / 1000

    def _rpc(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.calls[kind] += 1
        if seconds > 0:
            time.sleep(seconds)

    def _parse(self, path: str) -> list[str]:
        parts = self._strip_protocol(path).strip("/").split("/")
        if parts[0] != "warehouse" or (len(parts) > 1 and parts[1] not in SOURCES):
            raise FileNotFoundError(path)
        return parts

    def _hour(self, day: str, hour: str | None = None) -> int:
        try:
            when = datetime.strptime(day, "dt=%Y-%m-%d").replace(tzinfo=timezone.utc)
            if hour is not None:
                when += timedelta(hours=int(hour.removeprefix("hour=")))
        except ValueError:
            return -1
        return int((when - START) / HOUR)

    def _size(self, source: str, hour: int, i: int) -> int:
        return 32 * 2**20 + (hour * 1_000_003 + i * 7919 + SOURCES.index(source) * 104_729) % (96 * 2**20)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        self._rpc("ls", self.latency)
        parts = self._parse(path)
        base = "/".join(parts)
        if len(parts) == 1:
            entries = [(f"{base}/{s}", 0, "directory") for s in SOURCES]
        elif len(parts) == 2:
            days = sorted({(START + h * HOUR).strftime("dt=%Y-%m-%d") for h in range(self.hours)})
            entries = [(f"{base}/{d}", 0, "directory") for d in days]
        elif len(parts) == 3:
            first = self._hour(parts[2])
            hours = [h for h in range(first, first + 24) if 0 <= h < self.hours]
            if not hours:
                raise FileNotFoundError(path)
            entries = [(f"{base}/hour={(START + h * HOUR):%H}", 0, "directory") for h in hours]
        elif len(parts) == 4:
            hour = self._hour(parts[2], parts[3])
            if not 0 <= hour < self.hours:
                raise FileNotFoundError(path)
            source = parts[1]
            entries = [
                (f"{base}/part-{i:05d}.parquet", self._size(source, hour, i), "file")
                for i in range(self.files_per_hour)
            ]
            entries.append((f"{base}/_SUCCESS", 0, "file"))
        else:
            raise FileNotFoundError(path)
        if not detail:
            return [name for name, _, _ in entries]
        return [{"name": name, "size": size, "type": kind} for name, size, kind in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._rpc("stat", self.stat_latency)
        parts = self._parse(path)
        name = "/".join(parts)
        if len(parts) == 5:
            hour = self._hour(parts[2], parts[3])
            leaf = parts[4]
            if 0 <= hour < self.hours:
                if leaf == "_SUCCESS":
                    return {"name": name, "size": 0, "type": "file"}
                if leaf.startswith("part-") and leaf.endswith(".parquet"):
                    i = int(leaf[5:-8])
                    if 0 <= i < self.files_per_hour:
                        return {"name": name, "size": self._size(parts[1], hour, i), "type": "file"}
            raise FileNotFoundError(path)
        if len(parts) == 4 and not 0 <= self._hour(parts[2], parts[3]) < self.hours:
            raise FileNotFoundError(path)
        return {"name": name, "size": 0, "type": "directory"}


fsspec.register_implementation("metastore", MetastoreFS, clobber=True)


def job_dataset(days: int, files_per_hour: int, latency_ms: float, stat_latency_ms: float) -> DatasetSpec:
    """Two streams reading the same two sources (four source names, two physical scans)."""
    options = (
        f"{{days: '{days}', files_per_hour: '{files_per_hour}', latency_ms: '{latency_ms}', "
        f"stat_latency_ms: '{stat_latency_ms}'}}"
    )
    columns = "{ts: event_time, label: click, id: sample_id, dense: [d0]}"
    sources = {
        stream: "\n".join(
            f"        - {{name: {src}_{stream}, type: parquet, kind: batch, granularity: hour, "
            f"path: 'metastore://warehouse/{src}', storage_options: {options}, columns: {columns}}}"
            for src in SOURCES
        )
        for stream in ("history", "fresh")
    }
    job = parse_job_spec(
        f"""
name: bench-dtgg
dataset:
  start: {START:%Y-%m-%d}
  streams:
    - name: history
      window: 24h
      sources:
{sources["history"]}
    - name: fresh
      window: 1h
      sources:
{sources["fresh"]}
""",
        "<bench dtgg>",
    )
    return job.dataset


def naive_plan(
    dataset: DatasetSpec, window: TimeWindow, sizes_from_listing: bool = False
) -> list[tuple[datetime, str, str, str, int]]:
    """The straightforward loader (module docstring): no threads, no cache, no fusion.

    ``sizes_from_listing``: the ablation that takes sizes from ``ls(detail=True)`` instead of
    one ``size`` RPC per file (still no threads, cache or fusion).
    """
    tasks = []
    for stream in dataset.streams:
        for source in stream.sources:
            fs, root = fsspec.core.url_to_fs(source.path, **source.storage_options)
            for hour in window.partition_starts("hour"):
                directory = f"{root}/dt={hour:%Y-%m-%d}/hour={hour:%H}"
                try:
                    listing = fs.ls(directory, detail=sizes_from_listing)
                except FileNotFoundError:
                    continue
                sizes = {e["name"]: e["size"] for e in listing} if sizes_from_listing else None
                names = list(sizes) if sizes is not None else listing
                if f"{directory}/_SUCCESS" not in names:
                    continue
                for name in sorted(names):
                    if name.rsplit("/", 1)[-1].startswith(("_", ".")):
                        continue
                    size = sizes[name] if sizes is not None else fs.size(name)
                    tasks.append((hour, stream.name, source.name, name, size))
    tasks.sort()
    return tasks


def metastore(dataset: DatasetSpec) -> MetastoreFS:
    source = dataset.streams[0].sources[0]
    return fsspec.core.url_to_fs(source.path, **source.storage_options)[0]


def calibrate(seconds: float, calls: int = 300) -> float:
    """Real cost of one ``time.sleep(seconds)`` RPC stand-in (sleep overshoots)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        time.sleep(seconds)
    return (time.perf_counter() - t0) / calls


def timed_plan(dataset: DatasetSpec, window: TimeWindow, threads: int) -> tuple[Planner, Any, float]:
    t0 = time.perf_counter()
    planner = Planner(dataset, SourceContext("."), threads=threads, cache=ListingCache())
    plan = planner.plan(window)
    return planner, plan, time.perf_counter() - t0


def rss_child(files: int, files_per_hour: int) -> None:
    """Plan >= ``files`` files (zero latency) and stream every task; print peak RSS as JSON."""
    days = math.ceil(files / (24 * len(SOURCES) * files_per_hour))
    dataset = job_dataset(days, files_per_hour, 0.0, 0.0)
    before = vm_hwm()
    window = TimeWindow(START, START + timedelta(days=days))
    _planner, plan, seconds = timed_plan(dataset, window, threads=4)
    after_plan = vm_hwm()
    t0 = time.perf_counter()
    streamed = sum(1 for _ in plan.tasks)
    print(
        json.dumps(
            {
                "files": plan.stats.files,
                "tasks": len(plan.tasks),
                "streamed": streamed,
                "plan_s": round(seconds, 3),
                "stream_s": round(time.perf_counter() - t0, 3),
                "rss_before_plan": before,
                "rss_after_plan": after_plan,
                "peak_rss_bytes": vm_hwm(),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--files-per-hour", type=int, default=500)
    parser.add_argument("--latency-ms", type=float, default=2.0, help="cost of one directory listing RPC")
    parser.add_argument("--stat-latency-ms", type=float, default=0.2, help="cost of one per-file metadata RPC")
    parser.add_argument("--rss-files", type=int, default=1_000_000, help="files planned by the RSS child")
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args.rss_files, 1000)
        return

    dataset = job_dataset(args.days, args.files_per_hour, args.latency_ms, args.stat_latency_ms)
    fs = metastore(dataset)
    window = TimeWindow(START, START + timedelta(days=args.days))
    hours = args.days * 24
    consumers = sum(len(s.sources) for s in dataset.streams)
    ls_cost, stat_cost = calibrate(args.latency_ms / 1000), calibrate(args.stat_latency_ms / 1000, 2000)
    naive_rpcs = (consumers * hours, consumers * hours * args.files_per_hour)
    print(
        f"metastore: {args.days} days x 24 h x {len(SOURCES)} sources x {args.files_per_hour} files "
        f"= {hours * len(SOURCES) * args.files_per_hour:,} files; ls {args.latency_ms} ms "
        f"(measured {ls_cost * 1e3:.3f}), stat {args.stat_latency_ms} ms (measured {stat_cost * 1e3:.3f})"
    )
    print(
        f"naive: {naive_rpcs[0]:,} ls + {naive_rpcs[1]:,} stat RPCs; expected >= "
        f"{naive_rpcs[0] * ls_cost + naive_rpcs[1] * stat_cost:.0f} s",
        flush=True,
    )

    # Warm-up (imports, adapter construction) outside every timed run.
    Planner(dataset, SourceContext("."), threads=1).plan(TimeWindow(START, START + HOUR))
    fs.calls.clear()
    t0 = time.perf_counter()
    naive = naive_plan(dataset, window)
    naive_s = time.perf_counter() - t0
    naive_calls = dict(fs.calls)
    naive_bytes = Counter()
    for _, stream, source, _, size in naive:
        naive_bytes[(stream, source)] += size
    naive_tasks = len(naive)
    del naive
    print(f"naive: {naive_tasks:,} tasks in {naive_s:.1f} s ({naive_calls})", flush=True)
    t0 = time.perf_counter()
    ablation_tasks = len(naive_plan(dataset, window, sizes_from_listing=True))
    naive_listing_sizes_s = time.perf_counter() - t0
    assert ablation_tasks == naive_tasks
    print(f"ablation, naive with sizes from the listing: {naive_listing_sizes_s:.2f} s", flush=True)

    seconds_by_threads: dict[int, float] = {}
    rpcs_by_threads: dict[int, dict[str, int]] = {}
    for threads in (1, 4):
        fs.calls.clear()
        planner, plan, seconds = timed_plan(dataset, window, threads)
        seconds_by_threads[threads], rpcs_by_threads[threads] = seconds, dict(fs.calls)
        print(
            f"dtgg {threads}t: {len(plan.tasks):,} tasks in {seconds:.2f} s ({dict(fs.calls)}; "
            f"{plan.stats.listings} listings)",
            flush=True,
        )
        dtgg_bytes = {key: c.bytes for key, c in plan.counts.items()}
        if len(plan.tasks) != naive_tasks or dtgg_bytes != dict(naive_bytes):
            raise SystemExit(
                f"DTGG and naive disagree: {len(plan.tasks)} vs {naive_tasks} tasks, "
                f"{dtgg_bytes} vs {dict(naive_bytes)}"
            )

    # `planner` / `plan` are now the 4-thread ones, with a warm cache.
    full_s = seconds_by_threads[4]
    fs.calls.clear()
    t0 = time.perf_counter()
    slid = planner.plan(TimeWindow(window.start + HOUR, window.end + HOUR))
    slide_s = time.perf_counter() - t0
    slide_calls = dict(fs.calls)
    print(
        f"slide by 1 h (warm cache): {slide_s:.3f} s, {slid.stats.listings} listings, "
        f"{slid.stats.cache_hits} cache hits ({slide_calls})",
        flush=True,
    )

    t0 = time.perf_counter()
    materialised = sum(1 for _ in plan.tasks)
    materialise_s = time.perf_counter() - t0
    first, last = plan.tasks[0], plan.tasks[-1]
    main_hwm = vm_hwm()
    del slid, plan, planner

    out = subprocess.run(
        [sys.executable, __file__, "--rss-child", "--rss-files", str(args.rss_files)],
        capture_output=True,
        text=True,
        check=True,
    )
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"rss child: {rss}", flush=True)

    emit(
        {
            "bench": "dtgg",
            "files": hours * len(SOURCES) * args.files_per_hour,
            "tasks": naive_tasks,
            "naive_s": round(naive_s, 3),
            "dtgg_1t_s": round(seconds_by_threads[1], 3),
            "dtgg_4t_s": round(full_s, 3),
            "speedup_1t": round(naive_s / seconds_by_threads[1], 2),
            "speedup_4t": round(naive_s / full_s, 2),
            "slide_replan_ratio": round(slide_s / full_s, 4),
            "peak_rss_bytes": rss["peak_rss_bytes"],
            "rss_files": rss["files"],
            "metric": "planning wall time",
            "value": round(full_s, 3),
            "baseline": round(naive_s, 3),
            "ratio": round(naive_s / full_s, 2),
            "detail": {
                "days": args.days,
                "files_per_hour": args.files_per_hour,
                "latency_ms": args.latency_ms,
                "stat_latency_ms": args.stat_latency_ms,
                "measured_ls_ms": round(ls_cost * 1e3, 4),
                "measured_stat_ms": round(stat_cost * 1e3, 4),
                "naive_rpcs": naive_calls,
                "dtgg_rpcs": rpcs_by_threads,
                "slide_s": round(slide_s, 4),
                "slide_rpcs": slide_calls,
                "materialise_s": round(materialise_s, 3),
                "materialised": materialised,
                "naive_sizes_from_listing_s": round(naive_listing_sizes_s, 3),
                "speedup_4t_vs_naive_sizes_from_listing": round(naive_listing_sizes_s / full_s, 2),
                "speedup_4t_incl_materialise": round(naive_s / (full_s + materialise_s), 2),
                "first_task": first.task_id,
                "last_task": last.task_id,
                "main_peak_rss_bytes": main_hwm,
                "rss_child": rss,
            },
        }
    )


if __name__ == "__main__":
    main()
