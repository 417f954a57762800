#!/usr/bin/env python3
"""Benchmark training on the same corpus in different containers: time and peak RSS vs plain text.

    python benchmarks/bench_inputs.py /tmp/en_train.txt --bytes 64M --vocab-size 8000 --repeats 1

The first ``--bytes`` of the text (cut at a document separator) are written as ``.txt``,
``.txt.gz`` (level 6), ``.txt.xz`` (preset 6), ``.txt.zst`` (level 3), ``.jsonl.zst`` (one record
per document) and ``.parquet`` (snappy, 2,000 documents per row group) in a work folder. Each
training runs in a fresh subprocess (runs interleaved), and the parent samples the RSS of the
process tree every 50 ms. Printed per container: median wall seconds, the ratio to ``.txt``, peak
RSS, and the seconds a single thread needs only to read the container (decompress and parse,
``corpus.shards`` without counting): when that is close to the training time, reading is the
bottleneck. The merges of every container are checked against the ``.txt`` run's.
"""
from __future__ import annotations

import _signal  # noqa: I001  (first: a Ctrl-C or SIGTERM from here on is one line, exit 130 / 143)
import os
import sys

if hasattr(_signal, "pthread_sigmask"):   # held until _start's handler is in
    _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bpe_core", "cli"))
import _start as _tool_start  # (by path, not as bpe_core.cli._start: this checkout's bpe_core is put first below)
del sys.path[0]

_tool_start.begin(__name__)

import argparse
import gzip
import hashlib
import json
import lzma
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import bpe_core  # noqa: F401
except ImportError:  # a checkout built in place, not installed
    sys.path.insert(0, os.path.join(HERE, ".."))

from bpe_core.runtime.budget import fmt_bytes, parse_size  # noqa: E402

SPECIAL = "<|endoftext|>"
CONTAINERS = ["txt", "txt.gz", "txt.xz", "txt.zst", "jsonl.zst", "parquet"]


def prepare(src: str, n_bytes: int, folder: str, which: list[str]) -> dict[str, str]:
    """Write the containers (reused when present with the same size); returns {name: path}."""
    os.makedirs(folder, exist_ok=True)
    with open(src, "rb") as f:
        data = f.read(n_bytes)
    cut = data.rfind(SPECIAL.encode())
    data = data[:cut] if cut > 0 else data
    tag = hashlib.sha1(data[-4096:] + str(len(data)).encode()).hexdigest()[:8]
    paths = {name: os.path.join(folder, f"corpus-{tag}.{name}") for name in which}
    docs = None
    for name, path in paths.items():
        if os.path.exists(path):
            continue
        tmp = path + ".part"
        if name == "txt":
            open(tmp, "wb").write(data)
        elif name == "txt.gz":
            open(tmp, "wb").write(gzip.compress(data, 6))
        elif name == "txt.xz":
            open(tmp, "wb").write(lzma.compress(data, preset=6))
        elif name == "txt.zst":
            import zstandard
            open(tmp, "wb").write(zstandard.ZstdCompressor(level=3).compress(data))
        else:
            docs = docs or data.split(SPECIAL.encode())
            texts = [d.decode("utf-8", "surrogateescape") for d in docs]
            if name == "jsonl.zst":
                import zstandard
                body = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
                open(tmp, "wb").write(zstandard.ZstdCompressor(level=3).compress(body))
            elif name == "parquet":
                import pyarrow as pa
                import pyarrow.parquet as pq
                pq.write_table(pa.table({"text": pa.array([d for d in docs], pa.binary())}), tmp,
                               row_group_size=2000, compression="snappy")
        os.replace(tmp, path)
    return paths


def child(path: str, vocab_size: int, workers: int, out: str) -> None:
    """One training run (in a fresh process); writes seconds and a digest of the merges to ``out``."""
    import bpe_core

    t = time.perf_counter()
    vocab, merges = bpe_core.train_bpe(path, vocab_size, [SPECIAL], num_workers=workers)
    secs = time.perf_counter() - t
    digest = hashlib.sha1(b"".join(a + b"\x00" + b + b"\x01" for a, b in merges)).hexdigest()[:12]
    json.dump({"seconds": secs, "merges": digest}, open(out, "w"))


def read_only(path: str, chunk_bytes: int = 16 << 20) -> float:
    """Seconds one thread needs to read (decompress, parse) the whole container into blocks."""
    from bpe_core.corpus.inputs import expand_inputs
    from bpe_core.corpus.shards import ReadOptions, iter_tasks, load

    opts = ReadOptions(chunk_bytes=chunk_bytes, special_tokens=[SPECIAL.encode()])
    t = time.perf_counter()
    for task in iter_tasks(expand_inputs(path), opts):
        load(task)
    return time.perf_counter() - t


def run(path: str, vocab_size: int, workers: int, tmp: str) -> tuple[float, int, str]:
    import psutil

    out = os.path.join(tmp, "child.json")
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", path, str(vocab_size),
                             str(workers), out])
    peak = 0
    ps = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    if proc.returncode:
        raise SystemExit(f"run on {path} failed ({proc.returncode})")
    r = json.load(open(out))
    return r["seconds"], peak, r["merges"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(argv[1], int(argv[2]), int(argv[3]), argv[4])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("text", help="a plain-text corpus with <|endoftext|> separators")
    p.add_argument("--bytes", type=parse_size, default=parse_size("64M"), help="use this much of it")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--work-dir", default="/tmp/bpe_core-bench-inputs")
    p.add_argument("--containers", nargs="+", default=CONTAINERS, choices=CONTAINERS)
    args = p.parse_args(argv)
    paths = prepare(args.text, args.bytes, args.work_dir, args.containers)
    times: dict[str, list] = {n: [] for n in paths}
    peaks: dict[str, list] = {n: [] for n in paths}
    digests: dict[str, str] = {}
    for _ in range(args.repeats):
        for name, path in paths.items():
            secs, peak, digest = run(path, args.vocab_size, args.workers, args.work_dir)
            times[name].append(secs)
            peaks[name].append(peak)
            digests[name] = digest
    base = statistics.median(times["txt"]) if "txt" in times else None
    size = os.path.getsize(paths["txt"]) if "txt" in paths else 0
    print(f"training on {fmt_bytes(size)} of text, vocab {args.vocab_size}, {args.workers} worker(s), "
          f"median of {args.repeats}")
    print(f"{'container':<11} {'on disk':>10} {'train s':>8} {'vs .txt':>8} {'peak RSS':>10} {'read-only s':>12}  merges")
    for name, path in paths.items():
        t = statistics.median(times[name])
        ratio = f"{t / base:.2f}x" if base else "-"
        same = "same" if digests[name] == digests.get("txt", digests[name]) else "DIFFERENT"
        print(f"{name:<11} {fmt_bytes(os.path.getsize(path)):>10} {t:>8.2f} {ratio:>8} "
              f"{fmt_bytes(max(peaks[name])):>10} {read_only(path):>12.2f}  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
