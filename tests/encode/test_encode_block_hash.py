"""The block hasher of ``_emit_pieces`` (``hash_block``): where 8 bytes can be read at a block's
last end it loads every head word unchecked and takes a short key's mask and length term from
tables; elsewhere it reads byte by byte. Both must give the hash the cache's insert gives
(``_key_hash``), or a warm pass would miss where the piece was put: a warm pass adds no miss, for
keys of 1, 2, 3, 7, 8, 9, 15, 16 and 17 bytes, keys that differ only in their last byte, non-ASCII
bytes, blocks that end at, near and far from the end of the buffer, and caches cleared mid-call;
the ids equal tiktoken's on the same text.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.encode import _encode

from encode_helpers import SETTINGS, gpt2_tiktoken, gpt2_tokenizer

LENGTHS = [1, 2, 3, 7, 8, 9, 15, 16, 17]
BYTES = st.sampled_from(list(b"ab \x00\xff\xe2\x82\xac\n\xc3\xa9") + [0x80, 0x7F])


@st.composite
def edge_pieces(draw):
    """Pieces of the edge lengths (some of any length up to 40), and for some of them a twin that
    differs only in its last byte."""
    out = []
    for _ in range(draw(st.integers(1, 80))):
        n = draw(st.one_of(st.sampled_from(LENGTHS), st.integers(1, 40)))
        piece = bytes(draw(st.lists(BYTES, min_size=n, max_size=n)))
        out.append(piece)
        if draw(st.booleans()):
            out.append(piece[:-1] + bytes([(piece[-1] + 1) % 256]))
    return out


def _ends(parts):
    return np.cumsum([len(p) for p in parts]).astype(np.int64)


def _plain(table, parts):
    enc = _encode.Encoder(table, max_cached_len=0)
    return [i for p in parts for i in enc.encode_piece(p)]


@SETTINGS
@given(parts=edge_pieces(), pad=st.sampled_from([0, 1, 7, 8, 9, 40]))
def test_a_warm_pass_finds_every_piece_where_it_was_put(parts, pad):
    """A cold pass inserts each piece (``_key_hash``), the warm passes look them up through
    ``hash_block``: no new miss, the merged ids. ``pad`` bytes of one more piece after the last
    decide whether the last block takes the unchecked loads."""
    table = gpt2_tokenizer()._table
    if pad:
        parts = parts + [b"z" * pad]
    data = b"".join(parts)
    want = _plain(table, parts)
    enc = _encode.Encoder(table, max_entries=1 << 18, max_cached_len=4095)
    assert enc.encode_pieces(data, _ends(parts)).tolist() == want
    misses = enc.cache_info()["misses"]
    for _ in range(2):
        assert enc.encode_pieces(data, _ends(parts)).tolist() == want
    assert enc.cache_info()["misses"] == misses
    # each piece put alone (a buffer that ends with it: the checked loads), then all found by the
    # unchecked ones: the two paths hash alike
    alone = _encode.Encoder(table, max_entries=1 << 18, max_cached_len=4095)
    for p in parts:
        alone.encode_pieces(p, np.array([len(p)], np.int64))
    misses = alone.cache_info()["misses"]
    assert alone.encode_pieces(data + b"z" * 8, _ends(parts)).tolist() == want
    assert alone.cache_info()["misses"] == misses
    # a cache of 5 entries, cleared many times mid-call, gives the same ids
    small = _encode.Encoder(table, max_entries=5, max_cached_len=4095)
    for _ in range(2):
        assert small.encode_pieces(data, _ends(parts)).tolist() == want


@pytest.mark.parametrize("n", LENGTHS)
def test_keys_of_one_length_that_differ_only_in_their_last_byte(n):
    """Every last byte after one head, many blocks of them: each found warm, each its own ids."""
    table = gpt2_tokenizer()._table
    parts = [b"ab\xc3\xa9xyzuvwqrstop"[: n - 1] + bytes([k]) for k in range(256)] * 2
    data = b"".join(parts)
    want = _plain(table, parts)
    enc = _encode.Encoder(table, max_entries=1 << 18)
    for p in parts[:256]:                   # put alone: the checked loads
        enc.encode_pieces(p, np.array([len(p)], np.int64))
    misses = enc.cache_info()["misses"]
    assert enc.encode_pieces(data + b"z" * 8, _ends(parts)).tolist() == want
    assert enc.cache_info()["misses"] == misses


@SETTINGS
@given(words=st.lists(st.one_of(st.sampled_from(["a", "ab", "abc", "the", " the", "tokenize", "tokenizer",
                                                 "tokenizers", "é", "€", "日本", "x" * 16, "y" * 17, "\n"]),
                                st.text(min_size=1, max_size=18)), min_size=1, max_size=200))
def test_batch_and_text_ids_equal_tiktoken(words):
    """Text made of the edge-length words: our ids (cold and warm, one text and a batch over two
    threads) equal tiktoken's."""
    text = " ".join(words)
    tok, ref = gpt2_tokenizer(), gpt2_tiktoken()
    want = ref.encode(text, allowed_special="all")
    for _ in range(2):
        assert tok.encode(text) == want
    ids, offsets = tok.encode_batch_flat([text, text[::-1], text], num_threads=2)
    assert ids[offsets[0]:offsets[1]].tolist() == want
    assert ids[offsets[2]:offsets[3]].tolist() == want
