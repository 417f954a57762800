"""Cut shards: the independent units of the corpus, and the corpus in order as tasks.

The third step of ``corpus/`` (``inputs`` -> ``shards`` -> ``readers`` -> ``ranges``): a shard
is a small description of part of one input that a worker reads by itself (``read()``), or a
stream read in order (``iter_blocks()``). Two kinds:

- :class:`Shard`: bytes ``[start, end)`` of one plain-text file (a local path or an fsspec URL)
  and a stamp of its content (``source_shards`` cuts them): the picklable task of the
  data-parallel phases of a single input on a cluster (``runtime.executors``). Nothing but the
  description crosses the network to the worker.
- :class:`InputShard`: a unit of one ``inputs.Source`` of any container (``input_shards``,
  ``Source.shards``): :class:`TextRangeShard` (a byte range of plain text), :class:`JsonlRangeShard`
  (whole lines of JSON Lines), :class:`ParquetShard` (row groups), :class:`StreamShard` (a
  compressed file or standard input, decompressed in bounded pieces) and :class:`IteratorShard`
  (an iterator or ``datasets`` object). It produces the :class:`Block` objects of the corpus.

Plain text is cut where ``corpus.chunks`` proves a cut safe (a special-token start, or a safe point
inside a document for the named patterns), exactly as the single-node chunks are, by reading small
windows near each target offset (``chunks.cut_points``); a compressed stream at the same points as
it is decompressed (``chunks.first_safe_cut``); records at record boundaries. So the pretokens (or
units, or ids) of the shards are exactly those of the whole input, for any shard size.

A :class:`Block` holds bytes of the corpus: items joined by the separator (``doc_ends`` None),
or, without one, items back to back with ``doc_ends``. ``begins_item`` says whether an item starts
at its first byte: the separator *between* two blocks is not in either block; the consumer adds
it (in order) before a block that begins an item when an item came before. ``iter_tasks`` gives
the corpus in order (lazy shards for workers, the blocks of streams read ahead on threads);
``load``, ``shard_blocks``, ``corpus_bytes`` and ``spool`` read them.

The bytes come from the readers of each format (``corpus.readers``) over ranges and file objects
of the inputs (``corpus.ranges``: ``read_source``, ``open_source``).

>>> import tempfile, os; p = os.path.join(tempfile.mkdtemp(), "c.txt")
>>> _ = open(p, "wb").write(b"aa<|e|>bb<|e|>cc")
>>> shards = source_shards(p, 3, [b"<|e|>"], "gpt2")
>>> [(s.start, s.end) for s in shards], shards[1].read().tobytes()
([(0, 9), (9, 16)], b'<|e|>cc')
"""
from __future__ import annotations

import contextlib
import functools
import os
import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from ..runtime.lazy import np  # numpy on first use (a small run never imports it)

from ..errors import CorpusError
from .chunks import cut_points, first_safe_cut
from .files import open_stdin
from .readers import (BadRecords, compression_of, dataset_documents, decompressed_pieces, is_dataset,
                      iterator_documents, jsonl_documents, line_of, need_module, parquet_column,
                      parquet_row_group_documents)
from .ranges import Stamp, open_source, read_source, source_stamp

# "Source" in annotations names ``inputs.Source``: a name only (inputs come before shards in corpus/, and
# not even type checkers import it here, so the two modules form no cycle).

__all__ = ["Block", "InputShard", "IteratorShard", "JsonlRangeShard", "ParquetShard", "ReadOptions", "Shard",
           "StreamShard", "TextRangeShard", "corpus_bytes", "input_shards", "iter_tasks", "load", "shard_blocks",
           "source_shards", "spool"]


@dataclass
class ReadOptions:
    """How sources are cut into blocks and what a record is.

    ``separator`` None means: the first special token (if any). Pass ``b""`` for none (encoding
    with ``separator=False``; items are then kept apart by ``Block.doc_ends``).
    """

    chunk_bytes: int = 16 << 20
    special_tokens: Sequence[bytes] = ()
    pattern: Optional[str] = "gpt2"          # the canonical name (pretok.pattern_name) or None
    inside_documents: bool = True
    separator: Optional[bytes] = None
    text_field: str = "text"
    text_column: str = "text"
    bad: BadRecords = field(default_factory=BadRecords)

    @property
    def sep(self) -> bytes:
        """The separator bytes (``b""``: none)."""
        if self.separator is not None:
            return self.separator
        return bytes(self.special_tokens[0]) if self.special_tokens else b""


@dataclass
class Block:
    """Bytes of the corpus for one worker (see the module docstring)."""

    data: Any                          # bytes-like
    doc_ends: Optional[np.ndarray]     # None: one text (items joined by the separator)
    begins_item: bool
    n_items: int
    source: int                        # index of the source in the list
    label: str                         # for messages: "path[start:end]", "path lines 1-900"

    @property
    def n_bytes(self) -> int:
        return len(self.data)


# ==== Shards of one plain file: byte ranges (the cluster tasks of a single input) ===================


@dataclass(frozen=True)
class Shard:
    """Bytes ``[start, end)`` of one input (a local path or an fsspec URL), read by the worker.

    ``stamp`` identifies the input's content; reading checks it, so an input rewritten during a
    run raises :class:`errors.InputChanged` on whichever worker sees it. ``index`` is the shard's
    position in the input order (results are combined in that order).
    """

    source: str
    start: int
    end: int
    index: int = 0
    stamp: Optional[Stamp] = None

    @property
    def n_bytes(self) -> int:
        return self.end - self.start

    def read(self) -> np.ndarray:
        """The shard's bytes as a fresh ``uint8`` array (``read_source``)."""
        return read_source(self.source, self.start, self.end, self.stamp)

    def label(self) -> str:
        return f"{self.source}[{self.start}:{self.end}]"


def source_shards(source: Union[str, os.PathLike], chunk_bytes: int, special_tokens: Sequence[bytes] = (),
                  pattern: Optional[str] = "gpt2", inside_documents: bool = True,
                  stamp: Optional[Stamp] = None) -> list[Shard]:
    """Cut a local file or a URL into shards of about ``chunk_bytes`` at proven-safe points.

    ``pattern`` is the canonical name of the pattern (``pretok.pattern_name``; None for a custom
    regex: cuts at special tokens only). Only small windows near each cut are read. The cuts are
    those of ``chunks.file_chunks`` on the same bytes.
    """
    source = os.fspath(source)
    stamp = stamp or source_stamp(source)
    cuts = cut_points(functools.partial(read_source, source, stamp=stamp), stamp.size, chunk_bytes,
                      special_tokens, pattern, inside_documents)
    pairs = [(s, e) for s, e in zip(cuts[:-1], cuts[1:]) if e > s]
    return [Shard(source, s, e, i, stamp) for i, (s, e) in enumerate(pairs)]


# ==== Shards of an input (any container) ============================================================


class InputShard:
    """A unit of an input (``inputs.Source``) that can be read on its own. ``lazy`` shards are read by ``read()`` (on a
    worker); the others stream blocks from ``iter_blocks()`` (in order, on a producer thread)."""

    lazy = False

    def __init__(self, source: Source, opts: ReadOptions):
        self.source = source
        self.opts = opts
        self.bytes_out = 0          # what the shard produced (for the conservation checks)
        self.items_out = 0

    def read(self) -> Block:
        raise NotImplementedError

    def iter_blocks(self) -> Iterator[Block]:
        if self.lazy:
            yield self.read()
            return
        raise NotImplementedError


def input_shards(source: Source, opts: ReadOptions) -> list[InputShard]:
    """The independent units of one input (``Source.shards``), in order (see the module docstring)."""
    if source.kind == "iterator":
        return [IteratorShard(source, opts)]
    if source.is_stdin:
        return [StreamShard(source, opts)]
    if source.size == 0:
        return []
    if source.kind == "parquet":
        return _parquet_shards(source, opts)
    if source.compression is not None:
        return [StreamShard(source, opts)]
    if source.kind == "jsonl":
        return [JsonlRangeShard(source, opts, s, e)
                for s, e in _line_ranges(source.name, opts.chunk_bytes, source.stamp)]
    # the cuts of chunks.file_chunks, through whichever filesystem holds the file (the windows read
    # in bytearrays: the cut rules are regex searches, and a small run imports no numpy)
    cuts = cut_points(functools.partial(read_source, source.name, stamp=source.stamp, numpy=False), source.size,
                      opts.chunk_bytes, opts.special_tokens, opts.pattern, opts.inside_documents)
    return [TextRangeShard(source, opts, s, e) for s, e in zip(cuts[:-1], cuts[1:]) if e > s]


class TextRangeShard(InputShard):
    """Bytes ``[start, end)`` of a plain-text file, read with pread."""

    lazy = True

    def __init__(self, source: Source, opts: ReadOptions, start: int, end: int):
        super().__init__(source, opts)
        self.start, self.end = start, end

    def read(self, numpy: bool = True, out=None) -> Block:
        """The block; its data a ``bytearray`` when not ``numpy`` (``read_source``), a view of
        ``out`` when that buffer is long enough (the caller's, reused from block to block)."""
        data = read_source(self.source.name, self.start, self.end, self.source.stamp, numpy=numpy, out=out)
        first = self.start == 0
        return Block(data, None, first, int(first), self.source.index,
                     f"{self.source.name}[{self.start}:{self.end}]")


class JsonlRangeShard(InputShard):
    """Whole lines ``[start, end)`` of an uncompressed JSON Lines file (read with pread)."""

    lazy = True

    def __init__(self, source: Source, opts: ReadOptions, start: int, end: int):
        super().__init__(source, opts)
        self.start, self.end = start, end

    def read(self) -> Block:
        path = self.source.name
        data = read_source(path, self.start, self.end, self.source.stamp).tobytes()
        local = _Deferred()
        docs = [d for d, _ in jsonl_documents([data], path, self.opts.text_field, local)]
        if local.found:                   # line numbers from the start of the file, only when needed
            base = line_of(path, self.start) - 1
            for where, reason, n in local.found:
                self.opts.bad.add(path, f"line {int(where.split()[1]) + base}", reason, n)
        return _record_block(docs, self.opts, self.source.index, f"{path}[{self.start}:{self.end}]")


class _Deferred(BadRecords):
    """Bad records held until their line numbers are known."""

    def __init__(self):
        super().__init__(skip=True)
        self.found: list = []

    def add(self, path: str, where: str, reason: str, n: int = 1) -> None:
        self.found.append((where, reason, n))


class ParquetShard(InputShard):
    """Row groups ``groups`` of a Parquet file."""

    lazy = True

    def __init__(self, source: Source, opts: ReadOptions, groups: list[int], first_rows: list[int]):
        super().__init__(source, opts)
        self.groups, self.first_rows = groups, first_rows

    def read(self) -> Block:
        docs: list = []
        with _parquet_input(self.source) as f:
            for g, first in zip(self.groups, self.first_rows):
                docs.extend(parquet_row_group_documents(self.source.name, g, self.opts.text_column, first,
                                                        self.opts.bad, file=f))
        return _record_block(docs, self.opts, self.source.index,
                             f"{self.source.name} row groups {self.groups[0]}-{self.groups[-1]}")


class StreamShard(InputShard):
    """A compressed file or standard input: decompressed in bounded pieces, in order."""

    def iter_blocks(self) -> Iterator[Block]:
        src = self.source
        if src.is_stdin:
            raw = open_stdin()                    # a closed one: one line; a terminal: a hint
            head = raw.peek(16)[:16] if hasattr(raw, "peek") else b""
            compression = compression_of(head, "<stdin>")
            yield from self._blocks(raw, compression, "<stdin>")
            return
        with open_source(src.name) as raw:
            yield from self._blocks(raw, src.compression, src.name)
        if src.stamp is not None:
            src.stamp.check()

    def _blocks(self, raw, compression, name) -> Iterator[Block]:
        opts = self.opts
        pieces = decompressed_pieces(raw, compression, name, opts.bad)
        if self.source.kind == "jsonl":
            def docs():
                for doc, _ in jsonl_documents(pieces, name, opts.text_field, opts.bad):
                    yield doc
            yield from self._count(_record_blocks(docs(), opts, self.source.index, name))
            return
        first = True
        for data in _cut_stream(pieces, opts):
            yield from self._count([Block(data, None, first, int(first), self.source.index, name)])
            first = False

    def _count(self, blocks: Iterable[Block]) -> Iterator[Block]:
        for b in blocks:
            self.bytes_out += b.n_bytes
            self.items_out += b.n_items
            yield b


class IteratorShard(StreamShard):
    """An iterator of documents or a ``datasets`` object (read once, in order)."""

    def iter_blocks(self) -> Iterator[Block]:
        src, opts = self.source, self.opts
        if is_dataset(src.obj):
            docs = dataset_documents(src.obj, opts.text_column, src.name, opts.bad)
        else:
            docs = iterator_documents(src.obj, src.name, opts.bad)
        yield from self._count(_record_blocks(docs, opts, src.index, src.name))


def _parquet_input(src: Source):
    """What ``pq.ParquetFile`` reads: the local path, or the URL's file object (to be closed)."""
    return open_source(src.name) if src.is_url else contextlib.nullcontext(src.name)


def _parquet_shards(src: Source, opts: ReadOptions) -> list[InputShard]:
    pq = need_module("pyarrow.parquet", src.name)
    with _parquet_input(src) as f:
        try:
            pf = pq.ParquetFile(f)
            meta = pf.metadata
        except Exception as exc:
            raise CorpusError(src.name, f"not a readable Parquet file ({exc})") from None
        parquet_column(pf, src.name, opts.text_column)
    shards: list[InputShard] = []
    groups: list[int] = []
    firsts: list[int] = []
    size = row = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        groups.append(g)
        firsts.append(row)
        row += rg.num_rows
        size += rg.total_byte_size
        if size >= opts.chunk_bytes:
            shards.append(ParquetShard(src, opts, groups, firsts))
            groups, firsts, size = [], [], 0
    if groups:
        shards.append(ParquetShard(src, opts, groups, firsts))
    return shards


def _line_ranges(path: str, chunk_bytes: int, stamp: Stamp) -> list[tuple[int, int]]:
    """Byte ranges of about ``chunk_bytes`` that end right after a newline (or at the end)."""
    n = stamp.size
    cuts = [0]
    target = chunk_bytes
    while target < n:
        pos, window, cut = target, 1 << 16, None
        while pos < n and cut is None:
            buf = read_source(path, pos, min(n, pos + window), stamp).tobytes()
            k = buf.find(b"\n")
            if k >= 0:
                cut = pos + k + 1
            pos += len(buf)
            window *= 2
        if cut is None or cut >= n:
            break
        cuts.append(cut)
        target = cut + chunk_bytes
    cuts.append(n)
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def _record_block(docs: list, opts: ReadOptions, source: int, label: str) -> Block:
    sep = opts.sep
    if sep:
        return Block(sep.join(docs), None, bool(docs), len(docs), source, label)
    lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    return Block(b"".join(docs), np.cumsum(lengths), bool(docs), len(docs), source, label)


def _record_blocks(docs: Iterable[bytes], opts: ReadOptions, source: int, label: str) -> Iterator[Block]:
    """Documents grouped into blocks of about ``chunk_bytes`` (cut at document boundaries)."""
    group: list = []
    size = 0
    for doc in docs:
        group.append(doc)
        size += len(doc) + 1
        if size >= opts.chunk_bytes:
            yield _record_block(group, opts, source, label)
            group, size = [], 0
    if group:
        yield _record_block(group, opts, source, label)


def _cut_stream(pieces: Iterable[bytes], opts: ReadOptions) -> Iterator[bytes]:
    """A text stream cut into pieces of about ``chunk_bytes`` at safe points (``first_safe_cut``)."""
    margin = max((len(s) for s in opts.special_tokens), default=0) + 2
    buf = bytearray()
    search = 0
    for piece in pieces:
        buf += piece
        while len(buf) >= opts.chunk_bytes + margin:
            lo = max(opts.chunk_bytes, search)
            c = first_safe_cut(buf, lo, len(buf) - margin, opts.special_tokens, opts.pattern,
                               opts.inside_documents)
            if c is None:
                search = len(buf) - margin
                break
            yield bytes(buf[:c])
            del buf[:c]
            search = 0
    if buf:
        yield bytes(buf)


# ==== Tasks: the corpus in order, streams read ahead ================================================


class _Producer(threading.Thread):
    """Reads the blocks of one streaming shard ahead of the consumer (bounded queue)."""

    def __init__(self, shard: InputShard, depth: int):
        super().__init__(daemon=True, name="bpe_core-reader")
        self.shard = shard
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            for block in self.shard.iter_blocks():
                if not self._put(("block", block)):
                    return
            self._put(("end", None))
        except BaseException as exc:          # handed to the consumer, raised there
            self._put(("error", exc))

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def blocks(self) -> Iterator[Block]:
        while True:
            kind, value = self.q.get()
            if kind == "block":
                yield value
            elif kind == "end":
                return
            else:
                raise value


def iter_tasks(sources: Sequence[Source], opts: ReadOptions, ahead: int = 1,
               shards: Optional[list] = None) -> Iterator[Union[InputShard, Block]]:
    """The corpus as tasks in order: lazy shards (for a worker to ``read()``) and blocks of the
    streaming shards, which up to ``ahead`` producer threads read ahead (across files, so several
    compressed files decompress at once; each holds at most two blocks)."""
    if shards is None:
        shards = [sh for s in sources for sh in input_shards(s, opts)]
    producers: dict[int, _Producer] = {}
    started = 0
    try:
        for i, sh in enumerate(shards):
            started = max(started, i)
            while started < len(shards) and started < i + max(1, ahead):
                nxt = shards[started]
                if not nxt.lazy and started not in producers:
                    producers[started] = _Producer(nxt, 1)
                    producers[started].start()
                started += 1
            if sh.lazy:
                yield sh
            else:
                yield from producers.pop(i).blocks()
    finally:
        for p in producers.values():
            p.stop.set()


def shard_blocks(shard: InputShard) -> Iterator[Block]:
    """The blocks of one shard, in order, for a task that reads it by itself (a cluster worker): a
    lazy shard's one block; a stream's blocks decompressed ahead on a reader thread (one block
    ahead, as ``iter_tasks`` does), so decompressing overlaps with the work on the last block.

    >>> from bpe_core.corpus.inputs import expand_inputs
    >>> import tempfile, os, gzip; p = os.path.join(tempfile.mkdtemp(), "a.txt.gz")
    >>> _ = open(p, "wb").write(gzip.compress(b"hello"))
    >>> [bytes(b.data) for sh in expand_inputs(p)[0].shards(ReadOptions()) for b in shard_blocks(sh)]
    [b'hello']
    """
    if shard.lazy:
        yield shard.read()
        return
    producer = _Producer(shard, 1)
    producer.start()
    try:
        yield from producer.blocks()
    finally:
        producer.stop.set()


def load(task: Union[InputShard, Block]) -> Block:
    """The block of a task from ``iter_tasks`` (reads a lazy shard; run it on a worker)."""
    return task.read() if isinstance(task, InputShard) else task


def corpus_bytes(sources: Sequence[Source], opts: ReadOptions) -> bytes:
    """The whole corpus as one bytes object, separators included (for tests and small inputs).

    Without a separator the items are simply concatenated (their boundaries are then lost).

    >>> from bpe_core.corpus.inputs import expand_inputs
    >>> import tempfile, os; d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "b.txt"), "w").write("two"); _ = open(os.path.join(d, "a.txt"), "w").write("one")
    >>> corpus_bytes(expand_inputs(d), ReadOptions(chunk_bytes=1 << 20, special_tokens=[b"<|e|>"]))
    b'one<|e|>two'
    """
    out = bytearray()
    seen = 0
    for task in iter_tasks(sources, opts):
        block = load(task)
        if block.begins_item and seen and opts.sep:
            out += opts.sep
        out += bytes(block.data)
        seen += block.n_items
    return bytes(out)


def spool(sources: Sequence[Source], opts: ReadOptions, out) -> int:
    """Write the corpus (items joined by the separator) to the binary file ``out``; returns the
    bytes written. A second pass over the corpus (SuperBPE, SupraTok) then reads one plain file.

    Raises:
        CorpusError: no separator while there is more than one item (the documents would merge).
    """
    n = seen = 0
    for task in iter_tasks(sources, opts, ahead=2):
        block = load(task)
        if block.begins_item and seen:
            if not opts.sep:
                raise CorpusError(block.label, "several files or records need a special token as the "
                                               "document separator to be read twice (for this method); "
                                               "give one (--special-token)")
            out.write(opts.sep)
            n += len(opts.sep)
        if block.doc_ends is not None and len(block.doc_ends) > 1 and not opts.sep:
            raise CorpusError(block.label, "several records need a special token as the document separator "
                                           "to be read twice (for this method); give one (--special-token)")
        out.write(block.data)
        n += len(block.data)
        seen += block.n_items
    return n
