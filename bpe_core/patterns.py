"""Pre-tokenization patterns and the special-token splitter.

The ``regex`` module is the truth for every pattern: the native scanner (``_pretok``) must give
byte-identical pieces for the named patterns, and any other pattern is run through ``regex``.

>>> resolve_pattern("gpt2") == GPT2_PATTERN
True
>>> split_on_specials(b"a<|endoftext|>b", [b"<|endoftext|>"])
[(b'a', False), (b'<|endoftext|>', True), (b'b', False)]
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

import regex

# GPT-2 (r50k): the pattern of the original release, as in CS336 and minbpe.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# GPT-4 (cl100k_base), as tiktoken ships it.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
# GPT-4o (o200k_base), as tiktoken ships it.
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

PATTERNS = {"gpt2": GPT2_PATTERN, "cl100k": CL100K_PATTERN, "o200k": O200K_PATTERN}
DEFAULT_SPECIAL_TOKEN = "<|endoftext|>"


def resolve_pattern(pattern: str) -> str:
    """Return the regex string for a pattern name (``gpt2``, ``cl100k``, ``o200k``) or a regex.

    >>> resolve_pattern(r"\\w+")
    '\\\\w+'
    """
    if pattern in PATTERNS:
        return PATTERNS[pattern]
    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise ValueError(f"invalid pre-tokenization pattern {pattern!r}: {exc}") from None
    return pattern


def pattern_name(pattern: str) -> str | None:
    """The name of a named pattern given its name or its regex string, else None."""
    if pattern in PATTERNS:
        return pattern
    for name, pat in PATTERNS.items():
        if pat == pattern:
            return name
    return None


def encode_specials(special_tokens: Iterable[str | bytes]) -> list[bytes]:
    """Special tokens as UTF-8 bytes, in the order given, checked (non-empty, no duplicates)."""
    out: list[bytes] = []
    for tok in special_tokens:
        b = tok.encode("utf-8") if isinstance(tok, str) else bytes(tok)
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
