"""The native list API (``pretokenize`` -> ``_pretok.split_pieces``) equals ``regex`` piece for piece.

``split_pieces`` shares short ``bytes`` objects through a per-call cache (two-way buckets keyed by
the zero-padded first 16 bytes and the length), writes its items straight into the list's array
(grown past an estimate of n/4 + k items when needed) and ``find_special`` finds one special token
with ``memchr`` + ``memcmp``. Each of these is checked here against the plain truth on input built
to stress it: colliding and evicted cache entries, pieces equal but for trailing NUL bytes, invalid
UTF-8, special tokens at the edges and back to back, lists longer than the estimate.
"""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.corpus.specials import encode_specials, split_on_specials
from bpe_core.pretok import _pretok
from bpe_core.pretok.patterns import PATTERNS, regex_pieces
from bpe_core.pretok.pretokenize import _special_spans, pretokenize

NAMES = list(PATTERNS)  # gpt2, cl100k, o200k
MAX_EXAMPLES = int(os.environ.get("BPE_CORE_MAX_EXAMPLES", "200"))
COMPILED = {name: regex.compile(pattern) for name, pattern in PATTERNS.items()}


def truth(data: bytes, name: str, specials=()) -> list[bytes]:
    """split_on_specials, then regex on each text part: the plain twin of the list API."""
    out: list[bytes] = []
    for piece, is_special in split_on_specials(data, encode_specials(specials)):
        out += [piece] if is_special else regex_pieces(piece, COMPILED[name])
    return out


def find_loop(data: bytes, token: bytes) -> list[list[int]]:
    """The bytes.find loop that find_special replaces."""
    spans, pos = [], data.find(token)
    while pos >= 0:
        spans.append([pos, pos + len(token)])
        pos = data.find(token, pos + len(token))
    return spans


# Short units whose pieces collide in a small cache, differ only by trailing NULs (equal zero-padded
# heads, other lengths), cross the 8- and 16-byte head words, or are invalid UTF-8.
_UNITS = [b"a", b"ab", b" a", b" ab", b"!", b"!\x00", b"!\x00\x00", b"\x00", b"\x00\x00", b" ",
          b"  ", b"\n", b"1", b"123", b"'s", b"\xff", b"\xc3", b"\xc3\xa9", b"\xe2\x82", b"<|e|>",
          b"abcdefgh", b"abcdefghi", b" abcdefghijklmno", b" abcdefghijklmnop", b"x" * 17, b"\t "]


@settings(max_examples=MAX_EXAMPLES)
@given(st.lists(st.sampled_from(_UNITS), min_size=1, max_size=40), st.integers(1, 60),
       st.sampled_from(NAMES))
def test_repeated_units_equal_regex(units, repeat, name):
    """A few units repeated: every piece recurs, so most come from the cache (both ways, evictions)."""
    data = b"".join(units) * repeat
    assert pretokenize(data, name) == truth(data, name)


@settings(max_examples=MAX_EXAMPLES)
@given(st.binary(max_size=300), st.sampled_from(NAMES))
def test_binary_with_specials_equals_regex(data, name):
    """Any bytes (invalid UTF-8 kept byte for byte), a special token spliced in at both edges and
    in the middle, back to back."""
    tok = b"<|endoftext|>"
    text = tok + data[: len(data) // 2] + tok + tok + data[len(data) // 2:] + tok
    got = pretokenize(text, name, [tok])
    assert got == truth(text, name, [tok])
    assert b"".join(got) == text


def test_same_head_other_length():
    """``c``, ``c\\0``, ``c\\0\\0``, ...: sixteen pieces with one zero-padded head, in a small input
    (a cache of 32 buckets), so some share a bucket and only their lengths tell them apart."""
    rng = random.Random(7)
    for c in b"!#$%&()*+,-./:;<=>?@[]^_`{|}~":
        units = [bytes([c]) + b"\x00" * k + b"a" for k in range(16)]
        data = b"".join(rng.sample(units, len(units)) + rng.sample(units, len(units)) + units)
        for name in NAMES:
            assert pretokenize(data, name) == truth(data, name), (name, chr(c))


def test_many_distinct_words_collide_and_evict():
    """~20k distinct short words in a cache of far fewer buckets, then again in another order:
    entries are evicted, refilled and hit in both ways; long words bypass the cache."""
    rng = random.Random(16)
    words = [" " + "".join(rng.choice("abcdefghij\x00") for _ in range(rng.randint(1, 18)))
             for _ in range(20000)]
    data = "".join(words + words[::-3] + words[:500] * 4).encode("utf-8")
    for name in NAMES:
        got = pretokenize(data, name)
        assert got == truth(data, name), name
        assert all(type(p) is bytes for p in got)


def test_list_longer_than_the_estimate():
    """One-byte pieces: more items than the n/4 estimate, so the item array grows (several times),
    with special tokens between; one huge piece: the estimate is given back."""
    data = (b"a!" * 30000 + b"<s>") * 3 + b"\xff" * 5000
    for name in NAMES:
        got = pretokenize(data, name, ["<s>"])
        assert got == truth(data, name, ["<s>"]), name
        assert len(got) > len(data) // 4
    long_word = b"x" * 100000
    assert pretokenize(long_word) == [long_word]
    got = pretokenize(b" " + long_word + b"\n")
    plain = [b" " + long_word, b"\n"]
    assert got == plain
    for lst in (got, plain):  # the adopted item array behaves as any list's
        lst.append(b"y")
        lst.extend([b"z"] * 1000)
        del lst[1:900]
        lst.insert(0, b"w")
    assert got == plain and len(got) == 105


def test_result_list_is_independent():
    """Shared pieces are immutable bytes; mutating one result list does not touch another."""
    a = pretokenize(b"the cat the cat")
    b = pretokenize(b"the cat the cat")
    a[0] = b"X"
    assert b == [b"the", b" cat", b" the", b" cat"]


@settings(max_examples=MAX_EXAMPLES)
@given(st.binary(max_size=200), st.sampled_from([b"a", b"aa", b"aba", b"<|endoftext|>", b"\x00",
                                                 b"\xff\xfe"]))
def test_find_special_equals_find_loop(data, token):
    """Self-overlapping tokens (aa in aaa), tokens at the edges, none at all."""
    for text in (data, token + data + token, data.replace(b"b", token)):
        assert _pretok.find_special(text, token).tolist() == find_loop(text, token)
        assert _special_spans(text, [token]).tolist() == find_loop(text, token)


def test_find_special_many_hits_and_shapes():
    """More hits than the first block of 256 starts; empty buffer; a token longer than the buffer."""
    text = b"<s>x" * 1000 + b"<s"
    spans = _pretok.find_special(text, b"<s>")
    assert spans.dtype == np.int64 and spans.shape == (1000, 2)
    assert spans.tolist() == find_loop(text, b"<s>")
    assert _pretok.find_special(b"", b"<s>").shape == (0, 2)
    assert _pretok.find_special(b"<s", b"<s>").shape == (0, 2)
    assert _pretok.find_special(b"aaaa", b"aa").tolist() == [[0, 2], [2, 4]]


@pytest.mark.parametrize("specials", [[5], ["<s>", 3], "<s>", b"<s>", [None]])
def test_special_tokens_of_the_wrong_type_are_refused(specials):
    """An int is not five NUL bytes, and a bare string is not one token per character."""
    from bpe_core.pretok.pretokenize import pretokenize
    with pytest.raises(TypeError, match="special token"):
        pretokenize(b"ab\x00\x00\x00\x00\x00c<s>", "gpt2", specials)
