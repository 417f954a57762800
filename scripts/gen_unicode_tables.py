"""Generate ``bpe_core/pretok/_unicode_tables.h``: the character classes of the native pre-tokenizer.

The ``regex`` module is the truth for pre-tokenization, and its Unicode data is newer than Python's
``unicodedata`` (for ``\\p{L}`` alone tens of thousands of code points differ). So the tables are
not derived from a Unicode database: every code point U+0000..U+10FFFF is probed with the
installed ``regex`` itself, one class at a time, and the answers are packed into a two-level
lookup table.

What each code point gets (a ``uint16_t``):

=========  ======  =============================================================================
bit        name    meaning (as ``regex`` answers it)
=========  ======  =============================================================================
0          L       ``\\p{L}``
1          N       ``\\p{N}``
2          S       ``\\s`` (in ``regex``: exactly the 25 White_Space code points)
3          U       ``[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]`` (o200k's "upper" class)
4          W       ``[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]`` (o200k's "lower" class)
8..15      fold    the ASCII letter of ``sdmtlvre`` that ``(?i:x)`` matches here, else 0
                   (``S``, ``s`` and U+017F LONG S all carry ``'s'``)
=========  ======  =============================================================================

A code point with none of L, N, S is "other" (``[^\\s\\p{L}\\p{N}]``). Surrogates U+D800..U+DFFF
are probed as well: ``regex`` puts them in no class, and the scanner uses U+DC80..U+DCFF for the
undecodable bytes, exactly as ``surrogateescape`` does on the ``regex`` path.

Usage::

    python scripts/gen_unicode_tables.py            # rewrite bpe_core/pretok/_unicode_tables.h
    python scripts/gen_unicode_tables.py --check    # exit 1 if the committed header is stale
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys

import regex

# The `regex` releases that give exactly the committed tables. Checked by running this generator
# under single releases: 2025.10.22 (the first with Unicode 17.0), 2025.10.23, 2025.11.3, 2026.1.14,
# 2026.5.9 and 2026.9.10 give identical flags; 2025.9.18 (Unicode 16.0) and 2026.9.29 (Unicode 18
# data) do not. Keep pyproject.toml's `regex` line in step; tests/pretok/test_pretokenize.py regenerates.
REGEX_VERSION_RANGE = ">=2025.10.22,<2026.9.29"

HEADER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bpe_core", "pretok", "_unicode_tables.h")

N_CODE_POINTS = 0x110000
FLAG_L, FLAG_N, FLAG_S, FLAG_U, FLAG_W = 1, 2, 4, 8, 16
FOLD_LETTERS = "sdmtlvre"  # the letters of the contractions 's 'd 'm 't 'll 've 're

# A code point first assigned in each Unicode version, newest first: names the data we probed.
_UNICODE_MARKERS = [
    ("17.0", 0x10940),  # SIDETIC LETTER N01
    ("16.0", 0x10D50),  # GARAY CAPITAL LETTER A
    ("15.1", 0x2EBF0),  # CJK UNIFIED IDEOGRAPH-2EBF0
    ("15.0", 0x31350),  # CJK UNIFIED IDEOGRAPH-31350
    ("14.0", 0x1E290),  # TOTO LETTER PA
]


def _all_code_points() -> str:
    # Surrogates included: a Python str can hold them, and regex must say "no class" for them.
    return "".join(map(chr, range(N_CODE_POINTS)))


def _members(pattern: str, text: str) -> list[int]:
    """Code points matched by a one-character class ``pattern``, e.g. ``\\p{N}`` -> [0x30, ...]."""
    out = []
    for m in regex.finditer(pattern, text):
        if m.end() - m.start() != 1:  # pragma: no cover - would mean full case folding
            raise AssertionError(f"{pattern} matched {m.group()!r}, more than one code point")
        out.append(m.start())
    return out


def probe_flags() -> list[int]:
    """The uint16 flags of every code point, probed from the installed ``regex``."""
    text = _all_code_points()
    sets = {
        name: set(_members(pat, text))
        for name, pat in {
            "L": r"\p{L}", "N": r"\p{N}", "S": r"\s", "Lu": r"\p{Lu}", "Lt": r"\p{Lt}",
            "Lm": r"\p{Lm}", "Lo": r"\p{Lo}", "M": r"\p{M}", "Ll": r"\p{Ll}",
        }.items()
    }
    # The scanners rely on these facts; check them rather than assume them.
    L, N, S = sets["L"], sets["N"], sets["S"]
    assert not (L & N) and not (L & S) and not (N & S), "L, N and \\s must be disjoint"
    assert sets["Lu"] | sets["Lt"] | sets["Lm"] | sets["Lo"] | sets["Ll"] <= L
    assert not (sets["M"] & (L | N | S)), "marks must be 'other' (not L, N, \\s)"
    assert not ((L | N | S) & set(range(0xD800, 0xE000))), "surrogates must be 'other'"
    assert _members(r"(?i:')", text) == [0x27]
    assert {0x0A, 0x0D, 0x20} <= S and 0x2F not in (L | N | S)
    upper = sets["Lu"] | sets["Lt"] | sets["Lm"] | sets["Lo"] | sets["M"]
    lower = sets["Ll"] | sets["Lm"] | sets["Lo"] | sets["M"]

    flags = [0] * N_CODE_POINTS
    for bit, members in ((FLAG_L, L), (FLAG_N, N), (FLAG_S, S), (FLAG_U, upper), (FLAG_W, lower)):
        for cp in members:
            flags[cp] |= bit
    for letter in FOLD_LETTERS:
        for cp in _members(f"(?i:{letter})", text):
            assert flags[cp] >> 8 == 0, f"U+{cp:04X} folds to two letters"
            flags[cp] |= ord(letter) << 8
    return flags


def unicode_version() -> str:
    """The newest Unicode version whose marker code point ``regex`` knows as a letter."""
    for version, cp in _UNICODE_MARKERS:
        if regex.match(r"\p{L}", chr(cp)):
            return version
    return "older than 14.0"


def pack(flags: list[int]) -> tuple[int, list[int], list[int]]:
    """Two-level table: ``leaves[index[cp >> shift] << shift | cp & mask]``; smallest shift wins.

    >>> shift, index, leaves = pack([0] * 0x110000)
    >>> len(set(index)), len(leaves) == 1 << shift
    (1, True)
    """
    best = None
    for shift in (5, 6, 7, 8, 9):
        size = 1 << shift
        blocks: dict[tuple[int, ...], int] = {}
        index, leaves = [], []
        for start in range(0, len(flags), size):
            block = tuple(flags[start : start + size])
            if block not in blocks:
                blocks[block] = len(blocks)
                leaves.extend(block)
            index.append(blocks[block])
        assert len(blocks) < 1 << 16
        cost = 2 * len(index) + 2 * len(leaves)
        if best is None or cost < best[0]:
            best = (cost, shift, index, leaves)
    _, shift, index, leaves = best
    assert index[0] == 0  # so ASCII flags are simply leaves[c], the scanners' fast path
    return shift, index, leaves


def _c_array(name: str, values: list[int], per_line: int = 16) -> str:
    lines = [f"static const uint16_t {name}[{len(values)}] = {{"]
    for i in range(0, len(values), per_line):
        lines.append("    " + ",".join(f"0x{v:x}" for v in values[i : i + per_line]) + ",")
    lines.append("};")
    return "\n".join(lines)


def render(flags: list[int], regex_version: str, unicode_ver: str) -> str:
    """The header text for ``flags`` (deterministic: same flags, same text)."""
    shift, index, leaves = pack(flags)
    digest = hashlib.sha256(bytes(b for f in flags for b in (f & 0xFF, f >> 8))).hexdigest()[:16]
    return f"""\
/* GENERATED by scripts/gen_unicode_tables.py -- do not edit.
 *
 * Character classes of the native pre-tokenizer (bpe_core/pretok/_pretok.pyx), probed from
 * regex {regex_version} (Unicode {unicode_ver}) over every code point U+0000..U+10FFFF.
 * Supported regex releases: {REGEX_VERSION_RANGE}. Flags digest: {digest}.
 *
 * bpe_ut_flags(cp) -> uint16_t:
 *   bit 0  L  \\p{{L}}           bit 3  U  [\\p{{Lu}}\\p{{Lt}}\\p{{Lm}}\\p{{Lo}}\\p{{M}}]
 *   bit 1  N  \\p{{N}}           bit 4  W  [\\p{{Ll}}\\p{{Lm}}\\p{{Lo}}\\p{{M}}]
 *   bit 2  S  \\s                bits 8..15: the letter of "sdmtlvre" that (?i:x) matches, or 0
 * None of L, N, S means "other" ([^\\s\\p{{L}}\\p{{N}}]); surrogates are "other".
 */
#ifndef BPE_CORE_UNICODE_TABLES_H
#define BPE_CORE_UNICODE_TABLES_H

#include <stdint.h>

#define BPE_UT_REGEX_VERSION "{regex_version}"
#define BPE_UT_UNICODE_VERSION "{unicode_ver}"
#define BPE_UT_DIGEST "{digest}"
#define BPE_UT_SHIFT {shift}

enum {{ BPE_UT_L = 1, BPE_UT_N = 2, BPE_UT_S = 4, BPE_UT_U = 8, BPE_UT_W = 16 }};

{_c_array("bpe_ut_index", index)}

{_c_array("bpe_ut_leaves", leaves)}

/* Flags of code point cp (cp < 0x110000). For cp < 0x80, bpe_ut_leaves[cp] is the same. */
static inline uint16_t bpe_ut_flags(uint32_t cp) {{
    return bpe_ut_leaves[((uint32_t)bpe_ut_index[cp >> BPE_UT_SHIFT] << BPE_UT_SHIFT)
                         | (cp & ((1u << BPE_UT_SHIFT) - 1u))];
}}

#endif /* BPE_CORE_UNICODE_TABLES_H */
"""


def generate() -> str:
    """The header text for the installed ``regex``."""
    return render(probe_flags(), regex.__version__, unicode_version())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed header")
    parser.add_argument("--output", default=HEADER_PATH, help="where to write the header")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        with open(args.output, encoding="ascii") as f:
            same = f.read() == text
        print("up to date" if same else f"{args.output} is stale: regenerate it")
        return 0 if same else 1
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        f.write(text)
    os.replace(tmp, args.output)
    print(os.path.normpath(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
