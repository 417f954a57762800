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
   the two halves are exactly the pretokens of the whole (``tests/test_corpus.py`` checks it on
   random text). So even one 2 GB line with no special token and no newline is cut into chunks.

A user-supplied regex gets cut at document edges only.
"""
from __future__ import annotations

import codecs
import mmap
import os
import re
import stat
import warnings
from typing import Sequence

import numpy as np

from .patterns import pattern_name, specials_regex


class CorpusError(ValueError):
    """Bad input: the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class BinaryInputWarning(UserWarning):
    """The input does not look like text (NUL bytes, or much of it is neither UTF-8 nor printable).

    Training and encoding go on (a byte-level tokenizer takes any bytes); the warning says so once.
    """


#: Compressed formats refused by their magic bytes: (name, magic, how to decompress). bzip2's
#: "BZh" + level is also checked against the block or end-of-stream magic that follows it.
COMPRESSED_MAGIC: tuple[tuple[str, bytes, str], ...] = (
    ("gzip", b"\x1f\x8b\x08", "gzip -dk {}"),
    ("xz", b"\xfd7zXZ\x00", "xz -dk {}"),
    ("zstd", b"\x28\xb5\x2f\xfd", "zstd -d {}"),
    ("bzip2", b"BZh", "bzip2 -dk {}"),
    ("lz4", b"\x04\x22\x4d\x18", "lz4 -d {}"),
    ("zip", b"PK\x03\x04", "unzip {}"),
)
_BZIP2_NEXT = (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90")

_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def compressed_format(head: bytes) -> tuple[str, str] | None:
    """``(format, decompress command template)`` when ``head`` starts with a known compressed
    format's magic bytes, else None.

    >>> compressed_format(b"\\xfd7zXZ\\x00\\x00"), compressed_format(b"hello")
    (('xz', 'xz -dk {}'), None)
    >>> compressed_format(b"BZh is not bzip2"), compressed_format(b"BZh91AY&SY")[0]
    (None, 'bzip2')
    """
    for name, magic, hint in COMPRESSED_MAGIC:
        if head.startswith(magic):
            if name == "bzip2" and not (len(head) >= 10 and head[3:4] in b"123456789"
                                        and head[4:10] in _BZIP2_NEXT):
                continue
            if name == "gzip" and not (len(head) >= 10 and head[3] & 0xE0 == 0):
                continue          # a gzip member: a 10-byte header, deflate, reserved flag bits 0
            return name, hint
    return None


def check_input(path: str | os.PathLike) -> int:
    """Check that ``path`` is a readable regular file and not compressed; return its size in bytes.

    Raises:
        CorpusError: no such file, a directory, not a regular file (a FIFO or device, which would
            read as empty here: save it to a file first), unreadable, or compressed (gzip, xz,
            zstd, bzip2, lz4, zip: decompress it first).

    >>> import tempfile, os, gzip; p = os.path.join(tempfile.mkdtemp(), "c.txt.gz")
    >>> _ = open(p, "wb").write(gzip.compress(b"hi"))
    >>> check_input(p)
    Traceback (most recent call last):
    ...
    bpe_core.corpus.CorpusError: ...c.txt.gz: is gzip-compressed; decompress it first (gzip -dk ...c.txt.gz)
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CorpusError(path, "no such file") from None
    except OSError as exc:
        raise CorpusError(path, f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise CorpusError(path, "is a directory, expected a text file")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "a special file")
        raise CorpusError(path, f"is not a regular file ({kind}); save it to a file first")
    if not os.access(path, os.R_OK):
        raise CorpusError(path, "permission denied")
    if st.st_size:
        try:
            with open(path, "rb") as f:
                head = f.read(16)
        except OSError as exc:
            raise CorpusError(path, f"cannot read: {exc.strerror or exc}") from None
        found = compressed_format(head)
        if found is not None:
            name, hint = found
            raise CorpusError(path, f"is {name}-compressed; decompress it first ({hint.format(path)})")
    return st.st_size


#: How much of the input :func:`binary_reason` looks at.
SNIFF_BYTES = 64 << 10
#: Share of the sniffed bytes that may be invalid UTF-8 or control characters before the input
#: looks binary (Latin-1 or CP-1252 prose stays far below it: one invalid byte per accented letter).
BINARY_SHARE = 0.30
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\x0b\x0c\r") + b"\x7f"


def binary_reason(head: bytes) -> str | None:
    """Why ``head`` (the start of a file) looks binary rather than text, or None.

    >>> binary_reason("plain text, ünïcödé".encode()), binary_reason(b"ab\\x00cd")
    (None, 'it has NUL bytes')
    >>> binary_reason(bytes(range(128, 256)) * 4)
    '100% of its first 512 bytes are invalid UTF-8 or control characters'
    """
    if not head:
        return None
    if b"\x00" in head:
        return "it has NUL bytes"
    text, consumed = codecs.utf_8_decode(head, "surrogateescape", False)   # a cut last character stays out
    invalid = sum(1 for ch in text if "\udc80" <= ch <= "\udcff")
    control = len(head[:consumed]) - len(head[:consumed].translate(None, _CONTROL))
    share = (invalid + control) / max(1, consumed)
    if consumed and share > BINARY_SHARE:
        return (f"{share:.0%} of its first {_fmt_sniffed(consumed)} are invalid UTF-8 or control "
                f"characters")
    return None


def _fmt_sniffed(n: int) -> str:
    return f"{n >> 10} KiB" if n >= 1 << 10 and n % (1 << 10) == 0 else f"{n} bytes"


def warn_if_binary(path: str | os.PathLike, stacklevel: int = 2) -> str | None:
    """Warn (:class:`BinaryInputWarning`) when the start of ``path`` does not look like text.

    Returns the reason, or None. A byte-level tokenizer takes any bytes, so this never stops a run.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return None         # check_input reports unreadable files
    reason = binary_reason(head)
    if reason is not None:
        warnings.warn(f"{path}: looks binary, not text ({reason}); using its bytes anyway",
                      BinaryInputWarning, stacklevel=stacklevel + 1)
    return reason


def open_corpus(path: str | os.PathLike) -> np.ndarray:
    """Memory-map a file read-only as ``uint8`` (an empty file gives an empty array).

    >>> import tempfile; p = tempfile.mktemp(); _ = open(p, "wb").write(b"hi")
    >>> open_corpus(p).tobytes()
    b'hi'
    """
    size = check_input(path)
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise CorpusError(path, f"cannot memory-map: {exc}") from None


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


def _newline_cut(buf, start: int, stop: int) -> int | None:
    """The first safe cut inside a document at or after ``start``: after a safe newline, or before
    the space between two letters."""
    cands = []
    m = _SAFE_NEWLINE.search(buf, max(0, start - 1), stop)
    if m is not None:
        cands.append(m.start() + 2)
    m = _SAFE_SPACE.search(buf, max(0, start - 1), stop)
    if m is not None:
        cands.append(m.end())
    cands = [c for c in cands if c >= start]
    return min(cands) if cands else None


def chunk_boundaries(buf, chunk_bytes: int, special_tokens: Sequence[bytes] = (),
                     pattern: str = "gpt2", inside_documents: bool = True) -> list[int]:
    """Cut ``buf`` into chunks of about ``chunk_bytes``; returns sorted offsets ``[0, ..., len]``.

    Each cut is placed at the first safe point at or after the target offset: a special-token start
    or, for a named pattern, a safe newline, whichever comes first. A document longer than
    ``chunk_bytes`` with no safe point stays whole. ``inside_documents=False`` cuts at special
    tokens only (SuperBPE stage-2 units run across newlines, so they must not be cut there).

    >>> chunk_boundaries(b"aa<|e|>bb<|e|>cc", 3, [b"<|e|>"], pattern="gpt2")
    [0, 9, 16]
    """
    return _cuts(lambda a, b: buf[a:b], len(buf), chunk_bytes, special_tokens, pattern, inside_documents)


def file_chunks(path: str | os.PathLike, chunk_bytes: int, special_tokens: Sequence[bytes] = (),
                pattern: str = "gpt2", inside_documents: bool = True, stamp=None) -> list[tuple[int, int]]:
    """``chunk_boundaries`` of a file, as ``(start, end)`` pairs, read near each cut with ``pread``.

    Only a small window around each target offset is read (never the whole file, never a memory
    map, so a file truncated meanwhile raises ``workers.InputChanged`` instead of ``SIGBUS``). The
    cuts are the same as ``chunk_boundaries`` on the whole content.

    >>> import tempfile; p = tempfile.mktemp(); _ = open(p, "wb").write(b"aa<|e|>bb<|e|>cc")
    >>> file_chunks(p, 3, [b"<|e|>"])
    [(0, 9), (9, 16)]
    """
    from .workers import FileStamp, read_range

    path = os.fspath(path)
    stamp = stamp or FileStamp.of(path)
    cuts = _cuts(lambda a, b: read_range(path, a, b, stamp), stamp.size, chunk_bytes, special_tokens,
                 pattern, inside_documents)
    return [(s, e) for s, e in zip(cuts[:-1], cuts[1:]) if e > s]


def _cuts(read, n: int, chunk_bytes: int, special_tokens: Sequence[bytes], pattern: str,
          inside_documents: bool) -> list[int]:
    """The cut offsets of ``n`` bytes, where ``read(a, b)`` gives bytes ``[a, b)`` (a buffer)."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    if n == 0:
        return [0]
    rx = specials_regex(list(special_tokens))
    maxlen = max((len(s) for s in special_tokens), default=0)
    newline_ok = inside_documents and pattern_name(pattern) is not None
    cuts = [0]
    target = chunk_bytes
    # Search windows grow so a long document does not cost a rescan per chunk.
    while target < n:
        window = max(chunk_bytes, 1 << 16)
        cut = None
        lo = target
        while cut is None and lo < n:
            hi = min(n, lo + window)
            # The bytes that decide a cut in [lo, hi): maxlen before (is a special start covered by
            # an earlier one?) and maxlen + 1 after (the rest of a special token, the lookahead).
            base = max(0, lo - maxlen - 1)
            buf = read(base, min(n, hi + maxlen + 2))
            cands = []
            if rx is not None:
                c = _special_cut(buf, lo - base, hi - base, rx, maxlen)
                if c is not None:
                    cands.append(c + base)
            if newline_ok:
                c = _newline_cut(buf, lo - base, hi - base)
                if c is not None and c + base < n:
                    cands.append(c + base)
            if cands:
                cut = min(cands)
            lo = hi
            window *= 2
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


def split_spans(buf, start: int, end: int, special_tokens: Sequence[bytes]) -> tuple[np.ndarray, int]:
    """``text_spans`` and the number of special-token occurrences, in one scan.

    >>> spans, n = split_spans(b"<|e|>ab<|e|><|e|>c", 0, 18, [b"<|e|>"]); spans.tolist(), n
    ([[5, 7], [17, 18]], 3)
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
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2), n_specials


def count_specials(buf, start: int, end: int, special_tokens: Sequence[bytes]) -> int:
    """Number of special-token occurrences (document separators) in ``buf[start:end]``."""
    return split_spans(buf, start, end, special_tokens)[1]


def open_mmap_bytes(path: str | os.PathLike):
    """A read-only ``mmap.mmap`` of the file (``b""`` for an empty file); ``re`` can scan it."""
    size = check_input(path)
    if size == 0:
        return b""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
