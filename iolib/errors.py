"""Exceptions that carry the value, the rule and the fix.

Why a module of their own: every layer (sources, engine, decode, storage) raises
them and the training loop catches them, so they must not pull anything heavy in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from enum import Enum
from typing import Any


class IolibError(Exception):
    """Base class of every error iolib raises on purpose."""


class ConfigError(IolibError, ValueError):
    """An argument breaks a rule: the message names the argument, the value and the fix."""


class DataError(IolibError):
    """Input data is missing or malformed: the message names the file, row group or sample.

    The same facts ride in typed fields, for code that handles the error (the fetcher
    blames `samples`; under on_error="skip" it leaves out the whole block of a failed
    sample unless `whole_block` is False). A field the raiser does not know stays empty.

    samples: global indices of the bad samples. column: the column that holds them.
    file, row_group: where they are stored (the row group's number within `file`).
    whole_block: the fault is the storage block's (a corrupt row group), not the
        samples' own (a null label), so its other samples fail too.
    """

    def __init__(
        self,
        message: str,
        *,
        samples: Sequence[int] = (),
        column: str | None = None,
        file: str | None = None,
        row_group: int | None = None,
        whole_block: bool = True,
    ) -> None:
        super().__init__(message)
        self.samples = [int(s) for s in samples]
        self.column = column
        self.file = file
        self.row_group = row_group
        self.whole_block = whole_block


class StorageError(IolibError, OSError):
    """Storage itself failed in a way no retry fixes (a full or read-only cache disk, a
    cache directory that cannot be written): the message names the place and the fix,
    and never blames the data."""


class StateError(IolibError, ValueError):
    """A state dict does not fit this loader: the message names the keys that differ."""


class WorkerError(IolibError, RuntimeError):
    """A batch failed inside a worker; carries the stage, the batch, the samples and the
    original traceback (as text, since process workers cannot send frames)."""

    def __init__(
        self,
        message: str,
        *,
        stage: str = "",
        batch: int | None = None,
        samples: list[int] | None = None,
        remote_traceback: str = "",
    ) -> None:
        self.stage = stage
        self.batch = batch
        self.samples = samples or []
        self.remote_traceback = remote_traceback
        text = message
        if remote_traceback:
            text = f"{message}\n\nOriginal traceback (in the worker):\n{remote_traceback}"
        super().__init__(text)


class WorkerDied(WorkerError):
    """A process worker exited (killed by a signal, out of memory) with batches pending."""


class OnError(str, Enum):
    """What to do with a sample whose data is bad: "raise" a DataError naming it, or
    "skip" it (left out of its batch and counted in ``stats()``).

    One value parsed once from the string a user passes (``on_error="skip"``) to the
    loader or a decoder; it compares equal to that string."""

    RAISE = "raise"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: OnError | str) -> OnError:
        """The policy named by `value`, or a ConfigError naming the choices."""
        try:
            return cls(value)
        except ValueError:
            choices = tuple(m.value for m in cls)
            raise ConfigError(f"`on_error` must be one of {choices}. Found: {value!r}.") from None


# A user's transform or Dataset raised it and its type must reach the training loop
# unchanged, so the failed sample travels as an attribute on the exception itself.
_SAMPLE_TAG = "iolib_sample"


def tag_sample(exc: BaseException, key: Any) -> None:
    """Record on `exc` (any exception) the sample it was raised for."""
    with contextlib.suppress(Exception):  # an exception type that refuses attributes
        setattr(exc, _SAMPLE_TAG, key)


def blamed_samples(exc: BaseException) -> list[Any] | None:
    """The samples `exc` names as the culprits, or None when it names none: a tagged
    sample (`tag_sample`), else the `samples` of iolib's own errors."""
    tagged = getattr(exc, _SAMPLE_TAG, None)
    if tagged is not None:
        return [tagged]
    if isinstance(exc, (DataError, WorkerError)) and exc.samples:
        return list(exc.samples)
    return None


def require_positive_int(name: str, value: object) -> int:
    """Return `value` if it is an int > 0, else raise ConfigError saying so."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"`{name}` must be a positive integer. Found: {value!r}.")
    return value


def require_non_negative_int(name: str, value: object) -> int:
    """Return `value` if it is an int >= 0, else raise ConfigError saying so."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"`{name}` must be a non-negative integer. Found: {value!r}.")
    return value


# Arguments of DataLoader that newcomers pass to what it loads (a source, a decoder).
LOADER_ARGUMENTS = ("batch_size", "shuffle", "num_workers", "drop_last", "sampler", "seed")
_accepted: dict[type, frozenset[str] | None] = {}


def refuse_loader_arguments(cls: type, given: dict[str, Any], example: str = "") -> None:
    """Raise a one-line TypeError if `given` holds a DataLoader argument that `cls`'s
    __init__ does not take (e.g. batch_size= on a source): say where it belongs."""
    if not given:
        return
    if cls not in _accepted:
        import inspect

        parameters = inspect.signature(cls.__init__).parameters.values()
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
        _accepted[cls] = None if takes_any else frozenset(p.name for p in parameters)
    accepted = _accepted[cls]
    misplaced = [k for k in LOADER_ARGUMENTS if k in given and accepted is not None
                 and k not in accepted]  # fmt: skip
    if misplaced:
        names = ", ".join(f"{k}=" for k in misplaced)
        example = example or f"DataLoader({cls.__name__}(...), {misplaced[0]}=...)"
        raise TypeError(
            f"{cls.__name__} takes no {names}: that is an argument of DataLoader, e.g. "
            f"{example.format(name=misplaced[0])}."
        )


def failure_text(exc: BaseException) -> str:
    """Everything a batch failure shows when printed: its message, iolib's note (stage,
    batch, samples), its traceback (a process worker's is in the message) and the causes
    Python would print. A failure keeps its own exception type, as in torch, so its
    context rides in a note and in `iolib_*` attributes."""
    import traceback

    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
