#!/usr/bin/env python3
"""Benchmark the counting phase on one machine (threads) and on a Dask cluster (worker processes).

    python tools/bench_cluster.py /tmp/en_train.txt --configs single:1 local:1 single:2 local:2

Each configuration runs in a fresh subprocess: ``single:N`` is ``pretok.counting.count_corpus`` with N
threads (the default path); ``local:N`` starts a ``LocalCluster`` of N worker processes (one thread
each), cuts the input into shards and counts them with ``count_shards`` (tables combined in a tree on
the workers, one table back). Printed per configuration: wall seconds of the counting (the cluster's
start-up apart), MB/s, peak RSS of the client process and of each worker process (``getrusage``), and
a digest of the table, which must be the same for every configuration. Then the overhead of the
cluster path relative to one machine at equal cores (``local:N`` / ``single:N``), and the measured
figures that feed the 1 TB estimate of ``docs/cluster.md`` (table bytes per input byte, per shard and
at the root; bytes per second per worker).

Keep the runs short on a shared machine: ``--max-bytes`` counts a prefix of the input.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import bpe_core  # noqa: F401
except ImportError:  # a checkout built in place, not installed
    sys.path.insert(0, os.path.join(HERE, ".."))

SPECIALS = [b"<|endoftext|>"]


def _peak_self() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def _digest(arena, offsets, counts) -> str:
    h = hashlib.sha256()
    for a in (arena, offsets, counts):
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()[:16]


def run_one(config: str, path: str, chunk_bytes: int) -> dict:
    """One configuration, in this (fresh) process."""
    from bpe_core.corpus.shards import source_shards
    from bpe_core.pretok.counting import count_corpus, count_shard, count_shards
    from bpe_core.runtime.executors import open_executor

    size = os.path.getsize(path)
    kind, _, n = config.partition(":")
    n = int(n or 1)
    out: dict = {"config": config, "bytes": size, "chunk_bytes": chunk_bytes}
    if kind == "single":
        t0 = time.perf_counter()
        table = count_corpus(path, SPECIALS, "gpt2", n, chunk_bytes)
        out["seconds"] = time.perf_counter() - t0
        out["client_peak_rss"] = _peak_self()
        out["worker_peak_rss"] = []
    else:
        t0 = time.perf_counter()
        import logging

        with open_executor(f"local:{n}", dashboard_address=None, silence_logs=logging.ERROR) as ex:
            out["startup_seconds"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            shards = source_shards(path, chunk_bytes, SPECIALS, "gpt2")
            table = count_shards(shards, SPECIALS, "gpt2", ex, size, path)
            out["seconds"] = time.perf_counter() - t1
            out["client_peak_rss"] = _peak_self()
            out["worker_peak_rss"] = sorted(ex.worker_peaks().values())
            out["tasks"] = ex.n_tasks
            out["shards"] = len(shards)
        # What crosses the network, measured on a few shards: their tables, against the root table.
        sample = shards[:: max(1, len(shards) // 4)][:4]
        leaf = [sum(a.nbytes for a in count_shard(s, SPECIALS, "gpt2").table) for s in sample]
        out["leaf_table_bytes_per_input_byte"] = sum(leaf) / max(1, sum(s.n_bytes for s in sample))
    out["unique_pretokens"] = table.n_words
    out["root_table_bytes"] = table.nbytes
    out["digest"] = _digest(table.arena, table.offsets, table.counts)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input")
    p.add_argument("--configs", nargs="+", default=["single:1", "local:1", "single:2", "local:2"])
    p.add_argument("--chunk-bytes", type=int, default=16 << 20)
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per configuration, interleaved (A B C A B C ...); the median is shown")
    p.add_argument("--max-bytes", type=int, default=None, help="count only this prefix of the input")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.input, args.chunk_bytes)))
        return 0
    path = args.input
    tmp = None
    if args.max_bytes:
        fd, tmp = tempfile.mkstemp(prefix="bench_cluster-", suffix=".txt")
        with os.fdopen(fd, "wb") as out, open(path, "rb") as f:
            out.write(f.read(args.max_bytes))
        path = tmp
    runs: dict = {c: [] for c in args.configs}
    try:
        for _ in range(args.repeats):
            for config in args.configs:
                r = subprocess.run([sys.executable, os.path.abspath(__file__), path, "--one", config,
                                    "--chunk-bytes", str(args.chunk_bytes)], capture_output=True, text=True)
                if r.returncode != 0:
                    print(r.stderr, file=sys.stderr)
                    return 1
                runs[config].append(json.loads(r.stdout.strip().splitlines()[-1]))
    finally:
        if tmp:
            os.unlink(tmp)
    # The run with the median counting time stands for its configuration.
    rows = [sorted(rs, key=lambda r: r["seconds"])[len(rs) // 2] for rs in runs.values()]
    for r in rows:
        r["all_seconds"] = [round(x["seconds"], 3) for x in runs[r["config"]]]
    mib = 1 << 20
    print(f"{'config':10} {'count s':>8} {'MB/s':>7} {'start s':>8} {'client peak':>12} {'worker peaks':>20} "
          f"{'unique':>9} digest")
    for r in rows:
        workers = ", ".join(f"{w / mib:.0f}" for w in r["worker_peak_rss"]) or "-"
        start = f"{r['startup_seconds']:.1f}" if "startup_seconds" in r else "-"
        print(f"{r['config']:10} {r['seconds']:8.2f} {r['bytes'] / 1e6 / r['seconds']:7.1f} {start:>8} "
              f"{r['client_peak_rss'] / mib:9.0f} MiB {workers + ' MiB':>20} {r['unique_pretokens']:9,} {r['digest']}")
    if len({r["digest"] for r in rows}) != 1:
        print("ERROR: the tables differ", file=sys.stderr)
        return 1
    by = {r["config"]: r for r in rows}
    for r in rows:
        kind, _, n = r["config"].partition(":")
        if kind == "local" and f"single:{n}" in by:
            print(f"overhead local:{n} / single:{n} (equal cores): {r['seconds'] / by[f'single:{n}']['seconds']:.2f}x")
    for r in rows:
        if "leaf_table_bytes_per_input_byte" in r:
            print(f"{r['config']}: {r['shards']} shards, {r['tasks']} tasks; shard tables "
                  f"{r['leaf_table_bytes_per_input_byte']:.3f} bytes per input byte; root table "
                  f"{r['root_table_bytes'] / mib:.1f} MiB ({r['root_table_bytes'] / r['bytes']:.3f} per input byte)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
