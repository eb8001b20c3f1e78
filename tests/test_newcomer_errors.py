"""Errors and warnings on the paths a newcomer walks first: each names the fix that
works (the argument's real name, where it belongs), once, from the user's own line."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from iolib import DataLoader
from iolib.decode.images import ImagePipeline
from iolib.errors import ConfigError, DataError, failure_text
from iolib.sources import ImageFolderSource, ParquetSource
from iolib.text import PackedTokens
from tests.conftest import run_cli as run


def _jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture
def images(tmp_path: Path) -> str:
    table = pa.table({"image": [_jpeg()] * 6 + [b"junk"] * 2, "label": list(range(8)),
                      "caption": ["a cat"] * 8})  # fmt: skip
    pq.write_table(table, tmp_path / "images.parquet")
    return str(tmp_path / "images.parquet")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_device_without_cuda_is_refused_at_construction(device: str) -> None:
    with pytest.raises(ConfigError, match=r"CUDA is not available here.*device='cpu'"):
        ImagePipeline(device=device)


def test_a_text_column_as_image_column_names_image_column(images: str) -> None:
    for on_error in ("raise", "skip"):  # skip would drop every sample: refused either way
        pipeline = ImagePipeline(size=8, device="cpu", backend="pil", image_column="caption",
                                 on_error=on_error)  # fmt: skip
        loader = DataLoader(ParquetSource(images), batch_size=4, decode=pipeline)
        with pytest.raises(ConfigError) as caught:
            next(iter(loader))
        message = str(caught.value)
        assert "image_column=" in message and "['image']" in message, message
        assert "on_error" not in message


def test_a_bad_image_message_is_printed_once(images: str) -> None:
    """The exception's message, then a note that adds where it failed, not the message
    again."""
    pipeline = ImagePipeline(size=8, device="cpu", backend="pil")
    loader = DataLoader(ParquetSource(images), batch_size=8, decode=pipeline)
    with pytest.raises(DataError) as caught:
        next(iter(loader))
    text = failure_text(caught.value)
    assert text.count("Bad image in column 'image'") == 1, text
    assert "failed in stage 'decode'" in text


def test_packed_tokens_missing_column_names_column(tmp_path: Path) -> None:
    pq.write_table(pa.table({"tokens": [[1, 2, 3]] * 8}), tmp_path / "t.parquet")
    tokens = PackedTokens(str(tmp_path / "t.parquet"), column="input_ids", seq_len=4, eos_id=0)
    with pytest.raises(DataError, match=r"Fix `column`\.$"):
        len(tokens)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: ParquetSource(p, batch_size=64),
        lambda p: ImageFolderSource(p, batch_size=64),
        lambda p: PackedTokens(p, column="tokens", seq_len=4, eos_id=0, batch_size=64),
        lambda p: ImagePipeline(size=8, batch_size=64),
    ],
    ids=["ParquetSource", "ImageFolderSource", "PackedTokens", "ImagePipeline"],
)
def test_batch_size_on_a_source_or_decoder_says_it_is_dataloaders(images: str, make) -> None:
    with pytest.raises(TypeError) as caught:
        make(images)
    message = str(caught.value)
    assert "takes no batch_size=" in message and "DataLoader(" in message, message
    assert len(message.splitlines()) == 1


def test_s3_endpoint_option_names_endpoint_url() -> None:
    with pytest.raises(ConfigError, match=r"'endpoint' -> endpoint_url"):
        len(ParquetSource("s3://bucket/data/", storage_options={"endpoint": "http://h:9000"}))


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """No credentials anywhere botocore looks; the endpoint refuses connections (the
    credentials are looked for before any request)."""
    pytest.importorskip("s3fs")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return "http://127.0.0.1:9"


def test_s3_failure_names_the_listing_not_the_summary(no_aws_credentials: str) -> None:
    options = {"endpoint_url": no_aws_credentials}
    with pytest.raises(PermissionError) as caught:
        len(ParquetSource("s3://bucket/data/", storage_options=options))
    message = str(caught.value)
    assert "listing 's3://bucket/data/'" in message and "_metadata" not in message, message
    assert "Fix:" in message


def test_cli_credentials_error_has_the_fix_line(no_aws_credentials: str, tmp_path, capsys):
    for args in (["inspect", "s3://bucket/x"], ["convert", "s3://bucket/x", str(tmp_path / "o")]):
        code, _, err = run(capsys, *args, "-o", f"endpoint_url={no_aws_credentials}")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "credentials" in err and "Fix: pass credentials with -o key=..." in err, err


def test_torchs_worker_count_warning_names_the_users_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DataLoader(list(range(10)), batch_size=2, num_workers=512, worker_mode="process")
    found = [w for w in caught if "worker processes in total" in str(w.message)]
    assert found and found[0].filename == __file__, [(w.filename, w.message) for w in caught]
