"""Corpus access: memory-mapped input, input checks, and chunk boundaries.

A *chunk* is a byte range ``[start, end)`` of the corpus. Chunks are cut only where the cut provably
leaves the result unchanged:

1. at the start of a special-token occurrence that the whole-text, left-to-right, longest-first
   special-token scan would also find (a document edge), or
2. inside a document, for the named patterns only, right after a ``\\n`` that sits between two ASCII
   non-whitespace bytes (and the byte after it is not ``/``), or, inside a line, right before a
   single space between two ASCII letters (``a b`` -> ``a | b``). No piece of the GPT-2, cl100k
   or o200k patterns crosses such a point (the space always starts the next pretoken: `` ?\\p{L}+``
   or ``[^\\r\\n\\p{L}\\p{N}]?\\p{L}+``), and no match before it looks past it, so the pretokens of
   the two halves are exactly the pretokens of the whole (``tests/corpus/test_corpus.py`` checks it on
   random text). So even one 2 GB line with no special token and no newline is cut into chunks.

A user-supplied regex gets cut at document edges only.
"""
from __future__ import annotations

import array
import itertools
import os
import re
from typing import Sequence

from ..runtime.lazy import np  # numpy on first use (a small run never imports it)

from ..runtime.workers import FileStamp, read_range
from .specials import specials_regex

__all__ = ["SAFE_CUT_PATTERNS", "chunk_boundaries", "cut_points", "file_chunks", "first_safe_cut", "text_spans",
           "split_spans", "count_specials"]

#: The patterns (by canonical name, ``pretok.pattern_name``) whose pieces never cross the safe points
#: inside a document (rule 2 above). Chunking of any other pattern (a custom regex: pass its name as
#: None) cuts at document edges only.
SAFE_CUT_PATTERNS = frozenset({"gpt2", "cl100k", "o200k"})


# Bytes that are (part of) whitespace for the safe-cut rule: ASCII whitespace as ``regex`` sees it.
_ASCII_SPACE = frozenset(b" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f")
_SAFE_NEWLINE = re.compile(rb"[!-~]\n(?=[!-.0-~])")  # printable non-space, \n, printable non-space non-'/'
_SAFE_SPACE = re.compile(rb"[A-Za-z](?= [A-Za-z])")   # cut before the space of "a b"


def _special_cut(buf, start: int, stop: int, rx: "re.Pattern[bytes]", maxlen: int) -> int | None:
    """First position ``c`` in ``[start, stop)`` where the global special-token scan starts a match.

    A match found by searching from ``start`` is a global match when no special-token occurrence
    starting in ``(c - maxlen, c)`` covers ``c``; otherwise we keep looking further right.
    """
    pos = start
    while pos < stop:
        m = rx.search(buf, pos, min(len(buf), stop + maxlen))
        if m is None or m.start() >= stop:
            return None
        c = m.start()
        covered = False
        for s in range(max(0, c - maxlen + 1), c):
            m2 = rx.match(buf, s, min(len(buf), s + maxlen))
            # alternatives are ordered longest first, so m2 is the longest special starting at s
            if m2 is not None and m2.end() > c:
                covered = True
                break
        if not covered:
            return c
        pos = c + 1
    return None


#: A search over this many bytes or more finds its candidates with numpy (the newlines and spaces,
#: then their neighbours): ``re`` tries both patterns at every byte, ~60 MB/s on letters without
#: whitespace (the cut search over 2 GB of them took minutes); numpy ~1 GB/s. Smaller: ``re``.
FAST_SEARCH_BYTES = 1 << 16
#: Bytes a numpy search looks at, at a time (its temporary arrays are a few times this).
_FAST_STEP = 1 << 22


def _lookup(chars: bytes):
    table = np.zeros(256, dtype=bool)
    table[np.frombuffer(chars, dtype=np.uint8)] = True
    return table


def _first_between(buf, pos: int, endpos: int, middle: int, before: bytes, after: bytes) -> int | None:
    """The first ``i`` with ``pos <= i`` and ``i + 2 < endpos`` where ``buf[i + 1] == middle``,
    ``buf[i]`` is in ``before`` and ``buf[i + 2]`` in ``after``: the start of the first match of
    ``[before]middle(?=[after])`` searched in ``buf[pos:endpos]``, found with numpy a step at a time.
    """
    data = np.frombuffer(buf, dtype=np.uint8)
    endpos = min(endpos, len(data))
    ok_before, ok_after = _lookup(before), _lookup(after)
    i = max(0, pos)
    while i + 2 < endpos:
        top = min(endpos, i + _FAST_STEP + 2)
        part = data[i:top]
        hits = np.flatnonzero(part[1:-1] == middle)     # candidates: buf[i + h + 1] == middle
        if hits.size:
            good = hits[ok_before[part[hits]] & ok_after[part[hits + 2]]]
            if good.size:
                return i + int(good[0])
        i = top - 2
    return None


_PRINTABLE = bytes(range(0x21, 0x7F))
_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _safe_newline(buf, pos: int, endpos: int) -> int | None:
    """``_SAFE_NEWLINE.search(buf, pos, endpos)``'s start (None: no match)."""
    if endpos - pos < FAST_SEARCH_BYTES:
        m = _SAFE_NEWLINE.search(buf, pos, endpos)
        return None if m is None else m.start()
    return _first_between(buf, pos, endpos, 0x0A, _PRINTABLE, _PRINTABLE.replace(b"/", b""))


def _safe_space(buf, pos: int, endpos: int) -> int | None:
    """``_SAFE_SPACE.search(buf, pos, endpos)``'s end (None: no match)."""
    if endpos - pos < FAST_SEARCH_BYTES:
        m = _SAFE_SPACE.search(buf, pos, endpos)
        return None if m is None else m.end()
    i = _first_between(buf, pos, endpos, 0x20, _LETTERS, _LETTERS)
    return None if i is None else i + 1


def _newline_cut(buf, start: int, stop: int, newline_from: int | None = None, endpos: int | None = None) -> int | None:
    """The first safe cut inside a document at or after ``start`` (and before ``stop``): after a safe
    newline, or before the space between two letters.

    Safe newlines are searched from ``newline_from`` (default ``start - 1``: a newline cut exactly
    at ``start`` is not taken, as ``first_safe_cut`` has always done; ``start - 2`` takes it), spaces
    from ``start - 1``, up to ``endpos`` (default ``stop``: the lookahead sees no byte at or past
    it, so a cut in the last two bytes before ``stop`` can be missed; a windowed search passes the
    end of what it read instead).
    """
    endpos = min(len(buf), stop if endpos is None else endpos)
    cands = []
    i = _safe_newline(buf, max(0, start - 1 if newline_from is None else newline_from), endpos)
    if i is not None:
        cands.append(i + 2)
    i = _safe_space(buf, max(0, start - 1), endpos)
    if i is not None:
        cands.append(i)
    cands = [c for c in cands if start <= c < stop]
    return min(cands) if cands else None


def first_safe_cut(buf, lo: int, hi: int, special_tokens: Sequence[bytes] = (), pattern: str | None = "gpt2",
                   inside_documents: bool = True) -> int | None:
    """The first safe cut ``c`` with ``lo <= c < hi`` in ``buf`` (the rules of this module), or None.

    The cut is decided by the bytes ``[c - maxlen - 1, c + maxlen + 2)`` (``maxlen``: the longest
    special token), so a cut found with ``hi <= len(buf) - maxlen - 2`` in the first part of a
    stream is a safe cut of the whole stream (``sources`` cuts decompressed streams this way).

    >>> first_safe_cut(b"aaa<|e|>bbb<|e|>", 1, 9, [b"<|e|>"]), first_safe_cut(b"ab cd", 0, 4)
    (3, 2)
    """
    if lo >= hi:
        return None
    rx = specials_regex(list(special_tokens))
    maxlen = max((len(s) for s in special_tokens), default=0)
    cands = []
    if rx is not None:
        c = _special_cut(buf, lo, hi, rx, maxlen)
        if c is not None:
            cands.append(c)
    if inside_documents and pattern in SAFE_CUT_PATTERNS:
        c = _newline_cut(buf, lo, hi)
        if c is not None and c < hi:
            cands.append(c)
    return min(cands) if cands else None


def chunk_boundaries(buf, chunk_bytes: int, special_tokens: Sequence[bytes] = (),
                     pattern: str | None = "gpt2", inside_documents: bool = True) -> list[int]:
    """Cut ``buf`` into chunks of about ``chunk_bytes``; returns sorted offsets ``[0, ..., len]``.

    Each cut is placed at the first safe point at or after the target offset: a special-token start
    or, for a named pattern, a safe newline, whichever comes first. A document longer than
    ``chunk_bytes`` with no safe point stays whole. ``pattern`` is the canonical name of the
    pattern (``pretok.pattern_name``; None for a custom regex, which is cut at document edges only).
    ``inside_documents=False`` cuts at special tokens only (SuperBPE stage-2 units run across newlines, so they must not be cut there).

    >>> chunk_boundaries(b"aa<|e|>bb<|e|>cc", 3, [b"<|e|>"], pattern="gpt2")
    [0, 9, 16]
    """
    return _cuts(lambda a, b: buf[a:b], len(buf), chunk_bytes, special_tokens, pattern, inside_documents)


def file_chunks(path: str | os.PathLike, chunk_bytes: int, special_tokens: Sequence[bytes] = (),
                pattern: str | None = "gpt2", inside_documents: bool = True, stamp=None) -> list[tuple[int, int]]:
    """``chunk_boundaries`` of a file, as ``(start, end)`` pairs, read near each cut with ``pread``.

    Only a small window around each target offset is read (never the whole file, never a memory
    map, so a file truncated meanwhile raises ``errors.InputChanged`` instead of ``SIGBUS``). The
    cuts are the same as ``chunk_boundaries`` on the whole content.

    >>> import tempfile; p = tempfile.mktemp(); _ = open(p, "wb").write(b"aa<|e|>bb<|e|>cc")
    >>> file_chunks(p, 3, [b"<|e|>"])
    [(0, 9), (9, 16)]
    """


    path = os.fspath(path)
    stamp = stamp or FileStamp.of(path)
    cuts = _cuts(lambda a, b: read_range(path, a, b, stamp), stamp.size, chunk_bytes, special_tokens,
                 pattern, inside_documents)
    return [(s, e) for s, e in zip(cuts[:-1], cuts[1:]) if e > s]


def cut_points(read, n: int, chunk_bytes: int, special_tokens: Sequence[bytes] = (),
               pattern: str | None = "gpt2", inside_documents: bool = True) -> list[int]:
    """``chunk_boundaries`` of ``n`` bytes that are read through ``read(a, b)`` (bytes ``[a, b)``).

    Only small windows near each target offset are read, so this cuts a remote file (an fsspec URL,
    ``corpus.shards``) or any other random-access source without reading it whole.

    >>> data = b"aa<|e|>bb<|e|>cc"
    >>> cut_points(lambda a, b: data[a:b], len(data), 3, [b"<|e|>"])
    [0, 9, 16]
    """
    return _cuts(read, n, chunk_bytes, special_tokens, pattern, inside_documents)


#: The first window the cut search reads after each target offset; it doubles while no safe cut is
#: found in it (a long document without a safe point), so a cut costs a small read, not a chunk.
CUT_WINDOW = 1 << 16
#: The windows double up to this size, then slide: a stretch with no cut (2 GB of letters without
#: whitespace) is read in windows of this size, not in one read as large as itself.
CUT_WINDOW_MAX = 16 << 20


def _cuts(read, n: int, chunk_bytes: int, special_tokens: Sequence[bytes], pattern: str | None,
          inside_documents: bool, window: int = CUT_WINDOW) -> list[int]:
    """The cut offsets of ``n`` bytes, where ``read(a, b)`` gives bytes ``[a, b)`` (a buffer).

    Each cut is ``first_safe_cut(whole, target, n)`` of the whole content (``target``: the last cut
    plus ``chunk_bytes``), found by reading windows ``[lo, hi)`` after the target, ``window`` bytes
    first, doubling up to ``CUT_WINDOW_MAX``: a window holds the bytes that decide every cut in it (``maxlen + 2`` before
    ``lo``, ``maxlen + 2`` after ``hi``), and a later window takes the cuts at its very start that
    the match before it left out, so the result does not depend on ``window``
    (``tests/corpus/test_cut_windows.py``).
    """
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    if n == 0:
        return [0]
    rx = specials_regex(list(special_tokens))
    maxlen = max((len(s) for s in special_tokens), default=0)
    newline_ok = inside_documents and pattern in SAFE_CUT_PATTERNS
    cuts = [0]
    target = chunk_bytes
    while target < n:
        size = max(1, window)
        cut = None
        lo = target
        while cut is None and lo < n:
            hi = min(n, lo + size)
            # The bytes that decide a cut in [lo, hi): maxlen + 2 before (is a special start covered
            # by an earlier one? the byte before a newline) and maxlen + 2 after (the rest of a
            # special token, the lookahead of a newline or a space).
            base = max(0, lo - maxlen - 2)
            top = min(n, hi + maxlen + 2)
            buf = read(base, top)
            cands = []
            if rx is not None:
                c = _special_cut(buf, lo - base, hi - base, rx, maxlen)
                if c is not None:
                    cands.append(c + base)
            if newline_ok:
                # the first window searches newlines as first_safe_cut does (from lo - 1); a later one
                # from lo - 2, so a newline cut at its very start (a match begun before it) counts
                c = _newline_cut(buf, lo - base, hi - base, lo - base - (1 if lo == target else 2), top - base)
                if c is not None and c + base < n:
                    cands.append(c + base)
            if cands:
                cut = min(cands)
            lo = hi
            size = min(size * 2, max(window, CUT_WINDOW_MAX))
        if cut is None or cut >= n:
            break
        if cut > cuts[-1]:
            cuts.append(cut)
        target = cut + chunk_bytes
    cuts.append(n)
    return cuts


def text_spans(buf, start: int, end: int, special_tokens: Sequence[bytes]) -> np.ndarray:
    """The text ranges of ``buf[start:end]`` between special tokens, as an int64 ``(k, 2)`` array.

    Empty ranges are dropped.

    >>> text_spans(b"ab<|e|>c<|e|>", 0, 13, [b"<|e|>"]).tolist()
    [[0, 2], [7, 8]]
    """
    return split_spans(buf, start, end, special_tokens)[0]


def split_spans(buf, start: int, end: int, special_tokens: Sequence[bytes],
                numpy: bool = True) -> tuple[np.ndarray | array.array, int]:
    """``text_spans`` and the number of special-token occurrences, in one scan.

    Not ``numpy``: the spans are a flat int64 ``array.array`` (start, end, start, end, ...): no
    numpy imported (a small run, ``pretok.counting``).

    >>> spans, n = split_spans(b"<|e|>ab<|e|><|e|>c", 0, 18, [b"<|e|>"]); spans.tolist(), n
    ([[5, 7], [17, 18]], 3)
    >>> split_spans(b"<|e|>ab<|e|><|e|>c", 0, 18, [b"<|e|>"], numpy=False)[0].tolist()
    [5, 7, 17, 18]
    """
    rx = specials_regex(list(special_tokens))
    spans = []
    n_specials = 0
    pos = start
    if rx is not None:
        for m in rx.finditer(buf, start, end):
            n_specials += 1
            if m.start() > pos:
                spans.append((pos, m.start()))
            pos = m.end()
    if end > pos:
        spans.append((pos, end))
    if not numpy:
        return array.array("q", itertools.chain.from_iterable(spans)), n_specials
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2), n_specials


def count_specials(buf, start: int, end: int, special_tokens: Sequence[bytes]) -> int:
    """Number of special-token occurrences (document separators) in ``buf[start:end]``."""
    return split_spans(buf, start, end, special_tokens)[1]


