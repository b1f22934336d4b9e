"""The code's comments and docstrings carry no measured figures of a machine.

Project rule: keep the *why* in the code and cite the benchmark by name; the measured figures live in the
benchmark docs (``docs/*.md``, sections "Measured reasons in the code"), never in code. This walks
``primus_dagster/**/*.py``, reads every comment (``tokenize``) and every module, class and function
docstring (``ast``), and names ``file:line`` for each timing, issue number, core count or "loaded
machine" found there. A time that is behaviour, not a measurement (a poll interval, a backoff, a
timeout), is let through when its line says so.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "primus_dagster"

TIMING = re.compile(r"(?<![\w.])\d+(\.\d+)?\s?(ms|µs|us)\b")
# a timing on a line holding one of these is an interval the code keeps, not a measurement
BEHAVIOUR = re.compile(r"\b(apart|doubling|timeout|every|wait|waits|waiting|poll|polls|polling)\b", re.I)
FORBIDDEN = {
    "issue number": re.compile(r"\bissue \d+", re.I),
    "core count": re.compile(r"\b\d+-core\b", re.I),
    "this VM": re.compile(r"\bthis VM\b"),
    "loaded machine": re.compile(r"loaded machine", re.I),
}


def texts(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """(line, text) of every comment line and docstring line in ``source``."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source, filename=filename)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            value = body[0].value.value
            if isinstance(value, str):
                for offset, line in enumerate(value.splitlines()):
                    yield body[0].lineno + offset, line


def findings(source: str, where: str) -> Iterator[str]:
    """``where:line: what: text`` for each figure in ``source``'s comments and docstrings."""
    for line, text in texts(source, where):
        if TIMING.search(text) and not BEHAVIOUR.search(text):
            yield f"{where}:{line}: measured timing: {text.strip()}"
        for what, pattern in FORBIDDEN.items():
            if pattern.search(text):
                yield f"{where}:{line}: {what}: {text.strip()}"


def test_the_checker_sees_figures_and_lets_intervals_through() -> None:
    sample = (
        '"""Measured: 3.0 µs a record on a loaded machine."""\n'
        "# Poll from 0.2 ms apart, doubling up to 5 ms.\n"
        "def f():\n"
        '    """~12 ms here (issue 11 on this VM, 2-core)."""\n'
        "    return 1  # ~110 us a step\n"
    )
    found = list(findings(sample, "sample.py"))
    assert sorted(int(f.split(":")[1]) for f in found) == [1, 1, 4, 4, 4, 4, 5], found


def test_code_comments_and_docstrings_carry_no_machine_figures() -> None:
    problems = [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        for problem in findings(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not problems, (
        "measured figures belong in docs/*.md ('Measured reasons in the code'), not in the code:\n"
        + "\n".join(problems)
    )
