"""A disk that fills up while a checkpoint is written: one clear error (the checkpoint, the file, the free
space), the previous checkpoint untouched, nothing half-written left behind; ``primus-dagster train``
prints it as one ``error:`` line, exits 1, and the same command afterwards resumes and finishes."""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from jobkit import make_job

from primus_dagster.training import checkpoint
from primus_dagster.training.checkpoint import (
    Checkpoint,
    CheckpointWriteError,
    free_space_text,
    load_checkpoint,
    save_checkpoint,
)

Usage = namedtuple("Usage", "total used free")
FREE = 3 * 2**20 + 2**19  # what the patched disk_usage reports: "3.5 MiB free"


def ckpt(step: int) -> Checkpoint:
    model = torch.nn.Linear(4, 1)
    return Checkpoint(step, step * 8, model.state_dict(), {"state": {}, "param_groups": []}, phase="batch")


@pytest.fixture
def small_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """``shutil.disk_usage`` reports :data:`FREE` bytes free (the real call would report this machine's)."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(2**30, 2**30 - FREE, FREE))


def save_to_dev_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.save`` writes to ``/dev/full``: the kernel's own ENOSPC, as on a full disk."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    real_save = torch.save

    def full_save(obj: object, f: object, *args: object, **kwargs: object) -> None:
        with open("/dev/full", "wb") as full:
            real_save(obj, full, *args, **kwargs)
            full.flush()

    monkeypatch.setattr(torch, "save", full_save)


def fsync_full_at(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """``os.fsync`` of the file ``name`` fails with ENOSPC (delayed allocation: the space runs out at fsync)."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"/{name}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def test_a_full_disk_at_the_model_file_is_one_clear_error_and_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_disk: None
) -> None:
    target = tmp_path / "run" / "checkpoint"
    save_checkpoint(ckpt(10), target)
    save_to_dev_full(monkeypatch)

    with pytest.raises(CheckpointWriteError) as caught:
        save_checkpoint(ckpt(20), target)

    error = caught.value
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC and error.filename == str(target)
    message = str(error)
    assert "\n" not in message
    assert message.startswith(
        f"cannot write checkpoint step 20 to {target} (writing model.pt): No space left on device"
    )
    assert f"3.5 MiB free on {target.parent}" in message and "run the same command again to resume" in message
    assert load_checkpoint(target).step == 10  # the previous checkpoint, whole
    assert leftovers(target.parent) == []  # no half-written temp directory
    monkeypatch.undo()  # space again: the next checkpoint is written as usual
    assert load_checkpoint(save_checkpoint(ckpt(30), target)).step == 30


def test_a_full_disk_at_fsync_names_the_file_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_disk: None
) -> None:
    fsync_full_at(monkeypatch, "progress.json")
    target = tmp_path / "step-000000005"
    with pytest.raises(CheckpointWriteError, match=r"\(writing progress\.json\): No space left on device; 3\.5 MiB"):
        save_checkpoint(ckpt(5), target)
    assert not target.exists() and leftovers(tmp_path) == []


def test_other_os_errors_are_raised_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_save(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError) as caught:
        save_checkpoint(ckpt(1), tmp_path / "c")
    assert type(caught.value) is OSError and caught.value.errno == errno.EIO
    assert leftovers(tmp_path) == []


def test_the_error_survives_pickling_and_free_space_reads_the_nearest_existing_directory(tmp_path: Path) -> None:
    error = CheckpointWriteError("cannot write checkpoint step 1 to /x: full", errno.ENOSPC, "/x")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is CheckpointWriteError and str(back) == str(error)
    assert (back.errno, back.filename) == (errno.ENOSPC, "/x")
    assert free_space_text(tmp_path / "not" / "yet").endswith(f" free on {tmp_path}")
    assert errno.ENOSPC in checkpoint.DISK_FULL_ERRNOS


@pytest.mark.integration
def test_train_on_a_full_disk_exits_1_with_one_error_line_and_then_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], small_disk: None
) -> None:
    """``primus-dagster train`` in this process, with the first checkpoint's model file hitting a full
    disk: exit 1, one ``error:`` line naming the checkpoint and the free space, no traceback; run again
    with space, the same command finishes the window."""
    from primus_dagster.cli import main

    env = make_job(tmp_path / "job", mode="batch", model="single", hours=1, every=2, rows_per_hour=1200)
    argv = ["train", str(env["job_path"]), "--data-root", str(env["root"]), "--hours", "1", "--executors", "1"]
    argv += ["--no-eval", "--json"]
    save_to_dev_full(monkeypatch)

    assert main(argv) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err[-3000:]
    assert errors[0].startswith("error: cannot write checkpoint step ") and "(writing model.pt)" in errors[0]
    assert "No space left on device; 3.5 MiB free on " in errors[0]
    assert "Traceback" not in err

    monkeypatch.undo()
    assert main(argv) == 0, capsys.readouterr().err[-3000:]


@pytest.fixture
def tiny_filesystem(tmp_path: Path):
    """A real 600 KiB tmpfs (smaller than MLflow's empty SQLite schema): needs root and ``mount``; elsewhere
    the test is skipped, naming why."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=30)


def test_train_with_its_mlflow_store_on_a_full_disk_is_one_error_line_naming_the_store(
    tmp_path: Path, tiny_filesystem: Path
) -> None:
    """The SQLite store of ``--tracking-uri`` lies on a filesystem too small for it: MLflow's SQL store fails
    with "database or disk is full" (and would log the chained traceback itself). ``primus-dagster train``, a
    process of its own (its whole stderr is what a user sees), says it in one line, naming the store and the
    free space there, first; exit 1, no traceback."""
    env = make_job(tmp_path / "job", mode="batch", model="single", hours=1, rows_per_hour=600)
    uri = f"sqlite:///{tiny_filesystem / 'mlflow.db'}"
    argv = ["train", str(env["job_path"]), "--data-root", str(env["root"]), "--hours", "1", "--tracking-uri", uri]
    done = subprocess.run(
        [sys.executable, "-m", "primus_dagster.cli", *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 1, done.stderr[-3000:]
    err = done.stderr
    assert "Traceback" not in err and "database or disk is full\n[SQL" not in err, err[-3000:]
    (error,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert error.startswith(f"error: writing to {uri} failed: database or disk is full; ")
    assert f"free on {tiny_filesystem} (the MLflow store)" in error.split(", ")[0]
