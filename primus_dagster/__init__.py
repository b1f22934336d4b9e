"""primus_dagster: unified batch/stream training of recommendation models, Dagster-native.

``primus_dagster.PrimusJobComponent`` (the job as a Dagster component, the type name ``dg`` lists) is
imported on first access: importing the package imports no Dagster (the engine runs without it).

Example::

    from primus_dagster import PrimusJobComponent    # imports primus_dagster.dagster_defs (and Dagster) now
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Names this package exports lazily -> the module that exports each, imported by name (``importlib``): mypy's
#: run over the engine (``[tool.mypy] files``) does not follow it into the Dagster glue.
LAZY_EXPORTS = {"PrimusJobComponent": "primus_dagster.dagster_defs"}


def __getattr__(name: str) -> Any:
    if name in LAZY_EXPORTS:
        return getattr(importlib.import_module(LAZY_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # dg's registry lists a module's components by dir(): the lazy names are part of it
    return sorted([*globals(), *LAZY_EXPORTS])
