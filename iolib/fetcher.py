"""The work a worker does for one batch: read, transform, collate, decode.

A `BatchFetcher` is picklable (process workers get a copy) and never raises: it returns
either the batch or a `Failure` that names the stage, the samples and the traceback, so
threads and processes report errors the same way and the consumer re-raises them.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from iolib.collate import (
    batch_nbytes,
    collate_rows,
    collate_table,
    default_collate,
    table_rows,
)
from iolib.decode.protocol import Decoder
from iolib.errors import DataError, OnError, WorkerError, blamed_samples, tag_sample
from iolib.plan.rng import sample_rng
from iolib.sources.base import Source
from iolib.storage import helper_cpu_s, take_counters


@dataclass(slots=True)
class BatchTask:
    """Batch ``number`` of an epoch: the samples' keys, in batch order (int64 indices; a
    list of other keys where a user's sampler yields them). Not changed once made (not
    frozen: a frozen dataclass's __init__ cost ~0.35 µs a batch, inline)."""

    number: int
    indices: Any
    epoch: int
    # Keys that replace a batch whose every sample failed under on_error="skip" (the
    # samples that follow it in the epoch's order), so no rank yields an empty batch.
    reserve: Any = None


def key_list(indices: Any) -> list[Any]:
    return indices.tolist() if isinstance(indices, np.ndarray) else list(indices)


@dataclass
class BatchMeta:
    """What a worker measured while making one batch."""

    stage_ms: dict[str, float] = field(default_factory=dict)
    # CPU per stage (this thread's, plus a storage helper's): wall time without it is
    # waiting, for storage or for a core. The tuner tells CPU-bound reads from storage.
    cpu_ms: dict[str, float] = field(default_factory=dict)
    nbytes: int = 0
    bytes_read: int = 0
    retries: int = 0
    skipped: list[int] = field(default_factory=list)
    samples: int = 0
    refilled: int = 0  # samples taken from the task's reserve
    notes: list[str] = field(default_factory=list)  # differences from torch met (warned once)


@dataclass
class Fetched:
    """A finished batch and what making it measured."""

    batch: Any
    meta: BatchMeta

    @property
    def nbytes(self) -> int:
        return self.meta.nbytes


def _importable_type(kind: type) -> type | None:
    """The exception's class where another process can find it by module and name, as
    pickle does (torch rebuilds the same type from it); None for a class defined inside
    a function."""
    found: Any = sys.modules.get(kind.__module__)
    for part in kind.__qualname__.split("."):
        found = getattr(found, part, None)
    return kind if found is kind else None


class _KeyErrorMessage(str):
    """KeyError quotes its message with repr(); this keeps newlines readable (as torch)."""

    def __repr__(self) -> str:
        return self


def add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: kept for tools that read __notes__
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


@dataclass
class Failure:
    """A batch that failed: enough context to raise a useful error in the consumer."""

    stage: str
    message: str
    traceback: str
    samples: list[Any]
    exception: BaseException | None = None  # kept in thread mode; dropped across processes
    kind: type | None = None  # the exception's class, to re-raise the same type

    def __getstate__(self) -> dict[str, Any]:
        kind = _importable_type(self.kind) if self.kind is not None else None
        return {**self.__dict__, "exception": None, "kind": kind}

    def context(self, batch: int, epoch: int, *, message: bool = True) -> str:
        shown = self.samples[:8]
        more = f" (+{len(self.samples) - 8} more)" if len(self.samples) > 8 else ""
        where = (
            f"Batch {batch} of epoch {epoch} failed in stage '{self.stage}' for sample(s) "
            f"{shown}{more}"
        )
        return f"{where}: {self.message}" if message else f"{where}."

    def to_exception(self, batch: int, epoch: int) -> BaseException:
        """The error to raise in the consumer: the worker's own exception where this
        process holds it (thread workers, inline), else one of the same type rebuilt from
        its message, as torch does; a WorkerError where the type cannot be rebuilt. The
        stage, batch and samples come along as a note and as `iolib_*` attributes."""
        context = self.context(batch, epoch)
        exc = self.exception
        if exc is None and self.kind is not None and self.kind is not WorkerError:
            text = f"{context}\n\nOriginal traceback (in the worker):\n{self.traceback}"
            if issubclass(self.kind, KeyError):
                text = _KeyErrorMessage(text)
            try:
                exc = self.kind(text)
            except Exception:
                exc = None
        if exc is None:
            exc = WorkerError(
                context,
                stage=self.stage,
                batch=batch,
                samples=self.samples,
                remote_traceback=self.traceback,
            )
        else:
            # The exception prints its own message: the note adds only where it failed.
            add_note(exc, f"iolib: {self.context(batch, epoch, message=False)}")
        for name, value in (("stage", self.stage), ("batch", batch), ("samples", self.samples)):
            with contextlib.suppress(Exception):
                setattr(exc, f"iolib_{name}", value)
        return exc


def skips(on_error: OnError, decode: Decoder | None) -> bool:
    """Can a batch lose samples: under the loader's on_error="skip", or a decoder's?"""
    return on_error == OnError.SKIP or (decode is not None and decode.on_error == OnError.SKIP)


class _StageError(Exception):
    def __init__(self, stage: str, samples: list[int], cause: BaseException) -> None:
        super().__init__(stage)
        self.stage, self.samples, self.cause = stage, samples, cause


class BatchFetcher:
    """Makes one batch from a task. Holds only picklable configuration.

    `unbatched` (torch's batch_size=None): each task is one sample, converted by
    `collate_fn` (default: torch's default_convert) instead of collated."""

    def __init__(
        self,
        source: Source,
        *,
        seed: int,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        transform: Callable[[Any, np.random.Generator], Any] | None = None,
        decode: Decoder | None = None,
        on_error: OnError = OnError.RAISE,
        unbatched: bool = False,
        cpu_every: int = 1,
    ) -> None:
        """cpu_every: measure the stages' CPU on batch numbers divisible by it (a CPU
        clock read costs ~1.5 µs, four a batch; a tuner reads every batch's)."""
        self.source = source
        self.cpu_every = max(1, int(cpu_every))
        self.seed = seed
        self.collate_fn = collate_fn
        self.transform = transform
        self.decode = decode
        self.on_error = on_error
        self.unbatched = unbatched
        # Source's own check_batch does nothing: not called per batch then.
        self._checks = type(source).check_batch is not Source.check_batch
        # Samples collated as read: `_make_plain` makes the batches CPU is not measured on.
        self._plain = transform is None and decode is None and not unbatched and not source.columnar

    def __call__(self, task: BatchTask) -> Fetched | Failure:
        meta = BatchMeta()
        take_counters()  # start this batch's I/O counts from zero
        try:
            if self._plain and task.number % self.cpu_every:  # its CPU is not measured
                batch = self._make_plain(task, meta)
            else:
                batch = self._make(task, meta)
            if meta.samples == 0 and skips(self.on_error, self.decode):
                batch = self._refill(task, meta)
        except _StageError as exc:
            return self._failure(exc.stage, exc.samples, exc.cause)
        except Exception as exc:  # a bug in our own glue: still report, never hang
            return self._failure("fetch", key_list(task.indices), exc)
        meta.bytes_read, meta.retries = take_counters()
        # A plain tensor (most batches of cheap samples) without batch_nbytes' call.
        plain = type(batch) is Tensor and not batch.is_nested
        meta.nbytes = batch.nbytes if plain else batch_nbytes(batch)
        take_notes = getattr(self.source, "take_notes", None)
        if take_notes is not None:
            meta.notes = take_notes()
        return Fetched(batch, meta)

    def unsendable(self, text: str) -> Failure:
        """The result of a batch its process worker could not send (see workers.py); the
        consumer fills in the samples from its own copy of the task."""
        return Failure("send", text, "", [], None, WorkerError)

    def _failure(self, stage: str, samples: list[Any], exc: BaseException) -> Failure:
        where = self.source.locate(samples[0]) if len(samples) == 1 else self.source.describe()
        raw = f"{type(exc).__name__}: {exc} [{where}]"
        raw_tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        # Credentials of the source's URLs and options never leave in an error.
        redact = self.source.redactor()
        text, tb = redact(raw), redact(raw_tb, assignments=False)
        keep = exc if tb == raw_tb and redact(str(exc)) == str(exc) else None
        return Failure(stage, text, tb, samples, keep, type(exc))

    def _timed(
        self, meta: BatchMeta, stage: str, keys: Any, cpu: bool, fn: Callable[..., Any], *args: Any
    ) -> Any:
        """fn(*args), its wall time (and, where `cpu`, its CPU) added to `meta` under
        `stage`; an error raised as the stage's, blaming its samples or else every one of
        `keys`. Arguments, not a closure: one Python call less a stage, inline."""
        start = time.perf_counter()
        if cpu:
            used = time.thread_time() + helper_cpu_s()
        try:
            return fn(*args)
        except Exception as exc:
            raise _StageError(stage, blamed_samples(exc) or key_list(keys), exc) from exc
        finally:
            wall = time.perf_counter() - start
            meta.stage_ms[stage] = meta.stage_ms.get(stage, 0.0) + 1e3 * wall
            if cpu:
                used = time.thread_time() + helper_cpu_s() - used
                meta.cpu_ms[stage] = meta.cpu_ms.get(stage, 0.0) + 1e3 * used

    def _read(self, indices: Any, epoch: int, batch: int | None = None) -> Any:
        if batch is None:  # a sample read again alone
            data = self.source.read(indices, epoch=epoch)
        else:  # the source is told which batch of its plan it reads
            data = self.source.read_batch(indices, epoch=epoch, batch=batch)
        if self._checks:
            self.source.check_batch(data, indices)
        return data

    def _read_skipping(self, indices: Any, epoch: int, meta: BatchMeta, batch: int) -> Any:
        """Read a batch; under on_error="skip", retry sample by sample and leave out those
        that fail (counted), keeping the others in order.

        Where the source reads by block (Parquet row groups), a block that failed once
        fails every sample in it: the rest of its samples are skipped without another
        read (and its retries), so a corrupt row group costs one read, not one per sample."""
        try:  # what _read does, inlined: one call less a batch
            data = self.source.read_batch(indices, epoch=epoch, batch=batch)
            if self._checks:
                self.source.check_batch(data, indices)
            return data, indices
        except Exception:
            if self.on_error == OnError.RAISE:
                raise
        block_of = getattr(self.source, "block_of", None)
        kept, parts, failed_blocks = [], [], set()
        for index in key_list(indices):
            block = block_of(index) if block_of is not None else None
            if block is not None and block in failed_blocks:
                meta.skipped.append(index)
                continue
            try:
                parts.append(self._read(as_batch_of_one(indices, index), epoch))
                kept.append(index)
            except Exception as exc:
                meta.skipped.append(index)
                # A sample's own fault (a null label) says so; others fail its block.
                if block is not None and _fails_block(exc):
                    failed_blocks.add(block)
        if not parts:
            return None, np.zeros(0, dtype=np.int64)
        kept_keys = np.array(kept, dtype=np.int64) if isinstance(indices, np.ndarray) else kept
        if self.source.columnar:
            import pyarrow as pa

            return pa.concat_tables(parts), kept_keys
        return [s for part in parts for s in part], kept_keys

    def _make(self, task: BatchTask, meta: BatchMeta) -> Any:
        samples = task.indices  # a list only where an error names them
        cpu = task.number % self.cpu_every == 0
        prepare = getattr(self.decode, "prepare", None)
        if prepare is not None:  # the decoder gets ready while the bytes are read
            prepare()
        data, indices = self._timed(
            meta,
            "read",
            samples,
            cpu,
            self._read_skipping,
            task.indices,
            task.epoch,
            meta,
            task.number,
        )
        if data is None:
            meta.samples = 0
            return None
        columnar = self.source.columnar
        if self.transform is not None:
            rows = table_rows(data) if columnar else data
            data = self._timed(
                meta, "transform", samples, cpu, self._transform, rows, indices, task
            )
            columnar = False
        if self.unbatched:
            rows = table_rows(data) if columnar else data
            batch = self._timed(meta, "collate", samples, cpu, self._convert, rows[0])
        elif columnar and self.collate_fn is None:
            batch = self._timed(meta, "collate", samples, cpu, collate_table, data)
        else:
            rows = table_rows(data) if columnar else data
            # Rows not made from Arrow: what collate_rows would call, called directly.
            collate = self._collate_rows if self.source.columnar else self.collate_fn
            batch = self._timed(meta, "collate", samples, cpu, collate or default_collate, rows)
        meta.samples = len(indices)
        if self.decode is not None:
            batch, skipped = self._timed(
                meta, "decode", samples, cpu, self._decode, batch, indices, task.epoch
            )
            meta.skipped.extend(int(i) for i in skipped)
            meta.samples -= len(skipped)
        return batch

    def _make_plain(self, task: BatchTask, meta: BatchMeta) -> Any:
        """_make for samples collated as read (no transform, decoder, Arrow table or
        unbatched conversion), CPU not measured: both stages timed with three clock
        reads and no call between (the inline loader's cheap samples)."""
        start = time.perf_counter()
        try:
            data, indices = self._read_skipping(task.indices, task.epoch, meta, task.number)
        except Exception as exc:
            raise _StageError("read", blamed_samples(exc) or key_list(task.indices), exc) from exc
        read = time.perf_counter()
        if data is None:
            meta.stage_ms["read"] = 1e3 * (read - start)
            meta.samples = 0
            return None
        try:
            batch = (self.collate_fn or default_collate)(data)
        except Exception as exc:
            samples = blamed_samples(exc) or key_list(task.indices)
            raise _StageError("collate", samples, exc) from exc
        end = time.perf_counter()
        meta.stage_ms = {"read": 1e3 * (read - start), "collate": 1e3 * (end - read)}
        meta.samples = len(indices)
        return batch

    def _refill(self, task: BatchTask, meta: BatchMeta) -> Any:
        """Every sample of the batch failed: make it from the reserve instead, a batch's
        worth at a time, so every rank still yields a non-empty batch at this step."""
        reserve = key_list(task.reserve) if task.reserve is not None else []
        size = len(key_list(task.indices))
        for start in range(0, len(reserve), size):
            keys = reserve[start : start + size]
            if isinstance(task.indices, np.ndarray):
                keys = np.asarray(keys, dtype=np.int64)
            spare = BatchMeta()
            batch = self._make(BatchTask(task.number, keys, task.epoch), spare)
            for stage, ms in spare.stage_ms.items():
                meta.stage_ms[stage] = meta.stage_ms.get(stage, 0.0) + ms
            # A spare that fails is not counted here: it is a sample of the epoch, counted
            # by its own batch (counted here too, a bad row counted twice).
            if spare.samples > 0:
                meta.samples = meta.refilled = spare.samples
                return batch
        raise _StageError(
            "read",
            key_list(task.indices),
            DataError(
                f"Every sample of batch {task.number} failed, and so did the {len(reserve)} "
                "samples kept in reserve for it: under on_error='skip' a batch is never "
                "yielded empty (every rank must yield the same batches). Check the data: "
                "see the skipped samples in stats()."
            ),
        )

    def _collate_rows(self, rows: list[Any]) -> Any:
        return collate_rows(rows, self.collate_fn, arrow_rows=True)

    def _decode(self, batch: Any, indices: Any, epoch: int) -> Any:
        return self.decode(batch, indices, seed=self.seed, epoch=epoch)  # type: ignore[misc]

    def _convert(self, sample: Any) -> Any:
        if self.collate_fn is not None:
            return self.collate_fn(sample)
        from torch.utils.data import default_convert

        return default_convert(sample)

    def _transform(self, rows: list[Any], indices: Any, task: BatchTask) -> list[Any]:
        out = []
        for row, index in zip(rows, key_list(indices), strict=True):
            try:
                out.append(self.transform(row, sample_rng(self.seed, task.epoch, index)))
            except Exception as exc:
                tag_sample(exc, index)
                raise
        return out


def _fails_block(exc: BaseException) -> bool:
    """Does a sample's failure fail its whole block? Yes, unless the error says the
    fault is the sample's own (a null label)."""
    return not isinstance(exc, DataError) or exc.whole_block


def as_batch_of_one(indices: Any, key: Any) -> Any:
    """A batch holding `key` alone, of the same kind as `indices`."""
    return np.array([key], dtype=np.int64) if isinstance(indices, np.ndarray) else [key]
