"""mkdocs hook: the command-line reference page, rendered from the parsers at build time.

``docs/cli.md`` holds the marker ``<!-- cli-reference -->``; this hook replaces it with every
subcommand of ``bpe-core`` (``bpe_core.cli.build_parser()``): its usage, description, and one table
per option group with each option's value, default and help text. The page is made from the same
``argparse`` objects the command runs, so it cannot drift from the command.

``render_reference`` is plain Python (no mkdocs): ``tests/test_docs_site.py`` calls it too.
"""
from __future__ import annotations

import argparse
import os
import sys

MARKER = "<!-- cli-reference -->"
PAGE = "cli.md"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def subcommands(parser: argparse.ArgumentParser) -> "list[tuple[str, str, argparse.ArgumentParser]]":
    """``(name, one-line help, parser)`` of every subcommand of ``parser``, in the order ``--help``
    lists them."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:         # an alias names the same parser again
                    continue
                seen.add(id(sub))
                found.append((name, helps.get(name, ""), sub))
    return found


def load_parsers() -> "tuple[str, str, list[tuple[str, str, argparse.ArgumentParser]]]":
    """``(prog, description, subcommands)`` of the installed command line."""
    try:
        import bpe_core  # noqa: F401  (the first on the path: installed, or a checkout built in place)
    except ImportError:  # a source checkout without its built extensions came first (`python -m mkdocs` in
        # the clone's root after `pip install .`): the installed package has the same parsers
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != ROOT]
        for name in [m for m in sys.modules if m == "bpe_core" or m.startswith("bpe_core.")]:
            del sys.modules[name]
        try:
            import bpe_core  # noqa: F401
        except ImportError:  # not installed: the checkout (built in place, or its one-line hint)
            sys.path.insert(0, ROOT)
    from bpe_core.cli import build_parser

    parser = build_parser()
    return parser.prog, parser.description or "", subcommands(parser)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    if action.default is None or action.default is argparse.SUPPRESS or action.nargs == 0 \
            or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction)):
        return ""
    if isinstance(action.default, (list, tuple)) and not action.default:
        return ""
    return f"`{action.default}`"            # a pipe inside a code span splits no cell


def _names(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if not action.option_strings:
        return f"`{formatter._metavar_formatter(action, action.dest.upper())(1)[0]}`"
    value = ""
    if action.nargs != 0:
        value = " " + formatter._format_args(action, action.dest.upper())
    return ", ".join(f"`{s}{value}`" for s in action.option_strings)


def render_command(name: str, summary: str, parser: argparse.ArgumentParser) -> str:
    """One subcommand as markdown: heading, usage, description, option tables, epilog."""
    formatter = parser._get_formatter()
    usage = parser.format_usage().strip()
    if usage.startswith("usage: "):
        usage = usage[len("usage: "):]
    lines = [f"## `{name}`", ""]
    if summary:
        lines += [_cell(summary), ""]
    lines += ["```text", usage, "```", ""]
    if parser.description and parser.description.split("\n")[0] != summary:
        lines += [parser.description.strip(), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS
                   and not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = group.title or "options"
        lines += [f"**{title}**", ""]
        if group.description:
            lines += [_cell(group.description), ""]
        lines += ["| option | default | meaning |", "|---|---|---|"]
        for action in actions:
            text = formatter._expand_help(action) if action.help else ""
            if action.choices and not isinstance(action, argparse._SubParsersAction):
                text += " (one of: " + ", ".join(f"`{c}`" for c in action.choices) + ")"
            lines.append(f"| {_names(action, formatter)} | {_default(action)} | {_cell(text)} |")
        lines.append("")
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```", ""]
    return "\n".join(lines)


def render_reference() -> str:
    prog, description, commands = load_parsers()
    lines = []
    if description:
        lines += [description.strip(), ""]
    lines += ["| command | what it does |", "|---|---|"]
    lines += [f"| [`{prog} {name}`](#{name}) | {_cell(summary)} |" for name, summary, _ in commands]
    lines.append("")
    for name, summary, parser in commands:
        lines.append(render_command(name, summary, parser))
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001  (mkdocs hook signature)
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its marker {MARKER}: the reference has nowhere to go")
    return markdown.replace(MARKER, render_reference())
