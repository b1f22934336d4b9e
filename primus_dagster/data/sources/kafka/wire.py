"""A minimal Kafka fetch client on plain sockets: the Kafka source's fast read path.

kafka-python turns every fetched record into Python objects (varints decoded one call at a
time, a ``ConsumerRecord`` each): about 6 µs per record, more than the bulk JSON decode of
the same record. This client sends Fetch requests itself (:mod:`.protocol`) and hands the
raw record batches to :mod:`.records`, which pulls out only values, offsets and timestamps.
It negotiates versions with ApiVersions, finds partition leaders with Metadata, reconnects
and refreshes leaders on retriable errors, and pipelines one fetch ahead of the caller.
It speaks PLAINTEXT, or TLS when given an ``ssl.SSLContext`` (``security_protocol: SSL``); never
SASL: the adapter reads SASL sources through kafka-python, and falls back to it when a broker
answers none of this client's versions. A failed TLS handshake is not retried.

Example::

    client = WireClient(["127.0.0.1:9092"], client_id="primus-clicks", timeout_s=30)
    reader = PartitionReader(client, "clicks", partition=0, stop=480, max_bytes=16 << 20)
    fetched = reader.fetch(120)    # Fetched(columns, next_offset, high_watermark)
    reader.close(); client.close()
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from dataclasses import dataclass

from primus_dagster.data.sources.kafka import protocol
from primus_dagster.data.sources.kafka.records import RecordColumns, read_batches

_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")


class WireError(RuntimeError):
    """A broker answered a fetch or metadata request with an error, or could not be reached."""

    def __init__(self, message: str, code: int | None = None, retriable: bool = False, log_start: int = -1):
        super().__init__(message)
        self.code, self.retriable, self.log_start = code, retriable, log_start


class WireUnsupportedError(WireError):
    """The broker answers none of the Fetch/Metadata versions this client speaks."""


def _split(server: str) -> tuple[str, int]:
    host, sep, port = server.strip().rpartition(":")
    return (host.strip("[]"), int(port)) if sep else (port, 9092)


class _Connection:
    """One broker socket: size-prefixed frames, responses matched by correlation id, in order."""

    def __init__(self, host: str, port: int, timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        self.address = f"{host}:{port}"
        raw = socket.create_connection((host, port), timeout=timeout_s)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.sock = raw if ssl_context is None else ssl_context.wrap_socket(raw, server_hostname=host)
        except BaseException:
            raw.close()
            raise
        self.next_id = 0
        self.in_flight: list[int] = []

    def send(self, frame: bytes, correlation_id: int) -> None:
        self.sock.sendall(frame)
        self.in_flight.append(correlation_id)

    def _exact(self, n: int) -> memoryview:
        view, got = memoryview(bytearray(n)), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if not k:
                raise ConnectionError(f"{self.address} closed the connection")
            got += k
        return view

    def receive(self, correlation_id: int) -> memoryview:
        """The response payload (after its correlation id) of the oldest in-flight request, which must be ours."""
        if not self.in_flight or self.in_flight[0] != correlation_id:
            raise RuntimeError(f"response {correlation_id} read out of order (in flight: {self.in_flight})")
        (size,) = _SIZE.unpack_from(self._exact(4))
        payload = self._exact(size)
        (got,) = _CORRELATION.unpack_from(payload)
        self.in_flight.pop(0)
        if got != correlation_id:
            raise ConnectionError(f"{self.address}: response {got} answers no request of ours ({correlation_id})")
        return payload[4:]

    def close(self) -> None:
        self.sock.close()


@dataclass
class Pending:
    """A request sent and not yet answered."""

    node: int
    correlation_id: int
    version: int


def _tls_failure(address: str, exc: ssl.SSLError) -> WireError:
    """A failed TLS handshake: not retriable (another try meets the same certificate)."""
    cause = f"certificate not trusted ({exc.verify_message})" if isinstance(exc, ssl.SSLCertVerificationError) else exc
    return WireError(f"TLS handshake with Kafka broker {address} failed: {cause}")


class WireClient:
    """Connections to the brokers of one cluster; leaders per topic-partition; Fetch and Metadata requests.

    ``ssl_context`` (from :func:`.security.ssl_context`): every connection is TLS, checked against it.
    """

    def __init__(
        self,
        bootstrap_servers: list[str],
        client_id: str,
        timeout_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.bootstrap = [_split(s) for s in bootstrap_servers if s.strip()]
        self.client_id, self.timeout_s, self.ssl_context = client_id, timeout_s, ssl_context
        self.brokers: dict[int, tuple[str, int]] = {}
        self.leaders: dict[tuple[str, int], int] = {}
        self._conns: dict[int, _Connection] = {}
        self.fetch_version: int | None = None
        self.metadata_version: int | None = None
        self.requests = 0

    # -- connections ---------------------------------------------------------------------------------

    def _connect(self, node: int) -> _Connection:
        conn = self._conns.get(node)
        if conn is not None:
            return conn
        if node < 0:  # bootstrap: the first server that accepts
            errors = []
            for host, port in self.bootstrap:
                try:
                    conn = _Connection(host, port, self.timeout_s, self.ssl_context)
                    break
                except ssl.SSLError as exc:
                    raise _tls_failure(f"{host}:{port}", exc) from exc
                except OSError as exc:
                    errors.append(f"{host}:{port}: {exc}")
            if conn is None:
                raise WireError(f"no bootstrap server accepts connections ({'; '.join(errors)})", retriable=True)
        else:
            if node not in self.brokers:
                raise WireError(f"broker {node} is not in the cluster metadata", retriable=True)
            host, port = self.brokers[node]
            try:
                conn = _Connection(host, port, self.timeout_s, self.ssl_context)
            except ssl.SSLError as exc:
                raise _tls_failure(f"{host}:{port}", exc) from exc
            except OSError as exc:
                raise WireError(f"broker {node} at {host}:{port}: {exc}", retriable=True) from exc
        self._conns[node] = conn
        if self.fetch_version is None:
            try:
                self._negotiate(node)
            except WireError:
                self.drop(node)  # so the next attempt negotiates again
                raise
            except protocol.ProtocolError as exc:
                self.drop(node)
                raise WireError(f"{conn.address}: unreadable ApiVersions response: {exc}") from exc
        return conn

    def _negotiate(self, node: int) -> None:
        versions = protocol.decode_api_versions(self.request(node, protocol.API_VERSIONS, 0, b""))
        fetch = protocol.pick_version(versions.get(protocol.API_FETCH), protocol.FETCH_VERSIONS)
        metadata = protocol.pick_version(versions.get(protocol.API_METADATA), protocol.METADATA_VERSIONS)
        if fetch is None or metadata is None:
            raise WireUnsupportedError(
                f"broker speaks Fetch {versions.get(protocol.API_FETCH)} and Metadata "
                f"{versions.get(protocol.API_METADATA)}; this client speaks Fetch {protocol.FETCH_VERSIONS} and "
                f"Metadata {protocol.METADATA_VERSIONS}"
            )
        self.fetch_version, self.metadata_version = fetch, metadata

    def drop(self, node: int) -> None:
        """Close the connection to ``node`` (after an error, or with a response left unread)."""
        conn = self._conns.pop(node, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for node in list(self._conns):
            self.drop(node)

    def send(self, node: int, api_key: int, version: int, body: bytes) -> Pending:
        conn = self._connect(node)
        conn.next_id += 1
        try:
            conn.send(protocol.encode_request(api_key, version, conn.next_id, self.client_id, body), conn.next_id)
        except OSError as exc:
            self.drop(node)
            raise WireError(f"{conn.address}: {exc}", retriable=True) from exc
        self.requests += 1
        return Pending(node, conn.next_id, version)

    def receive(self, pending: Pending) -> memoryview:
        conn = self._conns.get(pending.node)
        if conn is None:
            raise WireError(f"connection to broker {pending.node} was closed with a request in flight", retriable=True)
        try:
            return conn.receive(pending.correlation_id)
        except (OSError, ConnectionError) as exc:
            self.drop(pending.node)
            raise WireError(f"{conn.address}: {exc}", retriable=True) from exc

    def request(self, node: int, api_key: int, version: int, body: bytes) -> memoryview:
        return self.receive(self.send(node, api_key, version, body))

    # -- metadata and fetches --------------------------------------------------------------------------

    def refresh(self, topic: str) -> None:
        """Brokers and the leaders of ``topic``'s partitions, from any broker we know."""
        last: WireError | None = None
        for node in dict.fromkeys([*self._conns, *self.brokers, -1]):
            try:
                self._connect(node)
                version = self.metadata_version or protocol.METADATA_VERSIONS[0]
                payload = self.request(node, protocol.API_METADATA, version, protocol.encode_metadata(version, [topic]))
                meta = protocol.decode_metadata(version, payload)
                break
            except WireUnsupportedError:
                raise
            except protocol.ProtocolError as exc:
                self.drop(node)
                raise WireError(f"broker {node}: unreadable Metadata response: {exc}") from exc
            except WireError as exc:
                self.drop(node)
                last = exc
        else:
            raise last or WireError("no broker answered a metadata request", retriable=True)
        self.brokers.update(meta.brokers)
        code = meta.topic_errors.get(topic, 3)
        if code:
            raise WireError(
                f"topic {topic!r}: {protocol.error_name(code)}", code=code, retriable=code in protocol.RETRIABLE
            )
        for key, (_, leader) in meta.leaders.items():
            self.leaders[key] = leader

    def leader(self, topic: str, partition: int) -> int:
        node = self.leaders.get((topic, partition), -1)
        if node < 0:
            self.refresh(topic)
            node = self.leaders.get((topic, partition), -1)
            if node < 0:
                raise WireError(f"{topic}:{partition} has no leader", code=5, retriable=True)
        return node

    def send_fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, max_wait_ms: int, min_bytes: int = 1
    ) -> Pending:
        node = self.leader(topic, partition)
        self._connect(node)
        version = self.fetch_version or protocol.FETCH_VERSIONS[0]
        body = protocol.encode_fetch(
            version, topic, [(partition, offset, max_bytes)], max_wait_ms, min_bytes, max_bytes
        )
        return self.send(node, protocol.API_FETCH, version, body)

    def receive_fetch(self, pending: Pending, topic: str, partition: int) -> protocol.FetchedPartition:
        """The answer for one partition; raises :class:`WireError` for a request or partition error."""
        try:
            response = protocol.decode_fetch(pending.version, self.receive(pending))
        except protocol.ProtocolError as exc:
            self.drop(pending.node)
            raise WireError(f"{topic}:{partition}: unreadable Fetch v{pending.version} response: {exc}") from exc
        part = response.partitions.get((topic, partition))
        code = response.error or (part.error if part else 3)
        if code:
            if code in protocol.RETRIABLE:
                self.leaders.pop((topic, partition), None)
            raise WireError(
                f"{topic}:{partition}: {protocol.error_name(code)}",
                code=code,
                retriable=code in protocol.RETRIABLE,
                log_start=part.log_start_offset if part else -1,
            )
        assert part is not None
        return part


@dataclass
class Fetched:
    """What one fetch brought: the records in range, where to fetch next, the partition's high watermark."""

    columns: RecordColumns
    next_offset: int
    high_watermark: int | None


class PartitionReader:
    """Reads ``[offset, stop)`` of one topic-partition fetch by fetch, one request ahead of the caller.

    Retriable errors (leader moved, broker restarting, connection lost) are retried with a
    metadata refresh until ``retry_s`` passes; other errors raise :class:`WireError`.
    """

    def __init__(
        self,
        client: WireClient,
        topic: str,
        partition: int,
        stop: int,
        max_bytes: int,
        max_wait_ms: int = 500,
        check_crcs: bool = True,
        retry_s: float = 30.0,
    ):
        self.client, self.topic, self.partition, self.stop = client, topic, partition, stop
        self.max_bytes, self.max_wait_ms, self.check_crcs, self.retry_s = max_bytes, max_wait_ms, check_crcs, retry_s
        self._ahead: tuple[int, Pending] | None = None  # (offset, request) sent before it was asked for

    def _send(self, offset: int) -> Pending:
        return self.client.send_fetch(self.topic, self.partition, offset, self.max_bytes, self.max_wait_ms)

    def _answer(self, offset: int) -> protocol.FetchedPartition:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] != offset:
            self.client.drop(ahead[1].node)  # asked for another offset: that answer is of no use
            ahead = None
        deadline = time.monotonic() + self.retry_s
        while True:
            try:
                pending = ahead[1] if ahead is not None else self._send(offset)
                ahead = None
                return self.client.receive_fetch(pending, self.topic, self.partition)
            except WireError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def fetch(self, offset: int) -> Fetched:
        """Records of ``[offset, stop)`` from one fetch (possibly none), the next offset and the high watermark."""
        part = self._answer(offset)
        columns = RecordColumns()
        next_offset = read_batches(part.records, offset, self.stop, columns, self.check_crcs)
        if next_offset < self.stop and next_offset < part.high_watermark:
            self._ahead = (next_offset, self._send(next_offset))  # the broker reads while we decode
        return Fetched(columns, next_offset, part.high_watermark)

    def close(self) -> None:
        """Drop a request still in flight (its answer would be read by the next user of the connection)."""
        if self._ahead is not None:
            self.client.drop(self._ahead[1].node)
            self._ahead = None
