"""Readers: compressed streams, JSON Lines records, Parquet row groups, iterators of documents.

Each reader turns one input into *documents* (``bytes``) or, for plain text, a stream of bytes;
``corpus.shards`` cuts them into blocks for the workers. What a reader refuses it refuses in one
line naming the file and the line or row (:class:`~bpe_core.errors.CorpusError`), or, when the
caller asked to skip bad records, it counts the record in a :class:`BadRecords` and goes on:

- **compressed streams** (gzip, xz, zstd, bzip2; detected by magic bytes, ``files.compressed_format``):
  read in bounded pieces, every stream to the end of the file; a truncated or corrupt stream, or
  bytes that are not a stream (garbage between or after streams), is a bad record naming the
  compressed offset (every byte decompressed before it is kept when skipping);
- **JSON Lines**: one JSON object per line, the text at ``text_field`` (a dotted path such as
  ``meta.text`` reaches nested objects; a key that itself holds dots is tried first). Blank lines
  are not records. Invalid JSON (whatever Python's parser refuses, also too deep a nesting or an
  integer of over 4,300 digits), a missing field, a value that is not a string, or a string that
  is not UTF-8 (a lone surrogate) are bad records;
- **Parquet** (``pyarrow``): the ``text_column`` (string or binary) read one row group at a time;
  a null is a bad record, a row group that cannot be read counts all its rows as bad;
- **iterators** of ``str`` or ``bytes`` (or of lists of them: batches), and Hugging Face
  ``datasets`` objects (by their ``text_column``).

A ``str`` becomes UTF-8 with ``surrogateescape`` (as everywhere in bpe_core), so a JSON string
``"\\udc80"`` is the single byte ``0x80``: JSON Lines can carry any bytes.

>>> import io, json
>>> lines = io.BytesIO(b'{"text": "a"}\\n\\n{"meta": {"text": "b"}}\\n')
>>> bad = BadRecords(skip=True)
>>> [d for d, _ in jsonl_documents(lines, "x.jsonl", "text", bad)], bad.count
([b'a'], 1)
>>> bad.examples
["x.jsonl: line 3: no field 'text'"]
"""
from __future__ import annotations

import bz2
import io
import json
import lzma
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable, Iterator, Optional

from ..errors import CorpusError
from .files import ZSTD_SKIPPABLE, compressed_format
from .ranges import open_source

__all__ = ["BadRecords", "DECOMPRESSORS", "EXTRAS", "READ_BYTES", "compression_of", "dataset_documents",
           "decompressed_pieces", "file_head", "is_dataset", "line_of", "iterator_documents", "jsonl_documents", "need_module",
           "open_decompressed", "parquet_column", "parquet_row_group_documents", "to_document"]

#: How much compressed input one read takes.
READ_BYTES = 4 << 20
#: Compression formats read here (by the name ``files.compressed_format`` gives).
DECOMPRESSORS = ("gzip", "xz", "zstd", "bzip2")
#: The optional module behind each format, and the extra that installs it.
EXTRAS = {"zstandard": "zstd", "pyarrow": "parquet", "datasets": "datasets"}
#: Examples of bad records kept for the report.
MAX_EXAMPLES = 5


def need_module(name: str, path: str):
    """Import an optional module, or raise a one-line :class:`CorpusError` naming the extra.

    >>> need_module("json", "x").__name__
    'json'
    """
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise CorpusError(path, f"reading this file needs the {name} module: pip install {name}") from None


@dataclass
class BadRecords:
    """Bad records of one run: raised at once (``skip=False``) or counted with a few examples.

    Thread-safe: readers of several inputs may add at the same time.
    """

    skip: bool = False
    count: int = 0
    examples: list = field(default_factory=list)
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, path: str, where: str, reason: str, n: int = 1) -> None:
        """One bad record (``n`` for a whole row group): raise, or count it."""
        message = f"{where}: {reason}" if where else reason
        if not self.skip:
            raise CorpusError(path, message + " (--skip-bad-records skips such records)")
        with self._lock:
            self.count += n
            if len(self.examples) < MAX_EXAMPLES:
                self.examples.append(f"{path}: {message}")

    def to_dict(self) -> dict:
        return {"skipped": self.count, "examples": list(self.examples)}

    def absorb(self, found: dict) -> None:
        """Add what another collector found (``to_dict()`` of a cluster task's, in corpus order).

        >>> mine = BadRecords(skip=True); theirs = mine.fresh(); theirs.add("r.jsonl", "line 3", "no text")
        >>> mine.absorb(theirs.to_dict()); mine.to_dict()
        {'skipped': 1, 'examples': ['r.jsonl: line 3: no text']}
        """
        with self._lock:
            self.count += int(found["skipped"])
            self.examples.extend(found["examples"][:max(0, MAX_EXAMPLES - len(self.examples))])

    def fresh(self) -> "BadRecords":
        """An empty collector with the same policy (one per cluster task)."""
        return BadRecords(skip=self.skip)

    def __getstate__(self) -> dict:          # the lock does not travel (shards go to cluster workers)
        return {"skip": self.skip, "count": self.count, "examples": list(self.examples)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["skip"], state["count"], state["examples"])


def to_document(value: Any) -> bytes:
    """A document's bytes: ``str`` as UTF-8 with surrogateescape, ``bytes``-like as is.

    Raises:
        TypeError: anything else. UnicodeEncodeError: a lone surrogate outside U+DC80..U+DCFF.

    >>> to_document("é"), to_document(b"\\xff"), to_document("\\udcff")
    (b'\\xc3\\xa9', b'\\xff', b'\\xff')
    """
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(type(value).__name__)


# ==== Compressed streams ===========================================================================


#: Compressed bytes fed to a decompressor at a time (zstd, whose decompressor has no output limit,
#: gets ``ZSTD_FEED_BYTES`` at a time, so one call's output stays bounded too).
FEED_BYTES = 1 << 20
ZSTD_FEED_BYTES = 128 << 10
#: What one stream of each format is called in messages.
_UNIT = {"gzip": "member", "xz": "stream", "bzip2": "stream", "zstd": "frame"}


def compression_of(head: bytes, path: str) -> Optional[str]:
    """The compression of a file by its first bytes: None (not compressed) or one of DECOMPRESSORS.

    Raises:
        CorpusError: a compressed format that is not read here (lz4, zip).

    >>> import gzip; compression_of(gzip.compress(b"x"), "a"), compression_of(b"text", "a")
    ('gzip', None)
    >>> compression_of(b"\\x5a\\x2a\\x4d\\x18\\x00\\x00\\x00\\x00", "a")     # a zstd skippable frame
    'zstd'
    """
    found = compressed_format(head)
    if found is None:
        return None
    name, hint = found
    if name not in DECOMPRESSORS:
        raise CorpusError(path, f"is {name}-compressed, which is not read here (gzip, xz, zstd and bzip2 "
                                f"are); decompress it first ({hint.format(path)})")
    return name


class _Damage(Exception):
    """Where and how a compressed file stops being readable (turned into a bad record)."""

    def __init__(self, at: int, end: Optional[int], problem: str, stream_start: int = 0, stream_out: int = 0):
        super().__init__(problem)
        self.at, self.end, self.problem = at, end, problem      # at byte ``at``, or in [at, end)
        self.stream_start, self.stream_out = stream_start, stream_out


def _codec_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a decompressor's complaint about its input (bz2 raises OSError without
    an errno; zstandard's ZstdError is matched by name, the module being optional)."""
    if isinstance(exc, OSError):
        return exc.errno is None
    return isinstance(exc, (lzma.LZMAError, zlib.error, EOFError, ValueError)) or type(exc).__name__ == "ZstdError"


class _Input:
    """A binary reader with its offset, one-ahead look (``peek``) and push-back (``unread``)."""

    def __init__(self, raw: BinaryIO):
        self.raw = raw
        self.buf = b""
        self.offset = 0             # of the next byte read, from the start of the file

    def read(self, n: int) -> bytes:
        if self.buf:
            data, self.buf = self.buf[:n], self.buf[n:]
        else:
            data = self.raw.read(n) or b""
        self.offset += len(data)
        return data

    def peek(self, n: int) -> bytes:
        while len(self.buf) < n:
            more = self.raw.read(max(n - len(self.buf), FEED_BYTES))
            if not more:
                break
            self.buf += more
        return self.buf[:n]

    def unread(self, data: bytes) -> None:
        self.buf = data + self.buf
        self.offset -= len(data)


class _Decoder:
    """One stream's decompressor behind one interface: ``feed(data)`` yields the output of ``data``
    in pieces of at most ``limit`` bytes (zstd: of ``ZSTD_FEED_BYTES`` of input), until the stream
    ends (``eof``; ``unused`` is then what followed it in ``data``)."""

    def __init__(self, compression: str, path: str, limit: int):
        self.kind, self.limit, self.unused = compression, limit, b""
        if compression == "gzip":
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)     # one member: header, deflate, CRC
        elif compression == "xz":
            self._d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        elif compression == "bzip2":
            self._d = bz2.BZ2Decompressor()
        elif compression == "zstd":
            self._d = need_module("zstandard", path).ZstdDecompressor().decompressobj()
        else:
            raise CorpusError(path, f"unknown compression {compression!r}")

    @property
    def eof(self) -> bool:
        return self._d.eof

    def feed(self, data) -> Iterator[bytes]:
        d, limit = self._d, self.limit
        if self.kind == "zstd":             # a skippable frame is a frame without output
            for i in range(0, len(data), ZSTD_FEED_BYTES):
                out = d.decompress(data[i:i + ZSTD_FEED_BYTES])
                if out:
                    yield out
                if d.eof:
                    self.unused = bytes(d.unused_data) + bytes(data[i + ZSTD_FEED_BYTES:])
                    return
        elif self.kind == "gzip":
            while True:
                out = d.decompress(data, limit)
                if out:
                    yield out
                if d.eof:
                    self.unused = d.unused_data
                    return
                data = d.unconsumed_tail
                if not out and not data:
                    return
        else:
            out = d.decompress(data, limit)
            while True:
                if out:
                    yield out
                if d.eof:
                    self.unused = d.unused_data
                    return
                if d.needs_input:
                    return
                out = d.decompress(b"", limit)


def _stream_starts(inp: _Input, compression: str, k: int) -> bool:
    """After ``k`` whole streams: whether another starts at ``inp.offset`` (False: the file ends).

    What ``gzip`` and ``xz`` allow between streams is skipped (zero bytes; for xz in multiples of
    four, its stream padding); anything else that is not the next stream's magic is damage.
    """
    start = inp.offset
    if k and compression in ("gzip", "xz"):
        while True:
            head = inp.peek(FEED_BYTES)
            zeros = len(head) - len(head.lstrip(b"\0"))
            inp.read(zeros)
            if zeros < len(head) or not head:
                break
        if compression == "xz" and (inp.offset - start) % 4:
            raise _Damage(start, None, f"xz stream padding of {inp.offset - start:,} bytes after stream {k} "
                                       f"is not a multiple of 4")
    head = inp.peek(10)
    if not head:
        return False
    found = compressed_format(head)
    if found is not None and found[0] == compression:
        return True
    if compression == "gzip" and head[:2] == b"\x1f\x8b":
        return True                         # zlib says what is wrong with this member's header
    if len(head) < 10 and _could_start(head, compression):
        return True                         # the file ends inside a stream header: truncated
    unit = _UNIT[compression]
    what = f"after {unit} {k}" if k else "at the start"
    raise _Damage(inp.offset, None, f"not {compression} data {what} (trailing garbage or a damaged {unit} header)")


#: The first bytes of a stream of each format (zstd: also 0x50..0x5F, then ZSTD_SKIPPABLE).
_MAGIC = {"gzip": b"\x1f\x8b\x08", "xz": b"\xfd7zXZ\x00", "bzip2": b"BZh", "zstd": b"\x28\xb5\x2f\xfd"}


def _could_start(head: bytes, compression: str) -> bool:
    """Whether the last bytes of a file, too few to sniff, begin a stream of ``compression``.

    >>> _could_start(b"BZ", "bzip2"), _could_start(b"BZh9", "bzip2"), _could_start(b"\\x00", "bzip2")
    (True, True, False)
    """
    magic = _MAGIC[compression]
    if head.startswith(magic) or magic.startswith(head):
        return True
    return compression == "zstd" and head[0] & 0xF0 == 0x50 and (
        head[1:4].startswith(ZSTD_SKIPPABLE) or ZSTD_SKIPPABLE.startswith(head[1:4]))


def _decompress(raw: BinaryIO, compression: str, path: str, limit: int) -> Iterator[bytes]:
    """The decompressed bytes of every stream of ``raw`` in turn, read to the end of the file.

    Raises:
        _Damage: a truncated or corrupt stream, or bytes that are not a stream.
    """
    inp = _Input(raw)
    unit = _UNIT[compression]
    k = 0
    while _stream_starts(inp, compression, k):
        k += 1
        dec = _Decoder(compression, path, limit)
        start, out = inp.offset, 0
        while not dec.eof:
            data = inp.read(FEED_BYTES)
            if not data:
                raise _Damage(inp.offset, None, f"truncated {compression} stream (the file ends inside "
                                                f"{unit} {k})", start, out)
            try:
                for piece in dec.feed(data):
                    out += len(piece)
                    yield piece
            except Exception as exc:
                if not _codec_error(exc):
                    raise
                raise _Damage(inp.offset - len(data), inp.offset,
                              f"corrupt {compression} stream ({unit} {k}: {exc})", start, out) from None
        inp.unread(dec.unused)


def _output_before(raw: BinaryIO, compression: str, path: str, damage: _Damage) -> Iterator[bytes]:
    """What the damaged stream's last piece gave before its error (lost with the call that raised):
    the stream is decompressed again from its start (a seekable file only) and that piece fed one
    byte at a time. ``damage.at`` becomes the byte at which the error came."""
    try:
        if not raw.seekable():
            return
        raw.seek(damage.stream_start)
    except (AttributeError, OSError, ValueError):
        return
    dec = _Decoder(compression, path, FEED_BYTES)
    skip = damage.stream_out                # yielded already

    def fresh(outs: Iterator[bytes]) -> Iterator[bytes]:
        nonlocal skip
        for out in outs:
            if skip >= len(out):
                skip -= len(out)
            else:
                yield out[skip:]
                skip = 0

    pos = damage.stream_start
    try:
        while pos < damage.at:              # these pieces decompressed without error the first time
            data = raw.read(min(FEED_BYTES, damage.at - pos))
            if not data:
                return
            pos += len(data)
            yield from fresh(dec.feed(data))
        data = raw.read(damage.end - damage.at)
        for i in range(len(data)):
            yield from fresh(dec.feed(data[i:i + 1]))
            pos += 1
            if dec.eof:
                return
    except Exception as exc:
        if not _codec_error(exc):
            raise
        damage.at, damage.end = pos, None


class _PieceReader(io.RawIOBase):
    """A binary reader over an iterator of byte pieces."""

    def __init__(self, pieces: Iterator[bytes]):
        self._pieces = pieces
        self._buf = b""

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            out, self._buf = self._buf + b"".join(self._pieces), b""
            return out
        while not self._buf:
            self._buf = next(self._pieces, None)
            if self._buf is None:
                self._buf = b""
                return b""
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


def open_decompressed(raw: BinaryIO, compression: Optional[str], path: str) -> BinaryIO:
    """A binary reader of the decompressed bytes of ``raw`` (``raw`` itself when not compressed);
    every stream is read, and damage raises :class:`CorpusError` (see :func:`decompressed_pieces`)."""
    if compression is None:
        return raw
    if compression not in DECOMPRESSORS:
        raise CorpusError(path, f"unknown compression {compression!r}")
    return _PieceReader(decompressed_pieces(raw, compression, path, BadRecords(skip=False)))


def decompressed_pieces(raw: BinaryIO, compression: Optional[str], path: str, bad: BadRecords,
                        piece_bytes: int = READ_BYTES) -> Iterator[bytes]:
    """The decompressed bytes of ``raw`` in pieces of at most ``piece_bytes``.

    Every stream (gzip member, xz or bzip2 stream, zstd frame; zstd skippable frames give nothing)
    is read, to the end of the file. A truncated or corrupt stream, or bytes that are not a stream
    (trailing garbage, a damaged magic; xz stream padding that is not a multiple of four) are one
    bad record naming the compressed offset: raised, or (skipping) every byte the decompressor gave
    before the damage is kept and the rest of the file is skipped.
    """
    if compression is None:
        yield from iter(lambda: raw.read(piece_bytes), b"")
        return
    n = 0
    try:
        for data in _decompress(raw, compression, path, piece_bytes):
            n += len(data)
            yield data
        return
    except _Damage as exc:
        damage = exc
    if bad.skip and damage.end is not None:     # a corrupt piece: what it gave before the error
        for data in _output_before(raw, compression, path, damage):
            n += len(data)
            yield data
    where = f"compressed byte {damage.at:,}" if damage.end is None else \
        f"compressed bytes {damage.at:,}-{damage.end:,}"
    bad.add(path, f"{where}, after {n:,} decompressed bytes", damage.problem)


# ==== JSON Lines ===================================================================================


def _field(obj: Any, path: str, parts: tuple[str, ...]) -> Any:
    """The value at ``path`` (a key, or a dotted path of keys); raises KeyError(reason)."""
    if isinstance(obj, dict) and path in obj:
        return obj[path]
    cur = obj
    for k, part in enumerate(parts):
        if not isinstance(cur, dict):
            where = ".".join(parts[:k]) or "the record"
            raise KeyError(f"{where} is {_json_type(cur)}, not an object, so it has no field {path!r}")
        if part not in cur:
            raise KeyError(f"no field {path!r}")
        cur = cur[part]
    return cur


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def jsonl_documents(stream: Iterable[bytes] | BinaryIO, path: str, text_field: str, bad: BadRecords,
                    first_line: int = 1) -> Iterator[tuple[bytes, int]]:
    """``(document, line number)`` for each record of a JSON Lines stream.

    ``stream`` is a binary reader or an iterable of byte pieces (lines may cross pieces). Line
    numbers start at ``first_line``. Bad records go to ``bad`` (raised or counted).
    """
    parts = tuple(text_field.split("."))
    pieces = iter(lambda: stream.read(READ_BYTES), b"") if hasattr(stream, "read") else iter(stream)
    lineno = first_line
    rest = b""
    for piece in pieces:
        data = rest + piece if rest else piece
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            rest = data
            continue
        rest = data[cut:]
        for line in data[:cut].split(b"\n")[:-1]:
            doc = _record(line, lineno, path, text_field, parts, bad)
            if doc is not None:
                yield doc, lineno
            lineno += 1
    if rest:
        doc = _record(rest, lineno, path, text_field, parts, bad)
        if doc is not None:
            yield doc, lineno


def _record(line: bytes, lineno: int, path: str, text_field: str, parts: tuple[str, ...],
            bad: BadRecords) -> Optional[bytes]:
    if not line.strip():
        return None                       # blank lines are not records
    try:
        obj = json.loads(line)
    except UnicodeDecodeError:
        bad.add(path, f"line {lineno}", "not UTF-8")
        return None
    except json.JSONDecodeError as exc:
        bad.add(path, f"line {lineno}", f"invalid JSON ({exc.msg} at column {exc.colno})")
        return None
    except RecursionError:
        bad.add(path, f"line {lineno}", "invalid JSON (nested too deeply)")
        return None
    except ValueError as exc:             # what else the parser refuses (an integer of > 4,300 digits)
        bad.add(path, f"line {lineno}", f"invalid JSON ({str(exc).split(';')[0]})")
        return None
    try:
        value = _field(obj, text_field, parts)
    except KeyError as exc:
        bad.add(path, f"line {lineno}", exc.args[0])
        return None
    if not isinstance(value, str):
        bad.add(path, f"line {lineno}", f"field {text_field!r} is {_json_type(value)}, not a string")
        return None
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        bad.add(path, f"line {lineno}", f"field {text_field!r} holds a lone surrogate "
                                        f"(U+{ord(value[exc.start]):04X}) that is not UTF-8")
        return None


# ==== Parquet ======================================================================================


def parquet_column(pf, path: str, text_column: str) -> int:
    """The index of ``text_column`` in the Parquet file's schema; checks that it holds text.

    Raises:
        CorpusError: no such column (the message lists the columns) or not a string/binary column.
    """
    pa = need_module("pyarrow", path)
    schema = pf.schema_arrow
    if text_column not in schema.names:
        raise CorpusError(path, f"no column {text_column!r} (columns: {', '.join(schema.names)}); "
                                f"--text-column names it")
    t = schema.field(text_column).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        raise CorpusError(path, f"column {text_column!r} is {t}, not a string or binary column")
    return schema.get_field_index(text_column)


def parquet_row_group_documents(path: str, index: int, text_column: str, first_row: int,
                                bad: BadRecords, file: Any = None) -> list:
    """The documents of row group ``index`` as buffers (memoryviews into Arrow memory), nulls
    skipped as bad records; a row group that cannot be read is bad as a whole. ``file``: an open
    binary file object to read instead of ``path`` (an fsspec URL's file; ``path`` names it)."""
    pq = need_module("pyarrow.parquet", path)
    try:
        pf = pq.ParquetFile(path if file is None else file)
        n_rows = pf.metadata.row_group(index).num_rows
    except Exception as exc:              # pyarrow.ArrowInvalid, OSError: a corrupt file
        raise CorpusError(path, f"not a readable Parquet file ({exc})") from None
    try:
        table = pf.read_row_group(index, columns=[text_column], use_threads=False)   # workers are the threads
        arr = table.column(0).combine_chunks()
    except Exception as exc:
        bad.add(path, f"rows {first_row + 1}-{first_row + n_rows} (row group {index})",
                f"corrupt Parquet row group ({exc})", n=n_rows)
        return []
    return _arrow_documents(arr, path, first_row, bad)


def _arrow_documents(arr, path: str, first_row: int, bad: BadRecords) -> list:
    """The values of a string/binary Arrow array as memoryviews (no copy), nulls as bad records."""
    import numpy as np

    n = len(arr)
    if n == 0:
        return []
    bufs = arr.buffers()
    large = str(arr.type).startswith("large_")
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[arr.offset: arr.offset + n + 1]
    data = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")
    offs = offsets.tolist()
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        docs = []
        for i in range(n):
            if valid[i]:
                docs.append(data[offs[i]:offs[i + 1]])
            else:
                bad.add(path, f"row {first_row + i + 1}", "the text is null")
        return docs
    return [data[offs[i]:offs[i + 1]] for i in range(n)]


# ==== Iterators and datasets =======================================================================


def iterator_documents(items: Iterable, name: str, bad: BadRecords) -> Iterator[bytes]:
    """The documents of an iterator of ``str``/``bytes`` or of batches (lists/tuples) of them."""
    for k, item in enumerate(items):
        if isinstance(item, (list, tuple)):
            for j, value in enumerate(item):
                doc = _iter_doc(value, name, f"item {k + 1}[{j}]", bad)
                if doc is not None:
                    yield doc
        else:
            doc = _iter_doc(item, name, f"item {k + 1}", bad)
            if doc is not None:
                yield doc


def _iter_doc(value: Any, name: str, where: str, bad: BadRecords) -> Optional[bytes]:
    try:
        return to_document(value)
    except TypeError:
        bad.add(name, where, f"is {type(value).__name__}, not str or bytes")
    except UnicodeEncodeError as exc:
        bad.add(name, where, f"holds a lone surrogate (U+{ord(value[exc.start]):04X}) that is not UTF-8")
    return None


def is_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face ``datasets.Dataset`` / ``IterableDataset`` (by its class,
    so ``datasets`` is never imported here)."""
    return any(c.__module__.split(".")[0] == "datasets" and c.__name__ in ("Dataset", "IterableDataset")
               for c in type(obj).__mro__)


def dataset_documents(ds: Any, text_column: str, name: str, bad: BadRecords,
                      batch_size: int = 1024) -> Iterator[bytes]:
    """The documents of a ``datasets`` object's ``text_column``, read in batches."""
    columns = getattr(ds, "column_names", None)
    if columns is not None and text_column not in columns:
        raise CorpusError(name, f"no column {text_column!r} (columns: {', '.join(columns)}); "
                                f"text_column names it")
    row = 0
    for batch in ds.iter(batch_size=batch_size):
        if text_column not in batch:
            raise CorpusError(name, f"no column {text_column!r} (columns: {', '.join(batch)})")
        for value in batch[text_column]:
            row += 1
            if value is None:
                bad.add(name, f"row {row}", "the text is null")
                continue
            doc = _iter_doc(value, name, f"row {row}", bad)
            if doc is not None:
                yield doc


def file_head(path: str, n: int = 16) -> bytes:
    """The first ``n`` bytes of a file."""
    with open(path, "rb") as f:
        return f.read(n)


def line_of(path: str, offset: int) -> int:
    """The line number (from 1) at byte ``offset`` of a plain file, a local path or an fsspec URL
    (for messages only)."""
    n = 1
    with open_source(path) as f:
        left = offset
        while left > 0:
            data = f.read(min(left, 1 << 20))
            if not data:
                break
            n += data.count(b"\n")
            left -= len(data)
    return n

