"""Models, grouped cross-validation, save/load and fallback, on SYNTHETIC observations.

The observations come from `benchmarks.tuner_lab.synthetic` (a simulated loader), never from
the shipped training data; fitting is the lab's (`benchmarks.tuner_lab.training`).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from benchmarks.tuner_lab.features import SCHEMA_VERSION, group_labels
from benchmarks.tuner_lab.model import MODEL_ENV, Predictor, load, load_default
from benchmarks.tuner_lab.model_file import SHIPPED_SHA256, sha256
from benchmarks.tuner_lab.synthetic import make_observations
from benchmarks.tuner_lab.training import TrainablePredictor, evaluate, train_default
from predictors.baselines import ConstantModel, QueueingModel
from predictors.errors import ModelVersionError, SchemaError

# Trains models: the lab's simulator and scikit-learn (one OpenMP thread: conftest.py).
pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("one_openmp_thread")]


@pytest.fixture(scope="module")
def synthetic() -> pd.DataFrame:
    return make_observations(n_workloads=8, workers=(1, 2, 4, 8), depths=(1, 2, 4, 8), n_batches=60)


@pytest.fixture(scope="module")
def fitted(synthetic) -> Predictor:
    return TrainablePredictor().fit(synthetic)


def test_predict_shapes_and_ranges(fitted, synthetic):
    pred = fitted.predict(synthetic)
    assert list(pred.columns) == ["throughput_sps", "stall_fraction", "utilization", "memory_bytes"]
    assert (pred["throughput_sps"] > 0).all() and (pred["memory_bytes"] > 0).all()
    assert pred["stall_fraction"].between(0, 1).all()
    np.testing.assert_allclose(pred["utilization"], 1 - pred["stall_fraction"])


def test_grouped_cv_scores_every_unseen_group(synthetic):
    ev = evaluate(
        synthetic,
        {"learned": TrainablePredictor, "queueing": QueueingModel, "constant": ConstantModel},
        n_splits=4,
    )
    groups = set(group_labels(synthetic))
    for name in ("learned", "queueing", "constant"):
        assert set(ev.per_group.loc[ev.per_group["model"] == name, "group"]) == groups
    s = ev.summary
    # The learned model must beat the constant by a wide margin on unseen groups.
    assert s.loc["learned", "mdape_throughput"] < 0.5 * s.loc["constant", "mdape_throughput"]
    assert s.loc["learned", "r2_throughput"] > s.loc["constant", "r2_throughput"] + 0.5
    assert s.loc["learned", "mae_stall"] < s.loc["constant", "mae_stall"]


def test_grouped_cv_never_trains_on_the_scored_group(synthetic, monkeypatch):
    seen: list[set[str]] = []
    original = TrainablePredictor.fit

    def spy(self, frame):
        seen.append(set(group_labels(frame)))
        return original(self, frame)

    monkeypatch.setattr(TrainablePredictor, "fit", spy)
    ev = evaluate(synthetic, {"learned": TrainablePredictor}, n_splits=None)  # leave one group out
    groups = set(group_labels(synthetic))
    assert len(seen) == len(groups)
    assert all(len(groups - trained) == 1 for trained in seen)
    assert len(ev.per_group) == len(groups)


def test_single_group_cannot_be_cross_validated(synthetic):
    one = synthetic[group_labels(synthetic) == group_labels(synthetic)[0]]
    with pytest.raises(SchemaError, match="at least 2"):
        evaluate(one)


def test_save_load_round_trip(fitted, synthetic, tmp_path):
    path = fitted.save(tmp_path / "m.npz")
    meta = json.loads((tmp_path / "m.npz.json").read_text())
    assert meta["schema_version"] == SCHEMA_VERSION
    again = load(path)
    pd.testing.assert_frame_equal(again.predict(synthetic), fitted.predict(synthetic))


def test_other_schema_version_is_a_clear_error(fitted, tmp_path):
    path = fitted.save(tmp_path / "m.npz")
    sidecar = tmp_path / "m.npz.json"
    meta = json.loads(sidecar.read_text())
    meta["schema_version"] = SCHEMA_VERSION + 1
    sidecar.write_text(json.dumps(meta))
    with pytest.raises(ModelVersionError, match=r"schema version .*retrain"):
        load(path)


def test_missing_or_corrupt_default_falls_back_with_a_warning(fitted, tmp_path):
    with pytest.warns(RuntimeWarning, match="queueing model"):
        assert isinstance(load_default(tmp_path / "absent.npz"), QueueingModel)
    path = fitted.save(tmp_path / "m.npz")
    path.write_bytes(b"not a model file")
    with pytest.warns(RuntimeWarning, match="queueing model"):
        assert isinstance(load_default(path), QueueingModel)


def test_a_good_default_loads_without_warning(fitted, tmp_path):
    path = fitted.save(tmp_path / "m.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(load_default(path), Predictor)


def test_train_default_from_files(synthetic, tmp_path):
    data = tmp_path / "obs.parquet"
    synthetic.to_parquet(data)
    model = train_default([data], out=tmp_path / "default.npz", n_splits=3)
    assert 0 < model.utilization_error < 0.5
    assert "learned_mdape_throughput" in model.metrics
    assert isinstance(load(tmp_path / "default.npz"), Predictor)
    synthetic.drop(columns=["cpu_count"]).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(SchemaError, match="cpu_count"):
        train_default([tmp_path / "bad.parquet"], out=None)


class _RunsCode:
    """Unpickling this calls os.system: what a pickled model file could do."""

    def __reduce__(self):
        import os

        return (os.system, ("touch ran-code",))


def test_a_model_file_that_would_run_code_is_refused(fitted, tmp_path, monkeypatch):
    """Loading never unpickles: an object array (a pickle inside the .npz) and a joblib
    pickle under the model's name are both refused, and nothing runs."""
    monkeypatch.chdir(tmp_path)
    path = fitted.save(tmp_path / "m.npz")
    meta = json.loads((tmp_path / "m.npz.json").read_text())
    with path.open("wb") as handle:
        np.savez(handle, evil=np.array([_RunsCode()], dtype=object))
    meta["sha256"] = sha256(path)
    (tmp_path / "m.npz.json").write_text(json.dumps(meta))
    with pytest.raises(ModelVersionError, match="plain arrays"):
        load(path)
    import pickle

    path.write_bytes(pickle.dumps(_RunsCode()))
    meta["sha256"] = sha256(path)
    (tmp_path / "m.npz.json").write_text(json.dumps(meta))
    with pytest.raises(ModelVersionError):
        load(path)
    assert not (tmp_path / "ran-code").exists()


def test_a_changed_model_file_is_refused_by_its_digest(fitted, tmp_path):
    path = fitted.save(tmp_path / "m.npz")
    with pytest.raises(ModelVersionError, match="SHA-256"):
        load(path, expected_sha256="0" * 64)
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelVersionError, match="changed after it was written"):
        load(path)


def test_the_shipped_model_matches_its_pinned_digest():
    from benchmarks.tuner_lab.model import DEFAULT_MODEL_PATH

    assert sha256(DEFAULT_MODEL_PATH) == SHIPPED_SHA256
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = load_default()
    assert isinstance(model, Predictor) and 0.0 <= model.correction_weight <= 1.0


def test_a_retrained_model_is_used_through_the_environment(fitted, tmp_path, monkeypatch):
    path = fitted.save(tmp_path / "mine.npz")
    monkeypatch.setenv(MODEL_ENV, str(path))
    assert load_default().metrics == fitted.metrics


def test_family_cross_validation_leaves_a_whole_family_out(synthetic):
    ev = evaluate(synthetic, {"queueing": QueueingModel}, by="storage_profile")
    assert set(ev.per_group["group"]) == set(synthetic["storage_profile"])
    with pytest.raises(SchemaError, match="`by` must be one of"):
        evaluate(synthetic, by="colour")
