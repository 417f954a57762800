"""The unit kernels against their plain equivalents (dict lookups, Counter, list expansion)."""
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.engine.units import ENCODED_MARK, RankMerger, UnitCounter, WordIndex, expand_units
from bpe_core import reference

word = st.binary(min_size=1, max_size=40)


@given(st.sets(word, max_size=40), st.lists(word, max_size=40))
def test_word_index_equals_a_dict(words, pieces):
    words = sorted(words)
    arena = np.frombuffer(b"".join(words), np.uint8)
    offsets = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    idx = WordIndex(arena, offsets)
    pieces = pieces + words[:5]
    buf = b"".join(pieces)
    ends = np.cumsum([len(p) for p in pieces]).astype(np.int64)
    expected = [{w: i for i, w in enumerate(words)}.get(p, -1) for p in pieces]
    assert idx.word_ids(buf, ends, 0).tolist() == expected


@given(st.lists(st.lists(st.integers(0, 5), max_size=6), max_size=30))
def test_unit_counter_equals_a_counter(units):
    ids = np.array([x for u in units for x in u], dtype=np.uint32)
    bounds = np.concatenate(([0], np.cumsum([len(u) for u in units]))).astype(np.int64)
    c = UnitCounter()
    c.add_units(ids, bounds)
    data, starts, counts = c.to_arrays()
    got = Counter({tuple(data[starts[k]:starts[k + 1]].tolist()): int(counts[k]) for k in range(len(counts))})
    assert got == Counter(tuple(u) for u in units if len(u) >= 1)
    c2 = UnitCounter()
    c2.add_table(data, starts, counts)
    c2.add_table(data, starts, counts)
    assert sorted(c2.to_arrays()[2].tolist()) == sorted((2 * counts).tolist())


def test_expand_units():
    syms, offs = expand_units(np.array([1, 0, 1], np.uint32), np.array([0, 2, 3]),
                              np.array([7, 8, 9], np.uint32), np.array([0, 2, 3]))
    assert syms.tolist() == [9, 7, 8, 9] and offs.tolist() == [0, 3, 4]


def test_expand_units_narrow():
    """``narrow``: the same units as uint16; a symbol over 0xFFFF or an ``ENCODED_MARK`` is refused."""
    data, starts = np.array([1, 0, 1], np.uint32), np.array([0, 2, 3])
    syms, offs = expand_units(data, starts, np.array([7, 8, 0xFFFF], np.uint32), np.array([0, 2, 3]), narrow=True)
    assert syms.dtype == np.uint16 and syms.tolist() == [0xFFFF, 7, 8, 0xFFFF] and offs.tolist() == [0, 3, 4]
    with pytest.raises(ValueError, match="uint16"):
        expand_units(data, starts, np.array([7, 8, 0x10000], np.uint32), np.array([0, 2, 3]), narrow=True)
    with pytest.raises(ValueError, match="ENCODED_MARK"):
        expand_units(np.array([1, ENCODED_MARK], np.uint32), np.array([0, 2]), np.array([7, 8, 9], np.uint32),
                     np.array([0, 2, 3]), narrow=True)


@given(st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.sampled_from([b"a", b"b", b"c"])),
                min_size=1, max_size=12), st.binary(max_size=60).map(lambda b: bytes(97 + x % 3 for x in b)))
def test_rank_merger_replays_merges_like_the_reference(pairs, text):
    # a merge list over a growing alphabet (parts may be earlier results), as training produces
    tokens = [b"a", b"b", b"c"]
    merges = []
    for k, (x, y) in enumerate(pairs):
        x, y = tokens[(k + len(x)) % len(tokens)], tokens[(3 * k + len(y)) % len(tokens)]
        merges.append((x, y))
        tokens.append(x + y)
    # canonical ids: one per distinct bytes, first come first served (as the vocabulary's smaller id)
    ids_of = {t: i for i, t in enumerate(dict.fromkeys([bytes([i]) for i in range(256)] + [a + b for a, b in merges]))}
    m = RankMerger(np.array([ids_of[a] for a, _ in merges], np.uint32), np.array([ids_of[b] for _, b in merges], np.uint32),
                   np.array([ids_of[a + b] for a, b in merges], np.uint32))
    got = m.merge(np.frombuffer(text, np.uint8).astype(np.uint32)).tolist() if text else []
    expected = [ids_of[p] for p in reference.encode_pretoken(text, merges)] if text else []
    assert got == expected
