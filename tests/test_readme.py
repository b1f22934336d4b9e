"""The README stays a short page for users, and the job spec it shows is one the loader accepts."""

from __future__ import annotations

import re
from pathlib import Path

from primus_dagster.spec import parse_job_spec

README = Path(__file__).resolve().parents[1] / "README.md"
MAX_LINES = 250


def test_the_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines (at most {MAX_LINES}): move detail to docs/"


def test_the_readme_job_spec_is_valid() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md shows no job spec (a ```yaml block)"
    job = parse_job_spec(blocks[0], source="README.md")
    assert job.training.mode == "mixed"
