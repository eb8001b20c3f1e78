"""Modules moved into their layer's package keep their 0.1 import path: a user's script
that imports an old path gets the very module at the new one (`_MOVED`)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import iolib

OLD_TO_NEW = sorted(iolib._MOVED.items())


@pytest.mark.parametrize(("old", "new"), OLD_TO_NEW)
def test_an_old_path_imports_the_moved_module(old: str, new: str) -> None:
    moved = importlib.import_module(new)
    assert importlib.import_module(old) is moved
    assert moved.__spec__.name == new  # the module's own identity is untouched


def test_a_script_written_for_the_old_layout_runs() -> None:
    script = (
        "from iolib.images import ImagePipeline\n"  # old path
        "from iolib.rng import sample_rng\n"  # old path
        "from iolib.distributed import pipeline_rank\n"  # old path
        "from iolib.stages import StageFeed\n"  # old path
        "import iolib.autotune\n"  # old path
        "from iolib.loader.stages import StageLoader\n"
        "from iolib.decode.images import ImagePipeline as New\n"
        "assert ImagePipeline is New and StageFeed is StageLoader\n"  # old path
        "assert sample_rng(1, 2, 3).integers(1 << 30) == "
        "__import__('iolib').sample_rng(1, 2, 3).integers(1 << 30)\n"
        "print('ok', iolib.autotune.__name__)\n"  # old path
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "iolib.tuning.autotune"]


def test_an_unknown_old_name_still_fails() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("iolib.no_such_module")


def test_two_old_paths_imported_at_once_keep_their_own_specs() -> None:
    """Two threads importing two old paths interleave the finder's calls (each old
    path's import lock serializes only its own): each module gets its own spec back."""
    finder = next(f for f in sys.meta_path if isinstance(f, iolib._OldPaths))
    olds = ["iolib.rng", "iolib.autotune"]  # old paths
    aliases = [finder.find_spec(old) for old in olds]
    modules = [finder.create_module(alias) for alias in aliases]
    own = [module.__spec__ for module in modules]
    try:
        for alias, module in zip(aliases, modules, strict=True):
            module.__spec__ = alias  # as the import system does before exec_module
        for module in modules:
            finder.exec_module(module)
        assert [m.__spec__.name for m in modules] == [iolib._MOVED[old] for old in olds]
    finally:
        for module, spec in zip(modules, own, strict=True):
            module.__spec__ = spec
