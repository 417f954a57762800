"""The paper's constants and script-aware processing: supercategories, the CJK/Thai bigram gate,
Turkish/Finnish suffix gates mined from the data, hamza normalization for the statistics."""
from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field
import numpy as np
from typing import Optional

import regex

from ...pretok.wordtable import WordTable


# ==== Constants of the paper (Appendix A) ======================================================

TAU_BE = 1.15
STOPWORDS_EN = frozenset("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she should
so some such than that the their theirs them themselves then there these they this those through to
too under until up very was we were what when where which while who whom why will with would you your
yours yourself yourselves s t d ll m re ve don
""".split())

LETTER_WORD = regex.compile(r"^ ?[\p{L}\p{M}]+$|^'[\p{L}]+$")


def sigmoid(k: float, x: float) -> float:
    """``1 / (1 + exp(-k x))``.

    >>> sigmoid(1.0, 0.0)
    0.5
    """
    return 1.0 / (1.0 + math.exp(-k * x))


# ==== Script-aware processing ==================================================================


def supercategory(ch: str) -> str:
    """The paper's five Unicode supercategories: ``LM`` letters and marks, ``PS`` punctuation and
    symbols, ``N`` numbers, ``Z`` separators, ``C`` control and other.

    >>> [supercategory(c) for c in "a\\u0301.5 \\n"]
    ['LM', 'LM', 'PS', 'N', 'Z', 'C']
    """
    c = unicodedata.category(ch)[0]
    return {"L": "LM", "M": "LM", "P": "PS", "S": "PS", "N": "N", "Z": "Z"}.get(c, "C")


def is_spaceless(ch: str) -> bool:
    """Chinese, Japanese or Thai characters (scripts that do not mark word boundaries).

    >>> is_spaceless("中"), is_spaceless("の"), is_spaceless("ก"), is_spaceless("a"), is_spaceless("한")
    (True, True, True, False, False)
    """
    o = ord(ch)
    return (0x0E00 <= o <= 0x0E7F or 0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x4DBF
            or 0x4E00 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or 0xFF66 <= o <= 0xFF9F)


_HAMZA = str.maketrans({"أ": "ا", "إ": "ا", "آ": "ا", "ٱ": "ا", "ؤ": "و", "ئ": "ي", "ء": ""})


def normalize_hamza(text: str) -> str:
    """Arabic hamza normalization (for counting statistics only; tokens stay exact).

    >>> normalize_hamza("أحمد سئل")
    'احمد سيل'
    """
    return text.translate(_HAMZA)


_TR_MARKERS = frozenset("ve bir bu için ile olarak çok daha gibi değil".split())
_FI_MARKERS = frozenset("ja että oli ovat myös mutta joka jotka ole sekä".split())


def guess_suffix_language(text: str) -> Optional[str]:
    """``"tr"``, ``"fi"`` or None, by function-word hits (a cheap document-level guess).

    >>> guess_suffix_language("Bu ev ve bir kedi için çok güzel"), guess_suffix_language("the cat")
    ('tr', None)
    """
    words = text.lower().split()
    tr = sum(1 for w in words if w in _TR_MARKERS)
    fi = sum(1 for w in words if w in _FI_MARKERS)
    distinct = max(len(_TR_MARKERS.intersection(words)), len(_FI_MARKERS.intersection(words)))
    if max(tr, fi) < 3 or distinct < 2 or max(tr, fi) < 0.02 * len(words):
        return None
    return "tr" if tr > fi else "fi"


#: ``marker_words`` bits: the word is a Turkish / a Finnish function word of ``guess_suffix_language``;
#: ``WORD_START``: the word is an ASCII space then an ASCII letter or digit (each occurrence starts a
#: whitespace-separated word of the text)
TR_MARKER, FI_MARKER, WORD_START = 1, 2, 4


#: ``marker_words``' byte classes: ASCII letters, and the ASCII characters ``str.strip`` takes off
_ASCII_LETTER = np.zeros(256, dtype=bool)
_ASCII_LETTER[np.r_[0x41:0x5B, 0x61:0x7B]] = True
_STRIP_SPACE = np.zeros(256, dtype=bool)
_STRIP_SPACE[[c for c in range(0x80) if chr(c).isspace()]] = True
_ASCII_MARKERS = [w for w in _TR_MARKERS | _FI_MARKERS if w.isascii()]
_MARKER_LETTER = np.zeros(256, dtype=bool)
_MARKER_LETTER[[ord(c) for w in _ASCII_MARKERS for c in w + w.upper()]] = True


def marker_words(table: WordTable) -> np.ndarray:
    """Per word of ``table`` (uint8): ``TR_MARKER`` / ``FI_MARKER`` when the word, stripped of
    whitespace and lower-cased, is one of the function words :func:`guess_suffix_language` counts.

    With a pattern whose letter runs are whole pretokens (GPT-2's, cl100k's: a leading space or one
    other character aside), each whitespace-separated word of a document that the guess counts is a
    pretoken marked here, so a document with fewer than 3 marked pretokens of either language is
    never guessed (``documents``: only the others are decoded and guessed).

    A word that is an ASCII space then an ASCII letter or digit also has ``WORD_START``
    (:func:`guess_candidates`).

    >>> t = WordTable.from_counts({b" ve": 1, b"Ja": 1, b" the": 1, b"\\tJOKA": 1, b" ,": 1})
    >>> words = [t.arena[t.offsets[i]:t.offsets[i + 1]].tobytes() for i in range(t.n_words)]
    >>> dict(zip(words, marker_words(t).tolist())) == {b" ve": 5, b"Ja": 2, b" the": 4, b"\\tJOKA": 2, b" ,": 0}
    True
    """
    out = np.zeros(table.n_words, dtype=np.uint8)
    longest = max(len(w.encode()) for w in _TR_MARKERS | _FI_MARKERS)
    offsets = np.asarray(table.offsets, dtype=np.int64)
    arena = np.asarray(table.arena, dtype=np.uint8)
    # An ASCII word can be a function word only when its bytes are letters of the ASCII function
    # words (either case) and the whitespace str.strip takes off, with 2 to 6 letters (their
    # lengths): only those and the words with non-ASCII bytes are decoded (on English text most
    # words are ASCII and fail this: " of", " and", " in", punctuation, numbers)
    def per_word(flags: np.ndarray) -> np.ndarray:
        """The marked bytes of each word (a table's words are never empty: a sum per start)."""
        if not out.size:
            return np.zeros(0, dtype=np.int64)
        return np.add.reduceat(flags.view(np.uint8), offsets[:-1], dtype=np.int64)

    letters = per_word(_ASCII_LETTER[arena])
    others = per_word(~(_MARKER_LETTER | _STRIP_SPACE)[arena])         # (non-ASCII bytes are among them)
    non_ascii = per_word(arena >= 0x80)
    lo, hi = min(len(w) for w in _ASCII_MARKERS), max(len(w) for w in _ASCII_MARKERS)
    maybe = (non_ascii > 0) | ((others == 0) & (letters >= lo) & (letters <= hi))
    short = np.flatnonzero((np.diff(offsets) <= 4 * longest) & maybe)    # (any whitespace around it, and upper case)
    raw = table.arena.tobytes() if short.size else b""
    for w in short.tolist():
        text = raw[offsets[w]:offsets[w + 1]].decode("utf-8", "surrogateescape").strip().lower()
        out[w] = (TR_MARKER if text in _TR_MARKERS else 0) | (FI_MARKER if text in _FI_MARKERS else 0)
    two = np.flatnonzero(np.diff(offsets) >= 2)
    if two.size:
        first, second = arena[offsets[two]], arena[offsets[two] + 1]
        alnum = (((second | 0x20) >= 0x61) & ((second | 0x20) <= 0x7A)) | ((second >= 0x30) & (second <= 0x39))
        out[two[(first == 0x20) & alnum]] |= WORD_START
    return out


def guess_candidates(marked: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """The documents :func:`guess_suffix_language` may give a language: ``marked`` is
    ``marker_words(table)`` of every pretoken of the documents, ``firsts`` where each document
    starts in it (every document holds a pretoken). A document is left out when no language has 3
    marked pretokens, or when the marked pretokens of each are fewer than 2% of its ``WORD_START``
    pretokens: the guess counts at most the marked pretokens as function words (``marker_words``)
    and at least the ``WORD_START`` ones as words, and needs 3 and 2% (so on English text the
    few long documents with three ``" bu"`` are not decoded and split: 0.2 CPU-s on 60 MB).

    >>> m = np.array([1, 1, 1, 4, 4, 5, 5, 5, 0], np.uint8)    # doc 0: 3 Turkish; doc 1: 3 of 5 words
    >>> guess_candidates(m, np.array([0, 3])).tolist()
    [0, 1]
    >>> guess_candidates(np.concatenate((m, np.full(200, 4, np.uint8))), np.array([0, 3])).tolist()
    [0]
    """
    tr = np.add.reduceat(marked & TR_MARKER, firsts, dtype=np.int64)
    fi = np.add.reduceat((marked & FI_MARKER) >> 1, firsts, dtype=np.int64)
    starts = np.add.reduceat((marked & WORD_START) >> 2, firsts, dtype=np.int64)
    most = np.maximum(tr, fi)
    return np.flatnonzero((most >= 3) & ~(most < 0.02 * starts))


def mine_suffixes(word_counts: dict[str, int], top: int = 200, min_stem: int = 3) -> list[str]:
    """The ``top`` most frequent word endings of 2..4 letters (with a stem of ``min_stem`` letters
    or more left), counted over words weighted by their counts.

    >>> mine_suffixes({"evlerde": 5, "okullarda": 3, "evde": 2}, top=2)
    ['de', 'erde']
    """
    ends: dict[str, int] = {}
    for w, c in word_counts.items():
        w = w.strip().lower()
        if not w.isalpha():
            continue
        for k in range(2, 5):
            if len(w) - k >= min_stem:
                ends[w[-k:]] = ends.get(w[-k:], 0) + c
    return [s for s, _ in sorted(ends.items(), key=lambda x: (-x[1], x[0]))[:top]]


@dataclass
class ScriptGate:
    """Which merges script-aware processing forbids (all passes).

    - spaceless scripts: a merge that joins two Chinese/Japanese/Thai characters at its junction
      needs that character bigram seen ``bigram_min`` times in the training text;
    - Turkish/Finnish: a merge whose junction falls strictly inside a mined suffix at the end of the
      merged token is refused unless its right part is itself a mined suffix, so stems and suffixes
      stay separable (the paper's "suffix-aware weighting", expressed as a gate: the engine ranks by
      count only).
    """

    bigrams: dict[str, int] = field(default_factory=dict)
    bigram_min: int = 50
    suffixes: frozenset = frozenset()

    @property
    def active(self) -> bool:
        return bool(self.bigrams) or bool(self.suffixes)

    def allows(self, left: bytes, right: bytes) -> bool:
        """>>> g = ScriptGate({"中国": 60, "国人": 3}, 50, frozenset({"de", "lerde"}))
        >>> g.allows("中".encode(), "国".encode()), g.allows("国".encode(), "人".encode())
        (True, False)
        >>> g.allows(b"evlerd", b"e"), g.allows(b"evler", b"de"), g.allows(b"ev", b"lerde")
        (False, True, True)
        """
        a = left.decode("utf-8", "surrogateescape")
        b = right.decode("utf-8", "surrogateescape")
        if not a or not b:
            return True
        if self.bigrams and is_spaceless(a[-1]) and is_spaceless(b[0]):
            if self.bigrams.get(a[-1] + b[0], 0) < self.bigram_min:
                return False
        if self.suffixes:
            m = (a + b).strip().lower()
            rb = b.strip().lower()
            if m.isalpha() and rb not in self.suffixes:
                for k in range(len(rb) + 1, min(len(m), 5)):
                    if m[-k:] in self.suffixes:
                        return False
        return True


#: runs of two or more ``is_spaceless`` characters (its ranges)
_SPACELESS_RUN = regex.compile("[\u0E00-\u0E7F\u3040-\u30FF\u3400-\u4DBF\u4E00-\u9FFF\uF900-\uFAFF"
                               "\uFF66-\uFF9F]{2,}")
#: the lead bytes of the UTF-8 of ``is_spaceless`` characters (a uint8 -> bool table)
_SPACELESS_LEADS = np.zeros(256, dtype=bool)
_SPACELESS_LEADS[[0xE0, 0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEF]] = True


#: ``is_spaceless``' ranges of code points, as (first, last) pairs
_SPACELESS_RANGES = ((0x0E00, 0x0E7F), (0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),
                     (0xFF66, 0xFF9F))


def spaceless_bigrams(arena: np.ndarray, offsets: np.ndarray, counts: np.ndarray) -> dict[str, int]:
    """The character bigrams of two ``is_spaceless`` characters in the words of a table (word ``w``
    is ``arena[offsets[w]:offsets[w+1]]``, met ``counts[w]`` times), each counted with its words'
    counts; the bigrams in the order they are first met (word by word, left to right).

    Every such character is 3 bytes of UTF-8 (a lead byte of ``_SPACELESS_LEADS`` and two
    continuation bytes, a code point in its ranges), and a lead byte never continues another
    character, so a word decoded with ``surrogateescape`` holds one exactly where its bytes hold
    these three; a bigram is two of them 3 bytes apart in one word. Read by numpy over all the
    words at once (the loop over the decoded words: 0.11 CPU-s on 60 MB of en_train at 32k, 23,397
    words). Plain equivalent: :func:`spaceless_bigrams_python` (tested equal).

    >>> t = "中国人 ไท".encode()
    >>> spaceless_bigrams(np.frombuffer(t, np.uint8), np.array([0, len(t)]), np.array([2]))
    {'中国': 2, '国人': 2, 'ไท': 2}
    """
    arena = np.asarray(arena, dtype=np.uint8)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = int(offsets[-1]) if offsets.size else 0
    if n < 6:
        return {}
    arena = arena[:n]
    # where a 3-byte character of a spaceless script starts: a lead byte, two continuation bytes,
    # inside one word (its last byte before the word's end), a code point in the ranges
    at = np.flatnonzero(_SPACELESS_LEADS[arena[:n - 2]])
    if at.size < 2:
        return {}
    b1, b2 = arena[at + 1], arena[at + 2]
    ends = offsets[np.searchsorted(offsets, at, side="right")]        # the end of each one's word
    ok = ((b1 & 0xC0) == 0x80) & ((b2 & 0xC0) == 0x80) & (at + 3 <= ends)
    cp = ((arena[at].astype(np.int64) & 0x0F) << 12) | ((b1.astype(np.int64) & 0x3F) << 6) | (b2 & 0x3F)
    inside = np.zeros(at.size, dtype=bool)
    for lo, hi in _SPACELESS_RANGES:
        inside |= (cp >= lo) & (cp <= hi)
    ok &= inside
    at, cp, ends = at[ok], cp[ok], ends[ok]
    # pairs: one character and the next 3 bytes on, in the same word
    pair = np.flatnonzero((at[1:] == at[:-1] + 3) & (at[:-1] + 6 <= ends[:-1]))
    if not pair.size:
        return {}
    keys = (cp[pair] << 16) | cp[pair + 1]
    weights = np.asarray(counts, dtype=np.int64)[np.searchsorted(offsets, at[pair], side="right") - 1]
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    sums = np.bincount(inverse.reshape(-1), weights=weights, minlength=uniq.size)
    # (float sums of int64 counts: exact below 2**53; summed as integers when they may not be)
    if int(weights.sum()) >= 1 << 53:
        sums = np.zeros(uniq.size, dtype=object)
        np.add.at(sums, inverse.reshape(-1), weights.astype(object))
    order = np.argsort(first, kind="stable")
    # the bigrams as strings: their code points decoded at once (UTF-32), then cut in twos
    pairs = np.empty((order.size, 2), dtype="<u4")
    pairs[:, 0] = uniq[order] >> 16
    pairs[:, 1] = uniq[order] & 0xFFFF
    text = pairs.tobytes().decode("utf-32-le")
    return dict(zip([text[i:i + 2] for i in range(0, len(text), 2)], sums[order].astype(np.int64).tolist()))


def spaceless_bigrams_python(arena: bytes, offsets, counts) -> dict[str, int]:
    """:func:`spaceless_bigrams` word by word: each word that holds two spaceless lead bytes decoded,
    the bigrams inside each run of two spaceless characters or more (``_SPACELESS_RUN``) counted."""
    bigrams: dict[str, int] = {}
    leads = _SPACELESS_LEADS[np.frombuffer(arena, dtype=np.uint8)] if arena else np.zeros(0, dtype=bool)
    for w in range(len(offsets) - 1):
        a, b = int(offsets[w]), int(offsets[w + 1])
        if int(leads[a:b].sum()) < 2:
            continue
        text = arena[a:b].decode("utf-8", "surrogateescape")
        for run in _SPACELESS_RUN.findall(text):
            for i in range(len(run) - 1):
                pair = run[i:i + 2]
                bigrams[pair] = bigrams.get(pair, 0) + int(counts[w])
    return bigrams


def script_gate_from_table(table: WordTable, lang_words: dict[str, np.ndarray], bigram_min: int = 50,
                           suffix_top: int = 200) -> ScriptGate:
    """Build the gate: character bigrams of spaceless scripts from the word table
    (:func:`spaceless_bigrams`), suffixes from the words of documents guessed Turkish or Finnish."""
    offsets = table.offsets
    bigrams = spaceless_bigrams(table.arena, offsets, table.counts) if table.n_words else {}
    arena = table.arena.tobytes() if lang_words else b""
    suffixes: set[str] = set()
    for lang, wc in sorted(lang_words.items()):
        words = {arena[offsets[w]:offsets[w + 1]].decode("utf-8", "surrogateescape"): int(wc[w])
                 for w in np.flatnonzero(wc)}
        suffixes.update(mine_suffixes(words, suffix_top))
    return ScriptGate(bigrams, bigram_min, frozenset(suffixes))
