"""The shape of the code: iolib's and predictors' modules import one another without a
cycle, and no module reaches for another's private (underscore) names.

Why a test: a cycle hidden by a lazy or a type-only import still couples two modules
(neither can change alone), and a private name used elsewhere is an API nobody
promised. Every import counts here, at any depth of a file: top level, inside a
function, under ``if TYPE_CHECKING``. The graph is read from the source with ``ast``;
nothing is imported.
"""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import (
    LAB,
    cycle,
    imported_names,
    module_edges,
    modules,
    path_changes,
    string_imports,
)

# Private names still imported across modules, as (importer, module, name): none. A name
# another module needs gets a public home instead of an entry here.
PRIVATE_IMPORTS_ALLOWED: set[tuple[str, str, str]] = set()


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in modules()}
    for a, b in module_edges():
        graph[a].add(b)
    return graph


def test_graph_sees_every_kind_of_import() -> None:
    graph = _graph()
    assert (
        "iolib.decode.geometry" in graph["iolib.decode.images"]
    )  # from iolib.decode import geometry
    assert "iolib.decode" in graph["iolib.decode.images"]  # from iolib.decode import OutputSpec
    assert "predictors" not in {m.split(".")[0] for m in graph["iolib.errors"]}


def test_private_names_are_seen_through_a_module_alias(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "import iolib.storage.wrapper as w\nfrom iolib.plan import rng\nw._unit\nrng._x\n"
    )
    found = imported_names("iolib.m", path)
    assert ("iolib.storage.wrapper", "_unit") in found and ("iolib.plan.rng", "_x") in found


def test_no_import_cycle() -> None:
    found = cycle(module_edges())
    assert not found, f"modules that import each other around a loop: {' -> '.join(found)}"


def test_predictors_never_import_iolib() -> None:
    graph = _graph()
    reach = sorted(
        (m, t) for m, targets in graph.items() if m.startswith("predictors") for t in targets
    )
    assert [(m, t) for m, t in reach if t.startswith("iolib")] == []


def test_no_module_imports_anothers_private_names() -> None:
    known = modules()
    found = set()
    for module, path in known.items():
        for target, name in imported_names(module, path, known):
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
    known = modules()
    found = []
    for module, path in known.items():
        found += [
            (module, t) for t, _ in imported_names(module, path, known) if t.split(".")[0] == LAB
        ]
        found += [(module, t) for t in string_imports(path) if t.split(".")[0] == LAB]
        found += [(module, f"sys.path at line {n}") for n in path_changes(path)]
    assert not found, f"the product reaches for the lab: {sorted(found)}"


def test_string_imports_are_seen(tmp_path: Path) -> None:
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


def test_text_reaches_sources_only_through_the_package() -> None:
    """Modules of `iolib.text` import `iolib.sources` (its `__init__.py`), never a module
    inside it: the sources may rearrange their files without breaking the token layer."""
    known = modules()
    found = sorted(
        (module, target)
        for module, path in known.items()
        if module.split(".")[:2] == ["iolib", "text"]
        for target, _ in imported_names(module, path, known)
        if target.startswith("iolib.sources.")
    )
    assert not found, f"text/ imports inside sources/ (import from iolib.sources): {found}"
