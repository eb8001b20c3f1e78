"""The learned predictor: throughput, stall fraction and memory of a configuration.

Three scikit-learn regressors on the inputs of `predictors.features` (computed from
feature and config columns only). Each learns a *correction* to first principles
rather than the raw outcome, which is what lets it carry over to workloads it never
saw (the raw-target variants are kept for the comparison in docs/tuning.md):

- throughput: log(throughput) - log(queueing-model throughput);
- stall fraction: from the predicted throughput, since utilization = step / (step +
  stall) = throughput * step / batch_size (a direct regressor is the option
  `stall_from_throughput=False`; it measured worse, see docs/tuning.md);
- memory: log(memory) - log(depth * batch_bytes).

`evaluate` scores models with cross-validation grouped by (workload, storage_profile):
every score is on groups the model never saw. `save` writes a joblib file and a JSON
sidecar with the schema version; `load` refuses another version; `load_default` falls
back to the queueing model, with a warning, when the shipped model is missing or broken.

Example:
    >>> model = Predictor().fit(observations)
    >>> model.predict(candidates)[["throughput_sps", "utilization", "memory_bytes"]]
    >>> evaluate(observations).summary
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from predictors.baselines import ConstantModel, QueueingModel
from predictors.errors import ModelVersionError, SchemaError
from predictors.features import (
    INPUT_COLUMNS,
    SCHEMA_VERSION,
    extract_features,
    group_labels,
    queueing_batches_per_s,
    validate_observations,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEFAULT_MODEL_PATH",
    "Evaluation",
    "Predictor",
    "evaluate",
    "load",
    "load_default",
    "read_observations",
    "train_default",
]

log = logging.getLogger(__name__)
DEFAULT_MODEL_PATH = Path(__file__).parent / "data" / "default_model.joblib"


def _regressor(kind: str) -> Any:
    from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestRegressor

    if kind == "hgb":
        return HistGradientBoostingRegressor(
            max_iter=200, learning_rate=0.08, min_samples_leaf=10, random_state=0
        )
    if kind == "rf":
        return RandomForestRegressor(n_estimators=150, min_samples_leaf=3, n_jobs=1, random_state=0)
    raise ValueError(f"`kind` must be 'hgb' or 'rf'. Found: {kind!r}.")


class Predictor:
    """Learned model of (throughput, stall fraction, memory) for candidate configurations.

    `kind`: "hgb" (HistGradientBoosting, default) or "rf" (RandomForest);
    `residual`: learn corrections to first principles (default) or raw log targets;
    `stall_from_throughput`: derive the stall from the throughput (default) or fit it.
    `utilization_error` is set by `train_default` from grouped cross-validation and is
    the learned tuner's safety margin.
    """

    def __init__(
        self, kind: str = "hgb", residual: bool = True, stall_from_throughput: bool = True
    ) -> None:
        self.kind = kind
        self.residual = residual
        self.stall_from_throughput = stall_from_throughput
        self.name = f"{kind}-{'residual' if residual else 'raw'}"
        self.utilization_error = 0.05
        self.schema_version = SCHEMA_VERSION
        self.input_columns = INPUT_COLUMNS
        self.metrics: dict[str, float] = {}

    @staticmethod
    def _bases(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        rate = queueing_batches_per_s(frame) * frame["batch_size"].to_numpy(float)
        bound = (frame["depth"] * frame["batch_size"] * frame["bytes_per_sample"]).to_numpy(float)
        return np.log(rate), np.log(bound)

    def fit(self, frame: pd.DataFrame) -> Predictor:
        validate_observations(frame)
        x = extract_features(frame)
        thr_base, mem_base = self._bases(frame) if self.residual else (0.0, 0.0)
        self.models_ = {
            "throughput": _regressor(self.kind).fit(x, np.log(frame["throughput_sps"]) - thr_base),
            "memory": _regressor(self.kind).fit(x, np.log(frame["memory_bytes"]) - mem_base),
        }
        if not self.stall_from_throughput:
            self.models_["stall"] = _regressor(self.kind).fit(
                x, frame["stall_fraction"].to_numpy(float)
            )
        self.trained_rows = len(frame)
        self.trained_groups = sorted(set(group_labels(frame)))
        return self

    def predict(self, frame: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        if not hasattr(self, "models_"):
            raise RuntimeError(
                "This Predictor is not fitted. Fix: call `fit(observations)` or `load(path)`."
            )
        x = extract_features(frame)
        thr_base, mem_base = self._bases(frame) if self.residual else (0.0, 0.0)
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

    def feature_importances(
        self, frame: pd.DataFrame, target: str = "throughput", n_repeats: int = 5
    ) -> pd.Series:
        """Permutation importance of each input on `frame` (drop in R² when shuffled)."""
        import pandas as pd
        from sklearn.inspection import permutation_importance

        x = extract_features(frame)
        thr_base, mem_base = self._bases(frame) if self.residual else (0.0, 0.0)
        y = {
            "throughput": lambda: np.log(frame["throughput_sps"]) - thr_base,
            "stall": lambda: frame["stall_fraction"].to_numpy(float),
            "memory": lambda: np.log(frame["memory_bytes"]) - mem_base,
        }[target]()
        result = permutation_importance(
            self.models_[target], x, y, n_repeats=n_repeats, random_state=0
        )
        return pd.Series(result.importances_mean, index=x.columns).sort_values(ascending=False)

    # --- persistence ------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write `path` (joblib) and `path` + ".json" (schema version, provenance, metrics)."""
        import joblib
        import sklearn

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump(self, path)
        sidecar = {
            "schema_version": self.schema_version,
            "input_columns": list(self.input_columns),
            "kind": self.name,
            "sklearn_version": sklearn.__version__,
            "trained_rows": getattr(self, "trained_rows", 0),
            "trained_groups": getattr(self, "trained_groups", []),
            "utilization_error": self.utilization_error,
            "metrics": self.metrics,
        }
        _sidecar(path).write_text(json.dumps(sidecar, indent=2))
        return path


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def load(path: str | Path) -> Predictor:
    """Load a saved Predictor; raise ModelVersionError if it fits another schema."""
    import joblib

    path = Path(path)
    retrain = "Fix: retrain it with `iolib tune --retrain OBSERVATIONS...` (or `train_default`)."
    try:
        meta = json.loads(_sidecar(path).read_text())
    except FileNotFoundError as exc:
        raise ModelVersionError(
            f"Model {path} has no sidecar {_sidecar(path).name}. {retrain}"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ModelVersionError(
            f"Sidecar {_sidecar(path)} is not valid JSON ({exc}). {retrain}"
        ) from exc
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
    model = joblib.load(path)
    if not isinstance(model, Predictor):
        raise ModelVersionError(
            f"{path} holds a {type(model).__name__}, not a Predictor. {retrain}"
        )
    return model


def load_default(path: str | Path | None = None) -> Predictor | QueueingModel:
    """The shipped model; a missing or unreadable one gives the queueing model and a warning."""
    path = Path(path) if path is not None else DEFAULT_MODEL_PATH
    try:
        return load(path)
    except Exception as exc:  # any failure here must degrade, never crash the training run
        message = (
            f"predictors: could not load the default model {path} ({type(exc).__name__}: {exc}); "
            "using the queueing model instead. Fix: `iolib tune --retrain OBSERVATIONS...`."
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


@dataclass
class Evaluation:
    """Grouped cross-validation: one row per (model, unseen group), and a summary per model."""

    per_group: pd.DataFrame
    summary: pd.DataFrame
    out_of_fold: pd.DataFrame


def _scores(obs: pd.DataFrame, pred: pd.DataFrame) -> dict[str, float]:
    from sklearn.metrics import r2_score

    ape = np.abs(pred["throughput_sps"].to_numpy() / obs["throughput_sps"].to_numpy() - 1.0)
    mem_ape = np.abs(pred["memory_bytes"].to_numpy() / obs["memory_bytes"].to_numpy() - 1.0)
    util_err = np.abs(pred["utilization"].to_numpy() - (1.0 - obs["stall_fraction"].to_numpy()))
    r2 = r2_score(obs["throughput_sps"], pred["throughput_sps"]) if len(obs) > 1 else np.nan
    return {
        "rows": len(obs),
        "r2_throughput": float(r2),
        "mape_throughput": float(ape.mean()),
        "mdape_throughput": float(np.median(ape)),
        "mae_stall": float(
            np.abs(pred["stall_fraction"].to_numpy() - obs["stall_fraction"].to_numpy()).mean()
        ),
        "p80_util_error": float(np.quantile(util_err, 0.8)),
        "mdape_memory": float(np.median(mem_ape)),
    }


ModelFactory = Callable[[], Any]
DEFAULT_CANDIDATES: dict[str, ModelFactory] = {
    "learned": Predictor,
    "queueing": QueueingModel,
    "constant": ConstantModel,
}


def evaluate(
    frame: pd.DataFrame,
    models: dict[str, ModelFactory] | None = None,
    n_splits: int | None = None,
) -> Evaluation:
    """Grouped cross-validation of `models` (default: learned, queueing, constant).

    Groups are (workload, storage_profile); `n_splits=None` leaves one group out at a
    time, an integer uses GroupKFold. Every score is on groups absent from training.
    """
    import pandas as pd
    from sklearn.model_selection import GroupKFold, LeaveOneGroupOut

    validate_observations(frame)
    frame = frame.reset_index(drop=True)
    groups = group_labels(frame)
    n_groups = len(set(groups))
    if n_groups < 2:
        raise SchemaError(
            f"Grouped cross-validation needs at least 2 (workload, storage_profile) groups; "
            f"found {n_groups}. Fix: add observations of another workload or profile."
        )
    splitter = (
        LeaveOneGroupOut() if n_splits is None else GroupKFold(n_splits=min(n_splits, n_groups))
    )
    models = models or DEFAULT_CANDIDATES
    oof, rows = [], []
    for name, factory in models.items():
        pred = pd.DataFrame(
            index=frame.index,
            columns=["throughput_sps", "stall_fraction", "utilization", "memory_bytes"],
            dtype=float,
        )
        for train, test in splitter.split(frame, groups=groups):
            fitted = factory().fit(frame.iloc[train])
            pred.iloc[test] = fitted.predict(frame.iloc[test]).to_numpy()
        for group in sorted(set(groups)):
            mask = groups == group
            rows.append({"model": name, "group": group, **_scores(frame[mask], pred[mask])})
        oof.append(pred.assign(model=name, group=groups))
        rows.append({"model": name, "group": "(all, pooled)", **_scores(frame, pred)})
    table = pd.DataFrame(rows)
    summary = table[table["group"] == "(all, pooled)"].drop(columns="group").set_index("model")
    per_group = table[table["group"] != "(all, pooled)"].reset_index(drop=True)
    return Evaluation(per_group, summary, pd.concat(oof))


def train_default(
    paths: Iterable[str | Path], out: str | Path | None = DEFAULT_MODEL_PATH, n_splits: int = 5
) -> Predictor:
    """Train the shipped model from observation files; used by `iolib tune --retrain`.

    Cross-validates first (grouped), records the metrics and the utilization error
    (the tuner's margin) in the model and its sidecar, then fits on everything.
    """
    frame = read_observations(paths)
    evaluation = evaluate(
        frame, {"learned": Predictor, "queueing": QueueingModel}, n_splits=n_splits
    )
    model = Predictor().fit(frame)
    learned = evaluation.summary.loc["learned"]
    model.utilization_error = float(learned["p80_util_error"])
    model.metrics = {
        f"{m}_{k}": float(v) for m, row in evaluation.summary.iterrows() for k, v in row.items()
    }
    if out is not None:
        model.save(out)
    return model
