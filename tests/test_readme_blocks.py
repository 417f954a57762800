"""Every code block of README.md and docs/*.md runs as pasted (issue 30, "a newcomer's first hour").

Each block runs in a fresh temporary folder that holds the packaged sample
(``bpe_core/data/sample.txt``) as ``corpus.txt`` and ``heldout.txt``, the names the examples use
for "your text":

- ```` ```bash ```` blocks run with ``bash -e``; ``python`` is this interpreter and ``tools/``
  (``benchmarks/``, ``scripts/``) is the repository's folder (what a newcomer gets in the clone
  root); ``bpe-core X`` runs as ``python -m bpe_core X`` (the same command, whether or not the
  console script is installed here); to keep the test fast, a
  ``--vocab-size N`` above ``VOCAB_CAP`` runs as ``VOCAB_CAP`` (the 133 KB sample runs out of pairs
  near 8,400 anyway), the one change made to a block;
- ```` ```python ```` blocks run twice: as a script file (no ``if __name__ == "__main__":`` guard)
  and through ``python -``;
- ```` ```text ```` blocks (diagrams, output, layouts) are not run.

A block that cannot run anywhere (a cluster address, a 15 GB corpus, the benchmark corpora, a
``pip install``) is preceded by ``<!-- no-run: REASON -->``; the test counts them and keeps them
few. A fence without a language fails: say whether it is code or text.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "bpe_core" / "data" / "sample.txt"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The names the examples use for "your corpus" and "held-out text"; both are the sample here.
INPUT_NAMES = ("corpus.txt", "heldout.txt")
#: At most this many blocks may be marked no-run (keep examples runnable).
MAX_NO_RUN = 14
#: Shell blocks train with at most this vocabulary size (see the module docstring).
VOCAB_CAP = 2000
RUN_LANGS = {"bash", "python"}
TEXT_LANGS = {"text"}

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
NO_RUN = re.compile(r"<!--\s*no-run:\s*(.+?)\s*-->\s*\n\s*$")


def blocks():
    """(page, line, lang, code, no_run_reason) for every fenced block of the pages."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = text[max(0, m.start() - 300):m.start()]
            marker = NO_RUN.search(before)
            found.append((page.relative_to(ROOT).as_posix(), line, m.group(1).strip(), m.group(2),
                          marker.group(1) if marker else None))
    return found


BLOCKS = blocks()
RUNNABLE = [b for b in BLOCKS if b[2] in RUN_LANGS and b[4] is None]


def _workdir(tmp_path) -> pathlib.Path:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    for name in INPUT_NAMES:
        shutil.copyfile(SAMPLE, work / name)
    return work


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("BPE_CORE_DEBUG", None)
    return env


def _shell(code: str) -> str:
    """The block with ``tools/``, ``benchmarks/``, ``scripts/`` as the repository's and ``bpe-core``
    as this interpreter's command (``python`` is this interpreter: ``_env``)."""
    code = re.sub(r"--vocab-size (\d+)", lambda m: f"--vocab-size {min(int(m.group(1)), VOCAB_CAP)}", code)
    code = re.sub(r"(?<![\w./-])bpe-core (?=\w)", "python -m bpe_core ", code)
    return re.sub(r"(?<![\w./-])(tools|benchmarks|scripts)/", lambda m: str(ROOT / m.group(1)) + "/", code)


def _check(proc, page, line, how):
    assert proc.returncode == 0, (f"{page}:{line} ({how}) exit {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


def _ids(b):
    return f"{b[0]}:{b[1]}"


def test_every_block_says_what_it_is():
    """A fence names its language: runnable (bash, python) or text; no-run markers are few and
    each gives a reason."""
    unlabeled = [f"{p}:{n}" for p, n, lang, _, _ in BLOCKS if lang not in RUN_LANGS | TEXT_LANGS]
    assert not unlabeled, f"blocks without a language (use bash, python or text): {unlabeled}"
    no_run = [(f"{p}:{n}", why) for p, n, lang, _, why in BLOCKS if why is not None]
    assert len(no_run) <= MAX_NO_RUN, no_run
    assert all(lang in RUN_LANGS for _, _, lang, _, why in BLOCKS if why is not None)
    assert len(RUNNABLE) >= 8


def test_blocks_are_found():
    """The extraction sees the blocks of the README and the pages (a regex that found nothing would
    pass anything)."""
    readme = [b for b in RUNNABLE if b[0] == "README.md"]
    assert any(b[2] == "python" for b in readme) and any(b[2] == "bash" for b in readme)
    assert sum(b[2] == "bash" for b in RUNNABLE if b[0].startswith("docs/")) >= 3


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b[2] == "bash"], ids=_ids)
def test_shell_block_runs(block, tmp_path):
    page, line, _, code, _ = block
    work = _workdir(tmp_path)
    proc = subprocess.run(["bash", "-e", "-c", _shell(code)], cwd=work, env=_env(), capture_output=True,
                          text=True, timeout=300)
    _check(proc, page, line, "bash")


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b[2] == "python"], ids=_ids)
def test_python_block_runs(block, tmp_path):
    """As a script (no __main__ guard) and as ``python -``, each in a fresh folder."""
    page, line, _, code, _ = block
    work = _workdir(tmp_path / "script")
    (work / "example.py").write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, "example.py"], cwd=work, env=_env(), capture_output=True,
                          text=True, timeout=300)
    _check(proc, page, line, "script")
    work = _workdir(tmp_path / "stdin")
    proc = subprocess.run([sys.executable, "-"], input=code, cwd=work, env=_env(), capture_output=True,
                          text=True, timeout=300)
    _check(proc, page, line, "python -")
