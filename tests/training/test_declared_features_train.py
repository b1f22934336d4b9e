"""A real team's shape through a real ``primus-dagster train``: string ids, a list<string> feature,
epoch-second times and raw-scale numbers (``synth --schema realistic``), declared per-feature
tables and transforms, on one trainer and on two ranks (the row-sparse exchange over every table);
the layout and the dense statistics are logged with the run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jobkit import realistic_batch_world

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "primus_dagster.cli"]
SPEC = Path(__file__).resolve().parents[2] / "examples" / "realistic" / "job.yaml"


def run(command: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    training = {"mode": "batch", "model": {"type": "single", "hash_buckets": 4096}, "batch_size": 256}
    world = realistic_batch_world(tmp_path_factory.mktemp("realistic"), 1500, training)
    world["spec"]["training"]["features"]["categorical"] = [
        {"name": "user_id", "buckets": 2048, "dim": 8},
        {"name": "gender", "table": "profile"},
        {"name": "age_group", "table": "profile"},
    ]
    return world


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_realistic_shape_trains_with_declared_tables_and_transforms(world: dict, ranks: int) -> None:
    spec = dict(world["spec"], name=f"realistic-r{ranks}")
    spec["pools"] = {**spec["pools"], "training": {"replicas": ranks, "min_replicas": ranks, "max_replicas": ranks}}
    # training.compile auto, its background compile started early (at step 2 instead of 1000): one trainer
    # starts it and trains on, switching to the compiled kernels if the compile is done in time; two ranks stay eager
    spec["training"] = {**spec["training"], "compile_after_steps": 2}
    path = world["root"] / f"job-{ranks}.yaml"
    path.write_text(yaml.safe_dump(spec))
    command = [*CLI, "train", str(path), "--start", "2026-11-02", "--hours", "24", "--data-root", str(world["root"])]
    done = run([*command, "--json"], world["env"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "5 dense (price: log1p" in done.stderr and "1 list feature(s) in 3 table(s)" in done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["samples"] > 0 and 0.0 < result["eval_auc"] < 1.0
    assert "popularity_auc" in result  # the guard's prior, on the same training rows
    if ranks == 1:
        assert "kernels: compiling the embedding kernels with torch.compile (in the background, step 2)" in done.stderr
        assert result["kernels"] in ("eager (compiling)", "compiled") or result["kernels"].startswith("compiled from")
    else:
        assert "keeps the 2 ranks' replicas on the eager kernels" in result["kernels"]
