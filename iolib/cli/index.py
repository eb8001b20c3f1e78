"""`iolib index`: write what a loader would otherwise compute at start, beside the data.

Two files, both optional to a loader and both checked against the data before use:
Parquet's `_metadata` summary (every footer of a directory in one read, so a dataset
of many files starts with one request instead of two a file) and, with `--tokens`, the
per-row-group token index that `PackedTokens` needs (`iolib.text.tokenindex`).
"""

from __future__ import annotations

from typing import Any

import click
import pyarrow as pa

from iolib.cli.common import as_given, storage_options_option
from iolib.sources import ParquetSource
from iolib.sources.summary import write_summary
from iolib.storage import open_filesystem


@click.command("index")
@click.argument("url", metavar="DIRECTORY")
@click.option(
    "--tokens",
    "column",
    default=None,
    metavar="COLUMN",
    help="Also write the token index of this list<int> column (for PackedTokens).",
)
@storage_options_option
def index(url: str, column: str | None, storage_options: dict[str, Any]) -> None:
    """Write DIRECTORY/_metadata (the footers of its Parquet files in one file) and,
    with --tokens, the token index beside the data. Run it again after adding files."""
    fs, path = open_filesystem(url, storage_options)
    if not fs.isdir(path):
        raise click.BadParameter(f"{url!r} is not a directory of Parquet files.", param_hint="URL")
    source = ParquetSource(url, storage_options=storage_options)
    files = [f.path for f in source.files]
    if column is not None:  # before anything is written
        _check_token_column(source, column)
    where = write_summary(fs, path, files)
    rows = len(source)
    groups, shown = len(source.blocks()), as_given(where, url)
    click.echo(f"wrote {shown}: {len(files)} files, {groups} row groups, {rows} rows")
    if column is not None:
        from iolib.text.tokenindex import write_beside

        written, tokens = write_beside(ParquetSource(url, [column], storage_options), column)
        click.echo(
            f"wrote {as_given(written, url)}: {int(tokens.tokens.sum())} tokens in "
            f"{int(tokens.documents.sum())} documents of {column!r}"
        )


def _check_token_column(source: ParquetSource, column: str) -> None:
    """--tokens names a list column of integers, or the command stops here."""
    schema = source.schema
    if column not in schema.names:
        raise click.BadParameter(
            f"{source.describe()} has no column {column!r}; its columns: {schema.names}.",
            param_hint="--tokens",
        )
    kind = schema.field(column).type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if not (is_list and pa.types.is_integer(kind.value_type)):
        raise click.BadParameter(
            f"column {column!r} is {kind}: --tokens needs a list of integer token ids "
            "(list<int32>, list<int64>...). Nothing was written.",
            param_hint="--tokens",
        )
