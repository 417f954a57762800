"""Counting the pretokens of a corpus file: chunks on worker threads, one sorted word table.

This is the map-reduce of training: each chunk becomes a sorted count table
(``pretokenize.count_pretokens``), the tables are summed by k-way merges (``merge_counts``) as they
arrive, and a table that outgrows its share of the budget is spilled to disk as a sorted run. The
result does not depend on the number of workers, the chunk size or the spill threshold (tested
across all three), and its totals are checked against what the workers counted.
"""
from __future__ import annotations

import array
import copy
import dataclasses
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from ..runtime.lazy import np  # numpy on first use (a small run never imports it)

from ..corpus.readers import BadRecords
from ..corpus.inputs import Source, expand_inputs
from ..corpus.shards import Block, ReadOptions, TextRangeShard, iter_tasks, load, shard_blocks
from ..runtime.atomic import DISK_FULL, named, new_temp_dir, remove_stale_in
from ..runtime.budget import refuse_memory_folder
from ..runtime.memmon import MemoryMonitor, phase
from ..runtime.progress import progress_bar
from ..runtime.workers import (HEAP_TOPS_KEPT, check_total, read_range, release_free_memory, run_ordered,
                               trim_heap_tops)
from ..runtime.writeback import WriteBehind
from .patterns import pattern_name
from ._pretok import CountScratch, table_sums
from .pretokenize import count_pretokens, merge_counts, split_spans
from .wordtable import WordTable

__all__ = ["ChunkCount", "Spill", "block_spans", "check_distributable", "combine_counts", "count_corpus",
           "count_shard", "count_shards", "count_source_shard", "count_sources_on", "covered_bytes", "private_shard",
           "shard_weights", "SPILL_PREFIX"]




@dataclass
class ChunkCount:
    """What a worker returns for one chunk: its sorted table and the totals that must add up."""

    table: tuple            # (arena, offsets, counts), sorted by bytes
    n_bytes: int            # bytes of the chunk (read in full)
    n_specials: int         # special-token occurrences
    special_bytes: int      # bytes inside those occurrences
    n_pretokens: int        # pretokens counted (the sum of the counts)
    begins_item: bool = True    # an item (file, record) starts at the chunk's first byte
    n_items: int = 0            # items starting in the chunk
    source: int = 0             # index of its source
    # For results folded on a cluster (``combine_counts``): item starts inside the result that follow
    # an item inside it (a separator goes before each), bytes per source, bad records found, blocks.
    joins: int = 0
    per_source: Optional[dict] = None
    bad: Optional[dict] = None
    n_blocks: int = 1
    # With ``record``: (arena, offsets, ids, spans, n_bytes, ends, id_rows): the chunk's own sorted table
    # (arena and offsets), the number of every pretoken's word in text order (the words numbered as
    # first seen: id_rows gives each one's row), its text spans (between special tokens), the chunk's
    # size and where each span's pretokens end in the ids
    recorded: Optional[tuple] = None


def block_spans(buf, doc_ends, specials: Sequence[bytes]) -> tuple[np.ndarray, int]:
    """The text spans of a block (``corpus.shards.Block``) and its special-token occurrences:
    split at special tokens, and, when ``doc_ends`` is given, never across a document end."""
    if doc_ends is None:
        return split_spans(buf, 0, len(buf), specials)
    if not specials:
        starts = np.concatenate([[0], doc_ends[:-1]]).astype(np.int64)
        spans = np.stack([starts, np.asarray(doc_ends, np.int64)], axis=1) if len(doc_ends) else \
            np.zeros((0, 2), np.int64)
        return spans[spans[:, 1] > spans[:, 0]], 0
    parts, n = [], 0
    start = 0
    for end in np.asarray(doc_ends).tolist():
        sp, k = split_spans(buf, start, end, specials)
        parts.append(sp)
        n += k
        start = end
    return (np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)), n


def _count_chunk(task: tuple) -> ChunkCount:
    """Worker: count the pretokens of one block of the corpus; checks that they cover its text.

    ``task`` is ``(shard or block, specials, pattern)`` or ``(shard or block, specials, pattern,
    record, buffers)`` (a plain file's chunk is then read into a buffer of ``buffers``, a
    :class:`ReadBuffers`), or ``(path, start, end, specials, pattern, stamp)`` for a byte range of a
    plain file.
    """
    record = False
    buffers = taken = None
    if len(task) == 6:
        path, start, end, specials, pattern, stamp = task
        block = Block(read_range(path, start, end, stamp), None, start == 0, int(start == 0), 0,
                      f"{path}[{start}:{end}]")
    else:
        piece, specials, pattern, *rest = task
        record = bool(rest and rest[0])
        buffers = rest[1] if len(rest) > 1 else None
        if buffers is not None and type(piece) is TextRangeShard:
            taken = buffers.take(piece.end - piece.start)
            block = piece.read(out=taken)
        else:
            block = load(piece)
    scratch = buffers.take_scratch() if buffers is not None and not record else None
    try:
        return _count_block(block, specials, pattern, record, scratch)
    finally:
        if taken is not None:
            buffers.give(taken)
        if scratch is not None:
            buffers.give_scratch(scratch)


def _count_block(block: Block, specials, pattern: str, record: bool, scratch=None) -> ChunkCount:
    buf = block.data
    spans, n_specials = block_spans(buf, block.doc_ends, specials)
    recorded = None
    if record:
        ends = np.empty(len(spans), dtype=np.int64)
        arena, offsets, counts, ids, id_rows = count_pretokens(buf, spans, pattern, record=True, span_ends=ends,
                                                               by_entry=True)
        recorded = (arena, offsets, ids, spans, len(buf), ends, id_rows)
    else:
        arena, offsets, counts = count_pretokens(buf, spans, pattern, scratch=scratch)
    text_bytes = int((spans[:, 1] - spans[:, 0]).sum()) if len(spans) else 0
    # Conservation: the pretokens of the text spans cover every byte of them, exactly once (one
    # native pass over the table: numpy's diff and dot made two temporaries of its size per chunk).
    n_pretokens, covered, _ = table_sums(offsets, counts)
    check_total(f"bytes of {block.label} (pretoken bytes vs text bytes)", covered, text_bytes)
    n = len(buf)
    return ChunkCount((arena, offsets, counts), n, n_specials, n - text_bytes, n_pretokens,
                      block.begins_item, block.n_items, block.source, recorded=recorded)


class ReadBuffers:
    """The buffers the counting threads read plain-file chunks into, and the counters' hash tables
    (``_pretok.CountScratch``), reused from chunk to chunk.

    A fresh 64 MiB buffer per chunk costs the kernel a page fault and a zeroed page for every 4 KiB
    (2 MiB with transparent huge pages) before ``pread`` copies the text over it: on 1 GB of text
    that zeroing was ~10% of the counting's CPU. A worker takes a buffer, reads its chunk into it,
    and gives it back when the chunk is counted (nothing it returns points into it), so there are at
    most as many buffers as chunks being read at once: what the plan's per-worker bytes already hold
    while the workers count. An idle worker's buffer is not in the plan: ``count_corpus`` frees the
    free ones (:meth:`clear`) before the parent's large folds and spills, and when counting ends.

    The hash tables likewise: a worker takes one (:meth:`take_scratch`) for the chunk it counts and
    gives it back with the table counted; a kept one is no larger than the worker's table while it
    counts (the plan's per-worker bytes), and :meth:`clear` frees the idle ones with the buffers.

    >>> bufs = ReadBuffers(); a = bufs.take(10); bufs.give(a); bufs.take(5) is a, len(a) >= 10
    (True, True)
    """

    #: a new buffer has room for this share more than its chunk, rounded up to ``GRAIN`` bytes: chunks
    #: cut at pretoken boundaries differ a little in size, and a page never written is no memory
    SLACK = 1 / 16
    GRAIN = 1 << 20

    def __init__(self):
        import threading

        self._free: list = []
        self._scratches: list = []
        self._lock = threading.Lock()

    def take(self, n: int):
        """A uint8 buffer of at least ``n`` bytes (a free one, else a new one; a free one too
        short for ``n`` is dropped)."""
        with self._lock:
            while self._free:
                buf = self._free.pop()
                if len(buf) >= n:
                    return buf
        want = max(n, 1) + int(n * self.SLACK)
        return np.empty(-(-want // self.GRAIN) * self.GRAIN, dtype=np.uint8)

    def give(self, buf) -> None:
        with self._lock:
            self._free.append(buf)

    def take_scratch(self):
        """A counter's hash tables (``_pretok.CountScratch``): a free one, else a new empty one."""
        with self._lock:
            if self._scratches:
                return self._scratches.pop()
        return CountScratch()

    def give_scratch(self, scratch) -> None:
        with self._lock:
            self._scratches.append(scratch)

    def clear(self) -> None:
        """Free the idle buffers and hash tables (those in use are kept by their workers)."""
        with self._lock:
            self._free.clear()
            for scratch in self._scratches:    # kept, empty: the next chunk's count allocates afresh
                scratch.clear()


def _count_plain(task: tuple) -> ChunkCount:
    """Worker: ``_count_chunk`` of a plain file's byte range without numpy (a small run): the bytes
    in a ``bytearray``, the spans and the table in ``array.array`` (``"B"``, ``"q"``, ``"q"``).

    ``task`` is ``(shard, specials, pattern)``: a ``corpus.shards.TextRangeShard`` and a named pattern.
    """
    shard, specials, pattern = task
    block = shard.read(numpy=False)
    buf = block.data
    flat, n_specials = split_spans(buf, 0, len(buf), specials, numpy=False)
    text_bytes = sum(flat[1::2]) - sum(flat[0::2])
    if flat:
        spans = memoryview(flat).cast("B").cast("q", (len(flat) // 2, 2))
        arena, offsets, counts = count_pretokens(buf, spans, pattern, numpy=False)
    else:
        arena, offsets, counts = array.array("B"), array.array("q", [0]), array.array("q")
    n_pretokens, covered, _ = table_sums(offsets, counts)
    # Conservation: the pretokens of the text spans cover every byte of them, exactly once.
    check_total(f"bytes of {block.label} (pretoken bytes vs text bytes)", covered, text_bytes)
    n = len(buf)
    return ChunkCount((arena, offsets, counts), n, n_specials, n - text_bytes, n_pretokens,
                      block.begins_item, block.n_items, block.source)


def _count_buffer(buf, label: str, specials, pattern: str) -> ChunkCount:
    spans, n_specials = split_spans(buf, 0, len(buf), specials)
    arena, offsets, counts = count_pretokens(buf, spans, pattern)
    text_bytes = int((spans[:, 1] - spans[:, 0]).sum()) if len(spans) else 0
    # Conservation: the pretokens of the text spans cover every byte of them, exactly once.
    check_total(f"bytes of {label} (pretoken bytes vs text bytes)", covered_bytes(offsets, counts), text_bytes)
    return ChunkCount((arena, offsets, counts), len(buf), n_specials, len(buf) - text_bytes, int(counts.sum()))


# ==== On an executor (a cluster): shards -> tables -> one table ================================


def count_shard(shard, specials: Sequence[bytes], pattern: str) -> ChunkCount:
    """Task: count the pretokens of one shard (``corpus.shards.Shard``: the worker reads it).

    >>> from bpe_core.corpus.shards import Shard
    >>> import tempfile; p = tempfile.mktemp(); _ = open(p, "wb").write(b"a b<|e|>a")
    >>> c = count_shard(Shard(p, 0, 9), [b"<|e|>"], "gpt2")
    >>> c.n_bytes, c.n_specials, c.n_pretokens
    (9, 1, 3)
    """
    buf = shard.read()
    check_total(f"bytes of {shard.label()} (bytes read vs shard size)", len(buf), shard.n_bytes)
    return _count_buffer(buf, shard.label(), specials, pattern)


def combine_counts(parts: list) -> ChunkCount:
    """Combine: the sum of sorted count tables (``merge_counts``) and of their totals.

    The sum of the counts is checked (a fold keeps every pretoken). Associative, so the tables may
    be combined in any tree (on cluster workers) with the same result.

    >>> from bpe_core.pretok.wordtable import WordTable
    >>> def t(d): w = WordTable.from_counts(d); return w.arena, w.offsets, w.counts
    >>> a = ChunkCount(t({b"x": 1, b"y": 2}), 3, 0, 0, 3)
    >>> b = ChunkCount(t({b"y": 1}), 1, 0, 0, 1)
    >>> WordTable.from_arrays(combine_counts([a, b]).table).to_dict()
    {b'x': 1, b'y': 3}
    """
    if not parts:
        empty = WordTable.empty()
        return ChunkCount((empty.arena, empty.offsets, empty.counts), 0, 0, 0, 0, False, n_blocks=0)
    if len(parts) == 1:
        return parts[0]
    merged = merge_counts([p.table for p in parts])
    check_total("pretoken counts after a combine", int(merged[2].sum()), sum(int(p.table[2].sum()) for p in parts))
    # Items in order: an item start after an item (in this group) is a join; the group begins an
    # item when its first item starts before any other item of the group. Parts come in task order.
    seen = joins = 0
    begins = False
    for p in parts:
        joins += p.joins
        if p.begins_item:
            if seen:
                joins += 1
            else:
                begins = True
        seen += p.n_items
    per_source = None
    if any(p.per_source is not None for p in parts):
        per_source = {}
        for p in parts:
            for k, v in (p.per_source or {}).items():
                per_source[k] = per_source.get(k, 0) + v
    bad = None
    if any(p.bad is not None for p in parts):
        collect = BadRecords(skip=True)
        for p in parts:
            if p.bad is not None:
                collect.absorb(p.bad)
        bad = collect.to_dict()
    return ChunkCount(merged, sum(p.n_bytes for p in parts), sum(p.n_specials for p in parts),
                      sum(p.special_bytes for p in parts), sum(p.n_pretokens for p in parts), begins, seen,
                      parts[0].source, joins, per_source, bad, sum(p.n_blocks for p in parts))


def count_source_shard(shard, specials: Sequence[bytes], pattern: str) -> ChunkCount:
    """Task: count one shard of ``corpus.shards`` where it runs (a cluster worker reads it itself).

    A lazy shard (a byte range of a plain file or of a JSON Lines file, Parquet row groups) is one
    block; a compressed file is one shard whose blocks are decompressed and counted in order here
    and folded as they come. The result carries what the client's totals need: items and joins
    (separators), bytes per source, the bad records this shard held (collected fresh here).

    >>> import tempfile, os; d = tempfile.mkdtemp(); p = os.path.join(d, "r.jsonl")
    >>> _ = open(p, "w").write('{"text": "a b"}\\n{"text": "a"}\\n{"x": 1}\\n')
    >>> from bpe_core.corpus.readers import BadRecords
    >>> opts = ReadOptions(special_tokens=[b"<|e|>"], bad=BadRecords(skip=True))
    >>> c = count_source_shard(expand_inputs(p)[0].shards(opts)[0], [b"<|e|>"], "gpt2")
    >>> c.n_items, c.n_specials, c.n_pretokens, c.bad["skipped"], opts.bad.count
    (2, 1, 3, 1, 0)
    """
    sh = private_shard(shard)
    levels: list = []

    def absorb(result: ChunkCount) -> None:
        levels.append((0, result))
        while len(levels) >= FOLD_FANOUT and all(lv == levels[-1][0] for lv, _ in levels[-FOLD_FANOUT:]):
            lv = levels[-1][0]
            group = [r for _, r in levels[-FOLD_FANOUT:]]
            del levels[-FOLD_FANOUT:]
            levels.append((lv + 1, combine_counts(group)))

    for block in shard_blocks(sh):
        result = _count_chunk((block, specials, pattern))
        result.per_source = {block.source: result.n_bytes}
        absorb(result)
    if not sh.lazy:
        # Conservation: every byte and record the reader produced was counted once.
        check_total(f"bytes of {sh.source.name} (bytes counted vs bytes the reader produced)",
                    sum(r.n_bytes for _, r in levels), sh.bytes_out)
        check_total(f"records of {sh.source.name} (records counted vs records read)",
                    sum(r.n_items for _, r in levels), sh.items_out)
    total = combine_counts([r for _, r in levels])
    total.per_source = total.per_source or {}
    total.bad = sh.opts.bad.to_dict()
    return total


def private_shard(shard):
    """A copy of a ``corpus.shards`` shard with its own bad-record collector (a task reports what
    its shard held; on this machine's threads the shared collector stays untouched)."""
    sh = copy.copy(shard)
    sh.opts = dataclasses.replace(shard.opts, bad=shard.opts.bad.fresh())
    sh.bytes_out = sh.items_out = 0
    return sh


def shard_weights(shards: Sequence) -> dict:
    """Bytes of progress per shard (by ``id``): a byte range's length, else an even share of its
    source's estimated size."""
    per_source: dict = {}
    for sh in shards:
        per_source.setdefault(sh.source.index, []).append(sh)
    out = {}
    for group in per_source.values():
        share = group[0].source.estimated_bytes // max(1, len(group))
        for sh in group:
            out[id(sh)] = (sh.end - sh.start) if hasattr(sh, "end") else share
    return out


def check_distributable(sources: Sequence[Source]) -> None:
    """A cluster task reads its own shard: standard input and iterators cannot be shipped.

    Raises:
        ValueError: one line naming the input.

    >>> try:
    ...     check_distributable(expand_inputs([iter(["a"])]))
    ... except ValueError as exc:
    ...     print(exc)
    <list_iterator>: an iterator (<list_iterator>) cannot be read by cluster workers; write it to a file (or drop --cluster / cluster=)
    """
    for src in sources:
        if not src.rereadable:
            what = "standard input" if src.is_stdin else f"an iterator ({src.name})"
            raise ValueError(f"{src.name}: {what} cannot be read by cluster workers; write it to a file "
                             f"(or drop --cluster / cluster=)")


def count_sources_on(executor, sources: Sequence[Source], specials: Sequence[bytes], pattern: str,
                     chunk_bytes: int, progress: bool = False, report: Optional[dict] = None,
                     read_options: Optional[ReadOptions] = None) -> WordTable:
    """``count_corpus`` with the shards of ``sources`` counted where ``executor`` runs (a cluster).

    One task per shard (``Source.shards``: a byte range of a plain or JSON Lines file, Parquet row
    groups, a whole compressed file), each reading its own bytes; the tables are combined in a
    tree by :func:`combine_counts` (on the workers) and one comes back. The table, the totals
    (items, documents, separators, bad records) and the conservation checks are those of
    ``count_corpus`` on the same inputs.

    Raises:
        ValueError: an input a worker cannot read (standard input, an iterator).

    >>> import tempfile, os; d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "a.txt"), "w").write("low low")
    >>> _ = open(os.path.join(d, "b.txt"), "w").write("lower")
    >>> from bpe_core.runtime.executors import LocalExecutor
    >>> report = {"seconds": {}}
    >>> t = count_sources_on(LocalExecutor(2), expand_inputs(d), [b"<|e|>"], "gpt2", 1 << 20, report=report)
    >>> t.to_dict(), report["items"], report["separators_inserted"], report["documents"]
    ({b' low': 1, b'low': 1, b'lower': 1}, 2, 1, 2)
    """
    t0 = time.perf_counter()
    sources = list(sources)
    check_distributable(sources)
    opts = read_options if read_options is not None else ReadOptions()
    opts.chunk_bytes, opts.special_tokens = chunk_bytes, list(specials)
    opts.pattern, opts.inside_documents = pattern_name(pattern), True
    sep = opts.sep
    shards = [sh for src in sources for sh in src.shards(opts)]
    names = ", ".join(s.name for s in sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
    if report is not None:
        report["seconds"]["plan"] = round(report["seconds"].get("plan", 0) + time.perf_counter() - t0, 3)
    phase("pretokenize")
    t1 = time.perf_counter()
    weights = shard_weights(shards)
    bar = progress_bar(progress, total=sum(weights.values()) or None, desc="pre-tokenize", unit="B",
                       unit_scale=True, unit_divisor=1024)
    try:
        total = executor.map_reduce(count_source_shard, shards, combine_counts, shared=(list(specials), pattern),
                                    on_done=(lambda sh: bar.update(weights[id(sh)])) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    for src in sources:
        if src.stamp is not None:
            src.stamp.check()
    phase("merge counts")
    table = WordTable.from_arrays(total.table)
    if total.bad is not None:
        opts.bad.absorb(total.bad)
    # Conservation: every byte of every plain file read once (streams were checked by their task);
    # the table holds every pretoken counted, and covers every byte outside the special tokens.
    per_source = total.per_source or {}
    for src in sources:
        if src.plain_text:
            check_total(f"bytes of {src.name} (bytes read vs file size)", per_source.get(src.index, 0), src.size)
    check_total(f"bytes of {names} (bytes read vs bytes per source)", sum(per_source.values()), total.n_bytes)
    inserted = total.joins if sep else 0
    specials_seen = total.n_specials + inserted
    corpus_size = total.n_bytes + inserted * len(sep)
    check_total("pretokens (sum of the table's counts vs pretokens counted by the tasks)",
                int(table.counts.sum()), total.n_pretokens)
    check_total(f"bytes of {names} (bytes the table covers vs text bytes)",
                covered_bytes(table.offsets, table.counts), corpus_size - total.special_bytes - inserted * len(sep))
    if report is not None:
        report["n_chunks"] = total.n_blocks
        report["seconds"]["pretokenize"] = round(time.perf_counter() - t1, 3)   # counting and combining
        report["seconds"]["merge_counts"] = 0.0                                 # (on the workers)
        report["special_token_occurrences"] = specials_seen
        report["bytes_scanned"] = total.n_bytes
        report["corpus_bytes"] = corpus_size
        report["items"] = total.n_items
        report["separators_inserted"] = inserted
        report["documents"] = (specials_seen + 1 if total.n_items else 0) if specials else total.n_items
        report["pretokens_counted"] = total.n_pretokens
        report["spilled_runs"] = 0
        report["spilled_bytes"] = 0
        report["bad_records"] = opts.bad.to_dict()
    return table


def count_shards(shards: Sequence, specials: Sequence[bytes], pattern: str, executor, size: int, label: str,
                 progress: bool = False, report: Optional[dict] = None) -> WordTable:
    """Count the pretokens of ``shards`` on an executor (``runtime.executors``) into one table.

    Each task counts one shard where it runs (a cluster worker reads its own bytes); the tables are
    combined in a tree by :func:`combine_counts` (on the workers, for a cluster) and one table comes
    back. The totals are checked as in :func:`count_corpus`: every byte of the input (``size``)
    read once, the table holds every pretoken the tasks counted, and its words cover every byte
    outside the special tokens. The result equals ``count_corpus`` on the same bytes.
    """
    t1 = time.perf_counter()
    phase("pretokenize")
    check_total(f"bytes of {label} (bytes in the shards vs input size)", sum(s.n_bytes for s in shards), size)
    bar = progress_bar(progress, total=size, desc="pre-tokenize", unit="B", unit_scale=True, unit_divisor=1024)
    try:
        total = executor.map_reduce(count_shard, shards, combine_counts, shared=(list(specials), pattern),
                                    on_done=(lambda shard: bar.update(shard.n_bytes)) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    phase("merge counts")
    table = WordTable.from_arrays(total.table)
    check_total(f"bytes of {label} (bytes read vs input size)", total.n_bytes, size)
    check_total("pretokens (sum of the table's counts vs pretokens counted by the tasks)",
                int(table.counts.sum()), total.n_pretokens)
    check_total(f"bytes of {label} (bytes the table covers vs text bytes)",
                covered_bytes(table.offsets, table.counts), size - total.special_bytes)
    if report is not None:
        report["n_chunks"] = len(shards)
        report["seconds"]["pretokenize"] = round(time.perf_counter() - t1, 3)   # counting and combining
        report["seconds"]["merge_counts"] = 0.0                                 # (on the workers)
        report["special_token_occurrences"] = total.n_specials
        report["bytes_scanned"] = total.n_bytes
        report["pretokens_counted"] = total.n_pretokens
        report["spilled_runs"] = 0
        report["spilled_bytes"] = 0
    return table


def covered_bytes(offsets: np.ndarray, counts: np.ndarray) -> int:
    """Sum over words of ``len(word) * count``: the bytes of text a table stands for."""
    if len(counts) == 0:
        return 0
    return table_sums(offsets, counts)[1]


def count_corpus(inputs: Union[str, Sequence[Source]], specials: Sequence[bytes], pattern: str, num_workers: int,
                 chunk_bytes: int, progress: bool = False, report: Optional[dict] = None,
                 monitor: Optional[MemoryMonitor] = None, memory_limit: Optional[int] = None,
                 per_worker_bytes: int = 0, spill_threshold_bytes: Optional[int] = None,
                 spill_dir: Optional[str] = None,
                 check_words: Optional[Callable[[int], None]] = None,
                 read_options: Optional[ReadOptions] = None, record: Optional[list] = None,
                 plain: bool = False,
                 check_stretches: Optional[Callable[[list], None]] = None) -> WordTable:
    """Count the pretokens of a corpus into one sorted word table.

    ``inputs`` is a path (a plain-text file, as before) or a list of ``corpus.inputs.Source``
    (``read_options`` then says what a record is and collects bad records; its cutting fields are
    set here). Items (files, records) are joined by the first special token, or kept apart as spans
    when there is none (``corpus.shards``): the counts are those of the ``.txt`` with the same
    documents.

    Blocks go to ``num_workers`` threads (``workers.run_ordered``; in this thread when 1), at most
    ``num_workers + 1`` in flight; while others are in flight, a new block waits when a ``monitor``
    shows the process within ``per_worker_bytes`` of ``memory_limit``. Compressed and streamed
    inputs are decompressed ahead on reader threads. Partial tables are folded as they arrive,
    level by level (``FOLD_FANOUT`` tables of one level make one of the next, so each word is
    copied O(log n) times); when the tables in RAM outgrow ``spill_threshold_bytes``, they are
    merged and written to disk as one sorted run, and the runs are merged (exactly) at the end.
    ``check_words(n)`` is called with a lower bound on the number of unique pretokens as it grows
    (it raises to stop a run that provably cannot fit).

    Conservation is checked as the run goes: every byte of every plain file is read once, every
    byte a stream or reader produced is counted once, the pretokens of each block cover its text,
    and every fold and spill keeps the sum of the counts (so the final table holds exactly the
    pretokens the workers counted). A failure raises ``workers.InternalError``.

    ``record`` (a list): when the corpus is one local plain-text file and the pattern a named one,
    each chunk's ``ChunkCount.recorded`` is appended to it in text order (the chunk's own table, the
    row of every pretoken in it, its text spans and size): SuperBPE's stage 2 lists its units from
    these instead of pre-tokenizing the file again (``superbpe.units_from_records``). Otherwise the
    list stays empty.

    ``plain``: when the corpus is one byte range of a plain file (a small run) and the pattern a
    named one, count it without numpy: the table's arrays are then ``array.array``
    (``pretok.wordtable``), its numbers the same.

    ``check_stretches(ranges)``: called with the ``(name, start, end)`` chunks of plain files once
    they are cut, before any is read (it raises to refuse a chunk the budget cannot hold,
    ``budget.check_uncut``).
    """
    t0 = time.perf_counter()
    sources = expand_inputs(inputs, "text") if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    opts = read_options if read_options is not None else ReadOptions()
    opts.chunk_bytes, opts.special_tokens = chunk_bytes, list(specials)
    opts.pattern, opts.inside_documents = pattern_name(pattern), True
    sep = opts.sep
    shards = [sh for src in sources for sh in src.shards(opts)]
    if check_stretches is not None:     # the byte ranges of plain files, before any is read
        check_stretches([(sh.source.name, sh.start, sh.end) for sh in shards if isinstance(sh, TextRangeShard)])
    recording = (record is not None and len(sources) == 1 and sources[0].plain_text and not sources[0].is_url
                 and pattern_name(pattern) is not None and all(sh.lazy for sh in shards))
    # A small run (the whole input one byte range of a plain file) counts without numpy: the table's
    # arrays are ``array.array`` (``_count_plain``); the numbers are the same.
    plain = (plain and PLAIN_SMALL_RUNS and not recording and len(shards) == 1
             and type(shards[0]) is TextRangeShard and pattern_name(pattern) is not None)
    buffers = ReadBuffers()          # the chunks of plain files are read into reused buffers
    trim_heap_tops()                 # the counting threads' heaps give their free tops back
    tasks = ((sh, list(specials), pattern) for sh in shards) if plain else \
        ((sh, list(specials), pattern, recording, buffers)
         for sh in iter_tasks(sources, opts, max(1, (num_workers + 1) // 2), shards=shards))
    names = ", ".join(s.name for s in sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
    if report is not None:
        report["seconds"]["plan"] = round(report["seconds"].get("plan", 0) + time.perf_counter() - t0, 3)
    phase("pretokenize")
    total_size = sum(s.estimated_bytes for s in sources)
    bar = progress_bar(progress, total=total_size or None, desc="pre-tokenize", unit="B",
                       unit_scale=True, unit_divisor=1024)
    spill = Spill(spill_threshold_bytes, spill_dir)
    levels: list[tuple[int, tuple]] = []       # (level, sorted table) held in RAM
    totals = {"bytes": 0, "specials": 0, "special_bytes": 0, "pretokens": 0, "items": 0, "inserted": 0,
              "chunks": 0}
    per_source = [0] * len(sources)
    items_per_source = [0] * len(sources)
    t1 = time.perf_counter()
    merge_seconds = 0.0
    final_seconds = 0.0     # the last merge, after the workers are done (the rest of merge_seconds:
    #                         the folds while counting, overlapped with the workers' counting)
    fold_cpu = 0.0          # CPU seconds of the folds while counting (this thread's, beside the workers)
    workers = num_workers if any(not sh.lazy for sh in shards) else min(num_workers, len(shards))

    def fold(tables: list, threads: int = 1) -> tuple:
        merged = merge_counts(tables, threads=threads)
        check_total("pretoken counts after a fold", _n_pretokens(merged), sum(map(_n_pretokens, tables)))
        return merged

    def absorb(result: ChunkCount):
        nonlocal levels, merge_seconds, fold_cpu
        if result.begins_item and totals["items"] and sep:
            # the separator between two items: a special-token occurrence of the corpus
            totals["inserted"] += 1
            totals["specials"] += 1
            totals["special_bytes"] += len(sep)
        for key, value in (("bytes", result.n_bytes), ("specials", result.n_specials),
                           ("special_bytes", result.special_bytes), ("pretokens", result.n_pretokens),
                           ("items", result.n_items), ("chunks", 1)):
            totals[key] += value
        per_source[result.source] += result.n_bytes
        items_per_source[result.source] += result.n_items
        if recording:
            record.append(result.recorded)
        levels.append((0, result.table))
        tm, cm = time.perf_counter(), time.thread_time()
        while True:                 # fold FOLD_FANOUT tables of the lowest full level into one
            sizes: dict[int, int] = {}
            for lv, _ in levels:
                sizes[lv] = sizes.get(lv, 0) + 1
            full = [lv for lv, k in sizes.items() if k >= FOLD_FANOUT]
            if not full:
                break
            lv = min(full)
            if lv > 0:
                # A fold of folded tables (every FOLD_FANOUT ** 2 chunks) is the parent's peak: the
                # read buffers of idle workers are not in the plan's figure for it, so they go back
                # first (the next chunks read into new ones). A fold of chunk tables keeps them.
                buffers.clear()
            group = [t for l2, t in levels if l2 == lv]
            # A fold of folded tables takes longer than the workers' chunks in flight: they finish
            # and wait for this thread to hand them the next, so it runs on two threads (the same
            # table, in the same memory: merge_counts' halves write into one output)
            levels = [(l2, t) for l2, t in levels if l2 != lv] + \
                [(lv + 1, fold(group, min(max(workers, 1), 2) if lv > 0 else 1))]
        if spill.threshold is not None and sum(_table_bytes(t) for _, t in levels) > spill.threshold:
            # Over the threshold: merge everything in RAM into one table; it goes to disk if it is
            # still over, else it stays, as one table of the top level. Nothing is dropped.
            buffers.clear()
            top = max(lv for lv, _ in levels)
            merged = fold([t for _, t in levels], min(max(workers, 1), 2)) if len(levels) > 1 else levels[0][1]
            levels = [(top + 1, t) for t in spill.offer([merged])]
        # The tables just folded were made on worker threads, in their heap arenas: freed here, their
        # pages stay resident (glibc keeps them in the arena, and tables under its 32 MiB mmap
        # threshold do not go back on their own), so with small chunks the anonymous memory grew
        # ~100 MiB past what the plan holds (1 GB synthetic corpus, 300M budget: 335 MiB at the peak,
        # 224 MiB with this). Giving them back after each chunk costs a few ms.
        release_free_memory()
        merge_seconds += time.perf_counter() - tm
        fold_cpu += time.thread_time() - cm
        if check_words is not None and levels:
            check_words(max(len(t[2]) for _, t in levels))
        if bar is not None:
            bar.update(result.n_bytes)

    def may_submit(n_in_flight: int) -> bool:
        return monitor is None or not memory_limit or monitor.sample() < memory_limit - per_worker_bytes

    try:
        # One block more than workers in flight: a worker that finishes before the oldest block is
        # absorbed starts the next at once (with one per worker it waited for the oldest and its
        # fold: 1 GB of the synthetic corpus, workers busy 88-91% of the pass -> 97-98%). A
        # queued block holds nothing until it runs, and a finished one only its table.
        run_ordered(_count_plain if plain else _count_chunk, tasks, max(1, workers), absorb,
                    max_in_flight=max(1, workers) + 1, may_submit=may_submit)
        buffers.clear()              # the reading is over: the read buffers go back before the merge
        if bar is not None:
            bar.close()
        for src in sources:
            if src.stamp is not None:
                src.stamp.check()
        phase("merge counts")
        tm = time.perf_counter()
        runs = spill.runs() + [t for _, t in levels]
        if plain and len(runs) == 1 and isinstance(runs[0][2], array.array):
            table = WordTable(*runs[0])      # one sorted table, its words unique: merged already
        else:
            # the workers are done: the last merge runs on two threads when there are two
            table = WordTable.from_arrays(merge_counts(runs, threads=min(max(workers, 1), 2))) if runs \
                else WordTable.empty()
        final_seconds = time.perf_counter() - tm
        merge_seconds += final_seconds
    finally:
        spill.cleanup()
        # the tables just merged go, and their pages with them (the counting threads' heaps too: their
        # tops go back at 1 MiB until here): the merge phase starts from what it holds
        runs = levels = None
        release_free_memory()
        trim_heap_tops(HEAP_TOPS_KEPT)
    # Conservation over the whole run: every byte read once; the table holds every pretoken counted,
    # and its words cover every byte outside the special tokens.
    _check_sources(sources, shards, per_source, items_per_source)
    corpus_size = totals["bytes"] + totals["inserted"] * len(sep)
    check_total("pretokens (sum of the table's counts vs pretokens counted by the workers)",
                table.n_pretokens, totals["pretokens"])
    check_total(f"bytes of {names} (bytes the table covers vs text bytes)",
                covered_bytes(table.offsets, table.counts), corpus_size - totals["special_bytes"])
    if report is not None:
        report["n_chunks"] = totals["chunks"]
        report["seconds"]["pretokenize"] = round(time.perf_counter() - t1 - merge_seconds, 3)
        report["seconds"]["merge_counts"] = round(merge_seconds, 3)
        # the CPU seconds of the folds done while counting (in the "pretokenize" phase's CPU)
        report["fold_cpu_seconds"] = round(fold_cpu, 3)
        # of seconds["merge_counts"]: the last merge, after the workers are done (the rest is the
        # folds while the workers count: on two busy cores, wall time of this thread, not time added)
        report["final_merge_seconds"] = round(final_seconds, 3)
        report["special_token_occurrences"] = totals["specials"]
        report["bytes_scanned"] = totals["bytes"]
        report["corpus_bytes"] = corpus_size
        report["items"] = totals["items"]
        report["separators_inserted"] = totals["inserted"]
        # Documents: the text between separators (special tokens), or the items without any.
        report["documents"] = (totals["specials"] + 1 if totals["items"] else 0) if specials else totals["items"]
        report["pretokens_counted"] = totals["pretokens"]
        report["spilled_runs"] = spill.n_runs
        report["spilled_bytes"] = spill.n_bytes
        report["bad_records"] = opts.bad.to_dict()
    return table


def _check_sources(sources: Sequence[Source], shards: list, per_source: list, items_per_source: list) -> None:
    """Every byte of a plain file read once; every byte and record a stream produced counted once."""
    produced = [0] * len(sources)
    produced_items = [0] * len(sources)
    streamed = [False] * len(sources)
    for sh in shards:
        if not sh.lazy:
            streamed[sh.source.index] = True
            produced[sh.source.index] += sh.bytes_out
            produced_items[sh.source.index] += sh.items_out
    for k, src in enumerate(sources):
        if src.plain_text:
            check_total(f"bytes of {src.name} (bytes read vs file size)", per_source[k], src.size)
        elif streamed[k]:
            check_total(f"bytes of {src.name} (bytes counted vs bytes the reader produced)",
                        per_source[k], produced[k])
            check_total(f"records of {src.name} (records counted vs records read)",
                        items_per_source[k], produced_items[k])


FOLD_FANOUT = 4
#: Count an input that is one byte range of a plain file without numpy (``_count_plain``: a small
#: run never imports it); the tests turn it off to compare with the numpy path.
PLAIN_SMALL_RUNS = True
#: Spill folders are named ``bpe_core-spill-<pid>-*``: a later run removes those of a dead pid.
SPILL_PREFIX = "bpe_core-spill-"


def save_behind(path: str, arr) -> None:
    """``np.save(path, arr)`` with its pages written back as they are written
    (``runtime.writeback.WriteBehind``): a spilled run is never dirty page cache all at once, which a
    memory cgroup could not drop.

    >>> import tempfile; p = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> save_behind(p, np.arange(5)); np.load(p).tolist()
    [0, 1, 2, 3, 4]
    """
    arr = np.ascontiguousarray(arr)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(arr))
        f.flush()
        out = WriteBehind(f.fileno())
        out.write(arr.reshape(-1).view(np.uint8) if arr.size else b"")
        out.finish()


def _table_bytes(table: tuple) -> int:
    return int(sum(memoryview(a).nbytes for a in table))


def _n_pretokens(table: tuple) -> int:
    """The sum of a table's counts (numpy arrays or ``array.array``)."""
    return int(table[2].sum()) if not isinstance(table[2], array.array) else sum(table[2])


class Spill:
    """Sorted runs of the pretoken table on disk, once the table outgrows its share of the budget."""

    def __init__(self, threshold: Optional[int], folder: Optional[str]):
        self.threshold = threshold
        self.folder = folder
        self._dir: Optional[str] = None
        self.paths: list[str] = []
        self.sums: list[int] = []
        self.n_runs = 0
        self.n_bytes = 0

    def offer(self, tables: list[tuple]) -> list[tuple]:
        """Spill the tables if they are over the threshold; return what stays in RAM.

        The caller must keep what is returned: a table is either written here or handed back.
        """
        if self.threshold is None or sum(_table_bytes(t) for t in tables) <= self.threshold:
            return tables
        if self._dir is None:
            folder = self.folder or tempfile.gettempdir()
            refuse_memory_folder(folder)                      # a spill on tmpfs saves no memory
            remove_stale_in(folder, [SPILL_PREFIX])          # what a killed run left
            self._dir = new_temp_dir(folder, f"{SPILL_PREFIX}{os.getpid()}-")
        for table in tables:
            # a small run's table is ``array.array`` (``_count_plain``): numpy views of the same
            # buffers (no copy), so both kinds spill alike
            arena, offsets, counts = (np.asarray(a) for a in table)
            base = os.path.join(self._dir, f"run{self.n_runs:05d}")
            for name, arr in (("arena", arena), ("offsets", offsets), ("counts", counts)):
                try:
                    save_behind(f"{base}.{name}.npy", arr)
                except OSError as exc:          # a full disk names the spill file, not just "No space"
                    raise named(exc, f"{base}.{name}.npy") if exc.errno in DISK_FULL else exc from None
            self.paths.append(base)
            self.sums.append(int(counts.sum()))
            self.n_runs += 1
            self.n_bytes += int(arena.nbytes + offsets.nbytes + counts.nbytes)
        return []

    def runs(self) -> list[tuple]:
        """The spilled runs, memory-mapped (pages are read as the merge reaches them); each run's
        sum of counts is checked against what was written."""
        out = []
        for base, want in zip(self.paths, self.sums):
            run = tuple(np.load(f"{base}.{name}.npy", mmap_mode="r") for name in ("arena", "offsets", "counts"))
            check_total(f"pretoken counts of spilled run {base}", int(run[2].sum()), want)
            out.append(run)
        return out

    def cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


