"""The counting pass's record of every pretoken, kept for a method's second look at the corpus
(SuperBPE's stage-2 units, SupraTok's documents) instead of a second pre-tokenization of the file:
in RAM up to a share of the budget, the chunks past it in one file of the spill folder, mapped
when the record is read (:class:`PretokenRecord`)."""
from __future__ import annotations

import tempfile
import threading
from typing import Optional

import numpy as np

from ..runtime.atomic import naming

#: Each spilled array starts at a multiple of this many bytes of the file (int64 offsets aligned).
ALIGN = 8


class PretokenRecord:
    """The recorded chunks of ``count_corpus(record=)`` in text order: item ``k`` is chunk ``k``'s
    ``(arena, offsets, ids, spans, n_bytes, ends, id_rows)`` (its own sorted word table, the number
    of every pretoken's word, its text spans and size, where each span's pretokens end in ``ids``,
    and the row in the table of each word number; the last two may be left out: the ids are then
    rows), as a list would hold them.

    A chunk is held in RAM while the chunks held there take at most ``ram_bytes`` (their arena,
    offsets, ids and id rows); a chunk past that goes to one anonymous file in ``folder`` (the spill
    folder: ``tempfile``'s default when None; the file has no name and goes when the record is cleared or
    dropped). When that folder is on tmpfs (its files are memory) the record is dropped instead and
    stays empty (``dropped``): the method scans the file again. Read back (``record[k]``, iteration), a spilled chunk's arrays are views of the file
    mapped shared and writable: their pages are the page cache's, not the process's anonymous
    memory, and ``superbpe.record_table_rows`` may rewrite the ids in place as for a chunk in RAM.

    >>> rec = PretokenRecord(ram_bytes=0)
    >>> rec.append((np.frombuffer(b"ab", np.uint8), np.array([0, 1, 2]), np.array([1, 0, 1], np.uint32),
    ...             np.array([[0, 3]]), 3))
    >>> len(rec), rec.spilled_chunks, rec[0][2].tolist(), rec[0][0].tobytes()
    (1, 1, [1, 0, 1], b'ab')
    >>> rec.clear(); len(rec), bool(rec)
    (0, False)
    """

    def __init__(self, ram_bytes: int, folder: Optional[str] = None):
        self.ram_bytes = int(ram_bytes)
        self.folder = folder
        self._items: list = []       # a chunk's tuple, or a _Spilled one
        self._file = None
        self._size = 0               # bytes written to the file
        self._map: Optional[np.memmap] = None
        self._lock = threading.Lock()    # (the record's rows are made on two threads)
        #: bytes of the chunks held in RAM; chunks and bytes written to the file
        self.ram_held = 0
        self.spilled_chunks = 0
        self.spilled_bytes = 0
        #: the spill folder is memory (tmpfs): nothing is kept, and appends are ignored
        self.dropped = False

    # ==== a list's face ===========================================================================

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self):
        for k in range(len(self._items)):
            yield self[k]

    def __getitem__(self, k: int) -> tuple:
        item = self._items[k]
        if not isinstance(item, _Spilled):
            return item
        m = self._mapped()
        arrays = [m[at:at + n * np.dtype(dt).itemsize].view(dt) for at, n, dt in item.places]
        return tuple(arrays[:3]) + item.rest + tuple(arrays[3:])

    def append(self, chunk: tuple) -> None:
        """Keep chunk ``(arena, offsets, ids, spans, n_bytes[, ends[, id_rows]])``: in RAM while the
        share allows, else its arrays of words and pretokens written to the file (its spans and ends
        stay in RAM: three int64 a document)."""
        if self.dropped:
            return
        arrays = [(chunk[0], np.uint8), (chunk[1], np.int64), (chunk[2], np.uint32)]
        if len(chunk) > 6:
            arrays.append((chunk[6], np.uint32))
        size = sum(_nbytes(a) for a, _ in arrays)
        if self._file is None and self.ram_held + size <= self.ram_bytes:
            self._items.append(chunk)
            self.ram_held += size
            return
        folder = self.folder or tempfile.gettempdir()
        if self._file is None:
            from ..runtime.cgroup import in_memory_folder
            if in_memory_folder(folder):
                # files there are memory: no record at all (the method scans the file again)
                self.dropped = True
                self.clear()
                return
            with naming(folder):
                self._file = tempfile.TemporaryFile(dir=folder, prefix="bpe_core-record-")
                self._file.write(b"\0" * ALIGN)      # never an empty file to map (chunks with no text)
            self._size = ALIGN
        places = []
        with naming(folder):              # a full disk names the folder
            for arr, dt in arrays:
                a = np.ascontiguousarray(arr, dtype=dt)
                pad = -self._size % ALIGN
                if pad:
                    self._file.write(b"\0" * pad)
                    self._size += pad
                places.append((self._size, int(a.size), dt))
                self._file.write(memoryview(a).cast("B"))
                self._size += a.nbytes
        self._items.append(_Spilled(places, (np.asarray(chunk[3]),) + tuple(chunk[4:6])))
        self._map = None                  # mapped again when read (views of the old mapping stay valid)
        self.spilled_chunks += 1
        self.spilled_bytes += size

    def clear(self) -> None:
        """Drop every chunk; the file goes (its mapping with it, once no view of it is left)."""
        self._items.clear()
        self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None
        self._size = 0
        self.ram_held = 0

    # ==== private =================================================================================

    def _mapped(self) -> np.memmap:
        """The file mapped shared and writable (once everything is written)."""
        with self._lock:
            if self._map is None:
                self._file.flush()
                self._map = np.memmap(self._file, dtype=np.uint8, mode="r+", shape=(self._size,))
            return self._map


class _Spilled:
    """A chunk in the file: where its arena, offsets and ids (and id rows) are (``(at, n, dtype)``
    each), and the rest of its tuple (spans, size, span ends), held in RAM."""
    __slots__ = ("places", "rest")

    def __init__(self, places: list, rest: tuple):
        self.places, self.rest = places, rest


def _nbytes(arr) -> int:
    return int(np.asarray(arr).nbytes)
