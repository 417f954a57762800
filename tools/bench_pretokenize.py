"""Benchmark pre-tokenization on one core: ``regex`` against the native scanner.

For each corpus (a slice of en_train, ood_code, every language in ``multi/``) and pattern it
measures, in MB/s of UTF-8 input (median of ``--runs`` runs):

- ``regex``         ``for m in regex.finditer(pattern, text): pass`` (text already decoded)
- ``regex+Counter`` ``Counter(regex.findall(pattern, text))`` (the fastest plain-Python count)
- ``findall``       ``regex.findall(pattern, text)`` (the cheapest ``regex`` list: ``list[str]``)
- ``split``         ``_pretok.split_ends(buf, pattern)`` (all pretoken ends, int64)
- ``count``         ``_pretok.count_pretokens(buf, [[0, len]], pattern)`` (sorted word table)
- ``list``          ``pretokenize.pretokenize(buf, pattern, ["<|endoftext|>"])`` (the list API:
  ``list[bytes]``, special tokens split off, built natively by ``_pretok.split_pieces``)

Ratios: ``split/regex``, ``list/regex`` (the list API against the bare ``finditer`` loop, which
builds nothing), ``list/findall`` and ``count/Counter``.

Times are the process's CPU time (``time.process_time``), so a shared, busy machine slows the
figures less than wall time would (caches and memory bandwidth are still shared); everything runs
on one thread.

and checks on the way that the native pretokens equal the regex ones. Usage::

    python tools/bench_pretokenize.py                      # gpt2, 50 MB of en_train
    python tools/bench_pretokenize.py --patterns gpt2 cl100k o200k --en-mb 20 --runs 5
    python tools/bench_pretokenize.py --input /tmp/en_heldout.txt --patterns gpt2 cl100k o200k
    python tools/bench_pretokenize.py --input /tmp/en_heldout.txt --skip-regex --runs 7  # native only
"""
from __future__ import annotations

import argparse
import lzma
import os

# One core: no idle BLAS threads spinning beside the measured one (process CPU time counts them).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
import pathlib
import statistics
import sys
import tempfile
import time
from collections import Counter

import numpy as np
import regex

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bpe_core.pretok import _pretok  # noqa: E402
from bpe_core.pretok.patterns import PATTERNS  # noqa: E402
from bpe_core.pretok.pretokenize import pretokenize  # noqa: E402

DEFAULT_CORPORA = ROOT.parent / "shared" / "corpora"


def _load_xz_slice(path: pathlib.Path, n_bytes: int, tmp_dir: str) -> bytes:
    """The first n_bytes of an .xz corpus (cut after a newline), via a temp file."""
    out = pathlib.Path(tmp_dir) / path.name.replace(".xz", "")
    with lzma.open(path) as src, open(out, "wb") as dst:
        dst.write(src.read(n_bytes))
    data = out.read_bytes()
    cut = data.rfind(b"\n")
    return data[: cut + 1] if cut > 0 else data


def _median_seconds(fn, runs: int, min_seconds: float = 0.3) -> float:
    """Median CPU seconds over ``runs`` runs; small inputs repeat inside a run for min_seconds."""
    fn()  # warm up (page in, first allocations)
    times = []
    for _ in range(runs):
        reps, start = 0, time.process_time()
        while True:
            fn()
            reps += 1
            elapsed = time.process_time() - start
            if elapsed >= min_seconds:
                break
        times.append(elapsed / reps)
    return statistics.median(times)


def bench_one(data: bytes, name: str, runs: int, skip_regex: bool = False) -> dict:
    pattern = regex.compile(PATTERNS[name])
    pid = _pretok.PATTERN_IDS[name]
    text = data.decode("utf-8", "surrogateescape")
    buf = np.frombuffer(data, dtype=np.uint8)
    spans = np.array([[0, len(data)]], dtype=np.int64)

    # Correctness on the way: the native ends are the regex ends.
    ends = _pretok.split_ends(buf, pid)
    pieces = pattern.findall(text)
    if len(pieces) != len(ends) or b"".join(
            p.encode("utf-8", "surrogateescape") for p in pieces[:1000]) != data[: ends[min(999, len(ends) - 1)]]:
        raise AssertionError(f"{name}: native pretokens differ from regex")

    def run_regex():
        for _ in pattern.finditer(text):
            pass

    mb = len(data) / 1e6
    nan = float("nan")
    return {
        "MB": mb,
        "regex": nan if skip_regex else mb / _median_seconds(run_regex, runs),
        "regex+Counter": nan if skip_regex else
        mb / _median_seconds(lambda: Counter(pattern.findall(text)), runs),
        "findall": nan if skip_regex else mb / _median_seconds(lambda: pattern.findall(text), runs),
        "split": mb / _median_seconds(lambda: _pretok.split_ends(buf, pid), runs),
        "count": mb / _median_seconds(lambda: _pretok.count_pretokens(buf, spans, pid), runs),
        "list": mb / _median_seconds(lambda: pretokenize(data, name, ["<|endoftext|>"]), runs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", default=str(DEFAULT_CORPORA), help="the shared corpora folder")
    parser.add_argument("--patterns", nargs="+", default=["gpt2"], choices=list(PATTERNS))
    parser.add_argument("--en-mb", type=float, default=50.0, help="MB of en_train and ood_code")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="corpus names to run (e.g. en_train ja)")
    parser.add_argument("--input", nargs="*", default=None, metavar="FILE",
                        help="plain text files to run instead of the corpora (e.g. /tmp/en_heldout.txt)")
    parser.add_argument("--skip-regex", action="store_true",
                        help="measure only the native columns (the regex ones print nan)")
    args = parser.parse_args(argv)

    corpora = pathlib.Path(args.corpora)
    if not args.input and not corpora.is_dir():
        print(f"{corpora}: corpora folder not found", file=sys.stderr)
        return 2
    n_bytes = int(args.en_mb * 1e6)
    with tempfile.TemporaryDirectory(prefix="bench_pretok_") as tmp:
        if args.input:
            inputs = [(pathlib.Path(f).name.split(".")[0][:9], pathlib.Path(f).read_bytes) for f in args.input]
        else:
            inputs = [(p.name.split(".")[0], lambda p=p: _load_xz_slice(p, n_bytes, tmp))
                      for p in (corpora / "en_train.txt.xz", corpora / "ood_code.txt.xz")]
            inputs += [(p.stem, p.read_bytes) for p in sorted((corpora / "multi").glob("*.txt"))]
        if args.only:
            inputs = [(k, load) for k, load in inputs if k in args.only]
        cols = ["MB", "regex", "regex+Counter", "findall", "split", "count", "list"]
        print(f"# MB/s of CPU time on one core, median of {args.runs} runs; regex {regex.__version__}, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
        header = f"{'pattern':7} {'corpus':9} " + " ".join(f"{c:>13}" for c in cols) + \
            f" {'split/regex':>11} {'count/Counter':>13} {'list/regex':>10} {'list/findall':>12}"
        print(header)
        print("-" * len(header))
        for key, load in inputs:
            data = load()
            for name in args.patterns:
                r = bench_one(data, name, args.runs, args.skip_regex)
                print(f"{name:7} {key:9} " + " ".join(f"{r[c]:13.1f}" for c in cols)
                      + f" {r['split'] / r['regex']:10.1f}x {r['count'] / r['regex+Counter']:12.1f}x"
                      + f" {r['list'] / r['regex']:9.1f}x {r['list'] / r['findall']:11.1f}x",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
