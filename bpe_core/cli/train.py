"""Train a byte-level BPE tokenizer.

    bpe-core train corpus.txt --vocab-size 32000 --out tok/

Writes into the output folder: ``vocab.json`` + ``merges.txt`` (GPT-2 byte-to-unicode convention,
loadable by HF ``tokenizers``), ``model.json`` (the native model: exact bytes, pattern, special
tokens), and ``train_report.json`` (sizes, seconds per phase, peak memory); for plain BPE also HF's
``tokenizer.json`` + ``tokenizer_config.json`` when, loaded with HF ``tokenizers``, they give the
same ids on a sample across the training input (or ``--check-text FILE``), else the report says why
they are left out. The folder is published as
one unit (written in a temp folder that then replaces it in one step): an interrupted run leaves the
older model whole, or no folder where there was none (docs/formats.md, "Output sets").
"""
import argparse
import dataclasses
import os
import sys

from bpe_core.runtime.cli import (ArgumentParser, CliError, add_input_flags, check_not_an_input,
                                check_out_dir, check_out_prefix, check_work_dir, chunk_size, cluster_note,
                                count, local_input_files, run_main)
from bpe_core.runtime.cli import add_cluster_flags, memory_size
from bpe_core.config import TrainConfig
from bpe_core.corpus import CorpusError
from bpe_core.formats import registry
from bpe_core.corpus import check_input
from bpe_core.formats.model import FOLDER_FILES, folder_files
from bpe_core.corpus.specials import DEFAULT_SPECIAL_TOKEN
from bpe_core.pretok.patterns import is_pattern_name, pattern_name, pattern_names
from bpe_core.runtime.progress import add_progress_flag

from ._start import rerun_command

#: The name in its messages (``bpe-core train`` when run as that: ``main(prog=...)``).
PROG = "train_bpe.py"
SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "sample.txt")


def _default_input() -> str:
    try:
        from importlib.resources import files

        return str(files("bpe_core") / "data" / "sample.txt")
    except Exception:  # pragma: no cover - running from a checkout without the package installed
        return SAMPLE


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        description="Train a byte-level BPE tokenizer (exact, deterministic, any worker count).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Output files: vocab.json, merges.txt (GPT-2 form), model.json (native), train_report.json; "
               "for plain BPE also tokenizer.json + tokenizer_config.json (HF: AutoTokenizer.from_pretrained).\n"
               "Example: bpe-core train corpus.txt --vocab-size 32000 --out tok/ (in a clone: python tools/train_bpe.py ...)",
    )
    p.add_argument("input", nargs="*", default=None, metavar="INPUT",
                   help="training corpus: files (plain text, or gzip/xz/zstd/bzip2-compressed; JSON Lines; "
                        "Parquet), directories (recursive, sorted), glob patterns, or - for stdin; "
                        "default: the small sample corpus shipped in the package")
    p.add_argument("--vocab-size", type=count, default=32000, metavar="N",
                   help="vocabulary size: 256 bytes + special tokens + merges, e.g. 32000 or 32k "
                        "(k = 1,000; 32Ki = 32,768) (default: 32000)")
    p.add_argument("--out", default="bpe_tokenizer", metavar="DIR",
                   help="output folder, made by the run; the folder above it must exist "
                        "(default: ./bpe_tokenizer)")
    p.add_argument("--special-token", action="append", dest="special_tokens", metavar="TOK",
                   help=f"a special token, split out before counting and never merged; repeat for "
                        f"several (default: {DEFAULT_SPECIAL_TOKEN})")
    p.add_argument("--no-special-tokens", action="store_true", help="use no special tokens at all")
    p.add_argument("--pattern", default=None, metavar="NAME",
                   help=f"pre-tokenization pattern by name, any case: {pattern_names()} (default: gpt2)")
    p.add_argument("--regex", default=None, metavar="REGEX",
                   help="a custom pre-tokenization regex (Python 'regex' syntax) instead of --pattern; "
                        "text it does not match becomes pretokens of its own")
    p.add_argument("--workers", "--num-workers", type=int, default=None, dest="num_workers", metavar="N",
                   help="pre-tokenization worker threads (default: one per CPU core; capped at the cores)")
    p.add_argument("--chunk-size", type=chunk_size, default=None, dest="chunk_bytes", metavar="SIZE",
                   help="target chunk size for pre-tokenization, at least 4K, e.g. 64M (default: chosen "
                        "from the input)")
    p.add_argument("--chunk-bytes", type=chunk_size, dest="chunk_bytes", help=argparse.SUPPRESS)  # the old name
    p.add_argument("--memory-limit", type=memory_size, default=None, metavar="SIZE",
                   help="RAM budget for the whole process tree, e.g. 8G or 500M (default: 8G, or 80%% of "
                        "the RAM available or of the memory cgroup's room when less); the run plans "
                        "workers, chunks and spilling to fit")
    p.add_argument("--plan", action="store_true",
                   help="print the memory plan (workers, chunk size, spilling, estimated peak) and exit")
    p.add_argument("--min-pretoken-count", type=int, default=1, metavar="N",
                   help="drop pretokens seen fewer than N times before merging; saves memory but "
                        "CHANGES THE RESULT (default: 1, keep all)")
    p.add_argument("--spill-dir", default=None, metavar="DIR",
                   help="folder for sorted runs of the pretoken table when it outgrows the budget "
                        "(default: the system temp folder)")
    add_cluster_flags(p, "count on a Dask cluster (pip install 'dask[distributed]'): local:N starts N "
                         "worker processes here; tcp://host:8786 uses a running scheduler; no value: the "
                         "one in DASK_SCHEDULER_ADDRESS. INPUT may then be an fsspec URL (s3://, gs://, "
                         "hf://, ...). Same merges as on one machine (docs/cluster.md)")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help="start from an existing BPE tokenizer: a bpe_core folder (model.json) or GPT-2 "
                        "vocab.json + merges.txt; bpe continues its merges up to --vocab-size, superbpe "
                        "runs stage 2 on top of it (its size is the transition). Its special tokens and "
                        "pattern must be this run's (docs/superbpe.md)")
    p.add_argument("--tie-break", choices=["bytes", "hf"], default="bytes",
                   help="among pairs of equal count: bytes (default, CS336: the greatest (left, right) "
                        "bytes) or hf (HF tokenizers' BpeTrainer order, so the merges are HF's on the "
                        "same pre-tokenization; --method bpe only)")
    g = p.add_argument_group("SuperBPE (--method superbpe)")
    p.add_argument("--method", choices=registry.names(), default="bpe",
                   help="bpe (default) or superbpe: a second stage that merges across whitespace "
                        "boundaries from the transition point on (Liu et al., 2025); supratok: "
                        "PMI-seeded and scored multiword passes (Tanase & Pelican, 2025; "
                        "--transition is its pass-1 size)")
    g.add_argument("--transition", type=_transition, default=None, metavar="T",
                   help="where stage 2 starts: a vocabulary size (e.g. 12800) or a fraction of "
                        "--vocab-size (e.g. 0.4, the default: the paper's most compression-efficient "
                        "ratio; its downstream-best was 0.9). T = vocab size is plain BPE; "
                        "T = 256 + specials is BPE without pre-tokenization")
    g.add_argument("--stage2-split", choices=["hf", "units", "official"], default="hf",
                   help="stage-2 units: hf (default: between document edges, special tokens, numbers "
                        "and inside whitespace runs; the exported tokenizer.json splits the same way), "
                        "units (the previous default: numbers cut into digit groups between stage-1 "
                        "tokens) or official (the official implementation's stage-2 pre-tokenizer)")
    g.add_argument("--max-digits", type=int, default=3, metavar="N",
                   help="no stage-2 token holds a run of more than N digits (default: 3)")
    g.add_argument("--stage2-duplicates", action="store_true",
                   help="let stage 2 merge pairs whose bytes are already a token (each such merge "
                        "spends an id on bytes another id holds); default: never, so V ids are V "
                        "different strings")
    g.add_argument("--keep-encoded", action="store_true",
                   help="let stage-2 text that looks like encoded binary (uuencode) count; "
                        "default: they count for nothing in stage 2 (SupraTok: pass 2), so no such "
                        "junk tokens are learned (stage 1 is unaffected)")
    g.add_argument("--max-words", type=int, default=4, metavar="N",
                   help="stage-2 tokens span at most N words (default: 4)")
    g.add_argument("--forbid", action="append", default=None, metavar="TEXT",
                   help='no stage-2 token contains TEXT (repeatable; default: ": ")')
    g.add_argument("--max-token-bytes", type=int, default=None, metavar="N",
                   help="guardrail: no stage-2 token longer than N bytes; with --method bpe, no token "
                        "longer than N bytes at all (off by default: a corpus of one repeated byte then "
                        "builds tokens as long as its longest run; docs/memory.md)")
    g.add_argument("--max-nonalnum", type=int, default=None, metavar="N",
                   help="guardrail: at most N characters per stage-2 token that are neither "
                        "alphanumeric nor whitespace (keeps table rules and URL prefixes out)")
    s = p.add_argument_group("SupraTok (--method supratok; docs/supratok.md)")
    s.add_argument("--pass2-cross", choices=("all", "words", "seeds", "none"), default=_DEFAULTS["pass2_cross"],
                   help="pass 2: which pretoken boundaries a merge may cross: all (as SuperBPE's stage 2), "
                        "words (word-word only), seeds (inside a PMI seed phrase, the paper) or none "
                        f"(default {_DEFAULTS['pass2_cross']})")
    s.add_argument("--seed-pmi", type=float, default=2.0, metavar="BITS",
                   help="pass 2: minimum PMI of a seed phrase (default 2.0)")
    s.add_argument("--seed-min-count", type=int, default=100, metavar="N",
                   help="pass 2: minimum count of a seed phrase (default 100)")
    s.add_argument("--seed-max-n", type=int, default=6, metavar="N", help="pass 2: longest seed, in words (default 6)")
    s.add_argument("--span-pmi", type=float, default=5.0, metavar="BITS",
                   help="pass 3: candidate screening PMI (default 5.0)")
    s.add_argument("--span-min-count", type=int, default=5, metavar="N",
                   help="pass 3: candidate screening count (default 5)")
    s.add_argument("--span-max-n", type=int, default=5, metavar="N", help="pass 3: longest span, in words (default 5)")
    s.add_argument("--span-max-candidates", type=int, default=4000, metavar="N",
                   help="pass 3: candidates scored per span length (default 4000)")
    s.add_argument("--heldout-fraction", type=float, default=_DEFAULTS["heldout_fraction"], metavar="F",
                   help="share of documents held out (by hash) for pass-3 gains, when pass 3 runs "
                        f"(default {_DEFAULTS['heldout_fraction']})")
    s.add_argument("--supratok-rounds", type=int, default=_DEFAULTS["supratok_rounds"], metavar="N",
                   help=f"pass-3 rounds of leaf surgery; 0: no pass 3 (default {_DEFAULTS['supratok_rounds']})")
    s.add_argument("--no-script-aware", action="store_true",
                   help="turn off script-aware processing (bigram gate, suffix gate, hamza normalization)")
    s.add_argument("--script-bigram-min", type=int, default=50, metavar="N",
                   help="character-bigram count the Chinese/Japanese/Thai gate needs (default 50)")
    s.add_argument("--entropy-filter", action="store_true",
                   help="curate the input by character-bigram entropy before training (any method; "
                        "see tools/curate.py)")
    s.add_argument("--entropy-seed", type=int, default=0, metavar="S", help="seed of --entropy-filter (default 0)")
    p.add_argument("--check-text", default=None, metavar="FILE",
                   help="check tokenizer.json on documents drawn across FILE before writing it (default: a "
                        "sample across the training input); on other ids than bpe_core it is left out")
    p.add_argument("--allow-inexact", action="store_true",
                   help="write tokenizer.json even where it gives other ids than bpe_core on some checked "
                        "documents (the share identical goes into train_report.json)")
    add_input_flags(p)
    add_progress_flag(p)
    return p


def _pattern(args) -> str:
    """The pattern from ``--pattern NAME`` (names only) or ``--regex REGEX`` (always a regex)."""
    if args.pattern is not None and args.regex is not None:
        raise CliError("--pattern and --regex contradict each other (give one)")
    if args.regex is not None:
        if not args.regex:
            raise CliError("--regex: the regex is empty")
        # A regex without metacharacters would be read as a name: (?:...) keeps its meaning.
        return f"(?:{args.regex})" if is_pattern_name(args.regex) else args.regex
    if args.pattern is None:
        return "gpt2"
    name = pattern_name(args.pattern)
    if name is None or not is_pattern_name(args.pattern):
        raise CliError(f"--pattern: unknown pattern name {args.pattern!r}; the names are {pattern_names()} "
                       f"(for a custom regex use --regex)")
    return name


def _transition(text: str) -> "float | int":
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"transition must be positive, got {text}")
    return value if value <= 1 else int(value)


def main(argv: "list[str] | None" = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    args.prog = prog
    if args.profile_memory:
        def profiled() -> int:
            from bpe_core.runtime.profile import profile_command, split_flag

            check_out_prefix(args.profile_memory)
            _check_paths(args)                  # the run's own paths too, before it starts
            prefix, rest = split_flag(argv)
            r = profile_command(rerun_command("train", prog, rest), prefix,
                                budget=args.memory_limit)
            return r.exit_code if r.exit_code >= 0 else 128 - r.exit_code
        return run_main(profiled, prog)
    return run_main(lambda: _train(args), prog)


def _inputs(args):
    """The input specs: one path as a str (as before), several as a list; the sample by default."""
    if not args.input:
        return _default_input()
    return args.input[0] if len(args.input) == 1 else list(args.input)


def _check_paths(args):
    """Check the inputs and every output path before any work; returns the sources found
    (``corpus.inputs.expand_inputs``: the plan takes them instead of finding them again)."""
    from bpe_core.corpus.inputs import expand_inputs

    input_path = _inputs(args)
    sources = expand_inputs(input_path, args.input_format, args.text_column)      # local paths and URLs
    if args.spill_dir is not None:
        check_work_dir(args.spill_dir, "--spill-dir folder")
    inputs = local_input_files(sources) + (folder_files(args.init_from) if args.init_from else [])
    outputs = [] if args.plan else [os.path.join(args.out, name) for name in FOLDER_FILES]
    if not args.plan:
        check_out_dir(args.out)
    if args.profile_memory:
        for path in (args.profile_memory + ".json", args.profile_memory + ".png"):
            if any(os.path.abspath(path) == os.path.abspath(out) for out in outputs):
                raise CliError(f"{path}: is also an output of this run (the model folder {args.out}): "
                               "give another --profile-memory prefix")
            check_not_an_input(path, inputs)
    for path in outputs:
        check_not_an_input(path, inputs)
    return sources


def _train(args) -> int:
    from bpe_core.training import train

    input_path = _inputs(args)
    if args.no_special_tokens and args.special_tokens:
        raise CliError("--no-special-tokens and --special-token contradict each other")
    specials = () if args.no_special_tokens else tuple(args.special_tokens or (DEFAULT_SPECIAL_TOKEN,))
    pattern = _pattern(args)
    try:
        config = TrainConfig(input_path=input_path, vocab_size=args.vocab_size, special_tokens=specials,
                             pattern=pattern, num_workers=args.num_workers,
                             chunk_bytes=args.chunk_bytes, memory_limit=args.memory_limit,
                             min_pretoken_count=args.min_pretoken_count, spill_dir=args.spill_dir,
                             method=args.method, transition=args.transition,
                             stage2_split=args.stage2_split, max_words=args.max_words,
                             forbidden=tuple(args.forbid) if args.forbid is not None else (": ",),
                             max_token_bytes=args.max_token_bytes, max_nonalnum=args.max_nonalnum,
                             max_digits=args.max_digits, stage2_duplicates=args.stage2_duplicates,
                             stage2_skip_encoded=not args.keep_encoded,
                             seed_pmi=args.seed_pmi, seed_min_count=args.seed_min_count,
                             seed_max_n=args.seed_max_n, pass2_cross=args.pass2_cross, span_pmi=args.span_pmi,
                             span_min_count=args.span_min_count, span_max_n=args.span_max_n,
                             span_max_candidates=args.span_max_candidates,
                             heldout_fraction=args.heldout_fraction, supratok_rounds=args.supratok_rounds,
                             script_aware=not args.no_script_aware, script_bigram_min=args.script_bigram_min,
                             entropy_filter=args.entropy_filter, entropy_seed=args.entropy_seed,
                             progress=args.progress, input_format=args.input_format,
                             text_field=args.text_field, text_column=args.text_column,
                             skip_bad_records=args.skip_bad_records, cluster=args.cluster,
                             cluster_timeout=args.cluster_timeout,
                             init_from=args.init_from, tie_break=args.tie_break)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    from bpe_core.runtime.memmon import phase
    from bpe_core.training import plan

    sources = _check_paths(args)
    if args.check_text is not None:
        check_input(args.check_text)
    the_plan = plan(config, sources)  # a budget that cannot fit fails here, before any work
    note = cluster_note(args.cluster)
    if note:
        print(f"{args.prog}: note: {note}", file=sys.stderr)
    if args.plan:
        print(the_plan.describe())
        return 0
    out = args.out

    result = train(config)
    report = result.report
    if report["input_bytes"] == 0:     # a tokenizer of the 256 bytes alone is no use: say so, write nothing
        names = ", ".join("standard input (-)" if p == "-" else p
                          for p in ([input_path] if isinstance(input_path, str) else input_path))
        raise CliError(f"{names}: no text to train on (the input is empty)")
    bad = report.get("bad_records") or {}
    if bad.get("skipped"):
        print(f"{args.prog}: note: skipped {bad['skipped']:,} bad record(s) (--skip-bad-records); first: "
              f"{bad['examples'][0]}", file=sys.stderr)
    init = report.get("init_from")
    if init is not None and init["ids"] != "kept":
        print(f"{args.prog}: note: {args.init_from}: ids follow bpe_core's layout (bytes 0-255, special "
              f"tokens, then the merges in order), not the init files' ids", file=sys.stderr)
    if report["merges"] < report["merges_requested"]:
        cap = getattr(args, "max_token_bytes", None)
        why = ("the corpus has no more pairs whose token fits --max-token-bytes "
               f"{cap:,}" if cap else "the corpus has no more pairs")
        print(f"{args.prog}: warning: {input_path}: only {report['merges']} merges were possible "
              f"(asked for {report['merges_requested']}): {why}; "
              f"vocabulary size is {len(result.vocab)}", file=sys.stderr)
    phase("write")
    # HF's files are checked on the user's text first (a sample across the input, or --check-text);
    # the encoder (numpy with it) is loaded for that only
    from bpe_core.formats.exactness import documents_for, hf_folder_check

    docs, on, check_note = documents_for(result.model, args.check_text, input_path)
    from bpe_core.encode.tokenizer import model_encoder
    # the whole folder in one step: a run killed at any point leaves the older model or this one
    # + HF's files for plain BPE, when they pass; the report's peaks include the writing (and the check)
    dropped = result.publish(out, hf_check=hf_folder_check(model_encoder(result.model), docs, on, args.allow_inexact))
    hf = report.get("hf_files")
    if hf is not None:
        if check_note and hf.get("check") and not hf["check"]["exact"]:
            print(f"{args.prog}: note: {check_note}", file=sys.stderr)
        if not hf["written"]:
            print(f"{args.prog}: note: {hf['why']}; the rest of the folder is complete (model.json gives the "
                  f"exact ids: Tokenizer.load, bpe-core export --format transformers)", file=sys.stderr)
        elif not hf["check"]["exact"]:
            print(f"{args.prog}: warning: {hf['why']}", file=sys.stderr)
        # (exact: said in train_report.json only, with the documents checked and the cost)
    if registry.get(args.method).stage_aware:
        name = registry.get(args.method).name
        print(f"{args.prog}: note: vocab.json/merges.txt hold one merge list; tools that load them "
              f"(HF tokenizers) apply it without the {name} method's stages, so their ids can differ from "
              f"bpe_core's stage-aware encoder (model.json); see docs/{name}.md", file=sys.stderr)
    if dropped:
        print(f"{args.prog}: note: {len(dropped)} merge(s) rebuilt bytes that an earlier token already "
              f"has; vocab.json lists each string once (the smaller id)", file=sys.stderr)
    for note in report["plan"]["notes"]:
        if "workers asked for" in note:       # --workers capped to what the cores and budget can use
            print(f"{args.prog}: note: {note}", file=sys.stderr)
    secs = report["seconds"]
    # the method may name its own phases (SupraTok: documents, passes, statistics, final count)
    phases = report.get("summary_phases") or [["pre-tokenize", "pretokenize"], ["merges", "merge_loop"]]
    print(f"trained {len(result.merges)} merges, vocab {len(result.vocab)} on {report['input_bytes']:,} bytes "
          f"({report['unique_pretokens']:,} unique pretokens) in {secs['total']:.2f}s "
          f"[{', '.join(f'{label} {secs.get(key, 0):.2f}s' for label, key in phases)}]")
    for name in FOLDER_FILES:          # model.json, vocab.json, merges.txt, the report, HF's files
        if os.path.exists(os.path.join(out, name)):
            print(os.path.join(out, name))
    return 0

