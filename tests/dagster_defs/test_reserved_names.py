"""The spec's copy of Dagster's name rule (``primus_dagster.spec.names``) agrees with what Dagster really does.

The spec cannot import Dagster, so it keeps the rule as data; these tests build assets the way
``build_source_asset`` does (``@asset(key=AssetKey([source.name]))``) and check that Dagster refuses
exactly the names the spec refuses -- when Dagster changes its list, a test here fails.
"""

from __future__ import annotations

import builtins
import keyword
from pathlib import Path

import dagster as dg
import pytest

from primus_dagster.dagster_defs.live_asset import live_asset_name
from primus_dagster.dagster_defs.training_asset import training_asset_name
from primus_dagster.spec import DAGSTER_RESERVED_NAMES, SpecError, dagster_name_problem, load_job_spec, parse_job_spec
from primus_dagster.spec.names import job_asset_names

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"


def dagster_refuses(name: str) -> bool:
    """Whether Dagster refuses an asset keyed ``[name]`` (its op is then named ``name``)."""
    try:

        @dg.asset(key=dg.AssetKey([name]))
        def _asset() -> None: ...

    except dg.DagsterInvalidDefinitionError:
        return True
    return False


@pytest.mark.parametrize("name", sorted(DAGSTER_RESERVED_NAMES))
def test_dagster_refuses_every_reserved_name(name: str) -> None:
    assert dagster_refuses(name), f"Dagster accepts {name!r}: drop it from DAGSTER_RESERVED_NAMES"
    assert dagster_name_problem(name) is not None


def test_dagster_accepts_what_the_spec_accepts() -> None:
    """Candidates Dagster might reserve (builtins, soft keywords, Dagster words): where the spec accepts a
    name, Dagster must too -- otherwise the spec's copy misses a name Dagster added."""
    candidates = {n for n in dir(builtins) if n.isidentifier()} | set(getattr(keyword, "softkwlist", []))
    candidates |= {"asset", "op", "job", "graph", "resources", "run", "log", "self", "name", "key", "partition_key"}
    candidates |= {"inputs", "outputs", "configs", "result", "io_manager", "asset_key", "meta_data", "events"}
    missed = sorted(n for n in candidates if dagster_name_problem(n) is None and dagster_refuses(n))
    assert not missed, f"Dagster refuses {missed}: add them to DAGSTER_RESERVED_NAMES"
    assert not dagster_refuses("impressions_parquet")


def test_a_source_named_context_is_refused_by_both() -> None:
    text = EXAMPLE.read_text().replace("name: impressions_delta", "name: context")
    with pytest.raises(SpecError, match="Dagster refuses it"):
        parse_job_spec(text)
    assert dagster_refuses("context")


def test_job_asset_names_match_the_dagster_glue() -> None:
    job = load_job_spec(EXAMPLE)
    assert job_asset_names(job.name) == {
        "training asset": training_asset_name(job),
        "live asset": live_asset_name(job),
    }
