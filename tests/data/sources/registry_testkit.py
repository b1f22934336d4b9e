"""A stand-in for a Confluent Schema Registry, and Avro producers for it: test-only code (imported as
``registry_testkit`` by the Avro Kafka tests, like ``tls_testkit``; nothing of the product imports it).

No schema registry server can be installed here (no JVM, no Docker), so :class:`TestRegistry` is a small
HTTP server (stdlib ``http.server`` in a thread, on an ephemeral loopback port) speaking the part of the
Confluent Schema Registry REST API a consumer and a producer use: ``GET /schemas/ids/{id}`` (``{"schema":
"<json>"}``; 404 with error code 40403 for an unknown id) and ``POST /subjects/{subject}/versions``
(``{"schema": "<json>"}`` -> ``{"id": N}``; the same schema gets the same id). With ``user`` and
``password`` it requires HTTP basic auth (401 otherwise). :func:`framed` writes a record in the Confluent
wire format (magic byte 0, the 4-byte big-endian schema id, the schemaless Avro body), as Confluent's
``AvroSerializer`` does; :func:`produce_avro` sends such records to the embedded broker.

Example::

    with TestRegistry() as registry:
        schema_id = registry.register("events-value", SCHEMA)
        produce_avro(broker.bootstrap_servers, "events", [(framed(schema_id, SCHEMA, record), ts_ms, 0)])
        registry.url, registry.requests     # "http://127.0.0.1:40125", ["GET /schemas/ids/1", ...]
"""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fastavro


def avro_body(schema: Mapping[str, Any], record: Mapping[str, Any]) -> bytes:
    """``record`` as the schemaless Avro body of ``schema`` (no header)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(dict(schema)), dict(record))
    return out.getvalue()


def framed(schema_id: int, schema: Mapping[str, Any], record: Mapping[str, Any]) -> bytes:
    """``record`` in the Confluent wire format: magic byte 0, ``schema_id`` (4 bytes big-endian), the Avro body."""
    return b"\x00" + schema_id.to_bytes(4, "big") + avro_body(schema, record)


class TestRegistry:
    """A Confluent Schema Registry stand-in on ``127.0.0.1`` (module docstring); a context manager.

    ``schemas``: ``{id: schema}`` served by ``GET /schemas/ids/{id}``; ``requests``: every request line seen.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, user: str | None = None, password: str | None = None) -> None:
        self.schemas: dict[int, str] = {}
        self.requests: list[str] = []
        self._auth = None if user is None else "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self._lock = threading.Lock()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _answer(self, status: int, body: Mapping[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _allowed(self) -> bool:
                with registry._lock:
                    registry.requests.append(f"{self.command} {self.path}")
                if registry._auth is not None and self.headers.get("Authorization") != registry._auth:
                    self._answer(401, {"error_code": 401, "message": "Unauthorized"})
                    return False
                return True

            def do_GET(self) -> None:
                if not self._allowed():
                    return
                parts = self.path.strip("/").split("/")
                if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
                    with registry._lock:
                        schema = registry.schemas.get(int(parts[2]))
                    if schema is None:
                        self._answer(404, {"error_code": 40403, "message": f"Schema {parts[2]} not found"})
                    else:
                        self._answer(200, {"schema": schema})
                    return
                self._answer(404, {"error_code": 404, "message": "HTTP 404 Not Found"})

            def do_POST(self) -> None:
                if not self._allowed():
                    return
                parts = self.path.strip("/").split("/")
                if len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    self._answer(200, {"id": registry._register(body["schema"])})
                    return
                self._answer(404, {"error_code": 404, "message": "HTTP 404 Not Found"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="test-registry", daemon=True)

    def _register(self, schema: str) -> int:
        canonical = json.dumps(json.loads(schema), sort_keys=True)
        with self._lock:
            for sid, known in self.schemas.items():
                if json.dumps(json.loads(known), sort_keys=True) == canonical:
                    return sid
            sid = max(self.schemas, default=0) + 1
            self.schemas[sid] = schema
            return sid

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        """Register ``schema`` under ``subject`` over HTTP, as a producer's serializer does; its id."""
        import urllib.request

        request = urllib.request.Request(
            f"{self.url}/subjects/{subject}/versions",
            data=json.dumps({"schema": json.dumps(schema)}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"}
            | ({"Authorization": self._auth} if self._auth else {}),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(json.loads(response.read())["id"])

    def __enter__(self) -> TestRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def produce_avro(
    bootstrap: str, topic: str, records: Iterable[tuple[bytes, int, int]], flush_every: int = 50
) -> list[tuple[int, int]]:
    """Send ``(value, timestamp ms, partition)`` records (values from :func:`framed`) to ``topic``; their
    ``(partition, offset)``, in order."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
    futures = []
    for i, (value, ts, partition) in enumerate(records):
        futures.append(producer.send(topic, value, partition=partition, timestamp_ms=ts))
        if i % flush_every == flush_every - 1:
            producer.flush()  # several record batches
    producer.flush()
    out = [(f.get(10).partition, f.get(10).offset) for f in futures]
    producer.close()
    return out
