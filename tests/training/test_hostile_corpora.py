"""Hostile corpora at small sizes: one repeated byte (``a``, NUL), letters without whitespace (one
pretoken as long as the file). The fast trainer gives the reference trainer's merges, with and
without ``max_token_bytes``; under a budget too small for the tokens such a corpus builds, the run
stops with one ``BudgetError`` line naming the longest pretoken and ``--max-token-bytes`` (never an
OOM kill), and the tool exits 2.
"""
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core import reference
from bpe_core.errors import BudgetError
from bpe_core.methods.bpe import TokenBytesGuard
from bpe_core.runtime import budget

from robust_helpers import TRAIN, stderr_lines, tool


def train_both(data: bytes, vocab_size: int, **options):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "corpus.txt")
        with open(path, "wb") as f:
            f.write(data)
        fast = bpe_core.train_bpe(path, vocab_size, [], num_workers=1, **options)
    slow = reference.train_bpe_from_bytes(data, vocab_size, [], max_token_bytes=options.get("max_token_bytes"))
    return fast, slow


repeated_byte = st.builds(lambda b, n: bytes([b]) * n, st.sampled_from([0, ord("a"), ord(" "), 0xFF, ord("7")]),
                          st.integers(1, 3000))
no_whitespace = st.builds(lambda letters, n, seed: bytes(letters[(i * 7 + seed * i * i) % len(letters)]
                                                          for i in range(n)),
                          st.sampled_from([b"ab", b"abc", b"xyzw", b"aab"]), st.integers(1, 2000), st.integers(0, 5))


@settings(max_examples=40, deadline=None)
@given(st.one_of(repeated_byte, no_whitespace, st.tuples(repeated_byte, no_whitespace).map(b"".join)),
       st.integers(257, 256 + 40), st.sampled_from([None, 2, 3, 8, 64]))
def test_fast_equals_reference_on_hostile_text(data, vocab_size, max_token_bytes):
    fast, slow = train_both(data, vocab_size, max_token_bytes=max_token_bytes)
    assert fast[1] == slow[1]
    assert fast[0] == slow[0]
    if max_token_bytes is not None:
        assert all(len(a + b) <= max_token_bytes for a, b in fast[1])


@pytest.mark.parametrize("byte", [b"a", b"\0"])
def test_one_repeated_byte_builds_tokens_as_long_as_the_run(byte):
    """100 KB of one byte: the merges double the token (16 merges) and join the pieces of the
    binary expansion of 100,000 (5 more) until one token is the whole run, as in the reference;
    ``max_token_bytes`` stops them at that length."""
    fast, slow = train_both(byte * 100_000, 256 + 100)
    assert fast == slow and len(fast[1]) == 21 and len(max(fast[0].values(), key=len)) == 100_000
    capped, slow_capped = train_both(byte * 100_000, 256 + 100, max_token_bytes=1000)
    assert capped == slow_capped and max(len(a + b) for a, b in capped[1]) <= 1000


@pytest.mark.parametrize("byte", [b"a", b"\0"])
def test_a_megabyte_of_one_byte_trains_the_reference_merges_and_a_folder_hf_reads(tmp_path, byte):
    """1 MB of one byte through the tool at the default budget (tokens up to 1 MB long: the folder's
    long-token writers, the HF check): the reference trainer's merges, and HF ``tokenizers`` reads
    the published ``tokenizer.json`` with bpe_core's ids."""
    tokenizers = pytest.importorskip("tokenizers")
    data = byte * 1_000_000
    corpus = tmp_path / "one.txt"
    corpus.write_bytes(data)
    r = tool(TRAIN, corpus, "--vocab-size", "1000", "--out", tmp_path / "tok", "--no-progress")
    assert r.returncode == 0, r.stderr
    model = bpe_core.load(tmp_path / "tok")
    _, merges = reference.train_bpe_from_bytes(data, 1000, [])
    assert model.merges == merges and len(merges) == 25 and max(len(a + b) for a, b in merges) == len(data)
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    ours = bpe_core.Tokenizer.load(tmp_path / "tok")
    for text in (data[:30_000], data[:12_345] + b" x"):
        assert hf.encode(text.decode("latin-1" if byte == b"\0" else "ascii"), add_special_tokens=False).ids == \
            ours.encode(text)


def test_the_guard_stops_when_tokens_outgrow_the_budget():
    guard = TokenBytesGuard(None, memory_limit=100 << 20, merge_bytes=50 << 20, parent_overhead=20 << 20,
                            longest_pretoken=10_000_000)
    assert guard(b"a" * 1000, b"a" * 1000)
    with pytest.raises(BudgetError, match=r"after 2 merges they hold .*longest pretoken is 10,000,000 bytes.*"
                                          r"--max-token-bytes N.*a lower bound"):
        guard(b"a" * (5 << 20), b"a" * (5 << 20))
    # no guard where n_merges tokens of the longest pretoken's length fit
    plan = budget.plan_training(1 << 20, 1 << 30, 1, parent_overhead=30 << 20, per_worker_overhead=8 << 20,
                                vocab_size=1000, unique_pretokens=100, symbols=1000, longest_pretoken=20)

    class Config:
        max_token_bytes = None
    assert TokenBytesGuard.for_run(Config, plan, 744) is None
    plan = plan.with_count(1, symbols=1 << 20, longest_pretoken=1 << 20)
    assert isinstance(TokenBytesGuard.for_run(Config, plan, 744), TokenBytesGuard)


def test_the_guard_weighs_bytes_whose_gpt2_character_is_wide():
    """Writing holds a byte whose GPT-2 character is not printable ASCII (NUL is ``Ā``) in 2 bytes:
    the same token bytes of NUL pass a budget that those of ``a`` fit."""
    w, ww = budget.TOKEN_BYTES_WRITING, budget.TOKEN_BYTES_WRITING_WIDE
    assert ww > w
    n = 1 << 20
    limit = (w + ww) * n // 2           # between the two needs of 1 MiB of tokens

    def guard():
        return TokenBytesGuard(None, memory_limit=limit, merge_bytes=0, parent_overhead=0, longest_pretoken=n)
    g = guard()
    assert g(b"a" * (n // 2), b"a" * (n // 2)) and g.wide == 0
    with pytest.raises(BudgetError, match="too small for the tokens"):
        guard()(b"\0" * (n // 2), b"\0" * (n // 2))
    g = guard()
    assert g(b"a" * (n // 2), bytes([0xFF]) * 10) and g.wide == 10


@pytest.mark.parametrize("sites", [1850, 4_999_999], ids=["letters", "one-byte"])
def test_a_long_pretoken_is_named_when_the_merge_phase_does_not_fit(sites):
    """5 MB in one pretoken: its pair sites (a merge of ``aa`` has one at every byte) cost the site
    tables; the refusal names the pretoken, and the budget it names works."""
    count = dict(symbols=5_000_000, longest_pretoken=5_000_000, longest_pair_sites=sites)
    plan = budget.plan_training(5_000_000, 120 << 20, 2, parent_overhead=40 << 20, per_worker_overhead=8 << 20,
                                vocab_size=1000)
    with pytest.raises(BudgetError, match=r"the merge phase needs ~.*the longest pretoken: 5,000,000 bytes "
                                          r"without a break") as info:
        plan.with_count(1, **count)
    fits = budget.plan_training(5_000_000, info.value.min_budget, 2, parent_overhead=40 << 20,
                                per_worker_overhead=8 << 20, vocab_size=1000)
    assert fits.with_count(1, **count).merge_fits   # the named budget works


def test_tool_under_a_small_budget_is_one_line(tmp_path):
    """4 MB of ``a`` under 225M: the merge phase fits, the tokens it builds do not: one line (exit
    2) after some merges, no folder; with --max-token-bytes it trains (and under 250M without it:
    26 MiB of tokens, written in slices, ~130 MiB at the peak). The merge phase's figure holds the
    process as measured at the start (~180 MiB in a development checkout, ~202 MiB in a fresh
    virtual environment), so the budget sits between it and what writing the tokens needs."""
    corpus = tmp_path / "a.txt"
    corpus.write_bytes(b"a" * 4_000_000)
    r = tool(TRAIN, corpus, "--vocab-size", "1000", "--memory-limit", "225M", "--out", tmp_path / "tok",
             "--no-progress")
    assert r.returncode == 2, r.stderr
    lines = stderr_lines(r.stderr)
    assert len(lines) == 1 and "--max-token-bytes" in lines[0] and "4,000,000 bytes" in lines[0], r.stderr
    assert not (tmp_path / "tok").exists()
    r = tool(TRAIN, corpus, "--vocab-size", "1000", "--memory-limit", "225M", "--max-token-bytes", "4096",
             "--out", tmp_path / "tok", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "no more pairs whose token fits --max-token-bytes 4,096" in r.stderr   # not "no more pairs"
    merges = bpe_core.load(tmp_path / "tok").merges
    assert max(len(a + b) for a, b in merges) == 4096


def test_letters_without_whitespace_refuse_in_one_line_and_the_named_budgets_work(tmp_path):
    """3 MB of letters with no whitespace (one pretoken, one chunk): a small budget is refused in one
    line, before counting (the plan, or the chunk that cannot be cut: lower bounds) or after it (the
    merge phase, naming the pretoken); following the named budgets, each larger, at most three
    refusals, the last run trains with the merges of a run without a limit."""
    rng = np.random.default_rng(1)
    corpus = tmp_path / "letters.txt"
    corpus.write_bytes(np.frombuffer(b"abcdefgh", np.uint8)[rng.integers(0, 8, 3_000_000)].tobytes())
    cfg = dict(input_path=str(corpus), vocab_size=300, special_tokens=(), num_workers=1)
    want = bpe_core.train(bpe_core.TrainConfig(**cfg)).merges
    limit, refusals = 20 << 20, []
    while True:
        try:
            got = bpe_core.train(bpe_core.TrainConfig(**cfg, memory_limit=limit)).merges
            break
        except BudgetError as exc:
            refusals.append(str(exc))
            assert exc.min_budget > limit and len(refusals) <= 3, refusals
            limit = exc.min_budget
    assert got == want
    assert refusals and all("at least" in r or "3,000,000 bytes without a break" in r for r in refusals), refusals


def test_a_chunk_that_cannot_be_cut_is_refused_before_counting():
    plan = budget.plan_training(50_000_000, 60 << 20, 2, parent_overhead=20 << 20, per_worker_overhead=8 << 20,
                                vocab_size=300)
    budget.check_uncut(plan, [("let.txt", 0, plan.chunk_bytes)])          # an ordinary chunk
    with pytest.raises(BudgetError, match=r"let.txt: bytes 0-50,000,000 have no place to cut .* counting them "
                                          r"at once .* at least --memory-limit \d+M \(counting only"):
        budget.check_uncut(plan, [("let.txt", 0, 50_000_000)])
