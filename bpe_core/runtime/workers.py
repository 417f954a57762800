"""Parallel work without worker processes: threads over ``nogil`` kernels, reads that never fault.

Every data-parallel phase (counting pretokens, counting SuperBPE units, encoding a corpus) hands
chunks of the input to :func:`run_ordered`, a thread pool. The kernels release the GIL, so threads
run them in parallel as processes would, and there is nothing a process pool brings with it:

- no re-import of the caller's script (a script without ``if __name__ == "__main__":``, ``python -``
  and notebooks just work), no pickling of tables, no second interpreter's memory per worker;
- no worker that can die alone and leave the parent waiting: a failed chunk raises in the parent,
  a ``kill -9`` ends the whole run at once;
- signals reach one thread (the main one), which stops handing out chunks, cancels the queued ones,
  and waits only for the chunks already running (each is bounded by the chunk size).

Input is read with ``os.pread`` (:func:`read_range`), not through a memory map: a file truncated
while it is mapped kills the process with ``SIGBUS`` and no message, while a short read is an error
we can name (:class:`InputChanged`). :class:`FileStamp` also catches a file rewritten in place.

>>> run_ordered(lambda x: x * x, [1, 2, 3], num_workers=2, on_result=print)   # returns the hold-backs
1
4
9
0
"""
from __future__ import annotations

import os
import signal
import threading
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

from .lazy import np  # numpy on first use (a small run never imports it)

from ..errors import InputChanged, InternalError, Terminated

__all__ = ["FileStamp", "big_blocks_mapped", "check_total", "map_big_blocks", "read_range", "release_free_memory",
           "run_ordered", "terminate_on_sigterm", "trim_heap_tops"]


def check_total(what: str, got: int, want: int) -> None:
    """Raise :class:`InternalError` unless ``got == want`` (a conservation check in the product).

    >>> check_total("pretokens", 3, 3)
    >>> check_total("pretokens", 2, 3)
    Traceback (most recent call last):
    ...
    bpe_core.errors.InternalError: internal error: pretokens do not add up (2 counted, 3 expected); nothing was written
    """
    if int(got) != int(want):
        raise InternalError(f"internal error: {what} do not add up ({int(got):,} counted, {int(want):,} "
                            f"expected); nothing was written")


# ==== Reading the input =========================================================================


@dataclass(frozen=True)
class FileStamp:
    """What identifies the content of a file cheaply: size, modification time, inode."""

    path: str
    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, path: str | os.PathLike) -> "FileStamp":
        st = os.stat(path)
        return cls(os.fspath(path), st.st_size, st.st_mtime_ns, st.st_ino)

    def check(self) -> None:
        """Raise :class:`InputChanged` if the file is no longer what it was when stamped."""
        try:
            now = FileStamp.of(self.path)
        except OSError as exc:
            raise InputChanged(self.path, f"changed while it was read ({exc.strerror or exc})") from None
        if now.size != self.size:
            raise InputChanged(self.path, f"changed while it was read: {self.size:,} bytes at the start, "
                                          f"{now.size:,} now; nothing was written")
        if now != self:
            raise InputChanged(self.path, "changed while it was read (modified in place); nothing was written")


def read_range(path: str, start: int, end: int, stamp: Optional[FileStamp] = None,
               numpy: bool = True, out: Optional[np.ndarray] = None) -> np.ndarray | bytearray:
    """Bytes ``[start, end)`` of a file as a fresh ``uint8`` array (a ``bytearray`` when not
    ``numpy``: a small run never imports numpy), read with ``os.pread``; or into the start of
    ``out`` (a uint8 array or bytearray the caller reuses, at least ``end - start`` long: the view
    ``out[:end - start]`` is returned; a shorter one is ignored).

    Raises:
        InputChanged: fewer bytes than asked for (the file shrank), or ``stamp`` no longer matches.

    >>> import tempfile; p = tempfile.mktemp(); _ = open(p, "wb").write(b"hello")
    >>> read_range(p, 1, 4).tobytes()
    b'ell'
    >>> buf = np.zeros(8, np.uint8); read_range(p, 0, 5, out=buf).tobytes(), buf[:6].tobytes()
    (b'hello', b'hello\\x00')
    """
    n = end - start
    if out is not None and len(out) >= n:   # a buffer of the caller's, reused: no fresh pages to fault in
        out = out[:n]
    else:
        out = np.empty(n, dtype=np.uint8) if numpy else bytearray(n)
    if n:
        fd = os.open(path, os.O_RDONLY)
        try:
            view = memoryview(out)
            got = 0
            while got < n:
                k = os.preadv(fd, [view[got:]], start + got) if hasattr(os, "preadv") else _pread_into(fd, view[got:], start + got)
                if k <= 0:
                    break
                got += k
        finally:
            os.close(fd)
        if got < n:
            size = stamp.size if stamp is not None else end
            raise InputChanged(path, f"changed while it was read: ended at byte {start + got:,}, expected "
                                     f"{size:,} bytes; nothing was written")
    if stamp is not None:
        stamp.check()
    return out


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    data = os.pread(fd, len(view), offset)
    view[:len(data)] = data
    return len(data)


# ==== The thread pool ===========================================================================


def run_ordered(fn: Callable[[Any], Any], tasks: Iterable[Any], num_workers: int,
                on_result: Callable[[Any], None], max_in_flight: Optional[int] = None,
                may_submit: Optional[Callable[[int], bool]] = None) -> int:
    """Run ``fn`` over ``tasks`` on ``num_workers`` threads; ``on_result`` sees results in task order.

    At most ``max_in_flight`` (default ``num_workers + 1``) tasks are submitted and not yet consumed,
    so memory stays bounded whatever the number of tasks. Before each submission while others are in
    flight, ``may_submit(n_in_flight)`` may say no (the memory guard): then the oldest task is
    consumed first. With nothing in flight a task is always submitted, so the run always makes
    progress: it never waits for room that no running task can free.

    An exception in ``fn`` or ``on_result`` (or a ``KeyboardInterrupt`` in the calling thread)
    cancels the queued tasks, waits for the running ones, and propagates. With ``num_workers <= 1``
    everything runs in the calling thread. Returns how many times ``may_submit`` held a task back.
    """
    if num_workers <= 1:
        for task in tasks:
            on_result(fn(task))
        return 0
    limit = max_in_flight or num_workers + 1
    held = 0
    from concurrent.futures import ThreadPoolExecutor      # (with logging: only a run with workers pays)

    pool = ThreadPoolExecutor(num_workers, thread_name_prefix="bpe_core")
    pending: deque = deque()
    try:
        for task in tasks:
            while len(pending) >= limit:
                on_result(pending.popleft().result())
            while pending and may_submit is not None and not may_submit(len(pending)):
                held += 1
                on_result(pending.popleft().result())
            pending.append(pool.submit(fn, task))
        while pending:
            on_result(pending.popleft().result())
    finally:
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        release_free_memory()
    return held


# ==== Memory ====================================================================================


def release_free_memory() -> None:
    """Give the memory that worker threads freed back to the OS (glibc ``malloc_trim``).

    glibc keeps a heap arena per thread; what the counting threads freed stays in their arenas
    (resident, counted in RSS) unless trimmed, and the merge phase that follows allocates afresh in
    the main arena. Elsewhere this does nothing.
    """
    global _TRIM
    if _TRIM is None:
        try:
            import ctypes

            _TRIM = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM = None

#: glibc's ``mallopt`` parameter: blocks of at least this many bytes get a mapping of their own
_M_MMAP_THRESHOLD = -3


def map_big_blocks(threshold: int = 1 << 20) -> bool:
    """From now on in this process, glibc gives every block of ``threshold`` bytes or more a mapping
    of its own, returned to the OS when it is freed (``mallopt(M_MMAP_THRESHOLD)``); True when set.

    By default glibc raises that threshold each time a mapped block is freed (up to 32 MiB), so the
    many mid-sized arrays of a pass that follows a big one come from the heap, where freed memory
    stays resident: SupraTok's final count started 240 MiB above what it held (60 MB of text at
    32k). The setting stays for the process (glibc has no way back to the moving threshold): for a
    stretch of work, :func:`big_blocks_mapped`. Elsewhere (not glibc) this does nothing and returns False.
    """
    try:
        import ctypes

        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


#: glibc's ceiling for its moving mmap threshold (``DEFAULT_MMAP_THRESHOLD_MAX``: 4 MiB x sizeof(long))
GLIBC_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * 8


@contextlib.contextmanager
def big_blocks_mapped(threshold: int = 1 << 20) -> Iterator[bool]:
    """:func:`map_big_blocks` for the block only (yields whether it was set). On the way out the
    threshold goes to ``GLIBC_MMAP_THRESHOLD_MAX``, the value glibc's moving threshold climbs to
    once mapped blocks of that size are freed (as a training's are): blocks under it come from the
    heap again, as in a process that never called ``mallopt``. The moving itself stays off (glibc
    has no way to turn it back on), so the rest of the process does not keep mapping and unmapping
    every block of ``threshold`` bytes, the side effect the process-wide setting had."""
    was_set = map_big_blocks(threshold)
    try:
        yield was_set
    finally:
        if was_set:
            map_big_blocks(max(GLIBC_MMAP_THRESHOLD_MAX, int(threshold)))


#: glibc's ``mallopt`` parameter: a heap whose free top reaches this many bytes gives it back
_M_TRIM_THRESHOLD = -1
_MMAP_THRESHOLD_MAX = GLIBC_MMAP_THRESHOLD_MAX


#: the largest trim threshold glibc's moving threshold reaches (twice the mmap threshold's largest)
HEAP_TOPS_KEPT = 2 * _MMAP_THRESHOLD_MAX


def trim_heap_tops(threshold: int = 1 << 20) -> bool:
    """From now on in this process, a glibc heap (the main one and each thread's arena) gives its
    free top back to the OS once it reaches ``threshold`` bytes (``mallopt(M_TRIM_THRESHOLD)``),
    with blocks of 32 MiB and more mapped on their own (the value glibc's moving threshold settles
    at); True when set. ``trim_heap_tops(HEAP_TOPS_KEPT)`` is glibc's own setting once its
    thresholds have settled (what counting puts back when it ends: the merge loop frees and takes
    1 MiB pages, which a low threshold would hand back and fault in again).

    By default glibc raises the trim threshold with the mmap threshold (up to 64 MiB, the largest
    a thread's heap can be), and ``malloc_trim`` (:func:`release_free_memory`) trims the top of the
    main heap only: the free top of a counting thread's heap stayed resident to the end of the run
    (a 48 MiB heap with 20-32 MiB of it resident beside the merge engine on the 4 and 15 GB
    synthetic corpora, outside the plan's figure). Elsewhere (not glibc) this does nothing and
    returns False.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
                    and libc.mallopt(_M_TRIM_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


# ==== Signals ===================================================================================


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (like Ctrl-C does
    ``KeyboardInterrupt``), so ``finally`` blocks remove temp and spill files before the exit.

    Outside the main thread (where signal handlers cannot be set) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
