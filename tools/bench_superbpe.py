#!/usr/bin/env python3
"""SuperBPE against plain BPE: training time and stage-aware encoding throughput, side by side.

    python tools/bench_superbpe.py --train en_train_30MB.txt --vocab-size 8000 --text en_heldout.txt
    python tools/bench_superbpe.py --bpe bpe8k/ --superbpe sb8k/ --text en_heldout.txt
    python tools/bench_superbpe.py --train en_train.txt --vocab-size 32000 --no-encode

``--train``: trains a BPE and a SuperBPE model of ``--vocab-size`` on the file (in this process,
``bpe_core.train``; default options, all cores) and prints the seconds of each and their phases (the
ratio SuperBPE / BPE). Else ``--bpe`` / ``--superbpe`` name trained model folders.

Encoding: each model's ``Tokenizer.load`` encodes the whole ``--text`` in one call
(``encode_to_numpy``, one thread), ``--runs`` times interleaved; the median MB/s of each and the ratio
SuperBPE / BPE are printed, with tokens and bytes per token. Results also go to ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
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


def bench_encode(folders: dict[str, str], text_path: str, runs: int) -> dict:
    with open(text_path, "rb") as f:
        data = f.read()
    toks = {name: bpe_core.Tokenizer.load(folder) for name, folder in folders.items()}
    times: dict[str, list[float]] = {name: [] for name in toks}
    n_tokens = {}
    for _ in range(runs):
        for name, tok in toks.items():            # interleaved: drift hits both alike
            t0 = time.perf_counter()
            ids = tok.encode_to_numpy(data)
            times[name].append(time.perf_counter() - t0)
            n_tokens[name] = int(ids.size)
    out = {}
    mb = len(data) / 1e6
    for name in toks:
        med = statistics.median(times[name])
        out[name] = {"mb_per_s": round(mb / med, 3), "seconds": [round(t, 3) for t in times[name]],
                     "tokens": n_tokens[name], "bytes_per_token": round(len(data) / max(n_tokens[name], 1), 4)}
        print(f"encode {name:8s}: {mb / med:7.2f} MB/s (median of {runs}), {n_tokens[name]:,} tokens, "
              f"{len(data) / max(n_tokens[name], 1):.3f} bytes/token")
    if "bpe" in out and "superbpe" in out:
        ratio = out["superbpe"]["mb_per_s"] / out["bpe"]["mb_per_s"]
        out["ratio"] = round(ratio, 3)
        print(f"encode superbpe / bpe throughput: {ratio:.2f}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", default=None, metavar="FILE", help="train both models on FILE first")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--out", default=None, metavar="DIR", help="where --train writes the models (default: a temp folder)")
    p.add_argument("--bpe", default=None, metavar="DIR")
    p.add_argument("--superbpe", default=None, metavar="DIR")
    p.add_argument("--text", default=None, metavar="FILE", help="text to encode (e.g. en_heldout.txt)")
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
            folders = {k: v for k, v in (("bpe", args.bpe), ("superbpe", args.superbpe)) if v}
        if not args.no_encode:
            if not args.text or not folders:
                p.error("encoding needs --text and models (--train, or --bpe / --superbpe)")
            results["encode"] = bench_encode(folders, args.text, args.runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
