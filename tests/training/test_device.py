"""``training.device``: resolution on this machine and its errors, the spec's rule for multi-trainer jobs,
the CPU path left untouched; the ``gpu`` tests (skipped without CUDA, as in CI) train, evaluate,
checkpoint and restore each model type on the GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from speckit import one_source_spec

from primus_dagster.data import Batch, Jagged
from primus_dagster.spec import SpecError, parse_job_spec
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.training.checkpoint import load_checkpoint, save_checkpoint, trainer_checkpoint
from primus_dagster.training.device import DeviceError, resolve_device, to_device
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.metrics import evaluate
from primus_dagster.training.models import build_model
from primus_dagster.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
SMALL = {"embedding_dim": 4, "hash_buckets": 512}
MODELS = {
    "single": ModelSpec(type="single", memory_hidden=[8], adapt_hidden=[8], **SMALL),
    "mtrm": ModelSpec(type="mtrm", memory_hidden=[8], adapt_hidden=[8], adapt_batch_weight=0.25, **SMALL),
    "deepfm": ModelSpec(
        type="custom",
        factory=f"{REPO / 'examples' / 'models' / 'deepfm.py'}:build",
        params={"fm_dim": 4, "hidden": [8]},
        **SMALL,
    ),
}


def batches(kind: str, rows: int = 64, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (rows,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    values = torch.randint(0, 2**40, (int(offsets[-1]),), generator=g)
    return Batch.from_tensors(
        torch.randn(rows, 2, generator=g),
        torch.randint(0, 50, (rows, 2), generator=g),
        (torch.rand(rows, generator=g) < 0.3).float(),
        kind=kind,
        sparse_names=["user", "item"],
        lists={"genres": Jagged(values, offsets, torch.rand(len(values), generator=g))},
    )


def layout(training: TrainingSpec) -> FeatureLayout:
    return FeatureLayout.resolve(training, ["price", "age"], ["user", "item"], ["genres"], weighted=["genres"])


def test_cpu_is_the_default_and_touches_nothing() -> None:
    assert TrainingSpec().device == "cpu"
    assert resolve_device("cpu") == (torch.device("cpu"), "cpu")
    b = batches("batch")
    dense, sparse, label, lists = to_device(torch.device("cpu"), b.dense, b.sparse, b.label, b.lists)
    assert dense is b.dense and sparse is b.sparse and label is b.label and lists is b.lists


@NO_CUDA
def test_auto_falls_back_to_the_cpu_and_says_why() -> None:
    device, line = resolve_device("auto")
    assert device == torch.device("cpu")
    assert line == "auto -> cpu (CUDA is not available on this machine)"


def test_auto_with_several_trainers_takes_the_cpu() -> None:
    device, line = resolve_device("auto", trainers=2)
    assert device == torch.device("cpu") and "2 trainers: the rank exchange runs on the CPU" in line


@NO_CUDA
@pytest.mark.parametrize("setting", ["cuda", "cuda:1"])
def test_a_gpu_the_machine_does_not_have_is_one_clear_error(setting: str) -> None:
    with pytest.raises(
        DeviceError, match=rf"training.device is '{setting}', but CUDA is not available .*use device: auto"
    ):
        resolve_device(setting)


@pytest.mark.parametrize("setting", ["gpu", "cuda:x", "CPU", "cuda:", "mps"])
def test_the_spec_refuses_what_is_not_a_device(setting: str) -> None:
    with pytest.raises(ValidationError, match="device"):
        TrainingSpec(device=setting)


def test_a_multi_trainer_job_refuses_cuda_and_takes_auto() -> None:
    def spec(device: str) -> str:
        return one_source_spec("gpu", before="pools: {training: {replicas: 2, max_replicas: 2}}\n",
                               after=f"training: {{device: {device}, mode: batch, model: {{type: single}}}}\n")  # fmt: skip

    with pytest.raises(SpecError, match=r"device 'cuda' needs one trainer.*replicas is 2"):
        parse_job_spec(spec("cuda"), "<test>")
    assert parse_job_spec(spec("auto"), "<test>").training.device == "auto"


def _train_evaluate_restore(name: str, device: torch.device) -> tuple[list[float], float, Trainer]:
    training = TrainingSpec(mode="mixed", batch_size=32, model=MODELS[name])
    model = build_model(training.model, layout=layout(training), seed=0)
    trainer = Trainer(model, training, device=device)
    losses = [trainer.train_step(batches(kind, seed=s)) for s, kind in enumerate(["batch", "stream"] * 3)]
    result = evaluate(trainer.model, [batches("stream", seed=99)])
    return losses, result.auc, trainer


@pytest.mark.parametrize("where", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", list(MODELS))
def test_each_model_trains_evaluates_and_restores_on_its_device_as_on_the_cpu(
    name: str, where: str, tmp_path: Path
) -> None:
    cpu_losses, cpu_auc, _ = _train_evaluate_restore(name, torch.device("cpu"))
    losses, auc, trainer = _train_evaluate_restore(name, torch.device(where))
    assert all(p.device.type == where for p in trainer.model.parameters())
    assert losses == pytest.approx(cpu_losses, rel=1e-3, abs=1e-4)  # the same model, kernels aside
    assert auc == pytest.approx(cpu_auc, abs=0.02)
    ck = trainer_checkpoint(
        *trainer.state(),
        step=trainer.step,
        samples=trainer.counters.samples,
        samples_by_kind=trainer.counters.samples_by_kind,
        phase="mixed",
        phase_done=False,
        snapshot=None,
        versions={},
        mode="mixed",
        window=["2026-11-01T00:00:00+00:00", "2026-11-02T00:00:00+00:00"],
        layout=trainer.model.layout,
        stats=trainer.stats(),
    )
    loaded = load_checkpoint(save_checkpoint(ck, tmp_path / "ck"))
    assert all(t.device.type == "cpu" for t in loaded.model_state.values())  # a checkpoint loads anywhere
    training = trainer.spec
    again = Trainer(build_model(training.model, layout=layout(training), seed=1), training, device=torch.device(where))
    again.restore(loaded.model_state, loaded.optimizer_state, step=loaded.step, samples=loaded.samples)
    next_batch = batches("stream", seed=7)
    assert again.train_step(next_batch) == pytest.approx(trainer.train_step(next_batch), rel=1e-5)


@NO_CUDA
@pytest.mark.integration
@pytest.mark.parametrize("command", ["validate", "train"])
def test_cuda_without_cuda_stops_validate_and_train_with_one_line(command: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(one_source_spec("gpu-job", after="training: {device: cuda, mode: batch, model: {type: single}}\n"))
    args = [str(spec)] if command == "validate" else [str(spec), "--start", "2026-11-01", "--hours", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "primus_dagster.cli", command, *args, "--data-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "error: training.device is 'cuda', but CUDA is not available on this machine" in done.stderr
