"""The ranks' transport: an all-gather of byte messages of any length, one call a round.

:class:`PeerMesh` (direct sockets between the ranks, on one host or across hosts) and :class:`GlooBytes`
(the same through gloo) both satisfy :class:`ByteAllGather`, what
:class:`~primus_dagster.training.distributed.rounds.RankLoop` sends its rounds through.

Example::

    mesh = PeerMesh.connect(timeout_s=300)          # every rank, after init_process_group
    messages = mesh.all_gather(torch.tensor([1, 2, 3], dtype=torch.uint8))   # in rank order
    mesh.close()
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import selectors
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

#: The address a rank listens on for its peers (:func:`rank_address`).
RANK_ADDR_ENV = "PRIMUS_RANK_ADDR"


class ByteAllGather(Protocol):
    """Byte messages of any length between the ranks of the default group, in rank order (collectives)."""

    def all_gather(self, message: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``message`` (1-D uint8, contiguous; lengths may differ), in rank order."""
        ...

    def all_to_all(self, messages: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``messages[r]`` to rank ``r``; what every rank sent this one, in rank order."""
        ...

    def close(self) -> None:
        """Release the connections (also released when the process exits)."""
        ...


class PeerMesh:
    """All-gather of byte messages of any length over direct TCP connections between the ranks of the
    default group, on one host or across hosts (every rank listens on its :func:`rank_address`).

    Why not gloo: a gloo collective hands the work to its own threads (the caller's, a worker's, the
    TCP loop's) and costs a fixed CPU time per call whatever its size, and its buffers have one size for
    all, so a round needed a status all-gather, then the payload padded to the longest (the figures:
    docs/training.md, "Multi-trainer jobs"). Here the calling thread sends its frame (8-byte length +
    message) to every peer and reads theirs, non-blocking, in one ``select`` loop: one exchange per round,
    nothing padded, no other thread. Setup: every rank listens on its :func:`rank_address`, the addresses,
    ports and rank 0's random token go round in one gloo all-gather, rank ``r`` connects to the lower ranks
    and accepts the higher ones (which must present the token). A peer that exits closes its sockets: the
    others raise ConnectionError naming it; no message within ``timeout_s``: TimeoutError.

    Example::

        mesh = PeerMesh.connect(timeout_s=300)          # every rank, after init_process_group
        messages = mesh.all_gather(torch.tensor([1, 2, 3], dtype=torch.uint8))   # in rank order
    """

    def __init__(self, socks: Mapping[int, socket.socket], rank: int, timeout_s: float):
        self.socks, self.rank, self.timeout_s = dict(socks), rank, timeout_s
        self._selector = selectors.DefaultSelector()
        for sock in self.socks.values():
            sock.setblocking(False)

    @staticmethod
    def connect(timeout_s: float, *, gloo: bool = False) -> PeerMesh | GlooBytes:
        """Connect every rank of the default group to every other (collective); ``gloo=True``: no sockets
        of its own, the messages go through gloo (:class:`GlooBytes`)."""
        if gloo:
            return GlooBytes()
        rank, world = dist.get_rank(), dist.get_world_size()
        address = rank_address()
        with socket.create_server((address, 0), backlog=max(1, world)) as listener:
            listener.settimeout(timeout_s)
            info: list[Any] = [None] * world
            dist.all_gather_object(info, (address, listener.getsockname()[1], secrets.token_hex(16)))
            key = info[0][2].encode()
            socks: dict[int, socket.socket] = {}
            for peer in range(rank):
                sock = socket.create_connection((info[peer][0], info[peer][1]), timeout=timeout_s)
                sock.sendall(key + struct.pack("<q", rank))
                socks[peer] = sock
            while len(socks) < world - 1:
                sock, _ = listener.accept()
                sock.settimeout(timeout_s)
                hello = _recv_exact(sock, len(key) + 8)
                peer = struct.unpack("<q", hello[len(key) :])[0]
                if hello[: len(key)] != key or not rank < peer < world or peer in socks:
                    sock.close()  # not one of this group's ranks
                    continue
                socks[peer] = sock
        for sock in socks.values():
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return PeerMesh(socks, rank, timeout_s)

    def all_gather(self, message: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``message`` (1-D uint8, contiguous; lengths may differ), in rank order; this
        rank's is ``message`` itself."""
        return self.all_to_all([message] * (len(self.socks) + 1))

    def all_to_all(self, messages: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``messages[r]`` to rank ``r`` (1-D uint8, contiguous; lengths may differ), and what every rank
        sent this one, in rank order; this rank's own is ``messages[rank]`` itself."""
        if len(messages) != len(self.socks) + 1:
            raise ValueError(f"{len(messages)} messages for a group of {len(self.socks) + 1}")
        bodies_out = {peer: messages[peer].numpy().data for peer in self.socks}
        prefixes = {peer: struct.pack("<q", len(body)) for peer, body in bodies_out.items()}
        frames = {peer: 8 + len(body) for peer, body in bodies_out.items()}
        sent = dict.fromkeys(self.socks, 0)
        heads = {peer: bytearray(8) for peer in self.socks}
        got = dict.fromkeys(self.socks, 0)
        bodies: dict[int, torch.Tensor] = {}
        out: dict[int, torch.Tensor] = {self.rank: messages[self.rank]}
        for peer, sock in self.socks.items():  # a frame usually fits the socket buffer: no select for it
            sent[peer] = self._send(peer, sock, prefixes[peer], bodies_out[peer], 0)
        selector = self._selector
        for peer, sock in self.socks.items():
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if sent[peer] < frames[peer] else 0)
            selector.register(sock, events, peer)
        deadline = time.monotonic() + self.timeout_s
        try:
            while selector.get_map():
                ready = selector.select(max(0.0, deadline - time.monotonic()))
                if not ready:
                    missing = sorted(p for p in self.socks if p not in out or sent[p] < frames[p])
                    raise TimeoutError(
                        f"rank {self.rank}: ranks {missing} exchanged nothing within {self.timeout_s:g}s"
                    )
                for key, mask in ready:
                    peer = key.data
                    sock = self.socks[peer]
                    if mask & selectors.EVENT_WRITE:
                        sent[peer] = self._send(peer, sock, prefixes[peer], bodies_out[peer], sent[peer])
                    if mask & selectors.EVENT_READ:
                        got[peer] = self._receive(peer, sock, heads[peer], got[peer], bodies, out)
                    events = (selectors.EVENT_READ if peer not in out else 0) | (
                        selectors.EVENT_WRITE if sent[peer] < frames[peer] else 0
                    )
                    if not events:
                        selector.unregister(sock)
                    elif events != key.events:
                        selector.modify(sock, events, peer)
        finally:
            for registered in list(selector.get_map().values()):
                selector.unregister(registered.fileobj)
        return [out[r] for r in range(len(self.socks) + 1)]

    def _send(self, peer: int, sock: Any, prefix: bytes, body: memoryview, sent: int) -> int:
        views = [prefix[sent:], body] if sent < 8 else [body[sent - 8 :]]
        try:
            return sent + sock.sendmsg(views)
        except BlockingIOError:
            return sent
        except OSError as exc:
            raise ConnectionError(f"rank {self.rank}: rank {peer} is gone (it failed or exited): {exc}") from exc

    def _receive(
        self, peer: int, sock: Any, head: bytearray, got: int, bodies: dict[int, torch.Tensor], out: dict[int, Any]
    ) -> int:
        """Read what is there of ``peer``'s frame (``got`` bytes of it read so far); into ``out`` once whole."""
        while peer not in out:
            if got < 8:
                view, offset = memoryview(head), got
            else:
                if peer not in bodies:
                    bodies[peer] = torch.empty(struct.unpack("<q", head)[0], dtype=torch.uint8)
                view, offset = bodies[peer].numpy().data, got - 8
                if offset == len(view):
                    out[peer] = bodies.pop(peer)
                    break
            try:
                n = sock.recv_into(view[offset:])
            except BlockingIOError:
                break
            except OSError as exc:
                raise ConnectionError(f"rank {self.rank}: rank {peer} is gone (it failed or exited): {exc}") from exc
            if n == 0:
                raise ConnectionError(f"rank {self.rank}: rank {peer} is gone (it failed or exited): connection closed")
            got += n
        return got

    def close(self) -> None:
        self._selector.close()
        for sock in self.socks.values():
            sock.close()


class GlooBytes:
    """:class:`PeerMesh` through gloo (``pools.training.transport: gloo``): two gloo all-gathers, the lengths,
    then the messages padded to the longest (an all-to-all: the lengths, then the messages, over gloo's
    ``all_to_all_single``)."""

    def all_gather(self, message: torch.Tensor) -> list[torch.Tensor]:
        world = dist.get_world_size()
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([message.numel()], dtype=torch.int64))
        padded = torch.zeros(max(int(n) for n in sizes), dtype=torch.uint8)
        padded[: message.numel()] = message
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded)
        return [g[: int(n)] for g, n in zip(gathered, sizes, strict=True)]

    def all_to_all(self, messages: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        sizes = torch.tensor([m.numel() for m in messages], dtype=torch.int64)
        received = torch.empty_like(sizes)
        dist.all_to_all_single(received, sizes)
        out = torch.empty(int(received.sum()), dtype=torch.uint8)
        dist.all_to_all_single(out, torch.cat(list(messages)), received.tolist(), sizes.tolist())
        return list(torch.split(out, received.tolist()))

    def close(self) -> None:
        pass


def rank_address() -> str:
    """The address this rank's peers reach it at: ``$PRIMUS_RANK_ADDR`` (set by
    :class:`~primus_dagster.training.distributed.RankProcesses` for the ranks it starts; a pod sets its own),
    else loopback when the rendezvous (``$MASTER_ADDR``, torchrun's) is on this host or unset, else this
    host's address on the route to it."""
    if explicit := os.environ.get(RANK_ADDR_ENV):
        return explicit
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        if ipaddress.ip_address(socket.gethostbyname(master)).is_loopback:
            return "127.0.0.1"
    except (OSError, ValueError):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent: it picks the route
        probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
        return probe.getsockname()[0]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("a peer closed its connection during the handshake")
        data += chunk
    return data
