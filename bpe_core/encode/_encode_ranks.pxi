# _encode.pyx, part 3 of 10 (``include``d: compiled into the module as if written there).
# The rank table (RankTable): a pair of token ids -> its merge rank and result.

# ==== Rank table =============================================================================


cdef enum:
    NARROW_ID = 0x1FFFFF       # ids below this fit the narrow rank slot (21 bits; all ones: free)
    NARROW_RANK = 0x3FFFFF     # ranks below this fit it (22 bits)


cdef inline uint64_t _narrow_key(pair_key_t key) noexcept nogil:
    """A pair's narrow slot without its rank: ``(left << 43) | (right << 22)``."""
    return ((key >> 32) << 43) | ((key & 0x1FFFFF) << 22)



cdef class RankTable:
    """Pair of token ids -> (merge rank, id of the merged token), in an open-addressing table.

    Args:
        lefts, rights: uint32, one entry per merge (index = rank): the canonical ids of the merge's
            two parts; ``0xFFFFFFFF`` in ``lefts`` marks a merge that can never apply (a part is not
            in the vocabulary) and is skipped.
        merged_ids: uint32, the canonical id of each merge's result.
        byte_ids: uint32[256], the id of each single-byte token.

    The slots are one 64-bit word each, ``(left << 43) | (right << 22) | rank`` (``narrow``),
    when every id is below 2^21 - 1 and every rank below 2^22 - 1 (all real vocabularies): half
    the bytes of the 16-byte ``RankSlot`` layout kept for larger ones, so more of the table stays
    in cache (a miss of the merge loop is two dependent lookups a merge).

    When a pair occurs twice in the merges, its first (lowest) rank is what ``rank_of`` gives;
    the later ones are kept aside for ``rank_after`` (a pair made again after its first rank has
    passed, as ``reference.encode`` replays the merges). The four arrays are all a ``RankTable`` needs, so worker processes
    receive them (``Tokenizer._encoder_spec``) instead of the vocabulary.

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
        cdef vector[cpp_pair[pair_key_t, uint32_t]] later
        cdef RankSlot empty
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
        empty.key = EMPTY_KEY
        empty.rank = NO_RANK
        empty.merged = 0
        self.slots.assign(cap, empty)
        self.merged_ids.assign(n, 0)
        for i in range(256):
            self.byte_ids[i] = byte_ids[i]
        self.n_merges = n
        self.n_pairs = 0
        with nogil:
            for r in range(n):
                self.merged_ids[r] = merged_ids[r]
                if lefts[r] == NO_RANK or rights[r] == NO_RANK:
                    continue
                key = pack_pair(lefts[r], rights[r])
                slot = (key * MUL1) >> self.shift
                while self.slots[slot].key != EMPTY_KEY and self.slots[slot].key != key:
                    slot = (slot + 1) & self.slot_mask
                if self.slots[slot].key == EMPTY_KEY:   # first rank of a pair wins
                    self.slots[slot].key = key
                    self.slots[slot].rank = <uint32_t>r
                    self.slots[slot].merged = merged_ids[r]
                    self.n_pairs += 1
                else:                                   # the same pair again: kept aside
                    later.push_back(cpp_pair[pair_key_t, uint32_t](key, <uint32_t>r))
            if not later.empty():
                cpp_sort(later.begin(), later.end())
                for i in range(<Py_ssize_t>later.size()):
                    self.later_keys.push_back(later[i].first)
                    self.later_ranks.push_back(later[i].second)
            # The narrow layout (8 bytes a slot, the same positions) when every id and rank fits;
            # the wide slots are then dropped.
            # A query pair is made of byte ids and merged ids only: those must fit too (a larger
            # id would alias a stored pair once truncated).
            self.narrow = n < <Py_ssize_t>NARROW_RANK
            for i in range(256):
                if byte_ids[i] >= NARROW_ID:
                    self.narrow = False
            for r in range(n):
                if merged_ids[r] >= NARROW_ID:
                    self.narrow = False
            for slot in range(cap):
                key = self.slots[slot].key
                if key != EMPTY_KEY and ((key >> 32) >= NARROW_ID or (key & 0xFFFFFFFFu) >= NARROW_ID):
                    self.narrow = False
            if self.narrow:
                self.words.assign(cap, EMPTY_KEY)
                for slot in range(cap):
                    key = self.slots[slot].key
                    if key != EMPTY_KEY:
                        self.words[slot] = _narrow_key(key) | self.slots[slot].rank
                self.slots = vector[RankSlot]()
            # every pair of two bytes, looked up directly (a merge loop's first lookups; 256 KiB)
            self.byte_ranks.resize(65536)
            for i in range(65536):
                self.byte_ranks[i] = self.rank_of(self.byte_ids[i >> 8], self.byte_ids[i & 0xFF])

    cdef uint32_t rank_of(self, token_id_t left, token_id_t right) noexcept nogil:
        cdef pair_key_t key = pack_pair(left, right)
        return self.rank_at(self.home_of(key), key)

    cdef uint64_t home_of(self, pair_key_t key) noexcept nogil:
        """The home slot of ``key`` (where its probe starts): ``prefetch_home`` it, then ``rank_at``."""
        return (key * MUL1) >> self.shift

    cdef void prefetch_home(self, uint64_t slot) noexcept nogil:
        if self.narrow:
            prefetch(self.words.data() + slot)
        else:
            prefetch(self.slots.data() + slot)

    cdef uint32_t rank_at(self, uint64_t slot, pair_key_t key) noexcept nogil:
        """The first rank of ``key`` probing from its home slot (``home_of``), or NO_RANK."""
        cdef const RankSlot* base
        cdef const uint64_t* words
        cdef uint64_t want, w
        if self.narrow:
            words = self.words.data()
            want = _narrow_key(key)
            while True:
                w = words[slot]
                if (w & ~(<uint64_t>NARROW_RANK)) == want:
                    return <uint32_t>(w & NARROW_RANK)
                if w == EMPTY_KEY:
                    return NO_RANK
                slot = (slot + 1) & self.slot_mask
        base = self.slots.data()
        while True:
            if base[slot].key == key:
                return base[slot].rank
            if base[slot].key == EMPTY_KEY:
                return NO_RANK
            slot = (slot + 1) & self.slot_mask

    cdef uint32_t rank_after(self, token_id_t left, token_id_t right, uint32_t after) noexcept nogil:
        """The first rank > ``after`` that merges the pair, or NO_RANK: the rank at which the
        reference's replay merges a pair made while rank ``after`` was applied."""
        cdef uint32_t r = self.rank_of(left, right)
        cdef pair_key_t key
        cdef Py_ssize_t lo = 0, hi = <Py_ssize_t>self.later_keys.size(), mid
        if r == NO_RANK or r > after:
            return r
        if hi == 0:
            return NO_RANK
        key = pack_pair(left, right)
        while lo < hi:                              # the first (key, rank) >= (key, after + 1)
            mid = (lo + hi) >> 1
            if self.later_keys[mid] < key or (self.later_keys[mid] == key and self.later_ranks[mid] <= after):
                lo = mid + 1
            else:
                hi = mid
        if lo < <Py_ssize_t>self.later_keys.size() and self.later_keys[lo] == key:
            return self.later_ranks[lo]
        return NO_RANK

    def lookup_after(self, token_id_t left, token_id_t right, uint32_t after):
        """``(rank, merged_id)`` of the pair's first rank after ``after``, or None."""
        cdef uint32_t r = self.rank_after(left, right, after)
        if r == NO_RANK:
            return None
        return int(r), int(self.merged_ids[r])

    def lookup(self, token_id_t left, token_id_t right):
        """``(rank, merged_id)`` of the pair, or None when it is not a merge."""
        cdef uint32_t r = self.rank_of(left, right)
        if r == NO_RANK:
            return None
        return int(r), int(self.merged_ids[r])
