"""A team's own model (``examples/models/deepfm.py``, ``training.model.type: custom``) through a real
``primus-dagster train`` on the realistic shape: one trainer and two ranks (the row-sparse exchange
over its ``nn.EmbeddingBag`` tables), registered in MLflow and loaded by an interpreter that cannot
import the example (its code travels inside the model); a SIGKILL mid-window resumes from the
checkpoint with each sample trained once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from jobkit import (
    EXAMPLE_MODELS,
    expected_ids,
    kill_at_first_checkpoint,
    make_job,
    realistic_batch_world,
    resume_and_count,
    skip_without_torchrec,
)

from primus_dagster.training.tracking import MlflowTracker

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "primus_dagster.cli"]
REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "examples" / "realistic" / "job.yaml"
EXAMPLES = EXAMPLE_MODELS
DEEPFM, _, _ = EXAMPLES["deepfm"]
CUSTOM = {"type": "custom", "factory": DEEPFM, "params": EXAMPLES["deepfm"][1], "hash_buckets": 4096}

# Run with -I from a temp dir: neither the checkout nor examples/ is on sys.path.
LOAD = r"""
import json, sys, mlflow, mlflow.pytorch, torch
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pytorch.load_model(sys.argv[2]).eval()
try:
    import examples  # noqa: F401
    importable = True
except ImportError:
    importable = False
g = torch.Generator().manual_seed(0)
from primus_dagster.data import Jagged
lists = {n: Jagged(torch.randint(0, 2**40, (6,), generator=g), torch.tensor([0, 2, 2, 5, 6])) for n in model.list_names}
with torch.no_grad():
    scores = torch.sigmoid(model.predict(torch.randn(4, model.n_dense, generator=g),
                                         torch.randint(0, 2**40, (4, model.n_sparse), generator=g), lists))
print(json.dumps({"net": type(model.net).__name__, "examples_importable": importable, "scores": scores.tolist()}))
"""


def run(command: list[str], env: dict, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    training = {"mode": "batch", "model": CUSTOM, "batch_size": 256, "baseline_guard": "warn", "device": "auto"}
    world = realistic_batch_world(tmp_path_factory.mktemp("custom"), 1000, training)
    world["spec"]["training"]["features"]["categorical"] = [{"name": "user_id", "buckets": 2048, "dim": 8}]
    return world


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_the_example_models_train_on_one_or_two_ranks_and_load_without_their_code(
    world: dict, example: str, ranks: int
) -> None:
    skip_without_torchrec(example)
    factory, params, net = EXAMPLES[example]
    name = f"custom-{example.replace('_', '-')}"  # job and model names: no underscores
    spec = dict(world["spec"], name=f"{name}-r{ranks}")
    spec["training"] = {**spec["training"], "model": {**CUSTOM, "factory": factory, "params": params}}
    spec["pools"] = {**spec["pools"], "training": {"replicas": ranks, "min_replicas": ranks, "max_replicas": ranks}}
    path = world["root"] / f"job-{example}-{ranks}.yaml"
    path.write_text(yaml.safe_dump(spec))
    command = [*CLI, "train", str(path), "--start", "2026-11-02", "--hours", "24", "--data-root", str(world["root"])]
    done = run([*command, "--json"], world["env"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert f"model: custom, factory {factory}: {net}" in done.stderr
    if not torch.cuda.is_available():  # device: auto says what it took
        why = "2 trainers: the rank exchange runs on the CPU" if ranks == 2 else "CUDA is not available"
        assert f"device: auto -> cpu ({why}" in done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["samples"] > 0 and 0.0 < result["eval_auc"] < 1.0
    if ranks == 2:
        return
    uri = spec["tracking"]["tracking_uri"]
    version = MlflowTracker(uri, "custom").register_model(result["model_uri"], name)
    loaded = run([sys.executable, "-I", "-c", LOAD, uri, f"models:/{name}/{version}"], world["env"], cwd="/")
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    out = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert out["net"] == net and out["examples_importable"] is False
    assert len(out["scores"]) == 4 and all(0.0 < s < 1.0 for s in out["scores"])


def test_a_factory_that_breaks_the_protocol_stops_train_before_any_step(world: dict, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("from torch import nn\ndef build(context):\n    return nn.Linear(context.n_dense, 1)\n")
    spec = dict(world["spec"], name="custom-broken")
    spec["training"] = {**spec["training"], "model": {**CUSTOM, "factory": f"{broken}:build", "params": {}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    command = [*CLI, "train", str(path), "--start", "2026-11-02", "--hours", "24", "--data-root", str(world["root"])]
    done = run(command, world["env"])
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert f"training.model.factory '{broken}:build' failed on a batch of 2 rows" in done.stderr


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_a_custom_model_resumes_after_sigkill_with_each_sample_once(tmp_path: Path, example: str) -> None:
    skip_without_torchrec(example)
    factory, params, _ = EXAMPLES[example]
    model = f"custom, factory: '{factory}', params: {json.dumps(params)}, hash_buckets: 4096"
    env = make_job(tmp_path, mode="mixed", model_block=f"{{type: {model}}}", every=8, rows_per_hour=6000)
    kill_at_first_checkpoint(env, tmp_path / "run1.bin", slow_executors_ms=40)
    _, kept, after = resume_and_count(env, tmp_path / "run1.bin", tmp_path / "run2.bin", 0, timeout_s=240)
    assert kept + after == expected_ids(env)
