"""The Cython merge engine against a full recount after every step (``reference.py``)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.engine.merge import MergeEngine

BYTES = [bytes([i]) for i in range(256)]


def make_engine(words: dict, tokens=BYTES, heap_batch=65536):
    """words: {tuple of token ids: count}."""
    items = list(words.items())
    symbols = np.array([s for w, _ in items for s in w], dtype=np.uint32)
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(w) for w, _ in items])
    counts = np.array([c for _, c in items], dtype=np.int64)
    return MergeEngine(symbols, offsets, counts, list(tokens), heap_batch=heap_batch)


def engine_pairs_as_bytes(eng):
    toks = eng.tokens()
    out = {}
    for (a, b), c in eng.pair_counts_dict().items():
        key = (toks[a], toks[b])
        out[key] = out.get(key, 0) + c
    return out


def check_against_recount(words_bytes: dict, n_steps: int, tokens=BYTES, heap_batch=65536):
    """Step the engine and the reference side by side; compare winners, words and all pair counts."""
    ids = {t: i for i, t in reversed(list(enumerate(tokens)))}
    eng = make_engine({tuple(ids[s] for s in w): c for w, c in words_bytes.items()}, tokens, heap_batch)
    step_with_recount(eng, dict(words_bytes), n_steps)


def step_with_recount(eng, ref_words: dict, n_steps: int) -> None:
    """Step ``eng`` and the reference on ``ref_words`` ({tuple of token bytes: count}) side by side:
    all pair counts before each step, then the winner, until the reference has no pair left."""
    for _ in range(n_steps):
        ref_pairs = reference.get_pair_counts(ref_words)
        assert engine_pairs_as_bytes(eng) == {p: c for p, c in ref_pairs.items() if c > 0}
        expected = reference.best_pair(ref_pairs)
        got = eng.step()
        if expected is None:
            assert got is None
            return
        toks = eng.tokens()
        assert (toks[got[0]], toks[got[1]]) == expected
        new = {}
        for w, c in ref_words.items():
            m = reference.merge_word(w, expected)
            new[m] = new.get(m, 0) + c
        ref_words = new


words_strategy = st.dictionaries(
    st.text(alphabet="abc d", min_size=1, max_size=9).map(lambda s: tuple(bytes([b]) for b in s.encode())),
    st.integers(1, 6), max_size=12)


@given(words_strategy, st.sampled_from([1, 2, 3, 65536]))
def test_counts_equal_full_recount_after_every_step(words, heap_batch):
    # small heap batches keep most pairs outside the heap and exercise the floor being lowered
    check_against_recount(words, 25, heap_batch=heap_batch)


@given(st.dictionaries(st.binary(min_size=1, max_size=8).map(lambda b: tuple(bytes([x]) for x in b)),
                       st.integers(1, 1000), max_size=10), st.sampled_from([1, 4, 65536]))
def test_random_bytes_and_large_counts(words, heap_batch):
    check_against_recount(words, 15, heap_batch=heap_batch)


def test_pair_whose_count_falls_still_wins_later():
    # (b, c) wins first and takes (c, d) from "bcd"; (c, d) falls from 11 to 5 and must still be
    # merged third. A heap that drops stale entries never learns it (the stale-heap bug).
    words = {tuple(bytes([x]) for x in w): c for w, c in [(b"bcd", 6), (b"cd", 5), (b"bc", 6)]}
    check_against_recount(words, 4)
    eng = make_engine({(98, 99, 100): 6, (99, 100): 5, (98, 99): 6})
    merges = [(eng.token_bytes(a), eng.token_bytes(b)) for a, b, _ in eng.run(10)]
    assert merges[:3] == [(b"b", b"c"), (b"bc", b"d"), (b"c", b"d")]


def test_runs_count_every_window_and_merge_without_overlap():
    eng = make_engine({(97,) * 5: 1})
    assert eng.pair_count(97, 97) == 4
    a, b, t = eng.step()
    assert eng.word(0) == [t, t, 97]
    assert eng.pair_count(97, 97) == 0 and eng.pair_count(t, t) == 1 and eng.pair_count(t, 97) == 1


def test_ties_go_to_greatest_left_then_right_bytes():
    # all four pairs have count 1; greatest tuple is (b"z", b"a")
    eng = make_engine({(ord("a"), ord("z")): 1, (ord("z"), ord("a")): 1, (ord("y"), ord("z")): 1})
    a, b, _ = eng.step()
    assert (eng.token_bytes(a), eng.token_bytes(b)) == (b"z", b"a")


def test_duplicate_bytes_share_one_symbol():
    # Tokens 256 = b"bc" and 257 = b"ab" exist; merging (a, bc) builds b"abc"; a later (ab, c) builds
    # the same bytes and must reuse that symbol, so pairs with b"abc" add up as in a bytes-keyed trainer.
    tokens = BYTES + [b"bc", b"ab"]
    a, b, c, x = ord("a"), ord("b"), ord("c"), ord("x")
    words = {(a, 256): 5, (257, c): 4, (a, 256, x): 1, (257, c, x): 1}
    eng = make_engine(words, tokens)
    first = eng.step()
    second = eng.step()
    assert eng.token_bytes(first[2]) == eng.token_bytes(second[2]) == b"abc"
    assert first[2] == second[2]
    assert eng.pair_count(first[2], x) == 2
    check_against_recount({(b"a", b"bc"): 5, (b"ab", b"c"): 4, (b"a", b"bc", b"x"): 1,
                           (b"ab", b"c", b"x"): 1}, 4, tokens)


def test_allowed_predicate_blocks_pairs_forever():
    eng = make_engine({(97, 98): 5, (99, 100): 1})
    got = eng.run(5, allowed=lambda left, right: (left, right) != (b"a", b"b"))
    assert [(eng.token_bytes(a), eng.token_bytes(b)) for a, b, _ in got] == [(b"c", b"d")]


def test_words_export_roundtrip():
    eng = make_engine({(97, 98, 97, 98): 2, (98,): 1})
    eng.step()
    symbols, offsets, counts = eng.words()
    assert symbols.dtype == np.uint32 and offsets.tolist() == [0, 2, 3] and counts.tolist() == [2, 1]
    assert eng.word_lengths().tolist() == np.diff(offsets).tolist()      # without listing the symbols


@pytest.mark.parametrize("bad", [
    dict(symbols=[97], offsets=[0, 2], counts=[1]),
    dict(symbols=[97, 98], offsets=[0, 2], counts=[1, 1]),
    dict(symbols=[9999], offsets=[0, 1], counts=[1]),
    dict(symbols=[97], offsets=[0, 1], counts=[-1]),
])
def test_bad_tables_are_rejected(bad):
    with pytest.raises(ValueError):
        MergeEngine(np.array(bad["symbols"], np.uint32), np.array(bad["offsets"], np.int64),
                    np.array(bad["counts"], np.int64), BYTES)


@given(st.lists(st.lists(st.integers(97, 101), min_size=1, max_size=20), min_size=1, max_size=40),
       st.integers(0, 30))
def test_donated_symbols_become_the_cells(words, n_merges):
    """``donate=True``: the symbols array is the engine's memory (written in place, no copy); the
    engine merges as one that copied them. An array it cannot write stays as it was (copied)."""
    syms = np.array([t for w in words for t in w], dtype=np.uint32)
    offs = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    counts = np.arange(1, len(words) + 1, dtype=np.int64)
    tokens = [bytes([i]) for i in range(256)]
    copied = MergeEngine(syms.copy(), offs, counts, tokens)
    given = syms.copy()
    donated = MergeEngine(given, offs, counts, tokens, donate=True)
    assert int(given[offs[1] - 1]) & 0x40000000          # the word-end bit, written in the array itself
    assert copied.run(n_merges) == donated.run(n_merges)
    for x, y in zip(copied.words(), donated.words()):
        assert np.array_equal(x, y)
    frozen = syms.copy()
    frozen.flags.writeable = False
    kept = MergeEngine(frozen, offs, counts, tokens, donate=True)
    assert np.array_equal(frozen, syms) and kept.run(n_merges) == MergeEngine(syms, offs, counts, tokens).run(n_merges)


def test_a_bad_donated_symbol_is_refused_before_anything_is_written():
    syms = np.array([97, 98, 300], dtype=np.uint32)
    before = syms.copy()
    with pytest.raises(ValueError, match="300"):
        MergeEngine(syms, np.array([0, 3]), np.array([1]), [bytes([i]) for i in range(256)], donate=True)
    assert np.array_equal(syms, before)


@given(st.lists(st.lists(st.integers(97, 100), min_size=0, max_size=25), min_size=1, max_size=40),
       st.integers(0, 40))
def test_word_lengths_count_the_symbols_after_merges(words, n_merges):
    """``word_lengths`` (live cells counted per word) is the length of each word's symbols (walked
    symbol by symbol), after any merges, runs (aaa) and empty words included."""
    syms = np.array([t for w in words for t in w], dtype=np.uint32)
    offs = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    eng = MergeEngine(syms, offs, np.ones(len(words), dtype=np.int64), [bytes([i]) for i in range(256)])
    eng.run(n_merges)
    assert eng.word_lengths().tolist() == [len(eng.word(w)) for w in range(len(words))]
    counts = np.arange(len(words), dtype=np.int64) * 3 + 1
    assert eng.weighted_length(counts) == int((eng.word_lengths() * counts).sum())


@given(st.lists(st.lists(st.integers(97, 100), min_size=0, max_size=25), min_size=1, max_size=40),
       st.integers(0, 40), st.data())
def test_weighted_length_of_own_counts_and_of_listed_words(words, n_merges, data):
    """``weighted_length()`` takes each word's own count (the engine's, as built), and
    ``weighted_length(counts, words)`` only the words listed, each with its count: the plain sums
    of ``word_lengths()`` times the counts (stage 2's final counts without its arrays of counts)."""
    syms = np.array([t for w in words for t in w], dtype=np.uint32)
    offs = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    own = np.array(data.draw(st.lists(st.integers(0, 9), min_size=len(words), max_size=len(words))), dtype=np.int64)
    eng = MergeEngine(syms, offs, own, [bytes([i]) for i in range(256)])
    eng.run(n_merges)
    lengths = eng.word_lengths()
    assert eng.weighted_length() == int((lengths * own).sum())
    listed = np.array(sorted(data.draw(st.sets(st.integers(0, len(words) - 1)))), dtype=np.int64)
    extra = np.arange(listed.size, dtype=np.int64) * 5 + 2
    assert eng.weighted_length(extra, listed) == int((lengths[listed] * extra).sum())
    with pytest.raises(ValueError):
        eng.weighted_length(None, listed)            # listed words need their counts
    if listed.size > 1:
        with pytest.raises(ValueError):
            eng.weighted_length(extra, listed[::-1].copy())     # in increasing order only


@given(st.lists(st.lists(st.integers(97, 100), min_size=0, max_size=25), min_size=1, max_size=40),
       st.integers(0, 40), st.sampled_from([1, 2]))
def test_offsets_and_counts_let_go_build_the_same_engine(words, n_merges, threads):
    """``let_go=[offsets, counts]`` (stage 2 gives its pieces' starts and weights up): the list is
    emptied, the arrays are not kept (gone once the engine is built, nothing else holding them), and
    the engine merges, counts and lists the words as one given the arrays."""
    import gc
    import weakref
    syms = np.array([t for w in words for t in w], dtype=np.uint32)
    offs = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    counts = (np.arange(len(words), dtype=np.int64) * 7) % 5
    tokens = [bytes([i]) for i in range(256)]
    plain = MergeEngine(syms.copy(), offs, counts, tokens, threads=threads, build_par_min=1)
    held = [offs.copy(), counts.copy()]
    alive = [weakref.ref(a) for a in held]
    eng = MergeEngine(syms.copy(), None, None, tokens, threads=threads, build_par_min=1, let_go=held)
    gc.collect()
    assert held == [] and all(a() is None for a in alive)
    assert eng.run(n_merges) == plain.run(n_merges)
    assert [eng.word(w) for w in range(len(words))] == [plain.word(w) for w in range(len(words))]
    assert eng.weighted_length() == plain.weighted_length() == plain.weighted_length(counts)
    with pytest.raises(ValueError, match="let_go"):
        MergeEngine(syms.copy(), offs, None, tokens, let_go=[offs, counts])
