"""The architecture rules of ``primus_dagster`` that import-linter cannot state (``make lint`` runs this file).

Fast and static: the import graph comes from grimp (the library import-linter uses) and the AST; no module
of the package is imported. Each failure names the modules, the importing ``file:line`` and the name.

1. **No import cycles**, between any two modules of the package, at any depth and across packages. Every
   import counts: at module level, inside a function or method (a lazy import that dodges a cycle at
   import time is still a cycle of the design), under ``if TYPE_CHECKING:`` (a type-only dependency is a
   dependency: the fix is a protocol or a type in the lower module). Importing ``a.b.c`` also runs
   ``a.b/__init__.py`` first, so an import of a module is also an import of each of its packages that does
   not already contain the importer: ``a.x`` importing ``b.y`` depends on ``b`` too; and a module that
   imports its own package (``from primus_dagster.data import DataTask`` in ``data/batch.py``) is in a
   cycle as soon as that ``__init__.py`` imports it back. import-linter's
   ``acyclic_siblings`` contract (``[tool.importlinter]``) checks the stricter package-level rule between
   siblings at every depth, but it cannot see a cycle that goes through a package's ``__init__`` (the
   package is nobody's sibling of its own children): this test can.

2. **No private names across modules.** A name is private when it starts with ``_`` and is not a dunder
   (``__version__`` is public). Nobody imports a private name of a module of ``primus_dagster``: not
   ``from primus_dagster.x import _helper``, not ``import primus_dagster.x as x`` then ``x._helper``, at
   module level, inside functions, in multi-line and in relative imports alike. This covers every
   importer in the repository: the package, the reference code location (``definitions.py``,
   ``assets/``, ``resources/``, ``sensors/``), ``bench/`` and ``tests/`` (a test of a private helper tests it
   through the public name that uses it, or the helper becomes public). The one exception: the names of a
   *private module* (``pkg/_impl.py``) are that package's internals, so any module inside ``pkg`` (at any
   depth) may import ``_name`` from ``pkg._impl``; nobody outside ``pkg`` may import from it at all (the
   ``private_modules`` contract of import-linter says the same about the module itself). Private names of
   the helper modules of ``tests/`` and ``bench/`` are not checked.

3. **Every module is reachable from a production entry point** (:data:`ENTRY_POINTS`, each with the
   reason it is one) along imports that run (``TYPE_CHECKING`` imports do not), with the packages that
   running a module runs: a module that only ``bench/`` or ``tests/`` import is dead weight of the product
   (move it to ``bench/`` or ``tests/``, or use it). The test also checks that the list follows the project:
   every console script of ``[project.scripts]``, every ``python_module`` of ``workspace.yaml`` and every
   ``[..., "-m", "primus_dagster.<module>", ...]`` that production code launches is an entry point.
   A module loaded by name at run time (``importlib.import_module(f"primus_dagster.data.sources.{type}")``
   in the executor's warm-up) counts only where an import reaches it too: the source registry imports
   every adapter.

The map of the tree (docs/modules.md) is checked by ``tests/test_module_map.py``.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import grimp
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "primus_dagster"
#: The reference code location: top-level packages a user's ``definitions.py`` imports (grimp needs packages).
LOCATION_PACKAGES = ("assets", "resources", "sensors")

#: Production entry points: module -> why it is one. What these import, transitively (with the packages
#: that hold it), is the product. The console scripts include the dev tools' (``primus-dagster-dev``:
#: shipped with the package, for the demo and the tests' broker). The code locations of ``workspace.yaml``
#: are added by :func:`code_location_roots`. Not entry points: ``bench/``, ``tests/``, and modules that
#: can be run (``python -m primus_dagster.synth.cli``) but that no production code starts.
ENTRY_POINTS = {
    "primus_dagster.cli": "console script `primus-dagster` ([project.scripts]); also `python -m primus_dagster.cli`",
    "primus_dagster.devtools.cli": "console script `primus-dagster-dev` ([project.scripts])",
    "primus_dagster.data.executor.__main__": (
        "`python -m primus_dagster.data.executor`, started by data/executor/process.py (start_executor_process)"
        " and by the executor pods of cluster/kubernetes/manifests.py (EXECUTOR_MODULE)"
    ),
    "primus_dagster.training.distributed.dial_back": (
        "`python -m primus_dagster.training.distributed.dial_back`, a trainer rank that dials back to its parent,"
        " started by training/distributed/channel.py (ProcessStarter) and by the trainer rank pods of"
        " cluster/kubernetes/manifests.py (DIAL_BACK_MODULE)"
    ),
    "primus_dagster.dagster_defs": (
        "the library a user's Dagster code location imports (build_definitions, resources, sensors), as"
        " definitions.py does"
    ),
}


# -- the tree ---------------------------------------------------------------------------------------------


def module_name(path: Path) -> str:
    """``primus_dagster/data/__init__.py`` -> ``primus_dagster.data``; paths relative to the repository."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def package_modules() -> dict[str, Path]:
    """Every module of the package (packages by their ``__init__.py``) -> its file."""
    return {module_name(p): p for p in sorted((REPO / PACKAGE).rglob("*.py")) if "__pycache__" not in p.parts}


@cache
def parsed(path: Path) -> ast.Module:
    """The AST of ``path``, parsed once per run (every check reads the same files)."""
    return ast.parse(path.read_text(), filename=str(path))


def is_module(dotted: str) -> bool:
    """Whether ``dotted`` is a module or package of the repository (not a name inside one)."""
    base = REPO.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def is_package(module: str) -> bool:
    return package_modules()[module].name == "__init__.py"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def ancestors(module: str) -> list[str]:
    """``a.b.c`` -> ``[a.b, a]``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@cache
def import_graph(type_checking: bool) -> grimp.ImportGraph:
    """The package's import graph, plus the reference code location; ``type_checking``: with the
    imports under ``if TYPE_CHECKING:``."""
    return grimp.build_graph(
        PACKAGE, *LOCATION_PACKAGES, exclude_type_checking_imports=not type_checking, cache_dir=None
    )


@dataclass(frozen=True)
class Edge:
    """``importer`` depends on ``imported``; ``via`` is the module it names where the dependency is on a
    package that running ``via`` runs first (``via`` = ``imported`` for a direct import)."""

    importer: str
    imported: str
    via: str


def dependencies(graph: grimp.ImportGraph, modules: Iterable[str]) -> dict[str, set[Edge]]:
    """Each module -> its dependencies inside ``modules``: what it imports, and the packages of what it
    imports that do not contain it (running ``b.y`` runs ``b/__init__.py`` first)."""
    inside = set(modules)
    out: dict[str, set[Edge]] = {m: set() for m in inside}
    for importer in inside:
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported not in inside:
                continue
            if imported != importer:
                out[importer].add(Edge(importer, imported, imported))
            own = set(ancestors(importer))  # already running when the importer runs
            for package in ancestors(imported):
                if package in inside and package not in own and package != importer:
                    out[importer].add(Edge(importer, package, imported))
    return out


def describe(graph: grimp.ImportGraph, edge: Edge) -> str:
    """``importer -> imported`` with the import's ``file:line`` and statement."""
    details = sorted(
        graph.get_import_details(importer=edge.importer, imported=edge.via), key=lambda d: d["line_number"]
    )
    path = package_modules().get(edge.importer)
    where = []
    for d in details:
        line = path.read_text().splitlines()[d["line_number"] - 1] if path else ""
        lazy = "  (inside a function or block)" if line[:1].isspace() else ""
        where.append(f"{rel(path) if path else edge.importer}:{d['line_number']}: {d['line_contents']}{lazy}")
    head = f"{edge.importer} -> {edge.imported}"
    if edge.via != edge.imported:
        head += f"  (imports {edge.via}, which runs {edge.imported}/__init__.py first)"
    return "\n".join([head, *(f"          {w}" for w in where)])


# -- 1. cycles ----------------------------------------------------------------------------------------------


def strongly_connected(nodes: Iterable[str], succ: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of two or more modules, each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(succ[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def shortest_path(start: str, goal: str, succ: dict[str, set[str]], within: set[str]) -> list[str]:
    """Breadth-first: ``[start, ..., goal]`` inside ``within`` (both in it, a path known to exist)."""
    before: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for child in sorted(succ[node] & within):
            if child not in before:
                before[child] = node
                queue.append(child)
    path: list[str] = []
    step: str | None = goal
    while step is not None:
        path.append(step)
        step = before[step]
    return path[::-1]


def feedback_edges(nodes: set[str], succ: dict[str, set[str]]) -> list[tuple[str, str]]:
    """A small set of imports whose removal leaves ``nodes`` acyclic (the greedy order of Eades, Lin and
    Smyth: sinks last, sources first, else the module with the most imports out over in; the edges that
    point backwards in that order)."""
    out = {n: succ[n] & nodes for n in nodes}
    into: dict[str, set[str]] = {n: set() for n in nodes}
    for n in nodes:
        for m in out[n]:
            into[m].add(n)
    left = set(nodes)
    first: list[str] = []  # the order's head: sources, and the picks
    last: list[str] = []  # its tail: sinks
    while left:
        changed = True
        while changed:
            changed = False
            for n in sorted(left):
                if n in left and not out[n] & left:
                    last.insert(0, n)
                    left.discard(n)
                    changed = True
            for n in sorted(left):
                if n in left and not into[n] & left:
                    first.append(n)
                    left.discard(n)
                    changed = True
        if left:
            pick = max(sorted(left), key=lambda n: len(out[n] & left) - len(into[n] & left))
            first.append(pick)
            left.discard(pick)
    position = {n: i for i, n in enumerate(first + last)}
    return sorted((a, b) for a in nodes for b in out[a] if position[b] < position[a])


def cycle_report(graph: grimp.ImportGraph) -> list[str]:
    """One entry per set of mutually dependent modules: its members, and imports that would break every
    cycle among them, each with a cycle it closes (hop by hop, with the import that makes each hop)."""
    deps = dependencies(graph, set(package_modules()) & graph.modules)
    succ = {m: {e.imported for e in edges} for m, edges in deps.items()}
    edge_of: dict[tuple[str, str], Edge] = {}  # one edge per pair, a direct import where there is one
    for edge in sorted((e for edges in deps.values() for e in edges), key=lambda e: (e.via != e.imported, e.via)):
        edge_of.setdefault((edge.importer, edge.imported), edge)
    reports = []
    for component in strongly_connected(succ, succ):
        within = set(component)
        breakers = feedback_edges(within, succ)
        lines = [
            f"import cycle among {len(component)} modules: {', '.join(component)}",
            f"  removing these {len(breakers)} import(s) would break every cycle among them:",
        ]
        for a, b in breakers:
            cycle = [a, *shortest_path(b, a, succ, within)]
            lines.append(f"  - {a} -> {b}, in the cycle " + " -> ".join(cycle) + ":")
            lines.extend(f"      {describe(graph, edge_of[hop])}" for hop in itertools.pairwise(cycle))
        reports.append("\n".join(lines))
    return reports


def test_no_import_cycles() -> None:
    """No module of the package depends on itself through others (lazy and type-only imports count)."""
    reports = cycle_report(import_graph(type_checking=True))
    assert not reports, "\n\n".join(reports)


# -- 2. private names -----------------------------------------------------------------------------------


def importer_files() -> Iterator[Path]:
    """Every Python file that may import the package: the package, the code location, bench/, tests/."""
    roots = [REPO / PACKAGE, *(REPO / p for p in LOCATION_PACKAGES), REPO / "bench", REPO / "tests"]
    yield REPO / "definitions.py"
    for root in roots:
        yield from (p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts)


def resolve_from(importer: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute module of ``from ... import``; relative imports resolved against ``importer``."""
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_pkg else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


@dataclass(frozen=True, order=True)
class PrivateUse:
    path: str
    line: int
    module: str
    name: str
    how: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.how} uses {self.module}.{self.name}"


def private_name_allowed(importer: str, module: str, name: str) -> bool:
    """Whether ``importer`` may use ``name`` of ``module`` (a name, or a submodule) under rule 2: for each
    private part of ``module.name``, a private module may be used inside its package only, a private name
    only inside the module itself, or inside the package of a private module that holds it."""
    modules = package_modules()
    parts = f"{module}.{name}".split(".")
    for i in range(1, len(parts)):
        if not is_private(parts[i]):
            continue
        owner = ".".join(parts[:i])  # the package, or the module, the private part belongs to
        inside_owner = importer == owner or importer.startswith(owner + ".")
        if ".".join(parts[: i + 1]) in modules:  # a private module: its package only
            allowed = inside_owner
        else:  # a private name of the module `owner`
            package, _, leaf = owner.rpartition(".")
            allowed = importer == owner or (is_private(leaf) and importer.startswith(package + "."))
        if not allowed:
            return False
    return True


def private_uses(path: Path) -> list[PrivateUse]:
    """Private names of package modules that ``path`` imports or reaches through a module alias."""
    modules = package_modules()
    tree = parsed(path)
    importer = module_name(path)
    is_pkg = path.name == "__init__.py"
    found: set[PrivateUse] = set()
    aliases: dict[str, str] = {}  # local name -> package module it is bound to

    def check(module: str, name: str, line: int, how: str) -> None:
        if not private_name_allowed(importer, module, name):
            found.add(PrivateUse(rel(path), line, module, name, how))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != PACKAGE:
                    continue
                parent, _, leaf = alias.name.rpartition(".")
                if parent:  # import primus_dagster.x._y: the private module _y of x
                    check(parent, leaf, node.lineno, f"`import {alias.name}`")
                aliases[alias.asname or PACKAGE] = alias.name if alias.asname else PACKAGE
        elif isinstance(node, ast.ImportFrom):
            module = resolve_from(importer, is_pkg, node)
            if module.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                if alias.name == "*":
                    continue
                line = getattr(alias, "lineno", node.lineno)  # its own line in a multi-line import
                check(module, alias.name, line, f"`from {'.' * node.level}{node.module or ''} import {alias.name}`")
                if f"{module}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):  # x._y, x.sub._y, primus_dagster.x._y through the aliases bound above
        if not isinstance(node, ast.Attribute) or id(node) in inner:  # whole chains only
            continue
        chain: list[str] = []
        value: ast.expr = node
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in aliases:
            continue
        module = aliases[value.id]
        for attr in reversed(chain):
            if f"{module}.{attr}" in modules and not is_private(attr):
                module = f"{module}.{attr}"
                continue
            check(module, attr, node.lineno, f"`{value.id}.{'.'.join(reversed(chain))}`")
            break
    return sorted(found)


def test_no_private_names_across_modules() -> None:
    """Nobody imports a module's ``_private`` names (the exception: a private module's own package)."""
    uses = [use for path in importer_files() for use in private_uses(path)]
    assert not uses, "private names imported from another module:\n" + "\n".join(f"  {u}" for u in uses)


# -- 3. reachability ------------------------------------------------------------------------------------


def code_location_roots() -> dict[str, str]:
    """The code locations of ``workspace.yaml`` (top-level modules such as ``definitions``, read with the
    AST: grimp builds graphs of packages only) -> the modules each imports."""
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    roots: dict[str, str] = {}
    for entry in workspace.get("load_from", []):
        name = (entry.get("python_module") or {}).get("module_name")
        if not name:
            continue
        path = REPO / (name.replace(".", "/") + ".py")
        assert path.is_file(), f"workspace.yaml loads {name!r}, which is no file of the repository ({rel(path)})"
        for node in ast.walk(parsed(path)):
            for target in import_targets(node):
                if target.split(".")[0] in (PACKAGE, *LOCATION_PACKAGES) and is_module(target):
                    roots[target] = f"imported by {rel(path)} (code location of workspace.yaml)"
    return roots


def import_targets(node: ast.AST) -> list[str]:
    """What an absolute import statement may name: its modules, and for ``from m import n`` also ``m.n``
    (a submodule, or a name of ``m``); nothing for other nodes and relative imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level and node.module:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def reachable(graph: grimp.ImportGraph, roots: Iterable[str]) -> set[str]:
    """Every module that running ``roots`` runs: their imports and the packages those are in, transitively."""
    seen: set[str] = set()
    queue = deque(r for r in roots if r in graph.modules)
    while queue:
        module = queue.popleft()
        if module in seen:
            continue
        seen.add(module)
        queue.extend(ancestors(module))
        queue.extend(graph.find_modules_directly_imported_by(module))
    return seen


def outside_importers() -> dict[str, list[str]]:
    """Package module -> the ``file:line`` of each import of it in ``bench/`` and ``tests/``."""
    modules = package_modules()
    found: dict[str, list[str]] = {}
    for root in (REPO / "bench", REPO / "tests"):
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(parsed(path)):
                for target in import_targets(node):
                    if target in modules and isinstance(node, (ast.Import, ast.ImportFrom)):
                        found.setdefault(target, []).append(f"{rel(path)}:{node.lineno}")
    return found


def test_every_module_is_reachable_from_an_entry_point() -> None:
    """No module of the package is imported only by ``bench/`` or ``tests/``, or by nothing."""
    graph = import_graph(type_checking=False)
    roots = {**ENTRY_POINTS, **code_location_roots()}
    missing = sorted(m for m in roots if m.split(".")[0] == PACKAGE and m not in graph.modules)
    assert not missing, f"entry points that are no module of the package: {missing}"
    live = reachable(graph, roots)
    dead = sorted(set(package_modules()) - live)
    outside = outside_importers() if dead else {}
    lines = []
    for module in dead:
        users = [u for u in sorted(graph.find_modules_that_directly_import(module)) if u.split(".")[0] == PACKAGE]
        by = [*(f"{u} (itself unreachable)" for u in users), *outside.get(module, [])]
        users_text = "imported only by " + ", ".join(by) if by else "imported by nothing"
        lines.append(f"  {module} ({rel(package_modules()[module])}): {users_text}")
    assert not lines, (
        "modules no production entry point reaches (the entry points: "
        + "; ".join(f"{m}: {why}" for m, why in sorted(roots.items()))
        + "):\n"
        + "\n".join(lines)
    )


def launched_modules(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of each ``[..., "-m", MODULE, ...]`` in ``path`` (a string, or a name bound to one
    at module level) that names a module of the package."""
    tree = parsed(path)
    constants = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    for node in ast.walk(tree):
        if not isinstance(node, (ast.List, ast.Tuple)):
            continue
        items = node.elts
        for flag, target in itertools.pairwise(items):
            if not (isinstance(flag, ast.Constant) and flag.value == "-m"):
                continue
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                module = target.value
            elif isinstance(target, ast.Name) and target.id in constants:
                module = constants[target.id]
            else:
                continue
            if module.split(".")[0] == PACKAGE:
                yield flag.lineno, module


def console_scripts() -> dict[str, str]:
    """``[project.scripts]`` of pyproject.toml: name -> ``module:function`` (read by hand: no tomllib
    before Python 3.11)."""
    text = (REPO / "pyproject.toml").read_text()
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[)", text, re.M | re.S)
    assert section, "pyproject.toml has no [project.scripts]"
    return dict(re.findall(r'^([\w.-]+)\s*=\s*"([^"]+)"', section.group(1), re.M))


def test_the_entry_points_follow_the_project() -> None:
    """Console scripts, workspace code locations and ``python -m`` launches of production code are all
    entry points of the reachability check."""
    modules = package_modules()
    problems = []
    scripts = console_scripts()
    for script, target in sorted(scripts.items()):
        module = target.split(":")[0]
        if module not in ENTRY_POINTS:
            problems.append(f"console script {script!r} ({target}): {module} is not in ENTRY_POINTS")
    assert code_location_roots(), "workspace.yaml names no python_module code location"
    for path in (modules[m] for m in sorted(modules)):
        for line, module in launched_modules(path):
            if module not in modules:
                problems.append(f"{rel(path)}:{line}: launches `-m {module}`, which is no module of the package")
                continue
            run = f"{module}.__main__" if is_package(module) else module
            if run not in ENTRY_POINTS:
                problems.append(f"{rel(path)}:{line}: launches `-m {module}`: {run} is not in ENTRY_POINTS")
    assert not problems, "\n".join(problems)
