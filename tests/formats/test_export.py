"""Exports checked with the real libraries: HF tokenizers, tiktoken, GPT-2 files."""
from __future__ import annotations

from paths import TOOLS
import functools
import os
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.export import check_tiktoken_compatible, export, load_tiktoken_encoding
from bpe_core.formats.model import load_any
from bpe_core.formats.model import Model, dump_model
from bpe_core.pretok.patterns import resolve_pattern
from bpe_core.encode.tokenizer import Tokenizer
from encode_helpers import (EOT, FIXTURE_TEXTS, SETTINGS, corpus_names, corpus_sample, fixture_text,
                            gpt2_tokenizer, small_model)

tokenizers = pytest.importorskip("tokenizers")
tiktoken = pytest.importorskip("tiktoken")

sys.path.insert(0, str(TOOLS))
import export_tokenizer as cli  # noqa: E402

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)


def gpt2_model() -> Model:
    tok = gpt2_tokenizer()
    return Model(vocab=tok.vocab, merges=tok.merges, special_tokens=[EOT], pattern=resolve_pattern("gpt2"))


def trained_model(pattern="gpt2") -> Model:
    vocab, merges, specials = small_model()
    return Model(vocab=vocab, merges=merges, special_tokens=specials, pattern=resolve_pattern(pattern))


@functools.lru_cache(maxsize=None)
def exported(which: str, tmp_root: str):
    model = gpt2_model() if which == "gpt2" else trained_model()
    ours = Tokenizer(model.vocab, model.merges, model.special_tokens, model.pattern)
    hf_path = os.path.join(tmp_root, f"{which}-tokenizer.json")
    tt_path = os.path.join(tmp_root, f"{which}.tiktoken")
    export(model, "hf", hf_path)
    export(model, "tiktoken", tt_path)
    return ours, tokenizers.Tokenizer.from_file(hf_path), load_tiktoken_encoding(tt_path)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("exports"))


def texts():
    out = [fixture_text(n) for n in FIXTURE_TEXTS]
    for name in corpus_names():
        data = corpus_sample(name, 60_000)
        if data is not None:
            out.append(data[: data.rfind(b"\n") + 1].decode("utf-8"))
    return out


@pytest.mark.parametrize("which", ["gpt2", "trained"])
def test_hf_and_tiktoken_exports_give_identical_ids(tmp_root, which):
    ours, hf, tt = exported(which, tmp_root)
    for text in texts():
        want = ours.encode(text)
        assert hf.encode(text, add_special_tokens=False).ids == want
        assert tt.encode(text, allowed_special="all") == want


@SETTINGS
@given(st.lists(TEXT | st.sampled_from([EOT, EOT + EOT, " " * 3, "\n\n"]), max_size=6).map("".join))
def test_exports_match_on_hypothesis_text(tmp_root, text):
    for which in ("gpt2", "trained"):
        ours, hf, tt = exported(which, tmp_root)
        want = ours.encode(text)
        assert hf.encode(text, add_special_tokens=False).ids == want
        assert tt.encode(text, allowed_special="all") == want


def test_hf_decoder_round_trips(tmp_root):
    ours, hf, _ = exported("gpt2", tmp_root)
    text = fixture_text("german.txt")
    assert hf.decode(ours.encode(text), skip_special_tokens=False) == text


def test_gpt2_export_round_trips(tmp_path):
    model = trained_model()
    export(model, "gpt2", tmp_path / "g")
    again = Tokenizer.from_files(tmp_path / "g" / "vocab.json", tmp_path / "g" / "merges.txt", [EOT])
    text = fixture_text("corpus.en")[:5000] + EOT + "caf\udce9"
    assert again.encode(text) == Tokenizer(model.vocab, model.merges, [EOT]).encode(text)
    hf = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(tmp_path / "g" / "vocab.json"),
                                                              str(tmp_path / "g" / "merges.txt")))
    assert len(hf.get_vocab()) == len(model.vocab)


def test_no_tiktoken_witnesses_in_gpt2_or_trained_vocabs():
    assert check_tiktoken_compatible(gpt2_model()) == []
    assert check_tiktoken_compatible(trained_model()) == []


def test_tiktoken_rank_by_bytes_can_differ_on_hand_made_merges(tmp_path):
    """(b, c) before (a, b): merge-list BPE leaves b"abc" as [a, bc]; (a, bc) is no merge, yet the
    bytes b"abc" are a token (built by (ab, c)), so tiktoken merges them. bpe_core follows the
    merge list (and the reference); the exporter reports the witness."""
    vocab = {i: bytes([i]) for i in range(256)}
    merges = [(b"b", b"c"), (b"a", b"b"), (b"ab", b"c")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    model = Model(vocab=vocab, merges=merges, pattern=resolve_pattern("gpt2"))
    assert check_tiktoken_compatible(model) == [(b"abc", [b"a", b"bc"])]
    ours = Tokenizer(vocab, merges)
    assert ours.encode("abc") == reference.encode("abc", vocab, merges) == [97, 256]
    export(model, "tiktoken", tmp_path / "x.tiktoken")
    assert load_tiktoken_encoding(tmp_path / "x.tiktoken").encode("abc") == [258]
    # HF reads the merge list, so it agrees with us.
    export(model, "hf", tmp_path / "x.json")
    assert tokenizers.Tokenizer.from_file(str(tmp_path / "x.json")).encode("abc").ids == [97, 256]


def test_load_any_reads_gpt2_folder(tmp_path):
    export(gpt2_model(), "gpt2", tmp_path)
    model = load_any(tmp_path)
    assert model.special_tokens == [EOT] and len(model.merges) == 50000


# ==== CLI ======================================================================================


@pytest.mark.parametrize("fmt,out", [("hf", "tokenizer.json"), ("tiktoken", "tok.tiktoken"), ("gpt2", "gdir")])
def test_cli_exports(tmp_path, capsys, fmt, out):
    model = trained_model()
    dump_model(model, tmp_path / "model.json")
    rc = cli.main([str(tmp_path), "--format", fmt, "--out", str(tmp_path / out)])
    printed = capsys.readouterr().out.split()
    assert rc == 0 and all(os.path.exists(p) for p in printed)


@pytest.mark.parametrize("case", ["missing", "bad_model", "bad_out"])
def test_cli_bad_input(tmp_path, capsys, case):
    dump_model(trained_model(), tmp_path / "model.json")
    (tmp_path / "empty").mkdir()
    model, out = str(tmp_path), str(tmp_path / "t.json")
    if case == "missing":
        model = str(tmp_path / "nope")
    elif case == "bad_model":
        model = str(tmp_path / "empty")
    else:
        out = str(tmp_path / "no" / "such" / "t.json")
    rc = cli.main([model, "--format", "hf", "--out", out])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not os.path.exists(tmp_path / "t.json")
