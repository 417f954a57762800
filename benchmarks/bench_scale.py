#!/usr/bin/env python3
"""Scale benchmark: synthesize N GB, train and encode it inside a memory cgroup, print the table.

    python benchmarks/bench_scale.py --gb 1 4 15 --work big/ --memory-limit 2G --cap 2684354560
    python benchmarks/bench_scale.py --gb 1 --work big/ --memory-limit 2G --unlimited --encode
    python benchmarks/bench_scale.py --corpus big/c4.txt --cap 1G --against ../main-copy

``--corpus PATH`` trains an existing file instead of synthesizing one (repeat it for several).
``--against CHECKOUT`` also trains the same corpus, under the same cap, with another checkout of
bpe_core (its ``tools/train_bpe.py``, its package first on ``PYTHONPATH``) right after this one, and
prints its table too: a before/after in one run, merges compared.

For each size: ``benchmarks/synth_corpus.py`` writes ``WORK/cN.txt`` (kept if present), then
``tools/train_bpe.py cN.txt --vocab-size V --memory-limit LIMIT`` runs inside a fresh memory cgroup
capped at ``--cap`` bytes (``benchmarks/in_cgroup.sh``: cgroup v1, as root). The cap is the
honest test of "a machine with that much RAM": anonymous memory beyond it is killed (exit 137);
pages of mapped files are reclaimable and survive it. With ``--unlimited`` the same corpus is also
trained without a limit and outside the cgroup, and the merges must be identical; with ``--encode``
the corpus is encoded (``--verify``) under the same cap.

Printed per size: the CPU seconds of ``LC_ALL=C wc -w`` on the file (the yardstick: reading it once
on one core), then one row per phase with measured seconds, CPU seconds (every thread of the
process, ``time.process_time`` between phase marks), the peak anonymous and file-backed
memory of the process tree (sampled every 50 ms, from ``/proc/<pid>/status``) and the scheduler's
prediction (seconds, anonymous and mapped bytes of the merge phase), then the cgroup's own peak and
fail count (page cache included: a high fail count is reclaim, not a kill). Not a test: it takes
minutes to hours, so it never runs in CI.
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
import resource
import shutil
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH = HERE                            # synth_corpus.py and in_cgroup.sh, beside this script
MiB = 1 << 20
PHASES = [("pretokenize", "pretokenize", "pretokenize"), ("merge counts", "merge_counts", "merge_counts"),
          ("map words", "map_words", None), ("build words", "build_words", "build_words"),
          ("merge loop", "merge_loop", "merge_loop")]


def synth(gb: float, work: str, source: str) -> str:
    out = os.path.join(work, f"c{gb:g}.txt")
    if not os.path.exists(out):
        subprocess.run([sys.executable, os.path.join(BENCH, "synth_corpus.py"), source, out, "--gb", str(gb)],
                       check=True)
    return out


def child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


MAJOR_FAULTS = [0]     # major page faults (pages read from disk) of the last timed command's tree


def timed(cmd: list[str], env: dict | None = None) -> tuple[int, float, str, float]:
    """Exit status, wall seconds, stderr and CPU seconds (user + system of the command's tree)."""
    t0, c0 = time.perf_counter(), child_cpu()
    f0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_majflt
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    MAJOR_FAULTS[0] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_majflt - f0
    return proc.returncode, time.perf_counter() - t0, proc.stderr, child_cpu() - c0


def yardstick(corpus: str) -> tuple[float, float]:
    """``LC_ALL=C wc -w`` on the corpus: (CPU seconds, wall seconds)."""
    rc, wall, _, cpu = timed(["env", "LC_ALL=C", "wc", "-w", corpus])
    return cpu, wall


def cgroup(cap: int | None, cmd: list[str]) -> list[str]:
    return cmd if cap is None else [os.path.join(BENCH, "in_cgroup.sh"), str(cap)] + cmd


def train(corpus: str, out: str, vocab: int, limit: str | None, cap: int | None, spill: str,
          checkout: str = ROOT) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, os.path.join(checkout, "tools", "train_bpe.py"), corpus, "--vocab-size", str(vocab),
           "--out", out, "--spill-dir", spill, "--no-progress"]
    if limit:
        cmd += ["--memory-limit", limit]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    rc, wall, err, cpu = timed(cgroup(cap, cmd), env)
    res = {"rc": rc, "wall": wall, "cpu": cpu, "major_faults": MAJOR_FAULTS[0], "stderr": err.strip().splitlines()[-3:]}
    if rc == 0:
        res["report"] = json.load(open(os.path.join(out, "train_report.json")))
    return res


def fmt_mib(n) -> str:
    if isinstance(n, tuple):        # (planned, re-planned with the words counted)
        return f"{n[0] / MiB:,.0f} ({n[1] / MiB:,.0f} counted)"
    return "" if n is None else f"{n / MiB:,.0f}"


def table(gb, res: dict, cap: int | None, wc_cpu: float | None = None) -> str:
    r = res["report"]
    cpu = dict(r.get("cpu_seconds", {}))
    folds = r.get("fold_cpu_seconds", 0.0)     # folds while counting: merge counts' work, not the scan's
    if cpu and folds:
        cpu["pretokenize"] = cpu.get("pretokenize", 0.0) - folds
        cpu["merge counts"] = cpu.get("merge counts", 0.0) + folds
    mem = r["memory"]
    plan, mplan = r["plan"], r.get("merge_plan", {})
    pred_s = mplan.get("phase_seconds") or plan.get("phase_seconds", {})
    lines = [f"### {gb}: {r['unique_pretokens']:,} unique pretokens, {mplan.get('symbols', 0):,} symbols, "
             f"{r['engine']['n_pairs']:,} pairs, {r['merges']:,} merges, engine mapped: {r['engine'].get('mapped')}",
             "", "| phase | seconds | CPU s | predicted s | anon peak MiB | file peak MiB | predicted anon MiB | "
                 "predicted mapped MiB |", "|---|---|---|---|---|---|---|---|"]
    for name, key, pkey in PHASES:
        if name not in mem["peak_anon_by_phase"] and key not in r["seconds"]:
            continue
        pa = pm = None
        if name == "pretokenize":
            # planned from the estimated unique pretokens; with the words counted in brackets
            pa = plan["count_bytes"]
            if mplan.get("count_bytes") is not None and mplan["count_bytes"] != pa:
                pa = (pa, mplan["count_bytes"])
        elif name in ("build words", "merge loop"):
            pa, pm = mplan.get("merge_bytes"), mplan.get("merge_file_bytes")
        lines.append(f"| {name} | {r['seconds'].get(key, 0):.1f} | {cpu.get(name, 0):.1f} | {pred_s.get(pkey, '') if pkey else ''} | "
                     f"{fmt_mib(mem['peak_anon_by_phase'].get(name))} | {fmt_mib(mem['peak_file_by_phase'].get(name))} | "
                     f"{fmt_mib(pa)} | {fmt_mib(pm)} |")
    ratio = f", {res['cpu'] / wc_cpu:.2f}x wc -w" if wc_cpu else ""
    lines.append(f"| total | {r['seconds']['total']:.1f} (wall {res['wall']:.1f}) | "
                 f"{sum(cpu.values()):.1f} (process tree {res['cpu']:.1f}{ratio}) | {sum(pred_s.values()):.1f} | "
                 f"{fmt_mib(mem['peak_anon_bytes'])} | {fmt_mib(mem['peak_file_bytes'])} | | |")
    if "final_merge_seconds" in r:
        # merge counts' wall time is the folds while the workers count (this thread's wall time, on
        # cores the workers keep busy: not time added to the run) and the last merge after them
        lines.append(f"\nmerge counts: last merge {r['final_merge_seconds']:.1f} s after counting; folds while "
                     f"counting {r['seconds'].get('merge_counts', 0) - r['final_merge_seconds']:.1f} s wall, "
                     f"{folds:.1f} CPU s (the folding thread's)")
    cg = [ln for ln in res["stderr"] if ln.startswith("cgroup peak")]
    if cap is not None:
        lines.append(f"\ncgroup cap {cap / MiB:,.0f} MiB: {cg[0] if cg else 'no cgroup line'}; "
                     f"{res.get('major_faults', 0):,} major page faults (pages read back from disk)")
    eng = r["engine"]["memory"]
    n_sym = max(1, mplan.get("symbols", 1))
    lines.append(f"engine: {eng['anon'] / n_sym:.2f} B anon per symbol ({eng['anon'] / max(1, r['unique_pretokens']):.0f} "
                 f"per unique pretoken), mapped {eng['mapped'] / MiB:,.0f} MiB; parts (MiB): "
                 + ", ".join(f"{k} {v / MiB:,.0f}" for k, v in eng.items() if isinstance(v, int) and v > MiB))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, nargs="+", default=[])
    ap.add_argument("--corpus", action="append", default=[], help="train this existing file (repeatable)")
    ap.add_argument("--against", help="another checkout of bpe_core: train each corpus with it too (before/after)")
    ap.add_argument("--work", default=os.path.join(ROOT, "bench_out", "scale"),
                    help="folder for corpora, outputs and spill files (default: bench_out/scale in the checkout)")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(ROOT), "shared", "corpora", "en_train.txt.xz"),
                    help="the text the corpora are synthesized from (default: ../shared/corpora/en_train.txt.xz)")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--memory-limit", default="2G")
    ap.add_argument("--cap", type=parse_size, default=2684354560,
                    help="cgroup cap in bytes, or with a suffix: 2560M, 1G (0: no cgroup)")
    ap.add_argument("--no-yardstick", action="store_true", help="skip the wc -w run")
    ap.add_argument("--unlimited", action="store_true", help="also train without a limit; merges must match")
    ap.add_argument("--encode", action="store_true", help="also encode the corpus under the cap (--verify)")
    ap.add_argument("--delete", action="store_true", help="delete each synthesized corpus and its outputs when done")
    a = ap.parse_args(argv)
    cap = a.cap or None
    spill = os.path.join(a.work, "spill")
    os.makedirs(spill, exist_ok=True)
    bad = 0
    jobs = [(f"{gb:g} GB", lambda gb=gb: synth(gb, a.work, a.source), f"{gb:g}") for gb in a.gb or ([] if a.corpus else [1.0])]
    jobs += [(f"{os.path.basename(c)} ({os.path.getsize(c):,} bytes)", lambda c=c: c, os.path.basename(c))
             for c in a.corpus]
    for label, make, tag in jobs:
        corpus = make()
        wc_cpu = None
        if not a.no_yardstick:
            wc_cpu, wc_wall = yardstick(corpus)
            print(f"yardstick: LC_ALL=C wc -w {os.path.basename(corpus)}: {wc_cpu:.1f} CPU s ({wc_wall:.1f} s wall)")
        out = os.path.join(a.work, f"out{tag}")
        runs = [("this checkout", ROOT, out)]
        if a.against:
            runs.append((f"against {a.against}", a.against, out + "-against"))
        for who, checkout, where in runs:
            res = train(corpus, where, a.vocab_size, a.memory_limit, cap, spill, checkout)
            if res["rc"] != 0:
                print(f"### {label} ({who}): train exit {res['rc']} "
                      f"({'killed by the cgroup' if res['rc'] == 137 else 'failed'}), {res['wall']:.1f} s wall, "
                      f"{res['cpu']:.1f} CPU s: " + " / ".join(res["stderr"]))
                bad += 1
                continue
            print(table(f"{label}, {who}", res, cap, wc_cpu))
            print()
        if a.against and all(os.path.exists(os.path.join(w, "merges.txt")) for _, _, w in runs):
            same = open(os.path.join(out, "merges.txt"), "rb").read() == \
                open(os.path.join(out + "-against", "merges.txt"), "rb").read()
            bad += not same
            print(f"merges identical to {a.against}'s: {'yes' if same else 'NO'}")
        if a.unlimited:
            ref = train(corpus, out + "-unlimited", a.vocab_size, None, None, spill)
            same = ref["rc"] == 0 and open(os.path.join(out, "merges.txt"), "rb").read() == \
                open(os.path.join(out + "-unlimited", "merges.txt"), "rb").read()
            bad += not same
            print(f"unlimited run: exit {ref['rc']}, {ref['wall']:.1f} s wall, {ref['cpu']:.1f} CPU s, anon peak "
                  f"{fmt_mib(ref.get('report', {}).get('memory', {}).get('peak_anon_bytes'))} MiB; "
                  f"merges identical: {'yes' if same else 'NO'}")
        if a.encode:
            ids = os.path.join(a.work, f"ids{tag}.npy")
            rc, wall, err, cpu = timed(cgroup(cap, [sys.executable, os.path.join(HERE, "..", "tools", "encode_corpus.py"),
                                                    corpus, "--tokenizer", out, "--out", ids, "--memory-limit",
                                                    a.memory_limit, "--verify", "--no-progress"]))
            cg = [ln for ln in err.splitlines() if ln.startswith("cgroup peak")]
            print(f"encode: exit {rc}, {wall:.1f} s wall, {cpu:.1f} CPU s, {cg[0] if cg else ''}")
            bad += rc != 0
            if os.path.exists(ids):
                os.unlink(ids)
        if a.delete and not a.corpus:
            os.unlink(corpus)
        if a.delete:
            for _, _, where in runs:
                shutil.rmtree(where, ignore_errors=True)
            shutil.rmtree(out + "-unlimited", ignore_errors=True)
        print()
    return 1 if bad else 0


def parse_size(text: str) -> int:
    """``2684354560``, ``2560M``, ``2.5G`` -> bytes (binary units)."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
