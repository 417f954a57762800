"""Profile the memory of any command: RSS of its process tree over time, with phase labels.

    bpe-core profile --out runs/train8k -- \\
        bpe-core train corpus.txt --vocab-size 8000 --memory-limit 1G

Writes ``PREFIX.json`` (samples, phases with start/end, peak, budget, command, exit code) and
``PREFIX.png`` (RSS in MiB over time, the budget line, the phases shaded; needs matplotlib:
``pip install matplotlib``). bpe_core processes label their phases through the file named by
``BPE_CORE_PHASE_FILE``, which this tool sets. The exit code is the command's. The command's own
output is left alone; this tool's summary line goes to stderr.
"""
import argparse
import os
import sys

from bpe_core.runtime.cli import ArgumentParser, CliError, check_out_prefix
from bpe_core.config import parse_size

#: The name in its messages (``bpe-core profile`` when run as that: ``main(prog=...)``).
PROG = "profile_memory.py"


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        usage="%(prog)s [--interval SECONDS] [--budget SIZE] [--no-plot] --out PREFIX -- COMMAND ...",
        description="Run COMMAND, sample the RSS of its process tree, write PREFIX.json and PREFIX.png.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: bpe-core profile --out run -- bpe-core train c.txt "
               "--memory-limit 1G",
    )
    p.add_argument("--out", required=True, metavar="PREFIX",
                   help="output path without extension: PREFIX.json and PREFIX.png")
    p.add_argument("--interval", type=_interval, default=0.1, metavar="SECONDS",
                   help="seconds between samples (default: 0.1)")
    p.add_argument("--budget", type=_size, default=None, metavar="SIZE",
                   help="memory limit drawn as a line, e.g. 8G (default: the command's --memory-limit, "
                        "if any)")
    p.add_argument("--no-plot", action="store_true", help="write the JSON only")
    return p


def main(argv: "list[str] | None" = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    if "--" in argv:
        at = argv.index("--")
        opts, cmd = argv[:at], argv[at + 1:]
    else:
        opts, cmd = argv, []
    args = parser.parse_args(opts)           # --help exits 0 here; bad flags exit 2 with one line
    if not cmd:
        parser.error("give the command to profile after --")
    try:                                     # before the command runs, not after
        check_out_prefix(args.out, (".json",) if args.no_plot else (".json", ".png"))
    except CliError as exc:
        parser.error(str(exc))

    from bpe_core.runtime.profile import profile_command

    result = profile_command(cmd, args.out, interval=args.interval, budget=args.budget,
                             plot=not args.no_plot, prog=prog[:-3] if prog.endswith(".py") else prog)
    return result.exit_code if result.exit_code >= 0 else 128 - result.exit_code

