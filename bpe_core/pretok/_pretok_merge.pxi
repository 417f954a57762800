# _pretok.pyx, part 10 of 11 (``include``d: compiled into the module as if written there).
# merge_counts: a k-way merge of count tables sorted by bytes.

cdef enum:
    RUN_AHEAD = 8   # a run's word this many places on is fetched ahead (``_run_load``)

cdef inline void _run_load(WordRun* run) noexcept nogil:
    """Cache the word at ``run.pos``: its bytes, length and ordered 16-byte key (``WordRun``).

    The words a few places on are asked for ahead (``RUN_AHEAD``): each run is a stream of its
    own, and the merge reads several at once at the rate their words interleave."""
    cdef int64_t a = run.offsets[run.pos]
    cdef Py_ssize_t n = run.offsets[run.pos + 1] - a
    cdef uint64_t w0, w1
    if run.pos + RUN_AHEAD < run.n_words:
        bpe_prefetch(run.arena + run.offsets[run.pos + RUN_AHEAD])
        bpe_prefetch(run.offsets + run.pos + 4 * RUN_AHEAD)
        bpe_prefetch(run.counts + run.pos + 4 * RUN_AHEAD)
    run.word = run.arena + a
    run.length = n
    _head16(run.word, n, run.arena_end, &w0, &w1)
    run.key = bpe_order64(w0)
    run.key2 = bpe_order64(w1)


cdef inline int _loaded_cmp(uint64_t ka, uint64_t ka2, const uint8_t* wa, Py_ssize_t na,
                            uint64_t kb, uint64_t kb2, const uint8_t* wb, Py_ssize_t nb) noexcept nogil:
    """``_word_cmp`` of two words given with their 16-byte keys (first 16 bytes, zero-padded, as
    big-endian integers): unequal keys decide at once; equal keys mean the words agree on their
    first 16 bytes, where a word that ends sooner is followed by zeros only, so it is a prefix of the
    other: the bytes past the 16th decide, then the lengths."""
    if ka != kb:
        return -1 if ka < kb else 1
    if ka2 != kb2:
        return -1 if ka2 < kb2 else 1
    if na > 16 and nb > 16:
        return _word_cmp(wa + 16, na - 16, wb + 16, nb - 16)
    return (na > nb) - (na < nb)


cdef extern from *:
    """
    /* The first 8 bytes of a word, given as the big-endian integer of its ``WordRun`` key, stored
     * at p in byte order (the zero padding past a short word's end included). */
    static inline void bpe_store_be64(uint8_t* p, uint64_t v) {
    #if !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
        v = BPE_BSWAP64(v);
    #endif
        memcpy(p, &v, 8);
    }
    """
    void bpe_store_be64(uint8_t* p, uint64_t v) noexcept nogil


cdef enum:
    # The merge writes a word of up to 16 bytes as two 8-byte stores of its zero-padded head: the
    # output arena has this much room past the merged table's bytes (``merge_counts``), and the
    # upper half of a two-thread merge starts this far past the lower half's room (``_merge_two``).
    HEAD_SLACK = 16


cdef inline Py_ssize_t _tree_leaves(Py_ssize_t n_runs) noexcept nogil:
    """The leaves of the tournament over ``n_runs`` runs: the power of two at or above it (>= 1)."""
    cdef Py_ssize_t k = 1
    while k < n_runs:
        k *= 2
    return k


cdef inline bint _run_before(WordRun* runs, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """Tournament order: run ``a``'s current word comes before run ``b``'s. A finished run (its
    ``pos == n_words``, keys set to all ones) comes after every word; equal words: the lower run
    index first. Unequal keys decide at once (the first 8 bytes differ, or one word ends inside
    them before a nonzero byte of the other); equal keys go to the next 8, the bytes past 16, then
    the lengths."""
    cdef WordRun* x = &runs[a]
    cdef WordRun* y = &runs[b]
    cdef int r
    cdef bint x_done, y_done
    if x.key != y.key:
        return x.key < y.key
    x_done = x.pos == x.n_words
    y_done = y.pos == y.n_words
    if x_done or y_done:     # all-ones keys: a real word may start with 8 bytes 0xFF
        return (not x_done) or (y_done and a < b)
    r = _loaded_cmp(x.key, x.key2, x.word, x.length, y.key, y.key2, y.word, y.length)
    return r < 0 or (r == 0 and a < b)


cdef void _merge_runs(WordRun* runs, Py_ssize_t n_runs, Py_ssize_t* tree, uint8_t* arena,
                      int64_t* offsets, int64_t* counts, Py_ssize_t* n_words,
                      Py_ssize_t* n_bytes) noexcept nogil:
    """k-way merge of sorted word runs, summing the counts of equal words, written to ``arena``,
    ``offsets`` and ``counts`` (room for the sum of the runs' words, and of their bytes plus
    ``HEAD_SLACK``: the merged table is at most that); *n_words and *n_bytes get the merged table's
    sizes.

    A tournament of losers (Knuth's "tree of losers", TAOCP 5.4.1): ``runs`` has
    ``_tree_leaves(n_runs)`` entries (those past ``n_runs`` zeroed: runs without words), ``tree``
    3 times as many. Node i of ``tree[:K]`` holds the run that lost the match there; the winner of
    the whole tournament is the run with the smallest current word. After it gives its word, only
    the matches on its path to the root are replayed: log2(K) comparisons per word, where a binary
    heap's sift-down made up to two per level.
    """
    cdef Py_ssize_t K = _tree_leaves(n_runs), r, node, a, b, top, other
    cdef Py_ssize_t* loser = tree          # nodes 1 .. K - 1
    cdef Py_ssize_t* win = tree + K        # the winners while building, nodes 1 .. 2K - 1
    cdef Py_ssize_t w = 0, nb = 0, length
    cdef const uint8_t* word
    cdef const uint8_t* prev = NULL
    cdef Py_ssize_t prev_length = -1
    cdef uint64_t prev_key = 0, prev_key2 = 0, key, key2
    cdef WordRun* run
    for r in range(K):
        runs[r].pos = 0
        if r < n_runs and runs[r].n_words > 0:
            _run_load(&runs[r])
        else:
            runs[r].n_words = 0
            runs[r].key = runs[r].key2 = 0xFFFFFFFFFFFFFFFFULL
        win[K + r] = r
    for node in range(K - 1, 0, -1):
        a = win[2 * node]
        b = win[2 * node + 1]
        if _run_before(runs, b, a):
            win[node] = b
            loser[node] = a
        else:
            win[node] = a
            loser[node] = b
    top = win[1] if K > 1 else 0
    while True:
        run = &runs[top]
        if run.pos == run.n_words:       # the winner has no word left: every run is done
            break
        word = run.word
        length = run.length
        if prev_length >= 0 and run.key == prev_key and run.key2 == prev_key2 and length == prev_length and (
                length <= 16 or memcmp(word + 16, prev + 16, length - 16) == 0):
            counts[w - 1] += run.counts[run.pos]
        else:
            offsets[w] = nb
            counts[w] = run.counts[run.pos]
            if length <= 16:             # the head, zero-padded: two stores (HEAD_SLACK bytes of room)
                bpe_store_be64(arena + nb, run.key)
                bpe_store_be64(arena + nb + 8, run.key2)
            else:
                memcpy(arena + nb, word, length)
            w += 1
            nb += length
            prev = word
            prev_length = length
            prev_key = run.key
            prev_key2 = run.key2
        run.pos += 1
        if run.pos == run.n_words:
            run.key = run.key2 = 0xFFFFFFFFFFFFFFFFULL
        else:
            key = run.key
            key2 = run.key2
            _run_load(run)
            # Each run's words must rise strictly: checked here, on the key just loaded, rather
            # than in a pass of its own over every input (``merge_counts`` checks only the
            # offsets before merging). A run out of order stops the merge; merge_counts raises.
            if run.key < key or (run.key == key and
                                 _loaded_cmp(run.key, run.key2, run.word, run.length, key, key2, word, length) <= 0):
                run.disordered = True
                break
        node = (top + K) >> 1            # replay the matches on the winner's path
        while node > 0:
            other = loser[node]
            if _run_before(runs, other, top):
                loser[node] = top
                top = other
            node >>= 1
    offsets[w] = nb
    n_words[0] = w
    n_bytes[0] = nb


cdef bint _offsets_ok(WordRun* run, Py_ssize_t n_bytes) noexcept nogil:
    """Offsets start at 0, never decrease and end at ``n_bytes`` (every word inside the arena): what
    must hold before any word is read. The words' order is checked as they are merged."""
    cdef Py_ssize_t i
    cdef const int64_t* o = run.offsets
    cdef bint ok = o[0] == 0 and o[run.n_words] == n_bytes
    for i in range(run.n_words):
        ok &= o[i + 1] >= o[i]
    return ok


cdef extern from *:
    """
    #if defined(__linux__)
    #include <sys/mman.h>
    #include <unistd.h>
    #endif
    /* Give the whole pages of [p + used, p + size) back to the OS: the tail of an output array past
     * what is kept, never read again (a page written there would come back zeroed). Elsewhere
     * nothing. */
    static void bpe_release_tail(void* p, size_t used, size_t size) {
    #if defined(__linux__) && defined(MADV_DONTNEED)
        const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t a = ((uintptr_t)p + used + page - 1) / page * page;
        uintptr_t b = ((uintptr_t)p + size) / page * page;
        if (b > a) madvise((void*)a, b - a, MADV_DONTNEED);
    #endif
    }
    """
    void bpe_release_tail(void* p, size_t used, size_t size) noexcept nogil


cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t* thread, const void* attr, void* (*start)(void*) noexcept nogil, void* arg)
    int pthread_join(pthread_t thread, void** retval)


cdef struct MergeHalf:
    # The upper half of a two-thread merge: its runs (each from its cut on), where it writes, and
    # the sizes it wrote (``_merge_runs``'s outputs)
    WordRun* runs
    Py_ssize_t n_runs
    Py_ssize_t* tree
    uint8_t* arena
    int64_t* offsets
    int64_t* counts
    Py_ssize_t n_words
    Py_ssize_t n_bytes


cdef void* _merge_half_main(void* arg) noexcept nogil:
    cdef MergeHalf* h = <MergeHalf*>arg
    _merge_runs(h.runs, h.n_runs, h.tree, h.arena, h.offsets, h.counts, &h.n_words, &h.n_bytes)
    return NULL


cdef Py_ssize_t _lower_bound(WordRun* run, const uint8_t* word, Py_ssize_t length) noexcept nogil:
    """The first index of a sorted run whose word is not below ``word`` (``run.n_words`` if none)."""
    cdef Py_ssize_t lo = 0, hi = run.n_words, mid
    cdef int64_t a
    while lo < hi:
        mid = (lo + hi) // 2
        a = run.offsets[mid]
        if _word_cmp(run.arena + a, run.offsets[mid + 1] - a, word, length) < 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef void _merge_two(WordRun* runs, Py_ssize_t n_runs, Py_ssize_t* tree, WordRun* upper, Py_ssize_t* tree2,
                     uint8_t* arena, int64_t* offsets, int64_t* counts, Py_ssize_t* n_words,
                     Py_ssize_t* n_bytes) noexcept nogil:
    """``_merge_runs`` on two threads: every run is cut at the first word not below a pivot (the
    middle word of the longest run), so a word and all its copies fall in one half; this thread
    merges the words below the pivot into the start of the outputs, a second thread the others into
    the room after the lower half's inputs (its bytes ``HEAD_SLACK`` further on, past the lower
    half's last head stores; its offsets one entry further on: the lower half's last offset is not
    overwritten; ``offsets`` has room for one more than the words). The upper half is then moved
    down behind the lower half's result, its offsets shifted: the outputs are ``_merge_runs``'s,
    byte for byte. ``upper``, ``tree`` and ``tree2`` are sized as ``_merge_runs`` needs."""
    cdef Py_ssize_t r, longest = 0, mid, lw = 0, lb = 0, n1 = 0, b1 = 0, i, cut
    cdef const uint8_t* pivot
    cdef Py_ssize_t pivot_len
    cdef MergeHalf h
    cdef pthread_t thread
    cdef bint started
    for r in range(n_runs):
        if runs[r].n_words > runs[longest].n_words:
            longest = r
    mid = runs[longest].n_words // 2
    pivot = runs[longest].arena + runs[longest].offsets[mid]
    pivot_len = runs[longest].offsets[mid + 1] - runs[longest].offsets[mid]
    for r in range(n_runs):
        cut = _lower_bound(&runs[r], pivot, pivot_len)
        upper[r] = runs[r]
        upper[r].offsets = runs[r].offsets + cut
        upper[r].counts = runs[r].counts + cut if runs[r].counts != NULL else NULL
        upper[r].n_words = runs[r].n_words - cut
        runs[r].n_words = cut
        lw += cut
        lb += runs[r].offsets[cut]
    h.runs = upper
    h.n_runs = n_runs
    h.tree = tree2
    h.arena = arena + lb + HEAD_SLACK
    h.offsets = offsets + lw + 1
    h.counts = counts + lw if counts != NULL else NULL
    started = pthread_create(&thread, NULL, _merge_half_main, <void*>&h) == 0
    _merge_runs(runs, n_runs, tree, arena, offsets, counts, &n1, &b1)
    if started:
        pthread_join(thread, NULL)
    else:                                    # no thread: the upper half after the lower, here
        _merge_half_main(<void*>&h)
    if h.n_bytes > 0:
        memmove(arena + b1, arena + lb + HEAD_SLACK, h.n_bytes)
    if n1 != lw and h.n_words > 0:
        memmove(counts + n1, counts + lw, h.n_words * sizeof(int64_t))
    for i in range(h.n_words + 1):           # (the destination is always below the source)
        offsets[n1 + i] = offsets[lw + 1 + i] + b1
    n_words[0] = n1 + h.n_words
    n_bytes[0] = b1 + h.n_bytes


#: ``merge_counts(threads=2)`` merges on two threads from this many words in all (fewer: one thread).
MERGE_PAR_MIN_WORDS = 1 << 16


def merge_counts(tables, int threads=1, Py_ssize_t par_min_words=MERGE_PAR_MIN_WORDS):
    """Sum sorted word tables into one sorted word table (a k-way merge, no Python object per word).

    Contract: ``tables`` is a sequence of ``(arena, offsets, counts)`` as ``count_pretokens``
    returns them (uint8, int64, int64; each sorted by bytes, words unique). Returns one such table
    holding every word of any input with the sum of its counts. Raises ``ValueError`` on a table
    that is malformed or not sorted.

    >>> t1 = (np.frombuffer(b"ab", np.uint8), np.array([0, 1, 2]), np.array([1, 2]))
    >>> t2 = (np.frombuffer(b"bc", np.uint8), np.array([0, 1, 2]), np.array([5, 1]))
    >>> a, o, c = merge_counts([t1, t2])
    >>> bytes(a), o.tolist(), c.tolist()
    (b'abc', [0, 1, 2, 3], [1, 7, 1])

    One pass: the outputs are allocated for the sum of the inputs' words and bytes (address space:
    only the pages written become memory) and returned as views of what was written.

    ``threads=2`` (with ``par_min_words`` words or more in all): the tables are cut at one word and
    the two halves merged on two threads into the same outputs (the upper half then moved down
    behind the lower): the same table, byte for byte.

    Plain equivalent: ``sorted(sum((Counter(dict(rows(t))) for t in tables), Counter()).items())``.
    """
    cdef Py_ssize_t n_runs = len(tables), r, n_words = 0, n_bytes = 0, most_words = 0, most_bytes = 0
    cdef const uint8_t[::1] arena_view
    cdef const int64_t[::1] offsets_view
    cdef const int64_t[::1] counts_view
    keep = []  # the memoryviews stay alive while C pointers into them are used
    # the tournament's leaves: the runs, then runs without words up to a power of two
    cdef Py_ssize_t leaves = _tree_leaves(n_runs)
    cdef WordRun* runs = <WordRun*>calloc(leaves, sizeof(WordRun))
    cdef Py_ssize_t* tree = <Py_ssize_t*>calloc(3 * leaves, sizeof(Py_ssize_t))
    cdef WordRun* upper = NULL
    cdef Py_ssize_t* tree2 = NULL
    cdef bint ok, two
    cdef uint8_t[::1] out_arena
    cdef int64_t[::1] out_offsets
    cdef int64_t[::1] out_counts
    cdef uint8_t* arena_ptr
    cdef size_t sizes[3]
    try:
        if runs == NULL or tree == NULL:
            raise MemoryError("merge_counts: cannot allocate the merge tree")
        for r, table in enumerate(tables):
            arena, offsets, counts = table
            arena_view = np.ascontiguousarray(arena, dtype=np.uint8)
            offsets_view = np.ascontiguousarray(offsets, dtype=np.int64)
            counts_view = np.ascontiguousarray(counts, dtype=np.int64)
            if offsets_view.shape[0] != counts_view.shape[0] + 1:
                raise ValueError(f"table {r}: offsets must have len(counts) + 1 entries")
            if offsets_view[offsets_view.shape[0] - 1] != arena_view.shape[0]:
                raise ValueError(f"table {r}: offsets[-1] must equal len(arena)")
            keep.append((arena_view, offsets_view, counts_view))
            most_words += counts_view.shape[0]
            most_bytes += arena_view.shape[0]
            runs[r].arena = &arena_view[0] if arena_view.shape[0] > 0 else <const uint8_t*>tree
            runs[r].offsets = &offsets_view[0]
            runs[r].counts = &counts_view[0] if counts_view.shape[0] > 0 else NULL
            runs[r].n_words = counts_view.shape[0]
            runs[r].arena_end = runs[r].arena + arena_view.shape[0]
            with nogil:
                ok = _offsets_ok(&runs[r], arena_view.shape[0])
            if not ok:
                raise ValueError(f"table {r}: offsets must start at 0 and never decrease")
        two = threads >= 2 and most_words >= max(par_min_words, 2)
        # room for the head stores past the last word (two threads: past each half's, HEAD_SLACK)
        arena_out = np.empty(most_bytes + (2 if two else 1) * HEAD_SLACK, dtype=np.uint8)
        # (two threads: one offset more, the upper half's offsets start one entry after its words')
        offsets_out = np.empty(most_words + 1 + two, dtype=np.int64)
        counts_out = np.empty(most_words, dtype=np.int64)
        out_arena = arena_out
        out_offsets = offsets_out
        out_counts = counts_out
        arena_ptr = &out_arena[0]
        if two:
            upper = <WordRun*>calloc(leaves, sizeof(WordRun))
            tree2 = <Py_ssize_t*>calloc(3 * leaves, sizeof(Py_ssize_t))
            if upper == NULL or tree2 == NULL:
                raise MemoryError("merge_counts: cannot allocate the merge tree")
            with nogil:
                _merge_two(runs, n_runs, tree, upper, tree2, arena_ptr, &out_offsets[0],
                           &out_counts[0], &n_words, &n_bytes)
        else:
            with nogil:
                _merge_runs(runs, n_runs, tree, arena_ptr, &out_offsets[0],
                            &out_counts[0] if most_words > 0 else NULL, &n_words, &n_bytes)
        for r in range(n_runs):
            if runs[r].disordered or (upper != NULL and upper[r].disordered):
                raise ValueError(f"table {r} is not sorted by bytes with unique words")
        if two or n_words < most_words:
            # The upper half was written after the lower half's inputs, then moved down behind its
            # result: its first copy stayed resident past the table's end (1.5x the table where
            # the halves are equal: on the 15 GB synthetic corpus ~230 MiB at the final merge,
            # and the folds of folded tables kept theirs while counting). Those pages go back
            # (on one thread, only what a huge page mapped past the end).
            # (each array's own size: a page past its end would be another block's)
            sizes[0], sizes[1], sizes[2] = arena_out.nbytes, offsets_out.nbytes, counts_out.nbytes
            with nogil:
                bpe_release_tail(arena_ptr, n_bytes, sizes[0])
                bpe_release_tail(&out_offsets[0], (n_words + 1) * sizeof(int64_t), sizes[1])
                if most_words > 0:
                    bpe_release_tail(&out_counts[0], n_words * sizeof(int64_t), sizes[2])
        if n_words == most_words and not two:     # nothing summed: offsets and counts are full
            return arena_out[:n_bytes], offsets_out, counts_out
        return arena_out[:n_bytes], offsets_out[:n_words + 1], counts_out[:n_words]
    finally:
        free(runs)
        free(tree)
        free(upper)
        free(tree2)
