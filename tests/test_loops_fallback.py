"""The NumPy statement of the token loops (iolib/text/loops_numpy.py), the fallback where
the compiled extension is absent: the same results and errors as the compiled loops, and
whole epochs of packed windows bit for bit the same under IOLIB_NO_EXTENSION=1 (run in a
subprocess, so the choice is made there as an install without a compiler makes it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iolib.text import kernels, loops_numpy
from tests.test_text_loops import EOS, IGNORE, _args, _reference, segments
from tests.token_data import doc_lengths, write_documents

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@settings(max_examples=300, deadline=None)
@given(segments(), st.booleans())
def test_numpy_cut_pieces_matches_the_reference(segment, want_docs) -> None:
    tokens, sources, starts, doc_rows, pieces, rows, length = segment
    want = _reference(tokens, sources, starts, doc_rows, pieces, rows, length, want_docs)
    got = np.full_like(want, 7)
    loops_numpy.cut_pieces(tokens, sources, starts, doc_rows, pieces, EOS, IGNORE, got, rows,
                           length, want_docs)  # fmt: skip
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"pieces": np.array([[0, 0, 6, 11]], dtype=np.int64)}, IndexError),
        ({"sources": np.array([5, 4], dtype=np.int64)}, IndexError),
        ({"sources": np.array([6, 0], dtype=np.int64)}, IndexError),
        ({"sources": np.array([-1, 0], dtype=np.int64)}, IndexError),
        ({"sources": np.array([5], dtype=np.int64)}, IndexError),
        ({"tokens": (np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int64))}, TypeError),
        ({"tokens": (np.arange(6, dtype=np.int32), np.arange(2, dtype=np.int32))}, IndexError),
        ({"pieces": np.array([[1, 0, 0, 5]], dtype=np.int64)}, IndexError),
        ({"pieces": np.array([[0, 5, 0, 5]], dtype=np.int64)}, IndexError),
        ({"pieces": np.array([[0, 0, 5, 4]], dtype=np.int64)}, IndexError),
        ({"doc_rows": np.array([5], dtype=np.int64)}, IndexError),
        ({"out": np.zeros((3, 1, 3), dtype=np.int64)}, ValueError),
        ({"want_docs": True}, ValueError),
        ({"starts": np.array([0, 4, 10], dtype=np.int32)}, TypeError),
        ({"starts": np.array([0, 6, 4], dtype=np.int64)}, ValueError),
        ({"tokens": np.zeros(10, dtype=np.float64)}, TypeError),
        ({"tokens": np.zeros(10, dtype=">i4")}, TypeError),
        ({"tokens": np.zeros(10, dtype=object)}, TypeError),
        ({"out": np.zeros((3, 1, 4), dtype=np.int64)[:, :, ::2]}, ValueError),
    ],
)
def test_numpy_cut_pieces_refuses_what_the_compiled_one_refuses(changes, error) -> None:
    with pytest.raises(error):
        loops_numpy.cut_pieces(*_args(**changes))


EPOCHS = textwrap.dedent(
    """
    import json, sys
    from iolib import DataLoader
    from iolib.text import PackedTokens, kernels
    from tests.test_golden_batches import digest
    url, out = {}, {"kind": kernels.KIND}
    for name, kw in json.loads(sys.argv[2]).items():
        source = PackedTokens(sys.argv[1], column="tokens", **kw["source"])
        loader = DataLoader(source, **kw["loader"])
        batches = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches += list(loader)
        out[name] = digest(batches)
    print(json.dumps(out))
    """
)
CASES = {
    "streamed": {
        "source": {"seq_len": 24, "eos_id": 0, "document_ids": True, "shuffle_window": 7000,
                   "cache_bytes": 14000},
        "loader": {"batch_size": 4, "shuffle": True, "seed": 9},
    },
    "whole_lanes": {
        "source": {"seq_len": 16, "eos_id": 0, "ignore_index": -1, "lanes": 2},
        "loader": {"batch_size": 3, "shuffle": True, "seed": 2, "num_workers": 2},
    },
    "sequential": {
        "source": {"seq_len": 40, "eos_id": 7, "shuffle_documents": False},
        "loader": {"batch_size": 5, "shuffle": False, "seed": 1},
    },
}  # fmt: skip


def _epochs(url: str, cache: str, switch: str | None) -> dict[str, str]:
    env = {**os.environ, "IOLIB_CACHE_DIR": cache, "PYTHONPATH": ROOT}
    env.pop(kernels.ENV_SWITCH, None)
    if switch is not None:
        env[kernels.ENV_SWITCH] = switch
    run = subprocess.run([sys.executable, "-c", EPOCHS, url, json.dumps(CASES)], env=env,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_packed_epochs_are_the_same_with_and_without_the_extension(tmp_path) -> None:
    """Pack (row groups into segments) and cut (batches) through the whole loader, in
    three configurations, with the compiled loops and under IOLIB_NO_EXTENSION=1."""
    url = write_documents(tmp_path / "docs", doc_lengths(150, seed=4, high=70), shards=3)
    compiled = _epochs(url, str(tmp_path / "cache"), None)
    fallback = _epochs(url, str(tmp_path / "cache"), "1")
    assert compiled.pop("kind") == "compiled" and fallback.pop("kind") == "numpy"
    assert compiled == fallback
    assert len(set(compiled.values())) == len(CASES)


def test_the_fallback_is_chosen_when_the_extension_cannot_be_imported(tmp_path) -> None:
    """An install without the compiled module: the NumPy loops, said once as a warning."""
    script = textwrap.dedent(
        """
        import builtins, logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                            format="%(levelname)s %(message)s")
        real = builtins.__import__
        def without(name, globals=None, locals=None, fromlist=(), level=0):
            if name == "iolib.text.loops" or (name == "iolib.text" and "loops" in (fromlist or ())):
                raise ImportError("no compiled loops in this install")
            return real(name, globals, locals, fromlist, level)
        builtins.__import__ = without
        from iolib.text import kernels, PackedTokens
        print("KIND", kernels.KIND, kernels.loops.__name__)
        """
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop(kernels.ENV_SWITCH, None)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120, cwd=ROOT)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "KIND numpy iolib.text.loops_numpy" in run.stdout
    warnings = [line for line in run.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "not installed" in warnings[0]


def test_this_process_uses_the_compiled_loops_unless_told() -> None:
    told = os.environ.get(kernels.ENV_SWITCH, "").strip() not in ("", "0")
    assert (kernels.KIND, kernels.loops.__name__) == (
        ("numpy", "iolib.text.loops_numpy") if told else ("compiled", "iolib.text.loops")
    )


def test_a_failed_compile_does_not_fail_the_build(tmp_path) -> None:
    """setup.py's extension is optional: with no working C compiler the build goes on
    without it (and the loader then runs the NumPy loops)."""
    env = {**os.environ, "CC": "/bin/false"}
    build = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
             "--build-temp", str(tmp_path / "tmp")]  # fmt: skip
    run = subprocess.run(build, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "failed" in run.stderr + run.stdout
    assert not list((tmp_path / "lib").rglob("loops*.so"))
