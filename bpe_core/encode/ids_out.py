"""Ids in chunk order, straight into the output ``.npy`` temp file(s) while the chunks are encoded.

``encode_corpus`` encodes chunks on worker threads, out of order; the output wants them in order,
and its total (the ``.npy`` header's shape) is known only at the end. Two pieces:

- :class:`IdsWriter` appends ids to the temp file of the output (or to the temp files of its
  shards, ``shard_tokens`` ids each, opened as they fill): a 128-byte placeholder header first, the
  ids as they come, the real header (:func:`npy_header`, what ``np.lib.format.open_memmap`` writes)
  last. No fsync here: the one fsync is ``runtime.atomic.publish_files``'.
- :class:`OrderedIds` gives each chunk a :class:`ChunkSlot`. The chunk at the head (every chunk
  before it consumed) writes its ids straight into the writer; any other holds its ids in memory
  up to ``hold`` bytes and appends the rest to a spill file of its own. When the chunk before it is
  consumed (:meth:`OrderedIds.done`, in order, on the calling thread), its held ids and its spill
  go into the writer (the spill by ``copy_file_range``, in the kernel) and it writes directly from
  then on. So with one worker nothing is held or spilled, and with ``w`` workers at most ``w - 1``
  running chunks and the finished ones waiting for their turn hold ids: at most ``hold`` bytes
  each.

Only one thread writes to the writer at a time: the head chunk's worker, or the thread that makes
a chunk the head (under that chunk's lock, before its worker writes again). The separator id
between two items goes before a chunk that begins an item when an item came before it; it is
written when the chunk becomes the head and its block is read, whichever comes last.

Conservation: each chunk's bytes in the writer are checked against what its worker put
(:meth:`OrderedIds.done`), and the writer's total against the file sizes (:meth:`IdsWriter.finish`).
"""
from __future__ import annotations

import contextlib
import io
import os
import threading
from typing import Optional

import numpy as np

from ..runtime.atomic import new_temp_file, output_mode
from ..runtime.workers import check_total

__all__ = ["HEADER_BYTES", "ChunkSlot", "IdsWriter", "OrderedIds", "npy_header", "write_all"]

#: The size of the ``.npy`` header of a 1-D array, whatever its length (``npy_header``).
HEADER_BYTES = 128
#: Bytes per read/write when a spill is copied without ``copy_file_range``.
COPY_BYTES = 8 << 20


def npy_header(dtype: np.dtype, n: int) -> bytes:
    """The ``.npy`` (version 1.0) header of a 1-D C-order array of ``n`` items of ``dtype``: the
    bytes ``np.lib.format.open_memmap`` writes. NumPy pads the shape for growth, so it is
    ``HEADER_BYTES`` long for any ``n`` up to 21 digits.

    >>> h = npy_header(np.dtype(np.uint16), 5); len(h), h[:6], len(npy_header(np.dtype(np.uint32), 10**20))
    (128, b'\\x93NUMPY', 128)
    """
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": (int(n),)})
    head = out.getvalue()
    check_total(".npy header bytes (header vs its placeholder)", len(head), HEADER_BYTES)
    return head


def write_all(fd: int, data) -> int:
    """Write all of ``data`` (any buffer: bytes, a C-contiguous ndarray) to ``fd`` at its position;
    returns the bytes written."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])
    return done


def _copy_range(src: int, dst: int, n: int) -> int:
    """Copy ``n`` bytes from ``src`` to ``dst``, each at its file position (both advance):
    ``os.copy_file_range`` (in the kernel, no copy through this process), else read and write."""
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < n:
                k = os.copy_file_range(src, dst, n - done)
                if k == 0:
                    break
                done += k
            return done
        except OSError:             # another filesystem (EXDEV on older kernels), or not supported
            pass
    while done < n:
        data = os.read(src, min(COPY_BYTES, n - done))
        if not data:
            break
        done += write_all(dst, data)
    return done


class IdsWriter:
    """Appends ids to the output's temp file, or to shard temp files of ``shard_tokens`` ids each.

    Temp files are made beside the output with its hidden temp prefix (``.<name>.tmp-<pid>-``, as
    ``runtime.atomic.atomic_path`` names them), shards included, so the next run removes what a
    killed one left (``remove_stale``). ``temps`` lists them for the caller to remove on failure.
    ``shard_names(k)`` gives the final path of shard ``k``.

    >>> import tempfile; d = tempfile.mkdtemp(); w = IdsWriter(os.path.join(d, "ids.npy"), np.dtype(np.uint16))
    >>> w.write(np.arange(3, dtype=np.uint16)); pairs, sizes = w.finish()
    >>> sizes, np.load(pairs[0][0]).tolist()
    ([3], [0, 1, 2])
    """

    def __init__(self, out_path: str, dtype: np.dtype, shard_tokens: Optional[int] = None, shard_names=None,
                 temps: Optional[list] = None):
        self.out_path = os.fspath(out_path)
        self.dtype = np.dtype(dtype)
        self.cap = None if shard_tokens is None else int(shard_tokens) * self.dtype.itemsize
        self.shard_names = shard_names
        self.temps = temps if temps is not None else []
        self.files: list[list] = []        # [tmp, final, fd, bytes of ids written]
        self.written = 0                   # bytes of ids, all files
        if self.cap is None:
            self._open(self.out_path)

    def _open(self, final: str) -> None:
        folder = os.path.dirname(os.path.abspath(self.out_path))
        fd, tmp = new_temp_file(folder, "." + os.path.basename(self.out_path) + f".tmp-{os.getpid()}-")
        self.temps.append(tmp)
        self.files.append([tmp, final, fd, 0])
        os.fchmod(fd, output_mode(final))
        write_all(fd, b"\0" * HEADER_BYTES)      # the placeholder; the real header goes last

    def _target(self) -> tuple[list, Optional[int]]:
        """The file to append to and the bytes it still takes (None: no limit)."""
        if self.cap is None:
            return self.files[0], None
        if not self.files or self.files[-1][3] >= self.cap:
            self._open(self.shard_names(len(self.files)))
        f = self.files[-1]
        return f, self.cap - f[3]

    def write(self, data) -> None:
        """Append ``data`` (ids of the writer's dtype, any buffer) after everything written."""
        view = memoryview(data).cast("B")
        while len(view):
            f, left = self._target()
            n = len(view) if left is None else min(left, len(view))
            write_all(f[2], view[:n])
            f[3] += n
            self.written += n
            view = view[n:]

    def copy(self, src_fd: int, n_bytes: int) -> None:
        """Append ``n_bytes`` read from ``src_fd`` at its position (a spill file, rewound)."""
        left_total = n_bytes
        while left_total > 0:
            f, left = self._target()
            n = left_total if left is None else min(left, left_total)
            got = _copy_range(src_fd, f[2], n)
            check_total("bytes copied from a spill file (copied vs its size)", got, n)
            f[3] += n
            self.written += n
            left_total -= n

    def finish(self) -> tuple[list[tuple[str, str]], list[int]]:
        """Write the real headers and close; returns ``(tmp, final)`` pairs for ``publish_files``
        and the ids in each file. With shards and no ids, one empty shard (as the old layout had).
        Conservation: every file holds the header and exactly the ids written to it."""
        if not self.files:
            self._open(self.shard_names(0))
        sizes = []
        try:
            for tmp, _final, fd, n_bytes in self.files:
                n = n_bytes // self.dtype.itemsize
                os.pwrite(fd, npy_header(self.dtype, n), 0)
                check_total(f"bytes in {tmp} (file size vs header + ids written)", os.fstat(fd).st_size,
                            HEADER_BYTES + n * self.dtype.itemsize)
                sizes.append(n)
        finally:
            self.close()
        check_total("tokens written (output files vs the ids put)", sum(sizes) * self.dtype.itemsize, self.written)
        return [(tmp, final) for tmp, final, _, _ in self.files], sizes

    def close(self) -> None:
        for f in self.files:
            if f[2] >= 0:
                with contextlib.suppress(OSError):
                    os.close(f[2])
                f[2] = -1


class ChunkSlot:
    """One chunk's way into the output (:class:`OrderedIds`): direct while it is the head, else held
    in memory up to ``hold`` bytes, then spilled."""

    def __init__(self, owner: "OrderedIds", index: int):
        self.owner = owner
        self.index = index
        self.lock = threading.Lock()
        self.direct = False
        self.items_before: Optional[int] = None    # items of the chunks before it (known at the head)
        self.begins: Optional[bool] = None         # whether its block begins an item (known once read)
        self.lead = False                          # the separator id went before it
        self.held: list = []
        self.held_bytes = 0
        self.peak_held = 0
        self.spill_fd = -1
        self.spill_bytes = 0
        self.put_bytes = 0                         # bytes of ids its worker put
        self.out_bytes = 0                         # bytes of ids (separator included) it sent to the writer

    def start(self, begins_item: bool) -> None:
        """The worker read the block: whether it begins an item (for the separator before it)."""
        with self.lock:
            self.begins = bool(begins_item)
            if self.direct:
                self._lead()

    def put(self, ids: np.ndarray) -> None:
        """The next ids of the chunk (a C-contiguous array of the output dtype; kept, not copied)."""
        with self.lock:
            if self.direct:
                self._send(ids)
                self.put_bytes += ids.nbytes
                return
            self.put_bytes += ids.nbytes
            room = self.owner.hold - self.held_bytes
            if self.spill_fd < 0 and room > 0:
                k = min(len(ids), room // ids.itemsize)
                if k:
                    self.held.append(ids[:k])
                    self.held_bytes += k * ids.itemsize
                    self.peak_held = max(self.peak_held, self.held_bytes)
                    ids = ids[k:]
                    if not len(ids):
                        return
            if self.spill_fd < 0:
                self.spill_fd = os.open(self.owner.spill_path(self.index),
                                        os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            self.spill_bytes += write_all(self.spill_fd, ids)

    def _send(self, data) -> None:
        self.owner.writer.write(data)
        self.out_bytes += memoryview(data).nbytes

    def _lead(self) -> None:
        """The separator before this chunk, once both its place and its block are known."""
        owner = self.owner
        if self.begins and owner.sep is not None and self.items_before:
            self._send(owner.sep)
            self.lead = True

    def make_head(self, items_before: int) -> None:
        """Every chunk before this one is in the writer: send what it holds, then write directly."""
        with self.lock:
            if self.direct:
                return
            self.direct = True
            self.items_before = items_before
            if self.begins is not None:
                self._lead()
            for ids in self.held:
                self._send(ids)
            self.held, self.held_bytes = [], 0
            if self.spill_fd >= 0:
                os.lseek(self.spill_fd, 0, os.SEEK_SET)
                self.owner.writer.copy(self.spill_fd, self.spill_bytes)
                self.out_bytes += self.spill_bytes
                self._drop_spill()

    def _drop_spill(self) -> None:
        if self.spill_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.spill_fd)
            with contextlib.suppress(OSError):
                os.unlink(self.owner.spill_path(self.index))
            self.spill_fd = -1


class OrderedIds:
    """Chunks' ids into ``writer`` in chunk order (see the module docstring).

    ``sep``: the separator id's bytes (None: none); ``hold``: the bytes of ids a chunk that is not
    the head keeps in memory before it spills; ``spill_path(index)``: the spill file of a chunk.
    Workers call :meth:`open` when they take a chunk, then ``slot.start`` and ``slot.put``; the
    consumer calls :meth:`done` for each chunk in order, after its worker finished.

    >>> import tempfile; d = tempfile.mkdtemp(); w = IdsWriter(os.path.join(d, "ids.npy"), np.dtype(np.uint16))
    >>> out = OrderedIds(w, b"\\x09\\x00", 2, lambda i: os.path.join(d, f"spill-{i}"))
    >>> b, a = out.open(1), out.open(0)              # chunk 1 first: it is not the head, it holds
    >>> b.start(True); b.put(np.array([5, 6, 7], np.uint16)); a.start(True); a.put(np.array([1], np.uint16))
    >>> out.done(0, 1), out.done(1, 1), np.load(w.finish()[0][0][0]).tolist()
    (False, True, [1, 9, 5, 6, 7])
    """

    def __init__(self, writer: IdsWriter, sep: Optional[bytes], hold: int, spill_path):
        self.writer = writer
        self.sep = sep
        self.hold = max(0, int(hold))
        self.spill_path = spill_path
        self._lock = threading.Lock()
        self._slots: dict[int, ChunkSlot] = {}
        self.head = 0
        self.items = 0
        self.max_held = 0          # the most bytes one chunk held at once (for the figures)
        self.spilled = 0           # bytes that went through spill files

    def open(self, index: int) -> ChunkSlot:
        """The slot of chunk ``index`` (a worker taking it); direct at once if it is the head."""
        slot = ChunkSlot(self, index)
        with self._lock:
            self._slots[index] = slot
            head, items = self.head == index, self.items
        if head:
            slot.make_head(items)
        return slot

    def done(self, index: int, n_items: int) -> bool:
        """Chunk ``index`` is finished and every chunk before it is done: make sure all of it is in
        the writer, check it, and make the next chunk the head. Returns whether the separator id
        went before it."""
        with self._lock:
            slot = self._slots.pop(index)
        slot.make_head(self.items)          # a no-op unless it never became the head (it was not opened then)
        check_total(f"tokens of chunk {index} (written vs encoded)", slot.out_bytes,
                    slot.put_bytes + (len(self.sep) if slot.lead else 0))
        self.max_held = max(self.max_held, slot.peak_held)
        self.spilled += slot.spill_bytes
        with self._lock:
            self.items += n_items
            self.head = index + 1
            nxt = self._slots.get(index + 1)
            items = self.items
        if nxt is not None:
            nxt.make_head(items)
        return slot.lead

    def close(self) -> None:
        """Drop the spill files of chunks left unfinished (after an error)."""
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
        for slot in slots:
            with slot.lock:
                slot._drop_spill()
                slot.held = []
