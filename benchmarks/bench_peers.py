"""iolib side by side with the loaders its users would otherwise run, on one throttled
object store: MosaicML `streaming` (StreamingDataset over MDS), Lightning `litdata`
(StreamingDataset; TokensLoader for tokens) and WebDataset (images only).

The store: moto's S3 server on 127.0.0.1 behind a throttling reverse proxy
(benchmarks/peers/proxy.py: 40 ms to first byte, 5 MB/s a connection, 20 MB/s in all
by default), so every system pays the same per request and per byte, and the proxy
counts the bytes and requests each run made. The data, as each system's user would
write it (benchmarks/peers/formats.py): iolib's images by `iolib convert` with its
defaults, its tokens by pyarrow's default writer (`--row-group-mb` sets row groups
instead); the peers' by their own writers at their recommended shard size (64 MB).

- tokens: documents of log-normal length, windows of --seq-len. iolib:
  `iolib.text.PackedTokens` over Parquet + `iolib.DataLoader`; streaming: MDS windows
  (llm-foundry's concat_tokens layout); litdata: `optimize()` token chunks read with
  `TokensLoader(block_size=seq_len)`.
- images: JPEGs decoded, random-resized-cropped to 224x224, flipped, normalized.
  iolib: ParquetSource + `iolib.decode.images.ImagePipeline` (DALI on the CPU where installed);
  peers: PIL decode + crop in their dataset transform (benchmarks/peers/systems.py).

Each (system, workload) runs shuffled with --workers workers in a fresh process with an
empty local cache folder, every system with its default settings: a warm-up epoch cut
after its first batch (a `break`), then a whole epoch of the same loader, so what the
cut epoch leaves in flight counts. Rounds are interleaved, the order reversed every
other round. Reported per system (median [min-max] over rounds): the epoch rate, the
time to the first batch beside its physical floor (the bytes of the read units it needs
over the whole link, plus one request's latency), the bytes through the proxy before the
first batch, the link's MB/s during the epoch, the bytes fetched in the whole run
against those stored, peak PSS of the process tree (psutil, its timeline kept in the
JSON), the load average, and for iolib what `loader.stats()` counted.

Install (the peers never go into the project's venv: they may pull another torch):

    python3 -m venv /work/peers-venv
    /work/peers-venv/bin/pip install torch==2.13.0          # first, pinned (as the Makefile)
    /work/peers-venv/bin/pip install -e '.[test,s3]' -r benchmarks/requirements-peers.txt \\
        -c benchmarks/constraints-peers.txt                  # why: requirements-peers.txt

Run (about 15 minutes here with the defaults; --tokens/--images scale it up):

    /work/peers-venv/bin/python benchmarks/bench_peers.py
    /work/peers-venv/bin/python benchmarks/bench_peers.py --tokens 4000000 --images 300 \\
        --shard-mb 8 --rounds 1                              # a quick look

Writes benchmarks/results/peers-<date>.md and .json (--name another). A peer that
cannot be imported or run is reported with its error; the others still run.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import psutil
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run from a checkout: this checkout's iolib
    sys.path.insert(0, str(ROOT))

from benchmarks.peers import formats  # noqa: E402

SYSTEMS = ("iolib", "streaming", "litdata", "webdataset")
WORKLOADS = ("tokens", "images")
BUCKET = "iolib-bench"
PEER_MODULES = {"streaming": "streaming", "litdata": "litdata", "webdataset": "webdataset"}


# -- the store -------------------------------------------------------------------------
@contextlib.contextmanager
def throttled_store(latency: float, conn_mbps: float, total_mbps: float) -> Iterator[dict]:
    """moto's S3 server and the proxy in front of it, each in a child process."""
    from iolib.cli.bench.s3server import moto_s3

    with moto_s3(BUCKET) as options:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.peers.proxy", "--upstream",
             options["endpoint_url"], "--latency", str(latency),
             "--conn-mbps", str(conn_mbps), "--total-mbps", str(total_mbps)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            port = int(proxy.stdout.readline())
            yield {"direct": options, "proxy": f"http://127.0.0.1:{port}"}
        finally:
            proxy.stdin.close()
            try:
                proxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proxy.kill()


def proxy_call(proxy: str, what: str) -> dict:
    method = "POST" if what == "reset" else "GET"
    request = urllib.request.Request(f"{proxy}/__proxy__/{what}", method=method, data=None)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def upload(options: dict, folder: str, prefix: str) -> list[str]:
    """Every file of `folder` to s3://BUCKET/prefix/, straight to moto (not throttled)."""
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    keys = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.name != ".done":
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            fs.put_file(str(path), f"{BUCKET}/{key}")
            keys.append(key)
    return keys


def index_beside(options: dict, prefix: str) -> None:
    """`iolib index s3://.../prefix --tokens tokens`, straight to moto: the token index
    (and `_metadata`) beside the data, as docs/tokens.md says to do once for a corpus read
    more than once (the index is keyed by the stored files, so it is made where they are);
    without it each run's first epoch reads the corpus once more to count its tokens."""
    store = [a for k in ("endpoint_url", "key", "secret") for a in ("-o", f"{k}={options[k]}")]
    subprocess.run(
        [sys.executable, "-m", "iolib.cli", "index", f"s3://{BUCKET}/{prefix}", "--tokens",
         "tokens", *store], cwd=ROOT, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip


def presigned(proxy: str, keys: list[str]) -> list[str]:
    """GET URLs of `keys` through the proxy, as a WebDataset user hands `curl`."""
    import boto3

    client = boto3.client(
        "s3", endpoint_url=proxy, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    )  # fmt: skip
    return [
        client.generate_presigned_url("get_object", {"Bucket": BUCKET, "Key": k}, ExpiresIn=86400)
        for k in keys
    ]


# -- one run ---------------------------------------------------------------------------
def rollup(pid: int) -> dict:
    """A process's resident set and PSS as /proc/<pid>/smaps_rollup splits them (bytes)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                out[key.lower()] = int(rest.split()[0]) * 1024
    return out


class TreeMemory:
    """Peak RSS and PSS (summed over a process and its descendants), sampled; at the
    peak PSS, each process's share (`at_peak`: pid, its command, threads, smaps_rollup's
    split), to tell the parent's memory from its workers'."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.root, self.every = psutil.Process(pid), every
        self.rss = self.pss = 0
        self.at_peak: list[dict] = []
        self.began = time.perf_counter()
        self.timeline: list[tuple[float, int, int]] = []  # (s, PSS bytes, processes)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            rss = pss = 0
            try:
                tree = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            parts = []
            for process in tree:
                with contextlib.suppress(psutil.Error, OSError, ValueError):
                    info = rollup(process.pid)
                    rss += info.get("rss", 0)
                    pss += info.get("pss", 0)
                    parts.append({"pid": process.pid, "threads": process.num_threads(),
                                  "cmd": " ".join(process.cmdline())[-80:], **info})  # fmt: skip
            self.rss = max(self.rss, rss)
            if pss > self.pss:
                self.pss, self.at_peak = pss, parts
            self.timeline.append((round(time.perf_counter() - self.began, 2), pss, len(tree)))
            self.stop.wait(self.every)

    def close(self) -> dict:
        self.stop.set()
        self.thread.join()
        return {"peak_rss": self.rss, "peak_pss": self.pss, "pss_timeline": self.timeline,
                "at_peak": self.at_peak}  # fmt: skip


def run_one(spec: dict, proxy: str, timeout: float) -> dict:
    proxy_call(proxy, "reset")
    spec = dict(spec, proxy_stats=f"{proxy}/__proxy__/stats")
    load_before = os.getloadavg()[0]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.peers.systems", json.dumps(spec)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    memory = TreeMemory(child.pid)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for process in psutil.Process(child.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                process.kill()
        child.kill()
        out, err = child.communicate()
        err += f"\ntimed out after {timeout:.0f} s"
    result: dict[str, Any] = memory.close()
    result["proxy"] = proxy_call(proxy, "stats")
    result["load_avg_1min"] = [load_before, os.getloadavg()[0]]
    lines = [line for line in out.splitlines() if line.startswith("PEERS-RESULT ")]
    if child.returncode == 0 and lines:
        result.update(json.loads(lines[-1].removeprefix("PEERS-RESULT ")))
    else:
        tail = [line for line in err.strip().splitlines() if line.strip()][-6:]
        result["error"] = f"exit {child.returncode}: " + " | ".join(tail)[-1200:]
        result["stderr_tail"] = err[-4000:]
    return result


def importable(system: str) -> str | None:
    """None where the peer imports in a fresh process, else the error."""
    if system == "iolib":
        return None
    code = (
        "from benchmarks.peers.systems import _torchvision_or_stand_in as f; f(); "
        f"import {PEER_MODULES[system]}"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    if done.returncode == 0:
        return None
    return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "import failed"


# -- the report ------------------------------------------------------------------------
def _span(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return (
        fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"
    )


def summarize(runs: list[dict], stored: dict, needed: dict) -> dict:
    """{workload: {system: summary}} from the runs, errors kept."""
    out: dict = {}
    for run in runs:
        key = (run["workload"], run["system"])
        entry = out.setdefault(run["workload"], {}).setdefault(
            run["system"], {"runs": [], "errors": [], "stored_bytes": stored.get(key, 0),
                            "first_batch_bytes": needed.get(key, 0)}
        )  # fmt: skip
        (entry["errors"] if "error" in run else entry["runs"]).append(run)
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _med(values: list[float], fmt: str) -> str:
    """Median [min–max] of `values` in `fmt` (the median alone for one value)."""
    if not values:
        return "-"
    mid = _median(values)
    if len(values) == 1:
        return fmt.format(mid)
    return f"{fmt.format(mid)} [{_span(values, fmt)}]"


def floor_s(needed: int, cfg: dict) -> float:
    """The physical floor of a first batch: the bytes it needs over the whole link, plus
    one request's latency."""
    return needed / (cfg["total_mbps"] * 1e6) + cfg["latency"]


def _row(system: str, entry: dict, unit: str, best_peer: float | None, cfg: dict) -> str:
    runs = entry["runs"]
    if not runs:
        return f"| {system} | failed: {entry['errors'][0]['error'][:300]} |" + " |" * 8
    scale, fmt = (1e6, "{:.2f}") if unit == "tokens" else (1, "{:.0f}")
    epoch = [r["epoch_rate"] / scale for r in runs]
    ratio = "-"
    if best_peer and system == "iolib":
        ratio = f"{_median(epoch) * scale / best_peer:.2f}x"
    floor = floor_s(entry["first_batch_bytes"], cfg)
    total = cfg["total_mbps"]
    link = [r["link_mbps"] for r in runs]
    stored = max(entry["stored_bytes"], 1)
    fetched = [r["bytes_total"] / 1e6 for r in runs]
    ratio_fetched = [r["bytes_total"] / stored for r in runs]
    loads = [x for r in runs for x in r.get("load_avg_1min", [])]
    return (
        f"| {system} | {_med(epoch, fmt)} | {ratio} "
        f"| {_med([r['first_batch_s'] for r in runs], '{:.1f}')} "
        f"| {floor:.1f} ({entry['first_batch_bytes'] / 1e6:.1f} MB) "
        f"| {_med([r['bytes_before_first_batch'] / 1e6 for r in runs], '{:.0f}')} "
        f"| {_med(link, '{:.1f}')} ({100 * _median(link) / total:.0f}%) "
        f"| {_med(fetched, '{:.0f}')} / {stored / 1e6:.0f} "
        f"({_span(ratio_fetched, '{:.2f}')}x) "
        f"| {_med([r['peak_pss'] / 1e6 for r in runs], '{:,.0f}')} "
        f"| {_span(loads, '{:.1f}')} |"
    )


def breakdown(run: dict) -> str:
    """Where a run's peak PSS was, in MB: each process's anonymous / file-backed share
    (smaps_rollup) and threads; for iolib, what its process held at its own highest
    sample (benchmarks/peers/systems.py: Arrow, malloc in use and free, the cache)."""
    procs = "; ".join(
        f"pid {p['pid']} ({p.get('threads', 0)} threads): {p.get('pss', 0) / 1e6:.0f} = "
        f"{p.get('pss_anon', 0) / 1e6:.0f} anon + {p.get('pss_file', 0) / 1e6:.0f} file"
        for p in run["at_peak"]
    )
    samples = [p for p in run.get("memory_parts", []) if not p.get("what")]
    imported = [p for p in run.get("memory_parts", []) if p.get("what") == "imported"]
    if not samples:
        return procs
    top = max(samples, key=lambda p: p.get("pss", 0))
    held = ", ".join(
        f"{label} {top.get(key, 0) / 1e6:.0f}"
        for key, label in (("arrow", "Arrow"), ("malloc_used", "malloc in use"),
                           ("malloc_free", "malloc free"), ("cache_held", "cache"))
    )  # fmt: skip
    base = f"after imports {imported[0]['pss'] / 1e6:.0f} PSS; " if imported else ""
    return f"{procs}; {base}its highest sample: PSS {top.get('pss', 0) / 1e6:.0f}, {held}"


def write_report(results: dict, out: Path, name: str) -> str:
    cfg, facts = results["config"], results["facts"]
    lines = [
        "# iolib and its peers on one throttled object store",
        "",
        f"{results['when']}, {results['machine']}. Command: `{results['command']}`.",
        "",
        f"Store: moto's S3 server on 127.0.0.1 behind a throttling proxy: "
        f"{cfg['latency'] * 1000:.0f} ms to first byte, {cfg['conn_mbps']:g} MB/s a connection, "
        f"{cfg['total_mbps']:g} MB/s in all. Shuffled, {cfg['workers']} workers. Each run, in "
        "a fresh process with an empty local cache: a warm-up epoch cut after its first "
        "batch, then a whole epoch of the same loader. "
        f"{cfg['rounds']} interleaved rounds; figures are median [min–max] over them. "
        "Peers: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()) + ".",
        "",
        "Columns: epoch rate (the measured epoch, its first batch included) and iolib's ratio "
        "to the fastest peer; first batch (s from the dataset's construction, the warm-up "
        "epoch); the physical floor of a first batch (the bytes of the read units it needs, "
        "as the format lays them out, over the whole link, plus one request's latency); MB "
        "through the proxy before the first batch; the link's mean MB/s over the measured "
        "epoch (and its share of the total); MB fetched in the whole run, warm-up included, "
        "/ MB stored in that system's format; peak PSS of the process tree (MB, sampled "
        "every 0.2 s); the 1-minute load average before and after the run "
        f"({os.cpu_count()} cores).",
        "",
    ]  # fmt: skip
    for workload, systems in results["summary"].items():
        unit = "tokens" if workload == "tokens" else "samples"
        if workload == "tokens":
            t = facts.get("tokens", {})
            lines += [
                f"## Tokens: windows of {cfg['seq_len']}, batch {cfg['token_batch']}",
                "",
                f"{t.get('documents', 0):,} documents of log-normal length (median "
                f"{t.get('median_document', 0):.0f} tokens), {t.get('tokens_with_eos', 0):,} "
                f"tokens with eos ({t.get('raw_bytes', 0) / 1e6:.0f} MB as int32). Rates in "
                "M tokens/s. iolib's Parquet: "
                + (f"row groups of {cfg['row_group_mb']:g} MB" if cfg["row_group_mb"] else
                   "pyarrow's default writer (`pq.write_table`, one row group a file)")
                + f", files of {cfg['shard_mb']:g} MB.",
            ]  # fmt: skip
        else:
            i = facts.get("images", {})
            lines += [
                f"## Images: JPEG to 224x224, batch {cfg['image_batch']}",
                "",
                f"{i.get('images', 0):,} JPEGs of 192–320 px sides, "
                f"{i.get('jpeg_bytes', 0) / 1e6:.0f} MB. Rates in samples/s. iolib's Parquet: "
                "`iolib convert` with its defaults.",
            ]
        peers = [
            _median([r["epoch_rate"] for r in e["runs"]])
            for s, e in systems.items() if e["runs"] and s != "iolib"
        ]  # fmt: skip
        best_peer = max(peers, default=None)
        lines += [
            "",
            f"| system | epoch {unit}/s | vs fastest peer | first batch s | floor s "
            f"| MB before first batch | link MB/s (of {cfg['total_mbps']:g}) "
            "| MB fetched / stored | peak PSS MB | load |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        lines += [_row(s, e, unit, best_peer, cfg) for s, e in systems.items()]
        lines.append("")
        for system, entry in systems.items():
            for run in entry["runs"]:
                if system == "iolib" and "iolib_stats" in run:
                    stats = run["iolib_stats"]
                    keep = {k: v for k, v in stats.items() if "byte" in k or k.startswith(
                        ("row_group", "cache", "requests", "storage", "fetch"))}  # fmt: skip
                    lines.append(
                        f"- iolib `loader.stats()`, round {run['round']}: `{json.dumps(keep)}`"
                    )
            for run in entry["runs"]:
                if run.get("at_peak"):
                    lines.append(f"- {system}, round {run['round']}, at the peak: {breakdown(run)}")
            for run in entry["errors"]:
                lines.append(f"- {system} round {run['round']} failed: `{run['error']}`")
            notes = {json.dumps(r.get("notes")) for r in entry["runs"] if r.get("notes")}
            for note in sorted(notes):
                lines.append(f"- {system}: {note}")
        lines.append("")
    if results["skipped"]:
        lines += ["## Not run", ""]
        lines += [f"- {s}: `{why}`" for s, why in results["skipped"].items()]
        lines.append("")
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text)
    # One line: the memory timelines (a sample every 0.2 s a run) would take ~80,000 lines.
    (out / f"{name}.json").write_text(json.dumps(results, default=str) + "\n")
    return text


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("mosaicml-streaming", "litdata", "webdataset", "torch", "pyarrow"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


# -- the command -----------------------------------------------------------------------
@click.command(context_settings={"show_default": True})
@click.option("--tokens", default=24_000_000, help="Tokens in the corpus.")
@click.option("--images", default=2_000, help="JPEGs in the image set.")
@click.option("--seq-len", default=2048)
@click.option("--token-batch", default=16, help="Windows a batch.")
@click.option("--image-batch", default=64, help="Images a batch.")
@click.option("--workers", default=2, help="Loader workers of every system.")
@click.option("--rounds", default=2, help="Interleaved rounds (one epoch per system each).")
@click.option("--shard-mb", default=64.0, help="Shard size of every format.")
@click.option(
    "--row-group-mb",
    default=0.0,
    help="Row group size of iolib's token Parquet (0: pyarrow's default writer).",
)
@click.option("--cache-mb", default=0.0, help="PackedTokens(cache_bytes=) (0: its default).")
@click.option("--image-cache-mb", default=0.0,
              help="iolib's ParquetSource(cache_bytes=) for images (0: its default).")  # fmt: skip
@click.option("--image-window-mb", default=0.0,
              help="iolib's ParquetSource(shuffle_window=) for images, in MiB (0: its default, "
              "a full shuffle).")  # fmt: skip
@click.option(
    "--decode-threads", default=0, help="ImagePipeline(threads=) of iolib (0: its default)."
)
@click.option("--image-backend", default="auto", type=click.Choice(["auto", "dali", "pil"]),
              help="iolib's ImagePipeline(backend=) for images.")  # fmt: skip
@click.option("--latency", default=0.04, help="Seconds to first byte of each response.")
@click.option("--conn-mbps", default=5.0, help="MB/s on one connection.")
@click.option("--total-mbps", default=20.0, help="MB/s over all connections.")
@click.option("--system", "systems", multiple=True, type=click.Choice(SYSTEMS),
              default=SYSTEMS, help="Systems to run (repeat the option).")  # fmt: skip
@click.option("--workload", "workloads", multiple=True, type=click.Choice(WORKLOADS),
              default=WORKLOADS, help="Workloads to run (repeat the option).")  # fmt: skip
@click.option("--data", type=click.Path(path_type=Path), default=HERE / "data" / "peers")
@click.option("--out", type=click.Path(path_type=Path), default=HERE / "results")
@click.option(
    "--iolib-path",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Run iolib from this checkout (its iolib/ ahead of this one's).",
)
@click.option("--settle-s", default=3.0,
              help="Seconds the process waits after dropping the loader, so what it still "
              "reads is counted.")  # fmt: skip
@click.option("--name", default=None, help="Results file name under --out (default peers-<date>).")
@click.option("--timeout", default=900.0, help="Seconds one epoch may take before it is killed.")
@click.option("--streaming-start-method", default="spawn",
              type=click.Choice(["fork", "spawn", "forkserver"]),
              help="streaming's DataLoader worker start method (see the report).")  # fmt: skip
def main(**opts: Any) -> None:
    """iolib against MosaicML streaming, litdata and WebDataset on one throttled store."""
    began = time.perf_counter()
    skip = ("data", "out", "systems", "workloads", "name")
    cfg = {k: v for k, v in opts.items() if k not in skip}
    skipped = {s: why for s in opts["systems"] if (why := importable(s))}
    systems = [s for s in opts["systems"] if s not in skipped]
    for system, why in skipped.items():
        click.echo(f"{system}: cannot import, skipped: {why}", err=True)
    made = formats.make_all(opts["data"], cfg, systems, list(opts["workloads"]))
    plan = [
        (w, s) for w in opts["workloads"] for s in systems
        if not (w == "tokens" and s == "webdataset")
    ]  # fmt: skip
    runs, stored, needed = [], {}, {}
    with throttled_store(cfg["latency"], cfg["conn_mbps"], cfg["total_mbps"]) as store:
        keys = {}
        for workload, system in tqdm(plan, desc="upload", unit="dataset"):
            folder = made["folders"][workload][system]
            keys[workload, system] = upload(store["direct"], folder, f"{workload}/{system}")
            if (workload, system) == ("tokens", "iolib"):
                index_beside(store["direct"], f"{workload}/{system}")
            stored[workload, system] = formats.folder_bytes(folder)
            needed[workload, system] = formats.first_batch_bytes(
                workload, system, folder, cfg, made["facts"]
            )
        jobs = []
        for r in range(cfg["rounds"]):
            order = plan if r % 2 == 0 else plan[::-1]
            jobs += [(r, w, s) for w, s in order]
        bar = tqdm(jobs, desc="epochs", unit="epoch")
        for r, workload, system in bar:
            bar.set_postfix_str(f"{workload} {system} round {r}")
            spec = {
                "system": system, "workload": workload, "round": r, "bucket": BUCKET,
                "prefix": f"{workload}/{system}", "endpoint": store["proxy"],
                "workers": cfg["workers"], "seq_len": cfg["seq_len"],
                "batch": cfg["token_batch"] if workload == "tokens" else cfg["image_batch"],
                "cache_mb": cfg["cache_mb"], "decode_threads": cfg["decode_threads"],
                "image_cache_mb": cfg["image_cache_mb"], "image_backend": cfg["image_backend"],
                "image_window_mb": cfg["image_window_mb"],
                "iolib_path": cfg["iolib_path"], "settle_s": cfg["settle_s"],
            }  # fmt: skip
            if system == "streaming":
                # Forked workers stalled ~60 s before their first request (none in flight
                # at the proxy) in about half the epochs here, and twice read a shard cut
                # short; spawned workers did neither in repeated runs.
                spec["start_method"] = cfg["streaming_start_method"]
            if system == "webdataset":
                spec["urls"] = presigned(store["proxy"], [k for k in keys[workload, system]])
            run = run_one(spec, store["proxy"], cfg["timeout"])
            runs.append({"system": system, "workload": workload, "round": r, **run})
            if "error" in run:
                tqdm.write(f"{workload} {system} round {r}: {run['error'][:400]}")
    results = {
        "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "command": " ".join(["python benchmarks/bench_peers.py", *sys.argv[1:]]),
        "config": cfg, "facts": made["facts"], "versions": versions(), "skipped": skipped,
        "summary": summarize(runs, stored, needed), "runs": runs,
        "wall_s": time.perf_counter() - began,
    }  # fmt: skip
    name = opts["name"] or f"peers-{datetime.now(timezone.utc):%Y-%m-%d}"
    click.echo(write_report(results, opts["out"], name))


def rewrite(json_path: Path) -> str:
    """The report again from a run's JSON (after a change to how it is written)."""
    results = json.loads(json_path.read_text())
    return write_report(results, json_path.parent, json_path.stem)


if __name__ == "__main__":
    main()
