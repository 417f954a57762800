"""count_pretokens(..., record=True): the same word table, plus the row of every pretoken in order.

The truth for the ids is the plain pretokenizer (``pretokenize`` / ``pretoken_ends``, themselves
proven equal to ``regex`` in test_pretokenize.py): the k-th pretoken of the spans, read in order,
must be the bytes of row ``ids[k]`` of the table.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.corpus.chunks import split_spans
from bpe_core.pretok import _pretok
from bpe_core.pretok.patterns import PATTERNS
from bpe_core.pretok.pretokenize import count_pretokens, pretoken_ends, pretokenize

NAMES = list(PATTERNS)  # gpt2, cl100k, o200k
SPECIAL = b"<|endoftext|>"
USER_PATTERN = r"""\p{L}+|\p{N}|[^\s\p{L}\p{N}]+|\s+"""

# Words, spaces, newlines, digits, punctuation, contractions, non-ASCII letters and marks, emoji,
# invalid UTF-8 (lone continuation bytes, cut sequences, encoded surrogates), special tokens and
# fragments of them.
PIECES = [b"the", b"The", b" cat", b"HELLO", b"a", b"x" * 20, b" ", b"  ", b"\t", b"\n", b"\n\n",
          b"\r\n", b" \n", b"0", b"12", b"34567", b"'s", b"'LL", b"'ve", b"'", b".", b",!?", b"--",
          b"/", "é".encode(), "日本".encode(), "я".encode(), "\u0301".encode(), "\u00a0".encode(),
          "٣".encode(), "😀".encode(), b"\x80", b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80",
          SPECIAL, SPECIAL, b"<|", b"|>"]
texts = st.one_of(st.lists(st.sampled_from(PIECES), max_size=60).map(b"".join),
                  st.binary(max_size=80))


def rows(arena, offsets) -> list[bytes]:
    return [arena[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]


def span_pieces(data: bytes, spans: np.ndarray, pattern: str) -> list[bytes]:
    """The pretokens of every span in order, from the plain ``pretoken_ends``."""
    out = []
    for a, b in spans.tolist():
        text = data[a:b]
        ends = pretoken_ends(text, pattern).tolist()
        out += [text[s:e] for s, e in zip([0] + ends[:-1], ends)]
    return out


def check_record(data: bytes, spans: np.ndarray, pattern: str) -> list[bytes]:
    """record=True gives the record=False table and ids naming each pretoken in order."""
    plain = count_pretokens(data, spans, pattern)
    ends = np.full(len(spans), -1, dtype=np.int64)
    arena, offsets, counts, ids = count_pretokens(data, spans, pattern, record=True, span_ends=ends)
    # where each span's pretokens end in the ids
    assert ends.tolist() == np.cumsum([len(span_pieces(data, spans[k:k + 1], pattern))
                                       for k in range(len(spans))], dtype=np.int64).tolist()
    for got, want in zip((arena, offsets, counts), plain):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert ids.dtype == np.uint32 and ids.ndim == 1
    assert ids.size == counts.sum()
    assert np.array_equal(np.bincount(ids, minlength=len(counts)), counts)
    words = rows(arena, offsets)
    got = [words[i] for i in ids.tolist()]
    assert got == span_pieces(data, spans, pattern)
    # by entry: the words numbered in the order first seen, each number's row given
    *table, entries, id_rows = count_pretokens(data, spans, pattern, record=True, by_entry=True)
    for got_a, want in zip(table, plain):
        assert np.array_equal(got_a, want)
    assert entries.dtype == id_rows.dtype == np.uint32 and id_rows.size == counts.size
    assert id_rows[entries].tolist() == ids.tolist()
    if entries.size and pattern in NAMES:   # numbered as first seen (the native scanners; a custom
        # regex numbers them in table order): a word not seen before takes the next number
        most = np.maximum.accumulate(entries.astype(np.int64))
        assert entries[0] == 0 and np.all(entries[1:] <= most[:-1] + 1) and most[-1] == counts.size - 1
    return got


@given(texts, st.lists(st.integers(0, 200), max_size=3))
def test_record_matches_pretokenize(data, empties):
    """Spans between special tokens (as the trainer cuts them), plus some spans with no text."""
    spans, _ = split_spans(data, 0, len(data), [SPECIAL])
    for e in empties:  # empty spans anywhere in the list
        p = e % (len(data) + 1)
        spans = np.insert(spans, e % (len(spans) + 1), [p, p], axis=0)
    for pattern in NAMES:
        got = check_record(data, spans, pattern)
        # The whole-text pretokenizer, special tokens split off: the same pieces in the same order.
        assert got == [p for p in pretokenize(data, pattern, [SPECIAL]) if p != SPECIAL]


@given(texts, st.lists(st.integers(0, 200), max_size=6))
def test_record_arbitrary_cuts(data, cuts):
    """Spans cut anywhere (inside UTF-8 sequences too); the regex path (a custom pattern) as well."""
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    spans = np.array(list(zip(bounds[:-1], bounds[1:])), dtype=np.int64).reshape(-1, 2)
    for pattern in NAMES + [USER_PATTERN]:
        check_record(data, spans, pattern)


def test_record_hash_table_growth():
    """200k distinct words (the table doubles from 16k slots many times), words over 16 bytes."""
    words = [f"w{i:x}" for i in range(200_000)] + ["y" * 16 + f"{i}" for i in range(3000)]
    data = (" ".join(words) + SPECIAL.decode() + " ".join(words[::7])).encode()
    spans, _ = split_spans(data, 0, len(data), [SPECIAL])
    for pattern in NAMES:
        check_record(data, spans, pattern)


def test_record_front_cache():
    """The record's front cache (a recent word of up to 15 bytes found by its key): a Zipf draw of
    short and long words (14, 15, 16 and 17 bytes: the edge of the cache) over a text large enough
    for the full cache and small enough for many evictions; every id names its pretoken."""
    rng = np.random.default_rng(7)
    vocab = [f"{'z' * (i % 18)}{i}" for i in range(5000)] + ["a" * n for n in (13, 14, 15, 16, 17)]
    draw = np.minimum(rng.zipf(1.3, 120_000) - 1, len(vocab) - 1)
    data = " ".join(vocab[i] for i in draw.tolist()).encode()
    spans, _ = split_spans(data, 0, len(data), [SPECIAL])
    for pattern in NAMES:
        check_record(data, spans, pattern)


@given(st.lists(st.sampled_from([b" a", b" bb", b" a" * 8, b" " + b"c" * 14, b" " + b"c" * 15,
                                 b" " + b"d" * 16, b"\n", b"7"]), max_size=300).map(b"".join))
def test_record_repeats(data):
    """A few words repeated (hits, and evictions in a 64-slot front cache): the same table and ids
    as the plain count and the pretokenizer."""
    spans, _ = split_spans(data, 0, len(data), [SPECIAL])
    for pattern in NAMES:
        check_record(data, spans, pattern)


def test_record_empty():
    for pattern in NAMES + [USER_PATTERN]:
        for data, spans in [(b"", np.zeros((0, 2), np.int64)), (b"", np.array([[0, 0]])),
                            (b"ab cd", np.zeros((0, 2), np.int64)),
                            (b"ab cd", np.array([[0, 0], [2, 2], [5, 5]]))]:
            arena, offsets, counts, ids = count_pretokens(data, spans, pattern, record=True)
            assert arena.size == 0 and offsets.tolist() == [0] and counts.size == 0
            assert ids.dtype == np.uint32 and ids.size == 0


def test_record_kernel_keyword():
    """The kernel: record defaults to False (three arrays), record=True adds the ids."""
    data, spans = b"b a b<|>a", np.array([[0, 5], [8, 9]])
    assert len(_pretok.count_pretokens(data, spans, 0)) == 3
    assert len(_pretok.count_pretokens(data, spans, 0, record=False)) == 3
    arena, offsets, counts, ids = _pretok.count_pretokens(data, spans, 0, record=True)
    assert rows(arena, offsets) == [b" a", b" b", b"a", b"b"]
    assert ids.tolist() == [3, 0, 1, 2]
    with pytest.raises(ValueError):
        _pretok.count_pretokens(data, np.array([[0, 10]]), 0, record=True)
    # span ends: only with record, one per span
    with pytest.raises(ValueError, match="span_ends"):
        _pretok.count_pretokens(data, spans, 0, span_ends=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="span_ends"):
        _pretok.count_pretokens(data, spans, 0, record=True, span_ends=np.zeros(1, np.int64))


def test_record_span_ends_of_a_custom_regex():
    """A custom regex (no native scanner) gives the span ends the named patterns give: where each
    span's pretokens end in the ids."""
    data, spans = b"ab  cd<|>e f<|><|>g", np.array([[0, 6], [9, 12], [15, 15], [18, 19]])
    ends = np.zeros(4, np.int64)
    arena, offsets, counts, ids = count_pretokens(data, spans, r"\S+|\s+", record=True, span_ends=ends)
    assert [rows(arena, offsets)[i] for i in ids] == [b"ab", b"  ", b"cd", b"e", b" ", b"f", b"g"]
    assert ends.tolist() == [3, 6, 6, 7]
