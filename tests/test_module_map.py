"""The map of the tree in docs/modules.md ("What is where") lists the tree as it is (``make lint`` runs this file).

The map is the first fenced block of that section. Each line is an *entry* (paths, then a description
after two spaces or more) or the *continuation* of the entry above (a line indented to the description
column or further). Paths are what an entry line holds before its description, separated by spaces or
commas: ``name/`` is a directory, anything else a file; an entry indented by 2·d spaces lies in the
directory of the last entry at depth d-1 (``primus_dagster/`` at depth 0, ``data/`` at 1, ``driver/`` at 2,
``state.py`` at 3). Module names in a description do not count.

The test checks, naming each path and the map's line:

* every module of ``primus_dagster/`` is listed, and every listed path exists. ``__init__.py`` (a package
  is listed as its directory, the entry says what its API is) and ``__main__.py`` (the ``python -m`` hook of
  its package) need not be listed, but may be;
* every top-level directory of the repository (hidden ones, ``__pycache__`` and build outputs excepted) is
  listed, and so is nothing that does not exist;
* the entry of ``docs/`` names every ``docs/*.md`` and no other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAP = REPO / "docs" / "modules.md"
HEADING = "## What is where"
PACKAGE = "primus_dagster"
UNLISTED_MODULES = {"__init__.py", "__main__.py"}
#: Top-level directories that are no part of the project's layout.
NOT_LAYOUT = {"__pycache__", "build", "dist", "node_modules"}


@dataclass(frozen=True)
class Entry:
    line: int  # in docs/modules.md, 1-based
    path: str  # relative to the repository; a directory ends with "/"
    description: str  # with its continuation lines


def map_block() -> tuple[int, list[str]]:
    """(docs/modules.md line of the block's first line, the block's lines)."""
    lines = MAP.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == HEADING), None)
    assert start is not None, f"docs/modules.md has no {HEADING!r} section"
    fence = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("```")), None)
    assert fence is not None and not any(line.startswith("## ") for line in lines[start + 1 : fence]), (
        f"docs/modules.md:{start + 1}: the {HEADING!r} section has no fenced block"
    )
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    return fence + 2, lines[fence + 1 : end]


def map_entries() -> list[Entry]:
    """Every path of the map, in order."""
    first, lines = map_block()
    head = re.match(r"(\S+)\s{2,}", lines[0])
    assert head, f"docs/modules.md:{first}: the map's first line has no description column"
    column = head.end()
    entries: list[Entry] = []
    dirs: list[str] = []  # dirs[d]: the directory of the last entry line at depth d
    current: list[int] = []  # the entries of the last entry line
    for offset, text in enumerate(lines):
        line, stripped = first + offset, text.strip()
        indent = len(text) - len(text.lstrip())
        if not stripped:
            continue
        if indent >= column:  # more description of the entries above
            for i in current:
                entries[i] = replace(entries[i], description=f"{entries[i].description} {stripped}")
            continue
        assert indent % 2 == 0, f"docs/modules.md:{line}: indent by 2 spaces per level, not {indent}"
        depth = indent // 2
        assert depth <= len(dirs), f"docs/modules.md:{line}: indented deeper than the directory above"
        left, _, description = stripped.partition("  ")
        parent = dirs[depth - 1] if depth else ""
        del dirs[depth:]
        current = []
        for token in filter(None, re.split(r"[,\s]+", left)):
            entries.append(Entry(line, parent + token, description.strip()))
            current.append(len(entries) - 1)
            if token.endswith("/") and len(dirs) == depth:
                dirs.append(parent + token)
    return entries


def tree_modules() -> set[str]:
    """Every module of the package that the map must list, relative to the repository."""
    return {
        str(p.relative_to(REPO))
        for p in (REPO / PACKAGE).rglob("*.py")
        if "__pycache__" not in p.parts and p.name not in UNLISTED_MODULES
    }


def exists(path: str) -> bool:
    target = REPO / path.rstrip("/")
    return target.is_dir() if path.endswith("/") else target.is_file()


def test_the_map_lists_every_module_of_the_package() -> None:
    entries = map_entries()
    listed = {e.path: e for e in entries if e.path.startswith(PACKAGE + "/")}
    missing = sorted(tree_modules() - set(listed))
    stale = sorted(f"{p} (docs/modules.md:{e.line})" for p, e in listed.items() if not exists(p))
    problems = [f"  not in the map: {p}" for p in missing] + [f"  in the map, not in the tree: {p}" for p in stale]
    assert not problems, "docs/modules.md 'What is where' differs from primus_dagster/:\n" + "\n".join(problems)


def test_the_map_lists_the_top_level_of_the_repository() -> None:
    entries = map_entries()
    top = {e.path.split("/")[0] + ("/" if "/" in e.path else "") for e in entries}
    stale = sorted(  # the package's own entries: the test above
        f"{e.path} (docs/modules.md:{e.line})"
        for e in entries
        if not e.path.startswith(PACKAGE + "/") and not exists(e.path)
    )
    dirs = sorted(
        p.name + "/"
        for p in REPO.iterdir()
        if p.is_dir() and not p.name.startswith(".") and not p.name.endswith(".egg-info") and p.name not in NOT_LAYOUT
    )
    missing = [d for d in dirs if d not in top]
    problems = [f"  top-level directory not in the map: {d}" for d in missing]
    problems += [f"  in the map, not in the repository: {p}" for p in stale]
    assert not problems, "docs/modules.md 'What is where' differs from the repository:\n" + "\n".join(problems)


def test_the_docs_entry_names_every_document() -> None:
    entry = next((e for e in map_entries() if e.path == "docs/"), None)
    assert entry is not None, "docs/modules.md 'What is where' has no docs/ entry"
    named = set(re.findall(r"[\w.-]+\.md", entry.description))
    present = {p.name for p in (REPO / "docs").glob("*.md")}
    problems = [f"  not named: docs/{n}" for n in sorted(present - named)]
    problems += [f"  named, not in docs/: {n}" for n in sorted(named - present)]
    assert not problems, f"docs/modules.md:{entry.line}: the docs/ entry differs from docs/:\n" + "\n".join(problems)
