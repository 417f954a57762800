"""Large vocabularies under a budget: the merge phase's pair tables (pair arrays, heap, pair map) grow
with the merges, and a run at the smallest budget the plan accepts stays under it, measured, with the
merges of the unlimited run.

At 15 GB (growing vocabulary, 100k and 200k) the pair tables are the part of the merge phase that
grows with the vocabulary: 12.1 M pairs at 100k, 17.3 M at 200k. The power-of-two pair map held its
old and new slots together when it doubled, and the pair arrays and the heap were copied to larger
blocks, so the peak came at a doubling the plan did not see (100k named 2,817M and held 2,691 MiB of
anonymous memory beside its mapped files). Now the engine makes room once for the pairs the plan
counts on (``MergeEngine.reserve_pairs``) and the map grows a 1/64 at a time. Here the same path at a
small scale: a corpus whose vocabulary keeps growing, trained to vocabularies whose pairs are many
times the first ones, at the smallest budget the plan accepts.
"""
from __future__ import annotations

import pytest

import bpe_core
from bpe_core.runtime import budget
from bpe_core.runtime.budget import PAIR_SLOT_BYTES, pair_map_slots, pairs_estimate
from test_budget_spill import SPECIAL, _smallest_budget_that_works, write_growing


@pytest.mark.parametrize("vocab_size", [2000, 12000])
def test_a_large_vocabulary_at_its_smallest_budget_stays_under_it(tmp_path, vocab_size):
    corpus = write_growing(tmp_path / "growing.txt", 4 << 20)
    cfg = dict(input_path=str(corpus), vocab_size=vocab_size, special_tokens=(SPECIAL,), num_workers=2,
               chunk_bytes=256 << 10, spill_dir=str(tmp_path), progress=False)
    unlimited = bpe_core.train(bpe_core.TrainConfig(**cfg))
    got, budget = _smallest_budget_that_works(cfg)
    assert got.merges == unlimited.merges and got.vocab == unlimited.vocab
    mem, eng = got.report["memory"], got.report["engine"]
    by_phase = {k: v >> 20 for k, v in mem["peak_anon_by_phase"].items()}
    assert not mem["budget_exceeded"] and mem["peak_anon_bytes"] <= budget, \
        f"{mem['peak_anon_bytes'] >> 20} MiB held under a {budget >> 20} MiB budget: {by_phase}"
    # the pairs the plan counted on held them all: the map was sized once, not grown
    symbols = got.report["merge_plan"]["symbols"]
    planned = pairs_estimate(symbols, vocab_size)
    assert eng["n_pairs"] <= planned
    assert eng["memory"]["pair_map"] == pair_map_slots(planned) * PAIR_SLOT_BYTES


@pytest.mark.parametrize("words, symbols, vocab", [(5_753_165, 56_784_484, 32000), (18_807_369, 195_319_199, 32000),
                                                   (18_807_369, 195_319_199, 200_000), (40_000, 400_000, 1000)])
def test_the_mapped_build_fills_its_lists_in_one_pass_inside_the_merge_loop_figure(words, symbols, vocab):
    """The fill buffer of a mapped byte build takes the room the merge loop's lists and pairs take
    later: all the initial lists at once where that room holds them, never below the old quarter, and
    the build's cells and buffer never above the engine's figure (the plan's anonymous peak as before)."""
    eng = budget.engine_memory(words, vocab, symbols, mapped=True)
    phase = budget.merge_phase(words, vocab, symbols, 0, mapped=True)
    building = int(symbols * (budget.ENGINE_CELL_BYTES + budget.ENGINE_BLOCK_BYTES)) + phase["fill"]
    assert phase["fill"] >= budget.fill_buffer_bytes(symbols)
    assert phase["anon"] == max(words * budget.TABLE_BYTES_PER_WORD, eng["anon"])
    if phase["fill"] > budget.fill_buffer_bytes(symbols):
        assert building + budget.ENGINE_BASE_BYTES + budget.BUILD_PAIR_BYTES <= eng["anon"]
    if symbols >= 10**7:           # the corpora of the benchmarks: one pass
        assert phase["fill"] >= symbols * budget.ENGINE_BASE_LIST_BYTES
