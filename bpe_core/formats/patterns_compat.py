"""Pre-tokenization patterns for other engines: a ``regex``-syntax pattern rewritten so that HF
``tokenizers`` (Oniguruma, Ruby syntax) or tiktoken (Rust ``fancy-regex``) reads it with the meaning
the ``regex`` module gives it, or refused in one line where no rewrite is known.

Where the engines read the same text differently, and what the rewrite writes instead:

- **possessive quantifiers** ``X*+ X++ X?+`` (Oniguruma and ``fancy-regex`` read them as possessive:
  kept for Oniguruma) and ``X{n,m}+`` (Oniguruma reads "``X{n,m}``, repeated", so ``\\p{N}{1,3}+``
  took any digit run: written ``(?>X{n,m})``, an atomic group, the same thing);
  ``fancy-regex`` gets an atomic group for every possessive quantifier;
- **gaps**: tiktoken drops text its regex does not match, ours keeps each gap as a piece: a custom
  pattern ``X`` goes to tiktoken as ``(?:X)|(?:(?!(?:X))[\\s\\S])+``;
- **anchors**: ``$`` is "end, or before a final newline" in ``regex`` but "end of line" in
  Oniguruma and "end" in Rust: written ``(?=\\n?\\z)``; ``^`` -> ``\\A``; ``regex``'s ``\\Z`` -> ``\\z``;
  under ``(?m)`` ``^`` / ``$`` become ``(?<![^\\n])`` / ``(?=\\n|\\z)``;
- ``.`` -> ``[^\\n]`` (``[\\s\\S]`` under ``(?s)``: Oniguruma spells DOTALL ``(?m)``);
- ``\\w`` (``regex``: Unicode's word class; Oniguruma's takes ``²`` too) ->
  ``[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]``; ``\\b`` / ``\\B`` -> lookarounds on it;
  ``\\d`` -> ``\\p{Nd}``;
- ``(?i)``: Oniguruma folds case in full (``(?i:ss)`` takes ``ß``), ``regex`` one character at a
  time, so each letter is written as the class of the characters ``regex`` takes for it
  (``(?i:'s)`` -> ``'[Ssſ]``) and the flag is dropped;
- capture groups become ``(?:``, character escapes ``\\x{...}``.

Refused (:class:`PatternNotPortable`, one line): a pattern that can match the empty string (``regex``
skips empty matches and keeps the text around them as one piece, HF cuts there), backreferences, recursion, conditionals, ``\\G``,
``\\K``, ``\\X``, fuzzy matching, ``regex``'s other flags (``x``, ``a``, ``V1``, ...), ``\\p{..}`` or a
long range under ``(?i)``, nested sets, a ``{`` that is no repeat count, and whatever the target engine then fails to compile
(:func:`check_compiles`: Oniguruma and ``fancy-regex`` take only fixed-width lookbehind).

Known limit: the engines' Unicode tables differ for characters assigned in recent Unicode versions
(the ``regex`` module may know a letter that Oniguruma does not yet); an export's check on the
user's text (``formats.exactness``) finds such a document.

>>> to_oniguruma(r"\\p{N}{1,3}+| ?\\p{L}++|\\s++$")
'(?>\\\\p{N}{1,3})| ?\\\\p{L}++|\\\\s++(?=\\\\n?\\\\z)'
>>> to_fancy_regex(r"\\p{L}++")      # + the text between matches as pieces (tiktoken drops it)
'(?:(?>\\\\p{L}+))|(?:(?!(?:(?>\\\\p{L}+)))[\\\\s\\\\S])+'
>>> to_oniguruma(r"(a)\\1")
Traceback (most recent call last):
...
bpe_core.formats.patterns_compat.PatternNotPortable: the pattern '(a)\\\\1' has a backreference (\\1), which HF tokenizers cannot read with the same meaning
"""
from __future__ import annotations

import functools
import sys
import unicodedata

__all__ = ["ENGINES", "PatternNotPortable", "check_compiles", "portable_pattern", "to_fancy_regex",
           "to_oniguruma"]

#: target engine -> the name users know it by (for messages)
ENGINES = {"oniguruma": "HF tokenizers", "fancy-regex": "tiktoken"}

#: ``regex``'s ``\\w``, spelt with properties both engines know (inside a character class)
_WORD = r"\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}"
#: the widest range a case-insensitive class may have (each character is written out)
_MAX_FOLDED_RANGE = 512
_CHAR_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07, "e": 0x1B}
_META = set(".^$*+?{}[]\\|()")


class PatternNotPortable(ValueError):
    """The pattern has no known rewrite with the same meaning for the target engine."""


def to_oniguruma(pattern: str) -> str:
    """``pattern`` (``regex`` syntax) as HF ``tokenizers``' ``Split`` reads it with the same meaning.

    Raises:
        PatternNotPortable: no rewrite with the same meaning is known (one line, says why).
    """
    return _Rewriter(pattern, "oniguruma").run()


def to_fancy_regex(pattern: str) -> str:
    """``pattern`` (``regex`` syntax) as tiktoken's ``fancy-regex`` reads it with the same meaning.

    Raises:
        PatternNotPortable: no rewrite with the same meaning is known (one line, says why).
    """
    out = _Rewriter(pattern, "fancy-regex").run()
    from ..pretok.patterns import pattern_name

    if pattern_name(pattern) is None:
        # tiktoken drops the text its regex does not match; ours keeps each gap as one piece: the
        # text up to the next place where a match starts
        out = f"(?:{out})|(?:(?!(?:{out}))[\\s\\S])+"
    return out


def portable_pattern(pattern: str, engine: str) -> str:
    """:func:`to_oniguruma` or :func:`to_fancy_regex` of a pattern given as a name or a regex
    (``pretok.patterns.resolve_pattern``; ``engine``: a key of :data:`ENGINES`), then
    compiled by the engine when it is installed (:func:`check_compiles`). Cached."""
    return _portable(pattern, engine)


@functools.lru_cache(maxsize=64)
def _portable(pattern: str, engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"unknown regex engine {engine!r} (known: {', '.join(ENGINES)})")
    from ..pretok.patterns import resolve_pattern

    try:
        pattern = resolve_pattern(pattern)          # a name: its regex
    except ValueError as exc:
        raise PatternNotPortable(str(exc)) from None
    out = to_oniguruma(pattern) if engine == "oniguruma" else to_fancy_regex(pattern)
    check_compiles(pattern, out, engine)
    return out


def check_compiles(pattern: str, rewritten: str, engine: str) -> None:
    """Compile ``rewritten`` with the engine itself when its package is installed (HF ``tokenizers``
    for Oniguruma, ``tiktoken`` for fancy-regex); ``PatternNotPortable`` naming ``pattern`` when it
    does not compile there (Oniguruma and fancy-regex take only fixed-width lookbehind, say)."""
    try:
        if engine == "oniguruma":
            from tokenizers import Regex

            Regex(rewritten)
        else:
            import tiktoken

            tiktoken.Encoding("check", pat_str=rewritten, special_tokens={},
                              mergeable_ranks={bytes([i]): i for i in range(256)})
    except ImportError:
        return
    except Exception as exc:  # noqa: BLE001  (any failure of the engine means: it cannot read it)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise PatternNotPortable(f"the pattern {pattern!r} does not compile in {ENGINES[engine]} "
                                 f"(as {rewritten!r}: {first})") from None


# ==== Private ====================================================================================


@functools.lru_cache(maxsize=None)
def _fold_table() -> dict[str, str]:
    """char -> a key shared by the characters case folding may equate (candidates only)."""
    table = {}
    for cp in range(sys.maxunicode + 1):
        c = chr(cp)
        low = c.lower()
        if low != c or c.upper() != c or c.casefold() != c:
            table[c] = c.casefold() if len(c.casefold()) == 1 else low
    return table


#: the characters beyond the other case that ``regex``'s ``(?i)`` takes for an ASCII letter (the
#: Kelvin sign and the long s; ``tests/formats/test_patterns_compat.py`` checks the table against
#: :func:`_case_variants_slow`): the named patterns need no scan of the Unicode tables
_ASCII_EXTRA = {"k": "\u212a", "K": "\u212a", "s": "\u017f", "S": "\u017f"}


def _case_variants(c: str) -> str:
    """The characters ``regex``'s ``(?i)`` takes for the literal ``c`` (``c`` first).

    >>> _case_variants("s"), _case_variants("K") == "Kk\\u212a", _case_variants("1")
    ('sSſ', True, '1')
    """
    if c.isascii():
        if not c.isalpha():
            return c
        return c + "".join(sorted(c.swapcase() + _ASCII_EXTRA.get(c, ""), key=ord))
    return _case_variants_slow(c)


@functools.lru_cache(maxsize=None)
def _case_variants_slow(c: str) -> str:
    """:func:`_case_variants` by asking ``regex`` about every candidate (a scan of the Unicode
    tables, once: about 0.3 s).

    >>> _case_variants_slow("s"), _case_variants_slow("é")
    ('sSſ', 'éÉ')
    """
    import regex

    table = _fold_table()
    key = table.get(c, c)
    candidates = {c, c.lower(), c.upper(), c.title(), key}
    candidates |= {x for x, k in _fold_groups().get(key, ())}
    rx = regex.compile("(?i)" + regex.escape(c))
    found = sorted((x for x in candidates if len(x) == 1 and x != c and rx.fullmatch(x)), key=ord)
    return c + "".join(found)


@functools.lru_cache(maxsize=None)
def _fold_groups() -> dict[str, list[tuple[str, str]]]:
    groups: dict[str, list[tuple[str, str]]] = {}
    for x, k in _fold_table().items():
        groups.setdefault(k, []).append((x, k))
        if x.lower() != k:
            groups.setdefault(x.lower(), []).append((x, k))
    return groups


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _hex(cp: int) -> str:
    return _NAMED.get(chr(cp)) or "\\x{%X}" % cp


def _class_char(c: str) -> str:
    """One literal character inside a character class, written so that either engine reads it so."""
    if c in "\\]^-[&" or not c.isprintable() or c.isspace():
        return _hex(ord(c))
    return c


def _literal(c: str) -> str:
    """One literal character outside a class."""
    if c in _META or c in "#/-":
        return "\\" + c if c in _META else c
    if not c.isprintable() or (c.isspace() and c != " "):
        return _hex(ord(c))
    return c


class _Rewriter:
    """One pass over a pattern: tokens of ``regex`` syntax in, the target engine's text out."""

    def __init__(self, pattern: str, engine: str):
        if not isinstance(pattern, str) or not pattern:
            raise PatternNotPortable(f"a pattern must be a non-empty string, got {pattern!r}")
        self.p = pattern
        self.engine = engine
        self.i = 0
        self.out: list[str] = []
        self.flags_stack: list[set[str]] = [set()]

    # -- helpers --------------------------------------------------------------------------------

    def refuse(self, what: str) -> PatternNotPortable:
        return PatternNotPortable(f"the pattern {self.p!r} has {what}, which {ENGINES[self.engine]} "
                                  f"cannot read with the same meaning")

    @property
    def flags(self) -> set[str]:
        return self.flags_stack[-1]

    def peek(self, n: int = 0) -> str:
        j = self.i + n
        return self.p[j] if j < len(self.p) else ""

    # -- the pass -------------------------------------------------------------------------------

    def run(self) -> str:
        import regex

        try:
            regex.compile(self.p)
        except regex.error as exc:
            raise PatternNotPortable(f"the pattern {self.p!r} does not compile: {exc}") from None
        self.leading_flags()
        # one frame per open group: (start in out, pushed flags, a lookaround, the items' "may be
        # empty" of the branch being read, whether an earlier branch may be empty)
        frames: list[list] = [[0, 0, False, [], False]]
        last_atom: int | None = None
        while self.i < len(self.p):
            c = self.p[self.i]
            start = len(self.out)
            items = frames[-1][3]
            if c == "\\":
                items.append(self.p[self.i + 1:self.i + 2] in "bBAZz")    # the assertions may be empty
                self.escape()
                last_atom = start
            elif c == "[":
                self.char_class()
                items.append(False)
                last_atom = start
            elif c == "(":
                lookaround = self.p.startswith(("(?=", "(?!", "(?<=", "(?<!"), self.i)
                opened = self.group_open()
                if opened is None:            # a comment: nothing
                    continue
                frames.append([start, opened, lookaround, [], False])
                last_atom = None
            elif c == ")":
                if len(frames) == 1:
                    raise self.refuse("an unbalanced ')'")
                start, pushed, lookaround, branch, empty = frames.pop()
                if pushed:
                    self.flags_stack.pop()
                frames[-1][3].append(lookaround or empty or all(branch))
                self.out.append(")")
                self.i += 1
                last_atom = start
            elif c == "|":
                frames[-1][4] = frames[-1][4] or all(items)
                frames[-1][3] = []
                self.out.append("|")
                self.i += 1
                last_atom = None
            elif c in "*+?" or c == "{":
                if c == "{" and self.quantifier_at(self.i) is None:
                    raise self.refuse("a '{' that is not a repeat count (regex may read it as fuzzy "
                                      "matching; write \\{ for the character)")
                if last_atom is None or not items:
                    raise self.refuse(f"a quantifier with nothing to repeat at {self.i}")
                if self.quantifier(last_atom) == 0:
                    items[-1] = True
                last_atom = None              # (a second quantifier is refused by regex already)
            elif c == ".":
                self.out.append("[\\s\\S]" if "s" in self.flags else "[^\\n]")
                self.i += 1
                items.append(False)
                last_atom = start
            elif c == "^":
                self.out.append("(?<![^\\n])" if "m" in self.flags else "\\A")
                self.i += 1
                items.append(True)
                last_atom = start
            elif c == "$":
                self.out.append("(?=\\n|\\z)" if "m" in self.flags else "(?=\\n?\\z)")
                self.i += 1
                items.append(True)
                last_atom = start
            else:
                self.literal(c)
                self.i += 1
                items.append(False)
                last_atom = start
        if len(frames) != 1:
            raise self.refuse("an unbalanced '('")
        if frames[0][4] or all(frames[0][3]):
            # regex skips an empty match and keeps the text around it as one piece; HF's Split and
            # tiktoken cut there (or fail): no rewrite keeps both
            raise self.refuse("a branch that can match the empty string")
        return "".join(self.out)

    def leading_flags(self) -> None:
        """Global flags at the start (``(?i)``, ``(?s)``, ``(?m)``): they apply to the whole pattern."""
        while self.p.startswith("(?", self.i):
            j = self.i + 2
            while j < len(self.p) and self.p[j].isalpha():
                j += 1
            if j >= len(self.p) or self.p[j] != ")" or j == self.i + 2:
                return
            self.flags_stack[-1] = self.flags | self.check_flags(self.p[self.i + 2:j])
            self.i = j + 1

    def check_flags(self, letters: str) -> set[str]:
        flags = set(letters)
        bad = flags - {"i", "s", "m", "u"}
        if bad:
            raise self.refuse(f"the flag(s) {''.join(sorted(bad))!r}")
        return flags - {"u"}

    def group_open(self) -> "int | None":
        """Write the opening of a group; return whether it pushed flags (None: a comment, skipped)."""
        p, i = self.p, self.i
        if not p.startswith("(?", i):
            self.out.append("(?:")               # captures mean nothing to a split
            self.i += 1
            return 0
        rest = p[i + 2:]
        for head in (":", ">", "=", "!", "<=", "<!"):
            if rest.startswith(head):
                self.out.append("(?" + head)
                self.i += 2 + len(head)
                return 0
        if rest.startswith("#"):
            end = p.find(")", i)
            self.i = end + 1
            return None
        if rest.startswith(("P<", "<")):
            end = p.find(">", i)
            self.out.append("(?:")
            self.i = end + 1
            return 0
        kind = {"P=": "a backreference", "P>": "a recursion", "R": "a recursion", "(": "a conditional",
                "|": "a branch reset", "&": "a recursion"}
        for head, what in kind.items():
            if rest.startswith(head) or (head == "R" and rest[:1].isdigit()):
                raise self.refuse(what)
        j = i + 2
        while j < len(p) and (p[j].isalpha() or p[j] == "-"):
            j += 1
        if j < len(p) and p[j] in ":)" and j > i + 2:
            on, _, off = p[i + 2:j].partition("-")
            new = (self.flags | self.check_flags(on)) - self.check_flags(off)
            if p[j] == ")":
                raise self.refuse("an inline flag group that is not at the start")
            self.flags_stack.append(new)
            self.out.append("(?:")
            self.i = j + 1
            return 1
        raise self.refuse(f"the group {p[i:i + 4]!r}")

    def quantifier_at(self, j: int) -> "tuple[int, str] | None":
        """A ``{n}``, ``{n,}``, ``{n,m}`` or ``{,m}`` at ``j``: (its end, its text normalized)."""
        end = self.p.find("}", j)
        if end < 0:
            return None
        body = self.p[j + 1:end]
        lo, comma, hi = body.partition(",")
        if not (lo.isdigit() or (comma and not lo)) or (hi and not hi.isdigit()) or (not comma and not lo):
            return None
        if not lo.isascii() or not hi.isascii():
            return None
        return end + 1, "{" + (lo or "0") + (("," + hi) if comma else "") + "}"

    def quantifier(self, atom: int) -> int:
        """Write the quantifier at ``self.i`` for the atom written from ``out[atom]``; returns its
        least count."""
        c = self.p[self.i]
        if c == "{":
            end, text = self.quantifier_at(self.i)
            braces = True
        else:
            end, text, braces = self.i + 1, c, False
        mode = self.p[end] if end < len(self.p) and self.p[end] in "+?" else ""
        self.i = end + len(mode)
        if mode == "+" and (braces or self.engine == "fancy-regex"):
            # possessive = atomic: Oniguruma reads X{n,m}+ as (X{n,m})+; fancy-regex: one form for all
            self.out[atom:] = ["(?>", *self.out[atom:], text, ")"]
        else:
            if mode == "?" and braces and "," not in text:
                mode = ""                     # X{n}? is X{n} (Oniguruma reads it as (X{n})?)
            self.out.append(text + mode)
        return 1 if text == "+" else int(text[1:-1].split(",")[0]) if braces else 0

    def literal(self, c: str) -> None:
        if "i" in self.flags:
            variants = _case_variants(c)
            if len(variants) > 1:
                self.out.append("[" + "".join(_class_char(v) for v in variants) + "]")
                return
        self.out.append(_literal(c))

    # -- escapes -------------------------------------------------------------------------------

    def escape(self, in_class: bool = False) -> None:
        """One escape at ``self.i`` (a backslash), written for the target (inside a class: its
        contents only)."""
        p = self.p
        e = self.peek(1)
        self.i += 2
        if not e:
            raise self.refuse("a trailing backslash")
        if e in "pP":
            name = self.property_name()
            neg = (e == "P") != name.startswith("^")
            name = name.lstrip("^")
            if "i" in self.flags:
                raise self.refuse(f"a property class (\\{e}{{{name}}}) under (?i)")
            if not name.replace("_", "").replace(" ", "").isalnum():
                raise self.refuse(f"the property \\{e}{{{name}}}")
            self.out.append(("\\P{" if neg else "\\p{") + name + "}")
            return
        if e in "dD":
            self.out.append("\\p{Nd}" if e == "d" else "\\P{Nd}")
            return
        if e in "sS":
            self.out.append("\\" + e)
            return
        if e in "wW":
            if e == "w":
                self.out.append(_WORD if in_class else "[" + _WORD + "]")
            else:
                self.out.append("[^" + _WORD + "]")
            return
        if in_class and e in "bB":
            if e == "b":
                self.out.append(_hex(8))
                return
            raise self.refuse("\\B inside a character class")
        if e == "b":
            w = "[" + _WORD + "]"
            self.out.append(f"(?:(?<={w})(?!{w})|(?<!{w})(?={w}))")
            return
        if e == "B":
            w = "[" + _WORD + "]"
            self.out.append(f"(?:(?<={w})(?={w})|(?<!{w})(?!{w}))")
            return
        if e == "A":
            self.out.append("\\A")
            return
        if e in "Zz":
            self.out.append("\\z")
            return
        if e in _CHAR_ESCAPES:
            self.char(chr(_CHAR_ESCAPES[e]), in_class)
            return
        if e == "x":
            if self.peek() == "{":
                end = p.index("}", self.i)
                cp, self.i = int(p[self.i + 1:end], 16), end + 1
            else:
                cp, self.i = int(p[self.i:self.i + 2], 16), self.i + 2
            self.char(chr(cp), in_class)
            return
        if e in "uU":
            n = 4 if e == "u" else 8
            cp, self.i = int(p[self.i:self.i + n], 16), self.i + n
            self.char(chr(cp), in_class)
            return
        if e == "N":
            end = p.index("}", self.i)
            self.char(unicodedata.lookup(p[self.i + 1:end]), in_class)
            self.i = end + 1
            return
        if e == "0":
            j = self.i
            while j < len(p) and j < self.i + 2 and p[j] in "01234567":
                j += 1
            self.char(chr(int("0" + p[self.i:j], 8)), in_class)
            self.i = j
            return
        if e.isdigit():
            raise self.refuse(f"a backreference (\\{e})")
        if e.isalnum():
            raise self.refuse(f"the escape \\{e}")
        self.char(e, in_class)

    def char(self, c: str, in_class: bool) -> None:
        if in_class:
            self.out.append(_class_char(c))
        else:
            self.literal(c)

    def property_name(self) -> str:
        if self.peek() == "{":
            end = self.p.index("}", self.i)
            name, self.i = self.p[self.i + 1:end], end + 1
            return name
        name, self.i = self.p[self.i], self.i + 1
        return name

    # -- character classes ---------------------------------------------------------------------

    def char_class(self) -> None:
        """A ``[...]`` set; under ``(?i)`` each literal (and each char of a short range) is written
        with its case variants."""
        p = self.p
        self.i += 1
        neg = self.peek() == "^"
        if neg:
            self.i += 1
        parts: list[str] = []
        first = True
        folded = "i" in self.flags
        while True:
            if self.i >= len(p):
                raise self.refuse("an unterminated character class")
            c = p[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "[":
                raise self.refuse("a nested set or POSIX class")
            if c in "&~|-" and self.peek(1) == c:
                raise self.refuse(f"a set operation ({c}{c})")
            lo = self.class_item(parts, folded)
            if lo is not None and self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                hi = self.class_atom()
                if hi is None:
                    raise self.refuse("a range to a class escape")
                parts.pop()
                if folded:
                    if ord(hi) - ord(lo) > _MAX_FOLDED_RANGE:
                        raise self.refuse(f"a range of more than {_MAX_FOLDED_RANGE} characters under (?i)")
                    for cp in range(ord(lo), ord(hi) + 1):
                        parts.extend(_class_char(v) for v in _case_variants(chr(cp)))
                else:
                    parts.append(_class_char(lo) + "-" + _class_char(hi))
        self.out.append("[" + ("^" if neg else "") + "".join(parts) + "]")

    def class_atom(self) -> "str | None":
        """The single character at ``self.i`` in a class (consumed), or None for a class escape."""
        c = self.p[self.i]
        if c != "\\":
            self.i += 1
            return c
        mark, n_out = self.i, len(self.out)
        self.escape(in_class=True)
        text = "".join(self.out[n_out:])
        del self.out[n_out:]
        e = self.p[mark + 1]
        if e in "pPdDsSwW":
            self.i = mark
            return None
        if text.startswith("\\x{"):
            return chr(int(text[3:-1], 16))
        return text if len(text) == 1 else None

    def class_item(self, parts: list[str], folded: bool) -> "str | None":
        """Append one item of a class to ``parts``; return its character when it is a single one."""
        mark = self.i
        c = self.class_atom()
        if c is None:                         # a class escape (\p{..}, \d, \s, \w, ...)
            self.i = mark
            n_out = len(self.out)
            self.escape(in_class=True)
            parts.append("".join(self.out[n_out:]))
            del self.out[n_out:]
            return None
        if folded:
            parts.append("".join(_class_char(v) for v in _case_variants(c)))
        else:
            parts.append(_class_char(c))
        return c
