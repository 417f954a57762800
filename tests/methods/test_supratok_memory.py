"""SupraTok's n-gram statistics in less memory (issue 29): counted a block of windows at a time and
kept as int32 per position, with the same counts, ids and contexts as one pass over everything."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.methods.supratok.stats import NgramStats, flatten_units


units = st.lists(st.lists(st.integers(-1, 5), min_size=0, max_size=12), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(units, st.lists(st.integers(1, 4), min_size=8, max_size=8), st.integers(1, 7), st.integers(1, 3))
def test_blocks_give_the_same_statistics(unit_list, counts, block, min_count):
    """Word -1 stands for a non-letter word (it breaks n-grams)."""
    data = np.array([w + 1 for u in unit_list for w in u], dtype=np.uint32)     # word ids 0..6
    starts = np.concatenate(([0], np.cumsum([len(u) for u in unit_list]))).astype(np.int64)
    sid = np.array([-1, 0, 1, 2, 3, 4, 5])                                        # word 0: not a letter word
    ucounts = np.array(counts[:len(unit_list)])
    seq, weights = flatten_units(data, starts, sid, ucounts, dtype=np.int32)
    raw, _ = flatten_units(data, starts, np.arange(7), ucounts, dtype=np.int32)
    assert seq.dtype == np.int32 and raw.dtype == np.int32 and weights.dtype == np.int32
    whole = NgramStats(seq, raw, weights, 6, 4, min_count)
    parts = NgramStats(seq, raw, weights, 6, 4, min_count, block=block)
    for a, b in zip(whole.levels, parts.levels):
        assert a.total == b.total
        for x, y in ((a.prefix, b.prefix), (a.last, b.last), (a.counts, b.counts)):
            assert x.tolist() == y.tolist()
    for a, b in zip(whole.pos_ids, parts.pos_ids):
        assert a.dtype == np.int32 and a.tolist() == b.tolist()
    for n in (2, 3):
        cand = np.arange(whole.levels[n - 1].counts.size)
        if cand.size:
            assert all(np.allclose(x, y) for x, y in zip(whole.contexts(n, cand), parts.contexts(n, cand)))


@settings(max_examples=25, deadline=None)
@given(units, st.integers(1, 3), st.integers(0, 3))
def test_contexts_taken_while_building_are_the_same(unit_list, min_count, skip):
    """``contexts_for``: the asked contexts, taken level by level, equal those of the kept positions."""
    data = np.array([w + 1 for u in unit_list for w in u], dtype=np.uint32)
    starts = np.concatenate(([0], np.cumsum([len(u) for u in unit_list]))).astype(np.int64)
    seq, weights = flatten_units(data, starts, np.array([-1, 0, 1, 2, 3, 4, 5]), np.ones(len(unit_list), np.int64),
                                 dtype=np.int32)
    raw, _ = flatten_units(data, starts, np.arange(7), np.ones(len(unit_list), np.int64), dtype=np.int32)
    asked = {}

    def pick(stats, n):
        asked[n] = np.arange(stats.levels[n - 1].counts.size)[skip:]     # some of them
        return asked[n]

    kept = NgramStats(seq, raw, weights, 6, 4, min_count)
    lean = NgramStats(seq, raw, weights, 6, 4, min_count, contexts_for=pick)
    assert sorted(asked) == [2, 3, 4] and all(p is None for p in lean.pos_ids)
    for n in (2, 3, 4):
        assert all(np.allclose(x, y) for x, y in zip(kept.contexts(n, asked[n]), lean.contexts(n, asked[n])))


def test_a_sampled_supratok_does_not_follow_the_process_size(fixtures_dir, monkeypatch):
    """Under a budget that makes SupraTok's passes sample, the sample fraction (and so the merges)
    does not change with a few KB more or less in the process when it planned, as SuperBPE's stage 2
    (two runs of one command under --memory-limit 300M sampled 0.3028 and 0.3061 before)."""
    import bpe_core
    from bpe_core.methods.superbpe import FRACTION_STEPS
    from bpe_core.methods.supratok import passes
    from bpe_core.runtime import budget
    monkeypatch.setattr(passes, "STAGE2_BYTES_PER_SYMBOL", 10 ** 6)      # force a sample
    runs = []
    for rss in (100 << 20, (100 << 20) + 4096, (100 << 20) + 12 * 4096):
        monkeypatch.setattr(budget, "_current_rss", lambda rss=rss: rss)
        runs.append(bpe_core.train(bpe_core.TrainConfig(fixtures_dir / "corpus.en", 600, method="supratok",
                                                        num_workers=1, memory_limit=1 << 30)))
    fractions = {r.report["supratok"]["sample_fraction"] for r in runs}
    assert len(fractions) == 1
    fraction = next(iter(fractions))
    assert fraction < 1 and (fraction * FRACTION_STEPS).is_integer()
    assert runs[0].merges == runs[1].merges == runs[2].merges
