"""Credentials never leave the process: every entry point, every output.

Credentials go in through URLs (user info, with and without '/' in the secret) and
through storage options (`--storage-options` JSON and `-o key=value`); each API call and
CLI command runs against in-memory data and a real S3 endpoint (moto), and all that it
prints, raises or writes is searched for the secrets.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.errors import ConfigError, failure_text
from iolib.redact import Redactor, redact_text, userinfo
from iolib.sources import ParquetSource
from tests.conftest import jpeg_bytes, run_cli
from tests.fixtures_s3 import s3_options  # noqa: F401

KEY, SECRET, SLASHED = "AKIAFAKEKEY7", "SECRETVALUE9", "ab12/Cd34+Ef56/Gh78"
SECRETS = (KEY, SECRET, SLASHED, "Cd34+Ef56", "Gh78x")
PLAIN = f"memory://{KEY}:{SECRET}@bucket"  # fsspec's memory store keeps the user info
WITH_SLASH = f"memory://{KEY}:{SLASHED}@bucket"
HTTP = f"http://user:{SECRET}@127.0.0.1:9/data.parquet"  # nothing listens on port 9


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def _run(args: list[str], capture) -> tuple[int, str]:
    code, out, err = run_cli(capture, *args)
    return code, out + err


@pytest.fixture(scope="module")
def memory_data() -> str:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": np.arange(40), "label": np.arange(40) % 3}), buffer)
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{PLAIN.split('://')[1]}/train/part-0.parquet", buffer.getvalue())
    for i in range(6):
        fs.pipe(f"{PLAIN.split('://')[1]}/images/c{i % 2}/{i}.jpg", jpeg_bytes(i, (20, 16)))
    return PLAIN


def test_user_info_is_found_whatever_characters_the_secret_holds() -> None:
    assert userinfo(f"s3://{KEY}:{SLASHED}@bucket/x.parquet") == f"{KEY}:{SLASHED}"
    assert userinfo("s3://bucket/dir@2/x.parquet") is None  # '@' in a path is no user
    assert userinfo("http://host:8080/a@b") is None  # nor is a port
    redact = Redactor([f"s3://{KEY}:{SLASHED}@bucket/x"])
    # What s3fs and botocore print for such a URL: the secret cut at its first '/'.
    quoted = f'Invalid bucket name "{KEY}:ab12": ... key Cd34+Ef56/Gh78@bucket/x'
    assert not _leaks(redact(quoted)), redact(quoted)


def test_masking_keeps_words_that_are_not_secrets() -> None:
    text = "Unable to locate credentials; use -o KEY=VALUE; see https://example.org/a@b"
    assert Redactor([f"s3://{KEY}:{SECRET}@b/x"])(text, assignments=False) == text
    assert redact_text("NoCredentialsError: Unable to locate credentials") == (
        "NoCredentialsError: Unable to locate credentials"
    )


def test_a_slash_in_url_credentials_is_refused_saying_how_to_pass_them() -> None:
    with pytest.raises(ConfigError, match="storage options") as info:
        len(ParquetSource(f"{WITH_SLASH}/train"))
    assert not _leaks(str(info.value))


def test_api_errors_stats_and_descriptions_hold_no_secret(memory_data) -> None:
    source = ParquetSource(f"{memory_data}/train", storage_options={"secret": SECRET})
    loader = DataLoader(source, batch_size=8, num_workers=2)
    assert len(list(loader)) == 5
    shown = [source.describe(), source.locate(3), json.dumps(loader.stats(), default=str)]
    absent = ParquetSource(f"{memory_data}/absent.parquet", storage_options={"token": SECRET})
    with pytest.raises(Exception) as info:  # whatever its type, no secret in it
        len(absent)
    shown.append(failure_text(info.value))
    assert not _leaks("\n".join(shown)), shown


def _leaky_transform(sample: dict, rng: np.random.Generator) -> dict:
    raise ValueError(f"could not fetch {PLAIN}/train with secret {SECRET}")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failed_batch_names_no_secret_of_its_source(memory_data, workers) -> None:
    """A transform's error that quotes the source's URL and options: the loader re-raises
    it with the source's own redaction (each source says what hides its secrets)."""
    source = ParquetSource(f"{memory_data}/train", storage_options={"secret": SECRET})
    loader = DataLoader(source, batch_size=8, num_workers=workers, transform=_leaky_transform)
    with pytest.raises(ValueError) as info:
        next(iter(loader))
    assert not _leaks(failure_text(info.value)), failure_text(info.value)


@pytest.mark.parametrize("fmt", [[], ["--json"]], ids=["text", "json"])
@pytest.mark.parametrize("url", ["train", "absent", "slash", "http"])
def test_inspect_prints_no_secret(memory_data, capfd, url, fmt) -> None:
    target = {
        "train": f"{memory_data}/train",
        "absent": f"{memory_data}/absent.parquet",
        "slash": f"{WITH_SLASH}/train",
        "http": HTTP,
    }[url]
    code, output = _run(["inspect", target, "-o", f"secret={SECRET}", *fmt], capfd)
    assert not _leaks(output), output
    assert (code == 0) == (url == "train"), output
    if code:
        assert len(output.strip().split("\n")) == 1, "an error is one line"


def test_convert_bench_and_tune_print_no_secret(memory_data, capfd, tmp_path: Path) -> None:
    code, output = _run(["convert", f"{memory_data}/images", str(tmp_path / "shards")], capfd)
    assert code == 0 and not _leaks(output), output
    written = b"".join(p.read_bytes() for p in (tmp_path / "shards").rglob("*") if p.is_file())
    assert not any(s.encode() in written for s in SECRETS)
    options = json.dumps({"key": KEY, "secret": SECRET})
    commands = [
        ["bench", "--data", f"{WITH_SLASH}/train", "-w", "images", "--out", str(tmp_path)],
        ["bench", "--data", f"{memory_data}/absent", "--storage-options", options],
        [
            "tune",
            f"{memory_data}/absent",
            "--step-ms",
            "5",
            "--storage-options",
            options,
            "--out",
            str(tmp_path / "report"),
        ],  # not ./tune-report in the checkout
        ["convert", f"{WITH_SLASH}/images", str(tmp_path / "other")],
    ]
    for args in commands:
        code, output = _run(args, capfd)
        assert code == 2, (args, output)
        assert not _leaks(output), (args, output)
        # One line (a progress bar may precede it on the same line, erased by '\r').
        assert len(output.strip().split("\n")) == 1, (args, output)
        assert "Traceback" not in output


def test_s3_credentials_in_options_reach_no_output(s3_options, capfd) -> None:  # noqa: F811
    options = {**s3_options, "key": KEY, "secret": SECRET}
    url = "s3://iolib-bench/absent/train.parquet"
    for args in (
        [
            "inspect",
            url,
            "--json",
            *[f"-o{k}={v}" for k, v in options.items() if k != "client_kwargs"],
        ],
        ["bench", "--data", url, "--storage-options", json.dumps(options)],
    ):
        code, output = _run(args, capfd)
        assert code == 2 and not _leaks(output), (args, output)
