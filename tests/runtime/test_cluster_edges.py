"""Cluster edges a user meets from the tools: a bad input on a ``local:N`` cluster, a scheduler
address with nothing (or something else) behind it, a signal while a local cluster starts or
closes, a script without a ``__main__`` guard. Each ends quickly, in one line, with no leftovers."""
from paths import REPO
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytest.importorskip("distributed")

from bpe_core.errors import ClusterError  # noqa: E402
from bpe_core.runtime.executors import open_executor  # noqa: E402

ROOT = str(REPO)
TOOLS = os.path.join(ROOT, "tools")
TEXT = b"the cat sat on the mat. the dog sat on the log.\n" * 50


def run_py(code, cwd, timeout=90, args=()):
    path = os.path.join(cwd, "script.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(code))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, path, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def test_bad_record_on_a_local_cluster_is_one_line(tmp_path):
    (tmp_path / "a.txt").write_bytes(TEXT)
    (tmp_path / "b.jsonl").write_text('{"text": "hi"}\nnot json\n')
    r = subprocess.run([sys.executable, os.path.join(TOOLS, "train_bpe.py"), "a.txt", "b.jsonl", "--vocab-size", "300",
                        "--out", "tok", "--cluster", "local:2", "--no-progress"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "b.jsonl: line 2: invalid JSON" in lines[0]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_fails_at_once():
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match="cannot reach the Dask scheduler"):
        with open_executor(f"tcp://127.0.0.1:{_free_port()}"):
            pass
    assert time.monotonic() - t0 < 10          # Dask alone retries for its 30 s connect timeout
    with pytest.raises(ClusterError, match="unknown host"):
        from bpe_core.runtime.executors import _check_reachable
        _check_reachable("tcp://no-such-host.invalid:8786")


def test_not_a_scheduler_is_a_cluster_error():
    """An HTTP server (the dashboard's port, say) answers bytes Dask reads as a huge frame length."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(ClusterError, match="is not a Dask scheduler: it answers HTTP"):
            with open_executor(f"tcp://127.0.0.1:{server.getsockname()[1]}", timeout="3s"):
                pass
    finally:
        stop.set()
        t.join()
        server.close()


@pytest.mark.parametrize("when", ["start", "close"])
def test_sigterm_while_a_local_cluster_starts_or_closes(tmp_path, when):
    """Terminated, quickly, quietly: not Dask's atexit hook waiting out its timeouts. (Timed from
    the signal, which the script notes: the start-up before it takes longer on a busy machine.)"""
    r, _ = run_py("""
        import os, signal, sys, threading, time
        from bpe_core.runtime.executors import open_executor, _square
        from bpe_core.runtime.workers import terminate_on_sigterm, Terminated
        def term():
            with open("signal_at", "w") as f:
                f.write(repr(time.monotonic()))
            os.kill(os.getpid(), signal.SIGTERM)
        if __name__ == "__main__":
            with terminate_on_sigterm():
                try:
                    if sys.argv[1] == "start":
                        threading.Timer(0.4, term).start()
                    with open_executor("local:2") as ex:
                        ex.map(_square, [1, 2])
                        if sys.argv[1] == "close":
                            threading.Timer(0.05, term).start()
                        else:
                            time.sleep(30)
                except Terminated:
                    print("terminated")
        """, tmp_path, args=(when,))
    ended = time.monotonic()
    assert r.stdout.strip() == "terminated" and r.returncode == 0, (r.stdout, r.stderr)
    assert r.stderr == ""
    seconds = ended - float((tmp_path / "signal_at").read_text())      # the clock is system-wide
    assert seconds < 8, seconds


def test_script_without_main_guard_gets_one_clear_error(tmp_path):
    (tmp_path / "c.txt").write_bytes(TEXT)
    r, seconds = run_py("""
        import bpe_core
        bpe_core.train_bpe("c.txt", 300, ["<|endoftext|>"], cluster="local:2")
        """, tmp_path)
    assert r.returncode == 1
    assert "ClusterError" in r.stderr and "__main__" in r.stderr
    assert len(r.stderr.splitlines()) < 30, r.stderr        # not a traceback from every process
    assert r.stderr.count("Traceback") == 1
