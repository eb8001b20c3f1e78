"""Write docs/reference.md, the API reference, from the code: signatures and docstrings
of every public class and function, the `stats()` keys and `state_dict()` fields (with
their units), and the commands' options.

    python docs/make_reference.py          # rewrite docs/reference.md
    python docs/make_reference.py --check  # exit 1 if the page differs from the code

tests/test_docs_reference.py runs the check, and checks the two tables below against
what a running loader returns, so the page cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent / "reference.md"

# (module, names): the public API, in the order a user meets it.
API: list[tuple[str, list[str]]] = [
    ("iolib", ["DataLoader", "sample_rng"]),
    (
        "iolib.sources",
        ["ParquetSource", "ImageFolderSource", "TorchDatasetSource", "as_source", "Source"],
    ),
    ("iolib.decode.images", ["ImagePipeline"]),
    ("iolib.text", ["PackedTokens", "TokenBudgetBatches", "cu_seqlens"]),
    ("iolib.collate", ["ListFormat"]),
    ("iolib.storage", ["RetryPolicy"]),
    ("iolib.decode", ["Decoder", "FunctionDecoder"]),
    (
        "iolib.errors",
        [
            "IolibError",
            "ConfigError",
            "DataError",
            "StorageError",
            "StateError",
            "WorkerError",
            "WorkerDied",
            "OnError",
        ],
    ),
]

# DataLoader.stats(): key -> (unit, meaning). The windowed figures are medians over the
# last 64 batches (`Telemetry.window`); totals count since the loader was built.
STATS: dict[str, tuple[str, str]] = {
    "batches": ("count", "batches handed to the training loop (total)"),
    "samples": ("count", "samples in those batches (total)"),
    "samples_per_s": ("samples/s", "throughput over the last 64 batches (wait + step time)"),
    "stall_fraction": ("0-1", "share of the last 64 batches' time the loop waited for data"),
    "utilization": ("0-1", "1 - stall_fraction: the share spent computing"),
    "wait_ms": ("ms", "median wait for a batch in `next()`, last 64 batches"),
    "step_ms": (
        "ms",
        "median time the loop spent on a batch (between hand-over and the "
        "next request), last 64 batches",
    ),
    "stage_ms": (
        "ms per batch",
        "median wall time of each stage (read, decode, transform, "
        "collate...), by stage name, last 64 batches",
    ),
    "stage_cpu_ms": (
        "ms per batch",
        "median CPU time of each stage, by stage name (inline without a tuner: measured "
        "on one batch in 8)",
    ),
    "batch_bytes": ("bytes", "median size of a batch (tensors and buffers)"),
    "bytes_read": ("bytes", "bytes read from storage (total)"),
    "retries": ("count", "storage requests retried (total)"),
    "skipped": ("count", "samples left out under on_error='skip' (total)"),
    "refilled": ("count", "samples read from the reserve for batches that lost every sample"),
    "peak_bytes_in_flight": ("bytes", "most bytes held in batches in flight at once"),
    "first_batch_s": ("s", "from iter() to the first batch (None before one)"),
    "workers": ("count", "workers now"),
    "depth": ("batches", "batches in flight or ready (the prefetch depth) now"),
    "worker_mode": (
        "text",
        "'thread', 'process', 'inline' (num_workers=0) or 'torch' (an IterableDataset)",
    ),
    "batches_ready": ("batches", "batches finished and waiting for the loop now"),
    "bytes_in_flight": ("bytes", "bytes held in batches in flight now"),
    "worker_pids": ("list", "OS process ids of live process workers"),
    "worker_threads": ("list", "native thread ids of live thread workers"),
    "epoch": ("count", "the cursor's epoch"),
    "position": ("samples", "the cursor: global samples of the epoch consumed"),
    "cache_budget_bytes": ("bytes", "the row-group (or segment) cache's bound"),
    "cache_held_bytes": ("bytes", "decoded bytes the cache holds now"),
    "cache_hits": ("count", "row-group reads served from the cache (this process)"),
    "cache_evictions": ("count", "row groups dropped from the cache"),
    "cache_declined": ("count", "row groups not kept (needed later than all the cache held)"),
    "row_group_reads": ("count", "row groups read from storage (this process)"),
    "row_group_rereads": ("count", "of those, row groups read again in the same epoch"),
    "bytes_after_close": (
        "bytes",
        "read-ahead bytes that arrived after a loader over this source was closed, dropped "
        "or left (requests already on the wire; this process)",
    ),
    "decode_backend": (
        "text",
        "the decoder that runs: 'dali', 'pil' or 'nvjpeg' (with "
        "decode=ImagePipeline(...); its resolved_backend())",
    ),
    "tuner": (
        "dict",
        "with prefetch='auto' or a tuner: its decisions and reasons (docs/tuning.md)",
    ),
}
# Keys only some loaders report, and which.
STATS_WHEN = {
    "cache_hits": "ParquetSource, PackedTokens",
    "cache_evictions": "ParquetSource, PackedTokens",
    "cache_declined": "ParquetSource, PackedTokens",
    "row_group_reads": "ParquetSource, PackedTokens",
    "row_group_rereads": "ParquetSource, PackedTokens",
    "cache_budget_bytes": "ParquetSource, PackedTokens",
    "cache_held_bytes": "ParquetSource, PackedTokens",
    "bytes_after_close": "ParquetSource, PackedTokens",
    "batches_ready": "not an IterableDataset",
    "bytes_in_flight": "not an IterableDataset",
    "worker_pids": "not an IterableDataset",
    "worker_threads": "not an IterableDataset",
    "depth": "not an IterableDataset",
    "decode_backend": "decode=ImagePipeline(...)",
    "tuner": "prefetch='auto' or a tuner",
}

# DataLoader.state_dict(): field -> meaning. All JSON-able.
STATE: dict[str, str] = {
    "epoch": "the epoch the cursor is in",
    "position": "global samples of that epoch consumed (all ranks together)",
    "seed": "the shuffle seed (a resume with torch's seed adopts it)",
    "batch_size": "per rank; must match to resume",
    "drop_last": "must match to resume",
    "shuffle": "'none', 'global' or 'block'; must match to resume",
    "shuffle_window": "row groups per block-shuffle window; must match to resume",
    "dataset": "a short hash of what defines the order (files, row counts); must match",
    "num_samples": "samples in the dataset; must match",
    "world_size": "ranks when saved (a resume at another world size is allowed)",
    "dataset_fields": "what the hash covers, readable, to name a difference",
    "version": "the state format's version",
}


def _first_paragraphs(doc: str | None) -> str:
    return inspect.cleandoc(doc or "").strip()


def _signature(name: str, obj: Any) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params = []
    for p in signature.parameters.values():
        if p.name == "self":
            continue
        text = str(p.replace(annotation=inspect.Parameter.empty))
        params.append(text)
    marked, seen_star = [], False
    for p, text in zip(signature.parameters.values(), params, strict=False):
        if p.kind is p.KEYWORD_ONLY and not seen_star:
            marked.append("*")
            seen_star = True
        if p.kind is p.VAR_POSITIONAL:
            seen_star = True
        marked.append(text)
    one_line = f"{name}({', '.join(marked)})"
    if len(one_line) <= 88:
        return one_line
    return f"{name}(\n" + "".join(f"    {m},\n" for m in marked) + ")"


def _clean(text: str) -> str:
    """No memory addresses in the page (they change every run)."""
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties defined by the class itself, in source order."""
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_") or name in ("columnar",):
            continue
        if isinstance(value, (property, staticmethod, classmethod)) or inspect.isfunction(value):
            found.append((name, value))
    return found


def _class_section(module: str, name: str, cls: type) -> list[str]:
    out = [f"### `{module}.{name}`", ""]
    if issubclass(cls, enum.Enum):
        values = ", ".join(f"`{m.value!r}`" for m in cls)
        out += [_first_paragraphs(cls.__doc__), "", f"Values: {values}.", ""]
        return out
    if issubclass(cls, BaseException):
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        out += [f"An exception ({bases}).", "", _first_paragraphs(cls.__doc__), ""]
        return out
    out += ["```text", _clean(_signature(name, cls)), "```", ""]
    out += [_first_paragraphs(cls.__doc__), ""]
    if dataclasses.is_dataclass(cls) and name not in ("ImagePipeline",):
        fields = [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
        if fields:
            out.append("Fields: " + ", ".join(f"`{f.name}`" for f in fields) + ".")
            out.append("")
    members = _members(cls)
    if members:
        out += ["| member | what it does |", "| --- | --- |"]
        for member, value in members:
            if isinstance(value, property):
                shown, doc = f"`{member}` (property)", value.fget.__doc__
            else:
                function = (
                    value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
                )
                shown, doc = f"`{_clean(_signature(member, function))}`", function.__doc__
            summary = " ".join(_first_paragraphs(doc).split("\n\n")[0].split())
            out.append(f"| {shown.replace(chr(10), ' ').replace('    ', '')} | "
                       f"{summary.replace('|', '/')} |")  # fmt: skip
        out.append("")
    return out


def _function_section(module: str, name: str, function: Any) -> list[str]:
    return [
        f"### `{module}.{name}`",
        "",
        "```text",
        _clean(_signature(name, function)),
        "```",
        "",
        _first_paragraphs(function.__doc__),
        "",
    ]


def _commands() -> list[str]:
    import click

    from iolib.cli import cli

    out = [
        "## Command line",
        "",
        "`iolib COMMAND --help` prints the same. Every command takes `-o KEY=VALUE` "
        "storage options.",
        "",
    ]
    context = click.Context(cli)
    for name in cli.list_commands(context):
        command = cli.get_command(context, name)
        if command is None:
            continue
        out += [f"### `iolib {name}`", "", _first_paragraphs(command.help), ""]
        out += ["| option | default | what it does |", "| --- | --- | --- |"]
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            flags = ", ".join(f"`{o}`" for o in param.opts)
            default = param.default
            unset = default is None or default is False or default == () or param.is_flag
            default = "" if unset or "Sentinel" in repr(default) else default
            text = " ".join((param.help or "").split()).replace("|", "/")
            out.append(f"| {flags} | {default} | {text} |")
        out.append("")
    return out


def _anchor(module: str, name: str) -> str:
    return (module + name).replace(".", "").lower()


def render() -> str:
    import iolib

    out = [
        "# API reference",
        "",
        f"iolib {iolib.__version__}. Generated from the code by `python docs/make_reference.py`",
        "(tests/test_docs_reference.py fails when this page and the code differ). The guides",
        "explain; this page lists. Every public class and function, with its arguments:",
        "",
    ]
    for module, names in API:
        links = [f"[`{n}`](#{_anchor(module, n)})" for n in names]
        out.append(f"- `{module}`: " + ", ".join(links))
    out += [
        "- [`DataLoader.stats()` keys](#dataloaderstats-keys)",
        "- [`DataLoader.state_dict()` fields](#dataloaderstate_dict-fields)",
        "- [Command line](#command-line)",
        "",
    ]
    for module, names in API:
        out += [f"## `{module}`", ""]
        mod = importlib.import_module(module)
        for name in names:
            obj = getattr(mod, name)
            out += [f'<a id="{_anchor(module, name)}"></a>', ""]
            if inspect.isclass(obj):
                out += _class_section(module, name, obj)
            else:
                out += _function_section(module, name, obj)
    out += [
        "## `DataLoader.stats()` keys",
        "",
        "Windowed figures are over the last 64 batches; totals count since the loader was built.",
        "",
        "| key | unit | meaning | reported by |",
        "| --- | --- | --- | --- |",
    ]
    for key, (unit, meaning) in STATS.items():
        out.append(f"| `{key}` | {unit} | {meaning} | {STATS_WHEN.get(key, 'every loader')} |")
    out += [
        "",
        "## `DataLoader.state_dict()` fields",
        "",
        "A small JSON-able dict: save it with the model, restore it with "
        "`load_state_dict` in any process, worker count or world size.",
        "",
        "| field | meaning |",
        "| --- | --- |",
    ]
    for key, meaning in STATE.items():
        out.append(f"| `{key}` | {meaning} |")
    out.append("")
    out += _commands()
    return "\n".join(line.rstrip() for line in out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if PAGE.read_text() != text:
            print(f"{PAGE} differs from the code: run python docs/make_reference.py")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
