"""tools/train_bpe.py: help, a real run, the files it writes, and every bad input."""
from paths import REPO
import json
import os
import subprocess
import sys
import pathlib

import pytest

from bpe_core import reference
from bpe_core.formats.model import load_gpt2, load_model
from tool_runner import run_tool

ROOT = REPO
sys.path.insert(0, str(ROOT / "tools"))
import train_bpe as cli  # noqa: E402

TEXT = ("the cat sat on the mat. the dog sat on the log.\n" * 20 + "<|endoftext|>"
        + "naïve café — 東京 and \xff ok. 123 4567 it's I'M\n" * 10)


@pytest.fixture
def corpus_file(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_bytes(TEXT.encode("utf-8", "surrogateescape").replace(b"\xc3\xbf", b"\xff"))
    return p


def run_cli(*args):
    """``python tools/train_bpe.py ARGS`` as its own process (forked by ``tool_runner``)."""
    return run_tool(ROOT / "tools" / "train_bpe.py", *args)


def test_help_explains_every_option():
    r = run_cli("--help")
    assert r.returncode == 0
    for flag in ["--vocab-size", "--out", "--special-token", "--no-special-tokens", "--pattern", "--workers",
                 "--memory-limit", "--chunk-size", "--no-progress"]:
        assert flag in r.stdout


def test_run_writes_all_files(corpus_file, tmp_path):
    out = tmp_path / "tok"
    r = run_cli(corpus_file, "--vocab-size", 300, "--out", out, "--workers", 2)
    assert r.returncode == 0, r.stderr
    assert "trained" in r.stdout and "merges" in r.stdout
    for name in ["model.json", "vocab.json", "merges.txt", "train_report.json"]:
        assert (out / name).is_file()
    assert not [p for p in os.listdir(out) if ".tmp-" in p]
    model = load_model(out)
    data = corpus_file.read_bytes()
    ref_vocab, ref_merges = reference.train_bpe_from_bytes(data, 300, ["<|endoftext|>"])
    assert model.merges == ref_merges and model.vocab == ref_vocab
    vocab, merges = load_gpt2(out / "vocab.json", out / "merges.txt")
    assert merges == ref_merges and vocab == ref_vocab
    report = json.loads((out / "train_report.json").read_text())
    for key in ["input_bytes", "documents", "unique_pretokens", "merges", "seconds", "peak_rss_bytes"]:
        assert key in report
    assert report["input_bytes"] == len(data) and report["documents"] == 2
    assert set(report["seconds"]) >= {"pretokenize", "merge_loop", "total"}


def test_hf_tokenizers_loads_our_files(corpus_file, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    out = tmp_path / "tok"
    assert cli.main([str(corpus_file), "--vocab-size", "320", "--out", str(out), "--no-progress"]) == 0
    model = load_model(out)
    tok = Tokenizer(models.BPE.from_file(str(out / "vocab.json"), str(out / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(model.pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    sample = "the cat sat on the log. naïve 東京 it's 12345 I'M  spaced\n\nout"
    expected = reference.encode(sample, model.vocab, model.merges, [], model.pattern)
    assert tok.encode(sample).ids == expected


def test_short_corpus_warns(tmp_path):
    p = tmp_path / "tiny.txt"
    p.write_bytes(b"abab")
    r = run_cli(p, "--vocab-size", 1000, "--out", tmp_path / "o", "--no-special-tokens", "--no-progress")
    assert r.returncode == 0
    assert "only 2 merges" in r.stderr


def test_default_input_runs(tmp_path):
    r = run_cli("--vocab-size", 300, "--out", tmp_path / "o", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "trained 43 merges" in r.stdout


@pytest.mark.parametrize("case", ["missing", "directory", "small_vocab", "empty_special", "out_is_file",
                                  "out_under_file", "bad_pattern", "bad_size"])
def test_bad_input_one_line_exit_2(case, corpus_file, tmp_path):
    out = tmp_path / "out"
    args = [corpus_file, "--vocab-size", 300, "--out", out]
    if case == "missing":
        args[0] = tmp_path / "nope.txt"
    elif case == "directory":          # a folder is read as its files: one with none is refused
        args[0] = tmp_path / "empty"
        args[0].mkdir()
    elif case == "small_vocab":
        args[2] = 256
    elif case == "empty_special":
        args += ["--special-token", ""]
    elif case == "out_is_file":
        args[4] = corpus_file
    elif case == "out_under_file":
        args[4] = corpus_file / "sub"
    elif case == "bad_pattern":
        args += ["--pattern", "("]
    elif case == "bad_size":
        args += ["--memory-limit", "lots"]
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    if case in ("missing", "directory"):
        assert str(args[0]) in lines[0]
    if out.exists():
        assert os.listdir(out) == []


def test_plan_prints_the_memory_plan_and_writes_nothing(corpus_file, tmp_path):
    out = tmp_path / "o"
    r = run_cli(corpus_file, "--vocab-size", 300, "--out", out, "--plan", "--memory-limit", "2G")
    assert r.returncode == 0, r.stderr
    assert "memory plan" in r.stdout and "budget 2.0 GiB" in r.stdout
    assert not out.exists()


def test_a_budget_that_cannot_fit_says_which_one_would(corpus_file, tmp_path):
    r = run_cli(corpus_file, "--vocab-size", 300, "--out", tmp_path / "o", "--memory-limit", "1M")
    assert r.returncode == 2
    assert "--memory-limit" in r.stderr and "Traceback" not in r.stderr


def test_bench_train_names_a_tool_it_cannot_run_instead_of_an_empty_table(corpus_file, tmp_path):
    """``benchmarks/bench_train.py``: a mistyped tool, or a bpe_core that does not import (a Python without
    the package), is one line naming the problem (exit 2), not an empty table or a traceback."""
    bench = [str(ROOT / "benchmarks" / "bench_train.py"), str(corpus_file), "--repeats", "1"]
    r = subprocess.run([sys.executable, *bench, "--tools", "bpe_core,rustbp"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown tool rustbp" in r.stderr and "Traceback" not in r.stderr
    # bpe_core not importable (as under a Python without its dependencies): a numpy that fails to import
    stub = tmp_path / "stub"
    (stub / "numpy").mkdir(parents=True)
    (stub / "numpy" / "__init__.py").write_text("raise ImportError('No module named numpy (stub)')\n")
    env = dict(os.environ, PYTHONPATH=str(stub))
    r = subprocess.run([sys.executable, *bench, "--tools", "bpe_core"], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "bpe_core cannot run" in r.stderr and "Traceback" not in r.stderr and "| vocab |" not in r.stdout


@pytest.mark.parametrize("tool", ["train_bpe.py", "encode_corpus.py"])
def test_a_ctrl_c_while_the_options_are_read_is_one_line(tool, corpus_file, tmp_path):
    """SIGINT while argparse reads the options (after the imports, before the run): the tool's
    one-line exit 130, not a KeyboardInterrupt traceback (the handler was handed back to Python
    before the options were read; a robustness test hit it at random on a loaded machine). The
    signal is sent from inside ``parse_args``, so the moment is exact."""
    script = (
        "import argparse, os, runpy, signal, sys\n"
        "parse = argparse.ArgumentParser.parse_args\n"
        "def interrupted(self, *a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return parse(self, *a, **k)\n"
        "argparse.ArgumentParser.parse_args = interrupted\n"
        f"sys.argv = [{str(ROOT / 'tools' / tool)!r}, {str(corpus_file)!r}, '--out', {str(tmp_path / 'o')!r}]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    # (from another folder: ``-c`` puts the current one first on sys.path, and CI's clone root holds
    # the unbuilt source package)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 130, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and len([x for x in r.stderr.splitlines() if x.strip()]) == 1, r.stderr


@pytest.mark.parametrize("tool", ["train_bpe.py", "encode_corpus.py"])
def test_a_sigterm_while_the_package_loads_is_one_line(tool, corpus_file, tmp_path):
    """SIGTERM while bpe_core's modules load, at the worst moment the robustness test found at random:
    inside a dataclass's making (``Field.__set_name__``), where Python 3.11 wraps any exception in
    "RuntimeError: Error calling __set_name__". The tool's one line and exit 143, no traceback."""
    script = (
        "import dataclasses, os, runpy, signal, sys\n"
        "made = dataclasses.Field.__set_name__\n"
        "def set_name(self, owner, name):\n"
        "    if owner.__module__.startswith('bpe_core') and not getattr(sys, '_sent', False):\n"
        "        sys._sent = True\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return made(self, owner, name)\n"
        "dataclasses.Field.__set_name__ = set_name\n"
        f"sys.argv = [{str(ROOT / 'tools' / tool)!r}, {str(corpus_file)!r}, '--out', {str(tmp_path / 'o')!r}]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 143, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and len([x for x in r.stderr.splitlines() if x.strip()]) == 1, r.stderr
    assert not (tmp_path / "o").exists()
