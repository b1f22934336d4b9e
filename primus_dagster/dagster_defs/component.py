"""The job as a Dagster component: ``PrimusJobComponent``, a ``defs.yaml`` that points at a job spec.

``dg scaffold defs primus_dagster.PrimusJobComponent my_job`` writes ``defs/my_job/defs.yaml`` and a
starter spec beside it (:data:`STARTER_SPEC`: the Parquet source of ``examples/job.yaml`` and a daily
training asset, no broker needed); ``dg check defs`` loads it, ``dg list components`` lists the type
(registered under the ``dagster_dg_cli.registry_modules`` entry point of ``pyproject.toml``). The
component builds what :func:`~primus_dagster.dagster_defs.build_definitions` builds for the spec, with
the job's sensors and schedules as its attributes say. The reference code location (``definitions.py``)
stays the other way to serve a job.

Example ``defs.yaml``::

    type: primus_dagster.PrimusJobComponent
    attributes:
      job_spec: job.yaml            # relative to this file's folder
      sensors: true                 # the batch sensor and a stream sensor per Kafka source
      sensor_status: running        # their default status: running or stopped
      schedules: true               # the training and auc_final schedules
      schedule_status: stopped
      deployment: local             # local (steps in the run worker) | kubernetes; default $PRIMUS_DEPLOYMENT
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from dagster import (
    ComponentLoadContext,
    DagsterInvalidDefinitionError,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    ScheduleDefinition,
)
from dagster.components import (
    Component,
    ComponentTypeSpec,
    Resolvable,
    Resolver,
    Scaffolder,
    ScaffoldRequest,
    scaffold_with,
)
from pydantic import BaseModel, Field

from primus_dagster.dagster_defs.definitions import build_definitions
from primus_dagster.dagster_defs.executors import DEPLOYMENTS, deployment_executor
from primus_dagster.dagster_defs.schedules import AssetJob, build_schedules
from primus_dagster.dagster_defs.sensors import build_sensors
from primus_dagster.spec import SpecError, load_job_spec

#: The file the scaffolder writes beside ``defs.yaml``.
STARTER_SPEC_FILE = "job.yaml"
#: A job name's rule (``JobSpec.name``: a DNS-1123 label of at most 53 characters).
JOB_NAME_MAX = 53

#: The starter job spec: ``examples/job.yaml``'s Parquet source, batch training of a single-tower model by
#: day (``{name}``: the job's name). Batch data only: it runs without a broker (the reference job adds Delta,
#: Iceberg and a Kafka stream).
STARTER_SPEC = """\
# A Primus job, derived from examples/job.yaml: one hourly Parquet source and a daily training asset.
#   primus-dagster validate job.yaml                    # the spec's own check, every problem with its line
#   primus-dagster synth --spec job.yaml --days 2       # synthetic data into $PRIMUS_DATA_ROOT
#   primus-dagster spec-schema                          # every key, as a JSON Schema
name: {name}

dataset:
  start: 2026-11-01                # first partition, UTC
  streams:
    - name: history
      window: 24h                  # sliding window
      sources:
        - name: impressions_parquet
          type: parquet
          kind: batch
          granularity: hour
          label_delay: 24h         # labels complete one day after the impression
          path: parquet/impressions     # relative paths resolve inside the data root ($PRIMUS_DATA_ROOT)
          layout: hive             # dt=YYYY-MM-DD/hour=HH
          success_marker: _SUCCESS
          quality: {{dense_invalid: repair, null_label: drop, null_ts: drop, ts_outside_partition: repair,
                    bad_id: repair}}
          checks: {{label_rate: [0.0, 0.5]}}
          columns:
            ts: event_time
            label: click
            id: sample_id
            dense: [d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12]
            sparse: [user_id, item_id, topic_id, device, hour_of_day]

training:
  mode: batch                      # batch data only; examples/job.yaml: batch_then_stream with a Kafka stream
  partition: day                   # one training-asset partition per day
  model: {{type: single, embedding_dim: 16, hash_buckets: 100000}}
  batch_size: 1024
  learning_rate: 0.002
  baseline_guard: warn            # a small synthetic world may not beat its prior: WARN, not a failed run

automation:
  sensor_interval: 30s             # how often the batch sensor ticks
  rerun: never                     # a trained partition that changes is reported; retrain: also train it again
  cold_start: first_partition
"""


def starter_job_name(defs_path: Path) -> str:
    """A valid job name from the scaffolded folder's name (``my_job`` -> ``my-job``), else ``primus-job``."""
    name = re.sub(r"[^a-z0-9]+", "-", defs_path.name.lower())[:JOB_NAME_MAX].strip("-")
    return name or "primus-job"


class PrimusJobScaffoldParams(BaseModel):
    """``dg scaffold defs primus_dagster.PrimusJobComponent PATH [--job-name NAME]``."""

    job_name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
        max_length=JOB_NAME_MAX,
        description="name of the starter job (a DNS-1123 label); default: from the folder's name",
    )


class PrimusJobScaffolder(Scaffolder[PrimusJobScaffoldParams]):
    """Writes the starter spec (:data:`STARTER_SPEC`) and the ``defs.yaml`` (or ``component.py``) that serves it."""

    @classmethod
    def get_scaffold_params(cls) -> type[PrimusJobScaffoldParams]:
        return PrimusJobScaffoldParams

    def scaffold(self, request: ScaffoldRequest[PrimusJobScaffoldParams]) -> None:
        target = request.target_path
        target.mkdir(parents=True, exist_ok=True)
        name = request.params.job_name or starter_job_name(target)
        (target / STARTER_SPEC_FILE).write_text(STARTER_SPEC.format(name=name))
        module, _, cls = request.type_name.rpartition(".")
        if request.scaffold_format == "python":
            (target / "component.py").write_text(
                "import dagster as dg\n"
                f"from {module} import {cls}\n\n\n"
                "@dg.component_instance\n"
                f"def load(context: dg.ComponentLoadContext) -> {cls}:\n"
                f'    return {cls}(job_spec="{STARTER_SPEC_FILE}")\n'
            )
            return
        (target / "defs.yaml").write_text(
            f"type: {request.type_name}\n"
            "attributes:\n"
            f"  job_spec: {STARTER_SPEC_FILE}            # relative to this file's folder\n"
            "  sensors: true                 # the batch sensor (and a stream sensor per Kafka source)\n"
            "  sensor_status: running        # running or stopped (start them in the UI)\n"
            "  schedules: true               # the training and auc_final schedules\n"
            "  schedule_status: stopped      # the clock-driven alternative to the sensors\n"
        )


class JobSpecError(DagsterInvalidDefinitionError):
    """The component's job spec does not load: the :class:`~primus_dagster.spec.SpecError`'s own message (a
    header naming the file, then ``file:line: key: problem`` per problem), raised without the validation's
    chain, so that ``dg check defs`` prints those lines and none of pydantic's frames. ``spec_error``: the
    original, with its ``problems``."""

    def __init__(self, spec_error: SpecError):
        super().__init__(str(spec_error))
        self.spec_error = spec_error


Status = Literal["running", "stopped"]
STATUSES: tuple[Status, ...] = ("running", "stopped")


@scaffold_with(PrimusJobScaffolder)
@dataclass
class PrimusJobComponent(Component, Resolvable):
    """A Primus training job from its job spec: source assets with checks, training asset, sensors, schedules.

    One asset per source (with its blocking checks), the training asset (with its delayed ``auc_final``
    check and job), the live model asset of a job with a Kafka stream, and, as the attributes say, the
    job's sensors and schedules. ``job_spec`` is relative to the folder of the ``defs.yaml`` (or
    ``component.py``) that declares it. The resources are those of
    :func:`~primus_dagster.dagster_defs.default_resources` (``$PRIMUS_DATA_ROOT``,
    ``$PRIMUS_KAFKA_BOOTSTRAP_SERVERS``, ``$MLFLOW_TRACKING_URI``, else the project's embedded defaults); the
    executor is the reference location's (:func:`~primus_dagster.dagster_defs.deployment_executor`): a run's
    steps in its run worker, or each a Kubernetes Job with ``deployment: kubernetes``.

    Example::

        dg scaffold defs primus_dagster.PrimusJobComponent ctr_job   # defs/ctr_job/{defs.yaml,job.yaml}
        dg check defs

        # defs/ctr_job/defs.yaml
        type: primus_dagster.PrimusJobComponent
        attributes:
          job_spec: job.yaml
          sensor_status: stopped

        # or in Python
        defs = PrimusJobComponent(job_spec="job.yaml").build_defs(context)
    """

    job_spec: Annotated[
        str, Resolver.default(description="path of the job spec YAML, relative to the defs.yaml's folder")
    ]
    sensors: Annotated[bool, Resolver.default(description="the batch sensor and one per Kafka source")] = True
    sensor_status: Annotated[
        Status, Resolver.default(description="the sensors' default status: running (as the reference location's)")
    ] = "running"
    schedules: Annotated[bool, Resolver.default(description="the training and the auc_final schedules")] = True
    schedule_status: Annotated[
        Status, Resolver.default(description="the schedules' default status: stopped (the sensors are the trigger)")
    ] = "stopped"
    deployment: Annotated[
        str | None,
        Resolver.default(
            description="how runs execute their steps: local (in the run worker) or kubernetes (a Job per step); "
            "default: $PRIMUS_DEPLOYMENT, else local"
        ),
    ] = None

    def __post_init__(self) -> None:
        # the schema also takes a string for a template ("{{ env.X }}"): what it rendered to is checked here
        for key in ("sensors", "schedules"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}: {getattr(self, key)!r}: choose true or false")
        for key in ("sensor_status", "schedule_status"):
            if getattr(self, key) not in STATUSES:
                raise ValueError(f"{key}: {getattr(self, key)!r}: choose running or stopped")
        if self.deployment is not None and self.deployment not in DEPLOYMENTS:
            raise ValueError(f"deployment: {self.deployment!r}: choose one of {', '.join(DEPLOYMENTS)}")

    @classmethod
    def get_spec(cls) -> ComponentTypeSpec:
        # no description: dg shows the docstring's
        return ComponentTypeSpec(
            tags=["primus", "training"], produces=["asset", "asset_check", "job", "sensor", "schedule", "resource"]
        )

    def spec_path(self, context: ComponentLoadContext) -> Path:
        """``job_spec`` resolved against the component's folder (an absolute path as it is)."""
        path = Path(self.job_spec).expanduser()
        if path.is_absolute():
            return path
        # a defs.yaml component's path is its folder; a component.py one's, the file
        return (context.path if context.path.is_dir() else context.path.parent) / path

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        path = self.spec_path(context)
        try:
            job = load_job_spec(path)
        except SpecError as exc:
            raise JobSpecError(exc) from None
        sensor_status = DefaultSensorStatus[self.sensor_status.upper()]
        schedule_status = DefaultScheduleStatus[self.schedule_status.upper()]
        sensors = build_sensors(job, default_status=sensor_status) if self.sensors else []
        schedules = build_schedules(job, default_status=schedule_status) if self.schedules else []
        executor = deployment_executor(self.deployment)
        defs = build_definitions(job, job_path=path, sensors=sensors, schedules=schedules, executor=executor)
        return with_targeted_jobs(defs)


def with_targeted_jobs(defs: Definitions) -> Definitions:
    """``defs`` with every job its sensors and schedules target listed in ``jobs`` too.

    The component tree rewrites each definition's metadata (``Definitions.with_definition_metadata_update``)
    and copies a targeted job once per sensor or schedule unless the job is in ``jobs``: the training job,
    which the batch sensor, the stream sensors and the training schedule share, would become several
    objects of one name, which Dagster refuses (``Duplicate definition found for unresolved job``).
    """
    listed = {id(job) for job in defs.jobs or ()}
    targeted: dict[int, AssetJob] = {}  # the jobs of build_sensors and build_schedules: asset jobs
    for schedule in defs.schedules or ():
        if isinstance(schedule, ScheduleDefinition) and schedule.has_job:
            targeted.setdefault(id(schedule.job), schedule.job)
    for sensor in defs.sensors or ():
        for job in sensor.jobs if sensor.has_jobs else ():
            targeted.setdefault(id(job), job)
    extra = [job for key, job in targeted.items() if key not in listed]
    return Definitions.merge(defs, Definitions(jobs=extra)) if extra else defs
