"""docs/reference.md cannot drift from the code: it is what docs/make_reference.py
renders now, its stats() and state_dict() tables name exactly the keys running loaders
return, and it covers every public name. Also: the version the README and the
changelog state, and dir(iolib)."""

from __future__ import annotations

import importlib
import importlib.util
import io
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import iolib
from iolib import DataLoader

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_reference", ROOT / "docs" / "make_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_page_is_what_the_code_renders() -> None:
    generator = _generator()
    assert generator.PAGE.read_text() == generator.render(), (
        "docs/reference.md differs from the code: run python docs/make_reference.py"
    )


def test_reference_covers_every_public_name() -> None:
    listed = {module: set(names) for module, names in _generator().API}
    for module in ("iolib", "iolib.sources", "iolib.decode.images", "iolib.text"):
        public = set(importlib.import_module(module).__all__) - {"sources"}
        assert public <= listed[module], f"{module}: {public - listed[module]} not in the page"


def _jpegs(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        buffer = io.BytesIO()
        Image.fromarray(np.full((16, 16, 3), i, np.uint8)).save(buffer, format="JPEG")
        out.append(buffer.getvalue())
    return out


def _drained(loader: DataLoader) -> dict:
    for _ in loader:
        pass
    return loader.stats()


@pytest.fixture(scope="module")
def every_kind_of_stats(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    from iolib.decode.images import ImagePipeline
    from iolib.sources import ParquetSource
    from iolib.text import PackedTokens

    folder = tmp_path_factory.mktemp("stats")
    pq.write_table(
        pa.table({"image": _jpegs(16), "label": list(range(16))}),
        folder / "images.parquet",
        row_group_size=8,
    )
    pq.write_table(pa.table({"ids": [[1, 2, 3, 4, 5]] * 40}), folder / "tokens.parquet")

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(20))

    pipeline = ImagePipeline(size=8, device="cpu", backend="pil")
    return [
        _drained(DataLoader(list(range(20)), batch_size=4, num_workers=2)),
        _drained(
            DataLoader(
                ParquetSource(str(folder / "images.parquet")),
                batch_size=4,
                num_workers=1,
                prefetch="auto",
                decode=pipeline,
            )
        ),
        _drained(
            DataLoader(
                PackedTokens(str(folder / "tokens.parquet"), column="ids", seq_len=8, eos_id=0),
                batch_size=2,
            )
        ),
        _drained(DataLoader(Stream(), batch_size=4)),
    ]


def test_stats_keys_are_the_documented_ones(every_kind_of_stats: list[dict]) -> None:
    documented = set(_generator().STATS)
    returned = set().union(*every_kind_of_stats)
    assert returned - documented == set(), "stats() keys missing from the reference page"
    assert documented - returned == set(), "the reference page names keys stats() never has"
    assert every_kind_of_stats[1]["decode_backend"] == "pil"


def test_state_dict_fields_are_the_documented_ones() -> None:
    state = DataLoader(list(range(10)), batch_size=2, seed=0).state_dict()
    assert set(state) == set(_generator().STATE)


def test_version_is_stated_where_a_user_looks() -> None:
    version = iolib.__version__
    assert f"Version {version}" in (ROOT / "README.md").read_text()
    assert re.search(rf"^## {re.escape(version)}\b", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert f'version = "{version}"' in (ROOT / "pyproject.toml").read_text()


def test_dir_lists_the_lazy_public_names() -> None:
    names = dir(iolib)
    assert {"DataLoader", "sample_rng", "sources", "__version__"} <= set(names)
    assert "annotations" not in names and "Any" not in names
