"""Training under a RAM budget: the sampled peak RSS of the process tree stays under it, the merges
do not change, and a killed run leaves no half-written output."""
from paths import REPO
import os
import random
import signal
import time
import pathlib

import pytest

import bpe_core
from bpe_core.runtime.budget import BudgetError

ROOT = REPO
TRAIN = ROOT / "tools" / "train_bpe.py"


def write_corpus(path, n_bytes, seed=0):
    """Documents of pseudo-words separated by <|endoftext|>: a 4 MiB block written repeatedly."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    words = ["".join(rng.choice(letters[: rng.randint(6, 26)]) for _ in range(rng.randint(1, 9)))
             for _ in range(20000)]
    parts, size = [], 0
    while size < 4 << 20:
        doc = " ".join(rng.choice(words) for _ in range(rng.randint(20, 400)))
        doc += rng.choice([".\n", "!\n\n", " 1234.\n"]) + "<|endoftext|>"
        parts.append(doc)
        size += len(doc)
    block = "".join(parts).encode()
    with open(path, "wb") as f:
        written = 0
        while written < n_bytes:
            f.write(block)
            written += len(block)
    return path


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    # 240 MiB: three times the room below, with the same plan as at 600 MiB (two workers, chunks
    # of a few MB, no spill, a merge phase estimated over the budget); a fraction of the I/O
    return write_corpus(tmp_path_factory.mktemp("budget") / "big.txt", 240 << 20)


def test_small_budget_holds_and_merges_do_not_change(big_corpus, tmp_path):
    # The budget covers this process, whose size depends on what the test session imported (dask,
    # pyarrow, transformers...): 80 MiB of room above it (the corpus is three times that).
    import psutil

    room = 80 << 20
    budget = psutil.Process().memory_info().rss + room
    limited = bpe_core.train(bpe_core.TrainConfig(big_corpus, 1000, memory_limit=budget, num_workers=2))
    peak = limited.report["memory"]["peak_rss_bytes"]
    assert 0 < peak < budget, f"peak RSS {peak >> 20} MiB over the {budget >> 20} MiB budget"
    plan = limited.report["plan"]
    assert plan["memory_limit"] == budget and plan["num_workers"] == 2
    assert plan["chunk_bytes"] * 3 < room < os.path.getsize(big_corpus) // 2     # chunked, well inside the room
    unlimited = bpe_core.train(bpe_core.TrainConfig(big_corpus, 1000, num_workers=2, chunk_bytes=64 << 20))
    assert limited.merges == unlimited.merges and limited.vocab == unlimited.vocab


def test_budget_too_small_says_so_up_front(big_corpus):
    with pytest.raises(BudgetError, match="--memory-limit"):
        bpe_core.train(bpe_core.TrainConfig(big_corpus, 1000, memory_limit=20 << 20))


def test_spilled_runs_give_the_same_table(tmp_path):
    from bpe_core.training import count_corpus
    path = write_corpus(tmp_path / "c.txt", 2 << 20, seed=3)
    specials = [b"<|endoftext|>"]
    whole = count_corpus(str(path), specials, "gpt2", 1, 64 << 10)
    report = {"seconds": {}}
    spilled = count_corpus(str(path), specials, "gpt2", 2, 64 << 10, spill_threshold_bytes=1 << 10,
                           report=report, spill_dir=str(tmp_path))
    assert report["spilled_runs"] > 1
    assert spilled.to_dict() == whole.to_dict()
    assert [p for p in os.listdir(tmp_path) if p.startswith("bpe_core-spill-")] == []


def test_min_pretoken_count_prunes_and_says_it_changes_results(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"aa aa aa bb cc dd " * 3 + b"zq")
    full = bpe_core.train(bpe_core.TrainConfig(path, 300, special_tokens=(), num_workers=1))
    pruned = bpe_core.train(bpe_core.TrainConfig(path, 300, special_tokens=(), num_workers=1, min_pretoken_count=2))
    assert pruned.report["unique_pretokens_kept"] < pruned.report["unique_pretokens"]
    assert (b"z", b"q") in full.merges and (b"z", b"q") not in pruned.merges


@pytest.fixture(scope="module")
def kill_corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("kill") / "c.txt", 4 << 20, seed=1)


@pytest.mark.parametrize("kill_at", ["pretokenize", "merge loop", "publish"])
def test_kill_9_leaves_no_half_written_file(tmp_path, kill_corpus, kill_at):
    """SIGKILL as the run enters a phase, or just before it puts its output folder in place: no
    target path holds a partial file. The run kills itself at that point
    (``robust_helpers.child_signal_at_phase``): a kill sent from outside once the phase showed in the
    phase file raced the run's end (a 3000-merge loop ends in a blink), and "write" was no phase at
    all (the test then waited for the run's end and killed nothing)."""
    from robust_helpers import NOT_REACHED
    from tool_runner import call_in_child

    out = tmp_path / "out"
    r = call_in_child("robust_helpers", "child_signal_at_phase", str(TRAIN),
                      [str(kill_corpus), "--vocab-size", "3000", "--out", str(out), "--no-progress", "--workers", "2"],
                      kill_at, "SIGKILL", cwd=tmp_path)
    assert r.returncode != NOT_REACHED, f"the run ended without reaching {kill_at!r}"
    assert r.returncode == -signal.SIGKILL, r.stderr
    # nothing at the target: the folder is written beside it and put in place in one rename
    assert not out.exists() or os.listdir(out) == [], os.listdir(out)


def test_a_later_run_removes_what_a_killed_writer_left(tmp_path):
    from bpe_core.runtime.atomic import remove_stale
    target = tmp_path / "model.json"
    stale = tmp_path / ".model.json.tmp-dead"
    live = tmp_path / ".model.json.tmp-live"
    other = tmp_path / ".other.json.tmp-dead"
    for p in (stale, live, other):
        p.write_text("partial")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    assert remove_stale(target) == [str(stale)]
    assert live.exists() and other.exists() and not stale.exists()
