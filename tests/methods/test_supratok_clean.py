"""SupraTok's clean vocabulary (``stage2_skip_encoded``, on by default, ``--keep-encoded`` turns it
off): units of text that looks encoded (uuencode) count for nothing in pass 2, as in SuperBPE's
stage 2. Fast == the plain twin with the rule on and off; a corpus with uuencoded lines teaches pass
2 none of them; every token passes the rules."""
import binascii
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.methods.superbpe import Stage2Rules
from bpe_core.methods.supratok.passes import SeedRule
from bpe_core.pretok.pretokenize import pretoken_ends
from bpe_core.reference import supratok as reference_supratok
from bpe_core.reference import superbpe_units
from paths import FIXTURES
from strategies import SPECIAL

from test_supratok import small_options, train_bytes


def uu_lines(seed: int, n: int) -> bytes:
    """``n`` uuencoded lines of random bytes (each ``M`` + 60 characters + newline)."""
    rng = random.Random(seed)
    return b"".join(binascii.b2a_uu(bytes(rng.getrandbits(8) for _ in range(45))) for _ in range(n))


#: a constant line of a uuencoded block (no digits: caught only inside a block of other lines)
CONSTANT = b"M" + b"AX>'" * 15 + b"\n"
PROSE = [b" the cat sat on the mat", b" of the", b" in the house", b" New York", b" she said", b" it was",
         b".", b" and then", b"\n", b"\n\n", b" 12 cats"]
PIECES = st.one_of(st.sampled_from(PROSE), st.integers(0, 50).map(lambda s: uu_lines(s, 1)),
                   st.just(CONSTANT), st.just(CONSTANT * 3))
mixed_docs = st.lists(st.lists(PIECES, min_size=1, max_size=10).map(b"".join), min_size=1,
                      max_size=6).map(lambda ds: SPECIAL.encode().join(ds))


def pass2_tokens(result) -> list[bytes]:
    n1 = result.model.stages[0]["merges"]
    return [a + b for a, b in result.merges[n1:]]


HEADER, FOOTER = b"Here is the file:\n\nbegin 644 file.zip\n", b"`\nend\n"


@pytest.fixture(scope="module")
def uu_corpus() -> tuple[bytes, bytes]:
    """Prose documents and documents that hold a uuencoded block (random lines among constant ones),
    each block repeated so that pass 2 would learn it; returns (corpus, its prose part)."""
    prose = (FIXTURES / "corpus.en").read_bytes()[:40000]
    block = uu_lines(1, 8) + CONSTANT * 4 + uu_lines(2, 8)
    docs = prose.split(b"\n\n")
    encoded_docs = [HEADER + block + FOOTER] * 12
    return SPECIAL.encode().join(docs + encoded_docs), prose


@pytest.mark.parametrize("keep", [False, True])
def test_uuencoded_lines_give_no_token(uu_corpus, keep):
    data, prose = uu_corpus
    result = train_bytes(data, 900, transition=500, **small_options(heldout_fraction=0.0,
                                                                     stage2_skip_encoded=not keep))
    junk = [t for t in pass2_tokens(result) if t not in prose and t not in HEADER and t not in FOOTER]
    info = result.report["supratok"]
    if keep:            # the test can fail: with the rule off, pass 2 learns the blocks
        assert len(junk) >= 10 and max(map(len, junk)) >= 60
        assert info["encoded_units"] == 0
    else:
        assert junk == []
        assert info["skip_encoded"] and info["encoded_units"] > 0


@settings(max_examples=max(8, settings().max_examples // 3), deadline=None)
@given(mixed_docs, st.integers(0, 15), st.integers(0, 40), st.booleans())
def test_passes_1_2_equal_plain_reference_on_encoded_text(data, n1, n2, skip):
    data = data * 2
    transition = 257 + n1
    opts = small_options(heldout_fraction=0.0, supratok_rounds=0, script_aware=False, pass2_cross="all",
                         stage2_skip_encoded=skip)
    fast = train_bytes(data, transition + n2, transition=transition, **opts)
    rule = SeedRule([], "gpt2", Stage2Rules(), None, False, "all")
    merges, k1 = reference_supratok.train_passes_1_2(data, transition + n2, transition - 257, [SPECIAL], "gpt2",
                                                     rule.allows, skip_encoded=skip)
    assert fast.merges == merges
    assert fast.model.stages[0]["merges"] == k1


@settings(max_examples=max(5, settings().max_examples // 6), deadline=None)
@given(mixed_docs, st.integers(0, 10))
def test_every_token_passes_the_rules(data, n1):
    data = data * 2
    transition = 257 + n1
    result = train_bytes(data, transition + 60, transition=transition,
                         **small_options(heldout_fraction=0.0, script_aware=False))
    stage = result.model.stages[1]
    rules = Stage2Rules.from_dict(stage["rules"])
    n_pass1 = result.model.stages[0]["merges"]
    units = reference_supratok.supratok_units(data, [SPECIAL], "gpt2", result.merges[:n_pass1])
    clean_text = b"\x00".join(b"".join(u) for u, encoded in units if not encoded)
    for a, b in result.merges[n_pass1:]:
        if pretoken_ends(a + b, "gpt2").size > 1:        # across pretokens: the stage-2 rules
            assert rules.allows(a, b), (a, b)
        # learned from units that count: its bytes lie inside one of them
        assert a + b in clean_text, (a, b)


def test_units_are_superbpe_units_split():
    """The twin's units are SuperBPE's ``units`` split (what the encoder and the fast path use)."""
    data = b"Some words.\n\n" + uu_lines(3, 4) + CONSTANT + b" 1234567 x" + SPECIAL.encode() + b"\n\nM9 y"
    merges = [(b" ", b"w"), (b"1", b"2"), (b"M", b"A")]
    units = reference_supratok.supratok_units(data, [SPECIAL], "gpt2", merges)
    assert [u for u, _ in units] == superbpe_units(data, [SPECIAL], "gpt2", merges, split="units")
    assert [e for _, e in units][:2] == [False, True]


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_native_encoded_units_equal_the_numpy_rule(data):
    """``units_in_encoded_regions`` (the documents pass's native rule) == ``documents.encoded_units``
    (numpy) on random words, flags, byte classes, units and document starts: regions cut at
    whitespace meets and documents, encoded regions found by the class sums, units by their bytes."""
    import numpy as np
    from bpe_core.engine.units import units_in_encoded_regions
    from bpe_core.methods.supratok.documents import encoded_units
    n_words = data.draw(st.integers(1, 6))
    flags = np.array(data.draw(st.lists(st.integers(0, 7), min_size=n_words, max_size=n_words)), np.uint8)
    rows = data.draw(st.lists(st.tuples(st.integers(0, 45), st.integers(0, 3), st.integers(0, 20),
                                        st.integers(0, 30), st.integers(0, 6)), min_size=n_words, max_size=n_words))
    classes = np.array(rows, np.int32).reshape(n_words, 5)
    ids = np.array(data.draw(st.lists(st.integers(0, n_words - 1), min_size=1, max_size=60)), np.uint32)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, ids.size - 1), max_size=12)) if ids.size > 1 else []))
    bounds = np.array([0] + cuts + [ids.size], np.int64)
    docs = np.array(sorted(set(data.draw(st.lists(st.integers(0, ids.size - 1), max_size=4)))), np.int64)
    doc_starts = docs if data.draw(st.booleans()) else None
    want = encoded_units(ids, bounds, flags, classes, doc_starts=doc_starts)
    got = units_in_encoded_regions(ids, bounds, flags, classes, doc_starts)
    assert got.tolist() == want.tolist()


def test_native_encoded_units_on_uuencoded_text(uu_corpus):
    """On a corpus with uuencoded blocks the native rule finds encoded units (and the same as numpy)."""
    import numpy as np
    from bpe_core.engine.units import units_in_encoded_regions
    from bpe_core.methods.superbpe import word_classes, word_flags
    from bpe_core.methods.supratok.documents import encoded_units
    from bpe_core.pretok.wordtable import WordTable
    text = uu_corpus[0].replace(SPECIAL.encode(), b"\n")[:60000]
    ends = pretoken_ends(text, "gpt2")
    words = [text[a:b] for a, b in zip([0] + ends[:-1].tolist(), ends.tolist())]
    from collections import Counter
    table = WordTable.from_counts(dict(Counter(words)))
    row = {table.arena[table.offsets[i]:table.offsets[i + 1]].tobytes(): i for i in range(table.n_words)}
    ids = np.array([row[w] for w in words], np.uint32)
    bounds = np.array(sorted({0, ids.size} | set(range(0, ids.size, 7))), np.int64)
    flags, classes = word_flags(table), word_classes(table)
    want = encoded_units(ids, bounds, flags, classes)
    got = units_in_encoded_regions(ids, bounds, flags, classes)
    assert got.any() and got.tolist() == want.tolist()


def _by_engine_and_by_replay(data: bytes, vocab_size: int, **options):
    """Train twice: the final count from the pass-2 engine (the default) and by the encoder's
    replay of every unit (``FINAL_COUNT_BY_ENGINE`` off: the engine counts the weighted units only).

    The engine route lists the units as they come (``documents.UnitList``), the replay route counts
    them (the replay reads them): the cut's pieces may differ (a long piece met twice is listed twice,
    and the sketch has a counter per 4 windows of the units as given), so of the cut's figures only
    the cuts and the restarts are compared; everything else must be equal."""
    from bpe_core.methods.supratok import passes
    runs = {}
    for by_engine in (True, False):
        old = passes.FINAL_COUNT_BY_ENGINE
        passes.FINAL_COUNT_BY_ENGINE = by_engine
        try:
            runs[by_engine] = train_bytes(data, vocab_size, **options)
        finally:
            passes.FINAL_COUNT_BY_ENGINE = old
    for run in runs.values():
        cut = run.report["supratok"]["pass2_cut"]
        cut["cuts"] = [c["cut"] for c in cut["cuts"]]
    return runs[True], runs[False]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.sampled_from([b" the cat", b" sat on", b" 12345", b" 7", b"\n", b"\n\n", b"  ", b",", b"x",
                                 b" M'XX%,#'A=9&4@#0A=9&4@#0A=9&4@#0A=9&4@#0A\n", b"*!A9&4@&3!4=9&4@#0A=9&4@#0A\n",
                                 b"\xc3\xa9t\xc3\xa9", b" ve bir", b" dog", SPECIAL.encode()]),
                min_size=1, max_size=200).map(b"".join),
       st.sampled_from([1, 2]), st.booleans())
def test_final_count_by_the_engine_equals_the_replay(data, workers, keep_encoded):
    """The final token count taken from the pass-2 engine (every unit with its count) equals the
    encoder's replay of every unit, and the figures beside it (``pass2_engine_tokens``: the weighted
    units only) are those of the replay route: the same report and merges, encoded units or not."""
    fast, plain = _by_engine_and_by_replay(data * 2, 320, num_workers=workers, special_tokens=[SPECIAL],
                                           stage2_skip_encoded=not keep_encoded)
    assert fast.model.merges == plain.model.merges
    assert fast.report["supratok"] == plain.report["supratok"]


def test_final_count_by_the_engine_on_encoded_text(uu_corpus):
    """With uuencoded blocks (encoded units, no weight) and with pass 3 (merges changed: the replay
    route both times), the engine's count gives the replay's report."""
    corpus, _ = uu_corpus
    fast, plain = _by_engine_and_by_replay(corpus, 600, special_tokens=[SPECIAL])
    assert fast.report["supratok"]["encoded_units"] > 0
    assert fast.model.merges == plain.model.merges
    assert fast.report["supratok"] == plain.report["supratok"]
    fast, plain = _by_engine_and_by_replay(corpus, 600, special_tokens=[SPECIAL],
                                           **small_options(supratok_rounds=1, num_workers=2))
    assert fast.model.merges == plain.model.merges
    assert fast.report["supratok"] == plain.report["supratok"]


def test_spaceless_characters_are_led_by_the_gate_lead_bytes():
    """Every ``is_spaceless`` character is 3 bytes of UTF-8 led by one of the bytes the gate reads
    words for (``script_gate_from_table`` decodes only words with two such leads)."""
    from bpe_core.methods.supratok.script import _SPACELESS_LEADS, is_spaceless

    assert not any(is_spaceless(chr(c)) for c in range(0x10000, 0x110000, 97))      # (its ranges are in the BMP)
    chars = [chr(c) for c in range(0x10000) if not 0xD800 <= c < 0xE000 and is_spaceless(chr(c))]
    assert chars and all(len(ch.encode()) == 3 and _SPACELESS_LEADS[ch.encode()[0]] for ch in chars)
    # ... and the gate's runs of them are made of exactly those characters
    from bpe_core.methods.supratok.script import _SPACELESS_RUN
    assert "".join(_SPACELESS_RUN.findall("".join(chr(c) for c in range(0xD800)) + "x"
                                          + "".join(chr(c) for c in range(0xE000, 0x10000)))) == "".join(chars)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab中国人の日本語ไทย“”—é ", min_size=1, max_size=6), min_size=1, max_size=30),
       st.integers(1, 3))
def test_script_gate_bigrams_equal_the_plain_count(words, count):
    """The gate's bigrams (words read only when they hold two spaceless lead bytes) are those of
    every word, decoded and counted plainly."""
    from collections import Counter

    from bpe_core.methods.supratok.script import is_spaceless, script_gate_from_table
    from bpe_core.pretok.wordtable import WordTable

    table = WordTable.from_counts({w.encode(): count + len(w) for w in words})
    want: Counter = Counter()
    for i in range(table.n_words):
        text = table.arena[table.offsets[i]:table.offsets[i + 1]].tobytes().decode("utf-8", "surrogateescape")
        for x, y in zip(text, text[1:]):
            if is_spaceless(x) and is_spaceless(y):
                want[x + y] += int(table.counts[i])
    assert script_gate_from_table(table, {}, bigram_min=1).bigrams == dict(want)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.sampled_from(["ve", " VE", "Ve\n", "\tbir ", "BİR", "için", " İÇİN", "ço\u212a", "jot\u212aa", "olarak",
                     " OLARAK\x1c", "ja", " ette", "että", "mutta", "the", "v e", "ve,", "  ", "\xa0ve", "ve\x85"]),
    st.text(alphabet="vebirujaoltkmdghİ\u212a VEBIR\t\n\x1c\xa0.,'1é", min_size=1, max_size=9)),
    min_size=1, max_size=40))
def test_marker_words_equal_the_plain_rule(words):
    """``marker_words``' marks equal the plain rule on every word (its ASCII prefilter decodes only
    words of letters and strippable whitespace with 2-6 letters, and every word with other bytes)."""
    from bpe_core.methods.supratok.script import FI_MARKER, TR_MARKER, _FI_MARKERS, _TR_MARKERS, marker_words
    from bpe_core.pretok.wordtable import WordTable

    table = WordTable.from_counts({w.encode(): 1 for w in words})
    got = marker_words(table)
    for i in range(table.n_words):
        raw = table.arena[table.offsets[i]:table.offsets[i + 1]].tobytes()
        text = raw.decode("utf-8", "surrogateescape").strip().lower()
        want = (TR_MARKER if text in _TR_MARKERS else 0) | (FI_MARKER if text in _FI_MARKERS else 0)
        if len(raw) > 4 * max(len(m.encode()) for m in _TR_MARKERS | _FI_MARKERS):
            want = 0                     # (too long to be one, whatever whitespace is around it)
        assert int(got[i]) & 3 == want, raw


_GATE_PIECES = ["中".encode(), "国".encode(), "の".encode(), "ไ".encode(), "ｦ".encode(), "豈".encode(), "“".encode(),
                "é".encode(), b"a", b" ", b"\xe4", b"\xe4\xb8", b"\xe0\xb8", b"\xef\xbc", b"\x80", b"\xff", b"\xf0\x9f",
                "\u0e7f".encode(), "\u0e80".encode(), "\u30ff".encode(), "\u3100".encode(), "\u4dbf".encode(),
                "\u4dc0".encode(), "\uff9f".encode(), "\uffa0".encode(), b"\xe0\x80\x80", b"\xed\xa0\x80"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_GATE_PIECES), min_size=1, max_size=8).map(b"".join), min_size=1,
                max_size=25), st.integers(1, 5))
def test_spaceless_bigrams_by_numpy_equal_the_decoded_words(words, count):
    """``spaceless_bigrams`` (numpy over the arena) gives the bigrams, counts and first-met order
    of ``spaceless_bigrams_python`` (each word decoded), on any bytes: truncated and invalid UTF-8,
    overlong and surrogate forms, characters at the edges of the ranges, words that end mid-character."""
    from bpe_core.methods.supratok.script import spaceless_bigrams, spaceless_bigrams_python
    from bpe_core.pretok.wordtable import WordTable

    table = WordTable.from_counts({w: count + len(w) for w in words})
    arena = table.arena.tobytes()
    got = spaceless_bigrams(np.frombuffer(arena, np.uint8), table.offsets, table.counts)
    want = spaceless_bigrams_python(arena, table.offsets, table.counts)
    assert list(got.items()) == list(want.items())
