"""What is read: Parquet shards, image folders, any map-style torch Dataset.

Sources describe data; they hold no open files across pickling and never start work
at construction (files are listed and footers read on first use).
"""

from __future__ import annotations

from iolib.sources.base import Source
from iolib.sources.files import ImageFolderSource
from iolib.sources.parquet import ParquetSource
from iolib.sources.parquet_fetch import decode_slots as decode_slots
from iolib.sources.readahead import ReadAhead as ReadAhead
from iolib.sources.torchds import TorchDatasetSource, as_source

# For other layers of iolib (the token reader), not users: `ReadAhead`, `decode_slots`.

__all__ = ["ImageFolderSource", "ParquetSource", "Source", "TorchDatasetSource", "as_source"]
