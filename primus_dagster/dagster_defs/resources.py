"""Dagster resources: where the data lives and which Kafka to talk to.

Example::

    defs = Definitions(assets=..., resources={
        "storage": PrimusStorageResource(data_root="/data"),
        "kafka": KafkaResource(bootstrap_servers="broker-1:9092"),
    })
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from dagster import ConfigurableResource
from pydantic import Field

from primus_dagster import paths
from primus_dagster.data.sources import SourceContext
from primus_dagster.spec import JobSpec

if TYPE_CHECKING:
    from primus_dagster.training.tracking import MlflowTracker

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


class MlflowResource(ConfigurableResource):
    """MLflow tracking for training assets: ``tracking_uri`` overrides the job spec's (default: the
    spec's, else SQLite under the project home); ``experiment`` likewise."""

    tracking_uri: str | None = Field(default=None, description="e.g. http://mlflow:5000 or sqlite:///…")
    experiment: str | None = Field(default=None)

    def tracker(self, job: JobSpec) -> "MlflowTracker":
        from primus_dagster.training.tracking import MlflowTracker

        return MlflowTracker(self.tracking_uri or job.tracking.tracking_uri, self.experiment or job.tracking.experiment)


class ExecutorPoolResource(ConfigurableResource):
    """The executor pool a training asset runs its job on. Today: local processes (data executors
    started next to the trainer); ``data_executors`` overrides the spec's ``pools.data.replicas``."""

    data_executors: int | None = Field(default=None, ge=1, description="Data executor processes.")

    def executors(self, job: JobSpec) -> int:
        return self.data_executors or job.pools.data.replicas or 1


def default_resources() -> dict[str, ConfigurableResource]:
    """Embedded defaults: project-local data root, Kafka from env or the embedded broker, MLflow
    from the spec (else SQLite under the project home), local executor processes."""
    return {
        "storage": PrimusStorageResource(data_root=str(paths.data_root())),
        "kafka": KafkaResource(broker_state_file=str(paths.broker_state_file())),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(),
    }
