"""Shared plumbing for the command-line tools: one clear line on stderr and exit code 2 on bad
input, never a traceback."""
from __future__ import annotations

import _thread
import argparse
import contextlib
import os
import re
import signal
import sys
import threading
import warnings
from typing import Callable

from ..errors import (BinaryInputWarning, BudgetWarning, ClusterError, CorpusError, InternalError, MissingDependency,
                      ModelFormatError, Terminated)
from .atomic import PUBLISHED, output_problem, probe_writable, recover_folder, remove_stale
from .budget import parse_size
from .workers import terminate_on_sigterm

#: The smallest ``--chunk-bytes`` / ``--chunk-size`` the tools take (the API takes any positive size).
MIN_CLI_CHUNK_BYTES = 4 << 10


#: The exit code of a run the cluster could not carry out (sysexits' temporary failure: run it again).
EX_TEMPFAIL = 75


class CliError(Exception):
    """A user error the tool reports as one line (exit code 2)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag gives one line on stderr (exit code 2), not usage + error."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # "-1G" is a value (a negative size the option's type refuses in its own words), not an
        # unknown option: argparse takes only plain negative numbers ("-1", "-.5") as values
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def check_out_dir(path: str) -> str:
    """Check, before any work, that the output folder can be published (``atomic.publish_folder``):
    a writable folder, or absent in a writable folder. The folder above it must exist, as for
    every output of every command (``check_out_file``): a missing one is an error naming it, not
    made (a mistyped path is not created). ``path`` itself appears, whole, when the run publishes
    it. What a killed run left beside it is cleaned up. A folder that cannot be written is named
    (``--out imm/tok/``: ``imm``)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"{path}: exists and is not a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CliError(f"{path}: folder {parent} does not exist")
    exc = probe_writable(path if os.path.isdir(path) else parent)
    if exc is not None and os.path.isdir(path):
        raise CliError(f"{path}: output folder is not writable ({exc.strerror or exc})")
    if exc is not None:
        shown = os.path.dirname(os.path.normpath(path)) or "."
        raise CliError(f"{shown}: cannot create the output folder {path} in it ({exc.strerror or exc})")
    recover_folder(path)
    if os.path.isdir(path):
        for name in ("model.json", "vocab.json", "merges.txt", "train_report.json"):
            remove_stale(os.path.join(path, name))       # what an older version's killed run left
    return path


def local_input_files(sources) -> list[str]:
    """The local files a run reads, from ``corpus.inputs.expand_inputs`` (paths and ``file://``
    URLs; not other URLs or streams)."""
    files = []
    for src in sources:
        if not getattr(src, "rereadable", False):
            continue
        name = src.name
        if getattr(src, "is_url", False):
            if not name.startswith("file://"):
                continue
            name = name[len("file://"):]
        files.append(name)
    return files


def check_not_an_input(path: str, inputs, what: str = "") -> None:
    """Refuse an output path that is one of the run's input files (the corpus, the tokenizer's
    files): writing there would replace it. One line naming the path (exit 2)."""
    if not os.path.exists(path):
        return
    for inp in inputs:
        with contextlib.suppress(OSError):
            if os.path.samefile(inp, path):
                raise CliError(f"{path}: is also an input ({inp}){what}; writing there would replace it: "
                               "give another output path")


def check_out_file(path: str) -> str:
    """Check, before any work, that an output file can be written: not a folder or a special file,
    in a folder that exists and is writable (probed with a real temp file)."""
    problem = output_problem(path)
    if problem is not None:
        raise CliError(f"{path}: {problem}")
    return path


def check_out_prefix(prefix: str, suffixes: tuple[str, ...] = (".json", ".png")) -> str:
    """Check, before any work, that ``PREFIX.json`` and ``PREFIX.png`` (``--profile-memory PREFIX``)
    can be written."""
    if os.path.isdir(prefix):
        raise CliError(f"{prefix}: is a directory; give a file prefix such as {os.path.join(prefix, 'run')}")
    for suffix in suffixes:
        problem = output_problem(prefix + suffix)
        if problem is not None:
            raise CliError(f"{prefix + suffix}: {problem}")
    return prefix


def check_work_dir(path: str, what: str = "folder") -> str:
    """Check that an existing folder the run writes into (``--spill-dir``) is there and writable."""
    if not os.path.isdir(path):
        raise CliError(f"{path}: {what} does not exist" if not os.path.exists(path)
                       else f"{path}: is not a directory")
    exc = probe_writable(path)
    if exc is not None:
        raise CliError(f"{path}: {what} is not writable ({exc.strerror or exc})")
    return path


def chunk_size(text: str) -> int:
    """``--chunk-bytes`` / ``--chunk-size``: a size of at least ``MIN_CLI_CHUNK_BYTES`` (4 KiB).

    Smaller chunks only add per-chunk overhead (``--chunk-bytes 1`` took a minute on 133 KB); the
    API still takes any positive size, which the tests use to cut small inputs into many chunks.

    >>> chunk_size("64K")
    65536
    """
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < MIN_CLI_CHUNK_BYTES:
        raise argparse.ArgumentTypeError(f"{text}: chunks smaller than {MIN_CLI_CHUNK_BYTES >> 10} KiB only "
                                         f"slow the run down; give at least 4K (or leave it to the plan)")
    return value


def count(text: str) -> int:
    """A count (``--vocab-size``, ``--shard-tokens``): a whole number, or one with a unit -- ``k`` =
    1,000, ``M`` = 1,000,000 and ``G`` = 1,000,000,000 (a "32k vocabulary" is 32,000 tokens), ``Ki``,
    ``Mi``, ``Gi`` for powers of two -- refused in one line otherwise (a count has no bytes: ``8KB``).
    The command checks its range. Sizes of memory (``--memory-limit 8G``) are binary; counts are not.

    >>> count("32000"), count("32k"), count("32K"), count("1.5k"), count("32Ki"), count("1M"), count("1G")
    (32000, 32000, 32000, 1500, 32768, 1000000, 1000000000)
    """
    text = str(text).strip()
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)\s*([kKmMgG])?(i?)", text)
    if m is None or (m.group(3) and not m.group(2)):
        raise argparse.ArgumentTypeError(f"invalid count {text!r} (examples: 32000, 32k, 32Ki)")
    power = {None: 0, "k": 1, "m": 2, "g": 3}[m.group(2) and m.group(2).lower()]
    unit = (1024 if m.group(3) else 1000) ** power
    number = float(m.group(1)) * unit if "." in m.group(1) else int(m.group(1)) * unit
    if number != int(number):
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: not a whole number")
    return int(number)


def cluster_note(spec, cores: int | None = None) -> str | None:
    """The note for ``--cluster local:N`` when N is more than this machine's cores (the worker
    processes then share them: each count is slower, the result the same), as ``--workers`` has.

    >>> cluster_note("local:4", cores=2)
    'local:4 starts 4 worker processes, 2 cores: they share the cores (the results are the same)'
    >>> cluster_note("local:2", cores=2), cluster_note("tcp://h:8786", cores=2), cluster_note(None, cores=1)
    (None, None, None)
    """
    if not isinstance(spec, str) or not spec.strip().startswith("local:"):
        return None
    n = spec.strip().partition(":")[2]
    cores = cores or os.cpu_count() or 1
    if not n.isdigit() or int(n) <= cores:
        return None
    return f"{spec.strip()} starts {int(n)} worker processes, {cores} cores: they share the cores (the results are the same)"


def memory_size(text: str, error: type = argparse.ArgumentTypeError) -> int:
    """``--memory-limit``: a positive size (``budget.parse_size``), refused in one line otherwise
    (``error``: argparse's, for ``type=``; ``CliError`` where the tool parses it itself).

    >>> memory_size("500M")
    524288000
    """
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise error(str(exc)) from None
    if value < 1:
        raise error(f"size {text}: a memory limit must be positive")
    return value


def add_cluster_flags(p: argparse.ArgumentParser, cluster_help: str) -> None:
    """``--cluster`` (its help: ``cluster_help``), ``--cluster-timeout`` and ``--profile-memory``, the
    same in every command that can run on a cluster (train, encode)."""
    p.add_argument("--cluster", nargs="?", const="env", default=None, metavar="SPEC", help=cluster_help)
    p.add_argument("--cluster-timeout", type=cluster_seconds, default=None, metavar="SECONDS",
                   help="with --cluster: how long to wait for a worker when none is connected, and the base "
                        "of how long the run may go without a task finishing; past it the run stops in one "
                        "line, exit 75 (default: 30)")
    p.add_argument("--profile-memory", default=None, metavar="PREFIX",
                   help="sample the RSS of the process tree and write PREFIX.json and PREFIX.png "
                        "(RSS over time with phases and the budget line)")


def cluster_seconds(text: str) -> float:
    """``--cluster-timeout``: a positive number of seconds (``executors.cluster_timeout``).

    >>> cluster_seconds("45")
    45.0
    """
    from .executors import cluster_timeout

    try:
        return cluster_timeout(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("cluster_timeout: ", "")) from None


def add_input_flags(p) -> None:
    """The options of the inputs, for tools/train_bpe.py and tools/encode_corpus.py (docs/inputs.md)."""
    g = p.add_argument_group("inputs (docs/inputs.md)")
    g.add_argument("--format", dest="input_format", choices=["auto", "text", "jsonl", "parquet"], default="auto",
                   help="input format: auto (default: Parquet by its magic bytes, JSON Lines by a .jsonl/.json "
                        "name, else text; compression always by magic bytes), text, jsonl or parquet")
    g.add_argument("--text-field", default="text", metavar="FIELD",
                   help="JSON Lines: the field holding the text; a dotted path reaches nested objects "
                        "(default: text)")
    g.add_argument("--text-column", default="text", metavar="COLUMN",
                   help="Parquet: the column holding the text (default: text)")
    g.add_argument("--skip-bad-records", action="store_true",
                   help="count and skip bad records (invalid JSON, a missing field, a truncated stream, a "
                        "corrupt row group) instead of stopping at the first one")


def _one_line_warnings(prog: str):
    """``warnings.showwarning`` for the tools: a bpe_core warning is one line ``prog: warning: ...``."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, (BinaryInputWarning, BudgetWarning)):
            print(f"{prog}: warning: {message}", file=sys.stderr if file is None else file)
        else:
            previous(message, category, filename, lineno, file, line)
    return show


def run_main(fn: Callable[[], int], prog: str | None = None) -> int:
    """Run a tool body; map user errors to one stderr line and exit code 2.

    Exit codes: 0 done; 2 bad input, a budget that cannot fit, an input that changed while read;
    70 an internal error (a conservation check failed: nothing was written); 75 (``EX_TEMPFAIL``) the
    cluster failed (``errors.ClusterError``: the scheduler cannot be reached or was lost, no worker
    joined or every worker is gone, a task kept losing its worker; nothing was written, running
    again may succeed); 130 Ctrl-C; 143 SIGTERM.

    Signals (main thread; see :class:`_Signals`): while ``fn`` runs, SIGTERM raises
    :class:`Terminated` and Ctrl-C ``KeyboardInterrupt``, so temp and spill files are removed on the
    way out ("terminated (SIGTERM); temporary files removed", 143; "interrupted; ...", 130). Once
    the run has published its output (``atomic.PUBLISHED`` grew), a signal does not undo it: the line
    says "output complete (PATH); terminated (SIGTERM) after publishing" (or "interrupted after
    publishing"), and the exit code is still the signal's (143 / 130). A signal after ``fn`` returned
    is held and reported the same way when ``run_main`` returns: never an exit without a line.
    """
    prog = prog or os.path.basename(sys.argv[0] or "bpe_core")
    global last_exit
    last_exit = None
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warnings(prog)
        if os.environ.get("BPE_CORE_DEBUG"):
            with terminate_on_sigterm():
                return fn()          # full tracebacks while debugging
        signals = _Signals()
        with signals:
            rc = last_exit = _run(fn, prog, signals)
        rc = _late(prog, rc, signals)        # (the handlers are back: a signal now is the caller's)
        last_exit = rc
        return rc


#: The exit code of the last :func:`run_main` of this process (None while it runs): the tools'
#: launcher (``tools/_tool_start.py``) reads it to tell a signal after the run from one before it.
last_exit: int | None = None


class _Signals:
    """SIGINT / SIGTERM handlers for one :func:`run_main`: they raise (``KeyboardInterrupt`` /
    :class:`Terminated`) while ``armed`` (the tool body runs), and are only recorded once
    :func:`_run` disarms them (the body returned or raised): what the run says and returns is then
    decided without an exception landing in the middle of it. Outside the main thread, nothing."""

    #: seconds before a signal whose exception was dropped is sent again (_unraisable)
    AGAIN_AFTER = 0.02

    def __init__(self):
        self.armed = True
        self.late: list[int] = []
        self.received: int | None = None     # the first signal that came while armed
        self.published = len(PUBLISHED)
        self._old: dict = {}
        self._old_hook = None
        self._again: threading.Event | None = None    # set: the signal being sent again is called off
        self._in_hook = 0                # inside _unraisable: a signal now is held, not raised
        self._sending = False            # a signal is on its way again (_send_again)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(s) != signal.SIG_IGN:      # a signal the shell ignores stays ignored
                    self._old[s] = signal.signal(s, self._handle)
            if self._old:
                self._old_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc):
        for s, handler in self._old.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if self._old_hook is not None and sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._old_hook
        return False

    def disarm(self) -> None:
        """From now on a signal is recorded, not raised (the tool body returned or raised)."""
        self.armed = False
        if self._again is not None:
            self._again.set()

    def _handle(self, signum, frame):
        if not self.armed:
            if self._again is not None and signum == self.received:
                self._again = None           # our own second delivery, after the run ended: not news
                return
            self.late.append(signum)
            return
        if self.received is None:
            self.received = signum
        if self._in_hook:
            # an exception raised inside sys.unraisablehook is printed with a traceback: the signal
            # is sent again once the hook has returned
            self._send_again(signum)
            return
        if signum == signal.SIGTERM:
            raise Terminated()
        raise KeyboardInterrupt()

    def _unraisable(self, unraisable) -> None:
        """Python runs a signal handler wherever the main thread is, and an exception raised in a
        garbage-collector callback, a ``__del__`` or a weakref finalizer (e.g. ``distributed``'s GC
        diagnosis) cannot propagate: Python prints "Exception ignored in ..." and the run goes on as
        if no signal had come. Such an exception of ours is not printed; the signal is sent to the
        main thread again a moment later, when it is back in the run's own code."""
        self._in_hook += 1
        try:
            if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.received is not None:
                if self.armed:
                    self._send_again(self.received)
                return
            (self._old_hook or sys.__unraisablehook__)(unraisable)
        finally:
            self._in_hook -= 1

    def _send_again(self, signum: int) -> None:
        """Send ``signum`` to the main thread ``AGAIN_AFTER`` seconds from now, and not before it has
        left :meth:`_unraisable` (unless :meth:`disarm` calls it off first). The sender is a bare
        ``_thread`` thread: ``threading.Thread.start`` waits for the thread to begin, and on a loaded
        machine the signal could then land inside that wait, in the hook."""
        if self._sending:
            return                           # one is on its way
        self._sending = True
        called_off = self._again = threading.Event()
        main = threading.main_thread().ident

        def send():
            while not called_off.wait(self.AGAIN_AFTER):
                if not self._in_hook:
                    self._sending = False    # (before: it may be lost again and sent once more)
                    signal.pthread_kill(main, signum)
                    return
            self._sending = False
        _thread.start_new_thread(send, ())

    def outputs(self) -> list[str]:
        """What this run published, in order (``atomic.PUBLISHED`` since the run began)."""
        return PUBLISHED[self.published:]


def _after_publishing(prog: str, signum: int, outputs: list[str]) -> int:
    """The line and exit code of a signal that came after the run published ``outputs``."""
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    if not outputs:                      # a run that publishes nothing (--plan, a report on stdout)
        print(f"{prog}: run complete; {what} after it ended", file=sys.stderr)
        return 128 + signum
    shown = ", ".join(outputs[:3]) + (f" and {len(outputs) - 3} more" if len(outputs) > 3 else "")
    print(f"{prog}: output complete ({shown}); {what} after publishing", file=sys.stderr)
    return 128 + signum


def _run(fn: Callable[[], int], prog: str, signals: _Signals) -> int:
    try:
        try:
            rc = fn()
        finally:
            signals.disarm()             # from here on a signal is recorded, not raised
    except Terminated:
        if signals.outputs():
            return _after_publishing(prog, signal.SIGTERM, signals.outputs())
        print(f"{prog}: terminated (SIGTERM); temporary files removed", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        if signals.outputs():
            return _after_publishing(prog, signal.SIGINT, signals.outputs())
        print(f"{prog}: interrupted; temporary files removed", file=sys.stderr)
        return 130
    except BaseException as exc:
        if signals.received is not None and not signals.outputs():
            # the signal's own exception was lost on the way (see _Signals._unraisable) and what
            # ended the run is its consequence (workers of the same process group interrupted too):
            # the line is the signal's
            what = "terminated (SIGTERM)" if signals.received == signal.SIGTERM else "interrupted"
            print(f"{prog}: {what}; temporary files removed", file=sys.stderr)
            return 128 + signals.received
        return _report(exc, prog)
    if signals.received is not None and signals.received not in signals.late:
        # a signal came while the body ran, its exception was lost and the body finished before
        # the signal was sent again: reported as a signal after the run (its line, its code)
        signals.late.insert(0, signals.received)
    return rc


def _late(prog: str, rc: int, signals: _Signals) -> int:
    """The line and exit code of a signal that came after the tool body returned (if any)."""
    if signals.late:
        signum = signals.late[0]
        if rc == 0:
            return _after_publishing(prog, signum, signals.outputs())
        what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
        print(f"{prog}: {what} after the error above", file=sys.stderr)
        return 128 + signum
    return rc


def _report(exc: BaseException, prog: str) -> int:
    """One line on stderr for an error of the tool body, and its exit code (re-raises the others)."""
    try:
        raise exc
    except (CliError, CorpusError, ModelFormatError, MissingDependency) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except InternalError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 70
    except ClusterError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EX_TEMPFAIL
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"{prog}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
