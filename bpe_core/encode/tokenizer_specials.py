"""The special-token policy of ``Tokenizer``: which special tokens a call recognises
(``allowed_special`` / ``disallowed_special``, as tiktoken has them) and the native matcher for
that choice (``_encode.SpecialTable``, built once per subset).

Part of ``encode.tokenizer`` (``Tokenizer`` takes these methods from :class:`SpecialsMixin`).
"""
from __future__ import annotations

from typing import Sequence

import regex

from . import _encode


class SpecialsMixin:
    """The special-token choice of ``tokenizer.Tokenizer`` (it reads ``_special_tokens`` and
    ``_special_table``)."""

    def _select_specials(self, specials: bool, allowed_special, disallowed_special, texts):
        """Which special tokens to recognise: False (none), True (all) or a frozenset of some.

        ``allowed_special`` and ``disallowed_special`` as tiktoken: strings that are not special
        tokens of this tokenizer are ignored in ``allowed_special``; any ``disallowed_special``
        string found in one of ``texts`` raises ``ValueError``.
        """
        if not specials:
            return False
        if not disallowed_special and isinstance(allowed_special, str) and allowed_special == "all":
            return bool(self._special_tokens)           # the default, without building sets
        if allowed_special == "all":
            allowed = set(self._special_tokens)
        elif isinstance(allowed_special, str):
            raise ValueError(f"allowed_special must be 'all' or a set of strings, not {allowed_special!r}")
        else:
            allowed = set(allowed_special) & set(self._special_tokens)
        if disallowed_special == "all":
            disallowed = set(self._special_tokens) - allowed
        elif isinstance(disallowed_special, str):
            raise ValueError(f"disallowed_special must be 'all' or a collection of strings, not {disallowed_special!r}")
        else:
            disallowed = set(disallowed_special)
        if disallowed:
            rx = regex.compile(b"|".join(regex.escape(as_bytes(d)) for d in sorted(disallowed)))
            for text in texts:
                m = rx.search(as_bytes(text))
                if m:
                    token = m.group().decode("utf-8", "surrogateescape")
                    raise ValueError(f"the text holds the disallowed special token {token!r}: allow it "
                                     f"(allowed_special) to encode it as a special token, or leave it "
                                     f"out of disallowed_special to encode it as plain text")
        if len(allowed) == len(self._special_tokens):
            return bool(allowed)
        return frozenset(allowed) if allowed else False

    def _special_table_for(self, specials) -> "_encode.SpecialTable | None":
        """The native matcher for ``_select_specials``'s answer (subsets are built once)."""
        if specials is True:
            return self._special_table
        if not specials:
            return None
        tables = self.__dict__.setdefault("_subset_tables", {})
        table = tables.get(specials)
        if table is None:
            chosen = sorted(specials)
            table = tables[specials] = special_table([s.encode("utf-8") for s in chosen],
                                                      [self._special_tokens[s] for s in chosen])
        return table


def special_table(special_bytes: Sequence[bytes], ids: Sequence[int]) -> "_encode.SpecialTable | None":
    """The native special-token matcher (None when there are no special tokens)."""
    return _encode.SpecialTable(list(special_bytes), list(ids)) if special_bytes else None


def as_bytes(text: str | bytes) -> bytes:
    if isinstance(text, str):
        return text.encode("utf-8", "surrogateescape")
    return bytes(text)
