"""Where an image epoch's memory goes back: the Arrow pool the Parquet reads allocate
from, the C heap after a decoded batch, and the decoder built while the first batch's
bytes are read (benchmarks/results/peers-images*.md measured each)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.decode.heap import trim_heap
from iolib.decode.images import ImagePipeline
from iolib.sources import ParquetSource
from tests.conftest import jpeg_bytes

ROOT = Path(__file__).resolve().parent.parent
ENV = "ARROW_DEFAULT_MEMORY_POOL"


def _pool_after_a_read(tmp_path: Path, **env: str) -> str:
    """The default pool's backend in a fresh interpreter, before and after one batch."""
    pq.write_table(pa.table({"x": np.arange(100)}), tmp_path / "a.parquet", row_group_size=10)
    code = textwrap.dedent(f"""
        import pyarrow as pa
        from iolib import DataLoader
        from iolib.sources import ParquetSource
        before = pa.default_memory_pool().backend_name
        next(iter(DataLoader(ParquetSource({str(tmp_path / "a.parquet")!r}), batch_size=8)))
        print(before, pa.default_memory_pool().backend_name)
    """)
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return done.stdout.split()[-2:]


def test_parquet_reads_move_pyarrow_off_mimalloc_by_default(tmp_path: Path) -> None:
    before, after = _pool_after_a_read(tmp_path)
    assert after == ("system" if before == "mimalloc" else before)


def _jemalloc() -> bool:
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        return False
    return True


@pytest.mark.parametrize("chosen", [None, "mimalloc"])
def test_token_windows_move_pyarrow_to_jemalloc_where_it_has_one(tmp_path: Path, chosen) -> None:
    """Packed windows keep the decoded values as their segments, freed by the thread
    that evicts them: mimalloc kept those pages (arrow_pool.py), jemalloc gives them
    back; without jemalloc, or where the user chose a pool, the pool stays as it is."""
    rows = pa.array([[1, 2, 3]] * 40, pa.list_(pa.int32()))
    pq.write_table(pa.table({"tokens": rows}), tmp_path / "t.parquet", row_group_size=10)
    code = textwrap.dedent(f"""
        import pyarrow as pa
        from iolib import DataLoader
        from iolib.text import PackedTokens
        before = pa.default_memory_pool().backend_name
        windows = PackedTokens({str(tmp_path / "t.parquet")!r}, column="tokens", seq_len=4,
                               eos_id=0)
        next(iter(DataLoader(windows, batch_size=2, shuffle=True)))
        print(before, pa.default_memory_pool().backend_name)
    """)
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "PYTHONPATH": str(ROOT), **({ENV: chosen} if chosen else {})},
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    before, after = done.stdout.split()[-2:]
    moved = before == "mimalloc" and _jemalloc() and chosen is None
    assert after == ("jemalloc" if moved else before)


def test_a_pool_the_user_chose_is_kept(tmp_path: Path) -> None:
    # mimalloc, the one iolib would move off: kept because the user asked for it.
    before, after = _pool_after_a_read(tmp_path, ARROW_DEFAULT_MEMORY_POOL="mimalloc")
    assert before == after == "mimalloc"


def test_trimming_the_heap_keeps_what_is_in_use() -> None:
    kept = np.full(1 << 20, 7, dtype=np.uint8)
    freed = [bytearray(64 << 10) for _ in range(64)]
    del freed
    trim_heap()  # False off glibc: then a no-op
    assert int(kept.sum()) == 7 << 20


class _Recording:
    """A decoder that says when it was asked to get ready and when it decoded."""

    columns = ("image",)
    on_error = "raise"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def prepare(self) -> None:
        self.calls.append("prepare")

    def __call__(self, batch, indices, *, seed, epoch):
        self.calls.append("decode")
        return batch, []


def _image_parquet(path: Path, n: int = 12) -> str:
    images = [jpeg_bytes(i, (48, 40)) for i in range(n)]
    pq.write_table(pa.table({"image": images, "label": list(range(n))}), path, row_group_size=4)
    return str(path)


def test_the_decoder_is_told_to_get_ready_before_each_batch(tmp_path: Path) -> None:
    decoder = _Recording()
    source = ParquetSource(_image_parquet(tmp_path / "i.parquet"))
    batches = list(DataLoader(source, batch_size=4, decode=decoder, num_workers=0))
    # Asked when the pass begins (files are listed meanwhile) and before each batch's read.
    assert decoder.calls.count("decode") == len(batches) == 3
    pairs = zip(decoder.calls, decoder.calls[1:], strict=False)
    assert all(before == "prepare" for before, now in pairs if now == "decode")
    assert decoder.calls[0] == "prepare"


def test_a_prepared_pipeline_decodes_as_one_that_was_not(tmp_path: Path) -> None:
    url = _image_parquet(tmp_path / "i.parquet")
    runs = []
    for prepared in (False, True):
        pipe = ImagePipeline(size=32, device="cpu", backend="pil")
        if prepared:
            pipe.prepare()
            pipe.prepare()  # once is enough: a second call returns at once
        loader = DataLoader(ParquetSource(url), batch_size=4, shuffle=True, seed=1, decode=pipe)
        runs.append([b["image"] for b in loader])
    assert all((a == b).all() for a, b in zip(*runs, strict=True))


def test_the_heap_is_trimmed_once_free_pages_piled_up_not_after_every_batch(monkeypatch) -> None:
    import ctypes
    import platform

    from iolib.decode import heap

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        assert trim_heap() is False
        return
    growth = 32 << 20
    monkeypatch.setattr(heap, "_floor", None)
    assert trim_heap(growth) is True  # the first call sets where growth counts from
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(64 << 10) for _ in range(2 * growth // (64 << 10))]
    for b in blocks:  # touched, so resident; below the mmap threshold, so on the heap
        ctypes.memset(b, 1, 64 << 10)
    fence = libc.malloc(64 << 10)  # held above them: free() alone cannot shrink the heap
    # In use, however much resident: a working set reused batch after batch stays.
    assert trim_heap(growth) is False
    grown = heap.resident_bytes()
    for b in blocks:
        libc.free(b)
    assert heap.resident_bytes() > grown - growth  # freed, still resident
    assert trim_heap(growth) is True  # 2x growth freed on the heap goes back
    assert heap.resident_bytes() < grown - growth
    assert trim_heap(growth) is False  # nothing piled up since
    assert trim_heap(growth=0) is True  # 0: every call
    libc.free(fence)


def test_pages_freed_just_after_a_trim_count_as_growth_not_as_the_floor(monkeypatch) -> None:
    """Another thread's batch freed between the trim and the reading after it: the next
    look still trims it, instead of letting it stand as the heap's idle floor (where
    batches reuse it without a fault, so no look comes)."""
    import ctypes
    import platform

    from iolib.decode import heap

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return
    growth = 16 << 20
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(64 << 10) for _ in range(2 * growth // (64 << 10))]
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)
    fence = libc.malloc(64 << 10)
    real = heap._lib()

    class FreedJustAfterTheTrim:
        """glibc itself; its trim is followed at once by the other thread's free."""

        def __getattr__(self, name: str):
            return getattr(real, name)

        def malloc_trim(self, pad: int) -> int:
            done = real.malloc_trim(pad)
            for b in blocks:
                libc.free(b)
            return done

    monkeypatch.setattr(heap, "_floor", None)
    monkeypatch.setattr(heap, "_libc", FreedJustAfterTheTrim())
    assert trim_heap(growth) is True
    monkeypatch.setattr(heap, "_libc", real)
    piled = heap.resident_bytes()
    assert trim_heap(growth) is True  # 2x growth freed after the first trim goes back
    assert heap.resident_bytes() < piled - growth
    libc.free(fence)


def test_an_image_pipeline_caps_the_malloc_arenas_unless_the_user_chose() -> None:
    """Threads that start after an ImagePipeline is made share at most one arena per
    core (at least 2); a MALLOC_ARENA_MAX in the environment is left to glibc."""
    import platform

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return
    from iolib.base.resources import cpu_count

    cap = max(2, cpu_count())
    threads = cap + 6  # more than the cap, each alive at once with an arena of its own
    code = textwrap.dedent(f"""
        import ctypes, os, tempfile, threading
        from iolib.decode.images import ImagePipeline
        ImagePipeline(size=32, device="cpu", backend="pil")
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype = ctypes.c_void_p
        started, done = threading.Barrier({threads} + 1), threading.Event()
        def work():
            libc.malloc(1000)  # a thread's first malloc picks its arena
            started.wait()
            done.wait()
        threads = [threading.Thread(target=work) for _ in range({threads})]
        for t in threads:
            t.start()
        started.wait()  # all alive at once, so none reuses an ended thread's arena
        with tempfile.TemporaryFile("w+") as f:
            libc.fdopen.restype = ctypes.c_void_p
            out = libc.fdopen(os.dup(f.fileno()), b"w")
            libc.malloc_info(0, ctypes.c_void_p(out))
            libc.fclose(ctypes.c_void_p(out))
            f.seek(0)
            print(f.read().count("<heap nr="))
        done.set()
    """)
    clean = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    counts = {}
    for chosen in ("", str(threads + 1)):
        env = {**clean, "PYTHONPATH": str(ROOT)} | ({"MALLOC_ARENA_MAX": chosen} if chosen else {})
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
            timeout=120,
        )  # fmt: skip
        counts[chosen] = int(done.stdout.split()[-1])
    assert counts[""] <= cap
    assert counts[str(threads + 1)] > cap  # the user's cap, not iolib's


_MAPPED_PROBE = textwrap.dedent("""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    fields = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
              "uordblks", "fordblks", "keepcost")
    class Info(ctypes.Structure):
        _fields_ = [(f, ctypes.c_size_t) for f in fields]
    libc.mallinfo2.restype = Info
    # A freed 16 MiB mapped block raises glibc's own threshold to 16 MiB: an 8 MiB block
    # then comes from the heap (and stays there when freed) unless the threshold is fixed.
    libc.free(libc.malloc(16 << 20))
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(8 << 20)
    print("mapped" if libc.mallinfo2().hblkhd - before >= 8 << 20 else "heap")
    libc.free(block)
""")


def _after_a_loader(tmp_path: Path, loop: str, **env: str) -> str:
    """Where an 8 MiB block comes from in a fresh interpreter after `loop` ran a loader."""
    pq.write_table(pa.table({"x": np.arange(100)}), tmp_path / "a.parquet", row_group_size=10)
    code = (
        textwrap.dedent(f"""
        from iolib import DataLoader
        from iolib.sources import ParquetSource
        source = ParquetSource({str(tmp_path / "a.parquet")!r})
    """)
        + textwrap.dedent(loop)
        + _MAPPED_PROBE
    )
    clean = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return done.stdout.split()[-1]


def _glibc() -> bool:
    import platform

    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def test_a_loaders_workers_map_large_blocks_on_their_own(tmp_path: Path) -> None:
    """Row groups and batches of 4 MiB or more are freed back to the OS, not kept in
    glibc's arenas: the threshold is fixed, whatever glibc raised it to."""
    if not _glibc():
        return
    loop = "for _ in DataLoader(source, batch_size=8, num_workers=2, seed=0): pass\n"
    assert _after_a_loader(tmp_path, loop) == "mapped"
    assert _after_a_loader(tmp_path, "pass\n") == "heap"  # glibc's own rule, untouched


def test_a_threshold_the_user_set_is_kept(tmp_path: Path) -> None:
    if not _glibc():
        return
    loop = "for _ in DataLoader(source, batch_size=8, num_workers=2, seed=0): pass\n"
    chosen = str(64 << 20)  # glibc's own setting: 8 MiB stays on the heap
    assert _after_a_loader(tmp_path, loop, MALLOC_MMAP_THRESHOLD_=chosen) == "heap"


def test_an_image_pipeline_leaves_glibcs_threshold(tmp_path: Path) -> None:
    """Where images are decoded, DALI's per-batch buffers are reused from the heap: the
    workers do not fix the threshold."""
    if not _glibc():
        return
    loop = (
        "from iolib.decode.images import ImagePipeline\n"
        "pipe = ImagePipeline(size=32, device='cpu', backend='pil')\n"
        "for _ in DataLoader(source, batch_size=8, num_workers=2, seed=0): pass\n"
    )
    assert _after_a_loader(tmp_path, loop) == "heap"


_WORKER_EPOCH = textwrap.dedent("""
    import ctypes, sys
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    from iolib import DataLoader
    from iolib.decode import heap
    from iolib.sources import ParquetSource
    path, pile = sys.argv[1], int(sys.argv[2])
    pq.write_table(pa.table({"x": np.arange(200)}), path, row_group_size=10)
    heap.TRIM_GROWTH, heap.CHECK_BYTES = 16 << 20, 8 << 20
    heap.CHECK_S = 1e9  # looks by faults alone: a loaded machine makes epochs long
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    fences, looks = [], [0]
    def pile_up(batch, indices, *, seed, epoch):
        # Heap blocks touched (faulted in) and freed below a block kept: free pages
        # that only a trim gives back.
        blocks = [libc.malloc(64 << 10) for _ in range(pile // (64 << 10))]
        for b in blocks:
            ctypes.memset(b, 1, 64 << 10)
        fences.append(libc.malloc(64 << 10))
        for b in blocks:
            libc.free(b)
        return batch, []
    pile_up.columns, pile_up.on_error = ("x",), "raise"
    def audit(event, args):
        if event == "open" and args[0] == "/proc/self/statm":
            looks[0] += 1
    sys.addaudithook(audit)
    loader = DataLoader(ParquetSource(path), batch_size=10, num_workers=2, seed=0,
                        decode=pile_up if pile else None)
    batches = sum(1 for _ in loader)
    print(batches, looks[0], heap.idle_bytes() >> 20)
""")


def _worker_epoch(tmp_path: Path, pile: int) -> tuple[int, int, int]:
    """Batches, reads of /proc/self/statm (each look at the heap makes one or two) and
    the heap's free resident MiB after a thread-worker epoch in a fresh interpreter whose
    batches each pile `pile` bytes of free pages on the heap (guard 16 MiB, a look
    every 8 MiB faulted in)."""
    done = subprocess.run(
        [sys.executable, "-c", _WORKER_EPOCH, str(tmp_path / "a.parquet"), str(pile)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        check=True, timeout=120,
    )  # fmt: skip
    batches, looks, idle = map(int, done.stdout.split()[-3:])
    return batches, looks, idle


def test_workers_look_at_the_heap_as_memory_is_faulted_in_not_every_batch(
    tmp_path: Path,
) -> None:
    """A look at the heap walks every free chunk: batches that fault little in are not
    followed by one each."""
    if not _glibc():
        return
    batches, looks, _ = _worker_epoch(tmp_path, 0)
    assert batches == 20
    assert looks <= 6  # the first look, and one per 8 MiB the loader's start faulted in


def test_workers_give_back_free_heap_pages_once_they_pile_up(tmp_path: Path) -> None:
    """Batches that each leave 32 MiB of free pages on the heap: the workers trim it."""
    if not _glibc():
        return
    _, _, quiet = _worker_epoch(tmp_path, 0)  # what the process maps besides the heap
    batches, looks, idle = _worker_epoch(tmp_path, 32 << 20)
    assert batches == 20
    # More looks than an epoch that faults nothing in makes (at most 6, above); not one a
    # batch: a batch that reuses pages the other worker's look did not trim faults none.
    assert looks > 6
    assert idle < quiet + 16  # MiB: what piled up went back (20 x 32 MiB were freed)


_FREED_QUIETLY = textwrap.dedent("""
    import ctypes, sys, threading, time
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    from iolib import DataLoader
    from iolib.decode import heap
    from iolib.sources import ParquetSource
    path, held_bytes = sys.argv[1], int(sys.argv[2])
    pq.write_table(pa.table({"x": np.arange(300)}), path, row_group_size=10)
    # No look is due by faults after the first: only time can bring one.
    heap.TRIM_GROWTH, heap.CHECK_BYTES, heap.CHECK_S = 16 << 20, 1 << 40, 0.05
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    held, fences, calls = [], [], [0]
    def hold_then_free(batch, indices, *, seed, epoch):
        # The 3rd batch builds memory that stays in use; the 10th frees it below blocks
        # kept (free resident pages, no fault); the rest fault nothing in.
        calls[0] += 1
        if calls[0] == 3:
            for _ in range(held_bytes // (64 << 10)):
                block = libc.malloc(64 << 10)
                ctypes.memset(block, 1, 64 << 10)
                held.append(block)
        if calls[0] == 10:
            fences.extend(held[15::16])
            for i, block in enumerate(held):
                if i % 16 != 15:
                    libc.free(block)
        time.sleep(0.01)
        return batch, []
    hold_then_free.columns, hold_then_free.on_error = ("x",), "raise"
    loader = DataLoader(ParquetSource(path), batch_size=10, num_workers=1, seed=0,
                        decode=hold_then_free)
    batches = sum(1 for _ in loader)
    print(batches, heap.idle_bytes() >> 20)
""")


def _freed_quietly(tmp_path: Path, held: int) -> tuple[int, int]:
    """Batches and the heap's free resident MiB after a one-thread-worker epoch whose
    3rd batch builds `held` bytes that stay in use and 10th frees them."""
    done = subprocess.run(
        [sys.executable, "-c", _FREED_QUIETLY, str(tmp_path / "a.parquet"), str(held)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        check=True, timeout=120,
    )  # fmt: skip
    batches, idle = map(int, done.stdout.split()[-2:])
    return batches, idle


def test_workers_give_back_memory_freed_without_a_page_fault(tmp_path: Path) -> None:
    """Memory in use that a worker frees piles up free pages without faulting one in: the
    workers still look at the heap once a while passed, and trim it."""
    if not _glibc():
        return
    _, quiet = _freed_quietly(tmp_path, 0)
    batches, idle = _freed_quietly(tmp_path, 96 << 20)
    assert batches == 30
    assert idle < quiet + 16  # MiB: 90 MiB were freed below the blocks kept
