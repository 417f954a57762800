"""Whole-corpus encoding: identical ids for any worker count and chunk size, the .npy, the CLI."""
from __future__ import annotations

import importlib
import os
import random
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.model_io import Model, dump_model
from bpe_core.patterns import resolve_pattern
from bpe_core.tokenizer import Tokenizer
from encode_helpers import EOT, SETTINGS, fixture_text, small_model

# The module, not the function bpe_core re-exports under the same name.
ec = importlib.import_module("bpe_core.encode_corpus")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
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


def test_failure_leaves_nothing(tmp_path, tok_dir, monkeypatch):
    make_corpus(tmp_path / "in.txt")

    def boom(task):
        raise RuntimeError("worker died")

    monkeypatch.setattr(ec, "_encode_chunk", boom)
    with pytest.raises(RuntimeError):
        ec.encode_corpus(tmp_path / "in.txt", tok_dir, tmp_path / "ids.npy", num_workers=1, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]


def test_plan_encode():
    g = 2**30
    p = ec.plan_encode(10 * g, memory_limit=8 * g, num_workers=4)
    assert p.num_workers == 4 and p.estimated_peak_bytes <= 8 * g
    small = ec.plan_encode(10 * g, memory_limit=600 * 2**20, num_workers=16)
    assert 1 <= small.num_workers < 16 and small.estimated_peak_bytes <= 600 * 2**20
    assert ec.plan_encode(1000, num_workers=4).chunk_bytes == ec.MIN_CHUNK_BYTES
    with pytest.raises(ValueError, match="too small"):
        ec.plan_encode(g, memory_limit=100 * 2**20)


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
