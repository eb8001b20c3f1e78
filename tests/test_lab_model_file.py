"""A hostile model file degrades tuning and never the training run (issue 33, item 7).

Every mutation (tree indices out of range or pointing back to form a cycle, numbers
that are not finite, wrong dtypes, flipped bytes, FIFOs, huge files, zip bombs) must
end in one of two outcomes, in bounded time: the model is refused and the queueing
prior plans alone, or the model loads and answers finite numbers. The mutated files
carry a sidecar whose digest matches them (whoever can write the model can write its
sidecar), and claim full trust (`correction_weight` 1), so the trees are used.
"""

from __future__ import annotations

import io
import json
import math
import os
import threading
import warnings
import zipfile

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from benchmarks.tuner_lab.model import Predictor, load_default
from benchmarks.tuner_lab.model_file import sha256
from benchmarks.tuner_lab.synthetic import SimWorkload, make_observations, run_tuner
from benchmarks.tuner_lab.training import TrainablePredictor
from predictors.baselines import QueueingModel
from predictors.tuner import LearnedTuner

# The lab's simulator (benchmarks/tuner_lab); its fits on one OpenMP thread (conftest.py).
pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("one_openmp_thread")]

WORKLOAD = SimWorkload(
    "files",
    "sim",
    bytes_per_sample=8e3,
    decode_ms_per_sample=0.02,
    storage_latency_ms=4.0,
    storage_bandwidth_mbps=800,
    batch_size=64,
    step_ms=20.0,
    rows_per_read=16,
    cpu_count=4,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[dict[str, np.ndarray], dict]:
    """A small fitted model's arrays and sidecar, trusted fully."""
    obs = make_observations(n_workloads=4, workers=(1, 2, 4), depths=(1, 2, 4), n_batches=40)
    path = TrainablePredictor().fit(obs).save(tmp_path_factory.mktemp("model") / "m.npz")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads((path.parent / "m.npz.json").read_text())
    meta["correction_weight"] = 1.0
    return arrays, meta


def _write(path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    with path.open("wb") as handle:
        np.savez(handle, **arrays)
    meta = {**meta, "sha256": sha256(path)}
    path.with_name(path.name + ".json").write_text(json.dumps(meta))


def _bounded(fn, seconds: float = 15.0):
    """fn() on a thread; fails (instead of hanging the suite) if it does not return."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # reported below, on the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds:.0f} s (a hang)"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _load_and_tune(path) -> object:
    """The model `prefetch="auto"` would use, and a short tuned run planned with it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_default(path)
    tuner = LearnedTuner(model, target_utilization=0.9, memory_budget_bytes=2**30)
    trace = run_tuner(tuner, WORKLOAD, 60, seed=1)
    assert trace["utilization"].between(0, 1).all()
    if isinstance(model, Predictor):
        frame = pd.DataFrame({"workers": [1, 4], "depth": [2, 8]})
        for name, value in {
            "bytes_per_sample": 8e3,
            "decode_ms_per_sample": 0.02,
            "storage_latency_ms": 4.0,
            "storage_bandwidth_mbps": 800.0,
            "batch_size": 64,
            "step_ms": 20.0,
            "rows_per_read": 16,
            "cpu_count": 4,
            "shuffle": "none",
            "cache": False,
        }.items():
            frame[name] = value
        predicted = model.predict(frame)
        assert np.isfinite(predicted.to_numpy(dtype=float)).all()
    return model


TREE_FIELDS = ("left", "right", "feature", "roots")
BAD_NUMBERS = (math.nan, math.inf, -math.inf, -1.0, 1e300, "0.5", None, [0.1], True)


@st.composite
def mutations(draw):
    kind = draw(st.sampled_from(["index", "cycle", "number", "dtype", "flip", "drop"]))
    target = draw(st.sampled_from(["throughput", "memory"]))
    return kind, target, draw(st.integers(0, 10**6)), draw(st.sampled_from(BAD_NUMBERS))


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a hang is 15 s a shrink step
)
@given(mutation=mutations())
def test_a_mutated_model_file_is_refused_or_answers_finite_numbers(saved, tmp_path, mutation):
    kind, target, pick, number = mutation
    arrays = {k: v.copy() for k, v in saved[0].items()}
    meta = json.loads(json.dumps(saved[1]))
    left = arrays[f"{target}.left"]
    inner = np.flatnonzero(~arrays[f"{target}.leaf"])
    node = int(inner[pick % len(inner)])
    if kind == "index":
        name = TREE_FIELDS[pick % len(TREE_FIELDS)]
        array = arrays[f"{target}.{name}"]
        where = node if name != "roots" else pick % len(array)
        array[where] = (-1, len(left), 10**9, 2**40)[pick % 4]
    elif kind == "cycle":  # a child that points back at its tree's root or at itself
        root = int(
            arrays[f"{target}.roots"][np.searchsorted(arrays[f"{target}.roots"], node, "right") - 1]
        )
        arrays[f"{target}.{('left', 'right')[pick % 2]}"][node] = (root, node)[pick // 2 % 2]
    elif kind == "number":
        key = ("utilization_error", "correction_weight", "trained_rows", "metrics")[pick % 4]
        if key == "metrics":
            meta["metrics"]["queueing_mdape_throughput"] = number
        else:
            meta[key] = number
    elif kind == "dtype":
        name = ("leaf", "value", "threshold", "feature", "baseline")[pick % 5]
        arrays[f"{target}.{name}"] = arrays[f"{target}.{name}"].astype(str)
    elif kind == "drop":
        del arrays[f"{target}.{('value', 'roots', 'leaf')[pick % 3]}"]
    path = tmp_path / "m.npz"
    _write(path, arrays, meta)
    if kind == "flip":
        data = bytearray(path.read_bytes())
        data[pick % len(data)] ^= 0xFF
        path.write_bytes(bytes(data))
        meta["sha256"] = sha256(path)
        path.with_name("m.npz.json").write_text(json.dumps(meta))
    model = _bounded(lambda: _load_and_tune(path))
    assert isinstance(model, (Predictor, QueueingModel))
    if kind in ("index", "cycle", "dtype", "drop"):
        assert isinstance(model, QueueingModel)


@pytest.mark.parametrize("which", ["model", "sidecar"])
def test_a_fifo_as_model_or_sidecar_falls_back_without_blocking(saved, tmp_path, which):
    path = tmp_path / "m.npz"
    _write(path, *saved)
    fifo = path if which == "model" else path.with_name("m.npz.json")
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.warns(RuntimeWarning, match="not a regular file"):
        assert isinstance(_bounded(lambda: load_default(path), 20), QueueingModel)


def test_a_huge_model_file_is_refused_unread(saved, tmp_path):
    path = tmp_path / "m.npz"
    _write(path, *saved)
    with path.open("r+b") as handle:  # sparse: 4 GiB on paper, nothing on disk
        handle.truncate(4 * 2**30)
    with pytest.warns(RuntimeWarning, match="at most 64 MiB"):
        assert isinstance(_bounded(lambda: load_default(path), 20), QueueingModel)


def _npy_header(shape: tuple[int, ...]) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()  # the magic string and the header


@pytest.mark.parametrize("bomb", ["inflates", "declares"])
def test_a_zip_bomb_is_refused_before_it_inflates(saved, tmp_path, bomb):
    """A small file whose one array inflates past the bound (300 MiB of zeros in
    about 300 KiB), or whose header declares far more than the member holds."""
    path = tmp_path / "m.npz"
    archive = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
    with archive, archive.open("throughput.value.npy", "w", force_zip64=True) as member:
        if bomb == "inflates":
            member.write(_npy_header((300 * 2**17,)))
            zeros = bytes(2**20)
            for _ in range(300):
                member.write(zeros)
        else:
            member.write(_npy_header((2**40,)) + bytes(64))
    assert path.stat().st_size < 2**20
    meta = {**saved[1], "sha256": sha256(path)}
    path.with_name("m.npz.json").write_text(json.dumps(meta))
    with pytest.warns(RuntimeWarning, match="inflates|declares"):
        assert isinstance(_bounded(lambda: load_default(path), 30), QueueingModel)
