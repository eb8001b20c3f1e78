"""The Decoder protocol, the on_error policy and DataError's fields, seen by a user:
a plain function, a wrapped one and ImagePipeline all plug into DataLoader(decode=...)."""

from __future__ import annotations

import doctest
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import iolib.decode.protocol
from iolib import DataLoader
from iolib.decode import Decoder, FunctionDecoder
from iolib.decode.images import ImagePipeline
from iolib.errors import ConfigError, DataError, OnError
from iolib.sources import ParquetSource
from tests.conftest import jpeg_bytes


def halve_tokens(batch: dict, indices: np.ndarray, *, seed: int, epoch: int):
    return {**batch, "tokens": batch["tokens"].float() / 2}, []


def _loader(token_dir, **kwargs) -> DataLoader:
    return DataLoader(ParquetSource(str(token_dir)), batch_size=10, seed=3, **kwargs)


def test_a_plain_function_decodes_every_batch(token_dir) -> None:
    plain = list(_loader(token_dir))
    loader = _loader(token_dir, decode=halve_tokens)
    assert isinstance(loader.decode, Decoder) and loader.decode.on_error == OnError.RAISE
    for got, want in zip(loader, plain, strict=True):
        assert torch.equal(got["tokens"], want["tokens"].float() / 2)


def test_a_stage_runs_without_a_decoder_whose_columns_it_does_not_return(token_dir) -> None:
    calls = []

    def counted(batch, indices, *, seed, epoch):
        calls.append(len(indices))
        return halve_tokens(batch, indices, seed=seed, epoch=epoch)

    decoder = FunctionDecoder(counted, columns=("tokens",))
    labels = _loader(token_dir, decode=decoder).for_stage(1, 2)
    assert list(labels) and calls == []
    inputs = list(_loader(token_dir, decode=decoder).for_stage(0, 2))
    assert len(calls) == len(inputs) and inputs[0][0]["tokens"].dtype == torch.float32


def test_image_pipeline_is_a_decoder_whose_policy_compares_to_its_string() -> None:
    pipe = ImagePipeline(on_error="skip")
    assert isinstance(pipe, Decoder) and pipe.columns == ("image",)
    assert pipe.on_error == "skip" and pipe.on_error is OnError.SKIP
    assert pickle.loads(pickle.dumps(pipe)) == pipe


def test_a_decode_that_is_not_callable_is_refused(token_dir) -> None:
    with pytest.raises(ConfigError, match=r"`decode` must be a Decoder .* Found: 'pil'"):
        _loader(token_dir, decode="pil")


def test_half_a_decoder_is_refused_not_half_ignored(token_dir) -> None:
    class SkipsOnly:
        on_error = "skip"

        def __call__(self, batch, indices, *, seed, epoch):
            return batch, []

    with pytest.raises(ConfigError, match=r"declares 'on_error' .* add columns = \(\)"):
        _loader(token_dir, decode=SkipsOnly())


@pytest.mark.parametrize("value", ["ignore", "Skip", None, True])
def test_every_on_error_is_parsed_by_one_rule(token_dir, value) -> None:
    expected = f"`on_error` must be one of ('raise', 'skip'). Found: {value!r}."
    for make in (
        lambda: _loader(token_dir, on_error=value),
        lambda: ImagePipeline(on_error=value),
        lambda: FunctionDecoder(halve_tokens, on_error=value),
    ):
        with pytest.raises(ConfigError) as info:
            make()
        assert str(info.value) == expected


def test_a_bad_image_error_names_its_samples_and_column(tmp_path) -> None:
    images = [b"not an image" if i == 4 else jpeg_bytes(i, (24, 20)) for i in range(8)]
    table = pa.table({"id": np.arange(8), "image": pa.array(images, pa.binary())})
    pq.write_table(table, tmp_path / "bad.parquet")
    pipe = ImagePipeline(size=16, backend="pil", device="cpu")
    loader = DataLoader(ParquetSource(str(tmp_path / "bad.parquet")), batch_size=8, decode=pipe)
    with pytest.raises(DataError) as info:
        list(loader)
    assert info.value.samples == [4] and info.value.column == "image"
    assert "sample 4: not a recognized image format" in str(info.value)


def test_a_null_label_error_names_its_column_and_spares_its_row_group(tmp_path) -> None:
    labels = pa.array([0, 1, None, 3, 4, 5], pa.int64())
    pq.write_table(pa.table({"id": np.arange(6), "label": labels}), tmp_path / "n.parquet")
    loader = DataLoader(ParquetSource(str(tmp_path / "n.parquet")), batch_size=6)
    with pytest.raises(DataError) as info:
        list(loader)
    error = info.value
    assert error.samples == [2] and error.column == "label" and not error.whole_block
    skipping = DataLoader(ParquetSource(str(tmp_path / "n.parquet")), batch_size=6, on_error="skip")
    assert [int(i) for b in skipping for i in b["id"]] == [0, 1, 3, 4, 5]


def test_data_error_fields_survive_pickling() -> None:
    error = DataError("bad", samples=[3], column="x", file="a.parquet", row_group=2)
    back = pickle.loads(pickle.dumps(error))
    assert (str(back), back.samples, back.column, back.file, back.row_group, back.whole_block) == (
        "bad",
        [3],
        "x",
        "a.parquet",
        2,
        True,
    )


def test_protocol_example_runs() -> None:
    assert doctest.testmod(iolib.decode.protocol).failed == 0
