"""Standard input as the corpus (``-``), handled like a file: closed is one line (exit 2); a terminal
gets a one-line hint on stderr while the run waits for text, and the text ends at the first Ctrl-D."""
from paths import TOOLS, package_parent
import os
import select
import subprocess
import sys
import time

import pytest

from bpe_core.corpus.files import TERMINAL_HINT, stdin_problem
from bpe_core.corpus.inputs import expand_inputs
from bpe_core.errors import CorpusError

TOOL_ARGS = {
    "train_bpe.py": ["--vocab-size", "260"],
    "encode_corpus.py": ["--tokenizer", "TOK"],
}


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=package_parent())


def _args(tool: str, tmp_path) -> list:
    args = [a if a != "TOK" else str(tmp_path / "tok") for a in TOOL_ARGS[tool]]
    out = str(tmp_path / ("out" if tool == "train_bpe.py" else "ids.npy"))
    return [sys.executable, str(TOOLS / tool), "-", *args, "--out", out, "--progress", "none"]


@pytest.fixture
def tokenizer(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello there\n" * 20)
    r = subprocess.run([sys.executable, str(TOOLS / "train_bpe.py"), str(text), "--vocab-size", "270", "--out",
                        str(tmp_path / "tok"), "--progress", "none"], env=_env(), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("tool", ["train_bpe.py", "encode_corpus.py"])
def test_closed_stdin_is_one_line(tmp_path, tokenizer, tool):
    """``tool - 0<&-``: not ``AttributeError: 'NoneType' object has no attribute 'buffer'``."""
    r = subprocess.run(_args(tool, tmp_path), env=_env(), capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: os.close(0))
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == f"{tool}: error: -: standard input is closed: pipe the corpus in, or give a file instead of -"
    assert not (tmp_path / "out").exists() and not (tmp_path / "ids.npy").exists()


def test_closed_stdin_in_the_api(monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)
    assert "closed" in stdin_problem()
    with pytest.raises(CorpusError, match="standard input is closed"):
        expand_inputs("-")


@pytest.mark.parametrize("tool", ["train_bpe.py", pytest.param("encode_corpus.py", marks=pytest.mark.slow)])
def test_a_terminal_on_stdin_gets_a_hint_and_one_ctrl_d_ends_the_text(tmp_path, tokenizer, tool):
    """The hint is on stderr while the run waits for text (a pty: ``pty.openpty``), before anything
    is typed; then one line of text and one Ctrl-D end the input and the run."""
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(_args(tool, tmp_path), env=_env(), stdin=slave, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
        try:
            got = b""
            deadline = time.monotonic() + 60
            while TERMINAL_HINT.encode() not in got and time.monotonic() < deadline and p.poll() is None:
                ready, _, _ = select.select([p.stderr], [], [], 0.2)
                if ready:
                    got += os.read(p.stderr.fileno(), 4096)
            assert got.decode().strip() == f"{tool}: {TERMINAL_HINT}", got
            assert p.poll() is None                         # still waiting for the text
            os.write(master, b"hello world hello\n\x04")     # one Ctrl-D, at the start of a line
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
    finally:
        os.close(master)
        os.close(slave)
    assert p.returncode == 0, err
    assert TERMINAL_HINT.encode() not in err                # said once
    if tool == "encode_corpus.py":
        import numpy as np

        assert len(np.load(tmp_path / "ids.npy")) > 0


def test_a_pipe_on_stdin_gets_no_hint(tmp_path):
    r = subprocess.run(_args("train_bpe.py", tmp_path), env=_env(), input=b"hello world hello\n",
                       capture_output=True, timeout=60)
    assert r.returncode == 0 and TERMINAL_HINT.encode() not in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_cluster_timeout_must_be_positive_seconds(tmp_path, value):
    r = subprocess.run([sys.executable, str(TOOLS / "train_bpe.py"), "x.txt", "--cluster", "local:1",
                        "--cluster-timeout", value, "--out", str(tmp_path / "o")], env=_env(), capture_output=True,
                       text=True, timeout=60)
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--cluster-timeout" in lines[0], r.stderr
