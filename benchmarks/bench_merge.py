#!/usr/bin/env python3
"""The merge phase alone (build the engine, then the loop's two legs) on a table counted once, on
this checkout and on others, runs interleaved, each a fresh process; the merges must be equal.

    python benchmarks/bench_merge.py big/synth1g.txt --work big/merge1g --memory-limit 900M
    python benchmarks/bench_merge.py big/synth4g.txt --work big/merge4g --memory-limit 900M \\
        --against ../main-copy --runs 3

The corpus is counted once, by this checkout, as ``bpe-core train`` counts it (its plan: the
merge phase's threads, whether the engine's read-only arrays are mapped, the fill buffer), and the
table is kept in ``--work`` (``table-*.npy``, reused when present). Each run then builds the engine
from it and runs the loop as ``train_words`` does, with that checkout's thresholds: the first leg
while the best pair counts ``PAR_MIN_SITES``, the second on one thread.

Per run: wall and CPU seconds (every thread) of the build and of each leg, and, where the checkout's
engine times the parts of the merges it splits on each thread's own clock (``par_crit_ns``), the
loop's estimated wall time on a quiet machine: the main thread's CPU time less its parts and its
waits, plus the longer of the two parts of each split merge (on a shared machine the wall time is
mostly other people's jobs; these clocks are much less so). Not a test: on a large corpus it takes
minutes; on a shared machine read the ratios of runs made together.
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
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("arena", "offsets", "counts")


def built_in_place(checkout: str) -> bool:
    """Whether ``checkout``'s compiled extensions are built in place (``pip install -e .`` or
    ``setup.py build_ext --inplace``); a clone installed with ``pip install .`` has them only in the
    environment, and that installed package is the one measured for it."""
    from importlib.machinery import EXTENSION_SUFFIXES
    return any(os.path.exists(os.path.join(checkout, "bpe_core", "engine", "_engine" + suffix))
               for suffix in EXTENSION_SUFFIXES)


class _Counted(Exception):
    """Raised by the stand-in for ``train_words`` once the table is saved (the run stops there)."""


def count(corpus: str, work: str, vocab_size: int, limit: str | None) -> None:
    """Count ``corpus`` as ``bpe-core train`` does and keep the table and the merge phase's settings."""
    import numpy as np

    import bpe_core.methods.bpe as bpe_method
    from bpe_core.cli.train import main as train_main

    def keep(table, vocab_size, special_tokens=(), **kw):
        t = table.as_numpy()
        if not t.mapped:
            t = t.without_singletons()
        for name, arr in zip(NAMES, (t.arena, t.offsets, t.counts)):
            np.save(os.path.join(work, f"table-{name}.npy"), np.asarray(arr))
        settings = {"vocab_size": vocab_size, "n_specials": len(special_tokens), "threads": kw.get("threads", 1),
                    "mapped": kw.get("spill_dir") is not None, "fill_buffer_bytes": kw.get("fill_buffer_bytes")}
        with open(os.path.join(work, "settings.json"), "w") as f:
            json.dump(settings, f)
        raise _Counted()

    bpe_method.train_words = keep
    argv = [corpus, "--vocab-size", str(vocab_size), "--out", os.path.join(work, "model"), "--progress", "none"]
    if limit:
        argv += ["--memory-limit", limit]
    try:
        train_main(argv)
    except _Counted:
        return
    raise RuntimeError("training finished without reaching the merge phase")


def child(work: str) -> dict:
    """One build and loop in this process (its ``bpe_core`` is the first on ``sys.path``)."""
    import hashlib

    import numpy as np

    from bpe_core.engine import merge
    from bpe_core.runtime.budget import pairs_estimate

    with open(os.path.join(work, "settings.json")) as f:
        s = json.load(f)
    arena, offsets, counts = (np.load(os.path.join(work, f"table-{n}.npy"), mmap_mode="r" if s["mapped"] else None)
                              for n in NAMES)
    n_merges = s["vocab_size"] - 256 - s["n_specials"]
    threads = s["threads"]
    leg = merge.PAR_MIN_SITES
    split = min(getattr(merge, "PAR_SPLIT_SITES", leg), leg)
    spill = tempfile.mkdtemp(dir=work) if s["mapped"] else None
    clock = lambda: (time.perf_counter(), time.process_time(), time.thread_time())  # noqa: E731
    t0 = clock()
    engine = merge.MergeEngine(arena, offsets, counts, [bytes([i]) for i in range(256)], spill_dir=spill,
                               map_threshold=0 if spill else 1 << 62, fill_buffer_bytes=s["fill_buffer_bytes"],
                               threads=threads)
    engine.reserve_pairs(pairs_estimate(len(arena), s["vocab_size"]))
    t1 = clock()
    engine.par_min_sites = split
    first = engine.run(n_merges, min_count=leg, compact=True) if threads >= 2 else np.zeros((0, 3), np.uint32)
    t2 = clock()
    rest = engine.run(n_merges - len(first), compact=True, one_thread=threads >= 2)
    t3 = clock()
    if spill:
        os.rmdir(spill)
    part = {k: getattr(engine, k, 0) / 1e9 for k in ("par_main_ns", "par_wait_ns", "par_crit_ns")}
    timed = hasattr(engine, "par_crit_ns")
    quiet = ((t2[2] - t1[2]) - part["par_main_ns"] - part["par_wait_ns"] + part["par_crit_ns"]
             + (t3[2] - t2[2])) if timed else None
    steps = np.concatenate([np.asarray(first).reshape(-1), np.asarray(rest).reshape(-1)]).astype(np.uint32)
    return {"build": (t1[0] - t0[0], t1[1] - t0[1]), "leg1": (t2[0] - t1[0], t2[1] - t1[1]),
            "leg2": (t3[0] - t2[0], t3[1] - t2[1]), "n_first": len(first), "threads": threads,
            "thresholds": (leg, split), "quiet": quiet, "merges": len(steps) // 3,
            "parts": getattr(engine, "build_seconds", None),
            "sha256": hashlib.sha256(steps.tobytes()).hexdigest()[:16]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--work", required=True, help="a folder for the counted table (kept, reused)")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--memory-limit", help="the budget the run is planned for (as training's flag)")
    ap.add_argument("--against", action="append", default=[], help="another checkout (repeatable)")
    ap.add_argument("--runs", type=int, default=1, help="rounds of every checkout, interleaved")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.work)))
        return 0
    if not os.path.isfile(a.corpus):
        print(f"bench_merge: {a.corpus}: no such file", file=sys.stderr)
        return 2
    os.makedirs(a.work, exist_ok=True)
    if not os.path.exists(os.path.join(a.work, "settings.json")):
        if built_in_place(ROOT):
            sys.path.insert(0, ROOT)
        else:                        # the installed package (this folder's source has no extensions)
            sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != ROOT]
        count(a.corpus, a.work, a.vocab_size, a.memory_limit)
    with open(os.path.join(a.work, "settings.json")) as f:
        settings = json.load(f)
    print(f"table: {a.work} (threads {settings['threads']}, engine mapped: {settings['mapped']})\n")
    print("| checkout | round | build s / CPU s | first leg s / CPU s (merges) | second leg s / CPU s | "
          f"loop s / CPU s | loop, quiet estimate s | thresholds (leg, split) | merges |\n|{'---|' * 9}")
    digests = set()
    parts = {}                     # checkout -> the build's parts (``MergeEngine.build_seconds``) in its last round
    checkouts = [ROOT] + [os.path.abspath(c) for c in a.against]
    for r in range(a.runs):
        for ck in checkouts if r % 2 == 0 else checkouts[::-1]:
            cmd = [sys.executable, os.path.abspath(__file__), a.corpus, "--work", os.path.abspath(a.work), "--child"]
            if ck == ROOT and not built_in_place(ck):      # the installed bpe_core, from outside the clone
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.path.abspath(a.work))
            else:
                p = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=ck), capture_output=True, text=True, cwd=ck)
            name = os.path.basename(ck.rstrip("/")) or ck
            if p.returncode != 0:
                print(f"| {name} | {r + 1} | failed: {p.stderr.strip().splitlines()[-1:]} |" + " |" * 7)
                continue
            d = json.loads(p.stdout.strip().splitlines()[-1])
            digests.add(d["sha256"])
            if d.get("parts"):
                parts[name] = d["parts"]
            b, l1, l2 = d["build"], d["leg1"], d["leg2"]
            quiet = "" if d["quiet"] is None else f"{d['quiet']:.2f}"
            print(f"| {name} | {r + 1} | {b[0]:.2f} / {b[1]:.2f} | {l1[0]:.2f} / {l1[1]:.2f} ({d['n_first']:,}) | "
                  f"{l2[0]:.2f} / {l2[1]:.2f} | {l1[0] + l2[0]:.2f} / {l1[1] + l2[1]:.2f} | {quiet} | "
                  f"{d['thresholds'][0]:,}, {d['thresholds'][1]:,} | {d['merges']:,} {d['sha256']} |", flush=True)
    for name, p in parts.items():
        print(f"\n{name}, the build's parts in its last round (wall s / CPU s of every thread): "
              + ", ".join(f"{k} {w:.2f} / {c:.2f}" for k, (w, c) in p.items()))
    print(f"\nmerges identical: {'yes' if len(digests) <= 1 else 'NO'}")
    return 0 if len(digests) <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
