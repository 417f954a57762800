"""Entropy curation: entropy values, bins, seeded determinism, atomic output, the CLI."""
from paths import REPO
import json
import math
import os
import pathlib
import random

import pytest
from tool_runner import run_tool
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.methods.curate import (bigram_entropy, curate_bytes, curate_file, entropy_bin, keep_document)

ROOT = REPO
SEP = b"<|endoftext|>"


def test_entropy_hand_computed():
    assert bigram_entropy("") == 0.0 and bigram_entropy("a") == 0.0 and bigram_entropy("aaaaa") == 0.0
    assert bigram_entropy("abab") == pytest.approx(-(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3)))
    text = "".join(chr(0x4E00 + i) for i in range(33))            # 32 distinct bigrams: 5 bits
    assert bigram_entropy(text) == pytest.approx(5.0)


def test_bins_and_shares():
    assert [entropy_bin(h) for h in (0.0, 2.999, 3.0, 4.5, 4.5001, 9.0)] == \
        ["low", "low", "medium", "medium", "high", "high"]
    low = [b"ab" * 20 + str(i).encode() for i in range(400)]                         # H ~ 1
    rng = random.Random(0)
    high = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(300)).encode() for i in range(400)]
    data = SEP.join(low + high)
    out, rep = curate_bytes(data, seed=1)
    assert rep.documents["low"] == 400 and rep.documents["high"] == 400
    assert 20 <= rep.kept["low"] <= 65 and 330 <= rep.kept["high"] <= 385
    assert rep.bytes_kept == sum(len(d) for d in out.split(SEP))


@given(st.lists(st.text(max_size=40), max_size=20), st.integers(0, 3))
def test_deterministic_and_order_free(docs, seed):
    docs = [d.encode("utf-8", "surrogatepass") for d in docs if d]
    docs = [d for d in docs if SEP not in d]
    a, ra = curate_bytes(SEP.join(docs), seed)
    b, rb = curate_bytes(SEP.join(docs[::-1]), seed)
    kept = [d for d in docs if keep_document(d, entropy_bin(bigram_entropy(d.decode("utf-8", "surrogateescape"))), seed)]
    assert a == SEP.join(kept)
    assert sorted(a.split(SEP)) == sorted(b.split(SEP)) and ra.kept == rb.kept


def test_file_and_cli(tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(SEP.join(f"document number {i} with some text {i * 7}".encode() for i in range(50)))
    rep = curate_file(str(src), str(tmp_path / "a.txt"), seed=3)
    r = run_tool(ROOT / "tools" / "curate.py", src, "--out", tmp_path / "b.txt", "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a.txt").read_bytes() == (tmp_path / "b.txt").read_bytes()
    assert json.loads(r.stdout)["kept_total"] == sum(rep.kept.values())
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    bad = run_tool(ROOT / "tools" / "curate.py", tmp_path / "missing.txt", "--out", tmp_path / "c.txt")
    assert bad.returncode == 2 and "missing.txt" in bad.stderr
