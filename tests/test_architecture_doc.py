"""The layers are the folders, imports go down them, and docs/architecture.md draws the
tree as it is (docs/make_architecture.py writes that part from the folders)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.import_graph import (
    ORDER,
    ROOT,
    cycle,
    folder_layers,
    layer_edges,
    layer_of,
    modules,
    order_breaks,
)


def test_every_layer_in_the_tree_has_a_place_in_the_order() -> None:
    found = set(folder_layers())
    assert not found - set(ORDER), (
        f"new top-level packages of iolib: {sorted(found - set(ORDER))}; place them in ORDER "
        "(tests/import_graph.py), or move the modules into a layer's package"
    )
    assert not set(ORDER) - found, f"gone from the tree: {sorted(set(ORDER) - found)}"
    assert {layer_of(m) for m in modules()} <= set(ORDER)


def test_modules_import_only_down_the_layers() -> None:
    """The dependency direction: cli -> loader -> engine/fetcher -> sources -> storage,
    tuning -> predictors, plan below all but base; an import up the order is a break."""
    breaks = order_breaks()
    assert not breaks, "imports that go up the layers' order (ORDER, tests/import_graph.py): " + (
        ", ".join(f"{a} ({layer_of(a)}) -> {b} ({layer_of(b)})" for a, b in breaks)
    )
    assert not cycle(layer_edges())


def test_the_order_check_sees_an_import_up(monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.import_graph as graph

    monkeypatch.setattr(graph, "module_edges", lambda: {("iolib.plan", "iolib.loader")})
    assert graph.order_breaks() == [("iolib.plan", "iolib.loader")]
    monkeypatch.setattr(graph, "module_edges", lambda: {("iolib.loader", "iolib.plan")})
    assert graph.order_breaks() == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycle({("a", "b"), ("b", "c"), ("c", "a")})
    assert not cycle({("a", "b"), ("b", "c"), ("a", "c")})


def test_the_guide_draws_the_tree_as_it_is() -> None:
    spec = importlib.util.spec_from_file_location(
        "make_architecture", ROOT / "docs" / "make_architecture.py"
    )
    assert spec and spec.loader
    make = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_architecture", make)
    spec.loader.exec_module(make)
    assert make.main(["--check"]) == 0, (
        "docs/architecture.md's layers are out of date: run python docs/make_architecture.py"
    )
