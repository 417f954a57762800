"""The memory plan as arithmetic: no processes, overheads passed in as numbers.

Budgets 200 MB - 64 GB, 1-64 cores, inputs 1 KB - 15 GB: every plan fits its budget (a merge phase
estimated from the input size may not, and says so; with the real count it must), uses at least one
and at most one worker per core, sane chunks; spilling only gets rarer as the budget grows; a budget
that is too small raises ``BudgetError`` naming the smallest one that works, and that one does.
"""
import doctest
import json

import pytest
from hypothesis import given, strategies as st

from bpe_core.runtime import budget as scheduler
from bpe_core.config import parse_size
from bpe_core.runtime.budget import (MAX_CHUNK_BYTES, MIN_CHUNK_BYTES, BudgetError, Plan, default_memory_limit,
                                plan_encoding, plan_training)

MB, GB = 10**6, 10**9
MiB, GiB = 1 << 20, 1 << 30
OVERHEAD = 60 * MiB          # a little above what measure_worker_overhead gives (25-35 MiB)
AVAILABLE = 32 * GiB

BUDGETS = [200 * MB, 300 * MB, 500 * MB, 1 * GB, 2 * GB, 4 * GB, 8 * GiB, 16 * GB, 64 * GB]
CORES = [1, 2, 3, 4, 16, 64]
INPUTS = [1000, 1 * MB, 50 * MB, 230 * MB, 1 * GB, 4 * GB, 15 * GB]


def train(input_bytes, budget, cores, **kw):
    kw.setdefault("per_worker_overhead", OVERHEAD)
    kw.setdefault("parent_overhead", OVERHEAD)
    return plan_training(input_bytes, budget, cores, AVAILABLE, **kw)


def encode(input_bytes, budget, cores, vocab_size=50257, **kw):
    kw.setdefault("per_worker_overhead", OVERHEAD)
    kw.setdefault("parent_overhead", OVERHEAD)
    return plan_encoding(input_bytes, vocab_size, budget, cores, AVAILABLE, **kw)


def check_plan(plan: Plan, input_bytes: int, budget: int, cores: int, user_chunk=None, exact=False):
    assert 1 <= plan.num_workers <= cores
    assert plan.count_bytes <= budget
    if exact or plan.kind == "encode":
        assert plan.merge_fits
    if plan.merge_fits:
        assert plan.peak_bytes <= budget
    else:
        assert any("above the budget" in n for n in plan.notes) and "OVER" in plan.describe()
    assert plan.memory_limit == budget
    if user_chunk is None:
        assert 1 <= plan.chunk_bytes <= MAX_CHUNK_BYTES
        assert plan.chunk_bytes >= min(MIN_CHUNK_BYTES, input_bytes)
        assert plan.chunk_bytes <= max(input_bytes, 1)
        # no idle worker: at least one chunk each
        assert -(-input_bytes // plan.chunk_bytes) >= plan.num_workers
    else:
        assert plan.chunk_bytes == user_chunk
    assert plan.per_worker_bytes > 0 and plan.parent_bytes > 0
    if plan.kind == "train":
        assert plan.peak_bytes == max(plan.count_bytes, plan.merge_bytes)
        table = plan.unique_pretokens * scheduler.TABLE_BYTES_PER_WORD
        assert plan.spill_threshold_bytes > 0
        assert plan.spill or plan.spill_threshold_bytes >= table
    json.dumps(plan.to_dict())
    text = plan.describe()
    assert "budget" in text and "peak" in text


def plan_or_error(fn, input_bytes, budget, cores, **kw):
    """The plan, or (after checking the error) the plan at the smallest budget the error names."""
    try:
        return fn(input_bytes, budget, cores, **kw), budget
    except BudgetError as exc:
        assert exc.min_budget > budget
        assert "smallest budget" in str(exc)
        # the budget in the message is one a user can type, and it works
        typed = parse_size(str(exc).rsplit("--memory-limit ", 1)[1].split()[0].rstrip(",;"))
        assert typed >= exc.min_budget - (1 << 20)
        plan = fn(input_bytes, exc.min_budget, cores, **kw)
        fn(input_bytes, typed, cores, **kw)
        return plan, exc.min_budget


# ==== Training ==============================================================================


@pytest.mark.parametrize("cores", CORES)
@pytest.mark.parametrize("budget", BUDGETS)
def test_training_plans_fit(budget, cores):
    for n in INPUTS:
        plan, used = plan_or_error(train, n, budget, cores)
        check_plan(plan, n, used, cores)
        # after counting, with the real number of unique pretokens (here: the estimate / 3)
        plan, used = plan_or_error(train, n, budget, cores, unique_pretokens=plan.unique_pretokens // 3)
        check_plan(plan, n, used, cores, exact=True)


@pytest.mark.parametrize("cores", [1, 2, 8, 64])
@pytest.mark.parametrize("input_bytes", INPUTS)
@pytest.mark.parametrize("exact", [False, True])
def test_spill_and_feasibility_are_monotonic_in_budget(input_bytes, cores, exact):
    budgets = sorted(BUDGETS + [int(b * 1.5) for b in BUDGETS] + [b // 4 for b in BUDGETS])
    words = scheduler.unique_pretokens_estimate(input_bytes) if exact else None
    seen_fit = seen_no_spill = False
    for budget in budgets:
        try:
            plan = train(input_bytes, budget, cores, unique_pretokens=words)
        except BudgetError:
            assert not seen_fit, "a larger budget failed where a smaller one worked"
            continue
        seen_fit = True
        if seen_no_spill:
            assert not plan.spill, "a larger budget spills where a smaller one did not"
        seen_no_spill |= not plan.spill


def test_the_users_target_15gb_in_8gb_on_2_cores():
    plan = train(15 * GB, 8 * GiB, 2, vocab_size=32000)
    assert plan.num_workers == 2
    assert plan.merge_fits and plan.peak_bytes < 8 * GiB
    assert not plan.spill


def test_spill_when_the_table_does_not_fit_beside_the_workers():
    plan = train(15 * GB, 300 * MB, 2, vocab_size=32000)     # counting fits only with a spilled table
    assert plan.spill and plan.num_workers >= 1
    assert plan.spill_threshold_bytes < plan.unique_pretokens * scheduler.TABLE_BYTES_PER_WORD
    assert not plan.merge_fits and "--memory-limit" in " ".join(plan.notes)
    assert "spill         yes" in plan.describe()


def test_too_small_names_the_smallest_budget_and_that_budget_works():
    words = 25_000_000       # even with the read-only arrays mapped, 2.4 GiB of RAM
    with pytest.raises(BudgetError) as info:
        train(15 * GB, 1 * GiB, 2, vocab_size=32000, unique_pretokens=words)
    msg = str(info.value)
    assert "too small" in msg and "merge phase" in msg and "--memory-limit" in msg
    plan = train(15 * GB, info.value.min_budget, 2, vocab_size=32000, unique_pretokens=words)
    assert plan.peak_bytes <= info.value.min_budget
    with pytest.raises(BudgetError):
        train(15 * GB, info.value.min_budget - scheduler.BUDGET_SLACK - 2 * MiB, 2, vocab_size=32000,
              unique_pretokens=words)


def test_counting_that_cannot_fit_is_refused_before_any_work():
    with pytest.raises(BudgetError) as info:
        train(15 * GB, 100 * MB, 2, parent_overhead=90 * MiB)
    assert "counting needs" in str(info.value)
    train(15 * GB, info.value.min_budget, 2, parent_overhead=90 * MiB)


def test_more_budget_never_means_fewer_workers():
    workers = [train(4 * GB, b, 64).num_workers for b in (6 * GB, 8 * GB, 16 * GB, 64 * GB)]
    assert workers == sorted(workers)
    assert workers[-1] == 64


def test_small_input_runs_in_one_process():
    plan = train(1000, 200 * MB, 64)
    assert plan.num_workers == 1 and plan.chunk_bytes == 1000
    assert "in the parent process" in plan.describe()


def test_user_options_are_respected_and_clamped():
    plan = train(1 * GB, 8 * GiB, 4, num_workers=2, chunk_bytes=3 * MiB)
    assert plan.num_workers == 2 and plan.chunk_bytes == 3 * MiB
    plan = train(1 * GB, 8 * GiB, 4, num_workers=32)
    assert plan.num_workers == 4
    assert any("32 workers" in n for n in plan.notes)
    plan = train(100 * MB, 600 * MB, 16, num_workers=16)
    assert plan.num_workers < 16 and any("budget allows" in n for n in plan.notes)
    with pytest.raises(ValueError):
        train(1 * GB, 8 * GiB, 4, num_workers=0)
    with pytest.raises(ValueError):
        train(-1, 8 * GiB, 4)


def test_replanning_with_the_real_count_uses_it():
    est = train(230 * MB, 1 * GB, 2, vocab_size=32000)
    real = train(230 * MB, 1 * GB, 2, vocab_size=32000, unique_pretokens=513_605)
    assert real.unique_pretokens == 513_605
    assert real.merge_bytes < est.merge_bytes
    assert not any("estimated" in n for n in real.notes)


def test_a_repetitive_corpus_is_not_refused_on_the_estimate():
    # 1 GB of en_heldout repeated has its ~101 k unique pretokens, whatever the size suggests
    est = train(1 * GB, 300 * MB, 2, vocab_size=8000)
    assert not est.merge_fits                    # the estimate is pessimistic here ...
    real = train(1 * GB, 300 * MB, 2, vocab_size=8000, unique_pretokens=101_444)
    assert real.merge_fits                       # ... and the real count decides


def test_the_model_covers_the_measured_engine():
    # en_train (230 MB): 513,605 unique pretokens. Measured (2026-12-07, the pair tables made once
    # for the plan's pairs, the list pool compacted): the engine held 70 MiB (8k) and 90 MiB (32k), and
    # the whole process peaked at 125 and 143 MiB in the merge loop; the model of the engine alone
    # covers the whole process. (Before: merge-phase growth 113 and 174 MiB, the engine's tables
    # copied to larger blocks as they grew.)
    for vocab, measured in ((8000, 125 * MiB), (32000, 143 * MiB)):
        assert scheduler.engine_bytes(513_605, vocab) >= measured
    # and Heaps' estimate stays above the measured counts
    assert scheduler.unique_pretokens_estimate(12_613_005) >= 101_444
    assert scheduler.unique_pretokens_estimate(229_643_106) >= 513_605


def test_budget_above_available_ram_is_noted():
    plan = plan_training(1 * GB, 16 * GiB, 2, 4 * GiB, per_worker_overhead=OVERHEAD, parent_overhead=OVERHEAD)
    assert any("above the RAM available" in n for n in plan.notes)


def test_default_memory_limit():
    assert default_memory_limit(available=64 * GiB) == 8 * GiB
    assert default_memory_limit(available=4 * GiB) == int(0.8 * 4 * GiB)
    assert 0 < default_memory_limit() <= 8 * GiB


@given(input_bytes=st.integers(1000, 15 * GB), budget=st.integers(200 * MB, 64 * GB),
       cores=st.integers(1, 64), vocab_size=st.integers(256, 200_000),
       num_workers=st.none() | st.integers(1, 128), overhead=st.integers(10 * MiB, 150 * MiB))
def test_training_plan_properties(input_bytes, budget, cores, vocab_size, num_workers, overhead):
    kw = dict(vocab_size=vocab_size, num_workers=num_workers, per_worker_overhead=overhead,
              parent_overhead=overhead)
    plan, used = plan_or_error(train, input_bytes, budget, cores, **kw)
    check_plan(plan, input_bytes, used, cores)
    exact, used = plan_or_error(train, input_bytes, budget, cores, unique_pretokens=plan.unique_pretokens, **kw)
    check_plan(exact, input_bytes, used, cores, exact=True)
    if num_workers is not None:
        assert plan.num_workers <= num_workers
    # more budget: still a plan, and no spill where this one did not spill
    bigger = train(input_bytes, used * 2, cores, **kw)
    assert bigger.spill <= plan.spill


@given(input_bytes=st.integers(1, 15 * GB), chunk=st.integers(1, 256 * MiB),
       budget=st.integers(200 * MB, 64 * GB), cores=st.integers(1, 64))
def test_training_plan_with_a_user_chunk_size(input_bytes, chunk, budget, cores):
    plan, used = plan_or_error(train, input_bytes, budget, cores, chunk_bytes=chunk)
    check_plan(plan, input_bytes, used, cores, user_chunk=chunk)


# ==== Encoding ==============================================================================


@pytest.mark.parametrize("cores", CORES)
@pytest.mark.parametrize("budget", BUDGETS)
def test_encoding_plans_fit(budget, cores):
    for n in INPUTS:
        plan, used = plan_or_error(encode, n, budget, cores)
        check_plan(plan, n, used, cores)


def test_encoding_too_small_budget():
    with pytest.raises(BudgetError) as info:
        encode(4 * GB, 100 * MB, 2)
    assert "--memory-limit" in str(info.value)
    assert encode(4 * GB, info.value.min_budget, 2).num_workers == 1


@given(input_bytes=st.integers(1, 15 * GB), budget=st.integers(200 * MB, 64 * GB), cores=st.integers(1, 64),
       vocab_size=st.integers(256, 300_000), num_workers=st.none() | st.integers(1, 128))
def test_encoding_plan_properties(input_bytes, budget, cores, vocab_size, num_workers):
    plan, used = plan_or_error(encode, input_bytes, budget, cores, vocab_size=vocab_size, num_workers=num_workers)
    check_plan(plan, input_bytes, used, cores)


def _big_cache_budget(input_bytes, cores):
    """The smallest budget (to the byte) whose encoding plan takes the large cache."""
    lo, hi = 1, 64 * GB
    assert encode(input_bytes, hi, cores).cache_entries
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            big = encode(input_bytes, mid, cores).cache_entries
        except BudgetError:
            big = False
        lo, hi = (lo, mid) if big else (mid, hi)
    return hi


@pytest.mark.parametrize("cores", [1, 2, 16])
def test_encoding_takes_the_large_cache_from_its_thresholds(cores):
    """The large pretoken cache from ``ENCODE_BIG_CACHE_MIN_INPUT`` bytes of input (one byte less:
    the default), at the smallest budget that holds it within ``ENCODE_BIG_CACHE_SHARE`` (one byte
    less: the default, the same workers): its bytes in the worker's estimate, the plan within the
    share."""
    n = scheduler.ENCODE_BIG_CACHE_MIN_INPUT
    assert encode(n, 8 * GiB, cores).cache_entries == scheduler.ENCODE_BIG_CACHE_ENTRIES
    assert encode(n - 1, 8 * GiB, cores).cache_entries == 0
    b = _big_cache_budget(15 * GB, cores)
    at, below = encode(15 * GB, b, cores), encode(15 * GB, b - 1, cores)
    assert at.cache_entries == scheduler.ENCODE_BIG_CACHE_ENTRIES and below.cache_entries == 0
    assert at.num_workers == below.num_workers and at.peak_bytes <= b and below.peak_bytes <= b - 1
    assert at.per_worker_bytes - at.chunk_bytes == \
        below.per_worker_bytes - below.chunk_bytes + scheduler.ENCODE_BIG_CACHE_BYTES - scheduler.ENCODE_CACHE_BYTES
    assert at.peak_bytes <= scheduler.ENCODE_BIG_CACHE_SHARE * b
    assert "up to 1,048,576 pretokens a worker" in at.describe() and "pretokens a worker" not in below.describe()
    check_plan(at, 15 * GB, b, cores)


@given(input_bytes=st.integers(1, 15 * GB), budget=st.integers(200 * MB, 64 * GB), cores=st.integers(1, 64),
       vocab_size=st.integers(256, 300_000))
def test_the_large_cache_never_costs_a_worker(input_bytes, budget, cores, vocab_size):
    """Against the plan without it: the same workers and chunks; the same plan when it is not taken,
    else the cache's bytes more a worker and the peak within ``ENCODE_BIG_CACHE_SHARE`` of the budget."""
    from unittest import mock

    plan, used = plan_or_error(encode, input_bytes, budget, cores, vocab_size=vocab_size)
    with mock.patch.object(scheduler, "ENCODE_BIG_CACHE_MIN_INPUT", 1 << 62):
        base = encode(input_bytes, used, cores, vocab_size=vocab_size)
    assert plan.num_workers == base.num_workers and plan.chunk_bytes == base.chunk_bytes
    if plan.cache_entries:
        assert input_bytes >= scheduler.ENCODE_BIG_CACHE_MIN_INPUT
        assert plan.per_worker_bytes - base.per_worker_bytes == \
            scheduler.ENCODE_BIG_CACHE_BYTES - scheduler.ENCODE_CACHE_BYTES
        assert plan.peak_bytes <= scheduler.ENCODE_BIG_CACHE_SHARE * used
    else:
        assert plan == base


# ==== Docs ==================================================================================


def test_docstring_examples():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(scheduler):
        runner.run(test)
    assert runner.failures == 0


def test_plan_to_dict_is_asdict():
    """``Plan.to_dict`` copies its fields shallowly (``asdict``'s deep copy cost 0.3 ms a run): the
    same dict as ``asdict``, for an encoding and a training plan (a field that holds more than
    numbers, strings, the notes and a flat dict must be copied there too)."""
    import dataclasses

    from bpe_core.runtime.budget import plan_encoding, plan_training

    for p in (plan_encoding(1 << 20, 50257, 1 << 30, 2, 4 << 30, per_worker_overhead=1 << 26, parent_overhead=1 << 26),
              plan_training(64 << 20, 1 << 30, 2, 4 << 30, vocab_size=32000)):
        want = dict(dataclasses.asdict(p), notes=list(p.notes), merge_fits=p.merge_fits)
        got = p.to_dict()
        assert got == want and list(got) == list(want)
        got["phase_seconds"]["x"] = 1
        assert "x" not in p.phase_seconds
