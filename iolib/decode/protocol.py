"""The Decoder protocol: what the loader may ask of ``DataLoader(decode=...)``.

Why a protocol: the fetcher, the stage loaders and the loader each need something of a
decoder (to call it, to know whether it drops samples, to know what it reads), and a
decoder can be iolib's ``ImagePipeline``, a user's class or a plain function. Naming
those needs once here lets each of them ask by attribute, with types, and lets a
decoder be written without reading the loader's code.

Example::

    >>> from iolib.decode import FunctionDecoder
    >>> def to_lists(batch, indices, *, seed, epoch):
    ...     return {k: list(v) for k, v in batch.items()}, []
    >>> decoder = FunctionDecoder(to_lists, columns=("image",))
    >>> isinstance(decoder, Decoder), decoder.on_error
    (True, <OnError.RAISE: 'raise'>)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from iolib.errors import ConfigError, OnError

__all__ = ["Decoder", "FunctionDecoder", "as_decoder"]


@runtime_checkable
class Decoder(Protocol):
    """What the loader asks of a decoder. Who asks what:

    - the fetcher (one batch in a worker) calls it on each collated batch, after
      transform and collate: ``decoder(batch, indices, seed=, epoch=)`` returns the
      new batch and the global indices of the samples it left out (``[]`` if none).
      Any randomness comes from ``iolib.sample_rng(seed, epoch, index)``.
    - the loader and the fetcher read `on_error`: under ``OnError.SKIP`` a batch can
      lose samples, so each batch carries reserve samples to refill an emptied one.
    - the stage loaders (``loader.for_stage``) read `columns`: a stage that returns none
      of them runs without the decoder (``()``: unknown, every stage keeps it).
    - the fetcher calls ``prepare()`` before reading each batch where the decoder has
      one (optional): a hint that returns at once, to build what decoding needs (DALI)
      while the batch's bytes are read.

    A decoder is shared by thread workers and pickled into process workers: keep
    state built on first use (DALI pipelines) out of what it pickles.
    """

    @property
    def columns(self) -> tuple[str, ...]:
        """The batch columns it consumes; ``()`` when unknown."""
        ...

    @property
    def on_error(self) -> OnError:
        """Whether a bad sample raises or is left out (and counted)."""
        ...

    def __call__(
        self, batch: Any, indices: Any, *, seed: int, epoch: int
    ) -> tuple[Any, list[int]]: ...


@dataclass(frozen=True)
class FunctionDecoder:
    """A function ``fn(batch, indices, *, seed, epoch) -> (batch, skipped)`` as a
    Decoder. A plain function given to ``DataLoader(decode=...)`` is wrapped in one
    (consuming unknown columns, raising on bad data); wrap it yourself to say more."""

    fn: Callable[..., tuple[Any, list[int]]]
    columns: tuple[str, ...] = ()
    on_error: OnError = OnError.RAISE

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "on_error", OnError.parse(self.on_error))

    def __call__(self, batch: Any, indices: Any, *, seed: int, epoch: int) -> tuple[Any, list[int]]:
        return self.fn(batch, indices, seed=seed, epoch=epoch)


def as_decoder(decode: Any) -> Decoder | None:
    """`decode` as a Decoder: as given when it is one (or None), a function wrapped."""
    if decode is None or isinstance(decode, Decoder):
        return decode
    if not callable(decode):
        raise ConfigError(
            "`decode` must be a Decoder (e.g. iolib.decode.images.ImagePipeline) or a function "
            f"decode(batch, indices, *, seed, epoch). Found: {decode!r}."
        )
    # Half a Decoder would lose the half it declares (a skip policy, its columns).
    declared = [name for name in ("columns", "on_error") if hasattr(decode, name)]
    if declared:
        missing = {"columns": "columns = () when unknown", "on_error": 'on_error = "raise"'}
        lacks = [text for name, text in missing.items() if name not in declared]
        raise ConfigError(
            f"`decode` declares {declared[0]!r} but not all of iolib.decode.Decoder: add "
            f"{lacks[0]}, or wrap the function in iolib.decode.FunctionDecoder. "
            f"Found: {decode!r}."
        )
    return FunctionDecoder(decode)
