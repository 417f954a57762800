"""SupraTok's exports are honest (issue 29): hf and tiktoken are refused in one line naming the exact
format, no export holds a token twice, pass 3 spends no id on bytes another id holds (chains share
their common merges), the same merges for 1 and 2 workers; every phase shows progress and is named in
the summary line and the report."""
import json
import os
import random
import sys
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core.export import check_exportable, duplicate_tokens, export
from bpe_core.formats.model import Model, dump_model, load_any

from paths import TOOLS
from strategies import SPECIAL

sys.path.insert(0, str(TOOLS))
import export_tokenizer as export_cli  # noqa: E402

#: Phrases whose documents made the old trainer give two ids to one string: " \n\n" (a pass-1 pair
#: met again across pretokens in pass 2) and " the point" / " the end" (two pass-3 spans of one round
#: starting with the same two words).
PHRASES = [" the point of", " the point is", " the end of", " the end is", ". \n\n", "\n", " New York",
           " New York City", " it was", " a lot of", "  ", " of the", " in the house", " she said"]


def corpus(seed: int, n_docs: int = 40) -> bytes:
    r = random.Random(seed)
    return SPECIAL.join("".join(r.choice(PHRASES) for _ in range(r.randint(3, 15)))
                        for _ in range(n_docs)).encode()


def train_bytes(data: bytes, vocab_size: int, **options):
    # the paper's passes (seed-only pass 2, pass 3 on): the default runs no pass 3, whose repeats and
    # phases these tests are about (the default's own tests: test_supratok_grid.py)
    opts = dict(seed_min_count=3, seed_pmi=0.5, span_min_count=2, span_pmi=1.0, heldout_fraction=0.3,
                num_workers=1, transition=290, pass2_cross="seeds", supratok_rounds=2)
    opts.update(options)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.txt")
        with open(path, "wb") as f:
            f.write(data)
        return bpe_core.train(bpe_core.TrainConfig(path, vocab_size, method="supratok", **opts))


def pass3_repeats(result) -> list[tuple[bytes, list[int]]]:
    """Bytes a pass-3 merge builds that an earlier id holds. (Passes 1 and 2 may build bytes twice,
    as BPE does: pass 2 meets pass-1 pairs across pretokens, "\\n" + "\\n" of "\\n\\nI", or builds
    "abc" from (ab, c) after (a, bc), and the stage-aware encoder needs those merges there; their
    ids are never emitted and every export lists the bytes once.)"""
    model = result.model
    n12 = sum(int(st["merges"]) for st in model.stages[:2])
    base = 256 + len(model.special_tokens)
    first: dict[bytes, int] = {}
    bad = []
    for k, (a, b) in enumerate(model.merges):
        assert model.vocab[base + k] == a + b
        j = first.setdefault(a + b, base + k)
        if k >= n12 and j != base + k:
            bad.append((a + b, [j, base + k]))
    return bad


# ==== training: pass 3 spends no id on bytes another id holds =======================================


@pytest.mark.parametrize("seed_min_count", [3, 10 ** 6])      # with seeds, and pass 3 alone
def test_no_token_bytes_twice(seed_min_count):
    # the old trainer: " the point", " the end" twice at seeds 1-5 (two pass-3 spans of one round that
    # start with the same two words added the same merge twice)
    for seed in range(1, 6):
        result = train_bytes(corpus(seed), 330, seed_min_count=seed_min_count)
        assert pass3_repeats(result) == [], seed
        assert len(result.vocab) == 256 + 1 + len(result.merges)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from([3, 10 ** 6]))
def test_no_token_bytes_twice_property(seed, seed_min_count):
    result = train_bytes(corpus(seed, 30), 330, seed_min_count=seed_min_count)
    assert pass3_repeats(result) == []


def test_same_merges_for_one_and_two_workers():
    data = corpus(3, 60)
    one = train_bytes(data, 330, seed_min_count=10 ** 6)
    two = train_bytes(data, 330, seed_min_count=10 ** 6, num_workers=2, chunk_bytes=256)
    assert one.merges == two.merges and one.model.stages == two.model.stages
    assert one.report["supratok"]["pass3_spans"] > 0


# ==== exports =====================================================================================


@pytest.fixture(scope="module")
def supratok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("supratok") / "tok"
    train_bytes(corpus(1), 330, seed_min_count=10 ** 6).save(str(d))
    return d


@pytest.mark.parametrize("fmt", ["hf", "tiktoken"])
def test_inexact_formats_are_refused_in_one_line(supratok_dir, tmp_path, capsys, fmt):
    out = tmp_path / "out"
    rc = export_cli.main([str(supratok_dir), "--format", fmt, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(supratok_dir) in err and "--format transformers" in err
    assert not os.path.exists(out) and not os.path.exists(str(out) + ".json")
    with pytest.raises(ValueError, match="--format transformers"):
        export(load_any(str(supratok_dir)), fmt, str(out))
    assert not os.path.exists(out)


def test_gpt2_export_is_refused_where_inexact_and_written_with_a_note_when_allowed(supratok_dir, tmp_path, capsys):
    # checked on the training input (or the built-in check text): other ids than bpe_core
    rc = export_cli.main([str(supratok_dir), "--format", "gpt2", "--out", str(tmp_path / "g")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "other ids than bpe_core" in err
    assert "--format transformers" in err and not os.path.exists(tmp_path / "g")
    rc = export_cli.main([str(supratok_dir), "--format", "gpt2", "--out", str(tmp_path / "g"), "--allow-inexact"])
    err = capsys.readouterr().err
    assert rc == 0 and "SupraTok" in err and "--format transformers" in err and "% identical" in err
    with open(tmp_path / "g" / "vocab.json", encoding="utf-8") as f:
        ids = json.load(f)
    assert len(set(ids.values())) == len(ids)          # each string once, each id once


def test_training_folder_has_no_tokenizer_json(supratok_dir):
    # HF's tokenizer.json is written beside model.json only for a method HF encodes exactly; a
    # SupraTok folder loads through the remote-code class instead (tests/formats/test_loaders.py)
    names = set(os.listdir(supratok_dir))
    assert "model.json" in names and "tokenizer.json" not in names
    config = json.loads((supratok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "BpeCoreTokenizer" and "tokenization_bpe_core.py" in names


def _model_with_repeats() -> Model:
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"<|endoftext|>"
    merges = [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c"), (b"a", b"bc")]    # "abc" twice (ids 259, 260)
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return Model(vocab=vocab, merges=merges, special_tokens=["<|endoftext|>"])


def test_tiktoken_export_with_repeated_bytes_is_refused(tmp_path):
    model = _model_with_repeats()
    assert duplicate_tokens(model) == [(b"abc", [259, 260])]
    with pytest.raises(ValueError, match=r"tok\.tiktoken: 1 token\(s\) are held by two ids"):
        export(model, "tiktoken", str(tmp_path / "tok.tiktoken"))
    assert os.listdir(tmp_path) == []
    dump_model(model, tmp_path / "model.json")
    rc = export_cli.main([str(tmp_path), "--format", "tiktoken", "--out", str(tmp_path / "t.tiktoken")])
    assert rc == 2 and not os.path.exists(tmp_path / "t.tiktoken")


@settings(max_examples=6, deadline=None)
@given(st.lists(st.sampled_from(["the cat", " sat", " on", " the mat", "\n", " 12", ".", " the", "  "]),
                min_size=5, max_size=60).map("".join))
def test_bpe_tiktoken_export_loads_with_explicit_n_vocab(text):
    """Every export that is written lists each token once with ids 0..n-1 (tiktoken's check)."""
    pytest.importorskip("tiktoken")
    import tiktoken.load
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write((text + SPECIAL) * 5)
        model = bpe_core.train(bpe_core.TrainConfig(path, 300, num_workers=1)).model
        try:
            check_exportable(model, "tiktoken", path)
        except ValueError:
            assert duplicate_tokens(model)
            return
        ranks_path = os.path.join(d, "t.tiktoken")
        export(model, "tiktoken", ranks_path)
        meta = json.load(open(ranks_path + ".json", encoding="utf-8"))
        ranks = tiktoken.load.load_tiktoken_bpe(ranks_path)
        assert len(set(ranks)) == len(ranks) and len(set(ranks.values())) == len(ranks)
        tiktoken.Encoding("t", pat_str=meta["pat_str"], mergeable_ranks=ranks,
                          special_tokens=meta["special_tokens"], explicit_n_vocab=meta["explicit_n_vocab"])


# ==== progress, summary line, report ==============================================================


SUPRATOK_BARS = ["supratok documents", "pass 1 merges", "supratok statistics", "pass 2 merges", "pass 3 spans",
                 "supratok final count"]


def test_every_phase_reports_progress_and_time(capsys):
    result = train_bytes(corpus(2), 330, seed_min_count=10 ** 6, progress="json")
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    finals = {x["task"]: x for x in lines if x["final"]}
    for task in SUPRATOK_BARS:
        assert task in finals, task
        assert 0 < finals[task]["done"] <= finals[task]["total"], finals[task]
    for task in ("supratok documents", "supratok statistics", "pass 3 spans", "supratok final count"):
        # (the merges may stop early: no pair left)
        assert finals[task]["done"] == finals[task]["total"], finals[task]
    secs = result.report["seconds"]
    phases = result.report["summary_phases"]
    assert [k for _, k in phases] == ["pretokenize", "supratok_documents", "pass1", "supratok_statistics", "pass2",
                                      "pass3", "supratok_final_count"]
    assert all(k in secs for _, k in phases)


def test_summary_line_names_every_phase(tmp_path, capsys):
    import train_bpe
    path = tmp_path / "c.txt"
    path.write_bytes(corpus(2))
    rc = train_bpe.main([str(path), "--method", "supratok", "--vocab-size", "330", "--transition", "290",
                         "--seed-min-count", "3", "--seed-pmi", "0.5", "--span-min-count", "2", "--span-pmi", "1.0",
                         "--heldout-fraction", "0.3", "--workers", "1", "--out", str(tmp_path / "tok"),
                         "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    summary = next(x for x in out.splitlines() if x.startswith("trained "))
    for label in ("pre-tokenize", "documents", "pass 1", "statistics", "pass 2", "pass 3", "final count"):
        assert f"{label} " in summary, summary
