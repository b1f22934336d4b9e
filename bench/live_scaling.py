"""The spec's scaling defaults in real ``primus-dagster train`` runs, next to the same runs with scaling off.

A measurement on this machine, not a simulation: the synthetic world (``primus-dagster synth
--rows-per-hour R`` over two days, its stream in an embedded Kafka-compatible broker) and
``primus-dagster train examples/job.yaml --start <day 2> --hours 24`` (``batch_then_stream``: a batch
phase on day 1's complete labels, then a stream phase on day 2), every key at the example's values
and ``scaling`` at the spec's defaults (``ScalingSpec()``: the example has no ``scaling`` section).
The baseline is the same command on a copy of the spec with both strategies disabled (``scaling:
{horizontal: {enabled: false}, vertical: {enabled: false}}``): the two data executors of
``pools.data.replicas``, what a team runs without an autoscaler. Runs alternate (scaling, static,
scaling, ...), ``--repeats`` of each, one at a time.

Per run, from the run's own output:

* ``decisions``: the scaling decisions applied, by kind (the result's ``data_pools.<phase>.scaling``);
* ``oom_kills``: executors the pool's watchdog killed (``oom_restarts``), and ``oom_kills_from_resize``:
  those below a memory the pool's own sizing lowered (``oom_kills_from_resize``);
* ``stall_s_max``: the longest gap between two consecutive checkpoints of one phase (one every
  ``checkpoint_every_steps`` = 50 steps, about a second here; the run log's timestamps), and
  ``stall_s_max_scaling``: the longest such gap during which a scaling decision or an OOM kill was
  logged (what can be attributed to scaling);
* the run logs are kept in ``.primus/bench/live_scaling/<run key>.log``;
* ``samples_per_cpu_s``: samples trained / CPU seconds of the train process and every process it
  waited for (its data executors: ``RUSAGE_CHILDREN`` around the run; the broker, started by this
  bench, is left out of both sides alike).

``samples_per_cpu_s_ratio_vs_static`` = the median over the scaling runs / the median over the static
runs. The default size (150 000 rows/h: phases of about a minute each on 2 cores) and ``--rows-per-hour
40000`` (the size at which, before, resizes OOM-killed both executors) are the two sizes reported in
docs/scaling.md; the load average is printed before and after.

Last line: {"bench": "live_scaling", "oom_kills_from_resize": ..., "stall_s_max": ..., "decisions": {...},
"samples_per_cpu_s_ratio_vs_static": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from primus_dagster.devtools.kafka_broker import EmbeddedBroker

from _common import bench_dir, emit

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "job.yaml"
STATIC = {"horizontal": {"enabled": False}, "vertical": {"enabled": False}}
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_SCALING = ("scaling: data pool:", "above its memory allocation", "OOM-killed")


def cli() -> list[str]:
    """The installed ``primus-dagster`` console script (or the module, where it is not installed)."""
    script = Path(sys.executable).parent / "primus-dagster"
    return [str(script)] if script.exists() else [sys.executable, "-m", "primus_dagster.cli"]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stamp(line: str) -> float | None:
    match = _STAMP.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if match else None


def stalls(log: str) -> tuple[float, float]:
    """(longest gap between consecutive checkpoints of a phase, longest such gap that holds a scaling
    decision or an OOM kill), seconds."""
    longest = longest_scaling = 0.0
    last: float | None = None
    scaling_since = False
    for line in log.splitlines():
        t = stamp(line)
        if t is None:
            continue
        if "checkpoint at step" in line:
            if last is not None:
                gap = t - last
                longest = max(longest, gap)
                if scaling_since:
                    longest_scaling = max(longest_scaling, gap)
            last = None if "done)" in line else t  # a phase's last checkpoint: the next phase starts afresh
            scaling_since = False
        elif any(mark in line for mark in _SCALING):
            scaling_since = True
    return round(longest, 2), round(longest_scaling, 2)


def train(spec: Path, root: Path, bootstrap: str, key: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One ``primus-dagster train --json`` run: what it did and what it cost."""
    command = [*cli(), "train", str(spec), "--start", "2026-11-02", "--hours", "24", "--data-root", str(root)]
    command += ["--kafka-bootstrap", bootstrap, "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}"]
    command += ["--run-key", key, "--no-eval", "--json"]
    cpu0, wall0 = children_cpu_s(), time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    cpu, wall = children_cpu_s() - cpu0, time.perf_counter() - wall0
    (bench_dir("live_scaling") / f"{key}.log").write_text(proc.stderr)  # the run log, for a closer look
    run: dict[str, Any] = {"key": key, "exit_code": proc.returncode, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    stall, stall_scaling = stalls(proc.stderr)
    run |= {"stall_s_max": stall, "stall_s_max_scaling": stall_scaling}
    if proc.returncode != 0:
        run["error"] = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "(no output)"
        return run
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    decisions: Counter[str] = Counter()
    not_applied = 0
    pools = result["data_pools"].values()
    for pool in pools:
        scaling = pool.get("scaling") or {}
        decisions.update(d["kind"] for d in scaling.get("applied", []))
        not_applied += len(scaling.get("not_applied", []))
    run |= {
        "samples": int(result["samples"]),
        "samples_per_cpu_s": round(result["samples"] / cpu, 1),
        "decisions": dict(decisions),
        "decisions_not_applied": not_applied,
        "oom_kills": sum(int(p.get("oom_restarts", 0)) for p in pools),
        "oom_kills_from_resize": sum(int(p.get("oom_kills_from_resize", 0)) for p in pools),
        "restarts": sum(int(p.get("restarts", 0)) for p in pools),
        "blacklisted_nodes": sorted({n for p in pools for n in p.get("blacklisted_nodes", [])}),
        "executor_cpu_s": round(sum(float(p.get("cpu_seconds", 0.0)) for p in pools), 1),
    }
    return run


def synth(root: Path, bootstrap: str, rows_per_hour: int, env: dict[str, str]) -> float:
    command = [*cli(), "synth", "--spec", str(EXAMPLE), "--rows-per-hour", str(rows_per_hour)]
    command += ["--data-root", str(root), "--start", "2026-11-01", "--days", "2", "--kafka-bootstrap", bootstrap]
    started = time.perf_counter()
    subprocess.run([*command, "--no-progress"], check=True, env=env, capture_output=True, text=True)
    return round(time.perf_counter() - started, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows-per-hour", type=int, default=150_000, help="the synthetic world's size")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side (alternating)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one train run may take")
    args = parser.parse_args()
    load_before = os.getloadavg()
    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"scaling": [], "static": []}
    with tempfile.TemporaryDirectory(prefix="live-scaling-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "PRIMUS_HOME": str(root / "home"), "MLFLOW_DISABLE_TELEMETRY": "true"}
        static = root / "static.yaml"
        spec = yaml.safe_load(EXAMPLE.read_text())
        spec["scaling"] = STATIC
        static.write_text(yaml.safe_dump(spec, sort_keys=False))
        broker = EmbeddedBroker().start()
        try:
            synth_s = synth(root, broker.bootstrap_servers, args.rows_per_hour, env)
            print(f"synth: {args.rows_per_hour} rows/h over 2 days in {synth_s} s", flush=True)
            for i in range(args.repeats):
                for side, path in (("scaling", EXAMPLE), ("static", static)):
                    run = train(path, root, broker.bootstrap_servers, f"live-{side}-{i}", env, args.timeout)
                    runs[side].append(run)
                    print(f"{side:8s} {json.dumps(run)}", flush=True)
        finally:
            broker.stop()
    load_after = os.getloadavg()
    done = {side: [r for r in rs if r["exit_code"] == 0] for side, rs in runs.items()}
    medians = {side: statistics.median(r["samples_per_cpu_s"] for r in rs) if rs else None for side, rs in done.items()}
    decisions: Counter[str] = Counter()
    for run in runs["scaling"]:
        decisions.update(run.get("decisions", {}))
    ratio = round(medians["scaling"] / medians["static"], 3) if medians["scaling"] and medians["static"] else None
    emit(
        {
            "bench": "live_scaling",
            "rows_per_hour": args.rows_per_hour,
            "repeats": args.repeats,
            "oom_kills_from_resize": sum(r.get("oom_kills_from_resize", 0) for r in runs["scaling"]),
            "oom_kills": sum(r.get("oom_kills", 0) for r in runs["scaling"]),
            "failed_runs": sum(r["exit_code"] != 0 for rs in runs.values() for r in rs),
            "stall_s_max": max((r["stall_s_max"] for r in runs["scaling"]), default=None),
            "stall_s_max_scaling": max((r["stall_s_max_scaling"] for r in runs["scaling"]), default=None),
            "stall_s_max_static": max((r["stall_s_max"] for r in runs["static"]), default=None),
            "decisions": dict(decisions),
            "samples_per_cpu_s_ratio_vs_static": ratio,
            "metric": "samples_per_cpu_s",
            "value": medians["scaling"],
            "baseline": medians["static"],
            "ratio": ratio,
            "defaults": "spec",
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in load_after],
            "wall_s": round(time.perf_counter() - started, 1),
            "runs": runs,
        }
    )


if __name__ == "__main__":
    main()
