"""``MergeEngine`` built from ``array.array`` symbols (a small run's table, ``plain``): its own memory
is ``array.array`` and numpy is never needed, and it makes the steps, tokens and stats of an engine
built from numpy arrays; ``train_words`` gives the same vocab and merges on either kind of table."""
import array

import numpy as np
from hypothesis import given, settings, strategies as st

from bpe_core.engine.merge import MergeEngine, train_words
from bpe_core.pretok.wordtable import WordTable

BYTES = [bytes([i]) for i in range(256)]

words = st.dictionaries(st.binary(min_size=1, max_size=8).map(lambda b: bytes(x % 5 + 97 for x in b)),
                        st.integers(1, 9), max_size=14)


def tables(words):
    items = sorted(words.items())
    arena = b"".join(w for w, _ in items)
    ends = np.cumsum([0] + [len(w) for w, _ in items]).tolist()
    counts = [c for _, c in items]
    numpy = WordTable(np.frombuffer(arena, np.uint8).copy(), np.array(ends, np.int64), np.array(counts, np.int64))
    plain = WordTable(array.array("B", arena), array.array("q", ends), array.array("q", counts))
    return plain, numpy


@settings(max_examples=80, deadline=None)
@given(words, st.integers(0, 40), st.sampled_from(["bytes", "hf"]))
def test_a_plain_engine_is_the_numpy_engine(words, n, tie_break):
    plain, numpy = tables(words)
    plain, numpy = plain.without_singletons(), numpy.without_singletons()
    a = MergeEngine(plain.arena, plain.offsets, plain.counts, list(BYTES), tie_break=tie_break)
    b = MergeEngine(numpy.arena, numpy.offsets, numpy.counts, list(BYTES), tie_break=tie_break)
    assert a.plain and not b.plain
    got, want = a.run(n, compact=True), b.run(n, compact=True)
    assert isinstance(got, array.array) and got.typecode == "I"
    assert got.tolist() == want.reshape(-1).tolist()
    assert a.tokens() == b.tokens()
    assert a.stats() == b.stats()


@settings(max_examples=60, deadline=None)
@given(words, st.integers(256, 320), st.sampled_from(["bytes", "hf"]))
def test_train_words_on_either_kind_of_table(words, vocab_size, tie_break):
    plain, numpy = tables(words)
    assert train_words(plain, vocab_size, tie_break=tie_break) == train_words(numpy, vocab_size, tie_break=tie_break)
