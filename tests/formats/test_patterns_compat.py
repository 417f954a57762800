"""Patterns for other engines (``formats.patterns_compat``): HF ``tokenizers``' pre-tokenizer, as
our exported ``tokenizer.json`` wires it (``Split`` isolated + ``ByteLevel``), and tiktoken's regex
give exactly ``pretokenize``'s pieces, for the named patterns and generated custom ones, on
adversarial text; patterns without a known rewrite are refused in one line."""
from __future__ import annotations

import functools
import json
import unicodedata

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bpe_core.formats.hf import hf_tokenizer_json
from bpe_core.formats.model import Model, gpt2_to_token
from bpe_core.formats.patterns_compat import (PatternNotPortable, portable_pattern, to_fancy_regex,
                                              to_oniguruma)
from bpe_core.pretok.patterns import PATTERNS, resolve_pattern
from bpe_core.pretok.pretokenize import pretokenize

tokenizers = pytest.importorskip("tokenizers")
tiktoken = pytest.importorskip("tiktoken")

#: two custom patterns in the issue's style (possessive, atomic, {n,m}+, anchors, \w, (?i))
CUSTOM = {
    "possessive": r"\p{L}++| ?\p{N}{1,2}+|[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s",
    "atomic": r"(?i:'(?:s|t|ll|ve|re|d|m))|(?>\w+)|\d{2,4}?|\s*\n|[^\w\s]+|\s+",
}
ALL_PATTERNS = {**{name: resolve_pattern(name) for name in PATTERNS}, **CUSTOM}


def _stable(c: str) -> bool:
    """A character both engines' Unicode tables classify alike: assigned in this Python's
    ``unicodedata`` (characters of later Unicode versions are a known limit: the module docstring
    of ``formats.patterns_compat``)."""
    return unicodedata.category(c) != "Cn"


# Adversarial pieces: digit runs of every length (several scripts), contractions in all cases,
# whitespace runs of every kind, mixed scripts, emoji (with joiners and modifiers), combining
# marks, U+FFFD (what invalid UTF-8 becomes in a str), line ends, case-folding traps (ſ, K, ß).
PIECES = st.one_of(
    st.integers(1, 12).flatmap(lambda n: st.text(st.sampled_from("0123456789٣٤໑１"), min_size=n, max_size=n)),
    st.sampled_from(["'s", "'S", "'ll", "'LL", "'Ve", "'re", "'d", "'M", "'t", "'ſ", "'K", "'ß", "'", "''"]),
    st.lists(st.sampled_from([" ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c", "\x85"]),
             min_size=1, max_size=6).map("".join),
    st.sampled_from(["Hello", "WORLD", "héllo", "naïve", "Straße", "добрый", "日本語", "한국어", "مرحبا",
                     "שלום", "ไทย", "हिन्दी", "ΣΊΣΥΦΟΣ", "ǅemal", "ﬁne", "KELVIN", "ſtraße", "x²", "½", "_",
                     "e\u0301", "\u0301\u0302", "👍🏽", "👨\u200d👩\u200d👧", "🇩🇪", "\ufffd", "\ufffd\ufffd",
                     "?!", "...", "--", "/*", "$", "#", "http://x.y/z", "{1,3}", "\\", "a_b"]),
    st.characters(blacklist_categories=("Cs", "Cn")),
)
ADVERSARIAL = st.lists(PIECES, max_size=24).map("".join)


@functools.lru_cache(maxsize=None)
def hf_pre_tokenizer(pattern: str):
    """The pre-tokenizer of our exported ``tokenizer.json`` for a model with this pattern."""
    model = Model(vocab={i: bytes([i]) for i in range(256)}, merges=[], special_tokens=[], pattern=pattern)
    return tokenizers.Tokenizer.from_str(json.dumps(hf_tokenizer_json(model))).pre_tokenizer


def hf_pieces(pattern: str, text: str) -> list[bytes]:
    pieces = hf_pre_tokenizer(pattern).pre_tokenize_str(text)
    return [gpt2_to_token(p) for p, _ in pieces]


def tiktoken_pieces(pattern: str, text: str) -> list[bytes]:
    """tiktoken's pieces of ``text``: every substring of the text is a token of its own, so each
    piece of tiktoken's regex is encoded as one token, and the tokens are the pieces."""
    data = text.encode("utf-8")
    ranks = {bytes([i]): i for i in range(256)}
    for a in range(len(data)):
        for b in range(a + 2, len(data) + 1):
            ranks.setdefault(data[a:b], len(ranks))
    enc = tiktoken.Encoding("pieces", pat_str=portable_pattern(pattern, "fancy-regex"),
                            mergeable_ranks=ranks, special_tokens={})
    return [enc.decode_single_token_bytes(t) for t in enc.encode_ordinary(text)]


@pytest.mark.parametrize("name", sorted(ALL_PATTERNS))
@settings(max_examples=150)
@given(text=ADVERSARIAL)
def test_hf_split_gives_our_pieces(name, text):
    assume(all(map(_stable, text)))
    pattern = ALL_PATTERNS[name]
    assert hf_pieces(pattern, text) == pretokenize(text.encode("utf-8"), pattern)


@pytest.mark.parametrize("name", sorted(ALL_PATTERNS))
@settings(max_examples=60)
@given(text=st.lists(PIECES, max_size=8).map("".join))
def test_tiktoken_regex_gives_our_pieces(name, text):
    assume(all(map(_stable, text)) and len(text.encode("utf-8")) <= 120)
    pattern = ALL_PATTERNS[name]
    assert tiktoken_pieces(pattern, text) == pretokenize(text.encode("utf-8"), pattern)


@pytest.mark.parametrize("text", ["1234567", "12345678901", "x 1234 'LL\n\n  end  \n", "a  \nb  \n"])
@pytest.mark.parametrize("name", sorted(ALL_PATTERNS))
def test_fixed_cases(name, text):
    """The cases the issue names (digit runs of 4+ under cl100k, trailing whitespace), every run."""
    pattern = ALL_PATTERNS[name]
    ours = pretokenize(text.encode("utf-8"), pattern)
    assert hf_pieces(pattern, text) == ours
    assert tiktoken_pieces(pattern, text) == ours


def test_the_untranslated_pattern_would_differ():
    """The property tests can fail: the cl100k pattern as written reads otherwise in Oniguruma."""
    from tokenizers import Regex, pre_tokenizers

    raw = pre_tokenizers.Split(Regex(resolve_pattern("cl100k")), "isolated").pre_tokenize_str("1234567")
    assert [p for p, _ in raw] == ["1234567"]
    assert hf_pieces("cl100k", "1234567") == [b"123", b"456", b"7"]


# ==== generated custom patterns ==================================================================

ATOMS = st.sampled_from([r"\p{L}", r"\p{N}", r"\p{Lu}", r"\p{Ll}", r"[^\s\p{L}\p{N}]", r"\s", r"\S", r"\d", r"\w",
                         r"\W", r"[a-f]", r"[^\r\n]", r"'", r"[.,!?]", " ", r"\n", "x", r"\.", "."])
QUANTS = st.sampled_from(["", "*", "+", "?", "*+", "++", "?+", "{1,3}", "{1,3}+", "{2}", "{2}+", "{0,2}+", "*?",
                          "{1,2}?", "{3}?"])
PIECE = st.one_of(
    st.tuples(ATOMS, QUANTS).map("".join),
    st.tuples(st.sampled_from(["(?>", "(?:", "(", "(?i:"]), ATOMS, QUANTS, st.sampled_from([")", ")+", ")?+"]),
              QUANTS.filter(lambda q: q in ("", "?"))).map(lambda t: t[0] + t[1] + t[2] + t[3]),
    st.sampled_from([r"(?!\S)", r"$", r"^", r"\b", r"\B", r"(?=\p{N})", r"(?<=\s)", r"\Z", r"\A"]),
)
BRANCH = st.lists(PIECE, min_size=1, max_size=4).map("".join)
GENERATED = st.lists(BRANCH, min_size=1, max_size=4).map("|".join)


def _ours(pattern: str, text: str) -> list[bytes]:
    return pretokenize(text.encode("utf-8"), pattern)


@settings(max_examples=200)
@given(pattern=GENERATED, text=ADVERSARIAL)
def test_generated_patterns_hf(pattern, text):
    """A generated pattern either compiles nowhere, is refused in one line, or gives our pieces."""
    assume(all(map(_stable, text)))
    try:
        resolve_pattern(pattern)
    except ValueError:
        return
    try:
        portable_pattern(pattern, "oniguruma")
    except PatternNotPortable as exc:
        assert "\n" not in str(exc)
        return
    assert hf_pieces(pattern, text) == _ours(pattern, text)


@settings(max_examples=60)
@given(pattern=GENERATED, text=st.lists(PIECES, max_size=6).map("".join))
def test_generated_patterns_tiktoken(pattern, text):
    assume(all(map(_stable, text)) and len(text.encode("utf-8")) <= 100)
    try:
        resolve_pattern(pattern)
        portable_pattern(pattern, "fancy-regex")
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    assert tiktoken_pieces(pattern, text) == _ours(pattern, text)


# ==== rewrites and refusals ======================================================================


def test_rewritten_named_patterns():
    """The rewrites of the named patterns (recorded in the report of the export work)."""
    cl100k = to_oniguruma(resolve_pattern("cl100k"))
    assert r"(?>\p{N}{1,3})" in cl100k and r"\s++(?=\n?\z)" in cl100k and "(?i" not in cl100k
    assert to_oniguruma(resolve_pattern("gpt2")) == resolve_pattern("gpt2")
    assert "(?i" not in to_oniguruma(resolve_pattern("o200k"))
    assert to_fancy_regex(r"\p{N}{1,3}+| ?\p{L}++").startswith(r"(?:(?>\p{N}{1,3})| ?(?>\p{L}+))|")


@pytest.mark.parametrize("pattern, what", [
    (r"(a)\1", "backreference"),
    (r"(?x) a b", "flag"),
    (r"(?<n>a)(?P=n)", "backreference"),
    (r"a(?R)?b", "recursion"),
    (r"\X", "escape"),
    (r"\Gx", "escape"),
    (r"(?i:\p{Lu})", "property"),
    (r"[[:alpha:]]", "nested set"),
    (r"(?:ab){e<=1}", "repeat count"),
    (r"x*", "empty string"),
    (r"\p{L}|\p{N}*|(?=a)", "empty string"),
    (r"(?<=\s)\b", "empty string"),
])
@pytest.mark.parametrize("engine", ["oniguruma", "fancy-regex"])
def test_refused_in_one_line(pattern, what, engine):
    with pytest.raises(PatternNotPortable) as info:
        portable_pattern(pattern, engine)
    msg = str(info.value)
    assert "\n" not in msg and repr(pattern) in msg
    assert what in msg


def test_ascii_case_table():
    """The fast table of ASCII case variants is what ``regex`` itself takes under (?i)."""
    from bpe_core.formats.patterns_compat import _case_variants, _case_variants_slow

    for cp in range(128):
        c = chr(cp)
        assert sorted(_case_variants(c)) == sorted(_case_variants_slow(c)), c
