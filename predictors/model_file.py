"""A model file that is numbers only: loading it never runs code.

A pickle (joblib) runs whatever code its author put in it when loaded, and the tuner
loads its model in every training job that sets `prefetch="auto"`. So the fitted
gradient-boosted trees are written as plain arrays (`numpy.savez`, read back with
`allow_pickle=False`) beside a JSON sidecar with the schema version, the metrics and
the SHA-256 of the arrays; `TreeEnsemble` evaluates the trees with numpy, without
scikit-learn. The shipped file's digest is also pinned in code (`SHIPPED_SHA256`), so a
changed shipped model is refused rather than trusted.

Example:
    >>> save_arrays(path, {"throughput": regressor}, meta)   # after fitting
    >>> ensembles, meta = load_arrays(path)                   # numbers in, numbers out
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from predictors.errors import ModelVersionError

__all__ = ["SHIPPED_SHA256", "TreeEnsemble", "load_arrays", "save_arrays", "sha256", "sidecar"]

# The digest of predictors/data/default_model.npz as shipped (see `iolib tune --retrain`).
SHIPPED_SHA256 = "d2fbb037b99c76ddb30e24fe24ec448f25e4b445c3c92a9576626460fddfc6e5"
_FIELDS = ("feature", "threshold", "left", "right", "leaf", "value", "missing_left")


class TreeEnsemble:
    """Gradient-boosted regression trees as flat arrays: `baseline + sum(tree(x))`.

    Node i of tree t is `roots[t] + i`; a split sends x[feature] <= threshold left
    (a missing value where `missing_left` says), exactly as scikit-learn's
    HistGradientBoostingRegressor predicts.
    """

    def __init__(self, baseline: float, roots: np.ndarray, **nodes: np.ndarray) -> None:
        self.baseline = float(baseline)
        self.roots = np.asarray(roots, dtype=np.int64)
        self.nodes = {name: np.asarray(nodes[name]) for name in _FIELDS}

    @classmethod
    def from_sklearn(cls, regressor: Any) -> TreeEnsemble:
        """The trees of a fitted HistGradientBoostingRegressor (numerical features only)."""
        if getattr(regressor, "is_categorical_", None) is not None:
            raise ModelVersionError("Categorical features cannot be exported; use numerical ones.")
        parts: dict[str, list[np.ndarray]] = {name: [] for name in _FIELDS}
        roots, offset = [], 0
        for (tree,) in regressor._predictors:
            n = tree.nodes
            roots.append(offset)
            parts["feature"].append(n["feature_idx"].astype(np.int64))
            parts["threshold"].append(n["num_threshold"].astype(np.float64))
            parts["left"].append(n["left"].astype(np.int64) + offset)
            parts["right"].append(n["right"].astype(np.int64) + offset)
            parts["leaf"].append(n["is_leaf"].astype(bool))
            parts["value"].append(n["value"].astype(np.float64))
            parts["missing_left"].append(n["missing_go_to_left"].astype(bool))
            offset += len(n)
        baseline = float(np.ravel(regressor._baseline_prediction)[0])
        return cls(baseline, np.array(roots), **{k: np.concatenate(v) for k, v in parts.items()})

    def predict(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        n = self.nodes
        node = np.broadcast_to(self.roots, (len(x), len(self.roots))).copy()
        rows = np.arange(len(x))[:, None]
        while True:
            inner = ~n["leaf"][node]
            if not inner.any():
                break
            value = x[rows, n["feature"][node]]
            go_left = np.where(
                np.isnan(value), n["missing_left"][node], value <= n["threshold"][node]
            )
            step = np.where(go_left, n["left"][node], n["right"][node])
            node = np.where(inner, step, node)
        return self.baseline + n["value"][node].sum(axis=1)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        out = {f"{prefix}.{k}": v for k, v in self.nodes.items()}
        out[f"{prefix}.roots"] = self.roots
        out[f"{prefix}.baseline"] = np.array([self.baseline])
        return out


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def save_arrays(path: str | Path, ensembles: dict[str, TreeEnsemble], meta: dict[str, Any]) -> Path:
    """Write the ensembles to `path` (.npz, arrays only) and `meta` + digest beside it."""
    path = Path(path)
    if path.suffix != ".npz":
        raise ModelVersionError(
            f"A model file must end in .npz. Found: {path.name}. Fix: rename it."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for name, ensemble in ensembles.items():
        arrays.update(ensemble.arrays(name))
    with path.open("wb") as handle:
        np.savez(handle, **arrays)
    meta = {**meta, "targets": sorted(ensembles), "sha256": sha256(path)}
    sidecar(path).write_text(json.dumps(meta, indent=2, default=float))
    return path


def load_arrays(
    path: str | Path, expected_sha256: str | None = None
) -> tuple[dict[str, TreeEnsemble], dict[str, Any]]:
    """The ensembles and metadata of a model file; never unpickles anything.

    Refuses (ModelVersionError) a file that is not plain arrays, whose digest differs
    from its sidecar's or from `expected_sha256`, or whose sidecar is missing.
    """
    path = Path(path)
    fix = "Fix: retrain it with `iolib tune --retrain OBSERVATIONS... --model-out PATH.npz`."
    try:
        meta = json.loads(sidecar(path).read_text())
    except FileNotFoundError as exc:
        raise ModelVersionError(f"Model {path} has no sidecar {sidecar(path).name}. {fix}") from exc
    except json.JSONDecodeError as exc:
        raise ModelVersionError(
            f"Sidecar {sidecar(path)} is not valid JSON ({exc}). {fix}"
        ) from exc
    digest = sha256(path)
    for wanted, what in ((meta.get("sha256"), "its sidecar"), (expected_sha256, "the shipped")):
        if wanted is not None and wanted != digest:
            raise ModelVersionError(
                f"Model {path} has SHA-256 {digest[:12]}..., {what} digest says {wanted[:12]}...: "
                f"the file changed after it was written. {fix}"
            )
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:  # object arrays need pickle
        raise ModelVersionError(
            f"Model {path} is not a file of plain arrays ({exc}). {fix}"
        ) from exc
    ensembles = {}
    for target in meta.get("targets", []):
        try:
            parts = {k: arrays[f"{target}.{k}"] for k in (*_FIELDS, "roots", "baseline")}
        except KeyError as exc:
            raise ModelVersionError(f"Model {path} lacks array {exc} of `{target}`. {fix}") from exc
        baseline, roots = parts.pop("baseline")[0], parts.pop("roots")
        ensembles[target] = TreeEnsemble(baseline, roots, **parts)
    return ensembles, meta
