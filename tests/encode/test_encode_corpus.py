"""Whole-corpus encoding: identical ids for any worker count and chunk size, the .npy, the CLI."""
from __future__ import annotations

from paths import TOOLS
import importlib
import os
import random
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.formats.model import Model, dump_model
from bpe_core.pretok.patterns import resolve_pattern
from bpe_core.encode.tokenizer import Tokenizer
from encode_helpers import EOT, SETTINGS, fixture_text, small_model

# The module, not the function bpe_core re-exports under the same name.
ec = importlib.import_module("bpe_core.encode.encode_corpus")

sys.path.insert(0, str(TOOLS))
import encode_corpus as cli  # noqa: E402


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    vocab, merges, specials = small_model()
    d = tmp_path_factory.mktemp("tok")
    dump_model(Model(vocab=vocab, merges=merges, special_tokens=specials, pattern=resolve_pattern("gpt2")),
               d / "model.json")
    return d


def make_corpus(path, seed=0, n_docs=40):
    """Documents separated by the special token: prose, invalid UTF-8, a long line without spaces,
    whitespace runs at document edges."""
    rng = random.Random(seed)
    text = fixture_text("corpus.en").encode()
    docs = []
    for _ in range(n_docs):
        kind = rng.random()
        if kind < 0.6:
            a = rng.randrange(len(text) - 3000)
            docs.append(text[a: a + rng.randrange(1, 3000)])
        elif kind < 0.8:
            docs.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
        elif kind < 0.9:
            docs.append(b"x" * rng.randrange(1, 5000))
        else:
            docs.append(b"  \n\n " * rng.randrange(1, 50))
    data = b"\n" + EOT.encode() + b"\n"
    data = data.join(docs) + EOT.encode()
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("workers,chunk", [(1, 1000), (3, 1500), (2, 10**6)])
def test_any_workers_and_chunks_give_the_whole_text_ids(tmp_path, tok_dir, workers, chunk):
    data = make_corpus(tmp_path / "in.txt")
    tok = Tokenizer.load(tok_dir)
    res = ec.encode_corpus(tmp_path / "in.txt", tok_dir, tmp_path / "ids.npy", num_workers=workers,
                           chunk_bytes=chunk, verify=True, progress=False)
    ids = np.load(tmp_path / "ids.npy", mmap_mode="r")
    assert ids.dtype == np.uint16
    assert ids.tolist() == tok.encode(data)
    assert res.n_tokens == len(ids) and res.n_bytes == len(data) and res.verified_bytes > 0
    assert sorted(os.listdir(tmp_path)) == ["ids.npy", "in.txt"]        # no spill or temp left


@SETTINGS
@given(st.lists(st.sampled_from([b"hello world", b"\n", b"x\ny", b"  ", EOT.encode(), b"<|endof", b"\xe2\x82",
                                 b"\xac", "été".encode()]), max_size=60), st.integers(1, 40))
def test_chunked_encoding_is_exact(data_parts, chunk):
    tok = Tokenizer(*small_model()[:2], [EOT])
    import tempfile

    data = b"".join(data_parts)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "in.txt")
        with open(path, "wb") as f:
            f.write(data)
        ec.encode_corpus(path, tok, os.path.join(d, "ids.npy"), num_workers=1, chunk_bytes=chunk, progress=False)
        assert np.load(os.path.join(d, "ids.npy")).tolist() == tok.encode(data)


def test_iter_chunks_tile_the_file(tmp_path):
    data = make_corpus(tmp_path / "in.txt", seed=3)
    chunks = list(ec.iter_chunks(str(tmp_path / "in.txt"), 2000, [EOT.encode()], resolve_pattern("gpt2")))
    assert chunks[0][0] == 0 and chunks[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    assert len(chunks) > 5


def test_uint32_when_vocab_is_large(tmp_path):
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[70_000] = b"ab"
    tok = Tokenizer(vocab, [(b"a", b"b")])
    (tmp_path / "in.txt").write_bytes(b"abcab")
    ec.encode_corpus(tmp_path / "in.txt", tok, tmp_path / "ids.npy", num_workers=1, progress=False)
    ids = np.load(tmp_path / "ids.npy", mmap_mode="r")
    assert ids.dtype == np.uint32 and ids.tolist() == [70_000, 99, 70_000]


def test_empty_input(tmp_path, tok_dir):
    (tmp_path / "in.txt").write_bytes(b"")
    ec.encode_corpus(tmp_path / "in.txt", tok_dir, tmp_path / "ids.npy", num_workers=2, progress=False)
    assert np.load(tmp_path / "ids.npy").shape == (0,)


@pytest.mark.parametrize("workers", [1, 2])
def test_failure_leaves_nothing(tmp_path, tok_dir, monkeypatch, workers):
    make_corpus(tmp_path / "in.txt")
    calls = []

    def boom(self, task):
        calls.append(task)
        if len(calls) == 3:
            raise RuntimeError("worker died")
        return real(self, task)

    real = ec._ChunkEncoder.__call__
    monkeypatch.setattr(ec._ChunkEncoder, "__call__", boom)
    with pytest.raises(RuntimeError, match="worker died"):
        ec.encode_corpus(tmp_path / "in.txt", tok_dir, tmp_path / "ids.npy", num_workers=workers,
                         chunk_bytes=1000, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]


@pytest.fixture
def small_overheads(monkeypatch):
    """A parent of 50 MiB and workers of 40 MiB as the plan sees them, whatever pytest really uses.

    The run's measured peak still holds what pytest really uses (well over 50 MiB after a few
    modules), so a small budget the plan fits can be exceeded by what the plan was told to leave
    out: that ``BudgetWarning`` says nothing about the run, and is ignored in these tests only."""
    import warnings

    from bpe_core.errors import BudgetWarning
    from bpe_core.runtime import budget as scheduler

    monkeypatch.setattr(scheduler, "_current_rss", lambda: 50 * MiB)
    monkeypatch.setattr(scheduler, "measure_worker_overhead", lambda *a, **k: 40 * MiB)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=BudgetWarning)
        yield


MiB = 1 << 20


def test_plan_decides_workers_and_is_stored(tmp_path, tok_dir, small_overheads):
    """The scheduler's plan is what runs: a small budget gives one process, a large one a worker per
    core; the plan (budget included) is in the result."""
    make_corpus(tmp_path / "in.txt", seed=5)
    tok = Tokenizer.load(tok_dir)
    small = ec.encode_corpus(tmp_path / "in.txt", tok, tmp_path / "a.npy", num_workers=4, memory_limit=150 * MiB,
                             chunk_bytes=4000, progress=False)
    assert small.plan["kind"] == "encode" and small.plan["memory_limit"] == 150 * MiB
    assert small.num_workers == small.plan["num_workers"] == 1
    assert small.plan["peak_bytes"] <= 150 * MiB and small.plan["chunk_bytes"] == 4000
    cores = os.cpu_count() or 1
    big = ec.encode_corpus(tmp_path / "in.txt", tok, tmp_path / "b.npy", num_workers=4, memory_limit=4 << 30,
                           chunk_bytes=4000, progress=False)
    assert big.num_workers == big.plan["num_workers"] == min(4, cores)
    assert big.memory["peak_rss_bytes"] > 0 and set(big.phase_seconds) >= {"plan", "cut", "encode", "assemble",
                                                                          "write"}
    default = ec.plan(tmp_path / "in.txt", tok)
    from bpe_core.runtime.budget import default_memory_limit

    assert default.memory_limit <= default_memory_limit()
    with pytest.raises(ValueError, match="too small"):       # scheduler.BudgetError, before any work
        ec.encode_corpus(tmp_path / "in.txt", tok, tmp_path / "c.npy", memory_limit=60 * MiB, progress=False)
    assert not (tmp_path / "c.npy").exists()


def test_small_budget_gives_the_same_ids_as_no_budget(tmp_path, tok_dir, small_overheads):
    """Under a budget the plan allows two workers, but the real tree (pytest) is above the room for
    another chunk: chunks are held back one at a time, and the ids are those of an unlimited run."""
    make_corpus(tmp_path / "in.txt", seed=6)
    tok = Tokenizer.load(tok_dir)
    free = ec.encode_corpus(tmp_path / "in.txt", tok, tmp_path / "free.npy", num_workers=2, chunk_bytes=3000,
                            progress=False)
    budget = 260 * MiB             # 2 workers fit on paper (218 MiB + chunks) ...
    held = ec.encode_corpus(tmp_path / "in.txt", tok, tmp_path / "held.npy", num_workers=2, chunk_bytes=3000,
                            memory_limit=budget, progress=False)
    assert held.plan["num_workers"] == min(2, os.cpu_count() or 1)
    if held.num_workers == 2 and held.memory["peak_rss_bytes"] > budget - held.plan["per_worker_bytes"]:
        assert held.memory["held_back_chunks"] > 0    # ... but not in this test process
    assert np.array_equal(np.load(tmp_path / "held.npy"), np.load(tmp_path / "free.npy"))
    assert free.n_tokens == held.n_tokens == len(tok.encode((tmp_path / "in.txt").read_bytes()))


# ==== CLI ======================================================================================


def test_cli_writes_npy_and_summary(tmp_path, tok_dir, capsys):
    data = make_corpus(tmp_path / "in.txt", seed=1)
    rc = cli.main([str(tmp_path / "in.txt"), "--tokenizer", str(tok_dir), "--out", str(tmp_path / "ids.npy"),
                   "--workers", "2", "--memory-limit", "2G", "--chunk-size", "4k", "--verify", "--no-progress"])
    out = capsys.readouterr()
    assert rc == 0
    assert "tokens (uint16)" in out.out and "verified" in out.out
    assert np.load(tmp_path / "ids.npy", mmap_mode="r").tolist() == Tokenizer.load(tok_dir).encode(data)


@pytest.mark.parametrize("case", ["missing", "directory", "bad_tokenizer", "out_dir_missing", "out_is_dir",
                                  "bad_size"])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, tok_dir, capsys, case):
    make_corpus(tmp_path / "in.txt")
    (tmp_path / "sub").mkdir()
    inp, tokd, out = str(tmp_path / "in.txt"), str(tok_dir), str(tmp_path / "ids.npy")
    extra = []
    if case == "missing":
        inp = str(tmp_path / "nope.txt")
    elif case == "directory":
        inp = str(tmp_path / "sub")
    elif case == "bad_tokenizer":
        tokd = str(tmp_path / "sub")
    elif case == "out_dir_missing":
        out = str(tmp_path / "nodir" / "ids.npy")
    elif case == "out_is_dir":
        out = str(tmp_path / "sub")
    elif case == "bad_size":
        extra = ["--memory-limit", "lots"]
    rc = cli.main([inp, "--tokenizer", tokd, "--out", out, "--no-progress"] + extra)
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "sub"]
    assert os.listdir(tmp_path / "sub") == []


def test_cli_plan_prints_and_writes_nothing(tmp_path, tok_dir, capsys):
    make_corpus(tmp_path / "in.txt")
    rc = cli.main([str(tmp_path / "in.txt"), "--tokenizer", str(tok_dir), "--out", str(tmp_path / "ids.npy"),
                   "--memory-limit", "2G", "--plan"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("memory plan (encode ") and "budget 2.0 GiB" in out and "peak" in out
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]
    rc = cli.main([str(tmp_path / "in.txt"), "--tokenizer", str(tok_dir), "--out", str(tmp_path / "ids.npy"),
                   "--memory-limit", "1M", "--plan"])
    err = capsys.readouterr().err
    assert rc == 2 and "smallest budget that works" in err and len(err.strip().splitlines()) == 1


def test_cli_report_has_plan_and_peak(tmp_path, tok_dir, capsys):
    import json

    make_corpus(tmp_path / "in.txt", seed=2)
    rc = cli.main([str(tmp_path / "in.txt"), "--tokenizer", str(tok_dir), "--out", str(tmp_path / "ids.npy"),
                   "--workers", "1", "--report", str(tmp_path / "run.json"), "--no-progress"])
    assert rc == 0 and "peak RSS" in capsys.readouterr().out
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["plan"]["num_workers"] == 1 and report["memory"]["peak_rss_bytes"] > 0
    assert report["n_tokens"] == len(np.load(tmp_path / "ids.npy", mmap_mode="r"))


def test_kill_9_leaves_no_output_file(tmp_path):
    """``kill -9`` in the middle of a run: nothing at the ``--out`` path (the temp file and spill
    folder are hidden names beside it). A custom pattern (the ``regex`` path) and 4 KB chunks, one
    worker writing straight into the temp file; the run kills itself once that file holds 16 KB of
    ids (``robust_helpers.child_signal_while_writing``: a kill from outside raced the run's end)."""
    import signal

    from robust_helpers import NOT_REACHED
    from tool_runner import call_in_child

    vocab, merges, specials = small_model()
    d = tmp_path / "tok"
    d.mkdir()
    dump_model(Model(vocab=vocab, merges=merges, special_tokens=specials, pattern=r"\w+|\s+|[^\w\s]+"),
               d / "model.json")
    text = fixture_text("corpus.en").encode()
    data = (text + EOT.encode()) * max(1, (256 << 10) // (len(text) + len(EOT)))
    (tmp_path / "in.txt").write_bytes(data)
    out = tmp_path / "ids.npy"
    args = [tmp_path / "in.txt", "--tokenizer", d, "--out", out, "--workers", "1", "--chunk-size", "4k", "--no-progress"]
    r = call_in_child("robust_helpers", "child_signal_while_writing", str(TOOLS / "encode_corpus.py"),
                      [str(a) for a in args], 16 << 10, "SIGKILL", cwd=tmp_path)
    assert r.returncode != NOT_REACHED, "the run ended before its temp file held 16 KB of ids"
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not out.exists()
    left = [p.name for p in tmp_path.iterdir() if p.name not in ("in.txt", "tok")]
    assert left and all(n.startswith(".ids.npy.") for n in left), left      # the temp file is there, hidden


# ==== Start-up of a small run ==================================================================


def test_a_small_run_starts_no_monitor_thread_and_makes_a_spill_folder_only_to_spill(tmp_path, monkeypatch):
    """Up to ``SMALL_INPUT_BYTES`` the memory monitor runs without its sampling thread (still sampled
    at the start, before each chunk and at the end); above, with it. The spill folder is made when a
    chunk first spills, and removed at the end: a run that does not spill makes none. Same ids."""
    from bpe_core.runtime import memmon

    vocab, merges, specials = small_model()
    tok = Tokenizer(vocab, merges, specials)
    text = fixture_text("corpus.en").encode()
    path = tmp_path / "in.txt"
    path.write_bytes((text[:3000] + EOT.encode()) * 40)
    started, made = [], []
    from bpe_core.encode import corpus_workers
    real_start, real_mkdtemp = memmon.MemoryMonitor.start, corpus_workers.new_temp_dir
    monkeypatch.setattr(memmon.MemoryMonitor, "start",
                        lambda self, thread=True: started.append(thread) or real_start(self, thread))
    monkeypatch.setattr(corpus_workers, "new_temp_dir", lambda *a, **k: made.append(real_mkdtemp(*a, **k)) or made[-1])

    want = tok.encode(path.read_bytes())
    r = ec.encode_corpus(path, tok, tmp_path / "a.npy", num_workers=2, progress=False)
    assert r.memory["spilled_ids_bytes"] == 0
    assert started == [False] and made == [] and r.memory["n_samples"] >= 2
    assert np.load(tmp_path / "a.npy").tolist() == want

    monkeypatch.setattr(ec, "SMALL_INPUT_BYTES", 1000)
    monkeypatch.setattr(ec, "_hold_bytes", lambda c, n: 4)        # a chunk that waits spills at once
    r = ec.encode_corpus(path, tok, tmp_path / "b.npy", num_workers=2, chunk_bytes=4096, progress=False)
    assert started == [False, True] and r.memory["spilled_ids_bytes"] > 0
    assert len(made) == 1 and os.path.basename(made[0]).startswith(f".b.npy.spill-{os.getpid()}-")
    assert not os.path.exists(made[0]) and np.load(tmp_path / "b.npy").tolist() == want
    assert sorted(os.listdir(tmp_path)) == ["a.npy", "b.npy", "in.txt"]


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_the_small_input_threshold_changes_only_the_sampling_thread(tmp_path, monkeypatch, delta):
    """Around ``SMALL_INPUT_BYTES`` (the input one byte below, at, one byte above it) the run is
    the same: the same ids as the whole text's, and the sampling thread only above the threshold."""
    from bpe_core.runtime import memmon

    vocab, merges, specials = small_model()
    tok = Tokenizer(vocab, merges, specials)
    path = tmp_path / "in.txt"
    path.write_bytes((fixture_text("corpus.en").encode()[:2000] + EOT.encode()) * 7)
    size = os.path.getsize(path)
    started = []
    real_start = memmon.MemoryMonitor.start
    monkeypatch.setattr(memmon.MemoryMonitor, "start",
                        lambda self, thread=True: started.append(thread) or real_start(self, thread))
    monkeypatch.setattr(ec, "SMALL_INPUT_BYTES", size - delta)
    r = ec.encode_corpus(path, tok, tmp_path / "ids.npy", num_workers=2, chunk_bytes=4096, progress=False)
    assert started == [delta > 0]
    assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(path.read_bytes())
    assert r.n_bytes == size


def test_held_ids_use_the_whole_cutting_window_for_plain_files_only(tmp_path):
    """Plain files are cut before encoding: their waiting chunks share the plan's whole cutting
    window (``ENCODE_WINDOW_CHUNKS`` chunks); a compressed input is cut while it is encoded, so its
    chunks share one chunk of it."""
    import gzip

    from bpe_core.encode.corpus_plan import sources_of
    from bpe_core.runtime.budget import ENCODE_WINDOW_CHUNKS

    (tmp_path / "a.txt").write_bytes(b"x")
    with gzip.open(tmp_path / "b.txt.gz", "wb") as f:
        f.write(b"x")
    plain, packed = sources_of([str(tmp_path / "a.txt")]), sources_of([str(tmp_path / "b.txt.gz")])
    assert ENCODE_WINDOW_CHUNKS >= 2
    assert ec._hold_window(1 << 20, plain) == ENCODE_WINDOW_CHUNKS << 20
    assert ec._hold_window(1 << 20, packed) == ec._hold_window(1 << 20, plain + packed) == 1 << 20
    assert ec._hold_bytes(ec._hold_window(1 << 20, plain), 4) == (ENCODE_WINDOW_CHUNKS << 20) // 4
