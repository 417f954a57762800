#!/usr/bin/env python3
"""Corpus file -> ``.npy``: this checkout against others, interleaved, in CPU-seconds, same bytes.

    python benchmarks/bench_corpus_npy.py CORPUS --tokenizer DIR --root . /path/to/old/checkout
        [--runs 3] [--workers 2] [--memory-limit 400M] [--cgroup 400M] [--work DIR] [--keep] [--doc-index]

Each run is ``tools/encode_corpus.py`` of one checkout (``PYTHONPATH`` = that checkout, built in
place) in a process of its own, the checkouts taking turns; with ``--cgroup BYTES`` inside a
fresh memory cgroup of that size (``benchmarks/in_cgroup.sh``, root and cgroup v1). Per run:
wall seconds, CPU seconds (user + system of the process tree, ``RUSAGE_CHILDREN``), MB per
CPU-second, the phases of ``--report`` (``assemble``: the copy into the ``.npy`` before), the
peak anonymous memory the run sampled and the cgroup's peak. The outputs of every checkout must
be byte-identical (SHA-256 of the ``.npy``); they are deleted after each run (disk). Medians go to
stdout with the load average.
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
import re
import resource
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
IN_CGROUP = os.path.join(HERE, "in_cgroup.sh")


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def one_run(root: str, args, tag: str) -> dict:
    out = os.path.join(args.work, f"ids-{tag}.npy")
    report = os.path.join(args.work, f"report-{tag}.json")
    cmd = [sys.executable, os.path.join(root, "tools", "encode_corpus.py"), args.corpus, "--tokenizer",
           args.tokenizer, "--out", out, "--workers", str(args.workers), "--memory-limit", args.memory_limit,
           "--report", report, "--no-progress"]
    idx = os.path.join(args.work, f"idx-{tag}.npy")
    if args.doc_index:
        cmd += ["--doc-index", idx]
    if args.cgroup:
        cmd = ["bash", args.in_cgroup, str(parse_bytes(args.cgroup))] + cmd
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{root}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rep = json.load(open(report))
    m = re.search(r"cgroup peak (\d+) MB", proc.stderr)
    res = {"wall": wall, "cpu": cpu, "mb_per_cpu_s": rep["n_bytes"] / 1e6 / cpu, "mb_per_s": rep["n_bytes"] / 1e6 / wall,
           "assemble": rep["phase_seconds"].get("assemble", 0.0), "phases": rep["phase_seconds"],
           "peak_anon_mib": rep["memory"].get("peak_anon_bytes", 0) / 2**20,
           "peak_rss_mib": rep["memory"].get("peak_rss_bytes", 0) / 2**20,
           "spilled_mib": rep["memory"].get("spilled_ids_bytes", 0) / 2**20,
           "cgroup_peak_mib": int(m.group(1)) if m else None, "n_tokens": rep["n_tokens"],
           "sha256": sha256(out) + (sha256(idx) if args.doc_index else ""),
           "workers": rep["num_workers"], "chunk_bytes": rep["plan"]["chunk_bytes"]}
    if not args.keep:
        os.unlink(out)
        if args.doc_index:
            os.unlink(idx)
    os.unlink(report)
    return res


def parse_bytes(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    return int(m.group(1)) * units[m.group(2)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--root", nargs="+", default=[os.path.join(HERE, "..")])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="400M")
    ap.add_argument("--cgroup", default=None, help="run each inside a memory cgroup of this size (e.g. 400M)")
    ap.add_argument("--in-cgroup", default=IN_CGROUP)
    ap.add_argument("--work", default=".")
    ap.add_argument("--keep", action="store_true", help="keep the .npy outputs")
    ap.add_argument("--doc-index", action="store_true", help="also write (and compare) the document index")
    args = ap.parse_args(argv)
    runs: dict[str, list] = {r: [] for r in args.root}
    for k in range(args.runs):
        for i, root in enumerate(args.root if k % 2 == 0 else args.root[::-1]):
            res = one_run(root, args, f"{args.root.index(root)}")
            runs[root].append(res)
            print(json.dumps({"root": root, "run": k, **{a: (round(b, 3) if isinstance(b, float) else b)
                                                         for a, b in res.items() if a != "phases"},
                              "phases": res["phases"]}), file=sys.stderr, flush=True)
    shas = {r["sha256"] for rs in runs.values() for r in rs}
    size = os.path.getsize(args.corpus) / 1e6
    print(f"corpus {args.corpus} ({size:.0f} MB), {args.workers} workers, --memory-limit {args.memory_limit}"
          + (f", cgroup {args.cgroup}" if args.cgroup else "") + f"; {args.runs} runs interleaved, medians; "
          f"load average {os.getloadavg()[0]:.1f}; outputs identical: {'yes' if len(shas) == 1 else 'NO'}")
    print("| checkout | wall s | CPU s | MB/CPU-s | MB/s | cut s | assemble s | spilled MiB | peak anon MiB | cgroup peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = None
    for root, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "mb_per_cpu_s", "mb_per_s", "assemble",
                                                                  "spilled_mib", "peak_anon_mib")}
        med["cut"] = statistics.median(r["phases"].get("cut", 0.0) for r in rs)
        cg = [r["cgroup_peak_mib"] for r in rs if r["cgroup_peak_mib"] is not None]
        base = base or med
        print(f"| {root} | {med['wall']:.1f} | {med['cpu']:.1f} | {med['mb_per_cpu_s']:.1f} "
              f"({med['mb_per_cpu_s'] / base['mb_per_cpu_s']:.2f}x) | {med['mb_per_s']:.1f} | {med['cut']:.3f} | "
              f"{med['assemble']:.3f} | "
              f"{med['spilled_mib']:.0f} | {med['peak_anon_mib']:.0f} | {max(cg) if cg else '-'} |")
    return 0 if len(shas) == 1 else 1


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
