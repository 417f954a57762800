"""The open end of a text that may go on (``encode_iterable``, and blocks encoded with
``final=False``): what is final there. Special-token matches are decided once the longest special
token fits before the end (:meth:`OpenEndMixin._decided_end`); an unfinished UTF-8 character
(:func:`utf8_stable_end`) and the last ``_HOLD_BACK`` pretokens wait for more text
(:meth:`OpenEndMixin._text_ends`).

Part of ``encode.tokenizer`` (``Tokenizer`` takes these methods from :class:`OpenEndMixin`).
"""
from __future__ import annotations

import numpy as np

# Pretokens held back at the open end of a text: everything before them is final (docs/encoding.md).
_HOLD_BACK = 2


class OpenEndMixin:
    """Where the final part of an open-ended text ends, for ``tokenizer.Tokenizer`` (it uses its
    ``_specials_rx``, ``_max_special_len``, ``_pattern_name`` and ``_pretoken_ends``)."""

    def _decided_end(self, data: bytes) -> int:
        """For a buffer whose continuation is unknown: the end of the part whose special-token
        matches are final (a match starting at ``s`` is decided when ``s + longest <= len``).

        The returned end never cuts a decided special token.
        """
        n = len(data)
        if self._specials_rx is None:
            return n
        decided = n - self._max_special_len + 1
        end = max(decided, 0)
        for m in self._specials_rx.finditer(data):
            if m.start() >= decided:
                break
            end = max(end, m.end())
        return end

    def _text_ends(self, buf, s: int, e: int, open_end: bool):
        """Pretoken ends of text ``buf[s:e]`` (no special tokens in it), as absolute offsets.

        Returns ``(ends, resume)``. With ``open_end`` the text may continue after ``e``: an unfinished UTF-8 character and the
        last ``_HOLD_BACK`` pretokens are left out, and ``resume`` is where the next call starts.
        """
        if open_end:
            if self._pattern_name is None:
                return np.zeros(0, dtype=np.int64), s
            e = utf8_stable_end(buf, s, e)
        if e <= s:
            return np.zeros(0, dtype=np.int64), s
        ends = self._pretoken_ends(buf, s, e)
        if open_end:
            keep = len(ends) - _HOLD_BACK
            if keep <= 0:
                return np.zeros(0, dtype=np.int64), s
            return ends[:keep], int(ends[keep - 1])
        return ends, e


def utf8_stable_end(buf, s: int, e: int) -> int:
    """The largest ``c <= e`` such that decoding ``buf[s:c]`` cannot change when bytes follow.

    Only an unfinished but so far valid multi-byte sequence at the very end can change (a following
    continuation byte completes it); it is left out.

    >>> utf8_stable_end(b"a\\xe2\\x82", 0, 3), utf8_stable_end(b"a\\xe2\\x82\\xac", 0, 4)
    (1, 4)
    """
    for k in (1, 2, 3):
        i = e - k
        if i < s:
            return e
        x = buf[i]
        if x < 0x80:
            return e
        if x < 0xC0:
            continue                    # continuation byte: look further back
        if x < 0xC2 or x > 0xF4:
            return e                    # never starts a valid sequence
        need = 2 if x < 0xE0 else 3 if x < 0xF0 else 4
        if k >= need:
            return e                    # complete (or invalid: then final anyway)
        if k >= 2:
            second = buf[i + 1]
            lo, hi = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF),
                      0xF4: (0x80, 0x8F)}.get(x, (0x80, 0xBF))
            if not lo <= second <= hi:
                return e
        return i
    return e
