#!/usr/bin/env python3
"""Encoding throughput: bpe_core against tiktoken and HF ``tokenizers`` on the same ranks.

    python benchmarks/bench_encode.py [--corpora DIR] [--work DIR] [--skip-corpus] [--vocab32k DIR]
                                 [--runs 3] [--root CHECKOUT]

Tokenizers: the GPT-2 fixture vocab, and a 32k vocab trained on en_train (by HF ``tokenizers``'
ByteLevel BPE trainer when no ``--vocab32k`` folder with vocab.json + merges.txt is given; it is
converted through the GPT-2 files, so all three libraries get the same ranks). Texts: en_heldout and
ood_code, decompressed from ``../shared/corpora/*.xz`` into the work folder.

For each (vocab, text): MB/s on one core (one call on the whole text, bpe_core with a cold pretoken
cache each run; HF: a loop over documents) and with all cores (bpe_core: ``encode_corpus`` worker
processes, which includes starting them, and ``encode_batch`` threads; tiktoken: ``encode_batch``
threads; HF: ``encode_batch`` (rayon)), the ratio to tiktoken, and whether the ids are identical.
bpe_core and tiktoken are timed ``--runs`` times, interleaved, and the medians reported (HF once:
it is 20-50x slower). ``--root`` imports bpe_core from another checkout (built in place), so the
same script measures an older version. Then ``tools/encode_corpus.py``
on the whole en_train with wall time and the peak RSS of the process tree (psutil, sampled every
50 ms). Results go to stdout as a table and to ``<work>/bench_encode.json``.
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
import lzma
import shutil
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
if "--root" in sys.argv:                 # measure another checkout's bpe_core with this script
    ROOT = os.path.abspath(sys.argv[sys.argv.index("--root") + 1])
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from bpe_core.encode.encode_corpus import encode_corpus  # noqa: E402
from bpe_core.formats.model import load_gpt2  # noqa: E402
from bpe_core.pretok.patterns import GPT2_PATTERN  # noqa: E402
from bpe_core.encode.tokenizer import Tokenizer  # noqa: E402

EOT = "<|endoftext|>"
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def decompress(corpora: str, name: str, work: str) -> str:
    out = os.path.join(work, name)
    if not os.path.exists(out):
        with lzma.open(os.path.join(corpora, name + ".xz")) as src, open(out + ".part", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
        os.replace(out + ".part", out)
    return out


def train_32k(en_train: str, work: str) -> str:
    """32k ByteLevel BPE with HF tokenizers (GPT-2 split regex), saved as GPT-2 files."""
    out = os.path.join(work, "hf32k")
    if os.path.exists(os.path.join(out, "vocab.json")):
        return out
    import tokenizers
    from tokenizers import pre_tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=32000, special_tokens=[EOT], show_progress=False,
                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0 = time.time()
    tok.train([en_train], trainer)
    os.makedirs(out, exist_ok=True)
    tok.model.save(out)
    print(f"trained the 32k vocab with HF tokenizers in {time.time() - t0:.0f} s", file=sys.stderr)
    return out


def load_three(vocab_path: str, merges_path: str, work: str, tag: str):
    """bpe_core Tokenizer, tiktoken Encoding and HF Tokenizer on the same vocab.json + merges.txt."""
    import tiktoken
    import tiktoken.load
    import tokenizers
    from tokenizers import decoders, pre_tokenizers

    vocab, merges = load_gpt2(vocab_path, merges_path)
    ours = Tokenizer(vocab, merges, [EOT])
    eot_id = ours.special_tokens[EOT]
    head = open(merges_path, encoding="utf-8").readline()
    fixed = merges_path
    if not head.startswith("#version"):
        fixed = os.path.join(work, f"{tag}-merges.txt")
        with open(fixed, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + open(merges_path, encoding="utf-8").read())
    try:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(fixed, vocab_path)
    except AssertionError:
        # Not GPT-2's id layout (HF puts <|endoftext|> at 0 and the bytes in its own order): rank = id,
        # which is merge order for every merged token, as tiktoken needs.
        ranks = {b: i for i, b in vocab.items()}
    ranks.pop(EOT.encode(), None)
    tt = tiktoken.Encoding(tag, pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: eot_id})
    hf = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(vocab_path, fixed))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(GPT2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([EOT])
    return ours, tt, hf


def timed(fn, n_bytes: int, repeat: int = 1):
    """(result, MB/s of the median run)."""
    times = []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return result, n_bytes / 1e6 / statistics.median(times)


def interleaved(fns: dict, n_bytes: int, runs: int, before=None) -> dict:
    """Run each of ``fns`` once per round, ``runs`` rounds; MB/s of each one's median round."""
    times: dict = {k: [] for k in fns}
    results: dict = {}
    for _ in range(runs):
        for name, fn in fns.items():
            if before is not None:
                before(name)
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return results, {k: n_bytes / 1e6 / statistics.median(v) for k, v in times.items()}


def bench_pair(tag, ours, tt, hf, path, work, n_cores, runs=3):
    data = open(path, "rb").read()
    text = data.decode("utf-8")
    docs = [d + EOT for d in text.split(EOT)]
    docs[-1] = docs[-1][: -len(EOT)]
    row = {"vocab": tag, "text": os.path.basename(path), "MB": len(data) / 1e6, "runs": runs}

    def cold(name):
        if name == "bpe_core_1":
            ours._encoder().clear_cache()         # every run pays for merging the unique pretokens

    res, mbs = interleaved({"bpe_core_1": lambda: ours.encode_to_numpy(data),
                            "tiktoken_1": lambda: tt.encode(text, allowed_special="all")}, len(data), runs, cold)
    row.update(mbs)
    ids_ours, ids_tt = res["bpe_core_1"], res["tiktoken_1"]
    # HF on one 12 MB string is pathologically slow (~0.3 MB/s), so one core = a loop over documents.
    ids_hf, row["hf_1"] = timed(lambda: [i for d in docs for i in hf.encode(d, add_special_tokens=False).ids],
                                len(data))
    row["identical_tiktoken"] = ids_ours.tolist() == ids_tt
    row["identical_hf"] = ids_ours.tolist() == ids_hf
    out = os.path.join(work, f"{tag}-{os.path.basename(path)}.npy")
    res, mbs = interleaved({
        "bpe_core_all": lambda: encode_corpus(path, ours, out, num_workers=n_cores, progress=False),
        "bpe_core_threads": lambda: ours.encode_batch(docs, num_threads=n_cores),
        "tiktoken_all": lambda: tt.encode_batch(docs, num_threads=n_cores, allowed_special="all"),
    }, len(data), runs)
    row.update(mbs)
    row["identical_corpus"] = bool(np.array_equal(np.load(out, mmap_mode="r"), ids_ours))
    row["identical_threads"] = [i for d in res["bpe_core_threads"] for i in d] == ids_tt
    os.unlink(out)
    _, row["hf_all"] = timed(lambda: hf.encode_batch(docs, add_special_tokens=False), len(data))
    return row


def whole_file(en_train: str, model_dir: str, work: str, n_cores: int, memory_limit: str) -> dict:
    import psutil

    out = os.path.join(work, "en_train_ids.npy")
    cmd = [sys.executable, os.path.join(HERE, "..", "tools", "encode_corpus.py"), en_train, "--tokenizer", model_dir,
           "--out", out, "--workers", str(n_cores), "--memory-limit", memory_limit, "--no-progress"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    summary = proc.stdout.read().strip()
    size = os.path.getsize(en_train)
    n = len(np.load(out, mmap_mode="r"))
    os.unlink(out)
    return {"cmd": " ".join(cmd), "rc": proc.returncode, "wall_s": wall, "MB_per_s": size / 1e6 / wall,
            "peak_rss_MB": peak / 1e6, "tokens": n, "summary": summary}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpora", default=os.path.join(ROOT, "..", "shared", "corpora"))
    p.add_argument("--work", default=os.path.join(ROOT, "bench_out"))
    p.add_argument("--vocab32k", default=None, help="folder with vocab.json + merges.txt of a 32k vocab")
    p.add_argument("--skip-corpus", action="store_true", help="skip the whole-file en_train run")
    p.add_argument("--skip-32k", action="store_true")
    p.add_argument("--memory-limit", default="4G")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs of bpe_core and tiktoken (medians)")
    p.add_argument("--root", default=None, help="import bpe_core from this checkout (built in place)")
    p.add_argument("--skip-regex", action="store_true", help="skip the regex pre-tokenizer figures")
    p.add_argument("--json", default="bench_encode.json", help="results file name in the work folder")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    n_cores = os.cpu_count() or 1
    texts = [decompress(args.corpora, n, args.work) for n in ("en_heldout.txt", "ood_code.txt")]
    vocabs = [("gpt2", os.path.join(FIXTURES, "gpt2_vocab.json"), os.path.join(FIXTURES, "gpt2_merges.txt"))]
    if not args.skip_32k or not args.skip_corpus:
        en_train = decompress(args.corpora, "en_train.txt", args.work)
    if not args.skip_32k:
        folder = args.vocab32k or train_32k(en_train, args.work)
        vocabs.append(("32k", os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")))
    rows = []
    # Where the time goes without the native pre-tokenizer (regex), GPT-2 vocab, one core.
    import bpe_core.encode.tokenizer as tokenizer_mod

    ours = load_three(*vocabs[0][1:], args.work, "gpt2")[0]
    for path in texts if not args.skip_regex else ():
        data = open(path, "rb").read()
        tokenizer_mod._NATIVE_PRETOKENIZER = False
        _, regex_mbs = timed(lambda: ours.encode_to_numpy(data), len(data))
        tokenizer_mod._NATIVE_PRETOKENIZER = True
        print(f"regex pre-tokenizer, {os.path.basename(path)}: {regex_mbs:.1f} MB/s", file=sys.stderr)
        rows_regex = {"text": os.path.basename(path), "bpe_core_regex_1": regex_mbs}
        print(json.dumps(rows_regex), file=sys.stderr)
    for tag, vocab_path, merges_path in vocabs:
        three = load_three(vocab_path, merges_path, args.work, tag)
        for path in texts:
            row = bench_pair(tag, *three, path, args.work, n_cores, args.runs)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(f"\n{n_cores} cores; MB/s, medians of {args.runs} interleaved runs (HF: one run); ratio to tiktoken; "
          f"ids identical to tiktoken / HF / encode_corpus / encode_batch\n")
    print(f"| vocab | text | bpe_core 1 core | tiktoken 1 core | HF 1 core | bpe_core {n_cores} workers | "
          f"bpe_core {n_cores} threads | tiktoken {n_cores} threads | HF {n_cores} | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ident = "/".join("yes" if r.get(k) else "NO" for k in ("identical_tiktoken", "identical_hf",
                                                               "identical_corpus", "identical_threads"))
        print(f"| {r['vocab']} | {r['text']} | {r['bpe_core_1']:.1f} ({r['bpe_core_1'] / r['tiktoken_1']:.2f}x) | "
              f"{r['tiktoken_1']:.1f} | {r['hf_1']:.1f} ({r['hf_1'] / r['tiktoken_1']:.2f}x) | "
              f"{r['bpe_core_all']:.1f} ({r['bpe_core_all'] / r['tiktoken_all']:.2f}x) | "
              f"{r['bpe_core_threads']:.1f} ({r['bpe_core_threads'] / r['tiktoken_all']:.2f}x) | "
              f"{r['tiktoken_all']:.1f} | {r['hf_all']:.1f} | {ident} |")
    result = {"cores": n_cores, "rows": rows}
    if not args.skip_corpus:
        model_dir = os.path.join(args.work, "gpt2-native")
        os.makedirs(model_dir, exist_ok=True)
        # GPT-2's ids do not follow the native layout (bytes first); encode_corpus takes the GPT-2 folder.
        shutil.copy(os.path.join(FIXTURES, "gpt2_vocab.json"), os.path.join(model_dir, "vocab.json"))
        shutil.copy(os.path.join(FIXTURES, "gpt2_merges.txt"), os.path.join(model_dir, "merges.txt"))
        whole = whole_file(en_train, model_dir, args.work, n_cores, args.memory_limit)
        result["encode_corpus_en_train"] = whole
        print(f"\nencode_corpus.py on en_train ({os.path.getsize(en_train) / 1e6:.0f} MB, GPT-2 vocab, "
              f"{n_cores} workers, --memory-limit {args.memory_limit}): {whole['wall_s']:.1f} s wall, "
              f"{whole['MB_per_s']:.1f} MB/s, peak RSS of the process tree {whole['peak_rss_MB']:.0f} MB, "
              f"{whole['tokens']:,} tokens, rc={whole['rc']}")
    with open(os.path.join(args.work, args.json), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
