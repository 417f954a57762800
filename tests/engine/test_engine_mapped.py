"""The merge engine with its read-only arrays in mapped files equals the engine in RAM and the reference.

``map_threshold=0`` forces every read-only array (word records, initial position lists) into files
under ``spill_dir``; a tiny ``fill_buffer_bytes`` forces the position lists to be written in many
passes. Results must not depend on either, on either side of the threshold.
"""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.engine import merge as trainer
from bpe_core.engine._engine import WORD_RECORD_BYTES, MergeEngine
from bpe_core.pretok.wordtable import WordTable
from bpe_core.runtime.memmon import tree_memory

BYTES = [bytes([i]) for i in range(256)]


def table_of(counts: dict) -> WordTable:
    return WordTable.from_counts(counts)


def merges_of(table: WordTable, n: int, **kw) -> list:
    eng = MergeEngine(table.arena, table.offsets, table.counts, BYTES, **kw)
    toks = eng.tokens()
    out = []
    for a, b, _ in eng.run(n):
        toks = eng.tokens()
        out.append((toks[a], toks[b]))
    return out


def reference_merges(counts: dict, n: int) -> list:
    _, merges = reference.train_on_counts(counts, 256 + n)
    return merges


words_strategy = st.dictionaries(st.binary(min_size=0, max_size=12), st.integers(1, 50), max_size=25)
repetitive = st.dictionaries(st.text(alphabet="ab ", min_size=1, max_size=40).map(str.encode),
                             st.integers(1, 9), max_size=8)


@settings(deadline=None, max_examples=60)
@given(words=st.one_of(words_strategy, repetitive), fill=st.sampled_from([4, 12, 64, 1 << 20]),
       heap_batch=st.sampled_from([1, 3, 65536]))
def test_mapped_engine_equals_ram_engine_and_reference(tmp_path_factory, words, fill, heap_batch):
    folder = tmp_path_factory.mktemp("spill")
    table = table_of(words)
    n = 40
    in_ram = merges_of(table, n, heap_batch=heap_batch)
    mapped = merges_of(table, n, heap_batch=heap_batch, spill_dir=folder, map_threshold=0,
                       fill_buffer_bytes=fill)
    assert mapped == in_ram == reference_merges(words, n)
    assert os.listdir(folder) == []          # files are unlinked once mapped


def test_threshold_on_either_side_gives_the_same_merges(tmp_path):
    rng = np.random.default_rng(7)
    words = {bytes(rng.integers(97, 103, size=rng.integers(1, 15)).tolist()): int(rng.integers(1, 30))
             for _ in range(400)}
    table = table_of(words)
    records = table.n_words * WORD_RECORD_BYTES
    expected = reference_merges(words, 120)
    for threshold in (0, records - 1, records, records + 1, 1 << 40):
        eng = MergeEngine(table.arena, table.offsets, table.counts, BYTES, spill_dir=tmp_path,
                          map_threshold=threshold, fill_buffer_bytes=256)
        toks_steps = eng.run(120)
        toks = eng.tokens()
        assert [(toks[a], toks[b]) for a, b, _ in toks_steps] == expected, threshold
        mem = eng.memory()
        if threshold <= records:
            assert mem["words_in_ram"] == 0 and mem["mapped"] >= records
        if threshold > 1 << 30:
            assert mem["mapped"] == 0
    eng = MergeEngine(table.arena, table.offsets, table.counts, BYTES, spill_dir=tmp_path, map_threshold=0,
                      fill_buffer_bytes=256)
    assert eng.stats()["fill_passes"] > 1


def test_long_units_step_by_step_against_a_recount(tmp_path):
    # SuperBPE-like: few, long words with runs, so merged tokens grow long (span lengths in cells)
    words = {b"ab" * 300 + b"aaaa" * 50: 3, b"a" * 513: 2, b"ba" * 200: 1, b"x": 4}
    table = table_of(words)
    eng = MergeEngine(table.arena, table.offsets, table.counts, BYTES, spill_dir=tmp_path, map_threshold=0,
                      fill_buffer_bytes=64)
    ref = {tuple(bytes([b]) for b in w): c for w, c in words.items()}
    for _ in range(30):
        pairs = reference.get_pair_counts(ref)
        toks = eng.tokens()
        got_pairs = {}
        for (a, b), c in eng.pair_counts_dict().items():
            got_pairs[(toks[a], toks[b])] = got_pairs.get((toks[a], toks[b]), 0) + c
        assert got_pairs == {p: c for p, c in pairs.items() if c > 0}
        best = reference.best_pair(pairs)
        step = eng.step()
        if best is None:
            assert step is None
            break
        toks = eng.tokens()
        assert (toks[step[0]], toks[step[1]]) == best
        new = {}
        for w, c in ref.items():
            m = reference.merge_word(w, best)
            new[m] = new.get(m, 0) + c
        ref = new
    syms, offs, counts = eng.words()
    toks = eng.tokens()
    got = {tuple(toks[s] for s in syms[offs[i]:offs[i + 1]]): int(counts[i]) for i in range(len(counts))}
    assert got == ref


def test_train_words_with_a_spill_dir_equals_in_ram(tmp_path):
    rng = np.random.default_rng(3)
    words = {bytes(rng.integers(32, 127, size=rng.integers(1, 9)).tolist()): int(rng.integers(1, 9))
             for _ in range(600)}
    table = table_of(words)
    vocab0, merges0 = trainer.train_words(table, 500)
    mapped = table.to_files(str(tmp_path), drop_singletons=True)
    vocab1, merges1 = trainer.train_words(mapped, 500, spill_dir=str(tmp_path), fill_buffer_bytes=64)
    assert merges1 == merges0 and vocab1 == vocab0


@pytest.mark.parametrize("which", ["words", "positions"])
def test_a_full_disk_at_the_mapped_build_names_the_folder(tmp_path, monkeypatch, which):
    """The mapped files are allocated at their full size before they are written in place: a full
    disk is an error there (the folder named, nothing left in it), not a crash at a page fault."""
    import errno

    real = getattr(os, "posix_fallocate", None)

    def full(fd, offset, length):
        if f"-engine-{which}-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, offset, length) if real is not None else os.ftruncate(fd, offset + length)

    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to tell the files apart")
    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    words = {b"ab" * (i % 5 + 1) + bytes([97 + i % 7]): i % 4 + 1 for i in range(50)}
    with pytest.raises(OSError) as info:
        trainer.train_words(table_of(words), 300, spill_dir=str(tmp_path))
    assert info.value.errno == errno.ENOSPC and str(tmp_path) in str(info.value.filename)
    assert os.listdir(tmp_path) == []


@settings(deadline=None, max_examples=40)
@given(words=words_strategy, drop=st.booleans(), step=st.sampled_from([1, 2, 7, 1 << 20]))
def test_word_table_to_files_keeps_the_table(tmp_path_factory, words, drop, step):
    table = table_of(words)
    mapped = table.to_files(str(tmp_path_factory.mktemp("t")), drop_singletons=drop, step=step)
    want = table.without_singletons() if drop else table
    assert mapped.mapped and mapped.to_dict() == want.to_dict()
    assert mapped.offsets.tolist() == want.offsets.tolist()


def test_tree_memory_splits_anonymous_and_file_pages(tmp_path):
    path = tmp_path / "pages.bin"
    path.write_bytes(b"\1" * (64 << 20))
    before = tree_memory()
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    assert int(mm[::4096].sum()) == (64 << 20) // 4096          # touch every page
    after = tree_memory()
    assert after["file"] - before["file"] >= 48 << 20
    assert after["anon"] - before["anon"] < 32 << 20
    del mm
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc: anon is the RSS")
