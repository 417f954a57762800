"""The longest word of a counted table (``training._longest``, for the plan's per-word figures),
found a step of words at a time: the same word, length and pair sites as over all words at once."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core import training
from bpe_core.pretok.wordtable import WordTable


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 2, 5, 9, 4096, 4100]), min_size=1, max_size=40),
       st.sampled_from([1, 2, 3, 7, 1 << 20]), st.integers(0, 2**32 - 1))
def test_the_longest_word_is_found_a_step_at_a_time(lengths, step, seed):
    rng = np.random.default_rng(seed)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    arena = rng.integers(97, 100, size=int(offsets[-1])).astype(np.uint8)    # (words of equal length differ)
    table = WordTable(arena, offsets, np.ones(len(lengths), np.int64))
    got = training._longest(table, window=1000, step=step)
    assert got == training._longest(table, window=1000, step=1 << 30)
    assert got[0] == max(lengths)
