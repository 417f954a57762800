# _engine.pyx, part 6 of 6 (``include``d: compiled into the module as if written there).
# The pool of position-list blocks given back while the merge loop runs (_pool_compact).

# ==== Pool compaction =========================================================================
# The positions added by merges live in blocks of 2**cls entries cut from 1 MiB pages (``_alloc``).
# A block given back goes to its class's free list and is never joined to its neighbours, so the
# pages the first merges fill (their pairs have millions of positions) stay with the process after
# those lists are merged and freed: on the 15 GB synthetic corpus the pool peaked at 671 MiB in the
# first merges and held 657 MiB to the end, when its blocks in use were 401 MiB (100k merges; 339 at
# 200k) holding 74 MiB of entries. The per-pair tables grow the other way (12.1 M pairs at 100k, 17.3 M
# at 200k), so the merge phase's peak was the pool's early peak plus the pair tables' end.
#
# ``_pool_compact`` slides every list down into the fewest pages, in the order the lists lie in the
# pool (a block never moves up, so no list is written over before it moves; ``memmove``), each in the
# smallest block that holds its entries, and gives the pages left empty back to the system (pages
# are mappings of their own: a freed block of the malloc heap may stay in the process). The lists'
# entries, their order and lengths are unchanged: no merge changes. ``run`` calls it between merges
# when at least a quarter of the pool's pages (and 32 MiB) are free blocks.
#
# The two threads' shares of a merge (``NearTable``) keep the room of the largest merge so far (its
# sites, 8 B each: 64 MiB at 15 GB, from the first merges); ``_shares_trim`` gives it back between
# merges when they hold as much as the pool's threshold (a later merge that needs it takes it again).

cdef size_t POOL_PAGE_BYTES = (<size_t>1 << 18) * 4      # PAGE_SIZE entries of 4 bytes


cdef uint32_t* _page_new() noexcept nogil:
    """One pool page (a mapping of its own: given back whole by ``_page_free``); NULL when out of
    memory."""
    cdef void* p = mmap(NULL, POOL_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if p == MAP_FAILED:
        return NULL
    return <uint32_t*>p


cdef void _page_free(uint32_t* p) noexcept nogil:
    if p != NULL:
        munmap(p, POOL_PAGE_BYTES)


cdef inline uint8_t _fit_cls(uint32_t n) noexcept nogil:
    """The smallest class whose block holds ``n`` entries: 0 for 0 or 1, 3 for 5-8."""
    cdef uint8_t c = 0
    while ((<uint64_t>1) << c) < n:
        c += 1
    return c


cdef void _pool_free_tail(MergeEngine e, uint64_t off, uint64_t end) noexcept nogil:
    """Give ``[off, end)`` (inside one page) to the free lists, in power-of-two pieces (``_alloc``'s way
    with the rest of a page)."""
    cdef uint64_t rest = end - off, piece
    cdef int c = PAGE_BITS
    while rest > 0:
        piece = (<uint64_t>1) << c
        if piece <= rest:
            e.free_blocks[c].push_back(off)
            off += piece
            rest -= piece
        else:
            c -= 1


cdef bint _pool_wasteful(MergeEngine e) noexcept nogil:
    """At least a quarter of the pool's pages, and POOL_COMPACT_MIN_FREE bytes, are free blocks."""
    cdef uint64_t pages = e.pages.size() * POOL_PAGE_BYTES
    cdef uint64_t free_bytes = pages - e.pool_used * 4 if pages > e.pool_used * 4 else 0
    return free_bytes >= e.pool_min_free and 4 * free_bytes >= pages


cdef void _pool_compact(MergeEngine e) noexcept nogil:
    """Slide the pool's lists down (see above) and give the empty pages back."""
    cdef size_t n_pages = e.pages.size(), p, q, pid, n_pids = e.lst_cls.size()
    cdef vector[uint64_t] start
    cdef vector[uint64_t] order             # per page, (offset in page << 32) | pair id
    cdef uint8_t cls, new_cls
    cdef uint64_t off, dst = 0, size, used = 0
    cdef size_t keep
    if n_pages == 0:
        return
    # 1. the pool's lists by page (a counting sort), then by offset inside each page
    start.assign(n_pages + 1, 0)
    for pid in range(n_pids):
        cls = e.lst_cls[pid]
        if cls != NO_LIST and cls <= PAGE_BITS:
            start[(e.lst_off[pid] >> PAGE_BITS) + 1] += 1
    for p in range(n_pages):
        start[p + 1] += start[p]
    order.resize(start[n_pages])
    for pid in range(n_pids):
        cls = e.lst_cls[pid]
        if cls != NO_LIST and cls <= PAGE_BITS:
            off = e.lst_off[pid]
            order[start[off >> PAGE_BITS]] = ((off & (PAGE_SIZE - 1)) << 32) | pid
            start[off >> PAGE_BITS] += 1
    for p in range(n_pages, 0, -1):          # (the fill moved each start to the next page's)
        start[p] = start[p - 1]
    start[0] = 0
    for p in range(n_pages):
        sort(order.begin() + start[p], order.begin() + start[p + 1])
    # 2. each list to the lowest place that holds it (``dst <= off`` always: the lists keep their
    # order and no block grows), in the smallest block that holds its entries; the free lists are
    # made again from what is left between and after
    for q in range(PAGE_BITS + 1):
        e.free_blocks[q].clear()
    for q in range(order.size()):
        pid = <size_t>(order[q] & 0xFFFFFFFFu)
        off = e.lst_off[pid]
        if e.lst_len[pid] == 0:               # an empty list: no block (``_list_free``)
            e.lst_cls[pid] = NO_LIST
            continue
        new_cls = _fit_cls(e.lst_len[pid])
        size = (<uint64_t>1) << new_cls
        if (dst & (PAGE_SIZE - 1)) + size > PAGE_SIZE:
            _pool_free_tail(e, dst, ((dst >> PAGE_BITS) + 1) << PAGE_BITS)
            dst = ((dst >> PAGE_BITS) + 1) << PAGE_BITS
        if dst != off:
            memmove(e._block(dst), e._block(off), <size_t>e.lst_len[pid] * 4)
            e.lst_off[pid] = dst
        e.lst_cls[pid] = new_cls
        dst += size
        used += size
    # 3. the pages after the last one in use go back
    keep = <size_t>((dst + PAGE_SIZE - 1) >> PAGE_BITS)
    for p in range(keep, n_pages):
        _page_free(e.pages[p])
    e.pages.resize(keep)
    if keep > 0 and (dst & (PAGE_SIZE - 1)) != 0:
        e.pool_top = dst                      # the rest of the last page is cut from as before
    else:
        e.pool_top = (<uint64_t>keep) << PAGE_BITS     # (full or none: the next block takes a new page)
    e.pool_used = used
    e.n_pool_compactions += 1


cdef void _share_trim(NearTable* nt) noexcept nogil:
    """Give back a share's per-merge vectors (each merge clears them first, ``_share_begin``)."""
    nt.sites.clear()
    nt.sites.shrink_to_fit()
    nt.near.clear()
    nt.near.shrink_to_fit()
    nt.remap.clear()
    nt.remap.shrink_to_fit()


cdef bint _shares_trim(MergeEngine e) noexcept nogil:
    """Trim both shares when their per-merge vectors hold ``pool_min_free`` bytes or more."""
    cdef uint64_t held = (e.share0.sites.capacity() * 8 + e.share1.sites.capacity() * 8
                          + (e.share0.near.capacity() + e.share1.near.capacity()) * sizeof(Near)
                          + (e.share0.remap.capacity() + e.share1.remap.capacity()) * 4)
    if held == 0 or held < e.pool_min_free:
        return False
    _share_trim(&e.share0)
    _share_trim(&e.share1)
    return True
