"""The official implementation's stage-2 split (``stage2_split="official"``, a parity mode): its
pattern, the unit texts of a text piece (:func:`official_unit_texts`), each unit pre-tokenized and
stage-1 merged on its own (:func:`stage1_ids`), and the units of a corpus for training
(:func:`official_units`). Runs ``regex`` in Python."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import regex

from ...corpus.chunks import split_spans
from ...corpus.files import open_corpus
from ...engine.units import RankMerger, UnitCounter
from ...pretok.pretokenize import pretoken_ends

OFFICIAL_STAGE2_PATTERN = r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]{2,}[\r\n/]*| +(?!\S)"
_OFFICIAL = regex.compile(OFFICIAL_STAGE2_PATTERN)


def official_units(path, specials, pattern, tokens, steps1, fraction):
    """Units of the official stage-2 split: lines, official pieces isolated, gaps as units; each unit
    pre-tokenized and stage-1 merged on its own. Runs ``regex`` in Python (a parity mode)."""
    merger = stage1_merger(tokens, steps1)
    counter = UnitCounter()
    keep_below = 0xFFFFFFFFFFFFFFFF if fraction >= 1 else int(fraction * 2 ** 64)
    buf = open_corpus(path)
    spans, _ = split_spans(buf, 0, len(buf), specials)
    for s, e in spans:
        for unit_bytes in official_unit_texts(bytes(buf[s:e])):
            ids = stage1_ids(unit_bytes, pattern, merger)
            counter.add_units(ids, np.array([0, ids.size], dtype=np.int64), 1, keep_below)
    data, starts, counts = counter.to_arrays()
    info = {"units_seen": counter.n_seen, "units_kept": counter.n_kept, "unique_units": counter.n_units}
    return data, starts, counts, info


def official_unit_texts(text: bytes) -> list[bytes]:
    """The official stage-2 units of one text piece: per line, official pieces and the gaps between.

    >>> official_unit_texts(b"a b 12345 c\\nd")
    [b'a b ', b'123', b'45', b' c\\n', b'd']
    """
    out = []
    rx = _OFFICIAL
    for line in text.splitlines(keepends=True):
        s = line.decode("utf-8", "surrogateescape")
        pos = 0
        for m in rx.finditer(s):
            if m.start() > pos:
                out.append(s[pos:m.start()])
            out.append(m.group())
            pos = m.end()
        if pos < len(s):
            out.append(s[pos:])
    return [u.encode("utf-8", "surrogateescape") for u in out if u]


def stage1_merger(tokens: Sequence[bytes], steps) -> RankMerger:
    lefts = np.array([a for a, _, _ in steps], dtype=np.uint32)
    rights = np.array([b for _, b, _ in steps], dtype=np.uint32)
    results = np.array([t for _, _, t in steps], dtype=np.uint32)
    return RankMerger(lefts, rights, results)


def stage1_ids(text: bytes, pattern: str, merger: RankMerger) -> np.ndarray:
    ends = pretoken_ends(text, pattern)
    symbols = np.frombuffer(text, dtype=np.uint8).astype(np.uint32)
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    merged, _ = merger.merge_many(symbols, offsets)
    return merged
