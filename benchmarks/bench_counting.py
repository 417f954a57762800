#!/usr/bin/env python3
"""The counting pass alone (pre-tokenize and merge the count tables), planned as training plans it,
on this checkout and on others, runs interleaved, each a fresh process; the tables must be equal.

    python benchmarks/bench_counting.py big/synth1g.txt --memory-limit 2G
    python benchmarks/bench_counting.py big/synth4g.txt --memory-limit 1G --against ../main-copy --runs 3

Per run: CPU seconds of the process (every thread) in the pass and in its final merge, the CPU of
the folds done while counting (``fold_cpu_seconds``), wall seconds, the share of the pass the worker
threads spent counting a block (``busy``: 1.0 when neither waits for the other or for the fold),
MB of input per CPU second, the anonymous peaks per phase (sampled every 50 ms,
``runtime.memmon.MemoryMonitor``) and the plan's figure for counting (``count_bytes``). A table's
SHA-256 (arena, offsets, counts) must be the same in every run. Not a test: on a large corpus it
takes minutes; on a shared machine read the ratios of runs made together.
"""
from __future__ import annotations

import _signal  # noqa: I001  (first: a Ctrl-C or SIGTERM from here on is one line, exit 130 / 143)
import os
import sys

if hasattr(_signal, "pthread_sigmask"):   # held until _start's handler is in
    _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bpe_core", "cli"))
import _start as _tool_start  # (by path, not as bpe_core.cli._start: the measured checkout is put first below)
del sys.path[0]

_tool_start.begin(__name__)

import argparse
import json
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def child(corpus: str, limit: str | None) -> dict:
    """One counting pass in this process (its ``bpe_core`` is the first on ``sys.path``)."""
    import hashlib
    import threading

    from bpe_core.corpus.inputs import expand_inputs
    from bpe_core.pretok import counting
    from bpe_core.runtime import budget
    from bpe_core.runtime.memmon import MemoryMonitor

    size = os.path.getsize(corpus)
    plan = budget.plan_training(size, budget.parse_size(limit) if limit else None, os.cpu_count() or 1, None,
                                vocab_size=32000)
    marks, blocks = [], []
    phase = counting.phase

    def mark(name):                      # CPU at each phase mark of the pass
        marks.append((name, time.perf_counter(), time.process_time()))
        phase(name)

    count_chunk = counting._count_chunk

    def timed_chunk(task):               # when each worker counted a block
        t = time.perf_counter()
        try:
            return count_chunk(task)
        finally:
            blocks.append((threading.get_ident(), t, time.perf_counter()))

    counting.phase, counting._count_chunk = mark, timed_chunk
    report = {"seconds": {}}
    with MemoryMonitor(interval=0.05, budget=plan.memory_limit) as mon:
        t0, c0 = time.perf_counter(), time.process_time()
        table = counting.count_corpus(expand_inputs(corpus, "text"), [b"<|endoftext|>"], "gpt2", plan.num_workers,
                                      plan.chunk_bytes, report=report, monitor=mon,
                                      memory_limit=plan.memory_limit, per_worker_bytes=plan.per_worker_bytes,
                                      spill_threshold_bytes=plan.spill_threshold_bytes or None)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    marks.append(("end", time.perf_counter(), time.process_time()))
    cpu_by = {marks[i][0]: marks[i + 1][2] - marks[i][2] for i in range(len(marks) - 1)}
    span = (max(b[2] for b in blocks) - min(b[1] for b in blocks)) if blocks else 0.0
    busy = sum(b[2] - b[1] for b in blocks) / (plan.num_workers * span) if span else 1.0
    digest = hashlib.sha256()
    for arr in (table.arena, table.offsets, table.counts):
        digest.update(memoryview(arr).cast("B"))
    return {"wall": wall, "cpu": cpu, "cpu_pretokenize": cpu_by.get("pretokenize", 0.0),
            "cpu_merge_counts": cpu_by.get("merge counts", 0.0), "fold_cpu": report.get("fold_cpu_seconds", 0.0),
            "busy": busy, "mb_per_cpu_s": size / 1e6 / cpu, "words": table.n_words,
            "anon": {k: v for k, v in mon.summary()["peak_anon_by_phase"].items()},
            "count_bytes": plan.count_bytes, "workers": plan.num_workers, "chunk": plan.chunk_bytes,
            "sha256": digest.hexdigest()[:16]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--memory-limit", help="the budget the pass is planned for (as training's flag)")
    ap.add_argument("--against", action="append", default=[], help="another checkout (repeatable)")
    ap.add_argument("--runs", type=int, default=1, help="rounds of every checkout, interleaved")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not os.path.isfile(a.corpus):
        print(f"bench_counting: {a.corpus}: no such file", file=sys.stderr)
        return 2
    if a.child:
        print(json.dumps(child(a.corpus, a.memory_limit)))
        return 0
    checkouts = [ROOT] + [os.path.abspath(c) for c in a.against]
    print(f"| checkout | round | CPU s | pretokenize CPU s | folds CPU s | merge counts CPU s | wall s | busy | "
          f"MB/CPU-s | anon peak MiB (pretokenize / merge counts) | plan MiB | table |\n|{'---|' * 12}")
    digests = set()
    for r in range(a.runs):
        for ck in checkouts if r % 2 == 0 else checkouts[::-1]:
            cmd = [sys.executable, os.path.abspath(__file__), a.corpus, "--child"]
            if a.memory_limit:
                cmd += ["--memory-limit", a.memory_limit]
            p = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=ck), capture_output=True, text=True, cwd=ck)
            if p.returncode != 0:
                print(f"| {ck} | {r + 1} | failed: {p.stderr.strip().splitlines()[-1:]} |" + " |" * 9)
                continue
            d = json.loads(p.stdout.strip().splitlines()[-1])
            digests.add(d["sha256"])
            anon = d["anon"]
            print(f"| {os.path.basename(ck.rstrip('/')) or ck} | {r + 1} | {d['cpu']:.2f} | {d['cpu_pretokenize']:.2f} | "
                  f"{d['fold_cpu']:.2f} | {d['cpu_merge_counts']:.2f} | {d['wall']:.2f} | {d['busy']:.3f} | "
                  f"{d['mb_per_cpu_s']:.0f} | {anon.get('pretokenize', 0) / MiB:,.0f} / "
                  f"{anon.get('merge counts', 0) / MiB:,.0f} | {d['count_bytes'] / MiB:,.0f} | {d['sha256']} |", flush=True)
    print(f"\ntables identical: {'yes' if len(digests) <= 1 else 'NO'}")
    return 0 if len(digests) <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
