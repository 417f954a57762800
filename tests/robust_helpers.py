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


# ==== Signals at a known point ================================================================
# A test that signals a running tool from outside races it: on a loaded machine the run can end
# before the signal lands (or before the test sees the moment it waits for). These run the tool in a
# forked child (``tool_runner.call_in_child``) that signals itself at a point of the run, so the kill
# lands where the test says, every time, without a large input to make the run last.

NOT_REACHED = 3           # the child's exit code when the run ended before the point was reached


def _run_as_main(script, args: list) -> int:
    """Run ``script`` with ``args`` as ``__main__`` in this process; its exit code, or
    :data:`NOT_REACHED` when it ended with 0 (the signal it was to send never came)."""
    import runpy
    import sys

    sys.argv = [str(script), *map(str, args)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return NOT_REACHED if code == 0 else code
    return NOT_REACHED


def child_signal_while_writing(script: str, args: list, after_bytes: int, sig: str = "SIGKILL") -> int:
    """Run ``script`` (``tools/encode_corpus.py``) with ``args``; once the output's temp file holds at
    least ``after_bytes`` bytes of ids (``ids_out.IdsWriter.write``, after the write), send ``sig``
    to this process. Returns the run's exit code, or :data:`NOT_REACHED` if it ended first."""
    import signal

    from bpe_core.encode import ids_out

    real = ids_out.IdsWriter.write

    def write(self, data):
        real(self, data)
        if self.written >= after_bytes and all(os.path.getsize(f[0]) > after_bytes for f in self.files):
            os.kill(os.getpid(), getattr(signal, sig))

    ids_out.IdsWriter.write = write
    return _run_as_main(script, args)


def child_signal_at_phase(script: str, args: list, at: str, sig: str = "SIGKILL") -> int:
    """Run ``script`` (a tool) with ``args``, sending ``sig`` to this process as the run enters the
    phase ``at`` (``memmon.phase``: a listener beside the memory monitors sees each phase as it
    starts), or, with ``at="publish"``, just before its first ``os.replace`` or ``os.rename`` (an output
    being put in place). Returns the run's exit code, or :data:`NOT_REACHED` if it ended first."""
    import signal

    from bpe_core.runtime import memmon

    def fire():
        os.kill(os.getpid(), getattr(signal, sig))

    class AtPhase:
        def _enter_phase(self, name, now):
            if name == at:
                fire()

    if at == "publish":
        def firing(real):
            def call(*a, **k):
                fire()
                return real(*a, **k)
            return call

        os.replace, os.rename = firing(os.replace), firing(os.rename)
    else:
        with memmon._MONITORS_LOCK:
            memmon._MONITORS.append(AtPhase())
    return _run_as_main(script, args)


def truncate_input(path) -> None:
    """The input cut to 4 KB."""
    os.truncate(path, 4096)


def rewrite_input(path) -> None:
    """Same size, other bytes, a later mtime."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        for offset in (st.st_size // 3, st.st_size - 5000):
            f.seek(offset)
            f.write(b"Z" * 4096)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


CHANGES = {"truncate": truncate_input, "rewrite": rewrite_input}


def child_change_input(script: str, args: list, path: str, change: str, at: str) -> int:
    """Run ``script`` with ``args``; the input ``path`` is changed (:data:`CHANGES`) while it runs:
    as the run enters the phase ``at`` (``memmon.phase``), or with ``at="write"`` at the first ids
    the encoder writes. Returns the run's exit code, or :data:`NOT_REACHED` if the point never came
    (the change was not made)."""
    import runpy
    import sys

    from bpe_core.encode import ids_out
    from bpe_core.runtime import memmon

    done = []

    def fire():
        if not done:
            done.append(True)
            CHANGES[change](path)

    if at == "write":
        real = ids_out.IdsWriter.write

        def write(self, data):
            fire()
            return real(self, data)

        ids_out.IdsWriter.write = write
    else:
        class AtPhase:
            def _enter_phase(self, name, now):
                if name == at:
                    fire()

        with memmon._MONITORS_LOCK:
            memmon._MONITORS.append(AtPhase())
    sys.argv = [str(script), *map(str, args)]
    code = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code if done else NOT_REACHED
