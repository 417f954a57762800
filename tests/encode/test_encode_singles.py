"""The proven single tokens (``_encode.build_singles``): a piece is in the table exactly when the merge
loop turns it into its own token, and an encoder that consults it gives the ids of one that merges."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.encode import _encode
from bpe_core.encode.tokenizer import Tokenizer
from encode_helpers import (FIXTURE_TEXTS, SETTINGS, fixture_text, gpt2_tiktoken, gpt2_tokenizer, merge_lists,
                            small_model)


@st.composite
def adversarial_vocab(draw):
    """Random merges over a 3-letter alphabet (results may repeat bytes: two paths to one token, a
    merge whose parts are built only later, a token never built from its own bytes) plus vocabulary
    entries that no merge builds, in a shuffled id order (so a token's canonical id is not its rank)."""
    merges = draw(merge_lists(30))
    extra = draw(st.lists(st.text("abc", min_size=2, max_size=6).map(str.encode), max_size=6))
    entries = [a + b for a, b in merges] + extra
    order = draw(st.permutations(range(len(entries))))
    vocab = {i: bytes([i]) for i in range(256)}
    for k in order:
        vocab[len(vocab)] = entries[k]
    return vocab, merges


def _singles(tok: Tokenizer):
    """The proven single tokens of ``tok`` (built here: ``Tokenizer`` leaves them off by default)."""
    return _encode.build_singles(tok._table, tok._tokens)


def _is_single(tok: Tokenizer, piece: bytes, singles=None):
    """(ids, whether the piece was found in the singles table) with a fresh encoder."""
    enc = _encode.Encoder(tok._table, singles=singles if singles is not None else _singles(tok))
    ids = enc.encode_pieces(piece, np.array([len(piece)], np.int64)).tolist()
    return ids, enc.cache_info()["single_hits"] == 1


@SETTINGS
@given(adversarial_vocab())
def test_singles_hold_exactly_the_tokens_the_merge_loop_makes_whole(model):
    vocab, merges = model
    tok = Tokenizer(vocab, merges, pattern=r"[abc]+")
    ids_of = reference.token_ids(vocab)
    singles = _singles(tok)
    want_entries = 0
    for token in {b for b in vocab.values() if len(b) >= 2}:
        expected = [ids_of[p] for p in reference.encode_pretoken(token, merges)]
        ids, hit = _is_single(tok, token, singles)
        assert ids == expected
        assert hit == (expected == [ids_of[token]])
        want_entries += hit
    assert singles.cache_info()["entries"] == want_entries


@SETTINGS
@given(adversarial_vocab(), st.lists(st.text("abc", max_size=12), max_size=30))
def test_encoding_with_singles_equals_plain_merging(model, words):
    vocab, merges = model
    tok = Tokenizer(vocab, merges, pattern=r"[abc]+")
    text = " ".join(words)
    ids_of = reference.token_ids(vocab)
    expected = [ids_of[p] for w in text.encode().split(b" ") if w for p in reference.encode_pretoken(w, merges)]
    data = text.encode()
    spans = [m.span() for m in re.finditer(rb"[abc]+", data)]
    plain = _encode.Encoder(tok._table)               # no singles: every miss merges
    with_singles = _encode.Encoder(tok._table, singles=_singles(tok))
    for enc in (plain, with_singles, with_singles):   # cold, then warm
        got = []
        for s, e in spans:
            got += enc.encode_pieces(data, np.array([e], np.int64), s).tolist()
        assert got == expected
    assert tok.encode(text) == reference.encode(text, vocab, merges, pattern=r"[abc]+")


def test_a_token_that_is_not_its_own_encoding_is_left_out():
    # (b, c) first: "abc" becomes a + bc, and (a, bc) is no merge, although abc is a token (ab + c).
    vocab = {i: bytes([i]) for i in range(256)}
    merges = [(b"b", b"c"), (b"a", b"b"), (b"ab", b"c")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    tok = Tokenizer(vocab, merges, pattern=r"[abc]+")
    assert _is_single(tok, b"abc") == ([97, 256], False)
    assert _is_single(tok, b"ab") == ([257], True) and _is_single(tok, b"bc") == ([256], True)
    assert _singles(tok).cache_info()["entries"] == 2
    assert tok.encode("abc ab") == reference.encode("abc ab", vocab, merges, pattern=r"[abc]+")


def test_gpt2_singles_and_a_cold_pass_match_tiktoken():
    tok = gpt2_tokenizer()
    singles = _singles(tok)
    assert singles.cache_info()["entries"] > 40_000
    want = gpt2_tiktoken()
    for name in FIXTURE_TEXTS:
        text = fixture_text(name)
        enc = _encode.Encoder(tok._table, singles=singles)   # cold: first sights go to the singles
        ids, _, _ = enc.encode_text(text.encode(), 0, len(text.encode()), tok._pattern_id, tok._special_table)
        assert ids.tolist() == want.encode(text, allowed_special="all")
        info = enc.cache_info()
        assert info["single_hits"] > 0 and info["misses"] > 0


def test_tokenizer_with_singles_matches_reference(monkeypatch):
    from bpe_core.encode import tokenizer as tokenizer_mod, tokenizer_batch as batch_mod

    monkeypatch.setattr(tokenizer_mod, "_USE_SINGLES", True)
    monkeypatch.setattr(batch_mod, "_BATCH_THREAD_BYTES", 1)      # batches on threads
    vocab, merges, specials = small_model()
    tok = Tokenizer(vocab, merges, specials)
    assert tok._singles is not None
    data = fixture_text("corpus.en").encode()[:20_000] + b"\xff\xfe caf\xe9"
    assert tok.encode(data) == reference.encode(data, tok.vocab, merges, specials)
    texts = [data[:5000], b"", data[5000:9000]]
    for _ in range(2):                                # cold threads, then a shared warm cache
        assert tok.encode_batch(texts, 3) == [reference.encode(t, tok.vocab, merges, specials) for t in texts]
    assert tok._encoder().cache_info()["single_hits"] > 0


def test_build_singles_checks_its_arguments():
    tok = gpt2_tokenizer()
    other = Tokenizer({i: bytes([i]) for i in range(256)}, [])
    with pytest.raises(ValueError, match="same rank table"):
        _encode.Encoder(tok._table, singles=_singles(other))
    with pytest.raises(ValueError, match="max_len"):
        _encode.build_singles(tok._table, tok._tokens, 1)
