#!/usr/bin/env python3
"""Entropy curation of a training corpus (SupraTok section 3.2).

    python tools/curate.py corpus.txt --out curated.txt [--seed 0]

Per document (text between special tokens): the character-bigram entropy H; documents with H < 3.0,
3.0 <= H <= 4.5 and H > 4.5 are kept with probability 10%, 50% and 90%, decided by a keyed hash of the
document (seeded, deterministic, independent of order). The output is written to a temp file and
renamed. The report (documents and kept documents per bin, bytes kept) goes to stdout as JSON.
"""
import _signal  # noqa: I001  (first: a Ctrl-C or SIGTERM from here on is one line, exit 130 / 143)
import os
import sys

if hasattr(_signal, "pthread_sigmask"):   # held until _tool_start's handler is in (tools/_tool_start.py)
    _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))
try:
    import _tool_start
except ImportError:                       # run by path (runpy.run_path) with another folder first
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _tool_start

_tool_start.begin(__name__)

import argparse  # noqa: E402
import json  # noqa: E402

from bpe_core.runtime.cli import ArgumentParser, check_out_file, run_main  # noqa: E402
from bpe_core.corpus import check_input, warn_if_binary  # noqa: E402
from bpe_core.corpus.specials import DEFAULT_SPECIAL_TOKEN  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="curate.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="INPUT", help="corpus (documents separated by the special token)")
    p.add_argument("--out", required=True, metavar="FILTERED", help="output file for the kept documents")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the keep/drop hash (default 0)")
    p.add_argument("--special-token", default=DEFAULT_SPECIAL_TOKEN, metavar="TOK",
                   help=f"document separator (default: {DEFAULT_SPECIAL_TOKEN})")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_main(lambda: _run(args), "curate.py")


def _run(args) -> int:
    from bpe_core.methods.curate import curate_file

    check_input(args.input)
    check_out_file(args.out)
    warn_if_binary(args.input)
    report = curate_file(args.input, args.out, seed=args.seed, special=args.special_token)
    print(json.dumps({"output": os.path.abspath(args.out), **report.to_dict()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(_tool_start.run(main))
