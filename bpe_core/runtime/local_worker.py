"""Run in each worker process of a ``local:N`` cluster as it starts (a Dask worker preload, named by
``executors.open_executor``): Ctrl-C is the tool's to act on, not the workers'.

A terminal sends SIGINT to every process of the job, the workers of a ``LocalCluster`` included;
each would die with a ``KeyboardInterrupt`` traceback while the tool stops the run and closes the
cluster anyway. The workers start with SIGINT blocked (``executors._sigint_blocked``); here they
ignore it for good, which also discards one that came while it was blocked.
"""
from __future__ import annotations

import signal
import threading


def dask_setup(worker) -> None:
    """Dask's preload hook: SIGINT ignored in this worker process (its main thread runs this)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
