"""The live model asset: the newest model trained on the stream up to the moment it was asked for.

One materialisation is one live increment (:func:`~primus_dagster.training.live.run_live_increment`):
the newest trained window's model (the training asset's newest partition, found through MLflow) or
the newest increment built on it goes on learning from the Kafka records that arrived since, and is
published to MLflow and registered as a version of the job's registered model, tagged with its run
key, base, new records and the Dagster run; the alias ``live`` moves to it. An increment with no new
records trains nothing and records no materialisation (the step succeeds, the live model is unchanged) (no quality check: the
hours after an increment have not happened yet, so ``models:/<job>@live`` is the freshest model and
``@champion`` the newest checked one). The engine's stage lines (planning, executors, checkpoints,
heartbeats) go to the Dagster run log, as the training asset's (:func:`~primus_dagster.dagster_defs.run_log.engine_logs_to`).
The stream sensor asks for it when its thresholds (``automation.min_new_records``,
``max_wait``) are met; it can also be materialised by hand, or by ``primus-dagster live``. Jobs without
a Kafka stream source of kind ``stream`` (or in ``batch`` mode) have no live asset.

Example::

    defs = Definitions(assets=[..., build_live_asset(job, "job.yaml")], resources=default_resources())
"""

from collections.abc import Iterator
from pathlib import Path

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    MaterializeResult,
    asset,
    define_asset_job,
)

from primus_dagster.dagster_defs.lineage import dagster_run_tags, tag_run_with_mlflow
from primus_dagster.dagster_defs.resources import ExecutorPoolResource, MlflowResource, PrimusStorageResource
from primus_dagster.dagster_defs.run_log import engine_logs_to
from primus_dagster.dagster_defs.schedules import AssetJob
from primus_dagster.dagster_defs.training_asset import (
    register_version,
    registered_model_name,
    training_asset_name,
    typed_metadata,
    version_tags,
)
from primus_dagster.run_queue import RUN_KIND_TAG
from primus_dagster.spec import JobSpec

LIVE_TAG = "primus/live"  # on the runs the stream sensor asks for
LIVE_ALIAS = "live"  # the registered version of the newest live increment
_LIVE_JOBS: dict[tuple[str, AssetKey], AssetJob] = {}


def live_asset_name(job: JobSpec) -> str:
    """``<job>_live_model`` (hyphens as underscores)."""
    return f"{job.name.replace('-', '_')}_live_model"


def live_pool(job: JobSpec) -> str:
    """The Dagster concurrency pool of the job's live model (one increment at a time: primus_dagster/run_queue.py)."""
    return f"primus-live-{job.name}"


def live_asset_job(job: JobSpec, key_prefix: list[str] | None = None) -> AssetJob:
    """``<job>_live_job``: the asset job of the live model (the stream sensor's target; one object per
    job and prefix, as Dagster refuses two definitions of one job)."""
    key = AssetKey([*(key_prefix or []), live_asset_name(job)])
    name = f"{job.name.replace('-', '_')}_live_job"
    if (name, key) not in _LIVE_JOBS:
        _LIVE_JOBS[(name, key)] = define_asset_job(
            name,
            selection=AssetSelection.assets(key),
            description=f"A live increment of job `{job.name}`: its newest model trained on the stream since.",
            run_tags={RUN_KIND_TAG: "live"},  # one after another in the local run queue (run_queue.py)
        )
    return _LIVE_JOBS[(name, key)]


def build_live_asset(job: JobSpec, job_path: str | Path, key_prefix: list[str] | None = None) -> AssetsDefinition:
    """The live model asset of ``job`` (module docstring); ValueError for a job without a stream to follow."""
    sources, why = job.live_stream_sources()
    if not sources:
        raise ValueError(why)
    job_path = str(Path(job_path).resolve())
    training_key = AssetKey([*(key_prefix or []), training_asset_name(job)])
    kafka_keys = [AssetKey([*(key_prefix or []), source.name]) for _, source in sources]
    topics = ", ".join(f"`{source.topic}`" for _, source in sources)

    @asset(
        name=live_asset_name(job),
        output_required=False,  # an increment with no new records trains nothing and records no materialisation
        key_prefix=key_prefix,
        deps=[AssetDep(training_key), *(AssetDep(k) for k in kafka_keys)],
        group_name="training",
        kinds={"pytorch", "mlflow", "kafka"},
        owners=job.owners or None,  # the spec's owners and tags (JobSpec.owners / tags)
        tags=job.tags or None,
        # One increment at a time whatever launched it (a sensor's live job or the UI's Materialize): the
        # local instance runs one run per pool (primus_dagster/run_queue.py).
        pool=live_pool(job),
        description=(
            f"{job.training.model.type} model of job `{job.name}`: the newest trained partition's model, "
            f"then every record of {topics} since its window, published to MLflow at each materialisation "
            f"(a live increment), registered as a version of `{registered_model_name(job)}` "
            f"(`models:/{registered_model_name(job)}@{LIVE_ALIAS}`: the newest increment)."
        ),
    )
    def _live_asset(
        context: AssetExecutionContext,
        storage: PrimusStorageResource,
        mlflow: MlflowResource,
        executor_pool: ExecutorPoolResource,
    ) -> Iterator[MaterializeResult]:
        from primus_dagster.training.live import LiveIncrement, run_live_increment
        from primus_dagster.training.progress import progress_line
        from primus_dagster.training.run_state import RunHooks

        source_context = storage.source_context(source for _, source in sources)

        def log_progress(progress: dict) -> None:
            context.log.info(f"[live] {progress_line(progress)}")

        tracker = mlflow.tracker(job)
        run_tags = dagster_run_tags(context)
        with engine_logs_to(context.log):  # planning, executors, phases, checkpoints, heartbeats
            result = run_live_increment(
                LiveIncrement(
                    job,
                    job_path,
                    storage.data_root,
                    kafka_bootstrap=source_context.kafka_bootstrap_servers,
                    executors=executor_pool.executors(job),
                    tracker=tracker,
                    tags=run_tags,
                    progress=log_progress,
                ),
                RunHooks(data_plane=executor_pool.data_plane_factory(job)),
            )
        context.log.info(f"live increment: {result.start.why}; {result.records} new record(s)")
        if result.training is None:  # nothing new since the model: the live model is unchanged
            context.log.info("no new records: nothing trained, no materialisation (the live model is unchanged)")
            return
        tag_run_with_mlflow(context, result.training.run_id)
        values = result.metadata()
        metadata = typed_metadata(values)
        if result.training.model_uri:
            version, version_metadata = register_version(
                tracker,
                job,
                result.training.model_uri,
                version_tags(
                    values,
                    {**job.tags, **run_tags},  # the spec's tags, then the Dagster run's
                    **{"primus.run_kind": "live", "primus.live_run_key": result.run_key},
                    **{"primus.live_base": result.start.base_key or "", "primus.new_records": result.records},
                ),
            )
            tracker.set_alias(registered_model_name(job), LIVE_ALIAS, version)
            context.log.info(f"model version {version} is the {LIVE_ALIAS} model now")
            metadata.update(version_metadata)
        yield MaterializeResult(metadata=metadata)

    return _live_asset
