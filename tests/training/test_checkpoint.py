"""Training checkpoints: round trip, atomic overwrite, errors naming the broken file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from primus_dagster.training.checkpoint import (
    MANIFEST_FILE,
    Checkpoint,
    CheckpointError,
    checkpoint_name,
    checkpoint_step,
    load_checkpoint,
    manifest_of,
    save_checkpoint,
    verify_checkpoint,
)


def trained(steps: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(50, 4, mode="sum"), torch.nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        ids = torch.randint(0, 50, (8, 3))
        loss = model(ids).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer


SNAPSHOT = {
    "format": 1,
    "barrier_id": 4,
    "source_versions": {"delta": 7},
    "config": {"max_attempts": 3, "lease_s": 30.0, "trainers": 1},
    "tasks": [{"payload": {"kind": "batch", "path": "part-0"}, "state": "done", "rows": 1024}],
}


def make(step: int = 12, **extra: object) -> tuple[Checkpoint, torch.nn.Module, torch.optim.Optimizer]:
    model, optimizer = trained()
    ckpt = Checkpoint(
        step=step,
        samples=step * 8,
        model_state=model.state_dict(),
        optimizer_state=optimizer.state_dict(),
        data_snapshot=SNAPSHOT,
        source_versions={"delta": 7, "kafka": {"events/0": 1234}},
        phase="mixed",
        extra={"window": ["2024-01-01T00", "2024-01-01T06"], "metrics": {"loss": 0.5}, **extra},
    )
    return ckpt, model, optimizer


def test_checkpoint_name_sorts_by_step() -> None:
    assert checkpoint_name(123) == "step-000000123"
    assert sorted([checkpoint_name(s) for s in (12, 5, 100)]) == [checkpoint_name(s) for s in (5, 12, 100)]
    assert checkpoint_step(checkpoint_name(42)) == 42
    assert checkpoint_step("model.pt") is None
    with pytest.raises(ValueError):
        checkpoint_name(-1)


def test_round_trip_model_adam_and_snapshot(tmp_path: Path) -> None:
    ckpt, model, optimizer = make()
    final = save_checkpoint(ckpt, tmp_path / "ckpt" / checkpoint_name(12))
    assert final == (tmp_path / "ckpt" / "step-000000012").absolute()
    assert sorted(p.name for p in final.parent.iterdir()) == ["step-000000012"]  # no temp leftovers
    assert sorted(p.name for p in final.iterdir()) == ["manifest.json", "model.pt", "progress.json"]
    progress = json.loads((final / "progress.json").read_text())
    assert progress["format"] == 1 and progress["step"] == 12 and progress["phase"] == "mixed"

    loaded = load_checkpoint(final)  # torch.load(weights_only=True) handles Adam's state dict
    assert (loaded.step, loaded.samples, loaded.phase) == (12, 96, "mixed")
    assert loaded.data_snapshot == SNAPSHOT
    assert loaded.source_versions == {"delta": 7, "kafka": {"events/0": 1234}}
    assert loaded.extra["window"] == ["2024-01-01T00", "2024-01-01T06"]

    restored, restored_opt = trained(steps=0)
    restored.load_state_dict(loaded.model_state)
    restored_opt.load_state_dict(loaded.optimizer_state)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, restored.state_dict()[name])
    original, back = optimizer.state_dict(), restored_opt.state_dict()
    assert original["param_groups"] == back["param_groups"]
    for key, state in original["state"].items():
        assert torch.equal(state["step"], back["state"][key]["step"])
        assert torch.equal(state["exp_avg_sq"], back["state"][key]["exp_avg_sq"])
    # training continues identically from the restored state
    ids = torch.randint(0, 50, (8, 3), generator=torch.Generator().manual_seed(1))
    for m, o in ((model, optimizer), (restored, restored_opt)):
        o.zero_grad()
        m(ids).pow(2).mean().backward()
        o.step()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, restored.state_dict()[name])


def test_none_snapshot_round_trips(tmp_path: Path) -> None:
    model, optimizer = trained(steps=0)
    ckpt = Checkpoint(
        step=0,
        samples=0,
        model_state=model.state_dict(),
        optimizer_state=optimizer.state_dict(),
        data_snapshot=None,
        source_versions={},
        phase="batch",
        extra={},
    )
    loaded = load_checkpoint(save_checkpoint(ckpt, tmp_path / "c"))
    assert loaded.data_snapshot is None and loaded.extra == {} and loaded.optimizer_state["state"] == {}


def test_atomic_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "latest"
    first, _, _ = make(step=5)
    save_checkpoint(first, target)
    (target / "stale.txt").write_text("from the first save")
    second, _, _ = make(step=9)
    save_checkpoint(second, target)
    assert load_checkpoint(target).step == 9
    assert not (target / "stale.txt").exists()  # the directory was replaced, not merged
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_failed_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "latest"
    good, _, _ = make(step=5)
    save_checkpoint(good, target)
    bad, _, _ = make(step=6, not_json=object())
    with pytest.raises(CheckpointError, match="JSON-serialisable"):
        save_checkpoint(bad, target)
    assert load_checkpoint(target).step == 5
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_missing_files_name_the_path(tmp_path: Path) -> None:
    ckpt, _, _ = make()
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        load_checkpoint(tmp_path / "nowhere")
    a = save_checkpoint(ckpt, tmp_path / "a")
    (a / "progress.json").unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"{a / 'progress.json'}: missing")):
        load_checkpoint(a)
    b = save_checkpoint(ckpt, tmp_path / "b")
    (b / "model.pt").unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"{b / 'model.pt'}: missing")):
        load_checkpoint(b)
    assert issubclass(CheckpointError, ValueError)


def reseal(directory: Path) -> None:
    """Rewrite the manifest for the files as they are now: a checkpoint written whole with bad contents."""
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest_of(directory)))


def test_corrupt_files_name_the_path(tmp_path: Path) -> None:
    ckpt, _, _ = make()
    a = save_checkpoint(ckpt, tmp_path / "a")
    (a / "progress.json").write_text('{"format": 1, "step": ')
    reseal(a)
    with pytest.raises(CheckpointError, match=re.escape(f"{a / 'progress.json'}: corrupt JSON")):
        load_checkpoint(a)
    (a / "progress.json").write_text(json.dumps({"format": 99, "step": 1, "samples": 1, "phase": "batch"}))
    reseal(a)
    with pytest.raises(CheckpointError, match="unsupported checkpoint format 99"):
        load_checkpoint(a)
    b = save_checkpoint(ckpt, tmp_path / "b")
    data = (b / "model.pt").read_bytes()
    (b / "model.pt").write_bytes(data[: len(data) // 2])
    reseal(b)
    with pytest.raises(CheckpointError, match=re.escape(f"{b / 'model.pt'}: corrupt")):
        load_checkpoint(b)
    torch.save({"model": {}, "optimizer": {}, "evil": object()}, b / "model.pt")  # not weights-only
    reseal(b)
    with pytest.raises(CheckpointError, match=re.escape(f"{b / 'model.pt'}")):
        load_checkpoint(b)


def test_a_torn_checkpoint_is_never_loaded(tmp_path: Path) -> None:
    """A write or upload cut short: the manifest (written last) missing, a file short or changed."""
    ckpt, _, _ = make()
    a = save_checkpoint(ckpt, tmp_path / "a")
    assert sorted(p.name for p in a.iterdir()) == [MANIFEST_FILE, "model.pt", "progress.json"]
    verify_checkpoint(a)
    (a / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"{a / MANIFEST_FILE}: missing: an incomplete checkpoint")):
        load_checkpoint(a)
    b = save_checkpoint(ckpt, tmp_path / "b")
    data = (b / "model.pt").read_bytes()
    (b / "model.pt").write_bytes(data[: len(data) - 100])  # a cut upload: same name, fewer bytes
    with pytest.raises(CheckpointError, match=re.escape(f"{b / 'model.pt'}: {len(data) - 100} bytes, {MANIFEST_FILE}")):
        load_checkpoint(b)
    c = save_checkpoint(ckpt, tmp_path / "c")
    (c / "model.pt").write_bytes(bytes(len(data)))  # same size, other bytes
    with pytest.raises(CheckpointError, match="sha256 differs"):
        load_checkpoint(c)
    d = save_checkpoint(ckpt, tmp_path / "d")
    (d / MANIFEST_FILE).write_text('{"files": ')
    with pytest.raises(CheckpointError, match=re.escape(f"{d / MANIFEST_FILE}: corrupt manifest")):
        load_checkpoint(d)
