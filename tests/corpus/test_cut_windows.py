"""The cut search reads small windows near each target (``chunks._cuts``, doubling while no safe cut
is found) and gives exactly the cuts of the whole content: each cut is ``first_safe_cut`` of the
whole buffer from the target on, for any window size, chunk size, special tokens and pattern."""
from __future__ import annotations

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from bpe_core.corpus import chunks
from bpe_core.corpus.chunks import cut_points, first_safe_cut
from encode_helpers import SETTINGS

PIECES = [b"a", b"b", b"Z", b" ", b"  ", b"\n", b"\n\n", b"/", b"!", b"-", b"\t", b"\r\n", b"1", b"<|e|>", b"<|e",
          b"|>", b"<|e|><|e|>", b"\xc3\xa9", b"\xff", b"xxxxxxxxxxxxxxxx"]
SPECIALS = [[], [b"<|e|>"], [b"<|e|><|e|>", b"<|e|>"], [b"|><|"]]


def whole_cuts(buf: bytes, chunk_bytes: int, specials, pattern, inside: bool) -> list[int]:
    """The plain definition: from each target, ``first_safe_cut`` of the whole buffer."""
    n = len(buf)
    if n == 0:
        return [0]
    cuts, target = [0], chunk_bytes
    while target < n:
        c = first_safe_cut(buf, target, n, specials, pattern, inside)
        if c is None:
            break
        if c > cuts[-1]:
            cuts.append(c)
        target = c + chunk_bytes
    return cuts + [n]


def windowed(buf: bytes, chunk_bytes: int, specials, pattern, inside: bool, window: int, reads=None) -> list[int]:
    def read(a, b):
        if reads is not None:
            reads.append(b - a)
        return buf[a:b]
    return chunks._cuts(read, len(buf), chunk_bytes, specials, pattern, inside, window=window)


@SETTINGS
@given(st.lists(st.sampled_from(PIECES), max_size=120), st.integers(1, 60), st.integers(1, 70),
       st.sampled_from(SPECIALS), st.sampled_from(["gpt2", "cl100k", None]), st.booleans())
@example([b"a", b" ", b"b"], 1, 1, [], "gpt2", True)                 # a space cut at a window's last byte
@example([b"!", b"\n", b"a"], 1, 1, [], "gpt2", True)                # a newline cut at a window's first byte
@example([b"a", b"!", b"\n", b"b", b" ", b"a"], 2, 2, [b"<|e|>"], "gpt2", True)
def test_windows_give_the_whole_text_cuts(parts, chunk_bytes, window, specials, pattern, inside):
    buf = b"".join(parts)
    assert windowed(buf, chunk_bytes, specials, pattern, inside, window) == \
        whole_cuts(buf, chunk_bytes, specials, pattern, inside)


@SETTINGS
@given(st.lists(st.sampled_from(PIECES), max_size=60), st.integers(1, 40), st.sampled_from(SPECIALS),
       st.booleans())
def test_cut_points_default_window_is_the_whole_text_cuts(parts, chunk_bytes, specials, inside):
    buf = b"".join(parts)
    assert cut_points(lambda a, b: buf[a:b], len(buf), chunk_bytes, specials, "gpt2", inside) == \
        whole_cuts(buf, chunk_bytes, specials, "gpt2", inside)


def test_a_cut_reads_a_small_window_not_a_chunk():
    """Text with a safe point every line: each cut reads about one first window, whatever the chunk
    size; a long stretch without a safe point is crossed by doubling windows (about twice its
    length read), and the cuts are those of the whole text."""
    rng = np.random.default_rng(0)
    words = [b"alpha", b"beta", b"gamma", b"delta!", b"x" * 30]
    lines = [b" ".join(words[i] for i in rng.integers(0, len(words), 12)) for _ in range(20000)]
    buf = b"\n".join(lines)
    for chunk_bytes in (100_000, 1 << 20):
        reads: list[int] = []
        got = windowed(buf, chunk_bytes, [], "gpt2", True, 1 << 12, reads)
        assert got == whole_cuts(buf, chunk_bytes, [], "gpt2", True) and len(got) > 3
        assert max(reads) <= (1 << 12) + 8 and len(reads) == len(got) - 2
    long = b"a " * 1000 + b"y" * 300_000 + b"!\nb" + b"c " * 10
    reads = []
    got = windowed(long, 1000, [], "gpt2", True, 1 << 10, reads)
    assert got == whole_cuts(long, 1000, [], "gpt2", True)
    assert 300_000 < sum(reads) < 3 * 300_000


@SETTINGS
@given(st.lists(st.sampled_from(PIECES), max_size=60).map(b"".join), st.integers(0, 70), st.integers(0, 80),
       st.sampled_from([1, 2, 3, 5, 8, 64, 1 << 22]))
@example(b"a" * 40 + b" b", 0, 80, 3)
@example(b"x\n" * 20 + b"x\ny", 1, 80, 1)
@example(b"a\n/b\nc a b", 0, 80, 64)           # (no cut before a slash; the first of several matches)
@example(b"!\n\n\t \n1 a", 0, 80, 1 << 22)
def test_the_numpy_search_finds_what_re_finds(buf, pos, endpos, step):
    """The safe newline and the safe space found with numpy a step at a time (any step, so matches
    across the steps' seams too) are ``re``'s first matches, at any ``pos`` and ``endpos``."""
    want_nl = chunks._SAFE_NEWLINE.search(buf, pos, endpos)
    want_sp = chunks._SAFE_SPACE.search(buf, pos, endpos)
    saved = chunks.FAST_SEARCH_BYTES, chunks._FAST_STEP
    chunks.FAST_SEARCH_BYTES, chunks._FAST_STEP = 0, step
    try:
        assert chunks._safe_newline(buf, pos, endpos) == (want_nl.start() if want_nl else None)
        assert chunks._safe_space(buf, pos, endpos) == (want_sp.end() if want_sp else None)
    finally:
        chunks.FAST_SEARCH_BYTES, chunks._FAST_STEP = saved


@SETTINGS
@given(st.lists(st.sampled_from(PIECES), max_size=80).map(b"".join), st.integers(1, 40), st.sampled_from(SPECIALS),
       st.integers(1, 64))
def test_the_cuts_with_the_numpy_search_are_the_same(buf, chunk_bytes, specials, window):
    saved = chunks.FAST_SEARCH_BYTES, chunks._FAST_STEP
    chunks.FAST_SEARCH_BYTES, chunks._FAST_STEP = 0, 5
    try:
        fast = windowed(buf, chunk_bytes, specials, "gpt2", True, window)
    finally:
        chunks.FAST_SEARCH_BYTES, chunks._FAST_STEP = saved
    assert fast == whole_cuts(buf, chunk_bytes, specials, "gpt2", True)
