"""``TokenTable.split_lists`` (the lists of ``encode_batch``): equal to slicing the flat ids, and
every list is back in the cyclic garbage collector's care (built untracked, tracked at the end)."""
import gc
import sys

import numpy as np
import pytest
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


def _refcounts(table_ints):
    """The reference counts of a table's ints from 257 on (CPython's own small ints, shared with
    the rest of the process, change under the test)."""
    return [sys.getrefcount(o) for o in table_ints[257:]]


@settings(max_examples=30, deadline=None)
@given(n=st.sampled_from([1, 17, 4095, 4096, 4097, 20000]), seed=st.integers(0, 2**32 - 1),
       max_ints=st.sampled_from([1, 300, 600]))
def test_counted_references_of_a_long_list(n, seed, max_ints):
    """A list of 4,096 ids or more takes its ints' references counted, then added once an int
    (``int_counts``); a shorter one increfs each. Either way: the list equals the ids, each shared
    int holds one more reference per place it has in the list, none after the list is freed, and
    ids past the shared ints are ints of their own (also mid-list, around the counted ones)."""
    rng = np.random.default_rng(seed)
    t = _encode.TokenTable([bytes([i % 256]) * (1 + i // 256) for i in range(700)], max_ints=max_ints)
    ids = rng.integers(0, 700, n).astype(np.uint32)
    ids[rng.integers(0, n, max(1, n // 50))] = 699            # some past the shared ints
    shared = t.to_list(np.arange(t.n_ints, dtype=np.uint32))  # the table's own int objects
    before = _refcounts(shared)
    lst = t.to_list(ids)
    assert lst == ids.tolist()
    want = np.bincount(ids[ids < t.n_ints], minlength=t.n_ints)[257:]
    assert [a - b for a, b in zip(_refcounts(shared), before)] == want.tolist()
    assert all(lst[k] is shared[v] for k, v in enumerate(ids.tolist()) if v < t.n_ints)
    del lst
    assert _refcounts(shared) == before
    lst = t.to_list(ids)                                      # the counts went back to 0
    assert [a - b for a, b in zip(_refcounts(shared), before)] == want.tolist()


@pytest.mark.parametrize("n_ints", [4 * 4096 - 1, 4 * 4096, 4 * 4096 + 1])
@pytest.mark.parametrize("n", [4095, 4096, 4097])
def test_counted_references_around_the_share_of_the_ints(n, n_ints):
    """The counted references need a list of at least a quarter as many ids as there are shared
    ints (and 4,096): lists just below, at and above both thresholds give the ids, one reference
    more per place for each shared int, and none once the list is freed."""
    t = _encode.TokenTable([bytes([i % 256]) * (1 + i // 256) for i in range(n_ints + 300)], max_ints=n_ints)
    assert t.n_ints == n_ints
    rng = np.random.default_rng(n + n_ints)
    ids = rng.integers(0, n_ints + 300, n).astype(np.uint32)   # some past the shared ints
    shared = t.to_list(np.arange(t.n_ints, dtype=np.uint32))
    before = _refcounts(shared)
    lst = t.to_list(ids)
    assert lst == ids.tolist()
    want = np.bincount(ids[ids < n_ints], minlength=n_ints)[257:]
    assert [a - b for a, b in zip(_refcounts(shared), before)] == want.tolist()
    del lst
    assert _refcounts(shared) == before
