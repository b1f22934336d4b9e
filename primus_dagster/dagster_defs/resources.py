"""Dagster resources: where the data lives and which Kafka to talk to.

Example::

    defs = Definitions(assets=..., resources={
        "storage": PrimusStorageResource(data_root="/data"),
        "kafka": KafkaResource(bootstrap_servers="broker-1:9092"),
    })
"""

from __future__ import annotations

import os

from dagster import ConfigurableResource
from pydantic import Field

from primus_dagster import paths
from primus_dagster.data.sources import SourceContext

KAFKA_ENV = "PRIMUS_KAFKA_BOOTSTRAP_SERVERS"


class KafkaResource(ConfigurableResource):
    """Kafka connection. Resolution order: ``bootstrap_servers`` config, ``$PRIMUS_KAFKA_BOOTSTRAP_SERVERS``,
    then the embedded broker recorded in ``broker_state_file`` (started by ``primus-dagster broker --detach``)."""

    bootstrap_servers: str | None = Field(default=None, description="host:port[,host:port]")
    broker_state_file: str | None = Field(default=None, description="Embedded broker state file.")

    def resolve_bootstrap_servers(self) -> str:
        if self.bootstrap_servers:
            return self.bootstrap_servers
        if os.environ.get(KAFKA_ENV):
            return os.environ[KAFKA_ENV]
        from primus_dagster.kafka_broker import EmbeddedBroker

        state_file = self.broker_state_file or str(paths.broker_state_file())
        state = EmbeddedBroker.read_state(state_file)
        if state:
            return str(state["bootstrap_servers"])
        raise RuntimeError(
            "no Kafka configured: set the kafka resource's bootstrap_servers, or "
            f"${KAFKA_ENV}, or start the embedded broker with `primus-dagster broker --detach` "
            f"(looked for its state in {state_file})"
        )


class PrimusStorageResource(ConfigurableResource):
    """Root against which relative source locations in the job spec resolve."""

    data_root: str = Field(description="Local path or fsspec URL of the data root.")

    def source_context(self, kafka: KafkaResource | None = None, needs_kafka: bool = False) -> SourceContext:
        bootstrap = kafka.resolve_bootstrap_servers() if (kafka is not None and needs_kafka) else None
        return SourceContext(data_root=self.data_root, kafka_bootstrap_servers=bootstrap)


def default_resources() -> dict[str, ConfigurableResource]:
    """Embedded defaults: project-local data root, Kafka from env or the embedded broker."""
    return {
        "storage": PrimusStorageResource(data_root=str(paths.data_root())),
        "kafka": KafkaResource(broker_state_file=str(paths.broker_state_file())),
    }
