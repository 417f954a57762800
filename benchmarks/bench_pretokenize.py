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

and checks on the way that the native pretokens equal the regex ones.

``--against OLD.so`` measures another build of ``_pretok`` (a copy of an older
``_pretok.cpython-*.so``) beside this one in the same process, runs of the two alternating, for the
native columns only: ``split``, ``count`` and ``train`` (what a training worker does with a block:
find the special tokens, ``<|endoftext|>``, then count the pretokens of the text between them; the
old build with the ``regex`` search of ``corpus.chunks.split_spans``, the new with the native
``pretokenize.split_spans``). Each is reported in GB/s per CPU-second and per wall second, old, new and
new/old. Usage::

    python benchmarks/bench_pretokenize.py                      # gpt2, 50 MB of en_train
    python benchmarks/bench_pretokenize.py --patterns gpt2 cl100k o200k --en-mb 20 --runs 5
    python benchmarks/bench_pretokenize.py --input /tmp/en_heldout.txt --patterns gpt2 cl100k o200k
    python benchmarks/bench_pretokenize.py --input /tmp/en_heldout.txt --skip-regex --runs 7  # native only
    python benchmarks/bench_pretokenize.py --input /tmp/en_heldout.txt /tmp/ood_code.txt \
        --patterns gpt2 cl100k o200k --against /tmp/old/_pretok.cpython-311-x86_64-linux-gnu.so --runs 7
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
import importlib.machinery
import importlib.util
import lzma

# One core: no idle BLAS threads spinning beside the measured one (process CPU time counts them).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
import pathlib
import statistics
import tempfile
import time
from collections import Counter

import numpy as np
import regex

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bpe_core.corpus.chunks import split_spans as split_spans_regex  # noqa: E402
from bpe_core.pretok import _pretok  # noqa: E402
from bpe_core.pretok.patterns import PATTERNS  # noqa: E402
from bpe_core.pretok.pretokenize import pretokenize, split_spans  # noqa: E402

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


def load_build(path: str):
    """Another build of ``_pretok`` (an ``.so`` file) as a module of its own, beside the current one."""
    path = str(pathlib.Path(path).resolve())
    loader = importlib.machinery.ExtensionFileLoader("_pretok", path)
    spec = importlib.util.spec_from_file_location("_pretok", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _times(fn) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one call."""
    c, w = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c, time.perf_counter() - w


SPECIALS = [b"<|endoftext|>"]


def bench_against(data: bytes, name: str, old, runs: int) -> dict:
    """GB/s (CPU and wall) of split / count / train for the old build and this one, interleaved."""
    buf = np.frombuffer(data, dtype=np.uint8)
    pid = _pretok.PATTERN_IDS[name]
    whole = np.array([[0, len(data)]], dtype=np.int64)
    builds = {"old": old, "new": _pretok}
    # Same results first: ends, table, and the training path's table.
    ref = None
    for key, mod in builds.items():
        out = (mod.split_ends(buf, pid), mod.count_pretokens(buf, whole, pid),
               mod.count_pretokens(buf, split_spans_regex(buf, 0, len(data), SPECIALS)[0], pid))
        if ref is None:
            ref = out
        elif not (np.array_equal(out[0], ref[0]) and all(
                np.array_equal(a, b) for t, u in zip(out[1:], ref[1:]) for a, b in zip(t, u))):
            raise AssertionError(f"{name}: the two builds disagree")
    spans_new = split_spans(buf, 0, len(data), SPECIALS)[0]
    if not np.array_equal(spans_new, split_spans_regex(buf, 0, len(data), SPECIALS)[0]):
        raise AssertionError("split_spans differs from split_spans_regex")
    work = {
        "split": {k: (lambda m=m: m.split_ends(buf, pid)) for k, m in builds.items()},
        "count": {k: (lambda m=m: m.count_pretokens(buf, whole, pid)) for k, m in builds.items()},
        "train": {"old": lambda: old.count_pretokens(
                      buf, split_spans_regex(buf, 0, len(data), SPECIALS)[0], pid),
                  "new": lambda: _pretok.count_pretokens(
                      buf, split_spans(buf, 0, len(data), SPECIALS)[0], pid)},
    }
    out = {}
    for col, fns in work.items():
        for fn in fns.values():
            fn()  # warm up
        cpu = {k: [] for k in fns}
        wall = {k: [] for k in fns}
        for _ in range(runs):
            for k, fn in fns.items():  # alternate the builds
                c, w = _times(fn)
                cpu[k].append(c)
                wall[k].append(w)
        for k in fns:
            out[(col, k, "cpu")] = len(data) / 1e9 / statistics.median(cpu[k])
            out[(col, k, "wall")] = len(data) / 1e9 / statistics.median(wall[k])
    return out


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
    parser.add_argument("--against", default=None, metavar="OLD.so",
                        help="another build of _pretok to measure beside this one (split, count, train)")
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
        if args.against:
            old = load_build(args.against)
            print(f"# GB/s on one core, old = {args.against}, new = {_pretok.__file__}; median of "
                  f"{args.runs} alternating runs; regex {regex.__version__}, {os.cpu_count()} CPUs, "
                  f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
            print(f"{'pattern':7} {'corpus':9} {'MB':>6}  " + "  ".join(
                f"{c + ' ' + t:>23}" for c in ("split", "count", "train") for t in ("cpu", "wall")))
            print(f"{'':7} {'':9} {'':>6}  " + "  ".join(f"{'old    new  new/old':>23}" for _ in range(6)))
            for key, load in inputs:
                data = load()
                for name in args.patterns:
                    r = bench_against(data, name, old, args.runs)
                    cells = []
                    for c in ("split", "count", "train"):
                        for t in ("cpu", "wall"):
                            a, b = r[(c, "old", t)], r[(c, "new", t)]
                            cells.append(f"{a:6.3f} {b:6.3f} {b / a:7.2f}x")
                    print(f"{name:7} {key:9} {len(data) / 1e6:6.1f}  " + "  ".join(f"{x:>23}" for x in cells),
                          flush=True)
            print(f"# load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
            return 0
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
    sys.exit(_tool_start.run_bench(main))
