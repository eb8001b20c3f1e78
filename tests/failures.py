"""Assertions on batch failures, which keep their own exception type (as in torch) and
carry iolib's context (stage, batch, samples) in a note and `iolib_*` attributes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from iolib.errors import failure_text


@contextmanager
def raises_failure(kind: type[BaseException] = Exception, match: str = "") -> Iterator[Any]:
    """Like pytest.raises, matching `match` against the whole failure text."""
    with pytest.raises(kind) as info:
        yield info
    if match:
        text = failure_text(info.value)
        assert re.search(match, text, re.DOTALL), f"{match!r} not in:\n{text}"
