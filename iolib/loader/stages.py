"""Feeds for the stages of a pipeline-parallel model: microbatches, per-stage columns.

Why no communication: every stage of a data-parallel replica builds its own loader with
the same dataset, seed, epoch, batch size, rank and world size (the replica's, not the
process's), so each computes the same plan and sees the same samples in the same order.
The first stage takes the inputs, the last the labels; neither reads nor decodes what it
does not use (Parquet column projection; an image folder's labels come from its listing).

Which columns a stage gets:

=============  ==========================================  =========================
stage          dict batch (Parquet, image folder, dicts)   tuple batch ``(x, y)``
=============  ==========================================  =========================
first          every column except the label column(s)     ``x``
last           the label column(s)                         ``y``
middle         ``None`` per microbatch                     ``None`` per microbatch
only (1 of 1)  everything                                  everything
=============  ==========================================  =========================

Label columns default to those of ``"label"``, ``"labels"``, ``"target"``, ``"y"``
present in the batch; ``labels=``, ``inputs=`` and ``columns=`` override (names for
dict batches, positions for tuple batches).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from iolib.collate import list_companions
from iolib.errors import ConfigError, DataError, require_non_negative_int, require_positive_int
from iolib.fetcher import skips
from iolib.sources.base import Source

DEFAULT_LABELS: tuple[str, ...] = ("label", "labels", "target", "y")
_INDEX = "__iolib_index__"  # the only column of a stage that reads nothing
_UNSET = object()

Names = str | int | Sequence[str | int] | None


def microbatch_sizes(rows: int, microbatches: int) -> list[int]:
    """Rows per microbatch with ``torch.tensor_split``'s rule: sizes differ by at most one,
    the first ones are larger. A batch with fewer rows than ``microbatches`` (an epoch's
    last batch) splits into one-row microbatches, never empty ones.

    >>> microbatch_sizes(10, 4), microbatch_sizes(3, 4)
    ([3, 3, 2, 2], [1, 1, 1])
    """
    parts = max(1, min(microbatches, rows))
    size, extra = divmod(rows, parts)
    return [size + 1] * extra + [size] * (parts - extra)


def split_batch(value: Any, sizes: list[int]) -> list[Any]:
    """Cut a batch (tensors, arrays, lists, and dicts/tuples of them) along its first
    dimension into pieces of `sizes` rows, in order."""
    if value is None:
        return [None] * len(sizes)
    if isinstance(value, torch.Tensor):
        return list(torch.split(value, sizes))
    if isinstance(value, dict):
        parts = {key: split_batch(v, sizes) for key, v in value.items()}
        return [{key: parts[key][i] for key in value} for i in range(len(sizes))]
    if isinstance(value, tuple):
        parts = [split_batch(v, sizes) for v in value]
        rows = zip(*parts, strict=True)
        return [type(value)(*p) if hasattr(value, "_fields") else tuple(p) for p in rows]
    if isinstance(value, (list, np.ndarray)):
        bounds = np.cumsum([0, *sizes]).tolist()
        return [value[a:b] for a, b in itertools.pairwise(bounds)]
    raise ConfigError(
        f"Cannot split a {type(value).__name__} into microbatches: a batch must be made of "
        "tensors, arrays, lists, and dicts or tuples of them. Return those from collate_fn."
    )


def batch_rows(batch: Any, top: bool = True) -> int:
    """Rows in a batch: the first dimension of its first tensor, array or list. At the top,
    a list is a sequence batch (``[x, y]`` from default_collate): its first element counts."""
    if isinstance(batch, torch.Tensor | np.ndarray):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, list) and not (top and batch and _is_batch(batch[0])):
        return len(batch)
    if isinstance(batch, dict | tuple | list) and batch:
        first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
        return batch_rows(first, top=False)
    raise ConfigError(f"Cannot tell how many rows a {type(batch).__name__} batch holds.")


def _is_batch(value: Any) -> bool:
    return isinstance(value, torch.Tensor | np.ndarray | dict | tuple | list)


def _as_list(names: Names) -> list[Any] | None:
    if names is None:
        return None
    return [names] if isinstance(names, str | int) else list(names)


class _IndexOnly(Source):
    """A source that reads nothing: the sample indices only (for a stage that needs no
    column). Same length, blocks and fingerprint, so the plan and the state are equal."""

    columnar = True

    def __init__(self, source: Source) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def fingerprint(self) -> str:
        return self.source.fingerprint()

    def blocks(self) -> tuple[int, ...]:
        return self.source.blocks()

    def describe(self) -> str:
        return self.source.describe()

    def locate(self, index: int) -> str:
        return self.source.locate(index)

    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        return pa.table({_INDEX: np.asarray(indices, dtype=np.int64)})


class _FolderLabels(_IndexOnly):
    """An image folder's labels and paths from its listing, without fetching an image."""

    def __init__(self, source: Any, columns: list[str]) -> None:
        super().__init__(source)
        self.columns = columns

    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        from iolib.sources.files import SCHEMA

        _, paths, labels = self.source._list()
        indices = np.asarray(indices, dtype=np.int64)
        values = {"label": labels[indices], "path": [paths[int(i)] for i in indices]}
        schema = pa.schema([SCHEMA.field(c) for c in self.columns])
        return pa.table({c: values[c] for c in self.columns}, schema=schema)


def _source_columns(source: Source) -> list[str] | None:
    """The columns a source's batches hold, known before reading (None if unknown)."""
    from iolib.sources.files import SCHEMA, ImageFolderSource
    from iolib.sources.parquet import ParquetSource

    if isinstance(source, ParquetSource):
        return list(source.schema.names)
    if isinstance(source, ImageFolderSource):
        return list(SCHEMA.names)
    return None


def _project(source: Source, columns: list[str]) -> Source | None:
    """`source` reading only `columns`, or None if it cannot leave columns unread."""
    from iolib.sources.files import ImageFolderSource
    from iolib.sources.parquet import ParquetSource

    if isinstance(source, ParquetSource):
        return source.with_columns(columns)
    if isinstance(source, ImageFolderSource) and "image" not in columns:
        return _FolderLabels(source, columns)
    return None


class StageLoader:
    """What one stage of a pipeline-parallel replica needs, batch by batch, as a list of
    microbatches; the same samples in the same order on every stage, with no collective.

    Example (two stages, each in its own process; the loader's rank and world size are
    the *data-parallel* replica's, see ``iolib.loader.distributed.pipeline_rank``)::

        where = pipeline_rank(num_stages=2)
        loader = DataLoader(ParquetSource("data/"), batch_size=32, shuffle=True, seed=0,
                            rank=where.replica, world_size=where.replicas)
        feed = loader.for_stage(where.stage, 2, microbatches=4)
        for microbatches in feed:       # one training step: 4 microbatches
            for mb in microbatches:     # stage 0: {"tokens": ...}; stage 1: {"label": ...}
                ...

    stage, num_stages: this stage and the pipeline depth. microbatches: pieces per batch
    (``torch.tensor_split`` sizes; an epoch's last batch with fewer rows than pieces
    yields one-row microbatches, so pass ``drop_last=True`` for a fixed count).
    inputs, labels: the columns (dict batches) or positions (tuple batches) of each role.
    columns: exactly what this stage gets, whatever its role.

    Reading: a stage reads only the Parquet columns it returns (an image folder's label
    stage fetches no image; a stage that returns nothing reads nothing) and skips the
    decoder when it needs none of the decoder's ``columns``. Exceptions, where batch
    content may depend on what is read: with ``transform``/``collate_fn`` every stage
    but an empty one reads every column; with ``on_error="skip"`` (loader or decoder)
    every stage reads and decodes everything, so a skipped sample vanishes on all stages.
    """

    def __init__(
        self,
        loader: Any,
        stage: int,
        num_stages: int,
        microbatches: int = 1,
        inputs: Names = None,
        labels: Names = None,
        columns: Names = None,
    ) -> None:
        require_positive_int("num_stages", num_stages)
        require_non_negative_int("stage", stage)
        if stage >= num_stages:
            raise ConfigError(f"`stage` must be in 0..{num_stages - 1}. Found: {stage}.")
        self.microbatches = require_positive_int("microbatches", microbatches)
        if loader.batch_size is not None and microbatches > loader.batch_size:
            raise ConfigError(
                f"`microbatches` ({microbatches}) exceeds batch_size ({loader.batch_size}): "
                "a microbatch would be empty. Use at most batch_size microbatches."
            )
        self.loader, self.stage, self.num_stages = loader, stage, num_stages
        self.inputs, self.labels, self.columns = (
            _as_list(inputs),
            _as_list(labels),
            _as_list(columns),
        )
        self._inner: Any = None
        self._picked: Any = _UNSET  # this stage's keys (None: nothing), once known
        self.reads, self.decodes = "all", loader.decode is not None
        self.read_columns: list[str] | None = None  # the projection, where there is one
        _warn_if_ranks_span_stages(loader, num_stages)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.num_stages - 1

    # -- which columns -------------------------------------------------------------------
    def pick(self, names: list[Any]) -> list[Any] | None:
        """This stage's keys among a batch's `names` (None: the stage gets nothing)."""
        if self.columns is not None:
            missing = [c for c in self.columns if c not in names]
            if missing:
                raise ConfigError(f"`columns` {missing} are not in the batch, which has {names}.")
            return self.columns
        labels = self._label_names(names)
        inputs = self.inputs or [n for n in names if n not in labels]
        if self.inputs and (missing := [c for c in self.inputs if c not in names]):
            raise ConfigError(f"`inputs` {missing} are not in the batch, which has {names}.")
        if self.first and self.last:
            return [n for n in names if n in inputs or n in labels]
        if self.first:
            return inputs
        return labels if self.last else None

    def _label_names(self, names: list[Any]) -> list[Any]:
        if self.labels is not None:
            missing = [c for c in self.labels if c not in names]
            if missing:
                raise ConfigError(f"`labels` {missing} are not in the batch, which has {names}.")
            return self.labels
        found = [n for n in names if n in DEFAULT_LABELS]
        if not found and self.last and not self.first:
            raise ConfigError(
                f"No label column in the batch (looked for {list(DEFAULT_LABELS)}; it has "
                f"{names}). Name them: for_stage(..., labels=['my_label'])."
            )
        return found

    # -- the loader this stage iterates ---------------------------------------------------
    @property
    def inner(self) -> Any:
        """The loader this stage iterates: the given one, or a copy that reads (and
        decodes) less. Built on first use; it starts at the given loader's cursor."""
        if self._inner is None:
            changes = self._reductions()
            self._inner = self.loader.replace(**changes) if changes else self.loader
        return self._inner

    def _reductions(self) -> dict[str, Any]:
        loader, decode = self.loader, self.loader.decode
        if skips(loader.options.sample.on_error, decode):
            return {}
        plain = loader.transform is None and loader.options.collate_fn is None
        names = _source_columns(loader.source) if plain else None
        if names is None:  # keys unknown before reading: only an empty stage reads less
            if self.columns is None and not (self.first or self.last):
                self.reads, self.decodes = "nothing", False
                return {"dataset": _IndexOnly(loader.source), "decode": None}
            return {}
        picked = self.pick(names)
        if picked is None:
            self.reads, self.decodes = "nothing", False
            return {"dataset": _IndexOnly(loader.source), "decode": None}
        changes: dict[str, Any] = {}
        wanted_by_decoder = set(decode.columns) if decode is not None else set()
        if wanted_by_decoder and not wanted_by_decoder & set(picked):
            changes["decode"], self.decodes = None, False
        if set(picked) != set(names):
            projected = _project(loader.source, list(picked))
            if projected is not None:
                changes["dataset"], self.reads = projected, "projected"
                self.read_columns = list(picked)
        return changes

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[list[Any]]:
        for batch in self.inner:
            yield self._microbatches(batch)

    def _microbatches(self, batch: Any) -> list[Any]:
        sizes = microbatch_sizes(batch_rows(batch), self.microbatches)
        return split_batch(self._select(batch), sizes)

    def _select(self, batch: Any) -> Any:
        if isinstance(batch, dict):
            if _INDEX in batch:
                return None
            if self._picked is _UNSET:
                self._picked = self.pick(list(batch))
            if self._picked is None:
                return None
            # A list column's mask, lengths or offsets go where the column goes.
            keys = [k for key in self._picked for k in (key, *list_companions(key)) if k in batch]
            return {key: batch[key] for key in dict.fromkeys(keys)}
        if isinstance(batch, tuple | list):
            return self._select_positions(batch)
        if self.first:
            return batch  # a lone tensor: the inputs
        return None

    def _select_positions(self, batch: Sequence[Any]) -> Any:
        count = len(batch)
        positions = list(range(count))
        if self.columns is not None:
            chosen = [positions[i] for i in self.columns]
            return batch[chosen[0]] if len(chosen) == 1 else tuple(batch[i] for i in chosen)
        labels = [positions[i] for i in (self.labels or [-1])] if count > 1 else []
        inputs = [positions[i] for i in self.inputs] if self.inputs else None
        inputs = inputs or [i for i in positions if i not in labels]
        if self.first and self.last:
            chosen = sorted(set(inputs) | set(labels))
        elif self.first:
            chosen = inputs
        elif self.last:
            chosen = labels
        else:
            return None
        if not chosen:
            raise DataError(f"The batch holds {count} element(s); stage {self.stage} gets none.")
        return batch[chosen[0]] if len(chosen) == 1 else tuple(batch[i] for i in chosen)

    # -- the loader's protocol -----------------------------------------------------------
    def __len__(self) -> int:
        """Batches (training steps) per epoch: the same on every stage and rank."""
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    def state_dict(self) -> dict[str, Any]:
        """The inner loader's cursor: equal on every stage, and interchangeable with the
        full loader's (a projection keeps the dataset's fingerprint)."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        """The inner loader's figures (``bytes_read``: compressed bytes fetched from
        storage by this stage) plus what this stage reads and decodes."""
        stats = self.inner.stats()
        stats["stage"] = {
            "stage": self.stage,
            "num_stages": self.num_stages,
            "microbatches": self.microbatches,
            "reads": self.reads,  # "all", "projected" or "nothing"
            "columns": self.read_columns,
            "decodes": self.decodes,
        }
        return stats

    def close(self) -> None:
        if self._inner is not None and self._inner is not self.loader:
            self._inner.close()


StageFeed = StageLoader  # the old name


def _warn_if_ranks_span_stages(loader: Any, num_stages: int) -> None:
    """Stages of one replica must share the loader's rank: a loader sharded over every
    process of a pipeline gives each stage other samples."""
    import torch.distributed as dist

    if num_stages < 2 or not (dist.is_available() and dist.is_initialized()):
        return
    if loader.world_size == dist.get_world_size() and loader.world_size > 1:
        warnings.warn(
            f"The loader is sharded over all {loader.world_size} processes, but a pipeline of "
            f"{num_stages} stages needs the stages of a replica to share one shard: pass "
            "rank=/world_size= of the data-parallel replica "
            "(iolib.loader.distributed.pipeline_rank).",
            stacklevel=3,
        )
