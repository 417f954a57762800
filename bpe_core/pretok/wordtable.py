"""The word table: unique pretokens with their counts, in flat arrays.

``arena`` (uint8) holds the bytes of all words back to back, ``offsets`` (int64, ``n_words + 1``)
their starts, ``counts`` (int64) their counts. Words are sorted by bytes, so two tables merge by a
k-way merge and the table does not depend on worker count or chunking. This is also the mergeable
count format for a cluster engine (see ``docs/formats.md``).

The arrays are numpy arrays, or ``array.array`` (``"B"``, ``"q"``, ``"q"``) in the table of a small
run (``pretok.counting``), which never imports numpy: what that run calls (``n_words``,
``n_pretokens``, ``one_byte_words``, ``without_singletons``, ``mapped``) takes both; the rest
works on :meth:`WordTable.as_numpy` (numpy views of the same memory).
"""
from __future__ import annotations

import array
import os
from dataclasses import dataclass
from typing import Mapping

from ..runtime.lazy import np, numpy_loaded  # numpy on first use (a small run never imports it)
from ..runtime.atomic import new_temp_file
from ..runtime.writeback import WriteBehind
from ._pretok import drop_one_byte_words, table_sums


@dataclass
class WordTable:
    arena: np.ndarray      # uint8
    offsets: np.ndarray    # int64, n_words + 1
    counts: np.ndarray     # int64, n_words

    @property
    def n_words(self) -> int:
        return len(self.counts)

    @property
    def nbytes(self) -> int:
        return sum(memoryview(a).nbytes for a in (self.arena, self.offsets, self.counts))

    @property
    def n_pretokens(self) -> int:
        """The sum of the counts.

        >>> WordTable.from_counts({b"a": 2, b"bc": 3}).n_pretokens
        5
        """
        if isinstance(self.counts, array.array):
            return table_sums(self.offsets, self.counts)[0]
        return int(self.counts.sum())

    @property
    def one_byte_words(self) -> int:
        """The number of words of one byte (they hold no pair).

        >>> WordTable.from_counts({b"a": 2, b"bc": 3}).one_byte_words
        1
        """
        if isinstance(self.counts, array.array):
            return table_sums(self.offsets, self.counts)[2]
        return int(np.count_nonzero(np.diff(self.offsets) == 1))

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

    def as_numpy(self) -> "WordTable":
        """The table with numpy arrays: itself, or views of its ``array.array`` memory (no copy).

        >>> t = WordTable(array.array("B", b"ab"), array.array("q", [0, 2]), array.array("q", [3]))
        >>> t.as_numpy().counts.dtype, t.as_numpy().to_dict()
        (dtype('int64'), {b'ab': 3})
        """
        if not isinstance(self.counts, array.array):
            return self
        return WordTable(np.frombuffer(self.arena, np.uint8), np.frombuffer(self.offsets, np.int64),
                         np.frombuffer(self.counts, np.int64))

    def to_dict(self) -> dict[bytes, int]:
        a = self.arena.tobytes()
        o = self.offsets
        return {a[o[i]:o[i + 1]]: int(self.counts[i]) for i in range(self.n_words)}

    def symbols(self) -> np.ndarray:
        """The words as uint32 symbols (each byte is its own token id), same offsets."""
        return self.as_numpy().arena.astype(np.uint32)

    def at_least(self, min_count: int) -> "WordTable":
        """Keep the words seen at least ``min_count`` times (this changes training results).

        >>> WordTable.from_counts({b"a": 1, b"bb": 3}).at_least(2).to_dict()
        {b'bb': 3}
        """
        table = self.as_numpy()
        return table._keep(table.counts >= min_count)

    def without_singletons(self) -> "WordTable":
        """Drop words of one byte: they hold no pair, so they never change the merges.

        >>> t = WordTable(array.array("B", b"abcd"), array.array("q", [0, 1, 3, 4]), array.array("q", [1, 2, 3]))
        >>> t.without_singletons().to_dict()
        {b'bc': 2}
        """
        if isinstance(self.counts, array.array):       # a small run's table (no numpy)
            kept = drop_one_byte_words(self.arena, self.offsets, self.counts)
            return self if kept is None else WordTable(*kept)
        return self._keep(np.diff(self.offsets) > 1)

    @property
    def mapped(self) -> bool:
        """The arrays are memory-mapped files (see :meth:`to_files`)."""
        return numpy_loaded() and isinstance(self.offsets, np.memmap)

    def to_files(self, folder: str, drop_singletons: bool = False,
                 step: int = 1 << 20) -> "WordTable":
        """The same table in files under ``folder``, memory-mapped read-only (page cache, not RSS).

        The files are written sequentially, ``step`` words at a time (no copy of the whole table in
        RAM), and unlinked once mapped: the mapping keeps them until the table is dropped, and a
        killed process leaves nothing behind. ``drop_singletons`` leaves out the words of one byte on
        the way (as :meth:`without_singletons`).

        >>> t = WordTable.from_counts({b"a": 4, b"bc": 2, b"def": 1})
        >>> import tempfile; m = t.to_files(tempfile.gettempdir(), drop_singletons=True)
        >>> m.mapped, m.to_dict()
        (True, {b'bc': 2, b'def': 1})
        """
        if isinstance(self.counts, array.array):
            return self.as_numpy().to_files(folder, drop_singletons, step)
        names = ("arena", "offsets", "counts")
        files = [new_temp_file(folder, f"bpe_core-spill-{os.getpid()}-table-{n}-")
                 for n in names]
        try:
            n_out, n_bytes = 0, 0
            outs = [WriteBehind(fd) for fd, _ in files]      # few dirty pages at a time (runtime.writeback)
            outs[1].write(np.zeros(1, np.int64))
            for lo in range(0, self.n_words, step):
                hi = min(self.n_words, lo + step)
                offs = np.asarray(self.offsets[lo:hi + 1])
                lengths = np.diff(offs)
                counts = np.asarray(self.counts[lo:hi])
                arena = np.asarray(self.arena[offs[0]:offs[-1]])
                if drop_singletons:
                    keep = lengths > 1
                    if not keep.all():   # (the bytes of the words dropped: those of one byte, each its byte)
                        arena = np.delete(arena, offs[:-1][lengths == 1] - offs[0])
                        lengths, counts = lengths[keep], counts[keep]
                ends = n_bytes + np.cumsum(lengths, dtype=np.int64)
                for out, arr in zip(outs, (arena, ends, counts)):
                    out.write(np.ascontiguousarray(arr))
                n_out += len(counts)
                n_bytes += int(arena.size)
            out = []
            for (fd, path), writer, dtype, n in zip(files, outs, (np.uint8, np.int64, np.int64),
                                                 (n_bytes, n_out + 1, n_out)):
                if os.fstat(fd).st_size != n * np.dtype(dtype).itemsize:
                    raise OSError(f"{path}: short write")
                writer.finish()           # clean pages: the kernel may drop them at once
                out.append(np.memmap(path, dtype=dtype, mode="r") if n else np.zeros(n, dtype))
            return WordTable(*out)
        finally:
            for fd, path in files:
                os.close(fd)
                os.unlink(path)

    def _keep(self, keep: np.ndarray) -> "WordTable":
        if keep.all():
            return self
        lengths = np.diff(self.offsets)
        byte_keep = np.repeat(keep, lengths)
        arena = self.arena[byte_keep]
        offsets = np.zeros(int(keep.sum()) + 1, np.int64)
        np.cumsum(lengths[keep], out=offsets[1:])
        return WordTable(arena, offsets, self.counts[keep])
