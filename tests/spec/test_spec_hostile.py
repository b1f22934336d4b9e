"""Files nobody should feed the loader: each one is a SpecError naming the file, the key path and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_dagster.cli import main
from primus_dagster.spec import SpecError, load_job_spec, parse_job_spec
from primus_dagster.spec.loader import MAX_BYTES
from primus_dagster.spec.yaml_reader import MAX_DEPTH

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"
TEXT = EXAMPLE.read_text()


def line_of(text: str, needle: str, occurrence: int = 0) -> int:
    """1-based line of the ``occurrence``-th line holding ``needle``."""
    return [i + 1 for i, line in enumerate(text.splitlines()) if needle in line][occurrence]


def problems_of(text: str) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        parse_job_spec(text, "job.yaml")
    message = str(info.value)
    assert message.startswith("invalid job spec job.yaml:")
    assert all(line.startswith("  job.yaml") for line in message.splitlines()[1:]), message
    return info.value.problems


def only_problem(text: str) -> tuple[str, str]:
    found = problems_of(text)
    assert len(found) == 1, found
    return found[0]


def load_file(tmp_path: Path, data: bytes) -> SpecError:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    with pytest.raises(SpecError) as info:
        load_job_spec(path)
    assert str(path) in str(info.value)
    return info.value


# ---- files that are no YAML text ----------------------------------------------------------------------


def test_binary_file(tmp_path: Path) -> None:
    err = load_file(tmp_path, b"name: x\n\x00\x01\x02\xff" * 10)
    assert err.details[0].path == "<file>" and "NUL" in err.details[0].message and err.details[0].line == 2


def test_not_utf8_names_line_and_column(tmp_path: Path) -> None:
    err = load_file(tmp_path, TEXT.replace("tracking:", "tracking:  # caf\xe9").encode("latin-1"))
    (problem,) = err.details
    assert "not UTF-8" in problem.message and "0xe9" in problem.message
    assert problem.line == line_of(TEXT, "tracking:")


def test_utf16_file(tmp_path: Path) -> None:
    err = load_file(tmp_path, TEXT.encode("utf-16"))
    assert "UTF-16" in str(err)


def test_utf8_bom_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + TEXT.encode())
    assert load_job_spec(path).name == "ctr-demo"


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty(tmp_path: Path, text: str) -> None:
    err = load_file(tmp_path, text.encode())
    assert "empty" in str(err) or "null" in str(err)


def test_huge_file(tmp_path: Path) -> None:
    err = load_file(tmp_path, TEXT.encode() + b"#" * MAX_BYTES)
    assert "larger than" in str(err)


def test_directory_and_missing_file(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "nope.yaml"):
        with pytest.raises(SpecError, match="cannot read"):
            load_job_spec(path)


def test_control_character(tmp_path: Path) -> None:
    err = load_file(tmp_path, TEXT.replace("tracking:", "tracking:\x07").encode())
    assert "U+0007" in str(err) and err.details[0].line == line_of(TEXT, "tracking:")


# ---- hostile YAML -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["a: " + "[" * 10_000 + "]" * 10_000, "a: " + "{b: " * 5_000 + "1" + "}" * 5_000, "a:\n" + "- " * 3_000 + "x"],
    ids=["flow-lists", "flow-maps", "block-lists"],
)
def test_deep_nesting(text: str) -> None:
    where, message = only_problem(text)
    assert where.startswith("<yaml> (line ") and f"deeper than {MAX_DEPTH}" in message


def test_billion_laughs() -> None:
    levels = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i, name in enumerate("bcdefghi"):
        previous = "abcdefghi"[i]
        levels.append(f"{name}: &{name} [{', '.join(['*' + previous] * 10)}]")
    where, message = only_problem("\n".join(levels) + "\n")
    assert "aliases are expanded" in message and "(line" in where


def test_recursive_alias() -> None:
    where, message = only_problem("a: &a [1, *a]\n")
    assert where == "a[1] (line 1)" and "recursive alias" in message


@pytest.mark.parametrize(
    "tag", ["!!python/object:os.system", "!!python/object/apply:os.system", "!!python/name:os.system", "!custom"]
)
def test_unsafe_tags(tag: str) -> None:
    where, message = only_problem(TEXT.replace("experiment: ctr-demo", f"experiment: {tag} ls"))
    assert where == f"tracking.experiment (line {line_of(TEXT, 'experiment: ctr-demo')})"
    assert tag in message and "not allowed" in message


def test_value_that_cannot_be_built() -> None:
    where, message = only_problem(TEXT.replace("batch_size: 1024", "batch_size: !!int lots"))
    assert where.startswith("training.batch_size (line") and "cannot read this value as int" in message


def test_syntax_error_names_the_file_and_line() -> None:
    text = TEXT.replace("name: ctr-demo", "name: [ctr-demo")
    with pytest.raises(SpecError) as info:
        parse_job_spec(text, "job.yaml")
    assert "<unicode string>" not in str(info.value)
    (problem,) = info.value.details
    assert problem.path == "<yaml>" and problem.line is not None and problem.column is not None
    assert f"job.yaml:{problem.line}:{problem.column}: <yaml>:" in str(info.value)


def test_several_documents() -> None:
    _where, message = only_problem(TEXT + "\n---\nname: other\n")
    assert "single document" in message


@pytest.mark.parametrize("text", ["- a list", "just a string", "42", "null"])
def test_not_a_mapping(text: str) -> None:
    where, message = only_problem(text)
    assert where.startswith("<root>") and "mapping" in message


def test_non_string_keys() -> None:
    where, message = only_problem(TEXT + "\n1: one\n")
    assert where.startswith("1 (line") and "string" in message


# ---- dates and durations that cannot be -------------------------------------------------------------


@pytest.mark.parametrize("start", ["2026-02-30", "2026-13-01", "2026-11-01T25:00:00", "0000-01-01"])
def test_impossible_dates(start: str) -> None:
    where, message = only_problem(TEXT.replace("start: 2026-11-01", f"start: {start}"))
    assert where == f"dataset.start (line {line_of(TEXT, 'start: 2026-11-01')})", message


@pytest.mark.parametrize(
    "start", ["1969-12-31", "3000-01-01", "9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+01:00"]
)
def test_dates_out_of_range(start: str) -> None:
    where, message = only_problem(TEXT.replace("start: 2026-11-01", f"start: {start}"))
    assert where.startswith("dataset.start (line") and "range" in message


@pytest.mark.parametrize(
    "window,words",
    [
        (".inf", "finite"),
        ("-.inf", "finite"),
        (".nan", "finite"),
        ("99999999999999999999d", "too long"),
        ("1" * 400, "too long"),
        ("1" * 5000, "cannot read"),  # past Python's int digit limit: YAML cannot build it
        ("1.0e+400", "finite"),
        ("36501d", "too long"),
    ],
)
def test_overflowing_durations(window: str, words: str) -> None:
    where, message = only_problem(TEXT.replace("window: 24h", f"window: {window}"))
    assert where.startswith("dataset.streams[0].window (line"), where
    assert words in message, message


# ---- duplicate keys, line numbers, anchors ------------------------------------------------------------


def test_duplicate_key_names_both_lines() -> None:
    text = TEXT.replace("  learning_rate: 0.002", "  learning_rate: 0.002\n  learning_rate: 0.1")
    where, message = only_problem(text)
    first = line_of(text, "learning_rate:")
    assert where == f"training.learning_rate (line {first + 1})"
    assert f"lines {first} and {first + 1}" in message and "duplicate key" in message


def test_duplicate_keys_are_reported_with_other_problems() -> None:
    text = TEXT.replace("  batch_size: 1024", "  batch_size: 1024\n  batch_size: 0").replace(
        "name: ctr-demo", "name: ctr-demo\nname: ctr-demo"
    )
    found = problems_of(text)
    assert len(found) == 3, found
    assert any(w.startswith("name (line") and "duplicate" in m for w, m in found)
    assert any(w.startswith("training.batch_size (line") and "duplicate" in m for w, m in found)
    assert any(w.startswith("training.batch_size (line") and "greater than" in m for w, m in found)


def test_duplicate_key_in_flow_mapping() -> None:
    where, message = only_problem(
        TEXT.replace("{replicas: 2, min_replicas: 1", "{replicas: 2, replicas: 3, min_replicas: 1")
    )
    assert where.startswith("pools.data.replicas (line") and "duplicate" in message


def test_merge_keys_are_no_duplicates() -> None:
    text = TEXT.replace("  experiment: ctr-demo", "  <<: {experiment: base}\n  experiment: ctr-demo")
    assert parse_job_spec(text).tracking.experiment == "ctr-demo"


def test_line_of_a_block_mapping_is_its_key() -> None:
    text = TEXT.replace(
        "  data: {replicas: 2, min_replicas: 1, max_replicas: 4}   # task_runners: one per core of cpu (1)",
        "  data:\n    replicas: 9\n    max_replicas: 4",
    )
    where, _ = only_problem(text)
    assert where == f"pools.data (line {line_of(text, '  data:')})"


def test_line_of_a_model_level_error_is_its_key() -> None:
    text = TEXT.replace("  start: 2026-11-01", "  start: 2026-11-01\n  end: 2026-10-01")
    where, message = only_problem(text)
    assert where == f"dataset (line {line_of(text, 'dataset:')})" and "after start" in message


def test_missing_key_points_at_its_mapping() -> None:
    text = TEXT.replace("          topic: ctr-events", "")
    where, message = only_problem(text)
    assert where == f"dataset.streams[1].sources[0].topic (line {line_of(text, '- name: events_kafka')})"
    assert "required" in message


def test_error_in_an_anchor_is_reported_once() -> None:
    text = TEXT.replace("            id: sample_id", "            id: sample_id\n            colour: red")
    where, message = only_problem(text)
    assert where == f"dataset.streams[0].sources[0].columns.colour (line {line_of(text, 'colour: red')})"
    uses = [str(line_of(text, "columns: *columns", i)) for i in range(3)]
    assert f"also used at lines {', '.join(uses)}" in message


def test_bad_value_in_an_anchor_is_reported_once() -> None:
    text = TEXT.replace("dense: [d0, d1,", "dense: [d0, d0,")
    where, message = only_problem(text)
    assert where.startswith("dataset.streams[0].sources[0].columns.dense (line") and "unique" in message


# ---- the command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"\x00\xff\xfe", b"", b"a: &a [*a]", TEXT.replace("start: 2026-11-01", "start: 2026-02-30").encode()],
    ids=["binary", "empty", "recursive", "feb-30"],
)
def test_validate_exits_2_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"invalid job spec {path}:") and "Traceback" not in err
    assert all(line.startswith(f"  {path}") for line in err.splitlines()[1:])
