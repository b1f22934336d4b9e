"""Driver snapshot files: atomic JSON writes and reads (what a snapshot holds and the restore rules:
``docs/data_plane.md``; building and restoring one: :class:`~.state.DataDriver`).

Example::

    save_snapshot("ckpt/data_driver.json", driver.snapshot())
    driver = DataDriver.restore(read_snapshot("ckpt/data_driver.json"))
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def save_snapshot(path: str | os.PathLike[str], snapshot: dict[str, Any]) -> Path:
    """Atomically write a snapshot as JSON: a temp file in the same folder, fsync, ``os.replace``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(snapshot, fh, separators=(",", ":"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The snapshot dict stored at ``path``."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a data driver snapshot (a JSON {type(data).__name__})")
    return data
