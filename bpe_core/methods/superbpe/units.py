"""Stage 2's units, listed in text order as runs of word ids or stage-1 tokens: by a scan of the
corpus on threads (:func:`count_units`) or on an executor's shards (:func:`count_units_sharded`,
:func:`count_units_on`), or from the counting pass's record of every pretoken
(:func:`units_from_records`); and their expansion into stage-1 tokens (:func:`stage2_table`)."""
from __future__ import annotations

import threading
from typing import Optional, Sequence

import numpy as np

from ...corpus.chunks import file_chunks, split_spans
from ...corpus.ranges import is_url
from ...corpus.shards import ReadOptions, shard_blocks, source_shards
from ...engine.units import (ENCODED_MARK, UnitCounter, WordIndex, chunk_unit_stream, expand_units, find_rows,
                             id_unit_stream, record_rows, strip_marks)
from ...errors import InputChanged, InternalError
from ...pretok.counting import check_distributable, private_shard
from ...pretok.patterns import pattern_name
from ...pretok.pretokenize import PATTERN_IDS, pretoken_ends
from ...pretok.wordtable import WordTable
from ...runtime.executors import open_executor
from ...runtime.memmon import prefault
from ...runtime.workers import FileStamp, read_range, run_ordered
from .words import ENDS_SPACE, NUMERIC, STARTS_SPACE, looks_encoded_counts, numeric_cuts, word_flags


def _units_chunk(task: tuple) -> tuple:
    """Worker (a thread): the units (as word-id runs, in text order) of ``path[start:end)``."""
    path, start, end, specials, pattern, keep_below, index, flags, cut_spaces, stamp, classes, seg, narrow = task
    return _units_of(read_range(path, start, end, stamp), path, specials, pattern, keep_below, index, flags,
                     cut_spaces, classes, seg, narrow)


def _units_of(buf, path: str, specials, pattern: str, keep_below: int, index, flags, cut_spaces: bool,
              classes: Optional[np.ndarray] = None, seg: Optional[tuple] = None, narrow: bool = False) -> tuple:
    """The units of ``buf`` (word-id runs, in text order; with ``classes``, the units of an
    encoded-looking region carry ``ENCODED_MARK`` at their end; with ``seg``, the stage-1
    segmentation ``(symbols, offsets)`` of the words, each word written as its stage-1 tokens).
    ``narrow`` (with ``seg``, a named pattern, tokens below 65536): the tokens as uint16 and no
    marks: a sixth value flags the encoded units (``chunk_unit_stream(narrow=True)``)."""
    spans, _ = split_spans(buf, 0, len(buf), specials)
    counter = UnitCounter()
    name = pattern_name(pattern)
    if name is not None:
        # units in text order, not counted: nearly all are distinct, and stage 2 deduplicates its
        # pieces (stage2_merges); a table of them would only cost a hash table
        seg_symbols, seg_offsets = seg if seg is not None else (None, None)
        listed = chunk_unit_stream(buf, spans, PATTERN_IDS[name], index, flags, keep_below, cut_spaces, classes,
                                   seg_symbols, seg_offsets, narrow=narrow and seg is not None)
        data, starts, seen, kept, missing = listed[:5]
        if missing:
            raise InputChanged(path, "changed while it was read: a pretoken is missing from the word table "
                                     "counted earlier; nothing was written")
        return (data, starts, np.ones(starts.size - 1, dtype=np.int64), seen, kept) + tuple(listed[5:])
    if narrow:
        raise ValueError("narrow units need a named pattern and a segmentation")
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
                classes: Optional[np.ndarray] = None, seg: Optional[tuple] = None,
                narrow: Optional[bool] = None) -> tuple[tuple, dict]:
    """The stage-2 units of a corpus as runs of word ids (rows of ``table``), in text order, each with
    count 1 (the custom-pattern path counts them; stage 2 deduplicates pieces either way).

    ``seg`` (``(seg_symbols, seg_offsets)``, the stage-1 segmentation of the table's words): the units
    are runs of stage-1 tokens instead, each word written as its tokens while it is scanned (what
    ``expand_units`` makes of the word-id units; the marks stay).

    ``classes`` (``word_classes(table)``): mark the units of regions that look encoded
    (``chunk_unit_stream``); ``stage2_table`` strips the marks and gives them no weight.

    With ``seg``, a named pattern and every stage-1 token below 65536 (``narrow`` None: so decided;
    False: never), the units are uint16 tokens with no marks and a fourth array flags the encoded
    ones (``(data, starts, counts, encoded)``, what ``units_from_records`` gives): half the bytes
    to write and hold, and no marks to strip after (the same units, tested).

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
    fits = seg is not None and pattern_name(pattern) is not None and (seg[0].size == 0 or int(seg[0].max()) <= 0xFFFF)
    narrow = fits if narrow is None else (narrow and fits)
    tasks = [(path, s, e, list(specials), pattern, keep_below, index, flags, cut_spaces, stamp, classes, seg, narrow)
             for s, e in chunks]
    parts = []
    seen = kept = 0

    def absorb(result) -> None:
        nonlocal seen, kept
        parts.append(result[:3] + tuple(result[5:]))
        seen += result[3]
        kept += result[4]

    run_ordered(_units_chunk, tasks, min(num_workers, len(tasks)), absorb)
    stamp.check()
    units = _concat_units(parts)
    info = {"units_seen": seen, "units_kept": kept, "unique_units": int(units[2].size)}
    return units, info


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
            arena, offsets, ids, spans, _ = recorded[k][:5]
            rows = index.word_ids(arena, offsets[1:], 0) if len(offsets) > 1 else np.zeros(0, np.int64)
            if len(recorded[k]) > 6:       # ids number the words as first seen: their rows and lengths
                id_rows = np.asarray(recorded[k][6], dtype=np.int64)
                rows = rows[id_rows]
                offsets = np.concatenate(([0], np.cumsum(np.diff(np.asarray(offsets, dtype=np.int64))[id_rows])))
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
    for k, (_, _, ids, spans, n_bytes) in enumerate(r[:5] for r in recorded):
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


def record_word_maps(recorded: list, table: WordTable) -> tuple[list, list, np.ndarray]:
    """The counting pass's record read as rows of ``table`` without rewriting it: returns
    ``(segments, maps, breaks)``: ``segments`` each chunk's ids as recorded (its words' numbers: in
    the order first seen, or rows of its own table), ``maps`` the row in ``table`` of each (uint32;
    the chunk's ``id_rows`` and the rows found composed; ``id_unit_stream(maps=)`` reads
    ``maps[k][segments[k]]``), ``breaks`` where the stretches of text start in the sequence of all
    pretokens, as :func:`record_table_rows` gives them (the first 0, the last the number of
    pretokens). Each chunk's words are found in the table by one walk through both sorted tables
    (``find_rows``); the spans are cut where the counting kernel says each one's pretokens end (the
    chunk's ``ends``, its sixth item). Work a chunk's own word, none a pretoken.

    Checked (``InternalError`` otherwise): every chunk word is in the table, each chunk's spans end
    in order at its last pretoken, and the chunks hold as many pretokens as the table counts (an id
    past its chunk's words is refused where the ids are read, ``id_unit_stream``).
    """
    segments, maps, firsts = [], [], [np.zeros(1, np.int64)]
    at, joins_prev = 0, False
    for k, chunk in enumerate(recorded):
        arena, offsets, ids, spans, n_bytes, ends = chunk[:6]
        ids = np.asarray(ids)
        if ids.dtype != np.uint32 or not ids.flags.c_contiguous:
            ids = np.ascontiguousarray(ids, dtype=np.uint32)
        try:
            rows = find_rows(np.asarray(arena, dtype=np.uint8), np.asarray(offsets, dtype=np.int64),
                             table.arena, table.offsets)
        except ValueError as exc:
            raise InternalError(f"the record of chunk {k}: {exc}") from None
        if len(chunk) > 6:          # the ids number the words as first seen: each one's row
            id_rows = np.asarray(chunk[6])
            if id_rows.shape != rows.shape or (id_rows.size and int(id_rows.max()) >= rows.size):
                raise InternalError(f"the record of chunk {k}: its id rows do not name its words")
            rows = rows[id_rows]
        maps.append(rows)
        segments.append(ids)
        spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        ends = np.asarray(ends, dtype=np.int64)
        if ends.shape != (spans.shape[0],) or (ends.size and (ends[0] < 0 or np.any(np.diff(ends) < 0)
                                                              or ends[-1] != ids.size)) \
                or (not ends.size and ids.size):
            raise InternalError(f"the record of chunk {k}: its spans do not end in order at its last pretoken")
        if spans.shape[0]:
            # a span starts a new stretch of text unless it goes on from the chunk before (both touch
            # the chunk edge: the counting chunks cut documents, the units do not)
            f = at + np.concatenate(([0], ends[:-1]))
            firsts.append(f[1:] if joins_prev and spans[0, 0] == 0 else f)
            joins_prev = bool(spans[-1, 1] == n_bytes)
        else:
            joins_prev = False
        at += ids.size
    if at != table.n_pretokens:
        raise InternalError(f"the record holds {at:,} pretokens, the word table counts {table.n_pretokens:,}")
    firsts.append(np.array([at], np.int64))
    starts = np.concatenate(firsts)         # in order: a repeated position (an empty span) is one break
    return segments, maps, starts[np.concatenate(([True], starts[1:] != starts[:-1]))]


def slice_segments(segments: list, lo: int, hi: int, maps: Optional[list] = None):
    """Positions ``lo:hi`` of arrays read one after the other, as a list of views (no copy); with
    ``maps`` (one per array), also the map of each view: returns ``(views, maps)`` then.

    >>> [a.tolist() for a in slice_segments([np.arange(3), np.arange(3, 5), np.arange(5, 9)], 2, 6)]
    [[2], [3, 4], [5]]
    """
    out, out_maps, at = [], [], 0
    for k, a in enumerate(segments):
        a_lo, a_hi = max(lo - at, 0), min(hi - at, a.size)
        if a_lo < a_hi:
            out.append(a[a_lo:a_hi])
            if maps is not None:
                out_maps.append(maps[k])
        at += a.size
    return out if maps is None else (out, out_maps)


def units_from_records(recorded: list, table: WordTable, flags: np.ndarray, cut_spaces: bool = True,
                       classes: Optional[np.ndarray] = None, seg: Optional[tuple] = None,
                       num_workers: int = 1, rows: Optional[tuple] = None,
                       sample_fraction: float = 1.0) -> tuple[tuple, dict]:
    """The stage-2 units of a corpus from the counting pass's record (``count_corpus(record=)``: per
    chunk in text order, its own sorted table, the row in it of every pretoken, its text spans and
    size), as ``count_units`` lists them with the same ``sample_fraction`` (tested equal): no second
    pre-tokenization.

    The record's pretokens become rows of ``table`` cut into stretches of text (:func:`record_word_maps`,
    read through each chunk's map; a record without span ends, :func:`record_table_rows`; ``rows``:
    either's result, when the caller had it made while stage 1 ran); ``id_unit_stream`` lists the
    units, the two halves of the corpus (cut at a special token) on two threads. Returns the units as a
    list of one or two parts ``(data, starts, counts)`` (the halves, not joined), and the figures; with
    ``seg`` each part also has ``encoded`` (bool per unit: which units came from regions that look
    encoded; they carry no ``ENCODED_MARK`` then, see ``stage2_table``).
    """
    if rows is None:
        rows = (record_word_maps(recorded, table) if all(len(r) > 5 for r in recorded)
                else record_table_rows(recorded, table, num_workers))
    segments, maps, breaks = rows if len(rows) == 3 else (rows[0], None, rows[1])
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
    keep_below = 0xFFFFFFFFFFFFFFFF if sample_fraction >= 1 else int(sample_fraction * 2 ** 64)
    per_id *= min(max(sample_fraction, 0.0), 1.0)

    def run(b):
        lo, hi = int(b[0]), int(b[-1])
        views, view_maps = slice_segments(segments, lo, hi, maps) if maps is not None else \
            (slice_segments(segments, lo, hi), None)
        return id_unit_stream(views, b - lo, flags, cut_spaces, classes,
                              seg_symbols, seg_offsets,
                              reserve=int((hi - lo) * per_id * 1.05) + (hi - lo) // 64,
                              marks=seg_symbols is None, narrow=narrow, keep_below=keep_below, maps=view_maps)

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
    """Unit lists ``(data, starts, counts, ...)`` one after another, as one ``(data, starts, counts)``;
    parts of four ``(data uint16, starts, counts, encoded)`` (``_units_of(narrow=True)``) as one
    ``(data uint16, starts, counts, encoded)``."""
    if not parts:
        return np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    narrow = len(parts[0]) == 4
    # fresh arrays, written whole: faulted in at once (prefault), not page by page
    data = prefault(np.empty(sum(p[0].size for p in parts), dtype=np.uint16 if narrow else np.uint32))
    np.concatenate([p[0] for p in parts], out=data, casting="same_kind" if narrow else "unsafe")
    counts = prefault(np.empty(sum(p[2].size for p in parts), dtype=np.int64))
    np.concatenate([p[2] for p in parts], out=counts, casting="unsafe")
    starts = prefault(np.empty(counts.size + 1, dtype=np.int64))
    starts[0] = 0
    np.cumsum(np.concatenate([np.diff(p[1]) for p in parts]), out=starts[1:])
    if narrow:
        return data, starts, counts, np.concatenate([p[3] for p in parts])
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
                 expanded: bool = False, narrow: bool = False,
                 give_up: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Expand word-id units into stage-1 token units; with ``cut_numbers`` (the ``"units"`` split)
    numeric words are split at their hard cuts. Returns ``(symbols, offsets, counts, encoded)``:
    ``encoded`` per unit, whether it came from a region that looks encoded (its word ids ended with
    ``ENCODED_MARK``, stripped here: ``strip_marks``).

    ``expanded``: the units already are stage-1 tokens (``count_units(seg=)``); only the marks are
    stripped, in place (the caller gives the arrays up; not with ``cut_numbers``, which needs the word
    ids). ``units`` may carry a fourth array, ``encoded`` (``units_from_records`` with a segmentation):
    then they have no marks and are returned as they are.

    ``narrow`` (word-id units): the symbols as uint16 when every stage-1 token id fits (half the
    bytes; stage 2's kernels read both), else uint32 as without it; the same units. ``give_up``
    (word-id units): the caller does not use the units again, so their marks are stripped in place
    (writable uint32 arrays) instead of on copies."""
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
        if encoded.any():       # on copies unless the caller gives them up: it may use its units again
            own = (give_up and data.dtype == np.uint32 and data.flags.c_contiguous and data.flags.writeable
                   and starts.flags.c_contiguous and starts.flags.writeable)
            data, starts, encoded = strip_marks(data if own else np.array(data, dtype=np.uint32),
                                                starts if own else starts.copy())
    lengths = np.diff(starts)
    seg_symbols = np.ascontiguousarray(seg_symbols, dtype=np.uint32)
    narrow = narrow and (seg_symbols.size == 0 or int(seg_symbols.max()) <= 0xFFFF)
    if not cut_numbers:
        symbols, offsets = expand_units(np.ascontiguousarray(data, dtype=np.uint32), starts, seg_symbols,
                                        seg_offsets, narrow=narrow)
        return symbols, offsets, np.asarray(counts, dtype=np.int64), encoded
    single_numeric = lengths == 1       # (empty units read no word)
    one = np.flatnonzero(single_numeric)
    single_numeric[one] = numeric[data[starts[one]]]
    plain = np.flatnonzero(~single_numeric)
    single = np.flatnonzero(single_numeric)
    words = data[starts[single]].astype(np.int64)
    # plain units: expand all of them in one native pass (the word ids gathered first, and the units'
    # own arrays let go before: each is a copy of a few bytes per pretoken of the units)
    plain_ids = data[np.repeat(~single_numeric, lengths)]
    del data
    plain_starts = np.zeros(plain.size + 1, dtype=np.int64)
    np.cumsum(lengths[plain], out=plain_starts[1:])
    symbols, offsets = expand_units(np.ascontiguousarray(plain_ids, dtype=np.uint32), plain_starts, seg_symbols,
                                    seg_offsets, narrow=narrow)
    del plain_ids
    counts = np.asarray(counts, dtype=np.int64)
    if single.size == 0:
        return symbols, offsets, counts[plain], encoded[plain]
    # single numeric units: each word's stage-1 tokens, cut at its hard boundaries. The pieces of a
    # word cover its tokens in order, so their symbols are the words' tokens one after another
    # (gathered at once); only the piece lengths come from the loop (one numeric_cuts per word)
    seg_symbols, seg_offsets = np.asarray(seg_symbols), np.asarray(seg_offsets)
    table_offsets = np.asarray(table.offsets)
    s_lo, s_hi = seg_offsets[words].astype(np.int64), seg_offsets[words + 1].astype(np.int64)
    n_seg = s_hi - s_lo
    firsts = np.zeros(words.size + 1, dtype=np.int64)
    np.cumsum(n_seg, out=firsts[1:])
    extra = seg_symbols[np.repeat(s_lo - firsts[:-1], n_seg) + np.arange(firsts[-1])]
    lens = token_lengths[extra].tolist()
    arena = table.arena.tobytes()
    w_lo, w_hi = table_offsets[words].tolist(), table_offsets[words + 1].tolist()
    bounds = firsts.tolist()
    piece_lens: list[int] = []
    n_pieces = np.empty(words.size, dtype=np.int64)
    for k in range(words.size):
        seg_lens = lens[bounds[k]:bounds[k + 1]]
        cuts = numeric_cuts(arena[w_lo[k]:w_hi[k]], seg_lens)
        n_pieces[k] = len(cuts) + 1
        prev = 0
        for c in cuts:
            piece_lens.append(c - prev)
            prev = c
        piece_lens.append(len(seg_lens) - prev)
    # (the symbols' own dtype: no second copy of them)
    symbols = np.concatenate([symbols, extra.astype(symbols.dtype, copy=False)])
    offsets = np.concatenate([offsets, offsets[-1] + np.cumsum(piece_lens, dtype=np.int64)]).astype(np.int64,
                                                                                                   copy=False)
    return (symbols, offsets, np.concatenate([counts[plain], np.repeat(counts[single], n_pieces)]),
            np.concatenate([encoded[plain], np.repeat(encoded[single], n_pieces)]))


def units_source_shard(shard, context: UnitsContext, specials: Sequence[bytes], pattern: str, keep_below: int,
                       cut_spaces: bool) -> tuple:
    """Task: the unique units of one shard of ``corpus.shards`` (its blocks in order, read where
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


def has_url(inputs) -> bool:
    """Whether the inputs (a spec or a list of specs) name an fsspec URL."""
    specs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    return any(isinstance(s, str) and is_url(s) for s in specs)


def count_units_on(executor, sources, opts: ReadOptions, table: WordTable, specials: Sequence[bytes], pattern: str,
                   chunk_bytes: int, sample_fraction: float = 1.0, cut_spaces: bool = True,
                   flags: Optional[np.ndarray] = None, classes: Optional[np.ndarray] = None,
                   num_workers: int = 1, seg: Optional[tuple] = None) -> tuple[tuple, dict]:
    """``count_units`` over the shards of ``sources`` (``corpus.shards``) on an executor: the
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
