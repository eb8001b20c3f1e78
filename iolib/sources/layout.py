"""Is a Parquet dataset's label column stored in sorted runs? A block shuffle over such
shards puts a few classes in each batch (a silent accuracy loss), so the loader says so.

Read from the footers already in memory, never the data: the order ``iolib convert``
recorded in the shards' metadata, else the label column's row-group statistics.
"""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any

log = logging.getLogger("iolib")

ORDER_KEY = b"iolib.convert.order"  # written by iolib.cli.convert
LABEL_COLUMNS = ("label", "labels", "target", "class", "y")
# Row groups looked at: enough to tell sorted runs from a mix, few enough to cost nothing.
GROUPS_CHECKED = 64

_said: set[str] = set()


def sorted_labels(files: list[Any]) -> str | None:
    """Why the label column looks sorted (a sentence), or None if it does not, or there is
    no label column to tell by. `files`: a ParquetSource's FileMeta list."""
    if not files:
        return None
    recorded = (files[0].footer.metadata or {}).get(ORDER_KEY)
    if recorded is not None:
        try:
            order = json.loads(recorded).get("order")
        except (ValueError, AttributeError):
            order = None
        if order == "sorted":
            return "iolib convert wrote it with --sorted (by class)"
        if order == "shuffled":
            return None
    column = next((c for c in LABEL_COLUMNS if c in files[0].schema.names), None)
    if column is None:
        return None
    ranges = _label_ranges(files, column)
    if len(ranges) < 2 or ranges[0][0] == ranges[-1][1]:
        return None  # too few groups, or a single label throughout
    # Sorted runs: each row group's labels end where the next one's begin.
    if all(hi <= next_lo for (_, hi), (next_lo, _) in itertools.pairwise(ranges)):
        return (
            f"the {column!r} column rises from row group to row group "
            f"(the first {len(ranges)} row groups' statistics)"
        )
    return None


def _label_ranges(files: list[Any], column: str) -> list[tuple[Any, Any]]:
    """(min, max) of `column` in the first row groups, as long as statistics exist."""
    ranges: list[tuple[Any, Any]] = []
    for meta in files:
        for local in range(len(meta.row_groups)):
            if len(ranges) >= GROUPS_CHECKED:
                return ranges
            group = meta.group_meta(local)
            chunks = (group.column(i) for i in range(group.num_columns))
            chunk = next((c for c in chunks if c.path_in_schema == column), None)
            stats = None if chunk is None else chunk.statistics
            if stats is None or not stats.has_min_max:
                return ranges
            ranges.append((stats.min, stats.max))
    return ranges


def warn_if_block_shuffle_sorted(source: Any) -> None:
    """Say once per dataset, in the log, that a block shuffle over label-sorted shards
    mixes few classes per batch, and what to do."""
    files = getattr(source, "files", None)
    if not isinstance(files, list):
        return
    try:
        why = sorted_labels(files)
    except Exception:  # a check of the layout must never stop training
        return
    if why is None:
        return
    where = source.describe()
    if where in _said:
        return
    _said.add(where)
    log.warning(
        "%s: shuffle='block' over shards whose labels run sorted (%s): each batch holds "
        "only a few classes, which hurts accuracy. Rewrite the shards shuffled "
        "(`iolib convert SRC DST` shuffles by default) or use shuffle=True.",
        where,
        why,
    )
