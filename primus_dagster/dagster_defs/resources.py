"""Dagster resources of the glue: where the data lives (with the Kafka it needs), MLflow, the executor pool.

The storage resource is the one the assets ask for a :class:`~primus_dagster.data.SourceContext`;
the Kafka resource is nested in it. Resources read no environment variables themselves:
:func:`default_resources` puts ``EnvVar``\\s into their configuration for the variables that are set
(Dagster resolves them in the run and shows their names, not their values, in the UI), and the
embedded defaults for the others.

Example::

    storage = PrimusStorageResource(data_root="/data", kafka=KafkaResource(bootstrap_servers=EnvVar("KAFKA")))
    defs = build_definitions("job.yaml", resources={**default_resources(), "storage": storage})
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from pydantic import Field, PrivateAttr

from primus_dagster import paths
from primus_dagster.broker_discovery import KAFKA_ENV, read_broker_state
from primus_dagster.cluster.backends import data_plane_starter
from primus_dagster.data import DataPlane, DataPlaneStarter, SourceContext
from primus_dagster.spec import JobSpec, SourceSpec

if TYPE_CHECKING:
    from primus_dagster.training.tracking import MlflowTracker

DATA_ROOT_ENV = "PRIMUS_DATA_ROOT"
MLFLOW_TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"


class KafkaResource(ConfigurableResource):
    """The Kafka that sources naming no ``bootstrap_servers`` of their own read: ``bootstrap_servers``,
    else the embedded broker recorded in ``broker_state_file`` while it runs (``primus-dagster-dev broker
    --detach``). Servers only: TLS and SASL settings are keys of the Kafka source (``security_protocol``,
    ``sasl_*``, ``ssl_*``), which travel with the spec to every process that reads it."""

    bootstrap_servers: str | None = Field(default=None, description="host:port[,host:port]")
    broker_state_file: str | None = Field(
        default=None, description="State file of the embedded broker to fall back to (None: no fallback)."
    )

    def resolve_bootstrap_servers(self) -> str:
        if self.bootstrap_servers:
            return self.bootstrap_servers
        broker_state = read_broker_state(self.broker_state_file) if self.broker_state_file else None
        if broker_state is not None:
            return str(broker_state["bootstrap_servers"])
        looked_in = f" (looked for its state in {self.broker_state_file})" if self.broker_state_file else ""
        raise RuntimeError(
            "no Kafka configured: set the kafka resource's bootstrap_servers (the default resources take "
            f"${KAFKA_ENV}), or start the embedded broker with `primus-dagster-dev broker --detach`{looked_in}"
        )


class PrimusStorageResource(ConfigurableResource):
    """The data root against which the spec's relative source locations resolve, and the Kafka resource
    for Kafka sources (needed only when a job reads one that names no ``bootstrap_servers``)."""

    data_root: str = Field(description="Local path or fsspec URL of the data root.")
    kafka: KafkaResource | None = None

    def source_context(self, sources: Iterable[SourceSpec] = ()) -> SourceContext:
        """The context to read ``sources`` with: the Kafka address is resolved only when one needs it."""
        sources_needing_kafka = [s.name for s in sources if s.type == "kafka" and not s.bootstrap_servers]
        if not sources_needing_kafka:
            return SourceContext(data_root=self.data_root)
        if self.kafka is None:
            raise RuntimeError(
                f"Kafka sources {sources_needing_kafka} name no bootstrap_servers and the storage resource "
                "has no kafka: give it kafka=KafkaResource(bootstrap_servers=...)"
            )
        return SourceContext(data_root=self.data_root, kafka_bootstrap_servers=self.kafka.resolve_bootstrap_servers())


class MlflowResource(ConfigurableResource):
    """MLflow tracking for training assets: ``tracking_uri`` overrides the job spec's (default: the
    spec's, else SQLite under the project home); ``experiment`` likewise."""

    tracking_uri: str | None = Field(default=None, description="e.g. http://mlflow:5000 or sqlite:///…")
    experiment: str | None = Field(default=None)

    def tracker(self, job: JobSpec) -> MlflowTracker:
        from primus_dagster.training.tracking import MlflowTracker

        return MlflowTracker(self.tracking_uri or job.tracking.tracking_uri, self.experiment or job.tracking.experiment)


class ExecutorPoolResource(ConfigurableResource):
    """The executor pools a training asset runs its job on, with their supervision (restart policy,
    blacklist) as the spec's ``pools`` say; ``data_executors`` overrides ``pools.data.replicas``.

    Every data plane it starts for a run is closed when the step ends -- success, failure or
    cancellation -- so no executor process (or pod) outlives the run.

    Example::

        pool = ExecutorPoolResource(data_executors=4)
        result = train_window(request, RunHooks(data_plane=pool.data_plane_factory(job)))
    """

    data_executors: int | None = Field(default=None, ge=1, description="Data executors (default: the spec's).")
    _planes: list[DataPlane] = PrivateAttr(default_factory=list)
    _run_id: str = PrivateAttr(default="local")

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._run_id = context.run.run_id if context.run is not None else "local"

    def executors(self, job: JobSpec) -> int:
        return self.data_executors or job.pools.data.replicas or 1

    def data_plane_factory(self, job: JobSpec) -> DataPlaneStarter:
        """What :class:`~primus_dagster.training.run_state.RunHooks` ``data_plane`` takes: a pooled data
        plane on ``job``'s data pool (or, for ``pools.backend: in_trainer``, executors in the run's
        process), remembered so that teardown closes it."""

        starter = data_plane_starter(job, run_id=self._run_id)

        def start(*args: Any, **kwargs: Any) -> DataPlane:
            plane = starter(*args, **kwargs)
            self._planes.append(plane)
            return plane

        return start

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        for plane in self._planes:
            plane.close()
        self._planes.clear()


def _env_var_if_set(name: str) -> EnvVar | None:
    # Dagster fails a run whose config holds an EnvVar that is not set, so an unset one is left out.
    return EnvVar(name) if os.environ.get(name) else None


def default_resources() -> dict[str, ConfigurableResource]:
    """``storage`` (data root ``$PRIMUS_DATA_ROOT``, else ``<PRIMUS_HOME>/data``; its ``kafka``:
    ``$PRIMUS_KAFKA_BOOTSTRAP_SERVERS``, else the embedded broker's state file), ``mlflow``
    (``$MLFLOW_TRACKING_URI``, else the spec's, else SQLite under the project home) and
    ``executor_pool`` (local processes). Set variables go in as ``EnvVar``."""
    kafka = KafkaResource(
        bootstrap_servers=_env_var_if_set(KAFKA_ENV), broker_state_file=str(paths.broker_state_file())
    )
    return {
        "storage": PrimusStorageResource(
            data_root=_env_var_if_set(DATA_ROOT_ENV) or str(paths.data_root()), kafka=kafka
        ),
        "mlflow": MlflowResource(tracking_uri=_env_var_if_set(MLFLOW_TRACKING_URI_ENV)),
        "executor_pool": ExecutorPoolResource(),
    }
