"""A tokenizer's idle encoders: each ``_encode.Encoder`` owns a pretoken cache and is used by one
thread at a time; a call borrows one and gives it back, so caches stay warm across calls and
across the short-lived threads of a batch or of ``encode_corpus``.

Part of ``encode.tokenizer`` (``Tokenizer`` takes these methods from :class:`EncoderPoolMixin`).
"""
from __future__ import annotations

from . import _encode


class EncoderPoolMixin:
    """Borrowing, making and warming the encoders of ``tokenizer.Tokenizer`` (its ``_idle`` list,
    rank ``_table`` and ``_singles``)."""

    def _encoder(self) -> "_encode.Encoder":
        """The idle encoder used last (created if there is none), for inspection and tests; it is
        not borrowed, so it must not be used while other threads encode."""
        if not self._idle:
            self._idle.append(self._new_encoder())
        return self._idle[-1]

    def _borrow(self) -> "_encode.Encoder":
        """An encoder for this call alone; give it back with ``self._idle.append(enc)``."""
        try:
            return self._idle.pop()        # atomic under the GIL
        except IndexError:
            return self._new_encoder()

    def _new_encoder(self) -> "_encode.Encoder":
        return _encode.Encoder(self._table, singles=self._singles)

    def _borrow_warmest(self) -> "_encode.Encoder":
        """The idle encoder whose cache holds the most pieces, borrowed (a new one if none)."""
        idle = list(self._idle)
        if idle:
            best = max(idle, key=lambda e: e.cache_info()["entries"])
            try:
                self._idle.remove(best)     # atomic; another thread may have taken it meanwhile
                return best
            except ValueError:
                pass
        return self._borrow()

    def _warm_encoders(self, n: int) -> None:
        """Leave at least ``n`` encoders idle, each about as warm as the warmest: one whose cache
        holds under half the warmest's entries gets a copy of it (``Encoder.copy_cache_from``), so
        the threads of a batch or of ``encode_corpus`` do not start cold beside a warm one. The
        encoders are borrowed while copied (no other thread uses them)."""
        got = [self._borrow() for _ in range(max(n, 1))]
        try:
            sizes = [e.cache_info()["entries"] for e in got]
            best = max(range(len(got)), key=sizes.__getitem__)
            for k, e in enumerate(got):
                if 2 * sizes[k] < sizes[best]:
                    e.copy_cache_from(got[best])
        finally:
            self._idle.extend(got)
