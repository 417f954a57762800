"""A batch of texts as one native job (``_encode.BatchJob``, :meth:`BatchMixin._encode_job`): the
texts shared out to threads that run without the GIL, their ids gathered by one copy, and the
batch entry points that are not :meth:`Tokenizer.encode_batch` itself.

Part of ``encode.tokenizer`` (``Tokenizer`` takes these methods from :class:`BatchMixin`).
"""
from __future__ import annotations

from typing import AbstractSet, Collection, Sequence

import numpy as np

from . import _encode

# encode_batch starts a thread per this many bytes of text, up to num_threads (a smaller batch is
# faster on one thread, whose encoder has seen it all).
_BATCH_THREAD_BYTES = 1 << 18

# The helper threads of batch jobs: kept between calls (a thread made and ended per call cost a
# clone, and, as glibc frees an ended thread's stack pages, ~170 page faults a call to fault them
# in again), made when first needed, each waiting on a lock of its own for its next task; one set
# per process (a forked child makes its own). No concurrent.futures: its import (with logging)
# took ~15 ms, a fifth of a first 5 MB batch.
_IDLE_HELPERS: list = []
_HELPERS_PID = [0]


class _Helper:
    """A daemon thread that runs ``fn(arg)`` for each task handed to it (:meth:`run`)."""

    def __init__(self):
        import threading

        self._go = threading.Lock()
        self._go.acquire()                 # released to hand a task over
        self._task = None
        threading.Thread(target=self._loop, name="bpe-batch", daemon=True).start()

    def run(self, fn, arg):
        """Start ``fn(arg)`` (which must not raise) on this thread; returns a lock that is
        released when it has returned."""
        import _thread

        done = _thread.allocate_lock()
        done.acquire()
        self._task = (fn, arg, done)
        self._go.release()
        return done

    def _loop(self):
        while True:
            self._go.acquire()
            fn, arg, done = self._task
            self._task = None
            try:
                fn(arg)
            except BaseException:          # (fn records its own errors; this thread lives on)
                pass
            finally:
                _IDLE_HELPERS.append(self)  # idle again before the caller is told (no extra thread)
                done.release()


def _helper():
    """An idle helper of this process, or a new one (borrowed: it returns itself to the idle list
    after its task)."""
    import os

    if _HELPERS_PID[0] != os.getpid():    # (a forked child's copies of its parent's helpers have no threads)
        _IDLE_HELPERS.clear()
        _HELPERS_PID[0] = os.getpid()
    try:
        return _IDLE_HELPERS.pop()         # atomic under the GIL
    except IndexError:
        return _Helper()


class BatchMixin:
    """The native batch job of ``tokenizer.Tokenizer`` and the batch methods built on
    ``encode_batch`` (they use its ``_native_batch``, ``_encode_flat``, ``_special_table_for``, the
    idle encoders and ``_tokens``)."""

    def encode_ordinary_batch(self, texts: Sequence[str | bytes], num_threads: int = 8, *,
                              flat: bool = False):
        """:meth:`encode_batch` with special-token strings as plain text (``encode_ordinary``).

        >>> from bpe_core import Tokenizer
        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> Tokenizer(vocab, [], ["<s>"]).encode_ordinary_batch(["<s>", "a"])
        [[60, 115, 62], [97]]
        """
        if not flat and self._native_batch():
            texts = texts if isinstance(texts, list) else list(texts)
            return self._encode_job(texts, num_threads, self._special_table_for(False), lists=True)
        ids, offsets = self._encode_flat(texts, num_threads, False)
        return (ids, offsets) if flat else self._tokens.split_lists(ids, offsets)

    def encode_batch_flat(self, texts: Sequence[str | bytes], num_threads: int = 8, *,
                          allowed_special: AbstractSet[str] | str = "all",
                          disallowed_special: Collection[str] | str = ()) -> tuple[np.ndarray, np.ndarray]:
        """Encode many texts into one flat array: ``(ids, offsets)``, uint32 ids back to back and
        int64 offsets (``len(texts) + 1``); text ``k`` is ``ids[offsets[k]:offsets[k + 1]]``.

        >>> from bpe_core import Tokenizer
        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> ids, offsets = Tokenizer(vocab, []).encode_batch_flat(["a", "", "bc"])
        >>> ids.tolist(), offsets.tolist()
        ([97, 98, 99], [0, 1, 1, 3])
        """
        return self.encode_batch(texts, num_threads, allowed_special=allowed_special,
                                 disallowed_special=disallowed_special, flat=True)

    def _encode_job(self, texts: list, num_threads: int, table, lists: bool = False):
        """A batch as one native job (``_encode.BatchJob``): up to ``num_threads`` threads (one
        per ``_BATCH_THREAD_BYTES`` of text) take documents one at a time, without the GIL, and the
        ids are gathered by one copy. With more than one thread, the warmest idle encoder's cache
        is shared by all of them, read first and written with what they merge (room made for the
        batch first: ``Encoder.reserve_shared``), so a piece is merged once, not once a thread,
        and the next call starts warm; what did not fit stays in the threads' own caches, moved
        into the shared one afterwards (``Encoder.absorb_cache``). ``lists``: a list of id lists,
        built from the workers' buffers (no flat copy); on several threads this thread builds them
        while the others still encode (``BatchJob.build_lists``: between stretches of documents of
        its own, it lists every document finished so far), not all after the job on one thread."""
        job = _encode.BatchJob(texts, self._pattern_id, table)
        tokens = self._tokens if lists else None
        n_workers = max(1, min(num_threads, job.n_docs, job.n_bytes // _BATCH_THREAD_BYTES))
        # The ids lie in the workers' buffers until ``collect`` copies them: it runs before the
        # encoders go back to the idle pool (a thread that borrows one resets its buffer).
        if n_workers <= 1:
            enc = self._borrow()
            try:
                job.run(enc)
                return job.collect(tokens)
            finally:
                self._idle.append(enc)
        shared = self._borrow_warmest()
        privates = [self._borrow() for _ in range(n_workers)]
        shared.reserve_shared(job.n_bytes)
        if lists:
            # the lists are built while the job runs, by this thread (BatchJob.build_lists)
            job.build_lists(tokens)
        errors: list[BaseException] = []

        def work(enc, listing=False):
            try:
                job.run(enc, shared, n_workers, listing)
            except BaseException as exc:   # re-raised in the calling thread
                errors.append(exc)
        helpers = []
        ran = False
        result = None
        try:
            for enc in privates[1:]:
                helpers.append(_helper().run(work, enc))
            work(privates[0], lists)
            ran = True
        finally:
            for done in helpers:
                done.acquire()             # (work catches everything: this only waits)
            try:
                if ran and not errors:
                    result = job.collect(tokens)
            finally:
                # What the threads kept in their own caches (the shared one was full) goes into it.
                for enc in privates:
                    shared.absorb_cache(enc)
                self._idle.extend(privates)
                self._idle.append(shared)   # last: the next one-thread call takes the warm one
        if errors:
            raise errors[0]
        return result
