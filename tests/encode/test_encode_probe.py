"""The pretoken cache's probe (``_find_slot``, ``Encoder._emit_pieces``): keys that share their
first 8 bytes and differ only in the tail, keys of exactly 8, 9, 16, 17, 24 and 25 bytes, keys
that differ only by trailing NUL bytes (the head word is zero-padded), keys that end at the very
end of the buffer (the tail word is read byte by byte there), invalid UTF-8, caches that grow or
are cleared between the two passes, a shared cache read beside an own one, and every
``max_cached_len`` edge. Every warm pass must give the ids of the uncached merge
(``max_cached_len=0``: every piece merged), itself checked against ``reference.encode_pretoken``.
"""
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.encode import _encode

from encode_helpers import SETTINGS, gpt2_tokenizer, small_model

# Heads that many keys share; tails from a small alphabet (so equal heads with different tails,
# and equal tails at different lengths, are common), NUL and bytes that are not UTF-8.
HEADS = [b"", b"a", b" the", b"abcdefg", b"abcdefgh", b"        ", b"\x00\x00", b"\xff\xfe\x00"]
TAIL_BYTES = st.sampled_from(list(b"ab \x00\xff\xe2\x82\n"))


@st.composite
def pieces(draw):
    """A list of non-empty byte pieces, lengths biased to the 8-byte word edges."""
    out = []
    for _ in range(draw(st.integers(1, 40))):
        head = draw(st.sampled_from(HEADS))
        n = draw(st.one_of(st.sampled_from([1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 25, 33]), st.integers(1, 70)))
        tail = bytes(draw(st.lists(TAIL_BYTES, min_size=0, max_size=n)))
        piece = (head + tail)[:n] or b"a"
        out.append(piece)
    return out


@functools.lru_cache(maxsize=None)
def _tables():
    """(name, rank table, uncached encoder) for GPT-2's vocabulary and a small trained one."""
    tok = gpt2_tokenizer()
    vocab, merges, specials = small_model()
    from bpe_core.encode.tokenizer import Tokenizer

    small = Tokenizer(vocab, merges, specials)
    return [("gpt2", tok._table, None), ("small", small._table, (vocab, merges))]


def _ends(parts):
    return np.cumsum([len(p) for p in parts]).astype(np.int64)


def _plain(table, parts):
    """The ids of each piece merged alone, no cache."""
    enc = _encode.Encoder(table, max_cached_len=0)
    return [enc.encode_piece(p) for p in parts]


@SETTINGS
@given(parts=pieces(), max_entries=st.sampled_from([1, 3, 50, 1 << 18]),
       max_len=st.sampled_from([2, 8, 9, 16, 17, 24, 256, 4095]))
def test_warm_probe_gives_the_merged_ids(parts, max_entries, max_len):
    for name, table, model in _tables():
        want = _plain(table, parts)
        if model is not None:
            vocab, merges = model
            ids_of = reference.token_ids(vocab)
            assert want == [[ids_of[t] for t in reference.encode_pretoken(p, merges)] for p in parts]
        flat = [i for w in want for i in w]
        data = b"".join(parts)                  # the last piece ends at the end of the buffer
        enc = _encode.Encoder(table, max_entries=max_entries, max_cached_len=max_len)
        for _ in range(3):                      # cold, then warm (hits), then warm again
            assert enc.encode_pieces(data, _ends(parts)).tolist() == flat, name
        assert enc.cache_info()["entries"] <= max_entries


@SETTINGS
@given(seen=pieces(), parts=pieces())
def test_shared_and_own_cache_in_a_batch_give_the_merged_ids(seen, parts):
    """A batch job whose threads read a warm shared cache first, then their own."""
    for name, table, _ in _tables():
        shared = _encode.Encoder(table)
        shared.encode_pieces(b"".join(seen), _ends(seen))
        own = _encode.Encoder(table, max_entries=7)
        docs = [b"".join(parts), b"".join(seen + parts), b"".join(parts[::-1])]
        # the pre-tokenizer splits the documents itself: the uncached ids are those of an
        # encoder without a cache over the same text
        plain = _encode.Encoder(table, max_cached_len=0)
        want = [plain.encode_text(d, 0, len(d), 0, None)[0].tolist() for d in docs]
        for _ in range(2):
            job = _encode.BatchJob(docs, 0)
            job.run(own, shared)
            ids, offsets = job.collect()
            got = [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
            assert got == want, name
            shared.absorb_cache(own)


def test_keys_that_differ_only_in_the_last_tail_byte():
    """Thousands of keys with one 8-byte head, every length 9..40, differing in one tail byte:
    a cache that grows across them and a tiny one that is cleared give the merged ids."""
    for name, table, _ in _tables():
        parts = [b"abcdefgh" + bytes([97 + (k % 26)]) * (m - 9) + bytes([k % 256])
                 for m in range(9, 41) for k in range(0, 256, 5)]
        want = [i for w in _plain(table, parts) for i in w]
        data = b"".join(parts)
        for enc in (_encode.Encoder(table), _encode.Encoder(table, max_entries=2)):
            for _ in range(2):
                assert enc.encode_pieces(data, _ends(parts)).tolist() == want, name
        enc = _encode.Encoder(table)
        enc.encode_pieces(data, _ends(parts))
        assert enc.cache_info()["entries"] == len(set(parts))


def test_keys_that_differ_only_by_trailing_nul_bytes():
    """b"ab", b"ab\\0", b"ab\\0\\0", ... have one zero-padded head word: the length tells them apart."""
    for name, table, _ in _tables():
        parts = [b"ab" + b"\x00" * k for k in range(0, 30)] + [b"\x00" * k for k in range(1, 30)]
        parts = parts + parts[::-1]
        want = [i for w in _plain(table, parts) for i in w]
        enc = _encode.Encoder(table)
        for _ in range(2):
            assert enc.encode_pieces(b"".join(parts), _ends(parts)).tolist() == want, name


@pytest.mark.parametrize("n", [8, 9, 15, 16, 17, 24, 25])
def test_a_key_at_the_end_of_the_buffer(n):
    """The last piece ends exactly at the end of a buffer that is itself a slice of a larger array:
    its tail is compared byte by byte (never read past the end) and still matches."""
    for name, table, _ in _tables():
        piece = bytes(range(97, 97 + n))
        parts = [piece, b" ", piece]
        backing = np.frombuffer(b"".join(parts) + b"ZZZZZZZZ", np.uint8)
        data = backing[: sum(map(len, parts))]
        want = [i for w in _plain(table, parts) for i in w]
        enc = _encode.Encoder(table)
        for _ in range(2):
            assert enc.encode_pieces(data, _ends(parts)).tolist() == want, name
        assert enc.cache_info()["misses"] == 2          # the piece and b" ", once each


@pytest.mark.parametrize("n_pieces", [1, 31, 32, 33, 63, 64, 65, 97, 1000])
def test_the_block_edges_of_the_pipelined_lookups(n_pieces):
    """``_emit_pieces`` hashes a block of pieces ahead (``hash_block``) and probes the block
    before: piece counts on and around the block edges, keys of 1 to 8 bytes (probed inline)
    mixed with longer keys, empty pieces, pieces over ``max_cached_len`` and misses in mid-block
    (a cache of 3 entries, cleared as it fills; a stage-2 caller's ``starts`` aside) give the ids
    of each piece merged alone, cold and warm, shared cache or own."""
    import random

    rng = random.Random(n_pieces)
    pool = [b"", b"a", b" the", b"\x00", b"abcdefgh", b"abcdefghi", b" tokenizer", b"x" * 20,
            b"\xe2\x82\xac", b"  ", b"\n"]
    parts = [rng.choice(pool) if rng.random() < 0.7 else bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12)))
             for _ in range(n_pieces)]
    for name, table, _ in _tables():
        want = [i for w in _plain(table, parts) for i in w]
        data = b"".join(parts)
        for max_entries in (3, 1 << 18):
            for max_len in (8, 16):
                enc = _encode.Encoder(table, max_entries=max_entries, max_cached_len=max_len)
                for k in range(3):
                    assert enc.encode_pieces(data, _ends(parts)).tolist() == want, (name, max_entries, max_len)
                    if k == 0:
                        misses = enc.cache_info()["misses"]
                if max_entries > 1000:              # warm: every cached piece found where it was put
                    assert enc.cache_info()["misses"] == misses
        shared = _encode.Encoder(table)
        shared.encode_pieces(data, _ends(parts))
        job = _encode.BatchJob([data, data], 0)     # (pre-tokenized here: the uncached ids of it)
        job.run(_encode.Encoder(table, max_entries=3), shared)
        ids, offsets = job.collect()
        plain = _encode.Encoder(table, max_cached_len=0).encode_text(data, 0, len(data), 0, None)[0].tolist()
        assert ids.tolist() == plain + plain, name
