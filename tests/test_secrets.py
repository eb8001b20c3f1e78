"""Credentials never leave the process: every entry point, every output.

Credentials go in through URLs (user info, with and without '/' in the secret) and
through storage options (`--storage-options` JSON and `-o key=value`); each API call and
CLI command runs against in-memory data and a real S3 endpoint (moto), and all that it
prints, raises or writes is searched for the secrets.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.base.redact import Redactor, redact_text, userinfo
from iolib.errors import ConfigError, failure_text
from iolib.sources import ParquetSource
from tests.conftest import jpeg_bytes, run_cli
from tests.fixtures_s3 import s3_options  # noqa: F401

KEY, SECRET, SLASHED = "AKIAFAKEKEY7", "SECRETVALUE9", "ab12/Cd34+Ef56/Gh78"
SECRETS = (KEY, SECRET, SLASHED, "Cd34+Ef56", "Gh78")
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


# -- every command that records or prints its arguments x every shape of secret ----------
def _pieces(password: str) -> list[str]:
    """The parts of `password` between its special characters (what a parser that stops
    at one of them would print)."""
    return [p for p in re.split(r"['\"@:]", password) if len(p) >= 4]


BEARER = "hf_BearerTok3nValue"
PASSWORDS = {  # URL passwords with the characters quoting and URL parsers trip on
    "quote": "Pqq7'Rss8",
    "double-quote": 'Dqq7"Ess8',
    "at": "Att7@Bss8",
    "colon": "Cqq7:Fss8",
    "all": "Mqq7'Nss8\"Oss8@Pss8:Qss8",
}
SHAPES = {
    "bearer-header": ([], ["-o", 'headers={"Authorization": "Bearer ' + BEARER + '"}'], [BEARER]),
    "options": ([], ["-o", f"key={KEY}", "-o", f"secret={SECRET}", "-o", "token=TokVal9x"],
                [KEY, SECRET, "TokVal9x"]),
    "json-options": ([], ["--storage-options", json.dumps({"token": "TokJson9x", "key": KEY})],
                     ["TokJson9x", KEY]),
    **{f"url-{name}": ([password], [], [password, *_pieces(password)])
       for name, password in PASSWORDS.items()},
}  # fmt: skip
COMMANDS = ["inspect", "inspect-json", "bench", "tune", "index", "convert",
            "history-list", "history-show", "history-clear"]  # fmt: skip


def _shape_data(shape: str) -> tuple[str, list[str], list[str]]:
    """(a memory:// URL holding a token dataset, extra arguments, secrets) for `shape`."""
    passwords, extra, secrets = SHAPES[shape]
    user = f"{KEY}:{passwords[0]}@" if passwords else ""
    base = f"memory://{user}sec-{shape}"
    buffer = io.BytesIO()
    table = pa.table({"ids": [[1, 2, 3, 4]] * 64, "tokens": [[5, 6, 7]] * 64})
    pq.write_table(table, buffer, row_group_size=16)
    fsspec.filesystem("memory").pipe(f"{base.split('://')[1]}/train/a.parquet", buffer.getvalue())
    return f"{base}/train", extra, secrets


def _command(name: str, url: str, out: Path, extra: list[str]) -> list[str]:
    """The command line of `name` on `url`, with `extra` options where they go (a
    group's options before its subcommand)."""
    if name.startswith("history"):
        # The history's own location holds the secret; the group takes the options.
        at = ["history", "--at", f"{url}-history", *extra]
        return at + {"history-list": ["list"], "history-show": ["show", "0123456789abcdef"],
                     "history-clear": ["clear", "--yes"]}[name]  # fmt: skip
    return _plain_command(name, url, out) + extra


def _plain_command(name: str, url: str, out: Path) -> list[str]:
    return {
        "inspect": ["inspect", url],
        "inspect-json": ["inspect", url, "--json"],
        "bench": ["bench", "--data", url, "-w", "tokens", "--samples", "64", "--batches", "2",
                  "--workers", "0", "--repeats", "1", "--no-progress", "--out", str(out)],
        "tune": ["tune", url, "--step-ms", "5", "--batches", "10", "--verify-batches", "5",
                 "--repeats", "1", "--max-workers", "1", "--out", str(out)],
        "index": ["index", url, "--tokens", "tokens"],
        "convert": ["convert", url, str(out / "shards")],
    }[name]  # fmt: skip


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("command", COMMANDS)
def test_no_secret_of_any_shape_in_any_output_or_file(
    capfd, tmp_path, monkeypatch, command, shape
) -> None:
    """Each command run with the secret in a bearer header, in key/secret/token options or
    in a URL password holding ' " @ or : (`iolib history`: in its location's URL and
    options): nothing printed and no file written (the output
    folder, the run history, the dataset's own folder: _metadata, token indexes) holds
    the secret."""
    monkeypatch.setenv("IOLIB_HISTORY", str(tmp_path / "history"))  # scanned below
    url, extra, secrets = _shape_data(shape)
    out = tmp_path / "out"
    args = _command(command, url, out, extra)
    code, output = _run(args, capfd)
    written = {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    if command == "tune":  # it ran, and recorded what it measured in the history
        assert code == 0, output
        assert any(p.startswith(str(tmp_path / "history")) for p in written), sorted(written)
    memory = fsspec.filesystem("memory")
    root = url.split("://")[1].rsplit("/", 1)[0]
    for path in memory.find(root):
        written[path] = memory.cat_file(path)
    leaked = [s for s in secrets if s in output]
    assert not leaked, (args, leaked, output)
    for path, data in written.items():
        assert not [s for s in secrets if s.encode() in data], (path, args)
    if command == "history-list":  # it opened the history and named where, masked
        assert code == 0 and "No runs recorded at memory://" in output, output
        assert "***@" in output or not shape.startswith("url"), output
    if command == "bench":  # the run ran and its record says what was asked, masked
        assert code == 0, output
        recorded = json.loads((out / "run.json").read_text())["command"]
        assert "***" in recorded and "--data" in recorded, recorded


def test_the_range_warning_names_no_password_with_a_quote(caplog) -> None:
    """The "server ignored a range request" warning quotes the file's URL: masked."""
    from iolib.sources.ranges import RangedFile

    caplog.set_level("WARNING")
    url = "http://user:Pqq7'Rss8@127.0.0.1:9/data.parquet"
    ranged = RangedFile.__new__(RangedFile)
    ranged.path, ranged.size, ranged._warned_ranges = url, 4, False
    ranged._whole_file(0, 2, b"abcd")
    assert "server ignored a range request" in caplog.text
    assert not [s for s in ("Pqq7'Rss8", "Rss8", "Pqq7") if s in caplog.text], caplog.text
    RangedFile._warned_ranges = False


@pytest.mark.parametrize("name", ["token", "sas_token", "key", "secret", "password"])
def test_each_sensitive_option_name_is_masked_wherever_its_value_appears(name) -> None:
    """The value under a sensitive name is a known secret: masked in free text too, where
    no `name=value` pattern can find it."""
    from iolib.base.redact import is_sensitive, redact_options, secrets_in

    assert is_sensitive(name)
    assert secrets_in(options={name: "Vq3zLm9w"}) == {"Vq3zLm9w"}
    assert redact_options({name: "Vq3zLm9w"}) == {name: "***"}
    assert Redactor([], {name: "Vq3zLm9w"})("denied for Vq3zLm9w") == "denied for ***"


def test_a_bearer_token_is_masked_alone_and_after_its_scheme() -> None:
    redact = Redactor([], {"headers": {"Authorization": f"Bearer {BEARER}"}})
    assert BEARER not in redact(f"sent {BEARER}") and redact(f"sent {BEARER}") == "sent ***"
    text = redact_text(f'{{"Authorization": "Bearer {BEARER}"}}')  # no known secret: the rule
    assert BEARER not in text and "Bearer ***" in text
