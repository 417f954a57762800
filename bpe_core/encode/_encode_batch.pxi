# _encode.pyx, part 6 of 10 (``include``d: compiled into the module as if written there).
# Single tokens (build_singles), the batch job (BatchJob) and the hand-over of owned ids.

cdef enum:
    BIG_SHARE = 64      # several threads take the documents over 1/64 of a share first (BatchJob)
    LIST_CHUNK = 1 << 16    # the listing thread encodes this many bytes of its own between list passes
    LIST_DOC_COST = 256     # ... a document counted as this many bytes more (many tiny ones: a pass)
    FIXED_SLACK = 64        # a fixed buffer's ids past one per byte of the job (INLINE_IDS and more)
    FIXED_MAX = 1 << 28     # a job of more bytes makes no fixed buffers (1 GiB of address space each)
    DOC_DONE = 1        # BatchJob.doc_state: a worker's ids are final, its buffer will not move
    DOC_OWN = 2         # ... the listing thread's own document (its ids in its own buffer)
    DOC_LATER = 3       # ... a worker's ids are final, in a buffer that may move: collect lists it
    LISTED = 1          # BatchJob.doc_listed: the list is built, its references its own
    LISTED_COUNTED = 2  # ... its shared ints' references counted in BatchJob.counts, added at the end

# ==== Single tokens and batch jobs ===============================================================


def build_singles(RankTable table not None, TokenTable tokens not None, Py_ssize_t max_len=256):
    """The pieces that encode as one token, proven by merging each: an ``Encoder`` whose cache
    holds ``token bytes -> [id]`` for every token of 2 to ``max_len`` bytes that the merge loop
    turns into exactly itself, and nothing else. It is read, never written, by the encoders it is
    given to (``Encoder(..., singles=...)``), which look a piece up there when their own cache
    misses, before merging it: on a cold cache most pieces of a text are single tokens.

    A token is not always its own encoding (the merges may never build it from its bytes, or build
    a different split first), hence the proof, not the vocabulary. Equivalent to
    ``{b: [i] for i, b in vocab if reference.encode_pretoken(b) == [i]}``.

    >>> t = RankTable(np.array([97, 256], np.uint32), np.array([98, 99], np.uint32),
    ...               np.array([256, 257], np.uint32), np.arange(256, dtype=np.uint32))
    >>> tt = TokenTable([bytes([i]) for i in range(256)] + [b"ab", b"abc", b"bc"])
    >>> s = build_singles(t, tt); s.cache_info()["entries"]    # "bc" is never built
    2
    >>> s.encode_piece(b"abc"), Encoder(t, singles=s).encode_pieces(b"abcab", np.array([3, 5])).tolist()
    ([257], [257, 256])
    """
    if max_len < 2 or max_len > 4095:
        raise ValueError("max_len must lie in 2 .. 4095")
    cdef Py_ssize_t i, n, got, count = 0
    cdef const int64_t* offs = tokens.offsets.data()
    cdef const uint8_t* data = tokens.data.data()
    cdef const uint8_t* p
    cdef vector[token_id_t] out
    cdef uint64_t w0
    for i in range(tokens.n):
        n = offs[i + 1] - offs[i]
        if tokens.valid[i] and 2 <= n <= max_len:
            count += 1
    cdef Encoder singles = Encoder(table, max_entries=max(count, 1) + 1, max_cached_len=max_len)
    out.resize(max_len)
    with nogil:
        for i in range(tokens.n):
            n = offs[i + 1] - offs[i]
            if not tokens.valid[i] or n < 2 or n > max_len:
                continue
            p = data + offs[i]
            got = singles._merge(p, n, out.data())
            if got != 1 or out[0] != <token_id_t>i:
                continue                    # not its own encoding (or not the canonical id)
            w0 = _load_head(p, n, p + n)
            _cache_insert(singles, p, n, w0, _key_hash(p, n, w0, p + n), out.data(), 1)
    return singles


cdef extern from *:
    """
    #if defined(_MSC_VER)
    #include <intrin.h>
    static Py_ssize_t bpe_fetch_add(Py_ssize_t* p, Py_ssize_t v) {
        return (Py_ssize_t)_InterlockedExchangeAdd64((volatile long long*)p, (long long)v);
    }
    #else
    static Py_ssize_t bpe_fetch_add(Py_ssize_t* p, Py_ssize_t v) {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    }
    #endif
    """
    Py_ssize_t fetch_add "bpe_fetch_add"(Py_ssize_t* p, Py_ssize_t v) noexcept nogil


cdef extern from *:
    """
    /* One step of the listing thread's wait for a worker's last document: a few spins, then the
       core offered to others, then sleeps of 20 us, doubled every 16 up to 640 us (the wait may be
       a large document's whole encode, or a worker the system has not run for a while on a busy
       machine: not spun through, which would count as CPU time). */
    #if defined(_WIN32)
    #include <windows.h>
    static void bpe_wait_step(int round) {
        if (round < 64) YieldProcessor();
        else SwitchToThread();
    }
    #else
    #include <sched.h>
    #include <time.h>
    static void bpe_wait_step(int round) {
        if (round < 64) {
    #if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
    #elif defined(__aarch64__)
            __asm__ __volatile__("yield");
    #endif
        } else if (round < 96) {
            sched_yield();
        } else {
            int doubled = (round - 96) / 16;
            struct timespec t = {0, 20000L << (doubled < 5 ? doubled : 5)};
            nanosleep(&t, NULL);
        }
    }
    #endif
    """
    void wait_step "bpe_wait_step"(int round) noexcept nogil
    Py_ssize_t list_size "PyList_GET_SIZE"(PyObject* l) noexcept
    bint _is_shared "bpe_is_shared"(PyObject* o, void** ptrs, Py_ssize_t n_ints) noexcept


cdef extern from *:
    """
    /* Whether o is the table's own int of its value (BatchJob._settle's giving up: an id past the
       shared ints has an int of its own, which holds its reference already). */
    static int bpe_is_shared(PyObject* o, void** ptrs, Py_ssize_t n_ints) {
        Py_ssize_t v;
        if (!PyLong_CheckExact(o))
            return 0;
        v = PyLong_AsSsize_t(o);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        return v >= 0 && v < n_ints && ptrs[v] == (void*)o;
    }
    """


cdef object _list_counted(TokenTable tokens, const token_id_t* p, Py_ssize_t n, uint32_t* counts):
    """``tokens._list`` of a batch job's document with its shared ints' references counted in the
    job's ``counts`` (4 bytes an int: in L2), not increfed: an incref writes the int itself, 32
    bytes read out of order from 1.6 MB (GPT-2) or 3.2 MB (cl100k), a cache miss more often than
    not while the other threads encode. The job adds the counts once (``BatchJob._settle``). An id
    past the shared ints gets an int of its own. Untracked by the cyclic collector."""
    cdef PyObject* lst = list_unset(n)
    cdef PyObject** items
    cdef PyObject* o
    cdef void** ptrs = tokens.int_ptrs.data()
    cdef Py_ssize_t i, j, n_ints = tokens.n_ints
    cdef uint32_t v
    if lst == NULL:
        raise MemoryError()
    items = list_items(lst)
    for i in range(n):
        v = p[i]
        if v < <uint64_t>n_ints:
            items[i] = <PyObject*>ptrs[v]
            counts[v] += 1
        else:
            o = long_from_u32(v)
            if o == NULL:
                for j in range(i):          # (what was counted becomes the list's own, to free it)
                    if p[j] < <uint64_t>n_ints:
                        counts[p[j]] -= 1
                        incref(items[j])
                _unset_from(lst, items, i, n)
            items[i] = o
    result = <object>lst
    decref(lst)
    return result


cdef class BatchJob:
    """Many documents encoded by several threads in one native job, then gathered by one copy.

    Each thread calls :meth:`run` with an encoder of its own; without the GIL it takes the next
    document by an atomic counter (with several threads, the large documents first: see
    ``_order_big_first``), encodes it whole (``Encoder.encode_text`` of it alone) into
    its encoder's buffer and notes where. :meth:`collect` then copies every document's ids into
    one uint32 array, in order. With ``shared`` (an encoder that does not encode meanwhile), every
    thread looks pieces up in that encoder's cache first and adds what it merges there, so the
    threads of a cold job do not each merge the same pieces: the cache is written under a lock,
    one published slot at a time, and never grown or cleared while the job runs
    (``Encoder.reserve_shared`` makes room before; once it is full, a thread keeps its new pieces
    in its own cache, which ``Tokenizer`` moves into the shared one afterwards:
    ``Encoder.absorb_cache``).

    With :meth:`build_lists` the job also builds the Python list of each document's ids while it
    runs, on the thread that calls :meth:`run` with ``lists=True`` (the caller's: it takes the GIL
    between stretches of its own documents and lists every document finished so far, the other
    workers' too); :meth:`collect` then returns the lists. So the lists are built while the other
    threads still encode, not after them on one thread. It reads another worker's ids in that
    worker's buffer while the worker goes on encoding into it: each worker makes its buffer large
    enough for the whole job first (one id per byte at most: it never moves), or, if it cannot, its
    documents are listed by :meth:`collect`.

    Args:
        texts: a list of ``str`` (UTF-8, ``surrogateescape``) or bytes-like documents.
        pattern_id, specials: as ``Encoder.encode_text``.

    >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
    ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
    >>> job = BatchJob(["ab ab", "", b"abc"], 0)
    >>> job.run(Encoder(t))
    >>> ids, offsets = job.collect(); ids.tolist(), offsets.tolist()
    ([256, 32, 256, 256, 99], [0, 3, 3, 5])
    """

    def __init__(self, texts, int pattern_id, SpecialTable specials=None):
        if pattern_id < 0 or pattern_id > 2:
            raise ValueError(f"unknown pattern id {pattern_id}")
        cdef Py_ssize_t n = len(texts), k, size = 0
        cdef const char* p = NULL
        cdef int64_t total = 0
        keep = []
        self.ptrs.resize(n)
        self.sizes.resize(n)
        for k in range(n):
            t = texts[k]
            if isinstance(t, str):
                p = utf8_if_free(t, &size)                  # ASCII, or UTF-8 kept: no copy
                if p == NULL:
                    t = _encode_utf8(<str>t)
                    p = PyBytes_AS_STRING(t)
                    size = PyBytes_GET_SIZE(t)
            else:
                if not isinstance(t, bytes):
                    t = bytes(t)
                p = PyBytes_AS_STRING(t)
                size = PyBytes_GET_SIZE(t)
            keep.append(t)
            self.ptrs[k] = <const uint8_t*>p
            self.sizes[k] = size
            total += size
        self.keep = keep
        self.pattern_id = pattern_id
        self.specials = specials
        self.n_docs = n
        self.n_bytes = total
        self.next_doc = 0
        self.doc_n.assign(n, 0)
        self.doc_at.assign(n, 0)
        self.doc_who.assign(n, -1)
        self.doc_state.assign(n, 0)
        self.workers = []
        self.fixed_max = FIXED_MAX

    def build_lists(self, TokenTable tokens not None):
        """Build the list of each document's ids while the job runs (see the class), from
        ``tokens`` (the tokenizer's ``TokenTable``): one call of :meth:`run` passes ``lists=True``,
        and :meth:`collect` returns the lists. Call before the first :meth:`run`.

        Memory: each other worker's buffer is made room for one id per byte of the whole job
        (address space, 4 bytes a byte of text: the pages hold memory only where ids are written,
        as before; none past ``FIXED_MAX`` bytes, whose workers' documents collect lists).
        """
        if self.workers:
            raise RuntimeError("build_lists() after run()")
        self.tokens = tokens
        self.lists = [None] * self.n_docs
        self.doc_listed.assign(self.n_docs, 0)
        if COUNTED_REFS and self.counts == NULL and self.n_bytes < (<int64_t>1 << 31):   # (ids <= bytes)
            self.counts = <uint32_t*>calloc(max(tokens.n_ints, 1), sizeof(uint32_t))   # NULL: increfs

    def __dealloc__(self):
        free(self.counts)

    def run(self, Encoder enc not None, Encoder shared=None, Py_ssize_t n_workers=1, bint lists=False):
        """Encode documents with ``enc`` until none is left (call once per thread, each with its
        own encoder; ``shared``: a cache shared by the threads, see the class; ``n_workers``: the threads
        running the job, each reserves room for its share of the ids first). Releases the GIL.

        ``lists`` (after :meth:`build_lists`): this thread also builds the lists (see the class) and
        returns when every document is listed but those of a worker whose buffer could move."""
        cdef Py_ssize_t k, stop = 0
        cdef bint done = True
        cdef int32_t who
        cdef const Specials* sp = &self.specials.c if self.specials is not None else NULL
        cdef uint32_t finished = DOC_DONE
        cdef token_id_t* fixed = NULL
        if n_workers < 1:
            raise ValueError("n_workers must be positive")
        if lists and self.tokens is None:
            raise ValueError("run(lists=True) without build_lists()")
        if shared is enc:
            shared = None
        if shared is not None and shared.table is not enc.table:
            raise ValueError("the encoders must share one rank table")
        if n_workers > 1 and not self.ordered:
            self._order_big_first(n_workers)   # (the first thread, holding the GIL throughout)
        who = <int32_t>len(self.workers)
        self.workers.append(enc)
        enc.out_n = 0
        if self.tokens is not None and not lists:
            # The listing thread reads this buffer while ids are added to it: room for all the
            # job's ids at once, so it never moves (an id stands for one byte or more; _emit_pieces
            # asks for one per byte of its pieces, plus INLINE_IDS; a special token for one).
            # Without the memory (or past FIXED_MAX bytes, not to take 4 bytes of address space a
            # byte of text per worker), this worker's documents wait for collect (DOC_LATER).
            finished = DOC_LATER
            if self.n_bytes <= self.fixed_max:
                try:
                    enc._reserve_out(self.n_bytes + FIXED_SLACK, True)
                    fixed = enc.out_buf
                    finished = DOC_DONE
                    enc.out_pinned = True       # (a growth now raises: never a read of freed memory)
                except MemoryError:
                    pass
        enc.shared = shared
        try:
            if lists:
                self._run_lister(enc, who, sp)
                self._settle(not load_acquire(&self.failed))
                return
            with nogil:
                # its share of the ids, guessed at one per 3 bytes (_emit_pieces reserves what it
                # needs on top): a new encoder's buffer is made once, not grown by copies
                enc._reserve_out(min(self.n_bytes // (3 * n_workers), <int64_t>RESERVE_MAX), True)
                while True:
                    k = fetch_add(&self.next_doc, 1)
                    if k >= self.n_docs:
                        break
                    if self.ordered:
                        k = self.order[k]
                    self.doc_who[k] = who
                    self.doc_at[k] = enc.out_n
                    if self.sizes[k] > 0:
                        enc._encode_text(self.pattern_id, sp, self.ptrs[k], self.sizes[k], 0, self.sizes[k],
                                         0, False, &stop, &done)
                    self.doc_n[k] = enc.out_n - self.doc_at[k]
                    if fixed != NULL and enc.out_buf != fixed:
                        store_release(&self.moved, 1)   # (cannot happen: see above; collect raises)
                    store_release(&self.doc_state[k], finished)
        except BaseException:
            store_release(&self.failed, 1)  # (the listing thread stops waiting for its documents)
            if lists:
                self._settle(False)
            raise
        finally:
            enc.shared = None
            enc.out_pinned = False

    cdef int _run_lister(self, Encoder enc, int32_t who, const Specials* sp) except -1:
        """:meth:`run` on the listing thread: stretches of its own documents (``LIST_CHUNK``
        bytes) encoded without the GIL, each followed by a pass that lists every document finished
        so far (:meth:`_list_ready`); once none is left to take, it waits for the other workers' last
        documents, listing each as it ends. Only this thread takes the GIL while the job runs (the
        others take it to start and to end), so taking it between stretches costs no hand-over."""
        cdef Py_ssize_t k, chunk, stop = 0, listed
        cdef bint done = True, more = True
        cdef int rounds = 0
        while more:
            with nogil:
                enc.out_n = 0               # (its documents so far are listed: the buffer is reused)
                chunk = 0
                while chunk < LIST_CHUNK:
                    k = fetch_add(&self.next_doc, 1)
                    if k >= self.n_docs:
                        more = False
                        break
                    if self.ordered:
                        k = self.order[k]
                    self.doc_who[k] = who
                    self.doc_at[k] = enc.out_n
                    if self.sizes[k] > 0:
                        enc._encode_text(self.pattern_id, sp, self.ptrs[k], self.sizes[k], 0, self.sizes[k],
                                         0, False, &stop, &done)
                    self.doc_n[k] = enc.out_n - self.doc_at[k]
                    self.doc_state[k] = DOC_OWN
                    chunk += self.sizes[k] + LIST_DOC_COST
            self._list_ready()
        listed = self.n_listed
        while not self._list_ready() and not load_acquire(&self.failed):
            if self.n_listed != listed:     # (a document ended: the next wait starts short)
                listed = self.n_listed
                rounds = 0
            with nogil:
                wait_step(rounds)           # (spins, then yields, then sleeps from 20 us)
            rounds += 1
        return 0

    cdef int _list_ready(self) except -1:
        """List every document whose ids are final since the last call: the places taken since
        (``scanned`` on), and the ``pending`` ones, which were still being encoded then (at most
        one a worker: each place is looked at once more per pass only while it is pending, so a
        long document in flight does not make every pass rescan the batch). Returns 1 when every
        document is listed or left to collect."""
        cdef Py_ssize_t pos, i, kept = 0, taken = min(fetch_add(&self.next_doc, 0), self.n_docs)
        for i in range(<Py_ssize_t>self.pending.size()):
            pos = self.pending[i]
            if not self._list_one(pos):
                self.pending[kept] = pos
                kept += 1
        self.pending.resize(kept)
        for pos in range(self.scanned, taken):
            if not self._list_one(pos):
                self.pending.push_back(pos)
        self.scanned = max(self.scanned, taken)
        return self.scanned == self.n_docs and self.pending.empty()

    cdef bint _list_one(self, Py_ssize_t pos) except -1:
        """The list of the document taken at place ``pos`` when its ids are final, from the buffer
        of the worker that encoded it (``TokenTable._list``); a DOC_LATER one is left to
        :meth:`collect`. False while it is still being encoded."""
        cdef Py_ssize_t k = self.order[pos] if self.ordered else pos
        cdef uint32_t state = load_acquire(&self.doc_state[k])
        cdef Encoder enc
        if state == 0:
            return False
        if state != DOC_LATER:
            enc = <Encoder>self.workers[self.doc_who[k]]
            if self.counts != NULL:
                self.lists[k] = _list_counted(<TokenTable>self.tokens, enc.out_buf + self.doc_at[k],
                                              self.doc_n[k], self.counts)       # untracked until collect
                self.doc_listed[k] = LISTED_COUNTED
            else:
                self.lists[k] = (<TokenTable>self.tokens)._list(enc.out_buf + self.doc_at[k] if self.doc_n[k] else NULL,
                                                                self.doc_n[k])
                self.doc_listed[k] = LISTED
            self.n_listed += 1
        return True

    cdef void _settle(self, bint ok) noexcept:
        """The references of the LISTED_COUNTED lists, before :meth:`run` returns on the listing
        thread: ``ok``, every int's count added at once (one pass over the shared ints a job, not
        one a list as ``TokenTable._list``'s counted path); else (the job gives up) each such list's
        shared ints increfed one by one (an id past them has an int of its own), the counts dropped.
        No list leaves the call with references missing."""
        cdef TokenTable tokens = <TokenTable>self.tokens
        cdef Py_ssize_t k, i
        cdef PyObject* lst
        cdef PyObject* o
        cdef void** ptrs
        if tokens is None or self.counts == NULL:
            return
        ptrs = tokens.int_ptrs.data()
        if ok:
            _add_counted(ptrs, self.counts, tokens.n_ints)
        else:
            for k in range(self.n_docs):
                if self.doc_listed[k] == LISTED_COUNTED:
                    lst = list_items(<PyObject*>self.lists)[k]
                    for i in range(list_size(lst)):
                        o = list_items(lst)[i]
                        if _is_shared(o, ptrs, tokens.n_ints):
                            incref(o)
            memset(self.counts, 0, max(tokens.n_ints, 1) * sizeof(uint32_t))
        for k in range(self.n_docs):
            if self.doc_listed[k] == LISTED_COUNTED:
                self.doc_listed[k] = LISTED

    def collect(self, TokenTable lists=None):
        """``(ids, offsets)`` after every :meth:`run` returned: uint32 ids of all documents back
        to back, int64 offsets (``n_docs + 1``). The workers' buffers are emptied. One worker's
        buffer becomes ``ids`` itself (no copy; the encoder starts a new one).

        With ``lists`` (the tokenizer's ``TokenTable``): the list of each document's ids instead,
        built straight from the workers' buffers (no flat copy in between); equal to
        ``lists.split_lists(*collect())``.
        """
        cdef Py_ssize_t k, k0, n = self.n_docs, built = 0
        cdef int64_t total = 0
        cdef int32_t who
        cdef Encoder enc
        cdef vector[token_id_t*] bufs
        cdef list out
        if n and self.next_doc < n:
            raise RuntimeError("collect() before every document was encoded")
        for k in range(n):
            if self.doc_who[k] < 0:
                raise RuntimeError("a document was not encoded (a worker failed)")
        if self.tokens is not None:
            return self._collect_lists(lists)
        if lists is not None:
            for enc in self.workers:
                bufs.push_back(enc.out_buf)
            out = [None] * n
            try:
                for k in range(n):
                    out[k] = lists._list(bufs[self.doc_who[k]] + self.doc_at[k] if self.doc_n[k] else NULL,
                                         self.doc_n[k])          # untracked while the batch is built
                    built = k + 1
            finally:
                for k in range(built):
                    gc_track(<PyObject*>out[k])
                self._release_workers()
            return out
        offsets = np.empty(n + 1, dtype=np.int64)
        cdef int64_t[::1] offs = offsets
        offs[0] = 0
        for k in range(n):
            total += self.doc_n[k]
            offs[k + 1] = total
        if len(self.workers) == 1 and total > 0 and self._one_run(total):
            ids = _hand_over(<Encoder>self.workers[0], total)
            self._release_workers()
            return ids, offsets
        ids = np.empty(total, dtype=np.uint32)
        cdef uint32_t[::1] flat = ids
        for enc in self.workers:
            bufs.push_back(enc.out_buf)
        with nogil:
            k = 0
            while k < n:                    # a run of documents of one worker is one copy
                k0 = k
                who = self.doc_who[k]
                k += 1
                while k < n and self.doc_who[k] == who and self.doc_at[k] == self.doc_at[k - 1] + self.doc_n[k - 1]:
                    k += 1
                if offs[k] > offs[k0]:
                    memcpy(&flat[offs[k0]], bufs[who] + self.doc_at[k0], (offs[k] - offs[k0]) * sizeof(token_id_t))
        self._release_workers()
        return ids, offsets

    cdef object _collect_lists(self, object lists):
        """:meth:`collect` of a job that builds lists (:meth:`build_lists`): the documents not
        listed while it ran (DOC_LATER ones, or all when no thread listed) are listed now, and the
        lists handed to the cyclic collector together."""
        cdef TokenTable tokens = <TokenTable>self.tokens
        cdef Py_ssize_t k, n = self.n_docs
        cdef Encoder enc
        cdef vector[token_id_t*] bufs
        cdef list out = self.lists
        if lists is not None and lists is not tokens:
            raise ValueError("collect() with another TokenTable than build_lists()")
        if out is None:
            raise RuntimeError("collect() called twice")
        self.lists = None
        try:
            if load_acquire(&self.failed):
                raise RuntimeError("a document was not encoded (a worker failed)")
            if self.moved:
                raise RuntimeError("a worker's buffer moved while the lists were built")
            for enc in self.workers:
                bufs.push_back(enc.out_buf)
            for k in range(n):
                if self.doc_listed[k]:
                    continue
                if self.doc_state[k] == DOC_OWN:        # (its buffer was reused: cannot happen)
                    raise RuntimeError("a document of the listing thread was not listed")
                out[k] = tokens._list(bufs[self.doc_who[k]] + self.doc_at[k] if self.doc_n[k] else NULL,
                                      self.doc_n[k])
                self.doc_listed[k] = 1
        finally:
            for k in range(n):
                if self.doc_listed[k]:
                    gc_track(<PyObject*>out[k])
            self._release_workers()
        return out

    cdef void _order_big_first(self, Py_ssize_t n_workers):
        """Take the documents larger than ``1 / BIG_SHARE`` of a worker's share of the bytes first,
        largest first, then the others in order: a thread that takes a large document last runs
        on alone (the first 5 MB of held-out English end in a 126 kB document, 2.5% of the text,
        which the last thread to take a document took alone, and one thread idled meanwhile); so
        the threads end within one small document of each other. Greedy two-thread schedules of
        per-document encode times measured on one thread put the end at 1.023x (warm) and 1.029x
        (cold) the even split in document order, 1.000x large first; on 5 MB of Python code,
        whose large files lie early, both were within 0.2%."""
        cdef Py_ssize_t k, n = self.n_docs
        cdef int64_t big = self.n_bytes // (n_workers * BIG_SHARE)
        cdef vector[cpp_pair[int64_t, Py_ssize_t]] bigs
        for k in range(n):
            if self.sizes[k] > big:
                bigs.push_back(cpp_pair[int64_t, Py_ssize_t](-self.sizes[k], k))
        if bigs.empty():
            return                                  # in order (each thread checks again: O(n))
        cpp_sort(bigs.begin(), bigs.end())          # largest first (equal sizes in order)
        self.order.reserve(n)
        for k in range(<Py_ssize_t>bigs.size()):
            self.order.push_back(bigs[k].second)
        for k in range(n):
            if self.sizes[k] <= big:
                self.order.push_back(k)
        self.ordered = True

    cdef bint _one_run(self, int64_t total):
        """Whether the ids lie in worker 0's buffer in document order from its start (one worker)."""
        cdef Py_ssize_t k
        cdef int64_t at = 0
        for k in range(self.n_docs):
            if self.doc_who[k] != 0 or self.doc_at[k] != at:
                return False
            at += self.doc_n[k]
        return at == total and (<Encoder>self.workers[0]).out_n == total

    cdef void _release_workers(self):
        cdef Encoder enc
        for enc in self.workers:
            enc.out_n = 0
            if enc.out_cap > (1 << 24):     # don't keep a huge buffer alive between calls
                free(enc.out_buf)
                enc.out_buf = NULL
                enc.out_cap = 0
        self.workers = []
        self.keep = None


@cython.final
cdef class _OwnedIds:
    """A malloc'ed uint32 buffer handed over from an encoder (``n`` ids of its ``cap``), given up with
    the last array over it (kept as the spare buffer, or freed: ``_spare_give``)."""
    cdef token_id_t* p
    cdef Py_ssize_t n
    cdef Py_ssize_t cap

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, <void*>self.p, self.n * sizeof(token_id_t), 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __dealloc__(self):
        _spare_give(self.p, self.cap)


cdef object _hand_over(Encoder enc, Py_ssize_t n):
    """The first ``n`` ids of ``enc``'s buffer as a uint32 array that owns the buffer; the encoder
    starts a new buffer (or takes the spare) on its next call. A buffer that may become the spare
    (SPARE_MIN_IDS to SPARE_MAX_IDS) keeps its size (its pages past the ids were never touched, so they
    hold no memory; the next call of that size writes into pages mapped already), another is
    trimmed to ``n``."""
    cdef _OwnedIds owner = _OwnedIds.__new__(_OwnedIds)
    cdef token_id_t* trimmed
    if SPARE_MIN_IDS <= enc.out_cap <= SPARE_MAX_IDS:
        owner.p = enc.out_buf
        owner.cap = enc.out_cap
    else:
        trimmed = <token_id_t*>realloc(enc.out_buf, n * sizeof(token_id_t))
        owner.p = trimmed if trimmed != NULL else enc.out_buf
        owner.cap = n
    owner.n = n
    enc.out_buf = NULL
    enc.out_cap = 0
    enc.out_n = 0
    return np.frombuffer(owner, dtype=np.uint32)
