"""Folds write into the arrays of tables folded before (``merge_counts(out=)``, ``FoldBuffers``).

Whatever the arrays held, the merged table is the one new arrays get, on one thread and on two;
arrays without the room are not used. ``count_corpus`` hands the arrays of folded tables to the
next folds of chunk tables, and its table is the same for every worker count, chunk size and spill
threshold."""
from collections import Counter

import numpy as np
from hypothesis import given, settings, strategies as st

from bpe_core.pretok import counting
from bpe_core.pretok._pretok import merge_counts as kernel_merge, merge_room
from bpe_core.pretok.counting import FoldBuffers, count_corpus
from strategies import corpus_bytes

SPECIALS = [b"<|endoftext|>"]
WORDS = st.binary(max_size=20).map(lambda b: bytes(b"\0a\xff"[x % 3] for x in b)) | st.binary(max_size=6)


def as_table(counter: Counter) -> tuple:
    words = sorted(counter)
    offsets = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum([len(w) for w in words], out=offsets[1:])
    return np.frombuffer(b"".join(words), dtype=np.uint8), offsets, \
        np.array([counter[w] for w in words], dtype=np.int64)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.dictionaries(WORDS, st.integers(1, 2**40), max_size=20), max_size=6),
       st.integers(-3, 40), st.integers(0, 255), st.integers(1, 2))
def test_merge_into_used_arrays_is_the_fresh_merge(dicts, extra, fill, threads):
    """Arrays full of old bytes, exactly the room, more, or too short by a little."""
    tables = [as_table(Counter(d)) for d in dicts]
    want = kernel_merge(tables, threads, par_min_words=0)
    room = merge_room(sum(len(t[2]) for t in tables), sum(len(t[0]) for t in tables))
    room = (room[0] + 16, room[1] + 1, room[2]) if threads == 2 else room    # two threads: more room
    out = tuple(np.full(max(0, n + extra), fill, dtype) for n, dtype in zip(room, (np.uint8, np.int64, np.int64)))
    got = kernel_merge(tables, threads, par_min_words=0, out=out)
    for x, y in zip(want, got):
        assert np.array_equal(x, y) and x.dtype == y.dtype
    used = extra >= 0
    assert all(np.shares_memory(g, o) for g, o in zip(got, out) if len(g)) == used or not any(len(g) for g in got)
    if not used:
        assert not any(np.shares_memory(g, o) for g, o in zip(got, out))


def test_fold_buffers_hand_back_what_fits():
    f = FoldBuffers()
    small = (np.zeros(3, np.uint8), np.array([0, 1, 3]), np.array([1, 1]))
    a = f.take([small])
    f.give(a)
    assert f.take([small, small]) is a            # room for both (the headroom)
    f.give(a)
    big = (np.zeros(10**6, np.uint8), np.arange(0, 10**6 + 1, 1), np.ones(10**6, np.int64))
    b = f.take([big])                             # the free one is too short: dropped, a new one
    assert b is not a and len(b[1]) >= 10**6 + 1
    f.give(b)
    f.clear()
    assert f.take([small]) is not b


@settings(max_examples=20, deadline=None)
@given(corpus_bytes.filter(bool), st.sampled_from([1, 200, None]), st.sampled_from([1, 2]))
def test_count_corpus_reuses_fold_arrays(tmp_path_factory, data, threshold, workers):
    """Many chunks (folds of folded tables, folds of chunk tables after them, spills): the table is
    one worker's without spilling, and the folds of chunk tables after a fold of folded tables
    write into arrays handed back (when there were enough chunks for one)."""
    tmp = tmp_path_factory.mktemp("folds")
    path = tmp / "c.txt"
    path.write_bytes(data * 40)
    plain = count_corpus(str(path), SPECIALS, "gpt2", 1, 1 << 30).to_dict()
    given_back, reused = [], []
    take, give = FoldBuffers.take, FoldBuffers.give

    def spy_take(self, tables):
        out = take(self, tables)
        reused.append(any(out is g for g in given_back))
        return out

    def spy_give(self, arrays):
        given_back.append(arrays)
        give(self, arrays)
    FoldBuffers.take, FoldBuffers.give = spy_take, spy_give
    try:
        report = {"seconds": {}}
        got = count_corpus(str(path), SPECIALS, "gpt2", workers, 16, spill_threshold_bytes=threshold,
                           spill_dir=str(tmp), report=report).to_dict()
    finally:
        FoldBuffers.take, FoldBuffers.give = take, give
    assert got == plain
    if threshold is None and report["n_chunks"] >= 20:      # a fold of folded tables, then folds of chunks
        assert any(reused)
