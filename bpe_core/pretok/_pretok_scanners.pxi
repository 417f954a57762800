# _pretok.pyx, part 3 of 11 (``include``d: compiled into the module as if written there).
# The scanners: the end of the pretoken at a position for each pattern (gpt2, cl100k, o200k), the
# ASCII window check, and the driver that writes pretoken ends (_split_ends).

# ==== Scanners =====================================================================================
#
# Each _end_<pattern> is small and inlined into the driver loops; it handles the frequent cases
# (letters, an optional prefix before letters, digits) and leaves punctuation and whitespace to
# out-of-line helpers.


cdef Py_ssize_t _ws_end(const uint8_t* s, Py_ssize_t i, Py_ssize_t j, Py_ssize_t n,
                        int pattern_id) noexcept nogil:
    """The whitespace alternatives at i, whose character ends at j (s[i] is ``\s``).

    gpt2: ``\s+(?!\S)|\s+``; cl100k: ``\s++$|\s*[\r\n]|\s+(?!\S)|\s``;
    o200k: ``\s*[\r\n]+|\s+(?!\S)|\s+``. ``\s+(?!\S)`` takes the whole run at the end of the
    text, else gives its last character back (unless the run is one character).
    """
    cdef Py_ssize_t last = i
    cdef Py_ssize_t after_crlf = j if (s[i] == CR or s[i] == LF) else -1
    cdef Py_ssize_t k = _ws_run(s, j, n, &last, &after_crlf)
    if pattern_id == PATTERN_GPT2:
        after_crlf = -1
    if pattern_id == PATTERN_CL100K and k == n:  # \s++$ comes before \s*[\r\n]
        return n
    if after_crlf >= 0:  # \s*[\r\n] (cl100k), \s*[\r\n]+ (o200k): to the last CR/LF of the run
        return after_crlf
    if k == n:
        return n
    if last > i:
        return last
    return k


cdef Py_ssize_t _other_end(const uint8_t* s, Py_ssize_t i, Py_ssize_t j, uint16_t f, Py_ssize_t n,
                           int pattern_id) noexcept nogil:
    """`` ?[^\s\p{L}\p{N}]+`` and what follows it, else the whitespace alternatives.

    Called when s[i] (ending at j, flags f) is not a letter and starts no letter/digit pretoken.
    cl100k appends ``[\r\n]*``, o200k ``[\r\n/]*``.
    """
    cdef Py_ssize_t k
    cdef uint16_t f1
    if s[i] == SPACE and j < n:
        f1 = _char(s, j, n, &k)
        if not (f1 & LNS):
            f = f1
            j = k
    if f & BPE_UT_S:
        return _ws_end(s, i, j, n, pattern_id)
    j = _run(s, j, n, LNS, 0)
    if pattern_id == PATTERN_CL100K:
        return _run_bytes(s, j, n, CR, LF, LF)
    if pattern_id == PATTERN_O200K:
        return _run_bytes(s, j, n, CR, LF, SLASH)
    return j


cdef inline Py_ssize_t _end_gpt2(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """GPT-2: ``'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``.

    Example: ``I'm  a`` -> ``I``, ``'m``, `` ``, `` a``.
    """
    cdef uint8_t c = s[i], c1
    cdef Py_ssize_t j, k
    cdef uint16_t f, f1
    if c == APOS and i + 1 < n:  # case-sensitive contractions
        c1 = s[i + 1]
        if c1 == c's' or c1 == c'd' or c1 == c'm' or c1 == c't':
            return i + 2
        if i + 2 < n and ((c1 == c'l' and s[i + 2] == c'l') or (c1 == c'v' and s[i + 2] == c'e')
                          or (c1 == c'r' and s[i + 2] == c'e')):
            return i + 3
    f = _char(s, i, n, &j)
    if c == SPACE and j < n:  # " ?" before a letter or digit run
        f1 = _char(s, j, n, &k)
        if f1 & (BPE_UT_L | BPE_UT_N):
            f = f1
            j = k
    if f & BPE_UT_L:
        return _run_letters(s, j, n)
    if f & BPE_UT_N:
        return _run_numbers(s, j, n)
    return _other_end(s, i, j, f, n, PATTERN_GPT2)


cdef inline Py_ssize_t _end_cl100k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """cl100k: ``'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|``
    `` ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s``.

    Example: ``I'M 123456!\n\n`` -> ``I``, ``'M``, `` ``, ``123``, ``456``, ``!\n\n``.
    """
    cdef uint8_t c = s[i]
    cdef Py_ssize_t j, k
    cdef uint16_t f
    if c == APOS:
        k = _contraction_ci(s, i, n)
        if k >= 0:
            return k
    f = _char(s, i, n, &j)
    if f & BPE_UT_L:
        return _run_letters(s, j, n)
    if f & BPE_UT_N:
        return _run_digits(s, j, n)
    # [^\r\n\p{L}\p{N}]?+\p{L}++: one prefix character before letters (possessive: if no
    # letter follows, the alternative fails; without the prefix it could not match either).
    if c != CR and c != LF and j < n and (_char(s, j, n, &k) & BPE_UT_L):
        return _run_letters(s, k, n)
    return _other_end(s, i, j, f, n, PATTERN_CL100K)


cdef inline Py_ssize_t _o200k_lower_first(const uint8_t* s, Py_ssize_t p, Py_ssize_t n) noexcept nogil:
    """``[U]*[W]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`` at p: its end, or -1.

    U = ``[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]``, W = ``[\p{Ll}\p{Lm}\p{Lo}\p{M}]``. ``[U]*`` backs off
    from the end of the U-run until ``[W]+`` can start: at the last W character of the run, or
    just after the run when a W (an Ll) follows it.
    """
    cdef Py_ssize_t q = p, e, k = -1
    cdef uint16_t f = 0
    while q < n:
        f = _char(s, q, n, &e)
        if not (f & BPE_UT_U):
            break
        if f & BPE_UT_W:
            k = q
        q = e
    if q < n and (f & BPE_UT_W):
        k = q
    if k < 0:
        return -1
    e = _run_lower(s, k, n)
    k = _contraction_ci(s, e, n)
    return k if k >= 0 else e


cdef Py_ssize_t _o200k_upper_first(const uint8_t* s, Py_ssize_t p, Py_ssize_t n) noexcept nogil:
    """``[U]+[W]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`` at p: its end, or -1."""
    cdef Py_ssize_t e
    if p >= n or not (_char(s, p, n, &e) & BPE_UT_U):
        return -1
    e = _run_lower(s, _run_upper(s, e, n), n)
    p = _contraction_ci(s, e, n)
    return p if p >= 0 else e


cdef inline Py_ssize_t _end_o200k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """o200k: ``P?[U]*[W]+C?|P?[U]+[W]*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|``
    ``\s+(?!\S)|\s+`` with P = ``[^\r\n\p{L}\p{N}]`` and C the contractions, any case.

    Example: ``HELLOworld's 1234`` -> ``HELLOworld's``, `` ``, ``123``, ``4``.
    """
    cdef uint8_t c = s[i]
    cdef Py_ssize_t j, k
    cdef uint16_t f = _char(s, i, n, &j)
    cdef bint prefix = not (f & (BPE_UT_L | BPE_UT_N)) and c != CR and c != LF
    # Alternative 1 with, then without, the optional prefix; then alternative 2 likewise.
    if prefix:
        k = _o200k_lower_first(s, j, n)
        if k >= 0:
            return k
    if f & (BPE_UT_U | BPE_UT_W):
        k = _o200k_lower_first(s, i, n)
        if k >= 0:
            return k
    if prefix:
        k = _o200k_upper_first(s, j, n)
        if k >= 0:
            return k
    if f & BPE_UT_U:
        k = _o200k_upper_first(s, i, n)
        if k >= 0:
            return k
    if f & BPE_UT_N:
        return _run_digits(s, j, n)
    return _other_end(s, i, j, f, n, PATTERN_O200K)


cdef Py_ssize_t _next_gpt2(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    return _end_gpt2(s, i, n)


cdef Py_ssize_t _next_cl100k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    return _end_cl100k(s, i, n)


cdef Py_ssize_t _next_o200k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    return _end_o200k(s, i, n)


# The drivers switch on the pattern once, outside the loop, so each loop inlines its scanner.


cdef inline bint _ascii_letter(uint8_t c) noexcept nogil:
    """``[A-Za-z]``: ``c | 0x20`` in ``a..z`` (the ASCII letters, all ``\p{L}``)."""
    return <uint8_t>((c | 0x20) - 0x61) < 26


cdef bint _check_ascii_classes() noexcept nogil:
    """Whether the Unicode tables give every ASCII byte the class the 64-byte windows assume
    (``bpe_aw_class``: letters, upper case, digits, whitespace); if not, the windows stay off."""
    cdef unsigned c, f, want
    cdef uint16_t t
    for c in range(128):
        f = bpe_aw_class(<uint8_t>c)
        t = bpe_ut_leaves[c]
        want = (((f & 1) != 0) * BPE_UT_L) | (((f & 4) != 0) * BPE_UT_N) | (((f & 8) != 0) * BPE_UT_S)
        want |= (((f & 2) != 0) * BPE_UT_U) | ((((f & 1) != 0) and not (f & 2)) * BPE_UT_W)
        if (t & (BPE_UT_L | BPE_UT_N | BPE_UT_S | BPE_UT_U | BPE_UT_W)) != want:
            return False
    return True


cdef bint _WINDOWS = _check_ascii_classes()
ASCII_WINDOWS = bool(_WINDOWS)  # for the tests: the fast path is in use


cdef inline Py_ssize_t _window(int pattern_id, const uint8_t* s, Py_ssize_t i, int64_t* ends,
                               Py_ssize_t room, int64_t* stop) noexcept nogil:
    """The pretoken ends the 64 ASCII bytes at s[i] prove (``bpe_ascii_window``; needs i + 64 <= n),
    at most ``room`` of them, into ends; how many."""
    cdef int64_t spare[64]
    cdef Py_ssize_t k
    if room >= 62:  # a window writes at most 62
        return bpe_ascii_window(pattern_id, s, i, ends, stop)
    k = bpe_ascii_window(pattern_id, s, i, spare, stop)
    if k > room:
        k = room
    memcpy(ends, spare, k * sizeof(int64_t))
    return k


cdef Py_ssize_t _split_ends(int pattern_id, const uint8_t* s, Py_ssize_t* pos, Py_ssize_t n,
                            int64_t* ends, Py_ssize_t cap) noexcept nogil:
    # Where 64 bytes on are still in the span, a window proves the ends of many pretokens at once
    # (ASCII text); else, and up to ``stop`` (the byte after a non-ASCII byte that stopped a
    # window), and when a window proves nothing, one pretoken with the exact scanner.
    cdef Py_ssize_t i = pos[0], n_ends = 0, k
    cdef int64_t stop = 0
    if pattern_id == PATTERN_GPT2:
        while i < n and n_ends < cap:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = _window(PATTERN_GPT2, s, i, ends + n_ends, cap - n_ends, &stop)
                if k > 0:
                    n_ends += k
                    i = ends[n_ends - 1]
                    continue
            # The most frequent pretokens, an ASCII letter or a space and an ASCII letter, then
            # letters, take the same path as in _end_gpt2 without a call.
            if _ascii_letter(s[i]):
                i = _run_letters(s, i + 1, n)
            elif s[i] == SPACE and i + 1 < n and _ascii_letter(s[i + 1]):
                i = _run_letters(s, i + 2, n)
            else:
                i = _end_gpt2(s, i, n)
            ends[n_ends] = i
            n_ends += 1
    elif pattern_id == PATTERN_CL100K:
        while i < n and n_ends < cap:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = _window(PATTERN_CL100K, s, i, ends + n_ends, cap - n_ends, &stop)
                if k > 0:
                    n_ends += k
                    i = ends[n_ends - 1]
                    continue
            if _ascii_letter(s[i]):  # likewise for _end_cl100k
                i = _run_letters(s, i + 1, n)
            elif s[i] == SPACE and i + 1 < n and _ascii_letter(s[i + 1]):
                i = _run_letters(s, i + 2, n)
            else:
                i = _end_cl100k(s, i, n)
            ends[n_ends] = i
            n_ends += 1
    else:
        while i < n and n_ends < cap:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = _window(PATTERN_O200K, s, i, ends + n_ends, cap - n_ends, &stop)
                if k > 0:
                    n_ends += k
                    i = ends[n_ends - 1]
                    continue
            i = _end_o200k(s, i, n)
            ends[n_ends] = i
            n_ends += 1
    pos[0] = i
    return n_ends
