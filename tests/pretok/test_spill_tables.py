"""The spill path of pre-tokenization (``pretok.counting.Spill``) takes every kind of counting table:
a small run's ``array.array`` table (one byte range, ``_count_plain``) and numpy tables (many
ranges), at every threshold from "spill everything" to "spill nothing": the table is the one a run
without spilling counts, and a full disk in the spill folder names the file."""
import array
import errno
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bpe_core.pretok import counting
from bpe_core.pretok.counting import Spill, count_corpus
from strategies import corpus_bytes

SPECIALS = [b"<|endoftext|>"]
# 1 spills every table; 200 spills some folds; 1 << 30 spills nothing
THRESHOLDS = [1, 200, 4096, 1 << 30]


def _table(path, chunk_bytes, threshold, tmp_path, plain, report=None):
    t = count_corpus(str(path), SPECIALS, "gpt2", 1, chunk_bytes, spill_threshold_bytes=threshold,
                     spill_dir=str(tmp_path), report=report, plain=plain)
    return t.to_dict()


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 64], ids=["one-range", "many-ranges"])
@pytest.mark.parametrize("text", [b"low lower lowest<|endoftext|>newer wider " * 40, b"abcdefgh" * 500,
                                  b"a" * 3000], ids=["words", "no-whitespace", "one-byte"])
def test_spilled_table_is_the_table_in_ram(tmp_path, text, chunk_bytes, threshold):
    path = tmp_path / "c.txt"
    path.write_bytes(text)
    want = _table(path, chunk_bytes, None, tmp_path, plain=False)
    report = {"seconds": {}}
    got = _table(path, chunk_bytes, threshold, tmp_path, plain=True, report=report)
    assert got == want
    if threshold == 1:
        assert report["spilled_runs"] >= 1          # the path under test was taken
    if threshold == 1 << 30:
        assert report["spilled_runs"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["c.txt"]     # the spill folder is gone


@settings(max_examples=25, deadline=None)
@given(corpus_bytes.filter(bool), st.sampled_from([1, 64, 300]), st.sampled_from([16, 1 << 20]))
def test_spill_any_bytes_any_threshold(tmp_path_factory, data, threshold, chunk_bytes):
    tmp = tmp_path_factory.mktemp("spill")
    path = tmp / "c.txt"
    path.write_bytes(data)
    assert _table(path, chunk_bytes, threshold, tmp, plain=True) == _table(path, chunk_bytes, None, tmp, plain=False)


def test_offer_takes_array_array_tables(tmp_path):
    spill = Spill(1, str(tmp_path))
    table = (array.array("B", b"abc"), array.array("q", [0, 1, 3]), array.array("q", [2, 5]))
    assert spill.offer([table]) == []
    (arena, offsets, counts), = spill.runs()
    assert (bytes(arena), offsets.tolist(), counts.tolist()) == (b"abc", [0, 1, 3], [2, 5])
    spill.cleanup()


def test_full_spill_folder_names_the_file(tmp_path, monkeypatch):
    def full(path, arr):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(counting, "save_behind", full)
    spill = Spill(1, str(tmp_path))
    with pytest.raises(OSError) as info:
        spill.offer([(np.zeros(1, np.uint8), np.array([0, 1]), np.array([1]))])
    spill.cleanup()
    assert info.value.errno == errno.ENOSPC and str(tmp_path) in info.value.filename


def test_a_spill_folder_on_tmpfs_is_refused_when_the_run_spills(tmp_path):
    """Files on tmpfs are memory: spilling there would not keep the budget. One BudgetError line,
    only once the run spills (a run that never spills may use any folder)."""
    from bpe_core.errors import BudgetError
    from bpe_core.runtime.cgroup import mount_fstype

    shm = "/dev/shm"
    if not os.path.isdir(shm) or mount_fstype(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    folder = tempfile.mkdtemp(dir=shm, prefix="bpe_core-test-")
    try:
        path = tmp_path / "c.txt"
        path.write_bytes(b"low lower lowest newer wider " * 50)
        assert _table(path, 64, 1 << 30, folder, plain=True) == _table(path, 64, None, folder, plain=False)
        with pytest.raises(BudgetError, match=f"{folder}: the spill folder is on tmpfs"):
            _table(path, 64, 1, folder, plain=True)
        assert os.listdir(folder) == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@settings(max_examples=25, deadline=None)
@given(corpus_bytes.filter(bool), st.sampled_from([1, 200, None]))
def test_two_workers_fold_on_two_threads_as_one_worker(tmp_path_factory, data, threshold):
    """Two workers: folds of folded tables, the merges before a spill and the last merge run on two
    threads (``merge_counts(threads=2)``; every size split here); the table is one worker's."""
    from bpe_core.pretok._pretok import merge_counts as kernel_merge

    calls = []

    def split_all(tables, threads=1):
        calls.append(threads)
        return kernel_merge(tables, threads, par_min_words=0)
    tmp = tmp_path_factory.mktemp("fold")
    path = tmp / "c.txt"
    path.write_bytes(data * 20)
    want = count_corpus(str(path), SPECIALS, "gpt2", 1, 16).to_dict()
    orig = counting.merge_counts
    counting.merge_counts = split_all
    try:
        report = {"seconds": {}}
        got = count_corpus(str(path), SPECIALS, "gpt2", 2, 16, spill_threshold_bytes=threshold,
                           spill_dir=str(tmp), report=report).to_dict()
    finally:
        counting.merge_counts = orig
    assert got == want
    if report["n_chunks"] >= 2:           # two workers ran: the last merge at least was split
        assert 2 in calls
