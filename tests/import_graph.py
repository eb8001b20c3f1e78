"""The import graph of iolib and predictors, by layer: what docs/architecture.md draws.

The layers are the folders: every top-level package (or module) of `iolib/` is one
layer, named by its folder (`iolib/engine/...` is the layer "engine"), the package's own
`__init__.py` is "iolib" (the public names) and `predictors/` is one more. ORDER only
says which way they may import: down the list, never up. An arrow A --> B means a
module of A imports one of B, at any depth of the file (lazy imports included: they are
dependencies too). `python -m tests.import_graph` prints the Mermaid block;
docs/make_architecture.py writes it and the layers' table into docs/architecture.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("iolib", "predictors")
LAB = "benchmarks"  # research and benchmarks: the packages never import it
LAB_NAME = re.compile(rf"^{LAB}(\.[A-Za-z_][\w.]*)?(:\w+)?$")

# The layers, top to bottom: a module imports its own layer and those below it, never
# one above (so no two layers import each other). A new top-level package of iolib gets
# a place here, and tests/test_architecture_doc.py says so until it has one.
ORDER: tuple[str, ...] = (
    "cli",  # the commands
    "iolib",  # the package's __init__: the public names, loaded lazily
    "loader",  # DataLoader and what it composes: options, feeds, runner, checkpoint
    "tuning",  # the loader's side of predictors
    "engine",  # workers, queues, telemetry
    "fetcher",  # one batch, start to end
    "text",  # token sources, on top of sources' public surface
    "decode",
    "sources",
    "collate",
    "storage",
    "plan",  # pure functions of integers: numpy only
    "predictors",  # numbers in, numbers out: imports nothing of iolib
    "base",
    "errors",
)
# Imported by nearly every layer; drawn once in words rather than as a dozen arrows.
UNDRAWN = ("base", "errors")


def folder_layers() -> dict[str, Path]:
    """The layers the tree holds: each top-level package or module of iolib, by name."""
    found = {"iolib": ROOT / "iolib" / "__init__.py", "predictors": ROOT / "predictors"}
    for path in sorted((ROOT / "iolib").iterdir()):
        if path.name.startswith(("_", ".")):
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            found[path.name] = path
        elif path.suffix == ".py":
            found[path.stem] = path
    return found


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
    """The module's layer: its top-level folder under iolib/ (or "iolib", "predictors")."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        raise KeyError(f"{module}: not a module of {PACKAGES}")
    if parts[0] == "predictors":
        return "predictors"
    return parts[1] if len(parts) > 1 else "iolib"


def order_breaks() -> list[tuple[str, str]]:
    """(importer, imported) module pairs whose layers go up ORDER (or a layer not in it)."""
    rank = {layer: i for i, layer in enumerate(ORDER)}
    out = []
    for a, b in module_edges():
        la, lb = layer_of(a), layer_of(b)
        if la != lb and rank.get(la, -1) >= rank.get(lb, -1):
            out.append((a, b))
    return sorted(out)


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


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imported_names(
    module: str, path: Path, known: dict[str, Path] | None = None
) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import in the file, at any
    depth, and every ``alias._name`` read through a module bound by an import; only the
    packages' modules. The one reader of imports: the layer graph and the architecture
    tests both use it."""
    if path.suffix == ".c":
        return []  # a C extension imports no Python module
    known = modules() if known is None else known
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


_IMPORTERS = ("import_module", "__import__", "find_spec", "run_module", "load_module")


def string_imports(path: Path) -> set[str]:
    """Module names the file reaches by string: the first argument of
    `importlib.import_module`, `__import__`, `find_spec` or `runpy.run_module`, and any
    other string (not a docstring) that is a dotted or `module:attr` name of the lab's
    package (a table of lazy imports). The ast graph above cannot see these."""
    out: set[str] = set()
    if path.suffix == ".c":
        return out
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if name in _IMPORTERS and isinstance(first, ast.Constant):
                out.add(str(first.value))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and LAB_NAME.match(node.value)
        ):
            out.add(node.value.split(":")[0])
    return out


def path_changes(path: Path) -> list[int]:
    """Lines that change `sys.path` (append, insert, extend, assignment): a package that
    does so imports whatever the checkout beside it holds."""
    if path.suffix == ".c":
        return []
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value  # sys.path.append(...)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if (
            isinstance(target, ast.Attribute)
            and target.attr == "path"
            and isinstance(target.value, ast.Name)
            and target.value.id == "sys"
        ):
            lines.append(node.lineno)
    return lines


def module_edges() -> set[tuple[str, str]]:
    """(importer, imported) between modules of the packages (names resolved to modules)."""
    known = modules()
    edges = set()
    for module, path in known.items():
        for name, _ in imported_names(module, path, known):
            while name and name not in known:
                name = name.rsplit(".", 1)[0] if "." in name else ""
            if name and name != module:
                edges.add((module, name))
    return edges


def layer_edges() -> set[tuple[str, str]]:
    return {
        (layer_of(a), layer_of(b))
        for a, b in module_edges()
        if layer_of(a) != layer_of(b) and not {layer_of(a), layer_of(b)} & set(UNDRAWN)
    }


def mermaid() -> str:
    lines = ["```mermaid", "flowchart TD"]
    lines += [f"    {a} --> {b}" for a, b in sorted(layer_edges())]
    lines.append("```")
    return "\n".join(lines)


if __name__ == "__main__":
    print(mermaid())
