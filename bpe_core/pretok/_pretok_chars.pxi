# _pretok.pyx, part 2 of 11 (``include``d: compiled into the module as if written there).
# Characters: one UTF-8 character's classes, and runs of characters of a class (letters, numbers,
# whitespace, contractions).

# ==== Characters ===================================================================================


cdef uint16_t _char_mb(const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                      Py_ssize_t* end) noexcept nogil:
    """``_char`` for a lead byte >= 0x80 (kept out of line so the ASCII paths stay small)."""
    cdef uint32_t b0 = s[i], b1, b2, b3
    if b0 >= 0xC2 and b0 < 0xE0:
        if i + 1 < n:
            b1 = s[i + 1]
            if (b1 & 0xC0) == 0x80:
                end[0] = i + 2
                return bpe_ut_flags(((b0 & 0x1F) << 6) | (b1 & 0x3F))
    elif b0 >= 0xE0 and b0 < 0xF0:
        if i + 2 < n:
            b1 = s[i + 1]
            b2 = s[i + 2]
            if ((b2 & 0xC0) == 0x80
                    and (b1 >= (0xA0 if b0 == 0xE0 else 0x80))
                    and (b1 <= (0x9F if b0 == 0xED else 0xBF))):
                end[0] = i + 3
                return bpe_ut_flags(((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F))
    elif b0 >= 0xF0 and b0 < 0xF5:
        if i + 3 < n:
            b1 = s[i + 1]
            b2 = s[i + 2]
            b3 = s[i + 3]
            if ((b2 & 0xC0) == 0x80 and (b3 & 0xC0) == 0x80
                    and (b1 >= (0x90 if b0 == 0xF0 else 0x80))
                    and (b1 <= (0x8F if b0 == 0xF4 else 0xBF))):
                end[0] = i + 4
                return bpe_ut_flags(((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12)
                                    | ((b2 & 0x3F) << 6) | (b3 & 0x3F))
    end[0] = i + 1
    return bpe_ut_flags(0xDC00 | b0)  # an undecodable byte: its surrogateescape code point


cdef inline uint16_t _char(const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                           Py_ssize_t* end) noexcept nogil:
    """Flags of the character at s[i] (i < n); sets *end to the byte after it.

    A character is a valid UTF-8 sequence within s[i:n] (Python's strict decoder: no overlongs,
    no encoded surrogates, nothing above U+10FFFF, not cut by n) or, failing that, the single
    byte s[i] as the surrogate U+DC00 + s[i], which is what ``surrogateescape`` decodes it to.
    """
    if s[i] < 0x80:
        end[0] = i + 1
        return bpe_ut_leaves[s[i]]
    return _char_mb(s, i, n, end)


cdef inline Py_ssize_t _run(const uint8_t* s, Py_ssize_t j, Py_ssize_t n,
                            uint16_t mask, uint16_t want) noexcept nogil:
    """End of the run of characters from j whose ``flags & mask == want``."""
    cdef Py_ssize_t e
    cdef uint8_t c
    while j < n:
        c = s[j]
        if c < 0x80:
            if (bpe_ut_leaves[c] & mask) != want:
                break
            j += 1
        else:
            if (_char_mb(s, j, n, &e) & mask) != want:
                break
            j = e
    return j


cdef inline Py_ssize_t _run_ascii(const uint8_t* s, Py_ssize_t j, Py_ssize_t n, uint64_t fold,
                                  uint64_t add_lo, uint64_t add_hi, uint16_t mask,
                                  uint16_t want) noexcept nogil:
    """``_run(s, j, n, mask, want)``, eight bytes at a time while they are ASCII.

    The class must hold exactly the ASCII bytes x with ``lo <= (x | fold) <= hi`` (letters,
    lowercase, uppercase, digits). Most words are short ASCII runs; finding their end with one bit
    trick per 8 bytes instead of a branch per byte saves the mispredicted loop exit. For x < 0x80,
    ``x + (0x80 - lo)`` reaches 0x80 iff ``x >= lo`` and ``x + (0x7F - hi)`` iff ``x > hi``; no byte
    carries into the next. A byte >= 0x80 (maybe a non-ASCII member) hands over to ``_run``.
    ``add_lo``/``add_hi``/``fold`` are those constants repeated in all 8 bytes.
    """
    cdef uint64_t w, x, miss
    cdef Py_ssize_t k
    while j + 8 <= n:
        w = bpe_load_le64(s + j)
        x = (w & 0x7F7F7F7F7F7F7F7FULL) | fold
        miss = ~(((x + add_lo) & ~(x + add_hi)) & ~w) & 0x8080808080808080ULL
        if miss == 0:
            j += 8
            continue
        k = j + (bpe_ctz64(miss) >> 3)
        if s[k] < 0x80:
            return k
        return _run(s, k, n, mask, want)
    return _run(s, j, n, mask, want)


cdef inline Py_ssize_t _run_letters(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """``\p{L}*`` from j: ASCII ``[A-Za-z]`` (folded to a..z: 0x61..0x7A), then any letter."""
    return _run_ascii(s, j, n, 0x2020202020202020ULL, 0x1F1F1F1F1F1F1F1FULL,
                      0x0505050505050505ULL, BPE_UT_L, BPE_UT_L)


cdef inline Py_ssize_t _run_lower(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """o200k's ``[W]*`` from j: ASCII ``[a-z]`` (0x61..0x7A), then any W character."""
    return _run_ascii(s, j, n, 0, 0x1F1F1F1F1F1F1F1FULL, 0x0505050505050505ULL,
                      BPE_UT_W, BPE_UT_W)


cdef inline Py_ssize_t _run_upper(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """o200k's ``[U]*`` from j: ASCII ``[A-Z]`` (0x41..0x5A), then any U character."""
    return _run_ascii(s, j, n, 0, 0x3F3F3F3F3F3F3F3FULL, 0x2525252525252525ULL,
                      BPE_UT_U, BPE_UT_U)


cdef inline Py_ssize_t _run_numbers(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """``\p{N}*`` from j: ASCII ``[0-9]`` (0x30..0x39), then any number."""
    return _run_ascii(s, j, n, 0, 0x5050505050505050ULL, 0x4646464646464646ULL,
                      BPE_UT_N, BPE_UT_N)


cdef inline Py_ssize_t _run_digits(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """``\\p{N}{1,3}`` after the first digit, which ends at j: up to two more digits."""
    cdef Py_ssize_t e
    cdef int k
    for k in range(2):
        if j >= n or not (_char(s, j, n, &e) & BPE_UT_N):
            break
        j = e
    return j


cdef inline Py_ssize_t _run_bytes(const uint8_t* s, Py_ssize_t j, Py_ssize_t n,
                                  uint8_t a, uint8_t b, uint8_t c) noexcept nogil:
    """End of the run of the ASCII bytes a, b, c from j (``[\\r\\n]*``, ``[\\r\\n/]*``)."""
    while j < n and (s[j] == a or s[j] == b or s[j] == c):
        j += 1
    return j


cdef inline Py_ssize_t _contraction_ci(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """``'(?i:[sdmt]|ll|ve|re)`` at i: its end, or -1 (cl100k and o200k: the same seven endings)."""
    cdef Py_ssize_t j, k
    cdef uint16_t a, b
    if i + 1 >= n or s[i] != APOS:
        return -1
    a = _char(s, i + 1, n, &j) >> 8
    if a == c's' or a == c'd' or a == c'm' or a == c't':
        return j
    if (a == c'l' or a == c'v' or a == c'r') and j < n:
        b = _char(s, j, n, &k) >> 8
        if (a == c'l' and b == c'l') or (a != c'l' and b == c'e'):
            return k
    return -1


cdef inline Py_ssize_t _ws_run(const uint8_t* s, Py_ssize_t j, Py_ssize_t n,
                               Py_ssize_t* last, Py_ssize_t* after_crlf) noexcept nogil:
    """End of the ``\\s`` run that continues at j; updates *last (start of its last character) and
    *after_crlf (the byte after its last CR or LF, if any)."""
    cdef Py_ssize_t e
    cdef uint8_t c
    while j < n:
        c = s[j]
        if c < 0x80:
            if not (bpe_ut_leaves[c] & BPE_UT_S):
                break
            if c == LF or c == CR:
                after_crlf[0] = j + 1
            last[0] = j
            j += 1
        else:
            if not (_char_mb(s, j, n, &e) & BPE_UT_S):
                break
            last[0] = j
            j = e
    return j
