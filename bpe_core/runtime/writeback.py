"""Files written with few dirty pages: the spill files a run under a memory cgroup writes.

A page of a file that was written and not yet written back to disk is *dirty*: it counts in the
memory cgroup of the process that wrote it, and the cgroup cannot drop it the way it drops a clean
page of the page cache; it must wait for the kernel's flusher to write it, and the kernel's dirty
limits are shares of the whole machine's RAM, not of the cgroup. So a run that writes a 1 GiB spill
file inside a 2.5 GiB cgroup may hold most of that gigabyte dirty at once, on top of its anonymous
memory, and be killed (exit 137) although everything it maps is a file.

:class:`WriteBehind` appends to a file in pieces of ``window`` bytes and starts the writeback of
each piece as soon as it is written (``sync_file_range``, Linux), waiting for the piece before it:
at most two pieces of the file are dirty or being written at any time, and the pages behind them are
clean (the cgroup reclaims them at once). Elsewhere it calls ``fdatasync`` after each piece, which
bounds the dirty pages the same way, only without the overlap.

>>> import tempfile; fd, path = tempfile.mkstemp()
>>> w = WriteBehind(fd, window=4); w.write(b"hello, "); w.write(memoryview(b"world")); w.finish()
>>> open(path, "rb").read(), w.written
(b'hello, world', 12)
"""
from __future__ import annotations

import os
import sys

__all__ = ["WRITE_BEHIND_WINDOW", "WriteBehind"]

#: Bytes written before their writeback starts (at most two windows of a file are dirty at once).
WRITE_BEHIND_WINDOW = 32 << 20

_SYNC_WAIT_BEFORE, _SYNC_WRITE, _SYNC_WAIT_AFTER = 1, 2, 4


def _load_sync_file_range():
    """libc's ``sync_file_range`` (None where there is none: not Linux, no glibc symbol)."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range() if sys.platform.startswith("linux") else None


class WriteBehind:
    """Append bytes to an open file descriptor, starting their writeback as it goes.

    Args:
        fd: a file descriptor open for writing, positioned at its end (the bytes are appended with
            ``os.write``).
        window: bytes per piece; the writeback of a piece starts when it is written, and the writer
            waits for the piece before it.

    Attributes:
        written: bytes written so far.
    """

    def __init__(self, fd: int, window: int = WRITE_BEHIND_WINDOW):
        self.fd = fd
        self.window = max(1, int(window))
        self.start = os.lseek(fd, 0, os.SEEK_CUR)
        self.written = 0
        self._started = 0          # bytes (from ``start``) whose writeback has been started
        self._waited = 0           # bytes (from ``start``) known to be clean

    def write(self, data) -> None:
        """Append ``data`` (bytes or any contiguous buffer) in pieces of at most ``window`` bytes."""
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            room = self.window - (self.written - self._started)
            k = os.write(self.fd, view[done:done + room])
            done += k
            self.written += k
            if self.written - self._started >= self.window:
                self._push()

    def wrote(self, nbytes: int) -> None:
        """Count ``nbytes`` more bytes as written after those written so far, written in place (through
        a shared mapping of the file, already as long): their writeback starts as :meth:`write`'s does.

        >>> import mmap, tempfile; fd, path = tempfile.mkstemp(); os.ftruncate(fd, 8)
        >>> m = mmap.mmap(fd, 8); m[:] = b"in place"; w = WriteBehind(fd, window=4); w.wrote(8); w.finish()
        >>> open(path, "rb").read(), w.written
        (b'in place', 8)
        """
        self.written += int(nbytes)
        if self.written - self._started >= self.window:
            self._push()

    def _push(self) -> None:
        """Start the writeback of what was written since the last push; wait for the push before."""
        lo, hi = self._started, self.written
        if _SYNC_FILE_RANGE is None:
            os.fdatasync(self.fd) if hasattr(os, "fdatasync") else os.fsync(self.fd)
            self._started = self._waited = hi
            return
        if self._started > self._waited:     # the previous piece: wait until it is on disk
            _SYNC_FILE_RANGE(self.fd, self.start + self._waited, self._started - self._waited,
                             _SYNC_WAIT_BEFORE | _SYNC_WRITE | _SYNC_WAIT_AFTER)
            self._waited = self._started
        _SYNC_FILE_RANGE(self.fd, self.start + lo, hi - lo, _SYNC_WRITE)
        self._started = hi

    def finish(self) -> None:
        """Everything written is on disk (``fdatasync``): every page of it is clean."""
        os.fdatasync(self.fd) if hasattr(os, "fdatasync") else os.fsync(self.fd)
        self._started = self._waited = self.written
