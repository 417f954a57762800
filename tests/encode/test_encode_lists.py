"""``TokenTable.split_lists`` (the lists of ``encode_batch``): equal to slicing the flat ids, and
every list is back in the cyclic garbage collector's care (built untracked, tracked at the end)."""
import gc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.encode import _encode


def _table(n=300):
    return _encode.TokenTable([bytes([i % 256]) * (1 + i // 256) for i in range(n)], max_ints=200)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 299), max_size=200), cuts=st.lists(st.integers(0, 200), max_size=30))
def test_split_lists_equal_slices(ids, cuts):
    arr = np.array(ids, dtype=np.uint32)
    offsets = np.array(sorted({0, len(ids), *[c for c in cuts if c <= len(ids)]}), dtype=np.int64)
    got = _table().split_lists(arr, offsets)
    assert got == [ids[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    assert all(type(x) is list and gc.is_tracked(x) for x in got)


def test_split_lists_are_collected_in_cycles():
    """A list of the batch that is made part of a cycle is freed by the collector."""
    lists = _table().split_lists(np.arange(3000, dtype=np.uint32) % 300, np.arange(0, 3001, 3, dtype=np.int64))
    assert len(lists) == 1000 and all(gc.is_tracked(x) for x in lists)
    probe = lists[500]
    probe.append(probe)                     # a cycle
    ref_count_before = len(gc.get_referrers(probe))
    del lists
    gc.collect()
    assert ref_count_before >= 1
    assert any(x is probe for x in gc.get_referrers(probe))   # still alive: referenced from itself and here
    del probe
    assert gc.collect() >= 1


def test_split_lists_refuses_bad_offsets():
    t = _table()
    ids = np.arange(5, dtype=np.uint32)
    for offsets in ([0, 6], [0, 3, 2, 5], [-1, 5]):
        try:
            t.split_lists(ids, np.array(offsets, dtype=np.int64))
        except ValueError:
            continue
        raise AssertionError(offsets)
    assert t.split_lists(ids, np.array([0], dtype=np.int64)) == []
