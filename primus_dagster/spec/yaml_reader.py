"""Read a job spec's YAML defensively: bounded, strict, and with every problem located.

``read_yaml(text)`` returns the data and its composed node tree (for line numbers), or raises
:class:`YamlProblems`. Beyond PyYAML's safe loader it refuses

- nesting deeper than :data:`MAX_DEPTH` (the composer recurses: deep nesting would crash it),
- more than :data:`MAX_NODES` nodes once aliases are expanded ("billion laughs": validation walks the
  expanded data) and recursive aliases,
- duplicate keys in one mapping (PyYAML keeps the last one silently), naming both lines,

and turns a value that cannot be built (``!!int abc``, an impossible date written as a YAML timestamp
such as ``2026-02-30``) into a located problem: a timestamp that is no real date stays the text it is,
so that the spec's own validation names its key. Nothing here echoes a value: YAML errors give the
problem, line and column, never the source line (it may hold a secret).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

MAX_DEPTH = 64
MAX_NODES = 50_000
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


@dataclass(frozen=True)
class YamlProblem:
    """One problem: ``path`` as key parts (may be empty), a message, and a 1-based line (and column)."""

    path: tuple[Any, ...]
    message: str
    line: int | None = None
    column: int | None = None


class YamlProblems(Exception):
    """The YAML could not be read into data; ``problems`` says where and why."""

    def __init__(self, problems: list[YamlProblem]):
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


class _Loader(yaml.SafeLoader):
    """SafeLoader with a nesting bound and constructors that fail with a located YAML error."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            self._nodes += 1
            if self._nodes > MAX_NODES:
                mark = self.peek_event().start_mark
                raise ComposerError(None, None, f"more than {MAX_NODES:,} values: a job spec is far smaller", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # any failure to build a value is the input's problem
            tag = str(node.tag).rsplit(":", 1)[-1]
            raise ConstructorError(
                None, None, f"cannot read this value as {tag} ({type(exc).__name__})", node.start_mark
            ) from None

    def construct_lenient_timestamp(self, node: Any) -> Any:
        """A YAML timestamp that is no real date (``2026-02-30``, hour 25) stays text for validation to name."""
        try:
            return self.construct_yaml_timestamp(node)
        except (ValueError, OverflowError, AttributeError):
            return self.construct_scalar(node)


_Loader.add_constructor(_TIMESTAMP_TAG, _Loader.construct_lenient_timestamp)


def _line(mark: Any) -> int | None:
    return None if mark is None else mark.line + 1


def _yaml_error(exc: yaml.YAMLError, text: str) -> YamlProblem:
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return YamlProblem((), f"character U+{ord(char):04X} is not allowed in YAML", line, column)
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        message = str(exc.problem or exc.context or "YAML syntax error")
        tag = re.match(r"could not determine a constructor for the tag '(.*)'$", message)
        if tag:
            name = re.sub(r"^tag:yaml\.org,2002:", "!!", tag[1])
            message = f"the YAML tag {_short(name)!r} is not allowed: a job spec holds plain values"
        if exc.context and exc.problem:
            where = f" at line {_line(exc.context_mark)}" if exc.context_mark and exc.context_mark is not mark else ""
            message = f"{message} ({exc.context}{where})"
        return YamlProblem((), message, _line(mark), None if mark is None else mark.column + 1)
    return YamlProblem((), f"YAML error: {type(exc).__name__}")


class _Recursive(Exception):
    pass


class _TooBig(Exception):
    pass


def _check_tree(root: yaml.Node) -> list[YamlProblem]:
    """Duplicate keys (once per node, also through aliases); raises for recursion and size."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    problems: list[YamlProblem] = []

    def walk(node: yaml.Node, path: tuple[Any, ...]) -> int:
        ident = id(node)
        if ident in sizes:
            return sizes[ident]
        if ident in visiting:
            raise _Recursive(path, node)
        visiting.add(ident)
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], yaml.Node] = {}
            for key, value in node.value:
                name: Any = key.value if isinstance(key, yaml.ScalarNode) else "?"
                if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE_TAG:
                    first = seen.setdefault((key.tag, key.value), key)
                    if first is not key:
                        problems.append(
                            YamlProblem(
                                (*path, name),
                                f"duplicate key {_short(key.value)!r} (lines {_line(first.start_mark)} and "
                                f"{_line(key.start_mark)}): a key may appear once in a mapping",
                                _line(key.start_mark),
                            )
                        )
                total += walk(key, (*path, name)) + walk(value, (*path, name))
                if total > MAX_NODES:
                    raise _TooBig(path, node)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                total += walk(item, (*path, index))
                if total > MAX_NODES:
                    raise _TooBig(path, node)
        visiting.discard(ident)
        sizes[ident] = total
        return total

    try:
        walk(root, ())
    except _Recursive as exc:
        path, node = exc.args
        return [
            YamlProblem(
                path, "an alias refers to the node that contains it (a recursive alias)", _line(node.start_mark)
            )
        ]
    except _TooBig as exc:
        path, node = exc.args
        return [
            YamlProblem(
                path,
                f"more than {MAX_NODES:,} values once aliases are expanded: a job spec is far smaller "
                "(aliases nested inside aliases multiply)",
                _line(node.start_mark),
            )
        ]
    return problems


def _path_at(root: yaml.Node, mark: Any) -> tuple[Any, ...]:
    """Key path of the node that starts at ``mark`` (``()`` if none does)."""
    if mark is None:
        return ()
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.start_mark.index == mark.index:
            return path
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                stack += [(value, (*path, name)), (key, (*path, name))]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(item, (*path, index)) for index, item in enumerate(node.value)]
    return ()


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def read_yaml(text: str) -> tuple[Any, yaml.Node | None, list[YamlProblem]]:
    """``(data, root node, duplicate keys)`` of one YAML document (``(None, None, [])`` for an empty one).

    Duplicate keys do not stop the reading (the last one is in the data), so that the caller can report
    them together with what validation finds; anything else that stops it raises :class:`YamlProblems`.
    """
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # checks every character first
        root = loader.get_single_node()
        if root is None:
            return None, None, []
        problems = _check_tree(root)
        duplicates = [p for p in problems if p.message.startswith("duplicate key")]
        if len(duplicates) != len(problems):
            raise YamlProblems(problems)
        try:
            data = loader.construct_document(root)
        except yaml.MarkedYAMLError as exc:  # a value that cannot be built: name its key
            problem = _yaml_error(exc, text)
            path = _path_at(root, exc.problem_mark)
            raise YamlProblems([YamlProblem(path, problem.message, problem.line, problem.column)]) from None
    except yaml.YAMLError as exc:
        raise YamlProblems([_yaml_error(exc, text)]) from None
    except RecursionError:  # a bound above failed to hold; still a message, not a crash
        raise YamlProblems([YamlProblem((), f"nested too deeply (at most {MAX_DEPTH} levels)")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, root, duplicates
