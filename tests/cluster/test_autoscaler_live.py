"""Criterion 1 of the live autoscaler: a real ``primus-dagster train`` with ``examples/job.yaml``'s
pools and the default ``scaling`` scales its data pool out while the trainer waits on slowed data
executors, and in once the trainer is the bottleneck; every sample is trained exactly once.

The run is ``primus-dagster-dev train`` (the ``primus-dagster train`` command plus the dev hooks):
``--slow-pool-executors-ms 60`` makes every executor of the job's own local pool, those the
autoscaler adds included, sleep 60 ms per served batch (two serve ~33 batches/s), and
``--slow-trainer-ms 20`` caps the trainer below ~50 batches/s: with two executors the trainer waits
about a third of the time, with four it is the bottleneck by a third (margins both ways, so that the
real per-batch work of a loaded machine does not tip the balance; at 15 ms four executors only just
matched the trainer, and a CI run under load never scaled in). The test waits for the run to end (a generous bound of
10 minutes), not for any wall time, and reads the decisions from its JSON result.

The same run holds scaling that never hurts (the example's run at 40 000 rows/h, repeated by
``bench/live_scaling.py --rows-per-hour 40000 --repeats 3``): vertical scaling shrinks the executors
of ``pools.data.memory`` 2 GiB, and no executor is OOM-killed (by a resize or at all), no node is
blacklisted, and no gap between two checkpoints of a phase during which a scaling decision was logged
is longer than 2 x ``scaling.interval`` (the run log's timestamps; a checkpoint every 50 steps, about
three seconds here). Before, a shrink sized from the heartbeats' mean killed both executors and the
kills blacklisted both nodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from primus_dagster.cluster import memory_bytes
from primus_dagster.devtools.trained_sample_ids import read_trained_sample_ids
from primus_dagster.spec import ScalingSpec, load_job_spec
from tests.training.jobkit import expected_ids, make_job

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"


def _with_example_pools(job_path: Path) -> None:
    """Replace the test job's ``pools`` with ``examples/job.yaml``'s; smaller batches for a longer phase."""
    spec = yaml.safe_load(job_path.read_text())
    spec["pools"] = yaml.safe_load(EXAMPLE.read_text())["pools"]
    spec.pop("scaling", None)  # the defaults
    for stream in spec["dataset"]["streams"]:
        for source in stream["sources"]:
            source["batch_rows"] = 100
    job_path.write_text(yaml.safe_dump(spec, sort_keys=False))


def longest_scaling_gap(log: str) -> float:
    """The longest gap between consecutive checkpoints of a phase that holds a scaling decision or a kill."""
    longest, last, marked = 0.0, None, False
    for line in log.splitlines():
        if line[:4].isdigit() and "checkpoint at step" in line:
            t = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            longest = max(longest, t - last) if last is not None and marked else longest
            last, marked = (None if "done)" in line else t), False
        marked = marked or "scaling: data pool:" in line or "killed" in line
    return longest


def test_default_scaling_scales_out_while_the_trainer_waits_and_in_when_it_is_the_bottleneck(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="mixed", every=100_000, rows_per_hour=24_000)
    _with_example_pools(env["job_path"])
    env["job"] = job = load_job_spec(env["job_path"])
    assert job.scaling == ScalingSpec() and job.pools.backend == "local"
    assert (job.pools.data.replicas, job.pools.data.min_replicas, job.pools.data.max_replicas) == (2, 1, 4)
    samples_log = tmp_path / "samples.bin"
    command = [sys.executable, "-m", "primus_dagster.devtools.cli", "train", str(env["job_path"]), "--hours", "3"]
    command += ["--data-root", str(env["root"]), "--record-samples", str(samples_log), "--no-eval", "--json"]
    command += ["--slow-pool-executors-ms", "60", "--slow-trainer-ms", "20"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])

    applied = [d for pool in result["data_pools"].values() for d in (pool.get("scaling") or {}).get("applied", [])]
    kinds = [d["kind"] for d in applied]
    assert "scale_out" in kinds, (kinds, done.stderr[-3000:])
    first_out = kinds.index("scale_out")
    assert "scale_in" in kinds[first_out:], (applied, done.stderr[-3000:])
    outs = [d for d in applied if d["kind"] == "scale_out"]
    # The scale-out was the trainers waiting on buffers not full (the ratio rule), from steady samples.
    assert any("trainers wait" in d["reason"] for d in outs), outs
    ins = [d for d in applied if d["kind"] == "scale_in"]
    assert any(d["inputs"].get("trainer_wait", 1.0) <= 0.02 or "L_u" in d["reason"] for d in ins), ins
    assert all(1 <= d["replicas"] + d["delta"] <= 4 for d in applied if d["kind"] in ("scale_out", "scale_in"))
    # Never hurts: the executors were shrunk below pools.data.memory, none was killed, no node blamed,
    # no stall from scaling.
    spec_memory = memory_bytes(job.pools.data.memory)
    shrunk = [d for d in applied if d["kind"] == "resize" and d["new"]["memory_bytes"] < spec_memory]
    assert shrunk, applied
    for phase, pool in result["data_pools"].items():
        assert pool["oom_kills_from_resize"] == 0 and pool["oom_restarts"] == 0, (phase, pool)
        assert pool["blacklisted_nodes"] == [] and pool["error"] is None, (phase, pool)
    assert "above its memory allocation" not in done.stderr
    assert longest_scaling_gap(done.stderr) <= 2 * job.scaling.interval.total_seconds(), done.stderr[-3000:]
    # Each sample once: scale-out and scale-in lost and repeated nothing.
    trained = Counter(int(i) for _, ids in read_trained_sample_ids(samples_log) for i in ids)
    assert trained == expected_ids(env)
