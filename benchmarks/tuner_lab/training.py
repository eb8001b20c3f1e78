"""Training the learned predictor: fit, grouped cross-validation, the default model.

Research, not runtime: `prefetch="auto"` plans with the queueing prior and never
imports this (or scikit-learn). `python -m benchmarks.tuner_lab retrain` and
`evaluate` run it from a source checkout. Three scikit-learn regressors learn corrections to
first principles (`benchmarks.tuner_lab.model.prior_bases`), meant to carry over to workloads
they never saw; left one whole workload or storage profile out they still did worse
than the queueing model (benchmarks/results/model-families.md, model-transfer.md).

`evaluate` scores models with cross-validation grouped by (workload, storage_profile):
every score is on groups the model never saw; `by="workload"` or `"storage_profile"`
leaves a whole family out, and `train_default` turns that score into
`correction_weight`, how much of its correction the tuner may trust (0 where the model
is no better than the queueing prior on families it never saw).

Example:
    >>> model = TrainablePredictor().fit(observations)
    >>> evaluate(observations).summary
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.tuner_lab.features import extract_features, group_labels, validate_observations
from benchmarks.tuner_lab.model import Predictor, prior_bases, read_observations
from predictors.baselines import ConstantModel, QueueingModel
from predictors.errors import SchemaError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEFAULT_CANDIDATES",
    "Evaluation",
    "TrainablePredictor",
    "correction_weight",
    "evaluate",
    "train_default",
]


def _regressor(kind: str) -> Any:
    from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestRegressor

    if kind == "hgb":
        return HistGradientBoostingRegressor(
            max_iter=200, learning_rate=0.08, min_samples_leaf=10, random_state=0
        )
    if kind == "rf":
        return RandomForestRegressor(n_estimators=150, min_samples_leaf=3, n_jobs=1, random_state=0)
    raise ValueError(f"`kind` must be 'hgb' or 'rf'. Found: {kind!r}.")


class TrainablePredictor(Predictor):
    """A `Predictor` that fits its trees with scikit-learn (`kind`: "hgb" or "rf");
    `save` writes them as plain arrays that `benchmarks.tuner_lab.model.load` reads."""

    def fit(self, frame: pd.DataFrame) -> TrainablePredictor:
        validate_observations(frame)
        x = extract_features(frame)
        thr_base, mem_base = prior_bases(frame) if self.residual else (0.0, 0.0)
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

    def feature_importances(
        self, frame: pd.DataFrame, target: str = "throughput", n_repeats: int = 5
    ) -> pd.Series:
        """Permutation importance of each input on `frame` (drop in R² when shuffled)."""
        import pandas as pd
        from sklearn.inspection import permutation_importance

        x = extract_features(frame)
        thr_base, mem_base = prior_bases(frame) if self.residual else (0.0, 0.0)
        y = {
            "throughput": lambda: np.log(frame["throughput_sps"]) - thr_base,
            "stall": lambda: frame["stall_fraction"].to_numpy(float),
            "memory": lambda: np.log(frame["memory_bytes"]) - mem_base,
        }[target]()
        result = permutation_importance(
            self.models_[target], x, y, n_repeats=n_repeats, random_state=0
        )
        return pd.Series(result.importances_mean, index=x.columns).sort_values(ascending=False)


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
    "learned": TrainablePredictor,
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
) -> TrainablePredictor:
    """Train a model from observation files and write it to `out` (None: keep it in
    memory); used by `python -m benchmarks.tuner_lab retrain`, which names `out`.

    Cross-validates first, grouped by (workload, storage_profile) and by family (each
    workload, each profile left out), records the metrics, the utilization error and
    the correction weight (`correction_weight`), then fits on everything.
    """
    frame = read_observations(paths)
    pair = {"learned": TrainablePredictor, "queueing": QueueingModel}
    evaluation = evaluate(frame, pair, n_splits=n_splits)
    families = [
        evaluate(frame, pair, n_splits=n_splits, by=by)
        for by in ("workload", "storage_profile")
        if frame[by].nunique() >= 2
    ]
    model = TrainablePredictor().fit(frame)
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
