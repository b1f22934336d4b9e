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
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

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
    # Each sample once: scale-out and scale-in lost and repeated nothing.
    trained = Counter(int(i) for _, ids in read_trained_sample_ids(samples_log) for i in ids)
    assert trained == expected_ids(env)
