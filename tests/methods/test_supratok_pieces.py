"""SupraTok's pass 2 on pieces and its documents by a native scan: the same result as the plain ways.

- ``stage2_merges(rebuilds=True)``: merges that rebuild an existing token's bytes (rules without
  ``distinct``) are still those of one engine run on the whole units, for any first cut, guard and
  spared tokens (restarts from the first merge included, with the units listed again);
- ``MergeEngine.run(stop_before_existing=True)`` stops before such a merge, and ``step`` makes it;
- ``cut_pieces(guard=)`` never cuts beside a guarded symbol (against plain Python);
- ``chunk_unit_stream(span_ends=)`` says where each span's word ids end;
- ``count_documents`` by the scan equals the loop over documents (units, counts, languages), and
  ``script.marker_words`` finds every document the Turkish/Finnish guess would pass.
"""
from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bpe_core.corpus.chunks import split_spans
from bpe_core.engine.merge import MergeEngine
from bpe_core.engine.units import WordIndex, chunk_unit_stream, cut_pieces
from bpe_core.methods.superbpe import Stage2Rules, stage2_merges
from bpe_core.methods.superbpe.stage2 import GUARD_LEFT, GUARD_RIGHT
from bpe_core.methods.supratok.documents import count_documents
from bpe_core.methods.supratok.script import guess_candidates, guess_suffix_language
from bpe_core.pretok.pretokenize import pretoken_ends
from bpe_core.pretok.wordtable import WordTable

# stage-1 tokens: the bytes, then "ab" (256) and two spaces (257), which merges can build again
TOKENS = [bytes([i]) for i in range(256)] + [b"ab", b"  "]
AB, SS = 256, 257
symbol = st.sampled_from([ord("a"), ord("b"), ord(" "), ord(":"), ord("c"), AB, SS])
units_st = st.lists(st.tuples(st.lists(symbol, max_size=14), st.integers(1, 4)), min_size=1, max_size=25)


def as_arrays(units):
    symbols = np.array([s for u, _ in units for s in u], dtype=np.uint32)
    offsets = np.concatenate(([0], np.cumsum([len(u) for u, _ in units]))).astype(np.int64)
    weights = np.array([w for _, w in units], dtype=np.int64)
    return symbols, offsets, weights


def whole_units(symbols, offsets, weights, n, allowed):
    engine = MergeEngine(symbols, offsets, weights, TOKENS)
    steps = engine.run(n, allowed=allowed)
    _, final_offsets, _ = engine.words()
    return steps, engine.tokens(), int((np.diff(final_offsets) * weights).sum())


RULES = [None, Stage2Rules(distinct=False).allows, Stage2Rules(max_words=1, distinct=False).allows]


@settings(max_examples=200, deadline=None)
@given(units_st, st.integers(0, 40), st.integers(1, 12), st.sampled_from(range(len(RULES))),
       st.sampled_from([None, bytes.isspace, lambda t: True]), st.integers(1, 2),
       st.sampled_from([None, bytes.isspace, lambda t: True]))
@example([(list(b"ab ab") + [AB, ord(" ")] + list(b"ab"), 3), ([AB] + list(b" ab"), 2)], 6, 2, 0, None, 1, None)
@example([(list(b"abc"), 3), ([AB, ord("c")], 3), (list(b"cab"), 3), ([ord("c"), AB], 3), (list(b"c:"), 5)],
         2, 4, 0, None, 2, None)
def test_rebuilding_merges_on_pieces_equal_whole_units(units, n, cut, rule, guess, threads, spare):
    symbols, offsets, weights = as_arrays(units)
    steps, tokens, final = whole_units(symbols, offsets, weights, n, RULES[rule])
    for foresee in (True, False):
        got = stage2_merges(symbols, offsets, weights, weights, TOKENS, n, RULES[rule], bounded=True, cut=cut,
                            rebuilds=True, guard_tokens=guess, threads=threads, spare_tokens=spare,
                            foresee=foresee)
        assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
        assert got.tokens == tokens
        assert got.final_tokens == final


@settings(max_examples=120, deadline=None)
@given(units_st, st.integers(0, 40), st.integers(1, 12), st.integers(1, 8), st.booleans())
# (without rebuilds the rule is ``distinct``, as in a run: bounded pieces without rebuilds assume no
# merge rebuilds an existing token; the rule without it let ("a", "b") rebuild "ab" here)
@example([([97, 98, 257], 1), ([32, 32], 2), ([97, 98, 32, 32], 1)], 2, 2, 1, False)
def test_two_legs_merge_as_one_run(units, n, cut, par, rebuilds):
    """``stage2_merges(threads=2)`` runs the merges of pairs counting ``STAGE2_PAR_MIN_SITES`` or more
    with the second thread and the rest on one (``engine.merge.run_legs``): the same merges as one engine run on
    the whole units, for any switch point (forced small here), with and without rebuilds."""
    from unittest import mock

    from bpe_core.methods.superbpe import stage2 as stage2_module
    from bpe_core.methods.superbpe.train import _allowed
    symbols, offsets, weights = as_arrays(units)
    rule = (lambda: None) if rebuilds else (lambda: _allowed(Stage2Rules(distinct=True), TOKENS))
    steps, tokens, final = whole_units(symbols, offsets, weights, n, rule())
    with mock.patch.object(stage2_module, "STAGE2_PAR_MIN_SITES", par):
        got = stage2_merges(symbols, offsets, weights, weights, TOKENS, n, rule(), bounded=True, cut=cut,
                            rebuilds=rebuilds, threads=2)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final


def test_a_rebuild_beside_a_cut_boundary_grows_the_guard_and_starts_again():
    # "a" + "b" rebuilds "ab" (256), so "ab" then also ends with "b" and starts with "a": the
    # windows ("b", "c") and ("c", "a") count less than the cut but ("ab", "c") and ("c", "ab") then
    # count 6, more than ("x", "y"), which pieces cut beside "b" and "a" would merge first
    units = [(list(b"abc"), 3), ([AB, ord("c")], 3), (list(b"cab"), 3), ([ord("c"), AB], 3), (list(b"xy"), 5)]
    symbols, offsets, weights = as_arrays(units)
    steps, tokens, final = whole_units(symbols, offsets, weights, 2, None)
    got = stage2_merges(symbols, offsets, weights, weights, TOKENS, 2, None, bounded=True, cut=4, rebuilds=True,
                        foresee=False)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert steps[0] == (ord("a"), ord("b"), AB) and tuple(steps[1][:2]) != (ord("x"), ord("y"))
    assert any(new == AB for _, _, new in steps)                # a merge rebuilt "ab"
    assert got.info["restarts"] >= 1 and got.info["cuts"][-1]["guarded_tokens"] >= 2
    # foreseen: ("a", "b") counts 6, at least the cut, and "a" + "b" are the bytes of "ab": "a", "b" and
    # "ab" guarded and "ab" spared before the first cut, no restart, the same merges
    got = stage2_merges(symbols, offsets, weights, weights, TOKENS, 2, None, bounded=True, cut=4, rebuilds=True)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.info["restarts"] == 0 and got.info["cuts"][0]["guarded_tokens"] == 3


def test_the_pairs_of_a_rebuilt_token_are_not_pruned():
    # ("c", "d") makes "cd" beside "ab" (a pair of count 2, below the cut 3: pruned unless spared);
    # ("a", "b") then rebuilds "ab" beside "cd": ("ab", "cd") counts 5 and goes before ("x", "y")
    units = [([AB, ord("c"), ord("d")], 2), (list(b"abcd"), 3), (list(b"ab"), 2), (list(b"xy"), 4)]
    symbols, offsets, weights = as_arrays(units)
    steps, tokens, final = whole_units(symbols, offsets, weights, 4, None)
    assert [tuple(s[:2]) for s in steps][2:] == [(AB, len(TOKENS)), (ord("x"), ord("y"))]
    got = stage2_merges(symbols, offsets, weights, weights, TOKENS, 4, None, bounded=True, cut=3, rebuilds=True,
                        guard_tokens=lambda t: True, foresee=False)   # (nothing cut: only the pruning is at stake)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    # ("ab", "cd") was forgotten (count 2, "ab" not spared): the rebuild of "ab" starts again, sparing it
    assert got.info["restarts"] == 1
    # foreseen: ("a", "b") counts 3, the cut: "ab" spared from the start, no restart
    got = stage2_merges(symbols, offsets, weights, weights, TOKENS, 4, None, bounded=True, cut=3, rebuilds=True,
                        guard_tokens=lambda t: True)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.info["restarts"] == 0


@settings(max_examples=60, deadline=None)
@given(units_st, st.integers(0, 40), st.integers(1, 12), st.sampled_from([None, bytes.isspace]))
@example([(list(b"abc"), 3), ([AB, ord("c")], 3), (list(b"cab"), 3), ([ord("c"), AB], 3), (list(b"xy"), 5)], 2, 4,
         None)
def test_rebuilds_let_the_units_go_and_list_them_again_to_start_again(units, n, cut, guess):
    """``regenerate`` with ``rebuilds``: the units are let go once cut and listed again for each run
    that starts again from the first merge (a guard grown, a token spared, a lower cut)."""
    symbols, offsets, weights = as_arrays(units)
    steps, tokens, final = whole_units(symbols, offsets, weights, n, None)
    calls = []

    def listed():
        return [symbols.copy()], [offsets.copy()], [weights.copy()], [weights.copy()]

    def again():
        calls.append(1)
        return listed()

    given_units = listed()
    got = stage2_merges(*given_units, TOKENS, n, None, bounded=True, cut=cut, rebuilds=True, guard_tokens=guess,
                        regenerate=again)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final
    assert all(lst == [] for lst in given_units)
    assert len(calls) == got.info["restarts"]


@settings(max_examples=100, deadline=None)
@given(units_st, st.integers(1, 30))
def test_engine_stops_before_a_merge_that_rebuilds_a_token(units, n):
    symbols, offsets, weights = as_arrays(units)
    plain, _, _ = whole_units(symbols, offsets, weights, n, None)
    engine = MergeEngine(symbols, offsets, weights, TOKENS)
    steps = []
    while len(steps) < n:
        n_tokens = len(engine.tokens())
        done = engine.run(n - len(steps), stop_before_existing=True)
        assert [new for _, _, new in done] == list(range(n_tokens, n_tokens + len(done)))     # all fresh
        steps += done
        if engine.stopped_before is None:
            break
        left, right = engine.stopped_before
        assert engine.token_bytes(left) + engine.token_bytes(right) in engine.tokens()
        step = engine.step()
        assert step[:2] == (left, right)
        steps.append(step)
    assert [tuple(s) for s in steps] == [tuple(s) for s in plain]
    assert engine.run(0, stop_before_existing=True) == [] and engine.stopped_before is None


@settings(max_examples=150)
@given(st.lists(st.lists(st.integers(0, 5), max_size=10), min_size=1, max_size=12),
       st.lists(st.integers(0, 3), min_size=6, max_size=6), st.integers(0, 7), st.integers(1, 2))
def test_guarded_symbols_are_never_cut_beside(seqs, guard, min_level, threads):
    symbols = np.array([s for q in seqs for s in q], dtype=np.uint32)
    offsets = np.concatenate(([0], np.cumsum([len(q) for q in seqs]))).astype(np.int64)
    levels = (symbols * 3 % 7).astype(np.uint32)             # any level per window
    weights = np.ones(len(seqs), dtype=np.int64)
    g = np.array(guard, dtype=np.uint8)
    data, starts, w, _, single = cut_pieces(symbols, offsets, levels, weights, weights, min_level, threads=threads,
                                            guard=g)
    want = Counter()
    for q in seqs:            # cut after position k unless its window's level or a guard keeps it
        piece = []
        for k, s in enumerate(q):
            piece.append(s)
            if k + 1 == len(q) or not (s * 3 % 7 >= min_level or g[s] & GUARD_LEFT or g[q[k + 1]] & GUARD_RIGHT):
                want[tuple(piece)] += 1
                piece = []
    got = Counter()
    for a, b, c in zip(starts[:-1], starts[1:], w):       # (a long piece may be listed more than once)
        got[tuple(data[a:b].tolist())] += int(c)
    assert got == Counter({p: c for p, c in want.items() if len(p) > 1})
    assert single == sum(c for p, c in want.items() if len(p) == 1)


# ==== Documents ================================================================================

WORDS = [b" the", b" cat", b" 12", b"\n", b"\n\n", b" ", b",", b" ve", b" bir", b" bu", b" VE", b" Bir", b"ja",
         b" ja", b" oli", b" ole", b" ett\xc3\xa4", b" \xc3\x87OK", b" jot\xe2\x84\xaaa", b"\tjoka", b" ve,",
         b"'ve", b" i\xc3\xa7in", b" myo\xcc\x88s", b"\xc2\xa0ile", b"<|endoftext|>"]


#: lines that look like encoded data (uuencode): their units are marked with ``skip_encoded``
ENCODED = [b"M9&]R(&5X86UP;&4@=&AE(&EN<'5T(&UA>2!B92!C;W)R=7!T960@8GD@=&AE\n",
           b"M(&EN<'5T(&UA>2!B92!C;W)R=7!T960@8GD@=&AE(&EN<'5T(&UA>2!B92!C\n"]


def _table(text: bytes, pattern: str) -> WordTable:
    """The word table of every pretoken of ``text`` (between ``<|endoftext|>``)."""
    spans, _ = split_spans(text, 0, len(text), [b"<|endoftext|>"])
    words = Counter()
    for s, e in spans:
        ends = pretoken_ends(text[s:e], pattern)
        words.update(text[s:e][a:b] for a, b in zip(np.concatenate(([0], ends[:-1])), ends))
    return WordTable.from_counts(words or {b"x": 1})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(WORDS + ENCODED), max_size=120), st.sampled_from(["gpt2", "cl100k", "o200k"]),
       st.sampled_from([1.0, 0.5]), st.integers(20, 400), st.booleans())
@example([b" ve", b" bir", b" bu", b" ve", b"<|endoftext|>", b" the"], "gpt2", 1.0, 64, False)
@example([b"\tjoka", b" ja", b" ole", b" jot\xe2\x84\xaaa", b" oli", b"<|endoftext|>"], "cl100k", 1.0, 64, False)
@example([b" the", b"\n", ENCODED[0], ENCODED[0], b"\n", b" 12", ENCODED[1], b"<|endoftext|>", ENCODED[0], b" cat"],
         "gpt2", 1.0, 400, True)
def test_documents_by_the_scan_equal_the_loop(tmp_path_factory, words, pattern, fraction, chunk, skip_encoded):
    from bpe_core.methods.superbpe import word_classes, word_flags
    from bpe_core.pretok.patterns import resolve_pattern

    path = tmp_path_factory.mktemp("docs") / "corpus.txt"
    text = b"".join(words) + b" the"
    path.write_bytes(text)
    table = _table(text, pattern)
    args = (str(path), table, None, [b"<|endoftext|>"], resolve_pattern(pattern), 2, chunk, fraction, 0.0, True)
    marks = dict(flags=word_flags(table), classes=word_classes(table)) if skip_encoded else {}
    from bpe_core.methods.supratok import documents

    block = documents.SCAN_BLOCK
    documents.SCAN_BLOCK = 1 + len(words) % 7          # encoded units marked a few pretokens at a time
    try:
        small = count_documents(*args, **marks)
    finally:
        documents.SCAN_BLOCK = block
    scan = count_documents(*args, **marks)
    loop = count_documents(*args, force_loop=True, **marks)
    for a, b in zip(small["units"], scan["units"]):
        assert np.array_equal(a, b)
    for a, b in zip(scan["units"], loop["units"]):
        assert np.array_equal(a, b)
    assert (scan["seen"], scan["kept"], scan["n_train_docs"]) == (loop["seen"], loop["kept"], loop["n_train_docs"])
    assert scan["lang_docs"] == loop["lang_docs"]
    assert scan["lang"].keys() == loop["lang"].keys()
    assert all(np.array_equal(scan["lang"][k], loop["lang"][k]) for k in scan["lang"])
    assert scan["df"] is None and loop["df"] is None and scan["held"] == loop["held"] == []


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["ve", "VE", "Ve", "bir", "BİR", "bu", "için", "İÇİN", "ÇOK", "çok", "ço\u212a",
                                 "ja", "että", "ETTÄ", "myös", "jot\u212aa", "the", "ve,", "(ve", "'ve", "x"]),
                min_size=0, max_size=40),
       st.lists(st.sampled_from([" ", "\n", "\t", "\xa0", "\u3000", "  ", "\x1c"]), min_size=40, max_size=40),
       st.sampled_from(["gpt2", "cl100k"]))
def test_marked_pretokens_cover_every_guessed_document(words, spaces, pattern):
    """A document the language guess passes holds 3 marked pretokens of that language or more."""
    from bpe_core.methods.supratok.script import FI_MARKER, TR_MARKER, marker_words

    text = "".join(w + s for w, s in zip(words, spaces))
    lang = guess_suffix_language(text)
    if lang is None:
        return
    data = text.encode()
    ends = pretoken_ends(data, pattern)
    pieces = [data[a:b] for a, b in zip(np.concatenate(([0], ends[:-1])), ends)]
    table = WordTable.from_counts(Counter(pieces))
    marks = marker_words(table)
    index = WordIndex(table.arena, table.offsets)
    ids = index.word_ids(data, ends, 0)
    bit = TR_MARKER if lang == "tr" else FI_MARKER
    assert int(np.count_nonzero(marks[ids] & bit)) >= 3
    assert guess_candidates(marks[ids], np.array([0])).tolist() == [0]


@settings(max_examples=200)
@given(st.lists(st.sampled_from(["ve", "bir", "BİR", "bu", "ja", "että", "oli", "ve,", "'ve"]), max_size=12),
       st.lists(st.sampled_from(["the", "cat", "x", "7", "12", "é", "Ω", ",", "a.b", "ve"]), min_size=100, max_size=400),
       st.randoms(use_true_random=False),
       st.lists(st.sampled_from([" "] * 12 + ["\n", "\t", "\xa0", "  ", "\x1c", ""]), min_size=412, max_size=412),
       st.sampled_from(["gpt2", "cl100k"]))
def test_guess_candidates_keep_every_guessed_document(markers, fillers, rnd, spaces, pattern):
    """``guess_candidates`` leaves out only documents the guess gives no language (its 2% bound:
    long documents of many words with a few function words among them)."""
    from bpe_core.methods.supratok.script import marker_words

    words = markers + fillers
    rnd.shuffle(words)
    text = "".join(w + s for w, s in zip(words, spaces)) or "x"
    data = text.encode()
    ends = pretoken_ends(data, pattern)
    pieces = [data[a:b] for a, b in zip(np.concatenate(([0], ends[:-1])), ends)]
    table = WordTable.from_counts(Counter(pieces))
    ids = WordIndex(table.arena, table.offsets).word_ids(data, ends, 0)
    kept = guess_candidates(marker_words(table)[ids], np.array([0])).tolist()
    if guess_suffix_language(text) is not None:
        assert kept == [0]


def test_guess_candidates_at_the_two_percent_edge():
    """3 Turkish function words among 150 words: the guess passes (3 >= 2% of 150) and the document
    is kept; among 300 it fails and the document is left out."""
    from bpe_core.methods.supratok.script import marker_words

    for n_words, lang in ((150, "tr"), (300, None)):
        text = "ve bir bu" + " the" * (n_words - 3)
        assert guess_suffix_language(text) == lang
        data = text.encode()
        ends = pretoken_ends(data, "gpt2")
        table = WordTable.from_counts(Counter(data[a:b] for a, b in zip(np.concatenate(([0], ends[:-1])), ends)))
        ids = WordIndex(table.arena, table.offsets).word_ids(data, ends, 0)
        assert guess_candidates(marker_words(table)[ids], np.array([0])).tolist() == ([0] if lang else [])


@settings(max_examples=80)
@given(st.lists(st.sampled_from([b" the", b" 12", b"\n\n", b",", b"x", b"<|endoftext|>"]), max_size=40))
def test_span_ends_slice_the_word_ids_of_each_span(words):
    text = b"".join(words) + b" the"
    spans, _ = split_spans(text, 0, len(text), [b"<|endoftext|>"])
    pieces = []
    for s, e in spans:
        ends = pretoken_ends(text[s:e], "gpt2") + s
        pieces.append(ends)
    table = WordTable.from_counts(Counter(text[a:b] for (s, _), ends in zip(spans, pieces)
                                          for a, b in zip(np.concatenate(([s], ends[:-1])), ends)))
    index = WordIndex(table.arena, table.offsets)
    numeric = np.zeros(table.n_words, np.uint8)
    span_ends = np.zeros(spans.shape[0], np.int64)
    ids, _, _, _, missing = chunk_unit_stream(np.frombuffer(text, np.uint8), spans, 0, index, numeric,
                                              span_ends=span_ends)
    assert missing == 0
    first = 0
    for (s, _), ends, end in zip(spans, pieces, span_ends):
        assert ids[first:end].tolist() == index.word_ids(text, ends, s).tolist()
        first = end
    assert first == ids.size
