"""The numpy-free path of a small run (``pretok.counting._count_plain``): ``array.array`` tables are
the numpy path's tables item for item: ``count_pretokens(numpy=False)``, ``split_spans(numpy=False)``,
the kernels ``table_sums`` and ``drop_one_byte_words`` (against their numpy equivalents), and
``WordTable`` on either kind; ``formats.texts._gpt2_joined`` (no numpy) against the uint16-table
version it replaced."""
import array

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bpe_core.corpus.chunks import split_spans
from bpe_core.formats import texts
from bpe_core.pretok import _pretok
from bpe_core.pretok.pretokenize import count_pretokens
from bpe_core.pretok.wordtable import WordTable
from strategies import SPECIAL, corpus_bytes

SPECIALS = [SPECIAL.encode()]


def _flat_view(flat):
    return memoryview(flat).cast("B").cast("q", (len(flat) // 2, 2))


@settings(max_examples=150, deadline=None)
@given(corpus_bytes, st.sampled_from(["gpt2", "cl100k", "o200k"]), st.booleans())
def test_plain_tables_are_the_numpy_tables(data, pattern, specials):
    specials = SPECIALS if specials else []
    spans, n = split_spans(data, 0, len(data), specials)
    flat, n_plain = split_spans(data, 0, len(data), specials, numpy=False)
    assert n_plain == n and isinstance(flat, array.array) and flat.tolist() == spans.reshape(-1).tolist()
    want = count_pretokens(data, spans, pattern)
    if not flat:
        return
    got = count_pretokens(bytearray(data), _flat_view(flat), pattern, numpy=False)
    assert [type(a) for a in got] == [array.array] * 3 and [a.typecode for a in got] == ["B", "q", "q"]
    for g, w in zip(got, want):
        assert g.tolist() == w.tolist()
    # the totals and the table without its one-byte words, on both kinds
    arena, offsets, counts = want
    lengths = np.diff(offsets)
    expect = (int(counts.sum()), int(np.dot(lengths, counts)), int(np.count_nonzero(lengths == 1)))
    assert _pretok.table_sums(offsets, counts) == _pretok.table_sums(got[1], got[2]) == expect
    plain, numpy = WordTable(*got), WordTable(*want)
    assert (plain.n_words, plain.n_pretokens, plain.one_byte_words, plain.nbytes) == \
        (numpy.n_words, numpy.n_pretokens, numpy.one_byte_words, numpy.nbytes)
    assert not plain.mapped
    kept_plain, kept_numpy = plain.without_singletons(), numpy.without_singletons()
    assert kept_plain.to_dict() == kept_numpy.to_dict()
    for g, w in zip((kept_plain.arena, kept_plain.offsets, kept_plain.counts),
                    (kept_numpy.arena, kept_numpy.offsets, kept_numpy.counts)):
        assert list(g) == w.tolist()


def test_the_kernels_check_their_tables():
    with pytest.raises(ValueError, match="offsets"):
        _pretok.table_sums(array.array("q", [0, 1]), array.array("q", [1, 2]))
    with pytest.raises(ValueError, match="outside the arena"):
        _pretok.drop_one_byte_words(b"ab", array.array("q", [0, 1, 3]), array.array("q", [1, 2]))
    assert _pretok.drop_one_byte_words(b"abcd", array.array("q", [0, 2, 4]), array.array("q", [1, 2])) is None
    assert _pretok.table_sums(array.array("q", [0]), array.array("q")) == (0, 0, 0)
    with pytest.raises(ValueError, match="record"):
        _pretok.count_pretokens(b"ab", np.array([[0, 2]]), 0, record=True, numpy=False)


def _gpt2_joined_numpy(tokens, seps):
    """The version before (a uint16 table, UTF-16 decode)."""
    code = np.array([ord(c) for c in texts._decoding_table()], dtype=np.uint16)
    lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    blob = np.frombuffer(b"".join(tokens), dtype=np.uint8)
    out = np.empty(blob.size + len(tokens), dtype="<u2")
    ends = np.cumsum(lengths + 1) - 1
    chars = np.ones(out.size, dtype=bool)
    chars[ends] = False
    out[chars] = code[blob]
    for j, sep in enumerate(seps):
        out[ends[j::len(seps)]] = sep
    return out.tobytes().decode("utf-16-le")


tokens = st.lists(st.one_of(st.binary(max_size=6), st.binary(max_size=4).map(lambda b: bytes(x % 3 for x in b))),
                  max_size=60)


@settings(max_examples=300, deadline=None)
@given(tokens, st.sampled_from([(0,), (0x20, 0x0A)]))
def test_gpt2_joined_is_the_numpy_version(toks, seps):
    if len(toks) % len(seps):
        toks = toks + [b"x"]
    assert texts._gpt2_joined(toks, seps) == _gpt2_joined_numpy(toks, seps)


def test_gpt2_joined_without_a_free_byte_value_and_on_a_vocabulary():
    every = [bytes([i]) for i in range(256)] + [b"\x00\xff", b" the"]
    for seps in ((0,), (0x20, 0x0A)):
        assert texts._gpt2_joined(every, seps) == _gpt2_joined_numpy(every, seps)
    assert texts._free_byte_values(bytes(range(255)), 1) == [255]
    assert texts._free_byte_values(bytes(range(255)), 2) is None
    assert sorted(texts._MARK_ORDER) == list(range(256))
