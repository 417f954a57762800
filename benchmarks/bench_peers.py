#!/usr/bin/env python
"""bpe_core's encoder beside every installed peer (tiktoken, HF tokenizers, fastokens, tokie,
kitoken, bpe-openai) on real text: one thread (whole text to a list, to an array), a batch of
documents on all threads (list of lists, flat), decoding, and a corpus file to ``.npy``.

Each work runs once untimed (warm-up, and the ids are checked), then ``--runs`` times, interleaved
(run 1 of every peer, then run 2, ..., every other round in reverse order), and the median MB/s of the input text is reported with ours / the best peer. The ids of every peer are
checked against ``tiktoken`` (for a trained vocabulary: ``bpe_core.reference``) on every document (a peer that differs is marked ``ids differ`` and
left out of "best"). Peers that are not installed are named as skipped; ``pip install
bpe_core[peers]`` installs them.

Vocabularies: GPT-2 from ``tests/fixtures`` (``gpt2_vocab.json`` + ``gpt2_merges.txt``), and
cl100k when its ranks can be read offline (``bpe-openai`` ships them; tiktoken itself downloads).
``--vocab trained:DIR`` is a BPE model folder written by ``tools/train_bpe.py``: ours loads it
(``Tokenizer.load``), the HF-format peers its ``tokenizer.json`` (exported into a temp folder when
the folder has none), tiktoken an ``Encoding`` built from our tiktoken export (``bpe_core.export``:
ranks = our ids); a peer that cannot load it is named as skipped with the reason. Its ids are checked
against ``bpe_core.reference`` (the plain-Python merge loop, memoized per pretoken:
:class:`ReferenceIds`), not against tiktoken, on every document.

Usage::

    python benchmarks/bench_peers.py --mb 10 --runs 5 --corpus en_heldout ood_code [--vocab gpt2 cl100k trained:DIR]

``--models NAME=DIR ...`` (e.g. ``bpe=bpe32k/ superbpe=sb32k/ supratok=st32k/``) adds a table of
trained model folders on the same text, one thread, whole text to an array (``encode_to_numpy``),
with each model's speed relative to the first; ``--plain`` adds the plain path of the stage-aware
models (``encode_python``: numpy and ``RankMerger`` per text piece, the path SupraTok took before
its native one), whose ids the native ones are checked against. ``--vocab none`` runs only that.

Ours also runs "1 thread, cold cache -> array": ``encode_to_numpy`` with a new encoder each run
(an empty pretoken cache, as the first call of a process sees it).

``--against DIR`` adds our encoder from another built checkout (e.g. a copy of ``main`` built in
place: its ``bpe_core`` folder is imported under the name ``bpe_core_against``) as the column
``before``, timed in the same interleaved rounds; it is never a peer for "best", and the last column
gives ours / before.

The machine is shared: quote medians and ratios, not single runs. A second table gives MB per
CPU-second of the process (``time.process_time``, all its threads): on a loaded machine it shows the
work done, where wall time mostly shows the scheduler (for the batch works it sums the threads).
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
import base64
import gzip
import importlib.util
import json
import lzma
import statistics
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if __name__ == "__main__" or importlib.util.find_spec("bpe_core") is None:
    # Run as a script: this checkout first (it is what is timed). Imported (a test): sys.path is
    # left alone; a checkout put first there is what Dask's spawned workers would import, unbuilt
    # in a fresh clone (their count tasks then never came back: test_cluster hung after this one).
    sys.path.insert(0, REPO)

from bpe_core.encode import Tokenizer  # noqa: E402
from bpe_core.pretok.patterns import GPT2_PATTERN  # noqa: E402

FIXTURES = os.path.join(REPO, "tests", "fixtures")
# ../shared/corpora beside the checkout (or two levels up, beside a worktree folder)
CORPORA = next((d for d in (os.path.join(REPO, "..", "shared", "corpora"), os.path.join(REPO, "..", "..", "shared", "corpora"))
                if os.path.isdir(d)), os.path.join(REPO, "..", "shared", "corpora"))
EOT = "<|endoftext|>"
PEERS = ["tiktoken", "tokenizers", "fastokens", "tokie", "kitoken", "bpe_openai"]
WORKS = ["1 thread, text -> list", "1 thread, text -> array", "batch, list of lists", "batch, flat",
         "decode, 1 thread", "corpus file -> .npy", "1 thread, cold cache -> array"]


# ==== Inputs ===================================================================================


def read_cut(name: str, mb: float, corpora: str = CORPORA) -> str:
    """The first ``mb`` MB of a shared corpus, cut at the last newline."""
    path = os.path.join(corpora, name + ".txt")
    want = int(mb * 1e6)
    if os.path.exists(path + ".xz"):
        with lzma.open(path + ".xz", "rb") as f:
            data = f.read(want)
    else:
        with open(path, "rb") as f:
            data = f.read(want)
    data = data[: data.rfind(b"\n") + 1]
    return data.decode("utf-8")


def documents(text: str) -> list[str]:
    """The documents of the text (split at ``<|endoftext|>``, which is left out)."""
    return [d for d in text.split(EOT) if d]


# ==== Vocabularies ================================================================================


def load_against(path: str):
    """The ``Tokenizer`` class of another built checkout (``path``: its root or its ``bpe_core``
    folder), imported as the package ``bpe_core_against`` beside this one."""
    import importlib.util

    root = path if os.path.exists(os.path.join(path, "encode")) else os.path.join(path, "bpe_core")
    spec = importlib.util.spec_from_file_location("bpe_core_against", os.path.join(root, "__init__.py"),
                                                  submodule_search_locations=[root])
    module = importlib.util.module_from_spec(spec)
    sys.modules["bpe_core_against"] = module
    spec.loader.exec_module(module)
    from bpe_core_against.encode import Tokenizer as Against  # noqa: E402

    return Against


def gpt2_setup(tmp: str, cls=Tokenizer):
    """(ours, tiktoken encoding, tokenizer.json path, reason bpe-openai is skipped)."""
    import tiktoken
    import tiktoken.load

    ours = cls.from_files(os.path.join(FIXTURES, "gpt2_vocab.json"), os.path.join(FIXTURES, "gpt2_merges.txt"), [EOT])
    merges = os.path.join(tmp, "merges.txt")
    with open(merges, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + open(os.path.join(FIXTURES, "gpt2_merges.txt"), encoding="utf-8").read())
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(merges, os.path.join(FIXTURES, "gpt2_vocab.json"))
    enc = tiktoken.Encoding("gpt2_fixture", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: 50256})
    hf_json = None
    if importlib.util.find_spec("tokenizers"):
        from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers

        hf = HF(models.BPE.from_file(os.path.join(FIXTURES, "gpt2_vocab.json"), merges))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens([EOT])
        hf_json = os.path.join(tmp, "gpt2_tokenizer.json")
        hf.save(hf_json)
    return ours, enc, hf_json, {"bpe_openai": "ships cl100k/o200k only, no GPT-2"}


def cl100k_setup(tmp: str, cls=Tokenizer):
    """cl100k from the ranks that bpe-openai ships (tiktoken would download them)."""
    import tiktoken

    spec = importlib.util.find_spec("bpe_openai")
    if spec is None:
        raise RuntimeError("no offline cl100k ranks: tiktoken downloads them and bpe-openai is not installed")
    path = os.path.join(os.path.dirname(spec.origin), "data", "cl100k_base.tiktoken.gz")
    ranks = {}
    with gzip.open(path, "rt", encoding="ascii") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    pat = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
    specials = {EOT: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
                "<|endofprompt|>": 100276}
    enc = tiktoken.Encoding("cl100k_offline", pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)
    vocab = {r: b for b, r in ranks.items()}
    vocab.update({i: s.encode() for s, i in specials.items()})      # tiktoken's ids for the specials
    ours = cls(vocab, merges_from_ranks(ranks), list(specials), "cl100k")
    return ours, enc, None, {"tokenizers": "no offline tokenizer.json for cl100k", "fastokens": "idem",
                             "tokie": "idem", "kitoken": "idem"}


TRAINED = "trained:"


def trained_setup(folder: str, tmp: str, cls=Tokenizer):
    """A BPE model folder of ``tools/train_bpe.py``: (ours, tiktoken encoding or None, tokenizer.json
    path, reasons for the skipped peers, the reference ids)."""
    from bpe_core.export import export, load_tiktoken_encoding
    from bpe_core.formats import load_model, registry

    model = load_model(folder)
    if registry.get(model.method).stage_aware:     # the reference twin here is one merge list by rank
        raise ValueError(f"{folder} is a {model.method} model, which encodes in stages; the reference here "
                         f"is plain BPE (compare trained models of other methods with --models)")
    ours = cls.load(folder)
    skip = {"bpe_openai": "ships cl100k/o200k only, loads no other vocabulary"}
    hf_json = os.path.join(folder, "tokenizer.json")
    if not os.path.exists(hf_json):
        hf_json = export(model, "hf", os.path.join(tmp, "trained_tokenizer.json"))[0]
    enc = None
    if importlib.util.find_spec("tiktoken"):
        try:
            ranks = export(model, "tiktoken", os.path.join(tmp, "trained.tiktoken"))[0]
            enc = load_tiktoken_encoding(ranks)
        except ValueError as exc:          # refused: duplicate token bytes (one id per token needed)
            skip["tiktoken"] = f"no tiktoken export: {str(exc)[:100]}"
    return ours, enc, hf_json, skip, ReferenceIds(model)


class ReferenceIds:
    """``bpe_core.reference.encode`` of a BPE model, with tiktoken's ``encode`` / ``encode_batch``
    signature (the ids every peer is checked against), memoized per pretoken.

    ``reference.encode_pretoken`` replays every merge whose concatenation occurs in the pretoken (the
    others cannot apply), so giving it only those merges, found from the pretoken's substrings, is
    the same function; pretokens longer than ``max_substrings`` get the whole list.
    """

    def __init__(self, model, max_substrings: int = 256):
        from bpe_core.corpus.specials import encode_specials
        from bpe_core.reference import token_ids

        self.merges = list(model.merges)
        self.ids_of = token_ids(model.vocab)
        self.specials = encode_specials(model.special_tokens)
        self.pattern = model.pattern
        self.max_substrings = max_substrings
        self.by_bytes: dict[bytes, list[int]] = {}
        for rank, (left, right) in enumerate(self.merges):
            self.by_bytes.setdefault(left + right, []).append(rank)
        self.cache: dict[bytes, list[int]] = {}

    def pretoken_ids(self, pretoken: bytes) -> list[int]:
        from bpe_core.reference import encode_pretoken

        got = self.cache.get(pretoken)
        if got is None:
            n = len(pretoken)
            if n > self.max_substrings:
                merges = self.merges
            else:
                ranks = sorted({r for i in range(n) for j in range(i + 2, n + 1)
                                for r in self.by_bytes.get(pretoken[i:j], ())})
                merges = [self.merges[r] for r in ranks]
            got = self.cache[pretoken] = [self.ids_of[p] for p in encode_pretoken(pretoken, merges)]
        return got

    def encode(self, text, allowed_special="all") -> list[int]:
        from bpe_core.corpus.specials import split_on_specials
        from bpe_core.reference import pretokenize

        data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
        out: list[int] = []
        for piece, is_special in split_on_specials(data, self.specials):
            if is_special:
                out.append(self.ids_of[piece])
                continue
            for pretoken in pretokenize(piece, self.pattern):
                out.extend(self.pretoken_ids(pretoken))
        return out

    def encode_batch(self, texts, allowed_special="all") -> list[list[int]]:
        return [self.encode(t) for t in texts]


def vocab_setup(vocab: str, tmp: str, cls=Tokenizer):
    """(ours, tiktoken encoding or None, tokenizer.json path, skipped peers, the ids to check
    against) for a ``--vocab`` value."""
    if vocab.startswith(TRAINED):
        return trained_setup(vocab[len(TRAINED):], tmp, cls)
    ours, enc, hf_json, skip = (gpt2_setup if vocab == "gpt2" else cl100k_setup)(tmp, cls)
    return ours, enc, hf_json, skip, enc


def vocab_arg(value: str) -> str:
    """``gpt2``, ``cl100k``, ``none`` or ``trained:DIR`` with a model folder (argparse type)."""
    if value in ("gpt2", "cl100k", "none"):
        return value
    if value.startswith(TRAINED):
        folder = value[len(TRAINED):]
        if not os.path.isfile(os.path.join(folder, "model.json")):
            raise argparse.ArgumentTypeError(f"{value!r}: {folder!r} is not a model folder (no model.json)")
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: choose gpt2, cl100k, none or trained:DIR")


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list of a rank table: each token of two or more bytes is the merge of the two parts
    that tiktoken's BPE over the lower ranks leaves (the usual conversion)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


# ==== Peers ===================================================================================


def load_peers(names, enc, hf_json, skip: dict) -> tuple[dict, dict]:
    """name -> adapter (a dict of work -> callable), and name -> reason for the skipped."""
    peers, skipped = {}, {}
    for name in names:
        if name in skip:
            skipped[name] = skip[name]
            continue
        if importlib.util.find_spec(name) is None:
            skipped[name] = "not installed"
            continue
        try:
            peers[name] = make_adapter(name, enc, hf_json)
        except Exception as exc:           # a peer that cannot load this vocab is named, not fatal
            skipped[name] = f"cannot load the vocab: {type(exc).__name__}: {str(exc)[:80]}"
    return peers, skipped


def make_adapter(name: str, enc, hf_json) -> dict:
    n_threads = os.cpu_count() or 1
    if name == "tiktoken":
        if enc is None:
            raise RuntimeError("no tiktoken encoding of this vocabulary")
        return {"list": lambda t: enc.encode(t, allowed_special="all"),
                "array": lambda t: enc.encode_to_numpy(t, allowed_special="all"),
                "batch": lambda ds: enc.encode_batch(ds, num_threads=n_threads, allowed_special="all"),
                "decode": lambda ids: enc.decode(ids)}
    if name == "bpe_openai":
        import bpe_openai

        bo = bpe_openai.get_encoding("cl100k_base")
        return {"list": lambda t: bo.encode(t, allowed_special="all"),
                "array": lambda t: bo.encode_to_numpy(t, allowed_special="all"),
                "batch": lambda ds: bo.encode_batch(ds, num_threads=n_threads, allowed_special="all"),
                "decode": lambda ids: bo.decode(ids)}
    if hf_json is None:
        raise RuntimeError("no tokenizer.json")
    if name == "tokenizers":
        from tokenizers import Tokenizer as HF

        hf = HF.from_file(hf_json)
        # (no whole-text work: HF keeps offsets and strings per token and crawls on a 5 MB sequence)
        return {"batch": lambda ds: [e.ids for e in hf.encode_batch(ds, add_special_tokens=False)],
                "decode": lambda ids: hf.decode(ids, skip_special_tokens=False)}
    if name == "fastokens":
        import fastokens

        ft = fastokens.Tokenizer.from_file(hf_json)

        def flat(ds):
            ids, offs = ft.encode_batch_flat(ds)
            return np.frombuffer(ids, np.uint32), np.frombuffer(offs, np.uint64)
        return {"list": lambda t: ft.encode(t).ids,
                "batch": lambda ds: [e.ids for e in ft.encode_batch(ds)],
                "flat": flat,
                "decode": lambda ids: ft.decode(ids)}
    if name == "tokie":
        import tokie

        tk = tokie.Tokenizer.from_json(hf_json)
        return {"list": lambda t: tk.encode(t, add_special_tokens=False).ids,
                "batch": lambda ds: [e.ids for e in tk.encode_batch(ds, add_special_tokens=False)],
                "decode": lambda ids: tk.decode(ids)}
    if name == "kitoken":
        import kitoken

        kt = kitoken.Kitoken.from_tokenizers_file(hf_json)
        return {"list": lambda t: kt.encode(t, True),
                "batch": lambda ds: kt.encode_all(ds, True),
                "decode": lambda ids: kt.decode(ids, True).decode("utf-8", "replace")}
    raise ValueError(name)


def ours_adapter(tok: Tokenizer) -> dict:
    n_threads = os.cpu_count() or 1
    def cold(text):
        tok._idle.clear()                   # a new encoder: an empty pretoken cache
        return tok.encode_to_numpy(text)
    return {"list": tok.encode, "array": tok.encode_to_numpy, "cold": cold,
            "batch": lambda ds: tok.encode_batch(ds, num_threads=n_threads),
            "flat": lambda ds: tok.encode_batch_flat(ds, num_threads=n_threads),
            "decode": tok.decode}


# ==== Measuring ================================================================================


def corpus_to_npy(adapter: dict, path: str, out: str, ours: Tokenizer | None):
    """A corpus file to a flat .npy: ours with ``encode_corpus``; a peer reads the file, encodes its
    documents as a batch (flat when it can) and saves."""
    if ours is not None:
        import importlib

        package = type(ours).__module__.split(".")[0]        # bpe_core, or bpe_core_against
        encode_corpus = importlib.import_module(package + ".encode.encode_corpus").encode_corpus

        encode_corpus(path, ours, out, num_workers=os.cpu_count() or 1, progress=False)
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    docs = [d + EOT for d in text.split(EOT)]
    if "flat" in adapter:
        ids = adapter["flat"](docs)[0]
    else:
        ids = np.fromiter((i for d in adapter["batch"](docs) for i in d), dtype=np.uint32)
    np.save(out, ids.astype(np.uint16) if ids.size and ids.max() < 65536 else ids)


def settle() -> None:
    """Free what the last work left, outside the timing: the collector, then glibc's free heap
    (``malloc_trim``, what ``run_ordered`` calls after its threads). Without it the corpus row of
    whoever ran after a list work paid for trimming that list's memory (~10 MB of int objects):
    with two copies of the same code, "ours / before" read 0.7 on that row and 1.0 on the others."""
    import gc

    from bpe_core.runtime.workers import release_free_memory

    gc.collect()
    release_free_memory()


def check(name, work, got, expected) -> bool:
    if work in ("list", "array"):
        return list(np.asarray(got).tolist()) == expected
    if work == "batch":
        return [list(x) for x in got] == expected
    if work == "flat":
        ids, offs = got
        offs = np.asarray(offs, dtype=np.int64)
        return all(ids[a:b].tolist() == e for a, b, e in zip(offs[:-1], offs[1:], expected)) and len(offs) == len(expected) + 1
    return got == expected


def bench(vocab: str, corpus: str, text: str, ours: Tokenizer, want, peers: dict, runs: int, tmp: str,
          before=None) -> dict:
    """Every work of everyone, interleaved; ``want`` gives the ids to check against (``encode`` and
    ``encode_batch`` as tiktoken's: tiktoken itself, or :class:`ReferenceIds`)."""
    docs = documents(text)
    n_bytes = len(text.encode("utf-8"))
    doc_bytes = sum(len(d.encode("utf-8")) for d in docs)
    want_text = want.encode(text, allowed_special="all")
    want_docs = want.encode_batch(docs, allowed_special="all")
    ids = np.array(want_text, dtype=np.uint32).tolist()
    path = os.path.join(tmp, f"{corpus}.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    everyone = {"bpe_core": ours_adapter(ours), **peers}
    mine = {"bpe_core": ours}
    if before is not None:
        everyone["before"] = ours_adapter(before)
        mine["before"] = before
    # Each call gets str objects of its own, made untimed: CPython keeps a str's UTF-8 once a tool
    # asks for it, so a shared str would let whoever runs after that tool read it for free.
    fresh = {}

    def refresh():
        fresh["text"] = text.encode("utf-8").decode("utf-8")
        fresh["docs"] = [d.encode("utf-8").decode("utf-8") for d in docs]

    jobs = []           # (work label, who, callable, bytes, check)
    for who, ad in everyone.items():
        if "list" in ad:
            jobs.append((WORKS[0], who, lambda ad=ad: ad["list"](fresh["text"]), n_bytes, ("list", want_text)))
        if "array" in ad:
            jobs.append((WORKS[1], who, lambda ad=ad: ad["array"](fresh["text"]), n_bytes, ("array", want_text)))
        if "batch" in ad:
            jobs.append((WORKS[2], who, lambda ad=ad: ad["batch"](fresh["docs"]), doc_bytes, ("batch", want_docs)))
        if "flat" in ad:
            jobs.append((WORKS[3], who, lambda ad=ad: ad["flat"](fresh["docs"]), doc_bytes, ("flat", want_docs)))
        if "decode" in ad:
            jobs.append((WORKS[4], who, lambda ad=ad: ad["decode"](ids), n_bytes, ("decode", text)))
        if "cold" in ad:
            jobs.append((WORKS[6], who, lambda ad=ad: ad["cold"](fresh["text"]), n_bytes, ("array", want_text)))
        if who in mine or "batch" in ad:
            out = os.path.join(tmp, f"{who}.npy")
            jobs.append((WORKS[5], who, lambda ad=ad, who=who, out=out: corpus_to_npy(
                ad, path, out, mine.get(who)), n_bytes, None))
    times = {(w, who): [] for w, who, *_ in jobs}
    cpu = {(w, who): [] for w, who, *_ in jobs}
    same, failed = {}, {}
    for r in range(runs + 1):              # round 0 warms caches up and checks the ids, untimed
        # every other round runs the jobs in reverse order, so no one always follows the same work
        for work, who, fn, nb, chk in (jobs if r % 2 == 0 else jobs[::-1]):
            if (work, who) in failed:
                continue
            refresh()
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                got = fn()
            except Exception as exc:        # e.g. a peer's own limit on tokens per call: named, left out
                failed[(work, who)] = f"{type(exc).__name__}: {str(exc)[:100]}"
                del times[(work, who)], cpu[(work, who)]
                continue
            if r:
                times[(work, who)].append(nb / 1e6 / (time.perf_counter() - t0))
                cpu[(work, who)].append(nb / 1e6 / max(time.process_time() - c0, 1e-9))
            elif chk is not None:
                same[(work, who)] = check(who, chk[0], got, chk[1])
            del got
            settle()                        # untimed: the next work does not pay for this one's garbage
    for who in mine:                        # the .npy of ours holds the whole text's ids
        if (WORKS[5], who) in times:
            saved = np.load(os.path.join(tmp, f"{who}.npy"))
            same[(WORKS[5], who)] = saved.tolist() == want_text
    return {"vocab": vocab, "corpus": corpus, "mb": n_bytes / 1e6, "docs": len(docs),
            "medians": {k: statistics.median(v) for k, v in times.items()},
            "cpu": {k: statistics.median(v) for k, v in cpu.items()}, "same": same, "failed": failed}


def bench_models(models: dict, corpus: str, text: str, runs: int, plain: bool) -> str:
    """One thread, whole text to an array, for each trained model folder (``--models``), interleaved;
    the table (MB/s medians, ratio to the first model, ids of the native path equal to the plain one)."""
    data = text.encode("utf-8")
    toks = {name: Tokenizer.load(folder) for name, folder in models.items()}
    jobs = {}
    for name, tok in toks.items():
        jobs[name] = lambda tok=tok: tok.encode_to_numpy(data)
        stage = getattr(tok, "_stage", None)
        if plain and stage is not None and hasattr(stage, "encode_python"):
            jobs[name + " (plain path)"] = lambda stage=stage: stage.encode_python(data)
    times = {k: [] for k in jobs}
    ids, same = {}, {}
    for r in range(runs + 1):
        for k, fn in jobs.items():
            t0 = time.perf_counter()
            got = fn()
            if r:
                times[k].append(len(data) / 1e6 / (time.perf_counter() - t0))
            else:
                ids[k] = np.asarray(got, dtype=np.uint32)
    for k in jobs:
        base = k.split(" (")[0]
        same[k] = bool(np.array_equal(ids[k], ids[base]))
    first = statistics.median(times[next(iter(models))])
    lines = [f"### trained models, {corpus} ({len(data) / 1e6:.1f} MB), 1 thread, whole text -> array, "
             f"MB/s medians of {runs}", "", "| model | method | MB/s | / first | bytes/token | ids = plain path |",
             "|---|---|---|---|---|---|"]
    for k in jobs:
        base = k.split(" (")[0]
        med = statistics.median(times[k])
        method = getattr(getattr(toks[base], "_model", None), "method", "bpe")
        lines.append(f"| {k} | {method} | {med:.1f} | {med / first:.2f} | {len(data) / max(ids[k].size, 1):.3f} | "
                     f"{'yes' if same[k] else 'NO'} |")
    return "\n".join(lines)


def table(res: dict, peer_names: list[str], key: str = "medians") -> str:
    against = any(who == "before" for _, who in res[key])
    cols = ["bpe_core"] + (["before"] if against else []) + peer_names
    what = "MB/s (wall)" if key == "medians" else "MB per CPU-second (all threads of the process)"
    lines = [f"### {res['vocab']}, {res['corpus']} ({res['mb']:.1f} MB, {res['docs']} docs), {what}, medians",
             "", "| work | " + " | ".join(cols) + " | best peer | ours/best |" + (" before/best | ours/before |" if against else ""),
             "|---" * (len(cols) + 3 + 2 * against) + "|"]
    for work in WORKS:
        cells, best = [], None
        for who in cols:
            m = res[key].get((work, who))
            if m is None:
                cells.append("-")
                continue
            ok = res["same"].get((work, who), True)
            cells.append(f"{m:.1f}" + ("" if ok else " (ids differ)"))
            if who not in ("bpe_core", "before") and ok and (best is None or m > best[1]):
                best = (who, m)
        ours = res[key].get((work, "bpe_core"))
        ratio = f"{ours / best[1]:.2f}" if best and ours else "-"
        row = f"| {work} | " + " | ".join(cells) + f" | {best[0] if best else '-'} | {ratio} |"
        if against:
            old = res[key].get((work, "before"))
            row += (f" {old / best[1]:.2f} |" if best and old else " - |") + (f" {ours / old:.2f} |" if ours and old else " - |")
        lines.append(row)
    for (work, who), why in res.get("failed", {}).items():
        lines.append(f"\n{who}, {work}: failed ({why})")
    if key == "medians":
        lines.append("\nids identical to the reference on every document: " + "; ".join(
            f"{who} {'yes' if all(ok for (w, h), ok in res['same'].items() if h == who) else 'NO'}"
            for who in cols if any(h == who for _, h in res["same"])))
    return "\n".join(lines)


def versions(names) -> str:
    """``bpe_core X, fastokens Y, ...``: the installed version of ours and of each peer asked for."""
    from importlib import metadata
    dist = {"bpe_openai": "bpe-openai"}
    out = []
    for name in ["bpe_core"] + list(names):
        try:
            out.append(f"{name} {metadata.version(dist.get(name, name))}")
        except metadata.PackageNotFoundError:
            out.append(f"{name} (not installed)")
    return ", ".join(out)


def cuts(args):
    """``(corpus, text)`` for each corpus asked for; one that cannot be read is named as skipped."""
    for corpus in args.corpus:
        try:
            yield corpus, read_cut(corpus, args.mb, args.corpora)
        except OSError as exc:
            print(f"{corpus}: skipped ({exc})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=10.0, help="MB of each corpus (a cut of its start)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--corpus", nargs="+", default=["en_heldout", "ood_code"])
    ap.add_argument("--vocab", nargs="+", default=["gpt2", "cl100k"], type=vocab_arg,
                    metavar="{gpt2,cl100k,none,trained:DIR}",
                    help="vocabularies: GPT-2, cl100k, none (only --models), or a BPE model folder "
                         "of tools/train_bpe.py (trained:DIR; its ids checked against bpe_core.reference)")
    ap.add_argument("--models", nargs="+", default=[], metavar="NAME=DIR",
                    help="trained model folders to compare on the same text (one thread, to an array)")
    ap.add_argument("--plain", action="store_true", help="with --models: also the stage-aware plain path")
    ap.add_argument("--peers", nargs="+", default=PEERS)
    ap.add_argument("--corpora", default=CORPORA, help="the folder of the corpora (NAME.txt or NAME.txt.xz)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--against", metavar="DIR",
                    help="also time bpe_core from this built checkout (column 'before', never a peer)")
    args = ap.parse_args(argv)
    against = load_against(args.against) if args.against else None
    models = {}
    for spec in args.models:
        name, sep, folder = spec.partition("=")
        if not sep or not os.path.isdir(folder):
            ap.error(f"--models wants NAME=DIR with an existing folder, got {spec!r}")
        models[name] = folder
    print(f"# bench_peers: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
          f"{args.runs} interleaved runs, --mb {args.mb}")
    print(f"# versions: {versions(args.peers)}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for vocab in [v for v in args.vocab if v != "none"]:
            try:
                ours, enc, hf_json, skip, want = vocab_setup(vocab, tmp)
                before = vocab_setup(vocab, tmp, against)[0] if against is not None else None
            except Exception as exc:
                print(f"\n{vocab}: skipped ({exc})")
                continue
            peers, skipped = load_peers(args.peers, enc, hf_json, skip)
            for name, why in skipped.items():
                print(f"{vocab}: {name} skipped ({why})")
            for corpus, text in cuts(args):
                res = bench(vocab, corpus, text, ours, want, peers, args.runs, tmp, before)
                print("\n" + table(res, list(peers)), flush=True)
                print("\n" + table(res, list(peers), "cpu"), flush=True)
                results.append(res)
        if models:
            for corpus, text in cuts(args):
                print("\n" + bench_models(models, corpus, text, args.runs, args.plain), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r, "medians": {" / ".join(k): v for k, v in r["medians"].items()},
                        "cpu": {" / ".join(k): v for k, v in r["cpu"].items()},
                        "same": {" / ".join(k): v for k, v in r["same"].items()},
                        "failed": {" / ".join(k): v for k, v in r["failed"].items()}} for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
