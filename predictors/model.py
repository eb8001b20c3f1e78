"""The learned predictor: throughput, stall fraction and memory of a configuration.

Three scikit-learn regressors on the inputs of `predictors.features` (computed from
feature and config columns only). Each learns a *correction* to first principles
rather than the raw outcome, meant to carry it over to workloads it never saw (left
one whole workload or storage profile out it still did worse than the queueing
model: benchmarks/results/model-families.md; the raw-target variants are kept for the comparison in
benchmarks/results/tuning-history.md):

- throughput: log(throughput) - log(queueing-model throughput);
- stall fraction: from the predicted throughput, since utilization = step / (step +
  stall) = throughput * step / batch_size (a direct regressor is the option
  `stall_from_throughput=False`; it measured worse, see tuning-history.md);
- memory: log(memory) - log(depth * batch_bytes).

`evaluate` scores models with cross-validation grouped by (workload, storage_profile):
every score is on groups the model never saw; `by="workload"` or `"storage_profile"`
leaves a whole family out, and `train_default` turns that score into
`correction_weight`, how much of its correction the tuner may trust (0 where the model
is no better than the queueing prior on families it never saw). `save` writes the trees
as plain arrays (`predictors.model_file`: loading never runs code); `load` refuses
another schema version or a changed file; `load_default` falls back to the queueing
model, with a warning, when the model is missing or broken.

Example:
    >>> model = Predictor().fit(observations)
    >>> model.predict(candidates)[["throughput_sps", "utilization", "memory_bytes"]]
    >>> evaluate(observations).summary
"""

from __future__ import annotations

import logging
import math
import os
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
    "MODEL_ENV",
    "Evaluation",
    "Predictor",
    "evaluate",
    "load",
    "load_default",
    "read_observations",
    "train_default",
    "user_model_path",
]

log = logging.getLogger(__name__)
DEFAULT_MODEL_PATH = Path(__file__).parent / "data" / "default_model.npz"
MODEL_ENV = "IOLIB_TUNER_MODEL"  # a retrained model's path, used instead of the shipped one


def user_model_path() -> Path:
    """Where `iolib tune --retrain` writes when no path is named: the user's data
    directory, never the installed package (`$XDG_DATA_HOME/iolib/model.npz`)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "iolib" / "model.npz"


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
        self.correction_weight = 1.0  # set from leave-one-family-out scores by train_default
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
        """Write `path` (.npz: the fitted trees as plain arrays) and `path` + ".json"
        (schema version, provenance, metrics, digest). See `predictors.model_file`."""
        from predictors.model_file import TreeEnsemble, save_arrays

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
    from predictors.model_file import load_arrays

    path = Path(path)
    retrain = "Fix: retrain it with `iolib tune --retrain OBSERVATIONS... --model-out PATH.npz`."
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
            f"Found: {value!r}. Fix: retrain it with `iolib tune --retrain`."
        )
    return float(value)


def load_default(path: str | Path | None = None) -> Predictor | QueueingModel:
    """The model the tuner uses: `path`, else $IOLIB_TUNER_MODEL, else the shipped one
    (its digest checked against `SHIPPED_SHA256`). A missing or unreadable model gives
    the queueing model and a warning: tuning degrades, the training run goes on."""
    from predictors.model_file import SHIPPED_SHA256

    chosen = path if path is not None else os.environ.get(MODEL_ENV)
    path = Path(chosen) if chosen else DEFAULT_MODEL_PATH
    expected = SHIPPED_SHA256 if path == DEFAULT_MODEL_PATH else None
    try:
        return load(path, expected)
    except Exception as exc:  # any failure here must degrade, never crash the training run
        message = (
            f"predictors: could not load the model {path} ({type(exc).__name__}: {exc}); "
            "using the queueing model instead. Fix: `iolib tune --retrain OBSERVATIONS...` "
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


FAMILIES = ("group", "workload", "storage_profile")


def evaluate(
    frame: pd.DataFrame,
    models: dict[str, ModelFactory] | None = None,
    n_splits: int | None = None,
    by: str = "group",
) -> Evaluation:
    """Grouped cross-validation of `models` (default: learned, queueing, constant).

    `by="group"`: groups are (workload, storage_profile); `"workload"` or
    `"storage_profile"` leaves a whole family out (every storage profile of a workload,
    or every workload on a profile): a case measured is not the family it belongs to.
    `n_splits=None` leaves one group out at a time, an integer uses GroupKFold.
    """
    import pandas as pd
    from sklearn.model_selection import GroupKFold, LeaveOneGroupOut

    validate_observations(frame)
    frame = frame.reset_index(drop=True)
    if by not in FAMILIES:
        raise SchemaError(f"`by` must be one of {list(FAMILIES)}. Found: {by!r}.")
    groups = group_labels(frame) if by == "group" else frame[by].astype(str).to_numpy()
    n_groups = len(set(groups))
    if n_groups < 2:
        raise SchemaError(
            f"Grouped cross-validation needs at least 2 groups by {by}; found {n_groups}. "
            "Fix: add observations of another workload or profile."
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


def correction_weight(evaluations: Iterable[Evaluation]) -> float:
    """How much of the learned correction to trust: 1 - (learned error / queueing error)
    on utilization, at the worst family left out, within [0, 1]. 0 where the model is no
    better than the queueing prior on a family it never saw."""
    skills = [
        1.0
        - e.summary.loc["learned", "mae_stall"] / max(e.summary.loc["queueing", "mae_stall"], 1e-9)
        for e in evaluations
    ]
    return float(min(1.0, max(0.0, min(skills, default=0.0))))


def train_default(
    paths: Iterable[str | Path], out: str | Path | None, n_splits: int | None = 5
) -> Predictor:
    """Train a model from observation files and write it to `out` (None: keep it in
    memory); used by `iolib tune --retrain`, which names `out` (never the package).

    Cross-validates first, grouped by (workload, storage_profile) and by family (each
    workload, each profile left out), records the metrics, the utilization error and
    the correction weight (`correction_weight`), then fits on everything.
    """
    frame = read_observations(paths)
    pair = {"learned": Predictor, "queueing": QueueingModel}
    evaluation = evaluate(frame, pair, n_splits=n_splits)
    families = [
        evaluate(frame, pair, n_splits=n_splits, by=by)
        for by in ("workload", "storage_profile")
        if frame[by].nunique() >= 2
    ]
    model = Predictor().fit(frame)
    learned = evaluation.summary.loc["learned"]
    model.utilization_error = float(learned["p80_util_error"])
    model.correction_weight = correction_weight(families)
    model.metrics = {
        f"{m}_{k}": float(v) for m, row in evaluation.summary.iterrows() for k, v in row.items()
    }
    for by, ev in zip(("workload", "storage_profile"), families, strict=False):
        for m, row in ev.summary.iterrows():
            model.metrics[f"{by}_out_{m}_mae_util"] = float(row["mae_stall"])
    if out is not None:
        model.save(out)
    return model
