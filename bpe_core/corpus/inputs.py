"""Find the inputs: many inputs of any container, read as one corpus of documents.

The first step of ``corpus/``, which flows one way::

    inputs  (find the inputs: files, folders, globs, URLs, stdin, iterators; detect each format)
      -> shards   (cut each input into shards; the corpus in order as tasks of blocks)
      -> readers  (open a reader per format: decompressors, JSON Lines, Parquet, bad records)
      -> ranges   (read byte ranges and streams of a local path or an fsspec URL; stamps)

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

(``ReadOptions``, ``Block``, the shard kinds, ``iter_tasks``, ``load``, ``corpus_bytes`` and
``spool`` live in ``corpus.shards``.) Plain files are the fast path (``files.check_input``,
``chunks.file_chunks``: pread chunks cut at safe points). Compressed text is decompressed in
bounded pieces and cut at the same safe points (``chunks.first_safe_cut``); records are grouped
into blocks at record boundaries.

>>> from bpe_core.corpus.shards import ReadOptions, corpus_bytes
>>> import tempfile, os; d = tempfile.mkdtemp()
>>> _ = open(os.path.join(d, "b.txt"), "w").write("two"); _ = open(os.path.join(d, "a.txt"), "w").write("one")
>>> [os.path.basename(s.name) for s in expand_inputs(d)]
['a.txt', 'b.txt']
>>> opts = ReadOptions(chunk_bytes=1 << 20, special_tokens=[b"<|e|>"])
>>> corpus_bytes(expand_inputs(d), opts)
b'one<|e|>two'
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from ..errors import CorpusError
from ..runtime.workers import FileStamp
from .files import check_input, stdin_problem, warn_if_binary
from .ranges import UrlStamp, expand_url, is_url, read_source, warn_if_binary_source
from .readers import compression_of, file_head, is_dataset
from .shards import InputShard, ReadOptions, input_shards

__all__ = ["COMPRESSED_RATIO", "FORMATS", "STDIN", "Source", "expand_inputs"]

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
class Source:
    """One input: a file (``kind`` text, jsonl or parquet; ``compression`` None or the stream's
    format), standard input, or an in-memory iterator / ``datasets`` object (``kind`` iterator).

    A file is a local path or an fsspec URL (``s3://``, ``gs://``, ``hf://``, ``file://``, ...):
    the same class reads both, through the filesystem the name says (``corpus.ranges``:
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

    def shards(self, opts: ReadOptions) -> list[InputShard]:
        """The independent units of this source, in order (``shards.input_shards``)."""
        return input_shards(self, opts)


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
    expanded by its filesystem (``ranges.expand_url``) and read as a local file is. The order is
    deterministic.

    Raises:
        CorpusError: a file that is missing, unreadable, not a regular file or compressed in a
            format not read here; a pattern or directory with no file; stdin given twice, or
            closed (``files.stdin_problem``).
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
            problem = stdin_problem()
            if problem is not None:
                raise CorpusError(STDIN, problem)
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
