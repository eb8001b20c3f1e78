"""Exceptions that carry the value, the rule and the fix.

Why a module of their own: every layer (sources, engine, decode, storage) raises
them and the training loop catches them, so they must not pull anything heavy in.
"""

from __future__ import annotations


class IolibError(Exception):
    """Base class of every error iolib raises on purpose."""


class ConfigError(IolibError, ValueError):
    """An argument breaks a rule: the message names the argument, the value and the fix."""


class DataError(IolibError):
    """Input data is missing or malformed: the message names the file, row group or sample."""


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


def failure_text(exc: BaseException) -> str:
    """Everything a batch failure shows when printed: its message, iolib's note (stage,
    batch, samples), its traceback (a process worker's is in the message) and the causes
    Python would print. A failure keeps its own exception type, as in torch, so its
    context rides in a note and in `iolib_*` attributes."""
    import traceback

    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
