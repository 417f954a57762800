"""A signal whose exception Python cannot deliver still ends the run with its one line.

``runtime.cli.run_main``'s handlers raise ``KeyboardInterrupt`` / ``Terminated`` wherever the main
thread is. When that is a garbage-collector callback (``distributed`` installs one), a ``__del__``
or a weakref finalizer, Python prints "Exception ignored in ..." and drops the exception: the run
went on, and with a local cluster its workers (interrupted with the whole process group) died, so
the run ended "cluster lost" (75) with a traceback on stderr instead of "interrupted" (130).
Now such an exception is not printed and the signal is sent again; and if the run ends with another
error first, the line is still the signal's.

Temp files: :func:`runtime.atomic.new_temp_file` / ``new_temp_dir`` choose the name before they
create anything, so a signal just after the creation cannot leave a file behind (``mkstemp`` only
returns the name once it has returned: a Ctrl-C in between left a ``.write-test-*`` file in the
output folder).
"""
import gc
import os
import signal
import subprocess
import sys
import time

import pytest

from bpe_core.runtime import atomic, cli
from bpe_core.runtime.cli import CliError, run_main
from paths import FIXTURES, TOOLS, package_parent
from robust_helpers import env_with_tmpdir, stderr_lines, tool, write_diverse

# Runs a tool; when ``target`` is first called, a gc callback is installed that sends the signal
# from inside the collector's callback, and a collection is forced: the handler's exception is raised
# inside the callback, where Python can only print it and drop it.
LAUNCHER = r'''
import gc, os, runpy, sys
target, signum, script = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = sys.argv[3:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
fired = []

def in_gc(phase, info):
    if phase == "start" and not fired:
        fired.append(1)
        os.kill(os.getpid(), signum)

def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_name == target and not fired:
        sys.setprofile(None)
        gc.callbacks.append(in_gc)
        gc.collect()
sys.setprofile(profile)
runpy.run_path(script, run_name="__main__")
'''


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lost")
    corpus = write_diverse(folder / "corpus.txt", 2 << 20, seed=3)
    r = tool(TOOLS / "train_bpe.py", FIXTURES / "tinystories_sample.txt", "--vocab-size", 300,
             "--out", folder / "tok", "--no-progress")
    assert r.returncode == 0, r.stderr
    return corpus, folder / "tok"


@pytest.mark.parametrize("tool_name, target, signum", [
    ("train_bpe", "train", signal.SIGINT),
    ("train_bpe", "train", signal.SIGTERM),
    ("encode_corpus", "encode_corpus", signal.SIGINT),
])
def test_a_signal_lost_in_a_gc_callback_still_ends_the_run(inputs, tmp_path, tool_name, target, signum):
    corpus, tok = inputs
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = env_with_tmpdir(tmpdir)
    env["PYTHONPATH"] = package_parent()
    out = tmp_path / "out"
    out.mkdir()
    if tool_name == "train_bpe":
        args = [corpus, "--vocab-size", 2000, "--out", out / "tok", "--no-progress"]
    else:
        args = [corpus, "--tokenizer", tok, "--out", out / "ids.npy", "--no-progress"]
    r = subprocess.run([sys.executable, "-c", LAUNCHER, target, str(int(signum)), str(TOOLS / f"{tool_name}.py"),
                        *map(str, args)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    lines = [line for line in stderr_lines(r.stderr) if "%|" not in line]
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    assert r.returncode == 128 + signum and len(lines) == 1, (r.returncode, r.stderr)
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr
    assert os.listdir(tmpdir) == []
    if lines[0] == f"{tool_name}.py: {what}; temporary files removed":
        assert os.listdir(out) == []
    else:       # (a loaded machine: the run ended before the signal was sent again) it says so
        assert lines[0].startswith(f"{tool_name}.py: output complete (") and \
            lines[0].endswith(f"); {what} after publishing"), lines


def _kill_self_inside_gc(signum=signal.SIGINT):
    sent = []

    def in_gc(phase, info):
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signum)
    gc.callbacks.append(in_gc)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(in_gc)
    assert sent


def test_a_lost_signal_then_another_error_is_reported_as_the_signal(capsys, monkeypatch):
    """The signal's exception is dropped in a gc callback and the body then fails with its own error
    (as a run whose workers the same Ctrl-C killed): the line and the exit code are the signal's, and
    the signal sent again is not delivered after run_main returned."""
    monkeypatch.setattr(cli._Signals, "AGAIN_AFTER", 30.0)     # (the error surely comes first)

    def body():
        _kill_self_inside_gc()
        raise CliError("the workers are gone")

    after = []
    old = signal.signal(signal.SIGINT, lambda *a: after.append(1))
    try:
        rc = run_main(body, prog="tool")
        time.sleep(0.1)
    finally:
        signal.signal(signal.SIGINT, old)
    err = capsys.readouterr().err
    assert rc == 130 and err.splitlines() == ["tool: interrupted; temporary files removed"], (rc, err)
    assert after == []


def test_a_lost_signal_and_a_body_that_ends_first_is_a_signal_after_the_run(capsys, monkeypatch):
    """The body returns before the signal is sent again: the run says so, with the signal's code."""
    monkeypatch.setattr(cli._Signals, "AGAIN_AFTER", 30.0)     # (the body surely ends first)

    def body():
        _kill_self_inside_gc(signal.SIGINT)
        return 0

    rc = run_main(body, prog="tool")
    time.sleep(0.1)
    err = capsys.readouterr().err
    assert rc == 130 and err.splitlines() == ["tool: run complete; interrupted after it ended"], (rc, err)


def test_a_lost_signal_is_delivered_again_to_the_body(capsys):
    """The body goes on after the dropped exception: the signal is raised again in its own code."""
    reached = []

    def body():
        _kill_self_inside_gc(signal.SIGTERM)
        for _ in range(500):
            time.sleep(0.01)
        reached.append("end")            # not reached: the second delivery ended the body
        return 0

    rc = run_main(body, prog="tool")
    err = capsys.readouterr().err
    assert rc == 143 and err.splitlines() == ["tool: terminated (SIGTERM); temporary files removed"], (rc, err)
    assert reached == [] and "Exception ignored" not in err


@pytest.mark.parametrize("make", ["file", "dir"])
def test_a_temp_made_just_before_a_signal_is_removed(tmp_path, make):
    """The exception of a signal that lands right after the file or folder was created (the first
    moment ``mkstemp`` could not clean up) removes it."""
    def create(path):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)) if make == "file" else os.mkdir(path)
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        atomic._new_temp(str(tmp_path), ".x-", "", create)
    assert os.listdir(tmp_path) == []


def test_the_write_probe_leaves_nothing_when_a_signal_lands_inside_it(tmp_path, monkeypatch):
    real_close = os.close

    def close_then_signal(fd):
        real_close(fd)
        raise KeyboardInterrupt
    monkeypatch.setattr(atomic.os, "close", close_then_signal)
    with pytest.raises(KeyboardInterrupt):
        atomic.probe_writable(str(tmp_path))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
    assert atomic.probe_writable(str(tmp_path)) is None and os.listdir(tmp_path) == []
    os.chmod(tmp_path, 0o500)
    try:
        if os.geteuid() != 0:
            assert isinstance(atomic.probe_writable(str(tmp_path)), PermissionError)
    finally:
        os.chmod(tmp_path, 0o700)


def test_new_temp_names_are_fresh_and_private(tmp_path):
    fd, a = atomic.new_temp_file(str(tmp_path), ".t-", ".npy")
    os.close(fd)
    b = atomic.new_temp_dir(str(tmp_path), ".t-")
    assert a != b and os.path.basename(a).startswith(".t-") and a.endswith(".npy")
    assert (os.stat(a).st_mode & 0o777, os.stat(b).st_mode & 0o777) == (0o600 & ~atomic.current_umask(),
                                                                        0o700 & ~atomic.current_umask())


def _wait_for_interrupt(seconds=5.0):
    with pytest.raises(KeyboardInterrupt):
        for _ in range(int(seconds / 0.01)):
            time.sleep(0.01)


def test_a_signal_that_lands_inside_the_unraisable_hook_is_held_until_it_returns(monkeypatch):
    """On a loaded machine the signal sent again can come while the main thread is still inside
    ``sys.unraisablehook`` (it was there when a ``threading.Timer`` waited for its thread to start),
    and an exception raised there is printed with a traceback: it is held and sent once the hook
    has returned."""
    monkeypatch.setattr(cli._Signals, "AGAIN_AFTER", 0.01)
    with cli._Signals() as s:
        s._in_hook += 1                          # as if the main thread were inside the hook
        try:
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs in here: held, not raised
            for _ in range(20):
                time.sleep(0.01)                 # (the sender waits while the hook runs)
        finally:
            s._in_hook -= 1
        assert s.received == signal.SIGINT
        _wait_for_interrupt()                    # sent again once out of the hook
        s.disarm()


def test_a_signal_lost_again_is_sent_again_again(monkeypatch):
    """The second delivery can be lost in a collector callback too: each loss sends it once more."""
    monkeypatch.setattr(cli._Signals, "AGAIN_AFTER", 0.01)
    lost = type("Unraisable", (), {"exc_value": KeyboardInterrupt()})()
    with cli._Signals() as s:
        s.received = signal.SIGINT
        for _ in range(3):
            s._unraisable(lost)                  # what Python calls for the dropped exception
            _wait_for_interrupt()
        s.disarm()
