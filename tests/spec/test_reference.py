"""The generated spec reference: every key of every section, each with a description, linked."""

from __future__ import annotations

import re

from primus_dagster.cli import main
from primus_dagster.spec import SOURCE_TYPES, spec_reference_markdown
from primus_dagster.spec.reference import sections


def test_every_key_of_every_section_says_what_it_does() -> None:
    undescribed = [
        f"{section.path or '<top>'}.{name} ({section.model.__name__})"
        for section in sections()
        for name, field in section.model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not undescribed, "spec keys without a description: " + ", ".join(undescribed)


def test_the_page_has_a_section_per_source_type_and_every_link_lands() -> None:
    page = spec_reference_markdown()
    for source_type in SOURCE_TYPES:
        assert f"## `dataset.streams[].sources[]` (`type: {source_type}`)" in page
    anchors = set(re.findall(r"\{#([a-z0-9-]+)\}", page))
    links = set(re.findall(r"\]\(#([a-z0-9-]+)\)", page))
    assert links and links <= anchors, f"links to missing sections: {sorted(links - anchors)}"


def test_the_cli_prints_the_page(capsys) -> None:
    assert main(["spec-reference"]) == 0
    assert capsys.readouterr().out.startswith("# Job spec reference")
