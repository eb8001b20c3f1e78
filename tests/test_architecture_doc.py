"""docs/architecture.md draws the real import graph, and the layers form no cycle."""

from __future__ import annotations

import itertools

from tests.import_graph import ROOT, cycle, layer_edges, layer_of, mermaid, module_edges, modules


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for module in modules():
        try:
            layer_of(module)
        except KeyError:
            unplaced.append(module)
    assert not unplaced, f"add these to LAYERS in tests/import_graph.py: {unplaced}"


def test_layers_form_no_cycle() -> None:
    found = cycle(layer_edges())
    assert not found, f"layer cycle: {' -> '.join(found)}; the module imports behind it: " + str(
        sorted(
            (a, b)
            for a, b in module_edges()
            if (layer_of(a), layer_of(b)) in set(itertools.pairwise(found))
        )
    )


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycle({("a", "b"), ("b", "c"), ("c", "a")})
    assert not cycle({("a", "b"), ("b", "c"), ("a", "c")})


def test_the_guide_draws_the_graph_as_it_is() -> None:
    guide = (ROOT / "docs" / "architecture.md").read_text()
    assert mermaid() in guide, (
        "docs/architecture.md's diagram is out of date: paste the output of "
        "`python -m tests.import_graph`"
    )
