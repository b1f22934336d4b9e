"""Names of the job spec that become Dagster names, checked the way Dagster checks them -- without Dagster.

A source's ``name`` is the last part of its Dagster asset key, and Dagster derives the asset's op name
from the key: with no key prefix the op *is* the source name, and Dagster refuses an op name that is a
Python keyword or one of its own reserved words (``context``, ``config``, ``input``, ``type``, ...):
``@asset(key=AssetKey(["context"]))`` raises ``DagsterInvalidDefinitionError`` when the definitions load.
The spec refuses those names at validate time instead.

The rule is copied here as data because the spec must not import Dagster (import-linter contract).
Where Dagster defines it (dagster 1.13): ``dagster/_core/definitions/utils.py``: ``DISALLOWED_NAMES``
(the words below plus ``keyword.kwlist``) and ``VALID_NAME_REGEX_STR = r"^[A-Za-z0-9_]+$"``, used by
``check_valid_name``. ``tests/dagster_defs/test_reserved_names.py`` checks this copy against Dagster's
real behaviour (an asset built with each name must be refused, and others accepted).
"""

from __future__ import annotations

import keyword
import re

#: Dagster's ``DISALLOWED_NAMES`` (dagster/_core/definitions/utils.py): its own words and Python's keywords.
DAGSTER_RESERVED_NAMES: frozenset[str] = frozenset(
    [
        "context",
        "conf",
        "config",
        "meta",
        "arg_dict",
        "dict",
        "input_arg_dict",
        "output_arg_dict",
        "int",
        "str",
        "float",
        "bool",
        "input",
        "output",
        "type",
        *keyword.kwlist,  # "just disallow all python keywords"
    ]
)

#: Dagster's ``VALID_NAME_REGEX_STR``: the characters a Dagster name (and an asset-key part used as one) may hold.
DAGSTER_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_]+$")


def dagster_name_problem(name: str) -> str | None:
    """Why Dagster would refuse ``name`` as an op or asset name, or ``None`` when it accepts it."""
    if name in DAGSTER_RESERVED_NAMES:
        kind = "a Python keyword" if keyword.iskeyword(name) else "a word Dagster reserves"
        return f"{name!r} is {kind}: Dagster refuses it as an asset name; rename it"
    if not DAGSTER_NAME_PATTERN.match(name):
        return f"{name!r} is not a valid Dagster name: use letters, digits and _ only"
    return None


def job_asset_names(job_name: str) -> dict[str, str]:
    """The Dagster asset names a job adds beside its sources' (by what they are), which a source must not take.

    Copied from ``primus_dagster.dagster_defs.training_asset.training_asset_name`` and
    ``primus_dagster.dagster_defs.live_asset.live_asset_name`` (the spec cannot import them);
    ``tests/dagster_defs/test_reserved_names.py`` checks that the two agree.
    """
    ident = job_name.replace("-", "_")
    return {"training asset": f"{ident}_model", "live asset": f"{ident}_live_model"}
