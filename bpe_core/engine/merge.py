"""The merge loop over a word table: the engine's public face for training.

>>> from bpe_core.pretok.wordtable import WordTable
>>> vocab, merges = train_words(WordTable.from_counts({b"low": 5, b"lower": 2}), 258)
>>> merges
[(b'l', b'o'), (b'lo', b'w')]
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from ..corpus.specials import encode_specials
from ..pretok.wordtable import WordTable
from ..runtime.memmon import phase
from ..runtime.progress import progress_bar
from ._engine import MergeEngine

__all__ = ["MergeEngine", "train_words"]


def train_words(table: WordTable, vocab_size: int, special_tokens: Sequence[str | bytes] = (),
                progress: bool = False, allowed: Optional[Callable[[bytes, bytes], bool]] = None,
                report: Optional[dict] = None) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Run the merge loop on a word table; return ``(vocab, merges)``."""
    specials = encode_specials(special_tokens)
    n_merges = vocab_size - 256 - len(specials)
    t0 = time.perf_counter()
    phase("build words")
    table = table.without_singletons()
    engine = MergeEngine(table.arena, table.offsets, table.counts, [bytes([i]) for i in range(256)])
    t1 = time.perf_counter()
    bar = progress_bar(progress, total=n_merges, desc="merges", unit="merge")
    last = [0]

    def tick(done):
        if bar is not None:
            bar.update(done - last[0])
            last[0] = done

    phase("merge loop")
    steps = engine.run(n_merges, allowed=allowed, progress=tick if bar is not None else None)
    if bar is not None:
        bar.close()
    t2 = time.perf_counter()
    tokens = engine.tokens()
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    for s in specials:
        vocab[len(vocab)] = s
    merges: list[tuple[bytes, bytes]] = []
    for left, right, _new in steps:
        pair = (tokens[left], tokens[right])
        merges.append(pair)
        vocab[len(vocab)] = pair[0] + pair[1]
    if report is not None:
        report["seconds"]["build_words"] = round(t1 - t0, 3)
        report["seconds"]["merge_loop"] = round(t2 - t1, 3)
        report["engine"] = engine.stats()
        report["merges"] = len(merges)
        report["merges_requested"] = max(n_merges, 0)
    return vocab, merges


