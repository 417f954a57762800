"""The heap's floor raised as the loop runs (``MergeEngine._raise_floor``): the entries of pairs that
cannot win soon leave the heap and come back when the floor comes down; every merge, token, word and
pair count equals the engine that keeps every entry, and equals a full recount after every step."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.engine.merge import MergeEngine

from test_engine import step_with_recount

BYTES = [bytes([i]) for i in range(256)]


def _engine(words, weights, tokens, heap_batch=65536, raise_min=None, threads=1):
    syms = np.array([t for w in words for t in w], dtype=np.uint32)
    offs = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    eng = MergeEngine(syms, offs, np.array(weights[:len(words)], dtype=np.int64), tokens,
                      heap_batch=heap_batch, threads=threads, build_par_min=1)
    if raise_min is not None:
        eng.heap_raise_min = raise_min
    return eng


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=30), min_size=1, max_size=60),
       st.lists(st.integers(0, 9), min_size=60, max_size=60), st.sampled_from([1, 2, 3, 8]),
       st.sampled_from([1, 2, 5, 16]), st.integers(1, 120), st.sampled_from([1, 2]))
def test_raised_floor_merges_as_the_engine_that_keeps_every_entry(words, weights, batch, raise_min,
                                                                  n_merges, threads):
    """Few token ids (merges rebuild existing tokens' bytes: pairs whose count rises again after
    they left the heap), weights 0 included, a floor raised after almost every merge."""
    tokens = [bytes([97 + i]) for i in range(6)]
    plain = _engine(words, weights, tokens, threads=threads)
    raised = _engine(words, weights, tokens, batch, raise_min, threads=threads)
    plain.par_min_sites = raised.par_min_sites = 1
    assert plain.run(n_merges) == raised.run(n_merges)
    assert plain.tokens() == raised.tokens()
    for x, y in zip(plain.words(), raised.words()):
        assert np.array_equal(x, y)
    assert plain.pair_counts_dict() == raised.pair_counts_dict()
    assert plain.stats()["heap_raises"] == 0


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(alphabet="abc d", min_size=1, max_size=9).map(lambda s: s.encode()),
                       st.integers(1, 6), max_size=14), st.sampled_from([1, 2, 3]))
def test_raised_floor_equals_a_full_recount_after_every_step(words, batch):
    ids = list(words)
    eng = _engine([list(w) for w in ids], [words[w] for w in ids], BYTES, batch, 1)
    step_with_recount(eng, {tuple(bytes([x]) for x in w): c for w, c in words.items()}, 30)


def test_the_heap_keeps_only_the_pairs_near_the_top():
    """Many pairs made by merges from few (random words over 12 ids: the build's 144 pairs are all in
    the heap, floor 1): with the floor raised the heap peaks far below the pair count, and the
    merges are the same."""
    rng = np.random.default_rng(11)
    words = [list(rng.integers(0, 12, rng.integers(2, 24))) for _ in range(20_000)]
    weights = list(rng.integers(1, 50, len(words)))
    tokens = [bytes([97 + i]) for i in range(12)]
    plain = _engine(words, weights, tokens)
    raised = _engine(words, weights, tokens, heap_batch=256, raise_min=4096)
    assert plain.run(1500) == raised.run(1500)
    s_plain, s_raised = plain.stats(), raised.stats()
    assert s_raised["heap_raises"] > 0 and s_plain["heap_raises"] == 0
    assert s_raised["memory"]["heap_peak"] * 3 < s_plain["memory"]["heap_peak"]
    assert s_raised["n_pairs"] == s_plain["n_pairs"]
