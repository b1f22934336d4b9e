"""MLflow tracking of a training job: params, per-step metrics, checkpoints as artifacts, the model.

Everything goes through an ``mlflow.MlflowClient`` bound to one tracking URI, so trackers of
different stores can live in one process. The one exception is ``mlflow.pytorch.log_model``,
which resolves its store from MLflow's global tracking URI: :func:`use_tracking_uri` sets it for
that call only (under a lock) and restores the previous value and ``$MLFLOW_TRACKING_URI``.

Trained models are registered in MLflow's model registry (:meth:`MlflowTracker.register_model`,
one version per trained partition or live increment, under the registered model named after the
job) and promoted with aliases (:meth:`MlflowTracker.set_alias`): the Dagster assets decide when.

A run is identified by a ``run_key`` (tag ``primus.run_key``): restarting a job with the same key
resumes its unfinished run -- a process killed mid-run leaves it RUNNING -- and
:meth:`MlflowTracker.latest_checkpoint` fetches the checkpoint to continue from.

The default store is ``sqlite:///<primus_home()>/mlflow/mlflow.db`` with artifacts in
``<primus_home()>/mlflow/artifacts`` (``mlflow ui --backend-store-uri <that uri>`` shows it).
MLflow reads ``$MLFLOW_DISABLE_TELEMETRY`` when it is imported: this module leaves the environment
alone; the ``primus-dagster`` command line and the Makefile set it to ``true`` (offline clusters).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import cloudpickle
import mlflow
import mlflow.pytorch
import numpy as np
import pyarrow as pa
import torch
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.models.signature import ModelSignature
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException
from mlflow.types import Schema, TensorSpec
from mlflow.types.schema import Array, ColSpec, DataType

from primus_dagster.paths import primus_home
from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.checkpoint import (
    DISK_FULL_ERRNOS,
    CheckpointError,
    checkpoint_files,
    checkpoint_name,
    checkpoint_step,
    verify_checkpoint,
)
from primus_dagster.training.model_api import factory_code

__all__ = [
    "RUN_KEY_TAG",
    "RUN_KIND_TAG",
    "MlflowTracker",
    "default_tracking_uri",
    "model_requirements",
    "model_signature",
    "use_tracking_uri",
]

log = logging.getLogger(__name__)


class _PickleChoiceFilter(logging.Filter):
    """Drops MLflow's "Saving pytorch model by Pickle or CloudPickle format requires exercising caution"
    warning, printed on every ``log_model`` of a pickled model. Pickle is this suite's deliberate choice
    (:meth:`MlflowTracker.log_model`: MLflow's ``pt2`` format cannot take the models' ``kind`` input), so
    the line tells a user nothing they can act on; any other record of the logger passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Saving pytorch model by Pickle or CloudPickle")


@contextmanager
def _without_pickle_warning() -> Iterator[None]:
    logger, quiet = logging.getLogger("mlflow.pytorch"), _PickleChoiceFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


class _StoreErrorOneLineFilter(logging.Filter):
    """MLflow's SQL store logs every database error it re-raises with the whole chained traceback (six
    frames deep for one full disk); the error itself still reaches the caller. A full store is dropped
    here (the caller names it in one line: :func:`store_full_reason`); any other keeps one line: the
    record's first line and the error's."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        if store_full_reason(error) is not None:
            return False
        head = record.getMessage().strip().splitlines()[:1]
        cause = [line for line in str(error).strip().splitlines() if line.strip()][:1]
        record.msg, record.args = " ".join(head + cause), None
        record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("mlflow.store.db.utils").addFilter(_StoreErrorOneLineFilter())


def store_full_reason(exc: BaseException) -> str | None:
    """The reason when ``exc`` (or what it was raised from) is a full disk under the MLflow store: a SQL
    store's "database or disk is full", or ``ENOSPC`` / ``EDQUOT``; else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if "database or disk is full" in str(current):
            return "database or disk is full"
        if isinstance(current, OSError) and current.errno is not None and current.errno in DISK_FULL_ERRNOS:
            return os.strerror(current.errno)
        current = current.__cause__ or current.__context__
    return None


RUN_KEY_TAG = "primus.run_key"
RUN_KIND_TAG = "primus.run_kind"  # "window": a planned window (a training partition); "live": a stream increment
# The MLflow UI opens an experiment on its GenAI traces page unless it is marked as model development.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
CHECKPOINTS = "checkpoints"
_MAX_PARAM_LEN = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
_GLOBAL = threading.RLock()  # guards MLflow's process-global tracking URI
_MODEL_VERSIONS_TAG = "mlflow.modelVersions"  # on a logged model: its registered versions (as mlflow.register_model)
_DISTRIBUTION = "primus_dagster"


def default_tracking_uri() -> str:
    """``sqlite:///<primus_home()>/mlflow/mlflow.db`` (the folder is created)."""
    folder = primus_home() / "mlflow"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def _artifact_root(tracking_uri: str) -> str | None:
    """``<db folder>/artifacts`` for a sqlite store (``<primus_home()>/mlflow/artifacts`` for the
    default one); None (MLflow's default) for servers and file stores."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = tracking_uri[len("sqlite:///") :].split("?", 1)[0]
    if not db or db == ":memory:":
        return None
    root = Path(db).absolute().parent / "artifacts"
    root.mkdir(parents=True, exist_ok=True)
    return str(root)


def local_store_folders(tracking_uri: str | None) -> list[Path]:
    """The local folders an MLflow store writes to (a sqlite store's database folder and its artifacts,
    a file store's root); none for a server. A full disk there is named by them."""
    uri = tracking_uri or f"sqlite:///{primus_home() / 'mlflow' / 'mlflow.db'}"
    if uri.startswith("sqlite:///"):
        db = uri[len("sqlite:///") :].split("?", 1)[0]
        return [] if not db or db == ":memory:" else [Path(db).absolute().parent]
    if uri.startswith("file://"):
        return [Path(uri[len("file://") :]).absolute()]
    return [] if "://" in uri else [Path(uri).absolute()]


@contextmanager
def use_tracking_uri(uri: str) -> Iterator[None]:
    """Make ``uri`` MLflow's global tracking URI inside the block (for fluent APIs such as
    ``mlflow.pytorch.load_model("models:/...")``); restores the previous one and
    ``$MLFLOW_TRACKING_URI`` afterwards. Blocks of different threads are serialised.

    Example::

        with use_tracking_uri(tracker.tracking_uri):
            model = mlflow.pytorch.load_model(model_uri)
    """
    with _GLOBAL:
        previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
        previous_env = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(uri)
        try:
            yield
        finally:
            mlflow.set_tracking_uri(previous)  # type: ignore[arg-type]  # None: back to "not set" (unsets the env var)
            if previous_env is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = previous_env


def model_signature(n_dense: int, n_sparse: int, list_names: Sequence[str] = ()) -> ModelSignature:
    """The signature of the project's models: tensor inputs ``dense`` ``[-1, n_dense]`` float32 and
    ``sparse`` ``[-1, n_sparse]`` int64, and per list feature its jagged ``<name>.values`` ``[-1]``
    int64 and ``<name>.offsets`` ``[-1]`` int64 (rows + 1; :class:`~primus_dagster.data.Jagged`),
    output ``[-1]`` float32 logits (``forward(dense, sparse, kind, lists)``; ``kind``, ``"batch"`` or
    ``"stream"``, is a plain argument and not part of it)."""
    lists = [
        TensorSpec(np.dtype(np.int64), (-1,), f"{name}.{part}") for name in list_names for part in ("values", "offsets")
    ]
    return ModelSignature(
        inputs=Schema(
            [
                TensorSpec(np.dtype(np.float32), (-1, int(n_dense)), "dense"),
                TensorSpec(np.dtype(np.int64), (-1, int(n_sparse)), "sparse"),
                *lists,
            ]
        ),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1,), "logit")]),
    )


def model_requirements() -> list[str]:
    """The pip requirements a logged model needs to load: ``torch`` and this package at its installed
    version (the pickled model's classes live in :mod:`primus_dagster.training.models`); only
    ``torch`` when the package is not installed as a distribution (a source checkout on ``sys.path``)."""
    try:
        return ["torch", f"{_DISTRIBUTION}=={importlib.metadata.version(_DISTRIBUTION)}"]
    except importlib.metadata.PackageNotFoundError:
        return ["torch"]


def dataset_profile(entry: Mapping[str, Any]) -> dict[str, int]:
    """The counts of a :func:`~primus_dagster.training.planning.consumed_sources` entry an MLflow dataset's
    *profile* shows: partitions, tasks, bytes, Kafka ``records`` (the offset ranges' sizes) and
    ``incomplete_partitions`` (read in part: tasks given up).

    >>> dataset_profile({"partitions": ["a", "b"], "tasks": 3, "bytes": 10, "offsets": {"t:0": [5, 9]}})
    {'partitions': 2, 'tasks': 3, 'bytes': 10, 'records': 4, 'incomplete_partitions': 0}
    """
    out = {"partitions": len(entry.get("partitions", ())), "tasks": int(entry.get("tasks", 0))}
    out["bytes"] = int(entry.get("bytes", 0))
    if "offsets" in entry:
        out["records"] = sum(int(stop) - int(first) for first, stop in entry["offsets"].values())
    out["incomplete_partitions"] = len(entry.get("incomplete_partitions", ()))
    return out


def arrow_colspec(schema: pa.Schema) -> Schema:
    """``schema`` as MLflow column specs (the dataset's *Schema* tab): integers ``long`` / ``integer``,
    floats ``float`` / ``double``, timestamps ``datetime``, strings (also dictionary-encoded) ``string``,
    lists ``array`` of their items; another type is named ``string`` (MLflow has no name for it)."""
    return Schema([ColSpec(_mlflow_type(field.type), field.name, required=not field.nullable) for field in schema])


def _mlflow_type(arrow: pa.DataType) -> DataType | Array:
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow) or pa.types.is_fixed_size_list(arrow):
        return Array(_mlflow_type(arrow.value_type))
    if pa.types.is_dictionary(arrow):
        return _mlflow_type(arrow.value_type)
    for test, kind in _ARROW_TO_MLFLOW:
        if test(arrow):
            return kind
    return DataType.string


_ARROW_TO_MLFLOW = (
    (pa.types.is_int64, DataType.long),
    (pa.types.is_uint64, DataType.long),
    (pa.types.is_integer, DataType.integer),
    (pa.types.is_float32, DataType.float),
    (pa.types.is_floating, DataType.double),
    (pa.types.is_boolean, DataType.boolean),
    (pa.types.is_timestamp, DataType.datetime),
    (pa.types.is_binary, DataType.binary),
    (pa.types.is_large_binary, DataType.binary),
)


def source_tags() -> dict[str, str]:
    """The tags ``mlflow.start_run`` sets on a run and ``MlflowClient.create_run`` does not: who ran it
    (``mlflow.user``) and from what (``mlflow.source.name`` / ``mlflow.source.type``, the command's
    script; the Dagster glue names its job instead), from MLflow's own context providers -- the runs
    table's *User* and *Source* columns."""
    from mlflow.tracking.context.registry import resolve_tags

    return {k: str(v) for k, v in resolve_tags().items() if k in _SOURCE_TAGS}


_SOURCE_TAGS = ("mlflow.user", "mlflow.source.name", "mlflow.source.type", "mlflow.source.git.commit")
_MAX_ATTEMPTS_NAMED = 1000  # runs of one key counted for its next run's name (more: the name repeats)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class TrackingUriError(ValueError):
    """A tracking URI MLflow has no store for (its scheme), named with the schemes it takes.

    Example::

        MlflowTracker("bogus://x", "primus")  # TrackingUriError: tracking URI 'bogus://x': ...
    """


class MlflowTracker:
    """One MLflow run of a training job, resumable by ``run_key`` (see the module docstring).

    ``tracking_uri`` None -> :func:`default_tracking_uri`. The experiment is created when missing
    (with ``artifact_location``, default ``<sqlite db folder>/artifacts``) and restored when deleted.

    Example::

        tracker = MlflowTracker(None, "primus")
        tracker.start("job-42", {"lr": 1e-3, "mode": "mixed"})
        if tracker.resumed and (local := tracker.latest_checkpoint()) is not None:
            ckpt = load_checkpoint(local)
        tracker.log_metrics({"loss": 0.41, "auc": 0.77}, step=500)
        tracker.log_checkpoint(save_checkpoint(ckpt, work / checkpoint_name(500)), step=500)
        model_uri = tracker.log_model(model)
        tracker.finish()
    """

    def __init__(self, tracking_uri: str | None, experiment: str, *, artifact_location: str | None = None) -> None:
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.experiment = experiment
        try:
            self.client = mlflow.MlflowClient(self.tracking_uri)
        except UnsupportedModelRegistryStoreURIException:
            scheme = self.tracking_uri.split(":", 1)[0]
            raise TrackingUriError(
                f"tracking URI {self.tracking_uri!r}: MLflow has no store for the scheme {scheme!r}; use "
                "sqlite:///PATH, file:///PATH, http(s)://HOST (an MLflow server) or a database URI "
                "(postgresql://, mysql://, mssql://)"
            ) from None
        self.experiment_id = self._experiment(artifact_location or _artifact_root(self.tracking_uri))
        self.run_id: str | None = None
        self.resumed = False

    def _experiment(self, artifact_location: str | None) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is None:
            try:
                return self.client.create_experiment(
                    self.experiment, artifact_location=artifact_location, tags=EXPERIMENT_TAGS
                )
            except MlflowException:  # created concurrently by another process
                found = self.client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
        if found.lifecycle_stage == "deleted":
            self.client.restore_experiment(found.experiment_id)
        for name, value in EXPERIMENT_TAGS.items():  # experiments created before the tag existed
            if found.tags.get(name) != value:
                self.client.set_experiment_tag(found.experiment_id, name, value)
        return found.experiment_id

    # ------------------------------------------------------------------ the run
    @property
    def run_url(self) -> str:
        """Where the run is shown: ``<tracking uri>/#/experiments/<exp>/runs/<run>`` for an MLflow
        server (http/https); for other stores the same ``<tracking uri>#/experiments/...`` locator
        (open it with ``mlflow ui --backend-store-uri <tracking uri>``)."""
        run_id = self.require_run_id()
        base = self.tracking_uri
        if base.startswith(("http://", "https://")):
            base = base.rstrip("/") + "/"
        return f"{base}#/experiments/{self.experiment_id}/runs/{run_id}"

    def require_run_id(self) -> str:
        """The id of the started run; RuntimeError before :meth:`start`."""
        if self.run_id is None:
            raise RuntimeError("no MLflow run: call MlflowTracker.start() first")
        return self.run_id

    def runs_of(self, run_key: str, max_results: int = 1) -> list[Any]:
        """The runs tagged ``primus.run_key == run_key``, newest first (at most ``max_results``)."""
        if "'" in run_key:
            raise ValueError(f"run_key must not contain a single quote: {run_key!r}")
        return list(
            self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'",
                order_by=["attributes.start_time DESC"],
                max_results=max_results,
            )
        )

    def unfinished_run(self, run_key: str) -> Any:
        """The most recent run with ``run_key`` when it is not FINISHED (else None)."""
        runs = self.runs_of(run_key)
        return runs[0] if runs and runs[0].info.status != "FINISHED" else None

    def start(
        self, run_key: str, params: Mapping[str, Any], tags: Mapping[str, Any] | None = None, resume: bool = True
    ) -> str:
        """Open the run for ``run_key`` and return its id.

        With ``resume``, the most recent run tagged ``primus.run_key == run_key`` is reused when
        it is not FINISHED (RUNNING after a killed process, FAILED or KILLED): it is set RUNNING
        again and only its missing params are logged (MLflow params are immutable; a differing
        value is kept and a warning logged). Otherwise a new run is created, named ``run_key`` -- or
        ``run_key #n`` for the n-th run of that key (a re-run of a trained window): every attempt has
        its own name in the runs table. Params are stringified (cut at 6000 characters); ``tags`` are
        set in both cases, over the source and user tags ``mlflow.start_run`` sets
        (:func:`source_tags`).
        """
        values = {str(k): str(v)[:_MAX_PARAM_LEN] for k, v in params.items()}
        earlier = self.runs_of(run_key, max_results=_MAX_ATTEMPTS_NAMED)
        found = earlier[0] if resume and earlier and earlier[0].info.status != "FINISHED" else None
        if found is not None:
            self.run_id, self.resumed = found.info.run_id, True
            self.client.update_run(self.run_id, status="RUNNING")
            old = found.data.params
            differing = sorted(k for k in values if k in old and old[k] != values[k])
            if differing:
                log.warning(
                    "MLflow run %s (run_key %s) resumed with different params %s; keeping the logged ones",
                    self.run_id,
                    run_key,
                    {k: (old[k], values[k]) for k in differing},
                )
            values = {k: v for k, v in values.items() if k not in old}
        else:
            name = f"{run_key} #{len(earlier) + 1}" if earlier else run_key
            run = self.client.create_run(self.experiment_id, run_name=name, tags={RUN_KEY_TAG: run_key})
            self.run_id, self.resumed = run.info.run_id, False
        for chunk in _chunks([Param(k, v) for k, v in values.items()], 100):
            self.client.log_batch(self.run_id, params=chunk)
        self.set_tags({**source_tags(), **(tags or {})})
        return self.run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` at ``step`` (NaN values are skipped)."""
        run_id = self.require_run_id()
        now = int(time.time() * 1000)
        entries = [Metric(str(k), float(v), now, int(step)) for k, v in metrics.items() if not math.isnan(float(v))]
        for chunk in _chunks(entries, 1000):
            self.client.log_batch(run_id, metrics=chunk)

    def log_metric_points(self, points: Iterable[tuple[str, float, int]]) -> None:
        """Log many ``(name, value, step)`` points at once (a time series; NaN values are skipped)."""
        run_id = self.require_run_id()
        now = int(time.time() * 1000)
        entries = [Metric(str(k), float(v), now, int(step)) for k, v, step in points if not math.isnan(float(v))]
        for chunk in _chunks(entries, 1000):
            self.client.log_batch(run_id, metrics=chunk)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set run tags (values stringified)."""
        run_id = self.require_run_id()
        for chunk in _chunks([RunTag(str(k), str(v)) for k, v in tags.items()], 100):
            self.client.log_batch(run_id, tags=chunk)

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        """``data`` as a JSON artifact of the run (e.g. ``features.json``: the model's feature layout)."""
        self.client.log_dict(self.require_run_id(), dict(data), artifact_file)

    def log_source_inputs(
        self,
        sources: Mapping[str, Mapping[str, Any]],
        context: str = "training",
        schemas: Mapping[str, pa.Schema] | None = None,
    ) -> int:
        """Record the data the run consumed as MLflow dataset inputs (``mlflow.log_input``; the run's
        *Datasets used* in the UI): one dataset per source, named after it, with ``source_type`` from
        ``sources[name]["type"]``, the whole entry (location, partitions, table versions, Kafka offset
        ranges) as the dataset's source JSON, and a digest of it -- the same data gives the same digest,
        so runs that read the same versions and offsets show the same dataset. Tags: ``mlflow.data.context``
        (``context``) and ``primus.kind``, and ``primus.incomplete`` (``true``) for an entry marked
        ``incomplete`` (tasks given up, see ``consumed_sources``). Each dataset's *profile* counts what the
        run was handed (partitions, tasks, bytes, Kafka records of its offset ranges, partitions read in
        part) and its *schema* is ``schemas[name]`` (the columns the trainer reads, as MLflow column specs)
        where given. The number of datasets logged.

        Example::

            tracker.log_source_inputs({"imp": {"type": "delta", "kind": "batch", "uri": "tables/imp",
                                               "partitions": ["2026-11-01T00:00"], "versions": ["12"]}})
        """
        run_id = self.require_run_id()
        inputs = []
        for name, entry in sorted(sources.items()):
            text = json.dumps(entry, sort_keys=True, default=str)
            schema = (schemas or {}).get(name)
            dataset = Dataset(
                name=str(name),
                digest=hashlib.sha256(text.encode()).hexdigest()[:20],
                source_type=str(entry.get("type", "unknown"))[:36],
                source=text,
                schema=None if schema is None else json.dumps({"mlflow_colspec": arrow_colspec(schema).to_dict()}),
                profile=json.dumps(dataset_profile(entry)),
            )
            tags = [InputTag("mlflow.data.context", context), InputTag("primus.kind", str(entry.get("kind", "")))]
            if entry.get("incomplete"):  # tasks given up: its partitions were not consumed in full
                tags.append(InputTag("primus.incomplete", "true"))
            inputs.append(DatasetInput(dataset, tags))
        if inputs:
            self.client.log_inputs(run_id, datasets=inputs)
        return len(inputs)

    # ------------------------------------------------------------------ checkpoints
    def log_checkpoint(self, directory: str | os.PathLike[str], step: int, keep_last: int | None = None) -> str:
        """Upload the checkpoint folder as artifacts ``checkpoints/<checkpoint_name(step)>``; that path.

        The files go up one by one, ``manifest.json`` last: an upload cut short leaves a checkpoint
        without its manifest, which :meth:`latest_checkpoint` skips. With ``keep_last``, the older
        checkpoints of the run beyond the newest ``keep_last`` are then deleted
        (:meth:`prune_checkpoints`): disk per run stays bounded, and the newest -- the final one
        when the run ends -- is always kept.
        """
        run_id = self.require_run_id()
        if not Path(directory).is_dir():
            raise FileNotFoundError(f"{directory}: no such checkpoint directory")
        artifact_path = f"{CHECKPOINTS}/{checkpoint_name(step)}"
        root = Path(directory)
        for file in checkpoint_files(root):
            if not file.is_file():
                raise FileNotFoundError(f"{file}: missing from the checkpoint directory (written by save_checkpoint?)")
            folder = file.parent.relative_to(root).as_posix()  # "." or "shards"
            self.client.log_artifact(run_id, str(file), artifact_path if folder == "." else f"{artifact_path}/{folder}")
        if keep_last is not None:
            self.prune_checkpoints(keep_last)
        return artifact_path

    def prune_checkpoints(self, keep_last: int, run_id: str | None = None) -> list[int]:
        """Delete the checkpoints of ``run_id`` (default: the current run) older than its newest
        ``keep_last`` (>= 1); the steps deleted."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        run_id = run_id or self.require_run_id()
        old = self.checkpoint_steps(run_id)[:-keep_last]
        if old:
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

            repository = get_artifact_repository(self.client.get_run(run_id).info.artifact_uri)
            for step in old:
                repository.delete_artifacts(f"{CHECKPOINTS}/{checkpoint_name(step)}")
            log.info("checkpoint retention: deleted %d older checkpoint(s), kept the newest %d", len(old), keep_last)
        return old

    def finished_run(self, run_key: str) -> str | None:
        """The id of the most recent FINISHED run with ``run_key`` (a warm start's source), or None."""
        if "'" in run_key:
            raise ValueError(f"run_key must not contain a single quote: {run_key!r}")
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(f"tags.`{RUN_KEY_TAG}` = '{run_key}' and attributes.status = 'FINISHED'"),
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def latest_finished(self, tags: Mapping[str, str], order_by: str = "attributes.start_time DESC") -> Any | None:
        """The first FINISHED run (an ``mlflow.entities.Run``) with all of ``tags``, by ``order_by``; None without one.

        Example: the newest trained window of a job, ``latest_finished({"primus.job": "ctr",
        "primus.run_kind": "window"}, "params.window_end DESC")``.
        """
        clauses = ["attributes.status = 'FINISHED'"]
        for name, value in tags.items():
            if "'" in name + value or "`" in name:
                raise ValueError(f"tag filters must not contain quotes: {name!r} = {value!r}")
            clauses.append(f"tags.`{name}` = '{value}'")
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=" and ".join(clauses), order_by=[order_by], max_results=1
        )
        return runs[0] if runs else None

    def checkpoint_steps(self, run_id: str | None = None) -> list[int]:
        """The steps of the checkpoints logged in ``run_id`` (default: the current run), ascending."""
        run_id = run_id or self.require_run_id()
        steps = (
            checkpoint_step(Path(info.path).name)
            for info in self.client.list_artifacts(run_id, CHECKPOINTS)
            if info.is_dir
        )
        return sorted(step for step in steps if step is not None)

    def latest_checkpoint(self, dest: str | os.PathLike[str] | None = None, run_id: str | None = None) -> Path | None:
        """Download the highest-step *complete* checkpoint of ``run_id`` (default: the current run) into
        ``dest`` (default: a new temp folder the caller owns) and return its local folder; None when
        none was logged. A checkpoint whose upload was cut (manifest missing, a file missing or short:
        :func:`~primus_dagster.training.checkpoint.verify_checkpoint`) is skipped with a warning, and
        the one before it is tried: a torn checkpoint is never returned."""
        run_id = run_id or self.require_run_id()
        steps = self.checkpoint_steps(run_id)
        if not steps:
            return None
        target = Path(dest) if dest is not None else Path(tempfile.mkdtemp(prefix="primus-ckpt-"))
        target.mkdir(parents=True, exist_ok=True)
        for step in reversed(steps):
            local = Path(self.client.download_artifacts(run_id, f"{CHECKPOINTS}/{checkpoint_name(step)}", str(target)))
            try:
                verify_checkpoint(local)
            except CheckpointError as error:
                log.warning(
                    "run %s: checkpoint at step %d is incomplete and is not loaded (%s); trying the one before it",
                    run_id,
                    step,
                    error,
                )
                continue
            return local
        log.warning("run %s: none of its %d checkpoint(s) is complete", run_id, len(steps))
        return None

    # ------------------------------------------------------------------ the model
    def log_model(
        self,
        model: torch.nn.Module,
        *,
        name: str = "model",
        input_example: dict[str, Any] | None = None,
        signature: ModelSignature | bool | None = None,
    ) -> str:
        """Log ``model`` with ``mlflow.pytorch`` into the current run; its ``models:/<id>`` URI.

        Saved as a (cloud)pickle -- MLflow's ``pt2`` format needs tensor-only inputs and our
        models take ``(dense, sparse, kind)``; MLflow's warning about that choice is not printed --
        with the pip requirements of
        :func:`model_requirements` (``torch`` and ``primus_dagster==<version>``: no slow environment
        inference). ``signature`` None: :func:`model_signature` from the model's ``n_dense`` /
        ``n_sparse`` when it has them (the project's models do), else none; False: none; or a
        given :class:`~mlflow.models.signature.ModelSignature`. The signature documents the tensor
        inputs; MLflow's pyfunc serving cannot call the model (it needs ``kind``), so MLflow does
        not validate it. A custom model (``training.model.type: custom``) adds its factory's
        distribution to the requirements, or -- a factory outside any installed distribution (a file,
        a checkout) -- is pickled with its module's code by value (:func:`~.model_api.factory_code`).
        ``input_example`` (JSON-able) is stored in the ``MLmodel`` metadata rather
        than as an MLflow input example, which MLflow would try (and fail) to validate against pyfunc
        serving. Load it with ``mlflow.pytorch.load_model`` inside :func:`use_tracking_uri`.
        """
        run_id = self.require_run_id()
        params = self.client.get_run(run_id).data.params
        if signature is None:
            n_dense, n_sparse = getattr(model, "n_dense", None), getattr(model, "n_sparse", None)
            lists = getattr(model, "list_names", [])
            if n_dense is not None and n_sparse is not None:
                signature = model_signature(n_dense, n_sparse, lists)
            else:
                signature = False
        # Created here rather than by log_model: without an active fluent run MLflow would put the
        # model into the default experiment, whose artifacts go to ./mlruns of the working dir.
        logged = self.client.create_logged_model(self.experiment_id, name=name, source_run_id=run_id, params=params)
        metadata = {"primus_input_example": input_example} if input_example is not None else None
        requirements = model_requirements()
        spec = getattr(model, "spec", None)  # a custom model's or an MTRM's team towers' code
        factories = spec.factories().values() if isinstance(spec, ModelSpec) else ()
        codes = [factory_code(reference) for reference in factories]
        by_value = list({id(c.by_value): c.by_value for c in codes if c.by_value is not None}.values())
        for code in codes:
            requirements += [r for r in code.requirements if r not in requirements]
        for module in by_value:
            cloudpickle.register_pickle_by_value(module)
        try:
            with use_tracking_uri(self.tracking_uri), _without_pickle_warning():
                info = mlflow.pytorch.log_model(
                    model,
                    name=name,
                    run_id=run_id,
                    model_id=logged.model_id,
                    serialization_format="pickle",
                    pip_requirements=requirements,
                    signature=signature,
                    metadata=metadata,
                )
        finally:
            for module in by_value:
                cloudpickle.unregister_pickle_by_value(module)
        return info.model_uri

    # ------------------------------------------------------------------ the model registry
    def register_model(self, model_uri: str, name: str, tags: Mapping[str, Any] | None = None) -> str:
        """Register the logged model ``model_uri`` (``models:/<model id>`` from :meth:`log_model`) as a
        new version of the registered model ``name`` (created when missing) with ``tags`` (values
        stringified); the version number (``models:/<name>/<version>`` loads it).

        The version records the logged model's source run (default: the current run), and the
        logged model lists the version (tag ``mlflow.modelVersions``, as ``mlflow.register_model``
        does), so the MLflow UI links them both ways.
        """
        try:
            self.client.create_registered_model(name)
        except MlflowException as error:
            if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
        tail = model_uri.removeprefix("models:/")
        # a logged model's models:/<id>; not a run's path or a registry URI (models:/<name>/<version>, @alias)
        model_id = tail if model_uri.startswith("models:/") and not any(c in tail for c in "/@") else None
        logged = self.client.get_logged_model(model_id) if model_id is not None else None
        run_id = logged.source_run_id if logged is not None and logged.source_run_id else self.run_id
        # MLflow's SQL registry store looks the logged model up through the global tracking URI.
        with use_tracking_uri(self.tracking_uri):
            version = self.client.create_model_version(
                name,
                source=model_uri,
                run_id=run_id,
                tags={str(k): str(v) for k, v in (tags or {}).items()},
                model_id=model_id,
            )
        if logged is not None:
            listed = json.loads(logged.tags.get(_MODEL_VERSIONS_TAG) or "[]")
            listed.append({"name": version.name, "version": version.version})
            self.client.set_logged_model_tags(logged.model_id, {_MODEL_VERSIONS_TAG: json.dumps(listed)})
        log.info("registered %s as version %s of model %s", model_uri, version.version, name)
        return str(version.version)

    def set_alias(self, name: str, alias: str, version: str | int) -> None:
        """Point the alias ``alias`` of registered model ``name`` at ``version`` (``models:/<name>@<alias>``
        loads it); an alias names one version, so this moves it from the one it named before."""
        self.client.set_registered_model_alias(name, alias, str(version))

    def alias_version(self, name: str, alias: str) -> str | None:
        """The version ``models:/<name>@<alias>`` names, or None (no such model or alias)."""
        try:
            return str(self.client.get_model_version_by_alias(name, alias).version)
        except MlflowException:
            return None

    def model_version_url(self, name: str, version: str | int) -> str:
        """Where the MLflow UI shows a model version: ``<tracking uri>/#/models/<name>/versions/<version>``
        for an MLflow server (http/https), the same ``<tracking uri>#/models/...`` locator otherwise
        (as :attr:`run_url`)."""
        base = self.tracking_uri
        if base.startswith(("http://", "https://")):
            base = base.rstrip("/") + "/"
        return f"{base}#/models/{quote(name, safe='')}/versions/{version}"

    def finish(self, status: str = "FINISHED") -> None:
        """End the run with ``status`` (FINISHED, FAILED or KILLED)."""
        if status not in ("FINISHED", "FAILED", "KILLED"):
            raise ValueError(f"status must be FINISHED, FAILED or KILLED, got {status!r}")
        self.client.set_terminated(self.require_run_id(), status)
