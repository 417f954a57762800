#!/usr/bin/env python3
"""Degenerate corpora (one repeated byte, letters without whitespace): checkouts side by side.

    python benchmarks/bench_hostile.py --root . /path/to/old/checkout --work /scratch/hostile
        [--cases a50 nul20 a20-1g nul20-1g] [--big]

Each case is ``tools/train_bpe.py`` (or ``tools/encode_corpus.py``) of one checkout in a process of
its own (``PYTHONPATH`` = that checkout, built in place), the checkouts taking turns; a case with a
cgroup runs inside a fresh memory cgroup (``benchmarks/in_cgroup.sh``, root and cgroup v1) of the
budget + 100 MiB. The corpora are written into ``--work`` (50 MB of ``a``, 20 MB of ``a`` and of
NUL; with ``--big``, 2 GiB of random letters, refused by training and encoding at the default
budget in a 4 GiB cgroup). Per run: exit status, wall seconds, CPU seconds (user + system of the
process tree, ``wait4``: the check's child process included), the largest process's max RSS, the
report's peak anonymous memory of the whole run and of the writing, the cgroup's peak, and the
SHA-256 of the folder's files (every checkout must write the same bytes) or the refusal's line.
Folders are deleted after each run (a 50 MB run writes 4.8 GB).

Cases: ``a50``, ``nul20`` (default budget, no cgroup); ``a20-1g``, ``nul20-1g`` (``--memory-limit
1G`` in 1,124 MiB); ``let2g-train``, ``let2g-encode`` (``--big``).
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
import shutil
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
IN_CGROUP = os.path.join(HERE, "in_cgroup.sh")
FILES = ("model.json", "vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json")
MIB = 1 << 20

#: name -> (corpus, tool, extra flags, cgroup bytes or None)
CASES = {
    "a50": ("a50.txt", "train", [], None),
    "nul20": ("nul20.txt", "train", [], None),
    "a20-1g": ("a20.txt", "train", ["--memory-limit", "1G"], 1124 * MIB),
    "nul20-1g": ("nul20.txt", "train", ["--memory-limit", "1G"], 1124 * MIB),
    "let2g-train": ("let2g.txt", "train", [], 4 << 30),
    "let2g-encode": ("let2g.txt", "encode", [], 4 << 30),
}


def make_corpora(work: str, big: bool) -> None:
    os.makedirs(work, exist_ok=True)
    for name, byte, n in (("a50.txt", b"a", 50_000_000), ("a20.txt", b"a", 20_000_000),
                          ("nul20.txt", b"\0", 20_000_000), ("tok.txt", None, 0)):
        path = os.path.join(work, name)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(byte * n if byte else b"the quick brown fox jumps over the lazy dog\n" * 2000)
    path = os.path.join(work, "let2g.txt")
    if big and not os.path.exists(path):
        import numpy as np

        rng = np.random.default_rng(0)
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
        with open(path, "wb") as f:
            for _ in range(16):
                f.write(letters[rng.integers(0, 26, 128 << 20)].tobytes())


def folder_sha(folder: str) -> str:
    h = hashlib.sha256()
    for name in FILES:
        with open(os.path.join(folder, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()[:16]


def one_run(root: str, case: str, args) -> dict:
    corpus, kind, flags, cgroup = CASES[case]
    out = os.path.join(args.work, f"out-{case}")
    shutil.rmtree(out, ignore_errors=True)
    src = os.path.join(args.work, corpus)
    if kind == "train":
        cmd = [sys.executable, os.path.join(root, "tools", "train_bpe.py"), src, "--vocab-size", "1000",
               "--out", out, "--no-progress", *flags]
    else:
        tok = os.path.join(args.work, "tok")
        if not os.path.isdir(tok):
            subprocess.run([sys.executable, os.path.join(root, "tools", "train_bpe.py"),
                            os.path.join(args.work, "tok.txt"), "--vocab-size", "300", "--out", tok, "--no-progress"],
                           env=dict(os.environ, PYTHONPATH=os.path.abspath(root)), check=True, capture_output=True)
        cmd = [sys.executable, os.path.join(root, "tools", "encode_corpus.py"), src, "--tokenizer", tok,
               "--out", out + ".npy", "--no-progress", *flags]
    if cgroup:
        cmd = ["bash", IN_CGROUP, str(cgroup)] + cmd
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = proc.stderr.read()
    proc.stderr.close()
    _, status, usage = os.wait4(proc.pid, 0)       # (this run's tree: its CPU and its largest process)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    m = re.search(r"cgroup peak (\d+) MB", stderr)
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    res = {"exit": proc.returncode, "wall": round(wall, 2), "cpu": round(usage.ru_utime + usage.ru_stime, 2),
           "maxrss_mib": usage.ru_maxrss // 1024, "cgroup_peak_mib": int(m.group(1)) if m else None,
           "peak_anon_mib": None, "write_peak_mib": None, "result": errors[0][:160] if errors else ""}
    report = os.path.join(out, "train_report.json")
    if proc.returncode == 0 and os.path.exists(report):
        memory = json.load(open(report))["memory"]
        res["peak_anon_mib"] = memory["peak_anon_bytes"] // MIB
        res["write_peak_mib"] = memory["peak_anon_by_phase"].get("write", 0) // MIB
        res["result"] = "folder " + folder_sha(out)
    shutil.rmtree(out, ignore_errors=True)
    if os.path.exists(out + ".npy"):
        os.unlink(out + ".npy")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", nargs="+", default=[os.path.join(HERE, "..")])
    ap.add_argument("--work", required=True, help="a folder for the corpora and outputs (several GB free)")
    ap.add_argument("--cases", nargs="+", default=["a50", "nul20", "a20-1g", "nul20-1g"], choices=sorted(CASES))
    ap.add_argument("--big", action="store_true", help="add the 2 GiB letters cases (train and encode)")
    args = ap.parse_args(argv)
    cases = args.cases + (["let2g-train", "let2g-encode"] if args.big else [])
    make_corpora(args.work, args.big or any(c.startswith("let2g") for c in cases))
    rows = []
    for case in cases:
        for root in args.root:
            res = one_run(root, case, args)
            rows.append((case, root, res))
            print(json.dumps({"case": case, "root": root, **res}), file=sys.stderr, flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} (CPU seconds compare; wall depends on the load and the disk)")
    print("| case | checkout | exit | wall s | CPU s | max RSS MiB | peak anon MiB | writing MiB | cgroup MiB | result |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case, root, r in rows:
        print(f"| {case} | {root} | {r['exit']} | {r['wall']} | {r['cpu']} | {r['maxrss_mib']} | "
              f"{r['peak_anon_mib'] or '-'} | {r['write_peak_mib'] or '-'} | {r['cgroup_peak_mib'] or '-'} | "
              f"{r['result']} |")
    same = all(len({r["result"] for c, _, r in rows if c == case and r["result"].startswith("folder")}) <= 1
               for case in cases)
    print(f"folders identical across checkouts: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
