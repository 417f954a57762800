"""SuperBPE (Liu et al., COLM 2025): a two-stage curriculum on the same merge engine.

Stage 1 is standard BPE until the vocabulary reaches the *transition* size ``t``. Stage 2 continues
from the stage-1 segmentation with whitespace boundaries lifted: its words are **units**, runs of
consecutive pretokens of one text piece, each already split into its stage-1 tokens. Units are cut
only at hard boundaries, by ``stage2_split``:

- ``"hf"`` (the default): the edges of text pieces (document edges, special tokens); a pretoken
  holding a digit (``\\p{N}``) is a unit of its own; two pretokens that meet inside a run of
  whitespace are cut apart. Every cut is a place in the text that one regex finds
  (:func:`hf_split_regex`, the HF export's ``Split``), and inside a unit no stage-1 merge can cross a
  pretoken boundary, so HF's one-list BPE gives the stage-aware ids on almost every document.
- ``"units"`` (the previous default; ``"default"`` in older model files): document edges; a numeric
  pretoken is a unit of its own, cut further where its stage-1 tokens meet at a digit/non-digit
  change or between groups of three digits counted from the right (``numeric_cuts``).

A stage-2 merge must pass the rules (:class:`Stage2Rules`): at most ``max_words`` words
(``len(token.split())``), no forbidden substring (``": "``), no run of more than ``max_digits``
digits (3: the paper's groups of three), not the bytes of an existing token (``distinct``: so V ids
are V different strings), and the optional guardrails ``max_token_bytes`` and ``max_nonalnum``
(characters that are neither alphanumeric nor whitespace).

``stage2_split="official"`` reproduces the stage-2 pre-tokenizer of the official implementation for
parity: inside each line, the pieces ``\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]{2,}[\\r\\n/]*| +(?!\\S)`` are
isolated and the gaps between them are the units; each unit is pre-tokenized and stage-1 merged on its
own.

The encoder is stage-aware (:class:`StageAwareEncoder`): stage-1 merges inside pretokens, then stage-2
merges inside units, which reproduces training exactly (the token count of the training corpus equals
the count training ended with). ``reference.train_superbpe_from_bytes`` is the plain twin.

Scale: units are listed in text order, each word as its stage-1 tokens (``_units.chunk_unit_stream``);
stage 2 cuts them where no merge it makes can cross and deduplicates the pieces (:func:`stage2_merges`).
When the stage-2 table still would not fit the budget, stage 2 trains on a deterministic sample of
units (kept by a hash of their content, so the sample does not depend on worker count); the run report
says how much text it saw.
"""
from __future__ import annotations

import contextlib
import threading
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import regex

from ..corpus.chunks import file_chunks, split_spans
from ..corpus.files import open_corpus
from ..corpus.readers import BadRecords
from ..corpus.inputs import expand_inputs
from ..corpus.ranges import is_url
from ..corpus.shards import ReadOptions, shard_blocks, source_shards
from ..corpus.specials import encode_specials, split_on_specials
from ..engine.merge import MergeEngine, huge_pages, replay_merges
from ..engine.units import (ENCODED_MARK, RankMerger, UnitCounter, WordIndex, chunk_unit_stream, cut_pieces,
                            SKETCH_MAX, cut_pieces_parts, expand_units, id_unit_stream, pair_sketch,
                            pair_sketch_parts, record_rows, strip_marks, unit_sums)
from ..errors import InputChanged, InternalError, ModelFormatError
from ..formats import registry
from ..encode.tokenizer import TwoStageEncoder
from ..formats.model import Model
from ..pretok.counting import check_distributable, private_shard
from ..pretok.patterns import pattern_name, resolve_pattern
from ..pretok.pretokenize import PATTERN_IDS, pretoken_ends, word_byte_classes, word_char_flags
from ..pretok.wordtable import WordTable
from ..runtime.memmon import huge_pages_ready, numpy_huge_pages, phase, prefault
from ..runtime.progress import progress_bar
from ..runtime.executors import open_executor
from ..runtime.workers import FileStamp, read_range, run_ordered

DEFAULT_TRANSITION = 0.4
OFFICIAL_STAGE2_PATTERN = r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]{2,}[\r\n/]*| +(?!\S)"
_DIGIT = regex.compile(r"\p{N}")
_DIGIT_RUN = regex.compile(r"\p{N}+")
_SPACE = regex.compile(r"\s")
#: ASCII bytes that are ``\s`` (the same set as ``regex``'s, which the patterns use).
_ASCII_SPACE = np.array([bool(_SPACE.match(chr(i))) for i in range(128)] + [False] * 128, dtype=bool)
_OFFICIAL = regex.compile(OFFICIAL_STAGE2_PATTERN)
_NON_ASCII_DIGIT = regex.compile(r"(?![\x00-\x7f])\p{N}")
_NON_ASCII_SPACE = regex.compile(r"(?![\x00-\x7f])\s")
#: Bytes of RAM per stage-1 token of the corpus in stage 2 (the compact engine: 4 B cells, pairs of
#: stage-1 tokens, the pair map; read-only arrays mapped): measured 26.5 B on en_train at 32k (peak
#: 1,520 MiB anonymous for 60.2 M stage-1 tokens; the engine before: 66 B), rounded up. The
#: scheduler's share for stage 2 divided by this bounds the sample.
STAGE2_BYTES_PER_SYMBOL = 32
#: Read-only engine arrays larger than this live in mapped files under the spill folder.
MAP_THRESHOLD = 64 << 20
#: ... in stage 2, up to this when an eighth of the budget share allows it: the engine on pieces is
#: less than half the engine on whole units was (25 M symbols instead of 57 M at 32k on en_train), and
#: lists in RAM are built from the pair ids the count pass kept (no second hashing pass, no file).
STAGE2_MAP_THRESHOLD = 256 << 20


@dataclass(frozen=True)
class Stage2Rules:
    """Which merged tokens stage 2 may create (stored in the model file)."""

    max_words: int = 4
    forbidden: tuple[str, ...] = (": ",)
    max_token_bytes: Optional[int] = None
    max_nonalnum: Optional[int] = None
    max_digits: Optional[int] = None
    distinct: bool = False

    def allows(self, left: bytes, right: bytes) -> bool:
        """Equivalent to ``reference.superbpe_allows`` (``distinct`` is checked by the caller, which
        knows the tokens so far).

        >>> Stage2Rules().allows(b" of", b" the"), Stage2Rules().allows(b"a:", b" b")
        (True, False)
        >>> Stage2Rules(max_digits=3).allows(b" 12", b"34")
        False
        """
        merged = left + right
        if len(merged.split()) > self.max_words:
            return False
        for f in self._forbidden_bytes:
            if f in merged:
                return False
        if self.max_token_bytes is not None and len(merged) > self.max_token_bytes:
            return False
        if self.max_nonalnum is not None or self.max_digits is not None:
            text = merged.decode("utf-8", "surrogateescape")
            if self.max_nonalnum is not None:
                if sum(1 for c in text if not (c.isalnum() or c.isspace())) > self.max_nonalnum:
                    return False
            if self.max_digits is not None:
                if any(len(r) > self.max_digits for r in _DIGIT_RUN.findall(text)):
                    return False
        return True

    @classmethod
    def from_config(cls, config) -> "Stage2Rules":
        """The rules a :class:`~bpe_core.config.TrainConfig` asks for."""
        return cls(max_words=config.max_words, forbidden=tuple(config.forbidden),
                   max_token_bytes=config.max_token_bytes, max_nonalnum=config.max_nonalnum,
                   max_digits=config.max_digits, distinct=not config.stage2_duplicates)

    @property
    def _forbidden_bytes(self) -> list[bytes]:
        return [f.encode("utf-8") for f in self.forbidden]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["forbidden"] = list(self.forbidden)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Stage2Rules":
        return cls(max_words=int(d.get("max_words", 4)), forbidden=tuple(d.get("forbidden", (": ",))),
                   max_token_bytes=d.get("max_token_bytes"), max_nonalnum=d.get("max_nonalnum"),
                   max_digits=d.get("max_digits"), distinct=bool(d.get("distinct", False)))


def resolve_transition(transition: float | int | None, vocab_size: int, n_specials: int) -> int:
    """The vocabulary size at the transition: an int is a size, a float in (0, 1] a fraction.

    >>> resolve_transition(0.4, 10000, 1), resolve_transition(3000, 10000, 1), resolve_transition(None, 1000, 0)
    (4000, 3000, 400)
    >>> resolve_transition(0.4, 300, 1)       # a fraction below 256 + specials starts at the base
    257
    """
    base = 256 + n_specials
    if transition is None:
        transition = DEFAULT_TRANSITION
    if isinstance(transition, float) and transition <= 1:
        if transition <= 0:
            raise ValueError(f"transition fraction must be in (0, 1], got {transition}")
        size = max(base, int(round(transition * vocab_size)))     # a fraction never goes below the base
    else:
        size = int(transition)
    if size < base or size > vocab_size:
        raise ValueError(f"transition {size} must be between {base} (256 + special tokens) and vocab_size {vocab_size}")
    return size


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
    """
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


# ==== Units ====================================================================================


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
    flags[nonempty[_ASCII_SPACE[first]]] |= STARTS_SPACE
    flags[nonempty[_ASCII_SPACE[last]]] |= ENDS_SPACE
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


def looks_encoded_counts(n, ws, punct, alnum, digits):
    """``reference.looks_encoded`` on class counts (numpy arrays or ints)."""
    nonspace = n - ws
    return ((nonspace >= ENCODED_MIN_CHARS) & (ws * ENCODED_MAX_SPACE_RATIO <= n)
            & (punct * ENCODED_MIN_PUNCT_RATIO >= nonspace) & (alnum * ENCODED_MIN_ALNUM_RATIO >= nonspace)
            & (digits * ENCODED_MIN_DIGIT_RATIO >= nonspace))


def _units_chunk(task: tuple) -> tuple:
    """Worker (a thread): the units (as word-id runs, in text order) of ``path[start:end)``."""
    path, start, end, specials, pattern, keep_below, index, flags, cut_spaces, stamp, classes, seg = task
    return _units_of(read_range(path, start, end, stamp), path, specials, pattern, keep_below, index, flags,
                     cut_spaces, classes, seg)


def _units_of(buf, path: str, specials, pattern: str, keep_below: int, index, flags, cut_spaces: bool,
              classes: Optional[np.ndarray] = None, seg: Optional[tuple] = None) -> tuple:
    """The units of ``buf`` (word-id runs, in text order; with ``classes``, the units of an
    encoded-looking region carry ``ENCODED_MARK`` at their end; with ``seg``, the stage-1
    segmentation ``(symbols, offsets)`` of the words, each word written as its stage-1 tokens)."""
    spans, _ = split_spans(buf, 0, len(buf), specials)
    counter = UnitCounter()
    name = pattern_name(pattern)
    if name is not None:
        # units in text order, not counted: nearly all are distinct, and stage 2 deduplicates its
        # pieces (stage2_merges); a table of them would only cost a hash table
        seg_symbols, seg_offsets = seg if seg is not None else (None, None)
        data, starts, seen, kept, missing = chunk_unit_stream(buf, spans, PATTERN_IDS[name], index, flags,
                                                              keep_below, cut_spaces, classes, seg_symbols,
                                                              seg_offsets)
        if missing:
            raise InputChanged(path, "changed while it was read: a pretoken is missing from the word table "
                                     "counted earlier; nothing was written")
        return data, starts, np.ones(starts.size - 1, dtype=np.int64), seen, kept
    for s, e in spans:
        ends = pretoken_ends(buf[s:e], pattern) + s
        ids = index.word_ids(buf, ends, s)
        if ids.size and ids.min() < 0:
            raise InputChanged(path, "changed while it was read: a pretoken is missing from the word table "
                                     "counted earlier; nothing was written")
        f = flags[ids]
        num = (f & NUMERIC) > 0
        hard = num[1:] | num[:-1]
        if cut_spaces:
            hard |= ((f[:-1] & ENDS_SPACE) > 0) & ((f[1:] & STARTS_SPACE) > 0)
        cut = np.flatnonzero(hard) + 1
        bounds = np.concatenate(([0], cut, [ids.size])).astype(np.int64)
        ids32 = ids.astype(np.uint32)
        if classes is not None and ids.size:
            ids32, bounds = _mark_encoded(ids, ids32, bounds, f, classes, cut_spaces)
        counter.add_units(ids32, bounds, 1, keep_below)
    data, starts, counts = counter.to_arrays()
    if seg is not None:
        data, starts = expand_units(data, starts, seg[0], seg[1])
    return data, starts, counts, counter.n_seen, counter.n_kept


def _mark_encoded(ids, ids32, bounds, f, classes, cut_spaces):
    """The units ``ids32[bounds[k]:bounds[k+1]]`` of one span, with ``ENCODED_MARK`` appended to
    those of the regions that look encoded (the Python twin of ``chunk_unit_stream``'s regions)."""
    rstart = np.zeros(ids.size, dtype=bool)
    rstart[0] = True
    if cut_spaces:
        rstart[1:] = ((f[:-1] & ENDS_SPACE) > 0) & ((f[1:] & STARTS_SPACE) > 0)
    rfirst = np.flatnonzero(rstart)
    c = classes[ids].astype(np.int64)
    sums = np.add.reduceat(c, rfirst, axis=0)
    enc_region = looks_encoded_counts(sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3], sums[:, 4])
    region_of = np.cumsum(rstart) - 1
    enc_unit = enc_region[region_of[bounds[:-1]]]
    if not enc_unit.any():
        return ids32, bounds
    ids32 = np.insert(ids32, bounds[1:][enc_unit], np.uint32(ENCODED_MARK))
    bounds = bounds + np.concatenate(([0], np.cumsum(enc_unit)))
    return ids32, bounds


def count_units(path: str, table: WordTable, specials: Sequence[bytes], pattern: str, num_workers: int,
                chunk_bytes: int, sample_fraction: float = 1.0, cut_spaces: bool = True,
                flags: Optional[np.ndarray] = None, executor=None,
                classes: Optional[np.ndarray] = None, seg: Optional[tuple] = None) -> tuple[tuple, dict]:
    """The stage-2 units of a corpus as runs of word ids (rows of ``table``), in text order, each with
    count 1 (the custom-pattern path counts them; stage 2 deduplicates pieces either way).

    ``seg`` (``(seg_symbols, seg_offsets)``, the stage-1 segmentation of the table's words): the units
    are runs of stage-1 tokens instead, each word written as its tokens while it is scanned (what
    ``expand_units`` makes of the word-id units; the marks stay).

    ``classes`` (``word_classes(table)``): mark the units of regions that look encoded
    (``chunk_unit_stream``); ``stage2_table`` strips the marks and gives them no weight.

    Chunks are scanned on worker threads (``workers.run_ordered``) that share one read-only
    ``WordIndex`` of the table; the per-chunk lists are joined in order in the calling thread. With an
    ``executor`` (``runtime.executors``: a cluster, or anything ``open_executor`` takes) the shards
    are counted where it runs instead (:func:`count_units_sharded`); the result is the same.
    """
    if executor is not None or is_url(path):
        units, info = count_units_sharded(path, table, specials, pattern, num_workers, chunk_bytes,
                                          sample_fraction, cut_spaces, flags, executor, classes)
        return _expanded(units, seg), info
    stamp = FileStamp.of(path)
    # Units run across newlines: cut chunks at document edges only.
    chunks = file_chunks(path, chunk_bytes, specials, pattern_name(pattern), inside_documents=False, stamp=stamp)
    keep_below = 0xFFFFFFFFFFFFFFFF if sample_fraction >= 1 else int(sample_fraction * 2 ** 64)
    if flags is None:
        flags = word_flags(table)
    index = WordIndex(table.arena, table.offsets)
    if seg is not None:
        seg = (np.ascontiguousarray(seg[0], dtype=np.uint32), np.ascontiguousarray(seg[1], dtype=np.int64))
    tasks = [(path, s, e, list(specials), pattern, keep_below, index, flags, cut_spaces, stamp, classes, seg)
             for s, e in chunks]
    parts = []
    seen = kept = 0

    def absorb(result) -> None:
        nonlocal seen, kept
        parts.append(result[:3])
        seen += result[3]
        kept += result[4]

    run_ordered(_units_chunk, tasks, min(num_workers, len(tasks)), absorb)
    stamp.check()
    data, starts, counts = _concat_units(parts)
    info = {"units_seen": seen, "units_kept": kept, "unique_units": int(counts.size)}
    return (data, starts, counts), info


def record_table_rows(recorded: list, table: WordTable, num_workers: int = 1) -> tuple[list, np.ndarray]:
    """Every pretoken of the counting pass's record as its row of ``table``, in text order, and where
    the stretches of text start: returns ``(rows, breaks)`` (``rows``: one uint32 array per chunk,
    read one after the other: each chunk's own ids rewritten in place, so the record takes no
    second 4 B a pretoken; ``breaks``: sorted int64 positions in that sequence, the first 0 and the
    last the number of pretokens). Needs only the word table, not stage 1, so training makes it
    while stage 1 runs. The record's ids are rows afterwards (it is not read as ids again).

    Each chunk's words are looked up once in ``table`` (``WordIndex``), so its pretokens become table
    rows by a gather; a chunk's pretokens are cut into its spans by their byte lengths; a span that
    reaches the end of its chunk goes on in the next chunk when that one starts with text (the
    counting chunks are cut inside documents, the units are not). On two threads with
    ``num_workers`` 2 (chunks in turn).

    Conservation, checked: every chunk word is in the table, the pretokens of each span cover its
    bytes exactly, and the rows of all the pretokens count what the table counts (``np.bincount``);
    ``InternalError`` otherwise.
    """
    index = WordIndex(table.arena, table.offsets)
    n_words = table.n_words
    sizes = [int(r[2].size) for r in recorded]
    at = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    segments = [np.asarray(r[2]) for r in recorded]
    for k, ids in enumerate(segments):
        if ids.dtype != np.uint32 or not ids.flags.c_contiguous or not ids.flags.writeable:
            segments[k] = np.array(ids, dtype=np.uint32)        # (the record lends writable uint32)
    cuts: list = [None] * len(recorded)

    def fill(ks: list) -> np.ndarray:
        """Chunks ``ks`` into ``all_rows``; their pretokens counted per table row."""
        counts = np.zeros(n_words, dtype=np.int64)
        for k in ks:
            arena, offsets, ids, spans, _ = recorded[k]
            rows = index.word_ids(arena, offsets[1:], 0) if len(offsets) > 1 else np.zeros(0, np.int64)
            spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
            try:      # in place: each id is read before its row is written over it
                cuts[k] = record_rows(rows, segments[k], offsets, np.cumsum(spans[:, 1] - spans[:, 0]),
                                      segments[k], 0, counts)
            except ValueError as exc:
                raise InternalError(f"the record of chunk {k}: {exc}") from None
        return counts

    groups = [list(range(len(recorded)))] if num_workers < 2 else \
        [list(range(0, len(recorded), 2)), list(range(1, len(recorded), 2))]
    if len(groups) == 2:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2, thread_name_prefix="bpe_core-record") as ex:
            counted = sum(ex.map(fill, groups))
    else:
        counted = fill(groups[0])
    # Conservation: the rows of the pretokens count what the word table counts.
    if not np.array_equal(counted, table.counts):
        raise InternalError("the recorded pretokens do not count what the word table counts")
    # Spans -> breaks: a span starts a new stretch of text unless it goes on from the chunk before
    # (both touch the chunk edge: the counting chunks cut documents, the units do not).
    firsts, joins_prev = [np.zeros(1, np.int64)], False
    for k, (_, _, ids, spans, n_bytes) in enumerate(recorded):
        spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        if not spans.shape[0]:
            joins_prev = False
            continue
        f = at[k] + np.concatenate(([0], cuts[k][:-1]))
        firsts.append(f[1:] if joins_prev and spans[0, 0] == 0 else f)
        joins_prev = bool(spans[-1, 1] == n_bytes)
    firsts.append(np.array([int(at[-1])], np.int64))
    breaks = np.unique(np.concatenate(firsts))      # sorted; a repeated position is one break
    return segments, breaks


def slice_segments(segments: list, lo: int, hi: int) -> list:
    """Positions ``lo:hi`` of arrays read one after the other, as a list of views (no copy).

    >>> [a.tolist() for a in slice_segments([np.arange(3), np.arange(3, 5), np.arange(5, 9)], 2, 6)]
    [[2], [3, 4], [5]]
    """
    out, at = [], 0
    for a in segments:
        a_lo, a_hi = max(lo - at, 0), min(hi - at, a.size)
        if a_lo < a_hi:
            out.append(a[a_lo:a_hi])
        at += a.size
    return out


def units_from_records(recorded: list, table: WordTable, flags: np.ndarray, cut_spaces: bool = True,
                       classes: Optional[np.ndarray] = None, seg: Optional[tuple] = None,
                       num_workers: int = 1, rows: Optional[tuple] = None) -> tuple[tuple, dict]:
    """The stage-2 units of a corpus from the counting pass's record (``count_corpus(record=)``: per
    chunk in text order, its own sorted table, the row in it of every pretoken, its text spans and
    size), as ``count_units`` lists them without a sample (tested equal): no second pre-tokenization.

    The record's pretokens become rows of ``table`` cut into stretches of text (:func:`record_table_rows`;
    ``rows``: its result, when the caller had it made while stage 1 ran); ``id_unit_stream`` lists the
    units, the two halves of the corpus (cut at a special token) on two threads. Returns the units as a
    list of one or two parts ``(data, starts, counts)`` (the halves, not joined), and the figures; with
    ``seg`` each part also has ``encoded`` (bool per unit: which units came from regions that look
    encoded; they carry no ``ENCODED_MARK`` then, see ``stage2_table``).
    """
    segments, breaks = rows if rows is not None else record_table_rows(recorded, table, num_workers)
    n_rows = int(breaks[-1])
    seg_symbols, seg_offsets = seg if seg is not None else (None, None)
    # two halves, cut at the break nearest the middle: one thread each
    halves = [breaks]
    if num_workers >= 2 and breaks.size > 2:
        m = int(np.searchsorted(breaks, n_rows // 2))
        m = min(max(m, 1), breaks.size - 2)
        halves = [breaks[:m + 1], breaks[m:]]

    # the output's size, about: stage-1 tokens per pretoken, weighted as the text has them (room asked
    # for at once instead of growing by copies into fresh pages; a hint, 5% over)
    per_id = 1.0
    if seg_offsets is not None and int(table.counts.sum()) > 0:
        per_id = float((np.diff(seg_offsets) * table.counts).sum()) / float(table.counts.sum())

    # with a segmentation the encoded units come flagged, not marked (no marks to take off after), and
    # as uint16 when every stage-1 token fits: half the bytes to write and for stage 2 to read
    narrow = seg_symbols is not None and (seg_symbols.size == 0 or int(seg_symbols.max()) <= 0xFFFF)

    def run(b):
        lo, hi = int(b[0]), int(b[-1])
        return id_unit_stream(slice_segments(segments, lo, hi), b - lo, flags, cut_spaces, classes,
                              seg_symbols, seg_offsets,
                              reserve=int((hi - lo) * per_id * 1.05) + (hi - lo) // 64,
                              marks=seg_symbols is None, narrow=narrow)

    if len(halves) == 2:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2, thread_name_prefix="bpe_core-units") as ex:
            parts = list(ex.map(run, halves))
    else:
        parts = [run(halves[0])]
    seen = sum(p[2] for p in parts)
    kept = sum(p[3] for p in parts)
    n_units = sum(p[1].size - 1 for p in parts)
    # the halves stay apart (stage2_merges takes the units in parts: no copy of 60 M tokens to join them)
    return ([(p[0], p[1], np.ones(p[1].size - 1, dtype=np.int64)) + tuple(p[4:]) for p in parts],
            {"units_seen": seen, "units_kept": kept, "unique_units": n_units})


class UnitsContext:
    """What every stage-2 units task needs: the word table (as a ``WordIndex``, built once per
    process on first use) and the word flags. Shipped once per worker (``Executor.share``)."""

    def __init__(self, arena: np.ndarray, offsets: np.ndarray, flags: np.ndarray,
                 classes: Optional[np.ndarray] = None):
        self.arena, self.offsets, self.flags, self.classes = arena, offsets, flags, classes
        self._index = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"arena": self.arena, "offsets": self.offsets, "flags": self.flags, "classes": self.classes}

    def __setstate__(self, state):
        self.__init__(state["arena"], state["offsets"], state["flags"], state.get("classes"))

    @property
    def index(self) -> WordIndex:
        with self._lock:
            if self._index is None:
                self._index = WordIndex(self.arena, self.offsets)
            return self._index


def units_shard(shard, context: UnitsContext, specials: Sequence[bytes], pattern: str, keep_below: int,
                cut_spaces: bool) -> tuple:
    """Task: the units of one shard (``corpus.shards.Shard``), as ``_units_chunk`` gives them."""
    return _units_of(shard.read(), shard.source, specials, pattern, keep_below, context.index, context.flags,
                     cut_spaces, context.classes)


def _expanded(units: tuple, seg: Optional[tuple]) -> tuple:
    """Word-id units ``(data, starts, counts)`` as stage-1 token units when ``seg`` is given
    (``expand_units``: marks stay)."""
    if seg is None:
        return units
    data, starts, counts = units
    data, starts = expand_units(np.ascontiguousarray(data, dtype=np.uint32),
                                np.ascontiguousarray(starts, dtype=np.int64), seg[0], seg[1])
    return data, starts, counts


def _concat_units(parts: list) -> tuple:
    """Unit lists ``(data, starts, counts, ...)`` one after another, as one ``(data, starts, counts)``."""
    if not parts:
        return np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # fresh arrays, written whole: faulted in at once (prefault), not page by page
    data = prefault(np.empty(sum(p[0].size for p in parts), dtype=np.uint32))
    np.concatenate([p[0] for p in parts], out=data, casting="unsafe")
    counts = prefault(np.empty(sum(p[2].size for p in parts), dtype=np.int64))
    np.concatenate([p[2] for p in parts], out=counts, casting="unsafe")
    starts = prefault(np.empty(counts.size + 1, dtype=np.int64))
    starts[0] = 0
    np.cumsum(np.concatenate([np.diff(p[1]) for p in parts]), out=starts[1:])
    return data, starts, counts


def combine_units(parts: list) -> tuple:
    """Combine: unit lists one after another, in order (so any tree of combines gives the list that
    joining them one by one gives, the list ``count_units`` makes on threads)."""
    if len(parts) == 1:
        return parts[0]
    data, starts, counts = _concat_units(parts)
    return data, starts, counts, sum(p[3] for p in parts), sum(p[4] for p in parts)


def count_units_sharded(path: str, table: WordTable, specials: Sequence[bytes], pattern: str, num_workers: int,
                        chunk_bytes: int, sample_fraction: float = 1.0, cut_spaces: bool = True,
                        flags: Optional[np.ndarray] = None, executor=None,
                        classes: Optional[np.ndarray] = None) -> tuple[tuple, dict]:
    """``count_units`` on an executor: shards of a local path or URL, the word table shipped once
    per worker, the unit tables combined in a tree (on the workers) and one table returned."""
    keep_below = 0xFFFFFFFFFFFFFFFF if sample_fraction >= 1 else int(sample_fraction * 2 ** 64)
    if flags is None:
        flags = word_flags(table)
    with open_executor(executor, num_workers) as ex:
        shards = source_shards(path, chunk_bytes, specials, pattern_name(pattern), inside_documents=False)
        context = ex.share(UnitsContext(table.arena, table.offsets, flags, classes))
        data, starts, counts, seen, kept = ex.map_reduce(
            units_shard, shards, combine_units, shared=(context, list(specials), pattern, keep_below, cut_spaces))
    info = {"units_seen": seen, "units_kept": kept, "unique_units": int(counts.shape[0])}
    return (data, starts, counts), info


def stage2_table(units: tuple, table: WordTable, seg_symbols: np.ndarray, seg_offsets: np.ndarray,
                 numeric: np.ndarray, token_lengths: np.ndarray,
                 cut_numbers: bool = True,
                 expanded: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Expand word-id units into stage-1 token units; with ``cut_numbers`` (the ``"units"`` split)
    numeric words are split at their hard cuts. Returns ``(symbols, offsets, counts, encoded)``:
    ``encoded`` per unit, whether it came from a region that looks encoded (its word ids ended with
    ``ENCODED_MARK``, stripped here: ``strip_marks``).

    ``expanded``: the units already are stage-1 tokens (``count_units(seg=)``); only the marks are
    stripped, in place (the caller gives the arrays up; not with ``cut_numbers``, which needs the word
    ids). ``units`` may carry a fourth array, ``encoded`` (``units_from_records`` with a segmentation):
    then they have no marks and are returned as they are."""
    data, starts, counts = units[:3]
    if len(units) == 4:
        if not expanded or cut_numbers:
            raise ValueError("units flagged as encoded (no marks) must be expanded, without cut_numbers")
        return (np.asarray(data), np.asarray(starts, dtype=np.int64), np.asarray(counts, dtype=np.int64),
                np.asarray(units[3], dtype=bool))
    if expanded and cut_numbers:
        raise ValueError("cut_numbers needs word-id units, not expanded ones")
    data = np.asarray(data)
    starts = np.asarray(starts, dtype=np.int64)
    if expanded:        # the caller gives the arrays up: strip in place
        if not (data.dtype == np.uint32 and data.flags.c_contiguous and data.flags.writeable):
            data = np.array(data, dtype=np.uint32)
        if not (starts.flags.c_contiguous and starts.flags.writeable):
            starts = np.array(starts)
        data, starts, encoded = strip_marks(data, starts)
        return data, starts, np.asarray(counts, dtype=np.int64), encoded
    n_units = starts.shape[0] - 1
    encoded = np.zeros(n_units, dtype=bool)
    if n_units > 0 and data.size:
        nonempty = starts[1:] > starts[:-1]
        encoded[nonempty] = data[starts[1:][nonempty] - 1] == ENCODED_MARK
        if encoded.any():       # on copies: the caller may use its units again
            data, starts, encoded = strip_marks(np.array(data, dtype=np.uint32), starts.copy())
    lengths = np.diff(starts)
    if not cut_numbers:
        symbols, offsets = expand_units(np.ascontiguousarray(data), starts, seg_symbols, seg_offsets)
        return symbols, offsets, np.asarray(counts, dtype=np.int64), encoded
    single_numeric = (lengths == 1) & numeric[data[starts[:-1]]] if lengths.size else np.zeros(0, bool)
    plain = np.flatnonzero(~single_numeric)
    # plain units: expand all of them in one native pass
    keep_bytes = np.repeat(~single_numeric, lengths)
    plain_starts = np.zeros(plain.size + 1, dtype=np.int64)
    np.cumsum(lengths[plain], out=plain_starts[1:])
    symbols, offsets = expand_units(np.ascontiguousarray(data[keep_bytes]), plain_starts, seg_symbols, seg_offsets)
    out_counts = [counts[plain]]
    out_encoded = [encoded[plain]]
    extra_syms, extra_lens = [], []
    arena = table.arena.tobytes()
    for u in np.flatnonzero(single_numeric):
        w = int(data[starts[u]])
        seg = seg_symbols[seg_offsets[w]:seg_offsets[w + 1]]
        word = arena[table.offsets[w]:table.offsets[w + 1]]
        cuts = numeric_cuts(word, token_lengths[seg].tolist())
        for a, b in zip([0] + cuts, cuts + [len(seg)]):
            extra_syms.append(seg[a:b])
            extra_lens.append(b - a)
            out_counts.append(np.array([counts[u]], dtype=np.int64))
            out_encoded.append(np.array([encoded[u]], dtype=bool))
    if extra_syms:
        symbols = np.concatenate([symbols] + extra_syms).astype(np.uint32)
        offsets = np.concatenate([offsets, offsets[-1] + np.cumsum(extra_lens)]).astype(np.int64)
    return symbols, offsets, np.concatenate(out_counts).astype(np.int64), np.concatenate(out_encoded)


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


def units_source_shard(shard, context: UnitsContext, specials: Sequence[bytes], pattern: str, keep_below: int,
                       cut_spaces: bool) -> tuple:
    """Task: the unique units of one shard of ``corpus.sources`` (its blocks in order, read where
    the task runs), as :func:`units_shard` gives them for a byte range."""
    sh = private_shard(shard)
    parts = []
    for block in shard_blocks(sh):
        buf = block.data if isinstance(block.data, np.ndarray) else np.frombuffer(block.data, np.uint8)
        parts.append(_units_of(buf, block.label, specials, pattern, keep_below, context.index, context.flags,
                               cut_spaces, context.classes))
    if not parts:
        data, starts, counts = UnitCounter().to_arrays()
        return data, starts, counts, 0, 0
    return combine_units(parts)


def _has_url(inputs) -> bool:
    """Whether the inputs (a spec or a list of specs) name an fsspec URL."""
    specs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    return any(isinstance(s, str) and is_url(s) for s in specs)


def count_units_on(executor, sources, opts: ReadOptions, table: WordTable, specials: Sequence[bytes], pattern: str,
                   chunk_bytes: int, sample_fraction: float = 1.0, cut_spaces: bool = True,
                   flags: Optional[np.ndarray] = None, classes: Optional[np.ndarray] = None,
                   num_workers: int = 1, seg: Optional[tuple] = None) -> tuple[tuple, dict]:
    """``count_units`` over the shards of ``sources`` (``corpus.sources``) on an executor: the
    units of the corpus those sources make (items joined by the first special token), as
    ``count_units`` counts them on that corpus spooled to one file. Shards are cut at document
    edges only (units run across newlines); the separator between items is a document edge.
    ``executor`` None: this machine's threads (``num_workers``), as for URL inputs without a cluster.
    ``seg``: as for ``count_units`` (the word-id units are expanded where they are joined).

    Raises:
        ValueError: an input a worker cannot read (standard input, an iterator).
    """
    check_distributable(sources)
    keep_below = 0xFFFFFFFFFFFFFFFF if sample_fraction >= 1 else int(sample_fraction * 2 ** 64)
    if flags is None:
        flags = word_flags(table)
    opts.chunk_bytes, opts.special_tokens = chunk_bytes, list(specials)
    opts.pattern, opts.inside_documents = pattern_name(pattern), False
    shards = [sh for src in sources for sh in src.shards(opts)]
    with open_executor(executor, num_workers) as ex:
        context = ex.share(UnitsContext(table.arena, table.offsets, flags, classes))
        data, starts, counts, seen, kept = ex.map_reduce(
            units_source_shard, shards, combine_units,
            shared=(context, list(specials), pattern, keep_below, cut_spaces))
    for src in sources:
        if src.stamp is not None:
            src.stamp.check()
    info = {"units_seen": seen, "units_kept": kept, "unique_units": int(counts.shape[0])}
    return _expanded((data, starts, counts), seg), info
# ==== Stage 2 on pieces =======================================================================

#: The first cut of stage 2 (:func:`stage2_merges`): the count of the distinct stage-1 pair at this
#: rank (times the number of stage-2 merges) when the pairs are sorted by count. Measured on en_train:
#: the last stage-2 merge counts 179 (30 MB, 8k) and 220 (230 MB, 32k), the pair at rank 2.5 x merges
#: ~140 and ~180; a cut above the last merge's count costs a restart (exact either way).
STAGE2_CUT_RANK = 2.5
#: The first cut is drawn from a sample of the pairs (exact counts of 1 in ``2**b`` distinct pairs,
#: chosen by hash) that still holds at least this many pairs above the cut's rank: the cut is then
#: within a few percent of the exact one (any cut is exact; a cut a little off costs a few pieces
#: more, or a restart).
STAGE2_CUT_SAMPLE_RANKS = 1024
#: The sketch of stage 2's pair counts (``pair_sketch``) has a counter per this many windows (a
#: power of two between 2**10 and 2**24): en_train at 32k, 57.6 M windows, 2**22 counters (8 MiB a
#: thread); its keep bitmap (512 KiB) stays in the CPU's cache while the units are cut.
STAGE2_WINDOWS_PER_COUNTER = 16


def cut_sample_bits(n_merges: int) -> int:
    """How finely :func:`stage2_merges` samples the pairs for its first cut (``2**-bits``, at most
    1 in 64): as coarse as still leaves ``STAGE2_CUT_SAMPLE_RANKS`` pairs above the cut's rank.

    >>> cut_sample_bits(100), cut_sample_bits(19200)     # all pairs; 1 in 32 (48,000 ranks -> 1,500)
    (0, 5)
    """
    k = int(STAGE2_CUT_RANK * n_merges)
    bits = 0
    while bits < 6 and (k >> (bits + 1)) >= STAGE2_CUT_SAMPLE_RANKS:
        bits += 1
    return bits


#: the steps of stage 2's budget share and sample fraction (``stage2_budget_share``, ``sample_fraction``)
OVERHEAD_STEP = 64 << 20
FRACTION_STEPS = 256


def stage2_budget_share(memory_limit: int, parent_overhead: int, table_ram: int) -> int:
    """The bytes stage 2 may take: the budget less the process before the work and twice the word
    table, at least 64 MiB. The process's size is measured (its RSS), so it is rounded up to a whole
    ``OVERHEAD_STEP`` first: a few KB more or less in the interpreter must not change the share,
    hence the sample of a tight budget and the merges (the same command trains the same merges).

    >>> mib = 1 << 20
    >>> stage2_budget_share(1024 * mib, 44 * mib, 100 * mib) == stage2_budget_share(1024 * mib, 45 * mib + 7, 100 * mib)
    True
    >>> stage2_budget_share(1024 * mib, 44 * mib, 100 * mib) // mib
    760
    """
    overhead = -(-max(int(parent_overhead), 0) // OVERHEAD_STEP) * OVERHEAD_STEP
    return max(int(memory_limit) - overhead - 2 * int(table_ram), 64 << 20)


def sample_fraction(need: int, share: int) -> float:
    """The share of the units stage 2 trains on when all of them (``need`` bytes) do not fit its
    ``share``: the fitting fraction rounded down to a whole 1/``FRACTION_STEPS`` (at least one
    step), 1.0 when they fit.

    >>> sample_fraction(100, 100), sample_fraction(1000, 521), sample_fraction(1000, 523)
    (1.0, 0.51953125, 0.51953125)
    """
    if need <= share:
        return 1.0
    return max(int(share * FRACTION_STEPS // need), 1) / FRACTION_STEPS


def rows_before_stage1(text_bytes: int, budget_share: int) -> bool:
    """Whether training makes the record's table rows while stage 1 runs: only when stage 2 will
    surely see the whole corpus, i.e. even one stage-1 token per byte of every pretoken fits the
    budget's share (``STAGE2_BYTES_PER_SYMBOL`` each); otherwise after stage 1, when it is known.
    Either way the rows, units and merges are the same (tested on both sides).

    >>> rows_before_stage1(10, 10 * STAGE2_BYTES_PER_SYMBOL), rows_before_stage1(11, 10 * STAGE2_BYTES_PER_SYMBOL)
    (True, False)
    """
    return text_bytes * STAGE2_BYTES_PER_SYMBOL <= budget_share


def sketch_bits(n_windows: int) -> int:
    """log2 of the number of counters in stage 2's pair sketch for ``n_windows`` windows.

    >>> sketch_bits(1000), sketch_bits(57_566_692), sketch_bits(10 ** 11)
    (10, 22, 24)
    """
    return max(10, min(24, (n_windows // STAGE2_WINDOWS_PER_COUNTER).bit_length()))


@dataclass
class Stage2Result:
    """What :func:`stage2_merges` returns: the merges ``(left_id, right_id, new_id)``, the bytes of
    every token id, the token count of the units at the end (with their ``counts``), the last
    engine's stats, ``info`` (the cuts tried: pieces and symbols of each) and ``seconds`` (pair
    levels, cuts and replays, engine builds, merge loops)."""

    steps: list
    tokens: list
    final_tokens: int
    engine_stats: dict
    info: dict
    seconds: dict


def first_cut(pair_counts: np.ndarray, n_merges: int, sample_bits: int = 0) -> int:
    """The first cut :func:`stage2_merges` tries: the count of the pair at rank
    ``STAGE2_CUT_RANK * n_merges`` (1 when there are fewer pairs); ``pair_counts`` may be those of a
    ``1 / 2**sample_bits`` sample of the pairs (:func:`cut_sample_bits`), whose rank is scaled down.

    >>> first_cut(np.arange(1, 101), 10)        # the 26th greatest of 1..100
    75
    >>> first_cut(np.arange(1, 101), 40, sample_bits=2)     # a quarter's rank: 100 // 4 = 25
    75
    """
    k = int(STAGE2_CUT_RANK * n_merges) >> sample_bits
    if k >= pair_counts.size or k < 0:
        return 1
    return max(1, int(np.partition(pair_counts, pair_counts.size - 1 - k)[pair_counts.size - 1 - k]))


@contextlib.contextmanager
def stage2_huge_pages(on: bool):
    """Inside the block, stage 2's numpy arrays of 4 MiB and more (``runtime.memmon.numpy_huge_pages``)
    and the engine's build buffers (cells, window pair ids: ``engine.merge.huge_pages``) ask for transparent
    huge pages (``on``) or not; the previous settings come back after it. Memory advice only: the
    merges never depend on it (tested). The unit and piece lists keep 4 KiB pages: with huge pages
    their passes got slower on this project's VM (fresh 2 MiB blocks cost more there than the 4 KiB
    pages a process has just freed)."""
    buffers = huge_pages(on)
    try:
        with numpy_huge_pages(on):
            yield
    finally:
        huge_pages(buffers)


def stage2_merges(symbols: np.ndarray, offsets: np.ndarray, weights: np.ndarray, counts: np.ndarray,
                  tokens: Sequence[bytes], n_merges: int, allowed, bounded: bool = True,
                  cut: Optional[int] = None, spill_dir: Optional[str] = None,
                  map_threshold: int = MAP_THRESHOLD, threads: int = 1,
                  sketch_size: Optional[int] = None,
                  regenerate: Optional[Callable[[], tuple]] = None) -> Stage2Result:
    """Stage 2's merges on units of stage-1 tokens (``symbols``/``offsets``, ``weights`` for the
    engine, ``counts`` for the final token count), equal to one engine run on the whole units.

    **Pieces.** A stage-2 token is a run of whole stage-1 tokens, so a window ``(X, Y)`` always lies
    on one boundary between stage-1 tokens, of the pair (last stage-1 token of X, first of Y); with
    ``bounded`` (the ``distinct`` rule: every stage-2 id is built by one merge, so its stage-1 tokens
    are fixed), every occurrence of ``(X, Y)`` lies on a boundary of that one stage-1 pair, and its
    count is at most that pair's count at the start. So while the merges count at least ``cut``, none
    crosses a boundary whose stage-1 pair counts less: the units are cut there, the pieces
    deduplicated with summed weights (``cut_pieces``; far fewer symbols than the units), and the
    engine runs on the pieces until the best pair counts less than ``cut``
    (``MergeEngine.run(min_count=)``); the pairs it does not see count less, so it merges what the
    whole units would. If it stops before ``n_merges``, the cut comes down (a quarter), the units are
    cut again, the merges so far are replayed on the new pieces (``RankMerger``, as the loop rewrote
    them) and the engine goes on. At ``cut`` 1 only boundaries that count 0 are cut (exact for any
    rules: pairs that count 0 are never merged). Without ``bounded`` the cut is 1.

    **Counts by a sketch.** The stage-1 pair counts are not counted exactly: one pass adds every
    window's weight to one of ``2**sketch_bits`` counters by a hash of its pair (``pair_sketch``), so a
    counter is at least the count of each pair it holds. A window is cut only where its counter is
    below the cut (``cut_pieces(keep=)``: a bitmap of the counters at or above the cut, small enough to
    stay in the CPU's cache), so no window the exact counts keep is cut; a collision only keeps a
    window the exact counts would cut (a longer piece; 1-3% more symbols on en_train). The first cut
    comes from the exact counts of a sample of the pairs (``cut_sample_bits``, ``first_cut``).

    With ``bounded`` the engine also forgets every pair a merge makes that counts less than the cut
    (``MergeEngine(prune_below=cut)``): no merge rebuilds a token's bytes, so such a pair's count
    never rises and it cannot be merged before the engine stops at the cut; the pair map stays small.

    ``symbols``, ``offsets``, ``weights``, ``counts`` may also be lists of one or two arrays each: the
    units in parts (each part's offsets are positions in its own symbols), one thread per part, the
    result of the parts joined (so the caller need not join them). ``cut``: the first cut (default
    :func:`first_cut`; tests force others). ``threads``: 2 counts the pairs and cuts the pieces on two
    threads (the same result). ``sketch_size``: log2 of the number of counters (default
    :func:`sketch_bits`; tests force tiny sketches full of collisions).

    ``regenerate``: a function that lists the same units again (``(symbols, offsets, weights,
    counts)``, as given). With it the units are let go once they are cut (the lists given are
    emptied), so the engine's build and merge loop reuse their memory instead of fresh pages (300 MB
    at 32k on en_train); only a restart lists them again (checked: the same stage-1 tokens and
    windows, or ``InternalError``).

    Plain equivalent: ``MergeEngine(symbols, offsets, weights, tokens).run(n_merges, allowed)``
    (tested equal: ``tests/test_superbpe.py``).
    """
    given = (symbols, offsets, weights, counts)
    parts, (symbols, offsets, weights, counts) = _stage2_parts(*given)
    seconds = {"sketch": 0.0, "cut": 0.0, "build": 0.0, "loop": 0.0}
    t0 = time.perf_counter()
    phase("stage-2 sketch")
    threads = min(max(threads, 1), 2)
    n_windows = sum(max(int(p[0].size) - (int(p[1].size) - 1), 0) for p in (parts or [(symbols, offsets)]))
    sample = cut_sample_bits(n_merges) if bounded and cut is None else 6
    bits = sketch_bits(n_windows) if sketch_size is None else sketch_size
    if parts is not None:
        sketch, sampled_counts, excess = pair_sketch_parts([p[:3] for p in parts], bits, sample)
    else:
        sketch, sampled_counts, excess = pair_sketch(symbols, offsets, weights, bits, sample, threads=threads)
    # Conservation, checked: the counters and what their caps left out hold every window's weight once,
    # and the pieces (and the one-symbol pieces) hold every stage-1 token of the units
    whole = parts or [(symbols, offsets, weights, counts)]
    windows_weight = sum(int((np.maximum(np.diff(o) - 1, 0) * np.maximum(w, 0)).sum()) for _, o, w, _ in whole)
    if int(sketch.sum(dtype=np.uint64)) + excess != windows_weight:
        raise InternalError(f"stage 2's pair sketch holds {int(sketch.sum(dtype=np.uint64)) + excess} windows, "
                            f"the units {windows_weight}")
    units_tokens = sum(int((np.diff(o) * c).sum()) for _, o, _, c in whole)
    del whole
    released = False
    if not bounded:
        cut = 1
    elif cut is None:
        cut = first_cut(sampled_counts, n_merges, sample)
    del sampled_counts
    cut = int(min(max(cut, 1), 0xFFFFFFFF))
    steps: list = []
    tokens = list(tokens)
    tried = []
    t1 = time.perf_counter()
    seconds["sketch"] += t1 - t0
    while True:
        t0 = time.perf_counter()
        phase("stage-2 cut")
        if released:            # a restart: the units again (they were let go after the last cut)
            parts, (symbols, offsets, weights, counts) = _stage2_parts(*regenerate())
            again = parts or [(symbols, offsets, weights, counts)]
            again_windows = sum(max(int(p[0].size) - (int(p[1].size) - 1), 0) for p in again)
            again_tokens = sum(int((np.diff(o) * c).sum()) for _, o, _, c in again)
            del again
            if (again_windows, again_tokens) != (n_windows, units_tokens):
                raise InternalError(f"stage 2's units listed again hold {again_tokens} stage-1 tokens in "
                                    f"{again_windows} windows, the first {units_tokens} in {n_windows}")
            released = False
        # (a counter holds at most SKETCH_MAX: a cut above it keeps every capped counter's windows)
        keep = np.packbits(sketch >= min(cut, SKETCH_MAX), bitorder="little")
        if parts is not None:
            data, starts, piece_weights, piece_counts, singles = cut_pieces_parts(parts, cut, keep=keep)
        else:
            data, starts, piece_weights, piece_counts, singles = cut_pieces(symbols, offsets, None, weights, counts,
                                                                            cut, threads=threads, keep=keep)
        pieces_tokens = int((np.diff(starts) * piece_counts).sum()) + int(singles)
        if pieces_tokens != units_tokens:
            raise InternalError(f"stage 2's pieces at cut {cut} hold {pieces_tokens} stage-1 tokens, "
                                f"the units {units_tokens}")
        tried.append({"cut": cut, "pieces": int(piece_weights.size), "symbols": int(data.size)})
        if regenerate is not None:      # cut: let the units go (the build and loop reuse the memory)
            parts = symbols = offsets = weights = counts = None
            for lst in given:
                if isinstance(lst, list):
                    lst.clear()
            released = True
        if steps:
            merger = RankMerger(np.array([a for a, _, _ in steps], dtype=np.uint32),
                                np.array([b for _, b, _ in steps], dtype=np.uint32),
                                np.array([t for _, _, t in steps], dtype=np.uint32))
            data, starts = merger.merge_many(data, starts)
        t2 = time.perf_counter()
        phase("stage-2 build")
        # with bounded (distinct) no merge rebuilds a token's bytes, so a new pair never counts more
        # than when its merge made it: one below the cut is forgotten (a small pair map)
        # the pieces' symbols become the engine's cells (donate: no copy, 4 bytes a symbol less)
        engine = MergeEngine(data, starts, piece_weights, tokens, spill_dir=spill_dir,
                             map_threshold=map_threshold, prune_below=cut if bounded else 0, threads=threads,
                             donate=True)
        del data, starts
        t3 = time.perf_counter()
        phase("merge loop")
        steps += engine.run(n_merges - len(steps), allowed=allowed, min_count=cut)
        tokens = engine.tokens()
        t1 = time.perf_counter()
        seconds["cut"] += t2 - t0       # the cut and the replay
        seconds["build"] += t3 - t2
        seconds["loop"] += t1 - t3
        if len(steps) >= n_merges or cut <= 1:
            break
        del engine
        cut = max(1, cut // 4)
    final_tokens = engine.weighted_length(piece_counts) + int(singles)
    info = {"cuts": tried, "restarts": len(tried) - 1}
    return Stage2Result(steps, tokens, final_tokens, engine.stats(), info,
                        {k: round(v, 3) for k, v in seconds.items()})


def unit_weights(encoded: list, counts: list) -> list:
    """Stage 2's weight of each unit, part by part: its count, 0 for the units of encoded regions
    (they teach stage 2 nothing; their count still goes into the final token count)."""
    return [np.where(e, 0, c) if e.any() else c for e, c in zip(encoded, counts)]


def _stage2_parts(symbols, offsets, weights, counts):
    """``stage2_merges``' units as ``(parts, arrays)``: a list of one or two parts ``(symbols,
    offsets, weights, counts)`` (one thread each) and no arrays, or no parts and the four arrays
    (which the kernels halve for two threads); dtypes made right (no copy when they are)."""
    def kinds(syms):        # uint16 units stay uint16 (the kernels read both); anything else uint32
        return (np.uint16 if getattr(syms, "dtype", None) == np.uint16 else np.uint32, np.int64, np.int64, np.int64)

    if isinstance(symbols, list) and len(symbols) == 1:        # one part: the arrays (halved for threads)
        symbols, offsets, weights, counts = symbols[0], offsets[0], weights[0], counts[0]
    if isinstance(symbols, list):
        return ([tuple(np.ascontiguousarray(a, dtype=k) for a, k in zip(p, kinds(p[0])))
                 for p in zip(symbols, offsets, weights, counts)], (None, None, None, None))
    return None, tuple(np.ascontiguousarray(a, dtype=k)
                       for a, k in zip((symbols, offsets, weights, counts), kinds(symbols)))


# ==== Training =================================================================================


def train_superbpe(config, table: WordTable, report: dict, plan, progress: bool = False,
                   init_merges: Optional[Sequence[tuple[bytes, bytes]]] = None,
                   recorded: Optional[list] = None):
    """Stage 1 and stage 2 on a counted corpus; returns ``(vocab, merges, stages)`` and fills
    ``report`` (this run's section of the report: seconds per step, engine, the ``superbpe`` figures).

    ``init_merges``: stage 1 is these merges (an existing BPE model's, ``--init-from``), applied to
    the words instead of trained; the transition is their end. ``recorded``: the counting pass's
    record of every pretoken (``count_corpus(record=)``): the stage-2 units come from it
    (:func:`units_from_records`) instead of a second scan of the file, when stage 2 sees all of it."""
    specials = encode_specials(config.special_tokens)
    rules = Stage2Rules.from_config(config)
    if init_merges is not None:
        t_size = 256 + len(specials) + len(init_merges)
    else:
        t_size = resolve_transition(config.transition, config.vocab_size, len(specials))
    n1 = t_size - 256 - len(specials)
    n_total = config.vocab_size - 256 - len(specials)
    pattern = resolve_pattern(config.pattern)

    split = normal_split(config.stage2_split)
    # ---- while stage 1 runs (one thread): what stage 2 needs from the word table alone, on the other
    # core: the words' flags and byte classes, and the record's pretokens as table rows (used when
    # stage 2 sees the whole corpus, which is known after stage 1; dropped otherwise)
    prep = ThreadPoolExecutor(2, thread_name_prefix="bpe_core-stage2-prep")
    try:
        return _train_superbpe(config, table, report, plan, progress, init_merges, recorded, specials, rules,
                               t_size, n1, n_total, pattern, split, prep)
    finally:
        prep.shutdown(wait=True, cancel_futures=True)


def _train_superbpe(config, table, report, plan, progress, init_merges, recorded, specials, rules, t_size, n1,
                    n_total, pattern, split, prep):
    """:func:`train_superbpe` once its background pool (``prep``) is open."""
    table_ram = 0 if table.mapped else table.nbytes
    budget_share = stage2_budget_share(plan.memory_limit, plan.parent_overhead, table_ram)
    record_info = None
    if split != "official":
        word_info = prep.submit(lambda: (word_flags(table),
                                         word_classes(table) if config.stage2_skip_encoded else None))
        # the rows only when stage 2 will surely see the whole corpus: even one stage-1 token per byte
        # of every pretoken fits its share (so the memory is what stage 2 would take anyway)
        text_bytes = int((np.diff(np.asarray(table.offsets, dtype=np.int64)) * table.counts).sum())
        if recorded and rows_before_stage1(text_bytes, budget_share):
            # on one thread: stage 1 has the other core (two threads beside it slowed stage 1 by more
            # than they gained: stage 1 + units 1.14-1.51 s against 0.99-1.41 s at 32k on en_train)
            record_info = prep.submit(record_table_rows, recorded, table, 1)

    # ---- stage 1: plain BPE on the word table (all words, so rows stay aligned with the table)
    # Read-only engine arrays above MAP_THRESHOLD go to mapped files in the spill folder (docs/memory.md).
    folder = config.spill_dir or tempfile.gettempdir()
    t0 = time.perf_counter()
    phase("build words")
    bar = progress_bar(progress, total=n_total, desc="merges", unit="merge")
    if init_merges is not None:         # stage 1 given: apply its merges to the words
        replay = replay_merges(table.arena, table.offsets, init_merges)
        seg_symbols, seg_offsets, tokens, steps1 = replay.symbols, replay.offsets, replay.tokens, replay.steps
        del replay
    else:
        engine = MergeEngine(table.arena, table.offsets, table.counts, [bytes([i]) for i in range(256)],
                             spill_dir=folder, map_threshold=MAP_THRESHOLD)
        phase("merge loop")
        steps1 = engine.run(n1)
        seg_symbols, seg_offsets, _ = engine.words()
        tokens = engine.tokens()
        del engine                      # stage 2 starts from the segmentation; free the stage-1 engine
    if bar is not None:
        bar.update(len(steps1))
    t1 = time.perf_counter()
    n_stage1_tokens = int((np.diff(seg_offsets) * table.counts).sum())

    # ---- stage 2 units. Its big arrays are written once, in order: numpy's huge-page hint stays on
    # only while free 2 MiB blocks can hold them without the kernel compacting memory (a stall per
    # fault where memory is fragmented; ~4x fewer kernel seconds per MB where it is not:
    # runtime.memmon.huge_pages_ready)
    need = n_stage1_tokens * STAGE2_BYTES_PER_SYMBOL
    huge = huge_pages_ready(min(need, budget_share))
    report["stage2_huge_pages"] = huge
    with stage2_huge_pages(huge):
        phase("stage-2 units")
        fraction = sample_fraction(need, budget_share)
        token_lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        # units of regions that look like encoded binary (uuencode, base64) stay in the table with no
        # weight: they teach stage 2 nothing, and the final token count still covers them (as the encoder
        # sees them)
        flags, classes = word_info.result() if split != "official" else (None, None)

        def list_units(use_record: bool):
            """The stage-2 units as lists of one or two parts ``(symbols, offsets, counts, encoded)``,
            the figures and where they came from: the counting pass's record (``use_record``, when it
            can serve) or a scan of the input (the same units: tested)."""
            if split == "official":
                syms, offs, cnts, info = _official_units(config.input_path, specials, pattern, tokens, steps1,
                                                         fraction)
                enc = (encoded_units(syms, offs, tokens) if config.stage2_skip_encoded
                       else np.zeros(cnts.shape[0], dtype=bool))
                return [syms], [offs], [cnts], [enc], info, "scan"
            path, sources = config.input_path, None
            if config.cluster is not None or _has_url(path):
                sources = expand_inputs(path, config.input_format, config.text_column)
                if len(sources) == 1 and sources[0].plain_text and not sources[0].is_url:
                    path, sources = sources[0].name, None
            # the hf split writes each word's stage-1 tokens while it scans (no word-id units to expand);
            # the units split cuts numbers by their word ids
            seg = (seg_symbols, seg_offsets) if split != "units" else None
            source = "scan"
            if use_record and recorded and sources is None and fraction >= 1:
                # the pretokens as counted: no second pre-tokenization of the file
                source = "record"
                unit_parts, info = units_from_records(
                    recorded, table, flags, cut_spaces=(split == "hf"), classes=classes, seg=seg,
                    num_workers=plan.num_workers, rows=record_info.result() if record_info is not None else None)
            elif sources is not None:      # many inputs, compressed, records, URLs: units over the same shards
                opts = ReadOptions(text_field=config.text_field, text_column=config.text_column,
                                   bad=BadRecords(skip=True))          # bad records: reported by the counting
                units, info = count_units_on(config.cluster, sources, opts, table, specials, pattern,
                                             plan.chunk_bytes, fraction, cut_spaces=(split == "hf"), flags=flags,
                                             classes=classes, num_workers=plan.num_workers, seg=seg)
                unit_parts = [units]
                del units
            else:
                units, info = count_units(path, table, specials, pattern, plan.num_workers,
                                          plan.chunk_bytes, fraction, cut_spaces=(split == "hf"), flags=flags,
                                          executor=config.cluster, classes=classes, seg=seg)
                unit_parts = [units]
                del units
            tables = [stage2_table(u, table, seg_symbols, seg_offsets, (flags & NUMERIC) > 0, token_lengths,
                                   cut_numbers=(split == "units"), expanded=seg is not None) for u in unit_parts]
            del unit_parts
            syms, offs, cnts, enc = (list(x) for x in zip(*tables))
            return syms, offs, cnts, enc, info, source

        units_syms, units_offs, units_counts, encoded, info, units_source = list_units(use_record=True)
        if record_info is not None:     # done with its rows (or never used them): not cleared under it
            record_info.cancel()
            futures_wait([record_info])
            record_info = None
        if recorded is not None:
            recorded.clear()         # the record's memory goes before stage 2's
        if split != "official":
            report["seconds"]["stage2_scan"] = round(time.perf_counter() - t1, 3)

        def listed_again():
            """A restart of stage 2 lists the units again, by a scan (the record is gone by then)."""
            syms, offs, cnts, enc, _, _ = list_units(use_record=False)
            return syms, offs, unit_weights(enc, cnts), cnts

        # one or two parts (stage2_merges takes them apart)
        weights = unit_weights(encoded, units_counts)
        encoded_tokens = sum(int((np.diff(o)[e] * c[e]).sum()) for o, c, e in zip(units_offs, units_counts, encoded))
        n_encoded_units = sum(int(c[e].sum()) for c, e in zip(units_counts, encoded))
        t2 = time.perf_counter()

        # ---- stage 2: continue from the stage-1 state, on the pieces of the units (stage2_merges:
        # phases "stage-2 sketch", "stage-2 cut", "stage-2 build", "merge loop")
        result = stage2_merges(units_syms, units_offs, weights, units_counts, tokens, n_total - len(steps1),
                               _allowed(rules, list(tokens) + list(specials)), bounded=rules.distinct,
                               spill_dir=folder,
                               map_threshold=max(MAP_THRESHOLD, min(STAGE2_MAP_THRESHOLD, budget_share // 8)),
                               threads=plan.num_workers, regenerate=listed_again)
        del units_syms, units_offs, units_counts, weights, encoded
        steps2 = result.steps
        if bar is not None:
            bar.update(len(steps2))
            bar.close()
        t3 = time.perf_counter()
    all_tokens = result.tokens
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    for s in specials:
        vocab[len(vocab)] = s
    merges = []
    for left, right, _ in list(steps1) + list(steps2):
        merges.append((all_tokens[left], all_tokens[right]))
        vocab[len(vocab)] = all_tokens[left] + all_tokens[right]
    report["seconds"]["stage1"] = round(t1 - t0, 3)
    report["seconds"]["stage2_units"] = round(t2 - t1, 3)
    report["seconds"]["stage2"] = round(t3 - t2, 3)
    for k, v in result.seconds.items():
        report["seconds"][f"stage2_{k}"] = v
    report["seconds"]["merge_loop"] = round((t1 - t0) + (t3 - t2), 3)
    report["engine"] = result.engine_stats
    # where the stage-2 units came from: the counting pass's record of every pretoken, or a second scan
    report["stage2_units_source"] = units_source
    report["merges"] = len(merges)
    report["merges_requested"] = max(n_total, 0)
    report["superbpe"] = {
        "transition": t_size,
        "stage1_merges": len(steps1),
        "stage2_merges": len(steps2),
        "stage2_split": split,
        "rules": rules.to_dict(),
        "stage2_sample_fraction": fraction,
        "stage2_units_seen": info["units_seen"],
        "stage2_units_kept": info["units_kept"],
        "stage2_unique_units": info["unique_units"],
        "stage2_text_share": round(info["units_kept"] / info["units_seen"], 6) if info["units_seen"] else 1.0,
        "stage1_tokens": n_stage1_tokens,
        # tokens of the text stage 2 trained on, when it ended (equals the encoder's count on the
        # training corpus, special tokens excluded, when stage 2 saw all of it)
        "final_tokens": result.final_tokens,
        "stage2_cut": result.info,
        "stage2_skip_encoded": bool(config.stage2_skip_encoded),
        "stage2_encoded_units": n_encoded_units,
        "stage2_encoded_tokens": encoded_tokens,      # stage-1 tokens in them
    }
    stages = [
        {"name": "bpe", "merges": len(steps1)},
        {"name": "superbpe", "merges": len(steps2), "split": split, "rules": rules.to_dict()},
    ]
    return vocab, merges, stages


def _allowed(rules: Stage2Rules, tokens: Sequence[bytes]):
    """The engine's stage-2 predicate: ``rules.allows`` and, with ``rules.distinct``, not the bytes of
    a token so far. The engine asks once per pair, just before it merges an allowed pair, so the
    set of known bytes grows here (equivalent to ``reference.superbpe_allows(known=vocab)``)."""
    if not rules.distinct:
        return rules.allows
    known = set(tokens)

    def allowed(left: bytes, right: bytes) -> bool:
        merged = left + right
        if merged in known or not rules.allows(left, right):
            return False
        known.add(merged)
        return True

    return allowed


def _official_units(path, specials, pattern, tokens, steps1, fraction):
    """Units of the official stage-2 split: lines, official pieces isolated, gaps as units; each unit
    pre-tokenized and stage-1 merged on its own. Runs ``regex`` in Python (a parity mode)."""
    merger = _stage1_merger(tokens, steps1)
    counter = UnitCounter()
    keep_below = 0xFFFFFFFFFFFFFFFF if fraction >= 1 else int(fraction * 2 ** 64)
    buf = open_corpus(path)
    spans, _ = split_spans(buf, 0, len(buf), specials)
    for s, e in spans:
        for unit_bytes in official_unit_texts(bytes(buf[s:e])):
            ids = _stage1_ids(unit_bytes, pattern, merger)
            counter.add_units(ids, np.array([0, ids.size], dtype=np.int64), 1, keep_below)
    data, starts, counts = counter.to_arrays()
    info = {"units_seen": counter.n_seen, "units_kept": counter.n_kept, "unique_units": counter.n_units}
    return data, starts, counts, info


def official_unit_texts(text: bytes) -> list[bytes]:
    """The official stage-2 units of one text piece: per line, official pieces and the gaps between.

    >>> official_unit_texts(b"a b 12345 c\\nd")
    [b'a b ', b'123', b'45', b' c\\n', b'd']
    """
    out = []
    rx = _OFFICIAL
    for line in text.splitlines(keepends=True):
        s = line.decode("utf-8", "surrogateescape")
        pos = 0
        for m in rx.finditer(s):
            if m.start() > pos:
                out.append(s[pos:m.start()])
            out.append(m.group())
            pos = m.end()
        if pos < len(s):
            out.append(s[pos:])
    return [u.encode("utf-8", "surrogateescape") for u in out if u]


def _stage1_merger(tokens: Sequence[bytes], steps) -> RankMerger:
    lefts = np.array([a for a, _, _ in steps], dtype=np.uint32)
    rights = np.array([b for _, b, _ in steps], dtype=np.uint32)
    results = np.array([t for _, _, t in steps], dtype=np.uint32)
    return RankMerger(lefts, rights, results)


def _stage1_ids(text: bytes, pattern: str, merger: RankMerger) -> np.ndarray:
    ends = pretoken_ends(text, pattern)
    symbols = np.frombuffer(text, dtype=np.uint8).astype(np.uint32)
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    merged, _ = merger.merge_many(symbols, offsets)
    return merged


# ==== The split as one regex (HF export) =====================================================

#: The ``"hf"`` split of a model pre-tokenized with the GPT-2 pattern: numeric pretokens
#: (`` ?\\p{N}+``) alone, and everything else up to the last character of a whitespace run of two or
#: more that a non-space follows (where GPT-2's ``\\s+(?!\\S)`` ends a pretoken). Uses only what
#: HF's ``Split`` (Oniguruma) supports: classes, lookahead and fixed-width lookbehind.
HF_SPLIT_GPT2 = (r"[ ]?\p{N}+"
                 r"|(?:(?![ ]?\p{N})[\s\S])(?:(?![ ]?\p{N})(?!(?<=\s)\s\S)[\s\S])*")
#: The closest for cl100k / o200k (not exact: their punctuation pretokens take trailing line breaks
#: and their whitespace rules differ): numbers in groups of 1-3 from the left (their pretokens), a cut
#: after the last line break of a whitespace run and before the last of the spaces after it.
HF_SPLIT_CL100K = (r"\p{N}{1,3}"
                   r"|(?:(?!\p{N})[\s\S])(?:(?!\p{N})(?!(?<=[\r\n])[^\S\r\n]+(?:\S|\z))"
                   r"(?!(?<=[^\S\r\n])[^\S\r\n]\S)[\s\S])*")
#: The ``"units"`` split cannot be expressed (its digit cuts depend on stage-1 tokens); this isolates
#: whole numeric pretokens, the closest a regex gets.
HF_SPLIT_UNITS_GPT2 = r"[ ]?\p{N}+|(?:(?![ ]?\p{N})[\s\S])+"


def hf_split_regex(model: Model) -> tuple[str, bool]:
    """The HF ``Split`` regex that expresses this SuperBPE model's stage-2 units, and whether it is
    exact (the same units as training on every text; else the closest one).

    >>> m = Model(vocab={i: bytes([i]) for i in range(256)}, merges=[], method="superbpe",
    ...           pattern=resolve_pattern("gpt2"),
    ...           stages=[{"name": "bpe", "merges": 0}, {"name": "superbpe", "merges": 0, "split": "hf"}])
    >>> hf_split_regex(m) == (HF_SPLIT_GPT2, True)
    True
    """
    split = model_split(model)
    name = pattern_name(model.pattern)
    if split == "official":
        return OFFICIAL_STAGE2_PATTERN, False
    if split == "units":
        return (HF_SPLIT_UNITS_GPT2 if name == "gpt2" else HF_SPLIT_CL100K), False
    if name == "gpt2":
        return HF_SPLIT_GPT2, True
    if name in ("cl100k", "o200k"):
        return HF_SPLIT_CL100K, False
    return HF_SPLIT_GPT2, False


# ==== Stage-aware encoding =====================================================================


class StageAwareEncoder:
    """Encode with a SuperBPE model: stage-1 merges inside pretokens, stage-2 merges inside units.

    Works in vocabulary ids (the smaller id for bytes that two merges build).
    """

    def __init__(self, model: Model):
        if model.method not in ("superbpe",):
            raise ValueError(f"not a SuperBPE model (method {model.method!r})")
        self.model = model
        self.pattern = resolve_pattern(model.pattern)
        self.specials = encode_specials(model.special_tokens)
        n1 = int(model.stages[0]["merges"])
        self.split = model_split(model)
        ids_of: dict[bytes, int] = {}
        for i in sorted(model.vocab):
            ids_of.setdefault(model.vocab[i], i)
        self.ids_of = ids_of
        self.token_bytes = [model.vocab[i] for i in range(len(model.vocab))]
        self.lengths = np.array([len(t) for t in self.token_bytes], dtype=np.int64)

        def merger(pairs):
            lefts = np.array([ids_of[a] for a, _ in pairs], dtype=np.uint32)
            rights = np.array([ids_of[b] for _, b in pairs], dtype=np.uint32)
            results = np.array([ids_of[a + b] for a, b in pairs], dtype=np.uint32)
            return RankMerger(lefts, rights, results)

        self.stage1 = merger(model.merges[:n1])
        self.stage2 = merger(model.merges[n1:])
        # the whole-text native path: the "hf" split with a named pattern (the others: Python below)
        self.native = None
        if self.split == "hf" and pattern_name(self.pattern) is not None:
            self.native = TwoStageEncoder(model.vocab, model.merges[:n1], model.special_tokens, self.pattern,
                                          self.stage2)

    def encode_array(self, data: bytes, specials: bool = True) -> np.ndarray:
        """uint32 ids of ``data`` (``specials=False``: as :meth:`encode_ordinary`); one native call
        for the ``"hf"`` split (``encode.TwoStageEncoder``), else :meth:`encode_python`."""
        if self.native is not None:
            return self.native.encode(data, specials)
        if specials:
            return np.asarray(self.encode_python(data), dtype=np.uint32)
        return np.asarray(self.encode_ordinary(data), dtype=np.uint32)

    def encode_ordinary(self, data: bytes) -> np.ndarray:
        """Encode text with no special tokens in it."""
        if self.split == "official":
            parts = [_stage1_ids(u, self.pattern, self.stage1) for u in official_unit_texts(data)]
            if not parts:
                return np.zeros(0, dtype=np.uint32)
            offsets = np.concatenate(([0], np.cumsum([p.size for p in parts]))).astype(np.int64)
            syms, offs = self.stage2.merge_many(np.concatenate(parts).astype(np.uint32), offsets)
            return syms
        ends = pretoken_ends(data, self.pattern)
        if ends.size == 0:
            return np.zeros(0, dtype=np.uint32)
        starts = np.concatenate(([0], ends[:-1]))
        symbols = np.frombuffer(data, dtype=np.uint8).astype(np.uint32)
        seg, seg_offs = self.stage1.merge_many(symbols, np.concatenate(([0], ends)).astype(np.int64))
        numeric = self._numeric_pretokens(data, starts, ends)
        if self.split == "hf":
            # a unit ends at a numeric pretoken (a unit of its own) and inside a run of whitespace
            hard = numeric[1:] | numeric[:-1]
            hard |= self._space_meets(data, starts, ends)
            cut = np.zeros(seg.size + 1, dtype=bool)
            cut[0] = cut[-1] = True
            cut[seg_offs[1:-1][hard]] = True
            out, _ = self.stage2.merge_many(seg, np.flatnonzero(cut).astype(np.int64))
            return out
        # numeric pretokens: a unit of their own, cut at digit boundaries between stage-1 tokens
        cut_before = np.zeros(seg.size + 1, dtype=bool)
        cut_before[0] = cut_before[-1] = True
        for p in np.flatnonzero(numeric):
            a, b = int(seg_offs[p]), int(seg_offs[p + 1])
            cut_before[a] = cut_before[b] = True
            lens = self.lengths[seg[a:b]].tolist()
            for c in numeric_cuts(data[starts[p]:ends[p]], lens):
                cut_before[a + c] = True
        bounds = np.flatnonzero(cut_before).astype(np.int64)
        out, _ = self.stage2.merge_many(seg, bounds)
        return out

    def _space_meets(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Per boundary between pretokens ``p`` and ``p+1``: the left one ends with whitespace and
        the right one starts with it."""
        arr = np.frombuffer(data, dtype=np.uint8)
        is_space = _ASCII_SPACE[arr]
        if (arr >= 0x80).any():                 # whitespace beyond ASCII (NBSP, U+2000..): mark its bytes
            text = data.decode("utf-8", "surrogateescape")
            if _NON_ASCII_SPACE.search(text):
                is_space = is_space.copy()
                byte_pos = char_pos = 0
                for m in _NON_ASCII_SPACE.finditer(text):
                    byte_pos += len(text[char_pos:m.start()].encode("utf-8", "surrogateescape"))
                    char_pos = m.start()
                    n = len(m.group().encode("utf-8", "surrogateescape"))
                    is_space[byte_pos:byte_pos + n] = True
        return is_space[ends[:-1] - 1] & is_space[starts[1:]]

    def _numeric_pretokens(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Which pretokens hold a digit (``\\p{N}``)."""
        arr = np.frombuffer(data, dtype=np.uint8)
        digit_pos = np.flatnonzero((arr >= 0x30) & (arr <= 0x39))
        if (arr >= 0x80).any():
            text = data.decode("utf-8", "surrogateescape")
            extra, char_pos, byte_pos = [], 0, 0
            for m in _NON_ASCII_DIGIT.finditer(text):
                byte_pos += len(text[char_pos:m.start()].encode("utf-8", "surrogateescape"))
                char_pos = m.start()
                extra.append(byte_pos)
            if extra:
                digit_pos = np.union1d(digit_pos, np.array(extra, dtype=np.int64))
        numeric = np.zeros(ends.size, dtype=bool)
        if digit_pos.size:
            numeric[np.searchsorted(ends, digit_pos, side="right")] = True
        return numeric

    def encode(self, data: bytes | str) -> list[int]:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if self.native is not None:
            return self.native.encode(data).tolist()
        return self.encode_python(data)

    def encode_python(self, data: bytes | str) -> list[int]:
        """The plain path, document by document (numpy and ``RankMerger`` per text piece): the
        twin of the native whole-text path, and the path of the other splits and custom patterns."""
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        out: list[int] = []
        for piece, is_special in split_on_specials(data, self.specials):
            if is_special:
                out.append(self.ids_of[piece])
            else:
                out.extend(self.encode_ordinary(piece).tolist())
        return out


# ==== The method ===============================================================================


_SPLITS = ("hf", "units", "default", "official")


def normal_split(split: str) -> str:
    """The canonical name of a stage-2 split (``"default"``, its name in older files, is ``"units"``).

    >>> normal_split("default"), normal_split("hf")
    ('units', 'hf')
    """
    if split not in _SPLITS:
        raise ValueError(f"unknown stage2_split {split!r} (hf, units, official)")
    return "units" if split == "default" else split


def model_split(model: Model) -> str:
    """The stage-2 split a SuperBPE model was trained with (a file without the mark: ``"units"``)."""
    return normal_split(model.stages[1].get("split", "units")) if len(model.stages) > 1 else "units"


def valid_rules(rules: Any) -> bool:
    """Whether a ``model.json`` stage's ``"rules"`` is what :meth:`Stage2Rules.to_dict` writes.

    >>> valid_rules({"max_words": 4, "forbidden": [": "]}), valid_rules({"max_words": -1})
    (True, False)
    """
    def count(x):
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    if not isinstance(rules, dict):
        return False
    if "max_words" in rules and not count(rules["max_words"]):
        return False
    if "forbidden" in rules and not (isinstance(rules["forbidden"], list)
                                     and all(isinstance(f, str) for f in rules["forbidden"])):
        return False
    return all(rules.get(k) is None or count(rules[k]) for k in ("max_token_bytes", "max_nonalnum"))


def check_stage_marks(path: str, model: Model) -> None:
    """The stage-2 marks SuperBPE and SupraTok write: a known ``"split"``, well-formed ``"rules"``."""
    for k, st in enumerate(model.stages):
        if "split" in st and st["split"] not in _SPLITS:
            raise ModelFormatError(path, f"field 'stages': stage {k} \"split\" must be one of {', '.join(_SPLITS)}")
        rules = st.get("rules")
        if rules is not None and not valid_rules(rules):
            raise ModelFormatError(path, f"field 'stages': stage {k} \"rules\" is malformed")


class SuperBPE(registry.Method):
    """SuperBPE (Liu et al., 2025): BPE up to the transition, then merges across whitespace."""

    name = "superbpe"
    n_stages = 2
    stage_aware = True
    supports_init = True
    records_pretokens = True

    def check_config(self, config) -> None:
        resolve_transition(config.transition, config.vocab_size, len(config.special_tokens))
        if config.min_pretoken_count > 1:
            raise ValueError(f"min_pretoken_count {config.min_pretoken_count} is for plain BPE: stage 2 joins "
                             "pretokens into units and needs every pretoken's stage-1 tokens (leave it at 1)")

    def uses_record(self, config) -> bool:
        # the official split pre-tokenizes the file again with its own regex (_official_units)
        return normal_split(config.stage2_split) != "official"

    def train(self, config, table, plan, progress=False, init=None, recorded=None) -> registry.MethodResult:
        report: dict = {"seconds": {}}
        vocab, merges, stages = train_superbpe(config, table, report, plan, progress=progress,
                                               init_merges=init.merges if init is not None else None,
                                               recorded=recorded)
        return registry.MethodResult(vocab, merges, stages, report)

    def check_stages(self, path: str, model: Model) -> None:
        check_stage_marks(path, model)

    def stage_encoder(self, model: Model) -> "StageAwareEncoder":
        return StageAwareEncoder(model)

    def hf_split_pattern(self, model: Model) -> str:
        return hf_split_regex(model)[0]

    def export_caveats(self, model: Model, fmt: str) -> list[str]:
        exact = hf_split_regex(model)[1]
        what = {"hf": ("tokenizer.json splits into the model's stage-2 units" if exact else
                       "tokenizer.json splits with the closest regex to the model's stage-2 split "
                       f"({model_split(model)!r} with pattern {model.pattern_name or 'a custom regex'!r} is not "
                       "expressible)")
                      + " and applies all merges by rank inside each piece (one stage)",
                "tiktoken": "tiktoken splits with the stage-1 pattern, so no token crosses a pretoken "
                            "boundary and stage-2 tokens are never produced",
                "gpt2": "vocab.json/merges.txt carry no pre-tokenizer or stages"}.get(fmt, "")
        return [f"this is a SuperBPE model: {what}; ids can differ from bpe_core's stage-aware encoder "
                f"(Tokenizer.load / model.json), which reproduces training exactly (see docs/superbpe.md)"]


registry.register(SuperBPE())
