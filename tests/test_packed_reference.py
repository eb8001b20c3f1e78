"""PackedTokens against a reference built the obvious way, on randomized corpora: the
stream of documents (each followed by eos) cut into windows, labels the next token
except at each eos, positions restarting at each document and each window. Row group
sizes, files, the column's integer type, empty and null documents, seq_len, an eos id
that also appears inside documents, batch sizes and budgets that window the shuffle are
all drawn."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from iolib import DataLoader
from iolib.errors import ConfigError
from iolib.text import PackedTokens

EOS, IGNORE = 1, -100
KINDS = [pa.list_(pa.int32()), pa.list_(pa.int64()), pa.list_(pa.uint16()), pa.list_(pa.int16()),
         pa.large_list(pa.int32()), pa.list_(pa.int8()), pa.list_(pa.uint8()),
         pa.list_(pa.uint32())]  # fmt: skip


@st.composite
def corpora(draw):
    docs = draw(st.lists(st.integers(0, 40), min_size=1, max_size=60))
    nulls = draw(st.sets(st.integers(0, len(docs) - 1), max_size=3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    # The token column's type: tokenizers write int32, some int64 or uint16;
    # large_list where a row group holds over 2^31 values; the rest for each width and
    # sign the compiled cut widens.
    kind = draw(st.sampled_from(KINDS))
    # Ids from a tiny vocabulary (eos, 1, also occurs inside documents), or shifted to
    # straddle uint16's top (row groups held narrowed and not, side by side) or below 0.
    info = np.iinfo(kind.value_type.to_pandas_dtype())
    shift = draw(
        st.sampled_from([s for s in (0, 65533, -3) if info.min <= s and s + 3 <= info.max])
    )
    rows = [
        None if i in nulls else (rng.integers(0, 4, n) + shift).tolist() for i, n in enumerate(docs)
    ]
    return {
        "rows": rows,
        "files": draw(st.integers(1, 3)),
        "row_group": draw(st.integers(1, 12)),
        "seq_len": draw(st.integers(1, 12)),
        "batch": draw(st.integers(1, 7)),
        "budget": draw(st.sampled_from([None, 600, 1200, 2500])),
        "document_ids": draw(st.booleans()),
        "shuffle": draw(st.booleans()),
        "lanes": draw(st.sampled_from(["auto", 2, 3])),
        "kind": kind,
    }


def _write(root: Path, rows: list, files: int, row_group: int, kind: pa.DataType) -> str:
    bounds = np.linspace(0, len(rows), files + 1).astype(int)
    for f in range(files):
        part = rows[bounds[f] : bounds[f + 1]]
        table = pa.table({"tokens": pa.array(part, kind)})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=row_group)
    return str(root)


def _reference(rows: list, seq_len: int) -> list[tuple]:
    """Every window as (input_ids, labels, position_ids, document_ids), in stream order."""
    tokens, docs, last, starts = [], [], [], []
    for row, doc in enumerate(rows):
        if not doc:
            continue
        starts.append(len(tokens))
        tokens += [*doc, EOS]
        docs += [row] * (len(doc) + 1)
        last += [False] * len(doc) + [True]
    begins = set(starts)
    windows = []
    for k in range(len(tokens) // seq_len):
        lo = k * seq_len
        span = range(lo, lo + seq_len)
        labels = [IGNORE if last[i] else tokens[i + 1] for i in span]
        position, positions = 0, []
        for i in span:
            position = 0 if (i == lo or i in begins) else position + 1
            positions.append(position)
        windows.append((tuple(tokens[lo : lo + seq_len]), tuple(labels), tuple(positions),
                        tuple(docs[lo : lo + seq_len])))  # fmt: skip
    return windows


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora())
def test_windows_match_the_reference(case) -> None:
    expected = _reference(case["rows"], case["seq_len"])
    assume(expected)
    with tempfile.TemporaryDirectory() as tmp:
        url = _write(Path(tmp), case["rows"], case["files"], case["row_group"], case["kind"])
        try:
            windows = PackedTokens(url, column="tokens", seq_len=case["seq_len"], eos_id=EOS,
                                   shuffle_documents=False, document_ids=case["document_ids"],
                                   cache_bytes=case["budget"], lanes=case["lanes"],
                                   shuffle_window=(case["budget"] or 2**30) // 2)  # fmt: skip
            assert len(windows) == len(expected)
        except ConfigError:
            assume(False)  # a budget below four row groups is refused: another test's case
        loader = DataLoader(windows, batch_size=case["batch"], shuffle=case["shuffle"], seed=3)
        got = []
        for batch in loader:
            columns = [batch["input_ids"], batch["labels"], batch["position_ids"]]
            if case["document_ids"]:
                columns.append(batch["document_ids"])
            got += [tuple(tuple(c[r].tolist()) for c in columns) for r in range(len(columns[0]))]
        loader.close()
    width = 4 if case["document_ids"] else 3
    want = [w[:width] for w in expected]
    if case["shuffle"] or case["lanes"] != "auto":  # lanes deal windows in turn
        assert Counter(got) == Counter(want)  # each window once, whatever the order
    else:
        assert got == want
