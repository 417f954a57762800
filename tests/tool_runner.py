"""Run a tool of ``tools/`` as its own process without paying an interpreter start-up each time.

``python tools/train_bpe.py ...`` in a fresh interpreter costs about a second of CPU before the tool
does anything (Python, numpy, bpe_core and the tool's imports); the suite ran a few hundred of them.
Here one small server process per test process (started on first use, single-threaded, with
bpe_core imported) forks a child for each run; the child is set up as a fresh ``python SCRIPT ARGS``
would be -- argv, environment, working directory, stdin/stdout/stderr (files), the script's folder
first on ``sys.path``, ``__name__ == "__main__"`` -- runs the script with ``runpy``, and ends the way
an interpreter ends (non-daemon threads joined, ``atexit`` hooks, streams flushed; an uncaught
``KeyboardInterrupt`` dies of SIGINT). So exit codes, stdout/stderr, signals sent to the child by
itself or by the tool (``os.kill``), files written and files left behind are those of a real run.

Use :func:`subprocess.run` instead where the test is about the interpreter itself: a signal during
start-up or imports, what a clean clone imports, a process's memory from its start, a process that
the test signals from outside while it runs (:func:`run_tool` waits for the end).

The server is not a child of the test process (it is started through a double fork): tests that
check that a run left no child process behind (``psutil.Process().children()``) see none of it.
It exits when the test process closes its end of the pipe (or dies).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["run_tool", "call_in_child"]

_SERVER = r'''
import importlib, json, os, sys
if os.fork():                       # the intermediate process exits: the server is nobody's child
    os._exit(0)
os.setsid()
sys.path[:] = json.loads(sys.argv[1])
import bpe_core                     # noqa: F401  (paid once, shared by every run)
import tool_runner
tool_runner._serve(sys.stdin.buffer, sys.stdout.buffer)
'''

_lock = threading.Lock()
_server = {}


def _preload():
    """What every tool imports anyway (loaded once in the server, before any fork)."""
    import importlib

    for name in ("numpy", "bpe_core.runtime.cli", "bpe_core.training", "bpe_core.encode.encode_corpus",
                 "bpe_core.formats.folder", "bpe_core.formats.registry", "runpy", "argparse"):
        try:
            importlib.import_module(name)
        except Exception:           # a tool that needs it reports it itself
            pass


def _serve(rfile, wfile):
    """The server loop: one JSON request a line; answer the child's pid, then its wait status."""
    import importlib

    _preload()
    for line in rfile:
        req = json.loads(line)
        if req.get("module"):
            importlib.import_module(req["module"])      # imported once here, inherited by later children
        pid = os.fork()
        if pid == 0:
            _child(req)                                 # never returns
        wfile.write(f"{pid}\n".encode())
        wfile.flush()
        _, status = os.waitpid(pid, 0)
        wfile.write(f"{status}\n".encode())
        wfile.flush()
    os._exit(0)


def _child(req):
    """In the forked child: become ``python SCRIPT ARGS`` (or call a function), then end as an
    interpreter does."""
    code = 1
    try:
        for fd, path, flags in ((0, req["stdin"], os.O_RDONLY),
                                (1, req["stdout"], os.O_WRONLY | os.O_TRUNC),
                                (2, req["stderr"], os.O_WRONLY | os.O_TRUNC)):
            new = os.open(path, flags)
            os.dup2(new, fd)
            os.close(new)
        sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", closefd=False, errors="backslashreplace", buffering=1)
        os.chdir(req["cwd"])
        os.umask(req["umask"])
        os.environ.clear()
        os.environ.update(req["env"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        code = _run(req)
        threading_shutdown = getattr(threading, "_shutdown", None)
        if threading_shutdown is not None:
            threading_shutdown()
        atexit._run_exitfuncs()
    except KeyboardInterrupt:                       # as an interpreter ends on an uncaught ^C
        import traceback

        traceback.print_exc()
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:                           # noqa: BLE001  (reported as an interpreter would)
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        _flush()
        os._exit(code)


def _run(req) -> int:
    import importlib
    import runpy

    try:
        if req.get("script"):
            script = req["script"]
            sys.argv = [script, *req["args"]]
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
            return 0
        sys.argv = [req["module"], *map(str, req["args"])]
        result = getattr(importlib.import_module(req["module"]), req["function"])(*req["args"])
        return result if isinstance(result, int) else 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:           # noqa: BLE001
            pass


def _start():
    here = os.path.dirname(os.path.abspath(__file__))
    from paths import package_parent

    path = [package_parent(), here] + [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, json.dumps(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=tempfile.gettempdir())
    proc.wait()                     # the intermediate process; the server lives on, holding the pipes
    _server.update(proc=proc, pid_owner=os.getpid(), buf=b"")
    atexit.register(_stop)


def _stop():
    proc = _server.pop("proc", None)
    if proc is not None:
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def _read_line(deadline=None):
    """The server's next answer line, read from the pipe unbuffered (a buffered reader could hold
    both answers while ``select`` waits on the pipe); None when ``deadline`` (monotonic) passes."""
    fd = _server["proc"].stdout.fileno()
    while b"\n" not in _server["buf"]:
        if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            raise RuntimeError("tool_runner: the server process ended")
        _server["buf"] += chunk
    line, _server["buf"] = _server["buf"].split(b"\n", 1)
    return int(line)


def _request(req: dict, timeout: float, args_for_error) -> subprocess.CompletedProcess:
    with _lock:
        if _server.get("pid_owner") != os.getpid():          # first use (or a forked test process)
            _server.clear()
            _start()
        proc = _server["proc"]
        with tempfile.TemporaryDirectory(prefix="bpe-tool-") as d:
            stdin = req.pop("input", None)
            req["stdin"] = os.devnull
            if stdin is not None:
                req["stdin"] = os.path.join(d, "stdin")
                with open(req["stdin"], "wb") as f:
                    f.write(stdin.encode() if isinstance(stdin, str) else stdin)
            req["stdout"], req["stderr"] = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            for name in ("stdout", "stderr"):
                open(req[name], "wb").close()
            try:
                proc.stdin.write((json.dumps(req) + "\n").encode())
                proc.stdin.flush()
                pid = _read_line()
                status = _read_line(time.monotonic() + timeout)
                timed_out = status is None
                if timed_out:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    status = _read_line()
            except BaseException:
                _stop()                                 # out of step with the server: the next run starts a new one
                _server.clear()
                raise
            with open(req["stdout"], "rb") as f:
                out = f.read().decode("utf-8", "replace")
            with open(req["stderr"], "rb") as f:
                err = f.read().decode("utf-8", "replace")
    if timed_out:
        raise subprocess.TimeoutExpired(args_for_error, timeout, out, err)
    return subprocess.CompletedProcess(args_for_error, os.waitstatus_to_exitcode(status), out, err)


def _umask(umask: int) -> int:
    if umask >= 0:
        return umask
    current = os.umask(0o022)
    os.umask(current)
    return current


def run_tool(script, *args, env=None, cwd=None, input=None, umask=-1, timeout=120) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, script, *args], capture_output=True, text=True, ...)``, in a
    forked child of the server (see the module docstring). ``env``: the child's whole environment
    (default: this process's); ``cwd``: its working directory, ``umask`` its umask (default: this
    process's); ``input``: its stdin (str or bytes; default: none)."""
    args = [str(a) for a in args]
    req = {"script": str(script), "args": args, "env": dict(os.environ if env is None else env),
           "cwd": str(cwd) if cwd is not None else os.getcwd(), "input": input, "umask": _umask(umask)}
    return _request(req, timeout, [sys.executable, str(script), *args])


def call_in_child(module: str, function: str, *args, env=None, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """``module.function(*args)`` in a forked child of the server; its int result is the exit code.
    ``args`` travel as JSON; ``module`` is imported in the server once and stays there."""
    req = {"module": module, "function": function, "args": list(args),
           "env": dict(os.environ if env is None else env), "cwd": str(cwd) if cwd is not None else os.getcwd(),
           "umask": _umask(-1)}
    return _request(req, timeout, [module, function, *map(str, args)])
