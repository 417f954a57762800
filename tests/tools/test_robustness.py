"""Exact or refuse, never hang: signals, an input that changes under a run, scripts without a main
guard, absurd worker counts, a worker that raises.

Every test has a deadline; a run that hangs fails the test instead of hanging the suite. The tools
run as subprocesses (``sys.executable tools/...``) with TMPDIR pointed at a folder of the test, so
temp and spill files left behind are visible.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

import bpe_core
from bpe_core.encode import encode_corpus as encode_mod
from bpe_core.pretok import counting

from robust_helpers import (ENCODE, NOT_REACHED, ROOT, SPECIAL, TRAIN, env_with_tmpdir, leftovers, read_outputs,
                            stderr_lines, tool, write_diverse)
from tool_runner import call_in_child

DEADLINE = 20.0          # seconds a run may take to end after a signal or a change (a loaded 2-core box)
MiB = 1 << 20


@pytest.fixture(scope="session")
def big_corpus(tmp_path_factory):
    """40 MB with ~550 k unique pretokens: training at 4000 and encoding take a few seconds."""
    return write_diverse(tmp_path_factory.mktemp("big") / "big.txt", 40 * MiB, seed=7)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    src = write_diverse(folder / "train.txt", 1 * MiB, seed=8)
    r = tool(TRAIN, src, "--vocab-size", 1000, "--out", folder / "tok", "--no-progress")
    assert r.returncode == 0, r.stderr
    return folder / "tok"


def _command(kind, corpus, out, tokenizer_dir):
    if kind == "train":
        return [sys.executable, str(TRAIN), str(corpus), "--vocab-size", "4000", "--out", str(out),
                "--workers", "2", "--no-progress"]
    return [sys.executable, str(ENCODE), str(corpus), "--tokenizer", str(tokenizer_dir), "--out",
            str(out / "ids.npy"), "--workers", "2", "--no-progress"]


def _finish(proc, deadline=DEADLINE):
    """Wait for the process at most ``deadline`` seconds (kill it and fail if it hangs)."""
    try:
        out, err = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running {deadline} s after the event; stderr: {err[-2000:]}")
    return proc.returncode, out, err


def _descendants(pid):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _assert_no_children(before):
    for child in before:                      # whatever the tool started is gone with it
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, f"left running: {child}"
    assert psutil.Process().children(recursive=True) == []


def _assert_clean(out, tmpdir, finished):
    assert leftovers(out) == [], f"left in the output folder: {leftovers(out)}"
    assert os.listdir(tmpdir) == [], f"left in TMPDIR: {os.listdir(tmpdir)}"
    if not finished:
        names = set(os.listdir(out))
        assert not names & {"train_report.json", "ids.npy"}, f"an interrupted run finished writing: {names}"


# ==== Signals ================================================================================

_rng = random.Random(10)
SIGNAL_CASES = [(kind, sig, delay) for kind in ("train", "encode") for sig in ("SIGINT", "SIGTERM")
                for delay in (0.2, round(_rng.uniform(0.4, 2.5), 2), 3.0)]


@pytest.mark.parametrize("kind,sig,delay", SIGNAL_CASES)
def test_a_signal_at_any_moment_ends_the_run_cleanly(big_corpus, tokenizer_dir, tmp_path, kind, sig, delay):
    out, tmpdir = tmp_path / "out", tmp_path / "tmp"
    out.mkdir(), tmpdir.mkdir()
    proc = subprocess.Popen(_command(kind, big_corpus, out, tokenizer_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env_with_tmpdir(tmpdir))
    time.sleep(delay)
    children = _descendants(proc.pid)
    proc.send_signal(getattr(signal, sig))
    rc, stdout, stderr = _finish(proc)
    expected = {"SIGINT": 130, "SIGTERM": 143}[sig]
    # (a SIGINT while the interpreter itself starts, before it runs a line of the script, ends it
    # with exit 1 and the bare line "KeyboardInterrupt", or Python's "Fatal Python error:
    # init_import_site" while it imports site, or -- while it compiles the script -- Python's
    # traceback whose one frame is the script at "line 0": no line of the tool ran; seen on a loaded
    # machine. From the tool's first line on, bpe_core/cli/_start.py has it: one line, 130;
    # test_early_signals.py sends it at exact moments.)
    line_0 = f'File "{_command(kind, big_corpus, out, tokenizer_dir)[1]}", line 0, in <module>'
    startup_interrupt = sig == "SIGINT" and (
        (rc == 1 and (stderr.strip() == "KeyboardInterrupt"
                      or stderr.startswith("Fatal Python error: init_import_site")))
        or (rc == -signal.SIGINT and stderr_lines(stderr) == ["Traceback (most recent call last):", "  " + line_0,
                                                               "KeyboardInterrupt"]))
    if (rc == -getattr(signal, sig) and not stderr.strip()) or startup_interrupt:
        # Killed by the default action: before the interpreter reached the tool's first line (its
        # start-up can take longer than ``delay`` on a loaded machine: nothing ran, nothing is left),
        # or after the run had written everything, while the interpreter shut down (it gives the
        # signals back to the default action then): every output complete, nothing else left.
        done = {"train": {"vocab.json", "merges.txt", "model.json", "train_report.json"},
                "encode": {"ids.npy"}}[kind]
        finished = done <= set(os.listdir(out))
        _assert_clean(out, tmpdir, finished=finished)
        if finished:                          # and whole: they load
            if kind == "train":
                json.loads((out / "model.json").read_text()), json.loads((out / "train_report.json").read_text())
            else:
                assert np.load(out / "ids.npy").size > 0
        return
    assert rc in (expected, 0), f"exit {rc} after {sig} at {delay} s; stderr: {stderr[-3000:]}"
    assert "Traceback" not in stderr and len(stderr_lines(stderr)) <= 1, stderr
    if rc != 0:
        assert len(stderr_lines(stderr)) == 1, "an interrupted run says so in one line"
    done = {"train": {"vocab.json", "merges.txt", "model.json", "train_report.json"}, "encode": {"ids.npy"}}[kind]
    # A signal that lands after the output's one-step publish but before the tool returns (seen once
    # under load at 3.0 s) still exits with its code: the output is then whole, never a part of it.
    finished = rc == 0 or done <= set(os.listdir(out))
    _assert_clean(out, tmpdir, finished=finished)
    if finished:
        if kind == "train":
            json.loads((out / "model.json").read_text()), json.loads((out / "train_report.json").read_text())
        else:
            assert np.load(out / "ids.npy").size > 0
    _assert_no_children(children)


# ==== The input changes under the run ========================================================


@pytest.mark.parametrize("change", ["truncate", "rewrite"])
@pytest.mark.parametrize("kind", ["train", "encode"])
def test_an_input_that_changes_is_refused(big_corpus, tokenizer_dir, tmp_path, kind, change):
    """The input changes while the run reads it (training: as pre-tokenization starts; encoding: as
    the first ids are written): one line naming it, exit 2, nothing written. The run changes its
    input itself at that point (``robust_helpers.child_change_input``); changed from outside once the
    run had read 12 MiB, it could end first on a loaded machine."""
    corpus = tmp_path / "in" / "corpus.txt"
    corpus.parent.mkdir()
    shutil.copyfile(big_corpus, corpus)
    out, tmpdir = tmp_path / "out", tmp_path / "tmp"
    out.mkdir(), tmpdir.mkdir()
    command = _command(kind, corpus, out, tokenizer_dir)
    r = call_in_child("robust_helpers", "child_change_input", command[1], command[2:], str(corpus), change,
                      "pretokenize" if kind == "train" else "write", env=env_with_tmpdir(tmpdir), cwd=tmp_path,
                      timeout=120)
    rc, stderr = r.returncode, r.stderr
    lines = stderr_lines(stderr)
    assert rc != NOT_REACHED, "the run ended before the input could change"
    assert rc == 2, f"exit {rc}; stderr: {stderr[-3000:]}"
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert str(corpus) in lines[0] and "changed" in lines[0], lines[0]
    assert os.listdir(out) == [], f"written although the input changed: {os.listdir(out)}"
    assert os.listdir(tmpdir) == []
    assert psutil.Process().children(recursive=True) == []


# ==== Scripts without a main guard, and ``python -`` =========================================

SCRIPT = '''
import numpy as np
import bpe_core

print("TOP-LEVEL-RAN")
CORPUS, OUT = {corpus!r}, {out!r}
vocab, merges = bpe_core.train_bpe(CORPUS, vocab_size=400, special_tokens=["<|endoftext|>"],
                                   pattern="gpt2", num_workers=2, chunk_bytes=64 << 10)
result = bpe_core.train(bpe_core.TrainConfig(CORPUS, 400, memory_limit="1G", num_workers=2))
assert result.merges == merges and result.vocab == vocab
tok = bpe_core.Tokenizer(vocab, merges, ["<|endoftext|>"])
r = bpe_core.encode_corpus(CORPUS, tok, OUT, num_workers=2, chunk_bytes=64 << 10, progress=False)
ids = np.load(OUT)
text = open(CORPUS, "rb").read()
assert tok.decode_bytes(ids) == text
docs = text.decode().split("<|endoftext|>")[:20]
assert tok.encode_batch(docs) == [tok.encode(d) for d in docs]
print("RESULT", len(merges), len(ids), r.num_workers)
'''


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_the_readme_api_runs_from_a_plain_script(tmp_path, how):
    corpus = write_diverse(tmp_path / "c.txt", 600 << 10, seed=3)
    code = SCRIPT.format(corpus=str(corpus), out=str(tmp_path / "ids.npy"))
    env = env_with_tmpdir(tmp_path)
    if how == "file":
        (tmp_path / "script.py").write_text(code)
        args, stdin = [sys.executable, str(tmp_path / "script.py")], None
    else:
        args, stdin = [sys.executable, "-"], code
    r = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("TOP-LEVEL-RAN") == 1, r.stdout
    result = [line for line in r.stdout.splitlines() if line.startswith("RESULT")]
    assert len(result) == 1 and result[0].split()[1] == "143", r.stdout
    assert int(result[0].split()[3]) == min(2, os.cpu_count() or 1), "encode_corpus did not use two workers"
    assert "Traceback" not in r.stderr


# ==== Absurd worker counts, tight budgets ====================================================


def test_a_thousand_workers_are_capped_and_give_the_same_merges(tmp_path):
    corpus = write_diverse(tmp_path / "c.txt", 5 * MiB, seed=4)
    r0 = tool(TRAIN, corpus, "--vocab-size", 600, "--out", tmp_path / "default", "--no-progress", timeout=120)
    assert r0.returncode == 0, r0.stderr
    r = tool(TRAIN, corpus, "--vocab-size", 600, "--out", tmp_path / "many", "--no-progress", "--workers", 1000,
             "--chunk-bytes", "64K", "--memory-limit", "1G", timeout=120)
    assert r.returncode == 0, r.stderr
    merges0, model0, _ = read_outputs(tmp_path / "default")
    merges, model, report = read_outputs(tmp_path / "many")
    assert merges == merges0 and model == model0
    assert report["num_workers"] <= os.cpu_count()
    assert any("1000 workers asked for" in note for note in report["plan"]["notes"]), report["plan"]["notes"]


def test_a_tight_budget_on_a_larger_corpus_finishes_or_refuses(tmp_path):
    corpus = write_diverse(tmp_path / "c.txt", 20 * MiB, seed=5)
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = tool(TRAIN, corpus, "--vocab-size", 2000, "--out", out, "--no-progress", "--memory-limit", "120M",
             env=env_with_tmpdir(tmp_path), timeout=120)
    assert time.monotonic() - t0 < 120
    assert r.returncode in (0, 2), r.stderr
    if r.returncode == 2:
        lines = stderr_lines(r.stderr)
        assert len(lines) == 1 and "--memory-limit" in lines[0], r.stderr
        assert not out.exists() or os.listdir(out) == []
    else:
        assert json.loads((out / "train_report.json").read_text())["merges"] == 2000 - 257
    assert leftovers(tmp_path) == []


# ==== A worker that raises ===================================================================


class Boom(RuntimeError):
    pass


def _raise_on_third(fn):
    calls = {"n": 0}
    lock = threading.Lock()

    def wrapper(*args, **kwargs):
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n == 3:
            raise Boom("chunk 3")
        return fn(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_count_worker_stops_training(tmp_path, monkeypatch, workers):
    corpus = write_diverse(tmp_path / "c.txt", 256 << 10, seed=6)
    count_chunk = counting._count_chunk
    monkeypatch.setattr(counting, "_count_chunk", _raise_on_third(count_chunk))
    spill = tmp_path / "spill"
    spill.mkdir()
    threads = threading.active_count()
    t0 = time.monotonic()
    with pytest.raises(Boom):
        bpe_core.train(bpe_core.TrainConfig(str(corpus), 400, num_workers=workers, chunk_bytes=16 << 10,
                                            spill_dir=str(spill)))
    monkeypatch.setattr(counting, "_count_chunk", _raise_on_third(count_chunk))
    with pytest.raises(Boom):      # and with the table spilling
        counting.count_corpus(str(corpus), [SPECIAL], "gpt2", workers, 16 << 10, spill_threshold_bytes=1,
                             spill_dir=str(spill))
    assert time.monotonic() - t0 < DEADLINE
    assert os.listdir(spill) == []
    assert threading.active_count() <= threads + 1       # + the memory monitor, if still stopping
    time.sleep(0.2)
    assert threading.active_count() == threads


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_encode_worker_stops_encoding(tmp_path, monkeypatch, tokenizer_dir, workers):
    corpus = write_diverse(tmp_path / "c.txt", 256 << 10, seed=6)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(encode_mod._ChunkEncoder, "__call__", _raise_on_third(encode_mod._ChunkEncoder.__call__))
    threads = threading.active_count()
    t0 = time.monotonic()
    with pytest.raises(Boom):
        bpe_core.encode_corpus(str(corpus), str(tokenizer_dir), str(out / "ids.npy"), num_workers=workers,
                               chunk_bytes=16 << 10, progress=False)
    assert time.monotonic() - t0 < DEADLINE
    assert os.listdir(out) == [], os.listdir(out)
    time.sleep(0.2)
    assert threading.active_count() == threads
