"""Schema validation, feature extraction and the leakage guard (SYNTHETIC observations)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from benchmarks.tuner_lab.features import (
    CONFIG_COLUMNS,
    DERIVED,
    FEATURE_COLUMNS,
    INPUT_COLUMNS,
    OUTCOME_COLUMNS,
    Derived,
    check_no_leakage,
    extract_features,
    group_labels,
    service_ms_per_batch,
    validate_observations,
)
from benchmarks.tuner_lab.synthetic import make_observations
from predictors.errors import LeakageError, SchemaError

pytestmark = pytest.mark.lab  # the lab's simulator (benchmarks/tuner_lab)


@pytest.fixture(scope="module")
def synthetic() -> pd.DataFrame:
    return make_observations(n_workloads=4, workers=(1, 4), depths=(1, 4), n_batches=40, seed=7)


def test_column_kinds_are_disjoint():
    kinds = [set(FEATURE_COLUMNS), set(CONFIG_COLUMNS), set(OUTCOME_COLUMNS)]
    assert not (kinds[0] & kinds[1]) and not (kinds[0] & kinds[2]) and not (kinds[1] & kinds[2])


def test_missing_columns_are_named_with_the_fix(synthetic):
    broken = synthetic.drop(columns=["step_ms", "throughput_sps"])
    with pytest.raises(
        SchemaError, match=r"step_ms.*throughput_sps|throughput_sps.*step_ms"
    ) as info:
        validate_observations(broken)
    assert "iolib bench" in str(info.value)


def test_bad_values_are_rejected(synthetic):
    bad = synthetic.copy()
    bad.loc[bad.index[0], "storage_bandwidth_mbps"] = 0.0
    with pytest.raises(SchemaError, match="storage_bandwidth_mbps"):
        validate_observations(bad)
    bad = synthetic.copy()
    bad.loc[bad.index[0], "shuffle"] = "random"
    with pytest.raises(SchemaError, match="shuffle"):
        validate_observations(bad)
    with pytest.raises(SchemaError, match="empty"):
        validate_observations(synthetic.iloc[:0])


def test_candidates_need_no_outcomes(synthetic):
    candidates = synthetic[[*FEATURE_COLUMNS, *CONFIG_COLUMNS]]
    assert validate_observations(candidates, require_outcomes=False) is candidates
    x = extract_features(candidates)
    assert list(x.columns) == list(INPUT_COLUMNS)
    assert np.all(np.isfinite(x.to_numpy()))


def test_service_time_worked_example():
    row = pd.DataFrame(
        {
            "bytes_per_sample": [1e6],  # 1 MB
            "decode_ms_per_sample": [2.0],
            "storage_latency_ms": [10.0],
            "storage_bandwidth_mbps": [100.0],  # 10 ms per MB
            "batch_size": [8],
            "rows_per_read": [4],  # 2 requests
        }
    )
    # 2 requests x 10 ms + 8 MB x 10 ms/MB + 8 x 2 ms = 20 + 80 + 16
    assert service_ms_per_batch(row)[0] == pytest.approx(116.0)


def test_groups_are_workload_and_profile(synthetic):
    labels = group_labels(synthetic)
    assert len(set(labels)) == synthetic.groupby(["workload", "storage_profile"]).ngroups


def test_leakage_guard_passes_on_the_shipped_inputs():
    check_no_leakage(DERIVED)
    assert not set(INPUT_COLUMNS) & set(OUTCOME_COLUMNS)


@pytest.mark.parametrize("outcome", OUTCOME_COLUMNS)
def test_leakage_guard_refuses_each_outcome(outcome):
    leaky = Derived(f"log_{outcome}", (outcome,), lambda f: np.log(f[outcome]))
    with pytest.raises(LeakageError, match=outcome):
        check_no_leakage((*DERIVED, leaky))
    with pytest.raises(LeakageError):
        check_no_leakage((Derived(outcome, ("step_ms",), lambda f: f["step_ms"]),))


def test_leakage_guard_refuses_unclassified_columns():
    with pytest.raises(LeakageError, match="does not classify"):
        check_no_leakage((Derived("x", ("wall_clock_s",), lambda f: f["wall_clock_s"]),))


def test_inputs_do_not_move_when_outcomes_do(synthetic):
    """Behavioural guard: scramble every outcome; the model inputs must not change.

    Fails if any input reads an outcome, even through a helper the static guard misses.
    """
    scrambled = synthetic.copy()
    rng = np.random.default_rng(0)
    for name in OUTCOME_COLUMNS:
        scrambled[name] = rng.permutation(scrambled[name].to_numpy()) * 3.0 + 1.0
    pd.testing.assert_frame_equal(extract_features(synthetic), extract_features(scrambled))
