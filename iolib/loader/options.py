"""The DataLoader's arguments, validated once: torch's rules and exception types, then
iolib's additions.

Why frozen dataclasses: the loader, a stage loader and a resumed run all need the same
validated configuration, and rebuilding a loader with one argument changed
(`DataLoader.replace`) starts from `arguments()`. torch's arguments stay flat; iolib's
own are grouped by what they change (`OrderOptions`: which samples in which order;
`SampleOptions`: what a sample becomes; `PaceOptions`: pace and memory, never content),
as grain groups its `ReadOptions` and `MultiprocessingOptions`. Every check raises
ConfigError, a ValueError, as torch raises ValueError for the same mistakes.
"""

from __future__ import annotations

import multiprocessing.context
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from iolib.base.resources import cpu_count, parse_bytes
from iolib.decode.protocol import as_decoder
from iolib.errors import ConfigError, OnError
from iolib.plan import SHUFFLE_MODES
from iolib.tuning.run_history import check_history

WORKER_MODES = ("auto", "thread", "process")


def _flag(name: str, value: Any) -> bool:
    """A flag by its truth, as torch reads it (True, 3, np.bool_), but no strings:
    `"no"` is truthy, and a flag given as text is a mistake, not a choice."""
    if isinstance(value, (bool, np.bool_, numbers.Number)):
        return bool(value)
    raise ConfigError(f"`{name}` must be True or False. Found: {value!r}.")


def _count(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"`{name}` must be an integer >= {minimum}. Found: {value!r}.")
    if value < minimum:
        rule = "should be non-negative" if minimum == 0 else f"should be >= {minimum}"
        raise ConfigError(f"{name} option {rule} (an integer >= {minimum}). Found: {value!r}.")
    return int(value)


def shuffle_mode(shuffle: Any) -> str:
    """iolib's mode names as given; any other value by its truth, as torch reads it."""
    if isinstance(shuffle, str):
        if shuffle not in SHUFFLE_MODES:
            raise ConfigError(
                f"`shuffle` must be True, False, 'global' or 'block'. Found: {shuffle!r}."
            )
        return shuffle
    if shuffle is None:
        return "none"
    return "global" if _flag("shuffle", shuffle) else "none"


@dataclass(frozen=True)
class OrderOptions:
    """Which samples each rank reads, in which order: iolib's own order (a user's sampler
    decides both itself). ``seed`` None is resolved by LoaderOptions (the generator's
    initial seed, else ``torch.initial_seed()``)."""

    seed: int | None = None
    rank: int | None = None  # None: from torch.distributed or torchrun
    world_size: int | None = None
    shuffle_window: int = 8  # row groups shuffled together by shuffle="block"

    def __post_init__(self) -> None:
        if self.seed is not None:
            object.__setattr__(self, "seed", _count("seed", self.seed, minimum=0))
        _count("shuffle_window", self.shuffle_window, minimum=1)


@dataclass(frozen=True)
class SampleOptions:
    """How a sample becomes what a batch holds: ``transform(sample, rng)``, a decoder
    (e.g. ``iolib.decode.images.ImagePipeline``) and what a bad sample does ("raise", "skip")."""

    transform: Callable[[Any, np.random.Generator], Any] | None = None
    decode: Any = None
    on_error: OnError | str = "raise"

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_error", OnError.parse(self.on_error))
        object.__setattr__(self, "decode", as_decoder(self.decode))


@dataclass(frozen=True)
class PaceOptions:
    """How batches are made: worker kind and read-ahead. They change pace and memory,
    never content. ``prefetch``: batches in flight or ready (an int), "auto" (the learned
    tuner) or a tuner object; ``memory_budget`` (bytes or "2GiB") is parsed once here;
    ``history``: where a tuned run records itself and warm-starts from
    (iolib.tuning.run_history)."""

    worker_mode: str = "auto"
    prefetch: int | str | Any = None
    target_utilization: float = 0.9
    memory_budget: int | str | None = None
    history: Any = None

    def __post_init__(self) -> None:
        if self.worker_mode not in WORKER_MODES:
            raise ConfigError(
                f"`worker_mode` must be one of {WORKER_MODES}. Found: {self.worker_mode!r}."
            )
        prefetch = self.prefetch
        if prefetch is not None and not (
            prefetch == "auto" or hasattr(prefetch, "decide") or isinstance(prefetch, int)
        ):
            raise ConfigError(
                "`prefetch` must be a positive integer (batches in flight or ready), 'auto' "
                f"(the learned tuner) or a tuner with a decide() method. Found: {prefetch!r}."
            )
        if isinstance(prefetch, int):
            _count("prefetch", prefetch, minimum=1)
        target = self.target_utilization
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
            raise ConfigError(
                "`target_utilization` must be a number strictly between 0 and 1 (the share "
                f"of time the GPU should compute, e.g. 0.9). Found: {target!r}."
            )
        object.__setattr__(self, "memory_budget", parse_bytes(self.memory_budget))
        check_history(self.history)

    @property
    def tuned(self) -> bool:
        """A tuner sets the depth and worker count (num_workers is then its upper bound)."""
        return self.prefetch is not None and not isinstance(self.prefetch, int)


@dataclass(frozen=True)
class TunerSpec:
    """The online tuner a loader runs: "auto" (the learned one) or an object with
    decide(), its utilization goal, memory budget (bytes) and the CPUs it plans for."""

    tuner: Any
    target: float
    memory_budget: int | None
    cpus: int
    history: Any = None  # DataLoader(history=...): None is the default place, False none


@dataclass(frozen=True)
class Readahead:
    """`prefetch` resolved: the depth to begin with (batches in flight or ready), and the
    tuner that may change it and the worker count (None: both stay as given)."""

    depth: int
    tuner: TunerSpec | None = None


# iolib's own arguments, by group: each group's fields are the DataLoader's keywords.
GROUPS = {"order": OrderOptions, "sample": SampleOptions, "pace": PaceOptions}


@dataclass(frozen=True)
class LoaderOptions:
    """Every DataLoader argument but the dataset: torch's, flat and with its defaults,
    then iolib's own in three groups (`order`, `sample`, `pace`). Values are checked and
    normalized at construction: a LoaderOptions is always valid. Build one from the
    constructor's keywords with `from_arguments`; `arguments()` gives them back."""

    batch_size: int | None = 1
    shuffle: Any = None
    sampler: Any = None
    batch_sampler: Any = None
    num_workers: int = 0
    collate_fn: Callable[[list[Any]], Any] | None = None
    pin_memory: bool = False
    drop_last: bool = False
    timeout: float = 0
    worker_init_fn: Callable[[int], None] | None = None
    multiprocessing_context: Any = None
    generator: torch.Generator | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory_device: str = ""
    in_order: bool = True
    order: OrderOptions = OrderOptions()
    sample: SampleOptions = SampleOptions()
    pace: PaceOptions = PaceOptions()
    iterable: bool = False  # the dataset is an IterableDataset (set by from_arguments)
    datapipe: bool = False  # ... and an IterDataPipe, which takes `shuffle` (as in torch)
    # shuffle="global" spelled out keeps a full shuffle where shuffle=True would let a
    # streaming source shuffle in windows (sampling.EpochPlan.windowed_ok).
    full_shuffle: bool = False
    # `seed` was not given: it came from torch.initial_seed() (set here); a loaded state's
    # seed then replaces it, so a resume is exact whatever the new process's torch seed.
    seed_from_torch: bool = False
    readahead: Readahead = field(init=False)  # `pace.prefetch` resolved once

    @classmethod
    def from_arguments(
        cls, dataset: Any, arguments: dict[str, Any], **derived: Any
    ) -> LoaderOptions:
        """The DataLoader's keywords (all but `dataset`), grouped; `derived` sets the
        flags a rebuilt loader keeps (`full_shuffle`, `seed_from_torch`)."""
        flat = dict(arguments)
        groups = {
            name: kind(**{f.name: flat.pop(f.name) for f in fields(kind) if f.name in flat})
            for name, kind in GROUPS.items()
        }
        shuffle = flat.get("shuffle")
        derived.setdefault("full_shuffle", isinstance(shuffle, str) and shuffle == "global")
        return cls(
            **flat,
            **groups,
            iterable=is_iterable(dataset),
            datapipe=is_datapipe(dataset),
            **derived,
        )

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("num_workers", _count("num_workers", self.num_workers, minimum=0))
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout < 0:
            raise ConfigError(
                f"timeout option should be non-negative (seconds, a number). Found: {timeout!r}."
            )
        self._check_workers(put)
        for name in ("pin_memory", "in_order"):
            put(name, _flag(name, getattr(self, name)))
        put("shuffle", shuffle_mode(self.shuffle))
        self._check_sampling(put)
        if self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise ConfigError(
                f"`generator` must be a torch.Generator or None. Found: {self.generator!r}."
            )
        if self.order.seed is None:
            # What torch.manual_seed(args.seed) sets moves the shuffle, as under torch.
            from_torch = self.generator is None
            seed = torch.initial_seed() if from_torch else self.generator.initial_seed()
            put("order", replace(self.order, seed=seed))
            put("seed_from_torch", from_torch)
        put("readahead", self._readahead())

    def _readahead(self) -> Readahead:
        """Batches in flight or ready: `prefetch`, else torch's prefetch_factor × workers
        (a tuner's safe start replaces it on first use)."""
        pace = self.pace
        if isinstance(pace.prefetch, int):
            return Readahead(pace.prefetch)
        depth = max(1, (self.prefetch_factor or 2) * max(self.num_workers, 1))
        if not pace.tuned:
            return Readahead(depth)
        spec = TunerSpec(pace.prefetch, float(pace.target_utilization), pace.memory_budget,
                         cpu_count(), pace.history)  # fmt: skip
        return Readahead(depth, spec)

    @property
    def batched(self) -> bool:
        """Samples are collated into batches (torch's auto-collation)."""
        return self.batch_size is not None or self.batch_sampler is not None

    @property
    def seed(self) -> int:
        """The resolved seed (given, the generator's, or torch's initial seed)."""
        return self.order.seed  # type: ignore[return-value]

    def _check_workers(self, put: Callable[[str, Any], None]) -> None:
        workers, factor = self.num_workers, self.prefetch_factor
        if workers == 0 and factor is not None:
            raise ConfigError(
                "prefetch_factor option could only be specified in multiprocessing (num_workers "
                "> 0, as in torch): leave it None, or use iolib's `prefetch` for read-ahead."
            )
        if factor is not None:
            put("prefetch_factor", _count("prefetch_factor", factor, minimum=0))
        elif workers > 0:
            put("prefetch_factor", 2)
        put("persistent_workers", _flag("persistent_workers", self.persistent_workers))
        if self.persistent_workers and workers == 0:
            raise ConfigError("persistent_workers option needs num_workers > 0 (as in torch).")
        put("multiprocessing_context", _context(self.multiprocessing_context, workers))

    def _check_sampling(self, put: Callable[[str, Any], None]) -> None:
        shuffled = self.shuffle != "none"
        if self.iterable:
            for name, given in (
                ("shuffle", shuffled and not self.datapipe),
                ("sampler", self.sampler is not None),
                ("batch_sampler", self.batch_sampler is not None),
            ):
                if given:
                    raise ConfigError(
                        f"DataLoader with IterableDataset: expected unspecified {name} option, "
                        f"but got {name}={getattr(self, name)!r}. An IterableDataset decides "
                        "its own order (as in torch)."
                    )
        if self.sampler is not None and shuffled:
            raise ConfigError("sampler option is mutually exclusive with shuffle (as in torch).")
        if self.batch_sampler is not None:
            if (
                self.batch_size != 1
                or shuffled
                or self.sampler is not None
                or _flag("drop_last", self.drop_last)
            ):
                raise ConfigError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last (as in torch): leave those at their defaults."
                )
            put("batch_size", None)
            put("drop_last", False)
            return
        if self.batch_size is None:
            if _flag("drop_last", self.drop_last):
                raise ConfigError(
                    "batch_size=None option disables auto-batching and is mutually exclusive "
                    "with drop_last (as in torch)."
                )
            put("drop_last", False)
            return
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size <= 0:
            raise ConfigError(f"`batch_size` must be a positive integer or None. Found: {size!r}.")
        put("batch_size", int(size))
        if not isinstance(self.drop_last, bool):  # torch's BatchSampler refuses 1 and np.bool_
            raise ConfigError(f"`drop_last` must be True or False. Found: {self.drop_last!r}.")
        put("drop_last", bool(self.drop_last))

    def arguments(self) -> dict[str, Any]:
        """The constructor's keyword arguments that rebuild an equal loader."""
        kwargs = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_ARGUMENTS
        }
        for group in (self.order, self.sample, self.pace):
            kwargs.update({f.name: getattr(group, f.name) for f in fields(group)})
        if self.batch_sampler is not None:
            kwargs["batch_size"] = 1  # normalized to None above; torch wants it left at 1
        return kwargs


# LoaderOptions' fields that are not DataLoader keywords: the groups (their fields are)
# and what the loader derives.
_NOT_ARGUMENTS = (*GROUPS, "iterable", "datapipe", "full_shuffle", "seed_from_torch", "readahead")


def _context(context: Any, workers: int) -> Any:
    """torch's checks of `multiprocessing_context`; a start method's name becomes its
    context, as torch's loader stores it."""
    if context is None:
        return None
    if workers == 0:
        raise ConfigError(
            "multiprocessing_context can only be used with multi-process loading "
            f"(num_workers > 0), but got num_workers={workers}."
        )
    if isinstance(context, str):
        methods = torch.multiprocessing.get_all_start_methods()
        if context not in methods:
            raise ConfigError(
                f"multiprocessing_context option should specify a valid start method in "
                f"{methods!r}, but got multiprocessing_context={context!r}."
            )
        return torch.multiprocessing.get_context(context)
    if not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError(
            "multiprocessing_context option should be a valid context object or a string "
            f"specifying the start method, but got multiprocessing_context={context!r}."
        )
    return context


def resolve_mode(mode: str, torch_dataset: bool) -> str:
    """ "auto" is processes for torch Datasets (GIL-bound Python), threads for iolib sources."""
    if mode == "auto":
        return "process" if torch_dataset else "thread"
    return mode


def is_iterable(dataset: Any) -> bool:
    return isinstance(dataset, IterableDataset)


def is_datapipe(dataset: Any) -> bool:
    from torch.utils.data import IterDataPipe

    return isinstance(dataset, IterDataPipe)
