"""The unique pretokens of a large file, estimated from a spread sample before it is counted.

A training run learns how many unique pretokens its corpus has only when the counting pass ends
(15 s and more on a 15 GB file), and the merge phase's memory grows with them. Before counting,
``runtime.budget`` has only Heaps' law fitted on English prose, which a corpus richer in words
exceeds by far (the growing-vocabulary synthetic corpus: 18.8 M unique pretokens in 15 GB, Heaps'
law with its margin says 8.9 M). ``sample_words`` counts ``pieces`` pieces of the file, spread
evenly over it, and fits the growth of their unique pretokens: the pieces of every other position
(half the sample) against all of them give the exponent of Heaps' law on this corpus, and the
sample's count is carried to the whole file with it. ``training.start`` refuses a budget the
estimate shows to be too small for the merge phase before any counting (``runtime.budget``).

An estimate, not a bound: only the sample's own count is a lower bound on the file's (a part of a
text has at most the text's unique pretokens). On the 15 GB synthetic corpus 128 MiB in 16 pieces
(0.5 CPU-s, on two threads when the run has two workers) gives 19.4 M (18.8 M counted); on its 2 GB
prefix, 4.4 M (3.1 M counted): a corpus whose new words thin out as it grows is overestimated, so
the caller refuses only well above its budget.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

from .pretokenize import count_pretokens, merge_counts, split_spans

#: The sample: this many pieces of at most this many bytes, evenly spread (each at most a quarter
#: of the file over ``pieces``).
SAMPLE_PIECES = 16
SAMPLE_PIECE_BYTES = 8 << 20
#: The exponent fitted is kept in this range (a sample of repeated text: 0; of unrelated pieces: 1).
MIN_EXPONENT, MAX_EXPONENT = 0.3, 1.0


@dataclass(frozen=True)
class WordSample:
    """What a spread sample says of a file's unique pretokens."""

    input_bytes: int
    sample_bytes: int
    #: unique pretokens of the whole sample, and of its pieces of every other position
    unique: int
    unique_half: int
    #: bytes of those unique pretokens (the engine's symbols of them, before merges)
    unique_bytes: int
    exponent: float
    #: the whole file's unique pretokens, carried from the sample by Heaps' law with ``exponent``
    estimate: int

    @property
    def symbols_per_word(self) -> float:
        return self.unique_bytes / self.unique if self.unique else 0.0


def sample_words(path: str, specials: Sequence[bytes], pattern: str = "gpt2", pieces: int = SAMPLE_PIECES,
                 piece_bytes: int = SAMPLE_PIECE_BYTES, threads: int = 1) -> WordSample:
    """Count ``pieces`` evenly spread pieces of the file at ``path`` (each cut to whole pretokens at
    its first and last space) and estimate the file's unique pretokens from them. The pieces are
    counted on ``threads`` threads (the counting kernel runs without the GIL); the tables, and so
    the estimate, are the same for any number.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as f:
    ...     _ = f.write(b" ".join(b"w%d" % (i % 5000) for i in range(200_000)))
    >>> s = sample_words(f.name, [], pieces=8, piece_bytes=4096)
    >>> s.unique <= 5000 and s.estimate >= s.unique
    True
    >>> os.remove(f.name)
    """
    size = os.path.getsize(path)
    pieces = max(2, int(pieces))
    piece = max(1, min(int(piece_bytes), size // (4 * pieces)))
    fd = os.open(path, os.O_RDONLY)

    def count_piece(i: int) -> tuple:
        buf = os.pread(fd, piece, (size - piece) * i // (pieces - 1))
        lo, hi = buf.find(b" "), buf.rfind(b" ")
        if 0 <= lo < hi:
            buf = buf[lo:hi]
        spans, _ = split_spans(buf, 0, len(buf), list(specials))
        return count_pretokens(buf, spans, pattern)

    # The pieces of even positions summed (``half``) and those of odd ones, then the two sums: the
    # whole sample's table without merging the even pieces' tables twice.
    try:
        if threads > 1:
            from concurrent.futures import ThreadPoolExecutor   # (here: a small run never samples)
            with ThreadPoolExecutor(max_workers=min(int(threads), pieces), thread_name_prefix="bpe_core-sample") as ex:
                tables = list(ex.map(count_piece, range(pieces)))
                half, odd = ex.map(merge_counts, (tables[0::2], tables[1::2]))
        else:
            tables = [count_piece(i) for i in range(pieces)]
            half, odd = merge_counts(tables[0::2]), merge_counts(tables[1::2])
    finally:
        os.close(fd)
    del tables
    full = merge_counts([half, odd], threads=min(max(int(threads), 1), 2))
    unique, unique_half = len(full[2]), len(half[2])
    sample = pieces * piece
    if unique and unique_half:
        exponent = math.log(unique / unique_half, 2)
    else:
        exponent = MAX_EXPONENT
    exponent = min(MAX_EXPONENT, max(MIN_EXPONENT, exponent))
    estimate = unique if size <= sample else int(math.ceil(unique * (size / sample) ** exponent))
    return WordSample(input_bytes=size, sample_bytes=min(sample, size), unique=unique, unique_half=unique_half,
                      unique_bytes=int(full[1][-1]) if unique else 0, exponent=round(exponent, 4),
                      estimate=min(estimate, size))
