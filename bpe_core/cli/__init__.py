"""The ``bpe-core`` command: ``bpe-core train|encode|export|profile|evaluate|curate ...``.

Installed with the package as a console script (``bpe-core``), and run as ``python -m bpe_core``;
``tools/train_bpe.py`` and the other tools of a checkout run the same code. Each subcommand is a
module of this package with ``build_parser()`` and ``main(argv=None) -> int``.

This module imports nothing at its top: the console script imports it before the signal-safe start
(``_start.console``) runs, so it must stay cheap.
"""

#: The subcommands, in the order ``bpe-core --help`` lists them, with their one-line summaries.
COMMANDS = {
    "train": "train a byte-level BPE tokenizer (BPE, SuperBPE, SupraTok) on a corpus",
    "encode": "encode a whole corpus into one flat .npy of token ids",
    "export": "export a trained tokenizer to HF tokenizers, tiktoken, GPT-2 files or transformers",
    "profile": "profile the memory of any command (RSS of its process tree over time)",
    "evaluate": "evaluate tokenizers on text files (bytes per token, round trip, longest tokens)",
    "curate": "entropy curation of a training corpus (SupraTok)",
}


def console() -> int:
    """The ``bpe-core`` console script and ``python -m bpe_core``: :func:`main`, started so that a
    Ctrl-C or SIGTERM at any moment is one line and exit 130 / 143 (``_start.py``; the two signals
    are held from here until its handler is in)."""
    import _signal  # (the C module under ``signal``, loaded with the interpreter: no file is read)

    if hasattr(_signal, "pthread_sigmask"):
        _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))
    from ._start import console as start

    return start()


def _module(name: str):
    import importlib

    return importlib.import_module(f"{__name__}.{name}")


def _version() -> str:
    from .. import __version__

    return __version__


def build_parser():
    """The top-level ``bpe-core`` parser: one subparser per command, each with every option and
    help text of that command (its module's ``build_parser``)."""
    import argparse

    from ..runtime.cli import ArgumentParser

    p = ArgumentParser(prog="bpe-core", description="Exact, fast, RAM-budgeted byte-level BPE: train "
                       "tokenizers on corpora larger than RAM, encode corpora into .npy id arrays.",
                       epilog="Run `bpe-core COMMAND --help` for the options of a command.")
    p.add_argument("--version", action="version", version=f"bpe-core {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, summary in COMMANDS.items():
        own = _module(name).build_parser(f"bpe-core {name}")
        sub.add_parser(name, parents=[own], add_help=False, help=summary, description=own.description,
                       epilog=own.epilog, usage=own.usage, formatter_class=own.formatter_class)
    return p


def main(argv=None) -> int:
    """``bpe-core ARGS``: the exit code of the command (2 and one line for a bad command)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:        # the command's own main reads the rest, as its tool does
        return _module(argv[0]).main(argv[1:], prog=f"bpe-core {argv[0]}")
    parser = build_parser()
    args = parser.parse_args(argv)          # --help, --version (exit 0); an unknown command (exit 2)
    if args.command is None:
        parser.error(f"give a command: {', '.join(COMMANDS)}")
    return _module(args.command).main(argv[argv.index(args.command) + 1:], prog=f"bpe-core {args.command}")
