"""Word statistics over the units: word classes, n-gram counts, PMI and contexts."""
from __future__ import annotations

import numpy as np

from dataclasses import dataclass
from typing import Callable, Optional


from ...pretok.wordtable import WordTable
from .script import LETTER_WORD, normalize_hamza


# ==== Word statistics: n-grams, PMI, contexts ====================================================


def word_classes(table: WordTable, normalize: bool) -> tuple[np.ndarray, list[bytes]]:
    """Statistic ids per word-table row (-1: not a letter word), and a surface per id.

    Letter words are pretokens of letters and marks with at most one leading space, or an apostrophe
    contraction. With ``normalize``, words equal after hamza normalization share an id (its surface is
    the most frequent member).
    """
    arena = table.arena.tobytes()
    offs = table.offsets
    sid = np.full(table.n_words, -1, dtype=np.int64)
    keys: dict[str, int] = {}
    best: list[tuple[int, bytes]] = []
    for w in range(table.n_words):
        b = arena[offs[w]:offs[w + 1]]
        t = b.decode("utf-8", "surrogateescape")
        if not LETTER_WORD.match(t):
            continue
        k = normalize_hamza(t) if normalize else t
        i = keys.get(k)
        c = int(table.counts[w])
        if i is None:
            i = keys[k] = len(best)
            best.append((c, b))
        elif c > best[i][0]:
            best[i] = (c, b)
        sid[w] = i
    return sid, [b for _, b in best]


@dataclass
class Level:
    """The frequent n-grams of one length ``n``: ids 0.. in key order."""

    n: int
    prefix: np.ndarray      # id of the (n-1)-gram prefix (for n = 1: the statistic id)
    last: np.ndarray        # statistic id of the last word
    counts: np.ndarray      # weighted training count
    total: int              # N_n: observed training n-grams (windows of n letter words)


def _run_lengths(valid: np.ndarray) -> np.ndarray:
    """Consecutive valid positions starting at each position.

    >>> _run_lengths(np.array([1, 1, 0, 1], bool)).tolist()
    [2, 1, 0, 1]
    """
    n = valid.size
    idx = np.where(~valid, np.arange(n), n)
    nxt = np.minimum.accumulate(idx[::-1])[::-1]
    return nxt - np.arange(n)


def flatten_units(data: np.ndarray, starts: np.ndarray, values: np.ndarray, counts: np.ndarray,
                  dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate units with a -1 separator after each; ``values`` maps word ids to the sequence
    (of ``dtype``: int32 halves it when the values fit), ``counts`` (one per unit) becomes a weight
    per position (int32 too with ``dtype`` int32 when the counts fit).

    >>> s, w = flatten_units(np.array([0, 1, 2]), np.array([0, 2, 3]), np.array([5, 6, 7]), np.array([2, 1]))
    >>> s.tolist(), w.tolist()
    ([5, 6, -1, 7, -1], [2, 2, 2, 1, 1])
    """
    lengths = np.diff(starts)
    n_units = lengths.size
    seq = np.full(data.size + n_units, -1, dtype=dtype)
    if seq.size:
        # a mask of the separators, not an int64 index of every position (three such arrays were
        # the largest temporaries of the statistics)
        sep = np.zeros(seq.size, dtype=bool)
        sep[np.cumsum(lengths + 1) - 1] = True
        seq[~sep] = np.asarray(values).astype(dtype, copy=False)[data]
        del sep
    counts = np.asarray(counts)
    small = dtype == np.int32 and (counts.size == 0 or int(counts.max()) < 2 ** 31)
    weights = np.repeat(counts.astype(np.int32 if small else np.int64), lengths + 1)
    return seq, weights


class NgramStats:
    """Word n-gram counts over the training units (apriori-pruned: an n-gram is counted only when
    both its (n-1)-grams reach ``min_count``), and the matching held-out counts.

    ``seq`` holds statistic ids per position (-1 for a non-letter word or a unit separator),
    ``raw`` the word-table ids (-1 separators), ``weights`` the unit count of each position.
    ``on_level(1)`` is called as each length n >= 2 is done (a progress bar).

    With ``contexts_for(stats, n)`` (the ids of length ``n`` whose :meth:`contexts` will be asked
    for), those contexts are taken as each length is built and the n-gram id of every position
    is not kept (``pos_ids[n - 1]`` is None): one int32 per position and length less.
    """

    def __init__(self, seq: np.ndarray, raw: np.ndarray, weights: np.ndarray, n_sids: int, max_n: int,
                 min_count: int, on_level: Optional[Callable[[int], None]] = None, block: int = 1 << 20,
                 contexts_for: Optional[Callable[["NgramStats", int], np.ndarray]] = None):
        self.n_sids = max(n_sids, 1)
        self._contexts: dict[int, tuple] = {}
        valid = seq >= 0
        # N_n: the weight of the windows of n valid positions (a run of n letter words starts there),
        # with one bool per position (the int64 run lengths took several arrays of every position)
        totals: dict[int, int] = {}
        run = valid.copy()
        for n in range(2, max_n + 1):
            run[:max(seq.size - n + 1, 0)] &= valid[n - 1:]
            run[max(seq.size - n + 1, 0):] = False
            totals[n] = int(weights[run].sum(dtype=np.int64))
        del run
        c1 = np.bincount(seq[valid], weights=weights[valid], minlength=self.n_sids).astype(np.int64)
        self.levels: list[Level] = [Level(1, np.arange(n_sids), np.arange(n_sids), c1, int(c1.sum()))]
        # per level: id at each position, -1 none (int32: one per position of every level is the
        # largest part of the statistics)
        self.pos_ids: list[np.ndarray] = []
        frequent = c1 >= min_count
        g1 = np.where(valid & frequent[np.maximum(seq, 0)], seq, -1).astype(np.int32, copy=False)
        del frequent
        del valid
        self.pos_ids.append(g1)
        self.seq, self.raw, self.weights = seq, raw, weights
        g = g1
        for n in range(2, max_n + 1):
            L = seq.size
            m = L - n + 1                      # window starts
            # counted a block of windows at a time: the temporaries (keys, sort, inverse) are a few
            # int64 per window of one block, not of the whole sequence; float sums of integer
            # weights, as in one np.bincount over every window
            # (each block's distinct keys are merged into the running ones at once: the blocks share
            # most of their n-grams, so keeping every block's list until the end cost more)
            uniq, sums = np.zeros(0, np.int64), np.zeros(0, np.float64)
            for a in range(0, max(m, 0), block):
                where, key = self._windows(g, g1, n, a, min(a + block, m))
                u, inv = np.unique(key, return_inverse=True)
                c = np.bincount(inv, weights=weights[where], minlength=u.size)
                del where, key, inv
                uniq, inv = np.unique(np.concatenate((uniq, u)), return_inverse=True)
                sums = np.bincount(inv, weights=np.concatenate((sums, c)), minlength=uniq.size)
                del u, c, inv
            cnt = sums.astype(np.int64)
            del sums
            freq = cnt >= min_count
            fkeys = uniq[freq]                 # sorted: an n-gram's id is its index here
            gn = np.full(L, -1, dtype=np.int32)
            if fkeys.size:
                for a in range(0, max(m, 0), block):
                    where, key = self._windows(g, g1, n, a, min(a + block, m))
                    k = np.minimum(np.searchsorted(fkeys, key), fkeys.size - 1)
                    hit = fkeys[k] == key
                    gn[where[hit]] = k[hit]
                    del where, key, k, hit
            self.levels.append(Level(n, fkeys // self.n_sids, fkeys % self.n_sids, cnt[freq], totals[n]))
            self.pos_ids.append(gn)
            if contexts_for is not None:
                cand = np.asarray(contexts_for(self, n))
                self._contexts[n] = (cand.copy(), self.contexts(n, cand))
                if n > 2:
                    self.pos_ids[n - 2] = None         # level n-1: its contexts are taken, its ids used
            g = gn
            if on_level is not None:
                on_level(1)
        if contexts_for is not None and max_n >= 2:
            self.pos_ids[0] = self.pos_ids[max_n - 1] = None

    def _windows(self, g: np.ndarray, g1: np.ndarray, n: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The windows of length ``n`` starting at ``a..b-1`` whose (n-1)-gram prefix and suffix are
        frequent (``g``: level n-1 ids, ``g1``: frequent words): their starts and keys."""
        ok = (g[a:b] >= 0) & (g[a + 1:b + 1] >= 0) & (g1[a + n - 1:b + n - 1] >= 0)
        where = np.flatnonzero(ok) + a
        return where, g[where].astype(np.int64) * self.n_sids + g1[where + n - 1]

    # ---- per-level features ------------------------------------------------------------------

    def words(self, n: int, j: int) -> list[int]:
        """The statistic ids of n-gram ``j`` of length ``n``."""
        out = []
        while n > 1:
            lv = self.levels[n - 1]
            out.append(int(lv.last[j]))
            j = int(lv.prefix[j])
            n -= 1
        out.append(j)
        return out[::-1]

    def word_matrix(self, n: int) -> np.ndarray:
        """All n-grams of length ``n`` as a (count, n) matrix of statistic ids."""
        lv = self.levels[n - 1]
        cols = [lv.last]
        j = lv.prefix
        for m in range(n - 1, 1, -1):
            lm = self.levels[m - 1]
            cols.append(lm.last[j])
            j = lm.prefix[j]
        cols.append(j)
        return np.stack(cols[::-1], axis=1) if n > 1 else lv.last[:, None]

    def pmi(self, n: int) -> np.ndarray:
        """PMI (bits) of every n-gram of length ``n``: log2(p(s) / prod p(w_i)), p = count / N."""
        lv = self.levels[n - 1]
        l1 = self.levels[0]
        wm = self.word_matrix(n)
        lp_words = np.log2(l1.counts[wm] / max(l1.total, 1)).sum(axis=1)
        return np.log2(lv.counts / max(lv.total, 1)) - lp_words

    def npmi(self, n: int) -> np.ndarray:
        lv = self.levels[n - 1]
        p = lv.counts / max(lv.total, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = self.pmi(n) / -np.log2(p)
        return np.where(p < 1, out, 1.0)

    def lookup(self, n: int, words: np.ndarray) -> np.ndarray:
        """Ids of the n-grams given as rows of statistic ids (-1 when not a frequent n-gram)."""
        ids = words[:, 0].astype(np.int64)
        ids = np.where(self.levels[0].counts[np.maximum(ids, 0)] > 0, ids, -1)
        for m in range(2, n + 1):
            lv = self.levels[m - 1]
            keys = lv.prefix * self.n_sids + lv.last
            q = ids * self.n_sids + words[:, m - 1]
            k = np.searchsorted(keys, q)
            k = np.minimum(k, max(keys.size - 1, 0))
            hit = (ids >= 0) & (keys.size > 0) & (keys[k] == q) if keys.size else np.zeros(ids.size, bool)
            ids = np.where(hit, k, -1)
        return ids

    def contexts(self, n: int, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Branching entropies H_L, H_R (bits) and the peak context probability of the candidate
        n-grams ``cand`` (ids of level ``n``); contexts are the neighbouring word-table ids, a unit
        edge counting as one context of its own."""
        known = self._contexts.get(n)
        if known is not None and np.array_equal(known[0], cand):
            return known[1]
        gn = self.pos_ids[n - 1]
        if gn is None:
            raise ValueError(f"the contexts of these {n}-grams were not kept (NgramStats(contexts_for=))")
        # candidate index per n-gram id; the extra last slot answers id -1 (no n-gram), so the
        # positions of the candidates are found without an array of every position of the level
        cmap = np.full(self.levels[n - 1].counts.size + 1, -1, dtype=np.int32)
        cmap[cand] = np.arange(cand.size)
        pos = np.flatnonzero(cmap[gn] >= 0)
        ci = cmap[gn[pos]].astype(np.int64)
        w = self.weights[pos]
        left = np.where(pos > 0, self.raw[np.maximum(pos - 1, 0)], -1)
        right = self.raw[pos + n] if pos.size else pos
        out = []
        peak = np.zeros(cand.size)
        for ctx in (left, right):
            key = ci * (int(self.raw.max()) + 2 if self.raw.size else 1) + (ctx + 1)
            uniq, inv = np.unique(key, return_inverse=True)
            cnt = np.bincount(inv, weights=w)
            owner = uniq // (int(self.raw.max()) + 2 if self.raw.size else 1)
            tot = np.bincount(owner, weights=cnt, minlength=cand.size)
            p = cnt / tot[owner]
            h = np.bincount(owner, weights=-p * np.log2(p), minlength=cand.size)
            out.append(np.maximum(h, 0.0))
            np.maximum.at(peak, owner, p)
        return out[0], out[1], peak

    def heldout_counts(self, n: int, seq: np.ndarray, docs: np.ndarray, cand: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Count and document frequency of the candidates ``cand`` (ids of level ``n``) in a held-out
        sequence (statistic ids, -1 separators) whose positions belong to documents ``docs``."""
        L = seq.size
        if L < n:
            return np.zeros(cand.size, np.int64), np.zeros(cand.size, np.int64)
        win = np.lib.stride_tricks.sliding_window_view(seq, n)
        good = (win >= 0).all(axis=1)
        where = np.flatnonzero(good)
        ids = self.lookup(n, win[where]) if where.size else np.zeros(0, np.int64)
        cmap = np.full(self.levels[n - 1].counts.size, -1, dtype=np.int64)
        cmap[cand] = np.arange(cand.size)
        ci = np.where(ids >= 0, cmap[np.maximum(ids, 0)], -1)
        hit = ci >= 0
        c = np.bincount(ci[hit], minlength=cand.size)
        pairs = np.unique(ci[hit] * (int(docs.max()) + 1 if docs.size else 1) + docs[where[hit]])
        d = np.bincount(pairs // (int(docs.max()) + 1 if docs.size else 1), minlength=cand.size)
        return c.astype(np.int64), d.astype(np.int64)
