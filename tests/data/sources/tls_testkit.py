"""A TLS listener in front of the embedded broker, and throwaway certificates: test-only code (imported as
``tls_testkit`` by the Kafka security tests, like ``native_testkit``; nothing of the product imports it).

tansu 0.6 serves PLAINTEXT only, so a TLS test puts :class:`TlsFront` (an asyncio TLS-terminating
TCP proxy on loopback) in front of it. Kafka clients connect to the brokers the metadata names after
bootstrapping, so the broker must advertise the front's address: :func:`tls_broker` binds the front
first, then starts an :class:`~primus_dagster.devtools.kafka_broker.EmbeddedBroker` that advertises it.
:func:`write_test_certificates` writes a CA, a server certificate for ``127.0.0.1`` signed by it,
and an unrelated CA (for wrong-CA tests), with ``cryptography``.

Example::

    pki = write_test_certificates(tmp_path)
    with tls_broker(pki) as (broker, front):
        front.bootstrap_servers          # "127.0.0.1:40125": TLS, trusted with pki.ca
        create_topic(front.bootstrap_servers, "events", client_config=front_client_config(pki))

Every client goes through the front (the broker's metadata names it): a PLAINTEXT client bootstrapping at
``broker.bootstrap_servers`` is sent on to the front and fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import logging
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus_dagster.devtools.kafka_broker import BrokerError, EmbeddedBroker
from primus_dagster.ports import free_port

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DevCertificates:
    """PEM files of a throwaway PKI: ``ca`` signed ``server_cert`` (key ``server_key``); ``other_ca`` signed nothing."""

    ca: Path
    server_cert: Path
    server_key: Path
    other_ca: Path


def write_test_certificates(directory: str | Path, host: str = "127.0.0.1") -> DevCertificates:
    """A CA, a server certificate for ``host`` (an IP or a DNS name, in the SAN) and an unrelated CA in ``directory``.

    Example::

        pki = write_test_certificates(tmp_path)      # tmp_path/ca.pem, server.pem, server.key, other-ca.pem
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def ca(cn: str) -> tuple[Any, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(key, hashes.SHA256())
        )
        return key, cert

    ca_key, ca_cert = ca("primus test CA")
    _, other_cert = ca("primus unrelated CA")
    try:
        san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        san = x509.DNSName(host)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(name(host))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    pki = DevCertificates(out / "ca.pem", out / "server.pem", out / "server.key", out / "other-ca.pem")
    pki.ca.write_bytes(ca_cert.public_bytes(pem))
    pki.other_ca.write_bytes(other_cert.public_bytes(pem))
    pki.server_cert.write_bytes(server_cert.public_bytes(pem))
    pki.server_key.write_bytes(
        server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return pki


class TlsFront:
    """A TLS-terminating TCP proxy on loopback: TLS in on :attr:`port`, plain TCP out to ``upstream``.

    The port is bound in the constructor (so a broker can advertise it before the front serves);
    :meth:`start` serves on an asyncio loop in a daemon thread, :meth:`stop` closes every connection.

    Example::

        front = TlsFront(certfile, keyfile)          # bound: front.port is known
        front.upstream = ("127.0.0.1", broker_port)
        with front:                                  # start() ... stop()
            ...
    """

    def __init__(
        self,
        certfile: str | Path,
        keyfile: str | Path,
        upstream: tuple[str, int] | None = None,
        host: str = "127.0.0.1",
        handshake_timeout_s: float = 5.0,
    ) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(certfile), str(keyfile))
        self.upstream = upstream
        self.host, self.handshake_timeout_s = host, handshake_timeout_s
        self._sock = socket.create_server((host, 0))
        self.port: int = self._sock.getsockname()[1]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        assert self.upstream is not None, "TlsFront.upstream is not set"
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 5.0)
        except (OSError, TimeoutError):
            client_writer.close()
            return
        self._writers.update((client_writer, up_writer))
        try:
            await asyncio.gather(self._pipe(client_reader, up_writer), self._pipe(up_reader, client_writer))
        finally:
            self._writers.difference_update((client_writer, up_writer))

    def _serve(self, started: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        # A client refusing our certificate is the point of some tests: not an error of the front.
        loop.set_exception_handler(lambda _loop, ctx: log.debug("TLS front: %s", ctx.get("message")))

        async def main() -> None:
            server = await asyncio.start_server(
                self._handle, sock=self._sock, ssl=self.context, ssl_handshake_timeout=self.handshake_timeout_s
            )
            started.set()
            async with server:
                while not self._stopped.is_set():
                    await asyncio.sleep(0.05)
                for writer in list(self._writers):
                    writer.close()

        try:
            loop.run_until_complete(main())
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            started.set()
            loop.close()

    def start(self) -> TlsFront:
        """Serve in a daemon thread; returns ``self`` once the listener accepts."""
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="tls-front", daemon=True)
        self._thread.start()
        if not started.wait(10.0):
            raise BrokerError(f"TLS front on {self.bootstrap_servers} did not start in 10s")
        return self

    def stop(self) -> None:
        """Close the listener and every connection (waits at most 10 s). Idempotent."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None
        self._sock.close()

    def __enter__(self) -> TlsFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def front_client_config(pki: DevCertificates) -> dict[str, Any]:
    """kafka-python keyword arguments of a client of the front (producers, admin clients of a test)."""
    return {"security_protocol": "SSL", "ssl_cafile": str(pki.ca)}


@contextlib.contextmanager
def tls_broker(pki: DevCertificates, log_path: str | None = None) -> Iterator[tuple[EmbeddedBroker, TlsFront]]:
    """An embedded broker behind a :class:`TlsFront` that it advertises; both stopped on exit.

    Example::

        with tls_broker(write_test_certificates(tmp_path)) as (broker, front):
            spec = {..., "bootstrap_servers": front.bootstrap_servers, "security_protocol": "SSL",
                    "ssl_cafile": str(pki.ca)}
    """
    front = TlsFront(pki.server_cert, pki.server_key)
    broker_port = free_port()
    front.upstream = ("127.0.0.1", broker_port)
    broker = EmbeddedBroker(
        port=broker_port, log_path=log_path, advertised=front.bootstrap_servers, client_config=front_client_config(pki)
    )
    with front, broker:
        yield broker, front
