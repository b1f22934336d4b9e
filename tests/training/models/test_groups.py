"""What a model declares it trains on which data kind (``ParameterGroups``), and the check that holds a model
to its declaration."""

from __future__ import annotations

import pytest

from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.model_api import ModelFactoryError
from primus_dagster.training.models import MTRM, ParameterGroups, build_model, check_model

SMALL = {"embedding_dim": 4, "hash_buckets": 64, "memory_hidden": [8], "adapt_hidden": [8]}


def test_mtrm_declares_its_towers_per_kind_and_every_parameter_is_in_one() -> None:
    for weight, batch_trains in [(0.0, ("memory",)), (0.25, ("memory", "adapt"))]:
        model = build_model(ModelSpec(type="mtrm", adapt_batch_weight=weight, **SMALL), 3, 2)
        groups = model.parameter_groups()
        assert groups.names == ("memory", "adapt")
        assert groups.trained_by("batch") == batch_trains and groups.trained_by("stream") == ("adapt",)
        assert groups.reads["stream"] == ("memory",)  # h_aux, without a gradient
        assert {groups.group_of(name).split(".")[0] for name, _ in model.named_parameters()} == {"memory", "adapt"}
        assert all(groups.group_of(name) == name.split(".")[0] for name, _ in model.named_parameters())
    single = build_model(ModelSpec(type="single", **SMALL), 3, 2).parameter_groups()
    assert single == ParameterGroups.one() and single.trained_by("stream") == ("all",)


def test_a_declaration_naming_an_unknown_kind_or_group_is_refused() -> None:
    with pytest.raises(ValueError, match="data kind 'live'"):
        ParameterGroups((("", "all"),), trains={"live": ("all",)})
    with pytest.raises(ValueError, match=r"names groups \['tower'\]"):
        ParameterGroups((("", "all"),), trains={"batch": ("tower",)})
    with pytest.raises(ValueError, match="in no declared group"):
        ParameterGroups((("memory.", "memory"),), trains={"batch": ("memory",)}).group_of("adapt.head.weight")


def test_a_model_whose_gradients_leave_its_declaration_is_refused_naming_the_parameter(monkeypatch) -> None:
    spec = ModelSpec(type="mtrm", adapt_batch_weight=0.25, **SMALL)
    layout = FeatureLayout.plain(spec, 3, 2)
    check_model(spec, layout)  # the built-in declaration holds
    wrong = ParameterGroups(
        (("memory.", "memory"), ("adapt.", "adapt")), trains={"batch": ("memory",), "stream": ("adapt",)}
    )
    monkeypatch.setattr(MTRM, "parameter_groups", lambda self: wrong)  # batch samples do train the adapt tower
    with pytest.raises(
        ModelFactoryError, match=r"a 'batch' micro-batch gave parameter 'adapt\.[^']+' \(group 'adapt'\)"
    ):
        check_model(spec, layout)
