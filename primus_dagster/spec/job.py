"""The job spec (Primus: JobCRD): one declarative contract for resources, data and training.

Example::

    from primus_dagster.spec import load_job_spec
    job = load_job_spec("examples/job.yaml")
    print(job.training.mode, [s.name for _, s in job.dataset.all_sources()])
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from primus_dagster.spec.automation import AutomationSpec
from primus_dagster.spec.base import StrictModel
from primus_dagster.spec.dataset import DatasetSpec
from primus_dagster.spec.durations import NonNegativeDuration, PositiveDuration, duration_default
from primus_dagster.spec.features import FeaturesSpec
from primus_dagster.spec.names import job_asset_names
from primus_dagster.spec.sources import KafkaSourceSpec

MAX_REPLICAS = 10_000_000  # executors per pool: the scaling simulator replays pools of 1.25 M
MAX_HASH_BUCKETS = 2**31 - 1
MAX_EMBEDDING_BYTES = 1 << 40
_QUANTITY = r"^\d{1,15}(\.\d{1,9})?(Ki|Mi|Gi|Ti)?$"

LayerSize = Annotated[int, Field(ge=1, le=1_048_576)]
"""Width of one hidden layer."""


class PoolSpec(StrictModel):
    """One executor pool: the data executors or the trainers, their count and resources."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Executors started for a run (data pool; `--executors` overrides it), or the number of "
        "trainer ranks (training pool: more than 1 trains a lock-step group).",
    )
    min_replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Fewest executors horizontal scaling keeps in the data pool (at most `replicas`); the "
        "training pool's ranks stay at `replicas`.",
    )
    max_replicas: int = Field(
        default=4,
        ge=1,
        le=MAX_REPLICAS,
        description="Most executors horizontal scaling grows the data pool to (at least `replicas`); a pool with "
        "min_replicas equal to max_replicas is fixed.",
    )
    cpu: float = Field(
        default=1.0,
        gt=0,
        le=1024,
        description="CPU cores per executor (fractions allowed): locally `ceil(cpu)` pinned cores, on Kubernetes "
        "the pod's request and limit.",
    )
    memory: str = Field(
        default="2Gi",
        pattern=_QUANTITY,
        max_length=32,
        description="Memory per executor: bytes, or a number with a Ki, Mi, Gi or Ti suffix (`512Mi`, `2Gi`); "
        "an executor above it is OOM-killed.",
    )
    task_runners: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Tasks a data executor reads at once, one thread each; default: one per whole core of "
        "`cpu`, at least 1 (more than `cpu` only helps to overlap reads from a slow store).",
    )
    restart: Literal["always", "on_failure", "never"] = Field(
        default="on_failure",
        description="When a finished executor is started again: `always`, `on_failure` (after a failure or an "
        "OOM kill; trainers restart from the latest checkpoint) or `never`.",
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        le=10_000,
        description="Restarts allowed per executor; one more failure fails the job.",
    )
    blacklist_after: int = Field(
        default=2,
        ge=1,
        le=10_000,
        description="Failed executor attempts on one node (locally: a CPU core) after which no executor is "
        "placed there again.",
    )
    oom_memory_factor: float = Field(
        default=1.5,
        ge=1,
        le=100,
        description="An OOM-killed executor restarts with its memory times this factor (at most `max_memory`).",
    )
    max_memory: str | None = Field(
        default=None,
        pattern=_QUANTITY,
        max_length=32,
        description="Cap on the memory raised after OOM kills and by vertical scaling, a quantity like `memory`; "
        "default: 4 x `memory`.",
    )

    @field_validator("memory", "max_memory")
    @classmethod
    def _some_memory(cls, value: str | None) -> str | None:
        if value is not None and float(re.match(r"[\d.]+", value).group()) <= 0:  # type: ignore[union-attr]
            raise ValueError(f"memory must be more than 0, got {value!r}")
        return value

    @model_validator(mode="after")
    def _runners_follow_cpu(self) -> PoolSpec:
        """``task_runners`` left out: one per whole core of ``cpu``. Set past validation (it stays unwritten:
        ``model_fields_set`` still tells what the spec wrote)."""
        if "task_runners" not in self.model_fields_set:
            object.__setattr__(self, "task_runners", self.default_task_runners())
        return self

    def default_task_runners(self) -> int:
        """What ``task_runners`` is when the spec leaves it out: one per whole core of ``cpu``, at least 1."""
        return min(256, max(1, math.floor(self.cpu)))

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpec:
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(
                f"need min_replicas <= replicas <= max_replicas, got {self.min_replicas} <= {self.replicas} <= {self.max_replicas}"
            )
        return self


class PoolsSpec(StrictModel):
    """Executor pools and the backend that runs them.

    ``namespace`` and ``image`` belong to the kubernetes backend (``image`` is required there); with
    another backend either one is an error, since it could do nothing (docs/kubernetes.md).
    ``in_trainer`` runs ``pools.data.replicas`` data executors as threads of the trainer's process (one
    trainer; no pool: no restarts, limits or scaling), which saves the executor processes, the Flight
    stream and the copy into shared memory (docs/data_plane.md).
    """

    backend: Literal["local", "kubernetes", "in_trainer"] = Field(
        default="local",
        description="Where the data executors run: `local` OS processes, `kubernetes` pods, or `in_trainer` "
        "threads of the trainer's process (one trainer, no pool keys but `replicas` and `task_runners`).",
    )
    namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Kubernetes namespace of the executor pods (kubernetes backend only; default: the run's own).",
    )
    image: str | None = Field(
        default=None,
        pattern=r"^\S+$",
        description="Container image of the executor pods (kubernetes backend only, and required there).",
    )
    data: PoolSpec = Field(
        default_factory=lambda: PoolSpec(replicas=2, max_replicas=8),
        description="The data executors that read the sources and serve batches to the trainers "
        "(default: 2 executors, scaled between 1 and 8).",
    )
    training: PoolSpec = Field(
        default_factory=lambda: PoolSpec(replicas=1, max_replicas=1),
        description="The trainers: `replicas` ranks with their `cpu`, `memory`, `restart` and `max_restarts` "
        "(the data-only keys are errors here).",
    )

    @field_validator("training")
    @classmethod
    def _training_keys(cls, value: PoolSpec) -> PoolSpec:
        """Trainer ranks are a fixed group (``replicas``) with ``cpu``, ``memory``, ``restart`` and
        ``max_restarts`` (docs/training.md); the data pool's other keys would do nothing there."""
        keys = ("blacklist_after", "oom_memory_factor", "max_memory")
        unused = [key for key in keys if getattr(value, key) != PoolSpec.model_fields[key].default]
        if value.task_runners != value.default_task_runners():
            unused.insert(0, "task_runners")
        if unused:
            raise ValueError(
                f"pools.training does not use {', '.join(unused)} (data executors only): remove "
                f"{'it' if len(unused) == 1 else 'them'}"
            )
        if value.restart == "always":
            raise ValueError(
                "pools.training.restart: always: a trainer group that finished is not started again; "
                "use on_failure (restart from the latest checkpoint, up to max_restarts) or never"
            )
        return value

    @field_validator("namespace", "image")
    @classmethod
    def _kubernetes_keys(cls, value: str | None, info: ValidationInfo) -> str | None:
        backend = info.data.get("backend")  # absent when the backend itself was invalid
        if backend in ("local", "in_trainer") and value is not None:
            raise ValueError(
                f"only the kubernetes backend uses pools.{info.field_name}: remove it or set pools.backend: kubernetes"
            )
        if backend == "kubernetes" and info.field_name == "image" and value is None:
            raise ValueError("required when pools.backend is kubernetes: the container image of the executor pods")
        return value

    @model_validator(mode="after")
    def _in_trainer_keys(self) -> PoolsSpec:
        """Executors that are threads of one trainer have a count and task runners, nothing a pool
        of processes has (limits, restarts, blacklist, memory), and serve that one trainer."""
        if self.backend != "in_trainer":
            return self
        if "data" in self.model_fields_set:
            unused = sorted(self.data.model_fields_set - {"replicas", "task_runners"})
            if unused:
                raise ValueError(
                    f"pools.backend in_trainer runs the data executors as threads of the trainer: "
                    f"pools.data.{', pools.data.'.join(unused)} would do nothing (only replicas and task_runners "
                    "apply); remove it or use backend local"
                )
        if self.training.replicas != 1:
            raise ValueError(
                f"pools.backend in_trainer serves one trainer, pools.training.replicas is {self.training.replicas}: "
                "a multi-trainer job runs its ranks as processes, use backend local"
            )
        return self


class MetricSpec(StrictModel):
    """One utilisation signal u_k of the horizontal load metric L_u = sum_k w_k * u_k (Primus: MetricCRD)."""

    name: Literal["buffer_fill", "cpu", "memory", "io"] = Field(
        description="The signal u_k: `cpu` (cores busy / allocated), `memory` (RSS / memory allocated), `io` "
        "(IO bytes/s / the IO capacity) or `buffer_fill` (the data buffer's fill, 0..1).",
    )
    weight: float = Field(
        ge=0,
        le=1e6,
        description="w_k: this signal's weight in L_u; weights are normalised (only their ratios matter), 0 "
        "leaves the signal out.",
    )
    aggregation: Literal["mean", "max"] = Field(
        default="mean",
        description="How the latest samples of a pool's live executors combine into the pool's u_k: `mean` or `max`.",
    )


class HorizontalScalingSpec(StrictModel):
    """Add executors above ``scale_up_threshold`` (L_theta), remove below ``scale_down_threshold``.

    The data pool's load is ``L_u / (1 - trainer wait)``: the utilisation the pool would need to
    serve everything the trainers want (docs/scaling.md); with ``proportional`` a step is sized
    from that measurement (``step`` is the least one), else it is ``step`` executors.
    """

    enabled: bool = Field(
        default=True,
        description="Grow and shrink the data pool within [min_replicas, max_replicas] from its load; false: "
        "the pool keeps its size.",
    )
    metrics: list[MetricSpec] = Field(
        # CPU only: memory does not rise when the pool falls behind (it is vertical scaling's); the
        # trainers' wait enters as demand (L_u / (1 - wait)), and buffer fill and trainer wait are
        # read by the ratio rule, the right way round (docs/scaling.md).
        default_factory=lambda: [MetricSpec(name="cpu", weight=1.0)],
        description="The weighted utilisation signals of the load L_u; default: `cpu` alone (memory is left to "
        "vertical scaling, buffer fill and trainer wait to the data/training ratio rule).",
    )
    scale_up_threshold: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="L_theta: the data pool's load (utilisation, 0..1) above which executors are added.",
    )
    scale_down_threshold: float = Field(
        default=0.3,
        ge=0,
        lt=1,
        description="The load (0..1) below which executors are removed; must be below scale_up_threshold.",
    )
    step: int = Field(
        default=1,
        ge=1,
        le=MAX_REPLICAS,
        description="Executors added or removed per decision (the least change when `proportional`).",
    )
    proportional: bool = Field(
        default=True,
        description="Size a step from the measured load, to bring it to scale_up_threshold - 0.05; false: "
        "always `step` executors.",
    )

    @model_validator(mode="after")
    def _order(self) -> HorizontalScalingSpec:
        if self.scale_down_threshold >= self.scale_up_threshold:
            raise ValueError(
                f"scale_down_threshold ({self.scale_down_threshold}) must be below scale_up_threshold ({self.scale_up_threshold})"
            )
        return self


class VerticalScalingSpec(StrictModel):
    """Resize executors to a recency-weighted demand D(N_R) plus headroom; skip changes below ``min_change``."""

    enabled: bool = Field(
        default=True,
        description="Resize executors from their measured use (memory only where horizontal scaling sizes the "
        "pool); false: executors keep their `cpu` and `memory`.",
    )
    history_decay: float = Field(
        default=0.7,
        gt=0,
        lt=1,
        description="Recency weighting of the demand D(N_R): each sample weighs this times the one after it "
        "(smaller: older samples are forgotten faster).",
    )
    headroom: float = Field(
        default=0.2,
        ge=0,
        le=100,
        description="Fraction added on top of the predicted demand (0.2: 20 % more than the demand).",
    )
    min_change: float = Field(
        default=0.1,
        ge=0,
        le=100,
        description="R_theta: a resize smaller than this fraction of the current allocation is not made.",
    )


class ScalingSpec(StrictModel):
    """Scaling policies; only one acts per decision tick, each change has a cooldown.

    Defaults fit runs from seconds (a local phase) to days (a cluster): a decision every 5 s, a
    pool that changed waits 10 s, and an executor's first 5 s of samples (start-up) are ignored.
    """

    interval: PositiveDuration = Field(
        default=duration_default("5s"), description="Time between two scaling decisions (a duration: `5s`, `1m`)."
    )
    cooldown: PositiveDuration = Field(
        default=duration_default("10s"), description="How long a pool that changed waits before it changes again."
    )
    warmup: NonNegativeDuration = Field(
        default=duration_default("5s"),
        description="Samples from an executor's first this long (its start-up) are left out of the decisions.",
    )
    horizontal: HorizontalScalingSpec = Field(
        default_factory=HorizontalScalingSpec,
        description="How many data executors run: the load signals, thresholds and steps.",
    )
    vertical: VerticalScalingSpec = Field(
        default_factory=VerticalScalingSpec, description="How much CPU and memory each executor gets."
    )


class DataPlaneSpec(StrictModel):
    """How read tasks are planned (DTGG), handed out to the data executors and retried (data driver)."""

    planner_threads: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Threads that list the sources' partitions when a window is planned (`--threads` overrides it).",
    )
    pack_bytes: int = Field(
        default=128 * 2**20,
        ge=0,
        le=2**40,
        description="Bytes of small Parquet, Delta or Iceberg files packed into one read task: a partition's "
        "files, in order, while their sizes plus open_cost_bytes each add up to at most this (Spark's "
        "maxPartitionBytes). 0: a task per file.",
    )
    open_cost_bytes: int = Field(
        default=4 * 2**20,
        ge=0,
        le=2**40,
        description="What opening a file costs, in bytes, when packing (Spark's openCostInBytes): a pack holds "
        "at most pack_bytes / open_cost_bytes files.",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Failed attempts (errors or expired leases) after which a task, or a file of a pack, is given up.",
    )
    failed_task_threshold: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Share of a run's tasks (counted in files) that may be given up; one more fails the job.",
    )
    allow_failed_tasks: bool = Field(
        default=True,
        description="true: tasks given up below failed_task_threshold let the run go on without their rows, "
        "each reported with its file and error and its partition marked incomplete; false: the first task "
        "given up fails the run (as `train --strict` does).",
    )
    lease: PositiveDuration = Field(
        default=duration_default("60s"),
        description="How long a task stays leased to its executor without a heartbeat; past it the task goes back "
        "to be read by another executor.",
    )
    buffer_batches: int = Field(
        default=8,
        ge=1,
        le=1_000_000,
        description="Batches a data executor buffers per trainer before it stops reading (backpressure).",
    )
    deterministic: bool = Field(
        default=False,
        description="true: each trainer takes its batches in one order fixed by the plan, so with training.seed "
        "the same spec and data train the same model whatever the number of executors and trainers, at the "
        "cost of waiting to reorder (docs/data_plane.md). false: batches are trained as they arrive.",
    )
    backup_after: float = Field(
        default=0.0,
        ge=0,
        le=1e6,
        description="An idle executor gets a backup copy of a task running longer than this many times the "
        "median task time, and the first copy to finish is delivered. 0 (the default): no backup copies.",
    )


_MEMORY_LR_SCALE = 1.0
_ADAPT_BATCH_WEIGHT = 0.1  # chosen on the quality bench's tuning seeds at the spec's rate (docs/training.md)


_FACTORY = r"^[^:\s][^:]*:[A-Za-z_][A-Za-z0-9_]*$"


class TowerSpec(StrictModel):
    """A team's own module as one of MTRM's two towers: the factory that builds it and its ``params``.

    Set as ``training.model.memory`` or ``training.model.adapt`` (docs/models.md, "MTRM over your towers").
    """

    factory: str = Field(
        max_length=4096,
        pattern=_FACTORY,
        description="The function that builds the tower: 'package.module:function' (importable) or "
        "'path/to/file.py:function' (relative to the spec file); it gets a ModelContext (role `memory` or "
        "`adapt`; aux_dim: the width of the memory state an adapt tower reads) and returns a torch module.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="Handed to the factory as ModelContext.params (the tower's own sizes)."
    )


class ModelSpec(StrictModel):
    """Model shape: hashed sparse embeddings and dense features into one or two towers, or a team's own module.

    A team's module is ``type: custom`` with ``factory`` and ``params`` (docs/models.md).
    """

    type: Literal["mtrm", "single", "custom"] = Field(
        default="mtrm",
        description="`mtrm`: two towers, a memory tower learning the batch data and an adapt (serving) tower "
        "learning the stream; `single`: one DLRM-style tower learning every batch; `custom`: a team's module "
        "built by `factory`.",
    )
    factory: str | None = Field(
        default=None,
        max_length=4096,
        pattern=_FACTORY,
        description="type custom only: the function that builds the model, 'package.module:function' (importable) "
        "or 'path/to/file.py:function' (relative to the spec file); it gets a ModelContext (the declared "
        "features and params) and returns a torch module.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="type custom only: handed to the factory as ModelContext.params."
    )
    memory: TowerSpec | None = Field(
        default=None,
        description="type mtrm only: a team's module as the memory tower (batch data; its state(inputs), or else "
        "its logit, is h_aux); default: the built-in tower of memory_hidden.",
    )
    adapt: TowerSpec | None = Field(
        default=None,
        description="type mtrm only: a team's module as the adapt (serving) tower (the stream; inputs.aux is the "
        "detached h_aux); default: the built-in tower of adapt_hidden.",
    )
    embedding_dim: int = Field(
        default=16,
        ge=1,
        le=65_536,
        description="Width of the shared embedding table's rows (and of the dense features' bottom layer in "
        "the built-in single and adapt towers).",
    )
    hash_buckets: int = Field(
        default=100_000,
        ge=16,
        le=MAX_HASH_BUCKETS,
        description="Rows of the shared embedding table (ids hash modulo 2^31-1, so more rows are never used).",
    )
    memory_hidden: list[LayerSize] = Field(
        default_factory=lambda: [64, 32],
        max_length=64,
        description="Hidden-layer widths of the built-in memory tower's MLP (type mtrm), first layer first.",
    )
    adapt_hidden: list[LayerSize] = Field(
        default_factory=lambda: [128, 64],
        max_length=64,
        description="Hidden-layer widths of the top MLP of the built-in single tower and of MTRM's built-in "
        "adapt tower, first layer first.",
    )
    sparse_embeddings: bool = Field(
        default=True,
        description="Sparse embedding gradients with a lazy (sparse) Adam: a step updates only the rows its "
        "batch touches. Sharded (row_wise) tables need it.",
    )
    memory_lr_scale: float = Field(
        default=_MEMORY_LR_SCALE,
        gt=0,
        le=100,
        description="MTRM only: the memory tower learns at training.learning_rate x this (the adapt tower at "
        "training.learning_rate); the default 1 was chosen on `bench/quality.py`'s tuning seeds "
        "(docs/training.md).",
    )
    adapt_batch_weight: float = Field(
        default=_ADAPT_BATCH_WEIGHT,
        ge=0,
        le=100,
        description="MTRM only: weight of the adapt tower's loss on batch samples (it reads the detached memory "
        "state); 0 is the paper's split, the adapt tower learning the stream alone. The default 0.1 was chosen "
        "on `bench/quality.py`'s tuning seeds (docs/training.md).",
    )

    @model_validator(mode="after")
    def _factory_iff_custom(self) -> ModelSpec:
        if self.type == "custom" and self.factory is None:
            raise ValueError("type 'custom' needs factory: 'package.module:function' or 'path/to/file.py:function'")
        if self.type != "custom" and (self.factory is not None or self.params):
            key = "factory" if self.factory is not None else "params"
            raise ValueError(f"{key} applies to type 'custom'; type {self.type!r} is built in (remove it)")
        if self.type == "custom":
            # the built-in towers' widths: a custom module has its own (set them in params)
            for key in ("memory_hidden", "adapt_hidden"):
                if getattr(self, key) != ModelSpec.model_fields[key].get_default(call_default_factory=True):
                    raise ValueError(f"{key} shapes a built-in tower; a custom model takes its sizes from params")
        return self

    @model_validator(mode="after")
    def _towers_need_mtrm(self) -> ModelSpec:
        for key, hidden in (("memory", "memory_hidden"), ("adapt", "adapt_hidden")):
            if getattr(self, key) is None:
                continue
            if self.type != "mtrm":
                raise ValueError(f"{key} is a tower of type 'mtrm'; type {self.type!r} has none (remove it)")
            if getattr(self, hidden) != ModelSpec.model_fields[hidden].get_default(call_default_factory=True):
                raise ValueError(f"{hidden} shapes the built-in {key} tower; {key}.factory builds its own")
        return self

    def factories(self) -> dict[str, str]:
        """Every team module of this model, by where it sits: ``{"model": ...}`` (type custom) or
        ``{"memory": ..., "adapt": ...}`` (an MTRM over custom towers; either may be built in)."""
        found = {"model": self.factory} if self.factory is not None else {}
        found.update({key: tower.factory for key, tower in (("memory", self.memory), ("adapt", self.adapt)) if tower})
        return found

    @model_validator(mode="after")
    def _mtrm_keys_need_mtrm(self) -> ModelSpec:
        # the defaults pass (a dumped spec carries them), any other value on a single tower is a mistake
        for key, default, tower in (
            ("memory_lr_scale", _MEMORY_LR_SCALE, "memory"),
            ("adapt_batch_weight", _ADAPT_BATCH_WEIGHT, "adapt"),
        ):
            if self.type != "mtrm" and getattr(self, key) != default:
                raise ValueError(f"{key} applies to the MTRM's {tower} tower; type {self.type!r} has none (remove it)")
        return self

    @model_validator(mode="after")
    def _table_fits(self) -> ModelSpec:
        # The table and Adam's two moments, float32: past this no machine the suite runs on holds it.
        size = self.hash_buckets * self.embedding_dim * 4 * 3
        if size > MAX_EMBEDDING_BYTES:
            raise ValueError(
                f"hash_buckets x embedding_dim = {self.hash_buckets:,} x {self.embedding_dim} needs about "
                f"{size / 2**30:,.0f} GiB for the embedding table and its optimizer state "
                f"(at most {MAX_EMBEDDING_BYTES // 2**30} GiB): use fewer buckets or a smaller embedding_dim"
            )
        return self


class TrainingSpec(StrictModel):
    """How the model learns from the batch and stream queues."""

    mode: Literal["batch", "stream", "batch_then_stream", "mixed"] = Field(
        default="batch_then_stream",
        description="What a training window trains on: `batch` or `stream` data only, `batch_then_stream` "
        "(pre-train on the batch window, then follow the stream) or `mixed` (both at once, the mixture "
        "prioritisation picking the next batch).",
    )
    model: ModelSpec = Field(
        default_factory=ModelSpec, description="The model: built-in MTRM or single tower, or a team's own module."
    )
    features: FeaturesSpec = Field(
        default_factory=FeaturesSpec,
        description="How the model reads each column the sources map: dense transforms, embedding tables and "
        "list pooling.",
    )
    batch_size: int = Field(
        default=1024,
        ge=1,
        le=2**24,
        description="Rows per optimiser step, cut from consecutive reader batches of one kind.",
    )
    loss: Literal["bce", "mse", "model"] = Field(
        default="bce",
        description="bce: binary cross-entropy on the logits; mse: squared error of sigmoid(logits) (the Brier "
        "score); model: the custom module's own loss(logits, labels) (type custom only).",
    )
    learning_rate: float = Field(
        default=3e-3,
        gt=0,
        le=1e3,
        description="Adam's step size (finite, > 0); the default 3e-3 was chosen on tuning seeds of the "
        "realistic world (docs/training.md, 'Defaults that learn').",
    )
    checkpoint_every_steps: int = Field(
        default=500,
        ge=1,
        le=2**40,
        description="Steps between checkpoints (model, optimiser, the data driver's barrier snapshot and the "
        "source versions, logged to MLflow); a restarted run resumes from the latest.",
    )
    checkpoint_keep_last: int = Field(
        default=3,
        ge=1,
        le=2**20,
        description="Checkpoints kept in MLflow per run (the newest, the final one always among them); older "
        "ones are deleted.",
    )
    auc_tolerance: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="The training asset's AUC check fails when next-hour AUC drops more than this below the "
        "previous partition's; the default sits above the run-to-run noise of identical runs on "
        "`bench/real_schema.py`.",
    )
    baseline_guard: Literal["block", "warn"] = Field(
        default="block",
        description="What a model no better than chance (AUC <= 0.51) or the popularity prior does: `block` "
        "fails the training asset's check with severity ERROR (the run fails), `warn` with severity WARN (the run "
        "succeeds). Either way it is not promoted to champion.",
    )
    batch_lag: NonNegativeDuration = Field(
        default=duration_default("0h"),
        description="Batch data of a training window comes from the window shifted back by this duration "
        "(e.g. `24h`, the batch sources' label delay: the stream of today with the complete batch of yesterday).",
    )
    partition: Literal["hour", "day"] = Field(
        default="day", description="Partitions of the training asset: one training window per hour or per day."
    )
    eval_hours: int = Field(
        default=1,
        ge=1,
        le=24 * 366,
        description="Held-out hours after the window that the next-hour AUC and log loss are measured on.",
    )
    threads: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="torch intra-op threads of a single trainer (training and evaluation); the ranks of a "
        "multi-trainer group take ceil(pools.training.cpu) each.",
    )
    device: str = Field(
        default="cpu",
        pattern=r"^(auto|cpu|cuda(:[0-9]{1,3})?)$",
        description="Where the model trains and is evaluated: `cpu`, `cuda` / `cuda:N` (a GPU; an error at "
        "validate and at the start of a run where there is none) or `auto` (cuda where available, else cpu). "
        "Multi-trainer jobs train on the CPU.",
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=2**32 - 1,
        description="Seeds the model's initialisation and the mixture prioritisation's sampling.",
    )
    compile: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="The embedding tables' backward pass and lazy Adam step as torch.compile'd fused loops: "
        "`auto` compiles in the background after compile_after_steps steps (CPU, one trainer, not "
        "data.deterministic), `on` before the first step, `off` never. A failed compile is logged and the run "
        "trains on eagerly.",
    )
    compile_after_steps: int = Field(
        default=1000,
        ge=0,
        le=2**40,
        description="Steps a run trains eagerly before `compile: auto` compiles, so that a short run never "
        "pays for the compile.",
    )
    sharding: Literal["auto", "replicated", "row_wise"] = Field(
        default="auto",
        description="How a group of trainers (pools.training.replicas > 1) keeps the built-in embedding tables "
        "and their optimiser state: `replicated` (every trainer holds every row), `row_wise` (each holds 1/N of "
        "every table's rows) or `auto` (row_wise once replicated tables would take more than half of "
        "pools.training.memory; docs/training.md, 'Sharded tables').",
    )
    embedding_optimizer: Literal["adam", "row_wise_adagrad"] = Field(
        default="adam",
        description="The embedding tables' optimiser: `adam` (lazy Adam, state twice the table) or "
        "`row_wise_adagrad` (row-wise Adagrad as FBGEMM and TorchRec fuse it: one accumulated squared gradient per "
        "row, state 1/dim of the table). Dense parameters always use Adam.",
    )

    priority_weights: object = Field(
        default=None,
        exclude=True,
        description="Removed (an error if set): w_i of the mixture prioritisation is each stream's "
        "dataset.streams[].weight.",
    )

    @field_validator("priority_weights")
    @classmethod
    def _priority_weights_removed(cls, value: object) -> object:
        # One source of truth for w_i: the streams' ``weight``. The old key is an error, not ignored; as a field
        # (not a before-validator) its error is one problem among the others of the spec.
        if value is not None:
            raise ValueError(
                "priority_weights was removed: w_i of the mixture prioritisation is dataset.streams[].weight "
                "(set each stream's weight instead)"
            )
        return value

    @model_validator(mode="after")
    def _model_loss_needs_custom(self) -> TrainingSpec:
        if self.loss == "model" and self.model.type != "custom":
            raise ValueError(
                f"loss 'model' calls a custom module's own loss(logits, labels); model type {self.model.type!r} "
                "has none (use bce or mse)"
            )
        return self

    @model_validator(mode="after")
    def _mtrm_needs_both_kinds(self) -> TrainingSpec:
        # MTRM's memory tower learns batch data and its serving (adapt) tower learns the stream:
        # with one kind only, one tower would never train.
        if self.model.type == "mtrm" and self.mode in ("batch", "stream"):
            raise ValueError(
                f"model type 'mtrm' needs batch and stream data: mode {self.mode!r} trains only one "
                "of its towers; use mode 'mixed' or 'batch_then_stream', or model type 'single'"
            )
        return self


class TrackingSpec(StrictModel):
    """MLflow tracking; default: SQLite store and local artifacts under the project home."""

    tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI: sqlite:///PATH, file:///PATH, an http(s):// MLflow server or a database "
        "URI; default: a SQLite store under `$PRIMUS_HOME/mlflow`.",
    )
    experiment: str = Field(
        default="primus",
        description="MLflow experiment the job's runs, metrics and checkpoints are logged to.",
    )


_OWNER = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+|team:[A-Za-z0-9_.-]+")
_TAG = re.compile(r"[A-Za-z0-9_.-]{1,63}")


class JobSpec(StrictModel):
    """The whole training job: resources, data, training, tracking and automation."""

    name: str = Field(
        pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
        max_length=53,
        description="The job's name: a DNS-1123 label (lowercase letters, digits and `-`), used for its runs, "
        "pods, Dagster assets and MLflow run keys.",
    )
    pools: PoolsSpec = Field(
        default_factory=PoolsSpec,
        description="The executor pools: where the data executors and trainers run, how many, and their resources.",
    )
    scaling: ScalingSpec = Field(
        default_factory=ScalingSpec,
        description="How the data pool grows, shrinks and resizes its executors while a run goes on.",
    )
    data: DataPlaneSpec = Field(
        default_factory=DataPlaneSpec,
        description="How the data plane plans read tasks, hands them out, retries and buffers them.",
    )
    dataset: DatasetSpec = Field(description="The job's input: its streams of sources, from `start` on.")
    training: TrainingSpec = Field(
        default_factory=TrainingSpec,
        description="How the model learns: mode, model, features, optimiser, checkpoints and checks.",
    )
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec, description="Where runs, checkpoints and models are logged (MLflow)."
    )
    automation: AutomationSpec = Field(
        default_factory=AutomationSpec,
        description="How sensors turn new data into runs, and how training continues from partition to partition.",
    )
    owners: list[str] = Field(
        default_factory=list,
        description="Who owns the job's assets: e-mail addresses or team:<name> (Dagster asset owners; the "
        "MLflow runs' primus.owners tag).",
    )
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="Tags of the job's Dagster assets and of its MLflow runs and model versions (key: letters, "
        "digits, _ - . up to 63; value: the same, may be empty).",
    )

    @field_validator("owners")
    @classmethod
    def _owners_are_dagster_owners(cls, value: list[str]) -> list[str]:
        bad = [o for o in value if not _OWNER.fullmatch(o)]
        if bad:
            raise ValueError(f"owners {bad}: each must be an e-mail address or team:<name>")
        return value

    @field_validator("tags")
    @classmethod
    def _tags_are_dagster_tags(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [f"{k}: {v}" for k, v in value.items() if not _TAG.fullmatch(k) or (v and not _TAG.fullmatch(v))]
        if bad:
            raise ValueError(f"tags {bad}: keys and values are letters, digits, _ - . (up to 63 characters)")
        return value

    @field_validator("scaling")
    @classmethod
    def _scaling_has_a_pool(cls, value: ScalingSpec, info: ValidationInfo) -> ScalingSpec:
        pools = info.data.get("pools")  # absent when pools itself was invalid
        # Defaults are validated too: only a policy the spec asks for (not the default) is an error.
        if pools is not None and pools.backend == "in_trainer" and value != ScalingSpec():
            raise ValueError(
                "pools.backend in_trainer has no executor pool to scale (its executors are threads of the "
                "trainer): remove scaling or use backend local"
            )
        return value

    @field_validator("training")
    @classmethod
    def _gpu_single_trainer(cls, value: TrainingSpec, info: ValidationInfo) -> TrainingSpec:
        pools = info.data.get("pools")  # absent when pools itself was invalid
        if pools is not None and pools.training.replicas > 1 and value.device.startswith("cuda"):
            raise ValueError(
                f"device {value.device!r} needs one trainer, pools.training.replicas is {pools.training.replicas}: "
                "the multi-trainer exchange packs gradients in host memory (use device cpu or auto)"
            )
        return value

    @model_validator(mode="after")
    def _compiled_not_deterministic(self) -> JobSpec:
        if self.training.compile == "on" and self.data.deterministic:
            raise ValueError(
                "training.compile is 'on' and data.deterministic is true: deterministic runs train on the eager "
                "kernels (a compiled scatter-add may sum in another order on several threads); set "
                "training.compile to auto (eager in deterministic runs) or off"
            )
        return self

    @model_validator(mode="after")
    def _declared_features_mapped(self) -> JobSpec:
        # A declaration no source maps would do nothing: name the column kind it must be mapped as.
        features = self.training.features
        for _, source in self.dataset.all_sources():
            m = source.columns
            mapped = {
                "dense": set(m.dense) if isinstance(m.dense, list) else set(),
                "categorical": {name for name, _ in m.sparse_pairs()},
                "categorical_list": {name for name, _ in m.list_pairs()},
            }
            where = {"dense": "columns.dense", "categorical": "columns.sparse", "categorical_list": "columns.lists"}
            for kind, declared in (
                ("dense", features.dense),
                ("categorical", features.categorical),
                ("categorical_list", features.categorical_list),
            ):
                for feature in declared:
                    if feature.name in mapped[kind]:
                        continue
                    other = next((k for k, names in mapped.items() if feature.name in names), None)
                    hint = f"it is mapped in {where[other]}" if other else "no column of that name is mapped"
                    if kind == "dense" and isinstance(m.dense, str):
                        hint = f"columns.dense is the list column {m.dense!r}: declare dense features by column name"
                    raise ValueError(
                        f"training.features.{kind}: {feature.name!r} is not in {where[kind]} of source "
                        f"{source.name!r} ({hint})"
                    )
        return self

    @model_validator(mode="after")
    def _mtrm_has_both_kinds_of_source(self) -> JobSpec:
        # MTRM's memory tower learns the batch sources and its adapt tower the stream: a model asked for as
        # MTRM without one kind of source would train a tower on the other kind's copies only, without a word.
        # The default model type is only advised against (advisories): a first spec still runs.
        problem = self._mtrm_missing_kind()
        if problem is not None and "type" in self.training.model.model_fields_set:
            raise ValueError(f"{problem}: add one, or use model type 'single'")
        return self

    def _mtrm_missing_kind(self) -> str | None:
        if self.training.model.type != "mtrm":
            return None
        kinds = {source.kind for _, source in self.dataset.all_sources()}
        for kind, tower in (("batch", "memory"), ("stream", "adapt")):
            if kind not in kinds:
                return (
                    f"training.model type 'mtrm' needs a source of kind {kind!r} (its {tower} tower learns it); "
                    f"every source of the dataset is of kind {sorted(kinds)[0]!r}"
                )
        return None

    def advisories(self) -> list[str]:
        """What the spec allows but a team rarely means, each with its fix (``validate`` prints them, a run
        logs them as warnings).

        Example::

            for line in job.advisories():
                log.warning("%s", line)
        """
        problem = self._mtrm_missing_kind()
        if problem is None:
            return []
        return [f"{problem}: the default model type is mtrm; set training.model.type: single for this data"]

    @model_validator(mode="after")
    def _source_names_free(self) -> JobSpec:
        # A source's asset key must not be one the job's own assets take: Dagster refuses duplicate keys.
        taken = {name: what for what, name in job_asset_names(self.name).items()}
        for _, source in self.dataset.all_sources():
            if source.name in taken:
                raise ValueError(
                    f"source name {source.name!r} is the name of job {self.name!r}'s {taken[source.name]} in "
                    "Dagster: rename the source"
                )
        return self

    def kind_weights(self) -> dict[str, float]:
        """``w_i`` of the mixture prioritisation per data kind (``batch`` / ``stream``): the mean
        ``weight`` of the streams feeding that kind, one count per source of the kind (a kind with no
        source is absent).

        Example: streams ``history`` (weight 1, batch) and ``clicks`` (weight 3, stream) ->
        ``{"batch": 1.0, "stream": 3.0}``.
        """
        found: dict[str, list[float]] = {}
        for stream, source in self.dataset.all_sources():
            found.setdefault(source.kind, []).append(stream.weight)
        return {kind: sum(ws) / len(ws) for kind, ws in sorted(found.items())}

    def live_stream_sources(self) -> tuple[list[tuple[str, KafkaSourceSpec]], str]:
        """The ``(stream name, source)`` pairs a live increment follows -- the Kafka sources of kind
        ``stream`` outside joins -- and, when there are none, why (``""`` otherwise)."""
        if self.training.mode == "batch":
            return [], f"job {self.name}: training.mode is batch: it trains no stream to follow"
        kafka = [
            (stream, source)
            for stream, source in self.dataset.all_sources()
            if isinstance(source, KafkaSourceSpec) and source.kind == "stream"
        ]
        if not kafka:
            return [], f"job {self.name}: no Kafka source of kind stream to follow"
        found = [(stream.name, source) for stream, source in kafka if stream.join is None]
        if not found:
            return [], f"job {self.name}: its Kafka stream sources are joined; live joins are not supported"
        return found, ""
