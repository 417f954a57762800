"""A budget too small for the vocabulary is refused before counting (``training._refuse_from_sample``,
``pretok.sample``): the unique pretokens of a large file are estimated from a spread sample, and a
run whose merge phase cannot fit even a share of that estimate stops before the counting pass,
naming a budget that then works. Here at a small scale (the sampling threshold lowered to 0): a
growing-vocabulary corpus, whose unique pretokens Heaps' law for English underestimates."""
from __future__ import annotations

import os

import pytest

import bpe_core
from bpe_core import training
from bpe_core.errors import BudgetError
from bpe_core.pretok.counting import count_corpus
from bpe_core.pretok.pretokenize import count_pretokens, split_spans
from bpe_core.pretok.sample import sample_words
from test_budget_spill import SPECIAL, write_growing


def _cfg(corpus, tmp_path, vocab_size=12000):
    return dict(input_path=str(corpus), vocab_size=vocab_size, special_tokens=(SPECIAL,), num_workers=2,
                chunk_bytes=256 << 10, spill_dir=str(tmp_path), progress=False)


def _exact_budget(cfg) -> int:
    """The budget the check after counting names (a first run far too small for the merge phase,
    but not for counting)."""
    try:
        bpe_core.train(bpe_core.TrainConfig(**cfg, memory_limit=1 << 20))
    except BudgetError as exc:
        first = exc.min_budget
    try:
        bpe_core.train(bpe_core.TrainConfig(**cfg, memory_limit=first))
    except BudgetError as exc:
        return exc.min_budget
    return first


class _Counted(Exception):
    """Raised in place of the counting pass: the run got past the checks before counting."""


def test_a_budget_too_small_for_the_vocabulary_is_refused_before_counting(tmp_path, monkeypatch):
    corpus = write_growing(tmp_path / "growing.txt", 4 << 20)
    cfg = _cfg(corpus, tmp_path)
    unlimited = bpe_core.train(bpe_core.TrainConfig(**cfg))
    exact = _exact_budget(cfg)                      # (no sampling: the file is below the threshold)
    monkeypatch.setattr(training, "SAMPLE_MIN_BYTES", 0)

    def not_counting(*args, **kwargs):
        raise _Counted()

    # budgets from the exact one down, 5% at a time, until counting itself would not fit: those the
    # sample shows too small for the merge phase stop before the counting pass, naming a budget
    monkeypatch.setattr(training, "count_corpus", not_counting)
    named = None
    for step in range(1, 20):
        limit = exact * (20 - step) // 20
        try:
            bpe_core.train(bpe_core.TrainConfig(**cfg, memory_limit=limit))
        except _Counted:
            assert limit >= exact * 3 // 4, "a budget far too small got past the sample"
            continue
        except BudgetError as exc:
            if "before counting" not in str(exc):
                break                               # counting itself does not fit any more
            assert exc.min_budget > limit
            named = exc.min_budget
            break
    assert named is not None, "no budget was refused before counting"
    # the budget named works: the run counts, merges as the unlimited one and stays under it
    monkeypatch.setattr(training, "count_corpus", count_corpus)
    got = bpe_core.train(bpe_core.TrainConfig(**cfg, memory_limit=named))
    assert got.merges == unlimited.merges and got.vocab == unlimited.vocab
    mem = got.report["memory"]
    assert not mem["budget_exceeded"] and mem["peak_anon_bytes"] <= named
    assert got.report["sample"]["estimate"] >= got.report["sample"]["unique"]
    # and the exact budget is not refused by the sample (a run inside its budget is never stopped
    # by an estimate that runs a little high)
    got = bpe_core.train(bpe_core.TrainConfig(**cfg, memory_limit=max(exact, named)))
    assert got.merges == unlimited.merges


def test_a_run_far_inside_its_budget_is_not_sampled(tmp_path, monkeypatch):
    corpus = write_growing(tmp_path / "growing.txt", 1 << 20)
    monkeypatch.setattr(training, "SAMPLE_MIN_BYTES", 0)
    got = bpe_core.train(bpe_core.TrainConfig(**_cfg(corpus, tmp_path, 500), memory_limit=4 << 30))
    assert "sample" not in got.report


def test_the_sample_counts_its_pieces_and_carries_them_to_the_file(tmp_path):
    """The sample's unique pretokens are those of its pieces, counted the plain way; the estimate is
    at least the sample's count and at most the file's bytes; a file of one repeated line is carried
    with the smallest exponent (no new words)."""
    corpus = write_growing(tmp_path / "growing.txt", 2 << 20)
    s = sample_words(str(corpus), [SPECIAL.encode()], pieces=8, piece_bytes=16 << 10)
    data = corpus.read_bytes()
    words, half = set(), set()      # (half: the pieces of even positions)
    for i in range(8):
        start = (len(data) - (16 << 10)) * i // 7
        buf = data[start:start + (16 << 10)]
        buf = buf[buf.find(b" "):buf.rfind(b" ")]
        spans, _ = split_spans(buf, 0, len(buf), [SPECIAL.encode()])
        arena, offsets, _ = count_pretokens(buf, spans)
        piece_words = {bytes(arena[offsets[k]:offsets[k + 1]]) for k in range(len(offsets) - 1)}
        words |= piece_words
        if i % 2 == 0:
            half |= piece_words
    assert s.unique == len(words) and s.unique_bytes == sum(map(len, words))
    assert s.unique_half == len(half) < s.unique
    assert s.unique <= s.estimate <= os.path.getsize(corpus)
    for threads in (2, 3, 8):        # pieces counted on threads: the same tables, the same estimate
        assert sample_words(str(corpus), [SPECIAL.encode()], pieces=8, piece_bytes=16 << 10, threads=threads) == s
    same = tmp_path / "same.txt"
    same.write_bytes(b"the same words again and again\n" * 100_000)
    r = sample_words(str(same), [], pieces=8, piece_bytes=16 << 10)
    assert r.exponent == 0.3 and r.unique <= 12
