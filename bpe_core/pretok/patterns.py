"""Pre-tokenization patterns, their names, and gap filling.

The ``regex`` module is the truth for every pattern: the native scanner (``_pretok``) must give
byte-identical pieces for the named patterns, and any other pattern is run through ``regex``.

A pattern is given as a **name** or as a **regex**:

- Names (case-insensitive): ``gpt2`` (aliases ``r50k``, ``r50k_base``, ``p50k``, ``p50k_base``: tiktoken
  uses the GPT-2 split pattern for r50k and p50k), ``cl100k`` (``cl100k_base``), ``o200k``
  (``o200k_base``). The exact regex string of a named pattern (what ``model.json`` stores) counts
  as that name and runs on the native scanner too.
- A string without any regex metacharacter (``.^$*+?{}[]\\|()``), such as ``GPT2`` or ``gpt-4``, is
  always read as a name, so a misspelt name is an error listing the names, never a regex that
  matches only itself. A custom regex therefore has at least one metacharacter (to split on a fixed
  word, write ``(?:word)``); it must compile.

A custom pattern need not cover the text: the text between two matches becomes a pretoken of its
own (as in HF ``tokenizers``' ``Split`` with ``behavior: isolated``), and empty matches are skipped,
so the pretokens always concatenate to the input (``regex_pieces``).

>>> resolve_pattern("gpt2") == resolve_pattern("R50K_BASE") == GPT2_PATTERN
True
>>> pattern_name("cl100k_base"), pattern_name(CL100K_PATTERN), pattern_name(r"\\w+")
('cl100k', 'cl100k', None)
>>> import regex
>>> regex_pieces(b"ab, cd!", regex.compile("[a-z]+"))
[b'ab', b', ', b'cd', b'!']
"""
from __future__ import annotations

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
#: Every accepted name (lowercase) -> its canonical name. tiktoken's r50k_base and p50k_base use the
#: GPT-2 split pattern (written with possessive quantifiers there; the same pieces).
PATTERN_ALIASES = {
    "gpt2": "gpt2", "r50k": "gpt2", "r50k_base": "gpt2", "p50k": "gpt2", "p50k_base": "gpt2",
    "cl100k": "cl100k", "cl100k_base": "cl100k",
    "o200k": "o200k", "o200k_base": "o200k",
}
_METACHARACTERS = frozenset(".^$*+?{}[]\\|()")
_BY_REGEX = {pat: name for name, pat in PATTERNS.items()}


def pattern_names() -> str:
    """The accepted names, for messages.

    >>> pattern_names()
    'gpt2 (r50k, r50k_base, p50k, p50k_base), cl100k (cl100k_base), o200k (o200k_base)'
    """
    parts = []
    for name in PATTERNS:
        aliases = [a for a, n in PATTERN_ALIASES.items() if n == name and a != name]
        parts.append(f"{name} ({', '.join(aliases)})" if aliases else name)
    return ", ".join(parts)


def is_pattern_name(pattern: str) -> bool:
    """Whether ``pattern`` is read as a name: it has no regex metacharacter.

    >>> is_pattern_name("GPT2"), is_pattern_name("gpt-4"), is_pattern_name(r"\\w+")
    (True, True, False)
    """
    return not any(c in _METACHARACTERS for c in pattern)


def pattern_name(pattern: str) -> str | None:
    """The canonical name of a named pattern given by any of its names (any case) or by its exact
    regex string; None for a custom regex or an unknown name.

    >>> pattern_name("O200K_Base"), pattern_name(GPT2_PATTERN), pattern_name("gpt3")
    ('o200k', 'gpt2', None)
    """
    if not isinstance(pattern, str):
        return None
    name = PATTERN_ALIASES.get(pattern.lower())
    return name if name is not None else _BY_REGEX.get(pattern)


def resolve_pattern(pattern: str) -> str:
    """The regex string of a pattern: a name (see the module docstring) or a custom regex.

    Raises:
        ValueError: an unknown name (the message lists the names), a regex that does not compile,
            or a pattern that is not a non-empty string.

    >>> resolve_pattern("O200K") == O200K_PATTERN
    True
    >>> resolve_pattern(r"\\w+")
    '\\\\w+'
    >>> resolve_pattern("GPT-2")
    Traceback (most recent call last):
    ...
    ValueError: unknown pre-tokenization pattern name 'GPT-2'; the names are gpt2 (r50k, r50k_base, p50k, p50k_base), cl100k (cl100k_base), o200k (o200k_base); a custom regex needs at least one regex metacharacter
    """
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"a pre-tokenization pattern must be a non-empty string, got {pattern!r}")
    name = pattern_name(pattern)
    if name is not None:
        return PATTERNS[name]
    if is_pattern_name(pattern):
        raise ValueError(f"unknown pre-tokenization pattern name {pattern!r}; the names are "
                         f"{pattern_names()}; a custom regex needs at least one regex metacharacter")
    import regex                # (a custom regex only: the named patterns never need the module)

    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise ValueError(f"invalid pre-tokenization regex {pattern!r}: {exc}") from None
    return pattern


def regex_pieces(data: bytes, rx: "regex.Pattern") -> list[bytes]:
    """The pretokens of one text piece (no special tokens in it) under a compiled ``regex``.

    ``data`` is decoded with ``surrogateescape`` (invalid UTF-8 is kept byte for byte), and the
    pieces are the non-empty matches of ``rx.finditer`` plus, as pretokens of their own, the texts
    between them (before the first, between two, after the last); empty matches are skipped. The
    pieces always concatenate to ``data``. For the named patterns, which cover every text, they are
    exactly the matches. This is the one regex pre-tokenizer of the package (training, encoding,
    ``pretokenize``); ``reference.pretokenize`` is its plain twin.

    >>> import regex
    >>> regex_pieces(b"axxbx", regex.compile("x*"))
    [b'a', b'xx', b'b', b'x']
    >>> regex_pieces(b"caf\\xe9 au lait", regex.compile(r"\\s+"))
    [b'caf\\xe9', b' ', b'au', b' ', b'lait']
    """
    text = data.decode("utf-8", "surrogateescape")
    out: list[str] = []
    pos = 0
    for m in rx.finditer(text):
        a, b = m.span()
        if a == b:
            continue
        if a > pos:
            out.append(text[pos:a])
        out.append(text[a:b])
        pos = b
    if pos < len(text):
        out.append(text[pos:])
    return [p.encode("utf-8", "surrogateescape") for p in out]
