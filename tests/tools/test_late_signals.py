"""SIGTERM and Ctrl-C near the end of a run tell the truth (``runtime.cli.run_main``,
``bpe_core/cli/_start.py``): before the output is published, "terminated (SIGTERM); temporary files
removed" / "interrupted; ..." and nothing at the output path; after it is published, "output
complete (PATH); terminated (SIGTERM) after publishing" with the output whole; after the run
ended, "output complete; terminated (SIGTERM) after the run ended". The exit code is always the
signal's (143 / 130), there is always one line and never a traceback.

The moments are exact, not timed: a launcher runs the tool as ``python tools/X.py`` does and sends
the signal as a given function is entered ("call:NAME") or returns ("return:NAME").
"""
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from paths import FIXTURES, TOOLS, package_parent
from robust_helpers import env_with_tmpdir, stderr_lines, tool

LAUNCHER = r'''
import os, runpy, sys
at, signum, script = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = sys.argv[3:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
kind, _, target = at.partition(":")
fired = []

def profile(frame, event, arg):
    if frame.f_code.co_name == target and event == kind and not fired:
        fired.append(1)
        sys.setprofile(None)
        os.kill(os.getpid(), signum)
sys.setprofile(profile)
runpy.run_path(script, run_name="__main__")
'''


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("late")
    corpus = folder / "corpus.txt"
    shutil.copyfile(FIXTURES / "tinystories_sample.txt", corpus)
    r = tool(TOOLS / "train_bpe.py", corpus, "--vocab-size", 300, "--out", folder / "tok", "--no-progress")
    assert r.returncode == 0, r.stderr
    return corpus, folder / "tok"


def _signal_at(tmp_path, name, args, at, signum):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = env_with_tmpdir(tmpdir)
    env["PYTHONPATH"] = package_parent()
    r = subprocess.run([sys.executable, "-c", LAUNCHER, at, str(int(signum)), str(TOOLS / f"{name}.py"),
                        *map(str, args)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 128 + signum, (r.returncode, r.stderr)
    lines = [line for line in stderr_lines(r.stderr) if "%|" not in line and "MB/s" not in line]
    assert len(lines) == 1, r.stderr
    return lines[0]


# (moment, what the line says): the ids are published inside ``publish_outputs`` (publish_files);
# ``warn_exceeded`` runs after it, inside the tool body; ``_run`` returns inside run_main;
# ``run_main`` returns inside _start.run.
ENCODE_MOMENTS = [
    ("call:publish_outputs", "terminated (SIGTERM); temporary files removed"),
    ("call:warn_exceeded", "output complete ({ids}); terminated (SIGTERM) after publishing"),
    ("return:_run", "output complete ({ids}); terminated (SIGTERM) after publishing"),
    ("return:run_main", "output complete; terminated (SIGTERM) after the run ended"),
]


@pytest.mark.parametrize("at,line", ENCODE_MOMENTS, ids=[m for m, _ in ENCODE_MOMENTS])
def test_encode_sigterm_near_the_end(inputs, tmp_path, at, line):
    corpus, tok = inputs
    ids = tmp_path / "ids.npy"
    got = _signal_at(tmp_path, "encode_corpus", [corpus, "--tokenizer", tok, "--out", ids, "--no-progress"],
                     at, signal.SIGTERM)
    assert got == "encode_corpus.py: " + line.format(ids=ids)
    if "output complete" in line:
        assert len(np.load(ids)) > 0           # whole: what the line says
    else:
        assert not ids.exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


@pytest.mark.parametrize("at,line", [
    ("call:save_folder", "interrupted; temporary files removed"),
    ("return:save_folder", "output complete ({out}); interrupted after publishing"),
    ("return:_run", "output complete ({out}); interrupted after publishing"),
    ("return:run_main", "output complete; interrupted after the run ended"),
])
def test_train_ctrl_c_near_the_end(inputs, tmp_path, at, line):
    corpus, _ = inputs
    out = tmp_path / "tok"
    got = _signal_at(tmp_path, "train_bpe", [corpus, "--vocab-size", "300", "--out", out, "--no-progress"],
                     at, signal.SIGINT)
    assert got == "train_bpe.py: " + line.format(out=out)
    assert out.exists() == ("output complete" in line)


def test_train_sigterm_after_publishing(inputs, tmp_path):
    corpus, _ = inputs
    out = tmp_path / "tok"
    got = _signal_at(tmp_path, "train_bpe", [corpus, "--vocab-size", "300", "--out", out, "--no-progress"],
                     "return:save_folder", signal.SIGTERM)
    assert got == f"train_bpe.py: output complete ({out}); terminated (SIGTERM) after publishing"
    assert sorted(os.listdir(out))[:2] == ["merges.txt", "model.json"]
