"""--init-from: continuing an existing BPE model equals training the larger vocabulary from scratch on
the same corpus; on another corpus it equals the reference twin's continuation; bad init models are
refused with one line."""
from paths import REPO
import doctest
import json
import os
import pathlib
import re
import shutil
import tempfile

import pytest
from tool_runner import run_tool
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core import reference
from bpe_core.engine import merge as engine_merge
from bpe_core.errors import IncompatibleInit
from bpe_core.formats.model import dump_folder, load_model
from bpe_core.methods import init_from

from strategies import SPECIAL, corpus_bytes

ROOT = REPO
FIXTURES = ROOT / "tests" / "fixtures"
words = st.sampled_from(["the", " the", " cat", " sat", " on", " mat", ".", " 12345", " 7", "\n", "  ",
                         " of", " a", ",", " and", " thesis", " aaa", "aaaa", SPECIAL])
phrase_text = st.lists(words, max_size=60).map("".join).map(lambda s: s.encode())


def _train(path, vocab_size, **options):
    return bpe_core.train(bpe_core.TrainConfig(path, vocab_size, **options))


def _corpus(d, name, data):
    p = os.path.join(d, name)
    with open(p, "wb") as f:
        f.write(data)
    return p


def _save(d, name, result):
    folder = os.path.join(d, name)
    os.makedirs(folder)
    dump_folder(result.model, folder)
    return folder


@settings(max_examples=max(10, settings().max_examples // 2), deadline=None)
@given(st.one_of(phrase_text, corpus_bytes), st.integers(0, 25), st.integers(1, 30), st.sampled_from([1, 2]))
def test_continuing_equals_training_from_scratch(data, n1, n2, workers):
    data = data * 3
    small, large = 257 + n1, 257 + n1 + n2
    with tempfile.TemporaryDirectory() as d:
        path = _corpus(d, "c.txt", data)
        base = _train(path, small, num_workers=workers, chunk_bytes=64 if workers > 1 else None)
        folder = _save(d, "base", base)
        cont = _train(path, large, num_workers=workers, init_from=folder)
        scratch = _train(path, large, num_workers=workers)
        assert cont.merges == scratch.merges and cont.vocab == scratch.vocab
        info = cont.model.metadata["init_from"]
        assert info["merges"] == len(base.merges) and info["vocab_size"] == len(base.vocab)
        assert info["ids"] == "kept" and info["format"] == "bpe_core"
        assert cont.report["init_from"] == info
        # SuperBPE on top of it: stage 2 from the init model's size == --transition at that size
        if len(base.merges) == small - 257:          # the corpus had the pairs to reach the size
            sb = _train(path, large, method="superbpe", num_workers=workers, init_from=folder)
            sb2 = _train(path, large, method="superbpe", num_workers=workers, transition=small)
            assert sb.merges == sb2.merges and sb.model.stages == sb2.model.stages


@settings(max_examples=max(10, settings().max_examples // 2), deadline=None)
@given(st.one_of(phrase_text, corpus_bytes), st.one_of(phrase_text, corpus_bytes), st.integers(0, 20),
       st.integers(1, 25))
def test_continuing_on_another_corpus_equals_reference(data_a, data_b, n1, n2):
    data_a, data_b = data_a * 2, data_b * 2
    with tempfile.TemporaryDirectory() as d:
        base = _train(_corpus(d, "a.txt", data_a), 257 + n1, num_workers=1)
        folder = _save(d, "base", base)
        path_b = _corpus(d, "b.txt", data_b)
        size = len(base.vocab) + n2
        cont = _train(path_b, size, num_workers=1, init_from=folder)
        vocab, merges = reference.train_bpe_from_bytes(data_b, size, [SPECIAL], init_merges=base.merges)
        assert cont.merges == merges and cont.vocab == vocab
        assert cont.merges[:len(base.merges)] == base.merges
        sb = _train(path_b, size, method="superbpe", num_workers=1, init_from=folder)
        vocab, merges, n_stage1 = reference.train_superbpe_from_bytes(data_b, size, [SPECIAL],
                                                                      init_merges=base.merges)
        assert sb.merges == merges and sb.vocab == vocab
        assert sb.model.stages[0]["merges"] == n_stage1 == len(base.merges)


def test_gpt2_files(tmp_path):
    """GPT-2's own vocab.json + merges.txt: its 50,000 merges come first, the ids are renumbered to
    bpe_core's layout, the files' checksums are recorded, and the result encodes as GPT-2 where no new
    merge applies."""
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    shutil.copy(FIXTURES / "gpt2_vocab.json", gpt2 / "vocab.json")
    shutil.copy(FIXTURES / "gpt2_merges.txt", gpt2 / "merges.txt")
    corpus = tmp_path / "c.txt"
    corpus.write_bytes((FIXTURES / "tinystories_sample.txt").read_bytes()[:50_000])
    out = tmp_path / "out"
    r = run_tool(ROOT / "tools" / "train_bpe.py", corpus, "--vocab-size", "50267", "--init-from", gpt2, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "ids follow bpe_core's layout" in r.stderr
    model = load_model(out)
    gpt2_model = bpe_core.formats.model.load_any(gpt2)
    assert model.merges[:50000] == gpt2_model.merges and len(model.merges) == 50267 - 257
    info = model.metadata["init_from"]
    assert info["format"] == "gpt2" and info["ids"] == "renumbered" and info["merges"] == 50000
    assert set(info["sha256"]) == {"vocab.json", "merges.txt"}
    report = json.loads((out / "train_report.json").read_text())
    assert report["init_from"] == info
    # the added merges are what this corpus's counts pick after GPT-2's: the reference agrees
    counts = reference.count_pretokens(corpus.read_bytes(), [SPECIAL])
    _, merges = reference.train_on_counts(counts, 50267, [SPECIAL], init_merges=gpt2_model.merges)
    assert model.merges == merges


@pytest.mark.parametrize("options, message", [
    (dict(vocab_size=280), "the init model has 280 tokens; --vocab-size must be larger (got 280)"),
    (dict(special_tokens=()), "special tokens ['<|endoftext|>'] differ from this run's []"),
    (dict(pattern="cl100k"), "its pattern (gpt2) is not this run's (cl100k)"),
    (dict(method="superbpe", transition=290), "stage 2 starts at the init model's size (280)"),
])
def test_refusals(tmp_path, options, message):
    corpus = _corpus(str(tmp_path), "c.txt", (ROOT / "bpe_core" / "data" / "sample.txt").read_bytes()[:20_000])
    base = _train(corpus, 280, num_workers=1)
    assert len(base.vocab) == 280
    folder = _save(str(tmp_path), "base", base)
    kw = dict(vocab_size=320, num_workers=1, init_from=folder)
    kw.update(options)
    with pytest.raises(IncompatibleInit, match=re.escape(message)):
        bpe_core.train(bpe_core.TrainConfig(corpus, **kw))


def test_refusals_cli(tmp_path):
    corpus = _corpus(str(tmp_path), "c.txt", b"low lower lowest newest widest " * 20)
    tool = str(ROOT / "tools" / "train_bpe.py")
    sb = str(tmp_path / "sb")
    assert run_tool(tool, corpus, "--vocab-size", "300", "--method", "superbpe", "--out", sb).returncode == 0
    cases = [(["--init-from", sb], "is a superbpe model; --init-from needs a plain BPE model"),
             (["--init-from", str(tmp_path / "missing")], "no such file or folder"),
             (["--init-from", sb, "--method", "supratok"], "cannot start from an existing model")]
    for extra, message in cases:
        r = run_tool(tool, corpus, "--vocab-size", "320", "--out", tmp_path / "o", *extra)
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "o").exists()


def test_docstring_examples():
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for module in (engine_merge, init_from):
        for test in doctest.DocTestFinder().find(module):
            runner.run(test)
    assert runner.failures == 0
