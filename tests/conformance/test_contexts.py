"""Worker start methods: multiprocessing_context="fork" / "spawn" / "forkserver" (a name
or a context object) gives torch's batches, and so does a script that changed the global
start method (multiprocessing.set_start_method), as some libraries and tests do."""

from __future__ import annotations

import multiprocessing

import pytest

from tests.conformance.conftest import Numbers, batches, reference

METHODS = ["fork", "spawn", "forkserver"]


@pytest.mark.parametrize("as_object", [False, True], ids=["name", "context"])
@pytest.mark.parametrize("method", METHODS)
def test_multiprocessing_context_gives_torch_batches(Loader, method, as_object) -> None:
    context = multiprocessing.get_context(method) if as_object else method
    loader = Loader(Numbers(12), batch_size=3, num_workers=2, multiprocessing_context=context)
    assert batches(loader) == reference(Numbers(12), batch_size=3)


@pytest.mark.parametrize("method", METHODS)
def test_global_start_method_gives_torch_batches(Loader, method) -> None:
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(method, force=True)
    try:
        loader = Loader(Numbers(12), batch_size=3, num_workers=2, persistent_workers=True)
        for _ in range(2):
            assert batches(loader) == reference(Numbers(12), batch_size=3)
        del loader
    finally:
        multiprocessing.set_start_method(previous, force=True)
