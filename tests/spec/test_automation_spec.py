"""The ``automation`` section: defaults, the reference example's values, and bad values named by key path."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from primus_dagster.spec import AutomationSpec, SpecError, job_spec_json_schema, load_job_spec, parse_job_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"

MINIMAL = """
name: tiny
dataset:
  start: 2026-11-01
  streams:
    - name: history
      sources:
        - {name: clicks, type: parquet, path: p, columns: {ts: t, label: y, dense: [a]}}
"""


def test_defaults_when_the_section_is_absent() -> None:
    automation = parse_job_spec(MINIMAL).automation
    assert automation == AutomationSpec()
    assert automation.sensor_interval == timedelta(seconds=30) and automation.max_wait == timedelta(minutes=15)
    assert (automation.rerun, automation.cold_start, automation.min_new_records) == ("never", "first_partition", 10_000)


def test_the_reference_example_sets_every_key() -> None:
    automation = load_job_spec(EXAMPLE).automation
    assert automation.min_new_records == 5000 and automation.max_wait == timedelta(minutes=10)
    assert automation.model_fields_set == set(AutomationSpec.model_fields)


@pytest.mark.parametrize(
    "section,path,message",
    [
        ("{min_new_records: 0}", "automation.min_new_records", "greater than or equal to 1"),
        ("{max_wait: 0s}", "automation.max_wait", "positive"),
        ("{sensor_interval: soon}", "automation.sensor_interval", "duration"),
        ("{rerun: always}", "automation.rerun", "'never' or 'retrain'"),
        ("{cold_start: error}", "automation.cold_start", "'first_partition' or 'allow'"),
        ("{cooldown: 5m}", "automation.cooldown", "unknown key"),
    ],
)
def test_a_bad_value_is_an_error_naming_its_key(section: str, path: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(MINIMAL + f"automation: {section}\n")
    assert any(where.startswith(path + " (line") and message in text for where, text in info.value.problems), (
        info.value.problems
    )


def test_the_json_schema_documents_the_section() -> None:
    schema = json.loads(job_spec_json_schema())
    assert "automation" in schema["properties"]
    fields = schema["$defs"]["AutomationSpec"]["properties"]
    assert set(fields) == {"sensor_interval", "min_new_records", "max_wait", "rerun", "cold_start"}
    assert fields["max_wait"]["default"] == "15m"
