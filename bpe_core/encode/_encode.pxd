# The C API of the encoder core (bpe_core/_encode.pyx) at a glance.
#
# A RankTable maps a pair of token ids to its merge rank (open addressing over pack_pair keys) and
# a rank to the id of the token the merge builds. A SpecialTable finds special tokens (leftmost,
# longest first). An Encoder owns one pretoken -> ids cache, an output buffer and the scratch of
# one thread; it encodes whole texts (special tokens, the native pre-tokenizer of _pretok.pxd,
# merging by rank) without the GIL, exactly as reference.encode.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libcpp.vector cimport vector

cimport cython

from bpe_core.engine._typedefs cimport pair_key_t, token_id_t
from bpe_core.engine._units cimport RankEntry, RankMerger


# One pair of the rank table's wide layout, 16 bytes (four per cache line): a probe reads one line,
# the key, its first rank and the id it merges into together. Tables whose ids and ranks fit use
# the narrow layout instead (RankTable.words, 8 bytes a slot).
cdef struct RankSlot:
    pair_key_t key
    uint32_t rank
    token_id_t merged           # the id the pair merges into at that rank


@cython.final
cdef class RankTable:
    cdef vector[RankSlot] slots         # open addressing; key EMPTY_KEY marks a free slot (the wide
                                        # layout: ids or ranks too large for ``words``)
    cdef vector[uint64_t] words         # the narrow layout, 8 bytes a slot: (left << 43) | (right << 22)
                                        # | rank, all ones free (ids < 2^21 - 1, ranks < 2^22 - 1)
    cdef readonly bint narrow           # words is used (else slots)
    cdef vector[token_id_t] merged_ids  # rank -> id of the token the merge builds
    cdef token_id_t byte_ids[256]       # byte value -> id of its single-byte token
    cdef vector[uint32_t] byte_ranks    # (byte << 8) | byte -> the first rank of the two bytes' pair
    cdef uint64_t slot_mask
    cdef int shift
    cdef readonly Py_ssize_t n_merges   # ranks are 0 .. n_merges - 1 (some may be unreachable)
    cdef readonly Py_ssize_t n_pairs    # pairs held (reachable merges, first rank of a pair kept)
    # a pair's ranks after its first (the same pair merged again: rare), sorted by (key, rank)
    cdef vector[pair_key_t] later_keys
    cdef vector[uint32_t] later_ranks

    cdef uint32_t rank_of(self, token_id_t left, token_id_t right) noexcept nogil
    cdef uint64_t home_of(self, pair_key_t key) noexcept nogil
    cdef void prefetch_home(self, uint64_t slot) noexcept nogil
    cdef uint32_t rank_at(self, uint64_t slot, pair_key_t key) noexcept nogil
    cdef uint32_t rank_after(self, token_id_t left, token_id_t right, uint32_t after) noexcept nogil


# The special tokens as plain C data (pointers into a SpecialTable's vectors), sorted longest first.
cdef struct Specials:
    const uint8_t* data          # the tokens' bytes, back to back
    const Py_ssize_t* offsets    # token k is data[offsets[k]:offsets[k] + lengths[k]]
    const Py_ssize_t* lengths
    const token_id_t* ids
    Py_ssize_t n
    int only_first               # the one first byte all tokens share (memchr), or -1
    uint8_t first[256]           # 1 for each byte a token starts with


@cython.final
cdef class SpecialTable:
    cdef vector[uint8_t] data
    cdef vector[Py_ssize_t] offsets
    cdef vector[Py_ssize_t] lengths
    cdef vector[token_id_t] ids
    cdef Specials c


# One pretoken of the cache, 32 bytes (two per cache line). meta == 0: empty; else
# (key length << 12) | n_ids. The key's first 8 bytes are w0 (zero-padded little-endian); ids
# live in `ids` when n_ids <= 4. The arena record at `off` holds the ids when n_ids > 4, then the
# key bytes after the first 8 when the key is longer than 8.
cdef struct CacheSlot:
    uint64_t w0
    uint32_t meta
    uint32_t off
    token_id_t ids[4]


@cython.final
cdef class Encoder:
    cdef readonly RankTable table
    # the pretoken -> ids cache (cleared whole when full)
    cdef void* slots_mem
    cdef CacheSlot* slots               # slots_mem aligned to 64 bytes
    cdef Py_ssize_t n_slots             # a power of two
    cdef uint64_t cache_mask
    cdef int cache_shift                # slot of hash h: h >> cache_shift (64 - log2(n_slots))
    cdef uint8_t* arena
    cdef Py_ssize_t arena_size
    cdef Py_ssize_t arena_cap
    cdef Py_ssize_t n_entries
    cdef readonly Py_ssize_t max_entries
    cdef readonly Py_ssize_t max_cached_len
    cdef readonly int64_t misses
    # scratch of the heap path
    cdef vector[token_id_t] toks
    cdef vector[uint32_t] pair_ranks
    cdef vector[int64_t] nexts
    cdef vector[int64_t] prevs
    cdef vector[uint64_t] heap
    # output ids of the current call, and the pretoken ends being encoded
    cdef token_id_t* out_buf
    cdef Py_ssize_t out_n
    cdef Py_ssize_t out_cap
    # out_buf must not move (another thread reads it: BatchJob's listing thread): a growth raises
    cdef bint out_pinned
    cdef int64_t* ends_buf
    # the UTF-8 of the str being encoded (encode_all), kept from call to call up to TEXT_KEEP bytes
    cdef char* text_buf
    cdef size_t text_cap
    # caches consulted around this encoder's own: ``shared``, the warmest encoder's cache, first
    # during a batch job (BatchJob), which every thread of the job also adds its merges to while
    # it has room (``_shared_insert``, under ``share_lock``: never grown or cleared meanwhile);
    # ``singles`` (read-only), the pieces proven to be one token (build_singles), after the own
    # cache, before merging
    cdef Encoder shared
    cdef long share_lock
    cdef Encoder singles
    cdef readonly int64_t single_hits

    cdef Py_ssize_t _merge_scan(self, const uint8_t* piece, Py_ssize_t n, token_id_t* out) noexcept nogil
    cdef Py_ssize_t _merge_heap(self, const uint8_t* piece, Py_ssize_t n, token_id_t* out) except -1 nogil
    cdef Py_ssize_t _merge(self, const uint8_t* piece, Py_ssize_t n, token_id_t* out) except -1 nogil
    cdef int _push(self, uint32_t rank, Py_ssize_t pos) except -1 nogil
    cdef Py_ssize_t _emit_slow(self, const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h, token_id_t* out,
                               const uint8_t* limit) except -1 nogil
    cdef Py_ssize_t _cache_miss(self, const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h,
                                token_id_t* out) except -1 nogil
    cdef int _encode_blocks(self, int pattern_id, const Specials* sp, const uint8_t* s, Py_ssize_t n_buf,
                            Py_ssize_t start, Py_ssize_t end, Py_ssize_t block) except -1 nogil
    cdef int _reserve_out(self, Py_ssize_t extra, bint huge=*) except -1 nogil
    cdef int _emit_pieces(self, const uint8_t* s, Py_ssize_t a, const int64_t* ends, Py_ssize_t count,
                          const uint8_t* limit, int64_t* starts) except -1 nogil
    cdef Py_ssize_t _encode_span(self, int pattern_id, const uint8_t* s, Py_ssize_t a, Py_ssize_t b,
                                 bint closed, const uint8_t* limit) except -1 nogil
    cdef int _encode_text(self, int pattern_id, const Specials* sp, const uint8_t* s, Py_ssize_t n_buf,
                          Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_bytes, bint open_end,
                          Py_ssize_t* stop, bint* done) except -1 nogil
    cdef object _take_out(self)
    cdef object _take_counted(self, const int64_t[::1] lengths, bint narrow, int64_t* n_bytes)


# A batch of documents encoded by several threads in one native job: each thread takes the next
# document by an atomic counter and writes its ids to its own encoder's buffer; one copy at the end.
@cython.final
cdef class BatchJob:
    cdef vector[const uint8_t*] ptrs
    cdef vector[Py_ssize_t] sizes
    cdef object keep                    # the documents (and bytes made of them) stay alive
    cdef int pattern_id
    cdef SpecialTable specials
    cdef Py_ssize_t next_doc            # taken with an atomic fetch-add
    cdef vector[int64_t] doc_n          # ids of each document
    cdef vector[int64_t] doc_at         # where they start in their worker's buffer
    cdef vector[int32_t] doc_who        # the worker that encoded it
    cdef list workers                   # worker index -> Encoder
    cdef readonly Py_ssize_t n_docs
    cdef readonly int64_t n_bytes
    cdef vector[Py_ssize_t] order       # the order documents are taken in (when ``ordered``)
    cdef readonly bint ordered          # big documents first (several workers), else in order
    # Lists built while the job runs (``build_lists``): the TokenTable, the lists so far, each
    # document's state (0 until its ids are final, then DOC_DONE, DOC_OWN; written with
    # store_release) and whether its list is built (the listing thread's alone)
    cdef object tokens
    cdef list lists
    cdef vector[uint32_t] doc_state
    cdef vector[uint8_t] doc_listed
    cdef Py_ssize_t scanned             # the listing thread has looked at the places before this
    cdef vector[Py_ssize_t] pending     # ... of which these were still being encoded (one a worker)
    cdef readonly Py_ssize_t n_listed   # documents listed while the job ran (the rest by collect)
    # a job of more bytes makes no fixed buffers (FIXED_MAX; tests set it around a job's size)
    cdef public int64_t fixed_max
    cdef uint32_t* counts               # the references those lists hold, not added yet (LISTED_COUNTED)
    cdef uint32_t failed                # a worker left run() by an exception (store_release)
    cdef uint32_t moved                 # a worker's fixed buffer moved after all (collect raises)

    cdef bint _one_run(self, int64_t total)
    cdef void _release_workers(self)
    cdef void _order_big_first(self, Py_ssize_t n_workers)
    cdef int _run_lister(self, Encoder enc, int32_t who, const Specials* sp) except -1
    cdef int _list_ready(self) except -1
    cdef bint _list_one(self, Py_ssize_t pos) except -1
    cdef void _settle(self, bint ok) noexcept
    cdef object _collect_lists(self, object lists)


# SuperBPE's stage 2 (the "hf" and "units" splits). A pair of neighbouring stage-1 ids that no
# stage-2 merge can ever join is a cut: what lies between two cuts (a segment) merges on its own.
# Stage2Table holds the pairs that are not cuts ("crossable"; every merge's own pair is one), each
# with its first rank and the id it merges into, so segments are merged from this one small table.
cdef struct CrossSlot:
    pair_key_t key              # EMPTY_KEY marks a free slot
    token_id_t res              # the id the pair merges into at its first rank
    uint32_t rank               # its first rank (| LATER_RANKS: merged again later), or NO_RANK


@cython.final
cdef class Stage2Table:
    cdef readonly RankMerger merger
    cdef vector[uint64_t] filter        # one bit per crossable pair's hash (a one-hash Bloom filter)
    cdef int fshift                     # its bit = pair hash >> fshift (_filter_hit)
    cdef vector[CrossSlot] slots        # open addressing over the crossable pairs (16 bytes a slot)
    cdef uint64_t mask
    cdef int shift
    cdef readonly bint all_cross        # too many crossable pairs to list: every pair is one
    cdef readonly Py_ssize_t n_cross
    cdef vector[uint32_t] lengths       # bytes of each token id (the "units" split's digit groups)
    cdef vector[uint8_t] sides          # per id: the unit-cut flags it gives as a pretoken's last / first id
                                        # (_id_sides), then one 0xFF (an unknown id: read the bytes)


# The scratch of one thread's stage-2 merging.
@cython.final
cdef class Stage2Scratch:
    cdef vector[int64_t] nxt            # RankMerger._merge (segments longer than SHORT_SEG)
    cdef vector[int64_t] prv
    cdef vector[RankEntry] heap
    cdef vector[int64_t] starts         # where each pretoken's stage-1 ids start
    cdef vector[int64_t] char_offs      # a numeric pretoken's characters (the "units" split) ...
    cdef vector[uint8_t] char_digit
    cdef vector[int64_t] hard           # ... its hard boundaries (byte offsets, ascending) ...
    cdef vector[uint8_t] inner_cut      # ... and a cut before which of its stage-1 ids
    cdef vector[uint32_t] pair_rank     # a window's pair lookups (``_look_up_pairs``): first rank,
    cdef vector[token_id_t] pair_res    # result and crossable, of the pair ending at each id
    cdef vector[uint8_t] pair_cross
    cdef vector[int64_t] pair_cand      # the pairs that pass the filter
    cdef vector[uint64_t] pair_key      # ... and their keys (pack_pair)
    cdef vector[int64_t] todo           # the pretokens whose unit cut needs their bytes, or digit groups


# Decoding (``TokenTable.decode``) and lists of ids: the bytes of every token back to back (token
# ``i`` is ``data[offsets[i]:offsets[i + 1]]``, ``valid[i]`` 0 for an unused id) and the Python int
# of every id below ``n_ints``.
@cython.final
cdef class TokenTable:
    cdef vector[uint8_t] data
    cdef vector[int64_t] offsets
    cdef vector[uint8_t] valid
    cdef readonly Py_ssize_t n
    cdef readonly Py_ssize_t n_ints
    cdef object ints
    cdef vector[void*] int_ptrs
    cdef vector[uint32_t] int_counts    # _list's references to add to each int (zero between calls)

    cdef object _list(self, const uint32_t* p, Py_ssize_t n)
