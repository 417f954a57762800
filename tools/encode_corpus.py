#!/usr/bin/env python3
"""Encode a whole corpus into one flat ``.npy`` of token ids.

    python tools/encode_corpus.py corpus.txt --tokenizer tok/ --out ids.npy [--workers N]
                                  [--memory-limit 8G] [--verify]

``np.load("ids.npy", mmap_mode="r")`` opens the result (``uint16`` when the vocab fits in 65,536
ids, else ``uint32``). Document separators (special tokens) encode as their id. Progress (MB/s) goes
to stderr, a one-line summary to stdout. Bad input: one line on stderr, exit code 2, nothing written.
"""
from __future__ import annotations

import os
import sys

try:
    import bpe_core  # noqa: F401  (the installed package)
except ImportError:  # a checkout built in place (python setup.py build_ext --inplace), not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bpe_core.cli_util import ArgumentParser, CliError, check_out_file, run_main  # noqa: E402
from bpe_core.config import parse_size  # noqa: E402
from bpe_core.corpus import check_input  # noqa: E402
from bpe_core.encode_corpus import VerifyError, encode_corpus  # noqa: E402
from bpe_core.tokenizer import Tokenizer  # noqa: E402


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="encode_corpus.py",
                       description="Encode a whole file into one flat .npy of token ids (bounded memory, "
                                   "identical for any worker count).")
    p.add_argument("input", metavar="INPUT", help="the corpus (read as bytes)")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="what tools/train_bpe.py wrote (a folder with model.json, or the file)")
    p.add_argument("--out", required=True, metavar="IDS.npy", help="the .npy to write (atomically)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="encoding processes (default: from the memory limit and the CPU count)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="RAM budget of the whole process tree, e.g. 8G, 500M (default: none)")
    p.add_argument("--chunk-size", default=None, metavar="SIZE",
                   help="override the planned chunk size, e.g. 16M")
    p.add_argument("--verify", action="store_true",
                   help="decode a sample of chunks back and compare with the input before renaming")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        check_input(args.input)
        check_out_file(args.out)
        if args.workers is not None and args.workers < 1:
            raise CliError("--workers must be at least 1")
        limit = parse_size(args.memory_limit) if args.memory_limit else None
        chunk = parse_size(args.chunk_size) if args.chunk_size else None
        tok = Tokenizer.load(args.tokenizer)
        try:
            result = encode_corpus(args.input, tok, args.out, num_workers=args.workers, memory_limit=limit,
                                   chunk_bytes=chunk, verify=args.verify, progress=not args.no_progress)
        except VerifyError as exc:
            print(f"encode_corpus.py: verify failed: {exc}", file=sys.stderr)
            return 1
        print(result.summary())
        return 0

    return run_main(body, "encode_corpus.py")


if __name__ == "__main__":
    sys.exit(main())
