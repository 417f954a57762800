"""The documentation site: ``mkdocs build --strict`` passes, the command-line reference covers every
option of every subcommand, and no page names a machine path or the project's issue numbers.

The site build needs the ``docs`` extra (mkdocs, mkdocstrings-python); without it that test skips.
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: Every page a user reads: the README and the site's pages.
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

#: What a page must not name: our machines' paths (a user's machine has none of them), a path into
#: a sibling checkout, and the issue numbers of the project's tracker (history belongs in
#: CHANGELOG.md and the commit log).
FORBIDDEN = {
    "a machine path": re.compile(r"(?<![\w.])/(?:work|tmp|home|root|mnt|scratch)/"),
    "the shared corpora folder": re.compile(r"\.\./shared\b|(?<![\w-])shared/corpora"),
    "a path to another checkout": re.compile(r"--against\s+\S*(?:\.\./|/)\S*"),
    "an issue number": re.compile(r"\b[Ii]ssues?\s*#?\d+|\(#\d+\)|\bitem \d+ of"),
}


def _load_hook():
    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pages_name_no_machine_path_or_issue_number():
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{page.relative_to(ROOT)}:{number}: {what}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line", ["python tools/bench_train.py /tmp/en_train.txt",
                                  "see ../shared/corpora/README", "Issue 28: the warm probe",
                                  "--against /work/base_main", "cd /work/wt/docs", "(issues 2 and 3)"])
def test_the_check_finds_what_it_forbids(line):
    """Each kind of line the check is for is caught (a regex that matched nothing would pass all)."""
    assert any(p.search(line) for p in FORBIDDEN.values()), line


@pytest.mark.parametrize("line", ["pip install bpe_core", "bpe-core train corpus.txt --out tok/",
                                  "a 32k vocabulary on 230 MB", "tmp/ and work/ are folders here"])
def test_the_check_passes_plain_lines(line):
    assert not any(p.search(line) for p in FORBIDDEN.values()), line


def test_cli_reference_covers_every_option():
    """The generated page names every subcommand and every option string of its parser."""
    hook = _load_hook()
    text = hook.render_reference()
    _, _, commands = hook.load_parsers()
    names = {name for name, _, _ in commands}
    assert {"train", "encode", "export", "profile", "evaluate", "curate"} <= names
    for name, _, parser in commands:
        assert f"## `{name}`" in text
        for action in parser._actions:
            if action.help is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in text, (name, option)


def test_cli_page_keeps_its_marker():
    assert _load_hook().MARKER in (DOCS / "cli.md").read_text(encoding="utf-8")


def test_every_page_is_in_the_site():
    """A page under docs/ that the navigation leaves out would be built but never found."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [p.name for p in DOCS.glob("*.md") if p.name not in nav]
    assert not missing, missing


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
                    reason="mkdocs / mkdocstrings not installed (pip install '.[docs]')")
def test_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    assert "--vocab-size" in cli and "--tokenizer" in cli and "cli-reference" not in cli
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert "encode_corpus" in api and "TrainConfig" in api and "vocab_size" in api
