"""Exact or refused, checked on the user's text (``formats.exactness``): the sample is drawn across
the whole input, an inexact export exits 2 with one line and writes nothing, ``--allow-inexact``
writes it with the rate, and a training folder whose ``tokenizer.json`` would be inexact is written
without it (the report says why)."""
from __future__ import annotations

import json
import os
import sys

import pytest

from paths import FIXTURES, TOOLS
from bpe_core.export import export_checked
from bpe_core.encode.tokenizer import model_encoder
from bpe_core.formats.exactness import (InexactExport, builtin_documents, documents_for, hf_folder_check,
                                        input_files, sample_documents)
from bpe_core.formats.folder import save_folder
from bpe_core.formats.model import Model, dump_folder
from bpe_core.pretok.patterns import resolve_pattern

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("tiktoken")

sys.path.insert(0, str(TOOLS))
import export_tokenizer as export_cli  # noqa: E402

SPECIAL = "<|endoftext|>"


def digit_model(pattern: str = "cl100k") -> Model:
    """A model whose merges build digit groups: every split of a digit run shows in its ids."""
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = SPECIAL.encode()
    merges = []
    for a, b in [(b"1", b"2"), (b"12", b"3"), (b"4", b"5"), (b"45", b"6"), (b"123", b"456")]:
        merges.append((a, b))
        vocab[len(vocab)] = a + b
    return Model(vocab=vocab, merges=merges, special_tokens=[SPECIAL], pattern=resolve_pattern(pattern))


def test_the_sample_is_drawn_across_the_whole_input(tmp_path):
    """Only the last 1% of the corpus has the text an export gets wrong: a head-only check passes
    it, the sample across the input finds it."""
    path = tmp_path / "c.txt"
    head = "".join(f"plain words {i}{SPECIAL}" for i in range(99_000))
    tail = "".join(f"order 1234567{SPECIAL}" for i in range(1_000))
    path.write_text(head + tail, encoding="utf-8")
    docs = sample_documents([path], [SPECIAL], max_docs=300, max_bytes=1 << 20)
    assert any(b"1234567" in d for d in docs) and len(docs) > 250
    assert not any(b"1234567" in d for d in path.read_bytes()[:1 << 20].split(SPECIAL.encode()))


def test_no_input_at_hand_means_the_builtin_text_never_the_packaged_sample():
    model = digit_model()
    docs, on, note = documents_for(model, None, "-")
    assert docs == builtin_documents() and "built-in" in on and "--check-text" in note
    assert input_files(None)[0] == [] and input_files(str(FIXTURES / "corpus.en"))[0] == [str(FIXTURES / "corpus.en")]


def test_an_inexact_export_is_refused_in_one_line_and_nothing_is_written(tmp_path, monkeypatch):
    # the HF split as it was before patterns_compat: cl100k's regex as written, which Oniguruma
    # reads otherwise (1234567 one pretoken)
    import bpe_core.formats.patterns_compat as compat

    monkeypatch.setattr(compat, "portable_pattern", lambda p, engine: resolve_pattern(p))
    out = tmp_path / "new" / "tok.json"
    docs = [b"the year 1234567 and 12", b"x 45"]
    with pytest.raises(InexactExport) as info:
        export_checked(digit_model(), "hf", out, docs, "t.txt")
    msg = str(info.value)
    assert "\n" not in msg and "on 1 of 2 documents" in msg and "'the year 1234567" in msg and "--allow-inexact" in msg
    assert not (tmp_path / "new").exists()
    paths, result = export_checked(digit_model(), "hf", out, docs, "t.txt", allow_inexact=True)
    assert paths == [str(out)] and result.differing == 1 and result.rate == 0.5


def test_a_translated_export_is_exact_where_the_old_one_was_not(tmp_path):
    docs = [b"the year 1234567 and 12", b"x 45", b"123456123"]
    paths, result = export_checked(digit_model(), "hf", tmp_path / "odd.name", docs, "t.txt")
    assert result.exact and result.n_docs == 3 and paths == [str(tmp_path / "odd.name")]
    tok = tokenizers.Tokenizer.from_file(paths[0])
    assert tok.encode("1234567", add_special_tokens=False).ids == [258, 260, 55]      # 123 456 7, as ours


@pytest.mark.parametrize("separate", [False, True], ids=["in-process", "child"])
def test_the_folder_is_written_without_an_inexact_tokenizer_json(tmp_path, monkeypatch, separate):
    """In this process, or (a large ``tokenizer.json``, forced here) loaded in a child process while
    the model files are written: the same decision and facts."""
    # (the untranslated split, as above)
    import bpe_core.formats.exactness as exactness
    import bpe_core.formats.patterns_compat as compat

    if separate:
        monkeypatch.setattr(exactness, "SEPARATE_CHECK_BYTES", 0)

    monkeypatch.setattr(compat, "portable_pattern", lambda p, engine: resolve_pattern(p))
    report: dict = {}
    check = hf_folder_check(model_encoder(digit_model()), [b"1234567", b"12 45"], "t.txt")
    save_folder(digit_model(), tmp_path / "tok", report, hf_check=check)
    names = set(os.listdir(tmp_path / "tok"))
    # (the remote-code files instead: AutoTokenizer(trust_remote_code=True) runs bpe_core)
    assert "tokenizer.json" not in names and "tokenization_bpe_core.py" in names and "model.json" in names
    facts = json.loads((tmp_path / "tok" / "train_report.json").read_text())["hf_files"]
    assert facts["written"] is False and "on 1 of 2 documents" in facts["why"]
    assert facts["check"]["seconds"] >= 0 and facts["check"]["loader"].startswith("tokenizers")
    report = {}
    check = hf_folder_check(model_encoder(digit_model()), [b"1234567", b"12 45"], "t.txt", allow_inexact=True)
    save_folder(digit_model(), tmp_path / "tok2", report, hf_check=check)
    assert "tokenizer.json" in os.listdir(tmp_path / "tok2") and report["hf_files"]["check"]["identical_share"] == 0.5


@pytest.mark.parametrize("separate", [False, True], ids=["in-process", "child"])
def test_a_tokenizer_json_hf_cannot_load_is_left_out(tmp_path, monkeypatch, separate):
    """The check loads the file as written: one HF cannot read is left out, the report says why."""
    import bpe_core.formats.exactness as exactness
    import bpe_core.formats.hf as hf_module

    monkeypatch.setattr(exactness, "SEPARATE_CHECK_BYTES", 0 if separate else 1 << 40)
    real = hf_module._hf_pieces
    monkeypatch.setattr(hf_module, "_hf_pieces", lambda *a, **k: [*real(*a, **k)][:-1])   # (no closing braces)
    report: dict = {}
    save_folder(digit_model(), tmp_path / "tok", report,
                hf_check=hf_folder_check(model_encoder(digit_model()), [b"1234567"], "t.txt"))
    assert "tokenizer.json" not in os.listdir(tmp_path / "tok")
    assert report["hf_files"]["why"].startswith("tokenizer.json, tokenizer_config.json left out: HF tokenizers "
                                                "cannot load this tokenizer.json (")


def test_a_failed_write_ends_the_check_process(tmp_path, monkeypatch):
    """A failure while the model files are written (the check running in its child process): the
    child is ended, nothing is published."""
    import subprocess

    import bpe_core.formats.exactness as exactness
    import bpe_core.formats.model as model_module

    monkeypatch.setattr(exactness, "SEPARATE_CHECK_BYTES", 0)
    children = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        children.append(real_popen(*args, **kwargs))
        return children[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(model_module, "dump_model", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space")))
    with pytest.raises(OSError):
        save_folder(digit_model(), tmp_path / "tok", {},
                    hf_check=hf_folder_check(model_encoder(digit_model()), [b"1234567"], "t.txt"))
    assert len(children) == 1 and children[0].returncode is not None
    assert not (tmp_path / "tok").exists()


def test_superbpe_like_refusal_names_the_exact_formats(tmp_path, capsys):
    """The tool: exit 2, one line with the count, a document's start and the exact formats; with
    --allow-inexact the file and the rate."""
    model = digit_model("gpt2")       # vocab.json + merges.txt of a gpt2 model: exact
    tok = tmp_path / "tok"
    tok.mkdir()
    dump_folder(digit_model(), tok)   # cl100k: gpt2 files would split digit runs otherwise
    text = tmp_path / "check.txt"
    text.write_text(f"a 1234567 b{SPECIAL}45 6{SPECIAL}", encoding="utf-8")
    out = tmp_path / "g"
    assert export_cli.main([str(tok), "--format", "gpt2", "--out", str(out), "--check-text", str(text)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other ids than bpe_core on 1 of 2 documents" in err[0] and "--format hf" in err[0]
    assert not out.exists()
    assert export_cli.main([str(tok), "--format", "gpt2", "--out", str(out), "--check-text", str(text),
                            "--allow-inexact"]) == 0
    err = capsys.readouterr().err
    assert "50.0% identical" in err and (out / "vocab.json").exists()
    assert model.pattern == resolve_pattern("gpt2")


def test_an_empty_check_text_checks_on_the_builtin_text(tmp_path):
    """Zero documents prove nothing: the built-in text stands in, and the note says why."""
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"\n\n  \n")
    docs, on, note = documents_for(digit_model(), str(empty))
    assert docs == builtin_documents() and "holds no text" in note and "built-in" in on
