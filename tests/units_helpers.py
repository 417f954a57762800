"""Shared helpers of the stage-2 unit tests (``tests/methods``): a text's GPT-2 pretokens as the
counting pass records them, computed in plain Python."""
from __future__ import annotations

from collections import Counter

import numpy as np

SPECIAL = b"<|endoftext|>"


def spans_and_table(text: bytes):
    """The text spans of ``text`` between ``<|endoftext|>``, the GPT-2 pretokens of each span (plain
    Python: ``pretoken_ends``) and their word table (``{b"x": 1}`` for a text without any)."""
    from bpe_core.corpus.chunks import split_spans
    from bpe_core.pretok.pretokenize import pretoken_ends
    from bpe_core.pretok.wordtable import WordTable

    spans, _ = split_spans(text, 0, len(text), [SPECIAL])
    pieces = []
    for s, e in spans:
        ends = pretoken_ends(text[s:e], "gpt2") + s
        pieces.append([text[a:b] for a, b in zip(np.concatenate(([s], ends[:-1])), ends)])
    return spans, pieces, WordTable.from_counts(Counter(p for ps in pieces for p in ps) or {b"x": 1})


def recorded_ids(pieces, table):
    """``(ids, breaks)``: the table row of every pretoken in text order (uint32), as the record holds
    them, and where each span's pretokens start (int64, one more than spans)."""
    row = {table.arena[table.offsets[i]:table.offsets[i + 1]].tobytes(): i for i in range(table.n_words)}
    ids = np.array([row[p] for ps in pieces for p in ps], dtype=np.uint32)
    breaks = np.concatenate(([0], np.cumsum([len(ps) for ps in pieces]))).astype(np.int64)
    return ids, breaks
