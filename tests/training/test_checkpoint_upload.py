"""Checkpoints in MLflow: a torn upload is never loaded (the previous complete one is), and retention
keeps the newest ``keep_last`` (disk per run bounded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from primus_dagster.training.checkpoint import (
    MANIFEST_FILE,
    Checkpoint,
    checkpoint_files,
    checkpoint_name,
    load_checkpoint,
    save_checkpoint,
)
from primus_dagster.training.tracking import CHECKPOINTS, MlflowTracker

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")


def tiny(step: int) -> Checkpoint:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters())
    return Checkpoint(step, step * 2, model.state_dict(), optimizer.state_dict(), {"barrier_id": step}, {}, "batch", {})


def artifact_files(tracker: MlflowTracker) -> list[str]:
    run_dir = Path(tracker.client.get_run(tracker.require_run_id()).info.artifact_uri.removeprefix("file://"))
    return sorted(str(p.relative_to(run_dir)) for p in (run_dir / CHECKPOINTS).rglob("*") if p.is_file())


def test_a_torn_upload_falls_back_to_the_previous_complete_checkpoint(tmp_path: Path) -> None:
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "torn")
    tracker.start("job-torn", {})
    tracker.log_checkpoint(save_checkpoint(tiny(5), tmp_path / "work" / checkpoint_name(5)), 5)
    torn = save_checkpoint(tiny(9), tmp_path / "work" / checkpoint_name(9))
    model_file, progress_file, manifest = checkpoint_files(torn)
    assert manifest.name == MANIFEST_FILE  # uploaded last
    # the process died mid-upload: the model and progress are there, the manifest never arrived
    for file in (model_file, progress_file):
        tracker.client.log_artifact(tracker.require_run_id(), str(file), f"{CHECKPOINTS}/{checkpoint_name(9)}")
    assert tracker.checkpoint_steps() == [5, 9]
    local = tracker.latest_checkpoint(tmp_path / "download")
    assert local is not None and load_checkpoint(local).step == 5

    # a model file cut short under a manifest that says otherwise is refused as well
    short = tmp_path / "short"
    save_checkpoint(tiny(12), short)
    data = (short / "model.pt").read_bytes()
    (short / "model.pt").write_bytes(data[:-10])
    for file in checkpoint_files(short):
        tracker.client.log_artifact(tracker.require_run_id(), str(file), f"{CHECKPOINTS}/{checkpoint_name(12)}")
    local = tracker.latest_checkpoint(tmp_path / "download2")
    assert local is not None and load_checkpoint(local).step == 5


def test_retention_keeps_the_newest_checkpoints_only(tmp_path: Path) -> None:
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "retention")
    tracker.start("job-retention", {})
    for step in range(1, 8):
        tracker.log_checkpoint(
            save_checkpoint(tiny(step), tmp_path / "work" / checkpoint_name(step)), step, keep_last=2
        )
        assert len(tracker.checkpoint_steps()) == min(step, 2)
    assert tracker.checkpoint_steps() == [6, 7]
    files = artifact_files(tracker)
    assert len(files) == 2 * 3  # two checkpoints of three files: nothing else left on disk
    assert {Path(f).parent.name for f in files} == {checkpoint_name(6), checkpoint_name(7)}
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        tracker.prune_checkpoints(0)
