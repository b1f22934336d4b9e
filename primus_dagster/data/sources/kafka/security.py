"""The one rule from a Kafka source's security keys to its clients' settings, and the TLS pre-flight check.

Every Kafka client of a source takes its security settings from here: the confluent-kafka
(librdkafka) consumers of :mod:`.adapter` from :func:`librdkafka_security_config` (librdkafka
configuration names), the kafka-python ones from :func:`client_security_config` (kafka-python keyword
arguments) and :func:`ssl_context` (one ``ssl.SSLContext``, the same object for every kafka-python
client, and for :func:`tls_problem`, which shakes hands before any client starts so that a wrong CA
fails at once, naming the broker and the TLS cause). Both maps read the same keys the same way. The
SASL password is read from the environment variable the spec names, here and nowhere else; it never
enters a message.

Example::

    config = client_security_config(spec)   # {} for PLAINTEXT; else security_protocol, ssl_context, sasl_*
    KafkaConsumer(bootstrap_servers=servers, **config)
    Consumer({"bootstrap.servers": servers, **librdkafka_security_config(spec)})  # security.protocol, ssl.*, sasl.*
    tls_problem("broker:9093", ssl_context(spec), timeout_s=10)   # None, or "TLS handshake with ... failed: ..."
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from primus_dagster.spec.sources import KafkaSecuritySpec


class KafkaConfigError(ValueError):
    """The source cannot reach Kafka: no bootstrap servers configured, none answers, the TLS handshake
    fails, or its security settings cannot be used (a certificate file missing, the password variable unset)."""


def split_server(server: str) -> tuple[str, int]:
    """``"host:port"`` (``[v6]:port``; a bare host: port 9092) as ``(host, port)``."""
    host, sep, port = server.strip().rpartition(":")
    return (host.strip("[]"), int(port)) if sep else (port, 9092)


def uses_tls(spec: KafkaSecuritySpec) -> bool:
    """``SSL`` or ``SASL_SSL``."""
    return spec.security_protocol in ("SSL", "SASL_SSL")


def _pem(spec: KafkaSecuritySpec, name: str, key: str) -> str | None:
    path = getattr(spec, key)
    if path is not None and not Path(path).is_file():
        raise KafkaConfigError(f"source {name!r}: {key} {path!r} is not a readable file")
    return path


def ssl_context(spec: KafkaSecuritySpec, name: str = "?") -> ssl.SSLContext | None:
    """The TLS client context of ``spec`` (None unless ``SSL``/``SASL_SSL``), as kafka-python builds one:
    TLS 1.2 or later, the broker's certificate verified against ``ssl_cafile`` (else the system CAs), its
    host name checked unless ``ssl_check_hostname`` is false, the client certificate loaded when given."""
    if not uses_tls(spec):
        return None
    cafile, certfile, keyfile = (_pem(spec, name, k) for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = spec.ssl_check_hostname
    try:
        if cafile:
            ctx.load_verify_locations(cafile)
        else:
            ctx.load_default_certs()
        if certfile:
            ctx.load_cert_chain(certfile=certfile, keyfile=keyfile)
    except (ssl.SSLError, OSError) as exc:
        raise KafkaConfigError(f"source {name!r}: cannot load its TLS certificates ({exc})") from exc
    return ctx


def sasl_password(spec: KafkaSecuritySpec, name: str = "?", environ: Mapping[str, str] | None = None) -> str:
    """The SASL password, from the environment variable ``sasl_password_env`` names (its value is never shown)."""
    env = os.environ if environ is None else environ
    var = spec.sasl_password_env
    if var is None or not env.get(var):
        raise KafkaConfigError(
            f"source {name!r}: the SASL password variable {var!r} (sasl_password_env) is not set in this process"
        )
    return env[var]


def client_security_config(
    spec: KafkaSecuritySpec, name: str = "?", environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """kafka-python keyword arguments of ``spec``'s security keys, for every client kind (consumer, admin,
    producer): ``{}`` for ``PLAINTEXT``; else ``security_protocol``, ``ssl_context`` (``SSL``/``SASL_SSL``) and
    ``sasl_mechanism`` / ``sasl_plain_username`` / ``sasl_plain_password`` (``SASL_*``). Never log the result:
    it holds the password."""
    if spec.security_protocol == "PLAINTEXT":
        return {}
    config: dict[str, Any] = {"security_protocol": spec.security_protocol}
    context = ssl_context(spec, name)
    if context is not None:
        config["ssl_context"] = context  # carries ssl_check_hostname and the certificates: one object for all
    if spec.security_protocol.startswith("SASL_"):
        config["sasl_mechanism"] = spec.sasl_mechanism
        config["sasl_plain_username"] = spec.sasl_username
        config["sasl_plain_password"] = sasl_password(spec, name, environ)
    return config


def librdkafka_security_config(
    spec: KafkaSecuritySpec, name: str = "?", environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """librdkafka (confluent-kafka) settings of ``spec``'s security keys, the same rule as
    :func:`client_security_config`: ``{}`` for ``PLAINTEXT``; else ``security.protocol``, for TLS
    ``ssl.ca.location`` / ``ssl.certificate.location`` / ``ssl.key.location`` and
    ``ssl.endpoint.identification.algorithm`` (``https``: the host name is checked; ``none`` when
    ``ssl_check_hostname`` is false), for SASL ``sasl.mechanism`` / ``sasl.username`` / ``sasl.password``
    (from ``sasl_password_env``). Never log the result: it holds the password."""
    if spec.security_protocol == "PLAINTEXT":
        return {}
    config: dict[str, str] = {"security.protocol": spec.security_protocol}
    if uses_tls(spec):
        ssl_context(spec, name)  # the same checks: files readable, certificates loadable
        for key, option in (
            ("ssl_cafile", "ssl.ca.location"),
            ("ssl_certfile", "ssl.certificate.location"),
            ("ssl_keyfile", "ssl.key.location"),
        ):
            if (path := getattr(spec, key)) is not None:
                config[option] = str(path)
        config["ssl.endpoint.identification.algorithm"] = "https" if spec.ssl_check_hostname else "none"
    if spec.security_protocol.startswith("SASL_"):
        config["sasl.mechanism"] = str(spec.sasl_mechanism)
        config["sasl.username"] = str(spec.sasl_username)
        config["sasl.password"] = sasl_password(spec, name, environ)
    return config


def tls_problem(server: str, context: ssl.SSLContext, timeout_s: float) -> str | None:
    """Why a TLS handshake with ``server`` fails (connection refused, certificate not trusted, wrong host
    name, not a TLS listener), or None when it succeeds; bounded by ``timeout_s``."""
    host, port = split_server(server)
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return f"TLS handshake with Kafka broker {host}:{port} failed: certificate not trusted ({exc.verify_message})"
    except ssl.SSLError as exc:
        return f"TLS handshake with Kafka broker {host}:{port} failed: {exc.reason or exc}"
    except TimeoutError:
        return f"TLS handshake with Kafka broker {host}:{port} failed: no answer in {timeout_s:.0f}s"
    except OSError as exc:
        return f"Kafka broker {host}:{port} does not accept connections ({exc.strerror or exc})"
