"""``tie_break="hf"``: the merges of HF ``tokenizers``' BpeTrainer, merge for merge.

HF is run on the same pre-tokenization (the byte-level GPT-2 split regex) with the same special
tokens: the text between special tokens goes to ``train_from_iterator`` (HF's trainer does not split
special tokens out of its input), and its initial alphabet is the 256 byte characters, so its
vocabulary counts as ours does (256 + specials + merges). The fast trainer (engine), the reference
twin and HF agree; the default (``"bytes"``, CS336) is unchanged.
"""
from paths import REPO, TOOLS, FIXTURES, package_parent
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core import reference
from bpe_core.corpus.specials import encode_specials, split_on_specials
from bpe_core.engine.merge import MergeEngine, hf_byte_rank, train_words
from bpe_core.formats.model import bytes_to_unicode, dump_folder
from bpe_core.pretok.wordtable import WordTable

from strategies import SPECIAL, corpus_bytes, corpus_text, tie_heavy
from test_reference import load_reference_merges

tokenizers = pytest.importorskip("tokenizers")

U2B = {c: b for b, c in bytes_to_unicode().items()}


def hf_merges(data: bytes, vocab_size: int, specials=(SPECIAL,)) -> list[tuple[bytes, bytes]]:
    """HF BpeTrainer's merges (as bytes) on the same pretokens: byte-level, GPT-2 regex."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=0)
    pieces = [p.decode("utf-8") for p, is_special in split_on_specials(data, encode_specials(specials))
              if not is_special]
    tok.train_from_iterator(pieces, trainer)
    out = []
    for m in json.loads(tok.to_str())["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ")
        out.append((bytes(U2B[c] for c in a), bytes(U2B[c] for c in b)))
    return out


def fast_merges(data: bytes, vocab_size: int, specials=(SPECIAL,), **options):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "corpus.txt")
        with open(path, "wb") as f:
            f.write(data)
        vocab, merges = bpe_core.train_bpe(path, vocab_size, list(specials), **{"num_workers": 1, **options})
    return vocab, merges


FIXTURE_SIZES = [("tinystories_sample.txt", 500), ("german.txt", 300), ("address.txt", 400)]


def test_hf_byte_rank_is_hfs_alphabet_order():
    from tokenizers import pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())        # HF's ids: the characters in order
    b2u = bytes_to_unicode()
    assert [alphabet.index(b2u[b]) for b in range(256)] == hf_byte_rank() == reference.hf_byte_rank()


@pytest.mark.parametrize("name, vocab_size", FIXTURE_SIZES)
def test_reference_and_fast_equal_hf_on_fixtures(name, vocab_size):
    data = (FIXTURES / name).read_bytes()
    expected = hf_merges(data, vocab_size)
    _, slow = reference.train_bpe_from_bytes(data, vocab_size, [SPECIAL], tie_break="hf")
    vocab, fast = fast_merges(data, vocab_size, tie_break="hf")
    assert slow == expected
    assert fast == expected
    assert len(vocab) == vocab_size
    # the CS336 tie-break gives other merges here: the test sees the difference
    assert reference.train_bpe_from_bytes(data, vocab_size, [SPECIAL])[1] != expected


def test_fast_equals_hf_on_corpus_en():
    data = (FIXTURES / "corpus.en").read_bytes()
    for workers in (1, 2):
        _, fast = fast_merges(data, 1000, tie_break="hf", num_workers=workers, chunk_bytes=16 << 10)
        assert fast == hf_merges(data, 1000)


def test_default_is_still_cs336():
    data = (FIXTURES / "corpus.en").read_bytes()
    expected = load_reference_merges(FIXTURES / "train-bpe-reference-merges.txt")
    assert fast_merges(data, 500)[1] == expected
    assert fast_merges(data, 500, tie_break="bytes")[1] == expected
    assert fast_merges(data, 500, tie_break="hf")[1] != expected


def test_ties_go_to_hf_smallest_ids():
    # every pair counts 1: CS336 takes the greatest bytes, HF the smallest ids ('a' < 'b' < ' ' in HF's
    # order: ' ' is byte-level 'Ġ', U+0120)
    data = b"ab ba"
    assert reference.train_bpe_from_bytes(data, 257, [])[1] == [(b"b", b"a")]
    assert reference.train_bpe_from_bytes(data, 257, [], tie_break="hf")[1] == [(b"a", b"b")]
    assert fast_merges(data, 257, [], tie_break="hf")[1] == [(b"a", b"b")] == hf_merges(data, 257, [])


@given(corpus_bytes, st.integers(257, 257 + 60))
def test_fast_equals_reference_with_hf_ties(data, vocab_size):
    fast = fast_merges(data, vocab_size, tie_break="hf")
    vocab, merges = reference.train_bpe_from_bytes(data, vocab_size, [SPECIAL], tie_break="hf")
    assert fast[1] == merges
    assert fast[0] == vocab


@settings(max_examples=max(10, settings().max_examples // 2), deadline=None)
@given(st.one_of(corpus_text, tie_heavy.map(lambda s: s * 3)), st.integers(257, 257 + 60))
def test_fast_and_reference_equal_hf_on_text(text, vocab_size):
    data = text.encode("utf-8")
    expected = hf_merges(data, vocab_size)
    assert reference.train_bpe_from_bytes(data, vocab_size, [SPECIAL], tie_break="hf")[1] == expected
    assert fast_merges(data, vocab_size, tie_break="hf")[1] == expected


@settings(max_examples=max(10, settings().max_examples // 3), deadline=None)
@given(st.lists(st.sampled_from(["ab", "ba", "aab", "bba", "abab", "a", "b", "ñ", "ññ"]), min_size=1, max_size=25),
       st.integers(1, 40), st.booleans())
def test_engine_hf_ties_mapped_and_two_threads(words, n_merges, mapped):
    """The engine alone (mapped read-only arrays, merges on two threads) against the reference loop."""
    counts: dict[bytes, int] = {}
    for i, w in enumerate(words):
        counts[w.encode()] = counts.get(w.encode(), 0) + 1 + i % 3
    with tempfile.TemporaryDirectory() as d:
        vocab, merges = train_words(WordTable.from_counts(counts), 256 + n_merges, (), tie_break="hf",
                                    spill_dir=d if mapped else None)
    ref_vocab, ref_merges = reference.train_on_counts(counts, 256 + n_merges, (), tie_break="hf")
    assert merges == ref_merges

    table = WordTable.from_counts(counts).without_singletons()
    eng = MergeEngine(table.arena, table.offsets, table.counts, [bytes([i]) for i in range(256)], threads=2,
                      tie_break="hf")
    eng.par_min_sites = 1
    tokens_steps = eng.run(n_merges)
    tokens = eng.tokens()
    assert [(tokens[a], tokens[b]) for a, b, _ in tokens_steps] == ref_merges


def test_init_from_continues_hf_merges(tmp_path):
    data = (FIXTURES / "tinystories_sample.txt").read_bytes()
    path = tmp_path / "c.txt"
    path.write_bytes(data)
    base = bpe_core.train(bpe_core.TrainConfig(str(path), 400, num_workers=1, tie_break="hf"))
    folder = tmp_path / "base"
    folder.mkdir()
    dump_folder(base.model, str(folder))
    cont = bpe_core.train(bpe_core.TrainConfig(str(path), 500, num_workers=1, tie_break="hf", init_from=str(folder)))
    assert cont.merges == hf_merges(data, 500)


def test_model_and_report_say_hf(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"ab ba ab")
    hf = bpe_core.train(bpe_core.TrainConfig(str(path), 258, num_workers=1, tie_break="hf"))
    assert hf.model.stages == [{"name": "bpe", "merges": 1, "tie_break": "hf"}]
    assert hf.report["tie_break"] == "hf"
    default = bpe_core.train(bpe_core.TrainConfig(str(path), 258, num_workers=1))
    assert default.model.stages == [{"name": "bpe", "merges": 1}] and "tie_break" not in default.report


def test_bad_values_and_other_methods_are_refused():
    with pytest.raises(ValueError, match="unknown tie_break 'HF'"):
        bpe_core.TrainConfig("x.txt", 300, tie_break="HF")
    for method in ("superbpe", "supratok"):
        with pytest.raises(ValueError, match=f"tie_break 'hf' is for plain BPE.*{method}"):
            bpe_core.TrainConfig("x.txt", 300, method=method, tie_break="hf")
    with pytest.raises(ValueError, match="needs the 256 single bytes"):
        MergeEngine(np.zeros(2, np.uint32), np.array([0, 2]), np.array([1]), [b"x"], tie_break="hf")
    with pytest.raises(ValueError, match="unknown tie_break"):
        MergeEngine(np.zeros(2, np.uint8), np.array([0, 2]), np.array([1]), [bytes([i]) for i in range(256)],
                    tie_break="greatest")


def _cli(*args):
    return subprocess.run([sys.executable, str(TOOLS / "train_bpe.py"), *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": package_parent()})


def test_cli_flag(tmp_path):
    data = (FIXTURES / "tinystories_sample.txt").read_bytes()
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(data)
    r = _cli(corpus, "--vocab-size", 400, "--out", tmp_path / "tok", "--tie-break", "hf", "--workers", 1,
             "--no-progress")
    assert r.returncode == 0, r.stderr
    model = json.loads((tmp_path / "tok" / "model.json").read_text())
    assert model["stages"][0]["tie_break"] == "hf"
    merges = reference.train_bpe_from_bytes(data, 400, [SPECIAL], tie_break="hf")[1]
    assert merges == hf_merges(data, 400)
    gpt2 = (tmp_path / "tok" / "merges.txt").read_text(encoding="utf-8").splitlines()
    b2u = bytes_to_unicode()
    enc = lambda t: "".join(b2u[b] for b in t)
    assert [l for l in gpt2 if not l.startswith("#")] == [f"{enc(a)} {enc(b)}" for a, b in merges]
    r = _cli(corpus, "--vocab-size", 400, "--out", tmp_path / "sb", "--tie-break", "hf", "--method", "superbpe")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "tie_break 'hf' is for plain BPE" in r.stderr
