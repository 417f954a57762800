# _engine.pyx, part 5 of 6 (``include``d: compiled into the module as if written there).
# The MergeEngine class: build (pairs, position lists), lazy heap, merge steps, inspection. (One part: Cython
# allows ``include`` only at module level, not inside a class body.)

# ==== Engine ==================================================================================

def hf_byte_rank():
    """Each byte's rank in HF ``tokenizers``' byte-level alphabet (``tie_break="hf"``): HF numbers its
    initial alphabet in the order of the characters, a byte's character being GPT-2's
    ``bytes_to_unicode`` one (``!``-``~``, ``¡``-``¬``, ``®``-``ÿ`` stand for themselves, the other
    bytes for U+0100 on, in byte order).

    >>> r = hf_byte_rank(); r[ord("!")], r[ord("a")], r[0], r[ord(" ")]
    (0, 64, 188, 220)
    """
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    char = {b: b for b in printable}
    for b in range(256):
        if b not in char:
            char[b] = 256 + len(char) - len(printable)
    rank = [0] * 256
    for i, b in enumerate(sorted(range(256), key=char.__getitem__)):
        rank[b] = i
    return rank


cdef class MergeEngine:
    """Incremental BPE over a word table.

    Args:
        symbols: uint32 token ids of all words, concatenated (C-contiguous), or uint8 bytes (a word
            table's arena, may be memory-mapped: it is read once).
        offsets: int64, ``n_words + 1`` word starts into ``symbols``.
        counts: int64 count of each word.
        tokens: the bytes of every token id that can occur in ``symbols`` (``tokens[i]`` for id
            ``i``); ids 0-255 are normally the single bytes. New ids are appended.
        heap_batch: rare pairs wait outside the heap, about this many are let in at a time.
        spill_dir: a folder for the read-only arrays larger than ``map_threshold`` bytes (None:
            everything stays in RAM).
        map_threshold: see ``spill_dir``.
        fill_buffer_bytes: the memory used to build the mapped position lists: they are written in
            place, into their mapped file, in passes of at most this many bytes of it (a pass's
            pages are dirty page cache until the pass is written back, before the next begins).
        prune_below: forget a new pair (its map entry and positions) that counts less than this when
            the merge that made it is done, so the pair map stays small. Exact only when no merge
            ever makes bytes an existing token has (SuperBPE's ``distinct`` rule) and steps never ask
            for a ``min_count`` below it: then a pair's count never rises after the merge that made
            it, so such a pair can never be merged. 0 (the default): keep every pair.
        prune_spare: with ``prune_below``, ``f(token_bytes) -> bool`` for every token (those given,
            then each new one as it is made): a pair whose left or right token it marks is never
            forgotten (a merge that rebuilds such a token's bytes may make its pairs count more:
            SupraTok's pass 2, ``superbpe.stage2_merges(rebuilds=True)``).
        threads: 2 runs ``run``'s merges of many sites on two threads (one native thread more, while
            ``run`` runs); the result is the same as on one (``_apply_merge``). ``step`` alone always
            uses one. The build counts and lists the windows on two threads too, when there are at
            least ``build_par_min`` of them and their pair ids are kept for the fill (``win_pid``)
            or the tokens are the bytes, and faults in and writes the cells on both (from
            ``build_par_min`` symbols).
        build_par_min: see ``threads`` (tests force 1).
        byte_count_min: a build whose tokens are the bytes (at most 256) and that has at least this
            many windows counts them by byte pair in arrays (no pair map, no window pair ids kept for
            the fill: it looks each window's pair up by its two bytes); the same pairs, ids and lists
            (tests force both sides).
        donate: ``symbols`` (a writable C-contiguous uint32 array) become the engine's cells, written
            in place, instead of being copied: the caller gives the array up (its contents are the
            engine's from then on). Otherwise, or for other symbols, they are copied.
        let_go: ``[offsets, counts]`` (``offsets`` and ``counts`` passed as None): the caller gives the
            two arrays up; the list is emptied at once and they go (when nothing else holds them) once
            the pairs are counted, before the position lists are built, the build's peak (stage 2's
            pieces: 16 bytes a piece less there; the words' counts and ends are in the engine's records
            by then).
        tie_break: among pairs of equal count, ``"bytes"`` (default, CS336): the greatest
            ``(left_bytes, right_bytes)`` wins; ``"hf"`` (HF ``tokenizers``' BpeTrainer): the smallest
            pair of HF ranks, a byte's rank its GPT-2 character's place in the sorted alphabet
            (``hf_byte_rank``), a later token's its id (ids past 255 are given in the order tokens
            are made, HF's order). ``"hf"`` needs ``tokens[:256]`` to be the single bytes.

    >>> import numpy as np
    >>> words = [b"aaa", b"ab"]
    >>> syms = np.frombuffer(b"".join(words), dtype=np.uint8).astype(np.uint32)
    >>> eng = MergeEngine(syms, np.array([0, 3, 5]), np.array([1, 1]), [bytes([i]) for i in range(256)])
    >>> eng.pair_count(97, 97), eng.pair_count(97, 98)
    (2, 1)
    >>> eng.step()            # (a, a) has count 2
    (97, 97, 256)
    >>> eng.word(0), eng.pair_count(97, 97), eng.pair_count(256, 97)
    ([256, 97], 0, 1)
    """

    # positions
    cdef uint32_t* cells                 # per position (see the module docstring): cells_own's, or
    cdef vector[uint32_t] cells_own      # ... the memory of the symbols given up (``donate``)
    cdef object cells_obj
    cdef int64_t n_cells
    cdef vector[uint32_t] blk            # word of position (b << BLK_SHIFT)
    cdef const WordRec* wrec             # per word (in RAM or mapped)
    cdef int64_t n_words
    cdef object _wrec_arr
    # tokens
    cdef vector[uint8_t] tok_arena
    cdef vector[int64_t] tok_off
    cdef vector[int64_t] tok_len
    cdef dict tok_ids                    # bytes -> canonical token id
    # pairs
    cdef _PairMap pair_map
    cdef vector[PairRec] prec            # per pair id: its key and count (the pair map keeps no key)
    # Where each pair may occur (the position of its left symbol): the initial positions as one CSR
    # over the first n_base pairs (in RAM or mapped), later ones in a block of the pool per pair;
    # both may hold stale entries.
    cdef const uint32_t* base
    cdef object _base_arr
    cdef vector[uint64_t] base_start     # n_base + 1 entries
    cdef vector[uint8_t] base_done       # the pair's initial list was consumed (merged)
    cdef uint32_t n_base
    cdef vector[uint64_t] lst_off
    cdef vector[uint32_t] lst_len
    cdef vector[uint8_t] lst_cls
    cdef vector[int8_t] pair_allowed     # -1 unknown, 0 never merge, 1 may merge
    cdef vector[pair_id_t] touched
    cdef NearTable share0                # each thread's share of the merge running (``_apply_merge``)
    cdef NearTable share1
    cdef int threads                     # 2: merges with many sites run on two threads
    cdef pthread_t worker
    cdef bint worker_on
    cdef uint32_t job_posted             # the worker's protocol: a job is posted by raising this,
    cdef uint32_t job_claimed            # taken by the thread that raises this to it first (``_par_wait``),
    cdef uint32_t job_done               # done when the worker sets this to it
    cdef public int64_t n_jobs_taken_back  # the second thread's jobs this thread ran itself (it had not begun)
    cdef uint32_t worker_stop
    cdef pair_id_t job_pid
    cdef int job_kind                    # JOB_SHARE: the second share's sites; JOB_LISTS: its list entries
    cdef public int64_t par_min_sites    # a merge with fewer sites runs on one thread (tests force 1)
    cdef public int64_t par_min_list_sites  # ... a split merge whose second share has fewer sites writes its list
                                         # entries on one thread (``_near_end``; tests force 1)
    cdef public int64_t n_list_jobs      # the merges whose second share's list entries the second thread wrote
    cdef public int64_t par_sites        # the sites of the merges split over both threads, and the larger share's
    cdef public int64_t par_sites_max    # ... (the sum of the two shares' sites at each: the split's balance)
    # The CPU time of the parts of merges run on both threads (ns, each thread's clock, so a loaded
    # machine does not change them): this thread's parts, its waits for the second thread, the second
    # thread's parts, and the longer of the two at each (``par_cpu``: a quiet machine's wall time of
    # the loop is about this thread's CPU time less its parts and waits, plus ``par_crit``)
    cdef public int64_t par_main_ns
    cdef public int64_t par_wait_ns
    cdef public int64_t par_worker_ns
    cdef public int64_t par_crit_ns
    cdef int64_t job_ns                  # (the second thread's time on the job just done)
    cdef readonly bint build_threads     # the build counted and filled its lists on two threads
    cdef readonly bint build_by_bytes    # ... counted its windows by byte pair (``byte_count_min``)
    cdef token_id_t job_tok
    # pool of list blocks
    cdef vector[uint32_t*] pages
    cdef uint64_t pool_top
    cdef uint64_t pool_used                     # entries of the pool's blocks in use (``_pool_compact``)
    cdef public int64_t n_pool_compactions
    cdef public int64_t pool_check_every         # ``run`` looks at the pool every this many merges
    cdef public int64_t trim_every               # ... and trims glibc's heap every this many (0: only
                                                 # when the shares are trimmed)
    cdef public uint64_t pool_min_free           # ... and compacts it when this many bytes, and a
                                                 # quarter of its pages, are free blocks (tests: 1, 0)
    cdef vector[vector[uint64_t]] free_blocks   # per class
    cdef uint64_t big_bytes
    cdef bint oom
    # heap
    cdef vector[HeapEntry] heap
    cdef count_t floor_count           # pairs below it are kept out of the heap (see _pop_best)
    cdef int64_t heap_batch            # about how many pairs are let in at a time
    cdef public int64_t heap_raise_min # the floor is raised once the heap holds this many entries
    cdef uint64_t heap_raise_at        # ... or twice what it held after the last raise
    cdef public int64_t n_raises
    cdef count_t prune_below           # new pairs counting less are forgotten (see __init__)
    cdef vector[uint8_t] spare         # per token id: its pairs are never forgotten (``prune_spare``)
    cdef object spare_fn
    cdef int64_t n_pruned
    cdef vector[pair_id_t] free_pids   # ids of forgotten pairs, given to new ones
    cdef vector[pair_id_t] born        # pairs made in this merge (or the build)
    cdef vector[int64_t] byte_pid      # (the build's fill passes, symbols all bytes) pair id of (a << 8) | b
    cdef vector[int64_t] byte_cur      # ... and each thread's write cursor of (a << 8) | b (``_fill_bytes``)
    cdef public uint32_t n_steps
    cdef public count_t last_count       # the count of the pair the last step merged
    cdef bint halt_existing              # (``run(stop_before_existing=)``) see ``stopped_before``
    cdef public tuple stopped_before     # the pair ``(left_id, right_id)`` whose merge would have
                                         # rebuilt an existing token, when ``run`` stopped before it
    cdef public int64_t n_pops
    cdef public int64_t n_rescans
    cdef public int64_t n_compactions
    cdef uint64_t peak_pool_bytes
    cdef uint64_t peak_heap
    cdef bint tie_hf                   # tie_break "hf": ties to the smallest pair of HF ranks
    cdef uint32_t byte_rank[256]       # ... a byte's HF rank (the rank of a later token is its id)
    cdef public object mapped_bytes
    cdef public object fill_passes
    cdef readonly bint plain           # built from array.array symbols: array.array memory, no numpy
    cdef public dict build_seconds     # the build's parts: name -> (wall s, CPU s of every thread)
    cdef tuple _clock

    def __init__(self, symbols, const int64_t[::1] offsets, const int64_t[::1] counts, tokens,
                 int64_t heap_batch=65536, spill_dir=None, int64_t map_threshold=64 << 20,
                 int64_t fill_buffer_bytes=256 << 20, count_t prune_below=0, int threads=1,
                 int64_t build_par_min=BUILD_PAR_MIN, bint donate=False, str tie_break="bytes",
                 prune_spare=None, int64_t byte_count_min=BYTE_COUNT_MIN, list let_go=None):
        cdef int64_t n_words
        cdef int64_t i, w, n_sym
        cdef const uint8_t[::1] sym8
        cdef const token_id_t[::1] sym32
        cdef token_id_t[::1] given
        cdef WordRec* recs
        cdef const uint8_t[::1] wview
        cdef int64_t lo, hi
        cdef uint8_t spare_it
        if let_go is not None:
            # the offsets and counts given up: held here alone, let go once read for the last time
            if offsets is not None or counts is not None or len(let_go) != 2:
                raise ValueError("let_go: [offsets, counts] in the list, and None for both arguments")
            offsets = let_go[0]
            counts = let_go[1]
            let_go.clear()
        n_words = counts.shape[0]
        self.build_seconds = {}
        self._clock = (_time.perf_counter(), _time.process_time())
        # symbols in an array.array (a small run's table): the engine's own arrays are array.array
        # too, and numpy is never imported
        self.plain = isinstance(symbols, _array.array)
        dtype = None if self.plain else getattr(symbols, "dtype", None)
        is_bytes = (isinstance(symbols, (bytes, bytearray)) or (self.plain and symbols.typecode == "B")
                    or (dtype is not None and dtype == np.uint8))
        if is_bytes:
            sym8 = symbols
            n_sym = sym8.shape[0]
        else:
            sym32 = symbols
            n_sym = sym32.shape[0]
        if offsets.shape[0] != n_words + 1:
            raise ValueError("offsets must have n_words + 1 entries")
        if n_words >= <int64_t>0xFFFFFFFF:
            raise ValueError("too many words for uint32 word ids")
        if n_sym >= <int64_t>0xFFFFFFFF:
            raise ValueError("too many symbols for uint32 positions")
        if offsets[0] != 0 or offsets[n_words] != n_sym:
            raise ValueError("offsets must start at 0 and end at len(symbols)")
        for w in range(n_words):
            if offsets[w + 1] < offsets[w]:
                raise ValueError("offsets must be non-decreasing")
            if offsets[w + 1] - offsets[w] > <int64_t>PAYLOAD:
                raise ValueError(f"word {w} is longer than {PAYLOAD} symbols")
            if counts[w] < 0:
                raise ValueError("counts must be >= 0")
        self.tok_ids = {}
        for tok in tokens:
            self._add_token(tok)
        if prune_spare is not None and prune_below > 0:
            for tok in tokens:
                spare_it = 1 if prune_spare(tok) else 0     # (a plain local: see ``_step_ids``)
                self.spare.push_back(spare_it)
        if tie_break not in ("bytes", "hf"):
            raise ValueError(f"unknown tie_break {tie_break!r} (bytes, hf)")
        self.tie_hf = tie_break == "hf"
        if self.tie_hf:
            if self.tok_off.size() < 256 or any(self.token_bytes(<token_id_t>i) != bytes([i]) for i in range(256)):
                raise ValueError("tie_break 'hf' needs the 256 single bytes as tokens 0-255")
            for i, r in enumerate(hf_byte_rank()):
                self.byte_rank[i] = r
        cdef token_id_t n_tokens = <token_id_t>self.tok_off.size()
        self.n_words = n_words
        self.mapped_bytes = 0
        self.fill_passes = 0
        self.oom = False
        folder = None if spill_dir is None else os.fspath(spill_dir)
        # 1. cells: the symbols, with the word-end bit on the last position of each word; given up
        # (``donate``: a writable uint32 array the caller no longer uses), their own memory
        self.n_cells = n_sym
        donated = (donate and not is_bytes and n_sym > 0 and isinstance(symbols, np.ndarray)
                   and symbols.dtype == np.uint32 and symbols.flags.c_contiguous and symbols.flags.writeable)
        if donated:
            given = symbols
            for i in range(n_sym):
                if given[i] >= n_tokens:
                    raise ValueError(f"symbol {given[i]} has no token bytes")
            self.cells_obj = symbols
            self.cells = &given[0]
        # (two threads: each faults in and writes half of the cells, from ``build_par_min`` symbols)
        cdef bint two_cells = threads >= 2 and n_sym > 0 and n_sym >= build_par_min and _usable_cpus() >= 2
        if not donated:
            self.cells_own.reserve(n_sym)
            with nogil:
                if two_cells:
                    _halves_two(self.cells_own.data(), NULL, n_sym, 0)
                else:
                    _populate(self.cells_own.data(), n_sym * sizeof(uint32_t))
            self.cells_own.resize(n_sym)
            self.cells = self.cells_own.data()
        if is_bytes:
            if n_tokens < 256:
                raise ValueError("byte symbols need the 256 single-byte tokens")
            with nogil:
                if two_cells:
                    _halves_two(self.cells, &sym8[0], n_sym, 1)
                else:
                    for i in range(n_sym):
                        self.cells[i] = sym8[i]
        elif not donated:
            for i in range(n_sym):
                if sym32[i] >= n_tokens:
                    raise ValueError(f"symbol {sym32[i]} has no token bytes")
                self.cells[i] = sym32[i]
        for w in range(n_words):
            if offsets[w + 1] > offsets[w]:
                self.cells[offsets[w + 1] - 1] |= END_BIT
        self._lap("checks, cells")
        # 2. word records (end, count) and the block index
        nbytes = n_words * WORD_RECORD_BYTES
        map_words = folder is not None and nbytes >= map_threshold
        rec_dtype = None if self.plain and not map_words else np.dtype([("count", "<i8"), ("end", "<u4")])
        if rec_dtype is None:          # plain: the records written here, in an array.array's memory
            arr = prefault(array.clone(_U8, nbytes, False))
            recs = <WordRec*>(<array.array>arr).data.as_voidptr
            for w in range(n_words):
                recs[w].count = counts[w]
                recs[w].end = <uint32_t>offsets[w + 1]
            self._wrec_arr = arr
        elif map_words:
            # written in place, into the mapped file (``_SpillMap``), 4 Mi words (48 MiB) at a time
            # (each piece on two threads with the cells)
            assert rec_dtype.itemsize == WORD_RECORD_BYTES
            out = _SpillMap(folder, "words", rec_dtype, n_words)
            try:
                if n_words > 0:
                    wview = out.arr.view(np.uint8)
                    recs = <WordRec*>&wview[0]
                for lo in range(0, n_words, 1 << 22):
                    hi = min(n_words, lo + (1 << 22))
                    with nogil:
                        if two_cells:
                            _records_two(recs, &counts[0], &offsets[0], lo, hi)
                        else:
                            _populate(<void*>(recs + lo), (hi - lo) * sizeof(WordRec))
                            for w in range(lo, hi):
                                recs[w].count = counts[w]
                                recs[w].end = <uint32_t>offsets[w + 1]
                    out.written((hi - lo) * WORD_RECORD_BYTES)
                self._wrec_arr = out.mapped()
            except BaseException:
                out.discard()
                raise
            self.mapped_bytes += nbytes
        else:
            assert rec_dtype.itemsize == WORD_RECORD_BYTES
            arr = prefault(np.empty(n_words, dtype=rec_dtype))
            arr["count"] = np.asarray(counts)
            arr["end"] = np.asarray(offsets[1:])
            self._wrec_arr = arr
        if n_words > 0:
            wview = self._wrec_arr if rec_dtype is None else self._wrec_arr.view(np.uint8)
            self.wrec = <const WordRec*>&wview[0]
        else:
            self.wrec = NULL
        self.blk.resize((n_sym >> BLK_SHIFT) + 1)
        w = 0
        for i in range(<int64_t>self.blk.size()):
            if (i << BLK_SHIFT) >= n_sym:
                self.blk[i] = <uint32_t>w
                continue
            while offsets[w + 1] <= (i << BLK_SHIFT):
                w += 1
            self.blk[i] = <uint32_t>w
        self._lap("words")
        # 3. pairs: count every window, then the initial position lists (a counting sort)
        self.pair_map = _PairMap(1 << 16)
        self.n_steps = 0
        self.last_count = 0
        self.n_pops = 0
        self.n_rescans = 0
        self.n_compactions = 0
        self.pool_top = 0
        self.pool_used = 0
        self.n_pool_compactions = 0
        self.pool_check_every = 256
        self.trim_every = TRIM_EVERY_CHECKS * 256
        self.pool_min_free = POOL_COMPACT_MIN_FREE
        self.big_bytes = 0
        self.peak_pool_bytes = 0
        self.peak_heap = 0
        self.free_blocks.resize(PAGE_BITS + 1)
        self.heap_batch = max(heap_batch, 1)
        self.heap_raise_min = HEAP_RAISE_MIN
        self.heap_raise_at = 0
        self.n_raises = 0
        self.prune_below = max(prune_below, 0)
        self.n_pruned = 0
        self.spare_fn = prune_spare if self.prune_below > 0 else None
        cdef vector[uint64_t] base_len
        # The pair id of every window, kept from the count pass for the fill pass (which then does
        # not hash each window again) while the position lists are small enough to stay in RAM:
        # at most map_threshold bytes more while the engine is built, freed before it returns.
        cdef vector[pair_id_t] win_pid
        cdef int64_t n_windows = 0
        for w in range(n_words):
            if offsets[w + 1] > offsets[w]:
                n_windows += offsets[w + 1] - offsets[w] - 1
        # symbols all bytes: counted by byte pair (``_count_bytes``), the fill looks pairs up by bytes
        cdef bint by_bytes = n_tokens <= 256 and n_windows >= byte_count_min
        self.build_by_bytes = by_bytes
        if n_windows * <int64_t>sizeof(pair_id_t) <= map_threshold and not by_bytes:
            win_pid.reserve(n_windows)
            _populate(win_pid.data(), n_windows * sizeof(pair_id_t))
            win_pid.resize(n_windows)
        # two threads: the build's count and fill give the second thread the words from the one where
        # the second half of the positions starts (none is divided); a merge divides its own sites
        # (``_split_at``)
        self.threads = 1
        self.par_min_sites = PAR_MIN_SITES
        self.par_min_list_sites = PAR_MIN_LIST_SITES
        self.n_list_jobs = 0
        self.n_jobs_taken_back = 0
        self.par_sites = 0
        self.par_sites_max = 0
        self.par_main_ns = self.par_wait_ns = self.par_worker_ns = self.par_crit_ns = 0
        cdef int64_t w_split = n_words
        if threads >= 2 and n_words >= 2 and _usable_cpus() >= 2:
            w_split = int(np.searchsorted(np.asarray(offsets), n_sym // 2))
            w_split = min(max(w_split, 1), n_words - 1)
            self.threads = 2
        # with the window pair ids in RAM, or (mapped lists: the pair of a window is looked up again in
        # each fill pass) when the symbols are bytes, whose pairs are few (the second half's own pair
        # table then has room for all of them from the start: see below)
        cdef uint64_t few_pairs = <uint64_t>n_tokens * n_tokens
        self.build_threads = (self.threads == 2 and n_windows >= build_par_min
                              and (win_pid.size() > 0 or few_pairs <= BUILD_FEW_PAIRS))
        cdef HalfCount half
        cdef _PairMap local_map
        cdef vector[pair_key_t] half_keys
        cdef vector[count_t] half_counts
        cdef vector[uint64_t] half_lens
        cdef vector[uint64_t] len_first
        cdef vector[pair_id_t] remap
        cdef vector[count_t] bcnt, bcnt2
        cdef vector[uint64_t] blens, blens2
        cdef vector[int64_t] bfirst, bfirst2
        if by_bytes:
            bcnt.assign(1 << 16, 0)
            blens.assign(1 << 16, 0)
            bfirst.assign(1 << 16, -1)
            if self.build_threads:      # (the second thread's arrays made here: it never allocates)
                bcnt2.assign(1 << 16, 0)
                blens2.assign(1 << 16, 0)
                bfirst2.assign(1 << 16, -1)
                half.engine = <void*>self
                half.w_lo = w_split
                half.w_hi = n_words
                half.bcnt = bcnt2.data()
                half.blens = blens2.data()
                half.bfirst = bfirst2.data()
                half.stage = 3
            with nogil:
                if self.build_threads:
                    self._count_bytes_two(&half, w_split, bcnt.data(), blens.data(), bfirst.data())
                    self._join_bytes(base_len, bcnt.data(), blens.data(), bfirst.data(), bcnt2.data(),
                                     blens2.data(), bfirst2.data(), len_first)
                else:
                    self._count_bytes(0, n_words, bcnt.data(), blens.data(), bfirst.data())
                    self._join_bytes(base_len, bcnt.data(), blens.data(), bfirst.data(), NULL, NULL, NULL,
                                     len_first)
        elif self.build_threads:
            if few_pairs <= BUILD_FEW_PAIRS:
                # every pair the second half can meet has room, made here: the second thread never
                # allocates (no glibc arena of its own; see ``_share_reserve``)
                local_map = _PairMap(few_pairs)
                half_keys.reserve(few_pairs)
                half_counts.reserve(few_pairs)
                half_lens.reserve(few_pairs)
            else:
                local_map = _PairMap(1 << 16)
            half.engine = <void*>self
            half.w_lo = w_split
            half.w_hi = n_words
            half.n_win = 0
            for w in range(w_split, n_words):
                if offsets[w + 1] > offsets[w]:
                    half.n_win += offsets[w + 1] - offsets[w] - 1
            half.win_pid = win_pid.data() + (n_windows - half.n_win) if win_pid.size() > 0 else NULL
            half.local_map = <void*>local_map
            half.keys = &half_keys
            half.counts = &half_counts
            half.lens = &half_lens
            half.stage = 0
            with nogil:
                self._count_two(base_len, win_pid.data() if win_pid.size() > 0 else NULL, w_split, &half,
                                len_first, remap)
        else:
            with nogil:
                self._count_range(base_len, win_pid.data() if win_pid.size() > 0 else NULL, 0, n_words)
        with nogil:
            self._touch_all()
            if n_tokens <= 256 and win_pid.size() == 0:
                self._byte_pairs()
        self._lap("count")
        if let_go is not None:
            # (read for the last time above: the position lists, the build's peak, reuse their memory)
            offsets = None
            counts = None
        self._build_base(base_len, folder, map_threshold, fill_buffer_bytes,
                         win_pid.data() if win_pid.size() > 0 else NULL,
                         &half if self.build_threads else NULL, len_first, remap)
        self._lap("lists")
        win_pid.clear()
        win_pid.shrink_to_fit()
        self.byte_pid.clear()
        self.byte_pid.shrink_to_fit()
        self.byte_cur.clear()
        self.byte_cur.shrink_to_fit()
        with nogil:
            self._build_heap()
        self._lap("heap")

    cdef _lap(self, str name):
        """Time the build's part ``name`` (``build_seconds``), from the previous lap."""
        cdef tuple now = (_time.perf_counter(), _time.process_time())
        cdef tuple was = self.build_seconds.get(name, (0.0, 0.0))      # (a part of each fill pass: summed)
        self.build_seconds[name] = (round(was[0] + now[0] - self._clock[0], 4),
                                    round(was[1] + now[1] - self._clock[1], 4))
        self._clock = now

    def __dealloc__(self):
        cdef size_t p, k
        cdef uint64_t off
        for p in range(self.pages.size()):
            _page_free(self.pages[p])
        for p in range(self.lst_off.size()):
            if self.lst_cls[p] != NO_LIST and self.lst_cls[p] > PAGE_BITS:
                off = self.lst_off[p]
                free(<void*>(off & ~BIG_FLAG))

    # ---- tokens --------------------------------------------------------------------------------

    cdef token_id_t _add_token(self, bytes tok) except? 0xFFFFFFFF:
        cdef token_id_t new_id = <token_id_t>self.tok_off.size()
        cdef Py_ssize_t k
        cdef const uint8_t* p = <const uint8_t*><char*>tok
        if new_id >= PAYLOAD:
            raise ValueError(f"too many tokens (at most {PAYLOAD})")
        self.tok_off.push_back(self.tok_arena.size())
        self.tok_len.push_back(len(tok))
        for k in range(len(tok)):
            self.tok_arena.push_back(p[k])
        if tok not in self.tok_ids:
            self.tok_ids[tok] = new_id
        return new_id

    cpdef bytes token_bytes(self, token_id_t tok):
        """The bytes of a token id."""
        if tok >= self.tok_off.size():
            raise IndexError(tok)
        return PyBytes_FromStringAndSize(<char*>&self.tok_arena[self.tok_off[tok]], self.tok_len[tok])

    @property
    def n_tokens(self):
        return self.tok_off.size()

    # ---- positions -----------------------------------------------------------------------------

    cdef inline uint32_t _span(self, uint32_t i) noexcept nogil:
        """Length in positions of the live token at ``i``."""
        cdef uint32_t c
        if self.cells[i] & END_BIT:
            return 1
        c = self.cells[i + 1]
        if c & DEAD_BIT:
            return c & PAYLOAD
        return 1

    cdef inline uint32_t _nxt(self, uint32_t i) noexcept nogil:
        """The next live position of ``i``'s word, or NIL."""
        cdef uint32_t e = i + self._span(i) - 1
        if self.cells[e] & END_BIT:
            return NIL
        return e + 1

    cdef inline uint32_t _prv(self, uint32_t i) noexcept nogil:
        """The previous live position of ``i``'s word, or NIL."""
        cdef uint32_t c
        if i == 0:
            return NIL
        c = self.cells[i - 1]
        if c & END_BIT:
            return NIL
        if c & DEAD_BIT:
            return i - (c & PAYLOAD)
        return i - 1

    cdef inline count_t _word_count(self, uint32_t i) noexcept nogil:
        """The count of the word holding position ``i``."""
        cdef uint32_t w = self.blk[i >> BLK_SHIFT]
        while self.wrec[w].end <= i:
            w += 1
        return self.wrec[w].count

    cdef inline int64_t _word_start(self, int64_t w) noexcept nogil:
        return 0 if w == 0 else self.wrec[w - 1].end

    cdef inline bint _holds(self, uint32_t i, token_id_t a, token_id_t b) noexcept nogil:
        """The window at ``i`` is the pair ``(a, b)`` now."""
        cdef uint32_t c = self.cells[i], j
        if (c & DEAD_BIT) or (c & PAYLOAD) != a:
            return False
        j = self._nxt(i)
        return j != NIL and (self.cells[j] & PAYLOAD) == b

    # ---- position lists ------------------------------------------------------------------------

    cdef inline uint32_t* _block(self, uint64_t off) noexcept nogil:
        if off & BIG_FLAG:
            return <uint32_t*>(off & ~BIG_FLAG)
        return self.pages[off >> PAGE_BITS] + (off & (PAGE_SIZE - 1))

    cdef uint64_t _pool_bytes(self) noexcept nogil:
        return self.pages.size() * PAGE_SIZE * 4 + self.big_bytes

    cdef uint64_t _alloc(self, uint8_t cls) noexcept nogil:
        """A block of 2**cls entries (0 when out of memory)."""
        cdef uint64_t size = (<uint64_t>1) << cls, off, rest, piece
        cdef uint32_t* page
        cdef uint8_t c
        cdef void* big
        if cls > PAGE_BITS:
            big = malloc(size * 4)
            if big == NULL:
                self.oom = True
                return 0
            self.big_bytes += size * 4
            return (<uint64_t>big) | BIG_FLAG
        self.pool_used += size
        if self.free_blocks[cls].size() > 0:
            off = self.free_blocks[cls].back()
            self.free_blocks[cls].pop_back()
            return off
        c = cls + 1                  # split a larger free block: the halves not used are freed
        while c <= PAGE_BITS and self.free_blocks[c].size() == 0:
            c += 1
        if c <= PAGE_BITS:
            off = self.free_blocks[c].back()
            self.free_blocks[c].pop_back()
            while c > cls:
                c -= 1
                self.free_blocks[c].push_back(off + ((<uint64_t>1) << c))
            return off
        if self.pages.size() == 0 or (self.pool_top & (PAGE_SIZE - 1)) + size > PAGE_SIZE or \
                (self.pool_top >> PAGE_BITS) >= self.pages.size():
            # the rest of the current page goes to the free lists, in power-of-two pieces
            if self.pages.size() > 0 and (self.pool_top >> PAGE_BITS) < self.pages.size():
                rest = PAGE_SIZE - (self.pool_top & (PAGE_SIZE - 1))
                c = PAGE_BITS
                while rest > 0:
                    piece = (<uint64_t>1) << c
                    if piece <= rest:
                        self.free_blocks[c].push_back(self.pool_top)
                        self.pool_top += piece
                        rest -= piece
                    else:
                        c -= 1
            page = _page_new()
            if page == NULL:
                self.oom = True
                self.pool_used -= size
                return 0
            self.pages.push_back(page)
            self.pool_top = (<uint64_t>(self.pages.size() - 1)) << PAGE_BITS
            if self._pool_bytes() > self.peak_pool_bytes:
                self.peak_pool_bytes = self._pool_bytes()
        off = self.pool_top
        self.pool_top += size
        return off

    cdef void _release(self, uint64_t off, uint8_t cls) noexcept nogil:
        if cls > PAGE_BITS:
            free(<void*>(off & ~BIG_FLAG))
            self.big_bytes -= ((<uint64_t>1) << cls) * 4
        else:
            self.free_blocks[cls].push_back(off)
            self.pool_used -= (<uint64_t>1) << cls

    cdef uint32_t _compact(self, pair_id_t pid) noexcept nogil:
        """Drop the stale entries of a pair's added list; return its new length."""
        cdef token_id_t a = pair_left(self.prec[pid].key), b = pair_right(self.prec[pid].key)
        cdef uint32_t* p = self._block(self.lst_off[pid])
        cdef uint32_t n = self.lst_len[pid], q, kept = 0
        for q in range(n):
            if q + PREFETCH < n:            # each entry's cells are a cache miss: asked for ahead
                __builtin_prefetch(&self.cells[p[q + PREFETCH]])
            if self._holds(p[q], a, b):
                p[kept] = p[q]
                kept += 1
        self.lst_len[pid] = kept
        self.n_compactions += 1
        return kept

    cdef uint32_t _list_room(self, pair_id_t pid, uint32_t k) noexcept nogil:
        """Room for ``k`` more entries in a pair's list; return where they go (its length before) and
        count them in its length (the caller writes them). A list without room drops its stale
        entries first (a block of ``2**MIN_COMPACT_CLS`` entries or more), then, when they still do
        not fit, moves to the smallest block that holds them all (one move per merge, not one at
        each power of two; a list's new entries are nearly all live). Sets ``oom`` (and returns 0) when out
        of memory."""
        cdef uint8_t cls = self.lst_cls[pid], new_cls
        cdef uint32_t n = 0
        cdef uint64_t off
        if cls != NO_LIST:
            n = self.lst_len[pid]
            if <uint64_t>n + k > ((<uint64_t>1) << cls):
                if cls >= MIN_COMPACT_CLS:
                    n = self._compact(pid)
        if cls == NO_LIST or <uint64_t>n + k > ((<uint64_t>1) << cls):
            new_cls = _fit_cls(n + k)
            off = self._alloc(new_cls)
            if self.oom:
                return 0
            if cls != NO_LIST:
                if n > 0:
                    memcpy(self._block(off), self._block(self.lst_off[pid]), n * 4)
                self._release(self.lst_off[pid], cls)
            self.lst_off[pid] = off
            self.lst_cls[pid] = new_cls
            if self._pool_bytes() > self.peak_pool_bytes:
                self.peak_pool_bytes = self._pool_bytes()
        self.lst_len[pid] = n + k
        return n

    cdef void _list_free(self, pair_id_t pid) noexcept nogil:
        if self.lst_cls[pid] != NO_LIST:
            self._release(self.lst_off[pid], self.lst_cls[pid])
            self.lst_cls[pid] = NO_LIST
            self.lst_len[pid] = 0

    # ---- pairs ---------------------------------------------------------------------------------

    cdef inline const pair_key_t* _keys(self) noexcept nogil:
        """The keys by pair id for the pair map (``keys[2 * pid]``: the first field of ``prec[pid]``)."""
        return <const pair_key_t*>self.prec.data()

    cdef inline pair_id_t _pair_id(self, token_id_t left, token_id_t right) noexcept nogil:
        """The id of a pair, created (count 0, no positions) when new."""
        cdef pair_key_t key = pack_pair(left, right)
        cdef int64_t found = self.pair_map.get(key, self._keys(), 2)
        if found >= 0:
            return <pair_id_t>found
        return self._new_pair(key)

    cdef pair_id_t _new_pair(self, pair_key_t key) noexcept nogil:
        """A pair not in the pair map yet: its id (a forgotten pair's, or the next), count 0, no
        positions."""
        cdef pair_id_t pid
        if self.free_pids.size() > 0:        # the id of a forgotten pair (prune_below)
            pid = self.free_pids.back()
            self.free_pids.pop_back()
            self.pair_map.put(key, pid, self._keys(), 2)
            self.prec[pid].key = key
            self.prec[pid].count = 0
            self.lst_off[pid] = 0
            self.lst_len[pid] = 0
            self.lst_cls[pid] = NO_LIST
            self.pair_allowed[pid] = -1
            self.born.push_back(pid)
            return pid
        cdef PairRec rec
        pid = <pair_id_t>self.prec.size()
        self.born.push_back(pid)
        if self.prec.size() == self.prec.capacity():
            self._reserve_pairs(self.prec.size() + self.prec.size() // 4 + 1024)
        self.pair_map.put(key, pid, self._keys(), 2)
        rec.key = key
        rec.count = 0
        self.prec.push_back(rec)
        self.lst_off.push_back(0)
        self.lst_len.push_back(0)
        self.lst_cls.push_back(NO_LIST)
        self.pair_allowed.push_back(-1)
        return pid

    cdef void _reserve_pairs(self, size_t n) noexcept nogil:
        """Grow the per-pair arrays by a quarter at a time (not doubled: they are the largest after
        the cells, and a doubling would leave up to half of them unused)."""
        self.prec.reserve(n)
        self.lst_off.reserve(n)
        self.lst_len.reserve(n)
        self.lst_cls.reserve(n)
        self.pair_allowed.reserve(n)

    cdef void _count_range(self, vector[uint64_t]& base_len, pair_id_t* win_pid, int64_t w_lo,
                           int64_t w_hi) noexcept nogil:
        """Count every window of words ``w_lo:w_hi`` once (its pair and how many windows each pair
        has); with ``win_pid``, write each window's pair id there, in position order."""
        cdef int64_t w, k, start, end
        cdef count_t c
        cdef pair_id_t pid
        cdef int64_t n = 0
        for w in range(w_lo, w_hi):
            c = self.wrec[w].count
            start = self._word_start(w)
            end = self.wrec[w].end
            for k in range(start, end - 1):
                if k + PREFETCH + 1 < end:        # the map slot of a window ahead (a hint only)
                    self.pair_map.prefetch(pack_pair(self.cells[k + PREFETCH] & PAYLOAD,
                                                     self.cells[k + PREFETCH + 1] & PAYLOAD))
                pid = self._pair_id(self.cells[k] & PAYLOAD, self.cells[k + 1] & PAYLOAD)
                if win_pid != NULL:
                    win_pid[n] = pid
                    n += 1
                self.prec[pid].count += c
                if pid >= base_len.size():
                    base_len.resize(pid + 1, 0)
                base_len[pid] += 1

    cdef void _touch_all(self) noexcept nogil:
        cdef size_t p
        for p in range(self.prec.size()):
            self.touched.push_back(<pair_id_t>p)

    cdef void _count_half(self, HalfCount* h) noexcept nogil:
        """The second thread's count (``_count_range`` on its own pair table, ``h``): local pair ids
        in the order first seen, each window's local id in ``h.win_pid`` (when kept)."""
        cdef int64_t w, k, start, end, found
        cdef count_t c
        cdef pair_key_t key
        cdef pair_id_t lid
        cdef int64_t n = 0
        for w in range(h.w_lo, h.w_hi):
            c = self.wrec[w].count
            start = self._word_start(w)
            end = self.wrec[w].end
            for k in range(start, end - 1):
                if k + PREFETCH + 1 < end:
                    (<_PairMap>h.local_map).prefetch(pack_pair(self.cells[k + PREFETCH] & PAYLOAD,
                                                               self.cells[k + PREFETCH + 1] & PAYLOAD))
                key = pack_pair(self.cells[k] & PAYLOAD, self.cells[k + 1] & PAYLOAD)
                found = (<_PairMap>h.local_map).get(key, h.keys.data(), 1)
                if found < 0:
                    lid = <pair_id_t>h.keys.size()
                    (<_PairMap>h.local_map).put(key, lid, h.keys.data(), 1)
                    h.keys.push_back(key)
                    h.counts.push_back(0)
                    h.lens.push_back(0)
                else:
                    lid = <pair_id_t>found
                if h.win_pid != NULL:
                    h.win_pid[n] = lid
                    n += 1
                h.counts[0][lid] += c
                h.lens[0][lid] += 1

    cdef void _count_two(self, vector[uint64_t]& base_len, pair_id_t* win_pid, int64_t w_split, HalfCount* h,
                         vector[uint64_t]& len_first, vector[pair_id_t]& remap) noexcept nogil:
        """The count on two threads: words ``:w_split`` here into the engine's pairs, the rest on a
        native thread into pairs of its own (``_count_half``); then those join the engine's in the
        order they were first seen, so every pair gets the id, count and windows one thread would
        give it (pairs are numbered as first seen in position order). ``len_first``: each pair's
        windows in the first half; ``remap``: the second half's local ids to pair ids."""
        cdef pthread_t t
        cdef bint started = bpe_thread_start(&t, <bpe_thread_fn>_half_main, <void*>h) == 0
        cdef size_t l
        cdef pair_id_t pid
        self._count_range(base_len, win_pid, 0, w_split)
        if started:
            pthread_join(t, NULL)
        else:
            self._count_half(h)
        len_first = base_len
        remap.resize(h.keys.size())
        for l in range(h.keys.size()):
            pid = self._pair_id(pair_left(h.keys[0][l]), pair_right(h.keys[0][l]))
            remap[l] = pid
            self.prec[pid].count += h.counts[0][l]
            if pid >= base_len.size():
                base_len.resize(pid + 1, 0)
            base_len[pid] += h.lens[0][l]
        len_first.resize(base_len.size(), 0)

    cdef void _count_bytes(self, int64_t w_lo, int64_t w_hi, count_t* cnt, uint64_t* lens,
                           int64_t* first) noexcept nogil:
        """``_count_range`` for symbols that are all bytes (tokens < 256), by byte pair
        ``x = (left << 8) | right`` in arrays of 65,536: ``cnt[x]`` its count, ``lens[x]`` its windows
        and ``first[x]`` its first window's position (-1: none) in words ``w_lo:w_hi`` (no pair map:
        ``_join_bytes`` gives the pairs their ids)."""
        cdef int64_t w, k, start, end
        cdef count_t c
        cdef uint32_t x, left
        for w in range(w_lo, w_hi):
            start = self._word_start(w)
            end = self.wrec[w].end
            if end - start < 2:
                continue
            c = self.wrec[w].count
            left = self.cells[start] & PAYLOAD
            for k in range(start, end - 1):
                x = (left << 8) | (self.cells[k + 1] & PAYLOAD)
                left = x & 0xFF
                cnt[x] += c
                lens[x] += 1
                if first[x] < 0:
                    first[x] = k

    cdef void _count_bytes_two(self, HalfCount* h, int64_t w_split, count_t* cnt, uint64_t* lens,
                               int64_t* first) noexcept nogil:
        """``_count_bytes`` on two threads: words ``:w_split`` here, the rest (``h``, its own arrays)
        on a native thread (here after them when none starts)."""
        cdef pthread_t t
        cdef bint started = bpe_thread_start(&t, <bpe_thread_fn>_half_main, <void*>h) == 0
        self._count_bytes(0, w_split, cnt, lens, first)
        if started:
            pthread_join(t, NULL)
        else:
            self._count_bytes(h.w_lo, h.w_hi, h.bcnt, h.blens, h.bfirst)

    cdef void _join_bytes(self, vector[uint64_t]& base_len, const count_t* cnt, const uint64_t* lens,
                          const int64_t* first, const count_t* cnt2, const uint64_t* lens2,
                          const int64_t* first2, vector[uint64_t]& len_first) noexcept nogil:
        """The pairs ``_count_bytes`` counted (and, unless NULL, those it counted in the words after
        them: ``cnt2``, ``lens2``, ``first2``) as the engine's pairs, numbered as one thread's
        ``_count_range`` numbers them (in the order first seen, by position), with their counts and
        windows (``base_len``; ``len_first``: the windows in the first words)."""
        cdef vector[uint64_t] order         # (first position << 16) | x, sorted: the order first seen
        cdef uint64_t x
        cdef int64_t f
        cdef size_t i
        cdef pair_id_t pid
        for x in range(1 << 16):
            f = first[x]
            if f < 0 and first2 != NULL:
                f = first2[x]
            if f >= 0:
                order.push_back((<uint64_t>f << 16) | x)
        sort(order.begin(), order.end())
        base_len.assign(order.size(), 0)
        len_first.assign(order.size(), 0)
        for i in range(order.size()):
            x = order[i] & 0xFFFF
            pid = self._pair_id(<token_id_t>(x >> 8), <token_id_t>(x & 0xFF))
            self.prec[pid].count += cnt[x] + (cnt2[x] if cnt2 != NULL else 0)
            base_len[pid] += lens[x] + (lens2[x] if lens2 != NULL else 0)
            len_first[pid] += lens[x]

    cdef void _byte_pairs(self) noexcept nogil:
        """The pair ids of the 65,536 byte pairs (-1: absent) as the pair map has them now, for the
        fill passes of a build whose symbols are all bytes: an index into 512 KiB that stays in the
        CPU's cache instead of a hashed lookup per window and pass."""
        cdef uint32_t x
        self.byte_pid.resize(1 << 16)
        for x in range(1 << 16):
            self.byte_pid[x] = self.pair_map.get(pack_pair(x >> 8, x & 0xFF), self._keys(), 2)
        self.byte_cur.resize(2 << 16)       # (``_fill_bytes``: each thread's write cursors)

    cdef void _fill_pass(self, uint32_t lo, uint32_t hi, uint32_t* buf, uint64_t* fill, int64_t w_lo,
                         int64_t w_hi, const uint64_t* first) noexcept nogil:
        """Write the positions of the windows of pairs ``lo <= pid < hi`` in words ``w_lo:w_hi`` into
        ``buf`` (the CSR slice from ``base_start[lo]``), in position order; ``first``: each pair's
        windows before word ``w_lo`` (the second half of a two-thread pass), written by the other
        thread. The pair map is only read."""
        cdef int64_t w, k, start, end
        cdef int64_t pid
        cdef uint64_t b0 = self.base_start[lo], at
        cdef const int64_t* direct = self.byte_pid.data() if self.byte_pid.size() > 0 else NULL
        if direct != NULL:
            self._fill_bytes(lo, hi, buf, w_lo, w_hi, first)
            return
        for w in range(w_lo, w_hi):
            start = self._word_start(w)
            end = self.wrec[w].end
            for k in range(start, end - 1):
                if direct != NULL:       # (symbols all bytes: ``_byte_pairs``)
                    pid = direct[((self.cells[k] & PAYLOAD) << 8) | (self.cells[k + 1] & PAYLOAD)]
                else:
                    pid = self.pair_map.get(pack_pair(self.cells[k] & PAYLOAD, self.cells[k + 1] & PAYLOAD), self._keys(), 2)
                if pid >= lo and pid < hi:
                    at = self.base_start[pid] - b0 + fill[pid - lo]
                    if first != NULL:
                        at += first[pid]
                    buf[at] = <uint32_t>k
                    fill[pid - lo] += 1

    cdef void _fill_bytes(self, uint32_t lo, uint32_t hi, uint32_t* buf, int64_t w_lo, int64_t w_hi,
                          const uint64_t* first) noexcept nogil:
        """``_fill_pass`` for symbols all bytes (``_byte_pairs``): a write cursor per byte pair
        (``byte_cur``: the first thread's 65,536, then the second's), -1 for a pair outside the pass."""
        cdef int64_t w, k, start, end, pid, at
        cdef uint32_t x, left
        cdef uint64_t b0 = self.base_start[lo]
        cdef int64_t* cur = self.byte_cur.data() + (0 if first == NULL else (1 << 16))
        for x in range(1 << 16):
            pid = self.byte_pid[x]
            if pid >= lo and pid < hi:
                cur[x] = <int64_t>(self.base_start[pid] - b0 + (first[pid] if first != NULL else 0))
            else:
                cur[x] = -1
        for w in range(w_lo, w_hi):
            start = self._word_start(w)
            end = self.wrec[w].end
            if end - start < 2:
                continue
            left = self.cells[start] & PAYLOAD
            for k in range(start, end - 1):
                x = (left << 8) | (self.cells[k + 1] & PAYLOAD)
                left = x & 0xFF
                at = cur[x]
                if at >= 0:
                    buf[at] = <uint32_t>k
                    cur[x] = at + 1

    cdef void _fill_pass_two(self, uint32_t lo, uint32_t hi, uint32_t* buf, uint64_t* fill, HalfCount* h,
                             vector[uint64_t]& len_first) noexcept nogil:
        """``_fill_pass`` on two threads: the first half's words here, the second half's (``h``) on a
        native thread after them in each pair's list: the lists one thread writes."""
        cdef pthread_t t
        cdef bint started
        h.fill.assign(hi - lo, 0)              # (room made before the first pass: no allocation)
        h.stage = 2
        h.lo = lo
        h.hi = hi
        h.first = len_first.data()
        h.buf = buf
        started = bpe_thread_start(&t, <bpe_thread_fn>_half_main, <void*>h) == 0
        self._fill_pass(lo, hi, buf, fill, 0, h.w_lo, NULL)
        if started:
            pthread_join(t, NULL)
        else:
            self._fill_pass_half(h)

    cdef void _fill_pass_half(self, HalfCount* h) noexcept nogil:
        self._fill_pass(h.lo, h.hi, h.buf, h.fill.data(), h.w_lo, h.w_hi, h.first)

    cdef void _fill_cached(self, const pair_id_t* win_pid, int64_t n_win, uint32_t* buf,
                           uint64_t* fill, int64_t w_lo, int64_t w_hi, const pair_id_t* remap,
                           const uint64_t* first) noexcept nogil:
        """``_fill_pass`` over all pairs with the pair ids the count pass kept (no hashing), for the
        windows of words ``w_lo:w_hi``; ``remap``: ``win_pid`` holds local ids (the second half of a
        two-thread build), ``first``: each pair's windows before this half in its list."""
        cdef int64_t w, k, start, end
        cdef int64_t n = 0
        cdef pair_id_t pid
        cdef pair_id_t ahead
        cdef uint64_t at
        for w in range(w_lo, w_hi):
            start = self._word_start(w)
            end = self.wrec[w].end
            for k in range(start, end - 1):
                if n + 16 < n_win:       # where a window ahead will be written (a hint only)
                    ahead = win_pid[n + 16]
                    if remap != NULL:
                        ahead = remap[ahead]
                    at = self.base_start[ahead] + fill[ahead]
                    if first != NULL:
                        at += first[ahead]
                    __builtin_prefetch(&buf[at])
                pid = win_pid[n]
                n += 1
                if remap != NULL:
                    pid = remap[pid]
                at = self.base_start[pid] + fill[pid]
                if first != NULL:
                    at += first[pid]
                buf[at] = <uint32_t>k
                fill[pid] += 1

    cdef void _fill_half(self, HalfCount* h) noexcept nogil:
        self._fill_cached(h.win_pid, h.n_win, h.buf, h.fill.data(), h.w_lo, h.w_hi, h.remap, h.first)

    cdef void _fill_two(self, const pair_id_t* win_pid, int64_t n_win, uint32_t* buf, vector[uint64_t]& fill,
                        HalfCount* h, vector[uint64_t]& len_first, vector[pair_id_t]& remap) noexcept nogil:
        """The fill on two threads: the first half's windows here from the start of each pair's
        list, the second half's on a native thread after them (``len_first``): the lists one thread
        writes, in position order."""
        cdef pthread_t t
        cdef vector[uint64_t] fill2
        cdef bint started
        fill2.assign(fill.size(), 0)
        h.stage = 1
        h.remap = remap.data()
        h.first = len_first.data()
        h.buf = buf
        h.fill = &fill2
        started = bpe_thread_start(&t, <bpe_thread_fn>_half_main, <void*>h) == 0
        self._fill_cached(win_pid, n_win - h.n_win, buf, fill.data(), 0, h.w_lo, NULL, NULL)
        if started:
            pthread_join(t, NULL)
        else:
            self._fill_half(h)

    cdef _build_base(self, vector[uint64_t]& base_len, folder, int64_t map_threshold,
                     int64_t fill_buffer_bytes, const pair_id_t* win_pid, HalfCount* half,
                     vector[uint64_t]& len_first, vector[pair_id_t]& remap):
        """The initial position lists: one CSR, in RAM, or in a mapped file written in passes."""
        cdef uint64_t total = 0, p, n_base = base_len.size()
        cdef uint32_t lo, hi
        cdef uint32_t[::1] bview
        cdef vector[uint64_t] fill, fill2
        self.n_base = <uint32_t>n_base
        self.base_start.resize(n_base + 1)
        self.base_done.assign(n_base, 0)
        for p in range(n_base):
            self.base_start[p] = total
            total += base_len[p]
        self.base_start[n_base] = total
        cdef uint64_t largest = 0
        for p in range(n_base):
            if base_len[p] > largest:
                largest = base_len[p]
        cdef uint64_t b0, b1
        if folder is not None and total * 4 >= <uint64_t>map_threshold:
            cap = max(<uint64_t>fill_buffer_bytes // 4, largest, 1)
            # The lists are written in place, into the mapped file itself (``_SpillMap``: no buffer
            # copied to the file), a pass at a time: the pass's part of the file (at most ``cap``
            # entries, the plan's fill buffer) is faulted in at once (not a fault per page at the
            # scattered first writes), filled, and on disk (clean) before the next pass begins.
            out = _SpillMap(folder, "positions", np.uint32, total)
            if total > 0:
                bview = out.arr
            self._lap("fill buffer")
            if half != NULL:
                fill2.reserve(n_base)
                half.fill = &fill2
            try:
                lo = 0
                while lo < n_base:
                    hi = lo
                    while hi < n_base and self.base_start[hi + 1] - self.base_start[lo] <= cap:
                        hi += 1
                    b0, b1 = self.base_start[lo], self.base_start[hi]
                    fill.assign(hi - lo, 0)
                    with nogil:
                        if b1 > b0 and self.threads == 2:
                            _halves_two(&bview[b0], NULL, b1 - b0, 0)
                        elif b1 > b0:
                            _populate(&bview[b0], (b1 - b0) * sizeof(uint32_t))
                    self._lap("fault in")
                    with nogil:
                        if b1 == b0:
                            pass
                        elif half != NULL:
                            self._fill_pass_two(lo, hi, &bview[b0], fill.data(), half, len_first)
                        else:
                            self._fill_pass(lo, hi, &bview[b0], fill.data(), 0, self.n_words, NULL)
                    self._lap("fill")
                    out.written((b1 - b0) * 4)
                    if hi < n_base:
                        out.clean()          # (one pass's part dirty at a time)
                    self._lap("write")
                    self.fill_passes += 1
                    lo = hi
                self._base_arr = out.mapped()
                self._lap("sync")
            except BaseException:
                out.discard()
                raise
            self.mapped_bytes += total * 4
        else:
            self._base_arr = prefault(array.clone(_U32, total, False) if self.plain else
                                      np.empty(total, dtype=np.uint32))
            if total > 0:
                bview = self._base_arr
                fill.assign(n_base, 0)
                with nogil:
                    if half != NULL and win_pid != NULL:
                        self._fill_two(win_pid, <int64_t>total, &bview[0], fill, half, len_first, remap)
                    elif half != NULL:
                        fill2.reserve(n_base)
                        half.fill = &fill2
                        self._fill_pass_two(0, <uint32_t>n_base, &bview[0], fill.data(), half, len_first)
                    elif win_pid != NULL:
                        self._fill_cached(win_pid, <int64_t>total, &bview[0], fill.data(), 0, self.n_words,
                                          NULL, NULL)
                    else:
                        self._fill_pass(0, <uint32_t>n_base, &bview[0], fill.data(), 0, self.n_words, NULL)
            self.fill_passes = 1
        cdef const uint32_t[::1] rview
        if total > 0:
            rview = self._base_arr
            self.base = &rview[0]
        else:
            self.base = NULL

    def pair_count(self, token_id_t left, token_id_t right):
        """The current count of a pair (0 when never seen)."""
        cdef int64_t pid = self.pair_map.get(pack_pair(left, right), self._keys(), 2)
        return 0 if pid < 0 else self.prec[pid].count

    def pair_counts_dict(self):
        """All pairs with a positive count, as ``{(left, right): count}`` (for tests)."""
        cdef size_t i
        out = {}
        for i in range(self.prec.size()):
            if self.prec[i].count > 0:
                out[(pair_left(self.prec[i].key), pair_right(self.prec[i].key))] = self.prec[i].count
        return out

    def build_lists(self):
        """The pairs in the order the build numbered them, each with its count and its initial
        position list: ``[((left, right), count, [positions])]`` (for tests: a build on two threads
        numbers, counts and lists the pairs as one thread does). Before any merge only."""
        cdef size_t p
        cdef uint64_t q
        if self.n_steps:
            raise ValueError("build_lists: the engine has merged since it was built")
        return [((pair_left(self.prec[p].key), pair_right(self.prec[p].key)), self.prec[p].count,
                 [self.base[q] for q in range(self.base_start[p], self.base_start[p + 1])])
                for p in range(self.n_base)]

    # ---- heap ----------------------------------------------------------------------------------

    cdef inline int _cmp_bytes(self, token_id_t a, token_id_t b) noexcept nogil:
        """memcmp order with the shorter prefix first, as Python compares bytes."""
        cdef int64_t la = self.tok_len[a], lb = self.tok_len[b]
        cdef int r = memcmp(&self.tok_arena[self.tok_off[a]], &self.tok_arena[self.tok_off[b]],
                            la if la < lb else lb)
        if r != 0:
            return r
        return (la > lb) - (la < lb)

    cdef inline uint32_t _hf_rank(self, token_id_t t) noexcept nogil:
        """HF's id order: the bytes by ``hf_byte_rank``, later tokens by id (after all bytes)."""
        return self.byte_rank[t] if t < 256 else t

    cdef bint _hf_above(self, pair_key_t kx, pair_key_t ky) noexcept nogil:
        """``tie_break="hf"``: x wins a tie when its (left, right) HF ranks are the smaller pair."""
        cdef uint32_t lx = self._hf_rank(pair_left(kx)), ly = self._hf_rank(pair_left(ky))
        if lx != ly:
            return lx < ly
        return self._hf_rank(pair_right(kx)) < self._hf_rank(pair_right(ky))

    cdef inline bint _above(self, HeapEntry x, HeapEntry y) noexcept nogil:
        """True when x wins over y: higher count, then greater (left_bytes, right_bytes) (or, with
        ``tie_hf``, the smaller pair of HF ranks)."""
        cdef int r
        cdef pair_key_t kx, ky
        if x.count != y.count:
            return x.count > y.count
        kx = self.prec[x.pair].key
        ky = self.prec[y.pair].key
        if kx == ky:
            return False
        if self.tie_hf:
            return self._hf_above(kx, ky)
        r = self._cmp_bytes(pair_left(kx), pair_left(ky))
        if r == 0:
            r = self._cmp_bytes(pair_right(kx), pair_right(ky))
        return r > 0

    cdef void _push(self, count_t count, pair_id_t pid) noexcept nogil:
        cdef HeapEntry e
        cdef size_t i, parent
        e.count = count
        e.pair = pid
        if self.heap.size() == self.heap.capacity():
            self.heap.reserve(self.heap.size() + self.heap.size() // 4 + 1024)
        self.heap.push_back(e)
        if self.heap.size() > self.peak_heap:
            self.peak_heap = self.heap.size()
        i = self.heap.size() - 1
        while i > 0:
            parent = (i - 1) >> 1
            if not self._above(e, self.heap[parent]):
                break
            self.heap[i] = self.heap[parent]
            i = parent
        self.heap[i] = e

    cdef HeapEntry _pop(self) noexcept nogil:
        cdef HeapEntry top = self.heap[0]
        cdef HeapEntry last = self.heap.back()
        self.heap.pop_back()
        if self.heap.size() > 0:
            self.heap[0] = last
            self._sift_down(0)
        return top

    cdef count_t _choose_floor(self, count_t below) noexcept nogil:
        """A power of two such that about HEAP_BATCH live pairs have counts in [it, below).

        Most pairs are rare (a stage-2 corpus has millions that occur once or twice) and never win;
        keeping them out of the heap until the heap runs below them saves most heap work.
        """
        cdef int64_t hist[64]
        cdef size_t p
        cdef count_t c
        cdef int b
        cdef int64_t total = 0
        for b in range(64):
            hist[b] = 0
        for p in range(self.prec.size()):
            c = self.prec[p].count
            if c > 0 and c < below and self.pair_allowed[p] != 0:
                b = 0
                while (c >> (b + 1)) > 0:
                    b += 1
                hist[b] += 1
        b = 63
        while b > 0:
            total += hist[b]
            if total >= self.heap_batch:
                return (<count_t>1) << b
            b -= 1
        return 1

    cdef void _lower_floor(self) noexcept nogil:
        """Let the pairs in [new floor, old floor) into the heap."""
        cdef count_t old = self.floor_count, c
        cdef count_t new = self._choose_floor(old)
        cdef size_t p
        for p in range(self.prec.size()):
            c = self.prec[p].count
            if c >= new and c < old and self.pair_allowed[p] != 0:
                self._push(c, <pair_id_t>p)
        self.floor_count = new
        self.n_rescans += 1

    cdef void _build_heap(self) noexcept nogil:
        """The first heap, bottom-up in O(n) (Floyd) rather than n pushes; pairs below the floor
        wait outside (see _pop_best)."""
        cdef size_t k, n
        cdef HeapEntry e
        self.floor_count = self._choose_floor(0x7FFFFFFFFFFFFFFF)
        for k in range(self.touched.size()):
            if self.prec[self.touched[k]].count >= self.floor_count:
                e.count = self.prec[self.touched[k]].count
                e.pair = self.touched[k]
                self.heap.push_back(e)
        self.touched.clear()
        self.touched.shrink_to_fit()
        self.born.clear()
        self.born.shrink_to_fit()
        n = self.heap.size()
        if n > self.peak_heap:
            self.peak_heap = n
        k = n // 2
        while k > 0:
            k -= 1
            self._sift_down(k)

    cdef void _sift_down(self, size_t i) noexcept nogil:
        cdef HeapEntry e = self.heap[i]
        cdef size_t n = self.heap.size(), child
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and self._above(self.heap[child + 1], self.heap[child]):
                child += 1
            if not self._above(self.heap[child], e):
                break
            self.heap[i] = self.heap[child]
            i = child
        self.heap[i] = e

    cdef inline bint _spared(self, uint64_t key) noexcept nogil:
        """Whether ``prune_spare`` marks the left or the right token of the pair ``key``."""
        cdef token_id_t a = pair_left(key), b = pair_right(key)
        return (a < self.spare.size() and self.spare[a]) or (b < self.spare.size() and self.spare[b])

    cdef void _heapify(self) noexcept nogil:
        """The pairs whose count rose in this merge get a heap entry; with ``prune_below``, the pairs
        this merge made that count less are forgotten first (their ids are given to later pairs; none
        of them was ever in the heap)."""
        cdef size_t k
        cdef count_t c
        cdef pair_id_t pid
        if self.prune_below > 0:
            for k in range(self.born.size()):
                pid = self.born[k]
                if self.prec[pid].count < self.prune_below and not self._spared(self.prec[pid].key):
                    self.pair_map.remove(self.prec[pid].key, self._keys(), 2)
                    self._list_free(pid)
                    self.prec[pid].count = 0
                    self.pair_allowed[pid] = 0
                    self.free_pids.push_back(pid)
                    self.n_pruned += 1
        self.born.clear()
        for k in range(self.touched.size()):
            c = self.prec[self.touched[k]].count
            if c > 0 and c >= self.floor_count:
                self._push(c, self.touched[k])
        self.touched.clear()
        if self.heap.size() >= <uint64_t>self.heap_raise_min and self.heap.size() >= self.heap_raise_at:
            self._raise_floor()

    cdef void _raise_floor(self) noexcept nogil:
        """Keep only the pairs that may win soon in the heap: the floor goes up to the power of two
        that about ``heap_batch`` live pairs reach (``_choose_floor``), and the entries below it go.

        Exact: an entry is never below its pair's count, so every pair at or above the new floor
        keeps an entry (the invariant of ``_pop_best``); the pairs below wait outside, as at the
        build, and come back when the floor comes down. Without it every pair made by a merge kept an
        entry to the end, since a build from bytes starts with floor 1 (at most 65,536 byte pairs): 17 M
        entries, 196 MiB, at 200k merges on the 15 GB synthetic corpus. Next time when the heap has
        twice the entries it keeps now (and at least ``heap_raise_min``)."""
        cdef count_t f = self._choose_floor(0x7FFFFFFFFFFFFFFF)
        cdef size_t i, n = 0, k
        if f > self.floor_count:
            for i in range(self.heap.size()):
                if self.heap[i].count >= f:
                    self.heap[n] = self.heap[i]
                    n += 1
            self.heap.resize(n)
            self.floor_count = f
            k = n // 2
            while k > 0:
                k -= 1
                self._sift_down(k)
            self.n_raises += 1
        self.heap_raise_at = 2 * self.heap.size()

    cdef int64_t _pop_best(self) noexcept nogil:
        """Pop until the top entry is current; return its pair id, or -1 when no pair is left.

        Pairs marked not allowed are dropped. Invariant: every live pair whose count is at least
        ``floor_count`` has an entry >= its count; so an entry that is current and not below the
        floor is the true maximum. When the heap runs below the floor, the floor comes down and the
        pairs between are pushed.
        """
        cdef HeapEntry e
        cdef count_t cur
        while True:
            if self.floor_count > 1 and (self.heap.size() == 0 or self.heap[0].count < self.floor_count):
                self._lower_floor()
                continue
            if self.heap.size() == 0:
                break
            e = self._pop()
            self.n_pops += 1
            if self.pair_allowed[e.pair] == 0:
                continue
            cur = self.prec[e.pair].count
            if cur == e.count:
                return e.pair
            if cur > 0 and cur >= self.floor_count:
                self._push(cur, e.pair)      # stale: its count went down; it may still win later
                                             # (below the floor: it waits outside, see _lower_floor)
        return -1

    # ---- merging -------------------------------------------------------------------------------

    cdef inline void _near_sub(self, NearTable* nt, token_id_t left, token_id_t right, count_t c) noexcept nogil:
        nt.near[_near_index(nt, pack_pair(left, right))].delta -= c

    cdef inline void _near_add(self, NearTable* nt, token_id_t left, token_id_t right, count_t c,
                               uint32_t pos) noexcept nogil:
        """One more window (weight ``c``, left symbol at ``pos``) of a pair holding the new token."""
        cdef uint32_t idx = _near_index(nt, pack_pair(left, right))
        nt.near[idx].delta += c
        nt.near[idx].n += 1
        nt.sites.push_back((<uint64_t>idx << 32) | pos)

    cdef inline void _other_sub(self, NearTable* nt, token_id_t left, token_id_t right, count_t c,
                                bint shared) noexcept nogil:
        """A window of a pair without the new token goes (the pair map is only read while a merge
        runs). On two threads the change is summed in the share's table (``NearTable.opid``) and
        applied when the share ends (``_other_flush``): the two threads lowering the same few
        counts site after site (the neighbours of the merged pair) passed their cache lines back
        and forth, and a merge on two threads took about as long as on one. A pair that finds no
        place in the table is lowered at once, atomically; sums do not depend on the order."""
        cdef int64_t pid = self.pair_map.get(pack_pair(left, right), self._keys(), 2)
        cdef uint32_t h, probe
        if pid < 0:             # never: every window was counted when it came
            return
        if not shared:
            self.prec[pid].count -= c
            return
        h = <uint32_t>(((<uint64_t>pid * <uint64_t>0x9E3779B97F4A7C15u) >> 40) & (OTHER_SLOTS - 1))
        for probe in range(OTHER_PROBES):
            if nt.ostamp[h] != nt.gen:
                if nt.oused.size() < OTHER_SLOTS // 2:
                    nt.ostamp[h] = nt.gen
                    nt.opid[h] = <uint32_t>pid
                    nt.odelta[h] = c
                    nt.oused.push_back(h)
                    return
                break
            if nt.opid[h] == <uint32_t>pid:
                nt.odelta[h] += c
                return
            h = (h + 1) & (OTHER_SLOTS - 1)
        bpe_atomic_sub(&self.prec[pid].count, c)

    cdef void _other_flush(self, NearTable* nt) noexcept nogil:
        """Apply a share's summed changes of the other pairs (atomically: the other share may
        apply its own to the same pairs now)."""
        cdef size_t q
        cdef uint32_t h
        for q in range(nt.oused.size()):
            h = nt.oused[q]
            bpe_atomic_sub(&self.prec[nt.opid[h]].count, nt.odelta[h])
        nt.oused.clear()

    cdef void _near_end(self, bint fresh, bint par) noexcept nogil:
        """Apply the merge's changes to the pairs holding the new token, from both shares: a pair
        already known gets its delta; a new one is made only when it counts more than 0 and not less
        than ``prune_below`` (one that counts less would be forgotten at once, see ``_heapify``);
        then the positions that came to each kept pair go into its list, the first share's first,
        each in the order they came. ``fresh``: the new token's id was made by this merge, so no
        pair holding it is known yet and the pair map is not asked (with ``prune_below`` most of
        these pairs are never kept: each lookup was a cache miss for nothing).

        Each kept pair's list gets its room for all of this merge's positions at once
        (``_list_room``: its stale entries dropped and its block grown once, not at each power of
        two), and each share's positions then go to their own places in it (``Near.at``): the
        second share's on the second thread when ``par`` (the merge ran on both), while this one
        writes the first's. The lists hold the same positions, in the same order, as one push at a
        time would."""
        cdef NearTable* n0 = &self.share0
        cdef NearTable* n1 = &self.share1
        cdef size_t q
        cdef int64_t found
        cdef uint32_t idx, start
        cdef pair_id_t pid
        cdef Near* e
        cdef int64_t t0
        cdef size_t m
        n1.remap.resize(n1.near.size())
        for q in range(n1.near.size()):          # the second share's pairs join the first's
            idx = _near_index(n0, n1.near[q].key)
            n0.near[idx].delta += n1.near[q].delta
            n0.near[idx].at = n1.near[q].n       # (the second share's windows of the pair)
            n1.remap[q] = idx
        m = n0.near.size()
        for q in range(m):
            if q + PREFETCH < m:                 # its pair-map slot is a cache miss (the lookup, or
                self.pair_map.prefetch(n0.near[q + PREFETCH].key)      # the new pair's place)
            e = &n0.near[q]
            found = -1 if fresh else self.pair_map.get(e.key, self._keys(), 2)
            if found >= 0:
                pid = <pair_id_t>found
                self.prec[pid].count += e.delta
            elif e.delta <= 0 or (e.delta < self.prune_below and not self._spared(e.key)):
                if e.n + e.at > 0 and self.prune_below > 0:
                    self.n_pruned += 1
                continue
            else:
                pid = self._new_pair(e.key) if fresh else self._pair_id(pair_left(e.key), pair_right(e.key))
                self.prec[pid].count = e.delta
            e.pid = pid
            if e.n + e.at > 0:
                self.touched.push_back(pid)      # (each pair once: the near table holds each key once)
                start = self._list_room(<pair_id_t>pid, e.n + e.at)
                if self.oom:
                    return
                e.at = start                     # the first share's positions go from here
        for q in range(n1.near.size()):          # ... and the second share's after them
            e = &n0.near[n1.remap[q]]
            n1.near[q].pid = e.pid
            n1.near[q].at = e.at + e.n
        if par and <int64_t>n1.sites.size() >= self.par_min_list_sites:
            self.job_kind = JOB_LISTS
            self.n_list_jobs += 1
            bpe_store_release(&self.job_posted, self.job_posted + 1)
            t0 = bpe_thread_ns()
            self._write_sites(n0)
            self._par_wait(t0)
        else:
            self._write_sites(n0)
            self._write_sites(n1)

    cdef void _par_wait(self, int64_t t0) noexcept nogil:
        """The second thread's job (posted before this thread's part, begun at ``t0`` of this
        thread's clock) once this thread's part is done: run here when the second thread has not
        taken it yet (it is not running: a busy machine gave its core to another process, or it
        naps), else wait for it (spin a while, then yield the core); count the parts' CPU times.
        Either thread runs the job the same way (the second share, or its list entries), so the
        result is the same."""
        cdef int64_t spins = 0
        cdef int64_t t1 = bpe_thread_ns(), t2
        cdef uint32_t job = self.job_posted
        if bpe_claim(&self.job_claimed, job - 1, job):
            if self.job_kind == JOB_LISTS:
                self._write_sites(&self.share1)
            else:
                self._do_share(1, True)
            t2 = bpe_thread_ns()
            self.n_jobs_taken_back += 1
            self.par_main_ns += t2 - t0
            self.par_crit_ns += t2 - t0
            return
        while bpe_load_acquire(&self.job_done) != job:
            spins += 1
            if spins < SPIN_PAUSES:
                bpe_pause()
            else:
                bpe_yield()
        t2 = bpe_thread_ns()
        self.par_main_ns += t1 - t0
        self.par_wait_ns += t2 - t1
        self.par_worker_ns += self.job_ns
        self.par_crit_ns += t1 - t0 if t1 - t0 > self.job_ns else self.job_ns

    cdef void _write_sites(self, NearTable* nt) noexcept nogil:
        """Put a share's positions into their pairs' lists, at the places ``_near_end`` gave them
        (room made: this never allocates, and the two shares write apart)."""
        cdef size_t q
        cdef uint64_t site
        cdef Near* e
        for q in range(nt.sites.size()):
            site = nt.sites[q]
            e = &nt.near[site >> 32]
            if e.pid >= 0:
                self._block(self.lst_off[e.pid])[e.at] = <uint32_t>(site & 0xFFFFFFFFu)
                e.at += 1

    cdef inline void _merge_at(self, uint32_t i, token_id_t a, token_id_t b, token_id_t t,
                               NearTable* nt, bint shared) noexcept nogil:
        """Merge the pair at ``i`` if the window there still holds it. The windows that hold the new
        token ``t`` (made, or unmade by a later site of the same word) are gathered in the share
        ``nt``; the merged pair's weight is summed there too."""
        cdef uint32_t c = self.cells[i], j, h, k, e, lb, n
        cdef token_id_t hs = 0, ks = 0
        cdef count_t cw
        if (c & DEAD_BIT) or (c & PAYLOAD) != a:
            return                           # stale: rewritten since it was listed
        j = self._nxt(i)
        if j == NIL or (self.cells[j] & PAYLOAD) != b:
            return
        cw = self._word_count(i)
        h = self._prv(i)
        lb = self._span(j)
        e = j + lb - 1
        k = NIL if (self.cells[e] & END_BIT) else e + 1
        # 1. The old windows around the site go.
        if h != NIL:
            hs = self.cells[h] & PAYLOAD
            if hs == t:
                self._near_sub(nt, hs, a, cw)
            else:
                self._other_sub(nt, hs, a, cw, shared)
        nt.removed += cw
        if k != NIL:
            ks = self.cells[k] & PAYLOAD
            if ks == t:
                self._near_sub(nt, b, ks, cw)
            else:
                self._other_sub(nt, b, ks, cw, shared)
        # 2. Rewrite: the pair becomes one token at i, of n positions; its other cells are dead and
        #    its first and last dead cells hold n.
        n = (j - i) + lb
        self.cells[i] = (self.cells[i] & END_BIT) | t
        self.cells[j] = DEAD_BIT | (self.cells[j] & END_BIT)
        self.cells[i + 1] = DEAD_BIT | (self.cells[i + 1] & END_BIT) | n
        self.cells[e] = DEAD_BIT | (self.cells[e] & END_BIT) | n
        # 3. The new windows come.
        if h != NIL:
            self._near_add(nt, hs, t, cw, h)
        if k != NIL:
            self._near_add(nt, t, ks, cw, i)

    cdef inline void _prefetch_far(self, uint32_t i) noexcept nogil:
        """Ask for the cells of a site far ahead and its block-index entry (hints only)."""
        __builtin_prefetch(&self.cells[i])
        __builtin_prefetch(&self.blk[i >> BLK_SHIFT])

    cdef inline void _prefetch_site(self, uint32_t i) noexcept nogil:
        """Ask for the record of a site's word (``_word_count`` reads the block index, asked for
        ``PREFETCH_FAR - PREFETCH`` sites earlier, then the records from there; a hint only). The
        walk reads ~1-3 records of 12 bytes: the line after the first is asked for too (the walk had
        missed on it about every other site in stage 2)."""
        cdef const WordRec* r = &self.wrec[self.blk[i >> BLK_SHIFT]]
        __builtin_prefetch(r)
        __builtin_prefetch(r + 3)

    cdef inline void _prefetch_pairs(self, uint32_t i, token_id_t a) noexcept nogil:
        """Ask for the pair-map slots of the windows left and right of the site at ``i`` (read from
        its cells now; a later site may change them, which only wastes the hint)."""
        cdef uint32_t c = self.cells[i], h, j, e
        if (c & DEAD_BIT) or (c & PAYLOAD) != a:
            return
        h = self._prv(i)
        if h != NIL:
            self.pair_map.prefetch(pack_pair(self.cells[h] & PAYLOAD, a))
        j = self._nxt(i)
        if j == NIL:
            return
        e = j + self._span(j) - 1
        if not (self.cells[e] & END_BIT):
            self.pair_map.prefetch(pack_pair(self.cells[j] & PAYLOAD, self.cells[e + 1] & PAYLOAD))

    cdef void _run_sites(self, NearTable* nt, const uint32_t* arr, uint64_t lo, uint64_t hi,
                         token_id_t a, token_id_t b, token_id_t t, bint shared) noexcept nogil:
        """Merge at ``arr[lo:hi]``, in that order. The sites are spread over the whole table, so each
        one is a cache miss: ask for the cells ``PREFETCH_FAR`` sites ahead and the word record
        ``PREFETCH`` ahead (hints only; the order and the result do not change)."""
        cdef uint64_t q
        for q in range(lo, hi):
            if q + PREFETCH_FAR < hi:
                self._prefetch_far(arr[q + PREFETCH_FAR])
            if q + PREFETCH < hi:
                self._prefetch_site(arr[q + PREFETCH])
            if q + PREFETCH_NEAR < hi:
                self._prefetch_pairs(arr[q + PREFETCH_NEAR], a)
            self._merge_at(arr[q], a, b, t, nt, shared)

    cdef void _do_share(self, int which, bint shared) noexcept nogil:
        """One thread's share of the merge posted in ``job_pid`` / ``job_tok``."""
        cdef NearTable* nt = &self.share0 if which == 0 else &self.share1
        cdef token_id_t a = pair_left(self.prec[self.job_pid].key)
        cdef token_id_t b = pair_right(self.prec[self.job_pid].key)
        self._run_sites(nt, nt.base, nt.b0, nt.b1, a, b, self.job_tok, shared)
        self._run_sites(nt, nt.added, nt.a0, nt.a1, a, b, self.job_tok, shared)
        if shared:
            self._other_flush(nt)

    cdef void _worker_loop(self) noexcept nogil:
        """The second thread (``threads=2``, while ``run`` runs): wait for a posted merge, do the
        second share, say it is done; spin a short while between merges, yield a few times, then
        nap (a spin or a yield is CPU time spent waiting)."""
        cdef uint32_t seen = self.job_done
        cdef int64_t spins, t0
        while True:
            spins = 0
            while bpe_load_acquire(&self.job_posted) == seen:
                spins += 1
                if spins < WORKER_PAUSES:
                    bpe_pause()
                elif spins < WORKER_PAUSES + WORKER_YIELDS:
                    bpe_yield()         # a core shared with this thread's poster gets it back
                else:
                    bpe_nap()
            seen = bpe_load_acquire(&self.job_posted)
            if self.worker_stop:
                break
            if not bpe_claim(&self.job_claimed, seen - 1, seen):
                continue                # the main thread ran it (``_par_wait``)
            t0 = bpe_thread_ns()
            if self.job_kind == JOB_LISTS:
                self._write_sites(&self.share1)
            else:
                self._do_share(1, True)
            self.job_ns = bpe_thread_ns() - t0
            bpe_store_release(&self.job_done, seen)

    cdef uint32_t _split_at(self, const uint32_t* b, uint64_t nb, const uint32_t* ad, uint64_t na) noexcept nogil:
        """Where a merge's sites ``b[:nb]`` + ``ad[:na]`` are divided between the two shares: the
        first position of the word holding their median, estimated from SPLIT_SAMPLE of them
        evenly spaced (a word is never divided). A fixed split (the table's middle) left one share
        most of the sites of the pairs whose words lie together in the sorted table."""
        cdef uint32_t sample[SPLIT_SAMPLE]
        cdef uint64_t n = nb + na, i, k
        cdef uint32_t pos, w
        if n == 0:
            return 0
        for k in range(SPLIT_SAMPLE):
            i = (n * (2 * k + 1)) // (2 * SPLIT_SAMPLE)
            sample[k] = b[i] if i < nb else ad[i - nb]
        sort(&sample[0], &sample[0] + <int>SPLIT_SAMPLE)
        pos = sample[SPLIT_SAMPLE // 2]
        w = self.blk[pos >> BLK_SHIFT]
        while self.wrec[w].end <= pos:
            w += 1
        return <uint32_t>self._word_start(w)

    cdef void _apply_merge(self, pair_id_t pid, token_id_t new_tok, bint fresh) noexcept nogil:
        """Rewrite every occurrence of the pair and update counts by exact deltas.

        The sites go to two shares by position: before the first position of the word holding their
        median and from it (``_split_at``; a word is never divided). With the worker running (``threads=2``) and enough sites, the second share runs on
        the worker while this thread runs the first; each share gathers the pairs holding the new
        token on its own (``NearTable``), and lowers the other pairs' counts atomically (the pair map
        is only read). Then ``_near_end`` applies both shares in a fixed order, so the result does
        not depend on the threads. Within a word the sites run in the same order on any thread."""
        cdef token_id_t a = pair_left(self.prec[pid].key)
        cdef token_id_t b = pair_right(self.prec[pid].key)
        cdef vector[uint32_t] positions
        cdef uint64_t q, s0 = 0, s1 = 0, m, lo, hi
        cdef uint32_t n_added = 0, tmp
        cdef uint32_t* added = NULL
        cdef NearTable* n0 = &self.share0
        cdef NearTable* n1 = &self.share1
        cdef bint par
        cdef int64_t t0
        cdef uint32_t sp = 0
        if pid < self.n_base and not self.base_done[pid]:
            s0 = self.base_start[pid]
            s1 = self.base_start[pid + 1]
            self.base_done[pid] = 1
        if self.lst_cls[pid] != NO_LIST:
            added = self._block(self.lst_off[pid])
            n_added = self.lst_len[pid]
        _share_begin(n0)
        _share_begin(n1)
        self.job_pid = pid
        self.job_tok = new_tok
        par = self.worker_on and <int64_t>((s1 - s0) + n_added) >= self.par_min_sites
        n0.a0 = n0.a1 = n1.a0 = n1.a1 = 0
        n0.added = n1.added = NULL
        if a == b:
            # Overlapping runs (aaa): left to right within each word, as the greedy rewrite.
            positions.reserve((s1 - s0) + n_added)
            for q in range(s0, s1):
                positions.push_back(self.base[q])
            for q in range(n_added):
                positions.push_back(added[q])
            # The initial list is in position order, and the added one mostly is (its sites come
            # in position order from each share): merged in O(n) then; sorted only when it is not.
            # (One repeated byte: 50 M positions, sorted already, took 12% of the run in sort.)
            if not is_sorted(positions.begin() + (s1 - s0), positions.end()):
                sort(positions.begin() + (s1 - s0), positions.end())
            if not is_sorted(positions.begin(), positions.begin() + (s1 - s0)):
                sort(positions.begin(), positions.end())
            elif not is_sorted(positions.begin(), positions.end()):
                inplace_merge(positions.begin(), positions.begin() + (s1 - s0), positions.end())
            m = positions.size()
            if par:
                sp = self._split_at(positions.data(), positions.size(), NULL, 0)
                lo = 0
                hi = positions.size()
                while lo < hi:                       # the first position of the second share
                    q = (lo + hi) // 2
                    if positions[q] < sp:
                        lo = q + 1
                    else:
                        hi = q
                m = lo
            n0.base = n1.base = positions.data()
            n0.b0 = 0
            n0.b1 = n1.b0 = m
            n1.b1 = positions.size()
        else:
            # No two sites of (a, b) with a != b overlap, so any order gives the same result; new
            # windows never hold (a, b) (they hold the new token), so this list does not grow.
            # The initial list is in position order; the added list is partitioned in place.
            m = s1
            if par:
                sp = self._split_at(self.base + s0, s1 - s0, added, n_added)
                lo = s0
                hi = s1
                while lo < hi:
                    q = (lo + hi) // 2
                    if self.base[q] < sp:
                        lo = q + 1
                    else:
                        hi = q
                m = lo
            n0.base = n1.base = self.base
            n0.b0 = s0
            n0.b1 = n1.b0 = m
            n1.b1 = s1
            m = n_added
            if par:
                m = 0
                for q in range(n_added):
                    if added[q] < sp:
                        tmp = added[q]
                        added[q] = added[m]
                        added[m] = tmp
                        m += 1
            n0.added = n1.added = added
            n0.a1 = n1.a0 = m
            n1.a1 = n_added
        if par:
            # the worker's share gets its room here, from this thread (see ``_share_reserve``)
            _share_reserve(n1, (n1.b1 - n1.b0) + (n1.a1 - n1.a0), self.tok_off.size())
            lo = (n0.b1 - n0.b0) + (n0.a1 - n0.a0)
            hi = (n1.b1 - n1.b0) + (n1.a1 - n1.a0)
            self.par_sites += <int64_t>(lo + hi)
            self.par_sites_max += <int64_t>(lo if lo > hi else hi)
            self.job_kind = JOB_SHARE
            bpe_store_release(&self.job_posted, self.job_posted + 1)
            t0 = bpe_thread_ns()
            self._do_share(0, True)
            self._par_wait(t0)
        else:
            self._do_share(0, False)
            self._do_share(1, False)
        self.prec[pid].count -= n0.removed + n1.removed
        self._list_free(pid)
        self._near_end(fresh, par)
        # 4. Every pair whose count rose gets a fresh heap entry.
        self._heapify()

    cpdef tuple step(self, allowed=None, count_t min_count=0):
        """Do one merge; return ``(left_id, right_id, new_id)``, or None when no pair is left.

        Args:
            allowed: optional ``f(left_bytes, right_bytes) -> bool``; a pair it rejects is never
                merged (asked once per pair, when the pair first reaches the top of the heap).
            min_count: when the best pair counts less, nothing is merged, ``allowed`` is not asked
                and None is returned (the engine may be stepped again, with a lower ``min_count``).

        Raises:
            MemoryError: the position lists could not grow (the engine cannot go on).
        """
        cdef token_id_t ids[3]
        if not self._step_ids(allowed, min_count, ids):
            return None
        return (ids[0], ids[1], ids[2])

    cdef bint _step_ids(self, allowed, count_t min_count, token_id_t* out) except -1:
        """``step`` without a tuple: the merge's ``(left_id, right_id, new_id)`` go into ``out``;
        False when no merge was done."""
        cdef int64_t best
        cdef pair_id_t pid
        cdef token_id_t a, b, new_tok
        cdef int8_t verdict
        cdef uint8_t spare_it
        cdef bint fresh
        if self.oom:
            raise MemoryError("the merge engine ran out of memory earlier")
        if min_count < self.prune_below:
            raise ValueError(f"min_count {min_count} is below prune_below {self.prune_below}: pairs that "
                             "could be merged now were forgotten")
        while True:
            with nogil:
                best = self._pop_best()
            if best < 0:
                return False
            pid = <pair_id_t>best
            if self.prec[pid].count < min_count:
                self._push(self.prec[pid].count, pid)      # back in the heap: the state is unchanged
                return False
            a = pair_left(self.prec[pid].key)
            b = pair_right(self.prec[pid].key)
            if allowed is not None and self.pair_allowed[pid] == -1:
                # (a plain local: Cython 3 miscompiles a conditional expression assigned to a
                # vector element, it writes through a temporary "FakeReference")
                verdict = 1 if allowed(self.token_bytes(a), self.token_bytes(b)) else 0
                self.pair_allowed[pid] = verdict
            if self.pair_allowed[pid] == 0:
                continue
            break
        merged = self.token_bytes(a) + self.token_bytes(b)
        existing = self.tok_ids.get(merged)
        fresh = existing is None
        if not fresh and self.halt_existing:
            self._push(self.prec[pid].count, pid)          # back in the heap: the state is unchanged
            self.stopped_before = (a, b)
            return False
        if fresh:
            new_tok = self._add_token(merged)
            if self.spare_fn is not None:
                # (a plain local, as ``verdict`` above: a conditional expression assigned to a
                # vector element wrote the byte through a pointer to a dead temporary, so a new
                # token was spared or not at random; valgrind: uninitialised values in ``_spared``)
                spare_it = 1 if self.spare_fn(merged) else 0
                self.spare.resize(new_tok + 1, 0)
                self.spare[new_tok] = spare_it
        else:
            new_tok = existing           # canonical: same bytes, same symbol
        self.n_steps += 1
        self.last_count = self.prec[pid].count
        with nogil:
            self._apply_merge(pid, new_tok, fresh)
        if self.oom:
            raise MemoryError("the merge engine could not grow a position list")
        out[0] = a
        out[1] = b
        out[2] = new_tok
        return True

    def run(self, Py_ssize_t n_merges, allowed=None, progress=None, Py_ssize_t every=256, count_t min_count=0,
            bint compact=False, bint stop_before_existing=False, bint one_thread=False):
        """Do up to ``n_merges`` merges; return the list of ``(left_id, right_id, new_id)``, or with
        ``compact`` a uint32 array of shape ``(n, 3)`` holding them (12 bytes a merge instead of a
        tuple and three ints, ~100 bytes); a flat ``array.array("I")`` of ``3 n`` items when the
        engine was built from ``array.array`` symbols (``plain``: a small run, no numpy).

        It stops early when no pair is left or (``min_count``) the best pair counts less, or
        (``stop_before_existing``) before a merge whose bytes are those of a token that exists (an
        allowed pair: its id pair is then ``stopped_before``, else that is None; the engine is as
        before that step, and ``step`` makes that merge).

        ``progress(n_done)`` is called every ``every`` merges and at the end; pending signals are
        handled as often (a SIGINT raises ``KeyboardInterrupt`` within ``every`` merges).

        With ``threads=2`` a second native thread runs while this runs (it is stopped and joined
        before this returns or raises); ``one_thread`` runs these merges on this thread alone (the
        same merges): between merges the second thread spins, yields and naps, CPU time for nothing
        when no merge left has ``par_min_sites`` sites (``superbpe.stage2``: 0.4-0.5 CPU-s of a
        0.9 s stage-2 loop on 60 MB).

        Python's cyclic garbage collector is paused while it runs (and turned back on after, when
        it was on): each step is a tuple, and every 700 of them a collection walked the objects of
        the whole process.
        """
        out = []
        cdef vector[token_id_t] flat
        cdef token_id_t ids[3]
        cdef Py_ssize_t done = 0
        cdef bint collecting = _gc.isenabled()
        if collecting:
            _gc.disable()
        self.stopped_before = None
        self.halt_existing = stop_before_existing
        if not one_thread:
            self._start_worker()
        try:
            while done < n_merges:
                if not self._step_ids(allowed, min_count, ids):
                    break
                if compact:
                    flat.push_back(ids[0])
                    flat.push_back(ids[1])
                    flat.push_back(ids[2])
                else:
                    out.append((ids[0], ids[1], ids[2]))
                done += 1
                if done % self.pool_check_every == 0:   # (between merges: no thread is in the lists
                    with nogil:                          # nor the shares; ``_engine_pool.pxi``)
                        if _pool_wasteful(self):
                            _pool_compact(self)
                        if _shares_trim(self) or (self.trim_every > 0 and done % self.trim_every == 0):
                            bpe_trim()       # freed list blocks and share vectors: resident until trimmed
                if done % every == 0:
                    PyErr_CheckSignals()     # Ctrl-C / SIGTERM handlers run here, not after the loop
                    if progress is not None:
                        progress(done)
        finally:
            self.halt_existing = False
            self._stop_worker()
            if collecting:
                _gc.enable()
        if progress is not None:
            progress(done)
        cdef token_id_t[:, ::1] view
        if compact and self.plain:
            arr = array.clone(_U32, done * 3, False)
            if done:
                memcpy((<array.array>arr).data.as_voidptr, flat.data(), done * 3 * sizeof(token_id_t))
            return arr
        if compact:
            arr = np.empty((done, 3), dtype=np.uint32)
            if done:
                view = arr
                memcpy(&view[0, 0], flat.data(), done * 3 * sizeof(token_id_t))
            return arr
        return out

    @property
    def worker_running(self):
        """Whether the second thread runs now (only inside ``run``, with ``threads=2``)."""
        return bool(self.worker_on)

    cdef _start_worker(self):
        if self.threads < 2 or self.worker_on:
            return
        self.worker_stop = 0
        self.job_done = self.job_posted
        self.job_claimed = self.job_posted
        if bpe_thread_start(&self.worker, <bpe_thread_fn>_worker_main, <void*>self) == 0:
            self.worker_on = True         # (no thread: the merges run on this one)

    cdef _stop_worker(self):
        if not self.worker_on:
            return
        self.worker_stop = 1
        bpe_store_release(&self.job_posted, self.job_posted + 1)
        with nogil:
            pthread_join(self.worker, NULL)
        self.worker_on = False
        self.job_done = self.job_posted
        self.job_claimed = self.job_posted

    # ---- inspection ----------------------------------------------------------------------------

    cdef int64_t _word_len(self, int64_t w) noexcept nogil:
        """A word's number of symbols: its live cells (each symbol's first position; the others are
        dead), counted over its positions in one straight pass (no walk from symbol to symbol)."""
        cdef int64_t n = 0, k, end = self.wrec[w].end
        for k in range(self._word_start(w), end):
            n += (self.cells[k] & DEAD_BIT) == 0
        return n

    def word(self, word_id_t w):
        """The current symbols of a word."""
        out = []
        cdef uint32_t pos
        if w >= self.n_words:
            raise IndexError(w)
        if self._word_start(w) == self.wrec[w].end:
            return out
        pos = <uint32_t>self._word_start(w)
        while pos != NIL:
            out.append(self.cells[pos] & PAYLOAD)
            pos = self._nxt(pos)
        return out

    def weighted_length(self, const int64_t[::1] counts=None, const int64_t[::1] words=None):
        """``sum(word_lengths() * counts)`` in one pass, without the array of lengths (stage 2's
        final token count: each word's symbols times how often its piece occurs).

        ``counts=None``: each word's own count, the one the engine was built with (so a caller need
        not keep its array of counts alive beside the engine: stage 2's pieces' weights).
        ``words``: only these words (ids in increasing order, each once), ``counts[i]`` the count of
        ``words[i]``: a few words' share without an array of counts for all (stage 2's pieces whose
        count differs from their weight)."""
        cdef int64_t n_words = self.n_words, w, k = 0, end, n, total = 0, i, prev = -1
        cdef const uint32_t* c = self.cells
        if words is not None:
            if counts is None or counts.shape[0] != words.shape[0]:
                raise ValueError("weighted_length: one count per word listed")
            for i in range(words.shape[0]):
                if words[i] <= prev or words[i] >= n_words:
                    raise ValueError("weighted_length: words listed once each, in increasing order, below n_words")
                prev = words[i]
            with nogil:
                for i in range(words.shape[0]):
                    w = words[i]
                    end = self.wrec[w].end
                    n = 0
                    k = self._word_start(w)
                    while k < end:
                        n += 1 - (c[k] >> 31)
                        k += 1
                    total += n * counts[i]
            return total
        cdef const int64_t* given = NULL
        if counts is not None:
            if counts.shape[0] != n_words:
                raise ValueError("weighted_length: one count per word")
            if n_words > 0:
                given = &counts[0]
        with nogil:
            for w in range(n_words):
                end = self.wrec[w].end
                n = 0
                while k < end:
                    n += 1 - (c[k] >> 31)
                    k += 1
                total += n * (given[w] if given != NULL else self.wrec[w].count)
        return total

    def word_lengths(self):
        """Each word's current number of symbols (int64): ``np.diff(words()[1])`` without listing the
        symbols (what a final token count needs)."""
        cdef int64_t n_words = self.n_words, w, k = 0, end, n
        lengths = np.empty(n_words, dtype=np.int64)
        cdef int64_t[::1] lv = lengths
        cdef const uint32_t* c = self.cells
        with nogil:
            for w in range(n_words):            # one pass over the cells: a word's live ones
                end = self.wrec[w].end
                n = 0
                while k < end:
                    n += 1 - (c[k] >> 31)
                    k += 1
                lv[w] = n
        return lengths

    def words(self):
        """The current word table as ``(symbols uint32, offsets int64, counts int64)`` (compacted)."""
        cdef int64_t n_words = self.n_words
        cdef int64_t w, pos = 0
        cdef uint32_t p
        offsets = prefault(np.empty(n_words + 1, dtype=np.int64))
        counts = prefault(np.empty(n_words, dtype=np.int64))
        cdef int64_t[::1] ov = offsets
        cdef int64_t[::1] cv = counts
        for w in range(n_words):
            ov[w] = pos
            cv[w] = self.wrec[w].count
            pos += self._word_len(w)
        ov[n_words] = pos
        symbols = prefault(np.empty(pos, dtype=np.uint32))
        cdef token_id_t[::1] sv = symbols
        pos = 0
        for w in range(n_words):
            if self._word_start(w) == self.wrec[w].end:
                continue
            p = <uint32_t>self._word_start(w)
            while p != NIL:
                sv[pos] = self.cells[p] & PAYLOAD
                pos += 1
                p = self._nxt(p)
        return symbols, offsets, counts

    def tokens(self):
        """The bytes of every token id, in id order (the engine's own bytes objects when no two ids
        hold the same bytes: no copy)."""
        if <size_t>len(self.tok_ids) == self.tok_off.size():
            # each id added a key, in id order (``_add_token``): the keys are the tokens
            return list(self.tok_ids)
        return [self.token_bytes(<token_id_t>i) for i in range(self.tok_off.size())]

    def compact_pool(self):
        """Slide the position lists added by merges into the fewest pages and give the others back
        (``run`` does it by itself when a quarter of the pool is free blocks); returns the pool's
        bytes before and after. Changes no merge.

        >>> e = MergeEngine(np.frombuffer(b"abab", np.uint8), np.array([0, 4]), np.array([3]),
        ...                 [bytes([i]) for i in range(256)])
        >>> e.step(); e.compact_pool()
        (97, 98, 256)
        (1048576, 1048576)
        """
        cdef uint64_t before = self._pool_bytes()
        with nogil:
            _pool_compact(self)
        return int(before), int(self._pool_bytes())

    def reserve_pairs(self, int64_t n_pairs):
        """Make room for ``n_pairs`` pairs in all (the plan's estimate, ``runtime.budget.pairs_estimate``)
        before the merge loop: the pair map is sized for them at once, and the per-pair arrays and the
        heap reserve their address space, so none of them is copied to a larger block (the old and the
        new held together) while the loop runs. Reserved pages that are never written take no memory.
        More pairs than that still fit (the arrays then grow as before). Changes no merge.

        >>> e = MergeEngine(np.frombuffer(b"abab", np.uint8), np.array([0, 4]), np.array([3]),
        ...                 [bytes([i]) for i in range(256)])
        >>> e.reserve_pairs(100_000); e.memory()["pair_map"] >= 100_000 * 8 * 10 // 7
        True
        """
        if n_pairs <= <int64_t>self.prec.size():
            return
        self.pair_map.reserve(<uint64_t>n_pairs, self._keys(), 2)
        if <size_t>n_pairs > self.prec.capacity():
            self._reserve_pairs(<size_t>n_pairs)
        if <size_t>n_pairs > self.heap.capacity():
            self.heap.reserve(<size_t>n_pairs)

    def memory(self):
        """Bytes held now, by structure: ``anon`` (RAM the engine allocated) and ``mapped`` (read-only
        arrays in mapped files: page cache the kernel may drop and read again).

        >>> e = MergeEngine(np.frombuffer(b"abab", np.uint8), np.array([0, 4]), np.array([3]),
        ...                 [bytes([i]) for i in range(256)])
        >>> m = e.memory(); m["cells"], m["mapped"]
        (16, 0)
        """
        # (the per-pair arrays and the heap by the entries written: ``reserve_pairs`` reserves
        # address space that takes no memory until it is written)
        cdef uint64_t pairs = (self.prec.size() * sizeof(PairRec)
                               + self.lst_off.size() * 8 + self.lst_len.size() * 4
                               + self.lst_cls.size()
                               + self.pair_allowed.size() + self.base_start.capacity() * 8
                               + self.base_done.capacity())
        cdef uint64_t used = 0, entries = 0
        cdef size_t q
        cdef uint64_t shares = _share_bytes(&self.share0) + _share_bytes(&self.share1)
        for q in range(self.lst_cls.size()):
            if self.lst_cls[q] != NO_LIST:
                used += ((<uint64_t>1) << self.lst_cls[q]) * 4
                entries += self.lst_len[q]
        out = {
            "list_blocks": used,
            "list_entries": entries,
            "cells": (self.cells_own.capacity() if self.cells_obj is None else self.n_cells) * 4,
            "block_index": self.blk.capacity() * 4,
            "pairs": pairs,
            "pair_map": self.pair_map.nbytes(),
            "lists": self._pool_bytes(),
            "lists_peak": self.peak_pool_bytes,
            "heap": self.peak_heap * sizeof(HeapEntry),
            "heap_peak": self.peak_heap * sizeof(HeapEntry),
            "shares": shares,
            "words_in_ram": 0 if self.mapped_bytes and isinstance(self._wrec_arr, np.memmap) else
                            self.n_words * WORD_RECORD_BYTES,
            "positions_in_ram": 0 if (not isinstance(self._base_arr, _array.array)
                                      and isinstance(self._base_arr, np.memmap)) else
                                int(self.base_start[self.n_base]) * 4,
            "mapped": int(self.mapped_bytes),
        }
        out["anon"] = (out["cells"] + out["block_index"] + out["pairs"] + out["pair_map"] + out["lists"]
                       + out["heap"] + out["shares"] + out["words_in_ram"] + out["positions_in_ram"])
        return out

    def stats(self):
        """Sizes of the internal tables (for reports and memory accounting)."""
        return {
            "n_words": self.n_words,
            "n_symbols": self.n_cells,
            "n_pairs": self.prec.size(),
            "heap_size": self.heap.size(),
            "n_pops": self.n_pops,
            "heap_rescans": self.n_rescans,
            "heap_raises": self.n_raises,
            "n_steps": self.n_steps,
            "list_compactions": self.n_compactions,
            "pool_compactions": self.n_pool_compactions,
            "pruned_pairs": self.n_pruned,
            "fill_passes": self.fill_passes,
            "memory": self.memory(),
        }
