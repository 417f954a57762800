"""SupraTok (Tănase & Pelican, arXiv 2508.11857): three passes on the same merge engine.

Pass 1 -- standard BPE inside pretokens until the vocabulary reaches the pass-1 size (``transition``,
    as in SuperBPE: a size or a fraction of ``vocab_size``; default 0.4).
Pass 2 -- PMI-seeded multiword merges. Word n-grams (n = 2..6) with PMI >= ``seed_pmi`` and count >=
    ``seed_min_count`` are mined on the training units; overlap control keeps one phrase out of each
    family of variants. The engine then continues from the pass-1 state on the *units* (runs of
    pretokens between hard boundaries, as in SuperBPE). A merge is eligible when it stays inside one
    pretoken (BPE continues), or when its bytes lie inside a seed phrase and it passes the SuperBPE
    stage-2 rules. Pass 2 runs until the vocabulary is full or no eligible pair is left.
Pass 3 -- spans of 2..5 words scored with the paper's Appendix-A composite score on a held-out
    share of the training documents (split by a hash of each document). A span is added by the chain
    of merges that joins its current tokens, and only through *leaf surgery*: each new merge takes the
    slot of a leaf merge (one whose token no later merge uses), and the span is accepted only when
    ``Net(s) = A(s) - sum U(leaf) > 0``. The vocabulary stays at ``vocab_size``. Pass 3 repeats for
    ``supratok_rounds`` rounds, each from the current vocabulary, until no candidate is accepted.

Script-aware processing (``script_aware``): character-bigram gates for Chinese/Japanese/Thai,
a suffix gate for Turkish/Finnish with suffixes mined from the training data, Arabic hamza
normalization for the word statistics only. See ``docs/supratok.md`` for every choice.

The model stores three stages; the encoder (:class:`SupraTokEncoder`) applies pass-1 merges inside
pretokens, then the pass-2 and pass-3 merges in rank order inside units (SuperBPE's stage-aware
encoder), which is exactly the replay the trainer measures its final token count with.
"""
from __future__ import annotations

import dataclasses
import math
import time
import unicodedata
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import regex

from . import corpus
from ._engine import MergeEngine
from ._units import UnitCounter, WordIndex
from .memmon import phase
from .model_io import Model
from .patterns import encode_specials, resolve_pattern, split_on_specials
from .pretokenize import pretoken_ends
from .superbpe import (STAGE2_BYTES_PER_SYMBOL, StageAwareEncoder, Stage2Rules, _numeric_mask,
                       resolve_transition, stage2_table)
from .wordtable import WordTable
from .workers import FileStamp, InputChanged, read_range, run_ordered

# ==== Constants of the paper (Appendix A) ======================================================

TAU_BE = 1.15
STOPWORDS_EN = frozenset("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she should
so some such than that the their theirs them themselves then there these they this those through to
too under until up very was we were what when where which while who whom why will with would you your
yours yourself yourselves s t d ll m re ve don
""".split())

_LETTER_WORD = regex.compile(r"^ ?[\p{L}\p{M}]+$|^'[\p{L}]+$")


def sigmoid(k: float, x: float) -> float:
    """``1 / (1 + exp(-k x))``.

    >>> sigmoid(1.0, 0.0)
    0.5
    """
    return 1.0 / (1.0 + math.exp(-k * x))


# ==== Script-aware processing ==================================================================


def supercategory(ch: str) -> str:
    """The paper's five Unicode supercategories: ``LM`` letters and marks, ``PS`` punctuation and
    symbols, ``N`` numbers, ``Z`` separators, ``C`` control and other.

    >>> [supercategory(c) for c in "a\\u0301.5 \\n"]
    ['LM', 'LM', 'PS', 'N', 'Z', 'C']
    """
    c = unicodedata.category(ch)[0]
    return {"L": "LM", "M": "LM", "P": "PS", "S": "PS", "N": "N", "Z": "Z"}.get(c, "C")


def is_spaceless(ch: str) -> bool:
    """Chinese, Japanese or Thai characters (scripts that do not mark word boundaries).

    >>> is_spaceless("中"), is_spaceless("の"), is_spaceless("ก"), is_spaceless("a"), is_spaceless("한")
    (True, True, True, False, False)
    """
    o = ord(ch)
    return (0x0E00 <= o <= 0x0E7F or 0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x4DBF
            or 0x4E00 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or 0xFF66 <= o <= 0xFF9F)


_HAMZA = str.maketrans({"أ": "ا", "إ": "ا", "آ": "ا", "ٱ": "ا", "ؤ": "و", "ئ": "ي", "ء": ""})


def normalize_hamza(text: str) -> str:
    """Arabic hamza normalization (for counting statistics only; tokens stay exact).

    >>> normalize_hamza("أحمد سئل")
    'احمد سيل'
    """
    return text.translate(_HAMZA)


_TR_MARKERS = frozenset("ve bir bu için ile olarak çok daha gibi değil".split())
_FI_MARKERS = frozenset("ja että oli ovat myös mutta joka jotka ole sekä".split())


def guess_suffix_language(text: str) -> Optional[str]:
    """``"tr"``, ``"fi"`` or None, by function-word hits (a cheap document-level guess).

    >>> guess_suffix_language("Bu ev ve bir kedi için çok güzel"), guess_suffix_language("the cat")
    ('tr', None)
    """
    words = text.lower().split()
    tr = sum(1 for w in words if w in _TR_MARKERS)
    fi = sum(1 for w in words if w in _FI_MARKERS)
    distinct = max(len(_TR_MARKERS.intersection(words)), len(_FI_MARKERS.intersection(words)))
    if max(tr, fi) < 3 or distinct < 2 or max(tr, fi) < 0.02 * len(words):
        return None
    return "tr" if tr > fi else "fi"


def mine_suffixes(word_counts: dict[str, int], top: int = 200, min_stem: int = 3) -> list[str]:
    """The ``top`` most frequent word endings of 2..4 letters (with a stem of ``min_stem`` letters
    or more left), counted over words weighted by their counts.

    >>> mine_suffixes({"evlerde": 5, "okullarda": 3, "evde": 2}, top=2)
    ['de', 'erde']
    """
    ends: dict[str, int] = {}
    for w, c in word_counts.items():
        w = w.strip().lower()
        if not w.isalpha():
            continue
        for k in range(2, 5):
            if len(w) - k >= min_stem:
                ends[w[-k:]] = ends.get(w[-k:], 0) + c
    return [s for s, _ in sorted(ends.items(), key=lambda x: (-x[1], x[0]))[:top]]


@dataclass
class ScriptGate:
    """Which merges script-aware processing forbids (all passes).

    - spaceless scripts: a merge that joins two Chinese/Japanese/Thai characters at its junction
      needs that character bigram seen ``bigram_min`` times in the training text;
    - Turkish/Finnish: a merge whose junction falls strictly inside a mined suffix at the end of the
      merged token is refused unless its right part is itself a mined suffix, so stems and suffixes
      stay separable (the paper's "suffix-aware weighting", expressed as a gate: the engine ranks by
      count only).
    """

    bigrams: dict[str, int] = field(default_factory=dict)
    bigram_min: int = 50
    suffixes: frozenset = frozenset()

    @property
    def active(self) -> bool:
        return bool(self.bigrams) or bool(self.suffixes)

    def allows(self, left: bytes, right: bytes) -> bool:
        """>>> g = ScriptGate({"中国": 60, "国人": 3}, 50, frozenset({"de", "lerde"}))
        >>> g.allows("中".encode(), "国".encode()), g.allows("国".encode(), "人".encode())
        (True, False)
        >>> g.allows(b"evlerd", b"e"), g.allows(b"evler", b"de"), g.allows(b"ev", b"lerde")
        (False, True, True)
        """
        a = left.decode("utf-8", "surrogateescape")
        b = right.decode("utf-8", "surrogateescape")
        if not a or not b:
            return True
        if self.bigrams and is_spaceless(a[-1]) and is_spaceless(b[0]):
            if self.bigrams.get(a[-1] + b[0], 0) < self.bigram_min:
                return False
        if self.suffixes:
            m = (a + b).strip().lower()
            rb = b.strip().lower()
            if m.isalpha() and rb not in self.suffixes:
                for k in range(len(rb) + 1, min(len(m), 5)):
                    if m[-k:] in self.suffixes:
                        return False
        return True


def script_gate_from_table(table: WordTable, lang_words: dict[str, np.ndarray], bigram_min: int = 50,
                           suffix_top: int = 200) -> ScriptGate:
    """Build the gate: character bigrams of spaceless scripts from the word table, suffixes from the
    words of documents guessed Turkish or Finnish."""
    arena = table.arena.tobytes()
    offsets, counts = table.offsets, table.counts
    bigrams: dict[str, int] = {}
    high = np.zeros(table.n_words, dtype=bool)
    if table.n_words:
        word_of_byte = np.repeat(np.arange(table.n_words), np.diff(offsets))
        high[word_of_byte[table.arena >= 0xE0]] = True        # 3-byte UTF-8 leads: CJK, kana, Thai
    for w in np.flatnonzero(high):
        text = arena[offsets[w]:offsets[w + 1]].decode("utf-8", "surrogateescape")
        c = int(counts[w])
        for x, y in zip(text, text[1:]):
            if is_spaceless(x) and is_spaceless(y):
                bigrams[x + y] = bigrams.get(x + y, 0) + c
    suffixes: set[str] = set()
    for lang, wc in sorted(lang_words.items()):
        words = {arena[offsets[w]:offsets[w + 1]].decode("utf-8", "surrogateescape"): int(wc[w])
                 for w in np.flatnonzero(wc)}
        suffixes.update(mine_suffixes(words, suffix_top))
    return ScriptGate(bigrams, bigram_min, frozenset(suffixes))


# ==== Documents: units, held-out split, document frequencies =======================================



def is_heldout(doc: bytes, fraction: float) -> bool:
    """Deterministic held-out split by a hash of the document bytes.

    >>> is_heldout(b"some document", 0.0), is_heldout(b"some document", 1.0)
    (False, True)
    """
    return zlib.crc32(doc) < fraction * 2 ** 32


def _docs_chunk(task: tuple) -> tuple:
    """Worker: training units, held-out documents, document frequencies and language words."""
    path, start, end, specials, pattern, keep_below, heldout, script_aware, index, numeric, sid, stamp = task
    n_sids = int(sid.max()) + 1 if sid.size else 0
    buf = read_range(path, start, end, stamp)
    spans, _ = corpus.split_spans(buf, 0, len(buf), specials)
    counter = UnitCounter()
    df = np.zeros(n_sids, dtype=np.int64)
    held: list[np.ndarray] = []
    lang_ids: dict[str, list[np.ndarray]] = {}
    lang_docs: dict[str, int] = {}
    n_train = 0
    for s, e in spans:
        doc = buf[s:e].tobytes()
        ends = pretoken_ends(buf[s:e], pattern) + s
        ids = index.word_ids(buf, ends, s)
        if ids.size and ids.min() < 0:
            raise InputChanged(path, "changed while it was read: a pretoken is missing from the word table "
                                     "counted earlier; nothing was written")
        if is_heldout(doc, heldout):
            held.append(ids.astype(np.uint32))
            continue
        n_train += 1
        num = numeric[ids]
        cut = np.flatnonzero(num[1:] | num[:-1]) + 1
        bounds = np.concatenate(([0], cut, [ids.size])).astype(np.int64)
        counter.add_units(ids.astype(np.uint32), bounds, 1, keep_below)
        u = np.unique(sid[ids])
        df[u[u >= 0]] += 1
        if script_aware:
            lang = guess_suffix_language(doc.decode("utf-8", "surrogateescape"))
            if lang is not None:
                lang_ids.setdefault(lang, []).append(ids)
                lang_docs[lang] = lang_docs.get(lang, 0) + 1
    data, starts, counts = counter.to_arrays()
    lang_counts = {k: np.bincount(np.concatenate(v), minlength=len(numeric)) for k, v in lang_ids.items()}
    return data, starts, counts, counter.n_seen, counter.n_kept, df, held, n_train, (lang_counts, lang_docs)


def count_documents(path: str, table: WordTable, sid: np.ndarray, specials: Sequence[bytes], pattern: str,
                    num_workers: int, chunk_bytes: int, sample_fraction: float, heldout: float,
                    script_aware: bool) -> dict:
    """One pass over the corpus: training units (deduplicated, sampled), held-out documents as word-id
    arrays (sorted, so the result does not depend on chunking), word document frequencies."""
    stamp = FileStamp.of(path)
    chunks = corpus.file_chunks(path, chunk_bytes, specials, pattern, inside_documents=False, stamp=stamp)
    keep_below = 0xFFFFFFFFFFFFFFFF if sample_fraction >= 1 else int(sample_fraction * 2 ** 64)
    index = WordIndex(table.arena, table.offsets)
    numeric = _numeric_mask(table)
    tasks = [(path, s, e, list(specials), pattern, keep_below, heldout, script_aware, index, numeric, sid, stamp)
             for s, e in chunks]
    total = UnitCounter()
    out = {"seen": 0, "kept": 0, "df": np.zeros(int(sid.max()) + 1 if sid.size else 0, np.int64),
           "held": [], "n_train_docs": 0, "lang": {}, "lang_docs": {}}

    def absorb(r):
        data, starts, counts, n_seen, n_kept, df, held, n_train, lang = r
        total.add_table(data, starts, counts)
        out["seen"] += n_seen
        out["kept"] += n_kept
        out["df"] += df
        out["held"].extend(held)
        out["n_train_docs"] += n_train
        for k, v in lang[0].items():
            out["lang"][k] = out["lang"].get(k, 0) + v
        for k, v in lang[1].items():
            out["lang_docs"][k] = out["lang_docs"].get(k, 0) + v

    run_ordered(_docs_chunk, tasks, min(num_workers, len(tasks)), absorb)
    stamp.check()
    out["held"].sort(key=lambda a: (a.size, a.tobytes()))
    out["units"] = total.to_arrays()
    return out


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
        if not _LETTER_WORD.match(t):
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


def flatten_units(data: np.ndarray, starts: np.ndarray, values: np.ndarray, counts: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate units with a -1 separator after each; ``values`` maps word ids to the sequence,
    ``counts`` (one per unit) becomes a weight per position.

    >>> s, w = flatten_units(np.array([0, 1, 2]), np.array([0, 2, 3]), np.array([5, 6, 7]), np.array([2, 1]))
    >>> s.tolist(), w.tolist()
    ([5, 6, -1, 7, -1], [2, 2, 2, 1, 1])
    """
    lengths = np.diff(starts)
    n_units = lengths.size
    pos = np.arange(data.size) + np.repeat(np.arange(n_units), lengths)
    seq = np.full(data.size + n_units, -1, dtype=np.int64)
    seq[pos] = values[data]
    weights = np.repeat(counts.astype(np.int64), lengths + 1)
    return seq, weights


class NgramStats:
    """Word n-gram counts over the training units (apriori-pruned: an n-gram is counted only when
    both its (n-1)-grams reach ``min_count``), and the matching held-out counts.

    ``seq`` holds statistic ids per position (-1 for a non-letter word or a unit separator),
    ``raw`` the word-table ids (-1 separators), ``weights`` the unit count of each position.
    """

    def __init__(self, seq: np.ndarray, raw: np.ndarray, weights: np.ndarray, n_sids: int, max_n: int,
                 min_count: int):
        self.n_sids = max(n_sids, 1)
        valid = seq >= 0
        run = _run_lengths(valid)
        c1 = np.bincount(seq[valid], weights=weights[valid], minlength=self.n_sids).astype(np.int64)
        self.levels: list[Level] = [Level(1, np.arange(n_sids), np.arange(n_sids), c1, int(c1.sum()))]
        self.pos_ids: list[np.ndarray] = []      # per level: id at each position, -1 none
        g1 = np.where(valid, seq, -1)
        g1 = np.where((g1 >= 0) & (c1[np.maximum(g1, 0)] >= min_count), g1, -1)
        self.pos_ids.append(g1)
        self.seq, self.raw, self.weights = seq, raw, weights
        g = g1
        for n in range(2, max_n + 1):
            L = seq.size
            ok = np.zeros(L, dtype=bool)
            if L >= n:
                ok[:L - n + 1] = (g[:L - n + 1] >= 0) & (g[1:L - n + 2] >= 0) & (g1[n - 1:] >= 0)
            total = int(weights[run >= n].sum())
            where = np.flatnonzero(ok)
            key = g[where].astype(np.int64) * self.n_sids + g1[where + n - 1]
            uniq, inv = np.unique(key, return_inverse=True)
            cnt = np.bincount(inv, weights=weights[where], minlength=uniq.size).astype(np.int64)
            freq = cnt >= min_count
            new_id = np.cumsum(freq) - 1
            gn = np.full(L, -1, dtype=np.int64)
            gn[where] = np.where(freq[inv], new_id[inv], -1)
            self.levels.append(Level(n, uniq[freq] // self.n_sids, uniq[freq] % self.n_sids, cnt[freq], total))
            self.pos_ids.append(gn)
            g = gn

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
        gn = self.pos_ids[n - 1]
        cmap = np.full(self.levels[n - 1].counts.size, -1, dtype=np.int64)
        cmap[cand] = np.arange(cand.size)
        pos = np.flatnonzero(gn >= 0)
        ci = cmap[gn[pos]]
        keep = ci >= 0
        pos, ci = pos[keep], ci[keep]
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


# ==== Pass 2: seeds ============================================================================


def select_seeds(stats: NgramStats, surfaces: list[bytes], min_count: int, min_pmi: float, max_n: int = 6,
                 max_seeds: Optional[int] = None) -> list[tuple[int, ...]]:
    """PMI seeds: n-grams (2 <= n <= max_n) with count >= min_count and PMI >= min_pmi, ranked by
    count x PMI, with overlap control: a candidate sharing a run of max(2, n-1) or more consecutive
    words with an already chosen seed is a variant of it and is skipped."""
    cands = []
    for n in range(2, min(max_n, len(stats.levels)) + 1):
        lv = stats.levels[n - 1]
        if lv.counts.size == 0:
            continue
        pmi = stats.pmi(n)
        sel = np.flatnonzero((lv.counts >= min_count) & (pmi >= min_pmi))
        wm = stats.word_matrix(n)
        for j in sel:
            cands.append((-float(lv.counts[j] * pmi[j]), tuple(int(x) for x in wm[j])))
    cands.sort(key=lambda c: (c[0], [surfaces[w] for w in c[1]]))
    covered: set[tuple[int, ...]] = set()
    seeds: list[tuple[int, ...]] = []
    for _, words in cands:
        n = len(words)
        k = max(2, n - 1)
        if any(words[i:i + m] in covered for m in range(k, n + 1) for i in range(n - m + 1)):
            continue
        seeds.append(words)
        for m in range(2, n + 1):
            for i in range(n - m + 1):
                covered.add(words[i:i + m])
        if max_seeds is not None and len(seeds) >= max_seeds:
            break
    return seeds


class SeedRule:
    """Pass-2 eligibility: a merge inside one pretoken, or a merge whose bytes lie inside a seed
    phrase (after hamza normalization) and that passes the stage-2 rules; never one the script gate
    forbids."""

    def __init__(self, seed_surfaces: Sequence[bytes], pattern: str, rules: Stage2Rules,
                 gate: Optional[ScriptGate], normalize: bool):
        self.text = b"\x00".join(_norm_bytes(s, normalize) for s in seed_surfaces)
        self.pattern = pattern
        self.rules = rules
        self.gate = gate if gate is not None and gate.active else None
        self.normalize = normalize

    def allows(self, left: bytes, right: bytes) -> bool:
        if self.gate is not None and not self.gate.allows(left, right):
            return False
        merged = left + right
        if pretoken_ends(merged, self.pattern).size <= 1:
            return True
        if not self.rules.allows(left, right):
            return False
        return _norm_bytes(merged, self.normalize) in self.text


def _norm_bytes(b: bytes, normalize: bool) -> bytes:
    if not normalize:
        return b
    return normalize_hamza(b.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


# ==== Pass 3: Appendix-A score ===================================================================


@dataclass
class SpanFeatures:
    """What Appendix A needs about one candidate span s = (w_1..w_n)."""

    n: int
    c_train: int
    pmi: float
    npmi: float
    h_left: float
    h_right: float
    mean_idf: float
    adj_npmi: float
    c_peak: float
    l_tok: int
    r_stop: float
    all_stop: bool
    awl: float
    clen: int
    c_holdout: int
    df_holdout: int
    valid_surface: bool = True


def score_span(f: SpanFeatures) -> dict[str, float]:
    """The Appendix-A composite score S(s) and its factors (equations 6-12)."""
    h_b = min(f.h_left, f.h_right)
    g_b = sigmoid(1.75, h_b - TAU_BE)
    g_n = sigmoid(6.0, f.npmi - 0.22)
    b_spec = 1 + 0.14 * max(0.0, f.mean_idf - 1)
    b_con = 1 + 0.50 * max(0.0, f.adj_npmi - f.c_peak)
    p_stop = max(0.30, 1 - 0.78 * f.r_stop ** 1.35)
    b_len = 1 + 0.08 * max(0, f.n - 2)
    b_cont = 1 + 0.04 * max(0.0, f.awl - 5)
    p_surf = 0.88 if f.clen > 42 else 1.0
    g_tok = f.l_tok - 1
    g_hold = g_tok * (f.c_holdout + 0.60 * f.df_holdout + 0.18 * math.sqrt(f.c_train))
    s = g_hold * g_n * g_b * b_spec * b_con * p_stop * b_len * b_cont * p_surf
    if f.c_holdout == 0:
        s *= 0.45
    return {"H_B": h_b, "g_B": g_b, "g_N": g_n, "b_spec": b_spec, "b_con": b_con, "p_stop": p_stop,
            "b_len": b_len, "b_cont": b_cont, "p_surf": p_surf, "G_hold": g_hold, "S": s}


def hard_reject(f: SpanFeatures, sc: dict[str, float]) -> Optional[str]:
    """The Appendix-A rejection rule that fires first, or None."""
    if f.c_train < 3:
        return "c_train<3"
    if f.pmi < 4.4:
        return "PMI<4.4"
    if sc["g_B"] < 0.18:
        return "g_B<0.18"
    if f.r_stop >= 0.75:
        return "r_stop>=0.75"
    if f.all_stop:
        return "all stopwords"
    if not f.valid_surface:
        return "surface"
    if f.l_tok <= 1:
        return "l_tok<=1"
    if sc["S"] <= 0.40:
        return "S<=0.40"
    return None


def gain(f: SpanFeatures) -> float:
    """A(s) = c_holdout * max(1, l_tok - 1) + 0.35 df_holdout (equation 13)."""
    return f.c_holdout * max(1, f.l_tok - 1) + 0.35 * f.df_holdout


def leaf_utility(f_eval: int, df_eval: int) -> float:
    """U(m) = f_eval(m) + 0.35 df_eval(m) (equation 13)."""
    return f_eval + 0.35 * df_eval


def valid_surface(text: str) -> bool:
    """No digits, tabs, newlines, double spaces, control characters; only letters, marks, single
    spaces and apostrophes.

    >>> valid_surface(" of the"), valid_surface(" of  the"), valid_surface(" 3 times"), valid_surface("a\\tb")
    (True, False, False, False)
    """
    if "  " in text or not text.strip():
        return False
    for ch in text:
        sc = supercategory(ch)
        if sc == "LM" or ch == " " or ch == "'":
            continue
        return False
    return True


# ==== Training =================================================================================


def _encoder_for(vocab: dict[int, bytes], merges: list, n1: int, specials: Sequence[str], pattern: str
                 ) -> StageAwareEncoder:
    """SuperBPE's stage-aware encoder over (stage 1 = pass 1, stage 2 = passes 2 and 3)."""
    model = Model(vocab=vocab, merges=merges, special_tokens=list(specials), pattern=pattern, method="superbpe",
                  stages=[{"name": "bpe", "merges": n1}, {"name": "superbpe", "merges": len(merges) - n1}])
    return StageAwareEncoder(model)


def _vocab_of(merges: list, specials: Sequence[bytes]) -> dict[int, bytes]:
    vocab = {i: bytes([i]) for i in range(256)}
    for s in specials:
        vocab[len(vocab)] = s
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return vocab


def _replay(enc: StageAwareEncoder, table: WordTable, units: tuple, numeric: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segment word-id units the way the encoder does: stage 1 per word, stage 2 per unit.
    Returns (symbols, offsets, counts) of the final segmentation (counts are the units' counts)."""
    seg, seg_offs = enc.stage1.merge_many(table.arena.astype(np.uint32), table.offsets)
    syms, offs, cnts = stage2_table(units, table, seg, seg_offs, numeric, enc.lengths)
    out, out_offs = enc.stage2.merge_many(syms, offs)
    return out, out_offs, cnts


def _heldout_units(held: list[np.ndarray], numeric: np.ndarray) -> tuple:
    """Held-out documents as units; the 'count' of a unit is its document index (stage2_table keeps
    counts per unit, so the index follows each unit through the expansion)."""
    data, bounds, docs = [], [0], []
    pos = 0
    for d, ids in enumerate(held):
        if ids.size == 0:
            continue
        num = numeric[ids]
        cut = np.flatnonzero(num[1:] | num[:-1]) + 1
        b = np.concatenate((cut, [ids.size])) + pos
        bounds.extend(b.tolist())
        docs.extend([d] * b.size)
        data.append(ids)
        pos += ids.size
    if not data:
        return np.zeros(0, np.uint32), np.zeros(1, np.int64), np.zeros(0, np.int64)
    return np.concatenate(data).astype(np.uint32), np.array(bounds, np.int64), np.array(docs, np.int64)


def train_supratok(config, table: WordTable, report: dict, plan, progress: bool = False):
    """All passes on a counted corpus; returns ``(vocab, merges, stages)``."""
    specials = encode_specials(config.special_tokens)
    pattern = resolve_pattern(config.pattern)
    rules = Stage2Rules.from_config(config)
    t_size = resolve_transition(config.transition, config.vocab_size, len(specials))
    n1_target = t_size - 256 - len(specials)
    n_total = config.vocab_size - 256 - len(specials)
    script_aware = config.script_aware
    seconds = report["seconds"]
    info: dict[str, Any] = {"transition": t_size}
    t0 = time.perf_counter()

    # ---- documents: training units, held-out split, document frequencies
    phase("supratok documents")
    sid, surfaces = word_classes(table, normalize=script_aware)
    budget_share = max(plan.memory_limit - plan.parent_overhead - 3 * table.nbytes, 64 << 20)
    need = int(table.counts.sum() * 2) * STAGE2_BYTES_PER_SYMBOL
    fraction = 1.0 if need <= budget_share else budget_share / need
    docs = count_documents(config.input_path, table, sid, specials, pattern, plan.num_workers, plan.chunk_bytes,
                           fraction, config.heldout_fraction, script_aware)
    numeric = _numeric_mask(table)
    held = docs["held"]
    held_counts = np.zeros(table.n_words, np.int64)
    if held:
        held_counts = np.bincount(np.concatenate(held), minlength=table.n_words).astype(np.int64)
    # suffix mining only for a language that holds at least 1% of the training documents
    min_docs = max(5, 0.01 * docs["n_train_docs"])
    langs = {k: v for k, v in docs["lang"].items() if docs["lang_docs"].get(k, 0) >= min_docs}
    gate = (script_gate_from_table(table, langs, config.script_bigram_min)
            if script_aware else ScriptGate())
    info.update(sample_fraction=fraction, units_seen=docs["seen"], units_kept=docs["kept"],
                train_documents=docs["n_train_docs"], heldout_documents=len(held),
                spaceless_bigrams=len(gate.bigrams), suffixes=len(gate.suffixes))
    t1 = time.perf_counter()
    seconds["supratok_documents"] = round(t1 - t0, 3)

    # ---- pass 1: BPE inside pretokens on the training documents
    phase("merge loop")
    engine = MergeEngine(table.symbols(), table.offsets, np.maximum(table.counts - held_counts, 0),
                         [bytes([i]) for i in range(256)])
    steps1 = engine.run(n1_target, allowed=gate.allows if gate.active else None)
    seg_symbols, seg_offsets, _ = engine.words()
    tokens = engine.tokens()
    t2 = time.perf_counter()
    seconds["pass1"] = round(t2 - t1, 3)

    # ---- word statistics and seeds
    phase("supratok statistics")
    data, starts, ucounts = docs["units"]
    seq, weights = flatten_units(data, starts, sid, ucounts)
    raw, _ = flatten_units(data, starts, np.arange(table.n_words), ucounts)
    max_n = max(config.seed_max_n, config.span_max_n)
    stats = NgramStats(seq, raw, weights, len(surfaces), max_n, min(config.seed_min_count, config.span_min_count))
    seeds = select_seeds(stats, surfaces, config.seed_min_count, config.seed_pmi, config.seed_max_n)
    seed_surfaces = [b"".join(surfaces[w] for w in s) for s in seeds]
    info["seeds"] = len(seeds)
    info["seed_examples"] = [s.decode("utf-8", "replace") for s in seed_surfaces[:20]]
    t3 = time.perf_counter()
    seconds["supratok_statistics"] = round(t3 - t2, 3)

    # ---- pass 2: seeded cross-boundary merges on the units
    phase("merge loop")
    token_lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    usyms, uoffs, ucnts = stage2_table(docs["units"], table, seg_symbols, seg_offsets, numeric, token_lengths)
    engine2 = MergeEngine(usyms, uoffs, ucnts, tokens)
    del usyms, uoffs
    rule = SeedRule(seed_surfaces, pattern, rules, gate, script_aware)
    steps2 = engine2.run(n_total - len(steps1), allowed=rule.allows)
    all_tokens = engine2.tokens()
    merges = [(all_tokens[a], all_tokens[b]) for a, b, _ in list(steps1) + list(steps2)]
    n1 = len(steps1)
    n2 = len(steps2)
    _, f_offs, f_counts = engine2.words()
    info["pass2_engine_tokens"] = int((np.diff(f_offs) * f_counts).sum())
    info["pass1_merges"], info["pass2_merges"] = n1, n2
    info["pass2_cross_merges"] = sum(1 for a, b in merges[n1:] if pretoken_ends(a + b, pattern).size > 1)
    t4 = time.perf_counter()
    seconds["pass2"] = round(t4 - t3, 3)

    # ---- pass 3: scored spans with leaf surgery
    phase("supratok pass 3")
    held_data, held_bounds, held_docs = _heldout_units(held, numeric)
    hseq, _ = flatten_units(held_data, held_bounds, sid, np.ones(max(held_bounds.size - 1, 0), np.int64))
    hdocs = np.repeat(held_docs, np.diff(held_bounds) + 1) if held_docs.size else np.zeros(0, np.int64)
    features = span_candidates(stats, surfaces, docs["df"], docs["n_train_docs"], hseq, hdocs, config)
    info["pass3_candidates"] = len(features)
    origin = [1] * n1 + [2] * n2          # which pass made each merge (kept in step with ``merges``)
    spans3: list[tuple[bytes, ...]] = []
    n_removed = 0
    rounds = []
    for r in range(config.supratok_rounds):
        vocab = _vocab_of(merges, specials)
        enc = _encoder_for(vocab, merges, n1, config.special_tokens, pattern)
        accepted, removed, log = leaf_surgery(enc, merges, n1, table, held_data, held_bounds, held_docs, numeric,
                                              features, free_slots=n_total - len(merges))
        rounds.append(log)
        if not accepted:
            break
        keep = [i for i in range(len(merges)) if i not in removed]
        n1 -= sum(1 for i in removed if i < n1)
        n_removed += len(removed)
        merges = [merges[i] for i in keep]
        origin = [origin[i] for i in keep]
        for chain in accepted:
            merges.extend(chain)
            origin.extend([3] * len(chain))
            spans3.append(tuple(chain))
    info["pass3_rounds"] = rounds
    info["pass3_spans"] = len(spans3)
    info["pass3_removed_leaves"] = n_removed
    n3 = origin.count(3)
    t5 = time.perf_counter()
    seconds["pass3"] = round(t5 - t4, 3)

    # ---- the final token count, by the encoder's own replay
    vocab = _vocab_of(merges, specials)
    enc = _encoder_for(vocab, merges, n1, config.special_tokens, pattern)
    _, o, c = _replay(enc, table, docs["units"], numeric)
    info["final_tokens"] = int((np.diff(o) * c).sum())
    hd, hb, _ = _heldout_units(held, numeric)
    held_tokens = 0
    if hd.size:
        _, ho, _ = _replay(enc, table, (hd, hb, np.ones(hb.size - 1, np.int64)), numeric)
        held_tokens = int(np.diff(ho).sum())
    info["heldout_tokens"] = held_tokens
    # tokens of the whole corpus (special tokens excluded) when no sampling happened
    info["final_tokens_corpus"] = info["final_tokens"] + held_tokens if fraction >= 1 else None
    seconds["merge_loop"] = round((t2 - t1) + (t4 - t3), 3)
    report["engine"] = engine2.stats()
    report["merges"] = len(merges)
    report["merges_requested"] = max(n_total, 0)
    report["supratok"] = info
    n2_final = origin.count(2)
    stages = [
        {"name": "bpe", "merges": n1},
        {"name": "supratok-seeds", "merges": n2_final, "rules": rules.to_dict(),
         "seeds_hex": [x.hex() for x in seed_surfaces]},
        {"name": "supratok-spans", "merges": n3, "spans": len(spans3)},
    ]
    return vocab, merges, stages


def span_candidates(stats: NgramStats, surfaces: list[bytes], df: np.ndarray, n_docs: int, hseq: np.ndarray,
                    hdocs: np.ndarray, config) -> list[tuple[bytes, list[bytes], SpanFeatures]]:
    """Pass-3 candidates (2..span_max_n words, count >= span_min_count, PMI >= span_pmi) with every
    Appendix-A feature except ``l_tok`` (which depends on the current vocabulary)."""
    l1 = stats.levels[0]
    texts = [s.decode("utf-8", "surrogateescape") for s in surfaces]
    is_stop = np.array([t.strip().lower().lstrip("'") in STOPWORDS_EN for t in texts], dtype=bool)
    idf = np.log((n_docs + 1) / (1 + df.astype(np.float64))) if df.size else np.zeros(0)
    wlen = np.array([len(t.strip()) for t in texts], dtype=np.int64)
    out = []
    bigram_npmi = stats.npmi(2) if len(stats.levels) > 1 else np.zeros(0)
    for n in range(2, min(config.span_max_n, len(stats.levels)) + 1):
        lv = stats.levels[n - 1]
        if lv.counts.size == 0:
            continue
        pmi = stats.pmi(n)
        npmi = stats.npmi(n)
        cand = np.flatnonzero((lv.counts >= config.span_min_count) & (pmi >= config.span_pmi))
        if cand.size > config.span_max_candidates:
            order = np.lexsort((cand, -(lv.counts[cand] * pmi[cand])))
            cand = np.sort(cand[order[:config.span_max_candidates]])
        if cand.size == 0:
            continue
        wm = stats.word_matrix(n)[cand]
        h_l, h_r, peak = stats.contexts(n, cand)
        c_h, d_h = stats.heldout_counts(n, hseq, hdocs, cand)
        bi = stats.lookup(2, np.stack([wm[:, :-1].ravel(), wm[:, 1:].ravel()], axis=1)).reshape(cand.size, n - 1)
        adj = np.where(bi >= 0, bigram_npmi[np.maximum(bi, 0)], 0.0).mean(axis=1)
        for k, j in enumerate(cand):
            words = [surfaces[w] for w in wm[k]]
            surface = b"".join(words)
            text = surface.decode("utf-8", "surrogateescape")
            stops = is_stop[wm[k]]
            f = SpanFeatures(
                n=n, c_train=int(lv.counts[j]), pmi=float(pmi[j]), npmi=float(npmi[j]),
                h_left=float(h_l[k]), h_right=float(h_r[k]), mean_idf=float(idf[wm[k]].mean()),
                adj_npmi=float(adj[k]), c_peak=float(peak[k]), l_tok=0, r_stop=float(stops.mean()),
                all_stop=bool(stops.all()), awl=float(wlen[wm[k]].mean()), clen=len(text.strip()),
                c_holdout=int(c_h[k]), df_holdout=int(d_h[k]), valid_surface=valid_surface(text))
            out.append((surface, words, f))
    out.sort(key=lambda x: x[0])
    return out


def leaf_surgery(enc: StageAwareEncoder, merges: list, n1: int, table: WordTable, held_data, held_bounds,
                 held_docs, numeric, features, free_slots: int = 0):
    """One round of pass 3. Returns (accepted chains of merges, indices of removed merges, log).

    U(m) of every leaf merge is measured on the held-out documents encoded with the current
    vocabulary; candidates are taken in decreasing Priority(s) = Net(s) + 0.03 S(s) and each takes the
    cheapest leaves still free (free vocabulary slots cost nothing); accepted iff Net(s) > 0.
    """
    # held-out token counts and document frequencies per token bytes
    f_eval: dict[bytes, int] = {}
    df_eval: dict[bytes, int] = {}
    if held_data.size:
        out, offs, docs = _replay(enc, table, (held_data, held_bounds, held_docs), numeric)
        unit_of = np.repeat(np.arange(offs.size - 1), np.diff(offs))
        tb = enc.token_bytes
        c = np.bincount(out, minlength=len(tb))
        dd = np.unique(docs[unit_of].astype(np.int64) * len(tb) + out)
        d = np.bincount(dd % len(tb), minlength=len(tb))
        for i in np.flatnonzero(c):
            f_eval[tb[i]] = f_eval.get(tb[i], 0) + int(c[i])
            df_eval[tb[i]] = df_eval.get(tb[i], 0) + int(d[i])
    results = [a + b for a, b in merges]
    operands = set()
    leaves = []
    for i in range(len(merges) - 1, -1, -1):
        a, b = merges[i]
        if results[i] not in operands:
            leaves.append(i)
        operands.add(a)
        operands.add(b)
    util = {i: leaf_utility(f_eval.get(results[i], 0), df_eval.get(results[i], 0)) for i in leaves}
    leaves.sort(key=lambda i: (util[i], -i))
    # score the candidates under the current vocabulary
    scored = []
    for surface, words, f0 in features:
        toks = [enc.token_bytes[i] for i in enc.encode_ordinary(surface).tolist()]
        f = dataclasses.replace(f0, l_tok=len(toks))
        sc = score_span(f)
        if hard_reject(f, sc) is not None:
            continue
        k = len(toks) - 1
        cost = sum(util[i] for i in leaves[:max(0, k - free_slots)])
        net = gain(f) - cost
        scored.append((-(net + 0.03 * sc["S"]), surface, toks, f, sc))
    scored.sort(key=lambda x: (x[0], x[1]))
    accepted, removed = [], []
    protected: set[bytes] = set()
    taken: list[bytes] = []
    li = 0
    free = free_slots
    log = {"scored": len(scored), "accepted": 0, "examples": []}
    removed_bytes: set[bytes] = set()
    for _, surface, toks, f, sc in scored:
        if any(surface in t or t in surface for t in taken):
            continue                                   # overlap with a span accepted this round
        if removed_bytes.intersection(toks):
            continue                                   # its segmentation lost a token this round
        k = len(toks) - 1
        use_free = min(free, k)
        chosen = []
        j = li
        while len(chosen) < k - use_free and j < len(leaves):
            if results[leaves[j]] not in protected and results[leaves[j]] not in toks:
                chosen.append(j)
            j += 1
        if len(chosen) < k - use_free:
            break
        net = gain(f) - sum(util[leaves[x]] for x in chosen)
        if net <= 0:
            continue
        free -= use_free
        chain = []
        left = toks[0]
        for t in toks[1:]:
            chain.append((left, t))
            left = left + t
        accepted.append(chain)
        taken.append(surface)
        protected.update(toks)
        for x in chosen:
            removed.append(leaves[x])
            removed_bytes.add(results[leaves[x]])
        chosen_set = set(chosen)
        leaves = [l for x, l in enumerate(leaves) if x not in chosen_set]
        if len(log["examples"]) < 10:
            log["examples"].append({"span": surface.decode("utf-8", "replace"), "net": round(net, 2),
                                    "S": round(sc["S"], 2), "l_tok": f.l_tok})
    log["accepted"] = len(accepted)
    log["removed"] = len(removed)
    return accepted, set(removed), log


# ==== Encoding =================================================================================


class SupraTokEncoder:
    """Encode with a SupraTok model: pass-1 merges inside pretokens, then the pass-2 and pass-3 merges
    in rank order inside units (SuperBPE's stage-aware encoder on the same stage split)."""

    def __init__(self, model: Model):
        if model.method != "supratok":
            raise ValueError(f"not a SupraTok model (method {model.method!r})")
        n1 = int(model.stages[0]["merges"])
        inner = dataclasses.replace(model, method="superbpe",
                                    stages=[{"name": "bpe", "merges": n1},
                                            {"name": "superbpe", "merges": len(model.merges) - n1}])
        self.model = model
        self._enc = StageAwareEncoder(inner)

    def encode_ordinary(self, data: bytes) -> np.ndarray:
        return self._enc.encode_ordinary(data)

    def encode(self, data: bytes | str) -> list[int]:
        return self._enc.encode(data)

    def decode(self, ids: Sequence[int]) -> bytes:
        vocab = self.model.vocab
        return b"".join(vocab[i] for i in ids)
