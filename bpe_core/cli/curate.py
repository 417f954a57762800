"""Entropy curation of a training corpus (SupraTok section 3.2).

    bpe-core curate corpus.txt --out curated.txt [--seed 0]

Per document (text between special tokens): the character-bigram entropy H; documents with H < 3.0,
3.0 <= H <= 4.5 and H > 4.5 are kept with probability 10%, 50% and 90%, decided by a keyed hash of the
document (seeded, deterministic, independent of order). The output is written to a temp file and
renamed. The report (documents and kept documents per bin, bytes kept) goes to stdout as JSON.
"""
import argparse
import json
import os
import sys

from bpe_core.runtime.cli import ArgumentParser, check_out_file, run_main
from bpe_core.corpus import check_input, warn_if_binary
from bpe_core.corpus.specials import DEFAULT_SPECIAL_TOKEN

#: The name in its messages (``bpe-core curate`` when run as that: ``main(prog=...)``).
PROG = "curate.py"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="INPUT", help="corpus (documents separated by the special token)")
    p.add_argument("--out", required=True, metavar="FILTERED", help="output file for the kept documents")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the keep/drop hash (default 0)")
    p.add_argument("--special-token", default=DEFAULT_SPECIAL_TOKEN, metavar="TOK",
                   help=f"document separator (default: {DEFAULT_SPECIAL_TOKEN})")
    return p


def main(argv=None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    return run_main(lambda: _run(args), prog)


def _run(args) -> int:
    from bpe_core.methods.curate import curate_file

    check_input(args.input)
    check_out_file(args.out)
    warn_if_binary(args.input)
    report = curate_file(args.input, args.out, seed=args.seed, special=args.special_token)
    print(json.dumps({"output": os.path.abspath(args.out), **report.to_dict()}, indent=1))
    return 0

