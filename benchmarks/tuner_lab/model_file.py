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
import io
import json
import math
import os
import stat
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from predictors.errors import ModelVersionError

__all__ = ["SHIPPED_SHA256", "TreeEnsemble", "load_arrays", "save_arrays", "sha256", "sidecar"]

# The digest of data/default_model.npz as committed (`python -m benchmarks.tuner_lab retrain`).
SHIPPED_SHA256 = "d2fbb037b99c76ddb30e24fe24ec448f25e4b445c3c92a9576626460fddfc6e5"
_FIELDS = ("feature", "threshold", "left", "right", "leaf", "value", "missing_left")
# Bounds on what a model file may hold: the shipped one is about 1 MiB (1,000 trees of
# a few dozen nodes); anything far past these is not a model of ours.
MAX_FILE_BYTES = 64 * 2**20  # the .npz on disk
MAX_SIDECAR_BYTES = 2**20  # the .json sidecar
MAX_ARRAY_BYTES = 256 * 2**20  # every array inflated, together
_CHUNK = 2**20


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

    def validate(self, n_features: int, where: str) -> None:
        """Raise ModelVersionError unless the trees are well formed: equal lengths,
        finite numbers, every index in range, and every child after its parent (so
        each path ends: no cycle can keep `predict` walking)."""
        n = self.nodes
        size = len(n["leaf"])
        shapes = {name: a.shape for name, a in n.items()}
        if any(shape != (size,) for shape in shapes.values()) or self.roots.ndim != 1:
            raise ModelVersionError(f"{where}: node arrays of unequal shapes {shapes}.")
        if size == 0 or len(self.roots) == 0:
            raise ModelVersionError(f"{where}: no trees.")
        kinds = {"feature": "iu", "left": "iu", "right": "iu", "threshold": "f", "value": "f"}
        for name, kind in kinds.items():
            if n[name].dtype.kind not in kind:
                raise ModelVersionError(f"{where}: `{name}` has dtype {n[name].dtype}.")
        for name in ("leaf", "missing_left"):
            if n[name].dtype.kind != "b":
                raise ModelVersionError(f"{where}: `{name}` has dtype {n[name].dtype}.")
        if not math.isfinite(self.baseline) or not np.all(np.isfinite(n["value"])):
            raise ModelVersionError(f"{where}: a leaf value or the baseline is not finite.")
        if np.any((self.roots < 0) | (self.roots >= size)):
            raise ModelVersionError(f"{where}: a root index outside 0..{size - 1}.")
        inner = ~n["leaf"]
        index = np.arange(size)
        feature, left, right = (n[k].astype(np.int64) for k in ("feature", "left", "right"))
        if np.any(inner & ((feature < 0) | (feature >= n_features))):
            raise ModelVersionError(f"{where}: a split on a feature outside 0..{n_features - 1}.")
        for name, child in (("left", left), ("right", right)):
            if np.any(inner & ((child <= index) | (child >= size))):
                raise ModelVersionError(
                    f"{where}: a `{name}` child that is not a later node in 0..{size - 1} "
                    "(out of range, or a cycle)."
                )

    def predict(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        n = self.nodes
        node = np.broadcast_to(self.roots, (len(x), len(self.roots))).copy()
        rows = np.arange(len(x))[:, None]
        # Children come after their parents (`validate`): no path is longer than the nodes.
        for _ in range(len(n["leaf"]) + 1):
            inner = ~n["leaf"][node]
            if not inner.any():
                break
            value = x[rows, n["feature"][node]]
            go_left = np.where(
                np.isnan(value), n["missing_left"][node], value <= n["threshold"][node]
            )
            step = np.where(go_left, n["left"][node], n["right"][node])
            node = np.where(inner, step, node)
        else:
            raise ModelVersionError("The model's trees do not end (a cycle); refusing them.")
        return self.baseline + n["value"][node].sum(axis=1)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        out = {f"{prefix}.{k}": v for k, v in self.nodes.items()}
        out[f"{prefix}.roots"] = self.roots
        out[f"{prefix}.baseline"] = np.array([self.baseline])
        return out


def _open_regular(path: Path, limit: int, what: str) -> io.BufferedReader:
    """`path` opened for reading if it is a regular file of at most `limit` bytes: a
    FIFO, a device or a directory is refused without blocking on it."""
    fix = "Fix: point it at a model file written by `python -m benchmarks.tuner_lab retrain`."
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:  # a directory, no permission
        raise ModelVersionError(f"{what} {path} cannot be opened ({exc}). {fix}") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ModelVersionError(
            f"{what} {path} is not a regular file (a FIFO, device or directory). {fix}"
        )
    if info.st_size > limit:
        os.close(fd)
        raise ModelVersionError(
            f"{what} {path} is {info.st_size / 2**20:.1f} MiB; a model file is at most "
            f"{limit / 2**20:.0f} MiB. {fix}"
        )
    return os.fdopen(fd, "rb")


def sha256(path: Path) -> str:
    """The file's SHA-256, read in chunks (a large file is never held whole)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _read_bounded(path: Path, limit: int, what: str) -> bytes:
    with _open_regular(path, limit, what) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:  # grew after the check
        raise ModelVersionError(f"{what} {path} is larger than {limit / 2**20:.0f} MiB.")
    return data


def _plain_arrays(data: bytes, path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz held in `data`, refusing pickles and any member whose
    declared size, inflated, passes `MAX_ARRAY_BYTES` (a zip bomb), before inflating."""
    fix = (
        "Fix: retrain it with "
        "`python -m benchmarks.tuner_lab retrain OBSERVATIONS... --model-out PATH.npz`."
    )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
            total = sum(m.file_size for m in members)
            if total > MAX_ARRAY_BYTES or len(members) > 10_000:
                raise ModelVersionError(
                    f"Model {path} inflates to {total / 2**20:.0f} MiB in {len(members)} "
                    f"arrays; a model is at most {MAX_ARRAY_BYTES / 2**20:.0f} MiB. {fix}"
                )
            arrays = {}
            for member in members:
                with archive.open(member) as handle:
                    version = np.lib.format.read_magic(handle)
                    reader = {
                        (1, 0): np.lib.format.read_array_header_1_0,
                        (2, 0): np.lib.format.read_array_header_2_0,
                    }.get(version)
                    if reader is None:
                        raise ValueError(f"array format version {version}")
                    shape, _, dtype = reader(handle)
                    if dtype.hasobject:
                        raise ValueError("object arrays need pickle")
                    declared = math.prod(shape) * dtype.itemsize
                    if declared > member.file_size:  # would allocate more than it holds
                        raise ValueError(f"array {member.filename} declares {declared} bytes")
            with np.load(io.BytesIO(data), allow_pickle=False) as loaded:
                for key in loaded.files:
                    arrays[key] = loaded[key]
            return arrays
    except ModelVersionError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        raise ModelVersionError(
            f"Model {path} is not a file of plain arrays ({exc}). {fix}"
        ) from exc


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
    fix = (
        "Fix: retrain it with "
        "`python -m benchmarks.tuner_lab retrain OBSERVATIONS... --model-out PATH.npz`."
    )
    try:
        meta = json.loads(_read_bounded(sidecar(path), MAX_SIDECAR_BYTES, "Sidecar"))
    except FileNotFoundError as exc:
        raise ModelVersionError(f"Model {path} has no sidecar {sidecar(path).name}. {fix}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ModelVersionError(
            f"Sidecar {sidecar(path)} is not valid JSON ({exc}). {fix}"
        ) from exc
    if not isinstance(meta, dict):
        raise ModelVersionError(f"Sidecar {sidecar(path)} is not a JSON object. {fix}")
    data = _read_bounded(path, MAX_FILE_BYTES, "Model")
    digest = hashlib.sha256(data).hexdigest()
    for wanted, what in ((meta.get("sha256"), "its sidecar"), (expected_sha256, "the shipped")):
        if wanted is not None and wanted != digest:
            raise ModelVersionError(
                f"Model {path} has SHA-256 {digest[:12]}..., {what} digest says {wanted[:12]}...: "
                f"the file changed after it was written. {fix}"
            )
    arrays = _plain_arrays(data, path)
    targets = meta.get("targets", [])
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ModelVersionError(f"Sidecar {sidecar(path)}: `targets` is not a list of names.")
    ensembles = {}
    for target in targets:
        try:
            parts = {k: arrays[f"{target}.{k}"] for k in (*_FIELDS, "roots", "baseline")}
        except KeyError as exc:
            raise ModelVersionError(f"Model {path} lacks array {exc} of `{target}`. {fix}") from exc
        baseline, roots = parts.pop("baseline"), parts.pop("roots")
        if baseline.shape != (1,) or baseline.dtype.kind != "f":
            raise ModelVersionError(f"Model {path}: `{target}.baseline` is not one number. {fix}")
        if roots.dtype.kind not in "iu":
            raise ModelVersionError(f"Model {path}: `{target}.roots` are not indices. {fix}")
        ensembles[target] = TreeEnsemble(baseline[0], roots, **parts)
    return ensembles, meta
