"""The plan's `OrderChoice` says when the source shuffles by windows; the loader sizes
the source's cache from that, never by comparing the options it was given."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from iolib import DataLoader
from iolib.plan import Layout, choose_order
from iolib.sources.base import Source


@pytest.mark.parametrize(
    ("shuffle", "windowed_ok", "expected"),
    [("global", True, ("block", 3, True)), ("block", True, ("block", 8, False)),
     ("global", False, ("global", 8, False)), ("none", True, ("none", 8, False))],
)  # fmt: skip
def test_the_choice_says_whether_the_source_runs_a_windowed_shuffle(
    shuffle, windowed_ok, expected
) -> None:
    layout = Layout(blocks=(4,) * 10, modes=(("global", "block", 3),))
    choice = choose_order(layout, shuffle, 8, batch_size=2, world_size=1, windowed_ok=windowed_ok)
    assert (choice.shuffle, choice.window, choice.source_windowed) == expected


class WindowedSource(Source):
    """40 rows in blocks of 4 that, like a streamed corpus, runs shuffle="block" as its
    own windowed shuffle of 2 blocks: the same mode and window a loader may ask for."""

    def __init__(self) -> None:
        self.fitted: list[int] = []

    def __len__(self) -> int:
        return 40

    def fingerprint(self) -> str:
        return "windowed-40"

    def read(self, indices: Any, *, epoch: int = 0) -> list[int]:
        return [int(i) for i in np.asarray(indices)]

    def blocks(self) -> tuple[int, ...]:
        return (4,) * 10

    def layout(self) -> Layout:
        return Layout(blocks=self.blocks(), modes=(("block", "block", 2),))

    def fit_cache(self, row_groups: int) -> int:
        self.fitted.append(row_groups)
        return row_groups


def test_a_source_that_shuffles_by_windows_gets_room_for_the_next_one() -> None:
    """Asked for the very mode and window the source runs, the loader still knows the
    source reads the next window ahead (comparing options said it did not)."""
    source = WindowedSource()
    loader = DataLoader(source, batch_size=4, shuffle="block", shuffle_window=2, seed=0)
    list(loader)
    workers = 1  # inline counts as one reader
    assert source.fitted == [2 + 2 + workers + 1]
