"""The rank table's two layouts: 8-byte slots (``narrow``: every id below 2^21 - 1 and every rank
below 2^22 - 1) and 16-byte slots (larger ids or ranks). Both give the same ranks and the same
encodings; a large id that only a byte or a merge result has (never a stored pair) still forces
the wide layout, since a truncated query key could alias a stored pair."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.encode import _encode
from bpe_core.encode.tokenizer import Tokenizer
from encode_helpers import SETTINGS, gpt2_tokenizer, merge_lists

BIG = 1 << 21


def _arrays(merges):
    """The rank-table arrays (as ``Tokenizer`` builds them) of a 3-letter merge list."""
    vocab = {i: bytes([i]) for i in range(256)}
    for a, b in merges:
        vocab[len(vocab)] = a + b
    tok = Tokenizer(vocab, merges, pattern=r"[abc]+")
    return tok._rank_arrays


def _shift(arrays, at):
    """The same arrays with every id >= ``at`` moved up by BIG (past the narrow layout's ids)."""
    return [np.where((a >= at) & (a != 0xFFFFFFFF), a + BIG, a).astype(np.uint32) for a in arrays]


def test_gpt2_is_narrow():
    assert gpt2_tokenizer()._table.narrow


@SETTINGS
@given(merge_lists(30), st.lists(st.text("abc", min_size=1, max_size=60), min_size=1, max_size=6),
       st.sampled_from([0, 98, 256]))
def test_wide_and_narrow_agree(merges, texts, at):
    """Ids >= ``at`` moved past 2^21 (``at`` 0 or 98: the byte ``b`` too, so a query pair holds a
    large id that no stored pair has; 256: only merged tokens) give the wide layout and the same
    ranks and ids as the narrow one (a narrow table that truncated the large ids would find
    ``(a, b)``'s rank for pairs that only share its low bits)."""
    arrays = _arrays(merges)
    narrow = _encode.RankTable(*arrays)
    wide_arrays = _shift(arrays, at)
    wide = _encode.RankTable(*wide_arrays)
    assert narrow.narrow and not wide.narrow
    up = lambda i: i + BIG if i >= at else i
    ids = sorted(set(arrays[3].tolist()) | set(arrays[2].tolist()))
    for left in ids:
        for right in ids:
            want = narrow.lookup(left, right)
            got = wide.lookup(up(left), up(right))
            assert got == (None if want is None else (want[0], up(want[1])))
    enc_n, enc_w = _encode.Encoder(narrow), _encode.Encoder(wide)
    for text in texts:
        data = text.encode()
        for method in ("scan", "heap"):
            assert enc_w.encode_piece(data, method) == [up(i) for i in enc_n.encode_piece(data, method)]


def test_truncated_ids_do_not_alias():
    """``a`` (97) + BIG truncates to 97: a narrow table would take ``(a + BIG, a)`` for ``(a, a)``."""
    lefts, rights, merged = (np.array([97], np.uint32) for _ in range(3))
    merged[0] = 256
    byte_ids = np.arange(256, dtype=np.uint32)
    byte_ids[98] = 97 + BIG                     # the byte b has a large id, in no stored pair
    t = _encode.RankTable(lefts, rights, merged, byte_ids)
    assert not t.narrow
    assert t.lookup(97, 97) == (0, 256) and t.lookup(97 + BIG, 97) is None
    assert _encode.Encoder(t).encode_piece(b"ba") == [97 + BIG, 97]


def test_reference_on_both_layouts():
    merges = [(b"a", b"b"), (b"ab", b"c"), (b"c", b"a"), (b"abc", b"abc")]
    arrays = _arrays(merges)
    vocab = {i: bytes([i]) for i in range(256)}
    for a, b in merges:
        vocab[len(vocab)] = a + b
    ids_of = reference.token_ids(vocab)
    want = [ids_of[p] for p in reference.encode_pretoken(b"abcabcab", merges)]
    assert _encode.Encoder(_encode.RankTable(*arrays)).encode_piece(b"abcabcab") == want
    wide = _encode.RankTable(*_shift(arrays, 0))
    assert [i - BIG for i in _encode.Encoder(wide).encode_piece(b"abcabcab")] == want
