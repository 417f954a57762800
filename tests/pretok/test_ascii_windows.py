"""The 64-byte ASCII windows of the native pre-tokenizer (``_ascii_window.h``) and the counters'
hot cache give exactly the ``regex`` pieces and counts.

A window only runs where 64 bytes of the span are left after a pretoken start, so these texts are
longer than the other property tests' and put the hard cases (contractions, whitespace runs, CR/LF
and ``/`` after other characters, digit groups, case changes, non-ASCII bytes) at every offset
around the window's edges.
"""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.pretok import _pretok
from bpe_core.pretok.patterns import PATTERNS
from bpe_core.pretok.pretokenize import count_pretokens

NAMES = list(PATTERNS)  # gpt2, cl100k, o200k
COMPILED = {name: regex.compile(PATTERNS[name]) for name in NAMES}

# ASCII pieces that exercise every rule of the windows, and non-ASCII ones that stop them (Unicode
# whitespace, letters, marks, digits, case-folding to s/k, an invalid byte as a lone surrogate).
ASCII_PIECES = (list("aAbzZsSdDmMtTlLvVrReEkK") + list("0123456789") + list(" \t\n\r\x0b\x0c")
                + [" ", " ", "  ", "\r\n", "'", "''", "'s", "'S", "'ll", "'LL", "'Ve", "'rE", "'d",
                   "'t", "'m", "'re", "/", "//", "\n/", "!", "?", ".", ",", "-", "(", "\"", "#",
                   "\x00", "\x1c", "\x7f", "the", " the", "Hello", "WORLD", "123456"])
OTHER_PIECES = ["é", "\u00a0", "\u3000", "\u2028", "\x85", "ſ", "\u212a", "日", "\u0301", "٣",
                "ǅ", "я", "\udcff", "\udcc3"]


def regex_ends(data: bytes, name: str) -> list[int]:
    text = data.decode("utf-8", "surrogateescape")
    ends, pos = [], 0
    for m in COMPILED[name].finditer(text):
        pos += len(m.group().encode("utf-8", "surrogateescape"))
        ends.append(pos)
    return ends


def assert_same(data: bytes, name: str) -> None:
    got = _pretok.split_ends(data, _pretok.PATTERN_IDS[name]).tolist()
    want = regex_ends(data, name)
    if got != want:
        k = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]),
                 min(len(got), len(want)))
        lo = want[k - 2] if k >= 2 else 0
        raise AssertionError(f"{name}: first difference at pretoken {k} (byte {lo}): "
                             f"{data[lo:lo + 40]!r}: got {[e - lo for e in got[k - 1:k + 3]]}, "
                             f"regex {[e - lo for e in want[k - 1:k + 3]]}")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def test_windows_are_on():
    """The byte classes the windows assume agree with the Unicode tables, so the fast path runs."""
    assert _pretok.ASCII_WINDOWS is True


@pytest.mark.parametrize("name", NAMES)
def test_random_ascii_texts(name):
    """Random texts of 20 to 600 pieces, mostly ASCII, some with non-ASCII pieces mixed in."""
    rng = random.Random(28)
    for it in range(200):
        p_other = (0, 0, 0.01, 0.05, 0.2)[it % 5]
        runs = [" " * rng.randint(1, 90), "\n" * rng.randint(1, 5), "ab" * rng.randint(1, 40),
                "7" * rng.randint(1, 80), "'s" * rng.randint(1, 30), "!\n/" * rng.randint(1, 9)]
        pieces = []
        for _ in range(rng.randint(20, 600) if it % 3 == 0 else rng.randint(20, 150)):
            r = rng.random()
            pieces.append(rng.choice(OTHER_PIECES) if r < p_other else
                          rng.choice(runs) if r > 0.97 else rng.choice(ASCII_PIECES))
        assert_same(_encode("".join(pieces)), name)


@pytest.mark.parametrize("name", NAMES)
def test_non_ascii_at_every_offset(name):
    """A non-ASCII character (or invalid byte) at every offset of two windows."""
    base = ("It's a test\tof  the WINDOWS' edges: x'll 12345 ,\r\n  //\n/ they'RE   ok!\n" * 3)
    for other in ("é", "\u00a0", "\u3000", "ſ", "\u212a", "\udcff"):
        for k in range(0, 140):
            assert_same(_encode(base[:k] + other + base[k:]), name)


@pytest.mark.parametrize("name", NAMES)
def test_runs_across_the_window_edge(name):
    """Whitespace, letter, digit and CR/LF runs of every length from every offset up to the edge."""
    for lead in range(0, 70, 3):
        for unit, count in ((" ", 70), ("\n", 8), (" \n", 6), ("\t", 5), ("a", 70), ("1", 70),
                            ("'s", 4), ("\r\n", 4), ("/", 3), ("!\n", 3)):
            for k in range(1, count + 1):
                for tail in ("x", " x", "1", "\u00a0x", "'ll"):
                    assert_same(_encode("y" * lead + unit * k + tail + "z" * 70), name)


_PIECE = st.sampled_from(ASCII_PIECES + OTHER_PIECES[:4])


@settings(max_examples=100, deadline=None)
@given(st.lists(_PIECE, min_size=30, max_size=200).map("".join).map(_encode))
def test_hypothesis_long_texts(data):
    for name in NAMES:
        assert_same(data, name)


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=64, max_size=300))
def test_hypothesis_long_binary(data):
    for name in NAMES:
        assert_same(data, name)


@pytest.mark.parametrize("name", NAMES)
def test_count_through_the_hot_cache(name):
    """Many more distinct words than the hot cache has slots (evictions), short and long, in many
    spans, each word several times: the counts are regex's, in one span or cut into many."""
    rng = random.Random(5)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyzABC'") for _ in range(rng.randint(1, 24)))
             for _ in range(6_000)]
    text = " ".join(rng.choice(words) if rng.random() < 0.5 else words[int(rng.paretovariate(1.0)) % 300]
                    for _ in range(30_000))
    data = text.encode()
    want = Counter(data[a:b] for a, b in zip([0] + regex_ends(data, name)[:-1], regex_ends(data, name)))
    cuts = sorted(rng.sample(range(1, len(data)), 40))
    for spans in (np.array([[0, len(data)]]), np.array(list(zip([0] + cuts, cuts + [len(data)])))):
        arena, offsets, counts = count_pretokens(data, spans, name)
        got = {arena[offsets[i]:offsets[i + 1]].tobytes(): int(counts[i]) for i in range(len(counts))}
        if len(spans) == 1:
            assert got == dict(want)
        else:
            want_cut = Counter()
            for a, b in spans.tolist():
                ends = regex_ends(data[a:b], name)
                want_cut.update(data[a:b][x:y] for x, y in zip([0] + ends[:-1], ends))
            assert got == dict(want_cut)
        a2, o2, c2, ids = count_pretokens(data, spans, name, record=True)
        assert np.array_equal(a2, arena) and np.array_equal(o2, offsets) and np.array_equal(c2, counts)


@pytest.mark.parametrize("name", NAMES)
def test_dense_pretokens_fill_the_ends_array(name):
    """Pretokens of one or two bytes outrun split_ends' first guess of room (a quarter of the bytes),
    so windows run with less room than they can fill and write only what fits."""
    for unit in ("a ", "a,", "1!", " \n", "x'", "'s"):
        for extra in range(0, 70, 7):
            assert_same(_encode(unit * 600 + "b" * extra), name)
