"""What a SIGKILLed run leaves (temp files, spill folders named with its pid) is removed by the next
run at once; what a running writer holds is left alone."""
import os
import signal
import subprocess
import sys

import numpy as np

import bpe_core
import importlib
from bpe_core.runtime.atomic import remove_stale, remove_stale_in
from bpe_core.encode.tokenizer import Tokenizer
from bpe_core.pretok import counting


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_a_dead_writer_go_at_once_and_a_live_writers_stay(tmp_path):
    out = tmp_path / "ids.npy"
    dead, live = dead_pid(), os.getpid()
    (tmp_path / f".ids.npy.tmp-{dead}-abc").write_bytes(b"x")
    (tmp_path / f".ids.npy.spill-{dead}-def").mkdir()
    (tmp_path / f".ids.npy.tmp-{live}-ghi").write_bytes(b"x")       # ours: a writer that runs
    (tmp_path / ".ids.npy.tmp-old").write_bytes(b"x")                # no pid, fresh: kept (age rule)
    removed = remove_stale(out, ("tmp", "spill"))
    assert sorted(os.path.basename(p) for p in removed) == [f".ids.npy.spill-{dead}-def",
                                                            f".ids.npy.tmp-{dead}-abc"]
    assert sorted(os.listdir(tmp_path)) == sorted([".ids.npy.tmp-old", f".ids.npy.tmp-{live}-ghi"])


def test_encode_after_sigkill_leaves_nothing_behind(tmp_path):
    """Kill encode_corpus hard mid-run (2 workers: its temp file holds ids, chunks may hold or
    spill), then run it again: only the output remains. The run kills itself once its temp file
    holds 64 KB of ids (``robust_helpers.child_signal_while_writing``: a kill from outside, sent when
    a hidden file appeared, raced the run's end)."""
    from robust_helpers import ENCODE, NOT_REACHED
    from tool_runner import call_in_child

    corpus = tmp_path / "in.txt"
    corpus.write_bytes(b"hello world, some text to encode.<|endoftext|>" * 40_000)
    tok_dir = tmp_path / "tok"
    from bpe_core.formats.model import dump_folder
    result = bpe_core.train(bpe_core.TrainConfig(corpus, 300, special_tokens=("<|endoftext|>",)))
    tok_dir.mkdir()
    dump_folder(result.model, tok_dir)
    args = [corpus, "--tokenizer", tok_dir, "--out", tmp_path / "ids.npy", "--workers", "2",
            "--chunk-size", "64k", "--no-progress"]
    r = call_in_child("robust_helpers", "child_signal_while_writing", str(ENCODE), [str(a) for a in args],
                      64 << 10, "SIGKILL", cwd=tmp_path)
    assert r.returncode != NOT_REACHED, "the run ended before its temp file held 64 KB of ids"
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert any(n.startswith(".ids.npy.tmp-") for n in os.listdir(tmp_path))      # what the kill left
    ec = importlib.import_module("bpe_core.encode.encode_corpus")
    r = ec.encode_corpus(corpus, tok_dir, tmp_path / "ids.npy", num_workers=1, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["ids.npy", "in.txt", "tok"]
    assert r.n_tokens == len(np.load(tmp_path / "ids.npy"))


def test_trainer_spill_folder_of_a_dead_run_is_removed(tmp_path):
    dead = dead_pid()
    (tmp_path / f"{counting.SPILL_PREFIX}{dead}-xyz").mkdir()
    (tmp_path / "unrelated").mkdir()
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"low lower lowest newer wider<|endoftext|>" * 2000)
    result = bpe_core.train(bpe_core.TrainConfig(corpus, 300, special_tokens=("<|endoftext|>",), num_workers=1,
                                                 chunk_bytes=4096, spill_dir=str(tmp_path)))
    # a 1-byte threshold would spill every table; the run's own folder is gone at the end too
    trainer_spill = counting.Spill(1, str(tmp_path))
    trainer_spill.offer([(np.zeros(1, np.uint8), np.array([0, 1]), np.array([1]))])
    trainer_spill.cleanup()
    assert sorted(os.listdir(tmp_path)) == ["c.txt", "unrelated"]
    assert result.report["pretokens"] > 0
    assert remove_stale_in(str(tmp_path), [counting.SPILL_PREFIX]) == []
