"""The import graph of iolib and predictors, by layer: what docs/architecture.md draws.

Every module belongs to one layer (LAYERS, by module-name prefix; the longest prefix
wins). An arrow A --> B means a module of A imports one of B, at any depth of the file
(lazy imports included: they are dependencies too). `python -m tests.import_graph`
prints the Mermaid block the guide holds; tests/test_architecture_doc.py checks the two
agree and that the layers form no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("iolib", "predictors")

# Layer of each module, by the longest matching prefix of its dotted name.
LAYERS: dict[str, str] = {
    "iolib.cli": "cli",
    "iolib._cli_common": "cli",
    "iolib.bench": "cli",
    "iolib.convert": "cli",
    "iolib.inspect_data": "cli",
    "iolib.index_command": "cli",
    "iolib.tune_command": "cli",
    "iolib.tune_probe": "cli",
    "iolib.loader": "loader",
    "iolib.options": "loader",
    "iolib.checkpoint": "loader",
    "iolib.feeds": "loader",
    "iolib.runner": "loader",
    "iolib.stream_feed": "loader",
    "iolib.resources": "base",
    "iolib.shutdown": "base",
    "iolib.sampling": "loader",
    "iolib.stages": "loader",
    "iolib.testing": "loader",
    "iolib.distributed": "loader",
    "iolib.autotune": "tuning",
    "iolib.run_history": "tuning",
    "iolib.history_command": "cli",
    "iolib.engine": "engine",
    "iolib.workers": "engine",
    "iolib.pool": "engine",
    "iolib.telemetry": "engine",
    "iolib.fetcher": "fetcher",
    "iolib.collate": "collate",
    "iolib.images": "decode",
    "iolib.decode": "decode",
    "iolib.text": "text",
    "iolib.sources": "sources",
    "iolib.storage": "storage",
    "iolib.plan": "plan",
    "iolib.permute": "plan",
    "iolib.rng": "plan",
    "iolib.errors": "base",
    "iolib.forks": "base",
    "iolib.redact": "base",
    "iolib": "loader",  # the package's __init__: the public names
    "predictors": "predictors",
}
# Imported by nearly every layer; drawn once in words rather than as a dozen arrows.
UNDRAWN = ("base",)


def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a C extension by its source)."""
    found = {}
    for package in PACKAGES:
        for path in sorted([*(ROOT / package).rglob("*.py"), *(ROOT / package).rglob("*.c")]):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def layer_of(module: str) -> str:
    """The module's layer; KeyError for a module no prefix places (place it in LAYERS).
    The bare package names match only their own __init__."""
    matches = [p for p in LAYERS if module == p or ("." in p and module.startswith(p + "."))]
    if not matches and module.startswith("predictors."):
        matches = ["predictors"]
    if not matches:
        raise KeyError(f"{module}: no layer in tests/import_graph.py LAYERS")
    return LAYERS[max(matches, key=len)]


def cycle(edges: set[tuple[str, str]]) -> list[str]:
    """One cycle of the graph as a path of nodes, or [] if it has none."""
    after: dict[str, list[str]] = {}
    for a, b in edges:
        after.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(after.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, node])):
                return found
        state[node] = 2
        return []

    for start in sorted(after):
        if start not in state and (found := visit(start, [])):
            return found
    return []


def imports(path: Path, module: str) -> set[str]:
    """Dotted names of the packages' modules that `path` imports."""
    out = set()
    if path.suffix == ".c":
        return out  # a C extension imports no Python module
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in out if name.split(".")[0] in PACKAGES}


def module_edges() -> set[tuple[str, str]]:
    """(importer, imported) between modules of the packages (names resolved to modules)."""
    known = modules()
    edges = set()
    for module, path in known.items():
        for name in imports(path, module):
            while name and name not in known:
                name = name.rsplit(".", 1)[0] if "." in name else ""
            if name and name != module:
                edges.add((module, name))
    return edges


def layer_edges() -> set[tuple[str, str]]:
    return {
        (layer_of(a), layer_of(b))
        for a, b in module_edges()
        if layer_of(a) != layer_of(b) and UNDRAWN[0] not in (layer_of(a), layer_of(b))
    }


def mermaid() -> str:
    lines = ["```mermaid", "flowchart TD"]
    lines += [f"    {a} --> {b}" for a, b in sorted(layer_edges())]
    lines.append("```")
    return "\n".join(lines)


if __name__ == "__main__":
    print(mermaid())
