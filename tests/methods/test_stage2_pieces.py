"""SuperBPE stage 2 on pieces (``superbpe.stage2_merges``): the same merges, tokens and final token
count as one engine run on the whole units, for any first cut (restarts included)."""
import functools
import os
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bpe_core.engine.merge import MergeEngine
from bpe_core.engine.units import (CUT_LONG_PIECE, SKETCH_MAX, cut_pieces, pair_counts, pair_levels, pair_sketch,
                                   sketch_bounds)
from bpe_core.methods.superbpe import Stage2Rules, first_cut, sketch_bits, stage2_merges
from bpe_core.methods.superbpe.train import _allowed
from units_helpers import recorded_ids, spans_and_table

#: GPT-2's pattern written out, so it runs as a custom regex (the Python units path)
GPT2_AS_CUSTOM = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

TOKENS = [bytes([i]) for i in range(256)]

# units over a small alphabet (many repeats, runs like "aaaa", spaces and ': ' for the rules)
unit = st.lists(st.sampled_from(list(b"ab :c1")), max_size=14)
units_st = st.lists(st.tuples(unit, st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=25)


def as_arrays(units):
    symbols = np.array([s for u, _, _ in units for s in u], dtype=np.uint32)
    offsets = np.concatenate(([0], np.cumsum([len(u) for u, _, _ in units]))).astype(np.int64)
    weights = np.array([w for _, w, _ in units], dtype=np.int64)
    counts = weights + np.array([extra for _, _, extra in units], dtype=np.int64)   # counts >= weights
    return symbols, offsets, weights, counts


def random_units(seed, alphabet, n_symbols, n_cuts, max_weight):
    """``(rng, symbols, offsets, weights)``: random symbols below ``alphabet`` cut into ``n_cuts + 1``
    non-empty sequences of weights below ``max_weight``."""
    rng = np.random.default_rng(seed)
    symbols = rng.integers(0, alphabet, n_symbols).astype(np.uint32)
    offsets = np.concatenate(([0], np.sort(rng.choice(np.arange(1, n_symbols), n_cuts, replace=False)),
                              [n_symbols])).astype(np.int64)
    return rng, symbols, offsets, rng.integers(0, max_weight, offsets.size - 1).astype(np.int64)


def window_sums(symbols, offsets, weights):
    """Plain numpy: the distinct pairs of the windows (uint64 ``left << 32 | right``, sorted), each
    one's weighted count, and per position its window's count (0 at a sequence's last position)."""
    keys = (symbols[:-1].astype(np.uint64) << np.uint64(32)) | symbols[1:].astype(np.uint64)
    inside = np.ones(keys.size, bool)
    inside[offsets[1:-1] - 1] = False                  # windows across sequence ends do not count
    w = np.repeat(weights, np.diff(offsets))[:-1]
    uniq, inv = np.unique(keys[inside], return_inverse=True)
    sums = np.bincount(inv, weights=w[inside]).astype(np.int64)
    per_position = np.zeros(symbols.size, dtype=np.int64)
    per_position[np.flatnonzero(inside)] = sums[inv]
    return uniq, sums, per_position


def whole_units(symbols, offsets, weights, counts, n, rules, weighted=False):
    engine = MergeEngine(symbols, offsets, weights, TOKENS)
    steps = engine.run(n, allowed=_allowed(rules, TOKENS))
    _, final_offsets, _ = engine.words()
    if weighted:        # also the final token count with the weights instead of the counts
        return (steps, engine.tokens(), int((np.diff(final_offsets) * counts).sum()),
                int((np.diff(final_offsets) * weights).sum()))
    return steps, engine.tokens(), int((np.diff(final_offsets) * counts).sum())


@settings(max_examples=150)
@given(units_st, st.integers(0, 40), st.integers(1, 40),
       st.sampled_from([Stage2Rules(distinct=True), Stage2Rules(max_words=1, distinct=True),
                        Stage2Rules(distinct=False)]))
def test_pieces_equal_whole_units(units, n, cut, rules):
    symbols, offsets, weights, counts = as_arrays(units)
    steps, tokens, final, weighted = whole_units(symbols, offsets, weights, counts, n, rules, weighted=True)
    got = stage2_merges(symbols, offsets, weights, counts, TOKENS, n, _allowed(rules, TOKENS),
                        bounded=rules.distinct, cut=cut, count_weighted=True)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens
    assert got.final_tokens == final
    assert got.weighted_tokens == weighted          # the units with their weights, not their counts
    if rules.distinct and cut > 1 and len(steps) == n and n > 0:
        assert got.info["cuts"][0]["cut"] == cut          # the forced first cut was used


@settings(max_examples=100)
@given(units_st, st.integers(0, 40), st.integers(1, 40), st.integers(1, 2))
def test_units_let_go_and_listed_again_for_a_restart(units, n, cut, n_parts):
    """``regenerate``: the units given (as lists) are let go once cut and listed again only for a
    restart; any first cut, restarts included, merges as the whole units do, and the lists are
    emptied."""
    symbols, offsets, weights, counts = as_arrays(units)
    rules = Stage2Rules(distinct=True)
    steps, tokens, final = whole_units(symbols, offsets, weights, counts, n, rules)
    at = len(units) // 2 if n_parts == 2 and len(units) > 1 else len(units)

    def listed():
        parts = [(symbols[offsets[a]:offsets[b]], offsets[a:b + 1] - offsets[a], weights[a:b], counts[a:b])
                 for a, b in ((0, at), (at, len(units))) if b > a]
        return tuple([np.array(p[k]) for p in parts] for k in range(4))

    calls = []

    def again():
        calls.append(1)
        return listed()

    given_units = listed()
    got = stage2_merges(*given_units, TOKENS, n, _allowed(rules, TOKENS), cut=cut, regenerate=again)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final
    assert all(lst == [] for lst in given_units)              # let go
    assert len(calls) == got.info["restarts"]                 # listed again once per restart


def test_units_listed_again_must_be_the_same():
    units = [(list(b"ab ab"), 3, 0), (list(b"abab"), 3, 1)]
    symbols, offsets, weights, counts = as_arrays(units)
    from bpe_core.errors import InternalError
    wrong = (symbols[:-1], np.array([0, 5, 8]), weights, counts)     # a token short
    with pytest.raises(InternalError, match="listed again"):
        stage2_merges([symbols], [offsets], [weights], [counts], TOKENS, 3, _allowed(Stage2Rules(distinct=True), TOKENS),
                      cut=1000, regenerate=lambda: wrong)


@settings(max_examples=40, deadline=None)
@given(units_st, st.integers(0, 40), st.integers(1, 40))
def test_pieces_with_mapped_engine_arrays_equal_whole_units(tmp_path_factory, units, n, cut):
    """The same with the engine's read-only arrays in mapped files (any size is over the threshold):
    forgetting pairs frees only lists in RAM, never the mapped initial lists."""
    rules = Stage2Rules(distinct=True)
    symbols, offsets, weights, counts = as_arrays(units)
    steps, tokens, final = whole_units(symbols, offsets, weights, counts, n, rules)
    got = stage2_merges(symbols, offsets, weights, counts, TOKENS, n, _allowed(rules, TOKENS), cut=cut,
                        spill_dir=str(tmp_path_factory.mktemp("spill")), map_threshold=0)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final


@given(units_st)
def test_levels_and_pieces_equal_plain_counts(units):
    symbols, offsets, weights, counts = as_arrays(units)
    levels, pair_counts = pair_levels(symbols, offsets, weights)
    seqs = [list(symbols[offsets[i]:offsets[i + 1]]) for i in range(len(units))]
    plain = Counter()
    for s, w in zip(seqs, weights):
        for a, b in zip(s, s[1:]):
            plain[(a, b)] += int(w)
    expect = [plain[(s[k], s[k + 1])] if k + 1 < len(s) else 0 for s in seqs for k in range(len(s))]
    assert levels.tolist() == expect
    assert sorted(pair_counts.tolist()) == sorted(plain.values())
    for cut in (1, 2, 3, 5):
        data, starts, pw, pc, single = cut_pieces(symbols, offsets, levels, weights, counts, cut)
        want_w, want_c, want_single = Counter(), Counter(), 0
        for s, lv, w, c in zip(seqs, np.split(levels, offsets[1:-1]), weights, counts):
            start = 0
            for k in range(len(s)):
                if k + 1 == len(s) or lv[k] < cut:
                    piece = tuple(s[start:k + 1])
                    if len(piece) == 1:
                        want_single += int(c)
                    else:
                        want_w[piece] += int(w)
                        want_c[piece] += int(c)
                    start = k + 1
        got = _as_dict((data, starts, pw, pc, single))
        assert got == {p: (want_w[p], want_c[p]) for p in want_w}
        assert single == want_single


@settings(max_examples=150)
@given(units_st, st.lists(st.tuples(st.sampled_from(list(b"ab :c1x")), st.sampled_from(list(b"ab :c1x"))),
                          unique=True, max_size=12), st.booleans())
def test_pair_counts_equal_plain_counts(units, pairs, narrow):
    """``pair_counts`` (stage 2's guard of the rebuilds it foresees): the weighted count of each pair
    asked for, over the windows inside the sequences (units of weight 0 add nothing), in any order."""
    symbols, offsets, weights, _ = as_arrays(units)
    plain = Counter()
    for u in range(len(units)):
        s = symbols[offsets[u]:offsets[u + 1]].tolist()
        for a, b in zip(s, s[1:]):
            plain[(a, b)] += int(weights[u])
    keys = np.array([(a << 32) | b for a, b in pairs], dtype=np.uint64)
    got = pair_counts(symbols.astype(np.uint16 if narrow else np.uint32), offsets, weights, keys)
    assert got.tolist() == [plain[p] for p in pairs]


def test_pair_counts_want_unique_keys():
    with pytest.raises(ValueError, match="unique"):
        pair_counts(np.array([1, 2], np.uint32), np.array([0, 2]), np.array([1]), np.array([5, 5], np.uint64))


def test_first_cut_and_a_restart_are_reported():
    # "ab" everywhere (count 12): a first cut of 1000 sees no pair that counts as much, so it restarts
    units = [(list(b"ab ab"), 3, 0), (list(b"abab"), 3, 1)]
    symbols, offsets, weights, counts = as_arrays(units)
    rules = Stage2Rules(distinct=True)
    got = stage2_merges(symbols, offsets, weights, counts, TOKENS, 3, _allowed(rules, TOKENS), cut=1000)
    assert got.steps == whole_units(symbols, offsets, weights, counts, 3, rules)[0]
    assert [c["cut"] for c in got.info["cuts"]][:2] == [1000, 250] and got.info["restarts"] >= 1
    assert first_cut(np.array([5, 9, 1, 7]), 1) == 5        # rank int(2.5 x 1) = 2 from the top: the 3rd


@settings(max_examples=80)
@given(st.lists(st.sampled_from([b" the", b" cat", b" 12", b"\n", b"\n\n", b"  ", b",", b"x", b"<|endoftext|>",
                                 b" supercalifragilistic", b" 0123456789abcdef", b"\xc3\xa9t\xc3\xa9",
                                 b" M'XX%,#'A=9&4@#0A", b"*!A9&4@&3!4", b"M;5%&4!"]),
                max_size=40).map(b"".join), st.booleans(), st.sampled_from([1.0, 0.5]), st.booleans())
@example(b"*!A9&4@&3!4" * 5 + b" 12\n\n the cat 0123" + b"M;5%&4!" * 8 + b"\n  x" + b"*!A9&4@&3!4" * 4, True, 1.0, True)
@example(b"*!A9&4@&3!4" * 5 + b" 12\n\n the cat 0123" + b"M;5%&4!" * 8 + b"\n  x" + b"*!A9&4@&3!4" * 4, False, 1.0, True)
@example(b" the" + b"*!A9&4@&3!4" * 5 + b"<|endoftext|>" + b"M;5%&4!" * 8 + b" 12", True, 1.0, True)
def test_unit_stream_lists_the_counted_units(text, cut_spaces, fraction, regions):
    """The native stream lists the units the Python scanner path (``_units_of`` with GPT-2 written as a
    custom regex) counts, with the same sample and (``regions``) the same encoded marks; without a
    sample, the direct path (words written as they come, marks added when a region ends) lists what
    the buffered path (the one a sample takes) lists with a sample that keeps every unit."""
    from bpe_core.engine.units import WordIndex, chunk_unit_stream
    from bpe_core.methods.superbpe import word_classes, word_flags
    from bpe_core.methods.superbpe.units import _units_of
    from bpe_core.pretok.pretokenize import PATTERN_IDS

    specials = [b"<|endoftext|>"]
    spans, pieces, table = spans_and_table(text)
    index, flags = WordIndex(table.arena, table.offsets), word_flags(table)
    classes = word_classes(table) if regions else None
    keep = 0xFFFFFFFFFFFFFFFF if fraction >= 1 else int(fraction * 2 ** 64)
    buf = np.frombuffer(text, dtype=np.uint8)
    data, starts, counts, n_seen, n_kept = _units_of(buf, "t", specials, GPT2_AS_CUSTOM, keep, index, flags,
                                                     cut_spaces, classes)
    counted = Counter({tuple(data[starts[i]:starts[i + 1]]): int(counts[i]) for i in range(counts.size)})
    ids, bounds, seen, kept, missing = chunk_unit_stream(text, spans, PATTERN_IDS["gpt2"], index, flags, keep,
                                                         cut_spaces, classes)
    listed = Counter(tuple(ids[bounds[i]:bounds[i + 1]]) for i in range(bounds.size - 1))
    assert listed == counted and (seen, kept, missing) == (n_seen, n_kept, 0)
    # the buffered path (the twin): the same list, with or without a sample
    b_ids, b_bounds, b_seen, b_kept, _ = chunk_unit_stream(text, spans, PATTERN_IDS["gpt2"], index, flags, keep,
                                                           cut_spaces, classes, buffered=True)
    assert b_ids.tolist() == ids.tolist() and b_bounds.tolist() == bounds.tolist()
    assert (b_seen, b_kept) == (seen, kept)
    if fraction >= 1 and not regions:   # every pretoken, in text order, with its row of the table
        row = {table.arena[table.offsets[i]:table.offsets[i + 1]].tobytes(): i for i in range(table.n_words)}
        assert ids.tolist() == [row[p] for ps in pieces for p in ps]


def test_levels_when_the_pair_table_grows():
    # ~100k distinct pairs in 120k symbols: more than the first table holds, so it grows mid-pass
    rng = np.random.default_rng(5)
    symbols = rng.integers(0, 2000, 120_000).astype(np.uint32)
    offsets = np.array([0, 50_000, 50_001, 120_000], dtype=np.int64)
    weights = np.array([2, 7, 1], dtype=np.int64)
    levels, pair_counts = pair_levels(symbols, offsets, weights)
    uniq, sums, expect = window_sums(symbols, offsets, weights)
    assert pair_counts.size == uniq.size > 70_000
    assert levels.tolist() == expect.tolist() and sorted(pair_counts.tolist()) == sorted(sums.tolist())


def test_pieces_when_the_piece_table_grows():
    # ~70k distinct pieces: more than the first table holds, so it grows while pieces wait in a batch
    rng = np.random.default_rng(7)
    symbols = rng.integers(0, 40, 500_000).astype(np.uint32)
    offsets = np.array([0, 100_000, 100_003, 500_000], dtype=np.int64)
    weights = np.array([1, 0, 2], dtype=np.int64)
    counts = np.array([1, 5, 3], dtype=np.int64)
    levels = rng.integers(0, 4, symbols.size).astype(np.uint32)
    data, starts, pw, pc, single = cut_pieces(symbols, offsets, levels, weights, counts, 1)
    want, want_single = _plain_pieces(symbols, offsets, levels, weights, counts, 1)
    got = {tuple(data[starts[i]:starts[i + 1]].tolist()): (pw[i], pc[i]) for i in range(pw.size)}
    assert len(got) > 46_000
    assert got == want and single == want_single


@pytest.mark.parametrize("alphabet, shift", [(50, 0), (3000, 0), (50, 30)])
def test_levels_on_two_threads_equal_one(alphabet, shift):
    # above the size where pair_levels splits the sequences between two threads (3000: tables grow;
    # shift: the second half's symbols are shifted, so some pairs are only in one half's table)
    _, symbols, offsets, weights = random_units(alphabet + shift, alphabet, 1_200_000, 999, 4)
    symbols[600_000:] += np.uint32(shift)
    one = pair_levels(symbols, offsets, weights, threads=1)
    two = pair_levels(symbols, offsets, weights, threads=2)
    assert np.array_equal(one[0], two[0])
    assert np.array_equal(np.sort(one[1]), np.sort(two[1]))
    # and the plain count
    _, sums, expect = window_sums(symbols, offsets, weights)
    assert np.array_equal(two[0].astype(np.int64), expect)
    assert np.array_equal(np.sort(two[1]), np.sort(sums))


def test_pieces_on_two_threads_equal_one():
    # above the size where cut_pieces splits the sequences between two threads (the tables grow)
    rng, symbols, offsets, weights = random_units(11, 30, 1_300_000, 499, 3)
    counts = weights + rng.integers(0, 2, offsets.size - 1)
    levels = rng.integers(0, 3, symbols.size).astype(np.uint32)
    one = cut_pieces(symbols, offsets, levels, weights, counts, 1, threads=1)
    two = cut_pieces(symbols, offsets, levels, weights, counts, 1, threads=2)
    assert one[2].size > 100_000
    # the same pieces, weights, counts and single count; two threads list them in another order
    # (by the top bit of their hash, then as first seen)
    assert _as_dict(one) == _as_dict(two) and one[4] == two[4]
    assert one[0].size == two[0].size and two[1][-1] == two[0].size


@pytest.mark.parametrize("threads", [1, 2])
def test_a_cut_that_consumes_its_parts_lists_the_same_pieces(threads):
    """``cut_pieces_parts(consume=True)`` (stage 2 lets its units go while they are cut) empties the
    list of parts once it has read them, drops the sequences' last references (their memory is
    freed before the tables are joined) and lists exactly what ``cut_pieces`` lists."""
    import gc
    import weakref
    from bpe_core.engine.units import cut_pieces_parts, unit_halves

    rng, symbols, offsets, weights = random_units(17, 30, 1_300_000, 499, 3)
    counts = weights + rng.integers(0, 2, offsets.size - 1)
    keep = np.packbits(rng.integers(0, 2, 1 << 12).astype(bool), bitorder="little")
    want = cut_pieces(symbols, offsets, None, weights, counts, 1, threads=threads, keep=keep)
    parts = unit_halves(threads, symbols, offsets, weights, counts)
    assert len(parts) == threads
    alive = weakref.ref(symbols)
    del symbols
    got = cut_pieces_parts(parts, 1, keep=keep, consume=True)
    gc.collect()
    assert parts == [] and alive() is None
    assert [a.tolist() for a in got[:4]] == [a.tolist() for a in want[:4]] and got[4] == want[4]


def _plain_pieces(symbols, offsets, levels, weights, counts, cut):
    """Plain Python: the weighted pieces between the cuts (``Counter``s) and the single count."""
    want_w, want_c, single = Counter(), Counter(), 0
    # (Python lists, not numpy scalars one at a time: the same loop, several times faster)
    symbols, offsets, levels = symbols.tolist(), offsets.tolist(), levels.tolist()
    weights, counts = weights.tolist(), counts.tolist()
    for u in range(len(offsets) - 1):
        a, b = offsets[u], offsets[u + 1]
        start = a
        for k in range(a, b):
            if k + 1 == b or levels[k] < cut:
                piece = tuple(symbols[start:k + 1])
                if len(piece) == 1:
                    single += counts[u]
                else:
                    want_w[piece] += weights[u]
                    want_c[piece] += counts[u]
                start = k + 1
    return {p: (want_w[p], want_c[p]) for p in want_w}, single


@functools.lru_cache(maxsize=None)
def _two_symbol_case():
    """The input of ``test_pieces_of_two_symbols_in_their_own_table`` and its plain-Python counts
    (seconds of Python: made once for both thread counts)."""
    rng, symbols, offsets, weights = random_units(13, 2000, 1_300_000, 40_000, 4)
    symbols[rng.integers(0, symbols.size, 1000)] = np.uint32(0xFFFFFFFE)    # the largest id there is
    counts = weights + rng.integers(0, 3, offsets.size - 1)
    levels = rng.choice(np.array([0, 5], np.uint32), symbols.size, p=[0.55, 0.45])   # mostly short pieces
    return (symbols, offsets, levels, weights, counts), _plain_pieces(symbols, offsets, levels, weights, counts, 1)


@pytest.mark.parametrize("threads", [1, 2])
def test_pieces_of_two_symbols_in_their_own_table(threads):
    """Many distinct pieces of two symbols (their table grows from 16k slots several times), among
    longer ones, found in both halves of the sequences: counted as plain Python counts them, each
    listed once, after the longer pieces."""
    arrays, (want, single) = _two_symbol_case()
    symbols, offsets, levels, weights, counts = (a.copy() for a in arrays)
    got = cut_pieces(symbols, offsets, levels, weights, counts, 1, threads=threads)
    assert _as_dict(got) == want and got[4] == single
    lengths = np.diff(got[1])
    assert (lengths == 2).sum() > 100_000 and (lengths > 2).any()
    first_two = int(np.argmax(lengths == 2))
    assert (lengths[first_two:] == 2).all()         # the two-symbol pieces come last


@pytest.mark.parametrize("threads", [1, 2])
def test_long_pieces_are_listed_as_they_come_and_merge_as_whole_units(threads):
    """A long piece (``CUT_LONG_PIECE`` symbols or more) that comes again is listed again, in both
    halves of the sequences (absorbed from the other half as it is); the shorter ones once each.
    Summed, they are the plain counts, and stage 2 on them gives the merges of the whole units."""
    rng = np.random.default_rng(5)
    long_ones = [list(rng.integers(0, 40, CUT_LONG_PIECE + k)) for k in range(4)]
    # the short ones run up to one symbol below the threshold (deduplicated), the long ones from it
    short_ones = [list(rng.integers(40, 60, 2 + k % (CUT_LONG_PIECE - 2))) for k in range(30)]
    seqs = [long_ones[k % 4] if k % 3 == 0 else short_ones[k % 30] for k in range(300_000)]
    units = [(s, 1 + k % 2, k % 3) for k, s in enumerate(seqs)]
    symbols, offsets, weights, counts = as_arrays(units)
    levels = np.full(symbols.size, 9, np.uint32)
    levels[offsets[1:] - 1] = 0                  # every sequence is one piece
    got = cut_pieces(symbols, offsets, levels, weights, counts, 1, threads=threads)
    lengths = np.diff(got[1])
    assert (lengths == CUT_LONG_PIECE - 1).any() and (lengths == CUT_LONG_PIECE).any()
    assert (lengths >= CUT_LONG_PIECE).sum() == 100_000            # each one listed
    assert (lengths < CUT_LONG_PIECE).sum() == len({tuple(s) for s in seqs if len(s) < CUT_LONG_PIECE}) == 20
    want, single = _plain_pieces(symbols, offsets, levels, weights, counts, 1)
    assert _as_dict(got) == want and got[4] == single == 0
    small = as_arrays(units[:3000])
    steps, tokens, final = whole_units(*small, 25, Stage2Rules(distinct=True))
    res = stage2_merges(*small, TOKENS, 25, _allowed(Stage2Rules(distinct=True), TOKENS), threads=threads)
    assert [tuple(s) for s in res.steps] == [tuple(s) for s in steps]
    assert res.tokens == tokens and res.final_tokens == final


def _as_dict(pieces):
    """The pieces' summed weights and counts; a piece listed twice must be a long one (pieces of
    ``CUT_LONG_PIECE`` symbols or more are listed as they come, the shorter ones once)."""
    data, starts, w, c, _ = (a.tolist() if isinstance(a, np.ndarray) else a for a in pieces)
    out: dict = {}
    for i in range(len(w)):
        piece = tuple(data[starts[i]:starts[i + 1]])
        if piece in out:
            assert len(piece) >= CUT_LONG_PIECE, piece
        ow, oc = out.get(piece, (0, 0))
        out[piece] = (ow + w[i], oc + c[i])
    return out


@settings(max_examples=80)
@given(st.lists(st.sampled_from([b" the", b" cat", b" 12", b"\n", b"\n\n", b"  ", b",", b"x", b"<|endoftext|>",
                                 b" M'XX%,#'A=9&4@#0A", b"*!A9&4@&3!4", b"M;5%&4!", b" 0123456789abcdef",
                                 b" supercalifragilistic", b"\xc3\xa9t"]),
                max_size=60).map(b"".join), st.booleans(), st.integers(0, 2 ** 64 - 1), st.booleans(),
       st.booleans(), st.randoms(use_true_random=False))
@example(b"*!A9&4@&3!4" * 5 + b" 12\n\n the cat 0123" + b"M;5%&4!" * 8 + b"\n  x" + b"*!A9&4@&3!4" * 4, True,
         2 ** 63, True, True, random.Random(0))
def test_sampled_unit_stream_equals_the_buffered_path(text, cut_spaces, keep, regions, with_seg, rnd):
    """With any sample (``keep_below`` from 0, none kept, to 2**64 - 1, all kept) the direct path of
    ``chunk_unit_stream`` (every word written as it comes, the units the sample leaves out taken off
    again: at once, or with regions when the region ends, hashed with their mark) lists exactly what
    the buffered path lists: ids or stage-1 tokens, bounds, units seen and kept."""
    from bpe_core.engine.units import WordIndex, chunk_unit_stream
    from bpe_core.methods.superbpe import word_classes, word_flags
    from bpe_core.pretok.pretokenize import PATTERN_IDS

    spans, _, table = spans_and_table(text)
    index, flags = WordIndex(table.arena, table.offsets), word_flags(table)
    classes = word_classes(table) if regions else None
    seg = [[rnd.randrange(0, 5000) for _ in range(rnd.randrange(0, 4))] for _ in range(table.n_words)]
    seg_args = ((np.array([t for s in seg for t in s], dtype=np.uint32),
                 np.concatenate(([0], np.cumsum([len(s) for s in seg]))).astype(np.int64)) if with_seg else ())
    args = (text, spans, PATTERN_IDS["gpt2"], index, flags, keep, cut_spaces, classes) + seg_args
    direct = chunk_unit_stream(*args)
    buffered = chunk_unit_stream(*args, buffered=True)
    assert direct[0].tolist() == buffered[0].tolist() and direct[1].tolist() == buffered[1].tolist()
    assert direct[2:] == buffered[2:]
    if with_seg:
        # uint16 stage-1 tokens with the encoded units flagged: the units with marks, marks taken off
        from bpe_core.engine.units import strip_marks
        d16, b16, seen, kept, missing, enc = chunk_unit_stream(*args, narrow=True)
        data, starts, want_enc = strip_marks(direct[0].copy(), direct[1].copy())
        assert d16.dtype == np.uint16 and d16.tolist() == data.tolist() and b16.tolist() == starts.tolist()
        assert enc.tolist() == want_enc.tolist() and (seen, kept, missing) == direct[2:]


@settings(max_examples=60)
@given(st.lists(st.sampled_from([b" the", b" cat", b" 12", b"\n", b"\n\n", b"  ", b",", b"x", b"<|endoftext|>",
                                 b" M'XX%,#'A=9&4@#0A", b"*!A9&4@&3!4", b" supercalifragilistic", b"\xc3\xa9t"]),
                max_size=40).map(b"".join), st.booleans(), st.sampled_from([1.0, 0.5]), st.booleans(),
       st.randoms(use_true_random=False))
def test_unit_stream_writes_stage1_tokens(text, cut_spaces, fraction, regions, rnd):
    """``chunk_unit_stream(seg_symbols=, seg_offsets=)`` equals listing the word-id units and expanding
    each word id by a plain loop over the segmentation (marks kept); the sample is the same."""
    from bpe_core.engine.units import ENCODED_MARK, WordIndex, chunk_unit_stream, expand_units
    from bpe_core.methods.superbpe import word_classes, word_flags
    from bpe_core.pretok.pretokenize import PATTERN_IDS

    spans, _, table = spans_and_table(text)
    index, flags = WordIndex(table.arena, table.offsets), word_flags(table)
    classes = word_classes(table) if regions else None
    keep = 0xFFFFFFFFFFFFFFFF if fraction >= 1 else int(fraction * 2 ** 64)
    # any segmentation (the kernel only copies it): 0-3 random token ids per word
    seg = [[rnd.randrange(0, 5000) for _ in range(rnd.randrange(0, 4))] for _ in range(table.n_words)]
    seg_symbols = np.array([t for s in seg for t in s], dtype=np.uint32)
    seg_offsets = np.concatenate(([0], np.cumsum([len(s) for s in seg]))).astype(np.int64)
    args = (text, spans, PATTERN_IDS["gpt2"], index, flags, keep, cut_spaces, classes)
    ids, bounds, seen, kept, missing = chunk_unit_stream(*args)
    toks, tbounds, seen2, kept2, missing2 = chunk_unit_stream(*args, seg_symbols, seg_offsets)
    assert (seen2, kept2, missing2) == (seen, kept, missing)
    plain = [[t for w in ids[bounds[u]:bounds[u + 1]].tolist()
              for t in ([w] if w == ENCODED_MARK else seg[w])] for u in range(bounds.size - 1)]
    assert [toks[tbounds[u]:tbounds[u + 1]].tolist() for u in range(tbounds.size - 1)] == plain
    e_syms, e_offs = expand_units(ids, bounds, seg_symbols, seg_offsets)
    assert e_syms.tolist() == toks.tolist() and e_offs.tolist() == tbounds.tolist()


@settings(max_examples=100)
@given(st.lists(st.tuples(st.lists(st.integers(0, 6), max_size=5), st.booleans()), max_size=30))
def test_strip_marks_equals_numpy(units):
    """``strip_marks`` (in place) equals the numpy twin: marks off the ends of the marked units."""
    from bpe_core.engine.units import ENCODED_MARK, strip_marks

    data = np.array([t for u, m in units for t in u + ([ENCODED_MARK] if m else [])], dtype=np.uint32)
    starts = np.concatenate(([0], np.cumsum([len(u) + m for u, m in units]))).astype(np.int64)
    nonempty = starts[1:] > starts[:-1]
    encoded = np.zeros(len(units), dtype=bool)
    encoded[nonempty] = data[starts[1:][nonempty] - 1] == ENCODED_MARK
    want_data = data[data != ENCODED_MARK]
    want_starts = starts - np.concatenate(([0], np.cumsum(encoded)))
    got_data, got_starts, got_enc = strip_marks(data.copy(), starts.copy())
    assert got_data.tolist() == want_data.tolist() and got_starts.tolist() == want_starts.tolist()
    assert got_enc.tolist() == encoded.tolist() == [m for _, m in units]
    with pytest.raises(ValueError):
        strip_marks(data.copy(), np.array([0, data.size + 1]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([b" the", b" cat", b" 12", b"\n", b"\n\n", b"  ", b",", b"x", b"<|endoftext|>",
                                 b" 0123456789abcdef", b"\xc3\xa9t\xc3\xa9", b" M'XX%,#'A=9&4@#0A", b"*!A9&4@&3!4",
                                 b"M;5%&4!"]),
                max_size=50).map(b"".join), st.booleans(), st.booleans(), st.booleans(), st.randoms(use_true_random=False))
@example(b"*!A9&4@&3!4" * 5 + b" 12\n\n the cat 0123" + b"M;5%&4!" * 8 + b"\n  x<|endoftext|>" + b"*!A9&4@&3!4" * 4,
         True, True, True, None)
def test_id_unit_stream_equals_the_scan(text, cut_spaces, regions, with_seg, rnd):
    """``id_unit_stream`` over the word ids of the text's pretokens (span by span) lists what
    ``chunk_unit_stream`` lists scanning the bytes: units, encoded marks, stage-1 tokens, counts."""
    import random
    from bpe_core.engine.units import WordIndex, chunk_unit_stream, id_unit_stream, strip_marks
    from bpe_core.methods.superbpe import word_classes, word_flags
    from bpe_core.pretok.pretokenize import PATTERN_IDS

    rnd = rnd or random.Random(0)
    spans, pieces, table = spans_and_table(text)
    ids, breaks = recorded_ids(pieces, table)
    flags = word_flags(table)
    classes = word_classes(table) if regions else None
    seg = ()
    if with_seg:
        segs = [[rnd.randrange(0, 5000) for _ in range(rnd.randrange(1, 4))] for _ in range(table.n_words)]
        seg = (np.array([t for s in segs for t in s], dtype=np.uint32),
               np.concatenate(([0], np.cumsum([len(s) for s in segs]))).astype(np.int64))
    want = chunk_unit_stream(text, spans, PATTERN_IDS["gpt2"], WordIndex(table.arena, table.offsets), flags,
                             0xFFFFFFFFFFFFFFFF, cut_spaces, classes, *seg)
    got = id_unit_stream(ids, breaks, flags, cut_spaces, classes, *seg)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    assert got[2:] == want[2:4]
    # the room asked for is a hint: too little (the output grows) or much more, the same units
    for reserve in (1, 3 * len(ids) + 100):
        again = id_unit_stream(ids, breaks, flags, cut_spaces, classes, *seg, reserve=reserve)
        assert again[0].tolist() == got[0].tolist() and again[1].tolist() == got[1].tolist()
    # the ids in segments read one after the other (the record's chunks; some empty): the same
    cuts = sorted(rnd.randrange(0, len(ids) + 1) for _ in range(rnd.randrange(0, 5)))
    segments = [ids[a:b] for a, b in zip([0] + cuts, cuts + [len(ids)])] + [ids[:0]]
    split = id_unit_stream(segments, breaks, flags, cut_spaces, classes, *seg)
    assert split[0].tolist() == got[0].tolist() and split[1].tolist() == got[1].tolist() and split[2:] == got[2:]
    # flagged instead of marked: the marked units with their marks taken off, and which they were
    flagged = id_unit_stream(ids, breaks, flags, cut_spaces, classes, *seg, marks=False)
    data, starts, encoded = strip_marks(got[0].copy(), got[1].copy())
    assert flagged[0].tolist() == data.tolist() and flagged[1].tolist() == starts.tolist()
    assert flagged[2:4] == got[2:4] and flagged[4].tolist() == encoded.tolist()
    # narrow: the same units as uint16 (every id here is below 5000)
    narrow = id_unit_stream(segments, breaks, flags, cut_spaces, classes, *seg, marks=False, narrow=True)
    assert narrow[0].dtype == np.uint16 and narrow[0].tolist() == flagged[0].tolist()
    assert narrow[1].tolist() == flagged[1].tolist() and narrow[2:4] == flagged[2:4]
    assert narrow[4].tolist() == flagged[4].tolist()


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(0, 11), max_size=80), st.integers(0, 2 ** 32 - 1),
       st.booleans(), st.booleans(), st.sampled_from([0, 1, 10 ** 6]),
       st.sampled_from([0xFFFFFFFFFFFFFFFF, 1 << 63, 1 << 62]))
def test_narrow_units_read_one_record_a_word_and_list_the_general_path(n_words, ids, seed, cut_spaces, regions,
                                                                       reserve, keep_below):
    """``id_unit_stream(narrow=True)`` with a segmentation (its own loop: one 32-byte record a word)
    lists what the general loop lists as uint32: random flags (numeric, whitespace at either end),
    class counts that make some regions look encoded, words of 0 to 3 stage-1 tokens, spans, the ids
    in segments, any room asked for, with or without a sample (drawn in the narrow loop as in the
    general one: ``_narrow_close``, ``_narrow_region``); a word of more than 65535 tokens takes the
    general loop."""
    from bpe_core.engine.units import id_unit_stream
    rng = np.random.default_rng(seed)
    ids = np.array([i % n_words for i in ids], dtype=np.uint32)
    flags = rng.integers(0, 8, n_words).astype(np.uint8)
    # class counts (n, whitespace, punctuation, alphanumeric, digits): words like base64 or like prose,
    # so that some regions look encoded and some do not
    kinds = np.array([[20, 0, 8, 8, 4], [5, 1, 0, 4, 0], [3, 3, 0, 0, 0]], dtype=np.int32)
    classes = np.ascontiguousarray(kinds[rng.integers(0, 3, n_words)]) if regions else None
    lens = rng.integers(0, 4, n_words)
    if n_words > 1 and rng.integers(0, 8) == 0:
        lens[int(rng.integers(0, n_words))] = 70000          # too long for the record: the general loop
    seg_offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    seg_symbols = rng.integers(0, 60000, int(seg_offsets[-1])).astype(np.uint32)
    cuts = np.sort(rng.integers(0, ids.size + 1, int(rng.integers(0, 4))))
    breaks = np.unique(np.concatenate(([0], cuts, [ids.size]))).astype(np.int64)
    pieces = np.sort(rng.integers(0, ids.size + 1, int(rng.integers(0, 3))))
    segments = [ids[a:b] for a, b in zip(np.concatenate(([0], pieces)), np.concatenate((pieces, [ids.size])))]
    want = id_unit_stream(ids, breaks, flags, cut_spaces, classes, seg_symbols, seg_offsets, marks=False,
                          keep_below=keep_below)
    got = id_unit_stream(segments, breaks, flags, cut_spaces, classes, seg_symbols, seg_offsets, marks=False,
                         narrow=True, reserve=reserve, keep_below=keep_below)
    assert got[0].dtype == np.uint16 and got[0].tolist() == want[0].tolist()
    assert got[1].tolist() == want[1].tolist() and got[2:4] == want[2:4]
    assert got[4].tolist() == want[4].tolist()
    with pytest.raises(ValueError, match="not below"):
        id_unit_stream(np.concatenate((ids, [n_words])).astype(np.uint32), np.array([0, ids.size + 1]), flags,
                       cut_spaces, classes, seg_symbols, seg_offsets, marks=False, narrow=True)


@pytest.mark.parametrize("cut_spaces", [False, True])
@pytest.mark.parametrize("keep_below", [1 << 63, 3 << 62, 1 << 61])
def test_narrow_units_sample_encoded_regions_as_the_general_path(cut_spaces, keep_below):
    """A sample in the narrow loop with regions that look encoded: a unit of such a region is drawn
    by the hash of its word ids with ``ENCODED_MARK`` after them, as in the general loop; long
    streams (many regions, encoded and not, numeric words, empty words) so that the sample and the
    mark both decide units (checked: some units kept, some left out, some flagged)."""
    from bpe_core.engine.units import id_unit_stream
    rng = np.random.default_rng(11)
    n_words = 40
    flags = rng.integers(0, 8, n_words).astype(np.uint8)
    flags[:20] &= ~np.uint8(1)                    # the base64-like words are not numeric
    classes = np.zeros((n_words, 5), dtype=np.int32)
    classes[:20] = [20, 0, 8, 8, 4]               # base64-like
    classes[20:] = [5, 1, 0, 4, 0]                # prose-like
    lens = rng.integers(0, 4, n_words)
    seg_offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    seg_symbols = rng.integers(0, 60000, int(seg_offsets[-1])).astype(np.uint32)
    runs = [rng.integers(0, 20, int(rng.integers(5, 40))) if rng.integers(0, 2) else
            rng.integers(20, 40, int(rng.integers(1, 12))) for _ in range(300)]
    ids = np.concatenate(runs).astype(np.uint32)
    # a span every few runs (a region ends at a span's end, and at a whitespace cut with cut_spaces)
    ends = np.cumsum([r.size for r in runs])[::3]
    breaks = np.unique(np.concatenate(([0], ends, [ids.size]))).astype(np.int64)
    seg = (seg_symbols, seg_offsets)
    want = id_unit_stream(ids, breaks, flags, cut_spaces, classes, *seg, marks=False, keep_below=keep_below)
    # reserve: the room a sample's narrow loop is sized for; the loop is taken only while the words'
    # 32-byte records cost no more than that room at 2 bytes a token (n_words * 16 tokens: 640), so
    # 639 / 640 / 641 are the gate's edge (and 1: far less room than the units kept, grown)
    for reserve in (0, 1, n_words * 16 - 1, n_words * 16, n_words * 16 + 1):
        got = id_unit_stream([ids[:1000], ids[1000:]], breaks, flags, cut_spaces, classes, *seg, marks=False,
                             narrow=True, keep_below=keep_below, reserve=reserve)
        assert got[0].tolist() == want[0].tolist()
        assert got[1].tolist() == want[1].tolist() and got[2:4] == want[2:4]
        assert got[4].tolist() == want[4].tolist()
    got = id_unit_stream([ids[:1000], ids[1000:]], breaks, flags, cut_spaces, classes, *seg, marks=False,
                         narrow=True, keep_below=keep_below)
    assert got[0].dtype == np.uint16
    every = id_unit_stream(ids, breaks, flags, cut_spaces, classes, *seg, marks=False)
    assert 0 < got[3] < got[2] == every[2] and 0 < int(got[4].sum()) < got[4].size   # a real test


def test_narrow_units_refuse_what_does_not_fit():
    from bpe_core.engine.units import id_unit_stream
    ids, breaks, flags = np.array([0, 1], np.uint32), np.array([0, 2]), np.zeros(2, np.uint8)
    seg = (np.array([7, 70000], np.uint32), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="16 bits"):
        id_unit_stream(ids, breaks, flags, False, None, *seg, marks=False, narrow=True)
    with pytest.raises(ValueError, match="marks=False"):
        id_unit_stream(ids, breaks, flags, narrow=True)
    ok = id_unit_stream(ids, breaks, flags, False, None, np.array([7, 65535], np.uint32), seg[1], marks=False,
                        narrow=True)
    assert ok[0].dtype == np.uint16 and ok[0].tolist() == [7, 65535]          # the widest that fits
    with pytest.raises(ValueError, match="16 bits"):                          # one more does not
        id_unit_stream(ids, breaks, flags, False, None, np.array([7, 65536], np.uint32), seg[1], marks=False,
                       narrow=True)


@settings(max_examples=60, deadline=None)
@given(units_st, st.integers(0, 30), st.integers(1, 30), st.integers(1, 2))
def test_uint16_units_sketch_cut_and_merge_as_uint32(units, n, cut, n_parts):
    """Units of uint16 (``id_unit_stream(narrow=True)``) give the sketch, the pieces and the merges
    of the same units in uint32, as one array or in parts."""
    symbols, offsets, weights, counts = as_arrays(units)
    narrow = symbols.astype(np.uint16)
    for bits, sample in ((3, 0), (6, 1)):
        wide_sketch, wide_sample, wide_over = pair_sketch(symbols, offsets, weights, bits, sample)
        narrow_sketch, narrow_sample, narrow_over = pair_sketch(narrow, offsets, weights, bits, sample)
        assert np.array_equal(wide_sketch, narrow_sketch) and wide_over == narrow_over
        assert sorted(wide_sample.tolist()) == sorted(narrow_sample.tolist())
        keep = np.packbits(wide_sketch >= cut, bitorder="little")
        assert _as_dict(cut_pieces(symbols, offsets, None, weights, counts, cut, keep=keep)) == \
            _as_dict(cut_pieces(narrow, offsets, None, weights, counts, cut, keep=keep))
    rules = Stage2Rules(distinct=True)
    at = len(units) // 2 if n_parts == 2 and len(units) > 1 else len(units)
    spans = [(a, b) for a, b in ((0, at), (at, len(units))) if b > a]

    def parts(syms):
        return tuple([np.array(x) for x in col] for col in zip(*[
            (syms[offsets[a]:offsets[b]], offsets[a:b + 1] - offsets[a], weights[a:b], counts[a:b]) for a, b in spans]))

    wide = stage2_merges(*parts(symbols), TOKENS, n, _allowed(rules, TOKENS), cut=cut)
    got = stage2_merges(*parts(narrow), TOKENS, n, _allowed(rules, TOKENS), cut=cut)
    assert got.steps == wide.steps and got.tokens == wide.tokens and got.final_tokens == wide.final_tokens


def test_id_unit_stream_refuses_bad_input():
    from bpe_core.engine.units import id_unit_stream

    flags = np.zeros(2, np.uint8)
    with pytest.raises(ValueError, match="not below"):
        id_unit_stream(np.array([0, 2], np.uint32), np.array([0, 2]), flags)
    with pytest.raises(ValueError, match="breaks"):
        id_unit_stream(np.array([0, 1], np.uint32), np.array([0, 1]), flags)


def test_record_rows_refuses_what_does_not_add_up():
    """The conservation checks of a recorded chunk: an id past its words, a word with no table row,
    spans that do not end where a pretoken ends (or that the pretokens do not reach)."""
    from bpe_core.engine.units import record_rows

    offsets = np.array([0, 1, 3])                       # local words of 1 and 2 bytes
    ok = dict(out=np.zeros(3, np.uint32), at=0, counts=np.zeros(4, np.int64))
    assert record_rows(np.array([2, 3]), np.array([1, 0, 1], np.uint32), offsets, np.array([3, 5]),
                       **ok).tolist() == [2, 3]
    cases = [(np.array([2, 3]), np.array([1, 2, 1], np.uint32), np.array([3, 5]), "not below"),
             (np.array([2, -1]), np.array([1, 0, 1], np.uint32), np.array([3, 5]), "no row"),
             (np.array([2, 9]), np.array([1, 0, 1], np.uint32), np.array([3, 5]), "no row"),
             (np.array([2, 3]), np.array([1, 0, 1], np.uint32), np.array([4, 5]), "cover"),
             (np.array([2, 3]), np.array([1, 0, 1], np.uint32), np.array([3, 6]), "cover")]
    for rows, ids, ends, message in cases:
        with pytest.raises(ValueError, match=message):
            record_rows(rows, ids, offsets, ends, np.zeros(3, np.uint32), 0, np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="too short"):
        record_rows(np.array([2, 3]), np.array([1, 0, 1], np.uint32), offsets, np.array([3, 5]),
                    np.zeros(2, np.uint32), 0, np.zeros(4, np.int64))


@settings(max_examples=150)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=6), st.lists(st.integers(0, 40), max_size=60),
       st.data())
def test_record_rows_equal_the_plain_gather_count_and_cuts(lengths, picks, data):
    """``record_rows`` against its plain equivalent: the rows by a gather, the counts by ``np.add.at``
    (added to what ``counts`` held), the span ends by ``searchsorted`` over the pretokens' bytes (a
    pretoken has at least one byte)."""
    from bpe_core.engine.units import record_rows

    n_local = len(lengths)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    rows = np.array(data.draw(st.lists(st.integers(0, 9), min_size=n_local, max_size=n_local)), np.int64)
    ids = np.array([p % n_local for p in picks], np.uint32)
    ends = np.cumsum(np.asarray(lengths, np.int64)[ids.astype(np.int64)])
    # spans end at some pretoken ends (the last one at the end of all of them)
    chosen = sorted(set(data.draw(st.lists(st.integers(0, max(len(ids) - 1, 0)), max_size=5))))
    span_ends = np.array([ends[k] for k in chosen if len(ids)] + ([ends[-1]] if len(ids) else []), np.int64)
    span_ends = np.unique(span_ends)
    out, counts = np.full(len(ids) + 2, 7, np.uint32), np.arange(10, dtype=np.int64)
    cuts = record_rows(rows, ids, offsets, span_ends, out, 2, counts)
    want_counts = np.arange(10, dtype=np.int64)
    np.add.at(want_counts, rows[ids.astype(np.int64)], 1)
    assert out[2:].tolist() == rows[ids.astype(np.int64)].tolist() and out[:2].tolist() == [7, 7]
    assert counts.tolist() == want_counts.tolist()
    assert cuts.tolist() == np.searchsorted(ends, span_ends, side="right").tolist()


# ---- the sketch of the pair counts (pair_sketch) and cutting by its bitmap (cut_pieces(keep=))


def _plain_pair_counts(symbols, offsets, weights):
    seqs = [symbols[offsets[i]:offsets[i + 1]].tolist() for i in range(offsets.size - 1)]
    plain = Counter()
    for s, w in zip(seqs, weights):
        for a, b in zip(s, s[1:]):
            plain[(a, b)] += int(w)
    levels = [plain[(s[k], s[k + 1])] if k + 1 < len(s) else 0 for s in seqs for k in range(len(s))]
    return plain, levels


def _sampled(pairs, sample_bits):
    """Which pairs ``pair_sketch`` samples (its hash, in numpy's wrapping uint64 arithmetic)."""
    if sample_bits == 0:
        return np.ones(len(pairs), bool)
    keys = np.array([(a << 32 | b) + 1 for a, b in pairs], dtype=np.uint64)
    with np.errstate(over="ignore"):
        return (keys * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - sample_bits) == 0


@settings(max_examples=100)
@given(units_st, st.sampled_from([3, 4, 6, 12]), st.sampled_from([0, 1, 3]))
def test_sketch_bounds_every_window_and_samples_exact_counts(units, bits, sample_bits):
    symbols, offsets, weights, counts = as_arrays(units)
    sketch, sampled, over = pair_sketch(symbols, offsets, weights, bits, sample_bits)
    plain, levels = _plain_pair_counts(symbols, offsets, weights)
    assert sketch.size == 2 ** bits and sketch.dtype == np.uint16
    # conservation: the counters hold every window's weight once; no bound is below the exact count
    assert int(sketch.sum()) + over == sum(plain.values()) and over == 0
    assert all(int(b) >= lv for b, lv in zip(sketch_bounds(sketch, symbols, offsets), levels))
    # the sample: the exact counts of the sampled pairs of weight > 0
    pairs = [p for p, c in plain.items() if c > 0]
    want = [plain[p] for p, s in zip(pairs, _sampled(pairs, sample_bits)) if s]
    assert sorted(sampled.tolist()) == sorted(want)
    # the keep bitmap cuts as the bounds do, for cuts around the counts
    for cut in (1, 2, 3, 5, 8):
        keep = np.packbits(sketch >= cut, bitorder="little")
        by_bits = cut_pieces(symbols, offsets, None, weights, counts, cut, keep=keep)
        by_bounds = cut_pieces(symbols, offsets, sketch_bounds(sketch, symbols, offsets), weights, counts, cut)
        for x, y in zip(by_bits[:4], by_bounds[:4]):
            assert np.array_equal(x, y)
        assert by_bits[4] == by_bounds[4]


def test_sketch_with_a_sample_on_two_threads_equals_one_and_the_plain_count():
    # above the size where pair_sketch splits the sequences between two threads; ~90k distinct pairs,
    # so 1 in 8 is ~11k sampled pairs (the sample table grows) and 2**12 counters collide a lot
    _, symbols, offsets, weights = random_units(3, 300, 1_200_000, 999, 4)
    one = pair_sketch(symbols, offsets, weights, 12, 3, threads=1)
    two = pair_sketch(symbols, offsets, weights, 12, 3, threads=2)
    assert np.array_equal(one[0], two[0]) and np.array_equal(np.sort(one[1]), np.sort(two[1]))
    assert one[2] == two[2] == 0
    levels, pair_counts = pair_levels(symbols, offsets, weights)
    assert int(two[0].sum()) == int((weights * np.maximum(np.diff(offsets) - 1, 0)).sum())    # each window once
    assert np.all(sketch_bounds(two[0], symbols, offsets) >= levels)
    uniq, sums, _ = window_sums(symbols, offsets, weights)
    pairs = [(int(k >> np.uint64(32)), int(k & np.uint64(0xFFFFFFFF))) for k in uniq]
    want = sums[_sampled(pairs, 3) & (sums > 0)]
    assert 8_000 < want.size < 15_000
    assert np.array_equal(np.sort(two[1]), np.sort(want))


def test_sketch_counters_saturate_and_still_bound():
    symbols = np.array([1, 2, 1, 2, 7, 8], np.uint32)
    offsets = np.array([0, 2, 4, 6], np.int64)
    weights = np.array([2 ** 32 - 10, 2 ** 40, 5], np.int64)        # (1, 2) counts past 2**32
    sketch, sampled, over = pair_sketch(symbols, offsets, weights, 3, 0)
    bounds = sketch_bounds(sketch, symbols, offsets)
    assert bounds[0] == bounds[2] == SKETCH_MAX == 65535 and bounds[4] >= 5
    assert sorted(sampled.tolist()) == [5, 2 ** 32 - 10 + 2 ** 40]
    # conservation with the caps: the counters and the excess hold every window's weight
    assert int(sketch.sum()) + over == 2 ** 32 - 10 + 2 ** 40 + 5
    with pytest.raises(ValueError, match="bits must be in 3..30"):
        pair_sketch(symbols, offsets, weights, 2)
    with pytest.raises(ValueError, match="power of two"):
        cut_pieces(symbols, offsets, None, weights, weights, 1, keep=np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="one level per symbol"):
        cut_pieces(symbols, offsets, None, weights, weights, 1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=6),
                          st.sampled_from([0, 1, 30_000, 65_534, 65_535, 65_536, 100_000]), st.integers(0, 2)),
                min_size=1, max_size=12),
       st.integers(0, 12), st.sampled_from([1, 65_534, 65_535, 65_536, 65_537, 131_072, 10 ** 6]),
       st.integers(1, 2))
@example([([1, 2], 100_000, 0), ([1, 2, 3], 65_536, 1)], 2, 65_536, 1)
@example([([1, 2], 100_000, 0), ([3, 1, 2], 65_535, 0)], 1, 131_072, 2)
def test_capped_counters_give_the_merges_of_whole_units(units, n, cut, n_parts):
    """Weights around the 16-bit cap of the sketch's counters and cuts on both sides of it: the
    counters and their excess still hold every window, and stage 2 (which caps the cut as it caps
    the counters) gives the merges, tokens and final count of the whole units."""
    rules = Stage2Rules(distinct=True)
    symbols, offsets, weights, counts = as_arrays(units)
    sketch, _, over = pair_sketch(symbols, offsets, weights, 3, 0)
    assert int(sketch.sum()) + over == int((weights * np.maximum(np.diff(offsets) - 1, 0)).sum())
    plain, levels = _plain_pair_counts(symbols, offsets, weights)
    assert all(int(b) >= min(lv, SKETCH_MAX) for b, lv in zip(sketch_bounds(sketch, symbols, offsets), levels))
    steps, tokens, final = whole_units(symbols, offsets, weights, counts, n, rules)
    engine = MergeEngine(symbols, offsets, weights, TOKENS)
    allowed = _allowed(rules, TOKENS)
    merged_counts = [engine.last_count for _ in range(n) if engine.step(allowed) is not None]
    if n_parts == 2 and len(units) > 1:
        parts = _two_parts(symbols, offsets, (weights, counts), len(units) // 2)
        args = ([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts], [p[3] for p in parts])
    else:
        args = (symbols, offsets, weights, counts)
    got = stage2_merges(*args, TOKENS, n, _allowed(rules, TOKENS), cut=cut, sketch_size=3)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final
    # a cut every merge reaches needs no restart, above the cap too (capped counters keep their windows)
    if len(merged_counts) == n and all(c >= cut for c in merged_counts):
        assert got.info["restarts"] == 0


@settings(max_examples=120)
@given(units_st, st.integers(0, 40), st.integers(1, 40), st.sampled_from([3, 4, 5, 16]),
       st.sampled_from([Stage2Rules(distinct=True), Stage2Rules(distinct=False)]))
def test_pieces_cut_by_a_small_sketch_equal_whole_units(units, n, cut, size, rules):
    """A sketch of 8 to 64k counters (many collisions: windows kept that the exact counts cut) gives
    the merges, tokens and final count of the whole units, for any first cut (restarts included)."""
    symbols, offsets, weights, counts = as_arrays(units)
    steps, tokens, final = whole_units(symbols, offsets, weights, counts, n, rules)
    got = stage2_merges(symbols, offsets, weights, counts, TOKENS, n, _allowed(rules, TOKENS),
                        bounded=rules.distinct, cut=cut, sketch_size=size)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final


@settings(max_examples=200)
@given(st.integers(0, 10 ** 12), st.integers(0, 10 ** 12))
def test_the_sketch_grows_with_the_windows_within_its_bounds(a, b):
    """``sketch_bits``: never fewer counters for more windows, at least one per 16 windows (up to
    2**24), at least one per 4 up to 2**22, and from 2**10 to 2**24 counters."""
    lo, hi = sorted((a, b))
    assert sketch_bits(lo) <= sketch_bits(hi)
    bits = sketch_bits(hi)
    assert 10 <= bits <= 24
    assert bits >= min((hi // 16).bit_length(), 24)
    assert bits >= min((hi // 4).bit_length(), 22)


@settings(max_examples=40)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 60), st.integers(3, 12), st.integers(1, 6))
def test_a_larger_sketch_keeps_no_more_windows_and_the_same_merges(seed, cut, bits, more):
    """A sketch of ``2**(bits + more)`` counters splits each counter of ``2**bits`` (the slot is the
    low bits of one hash), so each window's bound is no higher: the pieces hold no more symbols, and
    stage 2 makes the same merges either way (what the larger default sketch of a smaller corpus
    relies on)."""
    rng, symbols, offsets, weights = random_units(seed, 40, 3000, 150, 5)
    counts = weights + rng.integers(0, 2, weights.size)
    small, _, _ = pair_sketch(symbols, offsets, weights, bits)
    large, _, _ = pair_sketch(symbols, offsets, weights, bits + more)
    b_small = sketch_bounds(small, symbols, offsets)
    b_large = sketch_bounds(large, symbols, offsets)
    assert (b_large <= b_small).all()
    kept = [cut_pieces(symbols, offsets, None, weights, counts, cut,
                       keep=np.packbits(sk >= cut, bitorder="little"))[0].size for sk in (small, large)]
    assert kept[1] <= kept[0]
    rules = Stage2Rules(distinct=True)
    runs = [stage2_merges(symbols, offsets, weights, counts, TOKENS, 30, _allowed(rules, TOKENS), cut=cut,
                          sketch_size=size) for size in (bits, bits + more)]
    assert [tuple(s) for s in runs[0].steps] == [tuple(s) for s in runs[1].steps]
    assert runs[0].final_tokens == runs[1].final_tokens


@settings(max_examples=60)
@given(units_st, st.integers(1, 40))
def test_the_sampled_first_cut_gives_the_merges_of_whole_units(units, n):
    """Without a forced cut the first cut comes from a sample of the pairs (scaled to 1 in 2 and more
    by a small ``STAGE2_CUT_SAMPLE_RANKS``): the merges are those of the whole units all the same."""
    from bpe_core.methods import superbpe

    rules = Stage2Rules(distinct=True)
    symbols, offsets, weights, counts = as_arrays(units)
    steps, tokens, final = whole_units(symbols, offsets, weights, counts, n, rules)
    old = superbpe.stage2.STAGE2_CUT_SAMPLE_RANKS
    superbpe.stage2.STAGE2_CUT_SAMPLE_RANKS = 1
    try:
        assert superbpe.cut_sample_bits(n) >= 1
        got = stage2_merges(symbols, offsets, weights, counts, TOKENS, n, _allowed(rules, TOKENS))
    finally:
        superbpe.stage2.STAGE2_CUT_SAMPLE_RANKS = old
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final


def _two_parts(symbols, offsets, per_seq, at):
    """The sequences cut before sequence ``at`` into two parts with arrays of their own (the second
    part's offsets rebased to its own symbols)."""
    cut_sym = int(offsets[at])
    first = (symbols[:cut_sym].copy(), offsets[:at + 1].copy()) + tuple(a[:at].copy() for a in per_seq)
    second = (symbols[cut_sym:].copy(), offsets[at:] - cut_sym) + tuple(a[at:].copy() for a in per_seq)
    return [first, second]


@settings(max_examples=100)
@given(units_st, st.integers(0, 40), st.integers(1, 40), st.data())
def test_stage2_on_two_parts_equals_whole_units(units, n, cut, data):
    """The units given in two parts (arrays of their own, one thread each; the record path's two halves)
    give the merges, tokens and final count of the whole units; so do the sketch and the pieces."""
    from bpe_core.engine.units import cut_pieces_parts

    rules = Stage2Rules(distinct=True)
    symbols, offsets, weights, counts = as_arrays(units)
    at = data.draw(st.integers(0, len(units)))
    parts = _two_parts(symbols, offsets, (weights, counts), at)
    steps, tokens, final = whole_units(symbols, offsets, weights, counts, n, rules)
    got = stage2_merges([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts],
                        [p[3] for p in parts], TOKENS, n, _allowed(rules, TOKENS), cut=cut)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final
    keep = _sketch_of_parts_is_whole(symbols, offsets, weights, parts, cut)
    one = cut_pieces(symbols, offsets, None, weights, counts, cut, keep=keep)
    two = cut_pieces_parts(parts, cut, keep=keep)
    assert _as_dict(one) == _as_dict(two) and one[4] == two[4]
    levels = pair_levels(symbols, offsets, weights)[0]
    by_levels = cut_pieces_parts(parts, cut, levels=[levels[:int(offsets[at])], levels[int(offsets[at]):]])
    assert _as_dict(by_levels) == _as_dict(cut_pieces(symbols, offsets, levels, weights, counts, cut))


def _sketch_of_parts_is_whole(symbols, offsets, weights, parts, cut):
    """Assert the pair sketch of ``parts`` is the whole units' (counters, sampled counts, excess);
    returns the whole sketch's keep bitmap at ``cut``."""
    from bpe_core.engine.units import pair_sketch_parts

    whole = pair_sketch(symbols, offsets, weights, 5, 1)
    split = pair_sketch_parts([p[:3] for p in parts], 5, 1)
    assert np.array_equal(whole[0], split[0]) and sorted(whole[1].tolist()) == sorted(split[1].tolist())
    assert whole[2] == split[2]
    return np.packbits(whole[0] >= cut, bitorder="little")


def _many_parts(symbols, offsets, per_seq, ats):
    """The sequences cut before each sequence of ``ats`` (sorted) into parts with arrays of their own."""
    bounds = [0] + list(ats) + [offsets.size - 1]
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        lo, hi = int(offsets[a]), int(offsets[b])
        parts.append((symbols[lo:hi].copy(), offsets[a:b + 1] - lo) + tuple(x[a:b].copy() for x in per_seq))
    return parts


@settings(max_examples=100)
@given(units_st, st.integers(0, 40), st.integers(1, 40), st.data())
def test_stage2_on_many_parts_equals_whole_units(units, n, cut, data):
    """The units given in any number of parts (SupraTok's listed units come in chunks: the first
    ``half_at`` parts on one thread, the rest on the other, each cut in turn and let go once cut) give
    the merges, tokens and final count of the whole units, restarts (listed again) included; so do
    the sketch and the pieces, and a consuming cut leaves no part alive."""
    import gc
    import weakref
    from bpe_core.engine.units import cut_pieces_parts

    rules = Stage2Rules(distinct=True)
    symbols, offsets, weights, counts = as_arrays(units)
    ats = sorted(data.draw(st.lists(st.integers(0, len(units)), max_size=6)))
    steps, tokens, final = whole_units(symbols, offsets, weights, counts, n, rules)

    def listed():
        parts = _many_parts(symbols, offsets, (weights, counts), ats)
        return tuple([p[k] for p in parts] for k in range(4))

    got = stage2_merges(*listed(), TOKENS, n, _allowed(rules, TOKENS), cut=cut, regenerate=listed)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final
    parts = _many_parts(symbols, offsets, (weights, counts), ats)
    keep = _sketch_of_parts_is_whole(symbols, offsets, weights, parts, cut)
    one = cut_pieces(symbols, offsets, None, weights, counts, cut, keep=keep)
    levels = pair_levels(symbols, offsets, weights)[0]
    by_levels = cut_pieces_parts(parts, cut, levels=[levels[int(offsets[a]):int(offsets[a]) + p[0].size]
                                                     for a, p in zip([0] + ats, parts)])
    assert _as_dict(by_levels) == _as_dict(cut_pieces(symbols, offsets, levels, weights, counts, cut))
    alive = [weakref.ref(p[0]) for p in parts]
    many = cut_pieces_parts(parts, cut, keep=keep, consume=True)
    gc.collect()
    assert parts == [] and all(a() is None for a in alive)
    assert _as_dict(one) == _as_dict(many) and one[4] == many[4]


def test_stage2_refuses_a_sketch_or_pieces_that_lose_windows_or_tokens(monkeypatch):
    """The run-time totals of stage 2: a sketch that misses a window's weight, or pieces that miss a
    stage-1 token, stop the run (``InternalError``) instead of training on them."""
    from bpe_core.errors import InternalError
    from bpe_core.methods import superbpe

    symbols, offsets, weights, counts = as_arrays([(list(b"ab ab"), 3, 0), (list(b"abab"), 3, 1)])
    args = (symbols, offsets, weights, counts, TOKENS, 3, _allowed(Stage2Rules(), TOKENS))
    assert stage2_merges(*args).steps          # as it is: fine
    sketch = superbpe.stage2.pair_sketch

    def lossy_sketch(*a, **k):
        sk, sampled, over = sketch(*a, **k)
        sk[np.flatnonzero(sk)[0]] -= 1
        return sk, sampled, over

    monkeypatch.setattr(superbpe.stage2, "pair_sketch", lossy_sketch)
    with pytest.raises(InternalError, match="sketch holds"):
        stage2_merges(*args)
    # an excess that is not the capped weight is caught too (the check holds with the caps)
    monkeypatch.setattr(superbpe.stage2, "pair_sketch", lambda *a, **k: sketch(*a, **k)[:2] + (1,))
    with pytest.raises(InternalError, match="sketch holds"):
        stage2_merges(*args)
    monkeypatch.setattr(superbpe.stage2, "pair_sketch", sketch)
    cut = superbpe.stage2.cut_pieces_parts
    monkeypatch.setattr(superbpe.stage2, "cut_pieces_parts",
                        lambda *a, **k: cut(*a, **k)[:4] + (cut(*a, **k)[4] - 1,))
    with pytest.raises(InternalError, match="pieces at cut"):
        stage2_merges(*args)


def test_a_piece_table_turned_into_arrays_takes_no_more():
    """``to_arrays`` lends the table's own vectors (the second table's pieces appended): the arrays
    are what a copy gave, and both tables refuse further pieces instead of corrupting them."""
    from bpe_core.engine._units import _PieceTable
    syms = np.array([5, 6, 7, 5, 6, 8, 9, 9, 9], np.uint32)
    offs, w, c = np.array([0, 3, 6, 9]), np.array([2, 1, 4]), np.array([2, 1, 4])
    levels = np.array([9, 9, 0, 9, 9, 0, 9, 9, 0], np.uint32)
    a, b = _PieceTable(64), _PieceTable(64)
    a.add(syms, offs, levels, w, c, 2, 0, 2, None, None)
    b.add(syms, offs, levels, w, c, 2, 2, 3, None, None)
    data, starts, pw, pc, single = a.to_arrays(b)
    pieces = {tuple(data[starts[k]:starts[k + 1]].tolist()): (int(pw[k]), int(pc[k])) for k in range(pw.size)}
    assert pieces == {(5, 6, 7): (2, 2), (5, 6, 8): (1, 1), (9, 9, 9): (4, 4)} and single == 0
    for table in (a, b):
        with pytest.raises(ValueError, match="turned into arrays"):
            table.add(syms, offs, levels, w, c, 2, 0, 3, None, None)
    with pytest.raises(ValueError, match="turned into arrays"):
        a.absorb(_PieceTable(64))
    with pytest.raises(ValueError, match="turned into arrays"):
        a.to_arrays()


def test_a_piece_table_without_slots_takes_no_more_but_is_absorbed_and_listed():
    """``drop_slots`` (the cut gives the slot tables back before the joins): the table refuses pieces
    and absorbing, but another absorbs it, and it takes another's and lists them, as with its slots."""
    from bpe_core.engine._units import _PieceTable
    syms = np.array([5, 6, 7, 5, 6, 8, 9, 9, 9, 5, 6, 7], np.uint32)
    offs, w, c = np.array([0, 3, 6, 9, 12]), np.array([2, 1, 4, 3]), np.array([2, 1, 5, 3])
    levels = np.array([9, 9, 0, 9, 9, 0, 9, 9, 0, 9, 9, 0], np.uint32)

    def tables():
        a, b = _PieceTable(64), _PieceTable(64)
        a.add(syms, offs, levels, w, c, 2, 0, 2, None, None)
        b.add(syms, offs, levels, w, c, 2, 2, 4, None, None)
        return a, b

    a, b = tables()
    a.absorb(b)
    want = a.to_arrays()
    a, b = tables()
    b.drop_slots()
    with pytest.raises(ValueError, match="slots"):
        b.add(syms, offs, levels, w, c, 2, 0, 1, None, None)
    with pytest.raises(ValueError, match="slots"):
        b.absorb(_PieceTable(64))
    a.absorb(b)
    a.drop_slots()
    with pytest.raises(ValueError, match="slots"):
        a.add(syms, offs, levels, w, c, 2, 0, 1, None, None)
    got = a.to_arrays()
    assert [x.tolist() for x in got[:4]] == [x.tolist() for x in want[:4]] and got[4] == want[4]
    pieces = {tuple(got[0][got[1][k]:got[1][k + 1]].tolist()): (int(got[2][k]), int(got[3][k]))
              for k in range(got[2].size)}
    assert pieces == {(5, 6, 7): (5, 5), (5, 6, 8): (1, 1), (9, 9, 9): (4, 5)}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([b" the", b" cat", b" 12", b"\n", b"\n\n", b"  ", b",", b"x", b"<|endoftext|>",
                                 b" M'XX%,#'A=9&4@#0A", b"*!A9&4@&3!4", b"M;5%&4!", b" 0123456789abcdef"]),
                min_size=1, max_size=300).map(b"".join), st.sampled_from([1.0, 0.6]), st.booleans(),
       st.randoms(use_true_random=False))
def test_narrow_scanned_units_equal_the_marked_ones(tmp_path_factory, text, fraction, regions, rnd):
    """``count_units`` with a segmentation that fits 16 bits lists uint16 stage-1 tokens with the encoded
    units flagged; ``stage2_table`` of them equals ``stage2_table`` of the units with marks (uint32,
    ``narrow=False``): the same tokens, offsets, counts, encoded flags and figures, with a sample or not,
    on one worker or two with small chunks."""
    from bpe_core.methods.superbpe import word_classes, word_flags
    from bpe_core.methods.superbpe.units import count_units, stage2_table
    from bpe_core.pretok.counting import count_corpus
    from bpe_core.pretok.patterns import resolve_pattern

    path = tmp_path_factory.mktemp("narrow") / "corpus.txt"
    path.write_bytes(text * 40)
    specials, pattern = [b"<|endoftext|>"], resolve_pattern("gpt2")
    table = count_corpus(str(path), specials, pattern, 1, 1 << 20)
    seg = [[rnd.randrange(0, 60000) for _ in range(rnd.randrange(0, 4))] for _ in range(table.n_words)]
    seg_symbols = np.array([t for s in seg for t in s], dtype=np.uint32)
    seg_offsets = np.concatenate(([0], np.cumsum([len(s) for s in seg]))).astype(np.int64)
    flags = word_flags(table)
    classes = word_classes(table) if regions else None
    numeric, lengths = np.zeros(table.n_words, bool), np.ones(max(int(seg_symbols.max(initial=0)) + 1, 1), np.int64)
    got = {}
    for narrow in (False, None):
        for workers, chunk in ((1, 1 << 20), (2, 4096)):
            units, info = count_units(str(path), table, specials, pattern, workers, chunk, fraction, cut_spaces=True,
                                      flags=flags, classes=classes, seg=(seg_symbols, seg_offsets), narrow=narrow)
            assert len(units) == (4 if narrow is None else 3)
            if narrow is None:
                assert units[0].dtype == np.uint16
            syms, offs, cnts, enc = stage2_table(units, table, seg_symbols, seg_offsets, numeric, lengths,
                                                 cut_numbers=False, expanded=True)
            got[narrow, workers] = (syms.tolist(), offs.tolist(), cnts.tolist(), enc.tolist(), info)
    assert got[None, 1] == got[False, 1] and got[None, 2] == got[False, 2]


def _plain_cut_pieces(seqs, weights, counts, cut_after):
    """Plain Python: sequence ``i`` cut after every position ``k`` where ``cut_after(i, k)`` (and at
    its end); the pieces of two or more symbols with summed weights and counts, and the counts of the
    one-symbol pieces."""
    want, single = {}, 0
    for i, (s, w, c) in enumerate(zip(seqs, weights, counts)):
        start = 0
        for k in range(len(s)):
            if k + 1 == len(s) or cut_after(i, k):
                piece = tuple(s[start:k + 1])
                if len(piece) == 1:
                    single += int(c)
                else:
                    ow, oc = want.get(piece, (0, 0))
                    want[piece] = (ow + int(w), oc + int(c))
                start = k + 1
    return want, single


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 40), st.integers(3, 14), st.integers(1, 12),
       st.lists(st.integers(0, 3), min_size=6, max_size=6), st.sampled_from([1, 2]), st.booleans())
@example(7, 40, 14, 3, [0, 1, 2, 3, 0, 0], 1, False)       # many distinct pairs: cuts in every block
def test_long_sequences_cut_in_blocks_equal_plain_python(seed, alphabet, bits, cut, guard, threads, narrow):
    """Sequences of up to 300 symbols (the cut reads their windows 64 positions at a time), cut by a
    sketch's keep bitmap, by levels, and by either with a guard: the pieces plain Python cuts."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 300, rng.integers(1, 12))
    units = [(rng.integers(0, alphabet, n).tolist(), int(rng.integers(0, 4)), int(rng.integers(0, 3)))
             for n in lengths]
    symbols, offsets, weights, counts = as_arrays(units)
    if symbols.size == 0:
        return
    seqs = [symbols[offsets[i]:offsets[i + 1]].tolist() for i in range(len(units))]
    sym = symbols.astype(np.uint16) if narrow else symbols
    sketch, _, _ = pair_sketch(symbols, offsets, weights, bits)
    keep = np.packbits(sketch >= cut, bitorder="little")
    bounds = sketch_bounds(sketch, symbols, offsets)
    levels, _ = pair_levels(symbols, offsets, weights)
    g = np.array(guard, dtype=np.uint8)

    def guarded(s, k):
        return bool((s[k] < g.size and g[s[k]] & 1) or (s[k + 1] < g.size and g[s[k + 1]] & 2))

    # per sequence, per position: the sketch's bound and the level of its window
    bound_of = [bounds[offsets[i]:offsets[i + 1]].tolist() for i in range(len(seqs))]
    level_of = [levels[offsets[i]:offsets[i + 1]].tolist() for i in range(len(seqs))]
    for by, guard_on in ((bound_of, False), (level_of, False), (bound_of, True), (level_of, True)):
        def cut_after(i, k):
            return not (guard_on and guarded(seqs[i], k)) and by[i][k] < cut

        got = cut_pieces(sym, offsets, None if by is bound_of else levels, weights, counts, cut, threads=threads,
                         keep=keep if by is bound_of else None, guard=g if guard_on else None)
        want, single = _plain_cut_pieces(seqs, weights, counts, cut_after)
        assert _as_dict(got) == want and got[4] == single


@pytest.mark.parametrize("threshold", ["1", "below", "at", "above", "far above"])
def test_stage2_builds_on_two_threads_only_from_its_threshold(monkeypatch, threshold):
    """``stage2_merges(threads=2)`` builds its engine on two threads only from
    ``STAGE2_BUILD_PAR_MIN`` windows (``MergeEngine(build_par_min=)``; the loop's merges of many sites
    still take both), and the merges, tokens and final count are those of the whole units either way:
    a threshold of 1, far above, and one below, at and one above the engine's own window count."""
    from bpe_core.methods.superbpe import stage2 as stage2_module
    _, symbols, offsets, weights = random_units(3, 12, 40_000, 2_000, 4)
    counts = weights + 1
    rules = Stage2Rules(distinct=True)
    steps, tokens, final = whole_units(symbols, offsets, weights, counts, 60, rules)
    built = []

    class Spy(MergeEngine):
        def __init__(self, *args, **kwargs):
            starts = np.asarray(kwargs["let_go"][0] if kwargs.get("let_go") else args[1], dtype=np.int64)
            n_windows = int(np.maximum(np.diff(starts) - 1, 0).sum())      # (the engine's count)
            super().__init__(*args, **kwargs)
            built.append((kwargs.get("build_par_min"), self.build_threads, n_windows))

    monkeypatch.setattr(stage2_module, "MergeEngine", Spy)
    monkeypatch.setattr(stage2_module, "STAGE2_BUILD_PAR_MIN", 1 << 40)
    stage2_merges(symbols, offsets, weights, counts, TOKENS, 60, _allowed(rules, TOKENS), threads=2)
    n = built[0][2]
    built.clear()
    value = {"1": 1, "below": n - 1, "at": n, "above": n + 1, "far above": 1 << 40}[threshold]
    monkeypatch.setattr(stage2_module, "STAGE2_BUILD_PAR_MIN", value)
    got = stage2_merges(symbols, offsets, weights, counts, TOKENS, 60, _allowed(rules, TOKENS), threads=2)
    assert [tuple(s) for s in got.steps] == [tuple(s) for s in steps]
    assert got.tokens == tokens and got.final_tokens == final
    assert built and all(par_min == value for par_min, _, _ in built)
    two_cores = len(os.sched_getaffinity(0)) >= 2
    for _, two, windows in built:   # two threads exactly from the threshold (with two usable cores)
        assert two == (windows >= value and two_cores)
