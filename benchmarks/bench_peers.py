"""bpe_core's encoder beside every installed exact encoder (tiktoken, HF tokenizers, fastokens,
snaptokens, tokie, splintr-rs, tuetoken, riptoken, tokendagger, kitoken, bpe-openai) on real text,
cold and warm: one thread (whole text to a list, to an array), a batch of documents on all threads
(list of lists, flat), decoding, and a corpus file to ``.npy``.

One library per process: each measurement is a fresh process that loads one tokenizer, makes the
first call (**cold**: what a script that loads a tokenizer and encodes once sees) and then
``--warm`` more calls of the same work (**warm**: their median). ``--runs`` rounds of every
(library, work) process, interleaved (every other round in reverse order); the tables give the
medians over the rounds in MB per CPU-second of the process (``time.process_time``, all its threads:
the work done, which a loaded machine does not blur) and in MB/s of wall time, with ours / the best
peer in each row. Load time (not in any row) is printed apart.

The ids of every call are checked against ``tiktoken`` (for a trained vocabulary:
``bpe_core.reference``, :class:`ReferenceIds`) on every document: a peer that differs anywhere is
marked ``ids differ`` and left out of "best", and the line "ids identical ..." names it. Peers that are
not installed, or cannot load the vocabulary, are named as skipped; ``pip install bpe_core[peers]``
installs them (tokendagger builds from source and needs the PCRE2 headers: ``libpcre2-dev``).

Vocabularies: GPT-2 from ``tests/fixtures`` (``gpt2_vocab.json`` + ``gpt2_merges.txt``), and
cl100k when its ranks can be read offline (``bpe-openai`` ships them; tiktoken itself downloads);
the HF-format peers read a cl100k ``tokenizer.json`` written from those ranks (``cl100k_hf_json``).
``--vocab trained:DIR`` is a BPE model folder written by ``tools/train_bpe.py``: ours loads it
(``Tokenizer.load``), the HF-format peers its ``tokenizer.json`` (exported into a temp folder when
the folder has none), the tiktoken-format peers our tiktoken export (``bpe_core.export``: ranks = our
ids); a peer that cannot load it is named as skipped with the reason.

Usage::

    python benchmarks/bench_peers.py --mb 5 --runs 5 --corpus en_heldout ood_code [--vocab gpt2 cl100k trained:DIR]

``--works list array batch flat`` limits the works (default: all six); ``--peers`` the peers.

``--models NAME=DIR ...`` (e.g. ``bpe=bpe32k/ superbpe=sb32k/ supratok=st32k/``) adds a table of
trained model folders on the same text, one thread, whole text to an array (``encode_to_numpy``),
in this process, with each model's speed relative to the first; ``--plain`` adds the plain path of
the stage-aware models (``encode_python``), whose ids the native ones are checked against.
``--vocab none`` runs only that.

``--against DIR`` adds our encoder from another built checkout (e.g. a copy of ``main`` built in
place: its ``bpe_core`` folder is imported under the name ``bpe_core_against``) as the column
``before``, measured in the same interleaved rounds; it is never a peer for "best", and the last
column gives ours / before.

The machine is shared: quote medians and ratios measured in the same run, not single runs.
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
import pickle
import statistics
import subprocess
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# A measuring child imports the bpe_core its parent imported (the parent names its folder here).
PACKAGE_ENV = "BPE_CORE_BENCH_PACKAGE"
if __name__ == "__main__" or importlib.util.find_spec("bpe_core") is None:
    # Run as a script: this checkout first (it is what is timed). Imported (a test): sys.path is
    # left alone; a checkout put first there is what Dask's spawned workers would import, unbuilt
    # in a fresh clone (their count tasks then never came back: test_cluster hung after this one).
    sys.path.insert(0, os.environ.get(PACKAGE_ENV) or REPO)

from bpe_core.encode import Tokenizer  # noqa: E402
from bpe_core.pretok.patterns import GPT2_PATTERN  # noqa: E402

FIXTURES = os.path.join(REPO, "tests", "fixtures")
# ../shared/corpora beside the checkout (or two levels up, beside a worktree folder)
CORPORA = next((d for d in (os.path.join(REPO, "..", "shared", "corpora"), os.path.join(REPO, "..", "..", "shared", "corpora"))
                if os.path.isdir(d)), os.path.join(REPO, "..", "shared", "corpora"))
EOT = "<|endoftext|>"
PEERS = ["tiktoken", "tokenizers", "fastokens", "snaptokens", "tokie", "splintr", "tuetoken", "riptoken",
         "tokendagger", "kitoken", "bpe_openai"]
#: import name -> distribution name, where they differ (versions, ``pip install``)
DISTRIBUTIONS = {"bpe_openai": "bpe-openai", "splintr": "splintr-rs"}
#: work key -> row label
WORK_LABELS = {"list": "1 thread, text -> list", "array": "1 thread, text -> array",
               "batch": "batch, list of lists", "flat": "batch, flat", "decode": "decode, 1 thread",
               "corpus": "corpus file -> .npy"}
WORKS = list(WORK_LABELS.values())
PHASES = ("cold", "warm")
#: the peers that read a tiktoken ranks file (the others read a tokenizer.json)
RANKS_PEERS = {"tiktoken", "riptoken", "splintr", "tokendagger"}
CANNOT_LOAD = "cannot load the vocabulary"


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
#
# The parent writes each vocabulary once into files (a "setup": our tokenizer's arguments, a
# tiktoken ranks file, a tokenizer.json, the pattern and special tokens) that every measuring child
# loads from; the parent alone holds the reference ids.


def load_against(path: str):
    """The ``Tokenizer`` class of another built checkout (``path``: its root or its ``bpe_core``
    folder), imported as the package ``bpe_core_against`` beside this one."""
    root = path if os.path.exists(os.path.join(path, "encode")) else os.path.join(path, "bpe_core")
    spec = importlib.util.spec_from_file_location("bpe_core_against", os.path.join(root, "__init__.py"),
                                                  submodule_search_locations=[root])
    module = importlib.util.module_from_spec(spec)
    sys.modules["bpe_core_against"] = module
    spec.loader.exec_module(module)
    from bpe_core_against.encode import Tokenizer as Against  # noqa: E402

    return Against


def dump_ranks(ranks: dict[bytes, int], path: str) -> str:
    """A tiktoken ranks file (``base64 rank`` per line)."""
    with open(path, "wb") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(token) + b" %d\n" % rank)
    return path


def load_ranks(path: str) -> dict[bytes, int]:
    """The ranks of a tiktoken ranks file (plain or ``.gz``), read without tiktoken."""
    opener = gzip.open if path.endswith(".gz") else open
    ranks = {}
    with opener(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def gpt2_setup(tmp: str) -> tuple[dict, object]:
    """(the setup of GPT-2, the tiktoken encoding that gives the reference ids)."""
    import tiktoken
    import tiktoken.load

    merges = os.path.join(tmp, "gpt2_merges.txt")
    with open(merges, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + open(os.path.join(FIXTURES, "gpt2_merges.txt"), encoding="utf-8").read())
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(merges, os.path.join(FIXTURES, "gpt2_vocab.json"))
    specials = {EOT: 50256}
    enc = tiktoken.Encoding("gpt2_fixture", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    ours = Tokenizer.from_files(os.path.join(FIXTURES, "gpt2_vocab.json"), os.path.join(FIXTURES, "gpt2_merges.txt"), [EOT])
    hf_json = None
    if importlib.util.find_spec("tokenizers"):
        from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers

        hf = HF(models.BPE.from_file(os.path.join(FIXTURES, "gpt2_vocab.json"), merges))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens([EOT])
        hf_json = os.path.join(tmp, "gpt2_tokenizer.json")
        hf.save(hf_json)
    setup = {"ours": _ours_args(ours, tmp, "gpt2"), "ranks": dump_ranks(ranks, os.path.join(tmp, "gpt2.tiktoken")),
             "pat_str": GPT2_PATTERN, "specials": specials, "hf_json": hf_json,
             "skip": {"bpe_openai": "ships cl100k/o200k only, no GPT-2"}}
    return setup, enc


#: cl100k's split regex as the HF hub's cl100k ``tokenizer.json`` files spell it (no possessives)
CL100K_HF_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""


def cl100k_setup(tmp: str) -> tuple[dict, object]:
    """cl100k from the ranks that bpe-openai ships (tiktoken would download them)."""
    import tiktoken

    spec = importlib.util.find_spec("bpe_openai")
    if spec is None:
        raise RuntimeError("no offline cl100k ranks: tiktoken downloads them and bpe-openai is not installed")
    path = os.path.join(os.path.dirname(spec.origin), "data", "cl100k_base.tiktoken.gz")
    ranks = load_ranks(path)
    specials = {EOT: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
                "<|endofprompt|>": 100276}
    enc = tiktoken.Encoding("cl100k_offline", pat_str=CL100K_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    vocab = {r: b for b, r in ranks.items()}
    vocab.update({i: s.encode() for s, i in specials.items()})      # tiktoken's ids for the specials
    merges = merges_from_ranks(ranks)
    ours = Tokenizer(vocab, merges, list(specials), "cl100k")
    setup = {"ours": _ours_args(ours, tmp, "cl100k"), "ranks": dump_ranks(ranks, os.path.join(tmp, "cl100k.tiktoken")),
             "pat_str": CL100K_PATTERN, "specials": specials, "hf_json": None, "skip": {}}
    try:
        setup["hf_json"] = cl100k_hf_json(ranks, merges, specials, os.path.join(tmp, "cl100k_tokenizer.json"))
    except Exception as exc:         # (no tokenizers, or it cannot read the pattern): the HF peers are skipped
        why = f"no cl100k tokenizer.json: {str(exc)[:100]}"
        setup["skip"] = {name: why for name in ("tokenizers", "fastokens", "snaptokens", "tokie", "tuetoken", "kitoken")}
    return setup, enc


def cl100k_hf_json(ranks: dict[bytes, int], merges, specials: dict[str, int], path: str) -> str:
    """A ``tokenizer.json`` of cl100k for the HF-format peers, written offline: byte-level BPE over
    tiktoken's ranks (ids = ranks) and ``merges_from_ranks``, the split regex cl100k's
    ``tokenizer.json`` on the HF hub carries (``CL100K_HF_PATTERN``: the one fastokens recognises
    and scans natively), the special tokens at tiktoken's ids. Each peer's ids are still checked
    against tiktoken's on every document."""
    from tokenizers import Regex, Tokenizer as HF, decoders, models, pre_tokenizers

    def name(token: bytes) -> str:
        return "".join(BYTE_CHARS[b] for b in token)

    hf = HF(models.BPE({name(t): r for t, r in ranks.items()}, [(name(a), name(b)) for a, b in merges]))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CL100K_HF_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    doc = json.loads(hf.to_str())
    doc["added_tokens"] = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True} for s, i in sorted(specials.items(), key=lambda kv: kv[1])]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    return path


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in character of each byte (the byte-level alphabet of tokenizer.json)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


BYTE_CHARS = _byte_chars()


def _ours_args(tok: Tokenizer, tmp: str, name: str) -> dict:
    """What a child builds our tokenizer from: its constructor's arguments, pickled."""
    path = os.path.join(tmp, f"{name}.ours.pickle")
    with open(path, "wb") as f:
        pickle.dump(tok.__reduce__()[1], f)
    return {"args": path}


TRAINED = "trained:"


def trained_setup(folder: str, tmp: str) -> tuple[dict, "ReferenceIds"]:
    """A BPE model folder of ``tools/train_bpe.py``: (its setup, the reference ids)."""
    from bpe_core.export import export
    from bpe_core.formats import load_model, registry

    model = load_model(folder)
    if registry.get(model.method).stage_aware:     # the reference twin here is one merge list by rank
        raise ValueError(f"{folder} is a {model.method} model, which encodes in stages; the reference here "
                         f"is plain BPE (compare trained models of other methods with --models)")
    skip = {"bpe_openai": "ships cl100k/o200k only, loads no other vocabulary"}
    hf_json = os.path.join(folder, "tokenizer.json")
    if not os.path.exists(hf_json):
        hf_json = export(model, "hf", os.path.join(tmp, "trained_tokenizer.json"))[0]
    hf_json = byte_level_form(hf_json, model.pattern, os.path.join(tmp, "trained_tokenizer_bytelevel.json"))
    ranks = pat_str = specials = None
    try:
        ranks, sidecar = export(model, "tiktoken", os.path.join(tmp, "trained.tiktoken"))
        with open(sidecar, encoding="utf-8") as f:
            meta = json.load(f)
        pat_str, specials = meta["pat_str"], meta["special_tokens"]
    except ValueError as exc:          # refused: duplicate token bytes (one id per token needed)
        for name in RANKS_PEERS:
            skip[name] = f"no tiktoken export: {str(exc)[:100]}"
    setup = {"ours": {"folder": os.path.abspath(folder)}, "ranks": ranks, "pat_str": pat_str, "specials": specials,
             "hf_json": hf_json, "skip": skip}
    return setup, ReferenceIds(model)


def byte_level_form(hf_json: str, pattern: str | None, path: str) -> str:
    """For a GPT-2-pattern model: a copy of its ``tokenizer.json`` whose pre-tokenizer is the
    ``ByteLevel`` one with its own regex (GPT-2's, the form HF's trainers write and fastokens scans
    natively) instead of our export's ``Split`` + ``ByteLevel``; the same pretokens. Any other
    pattern: ``hf_json`` itself."""
    if pattern not in (None, "gpt2", GPT2_PATTERN):
        return hf_json
    with open(hf_json, encoding="utf-8") as f:
        doc = json.load(f)
    doc["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    return path


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


def vocab_setup(vocab: str, tmp: str) -> tuple[dict, object]:
    """(the setup of a ``--vocab`` value, the encoder that gives the reference ids: ``encode`` and
    ``encode_batch`` as tiktoken's)."""
    sub = os.path.join(tmp, "vocab_" + str(abs(hash(vocab))))
    os.makedirs(sub, exist_ok=True)
    if vocab.startswith(TRAINED):
        return trained_setup(vocab[len(TRAINED):], sub)
    return (gpt2_setup if vocab == "gpt2" else cl100k_setup)(sub)


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


# ==== Adapters (in a measuring child) ===============================================================
#
# An adapter maps each work it can do to a callable: ``list`` / ``array`` (whole text, special
# tokens allowed), ``batch`` / ``flat`` (documents, on all threads), ``decode`` (ids -> str).


def ours_adapter(tok, n_threads: int) -> dict:
    return {"list": tok.encode, "array": tok.encode_to_numpy,
            "batch": lambda ds: tok.encode_batch(ds, num_threads=n_threads),
            "flat": lambda ds: tok.encode_batch_flat(ds, num_threads=n_threads),
            "decode": tok.decode}


def load_ours(setup: dict, cls):
    """Our tokenizer (``cls``: this checkout's ``Tokenizer``, or the ``--against`` one's)."""
    if "folder" in setup["ours"]:
        return cls.load(setup["ours"]["folder"])
    with open(setup["ours"]["args"], "rb") as f:
        return cls(*pickle.load(f))


def _flat_u64(pair) -> tuple[np.ndarray, np.ndarray]:
    ids, offs = pair
    return np.frombuffer(ids, np.uint32), np.frombuffer(offs, np.uint64)


def make_adapter(name: str, setup: dict, n_threads: int) -> dict:
    """The adapter of peer ``name`` on this setup (raises when it cannot load the vocabulary)."""
    specials = setup["specials"] or {}
    if name in RANKS_PEERS:
        if setup["ranks"] is None:
            raise RuntimeError("no tiktoken ranks of this vocabulary")
        ranks = load_ranks(setup["ranks"])
    if name == "tiktoken":
        import tiktoken

        enc = tiktoken.Encoding("bench", pat_str=setup["pat_str"], mergeable_ranks=ranks, special_tokens=specials)
        return {"list": lambda t: enc.encode(t, allowed_special="all"),
                "array": lambda t: enc.encode_to_numpy(t, allowed_special="all"),
                "batch": lambda ds: enc.encode_batch(ds, num_threads=n_threads, allowed_special="all"),
                "decode": enc.decode}
    if name == "riptoken":
        import riptoken

        core = riptoken.CoreBPE(ranks, specials, setup["pat_str"])
        allowed = set(specials)
        return {"list": lambda t: core.encode(t, allowed),
                "batch": lambda ds: core.encode_batch(ds, allowed),          # rayon: all cores
                "decode": lambda ids: core.decode_bytes(ids).decode("utf-8", "replace")}
    if name == "splintr":
        import splintr

        with open(setup["ranks"], "rb") as f:
            sp = splintr.Tokenizer.from_bytes(f.read(), setup["pat_str"], specials)
        # (no whole text -> array: its array encoder, encode_flat, reads special tokens as text)
        return {"list": sp.encode_with_special,
                "batch": sp.encode_batch_with_special,                       # rayon: all cores
                "flat": lambda ds: _flat_u64(sp.encode_batch_flat(ds)),     # (documents hold no special)
                "decode": sp.decode}
    if name == "tokendagger":
        import tokendagger

        td = tokendagger.Encoding("bench", pat_str=setup["pat_str"], mergeable_ranks=ranks, special_tokens=specials)
        return {"list": lambda t: td.encode(t, allowed_special="all"),
                "batch": lambda ds: td.encode_batch(ds, num_threads=n_threads, allowed_special="all"),
                "decode": td.decode}
    if name == "bpe_openai":
        import bpe_openai

        bo = bpe_openai.get_encoding("cl100k_base")
        return {"list": lambda t: bo.encode(t, allowed_special="all"),
                "array": lambda t: bo.encode_to_numpy(t, allowed_special="all"),
                "batch": lambda ds: bo.encode_batch(ds, num_threads=n_threads, allowed_special="all"),
                "decode": bo.decode}
    hf_json = setup["hf_json"]
    if hf_json is None:
        raise RuntimeError("no tokenizer.json")
    if name == "tokenizers":
        from tokenizers import Tokenizer as HF

        hf = HF.from_file(hf_json)
        # (no whole-text work: HF keeps offsets and strings per token and crawls on a 5 MB sequence)
        return {"batch": lambda ds: [e.ids for e in hf.encode_batch(ds, add_special_tokens=False)],
                "decode": lambda ids: hf.decode(ids, skip_special_tokens=False)}
    if name in ("fastokens", "snaptokens"):          # snaptokens is a fork of fastokens: one API
        module = importlib.import_module(name)
        ft = module.Tokenizer.from_file(hf_json)
        return {"list": lambda t: ft.encode(t).ids,
                "array": lambda t: np.frombuffer(ft.encode_batch_flat([t])[0], np.uint32),   # its array path
                "batch": lambda ds: [e.ids for e in ft.encode_batch(ds)],
                "flat": lambda ds: _flat_u64(ft.encode_batch_flat(ds)),
                "decode": lambda ids: ft.decode(ids)}
    if name == "tuetoken":
        import tuetoken

        auto = tuetoken.AutoTokenizer.from_file(hf_json)     # its special-token-aware wrapper
        core = auto._core

        def flat(ds):
            got = core.encode_ordinary_to_buffer(ds, num_threads=n_threads)
            return got["data"], got["offsets"]
        # (no whole text -> array: its array encoder, encode_to_bytes, reads special tokens as text)
        return {"list": lambda t: auto.encode(t, add_special_tokens=False),
                "batch": lambda ds: core.encode_special_batch(ds, num_threads=n_threads),
                "flat": flat,
                "decode": lambda ids: core.decode(ids)}
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
    raise ValueError(f"unknown peer {name!r}")


def corpus_to_npy(adapter: dict, path: str, out: str, ours, n_threads: int):
    """A corpus file to a flat .npy: ours with ``encode_corpus``; a peer reads the file, encodes its
    documents as a batch (flat when it can) and saves."""
    if ours is not None:
        package = type(ours).__module__.split(".")[0]        # bpe_core, or bpe_core_against
        encode_corpus = importlib.import_module(package + ".encode.encode_corpus").encode_corpus

        encode_corpus(path, ours, out, num_workers=n_threads, progress=False)
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    docs = [d + EOT for d in text.split(EOT)]
    docs[-1] = docs[-1][: -len(EOT)]
    if "batch" not in adapter:
        raise RuntimeError("no batch encoder")
    ids = np.fromiter((i for d in adapter["batch"](docs) for i in d), dtype=np.uint32)
    np.save(out, ids.astype(np.uint16) if ids.size and ids.max() < 65536 else ids)


# ==== The measuring child =============================================================================


def check(work: str, got, want: dict) -> bool:
    """Whether ``got`` (the output of ``work``) holds the reference ids of every document."""
    if work in ("list", "array"):
        got = np.asarray(got, dtype=np.int64)
        return got.shape == want["text"].shape and bool(np.array_equal(got, want["text"]))
    if work == "batch":
        offs = want["offsets"]
        if len(got) != len(offs) - 1:
            return False
        flat = np.fromiter((i for d in got for i in d), dtype=np.int64)
        lens = np.fromiter((len(d) for d in got), dtype=np.int64, count=len(got))
        return bool(np.array_equal(flat, want["docs"]) and np.array_equal(np.cumsum(lens), offs[1:]))
    if work == "flat":
        ids, offs = got
        return (len(offs) == len(want["offsets"]) and bool(np.array_equal(np.asarray(offs, np.int64), want["offsets"]))
                and bool(np.array_equal(np.asarray(ids, np.int64), want["docs"])))
    if work == "decode":
        return got == want["decoded"]
    if work == "corpus":
        return bool(np.array_equal(np.load(got).astype(np.int64), want["text"]))
    raise ValueError(work)


def child(spec: dict) -> dict:
    """One library, one work: load, the first (cold) call, then ``warm`` more; the ids of each
    checked. Returns the timings (wall and process CPU seconds), the load time and ``same``."""
    n_threads = spec["threads"]
    with open(spec["setup"]) as f:
        setup = json.load(f)
    text_path = spec["text"]
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    docs = documents(text)
    data = np.load(spec["want"])
    want = {"text": data["text"], "docs": data["docs"], "offsets": data["offsets"], "decoded": text}
    who, work = spec["who"], spec["work"]
    t0 = time.perf_counter()
    ours = None
    if who in ("bpe_core", "before"):
        cls = load_against(spec["against"]) if who == "before" else Tokenizer
        ours = load_ours(setup, cls)
        adapter = ours_adapter(ours, n_threads)
    else:
        try:
            adapter = make_adapter(who, setup, n_threads)
        except Exception as exc:       # a peer that cannot load this vocab is named, not fatal
            return {"error": f"{CANNOT_LOAD}: {type(exc).__name__}: {str(exc)[:100]}"}
    load_s = time.perf_counter() - t0
    if work == "corpus":
        out = os.path.join(spec["tmp"], f"{who}.npy")
        fn = lambda: (corpus_to_npy(adapter, text_path, out, ours, n_threads), out)[1]  # noqa: E731
        if ours is None and "batch" not in adapter:
            return {"unsupported": True}
    elif work not in adapter:
        return {"unsupported": True}
    else:
        call = adapter[work]
        ids = want["text"].tolist() if work == "decode" else None
        # Each call gets str objects of its own, made untimed: CPython keeps a str's UTF-8 once
        # a tool asks for it, so a str used twice would be read for free the second time.
        fresh = {}

        def refresh():
            fresh["arg"] = (ids if work == "decode" else text.encode("utf-8").decode("utf-8") if work in ("list", "array")
                            else [d.encode("utf-8").decode("utf-8") for d in docs])
        fn = lambda: call(fresh["arg"])  # noqa: E731
    walls, cpus, same = [], [], True
    for k in range(spec["warm"] + 1):
        if work not in ("corpus",):
            refresh()
        t0, c0 = time.perf_counter(), time.process_time()
        got = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        same = same and check(work, got, want)
        del got
    return {"load_s": load_s, "wall": walls, "cpu": cpus, "same": same}


def run_child(spec: dict, tmp: str) -> dict:
    """``child(spec)`` in a fresh process (this script, ``--child``), which imports the bpe_core this
    process imported. A child that fails gives ``{"error": its last line of stderr}``."""
    import bpe_core

    path = os.path.join(tmp, "child.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ)
    env[PACKAGE_ENV] = os.path.dirname(os.path.dirname(os.path.abspath(bpe_core.__file__)))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"error": err[:200]}
    return json.loads(lines[-1])


# ==== The parent ==================================================================================


def bench(vocab: str, corpus: str, text: str, setup: dict, want, peers: list[str], works: list[str], runs: int,
          warm: int, tmp: str, against: str | None = None) -> dict:
    """Every (library, work) in a process of its own, ``runs`` interleaved rounds; ``want`` gives the
    reference ids (``encode`` and ``encode_batch`` as tiktoken's: tiktoken itself, or
    :class:`ReferenceIds`)."""
    docs = documents(text)
    n_bytes = len(text.encode("utf-8"))
    doc_bytes = sum(len(d.encode("utf-8")) for d in docs)
    want_docs = want.encode_batch(docs, allowed_special="all")
    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum([len(d) for d in want_docs], out=offsets[1:])
    sub = os.path.join(tmp, f"{abs(hash((vocab, corpus)))}")
    os.makedirs(sub, exist_ok=True)
    text_path = os.path.join(sub, f"{corpus}.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(text)
    want_path = os.path.join(sub, "want.npz")
    np.savez(want_path, text=np.array(want.encode(text, allowed_special="all"), np.int64),
             docs=np.fromiter((i for d in want_docs for i in d), np.int64), offsets=offsets)
    setup_path = os.path.join(sub, "setup.json")
    with open(setup_path, "w") as f:
        json.dump(setup, f)
    everyone = ["bpe_core"] + (["before"] if against else []) + peers
    jobs = [(work, who) for who in everyone for work in works]
    res = {"vocab": vocab, "corpus": corpus, "mb": n_bytes / 1e6, "docs": len(docs), "peers": peers,
           "wall": {}, "cpu": {}, "same": {}, "failed": {}, "load": {}}
    samples = {}
    for r in range(runs):
        for work, who in (jobs if r % 2 == 0 else jobs[::-1]):
            if (work, who) in res["failed"] or (work, who, "unsupported") in samples:
                continue
            spec = {"who": who, "work": work, "setup": setup_path, "text": text_path, "want": want_path,
                    "warm": warm, "threads": os.cpu_count() or 1, "against": against, "tmp": sub}
            got = run_child(spec, sub)
            if got.get("unsupported"):
                samples[(work, who, "unsupported")] = True
                continue
            if "error" in got:          # e.g. a peer's own limit on tokens per call: named, left out
                for w in (works if got["error"].startswith(CANNOT_LOAD) else [work]):
                    res["failed"][(w, who)] = got["error"]
                continue
            nb = doc_bytes if work in ("batch", "flat") else n_bytes
            s = samples.setdefault((work, who), {"cold": ([], []), "warm": ([], []), "load": []})
            s["cold"][0].append(nb / 1e6 / max(got["wall"][0], 1e-9))
            s["cold"][1].append(nb / 1e6 / max(got["cpu"][0], 1e-9))
            if len(got["wall"]) > 1:
                s["warm"][0].append(nb / 1e6 / max(statistics.median(got["wall"][1:]), 1e-9))
                s["warm"][1].append(nb / 1e6 / max(statistics.median(got["cpu"][1:]), 1e-9))
            s["load"].append(got["load_s"])
            res["same"][(WORK_LABELS[work], who)] = res["same"].get((WORK_LABELS[work], who), True) and got["same"]
    for key, s in samples.items():
        if len(key) == 3:
            continue
        work, who = key
        for phase in PHASES:
            walls, cpus = s[phase]
            if walls:
                res["wall"][(WORK_LABELS[work], who, phase)] = statistics.median(walls)
                res["cpu"][(WORK_LABELS[work], who, phase)] = statistics.median(cpus)
        res["load"].setdefault(who, []).extend(s["load"])
    res["failed"] = {(WORK_LABELS[w], who): why for (w, who), why in res["failed"].items()}
    res["load"] = {who: statistics.median(v) for who, v in res["load"].items()}
    return res


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


def table(res: dict, key: str = "cpu") -> str:
    """The rows (work, cold / warm) of one vocabulary and corpus: everyone's median, the best exact
    peer, ours / best (and with ``--against``: before / best, ours / before)."""
    against = any(who == "before" for _, who, _ in res[key])
    cols = ["bpe_core"] + (["before"] if against else []) + [p for p in res["peers"]
                                                             if any(w == p for _, w, _ in res[key])]
    what = "MB/s (wall)" if key == "wall" else "MB per CPU-second (all threads of the process)"
    lines = [f"### {res['vocab']}, {res['corpus']} ({res['mb']:.1f} MB, {res['docs']} docs), {what}, medians",
             "", "| work | " + " | ".join(cols) + " | best peer | ours/best |" + (" before/best | ours/before |" if against else ""),
             "|---" * (len(cols) + 3 + 2 * against) + "|"]
    for work in WORKS:
        for phase in PHASES:
            if not any((work, who, phase) in res[key] for who in cols):
                continue
            cells, best = [], None
            for who in cols:
                m = res[key].get((work, who, phase))
                if m is None:
                    cells.append("-")
                    continue
                ok = res["same"].get((work, who), True)
                cells.append(f"{m:.1f}" + ("" if ok else " (ids differ)"))
                if who not in ("bpe_core", "before") and ok and (best is None or m > best[1]):
                    best = (who, m)
            ours = res[key].get((work, "bpe_core", phase))
            ratio = f"{ours / best[1]:.2f}" if best and ours else "-"
            row = f"| {work}, {phase} | " + " | ".join(cells) + f" | {best[0] if best else '-'} | {ratio} |"
            if against:
                old = res[key].get((work, "before", phase))
                row += (f" {old / best[1]:.2f} |" if best and old else " - |") + (f" {ours / old:.2f} |" if ours and old else " - |")
            lines.append(row)
    said = set()
    for (work, who), why in res.get("failed", {}).items():
        if why.startswith(CANNOT_LOAD):     # one line for the peer, not one per work
            if who not in said:
                lines.append(f"\n{who}: {why}")
            said.add(who)
        else:
            lines.append(f"\n{who}, {work}: failed ({why})")
    if key == "cpu":
        reference = "bpe_core.reference" if res["vocab"].startswith(TRAINED) else "tiktoken"
        verdicts = []
        for who in cols:
            mine = [(w, ok) for (w, h), ok in res["same"].items() if h == who]
            if mine:
                bad = [w for w, ok in mine if not ok]
                verdicts.append(f"{who} {'yes' if not bad else 'NO (' + ', '.join(bad) + ')'}")
        lines.append(f"\nids identical to {reference} on every document: " + "; ".join(verdicts))
        lines.append("load, seconds (median): " + ", ".join(f"{who} {s:.2f}" for who, s in res["load"].items()))
    return "\n".join(lines)


def versions(names) -> str:
    """``bpe_core X, fastokens Y, ...``: the installed version of ours and of each peer asked for."""
    from importlib import metadata
    out = []
    for name in ["bpe_core"] + list(names):
        try:
            out.append(f"{name} {metadata.version(DISTRIBUTIONS.get(name, name))}")
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
    ap.add_argument("--runs", type=int, default=5, help="rounds: fresh processes per library and work")
    ap.add_argument("--warm", type=int, default=3, help="calls after the first (cold) one in each process")
    ap.add_argument("--corpus", nargs="+", default=["en_heldout", "ood_code"])
    ap.add_argument("--vocab", nargs="+", default=["gpt2", "cl100k"], type=vocab_arg,
                    metavar="{gpt2,cl100k,none,trained:DIR}",
                    help="vocabularies: GPT-2, cl100k, none (only --models), or a BPE model folder "
                         "of tools/train_bpe.py (trained:DIR; its ids checked against bpe_core.reference)")
    ap.add_argument("--works", nargs="+", default=list(WORK_LABELS), choices=list(WORK_LABELS))
    ap.add_argument("--models", nargs="+", default=[], metavar="NAME=DIR",
                    help="trained model folders to compare on the same text (one thread, to an array)")
    ap.add_argument("--plain", action="store_true", help="with --models: also the stage-aware plain path")
    ap.add_argument("--peers", nargs="+", default=PEERS)
    ap.add_argument("--corpora", default=CORPORA, help="the folder of the corpora (NAME.txt or NAME.txt.xz)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--against", metavar="DIR",
                    help="also time bpe_core from this built checkout (column 'before', never a peer)")
    args = ap.parse_args(argv)
    models = {}
    for spec in args.models:
        name, sep, folder = spec.partition("=")
        if not sep or not os.path.isdir(folder):
            ap.error(f"--models wants NAME=DIR with an existing folder, got {spec!r}")
        models[name] = folder
    against = os.path.abspath(args.against) if args.against else None
    print(f"# bench_peers: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, {args.runs} interleaved "
          f"rounds of one process per library and work (1 cold call, {args.warm} warm), --mb {args.mb}", flush=True)
    print(f"# versions: {versions(args.peers)}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for vocab in [v for v in args.vocab if v != "none"]:
            try:
                setup, want = vocab_setup(vocab, tmp)
            except Exception as exc:
                print(f"\n{vocab}: skipped ({exc})")
                continue
            peers = []
            for name in args.peers:
                why = setup["skip"].get(name) or (None if importlib.util.find_spec(name) else "not installed")
                if why:
                    print(f"{vocab}: {name} skipped ({why})")
                else:
                    peers.append(name)
            for corpus, text in cuts(args):
                res = bench(vocab, corpus, text, setup, want, peers, args.works, args.runs, args.warm, tmp, against)
                print("\n" + table(res, "cpu"), flush=True)
                print("\n" + table(res, "wall"), flush=True)
                results.append(res)
        if models:
            for corpus, text in cuts(args):
                print("\n" + bench_models(models, corpus, text, args.runs, args.plain), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r, **{k: {" / ".join(key): v for key, v in r[k].items()} for k in ("wall", "cpu", "same", "failed")}}
                       for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        with open(sys.argv[2]) as f:
            print(json.dumps(child(json.load(f))))
        sys.exit(0)
    sys.exit(_tool_start.run_bench(main))
