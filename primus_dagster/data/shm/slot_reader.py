"""The reader's side of the shared-memory fast path (protocol and lifecycle: ``docs/shared_memory.md``).

:func:`connect_shm` does the handshake with one executor (loopback or unix-socket address, the
executor serves ``shm-info``, the probe nonce matches); the :class:`ShmClient` it returns reads
the batches of one ``DoGet`` stream out of the executor's slot files, zero-copy.

Example::

    shm = connect_shm(location, client, options)          # None: use the plain Flight path
    stream = client.do_get(fl.Ticket(encode_ticket(trainer, shm=shm is not None)), options)
    meta, desc = split_meta(chunk.app_metadata)
    batch = shm.read(desc) if desc is not None else chunk.data
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from primus_dagster.data.shm.slots import FREE, HEADER, PROBE_NAME, RECEIVED, SENT, SHM_ACTION, remove_if_dead

log = logging.getLogger(__name__)


class ShmError(RuntimeError):
    """A shared-memory batch could not be read (its slot file is gone: the executor died or ended
    the stream); the reader treats the stream as broken."""


def is_local(location: str) -> bool:
    """Is ``location`` a loopback or unix-socket Flight address?

    >>> is_local("grpc://127.0.0.1:7000"), is_local("grpc+unix:///tmp/x.sock"), is_local("grpc://10.0.0.5:1")
    (True, True, False)
    """
    parts = urlsplit(location)
    if parts.scheme.endswith("unix"):
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connect_shm(location: str, client: fl.FlightClient, options: fl.FlightCallOptions) -> ShmClient | None:
    """A :class:`ShmClient` for a stream from the executor at ``location``, or None when the
    shared-memory path does not apply (not local, not supported or disabled there, other host)."""
    if not is_local(location):
        return None
    try:
        results = list(client.do_action(fl.Action(SHM_ACTION, b""), options))
        info = json.loads(results[0].body.to_pybytes())
        directory = Path(info["dir"])
        if (directory / PROBE_NAME).read_text() != info["nonce"]:
            return None
    except fl.FlightUnauthenticatedError:
        raise
    except (
        fl.FlightError,
        pa.ArrowException,
        NotImplementedError,
        OSError,
        ValueError,
        KeyError,
        IndexError,
        TypeError,
    ) as exc:  # an executor without shm-info (older) raises NotImplementedError
        log.debug("no shared memory with %s: %s", location, exc)
        return None
    return ShmClient(directory)


class _Mapping:
    """A slot file mapped read-write (the header is written back); unlinked once mapped."""

    def __init__(self, path: Path):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise ShmError(f"shared-memory slot {path} is gone: {exc}") from None
        try:
            self.mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # the mapping stays valid; no file is left behind, whoever dies
        self.size = len(self.mm)
        self.header = np.frombuffer(self.mm, dtype=np.int64, count=HEADER // 8)
        self.address = pa.py_buffer(self.mm).address


class _Lease:
    """Held by the buffers of one batch; frees its slot once the last of them is gone."""

    __slots__ = ("mapping", "seq")

    def __init__(self, mapping: _Mapping, seq: int):
        self.mapping, self.seq = mapping, seq

    def __del__(self) -> None:
        try:
            header = self.mapping.header
            if int(header[1]) == self.seq:
                header[0] = FREE
        except Exception:  # interpreter shutdown: nobody reuses the slot anyway
            pass


class ShmClient:
    """Reads one stream's shared-memory batches (one thread uses it)."""

    def __init__(self, directory: Path):
        self.dir = directory
        self._maps: dict[int, tuple[str, _Mapping]] = {}
        self.batches = 0

    def read(self, desc: dict[str, Any]) -> pa.RecordBatch:
        """The batch ``desc`` (the metadata's ``shm`` descriptor) names, zero-copy; its slot is
        marked received now and free once the batch (and every view of it) is gone."""
        try:
            index, name, seq, length = int(desc["slot"]), str(desc["file"]), int(desc["seq"]), int(desc["length"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad shared-memory descriptor {desc!r}: {exc}") from None
        if "/" in name or name.startswith("."):
            raise ValueError(f"bad shared-memory slot name {name!r}")
        known = self._maps.get(index)
        if known is None or known[0] != name:  # a new or replaced slot: drop the old mapping
            known = self._maps[index] = (name, _Mapping(self.dir / name))
        mapping = known[1]
        header = mapping.header
        if int(header[0]) != SENT or int(header[1]) != seq or HEADER + length > mapping.size:
            raise ShmError(
                f"shared-memory slot {name} does not hold batch {seq} (state {int(header[0])}, seq {int(header[1])})"
            )
        header[0] = RECEIVED
        buffer = pa.foreign_buffer(mapping.address + HEADER, length, base=_Lease(mapping, seq))
        batch = pa.ipc.open_stream(buffer).read_next_batch()
        self.batches += 1
        return batch

    def sweep(self, patience_s: float = 2.0) -> None:
        """After a broken stream: remove the executor's directory once the executor is dead. In the
        background, for up to ``patience_s``: a SIGKILLed process's sockets may close (and break
        the stream) before its lock is released."""

        def run() -> None:
            deadline = time.monotonic() + patience_s
            while not remove_if_dead(self.dir) and self.dir.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

        threading.Thread(target=run, name="shm-sweep", daemon=True).start()

    def close(self) -> None:
        """Forget the mappings (each lives on while a batch read from it does)."""
        self._maps.clear()
