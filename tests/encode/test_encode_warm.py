"""Warm caches for every thread: ``Encoder.copy_cache_from`` gives an encoder the pretoken cache of
another (the same ids, no new misses on what the other has seen), and the threads of a batch and
of ``encode_corpus`` start as warm as the warmest idle encoder (``Tokenizer._warm_encoders``)."""
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.encode import _encode

from bpe_core.encode.tokenizer import Tokenizer

from encode_helpers import EOT, SETTINGS, fixture_path, fixture_text, gpt2_tiktoken, gpt2_tokenizer

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)


@functools.lru_cache(maxsize=None)
def _own_gpt2():
    """A GPT-2 tokenizer of these tests alone (its idle encoders are counted; each test clears them)."""
    return Tokenizer.from_files(fixture_path("gpt2_vocab.json"), fixture_path("gpt2_merges.txt"), [EOT])


def _fresh(tok):
    return _encode.Encoder(tok._table)


def _encode_with(tok, enc, data: bytes):
    ids, _, _ = enc.encode_text(data, 0, len(data), tok._pattern_id, tok._special_table)
    return ids.tolist()


@settings(SETTINGS, max_examples=25)
@given(seen=TEXT, text=TEXT)
def test_a_copied_cache_encodes_as_a_fresh_encoder(seen, text):
    tok = gpt2_tokenizer()
    a = _fresh(tok)
    _encode_with(tok, a, seen.encode())
    b = _fresh(tok)
    _encode_with(tok, b, "unrelated words 123".encode())   # a cache of its own, replaced whole
    b.copy_cache_from(a)
    assert b.cache_info()["entries"] == a.cache_info()["entries"]
    misses = b.cache_info()["misses"]
    assert _encode_with(tok, b, seen.encode()) == _encode_with(tok, _fresh(tok), seen.encode())
    assert b.cache_info()["misses"] == misses            # everything it had seen was a hit
    data = text.encode()
    assert _encode_with(tok, b, data) == _encode_with(tok, _fresh(tok), data) == \
        gpt2_tiktoken().encode(text, allowed_special="all")


def test_copy_cache_of_a_large_cache_and_refusals():
    tok = gpt2_tokenizer()
    text = " ".join("".join(chr(97 + i // 26 ** k % 26) for k in range(4)) for i in range(6000)).encode()
    a = _fresh(tok)
    want = _encode_with(tok, a, text)
    assert a.cache_info()["entries"] > 5000               # grown past the first slot table (4096)
    b = _fresh(tok)
    b.copy_cache_from(a)
    b.copy_cache_from(b)                                   # itself: nothing changes
    assert _encode_with(tok, b, text) == want and b.cache_info()["entries"] == a.cache_info()["entries"]
    with pytest.raises(ValueError, match="one rank table"):
        _fresh(_own_gpt2()).copy_cache_from(a)            # another tokenizer: another rank table


def test_batch_threads_start_warm_and_give_the_same_ids():
    tok = _own_gpt2()
    tok._idle.clear()
    docs = [d for d in fixture_text("tinystories_sample.txt").split(EOT) if d] * 4
    want = gpt2_tiktoken().encode_batch(docs, allowed_special="all")
    assert tok.encode_batch(docs, num_threads=1) == want              # one warm encoder
    assert len(tok._idle) == 1
    warm = tok._idle[0].cache_info()["entries"]
    tok._warm_encoders(3)
    assert len(tok._idle) == 3
    assert all(e.cache_info()["entries"] == warm for e in tok._idle)
    assert tok.encode_batch(docs, num_threads=3) == want
    ids, offsets = tok.encode_batch_flat(docs, num_threads=3)
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want


def test_encode_corpus_workers_are_lent_warm_encoders(tmp_path):
    from bpe_core.encode.encode_corpus import encode_corpus

    tok = _own_gpt2()
    tok._idle.clear()
    text = fixture_text("tinystories_sample.txt")
    tok.encode(text)                                      # one warm encoder
    path = tmp_path / "in.txt"
    path.write_text(text * 3, encoding="utf-8")
    encode_corpus(str(path), tok, str(tmp_path / "ids.npy"), num_workers=2, chunk_bytes=4096, progress=False)
    assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(text * 3)
    assert len(tok._idle) >= 2 and min(e.cache_info()["entries"] for e in tok._idle) > 0
