"""One epoch of one system on one workload, in this process; prints one JSON line.

    python -m benchmarks.peers.systems '{"system": "iolib", "workload": "tokens", ...}'

The benchmark runs each (system, round) in a fresh process with a fresh local cache
folder, removed afterwards: nothing survives from one epoch to the next (the caches
are emptied between epochs), and the process tree's memory is that run's alone.
Times start after the imports, at the dataset's construction. Each run is a warm-up
epoch cut after its first batch (a `break`: the time to a first batch), then a whole
epoch of the same loader (the epoch rate), in one process, so what the cut epoch left
in flight counts in the bytes and in the link's use.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import io
import json
import math
import os
import random
import resource
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


# -- what each peer's user writes for images: PIL decode, random-resized crop, flip ----
def pil_train_image(data: bytes, size: int = 224) -> torch.Tensor:
    """torchvision's RandomResizedCrop(size) + RandomHorizontalFlip + ToTensor +
    Normalize, done with PIL alone (same defaults: scale 0.08-1, ratio 3/4-4/3)."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (size, size))  # JPEG: decode at a reduced scale where it can
    image = image.convert("RGB")
    width, height = image.size
    box = (0, 0, width, height)
    for _ in range(10):
        area = width * height * random.uniform(0.08, 1.0)
        ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < w <= width and 0 < h <= height:
            x, y = random.randint(0, width - w), random.randint(0, height - h)
            box = (x, y, x + w, y + h)
            break
    image = image.resize((size, size), Image.BILINEAR, box=box)
    if random.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float().div_(255)
    return (pixels - MEAN) / STD


def _torchvision_or_stand_in() -> str:
    """streaming imports torchvision.datasets at import time (for its vision datasets,
    unused here). PyPI's torchvision wheel is CUDA-built and cannot load beside a CPU
    torch (libc10_cuda.so); then a stand-in of the two names it imports takes its place.
    Returns what happened, for the report."""
    try:
        import torchvision  # noqa: F401

        return "torchvision imported"
    except Exception as exc:
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        reason = f"{type(exc).__name__}: {exc}"
    vision = types.ModuleType("torchvision")
    vision.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    datasets = types.ModuleType("torchvision.datasets")
    datasets.VisionDataset = type("VisionDataset", (torch.utils.data.Dataset,), {})
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.to_tensor = lambda image: torch.from_numpy(np.asarray(image))
    vision.datasets, vision.transforms, transforms.functional = datasets, transforms, functional
    sys.modules.update(
        {
            "torchvision": vision,
            "torchvision.datasets": datasets,
            "torchvision.transforms": transforms,
            "torchvision.transforms.functional": functional,
        }
    )
    return f"torchvision stand-in (import failed: {reason[:200]})"


# -- the loaders -----------------------------------------------------------------------
def _s3_options(spec: dict) -> dict:
    return {"endpoint_url": spec["endpoint"], "key": "testing", "secret": "testing"}


def iolib_loader(spec: dict) -> tuple[Any, Callable[[Any], int], dict]:
    import iolib
    from iolib.sources import ParquetSource
    from iolib.text import PackedTokens

    url = f"s3://{spec['bucket']}/{spec['prefix']}/*.parquet"
    options, notes = _s3_options(spec), {"iolib": os.path.dirname(iolib.__file__)}
    common = dict(shuffle=True, seed=spec["round"], num_workers=spec["workers"])
    if spec["workload"] == "tokens":
        kwargs: dict[str, Any] = dict(column="tokens", seq_len=spec["seq_len"], eos_id=0)
        if spec["cache_mb"]:  # memory only: the order follows shuffle_window, kept default
            kwargs["cache_bytes"] = int(spec["cache_mb"] * 2**20)
        notes["packed_tokens_kwargs"] = sorted(kwargs)
        windows = PackedTokens(url, storage_options=options, **kwargs)
        loader = iolib.DataLoader(windows, batch_size=spec["batch"], **common)
        return loader, lambda b: int(b["input_ids"].numel()), notes
    from iolib.decode.images import ImagePipeline

    backend = spec.get("image_backend") or "auto"
    threads = {"threads": spec["decode_threads"]} if spec.get("decode_threads") else {}
    decode = ImagePipeline(size=224, device="cpu", backend=backend, **threads)
    notes["image_backend"] = decode.backend
    if decode.backend == "auto":
        dali = importlib.util.find_spec("nvidia") and importlib.util.find_spec("nvidia.dali")
        notes["image_backend"] = "auto: DALI (CPU)" if dali else "auto: Pillow"
    # A cache below the data comes with a window of half of it (shuffle=True shuffles
    # within windows, as before the window was its own argument); None keeps the
    # default (all of it here, a global shuffle).
    cache = int(spec["image_cache_mb"] * 2**20) if spec.get("image_cache_mb") else None
    window = {"shuffle_window": cache // 2} if cache else {}
    if spec.get("image_window_mb"):
        window = {"shuffle_window": int(spec["image_window_mb"] * 2**20)}
    notes["image_shuffle_window"] = window.get("shuffle_window")
    source = ParquetSource(url, storage_options=options, cache_bytes=cache, **window)
    notes["image_cache_bytes"] = cache
    loader = iolib.DataLoader(source, batch_size=spec["batch"], decode=decode, **common)
    return loader, lambda b: len(b["label"]), notes


def _token_windows(sample: dict) -> torch.Tensor:
    return torch.from_numpy(np.asarray(sample["tokens"], dtype=np.int64))


def _image_sample(sample: dict) -> tuple[torch.Tensor, int]:
    return pil_train_image(sample["image"]), int(sample["label"])


def _mosaic_class(name: str) -> type:
    """streaming's StreamingDataset with this benchmark's sample conversion, made on first
    use (streaming imports torchvision, see `_torchvision_or_stand_in`) and reachable as a
    module attribute, so spawned workers can unpickle it."""
    _torchvision_or_stand_in()
    from streaming import StreamingDataset

    convert = _token_windows if name == "MosaicWindows" else _image_sample

    def __getitem__(self, index: int) -> Any:
        return convert(StreamingDataset.__getitem__(self, index))

    made = type(name, (StreamingDataset,), {"__getitem__": __getitem__, "__module__": __name__})
    globals()[name] = made
    return made


def __getattr__(name: str) -> Any:
    if name in ("MosaicWindows", "MosaicImages"):
        return _mosaic_class(name)
    raise AttributeError(name)


def streaming_loader(spec: dict) -> tuple[Any, Callable[[Any], int], dict]:
    notes = {"torchvision": _torchvision_or_stand_in()}
    os.environ.update(
        S3_ENDPOINT_URL=spec["endpoint"], AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    from streaming import StreamingDataLoader
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    name = "MosaicWindows" if spec["workload"] == "tokens" else "MosaicImages"
    dataset = _mosaic_class(name)(
        remote=f"s3://{spec['bucket']}/{spec['prefix']}", local=spec["cache_dir"],
        shuffle=True, shuffle_seed=spec["round"], batch_size=spec["batch"],
    )  # fmt: skip
    context = spec.get("start_method")
    if context:
        notes["start_method"] = context
    loader = StreamingDataLoader(
        dataset, batch_size=spec["batch"], num_workers=spec["workers"],
        multiprocessing_context=context,
    )  # fmt: skip
    return loader, _count(spec), notes


def litdata_loader(spec: dict) -> tuple[Any, Callable[[Any], int], dict]:
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader
    from litdata.streaming.item_loader import TokensLoader

    # litdata downloads with obstore, which refuses plain http unless its client is told
    # (a real endpoint is https; this one is the proxy on 127.0.0.1). No setting reaches
    # it, so its module-level client options get the one key.
    if hasattr(downloader, "_OBSTORE_CLIENT_OPTIONS"):
        downloader._OBSTORE_CLIENT_OPTIONS = {
            **downloader._OBSTORE_CLIENT_OPTIONS,
            "allow_http": True,
        }

    options = {
        "endpoint_url": spec["endpoint"], "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing", "region_name": "us-east-1",
    }  # fmt: skip
    common = dict(
        input_dir=f"s3://{spec['bucket']}/{spec['prefix']}", cache_dir=spec["cache_dir"],
        shuffle=True, seed=spec["round"], storage_options=options,
    )  # fmt: skip
    if spec["workload"] == "tokens":
        dataset = StreamingDataset(item_loader=TokensLoader(block_size=spec["seq_len"]), **common)
    else:
        dataset = StreamingDataset(transform=_image_sample, **common)
    loader = StreamingDataLoader(dataset, batch_size=spec["batch"], num_workers=spec["workers"])
    return loader, _count(spec), {}


def webdataset_loader(spec: dict) -> tuple[Any, Callable[[Any], int], dict]:
    import webdataset as wds

    shards = spec["urls"]  # presigned GET URLs through the proxy, read with curl
    urls = [f"pipe:curl -s -f -L '{url}'" for url in shards]
    random.seed(spec["round"])
    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=spec["round"], empty_check=False)
        .shuffle(1000)
        .map(lambda s: (pil_train_image(s["jpg"]), int(s["cls"])))
        .batched(spec["batch"], partial=True)
    )
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=spec["workers"])
    return loader, lambda b: len(b[1]), {"shards": len(shards)}


def _count(spec: dict) -> Callable[[Any], int]:
    if spec["workload"] == "tokens":
        return lambda b: int(b.numel())
    return lambda b: len(b[1])


LOADERS = {
    "iolib": iolib_loader,
    "streaming": streaming_loader,
    "litdata": litdata_loader,
    "webdataset": webdataset_loader,
}


def _import_iolib() -> None:
    import iolib
    import iolib.decode.images
    import iolib.sources
    import iolib.text  # noqa: F401


def _import_streaming() -> None:
    _torchvision_or_stand_in()
    import streaming  # noqa: F401


def _import_litdata() -> None:
    import litdata
    import litdata.streaming.item_loader  # noqa: F401


def _import_webdataset() -> None:
    import webdataset  # noqa: F401


# What each loader function imports, imported before the clock starts (the module
# docstring's "after the imports"): iolib's took 0.4-0.7 s of its first batch here, while
# webdataset's takes 0.02 s. What a system imports lazily on first use (DALI, Pillow) stays
# in its first batch.
IMPORTS = {
    "iolib": _import_iolib,
    "streaming": _import_streaming,
    "litdata": _import_litdata,
    "webdataset": _import_webdataset,
}


def proxy_bytes(spec: dict) -> int:
    """Response bytes the proxy has passed since the run began (its control calls are
    not counted)."""
    import urllib.request

    url = spec.get("proxy_stats")
    if not url:
        return 0
    with urllib.request.urlopen(url, timeout=30) as response:
        return int(json.loads(response.read())["bytes"])


def warm_up(loader: Iterable, start: float, spec: dict) -> dict:
    """The first batch of an epoch, then the epoch dropped (a `break` out of the loop):
    what a user pays to start, and what a cut epoch leaves behind."""
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - start
    fetched = proxy_bytes(spec)
    del iterator
    return {"first_batch_s": first, "bytes_before_first_batch": fetched}


def run_epoch(loader: Iterable, count: Callable[[Any], int], spec: dict) -> dict:
    """One whole epoch; the proxy's bytes during it give the link's use."""
    before = proxy_bytes(spec)
    start = time.perf_counter()
    first_at, first_units, units, batches = None, 0, 0, 0
    for batch in loader:
        n = count(batch)
        units += n
        batches += 1
        if first_at is None:
            first_at, first_units = time.perf_counter(), n
    end = time.perf_counter()
    first_at = first_at or end
    during = proxy_bytes(spec) - before
    return {
        "epoch_first_batch_s": first_at - start,
        "epoch_s": end - start,
        "units": units,
        "batches": batches,
        "epoch_rate": units / (end - start),
        "steady_rate": (units - first_units) / max(end - first_at, 1e-9),
        "epoch_bytes": during,
        "link_mbps": during / (end - start) / 1e6,
    }


class ArrowTrace:
    """Arrow's allocations in this process over time, every 0.2 s: (s, bytes allocated,
    the pool's peak so far), to tell Arrow's share of the tree's PSS from the rest; and
    beside it (`parts`) what else holds memory here: glibc malloc's bytes in use and
    free-but-kept, the resident set, threads, and the loader's cache where it has one
    (`watch`)."""

    def __init__(self) -> None:
        import threading

        import pyarrow as pa

        self.samples: list[tuple[float, int, int]] = []
        self.parts: list[dict] = []
        self.loader: Any = None
        self.stop = threading.Event()
        began = time.perf_counter()
        self.parts.append({"s": 0.0, "what": "torch imported", **memory_parts()})

        def run() -> None:
            while not self.stop.wait(0.2):
                now = round(time.perf_counter() - began, 2)
                pool = pa.default_memory_pool()  # the current one: iolib may switch it
                self.samples.append((now, pa.total_allocated_bytes(), pool.max_memory()))
                part = {"s": now, **memory_parts()}
                with contextlib.suppress(Exception):
                    if self.loader is not None:
                        stats = self.loader.stats()
                        part["cache_held"] = int(stats.get("cache_held_bytes", 0) or 0)
                        part["in_flight"] = int(stats.get("bytes_in_flight", 0) or 0)
                self.parts.append(part)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self) -> list[tuple[float, int, int]]:
        self.stop.set()
        self.thread.join()
        return self.samples


def memory_parts() -> dict:
    """This process now: resident and PSS split as smaps_rollup splits them, glibc
    malloc's bytes in use (`malloc_used`, its mmapped blocks included) and free but
    resident in its arenas (`malloc_free`), Arrow's allocated bytes, and threads."""
    import ctypes

    import pyarrow as pa

    out: dict = {"arrow": pa.total_allocated_bytes(), "threads": threading_count()}
    with contextlib.suppress(OSError, ValueError), open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                out[key.lower()] = int(rest.split()[0]) * 1024
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        fields = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                  "uordblks", "fordblks", "keepcost")  # fmt: skip

        class MallInfo2(ctypes.Structure):
            _fields_ = [(f, ctypes.c_size_t) for f in fields]

        libc.mallinfo2.restype = MallInfo2
        info = libc.mallinfo2()
        out["malloc_used"] = info.uordblks + info.hblkhd
        out["malloc_free"] = info.fordblks
    return out


def _vmstat() -> dict:
    """The kernel's counts of huge-page faults and compaction (`/proc/vmstat`; {} where
    there is none): a large NumPy array is madvised for huge pages, and faulting one in
    may stall on compaction."""
    keep = ("thp_fault_alloc", "compact_stall", "compact_isolated")
    with contextlib.suppress(OSError), open("/proc/vmstat") as f:
        return {k: int(v) for k, v in (line.split() for line in f) if k in keep}
    return {}


def threading_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def main(spec: dict) -> dict:
    torch.set_num_threads(1)
    trace = ArrowTrace()
    with tempfile.TemporaryDirectory(prefix=f"peers-{spec['system']}-") as cache:
        spec = dict(spec, cache_dir=str(Path(cache) / "local"))
        os.environ["IOLIB_CACHE_DIR"] = str(Path(cache) / "iolib")  # nothing from a past run
        IMPORTS[spec["system"]]()
        trace.parts.append({"s": 0.0, "what": "imported", **memory_parts()})
        start = time.perf_counter()
        loader, count, notes = LOADERS[spec["system"]](spec)
        if spec["system"] == "iolib":
            trace.loader = loader
        result = warm_up(loader, start, spec)
        used, kernel = resource.getrusage(resource.RUSAGE_SELF), _vmstat()
        result.update(run_epoch(loader, count, spec))
        after, kernel_after = resource.getrusage(resource.RUSAGE_SELF), _vmstat()
        # CPU and page faults of the measured epoch (this process; threads included):
        # what mapping large blocks on their own costs shows as faults and system time.
        result["epoch_cpu"] = {
            "user_s": after.ru_utime - used.ru_utime,
            "sys_s": after.ru_stime - used.ru_stime,
            "minor_faults": after.ru_minflt - used.ru_minflt,
            "voluntary_switches": after.ru_nvcsw - used.ru_nvcsw,
            "involuntary_switches": after.ru_nivcsw - used.ru_nivcsw,
            # The whole machine's: huge pages faulted in and the stalls compacting for them.
            **{k: kernel_after.get(k, 0) - kernel.get(k, 0) for k in kernel_after},
        }
        if spec["system"] == "iolib":
            result["iolib_stats"] = _jsonable(loader.stats())
        result["notes"] = notes
        trace.loader = None
        del loader
        time.sleep(spec.get("settle_s", 0.0))  # what the dropped loader still reads counts
        result["bytes_total"] = proxy_bytes(spec)
    result["arrow_timeline"] = trace.close()
    result["memory_parts"] = trace.parts
    return result


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(value)


if __name__ == "__main__":
    SPEC = json.loads(sys.argv[1])
    if SPEC.get("iolib_path"):  # another checkout's iolib ahead of this one's (cwd)
        sys.path.insert(0, SPEC["iolib_path"])
    print("PEERS-RESULT " + json.dumps(main(SPEC)), flush=True)
