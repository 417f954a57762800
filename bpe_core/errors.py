"""Every error and warning a user of bpe_core can see, in one place (the lowest layer).

The command-line tools turn them into one line on stderr (``runtime.cli.run_main``): the user's
mistakes (:class:`CorpusError`, :class:`ModelFormatError`, :class:`BudgetError`, any ``ValueError``)
exit 2, :class:`InternalError` exits 70, :class:`ClusterError` 75 (a temporary failure: running
again may succeed), Ctrl-C 130 and :class:`Terminated` (SIGTERM) 143.

>>> str(CorpusError("corpus.txt", "no such file"))
'corpus.txt: no such file'
"""
from __future__ import annotations

import os

__all__ = ["BinaryInputWarning", "BudgetError", "BudgetWarning", "ClusterError", "CorpusError", "IncompatibleInit", "InputChanged",
           "InternalError", "MissingDependency", "ModelFormatError", "Terminated", "VerifyError"]


class CorpusError(ValueError):
    """Bad input: the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):           # so it crosses a process boundary (a cluster worker) intact
        return (type(self), (self.path, self.reason))


class InputChanged(CorpusError):
    """The input file changed (shrank, grew or was rewritten) while it was being read."""


class ModelFormatError(ValueError):
    """A model file that cannot be read; the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class IncompatibleInit(ModelFormatError):
    """An ``--init-from`` model this run cannot continue (its method, special tokens, pattern or size
    do not fit the options); the message names the model and the mismatch."""


class BudgetError(ValueError):
    """The work cannot fit the memory limit. ``min_budget`` is the smallest budget that would work.

    A ``ValueError``, so the command-line tools report it as one line with exit code 2.
    """

    def __init__(self, message: str, min_budget: int):
        super().__init__(message)
        self.min_budget = min_budget

    def __reduce__(self):
        return (type(self), (str(self), self.min_budget))


class ClusterError(OSError):
    """The cluster could not run the work: the scheduler cannot be reached, is not a Dask scheduler
    or was lost; no worker joined, or every worker is gone; no task finished within the bound; or a
    task kept losing its worker (Dask gives up after ``distributed.scheduler.allowed-failures``
    losses). An ``OSError``: the environment failed, not the input; the tools report it as one line
    with exit code 75 (``EX_TEMPFAIL``)."""


class MissingDependency(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it
    (``pip install "dask[distributed]" fsspec``). The tools report it as one line, exit code 2."""


class InternalError(RuntimeError):
    """A run-time conservation check failed (bytes, pretokens or tokens do not add up).

    Nothing is written when this is raised: it means a bug, not bad input, and the message says
    which totals disagree.
    """


class VerifyError(RuntimeError):
    """``encode_corpus(..., verify=True)`` found ids that do not decode back to the input."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``timeout``, Slurm, ``docker stop``); handled like Ctrl-C, exit code 143."""


class BinaryInputWarning(UserWarning):
    """The input does not look like text (NUL bytes, or much of it is neither UTF-8 nor printable).

    Training and encoding go on (a byte-level tokenizer takes any bytes); the warning says so once.
    """


class BudgetWarning(UserWarning):
    """The memory budget cannot hold: it is above the RAM or the memory cgroup's limit, or a run's
    measured peak went above it. The run goes on; the tools show the warning as one line."""
