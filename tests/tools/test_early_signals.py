"""A Ctrl-C at any moment of a tool's start-up -- from its first line, through the imports of numpy
and bpe_core and the reading of its options, to the start of its work -- ends it with one line on
stderr and exit 130, no traceback, nothing written (``bpe_core/cli/_start.py``), whether it is run as
``python tools/X.py`` or as the installed ``bpe-core`` command.

The moments are exact, not timed: each run starts the tool through a small launcher that does what
``python tools/X.py ARGS`` does (``runpy``, the tool's folder first on ``sys.path``) and sends the
process SIGINT when a given module is first imported (an import hook) or a given function is
called (a profile hook). Each is a fresh interpreter (``tool_runner``'s forked children have
everything imported already).
"""
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from paths import FIXTURES, TOOLS, package_parent
from robust_helpers import env_with_tmpdir, leftovers, stderr_lines, tool

LAUNCHER = r'''
import os, runpy, sys
at, script = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
sys.path[0] = os.path.dirname(os.path.abspath(script))       # as `python SCRIPT` (not the cwd)
kind, _, target = at.partition(":")
fired = []

def fire():
    if not fired:
        fired.append(1)
        os.kill(os.getpid(), 2)           # SIGINT, as a Ctrl-C

class Hook:                               # "import:NAME": while NAME is first looked up
    def find_spec(self, name, path=None, target_=None):
        if kind == "import" and name == target:
            fire()
        return None

sys.meta_path.insert(0, Hook())
if kind == "call":                        # "call:NAME": as the function NAME is entered
    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == target:
            sys.setprofile(None)
            fire()
    sys.setprofile(profile)
runpy.run_path(script, run_name="__main__")
'''

#: The same moments for the ``bpe-core`` console script: what pip's generated script does, run
#: with ``ARGS`` (``bpe-core train ...``) as ``sys.argv``.
CONSOLE = LAUNCHER.replace(
    'runpy.run_path(script, run_name="__main__")',
    'sys.argv.insert(0, "bpe-core")\nimport re\nfrom bpe_core.cli import console\nsys.exit(console())')

#: The moments, in the order a run meets them. ``bpe_core.cli._start`` is imported by the tool's
#: first lines (the signal is held until its handler is in); argparse and bpe_core while the tool's imports
#: run (not numpy: a small run never imports it); ``parse_args`` reads the options; ``main`` is the tool's main before its first line;
#: ``run_main`` is entered just before the work (outside its try: ``_start.run`` has it);
#: ``_train`` is the work itself (``run_main``: "temporary files removed").
MOMENTS = ["import:bpe_core.cli._start", "import:argparse", "import:bpe_core.runtime.cli", "import:bpe_core.config",
           "call:parse_args",
           "call:main", "call:run_main", "call:_train"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A small corpus and a tokenizer trained on it (by ``tool_runner``: no interpreter start)."""
    folder = tmp_path_factory.mktemp("early")
    corpus = folder / "corpus.txt"
    shutil.copyfile(FIXTURES / "tinystories_sample.txt", corpus)
    r = tool(TOOLS / "train_bpe.py", corpus, "--vocab-size", 300, "--out", folder / "tok", "--no-progress")
    assert r.returncode == 0, r.stderr
    return corpus, folder / "tok"


def _args(name, corpus, tok, out):
    """A command line of tool ``name`` that would run to the end and write into ``out``."""
    return {
        "train_bpe": [corpus, "--vocab-size", "300", "--out", out / "tok", "--no-progress"],
        "encode_corpus": [corpus, "--tokenizer", tok, "--out", out / "ids.npy", "--no-progress"],
        "export_tokenizer": [tok, "--format", "hf", "--out", out / "tokenizer.json"],
        "curate": [corpus, "--out", out / "kept.txt"],
        "evaluate": ["--tokenizer", tok, "--text", corpus, "--json", out / "scores.json"],
        "profile_memory": ["--out", out / "prof", "--no-plot", "--", sys.executable, "-c", "pass"],
    }[name]


def _interrupt(name, at, inputs, tmp_path, console=False):
    corpus, tok = inputs
    out, tmpdir = tmp_path / "out", tmp_path / "tmp"
    out.mkdir(), tmpdir.mkdir()
    env = env_with_tmpdir(tmpdir)
    env["PYTHONPATH"] = package_parent()      # the bpe_core this test imports (installed or built in place)
    script = TOOLS / f"{name}.py"
    r = subprocess.run([sys.executable, "-c", CONSOLE if console else LAUNCHER, at,
                        COMMANDS[name] if console else str(script),
                        *map(str, _args(name, corpus, tok, out))],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert "Traceback" not in r.stderr, f"{name} at {at}: {r.stderr}"
    assert r.returncode == 130, f"{name} at {at}: exit {r.returncode}; stderr: {r.stderr}"
    lines = stderr_lines(r.stderr)
    prog = f"bpe-core {COMMANDS[name]}" if console else f"{name}.py"
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: interrupted"), r.stderr
    assert os.listdir(out) == [] and os.listdir(tmpdir) == [], (os.listdir(out), os.listdir(tmpdir))
    assert leftovers(tmp_path) == []
    return lines[0]


@pytest.mark.parametrize("at", MOMENTS)
def test_train_bpe_interrupted_at_any_moment_of_its_start(inputs, tmp_path, at):
    line = _interrupt("train_bpe", at, inputs, tmp_path)
    if at.startswith("import:"):          # the early handler: exits at once
        assert line == "train_bpe.py: interrupted before it started"
    elif at == "call:_train":             # the work: run_main's KeyboardInterrupt
        assert line == "train_bpe.py: interrupted; temporary files removed"
    else:                                 # between: _start.run's KeyboardInterrupt
        assert line == "train_bpe.py: interrupted"


COMMANDS = {"train_bpe": "train", "encode_corpus": "encode", "export_tokenizer": "export", "curate": "curate",
            "evaluate": "evaluate", "profile_memory": "profile"}


@pytest.mark.parametrize("at", [m for m in MOMENTS if m != "import:bpe_core.cli._start"] + ["import:bpe_core.cli.train"])
def test_bpe_core_train_interrupted_at_any_moment_of_its_start(inputs, tmp_path, at):
    """The same for the console script ``bpe-core train``: from the moment its entry point runs
    (it blocks the signals, then imports ``_start`` and the command's module)."""
    line = _interrupt("train_bpe", at, inputs, tmp_path, console=True)
    if at.startswith("import:"):
        assert line == "bpe-core train: interrupted before it started"
    elif at == "call:_train":
        assert line == "bpe-core train: interrupted; temporary files removed"
    else:
        assert line == "bpe-core train: interrupted"


@pytest.mark.parametrize("at", ["import:bpe_core.cli._start", "call:main"])
@pytest.mark.parametrize("name", ["encode_corpus", "export_tokenizer", "curate", "evaluate", "profile_memory"])
def test_every_tool_is_interrupted_in_one_line(inputs, tmp_path, name, at):
    _interrupt(name, at, inputs, tmp_path)


def test_the_launcher_runs_a_tool_to_the_end(inputs, tmp_path):
    """The launcher itself changes nothing: with a moment that never comes the run finishes."""
    corpus, tok = inputs
    env = dict(os.environ, PYTHONPATH=package_parent())
    r = subprocess.run([sys.executable, "-c", LAUNCHER, "import:no_such_module", str(TOOLS / "train_bpe.py"),
                        str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "tok"), "--no-progress"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tok" / "model.json").exists()


@pytest.mark.parametrize("name", ["train_bpe", "encode_corpus", "export_tokenizer", "curate", "evaluate",
                                  "profile_memory"])
def test_every_tool_starts_and_ends_through_start(name):
    """The first statement blocks the two signals (nothing is read from disk before it) and the
    last hands ``main`` to ``_start.run``."""
    text = (TOOLS / f"{name}.py").read_text(encoding="utf-8")
    body = text.split('"""', 2)[2].lstrip()
    assert body.startswith("import _signal  # noqa: I001"), body[:200]
    assert '_signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))' in body.split("\n\n", 2)[1]
    assert "_start.begin(__name__)" in body[:800]
    assert text.rstrip().endswith('if __name__ == "__main__":\n    sys.exit(_start.run(main))')
    assert "from __future__" not in text          # an import that reads a file before the first line


def test_a_signal_ignored_by_the_shell_stays_ignored(inputs, tmp_path):
    """A background job of a script starts with SIGINT ignored; the tool does not take it back."""
    corpus, _ = inputs
    env = dict(os.environ, PYTHONPATH=package_parent())
    r = subprocess.run([sys.executable, "-c", LAUNCHER, "call:main", str(TOOLS / "train_bpe.py"), str(corpus),
                        "--vocab-size", "300", "--out", str(tmp_path / "tok"), "--no-progress"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert r.returncode == 0, r.stderr
    assert pathlib.Path(tmp_path / "tok" / "model.json").exists()
