"""Training checkpoints on disk: model + optimizer state, data progress and source versions.

A checkpoint is one directory holding

* ``model.pt``      -- ``torch.save({"model": model_state, "optimizer": optimizer_state})``
* ``progress.json`` -- everything else, human-readable: ``format``, ``step``, ``samples``,
  ``phase``, the data driver's barrier snapshot, the source versions (Delta version, Iceberg
  snapshot, Kafka offsets) and ``extra`` (window, metrics, mode, ...)
* ``shards/``       -- a group whose tables are sharded: the tables' rows and their Adam moments, as
  ``torch.distributed.checkpoint`` files every rank wrote its share of (:mod:`~primus_dagster.training.shard_state`)
* ``manifest.json`` -- the size and sha256 of every file above, written (and uploaded) last

:func:`save_checkpoint` writes a temp sibling directory and renames it into place, so a reader
never sees a half-written checkpoint on local disk. An upload can still be cut (the process killed
while MLflow copies the files): :func:`load_checkpoint` verifies every file against the manifest and
refuses a checkpoint whose manifest is missing or does not match, naming the file (a torn checkpoint
is never loaded; :meth:`~primus_dagster.training.tracking.MlflowTracker.latest_checkpoint` then falls
back to the previous complete one). A disk that fills up while a checkpoint is written (``ENOSPC``,
``EDQUOT``) leaves the previous checkpoint in place and raises :class:`CheckpointWriteError`: one line
naming the checkpoint, the file and the free space. Uploading / finding checkpoints in MLflow lives in
:mod:`primus_dagster.training.tracking`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from primus_dagster.training.shard_state import SHARDS_DIR, ShardedInfo
from primus_dagster.training.shard_state import merge_shards as merge_shards_of

if TYPE_CHECKING:
    from primus_dagster.training.features import FeatureLayout

__all__ = [
    "CHECKPOINT_FORMAT",
    "MANIFEST_FILE",
    "Checkpoint",
    "CheckpointError",
    "CheckpointWriteError",
    "checkpoint_files",
    "checkpoint_name",
    "checkpoint_step",
    "free_space_text",
    "load_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]

CHECKPOINT_FORMAT = 1
MODEL_FILE = "model.pt"
PROGRESS_FILE = "progress.json"
MANIFEST_FILE = "manifest.json"
_NAME = re.compile(r"^step-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint directory with a missing, corrupt or unsupported file (named in the message)."""


#: The ``errno`` values of a full disk (``ENOSPC``) or a spent quota (``EDQUOT``, where the OS has it).
DISK_FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if e is not None)


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written because its disk is full: the message names the
    checkpoint, the file being written and the free space. ``errno`` is the original one (``ENOSPC``);
    the previous checkpoint is left as it was, so the run resumes from it once there is space."""

    def __init__(self, message: str, code: int = errno.ENOSPC, path: str | None = None):
        super().__init__(code, message, path)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:  # pickled with its own arguments (OSError's would not fit)
        return (type(self), (self.message, self.errno, self.filename))


def free_space_text(path: str | os.PathLike[str]) -> str:
    """``"12.3 MiB free on /data"``: the free space of the filesystem holding ``path`` (its nearest
    existing ancestor), from :func:`shutil.disk_usage`; ``"free space on /data unknown"`` when it cannot be read."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return f"free space on {where} unknown"
    size, unit = float(free), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.1f} {unit} free on {where}" if unit != "B" else f"{free} bytes free on {where}"


@dataclass
class Checkpoint:
    """One training checkpoint (see the module docstring for the files it becomes).

    ``data_snapshot``, ``source_versions`` and ``extra`` must be JSON-serialisable (and come
    back as JSON does: tuples as lists, non-string dict keys as strings).

    Example::

        ckpt = Checkpoint(step=500, samples=512_000, model_state=model.state_dict(),
                          optimizer_state=optimizer.state_dict(), data_snapshot=reader.barrier(1),
                          source_versions={"delta": 7, "kafka": {"0": 1234}}, phase="batch")
        save_checkpoint(ckpt, run_dir / checkpoint_name(ckpt.step))
        model.load_state_dict(load_checkpoint(run_dir / checkpoint_name(500)).model_state)
    """

    step: int
    samples: int
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]
    data_snapshot: dict[str, Any] | None = None
    source_versions: dict[str, Any] = field(default_factory=dict)
    phase: str = "batch"
    extra: dict[str, Any] = field(default_factory=dict)


def checkpoint_name(step: int) -> str:
    """The directory / artifact name of the checkpoint at ``step``: ``step-000000123`` (sorts by step)."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:09d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a :func:`checkpoint_name` (``"step-000000123"`` -> 123); None for other names."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def _progress(ckpt: Checkpoint) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "step": int(ckpt.step),
        "samples": int(ckpt.samples),
        "phase": ckpt.phase,
        "data_snapshot": ckpt.data_snapshot,
        "source_versions": ckpt.source_versions,
        "extra": ckpt.extra,
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _listed(directory: Path) -> list[str]:
    """The files the manifest lists, relative: ``model.pt``, ``progress.json``, every file of ``shards/``."""
    shards = directory / SHARDS_DIR
    parts = (
        sorted(p.relative_to(directory).as_posix() for p in shards.rglob("*") if p.is_file()) if shards.is_dir() else []
    )
    return [MODEL_FILE, PROGRESS_FILE, *parts]


def manifest_of(directory: Path) -> dict[str, Any]:
    """The manifest of a checkpoint directory's files (sizes, sha256), which :func:`verify_checkpoint` checks."""
    return {
        "format": CHECKPOINT_FORMAT,
        "files": {
            name: {"size": (directory / name).stat().st_size, "sha256": _sha256(directory / name)}
            for name in _listed(directory)
        },
    }


def checkpoint_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The files of the checkpoint in ``directory`` in upload order: the manifest comes last, so an
    upload cut anywhere leaves a checkpoint that :func:`load_checkpoint` refuses."""
    root = Path(directory)
    return [root / name for name in _listed(root)] + [root / MANIFEST_FILE]


def verify_checkpoint(directory: str | os.PathLike[str]) -> None:
    """Raise :class:`CheckpointError` naming the file unless ``directory`` holds a complete checkpoint:
    a manifest, and every file it lists with its size and sha256 (a torn write or upload fails here)."""
    root = Path(directory)
    path = root / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        expected = {str(name): (int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()}
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing: an incomplete checkpoint (a torn write or upload?)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: corrupt manifest: {type(exc).__name__}: {exc}") from exc
    for name, (size, sha256) in sorted(expected.items()):
        file = root / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (listed in {MANIFEST_FILE}): an incomplete checkpoint")
        found = file.stat().st_size
        if found != size:
            raise CheckpointError(
                f"{file}: {found} bytes, {MANIFEST_FILE} says {size}: an incomplete checkpoint (a torn write or upload?)"
            )
        if _sha256(file) != sha256:
            raise CheckpointError(f"{file}: sha256 differs from {MANIFEST_FILE}: a corrupt checkpoint")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(ckpt: Checkpoint, directory: str | os.PathLike[str], *, shards: Path | None = None) -> Path:
    """Write ``ckpt`` to ``directory`` atomically and return it (as an absolute :class:`Path`); ``shards``:
    the folder of its sharded tables (written by the group's ranks), moved into it as ``shards/``.

    The files (the manifest last) are written and fsynced in a temp sibling directory, which is then renamed to
    ``directory``. An existing checkpoint there is first renamed aside and removed after the
    swap; a crash between the two renames leaves it as ``.<name>.old-*`` next to the target.
    A full disk raises :class:`CheckpointWriteError` (the temp directory removed, the previous
    checkpoint in place); any other error is raised as it is, after the same clean-up.
    """
    target = Path(directory).absolute()
    try:
        progress = json.dumps(_progress(ckpt), indent=2, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint step {ckpt.step}: data_snapshot / source_versions / extra must be JSON-serialisable: {exc}"
        ) from exc
    doing = [f"creating its temp directory in {target.parent}"]  # the write under way, for a disk-full message
    try:
        return _write_checkpoint(ckpt, target, progress, doing, shards)
    except OSError as exc:
        code = exc.errno
        if code is None or code not in DISK_FULL_ERRNOS or isinstance(exc, CheckpointWriteError):
            raise
        raise CheckpointWriteError(
            f"cannot write checkpoint step {ckpt.step} to {target} ({doing[-1]}): {os.strerror(code)}; "
            f"{free_space_text(target.parent)}. Nothing of it was kept (the previous checkpoint is intact): "
            "free some space, then run the same command again to resume",
            code,
            str(target),
        ) from exc


def _write_checkpoint(ckpt: Checkpoint, target: Path, progress: str, doing: list[str], shards: Path | None) -> Path:
    """:func:`save_checkpoint`'s writes; ``doing`` gets each step as it starts (``"writing model.pt"``)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    old: Path | None = None
    try:
        doing.append(f"writing {MODEL_FILE}")
        with open(tmp / MODEL_FILE, "wb") as fh:
            torch.save({"model": ckpt.model_state, "optimizer": ckpt.optimizer_state}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        doing.append(f"writing {PROGRESS_FILE}")
        with open(tmp / PROGRESS_FILE, "w", encoding="utf-8") as fh:
            fh.write(progress + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if shards is not None:
            doing.append(f"moving the shards from {shards}")
            os.replace(shards, tmp / SHARDS_DIR)
        doing.append(f"writing {MANIFEST_FILE}")
        with open(tmp / MANIFEST_FILE, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest_of(tmp), indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        doing.append("renaming it into place")
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old)  # onto an empty directory: allowed by rename(2)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not target.exists():
            os.replace(old, target)  # put the previous checkpoint back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def _read_progress(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (not a checkpoint directory?)") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"{path}: corrupt JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a checkpoint progress file (a JSON {type(data).__name__})")
    if data.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path}: unsupported checkpoint format {data.get('format')!r} (expected {CHECKPOINT_FORMAT})"
        )
    missing = [key for key in ("step", "samples", "phase") if key not in data]
    if missing:
        raise CheckpointError(f"{path}: missing keys {missing}")
    return data


def _read_model(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (not a checkpoint directory?)")
    try:
        # weights_only=True (no arbitrary unpickling) loads model state dicts and torch.optim
        # state dicts (Adam: tensors, ints, floats, bools, tuples, None) -- see test_checkpoint.
        states = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: corrupt or unreadable torch file: {type(exc).__name__}: {exc}") from exc
    if not isinstance(states, dict) or not {"model", "optimizer"} <= set(states):
        raise CheckpointError(f"{path}: expected a dict with 'model' and 'optimizer' states")
    return states


def load_checkpoint(directory: str | os.PathLike[str], *, merge_shards: bool = True) -> Checkpoint:
    """The :class:`Checkpoint` saved in ``directory``; :class:`CheckpointError` naming the file
    when ``progress.json`` or ``model.pt`` is missing, corrupt or does not match ``manifest.json``
    (:func:`verify_checkpoint`: a torn checkpoint is never loaded). Tensors are loaded on the CPU. A
    checkpoint with sharded tables comes whole (``merge_shards``), or as ``model.pt`` holds it (a group
    that loads its own rows of the shards)."""
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"{root}: no such checkpoint directory")
    verify_checkpoint(root)
    progress = _read_progress(root / PROGRESS_FILE)
    states = _read_model(root / MODEL_FILE)
    model_state, optimizer_state = states["model"], states["optimizer"]
    extra = dict(progress.get("extra") or {})
    sharded = ShardedInfo.of(extra)
    if sharded is not None and merge_shards:
        model_state, optimizer_state = merge_shards_of(root / SHARDS_DIR, model_state, optimizer_state, sharded)
    return Checkpoint(
        step=int(progress["step"]),
        samples=int(progress["samples"]),
        model_state=model_state,
        optimizer_state=optimizer_state,
        data_snapshot=progress.get("data_snapshot"),
        source_versions=dict(progress.get("source_versions") or {}),
        phase=str(progress["phase"]),
        extra=extra,
    )


def trainer_checkpoint(
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any],
    *,
    step: int,
    samples: int,
    samples_by_kind: dict[str, int],
    phase: str,
    phase_done: bool,
    snapshot: dict[str, Any] | None,
    versions: dict[str, Any],
    mode: str,
    window: list[str],
    layout: FeatureLayout,
    stats: dict[str, Any],
    **extra: Any,
) -> Checkpoint:
    """The checkpoint of a window run at ``step`` (one trainer's or a rank group's): the fields every
    resume reads (``phase_done``, ``samples_by_kind``, ``mode``, ``window``, the model's feature
    ``layout`` -- with its widths ``n_dense`` / ``n_sparse`` --, ``stats``) and the trainer's own ``extra``.

    Example::

        ck = trainer_checkpoint(*trainer.state(), step=100, samples=102_400, samples_by_kind={"batch": 102_400},
                                phase="batch", phase_done=False, snapshot=reader.barrier(100), versions={},
                                mode="batch", window=["2026-11-01T00:00:00+00:00", "2026-11-02T00:00:00+00:00"],
                                layout=trainer.model.layout, stats=trainer.stats())
    """
    return Checkpoint(
        step=step,
        samples=samples,
        model_state=model_state,
        optimizer_state=optimizer_state,
        data_snapshot=snapshot,
        source_versions=versions,
        phase=phase,
        extra={
            "phase_done": phase_done,
            "samples_by_kind": dict(samples_by_kind),
            "mode": mode,
            "window": window,
            "n_dense": layout.n_dense,
            "n_sparse": layout.n_sparse,
            "layout": layout.to_dict(),
            "stats": stats,
            **extra,
        },
    )


def load_weights(model: Any, optimizer: Any, checkpoint: Checkpoint, *, warm_key: str | None = None) -> None:
    """Load ``checkpoint``'s model and optimizer state into ``model`` / ``optimizer``. ``warm_key``: the
    checkpoint is another run's final model (a warm start) -- a model that does not fit gets an error
    naming that run key and the likely cause."""
    try:
        model.load_state_dict(checkpoint.model_state)
        optimizer.load_state_dict(checkpoint.optimizer_state)
    except (RuntimeError, ValueError) as exc:
        if warm_key is None:
            raise
        raise ValueError(
            f"cannot warm-start from run key {warm_key!r}: its model does not fit this job's "
            f"(was training.model or the columns changed?): {exc}"
        ) from exc
