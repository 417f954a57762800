"""Shared by test_robustness.py and test_budget_matrix.py: quick corpora, tool runs, leftovers.

The corpora are generated, not read from ../shared, so the tests run on a user's clone too.
"""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from tool_runner import run_tool

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN = ROOT / "tools" / "train_bpe.py"
ENCODE = ROOT / "tools" / "encode_corpus.py"
SPECIAL = b"<|endoftext|>"


def write_diverse(path, n_bytes: int, seed: int = 0, block: int = 4 << 20) -> pathlib.Path:
    """``n_bytes`` of letter soup with English-like letter frequencies: many unique pretokens
    (hundreds of thousands in 40 MB, so training and encoding take seconds), ``<|endoftext|>``
    between paragraphs. One random block is written repeatedly, each copy shifted, so 40 MB take a
    fraction of a second to generate."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"etaoinshrdlucmfwypvbgkqjxz  ,.\n", dtype=np.uint8)
    p = np.array([12, 9, 8, 8, 7, 7, 6, 6, 4, 4, 3, 3, 2.5, 2.4, 2.2, 2, 2, 1.5, 1.5, 1, 0.8, 0.2,
                  0.2, 0.1, 0.1, 0.1, 16, 16, 1, 1, 0.5])
    size = min(block, max(n_bytes, 1))
    blk = alphabet[rng.choice(len(alphabet), size=size, p=p / p.sum())].tobytes()
    blk = blk.replace(b"\n\n", b"\n" + SPECIAL)
    with open(path, "wb") as f:
        written, i = 0, 0
        while written < n_bytes:
            part = blk[(i * 7919) % 1000:][: n_bytes - written]
            f.write(part)
            written += len(part)
            i += 1
    return pathlib.Path(path)


def tool(script, *args, env=None, timeout=120, **kwargs):
    """Run a tool of ``tools/`` to the end as its own process (forked by ``tool_runner``: no
    interpreter start-up); returns the CompletedProcess (text mode)."""
    return run_tool(script, *args, env=env, timeout=timeout, **kwargs)


def env_with_tmpdir(tmpdir) -> dict:
    """The environment with TMPDIR (spill runs, temp files) pointed at a folder the test inspects."""
    env = dict(os.environ)
    env["TMPDIR"] = str(tmpdir)
    env.pop("BPE_CORE_DEBUG", None)
    return env


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def leftovers(folder) -> list[str]:
    """Temp files, spill folders and hidden names in ``folder`` (recursively)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            if name.startswith(".") or ".tmp" in name or "spill" in name:
                found.append(os.path.join(dirpath, name))
    return found


def read_outputs(out_dir) -> tuple[bytes, bytes, dict]:
    """merges.txt and model.json bytes and the report of a train_bpe.py run."""
    out_dir = pathlib.Path(out_dir)
    return ((out_dir / "merges.txt").read_bytes(), (out_dir / "model.json").read_bytes(),
            json.loads((out_dir / "train_report.json").read_text()))
