"""The rank channel: ranks that someone else starts (a pod, a plain process) dial back to the parent.

A :class:`DialBackLauncher` is the :class:`~.launch.RankLauncher` of such ranks. Per start of a group it
listens on ``host:port`` (the *channel*; ``advertise``: the address the ranks dial, e.g. the step pod's
IP), starts each rank through its ``start(rank, environment) -> RankHandle`` callable -- ``environment``:
torchrun's rendezvous variables (``MASTER_ADDR`` ..., :func:`~.launch.rank_environment`) and the channel
address (``$PRIMUS_RANK_CHANNEL``) -- and waits for every rank to dial back. A rank (``python -m
primus_dagster.training.distributed.dial_back --channel HOST:PORT --rank R``, :func:`dial_back`)
connects, both sides prove they hold the channel key (``multiprocessing.connection``'s HMAC challenge,
each way), the rank says its number and the parent answers with what a spawned rank gets by pickling
(``target``, ``rank``, ``environment``, ``init_method``, ``args``); the rank then runs it as a spawned
rank does (:func:`~.launch.rank_entry`) and its outbox is that connection, so the parent reads it with the
same :class:`~.launch.RankInbox`. The listening socket is closed once every rank has dialed back.

Every wait is bounded and every failure names the channel: a rank that never dials back
(:class:`ChannelTimeoutError` after ``dial_timeout_s``), a rank that exits first, a connection with the
wrong key (refused, and named in the error of the rank it leaves missing), a parent that is not there.
The key comes from ``$PRIMUS_RANK_CHANNEL_KEY`` (a Secret reference in a pod), never the command line;
it guards the pickles both ways. A dial-back rank is no child of the parent: it stops when its channel
ends (the parent closed it, or died), where a spawned rank checks its parent's pid.

``multiprocessing.connection``'s ``Listener`` and ``Client`` are not used as they are: their ``accept``,
``connect`` and handshake have no timeout, so a silent peer would hang either side. The sockets here are
bounded (``SO_RCVTIMEO`` during the handshake, then cleared) and the handshake is theirs
(``deliver_challenge`` / ``answer_challenge``) on the same :class:`~multiprocessing.connection.Connection`.

Example (two ranks as plain processes on this host, standing for two hosts)::

    launcher = DialBackLauncher.local(["127.0.0.1", "127.0.0.2"])
    with RankProcesses(worker, 2, plan, launcher=launcher) as ranks:
        results = collect_results(ranks, timeout_s=600)
"""

from __future__ import annotations

import logging
import os
import secrets
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from multiprocessing import AuthenticationError
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from typing import Any

from primus_dagster.ports import free_port
from primus_dagster.training.distributed.launch import INIT_METHOD, RankHandle, rank_entry, rank_environment

log = logging.getLogger(__name__)

#: The channel a dial-back rank reaches its parent at (``HOST:PORT``).
CHANNEL_ENV = "PRIMUS_RANK_CHANNEL"
#: The channel key (a Secret reference in a pod; never on the command line).
CHANNEL_KEY_ENV = "PRIMUS_RANK_CHANNEL_KEY"
#: What a dial-back rank runs: ``python -m DIAL_BACK_MODULE --channel HOST:PORT --rank R``.
DIAL_BACK_MODULE = "primus_dagster.training.distributed.dial_back"
#: The exit code of a rank that could not reach its parent (no channel key, refused, no answer).
CHANNEL_ERROR_EXIT = 2
#: The exit code of a rank whose channel ended while it ran (its parent closed it, or is gone).
PARENT_GONE_EXIT = 3

RankStarter = Callable[[int, Mapping[str, str]], RankHandle]
Rendezvous = Callable[[int], Sequence[Mapping[str, str]]]


class ChannelError(RuntimeError):
    """A rank and its parent could not meet on the rank channel (the message names the rank and the channel).

    Example::

        raise ChannelError("trainer rank 1 exited with code 2 before dialing back to the rank channel 10.0.0.5:41234")
    """


class ChannelTimeoutError(ChannelError, TimeoutError):
    """A wait on the rank channel ran past its bound.

    Example::

        raise ChannelTimeoutError("trainer rank(s) [1] did not dial back to the rank channel 10.0.0.5:41234 within 300s")
    """


class _Refused(Exception):
    """A connection the parent turned away (wrong key, no hello, a rank that is not expected)."""


def parse_channel(channel: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as ``(host, port)``; ValueError naming it otherwise.

    >>> parse_channel("10.0.0.5:41234"), parse_channel("[::1]:80")
    (('10.0.0.5', 41234), ('::1', 80))
    """
    host, sep, port = channel.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"rank channel {channel!r} is not HOST:PORT")
    return host, int(port)


def channel_address(host: str, port: int) -> str:
    """``host:port`` as :func:`parse_channel` reads it back (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1_000_000))


@contextmanager
def _bounded(sock: socket.socket, timeout_s: float) -> Iterator[None]:
    """Every blocking read and write on ``sock`` (and its dups) fails after ``timeout_s`` inside the block
    (an ``OSError``), none after it. A socket-level bound, so a ``Connection`` on the same descriptor
    stays a plain blocking one."""
    bound = _timeval(max(timeout_s, 0.001))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, bound)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, bound)
    try:
        yield
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(0))


def _refusals(refused: Sequence[str]) -> str:
    return f" (connections refused: {'; '.join(refused)})" if refused else ""


class ProcessRank:
    """A :class:`~.launch.RankHandle` of a rank started as a plain process on this host.

    Example::

        rank = ProcessRank(subprocess.Popen([sys.executable, "-m", DIAL_BACK_MODULE, "--channel", channel, "--rank", "0"]))
        rank.is_alive(), rank.pid
    """

    def __init__(self, process: subprocess.Popen[bytes]):
        self.process = process

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        if self.is_alive():
            self.process.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self.process.kill()

    def join(self, timeout: float | None = None) -> None:
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)


class ProcessStarter:
    """Starts a dial-back rank as a plain process here: ``python -m primus_dagster.training.distributed.dial_back
    --channel $PRIMUS_RANK_CHANNEL --rank R``, with this process's environment, ``env``, the rank's
    ``environment`` and the key in ``$PRIMUS_RANK_CHANNEL_KEY``.

    Example::

        key = secrets.token_urlsafe(32)
        launcher = DialBackLauncher(ProcessStarter(key), authkey=key)
    """

    def __init__(
        self,
        authkey: str,
        *,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        dial_timeout_s: float = 120.0,
    ):
        self.authkey, self.python, self.env, self.dial_timeout_s = authkey, python, dict(env or {}), dial_timeout_s

    def __call__(self, rank: int, environment: Mapping[str, str]) -> ProcessRank:
        env = {**os.environ, **self.env, **environment, CHANNEL_KEY_ENV: self.authkey}
        channel = environment[CHANNEL_ENV]
        command = [self.python, "-m", DIAL_BACK_MODULE, "--channel", channel, "--rank", str(rank)]
        command += ["--timeout-s", f"{self.dial_timeout_s:g}"]
        return ProcessRank(subprocess.Popen(command, env=env))


class DialBackLauncher:
    """A :class:`~.launch.RankLauncher` whose ranks are started by ``start(rank, environment)`` and dial
    back to a channel this process listens on (module docstring).

    ``authkey``: the channel key (the ranks must get it through ``$PRIMUS_RANK_CHANNEL_KEY``: ``start``'s
    business); ``host`` / ``port``: where the channel listens (default loopback, a free port); ``advertise``:
    the address the ranks dial (default ``host``; required when ``host`` is a wildcard); ``rendezvous``:
    world size -> each rank's torchrun variables (default: :func:`~.launch.rank_environment` on
    ``addresses``, rank 0's address and a free port there, as :class:`~.launch.SpawnLauncher` does);
    ``release``: called once the ranks of a start are stopped (what ``start`` made for them);
    ``dial_timeout_s``: how long the ranks of a start may take to dial back (a pod's scheduling and image
    pull included); ``handshake_timeout_s``: the bound on one connection's handshake.

    Example::

        key = secrets.token_urlsafe(32)
        launcher = DialBackLauncher(ProcessStarter(key), authkey=key, addresses=["127.0.0.1", "127.0.0.2"])
        with RankProcesses(worker, 2, plan, launcher=launcher) as ranks:
            ...
    """

    children = False

    def __init__(
        self,
        start: RankStarter,
        *,
        authkey: str,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        addresses: Sequence[str] | None = None,
        rendezvous: Rendezvous | None = None,
        release: Callable[[], None] | None = None,
        dial_timeout_s: float = 120.0,
        handshake_timeout_s: float = 10.0,
    ):
        if not authkey:
            raise ValueError("a rank channel needs a key")
        if advertise is None and host in ("", "0.0.0.0", "::"):
            raise ValueError(f"the rank channel listens on {host or 'every address'}: give the address ranks dial")
        if addresses is not None and rendezvous is not None:
            raise ValueError("give the rank addresses or a rendezvous, not both")
        self.start_rank, self.authkey = start, authkey.encode()
        self.host, self.port, self.advertise = host, port, advertise or host
        self.addresses = list(addresses) if addresses is not None else None
        self.rendezvous = rendezvous
        self.dial_timeout_s, self.handshake_timeout_s = dial_timeout_s, handshake_timeout_s
        self._release = release

    @classmethod
    def local(
        cls,
        addresses: Sequence[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        dial_timeout_s: float = 120.0,
    ) -> DialBackLauncher:
        """Dial-back ranks as plain processes on this host (:class:`ProcessStarter`, a fresh key),
        listening on ``addresses`` (default loopback for all; distinct loopback addresses stand for hosts)."""
        key = secrets.token_urlsafe(32)
        starter = ProcessStarter(key, env=env, dial_timeout_s=dial_timeout_s)
        return cls(starter, authkey=key, addresses=addresses, dial_timeout_s=dial_timeout_s)

    def environments(self, world_size: int) -> list[dict[str, str]]:
        """Each rank's torchrun variables (``rendezvous``, else on ``addresses``)."""
        if self.rendezvous is not None:
            envs = [dict(e) for e in self.rendezvous(world_size)]
            if len(envs) != world_size:
                raise ValueError(f"the rendezvous gave {len(envs)} rank environments for a group of {world_size}")
            return envs
        addresses = self.addresses if self.addresses is not None else ["127.0.0.1"] * world_size
        if len(addresses) != world_size:
            raise ValueError(f"{len(addresses)} rank addresses for a group of {world_size}")
        master, port = addresses[0], free_port(addresses[0])
        return [rank_environment(r, world_size, master, port, addresses[r]) for r in range(world_size)]

    def start(
        self, target: Callable[..., None], args: tuple[Any, ...], *, world_size: int, name: str, procs: list[Any]
    ) -> list[Connection]:
        """Listen, start every rank, and return each rank's connection once all dialed back (module docstring)."""
        environments = self.environments(world_size)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.create_server((self.host, self.port), family=family, backlog=max(8, 2 * world_size)) as listener:
            listener.setblocking(False)
            channel = channel_address(self.advertise, listener.getsockname()[1])
            for rank in range(world_size):
                environments[rank][CHANNEL_ENV] = channel
                procs.append(self.start_rank(rank, dict(environments[rank])))
            log.info("%s: %d rank(s) started, waiting for them on the rank channel %s", name, world_size, channel)
            return self._accept(listener, channel, target, args, environments, procs)

    def release(self) -> None:
        if self._release is not None:
            self._release()

    def _accept(
        self,
        listener: socket.socket,
        channel: str,
        target: Callable[..., None],
        args: tuple[Any, ...],
        environments: list[dict[str, str]],
        procs: list[Any],
    ) -> list[Connection]:
        world = len(environments)
        conns: list[Connection | None] = [None] * world
        refused: list[str] = []
        deadline = time.monotonic() + self.dial_timeout_s
        try:
            while None in conns:
                missing = [r for r, conn in enumerate(conns) if conn is None]
                ended = {r: code for r in missing if (code := procs[r].exitcode) is not None}
                if ended:
                    rank, code = min(ended.items())
                    raise ChannelError(
                        f"trainer rank {rank} exited with code {code} before dialing back to the rank channel "
                        f"{channel}{_refusals(refused)}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeoutError(
                        f"trainer rank(s) {missing} did not dial back to the rank channel {channel} within "
                        f"{self.dial_timeout_s:g}s{_refusals(refused)}"
                    )
                readable, _, _ = select.select([listener], [], [], min(left, 0.2))
                if not readable:
                    continue
                try:
                    sock, peer = listener.accept()
                except BlockingIOError:  # the connection went away between select and accept
                    continue
                sock.setblocking(True)
                try:
                    conn, rank = self._admit(sock, conns)
                except _Refused as exc:
                    refused.append(f"{peer[0]}:{peer[1]} {exc}")
                    log.warning("rank channel %s: refused a connection from %s:%s: %s", channel, peer[0], peer[1], exc)
                    continue
                conn.send(("run", target, rank, environments[rank], INIT_METHOD, args))
                conns[rank] = conn
        except BaseException:
            for accepted in conns:
                if accepted is not None:
                    accepted.close()
            raise
        return [accepted for accepted in conns if accepted is not None]

    def _admit(self, sock: socket.socket, conns: list[Connection | None]) -> tuple[Connection, int]:
        """Authenticate one connection both ways and read the rank it says it is; _Refused otherwise."""
        try:
            with _bounded(sock, self.handshake_timeout_s):
                conn = Connection(os.dup(sock.fileno()))
                try:
                    mp_connection.deliver_challenge(conn, self.authkey)
                    mp_connection.answer_challenge(conn, self.authkey)
                    if not conn.poll(self.handshake_timeout_s):
                        raise _Refused(f"said nothing within {self.handshake_timeout_s:g}s")
                    hello = conn.recv()
                    rank = hello[1] if isinstance(hello, tuple) and len(hello) == 2 and hello[0] == "hello" else None
                    if not isinstance(rank, int) or not 0 <= rank < len(conns) or conns[rank] is not None:
                        conn.send(("refused", f"rank {rank!r} is not one this group waits for"))
                        raise _Refused(f"said it is rank {rank!r}, which this group does not wait for")
                except AuthenticationError:
                    conn.close()
                    raise _Refused("with a wrong channel key") from None
                except _Refused:
                    conn.close()
                    raise
                except Exception as exc:  # a torn or foreign handshake: a timeout, EOF, garbage
                    conn.close()
                    raise _Refused(f"broke off the handshake ({type(exc).__name__}: {exc})") from None
        finally:
            sock.close()
        return conn, rank


def _connect(host: str, port: int, rank: int, channel: str, deadline: float, timeout_s: float) -> socket.socket:
    """A TCP connection to the channel, retried until ``deadline`` (a pod's route or DNS may come late)."""
    while True:
        left = deadline - time.monotonic()
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(left, 10.0)))
            sock.settimeout(None)  # a blocking descriptor for the Connection; bounded by _bounded instead
            return sock
        except OSError as exc:
            if deadline - time.monotonic() <= 0:
                raise ChannelTimeoutError(
                    f"rank {rank}: cannot reach the rank channel {channel} within {timeout_s:g}s "
                    f"({type(exc).__name__}: {exc})"
                ) from None
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def dial_back(channel: str, rank: int, authkey: str, *, timeout_s: float = 300.0) -> tuple[Connection, tuple[Any, ...]]:
    """The rank's side: connect to ``channel``, authenticate both ways, say ``rank``, receive the work;
    returns the connection (the rank's outbox from now on) and ``(target, environment, init_method, args)``.
    :class:`ChannelError` naming the channel when the parent is not there, refuses the key or the rank,
    or does not answer within ``timeout_s`` in all.

    Example::

        conn, work = dial_back("10.0.0.5:41234", 1, os.environ["PRIMUS_RANK_CHANNEL_KEY"])
        serve_dialed(conn, 1, work)
    """
    host, port = parse_channel(channel)
    deadline = time.monotonic() + timeout_s
    sock = _connect(host, port, rank, channel, deadline, timeout_s)
    key = authkey.encode()
    try:
        with _bounded(sock, max(0.1, deadline - time.monotonic())):
            conn = Connection(os.dup(sock.fileno()))
            try:
                mp_connection.answer_challenge(conn, key)
                mp_connection.deliver_challenge(conn, key)
                conn.send(("hello", rank))
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise ChannelTimeoutError(
                        f"rank {rank}: the rank channel {channel} sent no work within {timeout_s:g}s"
                    )
                reply = conn.recv()
            except ChannelError:
                conn.close()
                raise
            except AuthenticationError:
                conn.close()
                raise ChannelError(
                    f"rank {rank}: the rank channel {channel} refused this rank's key (${CHANNEL_KEY_ENV})"
                ) from None
            except (EOFError, OSError) as exc:
                conn.close()
                raise ChannelError(
                    f"rank {rank}: the rank channel {channel} broke off ({type(exc).__name__}: {exc})"
                ) from None
            except Exception as exc:  # the work could not be unpickled here (a target this image lacks)
                conn.close()
                raise ChannelError(
                    f"rank {rank}: cannot load the work the rank channel {channel} sent: {type(exc).__name__}: {exc}"
                ) from None
    finally:
        sock.close()
    if isinstance(reply, tuple) and reply[:1] == ("refused",):
        conn.close()
        raise ChannelError(f"rank {rank}: the rank channel {channel} refused it: {reply[1]}")
    if not (isinstance(reply, tuple) and len(reply) == 6 and reply[0] == "run" and reply[2] == rank):
        conn.close()
        raise ChannelError(f"rank {rank}: the rank channel {channel} answered something else: {type(reply).__name__}")
    _, target, _, environment, init_method, args = reply
    return conn, (target, environment, init_method, args)


def _exit_when_the_channel_ends(conn: Connection, rank: int) -> None:
    """A daemon thread: once the parent's end of ``conn`` closes (nothing else comes that way after the
    work), this rank exits -- a dial-back rank is nobody's child, so nothing else would stop it."""

    def watch() -> None:
        mp_connection.wait([conn])
        sys.stderr.write(f"trainer rank {rank}: the rank channel ended (the job process closed it or is gone)\n")
        sys.stderr.flush()
        os._exit(PARENT_GONE_EXIT)

    threading.Thread(target=watch, name=f"rank-{rank}-channel-watch", daemon=True).start()


def serve_dialed(conn: Connection, rank: int, work: tuple[Any, ...]) -> None:
    """Run the work :func:`dial_back` received as a spawned rank runs its own (:func:`~.launch.rank_entry`),
    exiting when the channel ends. Of the environment it was sent, what its starter already set wins (a
    pod's own address, its cluster's names for its peers)."""
    target, environment, init_method, args = work
    _exit_when_the_channel_ends(conn, rank)
    missing = {name: value for name, value in environment.items() if name not in os.environ}
    rank_entry(target, missing, rank, init_method, conn, *args)
