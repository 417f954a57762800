"""Plain twin of SupraTok passes 1 and 2 (full recount per merge), for the equivalence tests.

Pass 3 (scored spans, leaf surgery) is not a merge loop and has no twin; its pieces are tested
against hand-computed values instead (tests/methods/test_supratok.py).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Optional, Sequence

from ..corpus.specials import encode_specials
from . import (best_pair, count_pretokens, get_pair_counts, merge_word, superbpe_units)


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


def train_passes_1_2(data: bytes, vocab_size: int, n1: int, special_tokens: Sequence[str | bytes],
                     pattern: str, allowed2: Callable[[bytes, bytes], bool],
                     allowed1: Optional[Callable[[bytes, bytes], bool]] = None) -> tuple[list, int]:
    """Pass 1: ``n1`` BPE merges inside pretokens; pass 2: merges inside units under ``allowed2``,
    until ``vocab_size``. Returns ``(merges, n_pass1)``."""
    specials = encode_specials(special_tokens)
    words = {tuple(bytes([b]) for b in p): c for p, c in count_pretokens(data, special_tokens, pattern).items()}
    merges = _merge_loop(words, n1, allowed1)
    units: dict[tuple[bytes, ...], int] = {}
    for u in superbpe_units(data, special_tokens, pattern, merges, split="units"):
        units[tuple(u)] = units.get(tuple(u), 0) + 1
    n_total = vocab_size - 256 - len(specials)
    # pass 2 continues from the pass-1 segmentation of every unit
    merges2 = _merge_loop(units, n_total - len(merges), allowed2)
    return merges + merges2, len(merges)
