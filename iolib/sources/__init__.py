"""What is read: Parquet shards, image folders, any map-style torch Dataset.

Sources describe data; they hold no open files across pickling and never start work
at construction (files are listed and footers read on first use).
"""

from __future__ import annotations

from iolib.sources.arrow_pool import prefer_token_pool as prefer_token_pool
from iolib.sources.base import Source
from iolib.sources.files import ImageFolderSource
from iolib.sources.footer import leaf_range as leaf_range
from iolib.sources.footer import leaf_values as leaf_values
from iolib.sources.parquet import ParquetSource
from iolib.sources.parquet_description import checked_cache_bytes as checked_cache_bytes
from iolib.sources.parquet_fetch import decode_slots as decode_slots
from iolib.sources.parquet_files import is_pattern as is_pattern
from iolib.sources.readahead import ReadAhead as ReadAhead
from iolib.sources.rgcache import EpochUses as EpochUses
from iolib.sources.rgcache import PlannedCache as PlannedCache
from iolib.sources.summary import regular_file as regular_file
from iolib.sources.summary import write_atomic as write_atomic
from iolib.sources.torchds import TorchDatasetSource, as_source

# For other layers of iolib (the token sources in iolib.text), not users, so not in
# __all__: `ReadAhead`, `PlannedCache`, `EpochUses`, `decode_slots`,
# `checked_cache_bytes`, `leaf_values`, `leaf_range`, `is_pattern`, `regular_file`, `write_atomic`,
# `prefer_token_pool`.

__all__ = ["ImageFolderSource", "ParquetSource", "Source", "TorchDatasetSource", "as_source"]
