"""The start of every command of bpe_core (``bpe-core``, ``python -m bpe_core``, ``tools/*.py``, the
benchmarks): a Ctrl-C or SIGTERM at any moment of its run ends it with one line on stderr and exit
130 / 143.

This module imports only ``os``, ``sys`` and ``_signal`` (the C module under ``signal``, loaded with
the interpreter; ``signal`` itself imports enum), so it is cheap to import before anything else.

A wrapper script (``tools/train_bpe.py``) begins, before any other import::

    import _signal  # noqa: I001  (first: a Ctrl-C or SIGTERM from here on is one line, exit 130 / 143)
    import os
    import sys

    if hasattr(_signal, "pthread_sigmask"):   # held until _start's handler is in
        _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))
    try:
        from bpe_core.cli import _start
    except ImportError:                       # a checkout built in place, not installed
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from bpe_core.cli import _start

    _start.begin(__name__)

and ends with ``sys.exit(_start.run(main))``. A benchmark loads this file by path (it times its
own checkout: importing ``bpe_core`` first would pick the installed one). The ``bpe-core`` console
script and ``python -m bpe_core`` call ``bpe_core.cli.console``, which blocks the two signals as its
first step, then :func:`console` here.

- From the first line to ``begin`` (``bpe_core``'s light ``__init__`` and this module are read from
  disk meanwhile) the two signals are blocked: one that arrives waits, and ``begin`` takes it.
- From ``begin`` until ``main`` is called (imports of argparse, numpy and bpe_core: about half a
  second) a signal exits at once (``os._exit``) after one line: nothing has been written yet, and an
  exception raised there could land anywhere -- inside an import it is a traceback, and one raised
  while a dataclass is made came out as "RuntimeError: Error calling __set_name__" (Python 3.11).
- ``run`` hands SIGINT back to Python: a Ctrl-C during the work raises ``KeyboardInterrupt``, which
  ``run_main`` turns into "interrupted; temporary files removed" (130), and ``run`` into one line
  and 130 where it lands outside ``run_main`` (reading the options). SIGTERM stays early until
  ``run_main`` takes it over (``terminate_on_sigterm``: 143, temp files removed).

What no line of a command can change: a SIGINT before the interpreter has set up its own handler
kills it silently (-2); one while it imports ``site`` is "Fatal Python error: init_import_site"
(exit 1); one while it compiles the script (a few ms) is Python's traceback at "line 0" (-2). The
console script that pip writes imports ``re``, ``sys``, ``bpe_core`` and ``bpe_core.cli`` before
``bpe_core.cli.console`` runs (``python -m bpe_core``: ``bpe_core``): a SIGINT in those 30 ms or so
is Python's ``KeyboardInterrupt`` traceback. No line of the command has run in any of them, and
nothing was written.

A signal that the shell has set to be ignored (``SIG_IGN``: a background job of a script) stays
ignored.
"""
import os
import sys

import _signal

_SIGNALS = (_signal.SIGINT, _signal.SIGTERM)
#: numpy's OpenBLAS reads it once, at numpy's import (``begin``)
_BLAS_THREADS = "OPENBLAS_NUM_THREADS"


def _prog() -> str:
    """The name in the lines: the script's (``train_bpe.py``), or ``bpe-core train``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "bpe-core"
    if name in ("bpe-core", "__main__.py"):         # the console script, python -m bpe_core
        return f"bpe-core {sys.argv[1]}" if len(sys.argv) > 1 and sys.argv[1].isalpha() else "bpe-core"
    return name


def _say(line: str) -> None:
    """``line`` on stderr, written at once (no buffered stream: one may be half-way through a write)."""
    try:
        sys.stdout.flush()
    except Exception:                   # noqa: BLE001  (a closed pipe, a write under way)
        pass
    os.write(2, f"{_prog()}: {line}\n".encode())


def _early_exit(signum, frame):
    """One line, then exit 130 (SIGINT) / 143 (SIGTERM) at once, without unwinding. After the run
    (``run_main`` has returned: ``runtime.cli.last_exit``) the line says how it ended, not "before it
    started"."""
    _say(_line(signum, "before it started"))
    os._exit(128 + signum)


def _line(signum, when: str) -> str:
    """What a signal ended; after ``run_main`` returned (``cli.last_exit``), that the run had ended."""
    what = "terminated (SIGTERM)" if signum == _signal.SIGTERM else "interrupted"
    rc = getattr(sys.modules.get("bpe_core.runtime.cli"), "last_exit", None)
    if rc is None:
        return f"{what} {when}".rstrip()
    return f"{'output complete' if rc == 0 else f'exit {rc} above'}; {what} after the run ended"


def block() -> None:
    """Hold SIGINT and SIGTERM until :func:`begin` puts its handler in."""
    if hasattr(_signal, "pthread_sigmask"):
        _signal.pthread_sigmask(_signal.SIG_BLOCK, _SIGNALS)


def begin(name: str) -> None:
    """In a command run as a script (``name == "__main__"``): the early handler for SIGINT and
    SIGTERM, then the two signals unblocked (one that came meanwhile is handled now). Imported (e.g.
    a wrapper by a test): the importer's handlers stay, and the signals are unblocked. Imported
    as ``__mp_main__`` (a worker process of ``--cluster local:N`` re-imports the command's script):
    SIGINT stays blocked, as the worker was started (``runtime.executors``: a Ctrl-C is the command's
    to act on, not its workers').

    A command (``__main__``, ``__mp_main__``) also sets ``OPENBLAS_NUM_THREADS=1`` where the user has
    not set it, before numpy is imported: bpe_core calls no BLAS routine, and numpy's OpenBLAS starts
    a thread per core at import that spins before it sleeps (0.05-0.09 CPU-s a process on 2
    cores, measured; more with more cores)."""
    if name in ("__main__", "__mp_main__"):
        os.environ.setdefault(_BLAS_THREADS, "1")
    if name == "__main__":
        for signum in _SIGNALS:
            if _signal.getsignal(signum) != _signal.SIG_IGN:
                _signal.signal(signum, _early_exit)
    if hasattr(_signal, "pthread_sigmask"):
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK,
                                (_signal.SIGTERM,) if name == "__mp_main__" else _SIGNALS)


#: True once a command of bpe_core runs (``run``): its own code, not a user's script, started any
#: local cluster (the executor then leaves out the hint about a missing ``__main__`` guard).
in_command = False


def run(main) -> int:
    """``main()`` with SIGINT handed back to Python; a ``KeyboardInterrupt`` that ``run_main`` did
    not turn into its line (one while the options are read) is one line and 130 here."""
    global in_command
    in_command = True
    try:
        if _signal.getsignal(_signal.SIGINT) is _early_exit:
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        return main()
    except KeyboardInterrupt:
        _say(_line(_signal.SIGINT, ""))
        return 128 + _signal.SIGINT
    finally:                            # the run is over: a late signal says so (cli.last_exit), exit 130 / 143
        for signum in _SIGNALS:
            if _signal.getsignal(signum) not in (_signal.SIG_IGN, None):
                _signal.signal(signum, _early_exit)


def run_bench(main) -> int:
    """``run(main)`` for a ``bench_*`` script: Ctrl-C is one line and 130 as in every tool, and a
    SIGTERM during the run is one line and 143 raised as ``SystemExit``, so its temporary folders are
    removed on the way out (a benchmark has no ``run_main`` to take SIGTERM over)."""
    def _terminated(signum, frame):
        _say("terminated (SIGTERM)")
        raise SystemExit(128 + signum)

    if _signal.getsignal(_signal.SIGTERM) is _early_exit:
        _signal.signal(_signal.SIGTERM, _terminated)
    return run(main)


def console() -> int:
    """The ``bpe-core`` command (its console script, and ``python -m bpe_core``): ``bpe_core.cli.main``
    started as every tool is (``bpe_core.cli.console`` blocked the signals before importing this)."""
    block()
    begin("__main__")
    import importlib

    from . import COMMANDS, main

    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:     # its imports under the early handler, as a tool's
        importlib.import_module(f"{__package__}.{sys.argv[1]}")
    return run(main)


def rerun_command(command: str, prog: str, args) -> list:
    """The command line that runs ``command`` (``train``, ``encode``) with ``args`` again as a child
    process (``--profile-memory`` reruns the command under the profiler): this interpreter, this
    ``bpe_core`` (the folder it was imported from comes first on the child's path, whatever the
    current folder holds), and ``prog`` in its messages."""
    parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = f"import sys; sys.path[0] = {parent!r}; from bpe_core.cli._start import rerun; sys.exit(rerun())"
    return [sys.executable, "-c", code, "bpe-core" if prog.startswith("bpe-core") else prog, command, *args]


def rerun() -> int:
    """The child of :func:`rerun_command` (``python -c CODE PROG COMMAND ARGS...``), started as every
    command is."""
    block()
    begin("__main__")
    first, command = sys.argv[1], sys.argv[2]
    sys.argv = [first, *sys.argv[3:]]
    import importlib

    module = importlib.import_module(f"bpe_core.cli.{command}")
    return run(lambda: module.main(None, prog=f"bpe-core {command}" if first == "bpe-core" else first))
