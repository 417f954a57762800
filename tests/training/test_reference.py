"""The reference trainer against the CS336 fixture, and its own worked examples."""
import json

import pytest

from bpe_core import reference
from bpe_core.formats.model import gpt2_to_token


def load_reference_merges(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            left, right = line.rstrip("\n").split(" ")
            out.append((gpt2_to_token(left), gpt2_to_token(right)))
    return out


def load_reference_vocab_values(path):
    values = set()
    with open(path, encoding="utf-8") as f:
        for token in json.load(f):
            try:
                values.add(gpt2_to_token(token))
            except KeyError:            # the special token is stored verbatim
                values.add(token.encode("utf-8"))
    return values


# The plain-Python reference takes ~10 s on the fixture (it recounts every pair after each merge):
# --slow. The default run checks the same chain: test_train_equivalence.py::test_cs336_fixture (the
# fast trainer against this fixture) and ::test_fast_equals_reference_on_random_corpora /
# ::test_patterns (the fast trainer against this reference).
@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["gpt2"])
def test_reference_matches_cs336_fixture(fixtures_dir, pattern):
    vocab, merges = reference.train_bpe(fixtures_dir / "corpus.en", 500, ["<|endoftext|>"], pattern)
    assert merges == load_reference_merges(fixtures_dir / "train-bpe-reference-merges.txt")
    assert len(merges) == 243
    assert set(vocab.values()) == load_reference_vocab_values(fixtures_dir / "train-bpe-reference-vocab.json")


def test_pair_counts_count_every_window():
    assert reference.get_pair_counts({(b"a", b"a", b"a"): 3})[(b"a", b"a")] == 6


def test_merge_is_greedy_left_to_right():
    assert reference.merge_word((b"a",) * 5, (b"a", b"a")) == (b"aa", b"aa", b"a")


def test_ties_compare_left_then_right_not_concatenation():
    # (b"a", b"bc") and (b"ab", b"c") concatenate to the same bytes; tuples decide: b"ab" > b"a".
    from collections import Counter
    assert reference.best_pair(Counter({(b"a", b"bc"): 1, (b"ab", b"c"): 1})) == (b"ab", b"c")
    # left decides before right: (b"b", b"a") > (b"a", b"z")
    assert reference.best_pair(Counter({(b"a", b"z"): 5, (b"b", b"a"): 5})) == (b"b", b"a")


def test_special_tokens_are_never_merged():
    vocab, merges = reference.train_bpe_from_bytes(b"<|endoftext|>" * 20, 300, ["<|endoftext|>"])
    assert merges == []
    assert vocab[256] == b"<|endoftext|>"


def test_invalid_utf8_is_kept_byte_for_byte():
    data = b"caf\xe9 caf\xe9 \xff\xfe"
    counts = reference.count_pretokens(data)
    assert b"".join(p * 0 + p for p in reference.pretokenize(data)) == data
    assert sum(len(p) * c for p, c in counts.items()) == len(data)


def test_encode_reproduces_training_segmentation():
    data = b"low lower lowest low low newer newest"
    vocab, merges = reference.train_bpe_from_bytes(data, 280)
    ids = reference.encode(data, vocab, merges)
    assert reference.decode_bytes(ids, vocab) == data
