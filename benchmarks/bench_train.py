#!/usr/bin/env python3
"""Benchmark BPE training: bpe_core against HF ``tokenizers`` and ``rustbpe`` on the same file.

    python benchmarks/bench_train.py /tmp/en_train.txt --vocab-size 10000 32000 --repeats 3
    python benchmarks/bench_train.py /tmp/en_train.txt --vocab-size 32000 --tools bpe_core --method bpe superbpe

With ``--method`` bpe_core runs once per method (``bpe_core`` is plain BPE, ``bpe_core:superbpe``
SuperBPE and ``bpe_core:supratok`` SupraTok with their defaults), interleaved with the other tools,
and the table gives each one's time, CPU time and peak RSS over plain BPE's:

    python benchmarks/bench_train.py en60.txt --vocab-size 32000 --tools bpe_core --method bpe superbpe supratok

``--against DIR [DIR ...]``: other checkouts of bpe_core (built in place) run in the same interleaved
loop (``PYTHONPATH=DIR``), their rows marked ``@1``, ``@2``..., each timed against its own plain BPE:

    python benchmarks/bench_train.py en_train.txt --vocab-size 32000 --tools bpe_core --method bpe superbpe --against ../old

Each training runs in a fresh subprocess; runs are interleaved (A B C A B C ...) so drift on a
noisy machine hits every tool alike. For each run the parent samples the RSS of the whole process
tree (psutil, every 50 ms), and the run reports its CPU seconds (user + system of the process, its
threads and the worker processes it waited for). Printed per vocab size: median wall seconds, CPU
seconds and peak RSS, the ratio of each tool's time to bpe_core's (> 1 means bpe_core is faster),
and per round (each run over plain BPE's of the same round, the median of those) the time, CPU and
peak RSS ratios: on a shared machine the CPU ratio is the steadier one.

``--small-run``: the fixed costs of a small training run, measured on the whole process: the CLI
(``tools/train_bpe.py FILE --vocab-size V --out DIR``, imports, plan, count, merges and the output
folder) in a fresh process on a 1 MB file (the first ``--small-bytes`` of INPUT, read through
xz/gzip/zstd; default INPUT: ``../shared/corpora/en_train.txt.xz`` beside the checkout, else the
packaged sample repeated), wall seconds and the process's max RSS (``wait4``, exact, no sampling),
median of ``--repeats`` interleaved runs, next to ``python -c "import numpy"`` (a fixed reference:
on a busy machine the ratio to it is steadier than the seconds) and the peers that are installed
(``gigabpe``, HF ``tokenizers``: train and write their ``tokenizer.json``). ``--against`` checkouts
run their own ``tools/train_bpe.py``. Children run without ``PYTHONDONTWRITEBYTECODE`` (the
bytecode of an installed package is cached; a first, unmeasured run of each writes it):

    python benchmarks/bench_train.py --small-run --repeats 7 --against ../old_checkout

"per round" is the median of each round's time over plain BPE's in the same round (the runs are
interleaved, so a slow spell of a shared machine hits both): steadier than the ratio of the medians
when the machine is noisy.

Tools that are not installed are skipped. HF gets the same split regex (``Split`` + ``ByteLevel``
with ``use_regex=False``) and ``BpeTrainer``; rustbpe gets the documents (split on the special
token) through ``train_from_iterator`` with the same pattern. Their tie-breaking differs from ours
(smallest ids vs greatest bytes), so their merges can differ on ties; only speed and memory are
compared here (exactness is the test suite's job).
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
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import bpe_core  # noqa: F401
except ImportError:  # a checkout built in place, not installed
    sys.path.insert(0, os.path.join(HERE, ".."))

SPECIAL = "<|endoftext|>"


# ==== One run (in a child process) ===========================================================


def _iter_docs(path, block=1 << 20):
    """Stream documents split on the special token, without loading the file."""
    tail = ""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        while True:
            chunk = f.read(block)
            if not chunk:
                break
            parts = (tail + chunk).split(SPECIAL)
            tail = parts.pop()
            yield from parts
    if tail:
        yield tail


def run_one(tool: str, path: str, vocab_size: int, workers: int | None) -> dict:
    from bpe_core.pretok.patterns import GPT2_PATTERN

    tool = tool.partition("@")[0]              # (which checkout: PYTHONPATH, set by the parent)
    t0 = time.perf_counter()
    if tool == "bpe_core" or tool.startswith("bpe_core:"):
        import bpe_core

        method = tool.partition(":")[2] or "bpe"
        _, merges = bpe_core.train_bpe(path, vocab_size, [SPECIAL], num_workers=workers, method=method)
        n = len(merges)
    elif tool == "hf":
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[SPECIAL], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=0)
        tok.train([path], trainer)
        n = tok.get_vocab_size()
    elif tool == "rustbpe":
        import rustbpe

        tok = rustbpe.Tokenizer()
        tok.train_from_iterator(_iter_docs(path), vocab_size, pattern=GPT2_PATTERN)
        n = tok.vocab_size
    else:
        raise ValueError(tool)
    module = sys.modules["bpe_core"].__file__ if "bpe_core" in sys.modules else None
    return {"tool": tool, "seconds": time.perf_counter() - t0, "size": n, "module": module, "cpu": cpu_seconds()}


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, its threads and the children it has waited for
    (the pre-tokenization workers): the whole run's CPU time, read at its end."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# ==== Driver =================================================================================


def measure(tool, path, vocab_size, workers, interval=0.05, checkout=None) -> dict:
    import psutil

    cmd = [sys.executable, os.path.abspath(__file__), "--_run", tool, path, str(vocab_size)]
    if workers:
        cmd += ["--workers", str(workers)]
    env = None
    if checkout is not None:              # bpe_core from that checkout, before any installed one
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([checkout] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            procs = [ps] + ps.children(recursive=True)
            rss = 0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(interval)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} failed:\n{err[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(tool=tool, wall=wall, peak_rss=peak)
    if checkout is not None and not (result.get("module") or "").startswith(os.path.abspath(checkout)):
        raise RuntimeError(f"{tool}: imported {result.get('module')}, not the checkout {checkout} (is it built in place?)")
    return result


# bpe_core imports its trainer lazily: import the module that trains (it needs numpy and the kernels)
TOOL_MODULES = {"bpe_core": "bpe_core.training", "hf": "tokenizers", "rustbpe": "rustbpe"}
#: what a tool needs besides its module (bpe_core imports numpy only when a run needs it: any run
#: larger than one chunk)
TOOL_DEPENDENCIES = {"bpe_core": ["numpy"]}


# ==== Small runs: the fixed costs of a whole process =========================================

SMALL_PEERS = {
    "gigabpe": ("gigabpe", "import gigabpe, sys; gigabpe.train_tokenizer([sys.argv[1]], vocab_size=int(sys.argv[2]), "
                           "output=sys.argv[3] + '.json', pretokenizer='bytelevel', special_tokens=['<|endoftext|>'])"),
    "hf": ("tokenizers", "import sys; from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers; "
                         "t = Tokenizer(models.BPE()); t.pre_tokenizer = pre_tokenizers.Sequence(["
                         "pre_tokenizers.Split(Regex(sys.argv[4]), behavior='isolated'), "
                         "pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]); "
                         "t.train([sys.argv[1]], trainers.BpeTrainer(vocab_size=int(sys.argv[2]), "
                         "special_tokens=['<|endoftext|>'], show_progress=False, "
                         "initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=0)); "
                         "t.save(sys.argv[3] + '.json')"),
}


def small_input(source: str | None, size: int, folder: str) -> tuple[str, str]:
    """A file of the first ``size`` bytes of ``source`` (compressed files read through), or of the
    shared English corpus beside the checkout, or of the packaged sample repeated; and what it was
    made from."""
    if source is None:
        shared = os.path.join(HERE, "..", "..", "shared", "corpora", "en_train.txt.xz")
        source = shared if os.path.isfile(shared) else None
    if source is None:
        from importlib.resources import files

        sample = (files("bpe_core") / "data" / "sample.txt").read_bytes()
        data = (sample * (size // len(sample) + 1))[:size]
        source = "the packaged sample, repeated (repetitive: pass a real corpus as INPUT)"
    else:
        opener = {".xz": "lzma", ".gz": "gzip", ".zst": "zstandard", ".bz2": "bz2"}.get(os.path.splitext(source)[1])
        if opener is None:
            with open(source, "rb") as f:
                data = f.read(size)
        elif opener == "zstandard":
            import zstandard

            with open(source, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as f:
                data = f.read(size)
        else:
            with __import__(opener).open(source, "rb") as f:
                data = f.read(size)
    path = os.path.join(folder, f"small_{size}.txt")
    with open(path, "wb") as f:
        f.write(data)
    return path, source


#: Runs a command and prints its wall seconds and max RSS. ``ru_maxrss`` counts what a process held
#: before its exec too (a child of fork/vfork starts with its parent's pages), so the measured command
#: is started by this small launcher (``python -S``, ~8 MB), never by the benchmark's own process.
LAUNCHER = """
import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    try:
        os.execv(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - t0
print(wall, usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024), os.waitstatus_to_exitcode(status),
      usage.ru_utime + usage.ru_stime)
"""


def run_process(cmd: list[str], env: dict) -> tuple[float, int, int, str, float]:
    """Run ``cmd`` (through :data:`LAUNCHER`); its wall seconds, max RSS in bytes (``wait4``: the
    process itself, exact), exit code, stderr and CPU seconds (user + system: steadier than the
    wall time on a busy machine)."""
    proc = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, *cmd], capture_output=True, env=env, text=True)
    try:
        wall, rss, code, cpu = proc.stdout.split()
        return float(wall), int(rss), int(code), proc.stderr, float(cpu)
    except ValueError:
        return 0.0, 0, proc.returncode or 1, proc.stderr + proc.stdout, 0.0


def small_run(args, p) -> int:
    import shutil
    import tempfile

    from bpe_core.pretok.patterns import GPT2_PATTERN

    folder = tempfile.mkdtemp(prefix="bench_small-")
    try:
        path, source = small_input(args.input, args.small_bytes, folder)
        vocab = args.vocab_size[0] if args.vocab_size != [10000, 32000] else 32000
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        out = os.path.join(folder, "out")
        cmds: dict[str, tuple[list[str], dict]] = {"numpy import (reference)": ([sys.executable, "-c", "import numpy"], env)}
        # the package this process imported (the installed one, or this checkout built in place)
        own = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["bpe_core"].__file__)))
        checkouts = [(own, "bpe_core CLI", os.path.join(HERE, "..", "tools", "train_bpe.py"))] + [
            (os.path.abspath(d), f"bpe_core CLI @{i}", os.path.join(os.path.abspath(d), "tools", "train_bpe.py"))
            for i, d in enumerate(args.against, 1)]
        for checkout, name, tool in checkouts:
            e = dict(env, PYTHONPATH=os.pathsep.join([checkout] + [x for x in [env.get("PYTHONPATH")] if x]))
            cmds[name] = ([sys.executable, tool, path, "--vocab-size", str(vocab), "--out", out, "--progress", "none"], e)
        for name, (module, code) in SMALL_PEERS.items():
            if name not in args.tools.split(",") and args.tools != "bpe_core,hf,rustbpe":
                continue
            try:
                __import__(module)
            except ImportError:
                print(f"bench_train.py: skipping {name}: {module} is not installed", file=sys.stderr)
                continue
            cmds[name] = ([sys.executable, "-c", code, path, str(vocab), out, GPT2_PATTERN], env)
        print(f"small run: {os.path.getsize(path) / 1e6:.1f} MB of {source}, vocab {vocab}, {os.cpu_count()} CPUs, "
              f"{args.repeats} runs each (after one unmeasured), interleaved")
        runs: dict[str, list[tuple[float, int, float]]] = {name: [] for name in cmds}
        for r in range(args.repeats + 1):
            for name, (cmd, e) in cmds.items():
                wall, rss, code, err, cpu = run_process(cmd, e)
                if code != 0:
                    print(f"bench_train.py: {name} failed (exit {code}):\n{err[-2000:]}", file=sys.stderr)
                    return 1
                if r:
                    runs[name].append((wall, rss, cpu))
                    print(f"  run {r} {name:28s} {wall:6.3f}s  CPU {cpu:6.3f}s  max RSS {rss / 1e6:6.1f} MB",
                          file=sys.stderr)
        ref = runs["numpy import (reference)"]
        print("\n| tool | median wall s | wall / numpy import (per round) | median CPU s | CPU / numpy import "
              "(per round) | median max RSS MB |")
        print("|---|---|---|---|---|---|")
        for name, rs in runs.items():
            ratio = statistics.median(x[0] / y[0] for x, y in zip(rs, ref))
            cpu_ratio = statistics.median(x[2] / y[2] for x, y in zip(rs, ref) if y[2] > 0)
            print(f"| {name} | {statistics.median(x[0] for x in rs):.3f} | {ratio:.2f}x | "
                  f"{statistics.median(x[2] for x in rs):.3f} | {cpu_ratio:.2f}x | "
                  f"{statistics.median(x[1] for x in rs) / 1e6:.1f} |")
        for i, d in enumerate(args.against, 1):
            print(f"@{i}: {os.path.abspath(d)}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({name: [{"wall": w, "max_rss": m, "cpu": c} for w, m, c in rs] for name, rs in runs.items()},
                          f, indent=1)
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def missing(tool: str) -> str | None:
    """Why ``tool`` cannot run here (its module or a dependency does not import), or None when it can."""
    for module in [*TOOL_DEPENDENCIES.get(tool, []), TOOL_MODULES[tool]]:
        try:
            __import__(module)
        except ImportError as exc:
            return f"{module} does not import ({exc})"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?")
    p.add_argument("--vocab-size", type=int, nargs="+", default=[10000, 32000])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tools", default="bpe_core,hf,rustbpe")
    p.add_argument("--workers", type=int, default=None, help="bpe_core workers (default: all cores)")
    p.add_argument("--method", nargs="+", default=["bpe"], choices=["bpe", "superbpe", "supratok"],
                   help="bpe_core methods to run (default: bpe); each is timed against plain BPE")
    p.add_argument("--against", nargs="+", default=[], metavar="DIR",
                   help="other bpe_core checkouts (built in place) to time in the same loop, each against "
                        "its own plain BPE")
    p.add_argument("--json", default=None, help="also write all runs to this JSON file")
    p.add_argument("--small-run", action="store_true",
                   help="time whole processes of a small run (the CLI on a 1 MB file) next to `import numpy` "
                        "and the installed peers (see above)")
    p.add_argument("--small-bytes", type=int, default=1_000_000, metavar="N",
                   help="--small-run: the size of the file (default 1000000)")
    p.add_argument("--_run", nargs=3, metavar=("TOOL", "INPUT", "VOCAB"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._run:
        tool, path, vocab = args._run
        print(json.dumps(run_one(tool, path, int(vocab), args.workers)))
        return 0

    if args.json:                       # checked before the runs, not after them
        folder = os.path.dirname(os.path.abspath(args.json))
        if os.path.isdir(args.json) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            p.error(f"{args.json}: not a writable file path (folder {folder})")
    if args.small_run:
        if args.input is not None and not os.path.isfile(args.input):
            p.error(f"{args.input}: no such file")
        for d in args.against:
            if not os.path.isfile(os.path.join(d, "tools", "train_bpe.py")):
                p.error(f"--against {d}: no tools/train_bpe.py there")
        return small_run(args, p)
    tools = []
    names = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in names if t not in TOOL_MODULES]
    if unknown or not names:
        p.error(f"--tools {args.tools}: unknown tool {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(TOOL_MODULES)}")
    for t in names:
        why = missing(t)
        if why is not None and t == "bpe_core":     # the tool every ratio is taken against
            p.error(f"bpe_core cannot run: {why}; install it (pip install -e .) or build it in place "
                    "(python setup.py build_ext --inplace)")
        if why is not None:
            print(f"bench_train.py: skipping {t}: {why}", file=sys.stderr)
            continue
        if t == "bpe_core":
            tools += ["bpe_core" if m == "bpe" else f"bpe_core:{m}" for m in args.method]
        else:
            tools.append(t)
    for d in args.against:
        if not os.path.isdir(os.path.join(d, "bpe_core")):
            p.error(f"--against {d}: no bpe_core package there")
    checkouts = {t: None for t in tools}
    for i, d in enumerate(args.against, 1):
        checkouts.update({f"{t}@{i}": os.path.abspath(d) for t in tools if t.startswith("bpe_core")})
    tools = list(checkouts)
    if args.input is None or not os.path.isfile(args.input):
        p.error(f"{args.input}: no such file")
    size_mb = os.path.getsize(args.input) / 1e6
    print(f"input {args.input} ({size_mb:.1f} MB), {os.cpu_count()} CPUs, tools: {', '.join(tools)}")
    runs = []
    for vocab_size in args.vocab_size:
        for r in range(args.repeats):
            for tool in tools:
                try:
                    res = measure(tool, args.input, vocab_size, args.workers, checkout=checkouts[tool])
                except RuntimeError as exc:           # a tool that failed, or a checkout not built
                    print(f"bench_train.py: {exc}", file=sys.stderr)
                    return 1
                res["vocab_size"] = vocab_size
                runs.append(res)
                print(f"  vocab {vocab_size} run {r + 1} {tool:18s} {res['wall']:7.2f}s  "
                      f"CPU {res.get('cpu', float('nan')):7.2f}s  "
                      f"peak RSS {res['peak_rss'] / 2**20:7.0f} MiB", file=sys.stderr)
    print(f"\n| vocab | tool | median wall s | median CPU s | median peak RSS MiB | time / bpe_core | per round "
          f"| CPU / bpe_core, per round | peak RSS / bpe_core, per round |")
    print("|---|---|---|---|---|---|---|---|---|")
    for vocab_size in args.vocab_size:
        med = {}
        for tool in tools:
            rs = [x for x in runs if x["tool"] == tool and x["vocab_size"] == vocab_size]
            med[tool] = (statistics.median(x["wall"] for x in rs), statistics.median(x["peak_rss"] for x in rs),
                         statistics.median(x.get("cpu", float("nan")) for x in rs))
        for tool in tools:
            base_tool = "bpe_core" + (tool[tool.index("@"):] if "@" in tool else "")
            base = med.get(base_tool, (None,))[0]
            ratio = f"{med[tool][0] / base:.2f}x" if base else "-"
            # paired: each round's time over plain BPE's in the same round (interleaved, so a slow
            # spell of the machine hits both), the median of those; steadier than a ratio of medians
            mine = [x["wall"] for x in runs if x["tool"] == tool and x["vocab_size"] == vocab_size]
            theirs = [x["wall"] for x in runs if x["tool"] == base_tool and x["vocab_size"] == vocab_size]
            paired = (f"{statistics.median(a / b for a, b in zip(mine, theirs)):.2f}x"
                      if base and len(mine) == len(theirs) else "-")
            mine_runs = [x for x in runs if x["tool"] == tool and x["vocab_size"] == vocab_size]
            base_runs = [x for x in runs if x["tool"] == base_tool and x["vocab_size"] == vocab_size]
            cpu_paired, rss_paired = (
                f"{statistics.median(a[key] / b[key] for a, b in zip(mine_runs, base_runs)):.2f}x"
                if base and len(mine_runs) == len(base_runs) and all(b.get(key) for b in base_runs) else "-"
                for key in ("cpu", "peak_rss"))
            print(f"| {vocab_size} | {tool} | {med[tool][0]:.2f} | {med[tool][2]:.2f} | {med[tool][1] / 2**20:.0f} | "
                  f"{ratio} | {paired} | {cpu_paired} | {rss_paired} |")
    for i, d in enumerate(args.against, 1):
        print(f"@{i}: {os.path.abspath(d)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
