"""A run whose pretoken tables spill stays under its budget, measured, with the merges of the
unlimited run.

At 15 GB (growing vocabulary, 32k, ``--memory-limit 2G``) the merge phase held ~100 MiB more than the
plan's figure once counting had folded and spilled its tables: the counting threads' heaps kept
their free tops resident to the end, and the plan counted the process as measured before counting
(before numpy and the engine were imported). Here the same path at a small scale: a corpus whose
vocabulary keeps growing, counted in small chunks with every table over a few KiB spilled to disk,
trained at the smallest budget the plan accepts, and the process's measured anonymous peak (the run
report's, sampled by ``runtime.memmon``) held against that budget.
"""
from __future__ import annotations

import random

import pytest

import bpe_core
from bpe_core import training
from bpe_core.pretok import counting
from bpe_core.runtime.budget import BudgetError

MiB = 1 << 20
SPECIAL = "<|endoftext|>"


def write_growing(path, n_bytes: int, seed: int = 0):
    """Letter-soup words, a share of them fresh (a running number glued on), so the unique
    pretokens keep growing with the size, as in ``benchmarks/synth_corpus.py``'s corpora."""
    rng = random.Random(seed)
    common = ["".join(rng.choice("etaoinshrdlucmfw") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    out, size, fresh = [], 0, 0
    while size < n_bytes:
        words = []
        for _ in range(rng.randint(5, 40)):
            w = common[min(int(rng.paretovariate(1.1)) - 1, len(common) - 1)]
            if rng.random() < 0.15:
                fresh += 1
                w += _letters(fresh * 7919 % 1000003)
            words.append(w)
        line = " ".join(words) + (".\n" if rng.random() < 0.9 else f"\n{SPECIAL}")
        out.append(line)
        size += len(line)
    path.write_text("".join(out)[:n_bytes], encoding="ascii")
    return path


def _letters(n: int) -> str:
    """``n`` in base 26, written with the letters a-z (a pretoken's letters stay one pretoken)."""
    out = ""
    while True:
        n, r = divmod(n, 26)
        out += chr(97 + r)
        if not n:
            return out


def _smallest_budget_that_works(cfg: dict) -> tuple[object, int]:
    """Train at 1 MiB and follow the budgets the refusals name (at most two: before and after
    counting); returns the result and the budget it ran at."""
    budget = 1 * MiB
    for _ in range(3):
        try:
            return bpe_core.train(bpe_core.TrainConfig(**cfg, memory_limit=budget)), budget
        except BudgetError as exc:
            assert exc.min_budget > budget, str(exc)
            budget = exc.min_budget
    raise AssertionError(f"still refused at {budget >> 20} MiB")


@pytest.mark.parametrize("threshold", [4 << 10, 256 << 10])
def test_a_spilling_run_at_its_smallest_budget_stays_under_it(tmp_path, monkeypatch, threshold):
    corpus = write_growing(tmp_path / "growing.txt", 3 << 20)
    cfg = dict(input_path=str(corpus), vocab_size=1000, special_tokens=(SPECIAL,), num_workers=2,
               chunk_bytes=128 << 10, spill_dir=str(tmp_path), progress=False)
    unlimited = bpe_core.train(bpe_core.TrainConfig(**cfg))
    assert unlimited.report["spilled_runs"] == 0

    real = counting.count_corpus

    def spilling(*args, **kwargs):          # the spill path, whatever the plan's threshold
        kwargs["spill_threshold_bytes"] = threshold
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "count_corpus", spilling)
    got, budget = _smallest_budget_that_works(cfg)
    assert got.report["spilled_runs"] >= 1, got.report["spilled_runs"]
    assert got.merges == unlimited.merges and got.vocab == unlimited.vocab
    assert got.report["unique_pretokens"] == unlimited.report["unique_pretokens"]
    mem = got.report["memory"]
    assert mem["budget_bytes"] == budget
    by_phase = {k: v >> 20 for k, v in mem["peak_anon_by_phase"].items()}
    assert not mem["budget_exceeded"] and mem["peak_anon_bytes"] <= budget, \
        f"{mem['peak_anon_bytes'] >> 20} MiB held under a {budget >> 20} MiB budget: {by_phase}"


def test_after_a_spilling_count_the_process_holds_what_it_held_before(tmp_path):
    """What counting leaves beside its table is what the merge phase starts from. The counting
    threads' heaps used to keep their free tops (glibc trims only the main heap's): on this 12 MB
    corpus 7-9 MiB more than before counting stayed resident after the table was dropped (tens of
    MiB at 15 GB, through the merge loop); now the process is back within a few MiB."""
    from bpe_core.runtime.memmon import tree_memory
    from bpe_core.runtime.workers import release_free_memory

    corpus = write_growing(tmp_path / "growing.txt", 12 << 20)
    counting.count_corpus(str(write_growing(tmp_path / "warm.txt", 1 << 20)), [SPECIAL.encode()], "gpt2", 2,
                          256 << 10, spill_threshold_bytes=64 << 10, spill_dir=str(tmp_path))   # imports
    before = tree_memory()["anon"]
    report = {"seconds": {}}
    table = counting.count_corpus(str(corpus), [SPECIAL.encode()], "gpt2", 2, 4 << 20, report=report,
                                  spill_threshold_bytes=256 << 10, spill_dir=str(tmp_path))
    assert report["spilled_runs"] >= 2 and table.n_words > 150_000
    del table
    release_free_memory()       # as training does once the table is in files (the main heap's top)
    left = tree_memory()["anon"] - before
    assert left <= 4 * MiB, f"{left / MiB:.1f} MiB more than before counting"
