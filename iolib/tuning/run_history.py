"""The run history on iolib's side: where it lives, a loader's workload key, and the
recorder that turns a run's batches into `predictors.history.RunRecord`s.

Where: `DataLoader(history=...)` (a path or fsspec URL, a `RunHistory`, False: none),
else $IOLIB_HISTORY (``off`` turns it off), else ``history`` under iolib's cache
directory. What a run records is what its telemetry already measured per batch (the
TunerStates the tuner reads), gathered off the per-batch path (on the tuner's thread)
and written at each epoch's end (on a thread of its own) and on close. A failed write
warns once and never stops training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
import warnings
from collections import deque
from pathlib import Path
from statistics import median
from typing import Any

from iolib.base.redact import redact_text, redact_url
from iolib.base.resources import cpu_count
from iolib.errors import ConfigError

log = logging.getLogger("iolib.tuning")

OFF = ("0", "off", "false", "no", "none")
_SAMPLES = 256  # per-batch samples kept per configuration (predictors.history.MAX_SAMPLES)
_SKIP = 2  # batches after a change took effect that still drain the old configuration
CLOSE_WAIT_S = 10.0  # the longest a closing loader waits for its history write
_MIN_BATCHES = 8  # a configuration measured on fewer says too little to record
_BLOCK = 8  # batches per block of the utilization's standard error (stalls come in runs)
# Blocks a record's utilization keeps: the whole of any run that fits a history file's
# samples many times over, bounded so a very long run holds no unbounded list.
_KEEP_BLOCKS = 1 << 16


@dataclasses.dataclass(frozen=True)
class HistoryAs:
    """`history=` for a loader whose records say they came from `kind` ("tune" for
    `iolib tune`'s runs, "bench" for `iolib bench`'s); `history` as `history=` takes it."""

    history: Any = None
    kind: str = "auto"


def check_history(value: Any) -> Any:
    """`history=` as given, if it is one of the accepted kinds; ConfigError otherwise."""
    if isinstance(value, HistoryAs):
        check_history(value.history)
        return value
    ok = value is None or isinstance(value, (bool, str, os.PathLike))
    ok = ok or (hasattr(value, "append") and hasattr(value, "runs"))
    if not ok:
        raise ConfigError(
            "`history` must be a path or fsspec URL, a predictors.history.RunHistory, "
            f"True (the default place) or False (no history). Found: {value!r}."
        )
    return value


def open_history(value: Any = None) -> Any:
    """The `RunHistory` that `history=value` names, or None when the history is off.
    None and True: $IOLIB_HISTORY, else ``history`` under the cache directory."""
    from predictors.history import RunHistory, default_location

    if isinstance(value, HistoryAs):
        return open_history(value.history)
    if value is False:
        return None
    if value is None or value is True:
        if os.environ.get("IOLIB_HISTORY", "").strip().lower() in OFF:
            return None
        return RunHistory(default_location())
    if isinstance(value, (str, os.PathLike)):
        return RunHistory(value)
    return value  # a RunHistory (with its own storage options)


def where(history: Any) -> str:
    """The history's location for people: credentials masked."""
    return redact_url(str(getattr(history, "location", history)))


def gpu_model() -> str:
    """The GPU model, read from the driver's files: asking CUDA would start it in this
    process, and fork-started workers cannot use CUDA after that."""
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        with contextlib.suppress(OSError):
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
    return f"{len(names)}x {names[0]}" if names else ""


def host_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # no psutil or no /proc: the key goes without it
        return 0


def decode_text(decode: Any) -> str:
    """Decode settings as short, stable text (no object addresses, no credentials)."""
    if decode is None:
        return ""
    kind = type(decode)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if dataclasses.is_dataclass(decode):
        fields = {f.name: getattr(decode, f.name) for f in dataclasses.fields(decode)}
        shown = {k: v for k, v in fields.items() if isinstance(v, (int, float, str, bool, tuple))}
        return redact_text(f"{name}{sorted(shown.items())}")
    settings = {
        k: v
        for k, v in sorted(vars(decode).items())
        if not k.startswith("_") and isinstance(v, (int, float, str, bool, tuple))
    } if hasattr(decode, "__dict__") else {}  # fmt: skip
    return redact_text(f"{name}{sorted(settings.items())}")


def workload_key(source: Any, batch_size: int, decode: Any, step_ms: float = 0.0) -> Any:
    """The `WorkloadKey` of a loader's source, batch size and decode on this host."""
    from predictors.history import WorkloadKey

    return WorkloadKey(
        dataset=str(source.fingerprint()),
        batch_size=int(batch_size or 1),
        decode=decode_text(decode),
        step_ms=float(step_ms),
        cores=cpu_count(),
        ram_bytes=host_memory(),
        gpu=gpu_model(),
    )


class _Segment:
    """One configuration's settled batches in this run: bounded per-batch samples for
    the record, and its utilization with the standard error by blocks of `_BLOCK`
    batches, as the tuner measures it (`predictors.measure.Measured`, every block of
    the run kept)."""

    def __init__(self) -> None:
        from predictors.measure import Measured

        self.service: deque = deque(maxlen=_SAMPLES)
        self.stall: deque = deque(maxlen=_SAMPLES)
        self.step: deque = deque(maxlen=_SAMPLES)
        self.read: deque = deque(maxlen=_SAMPLES)
        self.decode: deque = deque(maxlen=_SAMPLES)
        self.cpu: deque = deque(maxlen=_SAMPLES)
        self.batch_bytes: deque = deque(maxlen=_SAMPLES)
        self.measured = Measured(block=_BLOCK, keep=_KEEP_BLOCKS, unknown=0.1)

    @property
    def batches(self) -> int:
        return self.measured.batches

    def add(self, state: Any) -> None:
        self.service.append(state.service_ms)
        self.stall.append(state.stall_ms)
        self.step.append(state.step_ms)
        self.read.append(state.read_ms)
        self.decode.append(state.decode_ms)
        self.cpu.append(state.cpu_ms if state.cpu_ms is not None else state.transform_ms)
        self.batch_bytes.append(state.one_batch_bytes)
        self.measured.add(state)


class Recorder:
    """Gathers one run's settled batches per configuration (`add`, on the tuner's
    thread) and writes them to `history` (`flush`). Also finds the run's warm start."""

    def __init__(
        self,
        history: Any,
        *,
        source: Any,
        batch_size: int,
        decode: Any,
        rank: int,
        target: float,
        kind: str = "auto",
    ) -> None:
        from predictors.history import new_run_id

        self.history = history
        self.kind = kind
        self.key = workload_key(source, batch_size, decode)
        self.label = redact_text(
            f"{_describe(source)}, batch {batch_size}"
            + (f", decode {type(decode).__name__}" if decode is not None else "")
        )
        self.rank, self.target = int(rank), float(target)
        self.run_id = new_run_id()
        self.started = time.time()
        self.warm: Any = None
        self._segments: dict[tuple[int, int], _Segment] = {}
        self._since_change = 0
        self._last_config: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._warned = False
        self._writer: threading.Thread | None = None
        self._digest: str | None = None

    @classmethod
    def open(cls, value: Any, **options: Any) -> Recorder | None:
        """A recorder on the history `value` names (None when it is off or cannot open:
        a history never stops a run)."""
        if isinstance(value, HistoryAs):
            options.setdefault("kind", value.kind)
        try:
            history = open_history(value)
            return None if history is None else cls(history, **options)
        except Exception as exc:
            shown = where(value) if isinstance(value, (str, os.PathLike)) else "the default"
            warnings.warn(
                f"iolib: the run history at {shown} could not be opened "
                f"({type(exc).__name__}: {redact_text(str(exc))}); this run records none.",
                stacklevel=3,
            )
            return None

    def warm_start(
        self, target: float, memory_budget: float | None, max_workers: int | None
    ) -> Any:
        """The `WarmStart` this workload's history gives (None without one)."""
        from predictors.history import WarmStart

        try:
            found = self.history.find(self.key.base_digest())
            records = self.history.runs(found[0]) if found else []
            self.warm = WarmStart.from_records(
                records, target, memory_budget=memory_budget, max_workers=max_workers
            )
        except Exception as exc:  # an unreadable history is no history, never a failure
            self._warn_once(f"could not be read ({type(exc).__name__}: {exc})")
            self.warm = None
        return self.warm

    # -- gathering (the tuner's thread) ---------------------------------------------------
    def add(self, state: Any) -> None:
        """One batch's TunerState; the pipeline's and each epoch's first batch, and the
        first after a change took effect, are no sample of a configuration."""
        config = (state.workers, state.depth)
        if config != self._last_config:
            self._last_config, self._since_change = config, 0
        self._since_change += 1
        if state.batch_index == 0 or state.epoch_start or self._since_change <= _SKIP:
            return
        with self._lock:
            self._segments.setdefault(config, _Segment()).add(state)

    def records(self, settled: tuple[int, int] | None) -> list[Any]:
        """What this run measured so far, one record per configuration measured on
        `_MIN_BATCHES` or more batches, and the one the run holds now (`settled`) however
        few (its record says how many)."""
        from predictors.history import RunRecord

        with self._lock:
            segments = {
                k: v
                for k, v in self._segments.items()
                if v.batches >= _MIN_BATCHES or (k == settled and v.batches)
            }
            steps = [s for seg in segments.values() for s in seg.step]
            if not segments:
                return []
            if self._digest is None:  # fixed once: a later flush rewrites the same file
                key = dataclasses.replace(self.key, step_ms=median(steps))
                self._digest = key.digest()
            digest, base = self._digest, self.key.base_digest()
            out = []
            for (workers, depth), seg in segments.items():
                utilization = seg.measured.utilization
                out.append(
                    RunRecord(
                        workload=digest,
                        run_id=self.run_id,
                        rank=self.rank,
                        started=self.started,
                        source=self.kind,
                        workers=int(workers),
                        depth=int(depth),
                        batch_size=int(self.key.batch_size),
                        storage_ms=median(seg.read),
                        decode_ms=median(seg.decode),
                        cpu_ms=median(seg.cpu),
                        service_ms=list(seg.service),
                        lateness_ms=list(seg.stall),
                        utilization=utilization,
                        utilization_se=seg.measured.standard_error,
                        memory_bytes=round(depth * median(seg.batch_bytes)),
                        step_ms=median(seg.step),
                        batches=seg.batches,
                        target=self.target,
                        met=utilization >= self.target,
                        settled=(workers, depth) == settled,
                        label=self.label,
                        base=base,
                    )
                )
        return out

    # -- writing --------------------------------------------------------------------------
    def flush(self, settled: tuple[int, int] | None, *, wait: bool) -> None:
        """Write what the run measured so far (it replaces this run's earlier file): on a
        thread of its own, or here when `wait` (closing)."""
        records = self.records(settled)
        if not records:
            return
        if wait:
            # Closing waits for the write, but no longer than CLOSE_WAIT_S in all: a slow
            # remote history must not hold up the end of training.
            deadline = time.monotonic() + CLOSE_WAIT_S
            if self._writer is not None:
                self._writer.join(timeout=CLOSE_WAIT_S)
            final = threading.Thread(
                target=self._write, args=(records,), name="iolib-history", daemon=True
            )
            final.start()
            final.join(timeout=max(deadline - time.monotonic(), 0.0))
            if final.is_alive():
                log.warning(
                    "the run history's write took over %.0f s; it goes on in the background",
                    CLOSE_WAIT_S,
                )
            return
        if self._writer is not None and self._writer.is_alive():
            return  # the last epoch's write is still going: the next flush carries this
        self._writer = threading.Thread(
            target=self._write, args=(records,), name="iolib-history", daemon=True
        )
        self._writer.start()

    def _write(self, records: list[Any]) -> None:
        with self._write_lock:
            try:
                self.history.append(records, replace=True)
            except Exception as exc:  # never into the training loop
                self._warn_once(f"could not be written ({type(exc).__name__}: {exc})")

    def _warn_once(self, what: str) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"iolib: the run history at {where(self.history)} {redact_text(what)}; "
            "training goes on without it.",
            stacklevel=2,
        )

    def report(self) -> dict[str, Any]:
        """What `stats()["tuner"]["history"]` shows."""
        warm = self.warm
        return {
            "location": where(self.history),
            "workload": None if warm is None else warm.workload,
            "runs": 0 if warm is None else warm.runs,
            "started_from": None if warm is None else warm.describe(),
            "run_id": self.run_id,
        }


def _describe(source: Any) -> str:
    try:
        return str(source.describe())
    except Exception:
        return type(source).__name__


def record_measured(
    history: Any,
    loader: Any,
    *,
    kind: str,
    workers: int,
    depth: int,
    utilization: float,
    batches: int,
    step_ms: float,
    target: float | None = None,
    lateness_ms: list[float] | None = None,
) -> None:
    """Record one fixed configuration's measurement (an `iolib tune` verification run, an
    `iolib bench` configuration) from `loader.stats()`; a failure warns, never raises."""
    from predictors.history import RunRecord

    try:
        recorder = Recorder.open(
            history, source=loader.source, batch_size=loader.batch_size or 1,
            decode=loader.decode, rank=getattr(loader, "rank", 0), target=target or 0.0,
            kind=kind,
        )  # fmt: skip
        if recorder is None or not batches or not math.isfinite(utilization):
            return
        stats = loader.stats()
        stages, cpu = stats.get("stage_ms", {}), stats.get("stage_cpu_ms", {})
        key = dataclasses.replace(recorder.key, step_ms=step_ms)
        utilization = min(max(float(utilization), 0.0), 1.0)
        met = target is not None and utilization >= target
        late = [1e3 * s for s in (lateness_ms or []) if math.isfinite(s) and s >= 0]
        record = RunRecord(
            workload=key.digest(), run_id=recorder.run_id, rank=recorder.rank,
            started=recorder.started, source=kind, workers=int(workers), depth=int(depth),
            batch_size=int(key.batch_size), storage_ms=float(stages.get("read", 0.0)),
            decode_ms=float(stages.get("decode", 0.0)),
            cpu_ms=float(sum(cpu.values()) if cpu else stages.get("transform", 0.0)),
            lateness_ms=late, utilization=utilization,
            utilization_se=0.1,  # unknown: one run of a fixed configuration, no blocks kept
            memory_bytes=int(depth * stats.get("batch_bytes", 0)), step_ms=float(step_ms),
            batches=int(batches), target=float(target or 0.0), met=met, settled=True,
            label=recorder.label, base=key.base_digest(),
        )  # fmt: skip
        recorder.history.append([record])
    except Exception as exc:  # the measurement stands without its record
        warnings.warn(
            f"iolib: a run could not be recorded in the history ({type(exc).__name__}: "
            f"{redact_text(str(exc))}).",
            stacklevel=2,
        )


def next_run_of(
    history: Any,
    loader: Any,
    *,
    target: float,
    memory_budget: float | None,
    max_workers: int | None,
) -> dict[str, Any] | None:
    """What the next `prefetch="auto"` run of `loader`'s workload will try, read from the
    history as it stands (`predictors.explore.next_run`); None when the history is off
    or cannot be read."""
    from predictors.explore import next_run

    try:
        recorder = Recorder.open(
            history, source=loader.source, batch_size=loader.batch_size or 1,
            decode=loader.decode, rank=getattr(loader, "rank", 0), target=target,
        )  # fmt: skip
        if recorder is None:
            return None
        found = recorder.history.find(recorder.key.base_digest())
        records = recorder.history.runs(found[0]) if found else []
        return next_run(records, target, budget=memory_budget, max_workers=max_workers)
    except Exception as exc:  # the report goes on without it
        log.debug("no next-run plan (%s: %s)", type(exc).__name__, exc)
        return None
