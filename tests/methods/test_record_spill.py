"""The counting pass's record of every pretoken held in RAM or spilled to the spill folder
(``methods.record.PretokenRecord``), and a sampled stage 2 listed from it: the same units, merges
and figures as a second scan of the file, for SuperBPE and SupraTok."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core.formats import registry
from bpe_core.methods.record import PretokenRecord
from bpe_core.runtime import budget
from units_helpers import recorded_ids, spans_and_table

SPECIAL = "<|endoftext|>"
#: examples of the training tests: a few by default (each trains twice); BPE_CORE_MAX_EXAMPLES for more
TRAIN_EXAMPLES = int(os.environ.get("BPE_CORE_MAX_EXAMPLES", "10"))
PIECES = [b" the", b" cat", b" 12", b"\n", b"\n\n", b"  ", b",", b"x", SPECIAL.encode(), SPECIAL.encode() * 2,
          b" 0123456789", b"\xc3\xa9t\xc3\xa9", b" M'XX%,#'A=9&4@#0A", b"*!A9&4@&3!4", b" dog", b".", b" sat",
          b"\xff", b" " + b"y" * 40]


# ==== PretokenRecord ==============================================================================


def _chunk(rng: np.random.Generator, n_words: int, n_ids: int) -> tuple:
    lengths = rng.integers(1, 9, n_words)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    arena = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    ids = rng.integers(0, max(n_words, 1), n_ids).astype(np.uint32) if n_words else np.zeros(0, np.uint32)
    return arena, offsets, ids, np.array([[0, n_ids]], np.int64), n_ids


@pytest.mark.parametrize("ram", [0, 3000, 10 ** 9])
def test_a_spilled_record_reads_back_as_it_was_written(tmp_path, ram):
    """Chunks held in RAM or written to the file (empty ones too, odd sizes for the alignment): read
    back equal, in order; the ids writable in place (the rows are written over them); the file goes
    with ``clear``."""
    rng = np.random.default_rng(3)
    chunks = [_chunk(rng, w, n) for w, n in [(5, 17), (0, 0), (300, 1001), (1, 3), (77, 0), (40, 999)]]
    rec = PretokenRecord(ram, str(tmp_path))
    for c in chunks:
        rec.append(tuple(a.copy() if isinstance(a, np.ndarray) else a for a in c))
    assert len(rec) == len(chunks) and bool(rec)
    assert (rec.spilled_chunks == 0) == (ram >= 10 ** 9)
    for got, want in zip(rec, chunks):
        for g, w in zip(got[:4], want[:4]):
            assert g.dtype == w.dtype and np.array_equal(g, w)
        assert got[4] == want[4]
    ids = rec[2][2]
    ids[:] = ids[::-1]                        # in place, as record_table_rows writes the rows
    assert rec[2][2].tolist() == chunks[2][2][::-1].tolist()
    rec.clear()
    assert len(rec) == 0 and not rec and rec._file is None


# ==== a sampled stage 2 from the record ==========================================================


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=60).map(b"".join), st.booleans(), st.booleans(),
       st.sampled_from([0.0, 0.3, 0.7, 1.0]))
@example(b"*!A9&4@&3!4" * 5 + b" 12\n\n the cat 0123" + b"M;5%&4!" * 8 + b"\n  x<|endoftext|>" + b"*!A9&4@&3!4" * 4,
         True, True, 0.5)
def test_id_unit_stream_samples_as_the_scan(text, cut_spaces, regions, fraction):
    """``id_unit_stream(keep_below=)`` keeps the units ``chunk_unit_stream(keep_below=)`` keeps
    scanning the bytes: marked, flagged, narrow, with a segmentation or without."""
    from bpe_core.engine.units import WordIndex, chunk_unit_stream, id_unit_stream
    from bpe_core.methods.superbpe import word_classes, word_flags
    from bpe_core.pretok.pretokenize import PATTERN_IDS

    spans, pieces, table = spans_and_table(text)
    ids, breaks = recorded_ids(pieces, table)
    flags = word_flags(table)
    classes = word_classes(table) if regions else None
    keep = int(fraction * 2 ** 64) if fraction < 1 else 0xFFFFFFFFFFFFFFFF
    seg = (np.arange(2 * table.n_words, dtype=np.uint32) % 1000, np.arange(0, 2 * table.n_words + 1, 2))
    index = WordIndex(table.arena, table.offsets)
    for s in ((), seg):
        want = chunk_unit_stream(text, spans, PATTERN_IDS["gpt2"], index, flags, keep, cut_spaces, classes, *s)
        got = id_unit_stream([ids[:3], ids[3:]], breaks, flags, cut_spaces, classes, *s, keep_below=keep)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
        assert got[2:4] == want[2:4]
    want = chunk_unit_stream(text, spans, PATTERN_IDS["gpt2"], index, flags, keep, cut_spaces, classes, *seg,
                             narrow=True)
    got = id_unit_stream(ids, breaks, flags, cut_spaces, classes, *seg, marks=False, narrow=True, keep_below=keep)
    assert got[0].dtype == want[0].dtype == np.uint16
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    assert got[2:4] == want[2:4] and got[4].tolist() == want[5].tolist()


def test_a_chunk_spilled_after_a_read_reads_back(tmp_path):
    """Reading a spilled chunk maps the file; a chunk written after that is read from a new mapping
    (the old one ends where the file ended then), and the views read before stay as they were."""
    rng = np.random.default_rng(5)
    rec = PretokenRecord(ram_bytes=0, folder=str(tmp_path))
    chunks = [_chunk(rng, 20, 50), _chunk(rng, 30, 80), _chunk(rng, 5, 9)]
    seen = []
    for chunk in chunks:
        rec.append(chunk)
        seen.append(rec[len(rec) - 1])
    for chunk, got, again in zip(chunks, seen, rec):
        for want, a, b in zip(chunk[:3], got[:3], again[:3]):
            assert np.asarray(want).tolist() == a.tolist() == b.tolist()
    rec.clear()


# ==== training from a spilled record =============================================================


def _train_both(monkeypatch, method: str, path, **options):
    """Train ``method`` with its record (as the share allows: in RAM or spilled) and by a second scan."""
    out = {}
    cls = type(registry.get(method))
    for records in (True, False):
        monkeypatch.setattr(cls, "records_pretokens", records)
        out[records] = bpe_core.train(bpe_core.TrainConfig(input_path=str(path), method=method, **options))
    return out[True], out[False]


def _texts():
    return st.lists(st.sampled_from(PIECES), min_size=1, max_size=300).map(b"".join)


@settings(max_examples=TRAIN_EXAMPLES, deadline=None)
@given(_texts(), st.sampled_from([64, 97, 700, 4096]), st.sampled_from([1, 2]), st.sampled_from([0, 2000, None]),
       st.booleans())
def test_superbpe_from_a_spilled_record_equals_a_scan(tmp_path_factory, text, chunk, workers, ram, sampled):
    """SuperBPE's stage 2 from the record, spilled (all of it, part of it) or not, with a sampled
    stage 2 or the whole text: the second scan's merges, final token count and units."""
    import _pytest.monkeypatch

    from bpe_core.methods import superbpe
    path = tmp_path_factory.mktemp("rec") / "c.txt"
    path.write_bytes(text * 3)
    mp = _pytest.monkeypatch.MonkeyPatch()
    try:
        if ram is not None:
            mp.setattr(budget, "record_ram_bytes", lambda limit: ram)
        if sampled:         # a sample from about ten stage-1 tokens on
            for module in (superbpe.train, superbpe.stage2):
                mp.setattr(module, "STAGE2_BYTES_PER_SYMBOL", 10 ** 8)
        # the two runs get one stage-2 share: it counts this process's measured memory (rounded to
        # 64 MiB), which grows over a long test run, and a step between the runs drew two samples
        share = superbpe.train.stage2_budget_share
        mp.setattr(superbpe.train, "stage2_budget_share", lambda limit, _held, table: share(limit, 256 << 20, table))
        rec, scan = _train_both(mp, "superbpe", path, vocab_size=300, special_tokens=[SPECIAL], chunk_bytes=chunk,
                                num_workers=workers, memory_limit=1 << 30,
                                spill_dir=str(tmp_path_factory.mktemp("spill")))
    finally:
        mp.undo()
    assert rec.report["stage2_units_source"] == "record" and scan.report["stage2_units_source"] == "scan"
    assert rec.model.merges == scan.model.merges
    for key in ("final_tokens", "stage2_units_seen", "stage2_units_kept", "stage2_sample_fraction"):
        assert rec.report["superbpe"][key] == scan.report["superbpe"][key]
    if sampled and rec.report["superbpe"]["stage1_tokens"] > 20:
        assert rec.report["superbpe"]["stage2_sample_fraction"] < 1
    if ram == 0:
        assert rec.report["record"]["spilled_chunks"] == rec.report["record"]["chunks"] > 0


def test_superbpe_spilled_on_the_fixture(fixtures_dir, tmp_path, monkeypatch):
    """The fixture corpus, its record spilled past the first chunks and stage 2 sampled: the scan's
    merges and figures on one and two workers."""
    from bpe_core.methods import superbpe
    monkeypatch.setattr(budget, "record_ram_bytes", lambda limit: 60_000)
    for module in (superbpe.train, superbpe.stage2):
        monkeypatch.setattr(module, "STAGE2_BYTES_PER_SYMBOL", 10 ** 6)
    for workers in (1, 2):
        rec, scan = _train_both(monkeypatch, "superbpe", fixtures_dir / "corpus.en", vocab_size=600,
                                chunk_bytes=20000, num_workers=workers, memory_limit=1 << 30,
                                spill_dir=str(tmp_path))
        assert 0 < rec.report["record"]["spilled_chunks"] < rec.report["record"]["chunks"]
        assert rec.report["stage2_units_source"] == "record"
        assert rec.report["superbpe"]["stage2_sample_fraction"] < 1
        assert rec.model.merges == scan.model.merges
        assert rec.report["superbpe"]["final_tokens"] == scan.report["superbpe"]["final_tokens"]
    assert list(tmp_path.iterdir()) == []         # the record's file has no name, and is gone


@settings(max_examples=max(TRAIN_EXAMPLES * 3 // 5, 1), deadline=None)
@given(_texts(), st.sampled_from([64, 700, 4096]), st.sampled_from([1, 2]), st.sampled_from([0, 2000]))
def test_supratok_from_a_spilled_record_equals_a_scan(tmp_path_factory, text, chunk, workers, ram):
    """SupraTok's documents from a spilled record: the second scan's merges and documents."""
    import _pytest.monkeypatch
    path = tmp_path_factory.mktemp("rec") / "c.txt"
    path.write_bytes(text * 3)
    mp = _pytest.monkeypatch.MonkeyPatch()
    try:
        mp.setattr(budget, "record_ram_bytes", lambda limit: ram)
        rec, scan = _train_both(mp, "supratok", path, vocab_size=300, special_tokens=[SPECIAL], chunk_bytes=chunk,
                                num_workers=workers, spill_dir=str(tmp_path_factory.mktemp("spill")))
    finally:
        mp.undo()
    assert rec.report["supratok"]["documents_source"] == "record"
    assert scan.report["supratok"]["documents_source"] == "scan"
    assert rec.model.merges == scan.model.merges
    if ram == 0:
        assert rec.report["record"]["spilled_chunks"] == rec.report["record"]["chunks"] > 0


def test_the_record_is_not_the_process_overhead(tmp_path, monkeypatch):
    """The plan made after counting measures the process beside the table, less the record's bytes
    in RAM (the record lives in the eighth of the budget the plan leaves free): with a record or
    without, the merge phase plans from the same overhead (a 1 GB run under --memory-limit 3G had
    planned a smaller stage-2 sample with its record in RAM)."""
    from bpe_core import training
    from bpe_core.runtime.budget import Plan

    path = tmp_path / "c.txt"
    path.write_bytes(b" the cat sat, 12 dogs.\n\n M'XX%,#'A=9&4@#0A<|endoftext|> the dog sat" * 80)
    seen = []
    with_count = Plan.with_count
    monkeypatch.setattr(Plan, "with_count", lambda self, *a, **k: seen.append(k["parent_overhead"]) or
                        with_count(self, *a, **k))
    held = 300 << 20
    monkeypatch.setattr(training, "_held_beside", lambda table: held)
    rec, scan = _train_both(monkeypatch, "superbpe", path, vocab_size=320, special_tokens=[SPECIAL],
                            chunk_bytes=900)
    ram = rec.report["record"]["ram_bytes"]
    assert ram > 0 and "record" not in scan.report
    assert seen == [held - ram, held]


def test_no_record_spilled_to_a_memory_folder(tmp_path, monkeypatch):
    """A spill folder on tmpfs holds memory, not disk: the record is dropped at the first chunk it
    would spill (the method scans the file again), with the same merges."""
    from bpe_core.runtime import cgroup

    path = tmp_path / "c.txt"
    path.write_bytes(b" the cat sat, 12 dogs.\n\n M'XX%,#'A=9&4@#0A<|endoftext|> the dog sat" * 80)
    monkeypatch.setattr(budget, "record_ram_bytes", lambda limit: 3000)
    monkeypatch.setattr(cgroup, "in_memory_folder", lambda folder: True)
    rec, scan = _train_both(monkeypatch, "superbpe", path, vocab_size=320, special_tokens=[SPECIAL],
                            chunk_bytes=900)
    assert rec.report["stage2_units_source"] == "scan" and rec.report["record"]["chunks"] == 0
    assert rec.model.merges == scan.model.merges


def test_a_full_spill_folder_names_the_folder(tmp_path, monkeypatch):
    """ENOSPC while the record spills: one error naming the spill folder (the tools print it as
    one line), not a bare reason."""
    import tempfile as tf

    class Full:
        def write(self, b):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(tf, "TemporaryFile", lambda **k: Full())
    rec = PretokenRecord(0, str(tmp_path))
    with pytest.raises(OSError, match=str(tmp_path)):
        rec.append(_chunk(np.random.default_rng(0), 3, 5))
