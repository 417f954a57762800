"""The merge phase on two threads (``train_words(threads=2)``, what plain BPE runs with two workers)
makes the merges one thread makes and the reference trainer makes: random, tie-heavy and
adversarial word tables, with every merge split between the threads (``par_min_sites=1``), at
small thresholds where the loop changes legs midway, with the read-only arrays mapped, HF's tie
break, a merge guard and ``init_merges``."""
import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.engine import merge as merge_mod
from bpe_core.engine.merge import train_words
from bpe_core.pretok.wordtable import WordTable

# words over few letters (long runs: a == b merges, many ties), counts with many equal values
_word = st.lists(st.sampled_from(b"abcd "), min_size=1, max_size=30).map(bytes)
_tables = st.dictionaries(_word, st.integers(1, 6), min_size=1, max_size=60)
_thresholds = st.sampled_from([1, 2, 3, 5, 8, 64])


def _np_table(counts):
    return WordTable.from_counts(counts).as_numpy()


def _both(counts, vocab_size, par_min_sites, **kw):
    one = train_words(_np_table(counts), vocab_size, **kw)
    report = {"seconds": {}}
    two = train_words(_np_table(counts), vocab_size, threads=2, par_min_sites=par_min_sites, report=report, **kw)
    return one, two, report


@settings(max_examples=120, deadline=None)
@given(_tables, st.integers(257, 320), _thresholds)
def test_two_threads_train_as_one_and_as_the_reference(counts, vocab_size, par_min_sites):
    one, two, report = _both(counts, vocab_size, par_min_sites)
    assert two == one
    assert two == reference.train_on_counts(counts, vocab_size, [])
    n_symbols = sum(len(w) for w, c in counts.items() if len(w) > 1)
    # the second thread ran when the table has as many symbols as the threshold (else one thread)
    assert report["engine"]["threads"] == (2 if n_symbols >= max(par_min_sites, 2) else 1)


@settings(max_examples=80, deadline=None)
@given(_tables, st.integers(257, 320), _thresholds, _thresholds)
def test_the_split_threshold_apart_from_the_legs(counts, vocab_size, par_min_sites, split_min_sites):
    """The first leg runs while the best pair counts ``par_min_sites``; within it a merge is split
    from ``split_min_sites`` listed sites (each on either side of the other): one thread's merges."""
    one = train_words(_np_table(counts), vocab_size)
    report = {"seconds": {}}
    two = train_words(_np_table(counts), vocab_size, threads=2, par_min_sites=par_min_sites,
                      split_min_sites=split_min_sites, report=report)
    assert two == one
    n_symbols = sum(len(w) for w, c in counts.items() if len(w) > 1)
    assert report["engine"]["threads"] == (2 if n_symbols >= max(min(par_min_sites, split_min_sites), 2) else 1)


@settings(max_examples=40, deadline=None)
@given(_tables, st.integers(257, 300), _thresholds, st.sampled_from(["bytes", "hf"]))
def test_two_threads_mapped_and_hf_ties(tmp_path_factory, counts, vocab_size, par_min_sites, tie_break):
    """The engine's read-only arrays in mapped files, and HF ``tokenizers``' tie break."""
    spill = str(tmp_path_factory.mktemp("spill"))
    one, two, _ = _both(counts, vocab_size, par_min_sites, spill_dir=spill, tie_break=tie_break)
    assert two == one


def test_the_legs_change_midway_and_progress_counts_every_merge(monkeypatch):
    """A table whose best counts fall through the threshold: some merges run with the second thread,
    the rest on one; the merges are one thread's, and the progress bar sees every merge once."""
    rng = np.random.default_rng(7)
    counts = {bytes(rng.choice(list(b"abcdef "), size=int(rng.integers(2, 12))).tolist()): int(rng.integers(1, 40))
              for _ in range(400)}
    seen = []

    class Bar:
        def update(self, n):
            seen.append(n)

        def close(self):
            pass
    monkeypatch.setattr(merge_mod, "progress_bar", lambda progress, **k: Bar() if progress else None)
    one = train_words(_np_table(counts), 256 + 200)
    report = {"seconds": {}}
    two = train_words(_np_table(counts), 256 + 200, threads=2, par_min_sites=300, report=report, progress=True)
    assert two == one == reference.train_on_counts(counts, 256 + 200, [])
    assert report["engine"]["threads"] == 2
    assert 0 < report["engine"]["merges_on_two_threads"] < len(two[1])
    assert sum(seen) == len(two[1])


def test_adversarial_tables_on_two_threads():
    """One long run of a byte (overlapping a == b sites on both sides of the split), a word of
    alternating pairs, equal counts everywhere (every choice a tie)."""
    tables = [{b"a" * 500: 1, b"ab" * 100: 1},
              {b"a" * 257: 3, b"a" * 256: 3, b"b" * 300: 2},
              {bytes([i, j]): 1 for i in range(40) for j in range(40)},
              {b"abab" * 50 + b"a": 2, b"baba" * 50: 2, b"aabb" * 30: 2}]
    for counts in tables:
        for par in (1, 2, 7):
            one, two, _ = _both(counts, 256 + 80, par)
            assert two == one == reference.train_on_counts(counts, 256 + 80, [])


@pytest.mark.parametrize("par_min_sites", [1, 16])
def test_two_threads_with_a_guard_and_init_merges(par_min_sites):
    """``allowed`` (plain BPE's token-bytes guard) is asked the same questions; ``init_merges`` (an
    existing model's first merges) are kept and the loop goes on as one thread's."""
    counts = {b"low": 50, b"lower": 20, b"lowest": 20, b"newer": 30, b"wider": 10, b"aaaa": 5, b" the": 40}
    asked1, asked2 = [], []

    def guard(log):
        return lambda a, b: log.append((a, b)) or len(a + b) <= 4
    one = train_words(_np_table(counts), 300, allowed=guard(asked1))
    two = train_words(_np_table(counts), 300, allowed=guard(asked2), threads=2, par_min_sites=par_min_sites)
    assert two == one and asked2 == asked1
    init = one[1][:3]
    assert train_words(_np_table(counts), 300, init_merges=init, threads=2, par_min_sites=par_min_sites) == \
        train_words(_np_table(counts), 300, init_merges=init)


def test_small_tables_and_array_tables_stay_on_one_thread():
    """Fewer symbols than the threshold (no merge could be split), or a small run's ``array.array``
    table (no numpy): one thread, the same merges."""
    counts = {b"low": 5, b"lower": 2}
    report = {"seconds": {}}
    assert train_words(WordTable.from_counts(counts), 260, threads=2, report=report) == \
        train_words(WordTable.from_counts(counts), 260)
    assert report["engine"]["threads"] == 1
    t = WordTable.from_counts(counts)
    plain = WordTable(array.array("B", t.arena.tobytes()), array.array("q", t.offsets.tolist()),
                      array.array("q", t.counts.tolist()))
    report = {"seconds": {}}
    assert train_words(plain, 260, threads=2, par_min_sites=1, report=report) == \
        train_words(WordTable.from_counts(counts), 260)
    assert report["engine"]["threads"] == 1          # array.array table
    report = {"seconds": {}}
    train_words(_np_table(counts), 260, threads=2, par_min_sites=1, report=report)
    assert report["engine"]["threads"] == 2


def test_plain_bpe_merges_with_the_plans_workers(monkeypatch):
    """The BPE method gives the merge phase the plan's worker count (the engine takes two at most)."""
    from bpe_core.config import TrainConfig
    from bpe_core.methods import bpe

    got = {}

    def spy(*args, **kw):
        got.update(kw)
        return train_words(*args, **kw)
    monkeypatch.setattr(bpe, "train_words", spy)

    class Plan:
        num_workers = 2
    config = TrainConfig(input_path="-", vocab_size=260)
    bpe.BPE().train(config, _np_table({b"low": 5, b"lower": 2}), Plan())
    assert got["threads"] == 2


def test_the_second_merge_thread_only_when_the_budget_has_room_for_it(monkeypatch):
    """A plan whose merge figure leaves less than the second thread's memory under the budget merges
    on one thread (``SECOND_THREAD_BYTES``: its stack and the build's second-half tables); on both
    sides of that threshold the merges are the same."""
    from bpe_core.config import TrainConfig
    from bpe_core.methods import bpe

    got = []

    def spy(*args, **kw):
        got.append(kw["threads"])
        return train_words(*args, par_min_sites=8, **kw)     # (a small table: merges split from 8 sites)
    monkeypatch.setattr(bpe, "train_words", spy)

    class Plan:
        num_workers = 2
        memory_limit = 1 << 30
    config = TrainConfig(input_path="-", vocab_size=256 + 120)
    rng = np.random.default_rng(3)
    counts = {bytes(rng.choice(list(b"abcde "), size=int(rng.integers(2, 14))).tolist()): int(rng.integers(1, 30))
              for _ in range(300)}
    results = []
    for merge_bytes in ((1 << 30) - bpe.SECOND_THREAD_BYTES, (1 << 30) - bpe.SECOND_THREAD_BYTES + 1):
        Plan.merge_bytes = merge_bytes
        results.append(bpe.BPE().train(config, _np_table(counts), Plan()))
    assert got == [2, 1]
    # both sides of the threshold: the same merges and vocabulary (the first with merges on two threads)
    assert [r.report["engine"]["threads"] for r in results] == [2, 1]
    assert results[0].report["engine"]["merges_on_two_threads"] > 0
    assert results[0].merges == results[1].merges and results[0].vocab == results[1].vocab
    assert results[0].merges == reference.train_on_counts(counts, 256 + 120, config.special_tokens)[1]
