#!/usr/bin/env python3
"""The budget matrix: train at every ``--memory-limit`` from the refused region up to unlimited and
check that each run is exact (merges.txt and model.json byte-identical to the unlimited run, same
pretoken totals) or refuses with exit 2 and one line naming a budget (which is then run too).

    xz -dc ../shared/corpora/en_train.txt.xz > /tmp/en_train.txt
    python benchmarks/bench_budget.py /tmp/en_train.txt --vocab-size 32000
    python benchmarks/bench_budget.py corpus.txt --vocab-size 8000 --budgets 100M 200M 400M 1G

Without ``--budgets`` the sweep is found by a first run with ``--memory-limit 1M``: the budget it
names is M (if a run at M is refused again after counting, with the exact need, M becomes that one);
then M/2, 3M/4, M - 8 MiB, M - 1 MiB, M, M + 8 MiB, 5M/4, 3M/2, 2M, 4M and unlimited (no flag).

Prints a markdown table: budget | exit | identical? | pretokens | peak RSS | peak anon | seconds, where
the peaks are the sampled ones of the process tree from ``train_report.json`` (``memory.peak_rss_bytes``,
``memory.peak_anon_bytes``: the budget governs the anonymous one) and
``identical?`` is ``yes``/``NO`` for a finished run and the named budget for a refusal. Exit code 1
when any run is neither exact nor a clean refusal (or a named budget is refused again at the end).
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
import json
import re
import shutil
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "tools", "train_bpe.py")
MiB = 1 << 20
_NAMED = re.compile(r"--memory-limit (\d+(?:\.\d+)?)([KMGT]?)")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"cannot parse size {text!r} (examples: 500M, 2G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def fmt(n: int | None) -> str:
    if n is None:
        return "unlimited"
    if n >= 1 << 30 and n % (1 << 30) == 0:
        return f"{n >> 30}G"
    return f"{n / MiB:.0f}M" if n % MiB == 0 else f"{n / MiB:.1f}M"


def run(corpus: str, vocab: int, budget: int | None, out: str, extra: list[str]) -> dict:
    """One train_bpe.py run; returns exit, seconds, stderr, and the outputs when it finished."""
    if os.path.exists(out):
        shutil.rmtree(out)
    cmd = [sys.executable, TRAIN, corpus, "--vocab-size", str(vocab), "--out", out, "--no-progress", *extra]
    if budget is not None:
        cmd += ["--memory-limit", str(budget)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    r = {"budget": budget, "exit": p.returncode, "seconds": time.perf_counter() - t0, "stderr": p.stderr.strip()}
    if p.returncode == 0:
        with open(os.path.join(out, "merges.txt"), "rb") as f:
            r["merges"] = f.read()
        with open(os.path.join(out, "model.json"), "rb") as f:
            r["model"] = f.read()
        with open(os.path.join(out, "train_report.json"), encoding="utf-8") as f:
            report = json.load(f)
        r["pretokens"] = report.get("pretokens")
        r["unique_pretokens"] = report.get("unique_pretokens")
        r["peak"] = report.get("memory", {}).get("peak_rss_bytes") or report.get("peak_rss_bytes", {}).get("tree_sampled")
        r["anon"] = report.get("memory", {}).get("peak_anon_bytes")
    else:
        m = _NAMED.search(p.stderr)
        r["named"] = int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None
    return r


def verdict(r: dict, base: dict) -> tuple[str, bool]:
    """(the identical? cell, whether the run keeps the contract)."""
    lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
    if r["exit"] == 0:
        same = (r["merges"] == base["merges"] and r["model"] == base["model"]
                and r["pretokens"] == base["pretokens"] and r["unique_pretokens"] == base["unique_pretokens"])
        return ("yes" if same else "NO"), same
    if r["exit"] == 2 and r.get("named") and len(lines) == 1 and "Traceback" not in r["stderr"]:
        ok = r["named"] > (r["budget"] or 0)
        return f"refused: names {fmt(r['named'])}", ok
    return f"FAILED: {lines[-1][:80] if lines else 'no message'}", False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--budgets", nargs="+", type=parse_size, default=None, metavar="SIZE",
                   help="budgets to run (default: a sweep around the smallest that works)")
    p.add_argument("--workers", type=int, default=None, help="passed to train_bpe.py")
    p.add_argument("--keep", default=None, metavar="DIR", help="keep the outputs here (default: a temp folder)")
    args = p.parse_args(argv)
    extra = ["--workers", str(args.workers)] if args.workers else []
    work = args.keep or tempfile.mkdtemp(prefix="bench_budget-")
    os.makedirs(work, exist_ok=True)
    try:
        base = run(args.corpus, args.vocab_size, None, os.path.join(work, "unlimited"), extra)
        if base["exit"] != 0:
            print(f"the unlimited run failed (exit {base['exit']}): {base['stderr']}", file=sys.stderr)
            return 1
        rows = [base]
        if args.budgets:
            budgets = sorted(set(args.budgets))
        else:
            least, probe = None, 1 * MiB
            for _ in range(3):                       # 1M -> counting's need -> the merge phase's need
                r = run(args.corpus, args.vocab_size, probe, os.path.join(work, "probe"), extra)
                rows.append(r)
                if r["exit"] == 0:
                    least = probe
                    break
                if not r.get("named"):
                    print(f"a refusal named no budget: {r['stderr']}", file=sys.stderr)
                    return 1
                probe = r["named"]
            if least is None:
                print("three refusals in a row, each naming a larger budget", file=sys.stderr)
                return 1
            budgets = sorted({max(MiB, b) for b in (least // 2, least * 3 // 4, least - 8 * MiB, least - MiB,
                                                    least, least + 8 * MiB, least * 5 // 4, least * 3 // 2,
                                                    2 * least, 4 * least)})
        done = {r["budget"] for r in rows}
        for b in budgets:
            if b not in done:
                rows.append(run(args.corpus, args.vocab_size, b, os.path.join(work, "run"), extra))
                done.add(b)
        # Every budget a refusal named must work.
        for r in list(rows):
            named = r.get("named")
            if named and named not in done:
                rows.append(run(args.corpus, args.vocab_size, named, os.path.join(work, "run"), extra))
                done.add(named)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    size = os.path.getsize(args.corpus)
    print(f"budget matrix: {args.corpus} ({size / 1e6:.1f} MB), vocab {args.vocab_size}, "
          f"{len(rows)} runs of tools/train_bpe.py\n")
    print("| budget | exit | identical? | pretokens | peak RSS | peak anon | seconds |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    bad = 0
    ordered = sorted(rows, key=lambda r: (r["budget"] is None, r["budget"] or 0))
    for r in ordered:
        cell, ok = verdict(r, base)
        bad += not ok
        peak = f"{r['peak'] / MiB:.0f} MiB" if r.get("peak") else ""
        anon = f"{r['anon'] / MiB:.0f} MiB" if r.get("anon") else ""
        pretokens = f"{r['pretokens']:,}" if r.get("pretokens") is not None else ""
        print(f"| {fmt(r['budget'])} | {r['exit']} | {cell} | {pretokens} | {peak} | {anon} | {r['seconds']:.1f} |")
    ran = [r for r in ordered if r["exit"] == 0 and r["budget"] is not None]
    # The budget governs anonymous memory (docs/memory.md); file pages of mapped arrays are page cache.
    over = [r for r in ran if (r.get("anon") or r.get("peak") or 0) > r["budget"]]
    # A refusal at a budget above one that worked breaks "the smallest budget that works".
    worked = [r["budget"] for r in ran]
    late = [r for r in ordered if r["exit"] == 2 and worked and r["budget"] >= min(worked)]
    print()
    print(f"{len(ran)} budgeted runs finished, {sum(r['exit'] == 2 for r in ordered)} refused, {bad} broke the "
          f"contract; anonymous peak over the budget in {len(over)} run(s); refused above a budget that worked: "
          f"{', '.join(fmt(r['budget']) for r in late) or 'none'}")
    return 1 if bad or late else 0


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
