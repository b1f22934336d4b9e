"""Bring your own model: the protocol a team's PyTorch module follows (``training.model.type: custom``).

A job names a *factory*, ``training.model.factory: "package.module:function"`` (an importable
module) or ``"path/to/file.py:function"`` (a Python file; relative to the spec file), and
``training.model.params`` (any mapping, handed over as is). The factory is called once per model
build -- training start, resume, every trainer rank, the final evaluation -- with a
:class:`ModelContext` and returns a ``torch.nn.Module`` whose ``forward`` takes one
:class:`ModelInputs` and returns logits ``[B]`` (or ``[B, 1]``)::

    def build(context: ModelContext) -> nn.Module:
        return MyDeepFM(context.id_features, context.dense_names, **context.params)

    class MyDeepFM(nn.Module):
        def forward(self, inputs: ModelInputs) -> torch.Tensor:
            dense = inputs.dense                       # float32 [B, n_dense], transformed and filled
            ids = inputs.sparse["user_id"]             # Jagged: values in [0, buckets), offsets [B + 1]
            ...
            return logits                              # [B]

What the system does around it, unchanged for every model:

* **Inputs.** ``inputs.dense`` holds the declared dense columns after their transform and fill (the
  statistics are buffers of the wrapping model, saved with it); ``inputs.sparse`` is a
  :class:`SparseFeatures` -- TorchRec's ``KeyedJaggedTensor`` fields (``keys()``, ``values()``,
  ``lengths()``, ``offsets()``, ``weights_or_none()``, ``[key]``, ``to_dict()``; ``to_kjt()`` gives a
  real one where TorchRec is installed) with every id and list feature, its ids already hashed
  into ``[0, buckets)`` of the feature's declared table (:attr:`FeatureInfo.buckets`), so an
  ``nn.EmbeddingBag(buckets, dim)`` per table or a TorchRec ``EmbeddingBagCollection`` can look
  them up directly. ``inputs.kind`` is ``"batch"`` or ``"stream"``.
* **Embedding tables** are the module's ``nn.Embedding`` / ``nn.EmbeddingBag`` layers: built with
  ``sparse=True`` they get the lazy sparse Adam (a step updates only the rows it touched) and the
  multi-trainer row-sparse exchange; dense ones learn with Adam like every other parameter.
* **Loss.** ``training.loss``: ``bce`` (on the logits), ``mse`` (on ``sigmoid(logits)``), or
  ``model``: the module's own ``loss(logits, labels) -> scalar``.
* **Checkpoints, the registry, the fresh-venv load**: the wrapping model's ``state_dict`` holds the
  module's parameters under ``net.``; a factory module that is not part of an installed
  distribution is pickled by value into the registered model, so it loads without the team's code.

:func:`load_factory` resolves the reference; a factory that cannot be imported, or a module that
breaks the protocol, raises :class:`ModelFactoryError` naming the factory and what is wrong
(``primus-dagster validate`` and the start of training call
:func:`~primus_dagster.training.models.check_model`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from primus_dagster.data import Jagged
from primus_dagster.training.features import FeatureLayout

__all__ = [
    "FactoryCode",
    "FeatureInfo",
    "MemoryModule",
    "ModelContext",
    "ModelFactoryError",
    "ModelInputs",
    "RecModule",
    "SparseFeatures",
    "factory_code",
    "factory_module",
    "load_factory",
]

FILE_MODULE_PREFIX = "primus_user_model_"  # sys.modules name of a factory loaded from a file


class ModelFactoryError(ValueError):
    """``training.model.factory`` cannot be imported or called, or its module breaks the protocol."""


@dataclass(frozen=True)
class FeatureInfo:
    """One id feature as a custom model sees it: ``kind`` ``"id"`` (one id per row) or ``"list"``
    (several, pooled ``pooling``: ``sum`` / ``mean``; ``weighted``: the ids carry weights), its table
    and the table's ``buckets`` (ids arrive in ``[0, buckets)``) and ``dim`` (the declared width)."""

    name: str
    kind: str
    table: str
    buckets: int
    dim: int
    pooling: str = "sum"
    weighted: bool = False


@dataclass(frozen=True)
class ModelContext:
    """What a factory receives: the job's declared features and ``training.model.params``.

    Example::

        def build(context: ModelContext) -> nn.Module:
            tables = nn.ModuleDict({name: nn.EmbeddingBag(b, d, sparse=True)
                                    for name, (b, d) in context.tables.items()})
            ...
    """

    layout: FeatureLayout
    params: Mapping[str, Any] = field(default_factory=dict)
    #: ``"model"`` (type custom), or the MTRM tower this module is: ``"memory"`` (batch data) / ``"adapt"``
    role: str = "model"
    #: the width of ``inputs.aux`` (an adapt tower: the memory tower's detached state ``h_aux``); 0: no aux
    aux_dim: int = 0

    @property
    def dense_names(self) -> list[str]:
        """The columns of ``inputs.dense``, in order."""
        return [c.name for c in self.layout.dense]

    @property
    def n_dense(self) -> int:
        return self.layout.n_dense

    @property
    def id_features(self) -> list[FeatureInfo]:
        """Every key of ``inputs.sparse``, in its order: the scalar ids, then the lists."""
        tables = self.layout.tables
        return [
            FeatureInfo(c.name, "id" if c.pooling is None else "list", c.table, *tables[c.table], c.pooling or "sum",
                        c.weighted)
            for c in (*self.layout.sparse, *self.layout.lists)
        ]  # fmt: skip

    @property
    def tables(self) -> dict[str, tuple[int, int]]:
        """Declared tables in use: name -> ``(buckets, dim)``."""
        return dict(self.layout.tables)


class SparseFeatures:
    """The id features of a batch in TorchRec's ``KeyedJaggedTensor`` layout (the same method names),
    each feature's ids hashed into its table's ``[0, buckets)``.

    Key-major: ``values()`` holds every row's ids of the first key, then the second key's...;
    ``lengths()`` is ``[len(keys) * B]``. A scalar id feature has length 1 in every row.

    Example::

        bag = nn.EmbeddingBag(buckets, 16, mode="sum", sparse=True)
        j = inputs.sparse["genres"]
        pooled = bag(j.values, j.offsets[:-1], per_sample_weights=j.weights)     # [B, 16]
        kjt = inputs.sparse.to_kjt()                                              # with torchrec
    """

    def __init__(self, features: Mapping[str, Jagged], batch_size: int):
        self._features = dict(features)
        self._batch_size = batch_size

    def keys(self) -> list[str]:
        return list(self._features)

    def stride(self) -> int:
        """Rows of the batch (KJT's name)."""
        return self._batch_size

    def __getitem__(self, key: str) -> Jagged:
        try:
            return self._features[key]
        except KeyError:
            raise KeyError(f"no id feature {key!r}; the batch has {self.keys()}") from None

    def __contains__(self, key: object) -> bool:
        return key in self._features

    def to_dict(self) -> dict[str, Jagged]:
        return dict(self._features)

    def device(self) -> torch.device:
        """Where the ids are (``training.device``; KJT's name)."""
        first = next(iter(self._features.values()), None)
        return first.values.device if first is not None else torch.device("cpu")

    def values(self) -> torch.Tensor:
        parts = [j.values for j in self._features.values()]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=self.device())

    def lengths(self) -> torch.Tensor:
        parts = [j.lengths() for j in self._features.values()]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=self.device())

    def offsets(self) -> torch.Tensor:
        lengths = self.lengths()
        return torch.cat([torch.zeros(1, dtype=torch.int64, device=lengths.device), torch.cumsum(lengths, 0)])

    def weights_or_none(self) -> torch.Tensor | None:
        """Per-id weights where any feature has them (1.0 for the ids of the others), else None."""
        if all(j.weights is None for j in self._features.values()):
            return None
        parts = [
            j.weights if j.weights is not None else torch.ones(len(j.values), device=j.values.device)
            for j in self._features.values()
        ]
        return torch.cat(parts)

    def to_kjt(self) -> Any:
        """A ``torchrec.KeyedJaggedTensor`` of the same fields (needs TorchRec: ``make test-torchrec`` installs it)."""
        try:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        except ImportError as exc:
            raise ImportError(
                f"SparseFeatures.to_kjt needs torchrec ({exc}); see docs/models.md, 'Bring your own model'"
            ) from exc
        return KeyedJaggedTensor(
            keys=self.keys(), values=self.values(), lengths=self.lengths(), weights=self.weights_or_none(),
            stride=self._batch_size,
        )  # fmt: skip


@dataclass(frozen=True)
class ModelInputs:
    """What a custom module's ``forward`` gets: transformed ``dense`` [B, n_dense] (float32, no NaN),
    ``sparse`` (:class:`SparseFeatures`), the samples' ``kind`` and, for an MTRM adapt tower, ``aux``:
    the memory tower's state ``h_aux`` [B, context.aux_dim], without gradient (None elsewhere)."""

    dense: torch.Tensor
    sparse: SparseFeatures
    kind: str
    aux: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.dense.shape[0])


@runtime_checkable
class RecModule(Protocol):
    """A custom model: ``forward(inputs) -> logits [B]``; optionally ``loss(logits, labels)`` (used with
    ``training.loss: model``)."""

    def __call__(self, inputs: ModelInputs) -> torch.Tensor: ...


@runtime_checkable
class MemoryModule(RecModule, Protocol):
    """An MTRM memory tower of a team's own (``training.model.memory``): ``forward(inputs) -> logits [B]``
    and, optionally, ``state(inputs) -> [B, H]``: what the adapt tower reads as ``inputs.aux`` (without
    it, ``h_aux`` is the memory tower's logit, ``[B, 1]``)."""

    def state(self, inputs: ModelInputs) -> torch.Tensor: ...


def _split(reference: str) -> tuple[str, str]:
    module, sep, function = reference.rpartition(":")
    if not sep or not module or not function.isidentifier():
        raise ModelFactoryError(
            f"training.model.factory {reference!r}: expected 'package.module:function' or 'path/file.py:function'"
        )
    return module, function


def _file_module(path: Path, reference: str) -> ModuleType:
    """The module of a factory file, loaded once per process under a name derived from its path."""
    if not path.is_file():
        raise ModelFactoryError(f"training.model.factory {reference!r}: no file {str(path)!r}")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    name = f"{FILE_MODULE_PREFIX}{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelFactoryError(f"training.model.factory {reference!r}: {str(path)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: the module's classes pickle by this name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ModelFactoryError(
            f"training.model.factory {reference!r}: importing {str(path)!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def factory_module(reference: str) -> ModuleType:
    """The module that holds the factory ``reference`` (imported, or loaded from its file)."""
    module_ref, _ = _split(reference)
    if module_ref.endswith(".py"):
        return _file_module(Path(module_ref), reference)
    try:
        return importlib.import_module(module_ref)
    except Exception as exc:
        raise ModelFactoryError(
            f"training.model.factory {reference!r}: cannot import module {module_ref!r}: {type(exc).__name__}: {exc} "
            "(install the package, put it on PYTHONPATH, or name a file: 'path/to/file.py:function')"
        ) from exc


def load_factory(reference: str) -> Callable[[ModelContext], nn.Module]:
    """The factory function ``reference`` names, or :class:`ModelFactoryError`.

    >>> load_factory("no_such_package.models:build")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    primus_dagster.training.model_api.ModelFactoryError: training.model.factory 'no_such_package.models:build': ...
    """
    _, function = _split(reference)
    module = factory_module(reference)
    factory = getattr(module, function, None)
    if factory is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ModelFactoryError(
            f"training.model.factory {reference!r}: module {module.__name__!r} has no {function!r} "
            f"(callables there: {public[:12] or 'none'})"
        )
    if not callable(factory):
        raise ModelFactoryError(f"training.model.factory {reference!r}: {function!r} is not callable")
    return factory


@dataclass(frozen=True)
class FactoryCode:
    """How a registered model carries a custom factory's code: ``requirements`` (``dist==version``: the
    factory's own distribution when it is installed, and those of the libraries its module uses, e.g.
    ``torchrec``) and ``by_value``: the top-level module to pickle by value when no installed
    distribution provides it (its classes travel inside the model, so it loads without the team's
    checkout)."""

    requirements: tuple[str, ...]
    by_value: ModuleType | None


_ALWAYS_REQUIRED = {"torch", "primus_dagster"}  # tracking.model_requirements names these already


def _distribution_of(top: str, distributions: Mapping[str, list[str]]) -> str | None:
    for dist in distributions.get(top, []):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def factory_code(reference: str) -> FactoryCode:
    """:class:`FactoryCode` of the factory ``reference``."""
    module = factory_module(reference)
    top = module.__name__.split(".")[0]
    distributions = importlib.metadata.packages_distributions()
    own = _distribution_of(top, distributions)
    used = set()
    for value in vars(module).values():  # the libraries the module uses: its imported modules and names
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str) and name.split(".")[0] not in (top, *_ALWAYS_REQUIRED):
            used.add(name.split(".")[0])
    requirements = [r for r in (_distribution_of(t, distributions) for t in sorted(used)) if r is not None]
    return FactoryCode(tuple(([own] if own else []) + requirements), None if own else sys.modules[top])
