"""Plain twin of SupraTok passes 1 and 2 (full recount per merge), for the equivalence tests.

Pass 3 (scored spans, leaf surgery) is not a merge loop and has no twin; its pieces are tested
against hand-computed values instead (tests/methods/test_supratok.py).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Optional, Sequence

import regex

from ..corpus.specials import encode_specials, split_on_specials
from . import (best_pair, count_pretokens, encode_pretoken, get_pair_counts, looks_encoded, merge_word,
               numeric_cuts, pretokenize, superbpe_units)

_NUMBER = regex.compile(r"\p{N}")
_WHITESPACE = regex.compile(r"\s")


def _merge_loop(words: dict[tuple[bytes, ...], int], n_merges: int,
                allowed: Optional[Callable[[bytes, bytes], bool]]) -> list[tuple[bytes, bytes]]:
    merges = []
    while len(merges) < n_merges:
        pairs = get_pair_counts(words)                      # 1. full recount
        if allowed is not None:
            pairs = Counter({p: c for p, c in pairs.items() if allowed(*p)})
        pair = best_pair(pairs)                              # 2. highest count, greatest bytes
        if pair is None:
            break
        merges.append(pair)
        new: dict[tuple[bytes, ...], int] = {}
        for w, c in words.items():                           # 3. rewrite every word
            m = merge_word(w, pair)
            new[m] = new.get(m, 0) + c
        words = new
    return merges


def supratok_units(data: bytes, special_tokens: Sequence[str | bytes], pattern: str,
                   merges: Sequence[tuple[bytes, bytes]]) -> list[tuple[list[bytes], bool]]:
    r"""SupraTok's pass-2 units (SuperBPE's ``units`` split: ``superbpe_units(split="units")``), each
    with whether it looks like encoded data.

    A *region* is the text between the edges of a text piece (document edges, special tokens) and
    the places where two pretokens meet inside a run of whitespace (the left one ends with ``\s``,
    the right one starts with it): SuperBPE's regions for its default split. A region looks encoded
    by ``looks_encoded`` on its bytes. A unit (a run of pretokens without a number, or one numeric
    pretoken, before that one is cut into digit groups) is encoded when more than half of its bytes
    lie in regions that look encoded; the digit groups of a numeric pretoken share its flag.

    >>> uu = b"M86)C9&5F9VAI:FML;6YO<'%R<W1U=G=X>7I!0D-$149\n"       # a uuencoded line
    >>> [(b"".join(u), e) for u, e in supratok_units(b"Some words.\n\n" + uu, [], "gpt2", [])][:3]
    [(b'Some words.\n\nM', False), (b'86', True), (b')C', True)]
    """
    specials = encode_specials(special_tokens)
    out: list[tuple[list[bytes], bool]] = []
    for piece, is_special in split_on_specials(data, specials):
        if is_special:
            continue
        pretokens = pretokenize(piece, pattern)
        # 1. regions: cut where whitespace meets whitespace
        regions, region, prev_ends_space = [], -1, False
        for p in pretokens:
            text = p.decode("utf-8", "surrogateescape")
            starts_space = bool(text) and bool(_WHITESPACE.match(text[0]))
            if region < 0 or (prev_ends_space and starts_space):
                region += 1
            regions.append(region)
            prev_ends_space = bool(text) and bool(_WHITESPACE.match(text[-1]))
        region_text: dict[int, bytes] = {}
        for p, r in zip(pretokens, regions):
            region_text[r] = region_text.get(r, b"") + p
        encoded_region = {r: looks_encoded(t) for r, t in region_text.items()}
        # 2. units: runs of pretokens without a number; a numeric pretoken alone
        groups: list[list[int]] = []
        current: list[int] = []
        for k, p in enumerate(pretokens):
            if _NUMBER.search(p.decode("utf-8", "surrogateescape")):
                if current:
                    groups.append(current)
                    current = []
                groups.append([k])
            else:
                current.append(k)
        if current:
            groups.append(current)
        # 3. a unit is encoded when most of its bytes are; a numeric one is cut into digit groups
        for g in groups:
            n_bytes = sum(len(pretokens[k]) for k in g)
            n_encoded = sum(len(pretokens[k]) for k in g if encoded_region[regions[k]])
            encoded = 2 * n_encoded > n_bytes
            tokens = [t for k in g for t in encode_pretoken(pretokens[k], merges)]
            cuts = numeric_cuts(pretokens[g[0]], [len(t) for t in tokens]) if len(g) == 1 else []
            for a, b in zip([0] + cuts, cuts + [len(tokens)]):
                out.append((tokens[a:b], encoded))
    return out


def train_passes_1_2(data: bytes, vocab_size: int, n1: int, special_tokens: Sequence[str | bytes],
                     pattern: str, allowed2: Callable[[bytes, bytes], bool],
                     allowed1: Optional[Callable[[bytes, bytes], bool]] = None,
                     skip_encoded: bool = False) -> tuple[list, int]:
    """Pass 1: ``n1`` BPE merges inside pretokens; pass 2: merges inside units under ``allowed2``,
    until ``vocab_size``; with ``skip_encoded``, the units that look encoded (:func:`supratok_units`)
    do not count in pass 2. Returns ``(merges, n_pass1)``."""
    specials = encode_specials(special_tokens)
    words = {tuple(bytes([b]) for b in p): c for p, c in count_pretokens(data, special_tokens, pattern).items()}
    merges = _merge_loop(words, n1, allowed1)
    units: dict[tuple[bytes, ...], int] = {}
    for u, encoded in supratok_units(data, special_tokens, pattern, merges):
        if skip_encoded and encoded:
            continue
        units[tuple(u)] = units.get(tuple(u), 0) + 1
    n_total = vocab_size - 256 - len(specials)
    # pass 2 continues from the pass-1 segmentation of every unit
    merges2 = _merge_loop(units, n_total - len(merges), allowed2)
    return merges + merges2, len(merges)
