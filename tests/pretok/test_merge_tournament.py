"""``merge_counts``' tournament of losers equals ``collections.Counter`` on hostile tables.

The merge plays a tournament over its runs (leaves padded to a power of two with runs that have no
word, a finished run's keys set to all ones), writes each short word as two 8-byte stores of its
zero-padded head into the room past the table, and on two threads cuts every run at a pivot word.
Each test compares the merged table with the sum of ``Counter``s, in Python ``bytes`` order, on one
thread and on two (every size split), and the two arrays byte for byte: any number of tables
(1 to 40: full and ragged trees), empty tables, one table, every table the same words, words made
of 0xFF bytes (whose keys equal a finished run's), words sharing their first 16 bytes, words at the
pivot and on either side of it, and counts whose sums come near the int64 limit.
"""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.pretok._pretok import merge_counts as kernel_merge

MAX_EXAMPLES = int(os.environ.get("BPE_CORE_MAX_EXAMPLES", "200"))
INT64_MAX = 2**63 - 1


def as_table(counter: Counter) -> tuple:
    words = sorted(counter)
    offsets = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum([len(w) for w in words], out=offsets[1:])
    return np.frombuffer(b"".join(words), dtype=np.uint8), offsets, \
        np.array([counter[w] for w in words], dtype=np.int64)


def rows(table) -> list[tuple[bytes, int]]:
    arena, offsets, counts = table
    assert arena.dtype == np.uint8 and offsets.dtype == np.int64 and counts.dtype == np.int64
    assert len(offsets) == len(counts) + 1 and offsets[0] == 0 and offsets[-1] == len(arena)
    return [(arena[offsets[i]:offsets[i + 1]].tobytes(), int(counts[i])) for i in range(len(counts))]


def check(dicts: list[dict]) -> None:
    """One thread and two (``par_min_words=0``: every merge is split) give the Counter's sum, in
    bytes order, and the same arrays."""
    want = Counter()
    for d in dicts:
        want.update(d)
    tables = [as_table(Counter(d)) for d in dicts]
    one = kernel_merge(tables)
    two = kernel_merge(tables, threads=2, par_min_words=0)
    assert rows(one) == sorted(want.items())
    for x, y in zip(one, two):
        assert np.array_equal(x, y) and len(x) == len(y)


#: hostile words: a tiny alphabet with NUL and 0xFF (words that differ only in trailing NULs, 8 and
#: 16-byte runs of 0xFF whose keys are all ones), and long words sharing a 16-byte head
_HEAD = b"\xff" * 8 + b"head\x00\x01\xfe\xff"
WORDS = (st.binary(max_size=20).map(lambda b: bytes(b"\0\1a\xfe\xff"[x % 5] for x in b))
         | st.binary(max_size=24).map(lambda b: _HEAD + bytes(x % 3 for x in b))
         | st.sampled_from([b"", b"\xff" * 8, b"\xff" * 16, b"\xff" * 17, b"\xff" * 15, b"\xff" * 16 + b"\0"])
         | st.binary(max_size=6))


@settings(max_examples=MAX_EXAMPLES)
@given(st.lists(st.dictionaries(WORDS, st.integers(1, 2**40), max_size=15), max_size=40))
def test_any_number_of_tables_equals_counter(dicts):
    """0 to 40 tables: a tournament of 1 to 64 leaves, most of them padded."""
    check(dicts)


@settings(max_examples=MAX_EXAMPLES)
@given(st.dictionaries(WORDS, st.integers(1, 2**20), max_size=30), st.integers(1, 33))
def test_every_table_the_same_words(d, k):
    """Every run holds the same words: every match is a tie, broken by the run index."""
    check([d] * k)


@settings(max_examples=MAX_EXAMPLES)
@given(st.lists(st.dictionaries(WORDS, st.integers(1, 9), max_size=20), min_size=1, max_size=9),
       st.lists(st.integers(0, 8), max_size=12))
def test_empty_tables_among_others(dicts, holes):
    """Tables without a word anywhere among the others (and only empty ones)."""
    for h in holes:
        dicts.insert(h % (len(dicts) + 1), {})
    check(dicts)
    check([{}] * len(holes))
    check([dicts[0]])


@settings(max_examples=MAX_EXAMPLES)
@given(st.lists(st.binary(min_size=1, max_size=12), min_size=1, max_size=30), st.integers(1, 6), st.data())
def test_words_at_and_beside_the_pivot(words, k, data):
    """Two threads cut every run at the middle word of the longest: tables holding that word, its
    prefixes, its extensions by NUL and 0xFF, and the words just below and above it, so that copies
    of a word sit on both sides of each cut unless the cut keeps them together."""
    longest = sorted(set(words))
    pivot = longest[len(longest) // 2]
    near = [pivot, pivot[:-1], pivot + b"\0", pivot + b"\xff", pivot[:-1] + bytes([max(pivot[-1] - 1, 0)]),
            pivot[:-1] + bytes([min(pivot[-1] + 1, 255)])]
    others = [{w: data.draw(st.integers(1, 5)) for w in data.draw(st.lists(st.sampled_from(near + longest),
                                                                        max_size=8))}
              for _ in range(k)]
    check([{w: 1 for w in longest}] + others)
    check(others + [{w: 2 for w in longest}])


@settings(max_examples=MAX_EXAMPLES)
@given(st.lists(st.dictionaries(WORDS, st.integers(0, 2**62), min_size=1, max_size=8), min_size=1, max_size=8))
def test_counts_near_the_int64_limit(dicts):
    """Counts up to 2**62 scaled so that every sum fits in int64 (the largest ones exactly at the
    limit): summed exactly, as Python's integers."""
    total = Counter()
    for d in dicts:
        total.update(d)
    biggest = max(total.values()) or 1
    if biggest > INT64_MAX:
        dicts = [{w: c * (INT64_MAX // len(dicts)) // biggest for w, c in d.items()} for d in dicts]
    dicts = [{w: c for w, c in d.items() if c > 0} or {b"x": 1} for d in dicts]
    check(dicts)
    share = INT64_MAX // len(dicts)
    check([{b"w": share, **d} for d in dicts])


def test_long_words_sharing_heads_and_large_tables():
    """Words longer than 16 bytes that share their head (the tail bytes decide), words that are
    prefixes of others, and tables large enough for the default two-thread threshold and for the
    prefetch ahead of each run."""
    heads = [b"\xff" * 16, b"a" * 16, b"\0" * 16]
    words = [h + t for h in heads for t in (b"", b"\0", b"\0\0", b"\x01", b"\xff" * 40, b"b" * 3)]
    check([{w: 1 for w in words[::2]}, {w: 2 for w in words[1::2]}, {w: 3 for w in words}])
    rng = np.random.default_rng(11)
    big = [{int(x).to_bytes(5, "big").lstrip(b"\0") or b"\0": int(c)
            for x, c in zip(rng.integers(0, 1 << 36, 30_000), rng.integers(1, 1000, 30_000))}
           for _ in range(5)]
    big.append({w: 1 for d in big[:2] for w in d})
    check(big)
    tables = [as_table(Counter(d)) for d in big]
    want = Counter()
    for d in big:
        want.update(d)
    assert rows(kernel_merge(tables, threads=2)) == sorted(want.items())
