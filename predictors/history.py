"""The run history: what earlier runs of the same workload measured, per configuration.

A training job is rerun on the same data, step and machine (restarts, sweeps, daily
retrains, every rank of a multi-node job); what a cold run cannot know, the next run can
read here. One Parquet file per run and rank, written whole under a temporary name and
renamed (a single PUT on object stores), so concurrent writers never share a file and a
reader never sees half of one. Any fsspec URL works; the default is on local disk under
iolib's cache directory.

This module knows numbers, not loaders: the parts of a `WorkloadKey` are passed in as
plain values (iolib computes the dataset fingerprint). Reading is defensive: a truncated,
empty, foreign or crafted file is skipped with a `HistoryWarning` that names it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import threading
import time
import uuid
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "iolib.history/1"
# How many samples of each per-batch list a record keeps: enough for the tails a warm
# plan pools, small enough that a file stays a few kilobytes.
MAX_SAMPLES = 256
# A configuration measured on fewer batches says too little to start a run from.
MIN_BATCHES = 8
# The last K runs of a workload are kept and read; older files are removed on append.
DEFAULT_MAX_RUNS = 32
# A file larger than this, or with more rows, is no history iolib wrote.
_MAX_FILE_BYTES = 16 << 20
_MAX_ROWS = 4096
# The pooled service samples a warm plan reads (the most recent): the forecast scores
# every candidate against each, so more would slow a plan, not sharpen it.
MAX_POOLED = 2048
# A configuration the history says met the target was measured on this many batches
# (over its runs) at least, when any was; else any measurement meeting it counts.
MET_BATCHES = 16
# A warm start's "met" is first judged on the pooled measurement less this many of its
# standard errors (each record's at least MET_SE_FLOOR): a lucky calm stretch that
# met on the mean is no start a burst leaves alone.
MET_MARGIN_SE = 1.0
MET_SE_FLOOR = 0.01
_SUFFIX = ".parquet"
_BASES = "bases"  # bases/BASE/WORKLOAD: which workloads share all but the step
_META_KEY = b"iolib.history"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class HistoryWarning(UserWarning):
    """A history file was skipped (named in the message), or a write failed."""


def default_location() -> str:
    """$IOLIB_HISTORY, else ``history`` under $IOLIB_CACHE_DIR, else ~/.cache/iolib/history."""
    env = os.environ.get("IOLIB_HISTORY")
    if env:
        return env
    root = os.environ.get("IOLIB_CACHE_DIR") or str(Path.home() / ".cache" / "iolib")
    return str(Path(root) / "history")


def step_bucket(step_ms: float) -> int:
    """Step times within about a factor of 1.4 share a bucket (the nearest half power of two),
    so run-to-run jitter of a step keeps the key while another model size does not."""
    if not math.isfinite(step_ms) or step_ms <= 0:
        return 0
    return round(2 * math.log2(step_ms))


@dataclass(frozen=True)
class WorkloadKey:
    """What makes two runs the same workload. All plain values; `digest()` is stable across
    processes, machines and Python versions."""

    dataset: str  # the dataset's fingerprint, as checkpoints compute it
    batch_size: int
    decode: str = ""  # decode settings, as short text ("" when none)
    step_ms: float = 0.0  # the consumer's step time; only its bucket enters the key
    cores: int = 0
    ram_bytes: int = 0  # only whole GiB enter the key
    gpu: str = ""  # the GPU model, "" when none

    def parts(self) -> dict[str, Any]:
        """The values the digest is made of."""
        return {
            "dataset": str(self.dataset),
            "batch_size": int(self.batch_size),
            "decode": str(self.decode),
            "step_bucket": step_bucket(float(self.step_ms)),
            "cores": int(self.cores),
            "ram_gib": round(int(self.ram_bytes) / (1 << 30)),
            "gpu": str(self.gpu),
        }

    def digest(self) -> str:
        """16 hex digits naming the workload (the history's directory name)."""
        return _digest(self.parts())

    def base_digest(self) -> str:
        """The digest of every part but the step: what a run knows before its first step
        (`RunHistory.find` looks a workload up by it)."""
        parts = self.parts()
        del parts["step_bucket"]
        return _digest(parts)


def _digest(parts: dict[str, Any]) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunRecord:
    """What one run measured at one configuration (one row of a history file)."""

    workload: str  # WorkloadKey.digest()
    run_id: str
    rank: int
    started: float  # unix seconds
    source: str  # "auto" | "tune" | "bench"
    workers: int
    depth: int
    batch_size: int
    storage_ms: float  # medians of the service's parts per batch
    decode_ms: float
    cpu_ms: float
    service_ms: list[float] = field(default_factory=list)  # per-batch samples, bounded
    lateness_ms: list[float] = field(default_factory=list)
    utilization: float = 0.0
    utilization_se: float = 0.0
    memory_bytes: int = 0
    step_ms: float = 0.0
    batches: int = 0
    target: float = 0.0
    met: bool = False
    settled: bool = False  # the configuration the run settled on, not one it passed through
    label: str = ""  # a short human description of the workload (no credentials)
    base: str = ""  # WorkloadKey.base_digest(): the workload but its step


_INT = ("rank", "workers", "depth", "batch_size", "memory_bytes", "batches")
_FLOAT = ("started", "storage_ms", "decode_ms", "cpu_ms", "utilization", "utilization_se")
_FLOAT += ("step_ms", "target")
_STR = ("workload", "run_id", "source", "label", "base")
_BOOL = ("met", "settled")
_LIST = ("service_ms", "lateness_ms")
_FIELDS = tuple(f.name for f in dataclasses.fields(RunRecord))
_SOURCES = ("auto", "tune", "bench")


def _schema():  # pyarrow is imported lazily: importing predictors stays cheap
    import pyarrow as pa

    types = {}
    for name in _FIELDS:
        if name in _INT:
            types[name] = pa.int64()
        elif name in _FLOAT:
            types[name] = pa.float64()
        elif name in _BOOL:
            types[name] = pa.bool_()
        elif name in _LIST:
            types[name] = pa.list_(pa.float64())
        else:
            types[name] = pa.string()
    return pa.schema([(n, types[n]) for n in _FIELDS], metadata={_META_KEY: FORMAT.encode()})


def _bounded(values: Iterable[float]) -> list[float]:
    out = [float(v) for v in values]
    if len(out) > MAX_SAMPLES:  # keep the most recent samples
        out = out[-MAX_SAMPLES:]
    return out


def _check(record: RunRecord) -> str | None:
    """Why `record` is no record iolib would write, or None when it is sound."""
    if not re.fullmatch(r"[0-9a-f]{16}", record.workload or ""):
        return f"workload {record.workload!r} is no digest"
    if record.base and not re.fullmatch(r"[0-9a-f]{16}", record.base):
        return f"base {record.base!r} is no digest"
    if record.source not in _SOURCES:
        return f"source {record.source!r} is none of {_SOURCES}"
    if record.workers < 0 or record.workers > 4096:
        return f"workers {record.workers} out of range"
    if record.depth < 0 or record.depth > 1 << 16:
        return f"depth {record.depth} out of range"
    if record.batch_size < 1 or record.rank < 0 or record.batches < 0:
        return "batch size, rank or batch count out of range"
    if record.memory_bytes < 0:
        return f"memory {record.memory_bytes} is negative"
    for name in _FLOAT:
        value = getattr(record, name)
        if not math.isfinite(value) or value < 0:
            return f"{name} is {value}"
    if record.utilization > 1 or record.target > 1:
        return f"utilization {record.utilization} / target {record.target} out of range"
    for name in _LIST:
        values = getattr(record, name)
        if len(values) > MAX_SAMPLES:
            return f"{name} holds {len(values)} samples (at most {MAX_SAMPLES})"
        if not all(math.isfinite(v) and v >= 0 for v in values):
            return f"{name} holds a negative or non-finite sample"
    return None


def _filename(record: RunRecord) -> str:
    started_ns = round(record.started * 1e9)
    run = _SAFE.sub("_", record.run_id)[:64] or "run"
    return f"{started_ns:020d}-{run}-r{record.rank}{_SUFFIX}"


class RunHistory:
    """The runs recorded at `location` (a path or any fsspec URL; None: `default_location()`).

    `append` writes one file per run and rank; records appended again for the same run and
    rank by this object join the earlier ones in that run's file (rewritten whole).
    `runs(workload)` reads the last `max_runs` runs of a workload, skipping (with a
    `HistoryWarning` naming it) any file that is not a sound history file.
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        *,
        max_runs: int = DEFAULT_MAX_RUNS,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        import fsspec

        self.location = str(location) if location is not None else default_location()
        self.max_runs = max(1, int(max_runs))
        # The options open the store; they are never written into a file.
        self._fs, root = fsspec.core.url_to_fs(self.location, **(storage_options or {}))
        self._root = root.rstrip("/")
        self._local = "file" in _protocols(self._fs)
        self._written: dict[tuple[str, str, int], list[RunRecord]] = {}
        self._skipped: set[str] = set()
        self._lock = threading.Lock()

    # ---- writing ----

    def append(self, records: Iterable[RunRecord], *, replace: bool = False) -> list[str]:
        """Write `records` (one file per workload, run and rank); returns the paths written.
        `replace`: they replace what this object wrote for their run and rank before (a
        run that records its measurement so far at each epoch's end). Raises ValueError
        naming the first unsound record; storage errors propagate."""
        groups: dict[tuple[str, str, int], list[RunRecord]] = {}
        for record in records:
            record = dataclasses.replace(
                record,
                service_ms=_bounded(record.service_ms),
                lateness_ms=_bounded(record.lateness_ms),
            )
            why = _check(record)
            if why:
                raise ValueError(f"run history: refusing a record of run {record.run_id}: {why}")
            groups.setdefault((record.workload, record.run_id, record.rank), []).append(record)
        written = []
        for key, new in groups.items():
            with self._lock:
                rows = new if replace else self._written.get(key, []) + new
                self._written[key] = rows
            written.append(self._write(rows))
            self._prune(key[0])
        return written

    def _write(self, rows: list[RunRecord]) -> str:
        import pyarrow as pa
        import pyarrow.parquet as pq

        first = rows[0]
        directory = f"{self._root}/{first.workload}"
        path = f"{directory}/{_filename(first)}"
        table = pa.Table.from_pylist([dataclasses.asdict(r) for r in rows], schema=_schema())
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
        if self._local:
            os.makedirs(directory, exist_ok=True)
            temp = f"{directory}/.{uuid.uuid4().hex}.tmp"
            with open(temp, "wb") as f:
                f.write(data)
            os.replace(temp, path)  # atomic: a reader sees the old file or the new one
        else:
            self._fs.makedirs(directory, exist_ok=True)
            self._fs.pipe_file(path, data)  # one PUT: an object appears whole or not at all
        if first.base:
            self._mark(first.base, first.workload)
        return path

    def _mark(self, base: str, workload: str) -> None:
        """An empty file `bases/BASE/WORKLOAD`: `find` lists one folder, not every file."""
        marker = f"{self._root}/{_BASES}/{base}/{workload}"
        if self._fs.exists(marker):
            return
        if self._local:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            Path(marker).touch()
        else:
            self._fs.pipe_file(marker, b"")

    def _prune(self, workload: str) -> None:
        """Remove the files of runs older than the last `max_runs` (best effort)."""
        files = self._files(workload)
        runs = _runs_of(files)
        if len(runs) <= self.max_runs:
            return
        keep = set(runs[-self.max_runs :])
        for path in files:
            if _run_of(path) not in keep:
                with contextlib.suppress(FileNotFoundError, OSError):  # removed by another
                    self._fs.rm_file(path)

    # ---- reading ----

    def workloads(self) -> list[str]:
        """The digests of the workloads that have at least one run file, sorted."""
        try:
            entries = self._fs.ls(self._root, detail=True)
        except (FileNotFoundError, OSError):
            return []
        out = []
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            is_dir = entry.get("type") == "directory"
            if is_dir and re.fullmatch(r"[0-9a-f]{16}", name) and self._files(name):
                out.append(name)
        return sorted(out)

    def runs(self, workload: str, *, max_runs: int | None = None) -> list[RunRecord]:
        """The records of the last `max_runs` runs of `workload` (default: this history's
        bound), oldest first; unsound files are skipped with a warning naming them."""
        if not re.fullmatch(r"[0-9a-f]{16}", workload):
            raise ValueError(f"run history: {workload!r} is no workload digest")
        limit = self.max_runs if max_runs is None else max(1, int(max_runs))
        files = self._files(workload)
        keep = set(_runs_of(files)[-limit:])
        records: list[RunRecord] = []
        for path in files:
            if _run_of(path) in keep:
                records.extend(self._read(path, workload))
        records.sort(key=lambda r: (r.started, r.run_id, r.rank))
        return records

    def find(self, base: str) -> list[str]:
        """The workloads whose runs share `base` (`WorkloadKey.base_digest()`: all but the
        step) and still hold a run, the most recently run first."""
        if not re.fullmatch(r"[0-9a-f]{16}", base):
            raise ValueError(f"run history: {base!r} is no workload digest")
        try:
            markers = self._fs.ls(f"{self._root}/{_BASES}/{base}", detail=False)
        except (FileNotFoundError, NotADirectoryError, OSError):
            return []
        found = []
        for marker in markers:
            workload = marker.rstrip("/").rsplit("/", 1)[-1]
            files = self._files(workload) if re.fullmatch(r"[0-9a-f]{16}", workload) else []
            if files:  # names start with the start time: the newest last
                found.append((files[-1].rsplit("/", 1)[-1], workload))
        return [workload for _, workload in sorted(found, reverse=True)]

    def clear(self, workload: str | None = None) -> int:
        """Remove one workload's runs (all workloads when None); returns files removed."""
        names = [workload] if workload is not None else self.workloads()
        removed = 0
        for name in names:
            if not re.fullmatch(r"[0-9a-f]{16}", name):
                raise ValueError(f"run history: {name!r} is no workload digest")
            directory = f"{self._root}/{name}"
            try:
                entries = self._fs.ls(directory, detail=False)
            except (FileNotFoundError, OSError):
                continue
            for path in entries:
                try:
                    self._fs.rm_file(path)
                    removed += 1
                except (FileNotFoundError, OSError):
                    pass
            # Not empty (a writer arrived) or the store has no directories: leave it.
            with contextlib.suppress(FileNotFoundError, OSError):
                self._fs.rmdir(directory)
        if workload is None:  # the index of workloads by base goes with them
            with contextlib.suppress(FileNotFoundError, OSError):
                self._fs.rm(f"{self._root}/{_BASES}", recursive=True)
        with self._lock:
            self._written = {k: v for k, v in self._written.items() if workload not in (None, k[0])}
        return removed

    def _files(self, workload: str) -> list[str]:
        try:
            names = self._fs.ls(f"{self._root}/{workload}", detail=False)
        except (FileNotFoundError, NotADirectoryError, OSError):
            return []
        out = []
        for name in names:
            base = name.rsplit("/", 1)[-1]
            if base.endswith(_SUFFIX) and not base.startswith("."):
                out.append(name)
        return sorted(out)

    def _read(self, path: str, workload: str) -> list[RunRecord]:
        try:
            return _read_file(self._fs, path, workload)
        except Exception as exc:  # a broken file must never break a run: skip it, say which
            if path not in self._skipped:  # once per file and history object
                self._skipped.add(path)
                shown = _unstrip(self._fs, path)
                warnings.warn(f"run history: skipped {shown}: {exc}", HistoryWarning, stacklevel=3)
            return []


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _unstrip(fs: Any, path: str) -> str:
    """The file's URL for a message, any user info (a credential) in it masked."""
    with contextlib.suppress(Exception):
        path = fs.unstrip_protocol(path)
    path = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1***@", path)
    return re.sub(r"(^|/)[^/@\s]+:[^/@\s]*@", r"\1***@", path)  # user:secret@ anywhere


def _run_of(path: str) -> str:
    """The run id part of a file name (without its start time and rank): the ranks of
    one job share a run id (`new_run_id`), so their files count as one run."""
    base = path.rsplit("/", 1)[-1][: -len(_SUFFIX)]
    return base.split("-", 1)[-1].rsplit("-r", 1)[0]


def _runs_of(files: list[str]) -> list[str]:
    """The runs of `files`, oldest first (by their first file: names start with the
    start time)."""
    first: dict[str, str] = {}
    for path in sorted(files, key=lambda p: p.rsplit("/", 1)[-1]):
        first.setdefault(_run_of(path), path.rsplit("/", 1)[-1])
    return sorted(first, key=lambda run: first[run])


def _read_file(fs: Any, path: str, workload: str) -> list[RunRecord]:
    """The records of one file; raises ValueError saying what is wrong with it."""
    import pyarrow.parquet as pq

    size = fs.size(path)
    if not size:
        raise ValueError("empty file")
    if size > _MAX_FILE_BYTES:
        raise ValueError(f"{size} bytes is no history file")
    with fs.open(path, "rb") as f:
        data = f.read(_MAX_FILE_BYTES + 1)
    import pyarrow as pa

    parquet = pq.ParquetFile(pa.BufferReader(data))
    meta = parquet.metadata
    if (parquet.schema_arrow.metadata or {}).get(_META_KEY) != FORMAT.encode():
        raise ValueError(f"not written as {FORMAT}")
    if meta.num_rows > _MAX_ROWS:
        raise ValueError(f"{meta.num_rows} rows is no history file")
    # A crafted list of 10^9 zeros compresses to nothing: bound the values before reading.
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            if column.num_values > (MAX_SAMPLES + 1) * max(1, meta.num_rows):
                raise ValueError(f"column {column.path_in_schema} holds {column.num_values} values")
    names = set(parquet.schema_arrow.names)
    missing = [n for n in _FIELDS if n not in names]
    if missing:
        raise ValueError(f"foreign schema (no column {', '.join(missing)})")
    table = parquet.read(columns=list(_FIELDS)).cast(_schema())
    records = []
    for row in table.to_pylist():
        if any(row[n] is None for n in _FIELDS):
            raise ValueError("a value is missing")
        record = RunRecord(**row)
        why = _check(record)
        if why:
            raise ValueError(why)
        if record.workload != workload:
            raise ValueError(f"holds workload {record.workload}, not {workload}")
        records.append(record)
    return records


def _launcher() -> str:
    """The parent process (torchrun's agent for its ranks) as pid and start time: the
    ranks of one launch share it, two launches never do, even with one `--rdzv-id`."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/stat", "rb") as f:
            started = f.read().rsplit(b")", 1)[1].split()[19].decode()  # field 22
    except (OSError, IndexError):
        started = ""
    return f"{ppid}:{started}"


def new_run_id(environ: dict[str, str] | None = None) -> str:
    """A run id unique across processes and hosts, ordered by time for people reading it.
    Under torchrun (``TORCHELASTIC_RUN_ID``, with ``TORCHELASTIC_RESTART_COUNT``) every
    rank of one launch on a node, and of one restart of it, gets the same id: they are
    one run of the workload (for the last K runs and the model's leave-one-run-out
    weight). The launching agent is part of the id, because scripts often pass the same
    `--rdzv-id` to every launch; the nodes of a multi-node job count as a run each."""
    env = os.environ if environ is None else environ
    job = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if job and job.lower() != "none":  # torchrun's default id when none is given
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0").strip() or "0"
        launch = f"{job}\0{restart}\0{_launcher()}"
        return f"elastic-{hashlib.sha256(launch.encode()).hexdigest()[:12]}"
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class WarmStart:
    """What a run of a workload with history starts from (`QueueingTuner(warm=...)`).

    `start`: the configuration whose pooled measurement met the target with the least
    memory (else the one the last run settled on); `relative`: every earlier batch's
    service over its record's mean, pooled (bursts and tails included) for the plan's
    lateness; `reference_ms`: service samples measured at `start`, the change detector's
    reference (a run that serves otherwise is another regime); `step_ms`: the step the
    history measured (a run whose step differs by more than `step_factor` sets it aside).
    """

    workload: str
    start: tuple[int, int]
    met: bool
    runs: int
    relative: tuple[float, ...]
    reference_ms: tuple[float, ...]
    step_ms: float
    utilization: float
    memory_bytes: int
    records: tuple[RunRecord, ...] = ()
    step_factor: float = 1.5

    @classmethod
    def from_records(
        cls,
        records: Iterable[RunRecord],
        target: float,
        *,
        memory_budget: float | None = None,
        max_workers: int | None = None,
    ) -> WarmStart | None:
        """The warm start these records give for `target` (None without any usable one).
        A configuration's measurement is the mean over every run that measured it."""
        usable = [
            r
            for r in records
            if r.batches >= MIN_BATCHES
            and (memory_budget is None or r.memory_bytes <= memory_budget)
            and (max_workers is None or r.workers <= max_workers)
        ]
        if not usable:
            return None
        by_config: dict[tuple[int, int], list[RunRecord]] = {}
        for r in usable:
            by_config.setdefault((r.workers, r.depth), []).append(r)

        def mean(rs: list[RunRecord], name: str) -> float:
            return sum(getattr(r, name) for r in rs) / len(rs)

        def measured(rs: list[RunRecord]) -> float:
            # Weighted by batches: a few batches between two bursts meet by chance.
            return sum(r.utilization * r.batches for r in rs) / sum(r.batches for r in rs)

        def lower(rs: list[RunRecord]) -> float:
            inv = sum(1.0 / max(r.utilization_se, MET_SE_FLOOR) ** 2 for r in rs)
            return measured(rs) - MET_MARGIN_SE / math.sqrt(inv)

        long = {c for c, rs in by_config.items() if sum(r.batches for r in rs) >= MET_BATCHES}
        met = (
            [c for c in long if lower(by_config[c]) >= target]
            or [c for c in long if measured(by_config[c]) >= target]
            or [c for c, rs in by_config.items() if mean(rs, "utilization") >= target]
        )
        if met:  # least memory, then fewer workers, then the most recently measured
            start = min(
                met,
                key=lambda c: (
                    mean(by_config[c], "memory_bytes"),
                    c[0],
                    -max(r.started for r in by_config[c]),
                ),
            )
        else:
            last = max(usable, key=lambda r: (r.started, r.settled))
            settled = [r for r in usable if r.run_id == last.run_id and r.settled]
            start = ((settled or [last])[-1].workers, (settled or [last])[-1].depth)
        relative: list[float] = []
        for r in usable:
            if r.service_ms:
                m = sum(r.service_ms) / len(r.service_ms)
                if m > 0:
                    relative.extend(v / m for v in r.service_ms)
        at_start = by_config[start]
        reference = [v for r in at_start for v in r.service_ms]
        steps = sorted(r.step_ms for r in usable if r.step_ms > 0)
        return cls(
            workload=usable[-1].workload,
            start=start,
            met=bool(met),
            runs=len({r.run_id for r in usable}),
            relative=tuple(relative[-MAX_POOLED:]),
            reference_ms=tuple(reference[-64:]),
            step_ms=steps[len(steps) // 2] if steps else 0.0,
            utilization=mean(at_start, "utilization"),
            memory_bytes=round(mean(at_start, "memory_bytes")),
            records=tuple(usable),
        )

    def describe(self) -> str:
        """One line for logs and reports."""
        w, d = self.start
        how = "met the target with the least memory" if self.met else "was settled on last"
        return (
            f"warm start from {self.runs} earlier run(s): {w} worker(s), depth {d} {how} "
            f"(measured {self.utilization:.2f})"
        )
