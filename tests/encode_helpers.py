"""Shared helpers of the encoder, export and corpus-encoding tests (fixtures, reference models)."""
from __future__ import annotations

import functools
import lzma
import os
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
SHARED_CORPORA = os.path.join(HERE, "..", "..", "shared", "corpora")
MAX_EXAMPLES = int(os.environ.get("BPE_CORE_MAX_EXAMPLES", "60"))
EOT = "<|endoftext|>"

SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

FIXTURE_TEXTS = ["corpus.en", "address.txt", "german.txt", "tinystories_sample.txt"]


def fixture_path(name: str) -> str:
    return os.path.join(FIXTURES, name)


def fixture_text(name: str) -> str:
    with open(fixture_path(name), encoding="utf-8") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def gpt2_tokenizer():
    from bpe_core.encode.tokenizer import Tokenizer

    return Tokenizer.from_files(fixture_path("gpt2_vocab.json"), fixture_path("gpt2_merges.txt"), [EOT])


@functools.lru_cache(maxsize=None)
def gpt2_tiktoken():
    """tiktoken's GPT-2 encoding built offline from the fixture files (see fixtures/README.md)."""
    import tiktoken
    import tiktoken.load

    from bpe_core.pretok.patterns import GPT2_PATTERN

    with tempfile.TemporaryDirectory() as d:
        merges = os.path.join(d, "merges.txt")
        with open(merges, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + open(fixture_path("gpt2_merges.txt"), encoding="utf-8").read())
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(merges, fixture_path("gpt2_vocab.json"))
    return tiktoken.Encoding("gpt2_fixture", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: 50256})


@functools.lru_cache(maxsize=None)
def small_model(vocab_size: int = 400, n_bytes: int = 6000, specials: tuple = (EOT,)):
    """A vocabulary trained by the reference trainer on the start of corpus.en plus a few bytes
    of invalid UTF-8 (so merges over non-text bytes exist)."""
    from bpe_core.reference import train_bpe_from_bytes

    with open(fixture_path("corpus.en"), "rb") as f:
        data = f.read(n_bytes)
    data += b"\xff\xfe\xff\xfe caf\xe9 caf\xe9 \xe2\x82\xe2\x82" + EOT.encode() + "naïve naïve".encode()
    vocab, merges = train_bpe_from_bytes(data, vocab_size, list(specials))
    return vocab, merges, list(specials)


def corpus_sample(name: str, n_bytes: int = 200_000) -> bytes | None:
    """The first ``n_bytes`` of a shared corpus (``.xz`` decompressed), or None when absent."""
    path = os.path.join(SHARED_CORPORA, name)
    if os.path.exists(path + ".xz"):
        dec = lzma.LZMADecompressor()
        out = b""
        with open(path + ".xz", "rb") as f:
            while len(out) < n_bytes:
                block = f.read(1 << 16)
                if not block:
                    break
                out += dec.decompress(block, max_length=n_bytes - len(out))
        return out[:n_bytes]
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read(n_bytes)
    return None


def corpus_names() -> list[str]:
    names = ["en_heldout.txt", "ood_code.txt"]
    multi = os.path.join(SHARED_CORPORA, "multi")
    if os.path.isdir(multi):
        names += sorted(f"multi/{n}" for n in os.listdir(multi) if n.endswith(".txt"))
    return names


@st.composite
def merge_lists(draw, max_merges: int = 25):
    """Random merge lists over a 3-letter alphabet, each merge joining two tokens made before it;
    results may repeat bytes (two paths to one token, so a merge can make a pair whose rank has
    passed, and the same pair may be merged again)."""
    tokens = [b"a", b"b", b"c"]
    merges = []
    for _ in range(draw(st.integers(1, max_merges))):
        a = draw(st.sampled_from(tokens))
        b = draw(st.sampled_from(tokens))
        merges.append((a, b))
        tokens.append(a + b)
    return merges
