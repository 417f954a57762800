"""One pass over the corpus on worker threads: training units, held-out documents, document frequencies."""
from __future__ import annotations

import zlib
import numpy as np
from typing import Callable, Optional, Sequence


from ...corpus.chunks import file_chunks, split_spans
from ...engine.units import (ENCODED_MARK, UnitCounter, WordIndex, chunk_unit_stream, id_unit_stream,
                             units_in_encoded_regions)
from ...errors import InputChanged, InternalError
from ...pretok.patterns import pattern_name
from ...pretok.pretokenize import PATTERN_IDS, pretoken_ends
from ...pretok.wordtable import WordTable
from ..superbpe import ENDS_SPACE, NUMERIC, STARTS_SPACE, looks_encoded_counts, numeric_mask
from ...runtime.workers import FileStamp, read_range, run_ordered
from .script import guess_candidates, guess_suffix_language, marker_words

#: Native patterns whose letter runs are whole pretokens (``script.marker_words``): with them the
#: language guess reads only the documents with 3 marked pretokens of one language or more.
LETTER_RUN_PATTERNS = ("gpt2", "cl100k")
#: ``_docs_chunk_scan`` marks the encoded units of about this many pretokens at a time
SCAN_BLOCK = 1 << 16
#: ``documents_from_records`` asks its unit counters for room for a unit per this many pretokens
#: (en_train: one per 31; a hint, the lists grow past it)
UNITS_PER_PRETOKEN_ROOM = 16


# ==== Documents: units, held-out split, document frequencies =======================================


class UnitList:
    """Units in text order, each listed as often as it occurs (no counts, no hash table): what the
    documents pass gives pass 2 when nothing else reads the units (``listed=True``). Pass 2 cuts them
    into pieces and deduplicates those (``superbpe.stage2_merges``), so counting equal units first
    (``UnitCounter``: 0.16 CPU-s on 60 MB of en_train, 150,177 distinct units of 414,910) only
    cost time. Each block's word ids are copied once into room asked for at once (``data``: a
    buffer shared with other lists, this one writing from position ``at``); the encoded units are
    flagged (bool per unit), not marked.

    >>> ul = UnitList(5)
    >>> ul.add(np.array([3, 1, 4], np.uint32), np.array([0, 2, 3]), np.array([False, True]))
    >>> ul.add(np.array([1, 5], np.uint32), np.array([0, 2]), None)
    >>> [a.tolist() for a in ul.to_arrays()], ul.n_seen
    ([[3, 1, 4, 1, 5], [0, 2, 3, 5], [False, True, False]], 3)
    """

    def __init__(self, room: int = 0, data: Optional[np.ndarray] = None, at: int = 0):
        self.shared = data is not None
        self.data = np.empty(max(int(room), 0), dtype=np.uint32) if data is None else data
        self.at = self.size = int(at)
        self.bounds: list[np.ndarray] = []
        self.encoded: list[np.ndarray] = []
        self.n_seen = 0

    def add(self, ids: np.ndarray, bounds: np.ndarray, encoded: Optional[np.ndarray]) -> None:
        """Units ``ids[bounds[k]:bounds[k+1]]`` (every one holds a word), with their encoded flags
        (None: none is)."""
        n_units = bounds.size - 1
        if n_units <= 0:
            return
        a, b = int(bounds[0]), int(bounds[-1])
        if self.size + (b - a) > self.data.size:
            if self.shared:
                raise InternalError("listed units overflow their share of the buffer")
            grown = np.empty(max(2 * self.data.size, self.size + (b - a)), dtype=np.uint32)   # (a hint too small)
            grown[:self.size] = self.data[:self.size]
            self.data = grown
        self.data[self.size:self.size + (b - a)] = ids[a:b]
        self.bounds.append(bounds[:-1] - a + (self.size - self.at))
        self.size += b - a
        self.encoded.append(np.zeros(n_units, dtype=bool) if encoded is None else np.asarray(encoded, dtype=bool))
        self.n_seen += n_units

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(data uint32, starts int64, encoded bool)``, the units in the order they were added
        (``data``: this list's part of the buffer, a view)."""
        end = np.array([self.size - self.at], dtype=np.int64)
        starts = np.concatenate(self.bounds + [end]).astype(np.int64, copy=False)
        encoded = np.concatenate(self.encoded) if self.encoded else np.zeros(0, dtype=bool)
        data = self.data[self.at:self.size]
        self.bounds, self.encoded = [], []
        return data, starts, encoded

    @staticmethod
    def join(parts: list, data: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Several ``to_arrays()`` results one after the other, as one; ``data``: the buffer their
        data lie in one after the other from its start (not copied again).

        >>> a = (np.array([1, 2, 3], np.uint32), np.array([0, 1, 3]), np.array([0, 1], bool))
        >>> b = (np.array([4], np.uint32), np.array([0, 1]), np.array([1], bool))
        >>> [x.tolist() for x in UnitList.join([a, b])]
        [[1, 2, 3, 4], [0, 1, 3, 4], [False, True, True]]
        """
        if not parts:
            return np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64), np.zeros(0, dtype=bool)
        if len(parts) == 1 and data is None:
            return parts[0]
        at = np.cumsum([0] + [p[0].size for p in parts])
        if data is None:
            data = np.concatenate([p[0] for p in parts])
        else:
            data = data[:int(at[-1])]
        starts = np.concatenate([p[1][:-1] + at[k] for k, p in enumerate(parts)] + [at[-1:]]).astype(np.int64)
        return data, starts, np.concatenate([p[2] for p in parts])


def is_heldout(doc: bytes, fraction: float) -> bool:
    """Deterministic held-out split by a hash of the document bytes.

    >>> is_heldout(b"some document", 0.0), is_heldout(b"some document", 1.0)
    (False, True)
    """
    return zlib.crc32(doc) < fraction * 2 ** 32


def encoded_units(ids: np.ndarray, bounds: np.ndarray, flags: np.ndarray, classes: np.ndarray,
                  doc_starts: Optional[np.ndarray] = None) -> np.ndarray:
    """Which units ``ids[bounds[k]:bounds[k+1]]`` of one document look like encoded data (bool per
    unit), by SuperBPE's rule for its default split: a *region* is the text between the document's
    edges and the places where two pretokens meet inside a run of whitespace, and a region looks
    encoded by ``reference.looks_encoded`` on its bytes (``classes``: ``superbpe.word_classes``;
    ``flags``: ``superbpe.word_flags``). SupraTok's units are cut only at numbers, so one unit can
    span several regions: it counts as encoded when more than half of its bytes lie in regions that
    look encoded. Plain twin: ``reference.supratok.supratok_units``; the native form (what the
    documents pass runs): ``engine.units.units_in_encoded_regions`` (tested equal).

    ``doc_starts``: ``ids`` are several documents' (a chunk's), each starting at one of these
    positions (a region starts there too); units never cross them. Default: one document.
    """
    f = flags[ids]
    rstart = np.zeros(ids.size, dtype=bool)
    rstart[0] = True
    rstart[1:] = ((f[:-1] & ENDS_SPACE) > 0) & ((f[1:] & STARTS_SPACE) > 0)
    if doc_starts is not None:
        rstart[doc_starts[doc_starts < ids.size]] = True
    c = classes[ids].astype(np.int64)
    sums = np.add.reduceat(c, np.flatnonzero(rstart), axis=0)
    enc_region = looks_encoded_counts(sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3], sums[:, 4])
    if not enc_region.any():
        return np.zeros(bounds.size - 1, dtype=bool)
    enc_word = enc_region[np.cumsum(rstart) - 1]
    n_bytes = np.add.reduceat(c[:, 0], bounds[:-1])
    enc_bytes = np.add.reduceat(np.where(enc_word, c[:, 0], 0), bounds[:-1])
    return 2 * enc_bytes > n_bytes


def _nonempty(bounds: np.ndarray) -> np.ndarray:
    """Unit bounds without their empty units (``UnitCounter.add_units`` skips them too).

    >>> _nonempty(np.array([0, 2, 2, 3])).tolist()
    [0, 2, 3]
    """
    if bounds.size > 1 and bool((bounds[1:] == bounds[:-1]).any()):
        return np.concatenate((bounds[:1], bounds[1:][bounds[1:] != bounds[:-1]]))
    return bounds


def _docs_chunk(task: tuple) -> tuple:
    """Worker: training units, held-out documents, document frequencies and language words. With
    ``classes`` the units that look like encoded data (:func:`encoded_units`) end with
    ``ENCODED_MARK`` (pass 2 gives them no weight; ``superbpe.stage2_table`` takes the mark off)."""
    (path, start, end, specials, pattern, keep_below, heldout, script_aware, index, numeric, sid, stamp,
     flags, classes) = task
    n_sids = (int(sid.max()) + 1 if sid.size else 0) if sid is not None else 0
    buf = read_range(path, start, end, stamp)
    spans, _ = split_spans(buf, 0, len(buf), specials)
    counter = UnitCounter()
    df = np.zeros(n_sids, dtype=np.int64)
    held: list[np.ndarray] = []
    lang_ids: dict[str, list[np.ndarray]] = {}
    lang_docs: dict[str, int] = {}
    n_train = 0
    for s, e in spans:
        doc = buf[s:e].tobytes()
        ends = pretoken_ends(buf[s:e], pattern) + s
        ids = index.word_ids(buf, ends, s)
        if ids.size and ids.min() < 0:
            raise InputChanged(path, "changed while it was read: a pretoken is missing from the word table "
                                     "counted earlier; nothing was written")
        if is_heldout(doc, heldout):
            held.append(ids.astype(np.uint32))
            continue
        n_train += 1
        num = numeric[ids]
        cut = np.flatnonzero(num[1:] | num[:-1]) + 1
        bounds = np.concatenate(([0], cut, [ids.size])).astype(np.int64)
        ids32 = ids.astype(np.uint32)
        if classes is not None and ids.size:
            enc = units_in_encoded_regions(ids.astype(np.uint32), bounds, flags, classes)
            if enc.any():
                ids32 = np.insert(ids32, bounds[1:][enc], np.uint32(ENCODED_MARK))
                bounds = bounds + np.concatenate(([0], np.cumsum(enc)))
        counter.add_units(ids32, bounds, 1, keep_below)
        if sid is not None:
            u = np.unique(sid[ids])
            df[u[u >= 0]] += 1
        if script_aware:
            lang = guess_suffix_language(doc.decode("utf-8", "surrogateescape"))
            if lang is not None:
                lang_ids.setdefault(lang, []).append(ids)
                lang_docs[lang] = lang_docs.get(lang, 0) + 1
    data, starts, counts = counter.to_arrays()
    lang_counts = {k: np.bincount(np.concatenate(v), minlength=len(numeric)) for k, v in lang_ids.items()}
    return (data, starts, counts, counter.n_seen, counter.n_kept, df if sid is not None else None, held, n_train,
            (lang_counts, lang_docs))


def _docs_chunk_scan(task: tuple) -> tuple:
    """Worker: ``_docs_chunk`` when no document is held out, by one native scan of the chunk
    (``chunk_unit_stream``: the units and every pretoken's word id, document by document) instead of
    a loop over its documents; the language guess decodes only the documents that may pass it
    (all of them without ``markers``); with ``classes`` the units that look encoded are marked as
    there (``encoded_units`` on the chunk's documents at once). Document frequencies are not
    counted (None): only pass 3 reads them, and it needs held-out documents. The same units, counts
    and language words (tested)."""
    (path, start, end, specials, pattern_id, keep_below, script_aware, index, numeric, markers, n_words, stamp,
     flags, classes, listed) = task
    buf = read_range(path, start, end, stamp)
    spans, _ = split_spans(buf, 0, len(buf), specials)
    ends = np.zeros(spans.shape[0], dtype=np.int64)
    ids, bounds, _, _, missing = chunk_unit_stream(buf, spans, pattern_id, index, numeric, span_ends=ends)
    if missing:
        raise InputChanged(path, "changed while it was read: a pretoken is missing from the word table "
                                 "counted earlier; nothing was written")
    firsts = np.concatenate(([0], ends[:-1]))
    if listed:
        # the units as they come, the encoded ones flagged (UnitList: pass 2 deduplicates its pieces)
        bounds = _nonempty(bounds)
        enc = (units_in_encoded_regions(ids, bounds, flags, classes, firsts) if classes is not None and ids.size
               else np.zeros(bounds.size - 1, dtype=bool))
        listed_units = (ids, bounds, enc)
        n_seen = n_kept = bounds.size - 1
    elif classes is not None and ids.size:
        counter = UnitCounter()
        # the units that look encoded end with ENCODED_MARK; a block of documents at a time (the
        # byte classes of every pretoken of a chunk at once took 40 bytes a pretoken), in text order
        cuts = np.unique(np.searchsorted(ends, np.arange(SCAN_BLOCK, ids.size, SCAN_BLOCK), side="left"))
        for d0, d1 in zip(np.concatenate(([0], cuts + 1)).tolist(), np.concatenate((cuts + 1, [ends.size])).tolist()):
            if d1 <= d0:
                continue
            a, b = int(firsts[d0]), int(ends[d1 - 1])
            u0, u1 = np.searchsorted(bounds, [a, b])
            part, pb = ids[a:b], bounds[u0:u1 + 1] - a
            enc = units_in_encoded_regions(part, pb, flags, classes, firsts[d0:d1] - a)
            if enc.any():
                part = np.insert(part, pb[1:][enc], np.uint32(ENCODED_MARK))
                pb = pb + np.concatenate(([0], np.cumsum(enc)))
            counter.add_units(part, pb, 1, keep_below)
        del part, pb, enc
    else:
        counter = UnitCounter()
        counter.add_units(ids, bounds, 1, keep_below)
    if not listed:
        listed_units = counter.to_arrays()
        n_seen, n_kept = counter.n_seen, counter.n_kept
        del counter, bounds
    data, starts, counts = listed_units
    lang_counts: dict[str, np.ndarray] = {}
    lang_docs: dict[str, int] = {}
    if script_aware and spans.shape[0]:
        if markers is not None:          # the documents the guess may give a language (guess_candidates)
            docs = guess_candidates(markers[ids], firsts)    # (every document holds a pretoken)
        else:
            docs = np.arange(spans.shape[0])
        lang_ids: dict[str, list[np.ndarray]] = {}
        for k in docs.tolist():
            lang = guess_suffix_language(buf[spans[k, 0]:spans[k, 1]].tobytes().decode("utf-8", "surrogateescape"))
            if lang is not None:
                lang_ids.setdefault(lang, []).append(ids[firsts[k]:ends[k]])
                lang_docs[lang] = lang_docs.get(lang, 0) + 1
        lang_counts = {k: np.bincount(np.concatenate(v), minlength=n_words) for k, v in lang_ids.items()}
    return data, starts, counts, n_seen, n_kept, None, [], spans.shape[0], (lang_counts, lang_docs)


def count_documents(path: str, table: WordTable, sid: np.ndarray, specials: Sequence[bytes], pattern: str,
                    num_workers: int, chunk_bytes: int, sample_fraction: float, heldout: float,
                    script_aware: bool, on_bytes: Optional[Callable[[int], None]] = None,
                    flags: Optional[np.ndarray] = None, classes: Optional[np.ndarray] = None,
                    force_loop: bool = False, listed: bool = False) -> dict:
    """One pass over the corpus: training units (deduplicated, sampled), held-out documents as word-id
    arrays (sorted, so the result does not depend on chunking), word document frequencies.
    ``on_bytes(n)`` hears of each chunk of ``n`` bytes done (a progress bar). With ``flags`` and
    ``classes`` (``superbpe.word_flags``, ``superbpe.word_classes``) the training units that look
    like encoded data carry ``ENCODED_MARK`` (:func:`encoded_units`).

    Without held-out documents (``heldout`` 0) and with a native pattern, each chunk is one native
    scan (``_docs_chunk_scan``), and the document frequencies are not counted (``"df"`` is None:
    only pass 3 reads them, and it needs held-out documents); else a loop over the documents
    (``_docs_chunk``, also with ``force_loop``: the plain twin the tests compare it with). ``sid``
    (the words' statistic ids) is needed for the document frequencies only: None counts none.

    ``listed``: where the scan runs and takes no sample, ``"units"`` is a list of one part ``(data,
    starts, encoded)``: every unit as often as it occurs, in text order, the encoded ones flagged
    instead of marked (:class:`UnitList`: for pass 2 alone, which deduplicates its pieces); ``"listed"``
    says whether they are."""
    stamp = FileStamp.of(path)
    name = pattern_name(pattern)
    chunks = file_chunks(path, chunk_bytes, specials, name, inside_documents=False, stamp=stamp)
    keep_below = 0xFFFFFFFFFFFFFFFF if sample_fraction >= 1 else int(sample_fraction * 2 ** 64)
    index = WordIndex(table.arena, table.offsets)
    numeric = numeric_mask(table)
    scan = heldout <= 0 and name in PATTERN_IDS and not force_loop
    listed = listed and scan and sample_fraction >= 1
    if scan:        # no held-out documents: one native scan a chunk (_docs_chunk_scan)
        markers = marker_words(table) if script_aware and name in LETTER_RUN_PATTERNS else None
        worker = _docs_chunk_scan
        tasks = [(path, s, e, list(specials), PATTERN_IDS[name], keep_below, script_aware, index,
                  numeric.astype(np.uint8), markers, table.n_words, stamp, flags, classes, listed) for s, e in chunks]
    else:
        worker = _docs_chunk
        tasks = [(path, s, e, list(specials), pattern, keep_below, heldout, script_aware, index, numeric, sid, stamp,
                  flags, classes) for s, e in chunks]
    total = UnitCounter()
    listed_parts: list = []
    count_df = not scan and sid is not None
    out = {"seen": 0, "kept": 0, "df": np.zeros(int(sid.max()) + 1 if sid.size else 0, np.int64) if count_df else None,
           "held": [], "n_train_docs": 0, "lang": {}, "lang_docs": {}, "listed": listed}

    sizes = iter([e - s for s, e in chunks])

    def absorb(r):
        data, starts, counts, n_seen, n_kept, df, held, n_train, lang = r
        if on_bytes is not None:
            on_bytes(next(sizes))
        if listed:
            listed_parts.append((data, starts, counts))
        else:
            total.add_table(data, starts, counts)
        out["seen"] += n_seen
        out["kept"] += n_kept
        if df is not None:
            out["df"] += df
        out["held"].extend(held)
        out["n_train_docs"] += n_train
        for k, v in lang[0].items():
            out["lang"][k] = out["lang"].get(k, 0) + v
        for k, v in lang[1].items():
            out["lang_docs"][k] = out["lang_docs"].get(k, 0) + v

    run_ordered(worker, tasks, min(num_workers, len(tasks)), absorb)
    stamp.check()
    out["held"].sort(key=lambda a: (a.size, a.tobytes()))
    out["units"] = [UnitList.join(listed_parts)] if listed else total.to_arrays()
    return out


def can_use_record(heldout: float, pattern: str) -> bool:
    """Whether :func:`documents_from_records` can stand in for :func:`count_documents`: exactly when
    that would scan (no held-out documents, a native pattern: no document frequencies, no held-out
    word ids to list)."""
    return heldout <= 0 and pattern_name(pattern) in PATTERN_IDS


def documents_from_records(recorded: list, table: WordTable, pattern: str, num_workers: int,
                           sample_fraction: float, script_aware: bool, flags: Optional[np.ndarray] = None,
                           classes: Optional[np.ndarray] = None, listed: bool = False) -> dict:
    """:func:`count_documents` without held-out documents (:func:`can_use_record`), from the counting
    pass's record of every pretoken (``count_corpus(record=)``) instead of a second pre-tokenization
    of the file: the same units, counts, figures and language words (tested equal).

    The record's pretokens become table rows cut into documents (``superbpe.record_table_rows``);
    the documents are taken a block of about ``SCAN_BLOCK`` pretokens at a time, as
    ``_docs_chunk_scan`` takes a chunk's: units cut at numeric words (``id_unit_stream``), the
    encoded ones marked (:func:`encoded_units`), counted in text order (on two threads with
    ``num_workers`` 2: the two halves of the text, their tables joined in order, as the scan joins
    its chunks'); the language guess reads only the documents it may pass (``marker_words``), their
    bytes gathered from the table's words (a document's pretokens cover its bytes exactly).

    ``listed`` (without a sample: ``"listed"`` says whether): the units as :func:`count_documents`
    lists them with ``listed`` (one part, ``(data, starts, encoded)``)."""
    from ..superbpe.units import record_table_rows, slice_segments

    segments, breaks = record_table_rows(recorded, table, num_workers)
    keep_below = 0xFFFFFFFFFFFFFFFF if sample_fraction >= 1 else int(sample_fraction * 2 ** 64)
    listed = listed and sample_fraction >= 1
    # (the flags' NUMERIC is numeric_mask's rule, without its second pass over the words)
    numeric = (((flags & NUMERIC) > 0) if flags is not None else numeric_mask(table)).astype(np.uint8)
    name = pattern_name(pattern)
    markers = marker_words(table) if script_aware and name in LETTER_RUN_PATTERNS else None
    arena = np.asarray(table.arena, dtype=np.uint8)
    offsets = np.asarray(table.offsets, dtype=np.int64)
    n_words = table.n_words
    halves = [breaks]
    if num_workers >= 2 and breaks.size > 2:
        m = min(max(int(np.searchsorted(breaks, int(breaks[-1]) // 2)), 1), breaks.size - 2)
        halves = [breaks[:m + 1], breaks[m:]]

    def text_of(ids: np.ndarray) -> bytes:
        """The bytes of a document, its pretokens' words one after the other."""
        starts = offsets[ids]
        lengths = offsets[ids + 1] - starts
        at = np.cumsum(lengths) - lengths
        return arena[np.repeat(starts - at, lengths) + np.arange(int(lengths.sum()))].tobytes()

    def run(b: np.ndarray) -> tuple:
        lang_ids: dict[str, list[np.ndarray]] = {}
        lang_docs: dict[str, int] = {}
        lo, hi = int(b[0]), int(b[-1])
        if listed:      # every pretoken of the half, once, where it is in the text
            counter = UnitList(data=listed_ids, at=lo)
        else:
            counter = UnitCounter()
            # room for every pretoken of the text (the first half's counter: of all of it, as it takes
            # the other half's units in after) and its marks: units are nearly all distinct, so the
            # lists reach about that; asked for at once, they do not grow by copies into fresh pages
            room = (int(breaks[-1]) if lo == 0 else hi - lo) * sample_fraction
            counter.reserve(int(room * 1.02) + 1024, int(room) // UNITS_PER_PRETOKEN_ROOM + 1024)
        edges = np.unique(np.concatenate(([0], np.searchsorted(b, np.arange(lo + SCAN_BLOCK, hi, SCAN_BLOCK)),
                                          [b.size - 1])))
        for e0, e1 in zip(edges[:-1].tolist(), edges[1:].tolist()):
            bb = b[e0:e1 + 1]
            a, z = int(bb[0]), int(bb[-1])
            if z <= a:
                continue
            ids, bounds, _, _ = id_unit_stream(slice_segments(segments, a, z), bb - a, numeric)
            firsts = bb[:-1] - a
            if listed:
                bounds = _nonempty(bounds)
                counter.add(ids, bounds, units_in_encoded_regions(ids, bounds, flags, classes, firsts)
                            if classes is not None else None)
            else:
                part = ids
                if classes is not None:
                    enc = units_in_encoded_regions(ids, bounds, flags, classes, firsts)
                    if enc.any():
                        part = np.insert(ids, bounds[1:][enc], np.uint32(ENCODED_MARK))
                        bounds = bounds + np.concatenate(([0], np.cumsum(enc)))
                counter.add_units(part, bounds, 1, keep_below)
                del part
            del bounds
            if script_aware:
                if markers is not None:
                    docs = guess_candidates(markers[ids], firsts)
                else:
                    docs = np.arange(firsts.size)
                ends = bb[1:] - a
                for k in docs.tolist():
                    doc = ids[firsts[k]:ends[k]]
                    lang = guess_suffix_language(text_of(doc).decode("utf-8", "surrogateescape"))
                    if lang is not None:
                        lang_ids.setdefault(lang, []).append(doc)
                        lang_docs[lang] = lang_docs.get(lang, 0) + 1
        lang_counts = {k: np.bincount(np.concatenate(v), minlength=n_words) for k, v in lang_ids.items()}
        if listed:
            if counter.size != hi:
                raise InternalError(f"the listed units of pretokens {lo}..{hi} end at {counter.size}")
            return counter.to_arrays(), counter.n_seen, counter.n_seen, lang_counts, lang_docs
        return counter, counter.n_seen, counter.n_kept, lang_counts, lang_docs

    # listed: the word ids of the units are the record's rows in text order, so the halves write them
    # into one array, each where its text is (one part for pass 2, not joined by a copy)
    listed_ids = np.empty(int(breaks[-1]), dtype=np.uint32) if listed else None
    if len(halves) == 2:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2, thread_name_prefix="bpe_core-documents") as ex:
            results = list(ex.map(run, halves))
    else:
        results = [run(halves[0])]
    del segments
    # the first half's counter takes the later halves' units in (the table a fresh counter joining
    # them in order makes: the first half's units are distinct already), and its memory becomes the
    # arrays (no copy): a hash and a copy of every unit less
    total = results[0][0]
    out = {"seen": 0, "kept": 0, "df": None, "held": [], "n_train_docs": int(breaks.size - 1), "lang": {},
           "lang_docs": {}, "listed": listed}
    for i, (counter, n_seen, n_kept, lang_counts, lang_docs) in enumerate(results):
        if i and not listed:
            total.add_table(*counter.to_arrays(take=True))
        out["seen"] += n_seen
        out["kept"] += n_kept
        for k, v in lang_counts.items():
            out["lang"][k] = out["lang"].get(k, 0) + v
        for k, v in lang_docs.items():
            out["lang_docs"][k] = out["lang_docs"].get(k, 0) + v
    out["units"] = [UnitList.join([r[0] for r in results], listed_ids)] if listed else total.to_arrays(take=True)
    del results, counter, total
    return out
