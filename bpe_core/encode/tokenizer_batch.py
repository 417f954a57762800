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
# in again), made when first needed; one set per process (a forked child makes its own).
_HELPERS: dict[int, object] = {}
_HELPERS_MAX = 256


def _helpers():
    """The process's pool of batch helper threads (``concurrent.futures.ThreadPoolExecutor``: an
    idle thread is reused, a new one made only while none is idle)."""
    import os

    pid = os.getpid()
    pool = _HELPERS.get(pid)
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _HELPERS.clear()                   # (a forked child's copy of its parent's pool has no threads)
        pool = _HELPERS.setdefault(pid, ThreadPoolExecutor(_HELPERS_MAX, thread_name_prefix="bpe-batch"))
    return pool


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
        built from the workers' buffers (no flat copy)."""
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
        errors: list[BaseException] = []

        def work(enc):
            try:
                job.run(enc, shared, n_workers)
            except BaseException as exc:   # re-raised in the calling thread
                errors.append(exc)
        helpers = []
        ran = False
        result = None
        try:
            pool = _helpers()
            for enc in privates[1:]:
                helpers.append(pool.submit(work, enc))
            work(privates[0])
            ran = True
        finally:
            for h in helpers:
                h.result()                 # (work catches everything: this only waits)
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
