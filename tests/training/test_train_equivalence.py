"""The fast trainer equals the reference trainer: ordered merges and vocab, any worker count."""
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core import reference

from strategies import SPECIAL, corpus_bytes
from test_reference import load_reference_merges, load_reference_vocab_values


def train_both(data: bytes, vocab_size: int, specials, **options):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "corpus.txt")
        with open(path, "wb") as f:
            f.write(data)
        fast = bpe_core.train_bpe(path, vocab_size, specials, **options)
    slow = reference.train_bpe_from_bytes(data, vocab_size, specials, options.get("pattern", "gpt2"))
    return fast, slow


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_cs336_fixture(fixtures_dir, num_workers):
    vocab, merges = bpe_core.train_bpe(fixtures_dir / "corpus.en", 500, ["<|endoftext|>"],
                                       num_workers=num_workers, chunk_bytes=16 << 10)
    assert merges == load_reference_merges(fixtures_dir / "train-bpe-reference-merges.txt")
    assert set(vocab.values()) == load_reference_vocab_values(fixtures_dir / "train-bpe-reference-vocab.json")
    assert vocab[256] == b"<|endoftext|>"
    assert sorted(vocab) == list(range(500))


@given(corpus_bytes, st.integers(256 + 1, 256 + 60))
def test_fast_equals_reference_on_random_corpora(data, vocab_size):
    fast, slow = train_both(data, vocab_size, [SPECIAL], num_workers=1)
    assert fast[1] == slow[1]
    assert fast[0] == slow[0]


@settings(max_examples=max(5, settings().max_examples // 6))
@given(corpus_bytes, st.sampled_from([2, 4]), st.integers(1, 40))
def test_fast_equals_reference_with_workers(data, num_workers, chunk_bytes):
    data = data * 3
    fast, slow = train_both(data, 256 + 1 + 40, [SPECIAL], num_workers=num_workers, chunk_bytes=chunk_bytes)
    assert fast == slow


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k", r"\S+|\s+"])
@given(data=corpus_bytes)
def test_patterns(pattern, data):
    fast, slow = train_both(data, 256 + 30, [SPECIAL], num_workers=1, pattern=pattern)
    assert fast == slow


@pytest.mark.parametrize("data", [
    b"",                                          # empty file
    b"<|endoftext|>",                             # only a special token
    b"<|endoftext|><|endoftext|>a<|endoftext|>",  # adjacent, at the edges
    b"ab<|endoftext|>ab",                         # inside a word
    b"a" * 1000,                                  # one long run
    b"ab ba " * 50,                               # all ties
    bytes(range(256)) * 3,                        # every byte, invalid UTF-8
])
def test_edge_cases(data):
    fast, slow = train_both(data, 256 + 1 + 50, [SPECIAL], num_workers=2, chunk_bytes=7)
    assert fast == slow


def test_no_special_tokens_and_several():
    data = b"<|a|>x<|b|><|a|><|b|> hello hello"
    fast, slow = train_both(data, 256 + 2 + 10, ["<|a|>", "<|a|><|b|>"], num_workers=1)
    assert fast == slow
    fast, slow = train_both(data, 256 + 10, [], num_workers=1)
    assert fast == slow


def test_short_corpus_stops_early():
    _, merges = train_both(b"abab", 300, [], num_workers=1)[0]
    assert merges == [(b"a", b"b"), (b"ab", b"ab")]


def test_options_are_checked(fixtures_dir):
    with pytest.raises(TypeError, match="unknown option"):
        bpe_core.train_bpe(fixtures_dir / "corpus.en", 300, [], workers=2)
    with pytest.raises(ValueError, match="below 256"):
        bpe_core.train_bpe(fixtures_dir / "corpus.en", 256, ["<|endoftext|>"])
    with pytest.raises(ValueError, match="non-empty"):
        bpe_core.train_bpe(fixtures_dir / "corpus.en", 300, [""])
