"""Encoding text without whitespace: a stretch the cutter cannot cut (maybe one pretoken, merged
whole) that the budget cannot hold is refused before any work, in one line naming the stretch and
a budget; that budget is retried here and works, with the ids of the whole text."""
import re

import numpy as np

import bpe_core
from robust_helpers import ENCODE, TRAIN, stderr_lines, tool


def test_a_long_uncut_stretch_is_refused_and_the_named_budget_works(tmp_path):
    tok = tmp_path / "tok"
    assert tool(TRAIN, "--vocab-size", "300", "--out", tok, "--no-progress").returncode == 0
    rng = np.random.default_rng(0)
    text = np.frombuffer(b"abcdefghij", np.uint8)[rng.integers(0, 10, 3_000_000)].tobytes()
    corpus = tmp_path / "letters.txt"
    corpus.write_bytes(text)
    ids = tmp_path / "ids.npy"
    r = tool(ENCODE, corpus, "--tokenizer", tok, "--out", ids, "--memory-limit", "120M", "--no-progress")
    assert r.returncode == 2, r.stderr
    line, = stderr_lines(r.stderr)
    assert f"{corpus}: bytes 0-3,000,000 have no place to cut" in line and not ids.exists()
    budget = re.search(r"--memory-limit (\S+)$", line).group(1)
    r = tool(ENCODE, corpus, "--tokenizer", tok, "--out", ids, "--memory-limit", budget, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert np.load(ids).tolist() == bpe_core.Tokenizer.load(tok).encode(text)
