"""Encoded ids and their document index (``encode_corpus --doc-index``), read back as a checked pair.

The index is an ``int64`` ``.npy`` (``np.load`` reads it as before) followed by one trailer line
that records what it indexes: for each ids file, in order, its size in bytes and the sha256 of its
first and last MiB (the ``.npy`` header with the shape, the first ids and the last ones)::

    #bpe_core-doc-index {"version": 1, "ids": [{"bytes": 4194432, "ends_sha256": "9f2c..."}]}

``np.load`` ignores bytes after the array. :func:`load_ids` first finishes the renames of a writer
killed between the two renames of the pair (``runtime.atomic.recover_files``), then checks that
the index was written for these ids, so a reader never pairs new ids with an old index.

>>> import os, tempfile, numpy as np
>>> d = tempfile.mkdtemp(); ids, idx = os.path.join(d, "ids.npy"), os.path.join(d, "idx.npy")
>>> np.save(ids, np.array([5, 9, 0, 7], np.uint32))
>>> dump_doc_index(idx, np.array([0, 3], np.int64), [ids])
>>> got, index = load_ids(ids, idx); got.tolist(), index.tolist()
([5, 9, 0, 7], [0, 3])
>>> np.load(idx).tolist()
[0, 3]
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Optional, Sequence

from ..errors import CorpusError
from ..runtime.atomic import recover_files
from ..runtime.lazy import np

__all__ = ["dump_doc_index", "load_ids", "read_index_trailer"]

#: The trailer's first bytes (after the array data; a line of its own).
TRAILER_MAGIC = b"\n#bpe_core-doc-index "
#: Bytes hashed at each end of an ids file.
END_BYTES = 1 << 20


def _ends_digest(path: str | os.PathLike) -> tuple[int, str]:
    """``(size, sha256 of the first and last END_BYTES)`` of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(f.read(END_BYTES))
        if size > END_BYTES:
            f.seek(max(END_BYTES, size - END_BYTES))
            h.update(f.read(END_BYTES))
    return size, h.hexdigest()


def dump_doc_index(path: str | os.PathLike, index, ids_files: Sequence[str | os.PathLike]) -> None:
    """Write the ``int64`` document index ``index`` to ``path`` (fsynced) with the trailer that
    records ``ids_files`` (complete: their headers written), in order."""
    records = []
    for p in ids_files:
        size, digest = _ends_digest(p)
        records.append({"bytes": size, "ends_sha256": digest})
    trailer = TRAILER_MAGIC + json.dumps({"version": 1, "ids": records}, separators=(", ", ": ")).encode() + b"\n"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(index, dtype=np.int64))
        f.write(trailer)
        f.flush()
        os.fsync(f.fileno())


def read_index_trailer(path: str | os.PathLike) -> Optional[dict]:
    """The trailer of a document index (None when it has none: an index of an older version)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - (64 << 10)))
        tail = f.read()
    at = tail.rfind(TRAILER_MAGIC)
    if at < 0:
        return None
    try:
        doc = json.loads(tail[at + len(TRAILER_MAGIC):].decode())
    except (UnicodeDecodeError, ValueError):
        raise CorpusError(path, "the document index's trailer is damaged") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ids"), list):
        raise CorpusError(path, "the document index's trailer is damaged")
    return doc


def load_ids(path: str | os.PathLike, doc_index: str | os.PathLike | None = None, mmap: bool = True,
             check: bool = True):
    """The ids ``encode_corpus`` wrote to ``path`` and, with ``doc_index``, its document index,
    checked to belong together. Returns ``(ids, index)`` (``index`` None without ``doc_index``);
    memory-mapped read-only unless ``mmap=False``.

    Before reading, the renames of a writer killed between the two renames of the pair are finished
    (its journal, ``runtime.atomic.recover_files``). Then the index's trailer must record ``path``:
    its size and the sha256 of its first and last MiB. A mismatch (an index of another run, a pair
    cut in two and not recoverable) or an index without a trailer (written by an older version; pass
    ``check=False`` to read it anyway) raises :class:`CorpusError` naming the index.
    """
    path = os.fspath(path)
    recover_files(path)                       # a pending journal of a killed writer: finish it first
    mode = "r" if mmap else None
    if doc_index is None:
        return np.load(path, mmap_mode=mode), None
    doc_index = os.fspath(doc_index)
    if check:
        trailer = read_index_trailer(doc_index)
        if trailer is None:
            raise CorpusError(doc_index, "the document index records no ids file (written by an older bpe_core): "
                                         "the pair cannot be checked; encode again, or pass check=False")
        records = trailer["ids"]
        size, digest = _ends_digest(path)
        if len(records) != 1 or records[0].get("bytes") != size or records[0].get("ends_sha256") != digest:
            want = records[0].get("bytes") if len(records) == 1 else f"{len(records)} files"
            raise CorpusError(doc_index, f"is not the document index of {path}: it indexes ids of {want} bytes "
                                         f"with other contents, {path} has {size:,} bytes (a pair from two runs); "
                                         f"encode again to write both")
    return np.load(path, mmap_mode=mode), np.load(doc_index, mmap_mode=mode)
