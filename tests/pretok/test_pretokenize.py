"""The native pre-tokenizer is byte-identical to ``regex`` on everything we can think of.

The truth: ``regex.finditer(pattern, data.decode("utf-8", "surrogateescape"))``, each piece encoded
back with ``surrogateescape``. Every test compares against that, never against hand-written
expectations alone (the few literal cases below are the issue's traps, checked both ways).
"""
from __future__ import annotations

from paths import REPO
import importlib.util
import lzma
import os
import pathlib
import sys
from collections import Counter

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.pretok import _pretok
from bpe_core.pretok.patterns import PATTERNS
from bpe_core.pretok.pretokenize import (count_pretokens, is_native, merge_counts, pretoken_ends,
                                  pretokenize)

ROOT = REPO
CORPORA = ROOT.parent / "shared" / "corpora"
NAMES = list(PATTERNS)  # gpt2, cl100k, o200k
MAX_EXAMPLES = int(os.environ.get("BPE_CORE_MAX_EXAMPLES", "200"))
USER_PATTERN = r"""\p{L}+|\p{N}|[^\s\p{L}\p{N}]+|\s+"""


# ==== Helpers =====================================================================================


def regex_pieces(data: bytes, pattern: str) -> list[bytes]:
    """The truth, one bytes object per piece."""
    text = data.decode("utf-8", "surrogateescape")
    return [m.group().encode("utf-8", "surrogateescape") for m in regex.finditer(pattern, text)]


def regex_ends(data: bytes, pattern: str) -> np.ndarray:
    """The truth as byte end offsets, computed without a bytes object per piece (fast on MBs)."""
    text = data.decode("utf-8", "surrogateescape")
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    width = np.where(cps < 0x80, 1, np.where(cps < 0x800, 2, np.where(cps < 0x10000, 3, 4)))
    width[(cps >= 0xDC80) & (cps <= 0xDCFF)] = 1  # surrogateescape: one byte each
    cum = np.zeros(len(cps) + 1, dtype=np.int64)
    np.cumsum(width, out=cum[1:])
    # findall == [m.group() for m in finditer] (the patterns have no capturing groups), in C.
    char_ends = np.cumsum(np.fromiter(map(len, regex.findall(pattern, text)), dtype=np.int64))
    return cum[char_ends]


def native_pieces(data: bytes, name: str) -> list[bytes]:
    ends = _pretok.split_ends(data, _pretok.PATTERN_IDS[name]).tolist()
    return [data[a:b] for a, b in zip([0] + ends[:-1], ends)]


def assert_same_ends(data: bytes, name: str) -> None:
    """Native ends == regex ends; on failure, show the first differing pieces."""
    want = regex_ends(data, PATTERNS[name])
    got = _pretok.split_ends(data, _pretok.PATTERN_IDS[name])
    if len(want) == len(got) and np.array_equal(want, got):
        return
    m = min(len(want), len(got))
    k = int(np.argmax(want[:m] != got[:m])) if m and (want[:m] != got[:m]).any() else m
    lo = int(want[k - 2]) if k >= 2 else 0
    raise AssertionError(
        f"{name}: first difference at pretoken {k} (byte {lo}): regex "
        f"{regex_pieces(data[lo:lo + 60], PATTERNS[name])[:4]} vs native "
        f"{native_pieces(data[lo:lo + 60], name)[:4]}; context {data[lo:lo + 40]!r}")


def table_dict(table) -> dict[bytes, int]:
    arena, offsets, counts = table
    assert arena.dtype == np.uint8 and offsets.dtype == np.int64 and counts.dtype == np.int64
    assert len(offsets) == len(counts) + 1 and offsets[0] == 0 and offsets[-1] == len(arena)
    words = [arena[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(counts))]
    assert words == sorted(set(words)), "words must be unique and in bytes order"
    return dict(zip(words, counts.tolist()))


def as_table(counter: Counter) -> tuple:
    words = sorted(counter)
    offsets = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum([len(w) for w in words], out=offsets[1:])
    arena = np.frombuffer(b"".join(words), dtype=np.uint8)
    return arena, offsets, np.array([counter[w] for w in words], dtype=np.int64)


# ==== The Unicode tables ==========================================================================


def test_unicode_tables_regenerate_identically():
    """scripts/gen_unicode_tables.py, run in memory on the installed regex, gives the committed header."""
    spec = importlib.util.spec_from_file_location("gen_unicode_tables",
                                                  ROOT / "scripts" / "gen_unicode_tables.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    committed = (ROOT / "bpe_core" / "pretok" / "_unicode_tables.h").read_text(encoding="ascii")
    fresh = gen.generate()
    # The regex version named in the header may differ inside the supported range; the data may not.
    strip = lambda text: regex.sub(r"regex [0-9.]+ |\"[0-9.]+\"\n", "", text)  # noqa: E731
    assert strip(fresh) == strip(committed), (
        f"regex {regex.__version__} gives other Unicode tables than the committed ones "
        f"(from regex {_pretok.TABLES_REGEX_VERSION}); supported: {gen.REGEX_VERSION_RANGE}. "
        "Regenerate with scripts/gen_unicode_tables.py and re-run these tests.")
    assert _pretok.TABLES_DIGEST in committed


# ==== Every code point, every byte =================================================================


@pytest.fixture(scope="module")
def every_code_point() -> bytes:
    """Every scalar value, alone and between letters, spaces, digits and itself."""
    parts = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        parts.append(f"a{c}{c} {c}1")
    return "".join(parts).encode("utf-8")


@pytest.mark.parametrize("name", NAMES)
def test_every_code_point(every_code_point, name):
    assert_same_ends(every_code_point, name)


def _invalid_utf8_samples() -> bytes:
    out = bytearray()
    for lead in range(0x80, 0x100):  # every non-ASCII byte with every second byte
        for second in range(0x100):
            out += b"a" + bytes([lead, second]) + b" x\n"
    for lead in (0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5):
        for second in range(0x70, 0xD0):
            for tail in (b"\x41", b"\x80", b"\x9f\xbf", b"\xa0\x80", b"\xbf\xbf", b"\xc0", b"\x80\x80\x80"):
                out += b" " + bytes([lead, second]) + tail + b"'s"
    return bytes(out)


@pytest.mark.parametrize("name", NAMES)
def test_invalid_utf8(name):
    """Overlongs, encoded surrogates, > U+10FFFF, truncated and lone bytes: one surrogate each."""
    assert_same_ends(_invalid_utf8_samples(), name)
    for lead in range(0x80, 0x100):  # a truncated sequence at the very end of the text
        for data in (bytes([lead]), b"ab" + bytes([lead]), b"a " + bytes([lead, 0x80]),
                     bytes([lead, 0x80, 0x80]) + b"  "):
            assert native_pieces(data, name) == regex_pieces(data, PATTERNS[name]), data


# ==== The traps ============================================================================

TRAPS = [
    "a  b", "a\n\nb", "a   b", "a \tb", "a\t b", "a \n b", "a\r\nb", "a\n\r\nb", "  ", " ", "\n",
    "a  ", "a \n", "a\n ", "a\n  \n", " \n \n ", "x\r\n\r\n", "!\n/\n", " !!\r\n", "x/\n//",
    "I'M", "I'm", "you'LL", "you'll", "it'S", "we'Ve", "they'RE", "I'D", "'s", "'", "''s", "'ſ",
    "'Ss", "don't", "'''", "' s", "a's's", "O'Neil's", "x'll've're", "'\u212a", "l'\u017ft",
    "HELLOworld's", "HELLO'S", "ǅungla", "ǅ'LL", "AあB", "あAAAA", "ABC'S", "aBC", "Ab", "AB'd",
    "a\u0301b", "\u0301", " \u0301\u0301x", "!\u0301a", "\u0301A", "A\u0301\u0301", "ß'S",
    "12345", " 123", "1234567 89", "a1b2", "٣٤٥٦", "Ⅻ", "x²³⁴⁵",
    "\x00\x00a", "\ufeffhello", "\ufeff\ufeff", "a\u00a0b", "a\u00a0\u00a0b", "\u3000\u3000x",
    "a\u2028b", "\x1c\x1d\x1e\x1f", "a\x0b\x0cb", "\x85x", "\u200b\u200bx", "\U000e0001x",
    "\U0010ffff\U0010ffffa", "\uffff\ufffe", "\U000f0000", "\u0378\u0379 x",
    "日本語のテキスト。", "한국어 텍스트", "ภาษาไทย", "हिन्दी", "عربي ١٢٣", "Ελληνικά", "Русский",
    "😀😀 😀a", "👍🏽x", "a\u200db",
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text", TRAPS)
def test_trap(name, text):
    data = text.encode("utf-8")
    assert native_pieces(data, name) == regex_pieces(data, PATTERNS[name])
    assert pretokenize(data, name) == regex_pieces(data, PATTERNS[name])


def test_traps_literal():
    """The issue's examples, spelled out."""
    assert pretokenize("a  b") == [b"a", b" ", b" b"]
    assert pretokenize("a\n\nb") == [b"a", b"\n", b"\n", b"b"]
    assert pretokenize("a  ") == [b"a", b"  "]  # trailing whitespace is taken whole
    assert pretokenize("I'M") == [b"I", b"'", b"M"]  # GPT-2: contractions are case-sensitive
    assert pretokenize("I'M", "cl100k") == [b"I", b"'M"]
    assert pretokenize("I'M", "o200k") == [b"I'M"]
    assert pretokenize("\u0378\u0379", "gpt2") == ["\u0378\u0379".encode()]  # unassigned: one run
    assert pretokenize(b"a\xff\xfeb") == [b"a", b"\xff\xfe", b"b"]


# ==== Property tests ===============================================================================

_ALPHABET = st.sampled_from(
    list("aAbBzZsSdDmMtTlLvVrReEkK") + list("0123456789") + list(" \t\n\r\x0b\x0c")
    + ["\r\n", "\u00a0", "\u3000", "\u2028", "\x85", "\x00", "\ufeff", "\u200b"]
    + list("'’`\"!?.,;:-_/\\()[]{}<>@#$%^&*+=|~") + ["''", "'s", "'S", "'ll", "'LL", "'Ve", "'rE"]
    + ["é", "É", "ß", "ſ", "\u212a", "ǅ", "ǆ", "ʰ", "ｱ", "я", "Я", "日", "本", "한", "ก", "ि", "ع"]
    + ["\u0301", "\u0308", "\u093f", "\u0e31", "\u20dd"]  # marks (Mn, Mc, Me)
    + ["٣", "²", "Ⅻ", "½", "𝟙"]  # digits and other numbers
    + ["😀", "\U0001f3fd", "\u200d", "\U000e0001", "\u0378", "\U0010ffff", "\ue000"]
    + ["\udc80", "\udcff", "\udcc3\udca9", "\udce2\udc82"]  # surrogate-escaped invalid bytes
)
mixed_text = st.lists(_ALPHABET, max_size=60).map("".join)


def _encode(text: str) -> bytes:
    """UTF-8; the surrogates U+DC80..U+DCFF become the raw (invalid) bytes they stand for."""
    return text.encode("utf-8", "surrogateescape")


@settings(max_examples=MAX_EXAMPLES)
@given(st.one_of(mixed_text, st.text(max_size=40)).map(_encode))
def test_hypothesis_text(data):
    for name in NAMES:
        assert native_pieces(data, name) == regex_pieces(data, PATTERNS[name]), name


@settings(max_examples=MAX_EXAMPLES)
@given(st.binary(max_size=80))
def test_hypothesis_binary(data):
    for name in NAMES:
        assert native_pieces(data, name) == regex_pieces(data, PATTERNS[name]), name


@settings(max_examples=MAX_EXAMPLES)
@given(mixed_text.map(_encode), st.lists(st.integers(0, 200), max_size=6))
def test_count_pretokens_equals_counter(data, cuts):
    """Spans are scanned independently (cuts may fall inside a UTF-8 sequence)."""
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    spans = np.array(list(zip(bounds[:-1], bounds[1:])), dtype=np.int64).reshape(-1, 2)
    for pattern in NAMES + [USER_PATTERN]:
        regex_string = PATTERNS.get(pattern, pattern)
        want = Counter(p for a, b in spans.tolist() for p in regex_pieces(data[a:b], regex_string))
        assert table_dict(count_pretokens(data, spans, pattern)) == dict(want)
        assert table_dict(count_pretokens(np.frombuffer(data, np.uint8), spans, regex_string)) == dict(want)


@settings(max_examples=MAX_EXAMPLES)
@given(st.lists(st.dictionaries(st.binary(max_size=6), st.integers(1, 2**40), max_size=12), max_size=6))
def test_merge_counts_equals_counter_sum(dicts):
    want = Counter()
    for d in dicts:
        want.update(d)
    got = merge_counts([as_table(Counter(d)) for d in dicts])
    assert table_dict(got) == dict(want)


#: words over a tiny alphabet with NUL in it, around 8 bytes long: equal 8-byte keys with different
#: tails, words that differ only in trailing NULs (``a`` < ``a\0``: the key pads with zeros)
_KEYED_WORDS = st.binary(max_size=12).map(lambda b: bytes(b"\0\1a"[x % 3] for x in b)) | \
    st.binary(min_size=7, max_size=10).map(lambda b: b"prefix12"[:8] + bytes(x % 2 for x in b[8:]))


@settings(max_examples=MAX_EXAMPLES)
@given(st.lists(st.dictionaries(_KEYED_WORDS, st.integers(1, 2**40), max_size=20), max_size=7))
def test_merge_counts_orders_by_bytes_past_the_first_eight(dicts):
    """The merge compares an 8-byte key of each word before its bytes: the merged table is the
    Counter's sum with its words in Python ``bytes`` order (the order is checked, not just the sums)."""
    want = Counter()
    for d in dicts:
        want.update(d)
    arena, offsets, counts = merge_counts([as_table(Counter(d)) for d in dicts])
    got = [(bytes(arena[offsets[i]:offsets[i + 1]]), int(counts[i])) for i in range(len(counts))]
    assert got == sorted(want.items())
    assert offsets[-1] == len(arena) and len(offsets) == len(counts) + 1


@settings(max_examples=MAX_EXAMPLES)
@given(mixed_text.map(_encode), st.sampled_from(NAMES + [USER_PATTERN]))
def test_pretokenize_special_tokens(data, pattern):
    specials = ["<|endoftext|>", "<|end|>", "<|endoftext|>x"]
    text = data + b"<|endoftext|>" + data + b"<|endoftext|>x<|end|>" + data
    got = pretokenize(text, pattern, special_tokens=specials)
    assert b"".join(got) == text
    want = []
    for piece, is_special in [(p, s) for p, s in _split(text, specials)]:
        want += [piece] if is_special else regex_pieces(piece, PATTERNS.get(pattern, pattern))
    assert got == want
    assert pretokenize(text.decode("utf-8", "surrogateescape"), pattern, specials) == got


def _split(text: bytes, specials: list[str]):
    from bpe_core.corpus.specials import encode_specials, split_on_specials
    return split_on_specials(text, encode_specials(specials))


# ==== API details ==================================================================================


def test_named_patterns_by_name_or_string():
    data = "Don't stop 123456 ǅungla\r\n\r\n".encode()
    for name, pat in PATTERNS.items():
        assert is_native(name) and is_native(pat)
        assert pretoken_ends(data, name).tolist() == pretoken_ends(data, pat).tolist()
        assert pretoken_ends(data, pat).tolist() == regex_ends(data, pat).tolist()
    assert not is_native(USER_PATTERN)
    assert pretoken_ends(data, USER_PATTERN).tolist() == regex_ends(data, USER_PATTERN).tolist()


def test_empty_inputs():
    for pattern in NAMES + [USER_PATTERN]:
        assert pretokenize(b"", pattern) == []
        assert pretoken_ends(b"", pattern).dtype == np.int64
        assert len(pretoken_ends(b"", pattern)) == 0
        arena, offsets, counts = count_pretokens(b"", np.zeros((0, 2), np.int64), pattern)
        assert len(arena) == 0 and offsets.tolist() == [0] and len(counts) == 0
        assert table_dict(count_pretokens(b"ab", np.array([[1, 1]]), pattern)) == {}
    assert table_dict(merge_counts([])) == {}


def test_bad_inputs():
    with pytest.raises(ValueError):
        count_pretokens(b"abc", np.array([[0, 4]]), "gpt2")
    with pytest.raises(ValueError):
        count_pretokens(b"abc", np.array([[2, 1]]), USER_PATTERN)
    for pattern in ("gpt2", USER_PATTERN):
        with pytest.raises(ValueError):
            count_pretokens(b"abc", np.array([[0, 1, 2]]), pattern)
    with pytest.raises(ValueError):
        _pretok.count_pretokens(b"abc", np.array([[0, 1, 2]]), 0)
    with pytest.raises(ValueError):
        pretokenize(b"x", r"(unclosed")
    with pytest.raises(ValueError):
        _pretok.split_ends(b"x", 7)
    unsorted = (np.frombuffer(b"ba", np.uint8), np.array([0, 1, 2]), np.array([1, 1]))
    with pytest.raises(ValueError):
        merge_counts([unsorted])
    with pytest.raises(ValueError):
        merge_counts([(np.frombuffer(b"ab", np.uint8), np.array([0, 1]), np.array([1, 1]))])


def test_memmap_buffer(tmp_path):
    path = tmp_path / "text.bin"
    path.write_bytes(b"Hello world\n<|endoftext|>\nagain  ")
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    table = count_pretokens(buf, np.array([[0, 12], [25, 33]]), "cl100k")
    assert table_dict(table) == dict(Counter(regex_pieces(b"Hello world\n", PATTERNS["cl100k"])
                                             + regex_pieces(b"\nagain  ", PATTERNS["cl100k"])))


def test_hash_table_growth_and_long_words():
    """Many distinct words (the table doubles many times), words over 16 bytes sharing heads."""
    words = [f"w{i:x}" for i in range(30000)] + ["x" * 16 + f"{i}" for i in range(300)]
    data = (" ".join(words) + " " + " ".join(words[::7])).encode()
    spans = np.array([[0, len(data)]])
    want = Counter(regex_pieces(data, PATTERNS["gpt2"]))
    assert table_dict(count_pretokens(data, spans, "gpt2")) == dict(want)
    halves = [count_pretokens(data, np.array([[0, len(data) // 2]]), "gpt2"),
              count_pretokens(data, np.array([[len(data) // 2, len(data)]]), "gpt2")]
    want = Counter(regex_pieces(data[:len(data) // 2], PATTERNS["gpt2"]))
    want.update(regex_pieces(data[len(data) // 2:], PATTERNS["gpt2"]))
    assert table_dict(merge_counts(halves)) == dict(want)


# ==== Pathological input: linear time (no timing asserts; these would hang if quadratic) ===========

PATHOLOGICAL = ["^", " ", "a", "A", "1", "'", "\n", "\r\n", " \n", "\u0301", "あA", "Aあ", "ǅ",
                "'s", " !", "\t ", "A\u0301", "\xff"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("unit", PATHOLOGICAL)
def test_pathological(name, unit):
    n = 200_000 // len(unit)
    data = unit.encode("utf-8", "surrogateescape") * n
    for tail in (b"", b"x", b" x"):
        assert_same_ends(data + tail, name)


# ==== Shared corpora (skipped where ../shared is absent) ===========================================

def _corpus_slices(nbytes: int):
    for path in sorted((CORPORA / "multi").glob("*.txt")):
        yield path.name, path.read_bytes()
    for path in sorted(CORPORA.glob("*.txt.xz")):
        with lzma.open(path) as f:
            yield path.name, f.read(nbytes)


@pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is not present")
@pytest.mark.parametrize("name", NAMES)
def test_corpora_slices(name):
    """All of multi/*.txt and the first 2 MB of each .xz corpus; counts on four scripts with marks."""
    for key, data in _corpus_slices(2_000_000):
        assert_same_ends(data, name)
        if key in ("ar.txt", "hi.txt", "th.txt", "ko.txt"):
            spans = np.array([[0, len(data)]])
            assert table_dict(count_pretokens(data, spans, name)) == dict(
                Counter(regex_pieces(data, PATTERNS[name])))


@pytest.mark.slow
@pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is not present")
@pytest.mark.parametrize("name", NAMES)
def test_corpora_full(name):
    """Every byte of every shared corpus (minutes: opt in with --slow)."""
    for _, data in _corpus_slices(-1):
        start = 0
        while start < len(data):  # 50 MB pieces cut after a newline, each scanned as one text
            end = len(data) if start + 50_000_000 >= len(data) else data.rindex(b"\n", start, start + 50_000_000) + 1
            assert_same_ends(data[start:end], name)
            start = end


def _merged_both(tables):
    """``merge_counts`` on one thread and on two (every size split: ``par_min_words=0``)."""
    from bpe_core.pretok._pretok import merge_counts as kernel_merge

    one = kernel_merge(tables)
    two = kernel_merge(tables, threads=2, par_min_words=0)
    return one, two


@settings(max_examples=MAX_EXAMPLES)
@given(st.lists(st.dictionaries(_KEYED_WORDS | st.binary(max_size=6), st.integers(1, 2**40), max_size=25),
                max_size=7))
def test_merge_counts_on_two_threads_is_one_threads_table(dicts):
    """Two threads (the tables cut at the middle word of the longest, a word and its copies in one
    half, the upper half moved down behind the lower): the same arrays, byte for byte, as one
    thread, and the Counter's sum; words shared by every table, empty tables, one table."""
    tables = [as_table(Counter(d)) for d in dicts]
    one, two = _merged_both(tables)
    for x, y in zip(one, two):
        assert np.array_equal(np.asarray(x), np.asarray(y)) and len(x) == len(y)
    want = Counter()
    for d in dicts:
        want.update(d)
    arena, offsets, counts = two
    assert [(bytes(arena[offsets[i]:offsets[i + 1]]), int(counts[i])) for i in range(len(counts))] == \
        sorted(want.items())


def test_merge_counts_on_two_threads_adversarial():
    """The pivot word in every table (all its copies go to the upper half), halves of which one is
    empty, every word a duplicate (the lower half shrinks: the upper moves furthest), a table
    holding only the longest run, and a large merge at the default threshold."""
    from bpe_core.pretok._pretok import MERGE_PAR_MIN_WORDS

    same = {b"m": 3, b"a": 1, b"z": 2}
    cases = [[same, same, same], [{b"a": 1, b"b": 1}, {}], [{}, {b"x": 5}], [{b"b": 1, b"c": 1}, {b"a": 1}],
             [{bytes([i]): 1 for i in range(256)}] * 4,
             [{b"q" * k: k for k in range(1, 40)}, {b"q" * k: 1 for k in range(20, 60)}]]
    for dicts in cases:
        one, two = _merged_both([as_table(Counter(d)) for d in dicts])
        for x, y in zip(one, two):
            assert np.array_equal(np.asarray(x), np.asarray(y))
    rng = np.random.default_rng(3)
    n = MERGE_PAR_MIN_WORDS
    big = [Counter({int(w).to_bytes(4, "big"): int(c) for w, c in zip(rng.integers(0, 3 * n, n // 2),
                                                                         rng.integers(1, 9, n // 2))})
           for _ in range(3)]
    tables = [as_table(c) for c in big]
    one = merge_counts(tables)
    two = merge_counts(tables, threads=2)
    assert sum(len(t[2]) for t in tables) >= n        # the default threshold is reached
    for x, y in zip(one, two):
        assert np.array_equal(np.asarray(x), np.asarray(y))


def _table_of(words: list[bytes], counts: list[int]):
    """A table from words in the order given (sorted or not)."""
    offsets = np.concatenate([[0], np.cumsum([len(w) for w in words])]).astype(np.int64)
    return np.frombuffer(b"".join(words), np.uint8), offsets, np.array(counts, np.int64)


@settings(max_examples=MAX_EXAMPLES)
@given(st.lists(st.lists(_KEYED_WORDS | st.binary(max_size=6), max_size=25), min_size=1, max_size=5),
       st.data())
def test_merge_counts_refuses_a_table_out_of_order(word_lists, data):
    """The words' order is checked as they are merged (on one thread and on two: each half checks
    its part of every table): a table whose words do not rise strictly (two swapped, one repeated,
    anywhere, in any table) is refused with ``ValueError`` naming it, whatever the other tables hold;
    sorted unique tables merge to the Counter's sum."""
    from bpe_core.pretok._pretok import merge_counts as kernel_merge

    tables = [sorted(set(ws)) for ws in word_lists]
    want = Counter(w for ws in tables for w in ws)
    bad = data.draw(st.integers(0, len(tables) - 1))
    words = list(tables[bad])
    if len(words) >= 2:
        i = data.draw(st.integers(0, len(words) - 2))
        j = data.draw(st.integers(i + 1, len(words) - 1))
        if data.draw(st.booleans()):
            words[i], words[j] = words[j], words[i]        # out of order
        else:
            words[j] = words[i]                            # a word twice
    disordered = any(a >= b for a, b in zip(words, words[1:]))
    runs = [_table_of(ws, [1] * len(ws)) for ws in tables]
    runs[bad] = _table_of(words, [1] * len(words))
    for threads in (1, 2):
        if disordered:
            with pytest.raises(ValueError, match=f"table {bad} is not sorted"):
                kernel_merge(runs, threads=threads, par_min_words=0)
        else:
            arena, offsets, counts = kernel_merge(runs, threads=threads, par_min_words=0)
            assert [(bytes(arena[offsets[i]:offsets[i + 1]]), int(counts[i])) for i in range(len(counts))] == \
                sorted(want.items())


def test_merge_counts_refuses_offsets_outside_the_arena():
    """Offsets that decrease, do not start at 0 or point past the arena are refused before any word
    is read."""
    arena = np.frombuffer(b"abcd", np.uint8)
    for offsets in ([0, 3, 2, 4], [1, 2, 4], [0, 9, 4]):
        with pytest.raises(ValueError):
            merge_counts([(arena, np.array(offsets), np.ones(len(offsets) - 1, np.int64))])


def _resident_bytes_after(view) -> int:
    """Resident bytes of the memory of ``view``'s base array past the view's end (Linux ``mincore``;
    whole pages, the page holding the view's last byte excluded)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    base = view.base if view.base is not None else view
    start = view.ctypes.data + view.nbytes
    end = base.ctypes.data + base.nbytes
    a, b = -(-start // page) * page, end // page * page
    if b <= a:
        return 0
    vec = (ctypes.c_ubyte * ((b - a) // page))()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(ctypes.c_void_p(a), ctypes.c_size_t(b - a), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) * page


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore, madvise: Linux")
def test_merge_on_two_threads_keeps_no_pages_past_the_table():
    """Two threads write the upper half after the lower half's inputs and move it down behind the
    lower half's result: the pages of its first copy, past the table's end, go back to the OS (the
    table is what stays resident, not 1.5x it)."""
    from bpe_core.pretok._pretok import merge_counts as kernel_merge

    rng = np.random.default_rng(5)
    words = [b"w%07d" % int(i) for i in rng.permutation(400_000)]
    tables = [as_table(Counter(words[k::3] + words[:50_000])) for k in range(3)]     # shared words too
    one = kernel_merge(tables)
    two = kernel_merge(tables, threads=2, par_min_words=0)
    for x, y in zip(one, two):
        assert np.array_equal(x, y)
    for arr in two:
        assert arr.base is not None and arr.base.nbytes > arr.nbytes      # the room for the sum of inputs
        assert _resident_bytes_after(arr) == 0


def test_merge_gives_back_no_page_of_another_block():
    """The pages given back after a merge are inside its own output arrays: merges of every size
    from a few words to a few pages of offsets (duplicates summed, so the arrays are longer than the
    table), each output followed on the heap by other arrays whose contents must survive."""
    from bpe_core.pretok._pretok import merge_counts as kernel_merge

    kept = []
    for n in range(1, 1600, 3):
        words = [b"%05d" % i for i in range(n)]
        tables = [as_table(Counter(words)), as_table(Counter(words[: n // 2 + 1]))]
        for threads in (1, 2):
            arena, offsets, counts = kernel_merge(tables, threads=threads, par_min_words=0)
            kept.append(np.full(97 + n % 50, n % 251, np.uint8))     # what the heap puts next
            assert len(counts) == n and int(counts.sum()) == n + n // 2 + 1
    for k, arr in enumerate(kept):
        assert (arr == (1 + 3 * (k // 2)) % 251).all()
