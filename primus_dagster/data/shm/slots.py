"""The executor's side of the shared-memory fast path (Linux tmpfs): its locked directory and slot pools.

Flight stays the control and stream protocol; only the batch bytes move through reused, memory-mapped
slot files that a reader on the same host maps zero-copy (:mod:`.slot_reader`). Protocol, flow control
and lifecycle (who unlinks what, and when a killed executor's files go): ``docs/shared_memory.md``.

Example::

    shm = ShmDir()                                  # <root>/primus-data-<pid>-…, locked while we live
    pool = SlotPool(shm, max_slots=32, max_inflight=4)  # one per shared-memory DoGet stream
    put = pool.put(record_batch)                    # None: no free slot or no space, send it inline
    if put is not None:
        desc, slot = put                            # desc: the metadata's "shm" descriptor
        done = pool.received(slot, desc["seq"])     # the reader has it: the batch counts as served
    pool.close()
    shm.close()
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import mmap
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

log = logging.getLogger(__name__)

SHM_ENV = "PRIMUS_SHM"  # "0" / "false" / "off": no shared memory (executors and readers)
SHM_DIR_ENV = "PRIMUS_SHM_DIR"
PREFIX = "primus-data-"
TMP_PREFIX = ".primus-data-tmp-"
LOCK_NAME = "owner.lock"
PROBE_NAME = "probe"
SHM_ACTION = "shm-info"
HEADER = 64  # bytes before a slot's IPC stream (keeps Arrow's 64-byte alignment)
FREE, SENT, RECEIVED = 0, 1, 2  # slot states (header word 0); word 1: the batch's sequence number
_ORPHAN_AGE_S = 600.0


def shm_enabled() -> bool:
    """False when ``$PRIMUS_SHM`` turns the shared-memory path off."""
    return os.environ.get(SHM_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def shm_root() -> Path | None:
    """Where executors put their directories (``$PRIMUS_SHM_DIR`` or ``/dev/shm``); None if unusable."""
    root = Path(os.environ.get(SHM_DIR_ENV) or "/dev/shm")
    return root if root.is_dir() and os.access(root, os.W_OK | os.X_OK) else None


def remove_if_dead(directory: str | Path) -> bool:
    """Remove an executor's directory if its owner is gone (its lock is free); True if removed."""
    directory = Path(directory)
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # the owner holds it
    try:
        shutil.rmtree(directory, ignore_errors=True)
    finally:
        os.close(fd)
    return True


def sweep_stale(root: str | Path) -> list[str]:
    """Remove the directories of dead executors under ``root`` (and orphans older than 10 minutes:
    half-created ones, or ones a sweeper died removing); the names removed."""
    removed: list[str] = []
    try:
        entries = list(Path(root).iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith((PREFIX, TMP_PREFIX)):
            continue
        if entry.name.startswith(PREFIX) and remove_if_dead(entry):
            removed.append(entry.name)
            continue
        try:
            orphan = not (entry / LOCK_NAME).exists() or entry.name.startswith(TMP_PREFIX)
            if orphan and time.time() - entry.stat().st_mtime > _ORPHAN_AGE_S:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        except OSError:
            continue
    if removed:
        log.info("removed stale shared-memory directories of dead executors: %s", removed)
    return removed


def sweep_dead_executors() -> list[str]:
    """Remove the shared-memory directories of executors that died without cleaning up (SIGKILL, OOM
    kill) under this process's shared-memory root; a plane calls it when it closes, so that a killed
    executor's slots do not outlive the run. Live executors' directories stay (their lock is held)."""
    root = shm_root()
    return sweep_stale(root) if root is not None else []


class ShmDir:
    """An executor's shared-memory directory, locked for its lifetime (``docs/shared_memory.md``)."""

    def __init__(self, root: str | Path | None = None):
        root = Path(root) if root is not None else shm_root()
        if root is None:
            raise OSError(errno.ENOENT, "no writable shared-memory directory (/dev/shm or $PRIMUS_SHM_DIR)")
        sweep_stale(root)
        tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=root))
        self._lock_fd: int | None = None
        try:
            self._lock_fd = os.open(tmp / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            self.nonce = secrets.token_hex(16)
            (tmp / PROBE_NAME).write_text(self.nonce)
            # Renamed only once locked: a sweeper never sees an unlocked primus-data-* directory.
            self.path = root / f"{PREFIX}{os.getpid()}-{tmp.name[len(TMP_PREFIX) :]}"
            os.rename(tmp, self.path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
            raise
        self._streams = itertools.count()
        self._lock = threading.Lock()

    def info(self) -> dict[str, str]:
        """What ``DoAction("shm-info")`` answers."""
        return {"dir": str(self.path), "nonce": self.nonce}

    def next_stream(self) -> int:
        with self._lock:
            return next(self._streams)

    def close(self) -> None:
        """Remove the directory (slot files mapped by readers stay valid for them) and unlock."""
        with self._lock:
            fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(fd)


def ipc_size(batch: pa.RecordBatch) -> int:
    """Bytes of ``batch`` as one IPC stream (schema, batch, end marker), without writing it."""
    mock = pa.MockOutputStream()
    with pa.ipc.new_stream(mock, batch.schema) as writer:
        writer.write_batch(batch)
    return int(mock.size())


class Slot:
    """One slot file of a stream, mapped read-write by the executor."""

    def __init__(self, path: Path, size: int, index: int):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # reserve the pages now: ENOSPC here, not SIGBUS later
            self._mm: mmap.mmap | None = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            _unlink(path)
            raise
        os.close(fd)
        self.path, self.size, self.index = path, size, index
        self.header: np.ndarray | None = np.frombuffer(self._mm, dtype=np.int64, count=HEADER // 8)

    def state(self) -> int:
        return int(self.header[0]) if self.header is not None else FREE

    def seq(self) -> int:
        return int(self.header[1]) if self.header is not None else -1

    def write(self, batch: pa.RecordBatch, seq: int, length: int | None = None) -> int | None:
        """Write ``batch`` into the slot and mark it ``SENT`` as ``seq``: its IPC length; None (the slot
        left ``FREE``) when it does not fit. ``length``: the IPC length, when known."""
        assert self._mm is not None and self.header is not None
        room = self.size - HEADER if length is None else length
        sink = pa.FixedSizeBufferWriter(pa.py_buffer(memoryview(self._mm)[HEADER : HEADER + room]))
        try:
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
        except (pa.ArrowInvalid, OSError):  # out of room
            if length is not None:
                raise
            return None
        self.header[1] = seq
        self.header[0] = SENT  # last: the reader trusts the data once it sees SENT and seq
        return int(sink.tell())

    def close(self) -> None:
        """Unlink (if the reader has not yet) and unmap the executor's side."""
        _unlink(self.path)
        self.header = None
        mm, self._mm = self._mm, None
        if mm is not None:
            # BufferError: a view is still alive somewhere; the collector unmaps it later.
            with contextlib.suppress(BufferError):
                mm.close()


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class SlotPool:
    """The slots of one shared-memory stream (executor side; one thread uses it)."""

    def __init__(self, shm_dir: ShmDir, max_slots: int = 32, max_inflight: int = 4):
        self.dir = shm_dir
        self.stream = shm_dir.next_stream()
        self.max_slots = max(1, max_slots)
        self.max_inflight = max(1, max_inflight)
        self.slots: dict[int, Slot] = {}
        self._names = itertools.count()
        self._seq = 0
        self._largest = 0  # the largest slot size this stream needed so far
        self._no_space = False
        self.shm_batches = 0
        self.inline_batches = 0

    def inflight(self) -> int:
        """Slots sent and not yet received."""
        return sum(1 for slot in self.slots.values() if slot.state() == SENT)

    def received(self, slot: Slot, seq: int) -> bool:
        """Has the reader received batch ``seq`` of ``slot``?"""
        return slot.state() != SENT or slot.seq() != seq

    def wait(self, ready: Callable[[], bool], stop: Callable[[], bool], max_delay_s: float = 0.02) -> bool:
        """Poll until ``ready()`` (True) or ``stop()`` (False), from 0.2 ms apart, doubling up to
        ``max_delay_s`` (a reader paused for long costs ~1/max_delay_s polls a second)."""
        delay = 0.0002
        while not ready():
            if stop():
                return False
            time.sleep(delay)
            delay = min(delay * 2, max_delay_s)
        return True

    def put(self, batch: pa.RecordBatch) -> tuple[dict[str, Any], Slot] | None:
        """Write ``batch`` into a free slot: its descriptor (for the metadata) and the slot; None
        when no slot is free or there is no space (then send it inline)."""
        written, slot = None, self._free_slot(self._largest) if self._largest else None
        if slot is not None:  # a slot made for the largest batch so far mostly fits: no dry run to size it first
            written = slot.write(batch, self._seq + 1)
        if written is None:
            length = ipc_size(batch)
            slot = self._free_slot(HEADER + length)
            if slot is None:
                self.inline_batches += 1
                return None
            written = slot.write(batch, self._seq + 1, length)
        assert slot is not None and written is not None
        self._seq += 1
        self.shm_batches += 1
        return {"slot": slot.index, "file": slot.path.name, "seq": self._seq, "length": written}, slot

    def _free_slot(self, need: int) -> Slot | None:
        free = [slot for slot in self.slots.values() if slot.state() == FREE]
        fitting = [slot for slot in free if slot.size >= need]
        if fitting:
            return fitting[0]
        if self._no_space:
            return None
        if free:  # too small: replace it by a larger one (the reader drops its old mapping)
            index = free[0].index
            self.slots.pop(index).close()
        elif len(self.slots) < self.max_slots:
            index = min(set(range(self.max_slots)) - set(self.slots))
        else:
            return None
        # A quarter more than the largest batch so far: later batches may be a bit larger, and a slot
        # made for a task's short last batch must not be replaced (unlinked, re-made, faulted in
        # again) by the next full one.
        self._largest = max(self._largest, need)
        size = -(-(self._largest + self._largest // 4) // (1 << 16)) << 16
        path = self.dir.path / f"s{self.stream}-{index}-{next(self._names)}"
        try:
            slot = self.slots[index] = Slot(path, size, index)
        except OSError as exc:
            log.warning("shared memory: cannot create %s (%d bytes): %s; sending inline", path, size, exc)
            self._no_space = True
            return None
        return slot

    def close(self) -> None:
        """Unlink and unmap every slot (readers keep what they mapped)."""
        for slot in self.slots.values():
            slot.close()
        self.slots = {}
