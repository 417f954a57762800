# _engine.pyx, part 1 of 6 (``include``d: compiled into the module as if written there).
# The engine's memory layout: cell bits, word records, the merge-share and heap structs, the C declarations
# (prefetch, madvise, threads), and memory advice for the build buffers (huge_pages).

cdef pair_key_t EMPTY_KEY = 0xFFFFFFFFFFFFFFFFu
cdef uint32_t NO_MARK = 0xFFFFFFFFu
cdef uint32_t NIL = 0xFFFFFFFFu          # no neighbour (word edge)
cdef uint32_t DEAD_BIT = 0x80000000u     # the cell is inside a merged token, not its first position
cdef uint32_t END_BIT = 0x40000000u      # the last position of its word (fixed)
cdef uint32_t PAYLOAD = 0x3FFFFFFFu      # token id (live cell) or token length (dead edge cell)
cdef int BLK_SHIFT = 4                   # the block index holds the word of every 16th position (pieces of
                                         # stage 2 are short: 64 left ~12 words to walk per lookup)
cdef uint8_t NO_LIST = 0xFF
# Positions added by merges live in a pool of pages; a list is a block of 2**cls entries.
cdef int PAGE_BITS = 18
cdef uint64_t PAGE_SIZE = 1 << 18
cdef uint64_t BIG_FLAG = 0x8000000000000000u    # a block above a page: its own malloc, pointer here
cdef uint64_t POOL_COMPACT_MIN_FREE = 32 << 20   # ``run`` compacts the pool past this many free bytes
cdef int MIN_COMPACT_CLS = 3             # lists of 8 entries and more drop stale entries before growing

#: Bytes of one word record (count int64 + end uint32).
WORD_RECORD_BYTES = 12


cdef packed struct WordRec:
    count_t count       # the word's count
    uint32_t end        # one past its last position (its start is the previous word's end)


cdef struct PairRec:
    # a pair's record, by pair id: the key first (``_PairMap`` reads keys 2 apart), the count beside it
    # (a lookup that matches then updates the count in the same cache line)
    pair_key_t key
    count_t count


cdef struct Near:
    # a pair holding the new token, while one merge runs (see ``_apply_merge``)
    pair_key_t key
    count_t delta       # the change of its count in this merge
    int64_t pid         # its pair id once the merge is done (-1: not kept)
    uint32_t n          # the windows that came to it in this share's sites (> 0: a window came)
    uint32_t at         # (``_near_end``) the first share's: the second share's ``n`` of the pair, then, in
                        # either share, where the share's next position goes in the pair's list


cdef cppclass NearTable:
    # one thread's share of a merge: the pairs holding the new token it met (``Near``, a small hash
    # table of their indices stamped with ``gen``), the positions that came to them, as
    # (index << 32) | position in the order they came, and the weight of the merged pair it removed
    vector[Near] near
    vector[uint32_t] slot
    vector[uint32_t] stamp
    uint32_t gen
    vector[uint64_t] sites
    vector[uint32_t] remap          # (the second share) its index -> the first share's index
    count_t removed
    # (a share on two threads) the count changes of the other pairs, summed here and applied once
    # each when the share ends (``_other_flush``): a table of OTHER_SLOTS pair ids stamped with
    # ``gen``, at most half full (a pair that finds no place is lowered at once, atomically)
    vector[uint32_t] opid
    vector[count_t] odelta
    vector[uint32_t] ostamp
    vector[uint32_t] oused          # the slots in use, in the order they were taken
    # the sites it is given: base[b0:b1], then added[a0:a1]
    const uint32_t* base
    uint64_t b0
    uint64_t b1
    const uint32_t* added
    uint64_t a0
    uint64_t a1


cdef packed struct HeapEntry:
    # 12 bytes, packed: the heap holds about one entry per pair (17.3 M at 200k merges on the 15 GB
    # corpus: 198 MiB, 264 with the 16 bytes of an aligned struct)
    count_t count
    pair_id_t pair


cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    int MADV_HUGEPAGE

cdef extern from *:
    """
    #if defined(__GLIBC__)
    #include <malloc.h>
    static inline void bpe_trim(void) { malloc_trim(0); }
    #else
    static inline void bpe_trim(void) {}
    #endif
    """
    # glibc: the free blocks inside the heap given back to the OS (blocks under 32 MiB come from the
    # heap, ``runtime.workers.trim_heap_tops``; freed, they stay resident until trimmed)
    void bpe_trim() nogil


cdef extern from *:
    """
    #ifndef MADV_POPULATE_WRITE
    #define MADV_POPULATE_WRITE 23
    #endif
    #ifndef MADV_COLD
    #define MADV_COLD 20
    #endif
    """
    int MADV_POPULATE_WRITE
    int MADV_COLD


cdef extern from *:
    """
    #include <pthread.h>
    #include <sched.h>
    #include <time.h>
    static inline void bpe_atomic_sub(int64_t* p, int64_t v) { __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
    static inline uint32_t bpe_load_acquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void bpe_store_release(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int bpe_claim(uint32_t* p, uint32_t expected, uint32_t desired) {
        return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    static inline void bpe_pause(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }
    static inline void bpe_nap(void) { struct timespec ts = {0, 20000}; nanosleep(&ts, NULL); }
    static inline void bpe_yield(void) { sched_yield(); }
    static inline int64_t bpe_thread_ns(void) {      /* this thread's CPU time */
        struct timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
    typedef void* (*bpe_thread_fn)(void*);
    /* The engine's threads run C code that never allocates from the heap (the merge worker's
       buffers are reserved by the main thread: ``_share_reserve``) and never recurses deeply: a
       stack of 1 MiB, not the default 8 MiB (only its touched pages cost memory either way). */
    static inline int bpe_thread_start(pthread_t* t, bpe_thread_fn fn, void* arg) {
        pthread_attr_t attr;
        int rc;
        if (pthread_attr_init(&attr) != 0)
            return pthread_create(t, NULL, fn, arg);
        pthread_attr_setstacksize(&attr, (size_t)1 << 20);
        rc = pthread_create(t, &attr, fn, arg);
        pthread_attr_destroy(&attr);
        return rc;
    }
    """
    ctypedef unsigned long pthread_t
    ctypedef void* (*bpe_thread_fn)(void*) noexcept nogil
    void bpe_atomic_sub(int64_t* p, int64_t v) nogil
    uint32_t bpe_load_acquire(const uint32_t* p) nogil
    void bpe_store_release(uint32_t* p, uint32_t v) nogil
    bint bpe_claim(uint32_t* p, uint32_t expected, uint32_t desired) nogil
    void bpe_pause() nogil
    void bpe_nap() nogil
    void bpe_yield() nogil
    int64_t bpe_thread_ns() nogil
    int bpe_thread_start(pthread_t* t, bpe_thread_fn fn, void* arg) nogil
    int pthread_join(pthread_t t, void** ret) nogil


# Whether the engine's big buffers written whole at the build ask for transparent huge pages first
# (``huge_pages``: SuperBPE's stage 2 sets it only when free 2 MiB blocks can hold them,
# ``runtime.memmon.huge_pages_ready``). Set only between runs, with the GIL.
cdef bint _HUGE_BUFFERS = False


def huge_pages(bint on):
    """Let the engine's big build buffers (cells, window pair ids) ask for huge pages (``on``) or
    not; returns the previous setting. A hint to the kernel: the results never depend on it.

    >>> previous = huge_pages(True); huge_pages(previous)
    True
    """
    global _HUGE_BUFFERS
    cdef bint previous = _HUGE_BUFFERS
    _HUGE_BUFFERS = on
    return previous


cdef void _populate(void* p, size_t nbytes) noexcept nogil:
    """Fault in the whole pages of ``p[:nbytes]`` at once (``runtime.memmon.prefault`` for C++
    buffers about to be written whole; a hint: ignored by kernels without it), as huge pages where
    ``huge_pages`` is on."""
    cdef size_t start = (<size_t>p + 4095) & ~(<size_t>4095)
    cdef size_t end = (<size_t>p + nbytes) & ~(<size_t>4095)
    cdef size_t huge = <size_t>1 << 21
    cdef size_t hlo = (<size_t>p + huge - 1) & ~(huge - 1), hhi = (<size_t>p + nbytes) & ~(huge - 1)
    if nbytes >= (<size_t>4 << 20) and end > start:
        if _HUGE_BUFFERS and hhi > hlo:
            madvise(<void*>hlo, hhi - hlo, MADV_HUGEPAGE)
        madvise(<void*>start, end - start, MADV_POPULATE_WRITE)

cdef enum:
    PREFETCH_FAR = 32   # how many merge sites ahead ``_apply_merge`` asks for the cells and block entry of
    PREFETCH = 16       # ... and the word record of (the block entry is in cache by then)
    PREFETCH_NEAR = 6   # ... and the pair-map slots of its neighbour windows (its cells are in cache)
    TRIM_EVERY_CHECKS = 16    # ``run`` gives the heap's free blocks back every this many pool checks
    HEAP_RAISE_MIN = 1 << 20  # the heap's floor goes up once it holds this many entries (12 MiB; ``_raise_floor``)
    PAR_MIN_SITES = 64      # a merge with fewer sites runs on one thread (``threads=2``)
    BUILD_PAR_MIN = 1 << 20 # a build of fewer windows counts and fills on one thread (``threads=2``)
    BYTE_COUNT_MIN = 1 << 16  # a build of byte symbols (tokens < 256) with this many windows counts them by
                            # byte pair in arrays of 65,536 (``_count_bytes``), not in the pair map
    BUILD_FEW_PAIRS = 1 << 16  # a build whose lists are mapped runs on two threads when its tokens make at
                            # most this many pairs (the bytes: the second half's pair table, ~3 MiB)
    PAR_MIN_LIST_SITES = 2048  # a merge split over both threads writes its second share's list entries
                            # on the second thread from this many (``_near_end``)
    OTHER_SLOTS = 4096      # a share's table of the other pairs' count changes (``NearTable.opid``;
                            # a power of two, at most half used: 48 KiB)
    OTHER_PROBES = 8        # ... slots looked at before a pair is lowered at once instead
    SPLIT_SAMPLE = 31       # the sites looked at to divide a merge between the threads (``_split_at``)
    JOB_SHARE = 0           # the second thread's jobs: its share of a merge's sites (``_do_share``)
    JOB_LISTS = 1           # ... its share's positions into their lists (``_write_sites``)
    SPIN_PAUSES = 2000      # a thread waiting for the other spins this long, then yields its core
    WORKER_PAUSES = 400     # the second thread, between merges, spins this long, yields its core
    WORKER_YIELDS = 16      # ... this many times, then naps (20 us at a time): a spin or a yield is
                            # CPU time, and most merges run on one thread (fewer than PAR_MIN_SITES)

