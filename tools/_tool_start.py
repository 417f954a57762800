"""What every tool of this folder runs first and last: a Ctrl-C or SIGTERM at any moment of its run
ends it with one line on stderr and exit 130 / 143, and ``bpe_core`` is found in a checkout built
in place (``python setup.py build_ext --inplace``) when it is not installed.

A tool begins, before any other import (``os`` and ``sys`` come loaded with the interpreter)::

    import _signal  # noqa: I001  (first: a Ctrl-C or SIGTERM from here on is one line, exit 130 / 143)
    import os
    import sys

    if hasattr(_signal, "pthread_sigmask"):   # held until _tool_start's handler is in
        _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))
    try:
        import _tool_start
    except ImportError:                       # run by path (runpy.run_path) with another folder first
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _tool_start

    _tool_start.begin(__name__)

and ends with ``sys.exit(_tool_start.run(main))``.

- From its first line to ``begin`` (this module is read from disk meanwhile) the two signals are
  blocked: one that arrives waits, and ``begin`` takes it. ``_signal`` is the C module under
  ``signal``, loaded with the interpreter (``signal`` itself imports enum).
- From ``begin`` until ``main`` is called (imports of argparse, numpy and bpe_core: about half a
  second) a signal exits at once (``os._exit``) after one line: nothing has been written yet, and an
  exception raised there could land anywhere -- inside an import it is a traceback, and one raised
  while a dataclass is made came out as "RuntimeError: Error calling __set_name__" (Python 3.11).
- ``run`` hands SIGINT back to Python: a Ctrl-C during the work raises ``KeyboardInterrupt``, which
  ``run_main`` turns into "interrupted; temporary files removed" (130), and ``run`` into one line
  and 130 where it lands outside ``run_main`` (reading the options). SIGTERM stays early until
  ``run_main`` takes it over (``terminate_on_sigterm``: 143, temp files removed).

What no line of a tool can change: a SIGINT before the interpreter has set up its own handler kills
it silently (-2); one while it imports ``site`` is "Fatal Python error: init_import_site" (exit 1);
one while it compiles the tool's file (a few ms) is Python's traceback at "line 0" of the tool (-2).
No line of the tool has run in any of them, and nothing was written.

A signal that the shell has set to be ignored (``SIG_IGN``: a background job of a script) stays
ignored.
"""
import os
import sys

import _signal

_SIGNALS = (_signal.SIGINT, _signal.SIGTERM)


def _prog() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "bpe_core"


def _say(line: str) -> None:
    """``line`` on stderr, written at once (no buffered stream: one may be half-way through a write)."""
    try:
        sys.stdout.flush()
    except Exception:                   # noqa: BLE001  (a closed pipe, a write under way)
        pass
    os.write(2, f"{_prog()}: {line}\n".encode())


def _early_exit(signum, frame):
    """One line, then exit 130 (SIGINT) / 143 (SIGTERM) at once, without unwinding. After the run
    (``run_main`` has returned: ``cli.last_exit``) the line says how it ended, not "before it started"."""
    _say(_line(signum, "before it started"))
    os._exit(128 + signum)


def _line(signum, when: str) -> str:
    """What a signal ended; after ``run_main`` returned (``cli.last_exit``), that the run had ended."""
    what = "terminated (SIGTERM)" if signum == _signal.SIGTERM else "interrupted"
    rc = getattr(sys.modules.get("bpe_core.runtime.cli"), "last_exit", None)
    if rc is None:
        return f"{what} {when}".rstrip()
    return f"{'output complete' if rc == 0 else f'exit {rc} above'}; {what} after the run ended"


def begin(name: str, find_package: bool = True) -> None:
    """In a tool run as a script (``name == "__main__"``): the early handler for SIGINT and SIGTERM,
    then the two signals unblocked (one that came meanwhile is handled now); then ``bpe_core`` on
    the path, the installed package else this checkout's (not with ``find_package=False``: the
    ``bench_*`` scripts put their own checkout first, to time it rather than the installed one)."""
    if name == "__main__":              # (imported, e.g. by a test: the importer's handlers stay)
        for signum in _SIGNALS:
            if _signal.getsignal(signum) != _signal.SIG_IGN:
                _signal.signal(signum, _early_exit)
    if hasattr(_signal, "pthread_sigmask"):
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, _SIGNALS)
    if not find_package:
        return
    try:
        import bpe_core  # noqa: F401  (the installed package)
    except ImportError:                 # a checkout built in place, not installed
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def run(main) -> int:
    """``main()`` with SIGINT handed back to Python; a ``KeyboardInterrupt`` that ``run_main`` did
    not turn into its line (one while the options are read) is one line and 130 here."""
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
