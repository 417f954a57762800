"""Readers: compressed streams, JSON Lines records, Parquet row groups, iterators of documents.

Each reader turns one input into *documents* (``bytes``) or, for plain text, a stream of bytes;
``corpus.sources`` cuts them into blocks for the workers. What a reader refuses it refuses in one
line naming the file and the line or row (:class:`~bpe_core.errors.CorpusError`), or, when the
caller asked to skip bad records, it counts the record in a :class:`BadRecords` and goes on:

- **compressed streams** (gzip, xz, zstd, bzip2; detected by magic bytes, ``files.compressed_format``):
  read in bounded pieces; a truncated or corrupt stream is a bad record (the bytes before it are
  kept when skipping);
- **JSON Lines**: one JSON object per line, the text at ``text_field`` (a dotted path such as
  ``meta.text`` reaches nested objects; a key that itself holds dots is tried first). Blank lines
  are not records. Invalid JSON, a missing field, a value that is not a string, or a string that is
  not UTF-8 (a lone surrogate) are bad records;
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
import gzip
import io
import json
import lzma
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable, Iterator, Optional

from ..errors import CorpusError
from .files import compressed_format

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
        extra = EXTRAS.get(name, name)
        raise CorpusError(path, f"reading this file needs the {name} module: pip install 'bpe_core[{extra}]' "
                                f"(or pip install {name})") from None


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


def compression_of(head: bytes, path: str) -> Optional[str]:
    """The compression of a file by its first bytes: None (not compressed) or one of DECOMPRESSORS.

    Raises:
        CorpusError: a compressed format that is not read here (lz4, zip).

    >>> import gzip; compression_of(gzip.compress(b"x"), "a"), compression_of(b"text", "a")
    ('gzip', None)
    """
    found = compressed_format(head)
    if found is None:
        return None
    name, hint = found
    if name not in DECOMPRESSORS:
        raise CorpusError(path, f"is {name}-compressed, which is not read here (gzip, xz, zstd and bzip2 "
                                f"are); decompress it first ({hint.format(path)})")
    return name


class _ZstdReader(io.RawIOBase):
    """A zstd stream of one or more frames, read in bounded pieces; a truncated stream raises
    ``EOFError`` (``zstandard``'s own stream reader returns the short output silently)."""

    def __init__(self, raw: BinaryIO, path: str):
        zstd = need_module("zstandard", path)
        self._zstd = zstd
        self._raw = raw
        self._obj = zstd.ZstdDecompressor().decompressobj()
        self._buf = b""
        self._started = False
        self._done = False

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        while not self._buf and not self._done:
            data = self._raw.read(READ_BYTES)
            if not data:
                if self._started and not self._obj.eof:
                    raise EOFError("it ends inside a frame")
                self._done = True
                break
            while data:
                self._started = True
                out = self._obj.decompress(data)
                self._buf += out
                if self._obj.eof:           # the next frame, if any
                    data = self._obj.unused_data
                    self._obj = self._zstd.ZstdDecompressor().decompressobj()
                    self._started = False
                else:
                    data = b""
        if n is None or n < 0:
            n = len(self._buf)
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


def open_decompressed(raw: BinaryIO, compression: Optional[str], path: str) -> BinaryIO:
    """A binary reader of the decompressed bytes of ``raw`` (``raw`` itself when not compressed)."""
    if compression is None:
        return raw
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "xz":
        return lzma.LZMAFile(raw, "rb")
    if compression == "bzip2":
        return bz2.BZ2File(raw, "rb")
    if compression == "zstd":
        return _ZstdReader(raw, path)
    raise CorpusError(path, f"unknown compression {compression!r}")


def decompressed_pieces(raw: BinaryIO, compression: Optional[str], path: str, bad: BadRecords,
                        piece_bytes: int = READ_BYTES) -> Iterator[bytes]:
    """The decompressed bytes of ``raw`` in pieces of about ``piece_bytes``.

    A corrupt or truncated stream is one bad record: raised, or (skipping) the bytes before it are
    kept and the rest of the file is skipped.
    """
    reader = open_decompressed(raw, compression, path)
    n = 0
    while True:
        try:
            data = reader.read(piece_bytes)
        except (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError) as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise                     # a read error of the file itself, not of its content
            what = "truncated" if isinstance(exc, EOFError) else "corrupt"
            bad.add(path, f"after {n:,} decompressed bytes", f"{what} {compression} stream ({exc})")
            return
        except Exception as exc:          # zstandard.ZstdError
            if type(exc).__name__ != "ZstdError":
                raise
            bad.add(path, f"after {n:,} decompressed bytes", f"corrupt zstd stream ({exc})")
            return
        if not data:
            return
        n += len(data)
        yield data


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
    """The line number (from 1) at byte ``offset`` of a plain file (for messages only)."""
    n = 1
    with open(path, "rb") as f:
        left = offset
        while left > 0:
            data = f.read(min(left, 1 << 20))
            if not data:
                break
            n += data.count(b"\n")
            left -= len(data)
    return n

