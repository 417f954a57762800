"""A newcomer's first hour (issue 30): saving what training returns, messages that point the right
way, and reports without holes."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import bpe_core
from bpe_core.errors import CorpusError, ModelFormatError
from bpe_core.runtime import cli
from bpe_core.runtime.budget import default_memory_limit
from bpe_core.runtime.memmon import PHASE_FILE_ENV, phase, read_phase_file
from bpe_core.runtime.profile import build_report, profile_command
from bpe_core.runtime.progress import make_progress
from paths import REPO
from tool_runner import run_tool

ROOT = REPO
SAMPLE = ROOT / "bpe_core" / "data" / "sample.txt"
TRAIN = ROOT / "tools" / "train_bpe.py"
MODEL_FILES = ("vocab.json", "merges.txt", "model.json")


def _tool(script, *args, **kwargs):
    """``python SCRIPT ARGS`` as its own process (forked by ``tool_runner``: no start-up cost)."""
    return run_tool(script, *args, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    shutil.copyfile(SAMPLE, path)
    return path


# ==== Set up ================================================================================


def _setup_commands() -> list[str]:
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Set up", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)]


def test_readme_setup_is_two_commands_and_ci_runs_the_second():
    """A newcomer copies two commands: a venv + install + the main job, then the tests; CI runs the
    second exactly."""
    first, second = _setup_commands()
    assert first.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install . && ")
    assert "bpe-core train " in first and "\n" not in first and "\n" not in second
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == second
    assert 'pip install ".[test]"' in second and second.endswith("pytest")


def test_readme_outputs_are_ignored_by_git():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = ["tokenizer/", "tok/", "ids.npy", "tokenizer.json", ".venv/", "build/"]
    r = subprocess.run(["git", "check-ignore", "--no-index", *names], cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.split() == names


# ==== Save and load what training returns ===================================================


def test_train_result_save_writes_the_cli_folder(corpus, tmp_path):
    """``TrainResult.save(dir)`` writes the files ``train_bpe.py --out`` writes, byte for byte (the
    report aside: its timings differ), and every loader reads them back."""
    r = _tool(TRAIN, corpus, "--vocab-size", 400, "--out", tmp_path / "cli", "--progress", "none",
              "--workers", 1, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = bpe_core.train(bpe_core.TrainConfig(str(corpus), 400, num_workers=1, progress="none"))
    assert result.save(tmp_path / "api" / "tok") == str(tmp_path / "api" / "tok")   # parents created
    for name in MODEL_FILES:
        assert (tmp_path / "api" / "tok" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    report = json.loads((tmp_path / "api" / "tok" / "train_report.json").read_text())
    assert report["merges"] == result.report["merges"] == 400 - 257
    assert bpe_core.load(tmp_path / "api" / "tok").merges == result.merges
    tok = bpe_core.Tokenizer.from_pretrained(tmp_path / "api" / "tok")
    assert tok.merges == result.merges and tok.decode(tok.encode("Hello world")) == "Hello world"


def test_tokenizer_save_round_trips(corpus, tmp_path):
    result = bpe_core.train(bpe_core.TrainConfig(str(corpus), 300, num_workers=1, progress="none"))
    result.save(tmp_path / "a")
    tok = bpe_core.Tokenizer.load(tmp_path / "a")
    tok.save(tmp_path / "b")
    for name in MODEL_FILES:          # what was read is written back as it was (method, metadata)
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
    # A tokenizer built by hand in the trained layout (bytes, specials, merges) saves too.
    vocab = {i: bytes([i]) for i in range(256)}
    vocab.update({256: b"<|endoftext|>", 257: b"ab"})
    handmade = bpe_core.Tokenizer(vocab, [(b"a", b"b")], ["<|endoftext|>"])
    again = bpe_core.Tokenizer.from_pretrained(handmade.save(tmp_path / "c"))
    assert again.encode("xabab<|endoftext|>") == handmade.encode("xabab<|endoftext|>") == [120, 257, 257, 256]


def test_tokenizer_save_refuses_ids_a_model_file_cannot_hold(tmp_path):
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"ab"                # the special token is appended after the merge: id 257
    tok = bpe_core.Tokenizer(vocab, [(b"a", b"b")], ["<|endoftext|>"])
    with pytest.raises(ModelFormatError, match="model.json: cannot hold these ids: .* then the special tokens"):
        tok.save(tmp_path / "tok")
    assert not (tmp_path / "tok").exists()


# ==== Messages ==============================================================================


def test_empty_corpus_is_an_error_naming_the_file(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    r = _tool(TRAIN, "empty.txt", "--vocab-size", 300, "--out", "tok", "--progress", "none", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["train_bpe.py: error: empty.txt: no text to train on (the input is empty)"]
    assert not (tmp_path / "tok").exists()


def test_dev_stdin_points_to_dash(tmp_path):
    r = subprocess.run([sys.executable, str(TRAIN), "/dev/stdin", "--vocab-size", "300", "--out", "tok"],
                       input="hello world\n", capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "train_bpe.py: error: /dev/stdin: is not a regular file (a FIFO); to read standard input, give - "
        "instead of /dev/stdin"]
    # and - does read it
    r = subprocess.run([sys.executable, str(TRAIN), "-", "--vocab-size", "260", "--out", "tok",
                        "--progress", "none"], input=SAMPLE.read_text(encoding="utf-8"), capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_other_fifo_still_says_save_it(tmp_path):
    from bpe_core.corpus.files import check_input

    os.mkfifo(tmp_path / "f")
    with pytest.raises(CorpusError, match=r"\(a FIFO\); save it to a file first$"):
        check_input(tmp_path / "f")


def test_unwritable_out_names_the_parent(tmp_path, monkeypatch):
    """``--out imm/tok/`` where ``imm`` cannot be written: the line names ``imm``."""
    (tmp_path / "imm").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "probe_writable", lambda folder: PermissionError(13, "Permission denied", folder))
    with pytest.raises(cli.CliError) as info:
        cli.check_out_dir("imm/tok/")
    assert str(info.value) == "imm: cannot create the output folder imm/tok/ in it (Permission denied)"


def test_unwritable_out_names_the_parent_for_real(tmp_path):
    (tmp_path / "imm").mkdir(mode=0o555)
    parent, out = "imm", "imm/tok/"
    if os.geteuid() == 0:               # root writes into a 0555 folder; not into /sys
        parent, out = "/sys", "/sys/bpe_core_first_hour/"
        if os.path.exists(out):
            pytest.skip(f"{out} exists")
    r = _tool(TRAIN, SAMPLE, "--vocab-size", 300, "--out", out, cwd=tmp_path)
    (tmp_path / "imm").chmod(0o755)
    assert r.returncode == 2
    assert r.stderr.strip().startswith(f"train_bpe.py: error: {parent}: cannot create the output folder {out} in it (")
    assert len(r.stderr.strip().splitlines()) == 1


def test_superbpe_transformers_export_has_no_caveat(corpus, tmp_path):
    """The transformers export runs bpe_core's stage-aware encoder: exact, nothing to note (the note
    was an empty clause and said ids could differ)."""
    from bpe_core.export import export_caveats

    result = bpe_core.train(bpe_core.TrainConfig(str(corpus), 400, method="superbpe", transition=0.5,
                                                 num_workers=1, progress="none"))
    assert export_caveats(result.model, "transformers") == []
    for fmt in ("hf", "tiktoken", "gpt2"):
        (note,) = export_caveats(result.model, fmt)
        assert "SuperBPE model: " in note and ": ;" not in note
    # a stage-aware tokenizer saves its model as read
    tok = bpe_core.Tokenizer.from_pretrained(result.save(tmp_path / "a"))
    assert type(tok).__name__ == "StageAwareTokenizer"
    tok.save(tmp_path / "b")
    for name in MODEL_FILES:
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name


# ==== Reports and progress ==================================================================


def test_phase_marks_carry_the_rss(tmp_path, monkeypatch):
    monkeypatch.setenv(PHASE_FILE_ENV, str(tmp_path / "phases"))
    phase("a")
    phase("b")
    marks = read_phase_file(str(tmp_path / "phases"), with_rss=True)
    assert [m[1] for m in marks] == ["a", "b"] and all(m[2] > 0 for m in marks)
    assert read_phase_file(str(tmp_path / "phases")) == [m[:2] for m in marks]


def test_short_phase_has_a_peak_and_the_default_budget_shows(tmp_path):
    """A phase far shorter than the sampling interval still gets a peak (the RSS at its ends), and a
    tool run without --memory-limit shows the default budget it plans with."""
    script = tmp_path / "phases.py"         # a file, not -c: the clone's root is not on its path
    script.write_text("import time\nfrom bpe_core.runtime.memmon import phase\n"
                      "phase('start'); phase('merge counts'); phase('write'); time.sleep(0.3)\n")
    r = profile_command([sys.executable, str(script), "train_bpe.py"], str(tmp_path / "p"), interval=30,
                        plot=False, quiet=True)
    data = json.loads((tmp_path / "p.json").read_text())
    assert r.exit_code == 0
    peaks = {p["name"]: p["peak_rss_bytes"] for p in data["phases"]}
    assert peaks["merge counts"] > 0 and all(v > 0 for v in peaks.values()), peaks
    assert data["peak_rss_bytes"] >= max(peaks.values())
    assert data["budget_source"] == "default"
    assert abs(data["budget_bytes"] - default_memory_limit()) < (256 << 20)


def test_build_report_uses_the_marks():
    d = build_report(["x"], 0, 1.0, None, 0.0, 3.0, [(2.5, 50)], 50, 2.5,
                     [(1.0, "a", 70), (1.01, "b", 20), (2.0, "c", 30)])
    assert [p["peak_rss_bytes"] for p in d["phases"]] == [70, 30, 50]
    assert d["peak_rss_bytes"] == 70 and d["peak_phase"] == "a"


def test_explicit_memory_limit_is_the_budget(tmp_path):
    profile_command([sys.executable, "-c", "pass", "--memory-limit", "1G"], str(tmp_path / "p"), plot=False,
                    quiet=True)
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["budget_bytes"] == 1 << 30 and data["budget_source"] == "--memory-limit"


def test_bar_sizes_are_decimal_like_plain():
    s = io.StringIO()
    bar = make_progress("bar", total=100_000_000, desc="pre-tokenize", unit="B", unit_scale=True,
                        unit_divisor=1024, stream=s)
    bar.update(100_000_000)
    bar.close()
    assert "100M/100M" in s.getvalue() and "95.4M" not in s.getvalue()
    s = io.StringIO()
    plain = make_progress("plain", total=100_000_000, unit="B", unit_scale=True, stream=s)
    plain.update(100_000_000)
    plain.close()
    assert "100.0 MB of 100.0 MB" in s.getvalue()


def test_plain_counts_are_plural():
    s = io.StringIO()
    p = make_progress("plain", total=31743, desc="merges", unit="merge", stream=s)
    p.update(3328)
    p.close()
    line = s.getvalue().splitlines()[-1]
    assert "(3,328 of 31,743 merges)" in line and " merge/s" in line
    s = io.StringIO()
    p = make_progress("plain", total=1, desc="merges", unit="merge", stream=s)
    p.update(1)
    p.close()
    assert "(1 of 1 merge)" in s.getvalue()
