"""Evaluate tokenizers on text files: bytes/token, characters/token, round trip, the share of tokens
that cross a word boundary, and the longest tokens.

    bpe-core evaluate --tokenizer tok_bpe/ tok_superbpe/ --text heldout.txt code.txt
    bpe-core evaluate --sweep-transition 0.1 0.25 0.4 0.6 0.9 --train train.txt \\
        --vocab-size 8000 --text heldout.txt

Every model is encoded by the encoder that reproduces its training (stage-aware for SuperBPE).
``--sweep-transition`` trains one SuperBPE tokenizer per transition point (plus plain BPE) on
``--train`` and evaluates each.
"""
import argparse
import json
import os
import sys
import tempfile

from bpe_core.runtime.atomic import atomic_write
from bpe_core.runtime.cli import ArgumentParser, CliError, check_out_file, count, run_main
from bpe_core.corpus import check_input

#: The name in its messages (``bpe-core evaluate`` when run as that: ``main(prog=...)``).
PROG = "evaluate.py"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", nargs="+", default=[], metavar="DIR", help="tokenizer folders: model.json (what train_bpe.py wrote), or GPT-2 vocab.json + merges.txt")
    p.add_argument("--text", nargs="+", required=True, metavar="FILE", help="text files to encode")
    p.add_argument("--max-bytes", type=int, default=None, metavar="N", help="use the first N bytes of each file")
    p.add_argument("--longest", type=int, default=8, metavar="K", help="show the K longest tokens (default 8)")
    p.add_argument("--sweep-transition", nargs="+", type=float, default=None, metavar="T",
                   help="train SuperBPE at these transitions (fractions or sizes) and plain BPE on --train")
    p.add_argument("--train", default=None, metavar="FILE", help="training corpus for --sweep-transition")
    p.add_argument("--vocab-size", type=count, default=8000, metavar="N",
                   help="vocabulary size for --sweep-transition, e.g. 8000 or 8K (= 8,192) (default: 8000)")
    p.add_argument("--without-uuencode", action="store_true",
                   help="also score each file without its full uuencode lines ('M' and 60 characters of "
                        "0x21-0x60: the encoded binaries some corpora carry), as a file of its own")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the scores as JSON")
    p.add_argument("--hf", action="store_true",
                   help="also encode each file's documents with the model's HF tokenizer.json export (HF "
                        "tokenizers) and print the share of documents with identical ids and the token gap")
    p.add_argument("--hf-docs", type=int, default=None, metavar="N", help="--hf: the first N documents only")
    return p


def main(argv=None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    return run_main(lambda: _run(args), prog)


def _run(args) -> int:
    from bpe_core import TrainConfig, train
    from bpe_core.evaluate import as_dict, load_encoder, longest_tokens, score, show_token, token_change
    from bpe_core.formats.model import dump_model

    for path in args.text:
        check_input(path)
    if args.json:
        check_out_file(args.json)            # before any work, not after it
    entries = []            # (name, model, encode)
    for d in args.tokenizer:
        if not os.path.exists(d):
            raise CliError(f"{d}: no such tokenizer folder")
        model, encode = load_encoder(d)
        entries.append((os.path.basename(os.path.normpath(d)), model, encode))
    tmp = None
    if args.sweep_transition:
        if not args.train:
            raise CliError("--sweep-transition needs --train FILE")
        check_input(args.train)
        tmp = tempfile.TemporaryDirectory(prefix="bpe_core-sweep-")
        runs = [("bpe", dict(method="bpe"))] + [
            (f"superbpe t={t:g}", dict(method="superbpe", transition=(t if t <= 1 else int(t))))
            for t in args.sweep_transition]
        for name, opts in runs:
            result = train(TrainConfig(args.train, args.vocab_size, **opts))
            folder = os.path.join(tmp.name, name.replace(" ", "_").replace("=", ""))
            os.makedirs(folder)
            dump_model(result.model, os.path.join(folder, "model.json"))
            model, encode = load_encoder(folder)
            secs = result.report["seconds"]["total"]
            print(f"trained {name}: {secs:.1f}s, peak RSS {result.report['memory']['peak_rss_bytes'] >> 20} MiB",
                  file=sys.stderr)
            entries.append((name, model, encode))
    if not entries:
        raise CliError("nothing to evaluate: give --tokenizer DIR or --sweep-transition")
    scores = []
    print("| tokenizer | file | bytes/token | chars/token | tokens | cross-word tokens | round trip |")
    print("|---|---|---|---|---|---|---|")
    files = []              # the file labels, in order (with --without-uuencode, each file twice)
    for name, model, encode in entries:
        for path in args.text:
            for skip in ((False, True) if args.without_uuencode else (False,)):
                s = score(name, model, encode, path, args.max_bytes, skip_uuencode=skip)
                scores.append(s)
                if s.file not in files:
                    files.append(s.file)
                print(f"| {name} | {s.file} | {s.bytes_per_token:.3f} | {s.chars_per_token:.3f} | {s.n_tokens:,} | "
                      f"{100 * s.cross_word_share:.1f}% | {'ok' if s.round_trip else 'FAILED'} |")
    if len(entries) > 1:
        base = entries[0][0]
        print(f"\ncompared with {base}:")
        for label in files:
            ref = next(s for s in scores if s.tokenizer == base and s.file == label)
            for s in scores:
                if s.tokenizer != base and s.file == ref.file:
                    print(f"  {s.tokenizer} on {s.file}: {token_change(s.n_tokens, ref.n_tokens)}")
    if args.hf:
        from bpe_core.evaluate import hf_agreement, split_documents
        print()
        for name, model, _ in entries:
            for path in args.text:
                with open(path, "rb") as f:
                    data = f.read(args.max_bytes) if args.max_bytes else f.read()
                agree = hf_agreement(model, split_documents(data, model), args.hf_docs)
                print(f"{name} on {os.path.basename(path)}: {agree.line()}")
    if args.longest:
        for name, model, _ in entries:
            toks = ", ".join(show_token(t) for t in longest_tokens(model, args.longest))
            print(f"\nlongest tokens of {name}: {toks}")
    if args.json:
        with atomic_write(args.json, "w", encoding="utf-8") as f:
            json.dump([as_dict(s) for s in scores], f, indent=1)
    if tmp is not None:
        tmp.cleanup()
    return 0 if all(s.round_trip for s in scores) else 1

