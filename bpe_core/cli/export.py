"""Export a trained tokenizer to HF ``tokenizers``, tiktoken or GPT-2 files.

    bpe-core export tok/ --format hf --out tokenizer.json
    bpe-core export tok/ --format tiktoken --out tok.tiktoken   # + tok.tiktoken.json
    bpe-core export tok/ --format gpt2 --out gpt2_dir/
    bpe-core export tok/ --format transformers --out hf_dir/   # AutoTokenizer, exact ids

DIR is what tools/train_bpe.py wrote (model.json) or a folder with GPT-2 vocab.json + merges.txt.
Every export is loaded with the library users load it with and checked on a sample of the
training input (or --check-text FILE): other ids than bpe_core on any document means exit 2 and
nothing written, unless --allow-inexact. The written paths go to stdout; bad input gives one line
on stderr and exit code 2.
"""
import os
import sys

from bpe_core.runtime.cli import ArgumentParser, CliError, check_out_file, run_main
from bpe_core.export import (FORMATS, HF_FILE, TIKTOKEN_FILE, check_exportable,
                             check_tiktoken_compatible, export_caveats, export_checked, inexact_hint)
from bpe_core.corpus import check_input
from bpe_core.formats.exactness import MAX_DOCS, InexactExport, documents_for
from bpe_core.formats.model import MERGES_FILE, REPORT_FILE, VOCAB_FILE, load_any

#: The name in its messages (``bpe-core export`` when run as that: ``main(prog=...)``).
PROG = "export_tokenizer.py"


def build_parser(prog: str = PROG) -> ArgumentParser:
    p = ArgumentParser(prog=prog, description="Export a trained tokenizer.")
    p.add_argument("model", metavar="DIR", help="folder with model.json (or the file), or GPT-2 vocab.json + merges.txt")
    p.add_argument("--format", required=True, choices=FORMATS + ("transformers",),
                   help="hf: tokenizer.json; tiktoken: ranks + sidecar .json; gpt2: vocab.json + merges.txt; "
                        "transformers: a folder AutoTokenizer.from_pretrained(DIR, trust_remote_code=True) "
                        "loads, backed by bpe_core (the exact ids, stage-aware for SuperBPE)")
    p.add_argument("--out", required=True, metavar="PATH", help="output file (hf, tiktoken) or folder (gpt2)")
    p.add_argument("--check-text", default=None, metavar="FILE",
                   help="check the export on documents drawn across FILE (default: a sample across the "
                        "training input named in train_report.json, else bpe_core's built-in check text): "
                        "the written files are loaded with the library users load them with (HF "
                        "tokenizers, tiktoken) and must give bpe_core's ids on every document")
    p.add_argument("--check-docs", type=int, default=MAX_DOCS, metavar="N",
                   help=f"check on at most N documents (default {MAX_DOCS:,}; at most 2 MB)")
    p.add_argument("--allow-inexact", action="store_true",
                   help="write an export whose ids differ from bpe_core's on some checked documents "
                        "(the share identical is printed); default: such an export is refused, exit 2")
    return p


def _report_input(model_path: str):
    """The training input that train_report.json beside the model names (None when absent)."""
    import json

    folder = model_path if os.path.isdir(model_path) else os.path.dirname(os.path.abspath(model_path))
    try:
        with open(os.path.join(folder, REPORT_FILE), encoding="utf-8") as f:
            return json.load(f).get("input_path")
    except (OSError, ValueError, AttributeError):
        return None


def _check_out(fmt: str, out: str) -> None:
    """Every file the export writes can be written (checked before any work)."""
    if fmt in ("gpt2", "transformers"):
        if os.path.exists(out) and not os.path.isdir(out):
            raise CliError(f"{out}: exists and is not a directory")
        if not os.path.isdir(out):
            check_out_file(out)                      # the folder that will hold it
            return
        names = [VOCAB_FILE, MERGES_FILE] if fmt == "gpt2" else ["model.json", "tokenizer_config.json",
                                                                 "tokenization_bpe_core.py"]
    else:
        if not os.path.isdir(out):
            names = [out] + ([out + ".json"] if fmt == "tiktoken" else [])
            for path in names:
                check_out_file(path)
            return
        base = HF_FILE if fmt == "hf" else TIKTOKEN_FILE
        names = [base] + ([base + ".json"] if fmt == "tiktoken" else [])
    for name in names:
        check_out_file(os.path.join(out, name))


def main(argv: "list[str] | None" = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        if not os.path.exists(args.model):
            raise CliError(f"{args.model}: no such file or directory")
        _check_out(args.format, args.out)
        if args.check_text is not None:
            check_input(args.check_text)
        model = load_any(args.model)
        check_exportable(model, args.format, args.model)      # an export that would misrepresent it: refused
        write_transformers = None
        if args.format == "transformers":
            try:
                from bpe_core.transformers_tokenizer import export_transformers as write_transformers
            except ImportError:
                raise CliError("--format transformers needs the transformers package (pip install transformers)") from None
        docs, on, note = documents_for(model, args.check_text, _report_input(args.model), args.check_docs)
        try:
            paths, result = export_checked(model, args.format, args.out, docs, on, args.allow_inexact,
                                           hint=inexact_hint(model, args.format), write_transformers=write_transformers)
        except InexactExport as exc:
            raise CliError(str(exc)) from None
        if note and not result.exact_by_construction:
            print(f"{prog}: note: {note}", file=sys.stderr)
        if result.exact:
            print(f"{prog}: {result.line()}", file=sys.stderr)
        else:
            print(f"{prog}: warning: written with --allow-inexact: {result.line()}", file=sys.stderr)
        for caveat in export_caveats(model, args.format):
            print(f"{prog}: note: {caveat}", file=sys.stderr)
        if args.format == "tiktoken":
            witnesses = check_tiktoken_compatible(model, limit=3)
            if witnesses:
                shown = ", ".join(repr(t) for t, _ in witnesses)
                print(f"{prog}: warning: tiktoken's rank-by-bytes rule differs from the merge "
                      f"list on some tokens (e.g. {shown}); see docs/formats.md", file=sys.stderr)
        for p in paths:
            print(p)
        return 0

    return run_main(body, prog)

