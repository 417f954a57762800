"""The word table: unique pretokens with their counts, in flat arrays.

``arena`` (uint8) holds the bytes of all words back to back, ``offsets`` (int64, ``n_words + 1``)
their starts, ``counts`` (int64) their counts. Words are sorted by bytes, so two tables merge by a
k-way merge and the table does not depend on worker count or chunking. This is also the mergeable
count format for a cluster engine (see ``docs/formats.md``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


@dataclass
class WordTable:
    arena: np.ndarray      # uint8
    offsets: np.ndarray    # int64, n_words + 1
    counts: np.ndarray     # int64, n_words

    @property
    def n_words(self) -> int:
        return int(self.counts.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.arena.nbytes + self.offsets.nbytes + self.counts.nbytes)

    @classmethod
    def empty(cls) -> "WordTable":
        return cls(np.zeros(0, np.uint8), np.zeros(1, np.int64), np.zeros(0, np.int64))

    @classmethod
    def from_counts(cls, counts: Mapping[bytes, int]) -> "WordTable":
        """Build a sorted table from ``{pretoken: count}``.

        >>> t = WordTable.from_counts({b"b": 2, b"a": 1})
        >>> t.to_dict()
        {b'a': 1, b'b': 2}
        """
        words = sorted(counts)
        arena = np.frombuffer(b"".join(words), dtype=np.uint8).copy()
        offsets = np.zeros(len(words) + 1, dtype=np.int64)
        if words:
            offsets[1:] = np.cumsum([len(w) for w in words])
        return cls(arena, offsets, np.array([counts[w] for w in words], dtype=np.int64))

    @classmethod
    def from_arrays(cls, arrays: tuple) -> "WordTable":
        arena, offsets, counts = arrays
        return cls(np.asarray(arena, np.uint8), np.asarray(offsets, np.int64), np.asarray(counts, np.int64))

    def to_dict(self) -> dict[bytes, int]:
        a = self.arena.tobytes()
        o = self.offsets
        return {a[o[i]:o[i + 1]]: int(self.counts[i]) for i in range(self.n_words)}

    def symbols(self) -> np.ndarray:
        """The words as uint32 symbols (each byte is its own token id), same offsets."""
        return self.arena.astype(np.uint32)

    def at_least(self, min_count: int) -> "WordTable":
        """Keep the words seen at least ``min_count`` times (this changes training results).

        >>> WordTable.from_counts({b"a": 1, b"bb": 3}).at_least(2).to_dict()
        {b'bb': 3}
        """
        return self._keep(self.counts >= min_count)

    def without_singletons(self) -> "WordTable":
        """Drop words of one byte: they hold no pair, so they never change the merges."""
        return self._keep(np.diff(self.offsets) > 1)

    def _keep(self, keep: np.ndarray) -> "WordTable":
        if keep.all():
            return self
        lengths = np.diff(self.offsets)
        byte_keep = np.repeat(keep, lengths)
        arena = self.arena[byte_keep]
        offsets = np.zeros(int(keep.sum()) + 1, np.int64)
        np.cumsum(lengths[keep], out=offsets[1:])
        return WordTable(arena, offsets, self.counts[keep])
