"""Exact or refuse: every spill threshold, chunk size, worker count and RAM budget gives the result of
the unlimited run, or (budgets only) a refusal that names a budget which then works.

- ``count_corpus`` over spill thresholds from "always spill" to "never spill", just above and below
  the size of each chunk's table, of the running sums, and of the final table (hypothesis);
- ``bpe_core.train`` over a range of budgets;
- ``tools/train_bpe.py`` and ``tools/encode_corpus.py`` over a matrix of ``--memory-limit`` values.
"""
from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import bpe_core
from bpe_core import corpus
from bpe_core.runtime.budget import BudgetError
from bpe_core.runtime.workers import FileStamp
from bpe_core.pretok import counting
from bpe_core.engine import merge

from robust_helpers import ENCODE, SPECIAL, TRAIN, read_outputs, stderr_lines, tool, write_diverse

MiB = 1 << 20
CHUNK_SIZES = (4096, 8192, 16384, 65536)


# ==== count_corpus over spill thresholds =======================================================


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    return str(write_diverse(tmp_path_factory.mktemp("spill") / "small.txt", 96 << 10, seed=1))


@pytest.fixture(scope="module")
def unlimited_table(small_corpus):
    report = {"seconds": {}}
    table = counting.count_corpus(small_corpus, [SPECIAL], "gpt2", 1, 1 << 20, report=report)
    assert report["spilled_runs"] == 0
    return table, report


@pytest.fixture(scope="module")
def thresholds(small_corpus, unlimited_table):
    """Per chunk size: the thresholds where spilling changes behaviour, each -1, +0, +1 byte: every
    chunk's table size, the running sums of them (the tables in RAM before a fold), the final table."""
    stamp = FileStamp.of(small_corpus)
    out = {}
    final = counting._table_bytes((unlimited_table[0].arena, unlimited_table[0].offsets,
                                  unlimited_table[0].counts))
    for cb in CHUNK_SIZES:
        sizes = [counting._table_bytes(counting._count_chunk((small_corpus, s, e, [SPECIAL], "gpt2", stamp)).table)
                 for s, e in corpus.file_chunks(small_corpus, cb, [SPECIAL], "gpt2", stamp=stamp)]
        marks = set(sizes) | set(np.cumsum(sizes).tolist()) | {final}
        out[cb] = sorted({max(0, m + d) for m in marks for d in (-1, 0, 1)} | {0}), sum(sizes), min(sizes)
    return out


@settings(max_examples=40)
@given(data=st.data(), chunk=st.sampled_from(CHUNK_SIZES), workers=st.sampled_from([1, 2, 3]))
def test_every_spill_threshold_gives_the_unlimited_table(small_corpus, unlimited_table, thresholds, tmp_path_factory,
                                                        data, chunk, workers):
    marks, total, smallest = thresholds[chunk]
    threshold = data.draw(st.one_of(st.sampled_from(marks), st.integers(0, total + 1)), label="threshold")
    spill_dir = tmp_path_factory.mktemp("runs")
    report = {"seconds": {}}
    table = counting.count_corpus(small_corpus, [SPECIAL], "gpt2", workers, chunk, report=report,
                                 spill_threshold_bytes=threshold, spill_dir=str(spill_dir))
    whole, whole_report = unlimited_table
    assert table.to_dict() == whole.to_dict()
    assert report["pretokens_counted"] == whole_report["pretokens_counted"] == int(table.counts.sum())
    assert report["bytes_scanned"] == os.path.getsize(small_corpus)
    if threshold < smallest:
        assert report["spilled_runs"] > 0            # below every chunk's table: it must spill
    if threshold >= total:
        assert report["spilled_runs"] == 0           # above all tables together: it never spills
    assert os.listdir(spill_dir) == []               # the runs are removed


def test_always_spill_and_never_spill_both_happen(small_corpus, unlimited_table, tmp_path):
    """The two ends of the range really are what the property test assumes."""
    for threshold, spilled in ((0, True), (1 << 40, False)):
        report = {"seconds": {}}
        table = counting.count_corpus(small_corpus, [SPECIAL], "gpt2", 2, 4096, report=report,
                                     spill_threshold_bytes=threshold, spill_dir=str(tmp_path))
        assert (report["spilled_runs"] > 0) == spilled
        assert table.to_dict() == unlimited_table[0].to_dict()
    vocab, merges = merge.train_words(table, 400, [SPECIAL])
    vocab0, merges0 = merge.train_words(unlimited_table[0], 400, [SPECIAL])
    assert merges == merges0 and vocab == vocab0


# ==== bpe_core.train over budgets ==============================================================


@pytest.fixture(scope="module")
def mb_corpus(tmp_path_factory):
    return str(write_diverse(tmp_path_factory.mktemp("matrix") / "corpus.txt", 2 << 20, seed=2))


def named_budget(message: str) -> int:
    m = re.search(r"--memory-limit (\d+(?:\.\d+)?[KMGT]?)", message)
    assert m, f"the refusal names no budget: {message!r}"
    return bpe_core.config.parse_size(m.group(1))


def _train_or_follow(cfg, budget):
    """Train at ``budget``; on a refusal, follow the budget it names. Before counting only the
    counting phase is known (the merge phase is estimated), so a named budget may be refused once
    more after counting, with the exact need: at most two refusals, each naming a larger budget."""
    refusals = []
    while True:
        try:
            return bpe_core.train(bpe_core.TrainConfig(**cfg, memory_limit=budget)), refusals
        except BudgetError as exc:
            assert exc.min_budget > budget, str(exc)
            assert named_budget(str(exc)) == exc.min_budget
            refusals.append(str(exc))
            assert len(refusals) <= 2, refusals
            if len(refusals) == 2:
                assert "unique pretokens" in refusals[1], refusals   # the second one knows the count
            budget = exc.min_budget


def test_train_over_budgets_is_exact_or_refuses_with_a_budget_that_works(mb_corpus):
    cfg = dict(input_path=mb_corpus, vocab_size=500, special_tokens=("<|endoftext|>",), num_workers=2)
    base = bpe_core.train(bpe_core.TrainConfig(**cfg))
    with pytest.raises(BudgetError):
        bpe_core.train(bpe_core.TrainConfig(**cfg, memory_limit=1 * MiB))
    _, refusals = _train_or_follow(cfg, 1 * MiB)
    least = named_budget(refusals[-1])          # the budget that worked
    outcomes = []
    for budget in sorted({MiB, least // 2, least - 8 * MiB, least - MiB, least, least + MiB, 2 * least, 1 << 30}):
        got, refused = _train_or_follow(cfg, budget)
        if budget >= 2 * least:       # (in this process the RSS grows run by run, so not `least`)
            assert not refused, f"{budget >> 20} MiB refused although {least >> 20} MiB worked: {refused}"
        outcomes.append(bool(refused))
        assert got.merges == base.merges and got.vocab == base.vocab
        for key in ("pretokens", "unique_pretokens", "pretokens_counted", "bytes_scanned"):
            assert got.report[key] == base.report[key], key
    assert True in outcomes and False in outcomes


# ==== the command-line tools over budgets ======================================================


@pytest.fixture(scope="module")
def cli_unlimited(mb_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("unlimited")
    r = tool(TRAIN, mb_corpus, "--vocab-size", 500, "--out", out, "--workers", 2, "--no-progress")
    assert r.returncode == 0, r.stderr
    return out, read_outputs(out)


def _check_train(mb_corpus, out, base, budget):
    """Run at ``budget``: exact, or exit 2 with one line naming a budget; returns that budget or None."""
    if out.exists():
        shutil.rmtree(out)
    r = tool(TRAIN, mb_corpus, "--vocab-size", 500, "--out", out, "--workers", 2, "--no-progress",
             "--memory-limit", budget)
    if r.returncode == 2:
        lines = stderr_lines(r.stderr)
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert not out.exists() or not os.listdir(out), "a refused run wrote something"
        return named_budget(lines[0])
    assert r.returncode == 0, f"--memory-limit {budget}: exit {r.returncode}: {r.stderr}"
    merges, model, report = read_outputs(out)
    assert merges == base[0] and model == base[1], f"--memory-limit {budget}: different output"
    for key in ("pretokens", "unique_pretokens"):
        assert report[key] == base[2][key], key
    return None


def _follow(check, budget, *args):
    """Run at ``budget`` and follow the budgets the refusals name (at most two, see
    ``_train_or_follow``); returns the budgets refused and the one that worked."""
    refused = []
    while True:
        named = check(*args, str(budget))
        if named is None:
            return refused, budget
        assert named > budget, f"{budget} refused, naming the smaller {named}"
        refused.append(budget)
        assert len(refused) <= 2, f"refused {refused}, now naming {named}"
        budget = named


def test_train_cli_budget_matrix(mb_corpus, cli_unlimited, tmp_path):
    _, base = cli_unlimited
    refused, least = _follow(_check_train, MiB, mb_corpus, tmp_path / "tiny", base)
    assert refused, "1 MiB was accepted"
    for budget in (least // 2, least - 4 * MiB, least, least + 64 * MiB, 1 << 30):
        again, worked = _follow(_check_train, budget, mb_corpus, tmp_path / "run", base)
        if budget >= least:
            assert not again, f"{budget >> 20} MiB refused although {least >> 20} MiB worked"


@pytest.fixture(scope="module")
def encode_unlimited(mb_corpus, cli_unlimited, tmp_path_factory):
    out = tmp_path_factory.mktemp("enc") / "ids.npy"
    r = tool(ENCODE, mb_corpus, "--tokenizer", cli_unlimited[0], "--out", out, "--workers", 2, "--no-progress",
             "--chunk-size", "256K")
    assert r.returncode == 0, r.stderr
    return np.load(out)


def _check_encode(mb_corpus, tok, out, base, budget):
    if out.exists():
        out.unlink()
    r = tool(ENCODE, mb_corpus, "--tokenizer", tok, "--out", out, "--workers", 2, "--no-progress",
             "--memory-limit", budget)
    names = [n for n in os.listdir(out.parent) if n != out.name]
    assert names == [], f"left beside the output: {names}"
    if r.returncode == 2:
        lines = stderr_lines(r.stderr)
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert not out.exists()
        return named_budget(lines[0])
    assert r.returncode == 0, f"--memory-limit {budget}: exit {r.returncode}: {r.stderr}"
    assert np.array_equal(np.load(out), base), f"--memory-limit {budget}: different ids"
    return None


def test_encode_cli_budget_matrix(mb_corpus, cli_unlimited, encode_unlimited, tmp_path):
    tok = cli_unlimited[0]
    (tmp_path / "o").mkdir()
    out = tmp_path / "o" / "ids.npy"
    refused, least = _follow(_check_encode, MiB, mb_corpus, tok, out, encode_unlimited)
    assert len(refused) == 1, "encoding knows its need before it starts: one refusal at most"
    for budget in (least // 2, least - 4 * MiB, least, least + 64 * MiB, 1 << 30):
        again, _ = _follow(_check_encode, budget, mb_corpus, tok, out, encode_unlimited)
        assert len(again) <= 1
        if budget >= least:
            assert not again, f"{budget >> 20} MiB refused although {least >> 20} MiB worked"
