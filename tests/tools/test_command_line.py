"""The installed command line and one vocabulary of options across its commands.

- ``bpe-core`` (``bpe_core.cli``): the console script of the package metadata, ``python -m bpe_core``,
  ``--version``, ``--help`` listing every command, each subcommand carrying every option of its
  tool (``tools/*.py`` are wrappers over the same modules);
- the same name for the same idea (``--chunk-size``; train keeps ``--chunk-bytes`` as a hidden
  alias), counts and sizes take units (``32k`` = 32,000 tokens, ``8G`` = 8 GiB), the same rule for a missing folder
  above an output in every command (an error naming it, nothing made), and a note when a requested
  parallelism exceeds the cores (``--cluster local:N`` as ``--workers N``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from paths import REPO, TOOLS, package_parent
from tool_runner import run_tool

import bpe_core
from bpe_core import cli
from bpe_core.runtime.cli import cluster_note, count

TEXT = ("the cat sat on the mat. the dog sat on the log.\n" * 40 + "<|endoftext|>"
        + "naïve café 123 4567 it's\n" * 10)


def _bpe_core(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``python -m bpe_core ARGS`` as its own process, with the bpe_core this test imports."""
    env = dict(os.environ if env is None else env, PYTHONPATH=package_parent())
    return subprocess.run([sys.executable, "-m", "bpe_core", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def _options(parser: argparse.ArgumentParser) -> dict:
    """Option string -> (dest, default, help) of every action of ``parser``."""
    return {s: (a.dest, repr(a.default), a.help) for a in parser._actions for s in a.option_strings}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A corpus and a tokenizer trained on it."""
    root = tmp_path_factory.mktemp("command_line")
    (root / "corpus.txt").write_text(TEXT, encoding="utf-8")
    r = run_tool(TOOLS / "train_bpe.py", root / "corpus.txt", "--vocab-size", 300, "--out", root / "tok",
                 "--no-progress")
    assert r.returncode == 0, r.stderr
    return root


# ==== bpe-core ===============================================================================


def test_the_console_script_is_in_the_package_metadata():
    """``pip install`` writes a ``bpe-core`` command calling ``bpe_core.cli:console``."""
    try:
        import tomllib
    except ImportError:                   # Python < 3.11
        pytest.skip("tomllib")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts == {"bpe-core": "bpe_core.cli:console"}
    module, _, name = scripts["bpe-core"].partition(":")
    assert callable(getattr(__import__(module, fromlist=[name]), name))


def test_python_m_bpe_core_help_version_and_a_bad_command(tmp_path):
    r = _bpe_core("--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("usage: bpe-core"), r.stderr
    for name in ("train", "encode", "export", "profile", "evaluate", "curate"):
        assert f"\n    {name} " in r.stdout, name
    r = _bpe_core("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"bpe-core {bpe_core.__version__}", (r.stdout, r.stderr)
    for args, words in ((["nope"], "invalid choice: 'nope'"), ([], "give a command")):
        r = _bpe_core(*args, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr
        assert lines[0].startswith("bpe-core: error: ")


def test_bpe_core_train_encode_export_run_from_another_folder(folder, tmp_path):
    """The subcommands run the tools' code, with ``bpe-core COMMAND`` in their messages."""
    r = _bpe_core("train", folder / "corpus.txt", "--vocab-size", "300", "--out", "tok", "--no-progress",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tok" / "merges.txt").read_bytes() == (folder / "tok" / "merges.txt").read_bytes()
    r = _bpe_core("encode", folder / "corpus.txt", "--tokenizer", "tok", "--out", "ids.npy", "--no-progress",
                  cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "ids.npy").exists(), r.stderr
    r = _bpe_core("export", "tok", "--format", "gpt2", "--out", "missing/g", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("bpe-core export: error: missing/g: folder "), r.stderr


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_subcommand_carries_every_option_of_its_tool(name):
    """``bpe-core NAME --help`` and ``tools/...`` show the same options, defaults and help texts."""
    sub = cli.build_parser()._subparsers._group_actions[0].choices[name]
    module = __import__(f"bpe_core.cli.{name}", fromlist=["build_parser"])
    assert _options(sub) == _options(module.build_parser())
    assert sub.prog == f"bpe-core {name}" and sub.description == module.build_parser().description


def test_the_wrappers_are_the_package_s_commands():
    """``tools/train_bpe.py`` imported is ``bpe_core.cli.train``'s main (one code, two ways in)."""
    import bpe_core.cli.train

    sys.path.insert(0, str(TOOLS))
    try:
        import train_bpe
    finally:
        sys.path.remove(str(TOOLS))
    assert train_bpe.main is bpe_core.cli.train.main and train_bpe.build_parser is bpe_core.cli.train.build_parser


# ==== one vocabulary ==========================================================================


def test_chunk_size_is_the_name_and_chunk_bytes_a_hidden_alias():
    from bpe_core.cli import encode, train

    for flag in ("--chunk-size", "--chunk-bytes"):
        assert train.build_parser().parse_args(["c.txt", flag, "64K"]).chunk_bytes == 64 << 10, flag
    assert encode.build_parser().parse_args(["c.txt", "--tokenizer", "t", "--out", "o.npy", "--chunk-size",
                                             "64K"]).chunk_size == 64 << 10
    shown = train.build_parser().format_help()
    assert "--chunk-size SIZE" in shown and "--chunk-bytes" not in shown


def test_counts_take_the_units_sizes_take():
    from bpe_core.cli import evaluate, train

    assert [count(x) for x in ("300", "32k", "32K", "1M", "32Ki", "1Mi", "1.5k")] == [
        300, 32000, 32000, 10 ** 6, 32768, 1 << 20, 1500]
    for bad in ("32KB", "x", "-5", "1.5.2", "1.0005k", "5i", "2T"):
        with pytest.raises(argparse.ArgumentTypeError, match="invalid count"):
            count(bad)
    assert train.build_parser().parse_args(["--vocab-size", "32k"]).vocab_size == 32000
    assert evaluate.build_parser().parse_args(["--text", "t", "--vocab-size", "8Ki"]).vocab_size == 8192


def test_vocab_size_with_a_unit_trains_that_size(folder, tmp_path):
    r = run_tool(TOOLS / "train_bpe.py", folder / "corpus.txt", "--vocab-size", "1k", "--out", tmp_path / "k",
                 "--no-progress")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "k" / "train_report.json").read_text(encoding="utf-8"))
    assert report["merges_requested"] == 1000 - 257
    r = run_tool(TOOLS / "train_bpe.py", folder / "corpus.txt", "--vocab-size", "1KB", "--out", tmp_path / "b")
    assert r.returncode == 2 and r.stderr.strip() == ("train_bpe.py: error: argument --vocab-size: invalid count "
                                                      "'1KB' (examples: 32000, 32k, 32Ki) (see --help)"), r.stderr


def _outputs(folder, missing):
    """(tool, args) writing one output below the folder ``missing`` (which does not exist)."""
    corpus, tok = folder / "corpus.txt", folder / "tok"
    return [
        ("train_bpe.py", [corpus, "--vocab-size", "300", "--out", missing / "tok"]),
        ("train_bpe.py", [corpus, "--vocab-size", "300", "--out", folder / "t2", "--profile-memory", missing / "p"]),
        ("encode_corpus.py", [corpus, "--tokenizer", tok, "--out", missing / "ids.npy"]),
        ("encode_corpus.py", [corpus, "--tokenizer", tok, "--out", folder / "i.npy", "--report", missing / "r.json"]),
        ("export_tokenizer.py", [tok, "--format", "hf", "--out", missing / "tokenizer.json"]),
        ("export_tokenizer.py", [tok, "--format", "gpt2", "--out", missing / "gpt2"]),
        ("profile_memory.py", ["--out", missing / "run", "--", sys.executable, "-c", "pass"]),
        ("evaluate.py", ["--tokenizer", tok, "--text", corpus, "--json", missing / "s.json"]),
        ("curate.py", [corpus, "--out", missing / "kept.txt"]),
    ]


@pytest.mark.parametrize("case", range(9))
def test_a_missing_folder_above_an_output_is_an_error_in_every_command(folder, tmp_path, case):
    """One rule: the folder an output goes into must exist (an output folder itself is made). A
    missing one is one line naming it, exit 2, and nothing is made."""
    missing = tmp_path / "no" / "such"
    name, args = _outputs(folder, missing)[case]
    r = run_tool(TOOLS / name, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"folder {missing} does not exist" in lines[0], lines[0]
    assert not (tmp_path / "no").exists()


def test_a_cluster_larger_than_the_cores_gets_a_note(folder, tmp_path):
    cores = os.cpu_count() or 1
    assert cluster_note(f"local:{cores}") is None and cluster_note("local") is None
    r = run_tool(TOOLS / "train_bpe.py", folder / "corpus.txt", "--vocab-size", "300", "--plan",
                 "--cluster", f"local:{cores + 2}")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == (f"train_bpe.py: note: local:{cores + 2} starts {cores + 2} worker processes, "
                                f"{cores} cores: they share the cores (the results are the same)")
    r = run_tool(TOOLS / "encode_corpus.py", folder / "corpus.txt", "--tokenizer", folder / "tok", "--out",
                 tmp_path / "i.npy", "--plan", "--cluster", f"local:{cores + 2}")
    assert r.returncode == 0 and f"note: local:{cores + 2} starts" in r.stderr, r.stderr


def test_bpe_core_train_profile_memory_reruns_the_same_command(folder, tmp_path):
    """``--profile-memory`` reruns the command under the profiler (``_start.rerun``): the same
    package, the default budget drawn (a budgeted command), the messages of ``bpe-core train``."""
    r = _bpe_core("train", folder / "corpus.txt", "--vocab-size", "300", "--out", "tok", "--no-progress",
                  "--profile-memory", "prof", "--workers", "64", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "prof.json").read_text(encoding="utf-8"))
    assert report["exit_code"] == 0 and report["budget_source"] == "default"
    assert (tmp_path / "tok" / "merges.txt").read_bytes() == (folder / "tok" / "merges.txt").read_bytes()
    assert "bpe-core train: note: 64 workers asked for" in r.stderr, r.stderr


def test_profile_speaks_as_the_command_it_was_run_as(tmp_path):
    """``bpe-core profile`` names itself so in its lines; ``tools/profile_memory.py`` keeps its name."""
    r = _bpe_core("profile", "--no-plot", "--out", tmp_path / "p", "--", sys.executable, "-c", "pass", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr.startswith("bpe-core profile: peak RSS"), r.stderr
    r = run_tool(TOOLS / "profile_memory.py", "--no-plot", "--out", tmp_path / "q", "--", sys.executable, "-c", "pass")
    assert r.returncode == 0 and r.stderr.startswith("profile_memory: peak RSS"), r.stderr


def test_shard_tokens_is_a_count():
    from bpe_core.cli import encode

    def shard(text):
        return encode.build_parser().parse_args(["c.txt", "--tokenizer", "t", "--out", "o.npy",
                                                 "--shard-tokens", text]).shard_tokens

    assert [shard(x) for x in ("9000", "100M", "1G", "64Ki")] == [9000, 10 ** 8, 10 ** 9, 65536]
    for bad in ("0", "1e9", "2GB"):
        with pytest.raises(SystemExit):
            shard(bad)
