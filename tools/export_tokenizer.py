#!/usr/bin/env python3
"""Export a trained tokenizer to HF ``tokenizers``, tiktoken or GPT-2 files.

    python tools/export_tokenizer.py tok/ --format hf --out tokenizer.json
    python tools/export_tokenizer.py tok/ --format tiktoken --out tok.tiktoken   # + tok.tiktoken.json
    python tools/export_tokenizer.py tok/ --format gpt2 --out gpt2_dir/

DIR is what tools/train_bpe.py wrote (model.json) or a folder with GPT-2 vocab.json + merges.txt.
The written paths go to stdout; bad input gives one line on stderr and exit code 2.
"""
from __future__ import annotations

import os
import sys

try:
    import bpe_core  # noqa: F401  (the installed package)
except ImportError:  # a checkout built in place, not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bpe_core.cli_util import ArgumentParser, CliError, check_out_file, run_main  # noqa: E402
from bpe_core.export import FORMATS, check_tiktoken_compatible, export, export_caveats, load_any  # noqa: E402


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="export_tokenizer.py", description="Export a trained tokenizer.")
    p.add_argument("model", metavar="DIR", help="folder with model.json (or the file), or GPT-2 vocab.json + merges.txt")
    p.add_argument("--format", required=True, choices=FORMATS, help="hf: tokenizer.json; tiktoken: ranks + "
                   "sidecar .json; gpt2: vocab.json + merges.txt")
    p.add_argument("--out", required=True, metavar="PATH", help="output file (hf, tiktoken) or folder (gpt2)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        if not os.path.exists(args.model):
            raise CliError(f"{args.model}: no such file or directory")
        model = load_any(args.model)
        if args.format == "gpt2":
            if os.path.exists(args.out) and not os.path.isdir(args.out):
                raise CliError(f"{args.out}: exists and is not a directory")
            parent = os.path.dirname(os.path.abspath(args.out))
            if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
                raise CliError(f"{args.out}: folder {parent} does not exist or is not writable")
        elif not os.path.isdir(args.out):
            check_out_file(args.out)
        paths = export(model, args.format, args.out)
        for caveat in export_caveats(model, args.format):
            print(f"export_tokenizer.py: note: {caveat}", file=sys.stderr)
        if args.format == "tiktoken":
            witnesses = check_tiktoken_compatible(model, limit=3)
            if witnesses:
                shown = ", ".join(repr(t) for t, _ in witnesses)
                print(f"export_tokenizer.py: warning: tiktoken's rank-by-bytes rule differs from the merge "
                      f"list on some tokens (e.g. {shown}); see docs/formats.md", file=sys.stderr)
        for p in paths:
            print(p)
        return 0

    return run_main(body, "export_tokenizer.py")


if __name__ == "__main__":
    sys.exit(main())
