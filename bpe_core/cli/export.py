"""Export a trained tokenizer to HF ``tokenizers``, tiktoken or GPT-2 files.

    bpe-core export tok/ --format hf --out tokenizer.json
    bpe-core export tok/ --format tiktoken --out tok.tiktoken   # + tok.tiktoken.json
    bpe-core export tok/ --format gpt2 --out gpt2_dir/
    bpe-core export tok/ --format transformers --out hf_dir/   # AutoTokenizer, exact ids

DIR is what tools/train_bpe.py wrote (model.json) or a folder with GPT-2 vocab.json + merges.txt.
The written paths go to stdout; bad input gives one line on stderr and exit code 2.
"""
import os
import sys

from bpe_core.runtime.cli import ArgumentParser, CliError, check_out_file, run_main
from bpe_core.export import (FORMATS, HF_FILE, TIKTOKEN_FILE, check_exportable,
                             check_tiktoken_compatible, export, export_caveats)
from bpe_core.corpus import check_input
from bpe_core.formats.model import MERGES_FILE, VOCAB_FILE, load_any

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
                   help="hf: encode FILE's documents (split on the special tokens, else at blank lines) "
                        "with the written tokenizer.json and with bpe_core, and print the share of "
                        "documents with identical ids and the token-count gap (default: the packaged "
                        "sample text; needs HF tokenizers)")
    p.add_argument("--check-docs", type=int, default=2000, metavar="N",
                   help="check at most the first N documents (default 2000)")
    return p


def _check_hf(model, text_path, max_docs, prog: str = PROG) -> None:
    """Print how the written tokenizer.json agrees with bpe_core's own encoder (stderr)."""
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        print(f"{prog}: note: HF tokenizers is not installed, so the export was not compared "
              "with bpe_core's ids", file=sys.stderr)
        return
    from bpe_core.evaluate import hf_agreement, split_documents
    if text_path is None:
        from importlib.resources import files
        text_path = str(files("bpe_core") / "data" / "sample.txt")
    with open(text_path, "rb") as f:
        data = f.read(64 << 20)
    agree = hf_agreement(model, split_documents(data, model), max_docs)
    print(f"{prog}: {agree.line()} on {os.path.basename(text_path)}", file=sys.stderr)


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
        if args.format == "transformers":
            try:
                from bpe_core.transformers_tokenizer import export_transformers
            except ImportError:
                raise CliError("--format transformers needs the transformers package (pip install transformers)") from None
            from bpe_core.formats.model import check_model
            check_model(model)
            paths = export_transformers(model, args.out)
        else:
            paths = export(model, args.format, args.out)
        if args.format == "hf":
            _check_hf(model, args.check_text, args.check_docs, prog)
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

