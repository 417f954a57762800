#!/usr/bin/env python3
"""Benchmark the counting phase on one machine (threads) and on a Dask cluster (worker processes).

    python benchmarks/bench_cluster.py /tmp/en_train.txt --configs single:1 local:1 single:2 local:2

Each configuration runs in a fresh subprocess: ``single:N`` is ``pretok.counting.count_corpus`` with N
threads (the default path); ``local:N`` starts a ``LocalCluster`` of N worker processes (one thread
each), cuts the inputs into shards and counts them with ``count_sources_on`` (tables combined in a tree on
the workers, one table back). Printed per configuration: wall seconds of the counting (the cluster's
start-up apart), MB/s, peak RSS of the client process and of each worker process (``getrusage``), and
a digest of the table, which must be the same for every configuration. Then the overhead of the
cluster path relative to one machine at equal cores (``local:N`` / ``single:N``), and the measured
figures that feed the 1 TB estimate of ``docs/cluster.md`` (table bytes per input byte, per shard and
at the root; bytes per second per worker).

Keep the runs short on a shared machine: ``--max-bytes`` counts a prefix of the input.
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
import hashlib
import json
import resource
import subprocess
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


def run_one(config: str, inputs: list, chunk_bytes: int) -> dict:
    """One configuration, in this (fresh) process."""
    from bpe_core.corpus.readers import BadRecords
    from bpe_core.corpus.inputs import expand_inputs
    from bpe_core.corpus.shards import ReadOptions
    from bpe_core.pretok.counting import count_corpus, count_source_shard, count_sources_on
    from bpe_core.runtime.executors import open_executor, worker_cpu_seconds

    sources = expand_inputs(inputs if len(inputs) > 1 else inputs[0])
    size = sum(s.size for s in sources)
    kind, _, n = config.partition(":")
    n = int(n or 1)
    out: dict = {"config": config, "bytes": size, "chunk_bytes": chunk_bytes}
    report: dict = {"seconds": {}}
    if kind == "single":
        t0, c0 = time.perf_counter(), worker_cpu_seconds()
        table = count_corpus(sources, SPECIALS, "gpt2", n, chunk_bytes, report=report)
        out["seconds"] = time.perf_counter() - t0
        out["cpu_seconds"] = worker_cpu_seconds() - c0
        out["client_peak_rss"] = _peak_self()
        out["worker_peak_rss"] = []
    else:
        t0 = time.perf_counter()
        import logging

        with open_executor(f"local:{n}", dashboard_address=None, silence_logs=logging.ERROR) as ex:
            out["startup_seconds"] = time.perf_counter() - t0
            ex.client.run(worker_cpu_seconds)           # the workers are up and have imported the package
            w0, c0 = ex.client.run(worker_cpu_seconds), worker_cpu_seconds()
            t1 = time.perf_counter()
            table = count_sources_on(ex, sources, SPECIALS, "gpt2", chunk_bytes, report=report)
            out["seconds"] = time.perf_counter() - t1
            w1 = ex.client.run(worker_cpu_seconds)
            # CPU of the client (with the scheduler's event loop) and of every worker: what the
            # cluster path costs beyond the counting, whatever else the machine runs meanwhile.
            out["cpu_seconds"] = worker_cpu_seconds() - c0 + sum(w1[a] - w0[a] for a in w1 if a in w0)
            out["client_peak_rss"] = _peak_self()
            out["worker_peak_rss"] = sorted(ex.worker_peaks().values())
            out["tasks"] = ex.n_tasks
        out["shards"] = report["n_chunks"]
        # What crosses the network, measured on a few shards: their tables, against the root table.
        opts = ReadOptions(chunk_bytes=chunk_bytes, special_tokens=SPECIALS, pattern="gpt2", bad=BadRecords())
        shards = [sh for src in sources for sh in src.shards(opts)]
        sample = shards[:: max(1, len(shards) // 4)][:4]
        counted = [count_source_shard(s, SPECIALS, "gpt2") for s in sample]
        leaf = [sum(a.nbytes for a in c.table) for c in counted]
        out["leaf_table_bytes_per_input_byte"] = sum(leaf) / max(1, sum(c.n_bytes for c in counted))
    out["items"] = report.get("items")
    out["bytes"] = report.get("corpus_bytes", size)        # text bytes (compressed inputs: decompressed)
    out["unique_pretokens"] = table.n_words
    out["root_table_bytes"] = table.nbytes
    out["digest"] = _digest(table.arena, table.offsets, table.counts)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", nargs="+", help="a file, or any inputs train_bpe takes (files, folders, .gz, JSONL, ...)")
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
    paths = list(args.input)
    tmp = None
    if args.max_bytes:
        fd, tmp = tempfile.mkstemp(prefix="bench_cluster-", suffix=".txt")
        with os.fdopen(fd, "wb") as out, open(paths[0], "rb") as f:
            out.write(f.read(args.max_bytes))
        paths = [tmp]
    runs: dict = {c: [] for c in args.configs}
    try:
        for _ in range(args.repeats):
            for config in args.configs:
                r = subprocess.run([sys.executable, os.path.abspath(__file__), *paths, "--one", config,
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
    for r in rows:
        r["median_cpu_seconds"] = sorted(x["cpu_seconds"] for x in runs[r["config"]])[len(runs[r["config"]]) // 2]
    print(f"{'config':10} {'count s':>8} {'MB/s':>7} {'CPU s':>6} {'start s':>8} {'client peak':>12} "
          f"{'worker peaks':>20} {'unique':>9} digest")
    for r in rows:
        workers = ", ".join(f"{w / mib:.0f}" for w in r["worker_peak_rss"]) or "-"
        start = f"{r['startup_seconds']:.1f}" if "startup_seconds" in r else "-"
        print(f"{r['config']:10} {r['seconds']:8.2f} {r['bytes'] / 1e6 / r['seconds']:7.1f} "
              f"{r['median_cpu_seconds']:6.2f} {start:>8} {r['client_peak_rss'] / mib:9.0f} MiB "
              f"{workers + ' MiB':>20} {r['unique_pretokens']:9,} {r['digest']}")
    for r in rows:
        print(f"{r['config']}: count s of each run {r['all_seconds']}")
    if len({r["digest"] for r in rows}) != 1:
        print("ERROR: the tables differ", file=sys.stderr)
        return 1
    by = {r["config"]: r for r in rows}
    for r in rows:
        kind, _, n = r["config"].partition(":")
        if kind == "local" and f"single:{n}" in by:
            base = by[f"single:{n}"]
            print(f"overhead local:{n} / single:{n} (equal cores): wall {r['seconds'] / base['seconds']:.2f}x, "
                  f"CPU {r['median_cpu_seconds'] / base['median_cpu_seconds']:.2f}x")
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
    sys.exit(_tool_start.run_bench(main))
