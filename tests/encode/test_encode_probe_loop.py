"""The C loops of ``_emit_pieces``: ``bpe_enc_hash_block`` fills a ring entry per piece (head word,
second word, hash, length; pieces of up to 16 bytes hashed without a branch on their length where
16 bytes past the block's end are readable) and ``bpe_enc_probe_block`` probes the block's keys of
1 to 16 bytes from those entries alone, leaving a key with more than 4 ids (its tail after them in
the arena) to a careful probe out of the loop, and every other piece to ``_emit_slow``.

Each test compares with each piece merged alone without a cache (``max_cached_len=0``), and a
warm pass must add no miss (a piece hashed by the block loop is found where the insert's
``_key_hash`` put it).
"""
import numpy as np
import pytest

from bpe_core.encode import _encode

from encode_helpers import gpt2_tokenizer

# bytes GPT-2 merges with nothing around them (each piece of them is one id a byte)
LONE = [b"\x00", b"\x01", b"\x02", b"\x03", b"\x10", b"\x11", b"\x7f"]


def _ends(parts):
    return np.cumsum([len(p) for p in parts]).astype(np.int64)


def _plain(table, parts):
    enc = _encode.Encoder(table, max_cached_len=0)
    return [i for p in parts for i in enc.encode_piece(p)]


def _warm_and_cached(table, parts):
    """``parts`` encoded three times by one encoder (cold, then warm) as each piece alone, and
    each distinct piece cached once."""
    want = _plain(table, parts)
    enc = _encode.Encoder(table, max_entries=1 << 18)
    data = b"".join(parts)
    for _ in range(3):
        assert enc.encode_pieces(data, _ends(parts)).tolist() == want
    assert enc.cache_info()["entries"] == len(set(parts))


def _at_end(data: bytes) -> np.ndarray:
    """``data`` as a slice of a larger array: the encoder's buffer ends where the slice does, and
    the bytes after it are not zero (a load past the end that was not masked would change a key)."""
    backing = np.frombuffer(data + b"ZZZZZZZZZZZZZZZZ", np.uint8)
    return backing[: len(data)]


@pytest.mark.parametrize("n", list(range(5, 17)))
def test_short_keys_with_more_than_four_ids(n):
    """Keys of 5 to 16 bytes of one id a byte (their ids in the arena, their tail after them):
    found warm by the careful probe, each its own ids, in mid-buffer, in the last block and as
    the very last piece; keys of the same head and length that differ in the last byte stay
    apart."""
    table = gpt2_tokenizer()._table
    keys = [b"".join(LONE[(k + j) % len(LONE)] for j in range(n - 1)) + bytes([k]) for k in range(0, 8)]
    plain = _encode.Encoder(table, max_cached_len=0)
    assert all(len(plain.encode_piece(k)) > 4 for k in keys)          # the case under test
    filler = [b" the", b" a", b"b", b" tokenizer"]
    parts = []
    for r in range(40):
        parts += [keys[r % len(keys)], filler[r % len(filler)]]
    parts += keys                                                    # the last one ends the buffer
    want = _plain(table, parts)
    data = b"".join(parts)
    for buf in (data, _at_end(data)):
        enc = _encode.Encoder(table, max_entries=1 << 18)
        assert enc.encode_pieces(buf, _ends(parts)).tolist() == want
        misses = enc.cache_info()["misses"]
        for _ in range(2):
            assert enc.encode_pieces(buf, _ends(parts)).tolist() == want
        assert enc.cache_info()["misses"] == misses
    # a text encode of the same: the ids of tiktoken's split, warm as cold
    enc = _encode.Encoder(table)
    cold = enc.encode_text(data, 0, len(data), 0, None)[0].tolist()
    assert enc.encode_text(data, 0, len(data), 0, None)[0].tolist() == cold
    assert _encode.Encoder(table, max_cached_len=0).encode_text(data, 0, len(data), 0, None)[0].tolist() == cold


@pytest.mark.parametrize("n", list(range(1, 18)))
def test_every_short_length_at_every_distance_from_the_end(n):
    """A key of n bytes followed by 0 to 20 bytes of one more piece: the block's last end is at
    every distance from the buffer's end around the 16 readable bytes the branch-free hashing
    needs, so the block is hashed by the loop or the careful step; both hash as the insert did
    (no miss warm), put alone or in the block."""
    table = gpt2_tokenizer()._table
    key = b"ab\xc3\xa9xyzuvwqrstopq"[:n]
    for pad in range(0, 21):
        parts = [b" x", key] * 3 + ([b"\x00" * pad] if pad else [])
        want = _plain(table, parts)
        data = b"".join(parts)
        alone = _encode.Encoder(table, max_entries=1 << 18)
        for p in set(parts):                             # the insert's hash (_key_hash)
            alone.encode_pieces(p, np.array([len(p)], np.int64))
        misses = alone.cache_info()["misses"]
        for buf in (data, _at_end(data)):
            assert alone.encode_pieces(buf, _ends(parts)).tolist() == want, pad
        assert alone.cache_info()["misses"] == misses, pad


def test_keys_that_differ_only_in_the_second_word():
    """Keys of 9 to 16 bytes with one head word, differing only in their second word (its first
    or last byte, or by a trailing NUL): the probe's compare of the ring's second word tells them
    apart."""
    table = gpt2_tokenizer()._table
    parts = []
    for n in range(9, 17):
        for k in (0, 1, 97, 255):
            base = bytearray(b"abcdefgh" + b"z" * (n - 8))
            base[8] = k
            parts.append(bytes(base))
            base = bytearray(b"abcdefgh" + b"z" * (n - 8))
            base[-1] = k
            parts.append(bytes(base))
        parts.append(b"abcdefgh" + b"z" * (n - 9) + b"\x00")
    parts = parts * 3
    _warm_and_cached(table, parts)


def test_many_keys_of_one_head_and_length():
    """Some 3,000 keys of 12 bytes with one head word and at most 4 ids (the probe loop's own
    case), differing only in their second word, in one table: probes pass over slots of the same
    head and length, and only the second word's compare keeps a probe from taking a neighbour's
    ids."""
    import itertools

    table = gpt2_tokenizer()._table
    plain = _encode.Encoder(table, max_cached_len=0)
    parts = []
    for tail in itertools.product(b"aeiostnr", repeat=4):
        key = b" interna" + bytes(tail)
        if len(plain.encode_piece(key)) <= 4:
            parts.append(key)
    assert len(parts) > 2500
    _warm_and_cached(table, parts)


def test_stage_aware_encoding_of_short_keys_with_many_ids(tmp_path):
    """SuperBPE's native encoder asks ``_emit_pieces`` where each pretoken's ids start
    (``starts``): keys of 5 to 16 bytes with more than 4 ids (the careful probe) among short
    ones, cold and warm, give the plain path's ids."""
    import bpe_core
    from bpe_core.methods.superbpe import StageAwareEncoder

    rng = np.random.default_rng(5)
    words = [b" the", b" cat", b" sat", b"the", b"\n", b" on", b" mat", b".", b" a"]
    corpus = b"".join(words[i] for i in rng.integers(0, len(words), 4000))
    path = tmp_path / "c.txt"
    path.write_bytes(corpus)
    r = bpe_core.train(bpe_core.TrainConfig(str(path), 300, method="superbpe", transition=280, num_workers=1))
    enc = StageAwareEncoder(r.model)
    assert enc.native is not None
    odd = [b"~`|^~`|^~`|^~`|^"[:n] for n in range(5, 17)] + [b"".join(LONE[: n % 7 + 1]) * 2 for n in range(5, 17)]
    data = b"".join(odd[i % len(odd)] + words[i % len(words)] for i in range(300))
    # warm from the text shifted by a pretoken or two, so that where each pretoken's ids start
    # differs from the cold call's (a start left unwritten would keep the cold call's value)
    for text in (data, b"\n" + data, b" on." + data, data):
        assert enc.encode(text) == enc.encode_python(text)


def _piece_strategy():
    from hypothesis import strategies as st

    lone = st.integers(1, 16).map(lambda n: b"".join(LONE[j % len(LONE)] for j in range(n)))  # > 4 ids from 5
    word = st.sampled_from([b" the", b" a", b"b", b" tokenizer", b"\n", b".", b" ", b"123"])
    text = st.binary(min_size=1, max_size=40)                      # longer keys, uncached lengths
    return st.lists(st.one_of(lone, word, text), min_size=1, max_size=120)


def _check_starts(enc, table, parts):
    want = [enc_piece for enc_piece in (_encode.Encoder(table, max_cached_len=0).encode_piece(p) for p in parts)]
    want_starts = np.cumsum([0] + [len(w) for w in want[:-1]]).tolist()
    for buf in (b"".join(parts), _at_end(b"".join(parts))):
        for _ in range(3):                                         # cold, then warm (each path)
            ids, starts = enc._pieces_with_starts(buf, _ends(parts))
            assert ids.tolist() == [i for w in want for i in w]
            assert starts.tolist() == want_starts


def test_starts_of_every_path():
    """Where each pretoken's ids start (what SuperBPE's stage 2 cuts its units at), written by each
    path of ``_emit_pieces``: keys of 1 to 16 bytes found by the C loop, keys of 5 to 16 bytes with
    more than 4 ids (the careful probe out of the loop), longer cached keys, pieces longer than
    the cache takes (``_emit_slow``), in mid-buffer and as the buffer's last pieces; each call's
    starts begin as -1, so one left unwritten fails here even where stage 2's ids would not."""
    table = gpt2_tokenizer()._table
    keys = [b"".join(LONE[(k + j) % len(LONE)] for j in range(n)) for k in range(3) for n in range(1, 17)]
    long_piece = b" " + b"x" * 300                                  # past max_cached_len: merged each time
    parts = []
    for r in range(6):
        parts += keys[r::6] + [b" the", b" tokenizer" * 3, long_piece, b"\n"]
    parts += keys                                                  # the last ones end the buffer
    _check_starts(_encode.Encoder(table, max_entries=1 << 18, max_cached_len=64), table, parts)


def test_starts_of_random_pieces():
    """The starts of random mixes of short keys with many ids, common words and random bytes (any
    length, cold and warm) are the running sums of each piece's ids."""
    from hypothesis import given, settings

    table = gpt2_tokenizer()._table

    @settings(max_examples=150, deadline=None)
    @given(parts=_piece_strategy())
    def run(parts):
        _check_starts(_encode.Encoder(table, max_entries=1 << 18, max_cached_len=24), table, parts)

    run()
