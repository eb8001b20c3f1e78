"""How often a loader's workers look at the C heap (`iolib.decode.heap.check_heap`, which
walks every free chunk with glibc's mallinfo2 when it looks), and what that costs: per
epoch the batches, the looks (counted as reads of /proc/self/statm, one or two a look),
the process's CPU seconds and wall seconds, then the peak RSS. `PackedTokens` over
60,000 documents (~120 M tokens), seq_len 2048, batch 8, 2 thread workers: a warm-up
loader dropped, then 3 epochs of a persistent one. Looks survive load; CPU is the
process's, so compare trees in alternating legs.

Run: PYTHONPATH=<tree> python benchmarks/bench_heap_looks.py  (corpus made on first use
in /tmp/iolib-bench-heap-looks, 451 MB)
Prints: "<batches>b/<looks>looks/<cpu s>cpu/<wall s>s" for each epoch, then "peak <MB> MB".
"""

import resource
import sys
import time
from pathlib import Path

looks = [0]


def audit(event, args):
    if event == "open" and args and args[0] == "/proc/self/statm":
        looks[0] += 1


sys.addaudithook(audit)

import numpy as np  # noqa: E402

from iolib import DataLoader  # noqa: E402
from iolib.text import PackedTokens  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.token_data import write_documents  # noqa: E402

corpus = Path("/tmp/iolib-bench-heap-looks")  # 60,000 documents, ~120 M tokens, 451 MB
if not corpus.exists():
    lengths = np.random.default_rng(0).integers(50, 4000, size=60000)
    write_documents(corpus, lengths, shards=4, row_group_size=2000)


def make():
    return PackedTokens(str(corpus), column="tokens", seq_len=2048, eos_id=0)


warm = DataLoader(make(), batch_size=8, num_workers=2, seed=0, shuffle=True)
for _ in warm:
    pass
del warm
loader = DataLoader(
    make(), batch_size=8, num_workers=2, seed=0, shuffle=True, persistent_workers=True
)
rows = []
for _epoch in range(3):
    looks[0] = 0
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    n = sum(1 for _ in loader)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    t1 = time.perf_counter()
    rows.append((n, looks[0], r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, t1 - t0))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
print(" ".join(f"{n}b/{k}looks/{c:.2f}cpu/{w:.2f}s" for n, k, c, w in rows), f"peak {peak} MB")
