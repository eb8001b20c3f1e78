"""The cross-workload learned predictor: throughput, stall fraction and memory.

A `Predictor` holds trees fitted by `benchmarks.tuner_lab.training` (`python -m
benchmarks.tuner_lab retrain`) on the inputs of `benchmarks.tuner_lab.features`. Each tree
predicts a *correction* to first principles rather than the raw outcome:

- throughput: log(throughput) - log(queueing-model throughput);
- stall fraction: from the predicted throughput, since utilization = step / (step +
  stall) = throughput * step / batch_size (or a direct tree, `stall_from_throughput=False`);
- memory: log(memory) - log(depth * batch_bytes).

`save` writes the trees as plain arrays (`benchmarks.tuner_lab.model_file`: loading never runs
code); `load` refuses another schema version or a changed file; `load_default` falls
back to the queueing model, with a warning, when the model is missing or broken. No
learned model has beaten the queueing prior on families it never saw
(benchmarks/results/model-transfer.md), so the runtime (`prefetch="auto"`) loads none:
this model is the lab's, and this module never imports scikit-learn.

Example:
    >>> model = load(path)
    >>> model.predict(candidates)[["throughput_sps", "utilization", "memory_bytes"]]
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.tuner_lab.features import (
    INPUT_COLUMNS,
    SCHEMA_VERSION,
    extract_features,
    queueing_batches_per_s,
    validate_observations,
)
from predictors.baselines import QueueingModel
from predictors.errors import ModelVersionError, SchemaError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEFAULT_MODEL_PATH",
    "MODEL_ENV",
    "Predictor",
    "load",
    "load_default",
    "prior_bases",
    "read_observations",
    "user_model_path",
]

log = logging.getLogger(__name__)
DEFAULT_MODEL_PATH = Path(__file__).parent / "data" / "default_model.npz"
MODEL_ENV = "IOLIB_TUNER_MODEL"  # a retrained model's path, for the lab's scripts


def user_model_path() -> Path:
    """Where `python -m benchmarks.tuner_lab retrain` writes when no path is named: the user's data
    directory, never the installed package (`$XDG_DATA_HOME/iolib/model.npz`)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "iolib" / "model.npz"


def prior_bases(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The first-principles values the trees correct: log of the queueing model's
    throughput (samples/s) and log of the memory bound (depth x one batch's bytes)."""
    rate = queueing_batches_per_s(frame) * frame["batch_size"].to_numpy(float)
    bound = (frame["depth"] * frame["batch_size"] * frame["bytes_per_sample"]).to_numpy(float)
    return np.log(rate), np.log(bound)


class Predictor:
    """Learned model of (throughput, stall fraction, memory) for candidate configurations.

    `kind`: "hgb" (HistGradientBoosting, default) or "rf" (RandomForest);
    `residual`: learn corrections to first principles (default) or raw log targets;
    `stall_from_throughput`: derive the stall from the throughput (default) or fit it.
    `utilization_error` and `correction_weight` come from the training's grouped
    cross-validation: the tuner's safety margin and how much of the correction it trusts.
    Fitting lives in `benchmarks.tuner_lab.training.TrainablePredictor`.
    """

    def __init__(
        self, kind: str = "hgb", residual: bool = True, stall_from_throughput: bool = True
    ) -> None:
        self.kind = kind
        self.residual = residual
        self.stall_from_throughput = stall_from_throughput
        self.name = f"{kind}-{'residual' if residual else 'raw'}"
        self.utilization_error = 0.05
        self.correction_weight = 1.0  # set from leave-one-family-out scores by the training
        self.schema_version = SCHEMA_VERSION
        self.input_columns = INPUT_COLUMNS
        self.metrics: dict[str, float] = {}

    def predict(self, frame: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        if not hasattr(self, "models_"):
            raise RuntimeError(
                "This Predictor holds no trees. Fix: `load(path)` a model written by "
                "`python -m benchmarks.tuner_lab retrain`."
            )
        x = extract_features(frame)
        thr_base, mem_base = prior_bases(frame) if self.residual else (0.0, 0.0)
        throughput = np.exp(self.models_["throughput"].predict(x) + thr_base)
        # The loader cannot deliver faster than the consumer takes batches.
        consumer_sps = frame["batch_size"].to_numpy(float) * 1e3 / frame["step_ms"].to_numpy(float)
        throughput = np.minimum(throughput, consumer_sps)
        if self.stall_from_throughput:
            # utilization = step / (step + stall) = throughput * step / batch_size
            rate = throughput / frame["batch_size"].to_numpy(float)
            stall = 1.0 - np.minimum(rate * frame["step_ms"].to_numpy(float) / 1e3, 1.0)
        else:
            stall = np.clip(self.models_["stall"].predict(x), 0.0, 1.0)
        return pd.DataFrame(
            {
                "throughput_sps": throughput,
                "stall_fraction": stall,
                "utilization": 1.0 - stall,
                "memory_bytes": np.exp(self.models_["memory"].predict(x) + mem_base),
            },
            index=frame.index,
        )

    # --- persistence ------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write `path` (.npz: the fitted trees as plain arrays) and `path` + ".json"
        (schema version, provenance, metrics, digest). See `benchmarks.tuner_lab.model_file`."""
        from benchmarks.tuner_lab.model_file import TreeEnsemble, save_arrays

        ensembles = {
            name: m if isinstance(m, TreeEnsemble) else TreeEnsemble.from_sklearn(m)
            for name, m in self.models_.items()
        }
        meta = {
            "schema_version": self.schema_version,
            "input_columns": list(self.input_columns),
            "kind": self.name,
            "residual": self.residual,
            "stall_from_throughput": self.stall_from_throughput,
            "trained_rows": getattr(self, "trained_rows", 0),
            "trained_groups": getattr(self, "trained_groups", []),
            "utilization_error": self.utilization_error,
            "correction_weight": self.correction_weight,
            "metrics": self.metrics,
        }
        return save_arrays(path, ensembles, meta)


def load(path: str | Path, expected_sha256: str | None = None) -> Predictor:
    """Load a saved Predictor without running code; raise ModelVersionError if it fits
    another schema, is not plain arrays, or its digest differs (`model_file.load_arrays`)."""
    from benchmarks.tuner_lab.model_file import load_arrays

    path = Path(path)
    retrain = (
        "Fix: retrain it with "
        "`python -m benchmarks.tuner_lab retrain OBSERVATIONS... --model-out PATH.npz`."
    )
    ensembles, meta = load_arrays(path, expected_sha256)
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ModelVersionError(
            f"Model {path} was trained for observation schema version {version!r}; this "
            f"version of predictors reads schema {SCHEMA_VERSION}. {retrain}"
        )
    if tuple(meta.get("input_columns", ())) != INPUT_COLUMNS:
        raise ModelVersionError(
            f"Model {path} uses other input columns than this version. {retrain}"
        )
    stall_from_throughput = meta.get("stall_from_throughput", True) is not False
    needed = {"throughput", "memory"} | (set() if stall_from_throughput else {"stall"})
    if not needed <= set(ensembles):
        raise ModelVersionError(f"Model {path} lacks the trees for {sorted(needed)}. {retrain}")
    for target, ensemble in ensembles.items():
        ensemble.validate(len(INPUT_COLUMNS), f"Model {path}, trees of `{target}`")
    model = Predictor(
        residual=meta.get("residual", True) is not False,
        stall_from_throughput=stall_from_throughput,
    )
    model.models_ = ensembles
    model.utilization_error = _number(meta, "utilization_error", 0.1, 1e-6, 1.0, path)
    model.correction_weight = _number(meta, "correction_weight", 0.0, 0.0, 1.0, path)
    metrics = meta.get("metrics", {})
    if not isinstance(metrics, dict):
        raise ModelVersionError(f"Model {path}: `metrics` is not a mapping. {retrain}")
    model.metrics = {
        str(k): _number(metrics, k, 0.0, -1e12, 1e12, path) for k in list(metrics)[:1000]
    }
    model.trained_rows = int(_number(meta, "trained_rows", 0, 0, 1e12, path))
    groups = meta.get("trained_groups", [])
    model.trained_groups = [str(g) for g in groups[:10_000]] if isinstance(groups, list) else []
    return model


def _number(
    meta: dict[str, Any], key: str, default: float, low: float, high: float, path: Path
) -> float:
    """`meta[key]` as a finite number within [low, high] (`default` when absent)."""
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ok = False
    else:
        ok = math.isfinite(value) and low <= value <= high
    if not ok:
        raise ModelVersionError(
            f"Model {path}: `{key}` must be a finite number in [{low:g}, {high:g}]. "
            f"Found: {value!r}. Fix: retrain it with `python -m benchmarks.tuner_lab retrain`."
        )
    return float(value)


def load_default(path: str | Path | None = None) -> Predictor | QueueingModel:
    """The lab's model: `path`, else $IOLIB_TUNER_MODEL, else the one in the lab
    (its digest checked against `SHIPPED_SHA256`). A missing or unreadable model gives
    the queueing model and a warning: tuning degrades, the training run goes on."""
    from benchmarks.tuner_lab.model_file import SHIPPED_SHA256

    chosen = path if path is not None else os.environ.get(MODEL_ENV)
    path = Path(chosen) if chosen else DEFAULT_MODEL_PATH
    expected = SHIPPED_SHA256 if path == DEFAULT_MODEL_PATH else None
    try:
        return load(path, expected)
    except Exception as exc:  # any failure here must degrade, never crash the training run
        message = (
            f"predictors: could not load the model {path} ({type(exc).__name__}: {exc}); "
            "using the queueing model instead. Fix: "
            "`python -m benchmarks.tuner_lab retrain OBSERVATIONS...` "
            f"and point ${MODEL_ENV} at the file it writes."
        )
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return QueueingModel()


def read_observations(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate observation files (.parquet, .json, .jsonl, .csv) and validate them."""
    import pandas as pd

    frames = []
    for p in map(Path, paths):
        if p.suffix == ".parquet":
            frames.append(pd.read_parquet(p))
        elif p.suffix in (".json", ".jsonl"):
            frames.append(pd.read_json(p, lines=p.suffix == ".jsonl"))
        elif p.suffix == ".csv":
            frames.append(pd.read_csv(p))
        else:
            raise SchemaError(
                f"Observations file {p} has an unknown suffix. "
                "Fix: use .parquet, .json, .jsonl or .csv."
            )
    if not frames:
        raise SchemaError(
            "No observation files given. Fix: pass files written by `iolib bench --out`."
        )
    frame = pd.concat(frames, ignore_index=True)
    if "loader" in frame:  # the torch rows measure another loader: not our knobs
        frame = frame[frame["loader"].fillna("iolib") == "iolib"].reset_index(drop=True)
    if "step_ms" in frame:  # no step, no utilization: such rows cannot teach the tuner
        idle = frame["step_ms"] <= 0
        if idle.any():
            warnings.warn(
                f"predictors: left out {int(idle.sum())} observation(s) with step_ms <= 0 "
                "(utilization is undefined without a training step).",
                stacklevel=2,
            )
            frame = frame[~idle].reset_index(drop=True)
    return validate_observations(frame)
