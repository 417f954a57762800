#!/usr/bin/env python3
"""SuperBPE against plain BPE: training time and stage-aware encoding throughput, side by side.

    python benchmarks/bench_superbpe.py --train en_train_30MB.txt --vocab-size 8000 --text en_heldout.txt
    python benchmarks/bench_superbpe.py --bpe bpe8k/ --superbpe sb8k/ --text en_heldout.txt
    python benchmarks/bench_superbpe.py --train en_train.txt --vocab-size 32000 --no-encode
    python benchmarks/bench_superbpe.py --bpe bpe32k/ --superbpe sb32k/ --supratok st32k/ --text en30.txt \
        --runs 5 --baseline main=../main-copy       # before/after in one run

``--train``: trains a BPE and a SuperBPE model of ``--vocab-size`` on the file (in this process,
``bpe_core.train``; default options, all cores) and prints the seconds of each and their phases (the
ratio SuperBPE / BPE). Else ``--bpe`` / ``--superbpe`` name trained model folders.

Encoding: each model's ``Tokenizer.load`` (``--bpe``, ``--superbpe``, ``--supratok``; ``--methods``
picks some) encodes the whole ``--text`` in one call (``encode_to_numpy``, one thread), once to warm
the caches and then ``--runs`` times interleaved, in a worker process per checkout: this one and each
``--baseline LABEL=ROOT`` (another checkout built in place, e.g. a copy of ``main``), so before and
after are measured in the same run. Printed: MB per CPU-second of the encoding thread and MB/s
(medians), each method's ratio to ``bpe`` of the same checkout, each checkout's ratio to the first,
tokens, and whether the ids are identical across checkouts. Results also go to ``--json``.

``--corpus FILE``: the big job instead, a corpus file to one ``.npy`` (``tools/encode_corpus.py``,
``--corpus-workers`` threads, default 2) with each model, in a fresh process per run, the models
taking turns for ``--runs`` rounds. Printed: MB per CPU-second of the process tree (start-up, model
load and the ``.npy`` included: what a user's run costs), MB/s of the encode itself (the report's
seconds), each method's ratio to ``bpe`` per round (medians), tokens.

    python benchmarks/bench_superbpe.py --bpe bpe32k/ --superbpe sb32k/ --supratok st32k/ \
        --corpus en_train.txt --runs 5
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
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import bpe_core  # noqa: F401
except ImportError:  # a checkout built in place, not installed
    sys.path.insert(0, os.path.join(HERE, ".."))

import bpe_core  # noqa: E402
from bpe_core.formats.model import dump_folder  # noqa: E402


def train_both(path: str, vocab_size: int, out: str, workers) -> dict:
    """Train BPE and SuperBPE on ``path`` into ``out/bpe`` and ``out/superbpe``; their reports."""
    reports = {}
    for method in ("bpe", "superbpe"):
        t0 = time.perf_counter()
        result = bpe_core.train(bpe_core.TrainConfig(path, vocab_size, method=method, num_workers=workers))
        wall = time.perf_counter() - t0
        folder = os.path.join(out, method)
        os.makedirs(folder, exist_ok=True)
        dump_folder(result.model, folder)
        secs = result.report["seconds"]
        reports[method] = {"wall": round(wall, 3), "seconds": secs}
        print(f"train {method:8s} {vocab_size}: {wall:7.2f} s  " +
              " ".join(f"{k}={v:.2f}" for k, v in secs.items() if k not in ("total",)), flush=True)
    ratio = reports["superbpe"]["wall"] / reports["bpe"]["wall"]
    print(f"train superbpe / bpe: {ratio:.2f}x")
    reports["ratio"] = round(ratio, 3)
    return reports


def _worker(folders: dict[str, str], text_path: str, text_bytes: int) -> int:
    """``--worker``: load the models, then answer one line per method name read from stdin with the
    thread CPU seconds, wall seconds, token count and a digest of the ids of one encode (JSON)."""
    import hashlib
    with open(text_path, "rb") as f:
        data = f.read(text_bytes) if text_bytes > 0 else f.read()
    toks = {name: bpe_core.Tokenizer.load(folder) for name, folder in folders.items()}
    print(json.dumps({"ready": bpe_core.__file__}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if not name:
            break
        c0, t0 = time.thread_time(), time.perf_counter()
        ids = toks[name].encode_to_numpy(data)
        cpu, wall = time.thread_time() - c0, time.perf_counter() - t0
        print(json.dumps({"cpu": cpu, "wall": wall, "tokens": int(ids.size),
                          "digest": hashlib.sha1(ids.tobytes()).hexdigest()}), flush=True)
    return 0


def bench_encode(folders: dict[str, str], text_path: str, runs: int, roots: dict[str, str] | None = None,
                 text_bytes: int = 0) -> dict:
    """Encode the text with each model (one thread, ``encode_to_numpy``, whole text), ``runs`` times
    interleaved after one warm-up each, in one worker process per checkout (``roots``: label -> a
    checkout built in place; default this one); MB per CPU-second of the encoding thread and MB/s,
    medians, ratios to ``bpe`` of the same checkout and to the first checkout, ids compared."""
    import subprocess
    roots = roots or {"this": os.path.join(HERE, "..")}
    size = os.path.getsize(text_path) if text_bytes <= 0 else min(text_bytes, os.path.getsize(text_path))
    mb = size / 1e6
    args = [sys.executable, os.path.abspath(__file__), "--worker", "--text", text_path,
            "--text-bytes", str(text_bytes)]
    for name, folder in folders.items():
        args += [f"--{name}", folder]
    procs = {}
    for label, root in roots.items():
        env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
        procs[label] = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                        cwd=os.path.abspath(root))
        ready = json.loads(procs[label].stdout.readline())
        print(f"{label}: {ready['ready']}", flush=True)

    def ask(label, name):
        procs[label].stdin.write(name + "\n")
        procs[label].stdin.flush()
        return json.loads(procs[label].stdout.readline())

    got: dict = {(lb, n): [] for lb in roots for n in folders}
    digests: dict = {}
    for r in range(runs + 1):                      # run 0: warm-up (caches), not counted
        for name in folders:                       # interleaved: drift hits every checkout alike
            for label in roots:
                x = ask(label, name)
                digests.setdefault(name, set()).add(x["digest"])
                if r:
                    got[label, name].append(x)
    for p in procs.values():
        p.stdin.close()
        p.wait()
    out: dict = {"mb": round(mb, 3), "runs": runs, "load": os.getloadavg()}
    first = next(iter(roots))
    for label in roots:
        for name in folders:
            xs = got[label, name]
            cpu = statistics.median(x["cpu"] for x in xs)
            wall = statistics.median(x["wall"] for x in xs)
            out.setdefault(label, {})[name] = {"mb_per_cpu_s": round(mb / cpu, 2), "mb_per_s": round(mb / wall, 2),
                                               "cpu_s": [round(x["cpu"], 4) for x in xs], "tokens": xs[0]["tokens"]}
    print(f"\n{mb:.1f} MB, one thread, medians of {runs} interleaved runs, load {out['load'][0]:.2f}")
    print("| checkout | method | MB/CPU-s | MB/s | / bpe (CPU) | / bpe (wall) | / " + first + " | tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for label in roots:
        res = out[label]
        for name in folders:
            x = res[name]
            rb = x["mb_per_cpu_s"] / res["bpe"]["mb_per_cpu_s"] if "bpe" in res else float("nan")
            rw = x["mb_per_s"] / res["bpe"]["mb_per_s"] if "bpe" in res else float("nan")
            rf = x["mb_per_cpu_s"] / out[first][name]["mb_per_cpu_s"]
            x["ratio_to_bpe"] = round(rb, 3)
            print(f"| {label} | {name} | {x['mb_per_cpu_s']:.1f} | {x['mb_per_s']:.1f} | {rb:.3f} | {rw:.3f} | "
                  f"{rf:.2f} | {x['tokens']:,} |")
    same = {name: len(d) == 1 for name, d in digests.items()}
    out["ids_identical"] = same
    print("ids identical across checkouts: " + ", ".join(f"{n} {'yes' if v else 'NO'}" for n, v in same.items()))
    return out


def _corpus_run(folder: str, corpus: str, workers: int, work: str) -> dict:
    """One ``tools/encode_corpus.py`` of ``corpus`` with the model ``folder``, in a process of its
    own: its process-tree CPU seconds, wall seconds, the report's encode seconds and tokens."""
    import resource
    import subprocess
    out, report = os.path.join(work, "ids.npy"), os.path.join(work, "report.json")
    cmd = [sys.executable, os.path.join(HERE, "..", "tools", "encode_corpus.py"), corpus, "--tokenizer", folder,
           "--out", out, "--workers", str(workers), "--report", report, "--no-progress"]
    # the bpe_core this benchmark imported (installed, or this checkout built in place)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(bpe_core.__file__))))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"encode_corpus.py with {folder}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    with open(report) as f:
        rep = json.load(f)
    os.unlink(out)
    return {"cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), "wall": wall,
            "seconds": rep["seconds"], "tokens": rep["n_tokens"], "bytes": rep["n_bytes"]}


def bench_corpus(folders: dict[str, str], corpus: str, runs: int, workers: int) -> dict:
    """The corpus to ``.npy`` with each model, ``runs`` rounds, the models taking turns (a fresh
    process each); medians and each method's ratio to ``bpe`` of the same round."""
    got: dict = {name: [] for name in folders}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(runs):
            for name, folder in folders.items():
                got[name].append(_corpus_run(folder, corpus, workers, work))
    mb = next(iter(got.values()))[0]["bytes"] / 1e6
    out: dict = {"mb": round(mb, 3), "runs": runs, "workers": workers, "load": os.getloadavg()}
    print(f"\n{corpus} ({mb:.1f} MB) to .npy, {workers} threads, medians of {runs} rounds, load {out['load'][0]:.2f}")
    print("| method | MB/CPU-s (process) | MB/s (encode) | / bpe, CPU | / bpe, encode wall | tokens |")
    print("|---|---|---|---|---|---|")
    for name, xs in got.items():
        row = {"mb_per_cpu_s": round(mb / statistics.median(x["cpu"] for x in xs), 2),
               "mb_per_s": round(mb / statistics.median(x["seconds"] for x in xs), 2),
               "cpu_s": [round(x["cpu"], 3) for x in xs], "seconds": [x["seconds"] for x in xs],
               "tokens": xs[0]["tokens"]}
        if "bpe" in got:
            base = got["bpe"]
            row["ratio_cpu"] = round(statistics.median(b["cpu"] / x["cpu"] for b, x in zip(base, xs)), 3)
            row["ratio_wall"] = round(statistics.median(b["seconds"] / x["seconds"] for b, x in zip(base, xs)), 3)
        out[name] = row
        print(f"| {name} | {row['mb_per_cpu_s']:.1f} | {row['mb_per_s']:.1f} | {row.get('ratio_cpu', float('nan')):.3f} | "
              f"{row.get('ratio_wall', float('nan')):.3f} | {row['tokens']:,} |")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", default=None, metavar="FILE", help="train both models on FILE first")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--out", default=None, metavar="DIR", help="where --train writes the models (default: a temp folder)")
    p.add_argument("--bpe", default=None, metavar="DIR")
    p.add_argument("--superbpe", default=None, metavar="DIR")
    p.add_argument("--supratok", default=None, metavar="DIR")
    p.add_argument("--methods", default=None, metavar="NAMES",
                   help="comma-separated models to encode, of those given (default: all given)")
    p.add_argument("--baseline", action="append", default=[], metavar="LABEL=ROOT",
                   help="also encode with the checkout ROOT (built in place; e.g. a copy of main), in the "
                        "same interleaved run; repeatable")
    p.add_argument("--text-bytes", type=int, default=0, metavar="N", help="encode only the first N bytes")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--text", default=None, metavar="FILE", help="text to encode (e.g. en_heldout.txt)")
    p.add_argument("--corpus", default=None, metavar="FILE",
                   help="the big job instead: FILE to one .npy with each model (tools/encode_corpus.py)")
    p.add_argument("--corpus-workers", type=int, default=2, metavar="N", help="threads of --corpus's encodes")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-encode", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        if args.train:
            out = args.out or tmp
            results["train"] = train_both(args.train, args.vocab_size, out, args.workers)
            folders = {"bpe": os.path.join(out, "bpe"), "superbpe": os.path.join(out, "superbpe")}
        else:
            folders = {k: v for k, v in (("bpe", args.bpe), ("superbpe", args.superbpe),
                                         ("supratok", args.supratok)) if v}
        if args.methods:
            want = args.methods.split(",")
            missing = [m for m in want if m not in folders]
            if missing:
                p.error(f"--methods names models not given: {', '.join(missing)}")
            folders = {m: folders[m] for m in want}
        if args.worker:
            return _worker(folders, args.text, args.text_bytes)
        if args.corpus:
            if not folders:
                p.error("--corpus needs models (--train, or --bpe / --superbpe / --supratok)")
            if args.corpus_workers < 1:
                p.error("--corpus-workers must be at least 1")
            results["corpus"] = bench_corpus(folders, args.corpus, args.runs, args.corpus_workers)
        elif not args.no_encode:
            if not args.text or not folders:
                p.error("encoding needs --text and models (--train, or --bpe / --superbpe / --supratok)")
            roots = {}
            for spec in args.baseline:                # first, so "/ first" is this one over the baseline
                label, _, root = spec.rpartition("=")
                roots[label or "baseline"] = root
            roots["this"] = os.path.join(HERE, "..")
            results["encode"] = bench_encode(folders, args.text, args.runs, roots, args.text_bytes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
