"""Model files are checked on load (issue 16): malformed fields, corrupt merges, GPT-2 files that do
not belong together, a folder left half-written by a killed run, exports HF cannot load, bad ids."""
from __future__ import annotations

from paths import TOOLS
import functools
import json
import os
import shutil
import sys

import numpy as np
import pytest

from bpe_core import reference
from bpe_core.evaluate import show_token, token_change
from bpe_core.export import export
from bpe_core.formats.model import load_any
from bpe_core.formats.model import (Model, ModelFormatError, check_model, dump_folder, dump_gpt2, dump_model, load_gpt2,
                               load_model, token_to_gpt2)
from bpe_core.pretok.patterns import resolve_pattern
from bpe_core.encode.tokenizer import Tokenizer
from encode_helpers import EOT, fixture_path, fixture_text

sys.path.insert(0, str(TOOLS))
import encode_corpus as encode_cli  # noqa: E402
import evaluate as evaluate_cli  # noqa: E402
import export_tokenizer as export_cli  # noqa: E402


@functools.lru_cache(maxsize=None)
def _trained():
    data = fixture_text("corpus.en").encode("utf-8")[:20000]
    vocab, merges = reference.train_bpe_from_bytes(data, 400, [EOT])
    return vocab, merges


def trained_model(method: str = "bpe") -> Model:
    vocab, merges = _trained()
    stages = [{"name": "bpe", "merges": len(merges)}]
    if method == "superbpe":
        half = len(merges) // 2
        stages = [{"name": "bpe", "merges": half}, {"name": "superbpe", "merges": len(merges) - half,
                                                     "split": "default"}]
    return Model(vocab=dict(vocab), merges=list(merges), special_tokens=[EOT], pattern=resolve_pattern("gpt2"),
                 method=method, stages=stages)


@pytest.fixture
def folder(tmp_path):
    """A trained folder as tools/train_bpe.py writes it (GPT-2 files, then model.json with checksums)."""
    d = tmp_path / "tok"
    d.mkdir()
    dump_folder(trained_model(), d)
    return d


def edit_model(path, fn):
    doc = json.loads(path.read_text(encoding="utf-8"))
    fn(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")


def one_error_line(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def run_tools(capsys, tmp_path, tok):
    """Every tool that reads a model, on ``tok``: exit code and stderr of each; no file is left."""
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat.\n", encoding="utf-8")
    before = set(os.listdir(tmp_path))
    results = {}
    for name, fn, argv in [
        ("encode", encode_cli.main, [str(text), "--tokenizer", str(tok), "--out", str(tmp_path / "ids.npy"),
                                     "--no-progress"]),
        ("export-hf", export_cli.main, [str(tok), "--format", "hf", "--out", str(tmp_path / "tokenizer.json")]),
        ("export-gpt2", export_cli.main, [str(tok), "--format", "gpt2", "--out", str(tmp_path / "g2")]),
        ("evaluate", evaluate_cli.main, ["--tokenizer", str(tok), "--text", str(text)]),
    ]:
        code = fn(argv)
        results[name] = (code, capsys.readouterr().err)
    assert set(os.listdir(tmp_path)) == before, "a refused model must leave no files"
    return results


# ==== model.json: every field ===================================================================


MALFORMED = {
    "metadata list": (lambda d: d.update(metadata=[1, 2]), "field 'metadata' must be an object, got list"),
    "stages int": (lambda d: d.update(stages=5), "field 'stages' must be a list of objects, got integer"),
    "method unknown": (lambda d: d.update(method="wordpiece"), "field 'method' must be one of"),
    "vocab dict": (lambda d: d.update(vocab={"0": "00"}), "field 'vocab' must be a list"),
    "vocab not hex": (lambda d: d["vocab"].__setitem__(300, "zz"), "field 'vocab': entry 300 must be a hex"),
    "vocab number": (lambda d: d["vocab"].__setitem__(300, 10 ** 12), "field 'vocab': entry 300"),
    "merges pair of 3": (lambda d: d["merges"].__setitem__(0, ["20", "74", "68"]), "field 'merges': entry 0"),
    "merges int": (lambda d: d.update(merges=5), "field 'merges' must be a list"),
    "specials not str": (lambda d: d.update(special_tokens=[1]), "field 'special_tokens'"),
    "pattern int": (lambda d: d.update(pattern=5), "field 'pattern' must be a non-empty string"),
    "pattern bad regex": (lambda d: d.update(pattern="(unclosed"), "field 'pattern' is not a valid regex"),
    "no vocab": (lambda d: d.pop("vocab"), "field 'vocab' is missing"),
    "version true": (lambda d: d.update(version=True), "unsupported format version True"),
    "stage count wrong": (lambda d: d["stages"][0].update(merges=3), "field 'stages': the stages hold 3 merges"),
    "stage count bool": (lambda d: d["stages"][0].update(merges=True), "stage 0 needs \"merges\""),
    "files bad": (lambda d: d.update(files=[1]), "field 'files'"),
    "vocab too long": (lambda d: d["vocab"].append("6162"), "field 'vocab' has"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_model_json_is_one_error_naming_file_and_field(folder, case):
    change, message = MALFORMED[case]
    edit_model(folder / "model.json", change)
    with pytest.raises(ModelFormatError) as exc:
        Tokenizer.load(folder)
    assert str(exc.value).startswith(str(folder / "model.json") + ": ")
    assert message in str(exc.value)


def test_superbpe_stage_without_merges(tmp_path):
    dump_model(trained_model("superbpe"), tmp_path / "model.json")
    assert Tokenizer.load(tmp_path).encode("the cat") == Tokenizer.load(tmp_path).encode(b"the cat")
    edit_model(tmp_path / "model.json", lambda d: d["stages"][1].pop("merges"))
    with pytest.raises(ModelFormatError, match=r"model.json: field 'stages': stage 1 needs \"merges\""):
        Tokenizer.load(tmp_path)
    edit_model(tmp_path / "model.json", lambda d: d["stages"].pop())
    with pytest.raises(ModelFormatError, match="a superbpe model needs 2 stages, got 1"):
        load_model(tmp_path)


def test_model_without_method_loads_only_as_plain_bpe(tmp_path):
    """A model file without ``method`` is plain BPE; one with stages (SuperBPE's) is refused, not
    read as plain BPE (it would encode differently)."""
    dump_model(trained_model("bpe"), tmp_path / "model.json")
    want = Tokenizer.load(tmp_path).encode("the cat sat")
    edit_model(tmp_path / "model.json", lambda d: d.pop("method"))
    assert load_model(tmp_path).method == "bpe" and Tokenizer.load(tmp_path).encode("the cat sat") == want
    dump_model(trained_model("superbpe"), tmp_path / "model.json")
    edit_model(tmp_path / "model.json", lambda d: d.pop("method"))
    with pytest.raises(ModelFormatError, match=r"model.json: field 'method' is missing, and the model has stages other than plain BPE's"):
        Tokenizer.load(tmp_path)


def test_deep_nesting_and_binary_junk(tmp_path):
    path = tmp_path / "model.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelFormatError, match="model.json: not a bpe_core model file .JSON nesting too deep"):
        Tokenizer.load(path)
    path.write_bytes(b"\xc2{}")
    with pytest.raises(ModelFormatError, match="not UTF-8"):
        load_model(path)


@pytest.mark.parametrize("case", ["metadata list", "stages int", "method unknown", "vocab number"])
def test_tools_refuse_malformed_model_with_one_line(folder, tmp_path, capsys, case):
    change, message = MALFORMED[case]
    edit_model(folder / "model.json", change)
    for name, (code, err) in run_tools(capsys, tmp_path, folder).items():
        assert code == 2, name
        one_error_line(err, "model.json", message)


# ==== the merge chain ===========================================================================


def _corrupt_one_merge(model: Model) -> tuple[int, bytes, bytes]:
    """Rewrite one merge ``(a, b)`` into ``(a + b[:1], b[1:])`` where ``a + b[:1]`` is not a token
    (the bytes it builds stay the same, as in the issue's ``(b' ', b'in') -> (b' i', b'n')``)."""
    tokens = set(model.vocab.values())
    for r, (a, b) in enumerate(model.merges):
        if len(b) >= 2 and a + b[:1] not in tokens:
            model.merges[r] = (a + b[:1], b[1:])
            return r, a + b[:1], b[1:]
    raise AssertionError("no merge to corrupt")


def test_corrupt_merge_is_refused(tmp_path, capsys):
    model = trained_model()
    r, a, b = _corrupt_one_merge(model)
    with pytest.raises(ModelFormatError, match=rf"model: field 'merges': merge {r} .*neither a single byte nor "
                                               rf"built by an earlier merge"):
        check_model(model)
    with pytest.raises(ModelFormatError):
        export(model, "hf", tmp_path / "tokenizer.json")
    assert not os.listdir(tmp_path)
    tok = tmp_path / "tok"
    tok.mkdir()
    dump_model(model, tok / "model.json")            # dump does not check; every loader does
    with pytest.raises(ModelFormatError, match=f"merge {r}"):
        Tokenizer.load(tok)
    for name, (code, err) in run_tools(capsys, tmp_path, tok).items():
        assert code == 2, name
        one_error_line(err, "model.json", f"merge {r}")


def test_merge_building_bytes_outside_the_vocab(tmp_path):
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"ab"
    model = Model(vocab=dict(vocab), merges=[(b"a", b"c")])
    with pytest.raises(ModelFormatError, match=r"merge 0 \(b'a', b'c'\) builds b'ac', which is not in the vocab"):
        check_model(model)


def test_two_merges_building_the_same_bytes_still_load(tmp_path):
    """docs/semantics.md: (a, bc) and (ab, c) both build abc; both keep their ids."""
    vocab = {i: bytes([i]) for i in range(256)}
    merges = [(b"b", b"c"), (b"a", b"bc"), (b"a", b"b"), (b"ab", b"c")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    model = Model(vocab=vocab, merges=merges, pattern=resolve_pattern("gpt2"))
    dump_folder(model, tmp_path)
    assert Tokenizer.load(tmp_path).encode("abc") == [257]
    listed = json.loads((tmp_path / "vocab.json").read_text())
    assert listed["abc"] == 257 and 259 not in listed.values()     # the smaller id, once
    os.remove(tmp_path / "model.json")
    assert Tokenizer.load(tmp_path).encode("abc") == [257]      # the GPT-2 files alone


# ==== GPT-2 vocab.json + merges.txt ============================================================


def gpt2_pair(tmp_path, n_vocab: int, n_merges: int):
    """The first ``n_vocab`` tokens of GPT-2's vocab.json and its first ``n_merges`` merges."""
    full = json.loads(open(fixture_path("gpt2_vocab.json"), encoding="utf-8").read())
    vocab = {k: v for k, v in full.items() if v < n_vocab}
    with open(fixture_path("gpt2_merges.txt"), encoding="utf-8") as f:
        merges = [next(f) for _ in range(n_merges)]
    d = tmp_path / "g"
    d.mkdir(exist_ok=True)
    (d / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (d / "merges.txt").write_text("#version: 0.2\n" + "".join(merges), encoding="utf-8")
    return d


def test_gpt2_files_that_belong_together_load(tmp_path):
    d = gpt2_pair(tmp_path, 1000, 1000 - 256)
    tok = Tokenizer.from_files(d / "vocab.json", d / "merges.txt")
    assert tok.decode(tok.encode("Hello, world")) == "Hello, world"
    vocab, merges = load_gpt2(fixture_path("gpt2_vocab.json"), fixture_path("gpt2_merges.txt"))
    assert len(vocab) == 50257 and len(merges) == 50000
    vocab, merges = load_gpt2(fixture_path("train-bpe-reference-vocab.json"),
                              fixture_path("train-bpe-reference-merges.txt"))
    assert len(vocab) == 500 and len(merges) == 243
    assert load_any(_as_folder(tmp_path, "train-bpe-reference")).special_tokens == [EOT]


def _as_folder(tmp_path, stem):
    d = tmp_path / stem
    d.mkdir()
    shutil.copy(fixture_path(f"{stem}-vocab.json"), d / "vocab.json")
    shutil.copy(fixture_path(f"{stem}-merges.txt"), d / "merges.txt")
    return d


def test_gpt2_vocab_longer_than_merges_is_refused(tmp_path, capsys):
    d = gpt2_pair(tmp_path, 1000, 300)
    with pytest.raises(ModelFormatError, match=r"vocab.json: token '.*' \(id \d+\) is built by no merge in .*"
                                               r"merges.txt: the two files do not belong together"):
        Tokenizer.from_files(d / "vocab.json", d / "merges.txt", [EOT])
    with pytest.raises(ModelFormatError, match="do not belong together"):
        Tokenizer.load(d)
    for name, (code, err) in run_tools(capsys, tmp_path, d).items():
        assert code == 2, name
        one_error_line(err, "vocab.json", "do not belong together")


def test_gpt2_merges_longer_than_vocab_is_refused(tmp_path):
    d = gpt2_pair(tmp_path, 300, 1000)
    with pytest.raises(ModelFormatError, match=r"merges.txt: line \d+: builds '.*', which is not in .*vocab.json"):
        Tokenizer.from_files(d / "vocab.json", d / "merges.txt")


def test_gpt2_merge_with_a_part_not_built_before(tmp_path):
    d = gpt2_pair(tmp_path, 1000, 1000 - 256)
    lines = (d / "merges.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    k = next(i for i, line in enumerate(lines) if line == "Ġ in\n")
    lines[k] = "Ġi n\n"
    (d / "merges.txt").write_text("".join(lines), encoding="utf-8")
    with pytest.raises(ModelFormatError, match=rf"merges.txt: line {k + 1}: 'Ġi' is neither a single byte nor "
                                               rf"built by an earlier merge"):
        load_gpt2(d / "vocab.json", d / "merges.txt")


@pytest.mark.parametrize("bad_id, message", [(10 ** 12, "id 1000000000000 of 'Ġthe' is out of range"),
                                             (-5, "id -5 of 'Ġthe' is out of range"),
                                             ("7", "id of 'Ġthe' must be an integer, got string"),
                                             (12, "id 12 is given to both")])
def test_gpt2_bad_ids(tmp_path, capsys, bad_id, message):
    d = gpt2_pair(tmp_path, 1000, 1000 - 256)
    vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    vocab["Ġthe"] = bad_id
    (d / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ModelFormatError, match=message):
        Tokenizer.from_files(d / "vocab.json", d / "merges.txt")
    for name, (code, err) in run_tools(capsys, tmp_path, d).items():
        assert code == 2, name
        one_error_line(err, "vocab.json", message)


def test_gpt2_merges_not_utf8_names_the_line(tmp_path, capsys):
    d = gpt2_pair(tmp_path, 1000, 1000 - 256)
    data = (d / "merges.txt").read_bytes().splitlines(keepends=True)
    data[5] = b"\xc2 x\n"
    (d / "merges.txt").write_bytes(b"".join(data))
    with pytest.raises(ModelFormatError, match=r"merges.txt: line 6: not UTF-8 \(byte 0xc2\)"):
        Tokenizer.load(d)
    code = export_cli.main([str(d), "--format", "hf", "--out", str(tmp_path / "t.json")])
    assert code == 2
    one_error_line(capsys.readouterr().err, "merges.txt: line 6: not UTF-8")


def test_gpt2_vocab_json_nesting_and_type(tmp_path):
    d = gpt2_pair(tmp_path, 1000, 1000 - 256)
    (d / "vocab.json").write_text("{\"a\":" * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ModelFormatError, match="vocab.json: .*nesting too deep"):
        Tokenizer.load(d)
    (d / "vocab.json").write_text("[1, 2]")
    with pytest.raises(ModelFormatError, match="vocab.json: expected a JSON object of token -> id, got list"):
        Tokenizer.from_files(d / "vocab.json", d / "merges.txt")


# ==== a folder is one model ====================================================================


def test_train_writes_model_json_last_with_checksums(tmp_path):
    import train_bpe

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(fixture_text("corpus.en").encode("utf-8")[:5000])
    assert train_bpe.main([str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "tok"), "--no-progress"]) == 0
    out = tmp_path / "tok"
    doc = json.loads((out / "model.json").read_text())
    assert set(doc["files"]) == {"vocab.json", "merges.txt"}
    # model.json is renamed after the GPT-2 files
    assert os.stat(out / "model.json").st_mtime_ns >= os.stat(out / "merges.txt").st_mtime_ns
    assert Tokenizer.load(out).n_vocab == 300


def test_interrupted_run_leaves_a_folder_the_loaders_refuse(folder, tmp_path, capsys):
    """A run killed after writing merges.txt but before model.json: new GPT-2 files, old model.json."""
    other = trained_model()
    other.merges = other.merges[:50]
    other.vocab = {i: b for i, b in other.vocab.items() if i < 257 + 50}
    dump_gpt2(other.vocab, other.merges, folder)
    with pytest.raises(ModelFormatError, match=r"tok/: vocab.json does not match model.json .*interrupted"):
        Tokenizer.load(folder)
    with pytest.raises(ModelFormatError, match="does not match model.json"):
        load_model(folder / "model.json")
    for name, (code, err) in run_tools(capsys, tmp_path, folder).items():
        assert code == 2, name
        one_error_line(err, "does not match model.json", "retrain")


def test_model_json_without_checksums_or_alone_still_loads(folder):
    ids = Tokenizer.load(folder).encode("the cat sat")
    edit_model(folder / "model.json", lambda d: d.pop("files"))     # written before checksums existed
    (folder / "merges.txt").write_text("#version: 0.2\n")
    assert Tokenizer.load(folder).encode("the cat sat") == ids
    edit_model(folder / "model.json", lambda d: d.update(files={"vocab.json": {"sha256": "0" * 64},
                                                                "merges.txt": {"sha256": "0" * 64}}))
    os.remove(folder / "vocab.json")
    os.remove(folder / "merges.txt")
    assert Tokenizer.load(folder).encode("the cat sat") == ids      # model.json alone is a whole model


# ==== exports ==================================================================================


def test_export_refuses_unknown_method_and_writes_nothing(tmp_path):
    model = trained_model()
    model.method = "wordpiece"
    for fmt in ("hf", "tiktoken", "gpt2"):
        with pytest.raises(ModelFormatError, match="model: field 'method' must be one of bpe, superbpe, supratok"):
            export(model, fmt, tmp_path / "out")
    assert not os.listdir(tmp_path)


def test_hf_export_is_loaded_back_before_it_is_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tokenizers")
    import bpe_core.export as ex

    real = ex.hf_tokenizer_json

    def broken(model):
        doc = real(model)
        doc["model"]["merges"].append("Ġnot_a_token x")
        return doc

    monkeypatch.setattr(ex, "hf_tokenizer_json", broken)
    with pytest.raises(ValueError, match=r"tokenizer.json: HF tokenizers cannot load the exported tokenizer.json "
                                         r"\(.*\); nothing was written"):
        export(trained_model(), "hf", tmp_path / "tokenizer.json")
    tok = tmp_path / "tok"
    tok.mkdir()
    dump_folder(trained_model(), tok)
    before = set(os.listdir(tmp_path))
    assert export_cli.main([str(tok), "--format", "hf", "--out", str(tmp_path / "tokenizer.json")]) == 2
    one_error_line(capsys.readouterr().err, "HF tokenizers cannot load")
    assert set(os.listdir(tmp_path)) == before


# ==== ids ======================================================================================


@pytest.mark.parametrize("bad", [[-1], [5, -1], np.array([-1]), np.array([3, -2], dtype=np.int32), [400], [10 ** 12]])
def test_decode_refuses_ids_out_of_range(bad):
    model = trained_model()
    tok = Tokenizer(model.vocab, model.merges, model.special_tokens)
    with pytest.raises(ValueError, match=r"unknown token id\(s\) \[-?\d+\] \(ids are 0\.\.399\)"):
        tok.decode_bytes(bad)
    with pytest.raises(ValueError, match="unknown token id"):
        tok.decode(bad)
    assert tok.decode_bytes(np.array([104, 105], dtype=np.int64)) == b"hi"


def test_decode_refuses_negative_ids_for_stage_aware_models(tmp_path):
    dump_model(trained_model("superbpe"), tmp_path / "model.json")
    with pytest.raises(ValueError, match=r"unknown token id\(s\) \[-1\]"):
        Tokenizer.load(tmp_path).decode_bytes([-1])


def test_tokenizer_refuses_huge_ids():
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[10 ** 12] = b"ab"
    with pytest.raises(ValueError, match="token id 1000000000000 is out of range"):
        Tokenizer(vocab, [(b"a", b"b")])


# ==== evaluate ==================================================================================


def test_evaluate_takes_a_gpt2_folder_and_words_the_comparison(tmp_path, capsys):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    shutil.copy(fixture_path("gpt2_vocab.json"), gpt2 / "vocab.json")
    shutil.copy(fixture_path("gpt2_merges.txt"), gpt2 / "merges.txt")
    # a model whose longest token is 1024 bytes of "a"
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    t = b"a"
    for _ in range(10):
        merges.append((t, t))
        t = t + t
        vocab[len(vocab)] = t
    small = tmp_path / "aaa"
    small.mkdir()
    dump_folder(Model(vocab=vocab, merges=merges, pattern=resolve_pattern("gpt2")), small)
    text = tmp_path / "t.txt"
    text.write_text("Hello there, the quick brown fox. " * 20, encoding="utf-8")
    code = evaluate_cli.main(["--tokenizer", str(gpt2), str(small), "--text", str(text), "--longest", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| gpt2 | t.txt |" in out
    assert "compared with gpt2:" in out
    assert "aaa on t.txt: " in out and "% more tokens" in out
    assert "'" + "a" * 40 + "'... (1024 bytes)" in out and "a" * 41 not in out


def test_evaluate_display_helpers():
    assert token_change(50, 100) == "50.0% fewer tokens"
    assert token_change(150, 100) == "50.0% more tokens"
    assert token_change(3, 0) == "3 tokens (the base has none)"
    assert show_token(b"\xff" * 50) == repr("\ufffd" * 40) + "... (50 bytes)"
    assert show_token(token_to_gpt2(b"x").encode()) == "'x'"


def test_evaluate_without_uuencode_scores_each_file_twice(tmp_path, capsys):
    """``--without-uuencode``: each file is also scored without its full uuencode lines (``M`` and 60
    characters of 0x21-0x60); a line one character short, or not starting with ``M``, stays text."""
    from bpe_core.evaluate import score, without_uuencode

    full = b"M" + bytes(range(0x21, 0x5D)) + b"\n"          # 'M' + 60 characters of the alphabet
    assert len(full) == 62
    short = b"M" + bytes(range(0x21, 0x5C)) + b"\n"          # 59 characters
    other = b"N" + bytes(range(0x21, 0x5D)) + b"\n"
    prose = b"The quick brown fox jumps over the lazy dog.\n" * 10
    data = prose + full * 3 + short + other + prose + full
    rest, lines, nbytes = without_uuencode(data)
    assert (lines, nbytes) == (4, 4 * 62)
    assert rest == prose + short + other + prose
    assert without_uuencode(prose + full[:-1]) == (prose, 1, 61)          # the last line, no newline
    text = tmp_path / "t.txt"
    text.write_bytes(data)
    vocab = {i: bytes([i]) for i in range(256)}
    tok = tmp_path / "tok"
    tok.mkdir()
    dump_folder(Model(vocab=vocab, merges=[], pattern=resolve_pattern("gpt2")), tok)
    shutil.copytree(tok, tmp_path / "other")
    code = evaluate_cli.main(["--tokenizer", str(tok), str(tmp_path / "other"), "--text", str(text),
                              "--without-uuencode", "--longest", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"| tok | t.txt | 1.000 | 1.000 | {len(data):,} |" in out
    assert f"| tok | t.txt w/o 4 uuencode lines | 1.000 | 1.000 | {len(rest):,} |" in out
    assert "other on t.txt: " in out and "other on t.txt w/o 4 uuencode lines: " in out
    model, encode = __import__("bpe_core.evaluate", fromlist=["load_encoder"]).load_encoder(str(tok))
    assert score("tok", model, encode, str(text), skip_uuencode=True).n_bytes == len(rest)
