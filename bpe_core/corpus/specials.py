"""Special tokens: document separators, split out before anything else and never merged.

>>> split_on_specials(b"a<|endoftext|>b", [b"<|endoftext|>"])
[(b'a', False), (b'<|endoftext|>', True), (b'b', False)]
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

__all__ = ["DEFAULT_SPECIAL_TOKEN", "encode_specials", "specials_regex", "split_on_specials"]

DEFAULT_SPECIAL_TOKEN = "<|endoftext|>"


def encode_specials(special_tokens: Iterable[str | bytes]) -> list[bytes]:
    """Special tokens as UTF-8 bytes, in the order given, checked (non-empty, no duplicates).

    Each token is a ``str`` or bytes-like; anything else (an int would become that many NUL bytes)
    and a bare string given as the whole list (it would be one token per character) are refused.

    >>> encode_specials(["<s>", b"</s>"])
    [b'<s>', b'</s>']
    >>> encode_specials("<s>")
    Traceback (most recent call last):
    TypeError: special tokens must be a list of strings, got the string '<s>' (write ['<s>'])
    """
    if isinstance(special_tokens, (str, bytes, bytearray)):
        raise TypeError(f"special tokens must be a list of strings, got the string {special_tokens!r} "
                        f"(write [{special_tokens!r}])")
    out: list[bytes] = []
    for tok in special_tokens:
        if isinstance(tok, str):
            b = tok.encode("utf-8")
        elif isinstance(tok, (bytes, bytearray, memoryview)):
            b = bytes(tok)
        else:
            raise TypeError(f"special token {tok!r} is a {type(tok).__name__}, not a str or bytes")
        if not b:
            raise ValueError("special tokens must be non-empty")
        if b in out:
            raise ValueError(f"special token {tok!r} is given twice")
        out.append(b)
    return out


def specials_regex(specials: Sequence[bytes]) -> "re.Pattern[bytes] | None":
    """A bytes regex matching any special token, longest first (so overlaps take the longest)."""
    if not specials:
        return None
    alts = sorted(set(specials), key=lambda s: (-len(s), s))
    return re.compile(b"|".join(re.escape(s) for s in alts))


def split_on_specials(data: bytes, specials: Sequence[bytes]) -> list[tuple[bytes, bool]]:
    """Split ``data`` into ``(piece, is_special)`` parts; empty text parts are dropped.

    Scanning is left to right; at each position the longest special token that matches wins.
    """
    rx = specials_regex(specials)
    if rx is None:
        return [(data, False)] if data else []
    out: list[tuple[bytes, bool]] = []
    pos = 0
    for m in rx.finditer(data):
        if m.start() > pos:
            out.append((data[pos : m.start()], False))
        out.append((m.group(), True))
        pos = m.end()
    if pos < len(data):
        out.append((data[pos:], False))
    return out
