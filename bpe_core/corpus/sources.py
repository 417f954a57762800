"""Sources: many inputs of any container, read as one corpus of documents.

**The corpus.** The inputs, in order, are a list of *items*: a plain-text file (its whole text)
or one record (a JSON Lines record, a Parquet row, an item of an iterator). With a *separator*
(the first special token) the corpus is the items joined by it: exactly the bytes of one ``.txt``
holding the same documents with separators, so every result (merges, ids) is the same whatever
the container. A special token *inside* an item (a record holding ``<|endoftext|>``) splits it as
it would in that ``.txt``. Without a separator (no special tokens; or ``encode_corpus`` with
``separator=False``) the items are separate spans: pre-tokenization and merges never cross an
item boundary, and the encoder encodes each on its own. An empty file holds no item (as an empty
``.txt`` holds no document); an empty record is an empty item.

**Interface** (small, so a cluster task can process a shard on its own)::

    sources = expand_inputs(["shards/*.jsonl.zst", "extra.txt", "-"])      # -> list[Source]
    for shard in source.shards(options):          # independent units (pickle-able for files)
        shard.lazy   -> block = shard.read()      # one bounded Block, read by a worker (pread,
                                                  #   a Parquet row group, a JSONL byte range)
        else         -> for block in shard.iter_blocks(): ...   # a stream, read in order
    for task in iter_tasks(sources, options, ahead):   # lazy shards and blocks, in corpus order;
        ...                                            # streams decompressed ahead on threads

A :class:`Block` holds bytes of the corpus: items joined by the separator (``doc_ends`` None),
or, without one, items back to back with ``doc_ends``. ``begins_item`` says whether an item starts
at its first byte: the separator *between* two blocks is not in either block; the consumer adds
it (in order) before a block that begins an item when an item came before.

Plain files are the fast path (``files.check_input``, ``chunks.file_chunks``: pread chunks cut at
safe points). Compressed text is decompressed in bounded pieces and cut at the same safe points
(``chunks.first_safe_cut``); records are grouped into blocks at record boundaries.

>>> import tempfile, os; d = tempfile.mkdtemp()
>>> _ = open(os.path.join(d, "b.txt"), "w").write("two"); _ = open(os.path.join(d, "a.txt"), "w").write("one")
>>> [os.path.basename(s.name) for s in expand_inputs(d)]
['a.txt', 'b.txt']
>>> opts = ReadOptions(chunk_bytes=1 << 20, special_tokens=[b"<|e|>"])
>>> corpus_bytes(expand_inputs(d), opts)
b'one<|e|>two'
"""
from __future__ import annotations

import contextlib
import glob
import os
import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from ..errors import CorpusError
from ..runtime.workers import FileStamp
from .chunks import cut_points, first_safe_cut
from .files import check_input, warn_if_binary
from .shards import UrlStamp, expand_url, is_url, open_source, read_source, warn_if_binary_source
from .readers import (BadRecords, compression_of, dataset_documents, decompressed_pieces, file_head,
                      is_dataset, iterator_documents, jsonl_documents, line_of, need_module, parquet_column,
                      parquet_row_group_documents)

__all__ = ["Block", "FORMATS", "ReadOptions", "Source", "corpus_bytes", "expand_inputs", "iter_tasks",
           "STDIN"]

#: Input formats: ``auto`` (Parquet by its magic bytes; JSON Lines by the name ending in ``.jsonl``,
#: ``.json`` or ``.ndjson`` before any ``.gz``/``.xz``/``.zst``/``.bz2``; else text).
FORMATS = ("auto", "text", "jsonl", "parquet")
STDIN = "-"
_JSONL_EXT = (".jsonl", ".json", ".ndjson")
_COMPRESSED_EXT = (".gz", ".gzip", ".xz", ".zst", ".zstd", ".bz2", ".bz")
#: A rough size of decompressed text per compressed byte (only for the memory plan).
COMPRESSED_RATIO = 4
_GLOB_CHARS = set("*?[")
_WARNED: set = set()


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


# ==== Sources ======================================================================================


@dataclass
class Source:
    """One input: a file (``kind`` text, jsonl or parquet; ``compression`` None or the stream's
    format), standard input, or an in-memory iterator / ``datasets`` object (``kind`` iterator).

    A file is a local path or an fsspec URL (``s3://``, ``gs://``, ``hf://``, ``file://``, ...):
    the same class reads both, through the filesystem the name says (``corpus.shards``:
    ``read_source`` for byte ranges -- ``pread`` or a ranged read --, ``open_source`` for streams
    and Parquet). ``stamp`` identifies the content (``FileStamp``: size, mtime, inode; ``UrlStamp``:
    size and ETag / generation / mtime), checked as it is read and at the end of a run.
    """

    name: str
    kind: str
    compression: Optional[str] = None
    size: int = 0                              # bytes on disk (0 for streams without a file)
    obj: Any = None                            # the iterator or dataset
    index: int = 0
    stamp: Optional[Union[FileStamp, UrlStamp]] = None

    @property
    def is_url(self) -> bool:
        """A file read through fsspec (its name is a URL)."""
        return self.obj is None and is_url(self.name)

    @property
    def is_stdin(self) -> bool:
        return self.name == STDIN and self.obj is None and self.kind != "iterator"

    @property
    def plain_text(self) -> bool:
        """A regular uncompressed text file: read by pread, re-readable (a second pass works)."""
        return self.kind == "text" and self.compression is None and not self.is_stdin

    @property
    def rereadable(self) -> bool:
        return not self.is_stdin and self.kind != "iterator"

    @property
    def estimated_bytes(self) -> int:
        """Bytes of text this source holds, roughly (for the memory plan; exact for plain files)."""
        if self.kind == "iterator" or self.is_stdin:
            return 0
        if self.kind == "parquet":
            return self.size
        return self.size * (COMPRESSED_RATIO if self.compression else 1)

    def describe(self) -> str:
        what = {"text": "text", "jsonl": "JSON Lines", "parquet": "Parquet", "iterator": "iterator"}[self.kind]
        return f"{self.name} ({what}{', ' + self.compression if self.compression else ''})"

    # ---- shards ---------------------------------------------------------------------------------

    def shards(self, opts: ReadOptions) -> list["Shard"]:
        """The independent units of this source, in order (see the module docstring)."""
        if self.kind == "iterator":
            return [IteratorShard(self, opts)]
        if self.is_stdin:
            return [StreamShard(self, opts)]
        if self.size == 0:
            return []
        if self.kind == "parquet":
            return _parquet_shards(self, opts)
        if self.compression is not None:
            return [StreamShard(self, opts)]
        if self.kind == "jsonl":
            return [JsonlRangeShard(self, opts, s, e) for s, e in _line_ranges(self.name, opts.chunk_bytes, self.stamp)]
        # the cuts of chunks.file_chunks, through whichever filesystem holds the file
        cuts = cut_points(lambda a, b: read_source(self.name, a, b, self.stamp), self.size, opts.chunk_bytes,
                          opts.special_tokens, opts.pattern, opts.inside_documents)
        return [TextRangeShard(self, opts, s, e) for s, e in zip(cuts[:-1], cuts[1:]) if e > s]


def _is_glob(spec: str) -> bool:
    return any(c in _GLOB_CHARS for c in spec)


def _walk(folder: str) -> list[str]:
    """Every non-hidden regular file under ``folder``, recursively, sorted by path.

    A link to a folder that leads back to one above it (a loop) is a :class:`CorpusError` naming
    the link, not a path of 40 ``link/link/...`` steps that then fails with ``ELOOP``."""
    out = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for d in dirs:
            link = os.path.join(root, d)
            if os.path.islink(link):
                target = os.path.realpath(link)
                above = os.path.realpath(root)
                if above == target or above.startswith(target.rstrip(os.sep) + os.sep):
                    raise CorpusError(link, "a symbolic link loop (it leads back to a folder above it)")
        out.extend(os.path.join(root, f) for f in files if not f.startswith("."))
    return sorted(out)


def expand_inputs(specs: Union[str, os.PathLike, Any, Sequence[Any]], input_format: str = "auto",
                  text_column: str = "text") -> list[Source]:
    """The inputs as an ordered list of sources.

    Each spec is a file, a directory (its non-hidden files, recursively, sorted by path), a glob
    pattern (sorted matches; ``**`` recurses), ``-`` (standard input), an iterator of ``str`` /
    ``bytes``, or a ``datasets.Dataset`` / ``IterableDataset``. A file, directory or pattern may be
    an fsspec URL (``s3://bucket/shards/*.jsonl.zst``, ``hf://datasets/org/name/data/``): it is
    expanded by its filesystem (``shards.expand_url``) and read as a local file is. The order is
    deterministic.

    Raises:
        CorpusError: a file that is missing, unreadable, not a regular file or compressed in a
            format not read here; a pattern or directory with no file; stdin given twice.
        ValueError: an unknown ``input_format``.
    """
    if input_format not in FORMATS:
        raise ValueError(f"unknown input format {input_format!r} ({', '.join(FORMATS)})")
    if isinstance(specs, (str, os.PathLike)) or is_dataset(specs) or not isinstance(specs, (list, tuple)):
        specs = [specs]
    out: list[Source] = []
    n_stdin = 0
    for spec in specs:
        if is_dataset(spec) or not isinstance(spec, (str, os.PathLike)):
            if not (is_dataset(spec) or hasattr(spec, "__iter__")):
                raise TypeError(f"an input must be a path, an iterator or a datasets object, "
                                f"not {type(spec).__name__}")
            name = f"<{type(spec).__name__}>"
            out.append(Source(name, "iterator", obj=spec))
            continue
        spec = os.fspath(spec)
        if spec == STDIN:
            n_stdin += 1
            if n_stdin > 1:
                raise CorpusError(STDIN, "standard input is given twice")
            out.append(Source(STDIN, "jsonl" if input_format == "jsonl" else "text"))
            continue
        if is_url(spec):
            paths = expand_url(spec)
        elif os.path.isdir(spec):
            paths = _walk(spec)
            if not paths:
                raise CorpusError(spec, "is a directory with no files")
        elif not os.path.lexists(spec) and _is_glob(spec):
            paths = sorted(p for p in glob.glob(spec, recursive=True) if not os.path.isdir(p))
            if not paths:
                raise CorpusError(spec, "no file matches this pattern")
        else:
            paths = [spec]
        out.extend(_file_source(p, input_format, text_column) for p in paths)
    for k, s in enumerate(out):
        s.index = k
    if not out:
        raise CorpusError("<inputs>", "no input given")
    return out


def _looks_parquet(path: str, head: bytes, size: int, url: bool) -> bool:
    """A Parquet file starts and ends with ``PAR1`` and holds a footer between (12 bytes at least),
    whose length (the 4 bytes before the closing magic) fits in the file; a text file that only
    starts (or starts and ends) with ``PAR1`` is text, unless its name says ``.parquet`` (then a
    broken Parquet file gets its error, not a training on its bytes)."""
    if not head.startswith(b"PAR1"):
        return False
    if path.lower().endswith(".parquet"):
        return True
    if size < 12:
        return False
    if url:
        tail = read_source(path, size - 8, size).tobytes()
    else:
        with open(path, "rb") as f:
            f.seek(size - 8)
            tail = f.read(8)
    # The 4 bytes before the closing magic are the footer's length: it fits between the magics.
    return tail[4:] == b"PAR1" and 0 < int.from_bytes(tail[:4], "little") <= size - 12


def _file_source(path: str, input_format: str, text_column: str) -> Source:
    url = is_url(path)
    if url:
        stamp = UrlStamp.of(path)          # no such file, a directory: one line
        size = stamp.size
        head = read_source(path, 0, min(16, size)).tobytes() if size else b""
    else:
        size = check_input(path, compressed_ok=True)
        head = file_head(path, 16) if size else b""
        stamp = FileStamp.of(path)
    compression = compression_of(head, path)
    if input_format == "parquet" or (input_format == "auto" and _looks_parquet(path, head, size, url)):
        if compression is not None:
            raise CorpusError(path, f"is {compression}-compressed; a Parquet file compresses its own pages, "
                                    f"decompress it first")
        return Source(path, "parquet", None, size, stamp=stamp)
    if input_format == "jsonl":
        kind = "jsonl"
    elif input_format == "text":
        kind = "text"
    else:
        base = path.lower()
        for ext in _COMPRESSED_EXT:
            if base.endswith(ext):
                base = base[: -len(ext)]
                break
        kind = "jsonl" if base.endswith(_JSONL_EXT) else "text"
    if kind == "text" and compression is None and size and (stamp, path) not in _WARNED:
        _WARNED.add((stamp, path))        # once per file (the tools expand the inputs more than once)
        if url:
            warn_if_binary_source(path, stacklevel=4)
        else:
            warn_if_binary(path, stacklevel=4)
    return Source(path, kind, compression, size, stamp=stamp)


# ==== Shards =======================================================================================


class Shard:
    """A unit of a source that can be read on its own. ``lazy`` shards are read by ``read()`` (on a
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


class TextRangeShard(Shard):
    """Bytes ``[start, end)`` of a plain-text file, read with pread."""

    lazy = True

    def __init__(self, source: Source, opts: ReadOptions, start: int, end: int):
        super().__init__(source, opts)
        self.start, self.end = start, end

    def read(self) -> Block:
        data = read_source(self.source.name, self.start, self.end, self.source.stamp)
        first = self.start == 0
        return Block(data, None, first, int(first), self.source.index,
                     f"{self.source.name}[{self.start}:{self.end}]")


class JsonlRangeShard(Shard):
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
            base = _line_of(path, self.start) - 1
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


class ParquetShard(Shard):
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


class StreamShard(Shard):
    """A compressed file or standard input: decompressed in bounded pieces, in order."""

    def iter_blocks(self) -> Iterator[Block]:
        src = self.source
        if src.is_stdin:
            raw = sys.stdin.buffer
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


def _parquet_shards(src: Source, opts: ReadOptions) -> list[Shard]:
    pq = need_module("pyarrow.parquet", src.name)
    with _parquet_input(src) as f:
        try:
            pf = pq.ParquetFile(f)
            meta = pf.metadata
        except Exception as exc:
            raise CorpusError(src.name, f"not a readable Parquet file ({exc})") from None
        parquet_column(pf, src.name, opts.text_column)
    shards: list[Shard] = []
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


def _line_ranges(path: str, chunk_bytes: int, stamp: Union[FileStamp, UrlStamp]) -> list[tuple[int, int]]:
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


def _line_of(name: str, offset: int) -> int:
    """``readers.line_of`` for a local path or a URL (for messages only)."""
    if not is_url(name):
        return line_of(name, offset)
    n = 1
    with open_source(name) as f:
        left = offset
        while left > 0:
            data = f.read(min(left, 1 << 20))
            if not data:
                break
            n += data.count(b"\n")
            left -= len(data)
    return n


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

    def __init__(self, shard: Shard, depth: int):
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
               shards: Optional[list] = None) -> Iterator[Union[Shard, Block]]:
    """The corpus as tasks in order: lazy shards (for a worker to ``read()``) and blocks of the
    streaming shards, which up to ``ahead`` producer threads read ahead (across files, so several
    compressed files decompress at once; each holds at most two blocks)."""
    if shards is None:
        shards = [sh for s in sources for sh in s.shards(opts)]
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


def shard_blocks(shard: Shard) -> Iterator[Block]:
    """The blocks of one shard, in order, for a task that reads it by itself (a cluster worker): a
    lazy shard's one block; a stream's blocks decompressed ahead on a reader thread (one block
    ahead, as ``iter_tasks`` does), so decompressing overlaps with the work on the last block.

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


def load(task: Union[Shard, Block]) -> Block:
    """The block of a task from ``iter_tasks`` (reads a lazy shard; run it on a worker)."""
    return task.read() if isinstance(task, Shard) else task


def corpus_bytes(sources: Sequence[Source], opts: ReadOptions) -> bytes:
    """The whole corpus as one bytes object, separators included (for tests and small inputs).

    Without a separator the items are simply concatenated (their boundaries are then lost).
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


__all__ += ["Shard", "load", "shard_blocks", "spool"]
