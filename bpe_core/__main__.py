"""``python -m bpe_core ARGS``: the ``bpe-core`` command (``bpe_core.cli``)."""
import sys

from bpe_core.cli import console

if __name__ == "__main__":
    sys.exit(console())
