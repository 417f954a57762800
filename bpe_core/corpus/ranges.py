"""Read ranges: the bytes of one input file, local or remote, and what identifies its content.

The last step of ``corpus/`` (``inputs`` -> ``shards`` -> ``readers`` -> ``ranges``): a shard
(``corpus.shards``) says which bytes of which input; this module reads them, on whichever machine
runs the task -- ``pread`` for a local path (``runtime.workers.read_range``; a shared filesystem on
a cluster), ``fsspec`` for a URL (``s3://``, ``gs://``, ``hf://``, ``memory://``, ``file://``,
...): ``read_source`` for a byte range, ``open_source`` for a stream (decompressors) or a seekable
file (Parquet). A *stamp* (``runtime.workers.FileStamp`` for a local file, :class:`UrlStamp` for a
URL) identifies the content; reading checks it, so an input rewritten during a run raises
:class:`errors.InputChanged`. ``expand_url``, ``check_source`` and ``warn_if_binary_source`` are
``expand_inputs``' directory walk, ``files.check_input`` and ``files.warn_if_binary`` for a URL.

>>> import tempfile, os; p = os.path.join(tempfile.mkdtemp(), "c.txt")
>>> _ = open(p, "wb").write(b"aa<|e|>bb")
>>> read_source(p, 2, 7, source_stamp(p)).tobytes(), is_url(p)
(b'<|e|>', False)
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Optional, Union

from ..runtime.lazy import np  # numpy on first use (a small run never imports it)

from ..errors import BinaryInputWarning, CorpusError, InputChanged, MissingDependency
from ..runtime.workers import FileStamp, read_range
from .files import SNIFF_BYTES, binary_reason, check_input, compressed_format

__all__ = ["Stamp", "UrlStamp", "check_source", "expand_url", "is_url", "open_source", "read_source",
           "source_stamp", "url_fs", "warn_if_binary_source"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
#: The keys of ``fsspec``'s ``info()`` that identify a version of a remote file (first one present).
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "mtime", "LastModified", "last_modified",
                 "updated", "created")


def is_url(source: Union[str, os.PathLike]) -> bool:
    """True for an fsspec URL (``protocol://...``), False for a local path.

    >>> is_url("s3://bucket/corpus.txt"), is_url("memory://c.txt"), is_url("/data/corpus.txt")
    (True, True, False)
    """
    return isinstance(source, str) and _URL.match(source) is not None


def url_fs(url: str):
    """``(filesystem, path)`` of an fsspec URL; a missing ``fsspec`` or protocol package is one clear line.

    >>> fs, path = url_fs("memory://doc/a.txt"); type(fs).__name__, path
    ('MemoryFileSystem', '/doc/a.txt')
    """
    try:
        import fsspec
    except ImportError:
        raise MissingDependency(f"{url}: reading a URL needs fsspec: pip install fsspec") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:       # an unknown protocol, or its package missing
        raise CorpusError(url, f"cannot open this URL: {exc}") from None


@dataclass(frozen=True)
class UrlStamp:
    """What identifies the content of a remote file: its size and a version (ETag, generation,
    modification time, as the filesystem reports it; empty when it reports none)."""

    url: str
    size: int
    version: str

    @classmethod
    def of(cls, url: str) -> "UrlStamp":
        fs, path = url_fs(url)
        try:
            info = fs.info(path)
        except FileNotFoundError:
            raise CorpusError(url, "no such file") from None
        except Exception as exc:        # noqa: BLE001 -- any backend's error becomes one line
            raise CorpusError(url, f"cannot read: {exc}") from None
        if info.get("type") == "directory":
            raise CorpusError(url, "is a directory, expected a text file")
        version = next((str(info[k]) for k in _VERSION_KEYS if info.get(k) is not None), "")
        return cls(url, int(info["size"]), version)

    def check(self) -> None:
        """Raise :class:`InputChanged` if the file is no longer what it was when stamped."""
        try:
            now = UrlStamp.of(self.url)
        except CorpusError as exc:
            raise InputChanged(self.url, f"changed while it was read ({exc.reason})") from None
        if now.size != self.size:
            raise InputChanged(self.url, f"changed while it was read: {self.size:,} bytes at the start, "
                                         f"{now.size:,} now; nothing was written")
        if now != self:
            raise InputChanged(self.url, "changed while it was read (a new version); nothing was written")


Stamp = Union[FileStamp, UrlStamp]


def source_stamp(source: Union[str, os.PathLike]) -> Stamp:
    """The stamp of a local file (:class:`runtime.workers.FileStamp`) or of a URL (:class:`UrlStamp`)."""
    source = os.fspath(source)
    return UrlStamp.of(source) if is_url(source) else FileStamp.of(source)


def read_source(source: str, start: int, end: int, stamp: Optional[Stamp] = None,
                numpy: bool = True, out=None) -> np.ndarray | bytearray:
    """Bytes ``[start, end)`` of a local file or a URL as a fresh ``uint8`` array (a ``bytearray``
    when not ``numpy``); a local file is read into ``out`` when it is long enough
    (``runtime.workers.read_range``).

    Raises:
        InputChanged: fewer bytes than asked for, or the stamp no longer matches.

    >>> import fsspec; fsspec.filesystem("memory").pipe("/doc/a.txt", b"hello")
    >>> read_source("memory://doc/a.txt", 1, 4).tobytes()
    b'ell'
    """
    if not is_url(source):
        try:
            return read_range(source, start, end, stamp, numpy=numpy, out=out)
        except FileNotFoundError:
            raise CorpusError(source, f"no such file on this machine ({_host()}): on a cluster, the input must "
                                      f"be on a filesystem every worker sees at the same path, or a URL") from None
    if end <= start:
        return np.zeros(0, np.uint8) if numpy else bytearray()
    fs, path = url_fs(source)
    try:
        data = fs.cat_file(path, start=start, end=end)
    except FileNotFoundError:
        raise InputChanged(source, "changed while it was read (it is gone); nothing was written") from None
    if len(data) != end - start:
        raise InputChanged(source, f"changed while it was read: {len(data):,} bytes at {start:,}, expected "
                                   f"{end - start:,}; nothing was written")
    if stamp is not None:
        stamp.check()
    return np.frombuffer(data, dtype=np.uint8).copy() if numpy else bytearray(data)


def _host() -> str:
    import socket

    return socket.gethostname()


def open_source(source: str):
    """A binary file object of a local path (``open``) or an fsspec URL (``fs.open``), to be closed
    by the caller (a ``with`` block); readers that stream (decompressors) or seek (Parquet) take it.

    >>> import fsspec; fsspec.filesystem("memory").pipe("/doc/o.txt", b"hey")
    >>> with open_source("memory://doc/o.txt") as f:
    ...     f.read()
    b'hey'
    """
    if not is_url(source):
        return open(source, "rb")
    fs, path = url_fs(source)
    try:
        return fs.open(path, "rb")
    except FileNotFoundError:
        raise InputChanged(source, "changed while it was read (it is gone); nothing was written") from None


def expand_url(spec: str) -> list[str]:
    """The files an input URL stands for, as ``expand_inputs`` reads a local path: a file (itself,
    as given); a folder (its non-hidden files, recursively, sorted); a glob pattern (its matches,
    sorted; ``**`` recurses). The URLs returned carry the protocol (``fs.unstrip_protocol``).

    Raises:
        CorpusError: no such file, an empty folder, a pattern that matches nothing.

    >>> import fsspec; m = fsspec.filesystem("memory")
    >>> for name in ("b.txt", "a.txt", ".hidden", "sub/c.txt"): m.pipe(f"/exp/{name}", b"x")
    >>> expand_url("memory://exp/")
    ['memory:///exp/a.txt', 'memory:///exp/b.txt', 'memory:///exp/sub/c.txt']
    >>> expand_url("memory://exp/*.txt")
    ['memory:///exp/a.txt', 'memory:///exp/b.txt']
    """
    fs, path = url_fs(spec)
    try:
        if fs.isfile(path):
            return [spec]
        if fs.isdir(path):
            root = path.rstrip("/")
            found = [p for p in fs.find(root) if not any(part.startswith(".")
                                                          for part in p[len(root):].split("/"))]
            if not found:
                raise CorpusError(spec, "is a directory with no files")
            return [fs.unstrip_protocol(p) for p in sorted(found)]
        if any(c in path for c in "*?["):
            found = sorted(p for p in fs.glob(path) if not fs.isdir(p))
            if not found:
                raise CorpusError(spec, "no file matches this pattern")
            return [fs.unstrip_protocol(p) for p in found]
    except CorpusError:
        raise
    except FileNotFoundError:
        pass
    except Exception as exc:        # noqa: BLE001 -- any backend's error becomes one line
        raise CorpusError(spec, f"cannot read: {exc}") from None
    raise CorpusError(spec, "no such file")


def check_source(source: Union[str, os.PathLike]) -> int:
    """``files.check_input`` for a local path or a URL: readable, a file, not compressed; its size.

    >>> import fsspec; fsspec.filesystem("memory").pipe("/doc/b.txt", b"hi")
    >>> check_source("memory://doc/b.txt")
    2
    >>> check_source("memory://doc/none.txt")
    Traceback (most recent call last):
    ...
    bpe_core.errors.CorpusError: memory://doc/none.txt: no such file
    """
    source = os.fspath(source)
    if not is_url(source):
        return check_input(source)
    stamp = UrlStamp.of(source)
    if stamp.size:
        found = compressed_format(read_source(source, 0, min(16, stamp.size)).tobytes())
        if found is not None:
            raise CorpusError(source, f"is {found[0]}-compressed; decompress it first")
    return stamp.size


def warn_if_binary_source(source: Union[str, os.PathLike], stacklevel: int = 2) -> Optional[str]:
    """``files.warn_if_binary`` for a local path or a URL (the first 64 KiB are sniffed)."""
    source = os.fspath(source)
    try:
        size = source_stamp(source).size
        head = read_source(source, 0, min(SNIFF_BYTES, size)).tobytes()
    except (OSError, CorpusError):
        return None             # check_source reports what cannot be read
    reason = binary_reason(head)
    if reason is not None:
        warnings.warn(f"{source}: looks binary, not text ({reason}); using its bytes anyway",
                      BinaryInputWarning, stacklevel=stacklevel + 1)
    return reason
