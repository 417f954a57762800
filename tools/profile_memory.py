#!/usr/bin/env python3
"""Profile the memory of any command: ``bpe-core profile`` of a checkout (``python tools/profile_memory.py --help``).

The code is ``bpe_core.cli.profile``; this file starts it the signal-safe way (``bpe_core/cli/_start.py``).
"""
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

from bpe_core.cli.profile import *  # noqa: E402,F401,F403  (imported, e.g. by a test: the command's names)
from bpe_core.cli.profile import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(_start.run(main))
