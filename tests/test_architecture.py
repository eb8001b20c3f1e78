"""The shape of the code: iolib's and predictors' modules import one another without a
cycle, and no module reaches for another's private (underscore) names.

Why a test: a cycle hidden by a lazy or a type-only import still couples two modules
(neither can change alone), and a private name used elsewhere is an API nobody
promised. Every import counts here, at any depth of a file: top level, inside a
function, under ``if TYPE_CHECKING``. The graph is read from the source with ``ast``;
nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("iolib", "predictors")

# Private names still imported across modules, as (importer, module, name): none. A name
# another module needs gets a public home instead of an entry here.
PRIVATE_IMPORTS_ALLOWED: set[tuple[str, str, str]] = set()


def _modules() -> dict[str, Path]:
    """Every module by dotted name, a C extension by its source (it imports nothing)."""
    found = {}
    for package in PACKAGES:
        for path in sorted([*(ROOT / package).rglob("*.py"), *(ROOT / package).rglob("*.c")]):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import in the file, and
    for every ``alias._name`` read through a module bound by an import."""
    if path.suffix == ".c":
        return []
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, str | None]] = []
    bound: dict[str, str] = {}  # local name -> the module it refers to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append((alias.name, None))
                top = alias.name.split(".")[0]
                bound[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path, node)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in known:
                    out.append((submodule, None))
                    bound[alias.asname or alias.name] = submodule
                else:
                    out.append((base, alias.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = bound.get(node.value.id)
            if target is not None and node.attr.startswith("_"):
                out.append((target, node.attr))
    return [(target, name) for target, name in out if target.split(".")[0] in PACKAGES]


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {
        module: {target for target, _ in _imports(module, path, known) if target != module}
        for module, path in known.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_graph_sees_every_kind_of_import() -> None:
    graph = _graph()
    assert "iolib.decode.geometry" in graph["iolib.images"]  # from iolib.decode import geometry
    assert "iolib.decode" in graph["iolib.images"]  # from iolib.decode import OutputSpec
    assert "predictors" not in {m.split(".")[0] for m in graph["iolib.errors"]}


def test_private_names_are_seen_through_a_module_alias(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("import iolib.storage.wrapper as w\nfrom iolib import rng\nw._unit\nrng._x\n")
    found = _imports("iolib.m", path, _modules())
    assert ("iolib.storage.wrapper", "_unit") in found and ("iolib.rng", "_x") in found


def test_no_import_cycle() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "modules that import each other (directly or around a loop):\n" + (
        "\n".join(" <-> ".join(c) for c in cycles)
    )


def test_cycle_finder_finds_a_loop() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_predictors_never_import_iolib() -> None:
    graph = _graph()
    reach = sorted(
        (m, t) for m, targets in graph.items() if m.startswith("predictors") for t in targets
    )
    assert [(m, t) for m, t in reach if t.startswith("iolib")] == []


def test_no_module_imports_anothers_private_names() -> None:
    known = _modules()
    found = set()
    for module, path in known.items():
        for target, name in _imports(module, path, known):
            private = name is not None and name.startswith("_") and not name.startswith("__")
            if private and target != module:
                found.add((module, target, name))
    new = sorted(found - PRIVATE_IMPORTS_ALLOWED)
    assert not new, f"private names imported from another module: {new}"
    gone = sorted(PRIVATE_IMPORTS_ALLOWED - found)
    assert not gone, f"fixed: delete these from PRIVATE_IMPORTS_ALLOWED: {gone}"


def test_the_packages_never_import_the_lab_by_name_or_by_string() -> None:
    """No module of iolib or predictors imports `benchmarks`: not by an import
    statement, not by `importlib.import_module("benchmarks...")`, `__import__` or a table
    of lazy names, and none puts the checkout on `sys.path` to find it."""
    from tests.import_graph import LAB, path_changes, string_imports

    known = _modules()
    found = []
    for module, path in known.items():
        found += [(module, t) for t, _ in _imports(module, path, known) if t.split(".")[0] == LAB]
        found += [(module, t) for t in string_imports(path) if t.split(".")[0] == LAB]
        found += [(module, f"sys.path at line {n}") for n in path_changes(path)]
    assert not found, f"the product reaches for the lab: {sorted(found)}"


def test_string_imports_are_seen(tmp_path: Path) -> None:
    from tests.import_graph import path_changes, string_imports

    path = tmp_path / "m.py"
    path.write_text(
        '"""Docs may name benchmarks.tuner_lab."""\n'
        "import importlib, sys\n"
        'sys.path.append("/checkout")\n'
        'importlib.import_module("benchmarks.tuner_lab.training")\n'
        '__import__("benchmarks")\n'
        'LAZY = {"train": "benchmarks.tuner_lab.training:evaluate"}\n'
    )
    assert string_imports(path) == {"benchmarks.tuner_lab.training", "benchmarks"}
    assert path_changes(path) == [3]
