"""What stage 2 knows of each word (pretoken) of the table: whether it holds a digit
(:func:`numeric_mask`, :func:`numeric_cuts`), whitespace at its edges (:func:`word_flags`), its byte
classes (:func:`word_classes`), each with its plain twin; and which units look like encoded binary
(:func:`encoded_units`, :func:`looks_encoded_counts`)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import regex

from ...engine.units import unit_sums
from ...pretok.pretokenize import word_byte_classes, word_char_flags
from ...pretok.wordtable import WordTable

_DIGIT = regex.compile(r"\p{N}")
_ASCII_DIGITS = regex.compile(rb"[0-9]+")
_SPACE = regex.compile(r"\s")
#: ASCII bytes that are ``\s`` (the same set as ``regex``'s, which the patterns use).
ASCII_SPACE = np.array([bool(_SPACE.match(chr(i))) for i in range(128)] + [False] * 128, dtype=bool)


def numeric_cuts(pretoken: bytes, token_lengths: Sequence[int]) -> list[int]:
    """Where a numeric pretoken's stage-1 tokens are cut into separate units (token indices).

    A cut goes between tokens ``i-1`` and ``i`` when the byte offset there is a hard boundary:
    a change between digit and non-digit characters, or a boundary between groups of three digits
    counted from the right inside a run of digits. A pretoken without digits gets no cut.

    >>> numeric_cuts(b" 1234567", [1, 1, 3, 3])   # ' ', '1', '234', '567'
    [1, 2, 3]
    >>> numeric_cuts(b" 1234567", [2, 6])         # ' 1' | '234567': a group boundary
    [1]
    >>> numeric_cuts(b" 1234567", [3, 5])         # ' 12' | '34567': inside a group, no cut
    []
    >>> numeric_cuts(b"abc", [1, 2])
    []

    An ASCII pretoken is read as bytes (its only ``\\p{N}`` are 0-9, one byte a character); any
    other by :func:`numeric_cuts_plain` (the same cuts: tested).
    """
    if not pretoken.isascii():
        return numeric_cuts_plain(pretoken, token_lengths)
    hard = set()
    n = len(pretoken)
    for m in _ASCII_DIGITS.finditer(pretoken):
        i, j = m.span()
        if i > 0:
            hard.add(i)
        if j < n:
            hard.add(j)
        hard.update(range(i + ((j - i) % 3 or 3), j, 3))     # groups of three, counted from the right
    if not hard:
        return []
    cuts, pos = [], 0
    for t, k in enumerate(token_lengths):
        if t > 0 and pos in hard:
            cuts.append(t)
        pos += k
    return cuts


def numeric_cuts_plain(pretoken: bytes, token_lengths: Sequence[int]) -> list[int]:
    """:func:`numeric_cuts` character by character (any UTF-8, invalid bytes included)."""
    text = pretoken.decode("utf-8", "surrogateescape")
    if not _DIGIT.search(text):
        return []
    # byte offset of every character, and whether it is a digit
    offsets, digit = [], []
    pos = 0
    for ch in text:
        offsets.append(pos)
        digit.append(bool(_DIGIT.match(ch)))
        pos += len(ch.encode("utf-8", "surrogateescape"))
    hard = set()
    i = 0
    while i < len(text):
        if digit[i]:
            j = i
            while j < len(text) and digit[j]:
                j += 1
            if i > 0:
                hard.add(offsets[i])
            if j < len(text):
                hard.add(offsets[j])
            first = i + ((j - i) % 3 or 3)        # groups of three, counted from the right
            for k in range(first, j, 3):
                hard.add(offsets[k])
            i = j
        else:
            i += 1
    cuts, pos = [], 0
    for t, n in enumerate(token_lengths):
        if t > 0 and pos in hard:
            cuts.append(t)
        pos += n
    return cuts


def numeric_mask(table: WordTable) -> np.ndarray:
    """Which words hold a digit (``\\p{N}``). ASCII digits are found by numpy; non-ASCII words are
    decoded and checked with ``regex``."""
    arena, offsets = table.arena, table.offsets
    n = table.n_words
    is_digit = (arena >= 0x30) & (arena <= 0x39)
    word_of_byte = np.repeat(np.arange(n), np.diff(offsets))
    mask = np.zeros(n, dtype=bool)
    mask[word_of_byte[is_digit]] = True
    non_ascii = np.zeros(n, dtype=bool)
    non_ascii[word_of_byte[arena >= 0x80]] = True
    raw = arena.tobytes()
    for w in np.flatnonzero(non_ascii & ~mask):
        if _DIGIT.search(raw[offsets[w]:offsets[w + 1]].decode("utf-8", "surrogateescape")):
            mask[w] = True
    return mask


NUMERIC, STARTS_SPACE, ENDS_SPACE = 1, 2, 4


def word_flags(table: WordTable) -> np.ndarray:
    """Per word of ``table`` (uint8): ``NUMERIC`` (holds a ``\\p{N}`` character), ``STARTS_SPACE`` and
    ``ENDS_SPACE`` (its first / last character is ``\\s``), in one native pass over the words
    (``pretok.word_char_flags``; the plain twin :func:`word_flags_python` is tested equal).

    >>> t = WordTable.from_counts({b" a": 1, b"x\\n": 1, b" 12": 1, b"\\xc2\\xa0": 1})
    >>> words = [t.arena[t.offsets[i]:t.offsets[i + 1]].tobytes() for i in range(t.n_words)]
    >>> dict(zip(words, word_flags(t).tolist())) == {b" a": 2, b"x\\n": 4, b" 12": 3, b"\\xc2\\xa0": 6}
    True
    """
    return word_char_flags(np.ascontiguousarray(table.arena, dtype=np.uint8),
                           np.ascontiguousarray(table.offsets, dtype=np.int64))


def word_classes(table: WordTable) -> np.ndarray:
    """Per word of ``table`` (int32 rows): its bytes, ASCII whitespace, ASCII punctuation, ASCII
    letters or digits, and ASCII digits (the byte classes of ``reference.looks_encoded``); what the
    units pass sums over a region to tell encoded data (``chunk_unit_stream(word_classes=)``). One
    native pass (``pretok.word_byte_classes``; the plain twin :func:`word_classes_python`).

    >>> word_classes(WordTable.from_counts({b"ab,": 1, b" 7\\xc3\\xa9": 1})).tolist()
    [[4, 1, 0, 1, 1], [3, 0, 1, 2, 0]]
    """
    out = word_byte_classes(np.ascontiguousarray(table.arena, dtype=np.uint8),
                            np.ascontiguousarray(table.offsets, dtype=np.int64))
    if out.size and out[:, 0].max() >= 2 ** 31:
        raise ValueError("a pretoken of 2 GiB or more cannot be a stage-2 unit word")
    return out.astype(np.int32)


def word_flags_python(table: WordTable) -> np.ndarray:
    """Per word of ``table`` (uint8): ``NUMERIC`` (holds a digit), ``STARTS_SPACE`` and
    ``ENDS_SPACE`` (its first / last character is ``\\s``). ASCII edges are read by numpy; a word
    whose first or last byte is not ASCII is decoded and checked with ``regex``.

    >>> t = WordTable.from_counts({b" a": 1, b"x\\n": 1, b" 12": 1, b"\\xc2\\xa0": 1})
    >>> words = [t.arena[t.offsets[i]:t.offsets[i + 1]].tobytes() for i in range(t.n_words)]
    >>> dict(zip(words, word_flags_python(t).tolist())) == {b" a": 2, b"x\\n": 4, b" 12": 3, b"\\xc2\\xa0": 6}
    True
    """
    flags = numeric_mask(table).astype(np.uint8) * NUMERIC
    offsets = table.offsets
    nonempty = np.flatnonzero(np.diff(offsets) > 0)
    first = table.arena[offsets[nonempty]]
    last = table.arena[offsets[nonempty + 1] - 1]
    flags[nonempty[ASCII_SPACE[first]]] |= STARTS_SPACE
    flags[nonempty[ASCII_SPACE[last]]] |= ENDS_SPACE
    raw = None
    for w in nonempty[(first >= 0x80) | (last >= 0x80)]:
        if raw is None:
            raw = table.arena.tobytes()
        text = raw[offsets[w]:offsets[w + 1]].decode("utf-8", "surrogateescape")
        if _SPACE.match(text[0]):
            flags[w] |= STARTS_SPACE
        if _SPACE.match(text[-1]):
            flags[w] |= ENDS_SPACE
    return flags


def word_classes_python(table: WordTable) -> np.ndarray:
    """Per word of ``table`` (int32 rows): its bytes, ASCII whitespace, ASCII punctuation, ASCII
    letters or digits, and ASCII digits (the byte classes of ``reference.looks_encoded``); what the
    units pass sums over a region to tell encoded data (``chunk_unit_stream(word_classes=)``).

    >>> t = WordTable.from_counts({b"ab,": 1, b" 7\\xc3\\xa9": 1})
    >>> word_classes_python(t).tolist()
    [[4, 1, 0, 1, 1], [3, 0, 1, 2, 0]]
    """
    n = table.n_words
    out = np.zeros((n, 5), dtype=np.int64)
    offsets = np.asarray(table.offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    out[:, 0] = lengths
    nonempty = np.flatnonzero(lengths > 0)
    if nonempty.size:
        cls = _BYTE_CLASS[np.asarray(table.arena)]
        for col, c in ((1, 1), (2, 2), (3, 3)):
            out[nonempty, col] = np.add.reduceat((cls == c).astype(np.int64), offsets[nonempty])
        digit = ((np.asarray(table.arena) >= 0x30) & (np.asarray(table.arena) <= 0x39)).astype(np.int64)
        out[nonempty, 4] = np.add.reduceat(digit, offsets[nonempty])
    if out.size and out[:, 0].max() >= 2 ** 31:
        raise ValueError("a pretoken of 2 GiB or more cannot be a stage-2 unit word")
    return np.ascontiguousarray(out.astype(np.int32))


#: ``encoded_units``: a unit looks like encoded binary (uuencode, base64, hex dumps) when it has at
#: least ``ENCODED_MIN_CHARS`` non-whitespace bytes, whitespace is at most 1/``ENCODED_MAX_SPACE_RATIO``
#: of its bytes (prose: ~1/6; uuencoded lines: one newline per 61 bytes) and ASCII punctuation is at
#: least 1/``ENCODED_MIN_PUNCT_RATIO`` of its non-whitespace bytes (uuencode: ~45%; prose: ~3%) ...
ENCODED_MIN_CHARS = 40
ENCODED_MAX_SPACE_RATIO = 16
ENCODED_MIN_PUNCT_RATIO = 4
#: ... and ASCII letters and digits at least 1/``ENCODED_MIN_ALNUM_RATIO`` of them (so rules of
#: ``-----`` or ``*****`` are not taken for encoded data), and ASCII digits at least
#: 1/``ENCODED_MIN_DIGIT_RATIO`` of them (uuencode: ~16%; a heading over its ``=====`` rule, a banner or
#: a signature block: none or few).
ENCODED_MIN_ALNUM_RATIO = 4
ENCODED_MIN_DIGIT_RATIO = 20
#: Per byte: 1 ASCII whitespace (`` \t\n\r\v\f``), 2 ASCII punctuation (``!`` to ``~`` less letters
#: and digits), 3 ASCII letter or digit, 0 anything else (the classes ``encoded_units`` counts).
_BYTE_CLASS = np.array([1 if chr(b) in " \t\n\r\x0b\x0c" else 3 if chr(b).isalnum() else 2 if 0x21 <= b < 0x7F
                        else 0 for b in range(128)] + [0] * 128, dtype=np.int64)
_DIGIT_BYTE = np.array([0x30 <= b <= 0x39 for b in range(256)], dtype=np.int64)


def looks_encoded_counts(n, ws, punct, alnum, digits):
    """``reference.looks_encoded`` on class counts (numpy arrays or ints)."""
    nonspace = n - ws
    return ((nonspace >= ENCODED_MIN_CHARS) & (ws * ENCODED_MAX_SPACE_RATIO <= n)
            & (punct * ENCODED_MIN_PUNCT_RATIO >= nonspace) & (alnum * ENCODED_MIN_ALNUM_RATIO >= nonspace)
            & (digits * ENCODED_MIN_DIGIT_RATIO >= nonspace))


def encoded_units(symbols: np.ndarray, offsets: np.ndarray, tokens: Sequence[bytes]) -> np.ndarray:
    """Which stage-2 units look like encoded binary, by the bytes of their tokens (bool per unit;
    ``reference.looks_encoded`` is the plain twin). Stage 2 gives such units no weight
    (``TrainConfig.stage2_skip_encoded``), so uuencoded Usenet lines teach it no tokens.

    >>> toks = [bytes([i]) for i in range(256)]
    >>> text = b"M#H]3IS5LB)$_(/;W+;`BTDT*EMK4/!87P:F.>!*>`R<W$&70E89/%:V@N$;!\\n" + b"a plain sentence of prose, " * 3
    >>> syms = np.frombuffer(text, dtype=np.uint8).astype(np.uint32)
    >>> encoded_units(syms, np.array([0, 62, len(text)]), toks).tolist()
    [True, False]
    """
    n_units = offsets.shape[0] - 1
    if n_units <= 0:
        return np.zeros(0, dtype=bool)
    t_len = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
    t_start = np.concatenate(([0], np.cumsum(t_len)))
    arena = np.frombuffer(b"".join(tokens), dtype=np.uint8)

    def per_token(byte_class: np.ndarray) -> np.ndarray:
        c = np.concatenate(([0], np.cumsum(byte_class[arena])))
        return c[t_start[1:]] - c[t_start[:-1]]

    def per_unit(packed: np.ndarray, syms: np.ndarray, offs: np.ndarray) -> np.ndarray:
        """Sums of ``packed[token]`` over each unit (two counts < 2**32 packed in one int64)."""
        return unit_sums(syms, offs, np.ascontiguousarray(packed, dtype=np.int64))

    syms = np.ascontiguousarray(symbols, dtype=np.uint32)
    offs = np.ascontiguousarray(offsets, dtype=np.int64)
    # 1. bytes and whitespace of every unit: one pass over the table
    nw = per_unit(t_len | (per_token(_BYTE_CLASS == 1) << 32), syms, offs)
    n, ws = nw & 0xFFFFFFFF, nw >> 32
    nonspace = n - ws
    out = (nonspace >= ENCODED_MIN_CHARS) & (ws * ENCODED_MAX_SPACE_RATIO <= n)
    cand = np.flatnonzero(out)
    if cand.size == 0:
        return out
    # 2. punctuation and letters/digits of the few long units with little whitespace
    lens = offs[cand + 1] - offs[cand]
    starts = np.concatenate(([0], np.cumsum(lens)))
    take = np.repeat(offs[cand] - starts[:-1], lens) + np.arange(starts[-1])
    pa = per_unit(per_token(_BYTE_CLASS == 2) | (per_token(_BYTE_CLASS == 3) << 32),
                  np.ascontiguousarray(syms[take]), starts)
    punct, alnum = pa & 0xFFFFFFFF, pa >> 32
    digits = per_unit(per_token(_DIGIT_BYTE), np.ascontiguousarray(syms[take]), starts)
    out[cand] = ((punct * ENCODED_MIN_PUNCT_RATIO >= nonspace[cand])
                 & (alnum * ENCODED_MIN_ALNUM_RATIO >= nonspace[cand])
                 & (digits * ENCODED_MIN_DIGIT_RATIO >= nonspace[cand]))
    return out
