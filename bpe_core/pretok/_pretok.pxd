# The C API of the native pre-tokenizer, at a glance (see _pretok.pyx for the contracts).
#
# A scanner reads UTF-8 bytes s[i:n] and returns the end of the pretoken that starts at i, exactly
# where regex.finditer(pattern, s[:n].decode("utf-8", "surrogateescape")) would end it. It never
# looks before i, so a text can be resumed at any pretoken boundary, and [start, end) spans of one
# buffer are scanned independently by passing n = end.
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t


cdef enum:
    PATTERN_GPT2 = 0
    PATTERN_CL100K = 1
    PATTERN_O200K = 2


# One unique pretoken of a CountTable: its first 16 bytes inline (zero-padded little-endian
# words), all of its bytes at its first occurrence in the scanned buffer (not copied).
cdef struct Entry:
    uint64_t w0
    uint64_t w1
    const uint8_t* ptr
    int64_t length
    int64_t count


# Open addressing, linear probing. slots[i] = (hash >> 32) << 32 | (entry number + 1), 0 = empty;
# a power-of-two number of slots, at most half full. Entries are dense, in first-seen order.
cdef struct CountTable:
    uint64_t* slots
    Py_ssize_t mask  # number of slots - 1
    Entry* entries
    Py_ssize_t n_entries
    Py_ssize_t cap_entries


# A scanned pretoken waiting in a batch for its table lookup (see _flush).
cdef struct Pending:
    const uint8_t* ptr
    Py_ssize_t length
    uint64_t w0
    uint64_t w1
    uint64_t h


cdef enum:
    BATCH = 32  # pretokens scanned ahead of their lookups


# The plain count (see "The plain count" in _pretok.pyx): words of up to 15 bytes go through a
# direct-mapped front cache into a short table with inline keys, longer words into a CountTable.
cdef struct ShortSlot:  # 32 bytes: a word of up to 15 bytes, its count inline
    uint64_t w0
    uint64_t w1
    int64_t count
    uint64_t length  # 0: empty (a pretoken is never empty)


cdef struct ShortTable:  # open addressing, linear probing, at most 3/4 full
    ShortSlot* slots
    Py_ssize_t mask  # number of slots - 1
    Py_ssize_t n_words


cdef struct FrontSlot:  # 32 bytes: a recent word and its counts not yet in its short slot
    uint64_t w0
    uint64_t w1      # bytes 8..14, the length in the top byte (the key of _count_front.h)
    uint32_t base    # its age is (uint32)pending - base, at most FRONT_AGE_CAP after a miss (_flush_short)
    uint32_t idx     # its slot in the short table
    int64_t pending  # empty: w0 = w1 = 0 (no key), pending = base = 0


cdef struct ShortPending:  # a front-cache miss waiting in a batch for its short-table lookup
    uint64_t w0
    uint64_t w1
    uint64_t h
    Py_ssize_t length
    Py_ssize_t front  # its front slot


cdef struct WordCounter:
    FrontSlot* front
    uint64_t front_mask
    ShortTable short
    CountTable long  # words of 16 bytes or more


# One sorted word table (arena, offsets, counts) being read by merge_counts.
cdef struct WordRun:
    const uint8_t* arena
    const int64_t* offsets
    const int64_t* counts
    Py_ssize_t n_words
    Py_ssize_t pos
    # the word at pos (set by _run_load): its bytes, length, and first 16 bytes zero-padded as two
    # big-endian integers (keys in integer order are words in bytes order, unless equal)
    const uint8_t* word
    Py_ssize_t length
    uint64_t key
    uint64_t key2
    const uint8_t* arena_end  # the end of the arena (a word's 16 head bytes are read at once before it)
    # set by the merge when a word of this run is not above the one before it (out of order)
    bint disordered


# Scanners: the end of the pretoken that starts at i (i < n).
cdef Py_ssize_t _next_gpt2(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil
cdef Py_ssize_t _next_cl100k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil
cdef Py_ssize_t _next_o200k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil

# Writes up to cap pretoken ends of s[*pos:n] into ends, advances *pos; returns how many.
cdef Py_ssize_t _split_ends(int pattern_id, const uint8_t* s, Py_ssize_t* pos, Py_ssize_t n,
                            int64_t* ends, Py_ssize_t cap) noexcept nogil

# Counts the pretokens of s[i:n] into c (limit: the end of the buffer); 0, or -1 when out of
# memory. Pending counts stay in c's front cache until _counter_drain.
cdef int _count_span(int pattern_id, const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                     const uint8_t* limit, WordCounter* c) noexcept nogil

# The body of a __getbuffer__ that lends C memory (a 1-d uint32 array of shape[0] items at data,
# NULL when empty) to numpy, owned by owner (_pretok's record ids, _units' id lists).
cdef int lend_u32(Py_buffer* buffer, object owner, uint32_t* data, Py_ssize_t* shape,
                  Py_ssize_t* strides) except -1
cdef int lend_items(Py_buffer* buffer, object owner, void* data, Py_ssize_t itemsize, char* fmt,
                    Py_ssize_t* shape, Py_ssize_t* strides) except -1
