"""Encode a whole corpus into one flat ``.npy`` of token ids.

    bpe-core encode corpus.txt [more inputs...] --tokenizer tok/ --out ids.npy
                                  [--workers N] [--memory-limit 8G] [--verify] [--plan] [--report run.json]
                                  [--format auto|text|jsonl|parquet] [--text-field F] [--text-column C]
                                  [--skip-bad-records] [--no-separator] [--doc-index idx.npy]
                                  [--shard-tokens N] [--profile-memory PREFIX]

Inputs (docs/inputs.md): files, directories, glob patterns, ``-``; plain or gzip/xz/zstd/bzip2
text, JSON Lines, Parquet. Two files or records are kept apart by the separator id (the first
special token), as in the ``.txt`` holding the same documents (``--no-separator``: no id).

``np.load("ids.npy", mmap_mode="r")`` opens the result (``uint16`` when the vocab fits in 65,536
ids, else ``uint32``). Document separators (special tokens) encode as their id. Progress (MB/s) goes
to stderr, a one-line summary to stdout. Bad input, or a budget too small to fit one worker: one
line on stderr, exit code 2, nothing written. ``--plan`` prints the memory plan and exits.
"""
import argparse
import json
import os
import sys

from bpe_core.runtime.atomic import atomic_write
from bpe_core.runtime.cli import (ArgumentParser, CliError, add_input_flags, check_not_an_input,
                                check_out_file, check_out_prefix, chunk_size, cluster_note, local_input_files,
                                run_main)
from bpe_core.formats.model import folder_files
from bpe_core.runtime.cli import add_cluster_flags, count, memory_size
from bpe_core.config import parse_size
from bpe_core.corpus.inputs import expand_inputs
from bpe_core.corpus.ranges import is_url
from bpe_core.runtime.progress import add_progress_flag
from bpe_core.encode.tokenizer import Tokenizer

from ._start import rerun_command

#: The name in its messages (``bpe-core encode`` when run as that: ``main(prog=...)``).
PROG = "encode_corpus.py"


def build_parser(prog: str = PROG) -> ArgumentParser:
    p = ArgumentParser(prog=prog,
                       description="Encode a whole file into one flat .npy of token ids (bounded memory, "
                                   "identical for any worker count).")
    p.add_argument("input", nargs="+", metavar="INPUT",
                   help="the corpus: files (plain text, or gzip/xz/zstd/bzip2-compressed; JSON Lines; Parquet), "
                        "directories (recursive, sorted), glob patterns, or - for stdin")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="what tools/train_bpe.py wrote (a folder with model.json, or the file)")
    p.add_argument("--out", required=True, metavar="IDS.npy", help="the .npy to write (atomically); or an fsspec URL (s3://bucket/ids/): one "
                        "part-NNNNNN.npy per shard and a manifest.json written last")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="at most this many encoding threads (default: the CPU count; the memory plan "
                        "may use fewer)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="RAM budget of the whole process tree, e.g. 8G, 500M (default: 8G, or 80%% of "
                        "the RAM available or of the memory cgroup's room when less)")
    p.add_argument("--chunk-size", type=chunk_size, default=None, metavar="SIZE",
                   help="override the planned chunk size, at least 4K, e.g. 16M")
    p.add_argument("--plan", action="store_true",
                   help="print the memory plan (workers, chunk size, estimated peak) and exit")
    p.add_argument("--verify", action="store_true",
                   help="decode a sample of chunks back and compare with the input before renaming")
    p.add_argument("--no-separator", action="store_true",
                   help="write no separator id between two files or records (by default the first special "
                        "token's id goes between them, as in the .txt holding the same documents)")
    p.add_argument("--doc-index", default=None, metavar="IDX.npy",
                   help="also write the start offset of every document in the id array (int64 .npy)")
    p.add_argument("--shard-tokens", type=_positive_count, default=None, metavar="N",
                   help="write shards of N tokens, e.g. 100M (M = 1,000,000) (OUT-g1-00000.npy, ...: each run a new generation) and "
                        "OUT.manifest.json, written last, instead of "
                        "one .npy")
    p.add_argument("--report", default=None, metavar="PATH",
                   help="write a JSON report (plan, peak RSS per phase, seconds per phase) to PATH")
    add_cluster_flags(p, "encode on a Dask cluster (pip install 'dask[distributed]'): local:N starts N "
                         "worker processes here; tcp://host:8786 uses a running scheduler; no value: the "
                         "one in DASK_SCHEDULER_ADDRESS. INPUT may then be an fsspec URL; --out must be on "
                         "a filesystem the workers share. Same ids as on one machine (docs/cluster.md)")
    add_input_flags(p)
    add_progress_flag(p)
    return p


def _positive_count(text: str) -> int:
    """``--shard-tokens``: a count (``runtime.cli.count``: ``100M`` = 100,000,000) of at least 1."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give a positive number")
    return value


def main(argv: "list[str] | None" = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    inputs = args.input[0] if len(args.input) == 1 else list(args.input)

    def check_paths() -> None:
        """The inputs and every output path, before any work; no output may be an input (the
        corpus, the tokenizer's files) or another output of the run."""
        sources = expand_inputs(inputs, args.input_format, args.text_column)      # local paths and URLs
        read = local_input_files(sources) + folder_files(args.tokenizer)
        if not args.plan and not is_url(args.out):
            check_out_file(args.out)
            if args.report:
                check_out_file(args.report)
            if args.doc_index:
                check_out_file(args.doc_index)
        if not args.plan:
            from bpe_core.encode.encode_corpus import manifest_path
            written = [p for p in (None if is_url(args.out) else args.out, args.doc_index, args.report,
                                   manifest_path(args.out) if args.shard_tokens else None) if p]
            for path in written:
                check_not_an_input(path, read)
            if args.profile_memory:
                for path in (args.profile_memory + ".json", args.profile_memory + ".png"):
                    if any(os.path.abspath(path) == os.path.abspath(w) for w in written):
                        raise CliError(f"{path}: is also an output of this run: give another --profile-memory prefix")
                    check_not_an_input(path, read)
        if args.workers is not None and args.workers < 1:
            raise CliError("--workers must be at least 1")

    if args.profile_memory:
        def profiled() -> int:
            from bpe_core.runtime.profile import profile_command, split_flag

            budget = parse_size(args.memory_limit) if args.memory_limit else None
            check_out_prefix(args.profile_memory)
            check_paths()
            prefix, rest = split_flag(argv)
            r = profile_command(rerun_command("encode", prog, rest), prefix, budget=budget)
            return r.exit_code if r.exit_code >= 0 else 128 - r.exit_code
        return run_main(profiled, prog)

    def body() -> int:
        from bpe_core.encode.encode_corpus import VerifyError, encode_corpus, plan

        limit = memory_size(args.memory_limit, CliError) if args.memory_limit else None
        check_paths()
        chunk = args.chunk_size
        tok = Tokenizer.load(args.tokenizer)
        the_plan = plan(inputs, tok, args.workers, limit, chunk, args.input_format,
                        args.text_column)             # a budget that cannot fit fails here
        note = cluster_note(args.cluster)
        if note:
            print(f"{prog}: note: {note}", file=sys.stderr)
        if args.plan:
            print(the_plan.describe())
            return 0
        try:
            result = encode_corpus(inputs, tok, args.out, num_workers=args.workers, memory_limit=limit,
                                   chunk_bytes=chunk, verify=args.verify, progress=args.progress,
                                   separator=not args.no_separator, doc_index=args.doc_index,
                                   shard_tokens=args.shard_tokens, input_format=args.input_format,
                                   text_field=args.text_field, text_column=args.text_column,
                                   skip_bad_records=args.skip_bad_records, cluster=args.cluster,
                                   cluster_timeout=args.cluster_timeout)
        except VerifyError as exc:
            print(f"{prog}: verify failed: {exc}", file=sys.stderr)
            return 1
        if args.report:
            with atomic_write(args.report, "w", encoding="utf-8") as f:
                json.dump(result.report(), f, indent=2)
                f.write("\n")
        for note in result.plan["notes"]:
            if "workers asked for" in note:   # --workers capped to what the cores and budget can use
                print(f"{prog}: note: {note}", file=sys.stderr)
        if result.bad_records.get("skipped"):
            print(f"{prog}: note: skipped {result.bad_records['skipped']:,} bad record(s) "
                  f"(--skip-bad-records); first: {result.bad_records['examples'][0]}", file=sys.stderr)
        print(result.summary())
        if result.shards:
            from bpe_core.encode.encode_corpus import manifest_path
            print(f"{len(result.shards)} shard(s); manifest {manifest_path(args.out)}")
        if args.doc_index:
            print(f"{args.doc_index}: {result.n_documents:,} document start(s)")
        return 0

    return run_main(body, prog)

