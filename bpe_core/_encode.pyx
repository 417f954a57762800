# cython: language_level=3
"""The encoder core: merge pretokens by rank, with a pretoken -> ids cache.

Semantics (equivalent to ``reference.encode_pretoken``): a pretoken starts as its bytes, one token
each; repeatedly, the pair with the lowest merge rank present is merged at all of its occurrences,
greedily left to right without overlap (``aaa`` with ``(a, a)`` gives ``[aa, a]``); stop when no
adjacent pair is a merge. Token ids are canonical by bytes (``reference.token_ids``: the smallest id
holding the bytes), so a pair of ids names a pair of byte strings and ``RankTable`` can key on ids.

Why "all occurrences, then the next rank" and not tiktoken's "one occurrence at a time": the two
differ only when a merge creates a pair whose rank is *lower* than the merge being applied, which
happens when two merges build the same bytes (``(a, bc)`` and ``(ab, c)``). The reference, our
trainer and GPT-2's ``encoder.py`` apply a rank to the whole pretoken before looking at lower ranks,
so both paths here do too: pairs of a lower rank created during a batch wait in ``deferred``.

Two paths, the same result (tests run both on the same input):

- ``_merge_scan`` (pieces up to ``SHORT_PIECE`` bytes): find the lowest rank by a linear scan,
  rewrite the piece in one pass, look up only the pairs that touch a merged token. O(n) a merge.
- ``_merge_heap`` (longer pieces): tokens in a doubly linked list over byte positions; a min-heap
  of ``(rank << 32) | position`` entries. An entry is valid while ``pair_ranks[position]`` still
  equals its rank (a dead position has ``NO_RANK``); stale entries are skipped on pop (invalidate,
  don't delete, as tiktoken's ``_byte_pair_merge_large``). Within one rank, entries pop in position
  order, which is the left-to-right rewrite. O(n log n): ``b"a" * 100_000`` takes milliseconds.

The cache maps pretoken bytes (up to ``max_cached_len``) to their ids: most of a corpus is a few
hundred thousand distinct pretokens. Slots hold the full hash and an arena offset; the arena holds
each pretoken's ids followed by its bytes, so a hit costs two cache lines. It is cleared whole when it holds
``max_entries`` pretokens, so memory stays bounded. An ``Encoder`` is not thread-safe (it
owns the cache and scratch buffers); ``Tokenizer`` keeps one per thread. All work runs without the
GIL.
"""
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from libcpp.algorithm cimport pop_heap, push_heap
from libcpp.vector cimport vector

import numpy as np

from bpe_core._typedefs cimport pack_pair, pair_key_t, token_id_t


cdef extern from *:
    """
    static const uint32_t BPE_NO_RANK = 0xFFFFFFFFu;
    static const uint64_t BPE_EMPTY_KEY = 0xFFFFFFFFFFFFFFFFull;
    static const uint64_t BPE_MUL1 = 0x9E3779B97F4A7C15ull;
    static const uint64_t BPE_MUL2 = 0xBF58476D1CE4E5B9ull;
    static const uint64_t BPE_MUL3 = 0x94D049BB133111EBull;
    """
    const uint32_t NO_RANK "BPE_NO_RANK"
    const uint64_t EMPTY_KEY "BPE_EMPTY_KEY"
    const uint64_t MUL1 "BPE_MUL1"
    const uint64_t MUL2 "BPE_MUL2"
    const uint64_t MUL3 "BPE_MUL3"


cdef enum:
    SHORT_PIECE = 128          # longest piece merged by the linear scan; longer ones use the heap


# ==== Hashing ================================================================================


cdef inline uint64_t _mix(uint64_t h) noexcept nogil:
    h ^= h >> 31
    h *= MUL2
    h ^= h >> 29
    return h


cdef inline uint64_t _hash_bytes(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """8 bytes at a time, multiply-xorshift; good enough for a cache keyed on short pretokens."""
    cdef uint64_t h = MUL1 ^ (<uint64_t>n * MUL3)
    cdef uint64_t w
    while n >= 8:
        memcpy(&w, p, 8)
        h = _mix((h ^ w) * MUL1)
        p += 8
        n -= 8
    w = 0
    cdef Py_ssize_t i
    for i in range(n):                      # the tail, without a memcpy call
        w |= (<uint64_t>p[i]) << (8 * i)
    return _mix((h ^ w) * MUL3)


# ==== Rank table =============================================================================


cdef class RankTable:
    """Pair of token ids -> (merge rank, id of the merged token), in an open-addressing table.

    Args:
        lefts, rights: uint32, one entry per merge (index = rank): the canonical ids of the merge's
            two parts; ``0xFFFFFFFF`` in ``lefts`` marks a merge that can never apply (a part is not
            in the vocabulary) and is skipped.
        merged_ids: uint32, the canonical id of each merge's result.
        byte_ids: uint32[256], the id of each single-byte token.

    When a pair occurs twice in the merges, its first (lowest) rank is kept, as
    ``reference.encode`` does.

    >>> import numpy as np
    >>> t = RankTable(np.array([97], np.uint32), np.array([97], np.uint32),
    ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
    >>> t.lookup(97, 97), t.lookup(97, 98)
    ((0, 256), None)
    """

    def __init__(self, const uint32_t[::1] lefts, const uint32_t[::1] rights,
                 const uint32_t[::1] merged_ids, const uint32_t[::1] byte_ids):
        cdef Py_ssize_t n = lefts.shape[0], r, i
        cdef uint64_t cap = 16, slot
        cdef pair_key_t key
        if rights.shape[0] != n or merged_ids.shape[0] != n:
            raise ValueError("lefts, rights and merged_ids must have the same length")
        if byte_ids.shape[0] != 256:
            raise ValueError("byte_ids must have 256 entries")
        if n >= <Py_ssize_t>NO_RANK:
            raise ValueError("too many merges")
        self.shift = 60
        while cap < <uint64_t>(2 * n):
            cap <<= 1
            self.shift -= 1
        self.slot_mask = cap - 1
        self.slot_keys.assign(cap, EMPTY_KEY)
        self.slot_ranks.assign(cap, NO_RANK)
        self.merged_ids.assign(n, 0)
        for i in range(256):
            self.byte_ids[i] = byte_ids[i]
        self.n_merges = n
        self.n_pairs = 0
        for r in range(n):
            self.merged_ids[r] = merged_ids[r]
            if lefts[r] == NO_RANK or rights[r] == NO_RANK:
                continue
            key = pack_pair(lefts[r], rights[r])
            slot = (key * MUL1) >> self.shift
            while self.slot_keys[slot] != EMPTY_KEY and self.slot_keys[slot] != key:
                slot = (slot + 1) & self.slot_mask
            if self.slot_keys[slot] == EMPTY_KEY:   # first rank of a pair wins
                self.slot_keys[slot] = key
                self.slot_ranks[slot] = <uint32_t>r
                self.n_pairs += 1

    cdef uint32_t rank_of(self, token_id_t left, token_id_t right) noexcept nogil:
        cdef pair_key_t key = pack_pair(left, right)
        cdef uint64_t slot = (key * MUL1) >> self.shift
        cdef pair_key_t k
        while True:
            k = self.slot_keys[slot]
            if k == key:
                return self.slot_ranks[slot]
            if k == EMPTY_KEY:
                return NO_RANK
            slot = (slot + 1) & self.slot_mask

    def lookup(self, token_id_t left, token_id_t right):
        """``(rank, merged_id)`` of the pair, or None when it is not a merge."""
        cdef uint32_t r = self.rank_of(left, right)
        if r == NO_RANK:
            return None
        return int(r), int(self.merged_ids[r])


# ==== Encoder ================================================================================


cdef class Encoder:
    """Merges pretokens by rank, with a pretoken -> ids cache. One per thread.

    Args:
        table: the ``RankTable``.
        max_entries: the cache holds at most this many pretokens, then is cleared whole.
        max_cached_len: pretokens longer than this (bytes) are not cached.

    Equivalent to ``reference.encode_pretoken`` followed by ``reference.token_ids``.

    >>> import numpy as np
    >>> t = RankTable(np.array([97], np.uint32), np.array([97], np.uint32),
    ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
    >>> enc = Encoder(t)
    >>> enc.encode_piece(b"aaa")
    [256, 97]
    >>> enc.encode_pieces(b"aaaaa", np.array([3, 5], np.int64)).tolist()   # b"aaa", b"aa"
    [256, 97, 256]
    """

    def __init__(self, RankTable table not None, Py_ssize_t max_entries=1 << 18,
                 Py_ssize_t max_cached_len=256):
        if max_entries < 1 or max_cached_len < 0:
            raise ValueError("max_entries must be positive and max_cached_len non-negative")
        self.table = table
        self.max_entries = max_entries
        self.max_cached_len = max_cached_len
        if max_cached_len > 4095:
            raise ValueError("max_cached_len is at most 4095")
        # The slot table starts small (a few KB stay in L1/L2) and doubles at half load.
        self.cache_mask = (1 << 12) - 1
        self.slot_hash.assign(1 << 12, 0)
        self.slot_info.assign(1 << 12, 0)
        self.n_entries = 0
        self.misses = 0

    # ---- merging one pretoken ----------------------------------------------------------------

    cdef int _merge_scan(self, const uint8_t* piece, Py_ssize_t n, vector[token_id_t]& out) except -1 nogil:
        cdef token_id_t tok[SHORT_PIECE]
        cdef uint32_t rk[SHORT_PIECE]
        cdef token_id_t ntok[SHORT_PIECE]
        cdef uint32_t nrk[SHORT_PIECE]
        cdef Py_ssize_t old_at[SHORT_PIECE]
        cdef bint fresh[SHORT_PIECE]
        cdef Py_ssize_t m = n, i, w, j
        cdef uint32_t r
        cdef token_id_t new_id
        for i in range(m):
            tok[i] = self.table.byte_ids[piece[i]]
        for i in range(m - 1):
            rk[i] = self.table.rank_of(tok[i], tok[i + 1])
        while m > 1:
            # 1. The lowest rank present.
            r = NO_RANK
            for i in range(m - 1):
                if rk[i] < r:
                    r = rk[i]
            if r == NO_RANK:
                break
            # 2. Merge every occurrence, left to right, without overlap.
            new_id = self.table.merged_ids[r]
            w = 0
            i = 0
            while i < m:
                if i + 1 < m and rk[i] == r:
                    ntok[w] = new_id
                    fresh[w] = True
                    i += 2
                else:
                    ntok[w] = tok[i]
                    fresh[w] = False
                    old_at[w] = i
                    i += 1
                w += 1
            # 3. Only pairs touching a merged token change; the others keep their rank.
            for j in range(w - 1):
                if fresh[j] or fresh[j + 1]:
                    nrk[j] = self.table.rank_of(ntok[j], ntok[j + 1])
                else:
                    nrk[j] = rk[old_at[j]]
            m = w
            memcpy(tok, ntok, m * sizeof(token_id_t))
            if m > 1:
                memcpy(rk, nrk, (m - 1) * sizeof(uint32_t))
        for i in range(m):
            out.push_back(tok[i])
        return 0

    cdef int _merge_heap(self, const uint8_t* piece, Py_ssize_t n, vector[token_id_t]& out) except -1 nogil:
        cdef Py_ssize_t i, p, q, nq, pp
        cdef uint32_t r, cur = 0, nr
        cdef uint64_t top
        self.toks.resize(n)
        self.pair_ranks.resize(n)
        self.nexts.resize(n)
        self.prevs.resize(n)
        self.heap.clear()
        self.deferred.clear()
        cdef token_id_t* tok = self.toks.data()
        cdef uint32_t* prk = self.pair_ranks.data()
        cdef int64_t* nxt = self.nexts.data()
        cdef int64_t* prv = self.prevs.data()
        for i in range(n):
            tok[i] = self.table.byte_ids[piece[i]]
            nxt[i] = i + 1
            prv[i] = i - 1
        prk[n - 1] = NO_RANK
        # Heap entries are complemented keys, so std's max-heap pops the lowest (rank, position).
        for i in range(n - 1):
            prk[i] = self.table.rank_of(tok[i], tok[i + 1])
            if prk[i] != NO_RANK:
                self.heap.push_back(~((<uint64_t>prk[i] << 32) | <uint64_t>i))
                push_heap(self.heap.begin(), self.heap.end())
        while True:
            if self.heap.empty():
                if self.deferred.empty():
                    break
                self._flush_deferred()
                continue
            top = ~self.heap.front()
            r = <uint32_t>(top >> 32)
            p = <Py_ssize_t>(top & 0xFFFFFFFFu)
            if r != cur:
                # A rank is done: pairs of lower rank created meanwhile may now compete.
                if not self.deferred.empty():
                    self._flush_deferred()
                    continue
                cur = r
            pop_heap(self.heap.begin(), self.heap.end())
            self.heap.pop_back()
            if prk[p] != r:
                continue    # stale: p is dead or its pair changed
            q = nxt[p]
            nq = nxt[q]
            tok[p] = self.table.merged_ids[r]
            nxt[p] = nq
            if nq < n:
                prv[nq] = p
            prk[q] = NO_RANK
            # The pairs (p, nq) and (prv[p], p) are new.
            nr = self.table.rank_of(tok[p], tok[nq]) if nq < n else NO_RANK
            prk[p] = nr
            self._push(nr, p, cur)
            pp = prv[p]
            if pp >= 0:
                nr = self.table.rank_of(tok[pp], tok[p])
                prk[pp] = nr
                self._push(nr, pp, cur)
        p = 0
        while p < n:
            out.push_back(tok[p])
            p = nxt[p]
        return 0

    cdef void _push(self, uint32_t rank, Py_ssize_t pos, uint32_t cur) noexcept nogil:
        if rank == NO_RANK:
            return
        cdef uint64_t entry = ~((<uint64_t>rank << 32) | <uint64_t>pos)
        if rank < cur:
            self.deferred.push_back(entry)
        else:
            self.heap.push_back(entry)
            push_heap(self.heap.begin(), self.heap.end())

    cdef void _flush_deferred(self) noexcept nogil:
        cdef size_t k
        for k in range(self.deferred.size()):
            self.heap.push_back(self.deferred[k])
            push_heap(self.heap.begin(), self.heap.end())
        self.deferred.clear()

    cdef int _encode_piece(self, const uint8_t* piece, Py_ssize_t n, vector[token_id_t]& out) except -1 nogil:
        cdef uint64_t h, slot, info, offset
        cdef uint32_t key_len, n_ids
        cdef size_t start, k
        cdef const token_id_t* ids
        if n <= 0:
            return 0
        if n == 1:
            out.push_back(self.table.byte_ids[piece[0]])
            return 0
        if n > self.max_cached_len:
            if n <= SHORT_PIECE:
                return self._merge_scan(piece, n, out)
            return self._merge_heap(piece, n, out)
        # Cached pretoken? A slot is (hash, offset << 24 | key_len << 12 | n_ids); the arena holds
        # the ids (aligned) followed by the key bytes, so a hit touches one slot and one arena line.
        h = _hash_bytes(piece, n)
        slot = h & self.cache_mask
        while True:
            info = self.slot_info[slot]
            if info == 0:
                break
            if self.slot_hash[slot] == h:
                key_len = <uint32_t>((info >> 12) & 0xFFF)
                offset = info >> 24
                n_ids = <uint32_t>(info & 0xFFF)
                ids = <const token_id_t*>(self.arena.data() + offset)
                if key_len == <uint32_t>n and memcmp(ids + n_ids, piece, n) == 0:
                    for k in range(n_ids):
                        out.push_back(ids[k])
                    return 0
            slot = (slot + 1) & self.cache_mask
        self.misses += 1
        start = out.size()
        if n <= SHORT_PIECE:
            self._merge_scan(piece, n, out)
        else:
            self._merge_heap(piece, n, out)
        if self.n_entries >= self.max_entries:
            self._cache_clear()
        elif 2 * (self.n_entries + 1) > <Py_ssize_t>self.slot_info.size():
            self._cache_grow()
        slot = h & self.cache_mask
        while self.slot_info[slot] != 0:
            slot = (slot + 1) & self.cache_mask
        n_ids = <uint32_t>(out.size() - start)
        offset = self.arena.size()             # a multiple of 4: ids first, aligned; then the key
        self.arena.resize(offset + ((n_ids * sizeof(token_id_t) + n + 3) & ~(<size_t>3)))
        memcpy(self.arena.data() + offset, out.data() + start, n_ids * sizeof(token_id_t))
        memcpy(self.arena.data() + offset + n_ids * sizeof(token_id_t), piece, n)
        self.slot_hash[slot] = h
        self.slot_info[slot] = (offset << 24) | (<uint64_t>n << 12) | n_ids
        self.n_entries += 1
        return 0

    cdef int _cache_grow(self) except -1 nogil:
        cdef vector[uint64_t] old_hash, old_info
        cdef size_t k, cap = 2 * self.slot_info.size()
        cdef uint64_t slot
        old_hash.swap(self.slot_hash)
        old_info.swap(self.slot_info)
        self.slot_hash.assign(cap, 0)
        self.slot_info.assign(cap, 0)
        self.cache_mask = cap - 1
        for k in range(old_info.size()):
            if old_info[k] == 0:
                continue
            slot = old_hash[k] & self.cache_mask
            while self.slot_info[slot] != 0:
                slot = (slot + 1) & self.cache_mask
            self.slot_hash[slot] = old_hash[k]
            self.slot_info[slot] = old_info[k]
        return 0

    cdef void _cache_clear(self) noexcept nogil:
        cdef size_t k
        for k in range(self.slot_info.size()):
            self.slot_info[k] = 0
        self.arena.clear()
        self.n_entries = 0

    # ---- Python entry points -----------------------------------------------------------------

    def encode_piece(self, const uint8_t[::1] piece, str method="auto"):
        """Token ids of one pretoken (no cache): ``method`` is ``auto``, ``scan`` or ``heap``.

        ``scan`` accepts pieces up to 128 bytes. Equivalent to ``reference.encode_pretoken``.
        """
        cdef Py_ssize_t n = piece.shape[0]
        cdef vector[token_id_t] out
        if n == 0:
            return []
        if method == "scan" or (method == "auto" and n <= SHORT_PIECE):
            if n > SHORT_PIECE:
                raise ValueError(f"scan handles pieces up to {SHORT_PIECE} bytes")
            with nogil:
                self._merge_scan(&piece[0], n, out)
        elif method in ("heap", "auto"):
            with nogil:
                self._merge_heap(&piece[0], n, out)
        else:
            raise ValueError(f"unknown method {method!r}")
        return [int(x) for x in out]

    def encode_pieces(self, const uint8_t[::1] buf not None, const int64_t[::1] ends not None,
                      int64_t start=0, const int64_t[::1] forced_ids=None):
        """Encode the pretokens ``buf[start:ends[0]]``, ``buf[ends[0]:ends[1]]``, ... in order.

        Args:
            buf: the bytes (any read-only buffer: ``bytes``, an mmap, a uint8 array).
            ends: int64, the end offset of each pretoken, non-decreasing, at most ``len(buf)``.
            start: where the first pretoken starts.
            forced_ids: optional int64, one per pretoken: ``-1`` to merge the bytes, an id >= 0 to
                emit for the whole piece (a special token), ``-2`` to emit nothing (text that a
                custom pattern does not match, which the reference drops).

        Returns:
            A uint32 ndarray of token ids. Runs without the GIL.
        """
        cdef Py_ssize_t n_pieces = ends.shape[0], k
        cdef Py_ssize_t n_buf = buf.shape[0]
        cdef int64_t prev = start, end
        cdef bint bad = False
        cdef bint has_forced = forced_ids is not None
        cdef const uint8_t* base
        if has_forced and forced_ids.shape[0] != n_pieces:
            raise ValueError("forced_ids must have one entry per pretoken")
        if start < 0 or start > n_buf:
            raise ValueError("start is outside the buffer")
        self.out.clear()
        if n_buf == 0:
            if n_pieces and ends[n_pieces - 1] != 0:
                raise ValueError("ends must be non-decreasing and within the buffer")
            return np.zeros(0, dtype=np.uint32)
        base = &buf[0]
        with nogil:
            for k in range(n_pieces):
                end = ends[k]
                if end < prev or end > n_buf:
                    bad = True
                    break
                if has_forced and forced_ids[k] != -1:
                    if forced_ids[k] >= 0:
                        self.out.push_back(<token_id_t>forced_ids[k])
                else:
                    self._encode_piece(base + prev, end - prev, self.out)
                prev = end
        if bad:
            raise ValueError("ends must be non-decreasing and within the buffer")
        result = np.empty(self.out.size(), dtype=np.uint32)
        cdef uint32_t[::1] view = result
        if self.out.size():
            memcpy(&view[0], self.out.data(), self.out.size() * sizeof(token_id_t))
        if self.out.capacity() > (1 << 24):   # don't keep a huge buffer alive between calls
            self.out.clear()
            self.out.shrink_to_fit()
        return result

    def cache_info(self):
        """``{"entries", "misses", "bytes"}`` of the pretoken cache (misses = pretokens merged)."""
        return {
            "entries": int(self.n_entries),
            "misses": int(self.misses),
            "bytes": int(self.arena.size() + 16 * self.slot_info.size()),
        }

    def clear_cache(self):
        """Drop every cached pretoken."""
        self._cache_clear()
