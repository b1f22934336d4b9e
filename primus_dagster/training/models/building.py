"""Building and checking models: :func:`build_model` (a spec's model, seeded), :func:`build_initial_model`,
:func:`check_model` (the protocol on two made-up rows), :func:`model_summary` and
:func:`custom_model_line` (what the run log says about a model).

Example::

    model = build_model(ModelSpec(type="mtrm"), n_dense=13, n_sparse=5, seed=0)
    print(model_summary(model)["params"])
"""

from __future__ import annotations

import torch
from torch import nn

from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.features import DenseStats, FeatureLayout, ModelInit
from primus_dagster.training.model_api import ModelFactoryError
from primus_dagster.training.models.builtin import MTRM, SingleTower
from primus_dagster.training.models.custom import CustomModel
from primus_dagster.training.models.groups import KINDS, ParameterGroups
from primus_dagster.training.models.losses import loss_function
from primus_dagster.training.models.protocol import MAX_SPARSE_TABLES, RecModel, made_up_rows
from primus_dagster.training.models.tables import TablePlacement, placed, sparse_tables


def build_model(
    spec: ModelSpec,
    n_dense: int | None = None,
    n_sparse: int | None = None,
    seed: int = 0,
    *,
    layout: FeatureLayout | None = None,
    stats: DenseStats | None = None,
    placement: TablePlacement | None = None,
) -> RecModel:
    """The model of ``spec.type`` on ``layout`` (or, without one, on ``n_dense`` standardized columns
    and ``n_sparse`` ids in the shared table), initialised deterministically from ``seed`` (global RNG
    untouched); ``stats``: the dense transforms' statistics (:func:`~.features.fit_dense_stats`);
    ``placement``: its tables hold that rank's rows only (:mod:`.tables`; None: every row).

    Example::

        model = build_model(job.training.model, layout=layout, seed=job.training.seed)
        model = build_model(ModelSpec(type="single"), n_dense=13, n_sparse=5)
    """
    classes: dict[str, type[RecModel]] = {"single": SingleTower, "mtrm": MTRM, "custom": CustomModel}
    if spec.type not in classes:
        raise ValueError(f"unknown model type {spec.type!r}; expected one of {sorted(classes)}")
    if layout is None:
        if n_dense is None or n_sparse is None:
            raise ValueError("build_model needs a layout, or n_dense and n_sparse")
        if n_dense < 0 or n_sparse < 0:
            raise ValueError(f"need some input features, got n_dense={n_dense}, n_sparse={n_sparse}")
        layout = FeatureLayout.plain(spec, n_dense, n_sparse)
    with torch.random.fork_rng(devices=[]), placed(placement):
        torch.manual_seed(seed)
        model = classes[spec.type](spec, layout)
    if stats is not None:
        model.dense_transform.load(stats)
    return model


def build_initial_model(
    spec: ModelSpec, init: ModelInit, seed: int = 0, placement: TablePlacement | None = None
) -> RecModel:
    """:func:`build_model` on ``init``'s layout and statistics."""
    return build_model(spec, seed=seed, layout=init.layout, stats=init.stats, placement=placement)


def check_model(spec: ModelSpec, layout: FeatureLayout, loss: str = "bce") -> RecModel:
    """Build the model of ``spec`` on ``layout`` and run one forward and backward on two made-up rows,
    or raise :class:`~.model_api.ModelFactoryError` naming what breaks the protocol (a custom
    model's factory, its output, its loss, its tables). The built model is returned."""
    model = build_model(spec, layout=layout)
    rows = 2
    dense, sparse, lists = made_up_rows(layout, rows)
    factories = spec.factories()
    where = (
        "the module of "
        + ", ".join(f"training.model.{'' if k == 'model' else k + '.'}factory {v!r}" for k, v in factories.items())
        if factories
        else "the model"
    )
    groups = model.parameter_groups()
    trained: dict[tuple[str, ...], str] = {}  # each kind that trains other groups than the kinds before it
    for kind in KINDS:
        trained.setdefault(groups.trained_by(kind), kind)
    try:
        for kind in trained.values():
            model.zero_grad(set_to_none=True)
            logits = model(dense, sparse, kind, lists)
            value = loss_function(loss, model)(logits, torch.zeros(rows))
            extra = model.auxiliary_loss(dense, sparse, kind, torch.zeros(rows), lists)
            (value if extra is None else value + extra).backward()
            if value.dim() != 0:
                raise ModelFactoryError(f"{where}: its loss returned shape {list(value.shape)}; expected a scalar")
            _check_groups(model, groups, kind, where)
    except ModelFactoryError:
        raise
    except Exception as exc:
        raise ModelFactoryError(
            f"{where} failed on a batch of {rows} rows ({layout.n_dense} dense, ids {[c.name for c in layout.sparse]}, "
            f"lists {[c.name for c in layout.lists]}): {type(exc).__name__}: {exc}"
        ) from exc
    model.zero_grad(set_to_none=True)  # the made-up rows leave nothing behind
    tables = len(sparse_tables(model))
    if tables > MAX_SPARSE_TABLES:
        raise ModelFactoryError(
            f"{where} has {tables} sparse embedding tables; the multi-trainer exchange takes at most "
            f"{MAX_SPARSE_TABLES} (share tables between features)"
        )
    return model


def _check_groups(model: RecModel, groups: ParameterGroups, kind: str, where: str) -> None:
    """The gradients of a ``kind`` micro-batch's backward land only in the groups the model declares that
    kind trains: a group given no gradient is left alone by the optimiser, and a group's exchange sends
    only the declared ones."""
    allowed = set(groups.trained_by(kind))
    for name, param in model.named_parameters():
        try:
            group = groups.group_of(name)
        except ValueError as exc:
            raise ModelFactoryError(f"{where}: parameter_groups(): {exc}") from None
        if group not in allowed and param.grad is not None and bool(param.grad.to_dense().any()):
            raise ModelFactoryError(
                f"{where}: a {kind!r} micro-batch gave parameter {name!r} (group {group!r}) a gradient, but its "
                f"parameter_groups() says {kind!r} trains only {sorted(allowed)}"
            )


def custom_model_line(model: RecModel) -> str:
    """``custom, factory <factory>: <class>, N parameters, T sparse table(s)`` -- or, for an MTRM over a
    team's towers, ``mtrm, memory <factory>: <class>, adapt built in, ...`` (run log, ``validate``)."""
    params = sum(p.numel() for p in model.parameters())
    tail = f"{params:,} parameters, {len(sparse_tables(model))} sparse table(s)"
    if isinstance(model, MTRM):
        parts = []
        for role in ("memory", "adapt"):
            tower = getattr(model.spec, role)
            net = getattr(getattr(model, role), "net", None)
            parts.append(f"{role} built in" if tower is None else f"{role} {tower.factory}: {type(net).__name__}")
        return f"mtrm, {', '.join(parts)}; {tail}"
    net = type(getattr(model, "net", model)).__name__
    return f"custom, factory {model.spec.factory}: {net}, {tail}"


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def model_summary(model: nn.Module) -> dict:
    """Parameter counts, e.g. ``{"type": "mtrm", "params": N, "memory_params": M, "adapt_params": A, ...}``."""
    summary = {
        "type": getattr(model, "model_type", type(model).__name__),
        "params": _count(model),
        "n_dense": getattr(model, "n_dense", None),
        "n_sparse": getattr(model, "n_sparse", None),
        "lists": getattr(model, "list_names", []),
        "tables": {name: list(shape) for name, shape in model.layout.tables.items()}
        if isinstance(model, RecModel)
        else {},
    }
    if isinstance(model, RecModel):
        summary["groups"] = model.parameter_groups().describe()
    if isinstance(model, MTRM):
        summary.update(memory_params=_count(model.memory), adapt_params=_count(model.adapt))
    return summary
