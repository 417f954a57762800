"""Shared plumbing for the command-line tools: one clear line on stderr and exit code 2 on bad
input, never a traceback."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Callable

from .corpus import CorpusError
from .model_io import ModelFormatError


class CliError(Exception):
    """A user error the tool reports as one line (exit code 2)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag gives one line on stderr (exit code 2), not usage + error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def check_out_dir(path: str) -> str:
    """Create the output folder if needed and check that it is writable (before any work)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"{path}: exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CliError(f"{path}: output folder is not writable ({exc.strerror or exc})") from None
    from ._atomic import remove_stale
    for name in ("model.json", "vocab.json", "merges.txt", "train_report.json"):
        remove_stale(os.path.join(path, name))       # what a killed run left beside its outputs
    return path


def check_out_file(path: str) -> str:
    """Check that the folder of an output file exists and is writable."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise CliError(f"{path}: is a directory, expected a file path")
    if not os.path.isdir(folder):
        raise CliError(f"{path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise CliError(f"{path}: folder {folder} is not writable")
    return path


def run_main(fn: Callable[[], int], prog: str | None = None) -> int:
    """Run a tool body; map user errors to one stderr line and exit code 2.

    Exit codes: 0 done; 2 bad input, a budget that cannot fit, an input that changed while read;
    70 an internal error (a conservation check failed: nothing was written); 130 Ctrl-C; 143 SIGTERM.
    SIGTERM is handled like Ctrl-C (``workers.terminate_on_sigterm``): temp and spill files are
    removed on the way out.
    """
    from .workers import InternalError, Terminated, terminate_on_sigterm

    prog = prog or os.path.basename(sys.argv[0] or "bpe_core")
    with terminate_on_sigterm():
        if os.environ.get("BPE_CORE_DEBUG"):
            return fn()          # full tracebacks while debugging
        try:
            return fn()
        except (CliError, CorpusError, ModelFormatError) as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        except InternalError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 70
        except ValueError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        except Terminated:
            print(f"{prog}: terminated (SIGTERM); temporary files removed", file=sys.stderr)
            return 143
        except KeyboardInterrupt:
            print(f"{prog}: interrupted; temporary files removed", file=sys.stderr)
            return 130
        except OSError as exc:
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            print(f"{prog}: error: {where}{exc.strerror or exc}", file=sys.stderr)
            return 2
