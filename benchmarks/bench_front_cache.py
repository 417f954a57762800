#!/usr/bin/env python3
"""The counters' front cache with and without aging, in one process: ``count_pretokens`` on chunks
of a file, one thread, the two policies alternated round by round.

    python benchmarks/bench_front_cache.py big/synth4g.txt --offsets-mb 500 2000 3500 --rounds 10
    python benchmarks/bench_front_cache.py en_train.txt --offsets-mb 0 80 160

A front slot whose word was hit since the last miss that came to it turns the next miss away
(``_pretok.set_front_aging(True)``, the default); without aging every miss takes its slot (a plain
direct-mapped cache). Each policy counts the same chunks (``--chunk-mb`` bytes at each offset) with
its own kept ``CountScratch``, as a training worker does, and the tables must be identical. Printed:
the thread CPU seconds of counting all the chunks once, min and median over ``--rounds``, and the
ratio of the medians (aging / plain). Running both in one process, alternated, keeps a busy machine
from favouring one of them; read the median ratio. Not a test.
"""
from __future__ import annotations

import _signal  # noqa: I001  (first: a Ctrl-C or SIGTERM from here on is one line, exit 130 / 143)
import os
import sys

if hasattr(_signal, "pthread_sigmask"):   # held until _start's handler is in
    _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bpe_core", "cli"))
import _start as _tool_start  # (by path, not as bpe_core.cli._start: this checkout is put first below)
del sys.path[0]

_tool_start.begin(__name__)

import argparse
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--offsets-mb", type=int, nargs="+", default=[0], help="where the chunks start (MB)")
    ap.add_argument("--chunk-mb", type=int, default=64, help="bytes per chunk (a training chunk: 64)")
    ap.add_argument("--pattern", default="gpt2", choices=["gpt2", "cl100k", "o200k"])
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args(argv)
    if not os.path.isfile(a.corpus):
        print(f"bench_front_cache: {a.corpus}: no such file", file=sys.stderr)
        return 2
    sys.path.insert(0, ROOT)
    import numpy as np

    from bpe_core.pretok import _pretok

    chunks = []
    with open(a.corpus, "rb") as f:
        for off in a.offsets_mb:
            f.seek(off << 20)
            data = f.read(a.chunk_mb << 20)
            if data:
                chunks.append(np.frombuffer(data, dtype=np.uint8))
    if not chunks:
        print(f"bench_front_cache: {a.corpus}: no bytes at those offsets", file=sys.stderr)
        return 2
    pattern = _pretok.PATTERN_IDS[a.pattern]
    policies = {"plain": False, "aging": True}
    scratches = {name: _pretok.CountScratch() for name in policies}
    seconds: dict[str, list[float]] = {name: [] for name in policies}
    first: dict[int, tuple] = {}
    was = _pretok.set_front_aging(True)
    try:
        for r in range(a.rounds):
            for name in (list(policies) if r % 2 == 0 else list(policies)[::-1]):
                _pretok.set_front_aging(policies[name])
                total = 0.0
                for i, buf in enumerate(chunks):
                    spans = np.array([[0, len(buf)]], dtype=np.int64)
                    t = time.thread_time()
                    table = _pretok.count_pretokens(buf, spans, pattern, scratch=scratches[name])
                    total += time.thread_time() - t
                    digest = tuple(hash(arr.tobytes()) for arr in table)
                    if first.setdefault(i, digest) != digest:
                        print(f"bench_front_cache: chunk {i}: the tables differ", file=sys.stderr)
                        return 1
                seconds[name].append(total)
    finally:
        _pretok.set_front_aging(was)
    mb = sum(len(c) for c in chunks) / 1e6
    print(f"{len(chunks)} chunks, {mb:,.0f} MB, {a.pattern}, {a.rounds} rounds\n")
    print("| front cache | CPU s min | CPU s median | MB per CPU-s (median) |\n|---|---|---|---|")
    for name in policies:
        med = statistics.median(seconds[name])
        print(f"| {name} | {min(seconds[name]):.4f} | {med:.4f} | {mb / med:,.0f} |")
    ratio = statistics.median(seconds["aging"]) / statistics.median(seconds["plain"])
    print(f"\naging / plain (medians): {ratio:.3f}; tables identical: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
