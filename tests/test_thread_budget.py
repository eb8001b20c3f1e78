"""One per-process thread budget (iolib/base/resources.py): the readers take their thread
counts from it, none keeps a constant of its own."""

from __future__ import annotations

from iolib.base.resources import ThreadBudget, cpu_count, thread_budget
from iolib.sources import parquet_reader
from iolib.sources.parquet_fetch import decode_slots
from iolib.text import packed_reader


def test_the_readers_take_their_threads_from_the_budget() -> None:
    budget = thread_budget()
    assert isinstance(budget, ThreadBudget)
    assert budget.decodes == max(2, cpu_count()) == decode_slots()
    assert budget.remote_reads == parquet_reader.FETCH_THREADS
    assert budget.remote_reads == packed_reader.FETCH_THREADS
