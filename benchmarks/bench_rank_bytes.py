"""Bytes each rank fetches in one epoch of packed token windows, on the throttled store.

The store and corpus of `bench_peers.py` (moto's S3 server behind the throttling proxy
that counts bytes and requests; documents of log-normal length as Parquet). The token
index and the `_metadata` summary are written beside the data first (`iolib index`,
straight to moto), as a multi-node user would. Then each rank r of `--world` runs one
epoch of `PackedTokens(lanes=...)` shuffled, in a fresh process with an empty local
cache, one rank after another; the proxy's counters are reset before each. Reported per
rank: bytes through the proxy, that over the corpus's stored bytes (target: at most
1.2 / world), requests, and what `loader.stats()` counted.

    python benchmarks/bench_rank_bytes.py --world 8 --row-group-mb 8 --row-group-mb 2

Writes benchmarks/results/rank-bytes.md and .json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run from a checkout: this checkout's iolib
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_peers import BUCKET, proxy_call, throttled_store, upload  # noqa: E402
from benchmarks.peers import formats  # noqa: E402

RANK = """
import json, sys, time
from iolib import DataLoader
from iolib.text import PackedTokens

spec = json.loads(sys.argv[1])
options = {"endpoint_url": spec["endpoint"], "key": "testing", "secret": "testing"}
lanes = spec["lanes"] if spec["lanes"] == "auto" else int(spec["lanes"])
windows = PackedTokens(spec["url"], column="tokens", seq_len=spec["seq_len"], eos_id=0,
                       storage_options=options, lanes=lanes)
loader = DataLoader(windows, batch_size=spec["batch"], shuffle=True, seed=0,
                    num_workers=spec["workers"], rank=spec["rank"], world_size=spec["world"])
start, tokens = time.perf_counter(), 0
for batch in loader:
    tokens += int(batch["input_ids"].numel())
stats = loader.stats()
print("RANK-RESULT " + json.dumps({"tokens": tokens, "epoch_s": time.perf_counter() - start,
      "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float))}}))
"""


def run_rank(spec: dict, proxy: str) -> dict[str, Any]:
    """One rank's epoch in a fresh process with an empty cache directory."""
    proxy_call(proxy, "reset")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=str(ROOT), IOLIB_CACHE_DIR=cache, TQDM_DISABLE="1")
        done = subprocess.run([sys.executable, "-c", RANK, json.dumps(spec)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
    lines = [x for x in done.stdout.splitlines() if x.startswith("RANK-RESULT ")]
    if done.returncode or not lines:
        raise click.ClickException(f"rank {spec['rank']} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(lines[-1].removeprefix("RANK-RESULT ")),
            "proxy": proxy_call(proxy, "stats")}  # fmt: skip


def index_beside(options: dict, url: str) -> None:
    """`iolib index URL --tokens tokens`, straight to moto (not through the proxy)."""
    from iolib.sources import ParquetSource
    from iolib.sources.summary import write_summary
    from iolib.storage import open_filesystem
    from iolib.text.tokenindex import write_beside

    storage = {k: v for k, v in options.items() if k != "skip_instance_cache"}
    fs, path = open_filesystem(url, storage)
    source = ParquetSource(url, storage_options=storage)
    write_summary(fs, path, [f.path for f in source.files])
    write_beside(ParquetSource(url, ["tokens"], storage), "tokens")


@click.command(context_settings={"show_default": True})
@click.option("--tokens", default=24_000_000, help="Tokens in the corpus (bench_peers').")
@click.option("--world", default=8, help="World size; every rank runs, one after another.")
@click.option("--lanes", default="auto", help="PackedTokens(lanes=): 'auto' or a number.")
@click.option("--row-group-mb", "row_group_mbs", multiple=True, type=float, default=(8.0,),
              help="Parquet row group size (repeat the option for several corpora).")  # fmt: skip
@click.option("--shard-mb", default=64.0, help="Parquet file size.")
@click.option("--seq-len", default=2048)
@click.option("--batch", default=16)
@click.option("--workers", default=2)
@click.option("--latency", default=0.04, help="Seconds to first byte of each response.")
@click.option("--conn-mbps", default=5.0, help="MB/s on one connection.")
@click.option("--total-mbps", default=20.0, help="MB/s over all connections.")
@click.option("--data", type=click.Path(path_type=Path), default=HERE / "data" / "rank-bytes")
@click.option("--out", type=click.Path(path_type=Path), default=HERE / "results")
def main(**opts: Any) -> None:
    """Bytes fetched by each rank of a world, over the corpus's bytes."""
    values, offsets = formats.token_documents(opts["tokens"])
    corpora = []
    with throttled_store(opts["latency"], opts["conn_mbps"], opts["total_mbps"]) as store:
        for rg_mb in opts["row_group_mbs"]:
            folder = opts["data"] / f"tokens{opts['tokens']}-rg{rg_mb:g}"
            formats.tokens_parquet(folder, values, offsets, opts["shard_mb"], rg_mb)
            prefix = f"rank-bytes/rg{rg_mb:g}"
            upload(store["direct"], str(folder), prefix)
            url = f"s3://{BUCKET}/{prefix}"
            index_beside(store["direct"], url)
            stored = formats.folder_bytes(str(folder))
            ranks = []
            for rank in tqdm(range(opts["world"]), desc=f"row groups {rg_mb:g} MB"):
                spec = {"url": url, "endpoint": store["proxy"], "rank": rank,
                        "world": opts["world"], "lanes": opts["lanes"],
                        "seq_len": opts["seq_len"], "batch": opts["batch"],
                        "workers": opts["workers"]}  # fmt: skip
                ranks.append({"rank": rank, **run_rank(spec, store["proxy"])})
            corpora.append({"row_group_mb": rg_mb, "stored_bytes": stored, "ranks": ranks,
                            "groups": _row_groups(folder)})  # fmt: skip
    write_report(corpora, opts)


def _row_groups(folder: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).num_row_groups for p in sorted(folder.glob("*.parquet")))


def write_report(corpora: list[dict], opts: dict) -> None:
    world, load = opts["world"], os.getloadavg()[0]
    lines = [
        f"# Bytes per rank at world size {world}, on the throttled store",
        "",
        f"`python benchmarks/bench_rank_bytes.py {' '.join(sys.argv[1:])}` — moto behind "
        f"the throttling proxy ({opts['latency'] * 1000:.0f} ms, {opts['conn_mbps']:g} MB/s a "
        f"connection, {opts['total_mbps']:g} MB/s in all); {opts['tokens']:,} tokens as "
        f"Parquet files of {opts['shard_mb']:g} MB; `PackedTokens(lanes={opts['lanes']!r})`, "
        f"shuffled, batch {opts['batch']} x {opts['seq_len']}, {opts['workers']} workers; "
        "`_metadata` and the token index beside the data; each rank one epoch in a fresh "
        "process with an empty cache, one after another. Fetched: bytes through the proxy "
        f"(footers, summary and index included). Target: at most 1.2/world = {1.2 / world:.3f} "
        f"of the stored bytes. Load average at the end: {load:.1f} (2 cores, shared).",
        "",
        "| row groups | stored MB | rank | fetched MB | fetched / stored | requests "
        "| stats() bytes_read MB | tokens |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for corpus in corpora:
        stored = corpus["stored_bytes"]
        for r in corpus["ranks"]:
            lines.append(
                f"| {corpus['groups']} of ~{corpus['row_group_mb']:g} MB | {stored / 1e6:.1f} "
                f"| {r['rank']} | {r['proxy']['bytes'] / 1e6:.2f} "
                f"| {r['proxy']['bytes'] / stored:.3f} | {r['proxy']['requests']} "
                f"| {r['stats'].get('bytes_read', 0) / 1e6:.2f} | {r['tokens']:,} |"
            )
    lines.append("")
    for corpus in corpora:
        shares = [r["proxy"]["bytes"] / corpus["stored_bytes"] for r in corpus["ranks"]]
        verdict = "met" if max(shares) <= 1.2 / world else "missed"
        lines.append(
            f"- row groups of ~{corpus['row_group_mb']:g} MB: per rank {min(shares):.3f}–"
            f"{max(shares):.3f} of the stored bytes (mean {sum(shares) / len(shares):.3f}; "
            f"target ≤ {1.2 / world:.3f}: {verdict}); all ranks together {sum(shares):.2f}x."
        )
    opts["out"].mkdir(parents=True, exist_ok=True)
    (opts["out"] / "rank-bytes.md").write_text("\n".join(lines) + "\n")
    (opts["out"] / "rank-bytes.json").write_text(json.dumps(corpora, indent=1, default=str))
    click.echo("\n".join(lines))


if __name__ == "__main__":
    main()
