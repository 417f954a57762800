# _pretok.pyx, part 11 of 11 (``include``d: compiled into the module as if written there).
# Per-word character facts (SuperBPE's stage-2 units): character flags, byte classes, table sums,
# dropping one-byte words.

# ==== Per-word character facts (SuperBPE's stage-2 units) ======================================

cdef int _check_word_offsets(const uint8_t[::1] arena, const int64_t[::1] offsets) except -1:
    """Raise ``ValueError`` unless ``offsets`` are the words of ``arena`` (in it, not decreasing)."""
    cdef Py_ssize_t n_words = offsets.shape[0] - 1, w
    if n_words > 0 and (offsets[0] < 0 or offsets[n_words] > arena.shape[0]):
        raise ValueError("offsets go past the arena")
    for w in range(n_words):
        if offsets[w + 1] < offsets[w]:
            raise ValueError("offsets must not decrease")
    return 0


def word_char_flags(const uint8_t[::1] arena, const int64_t[::1] offsets):
    """Per word ``arena[offsets[w]:offsets[w+1]]`` (uint8): 1 when a character is ``\\p{N}``, 2 when
    its first character is ``\\s``, 4 when its last is; each word decoded alone, as Python's
    ``decode("utf-8", "surrogateescape")`` decodes it (an undecodable byte is the character
    U+DC00 + byte, which is neither), with the character tables of the pre-tokenizer.

    >>> w = [b" a", b"x\\n", b" 12", b"\\xc2\\xa0", b"\\xd9\\xa3", b"\\xc2", b""]
    >>> word_char_flags(np.frombuffer(b"".join(w), np.uint8),
    ...                 np.cumsum([0] + [len(x) for x in w])).tolist()     # U+00A0 is \\s, U+0663 \\p{N}
    [2, 4, 3, 6, 1, 0, 0]

    Plain equivalent: ``superbpe.word_flags_python`` (``regex`` on each decoded word; tested equal).
    """
    cdef Py_ssize_t n_words = offsets.shape[0] - 1, w, i, e, end
    cdef uint16_t f
    cdef uint8_t out_f
    out = np.zeros(max(n_words, 0), dtype=np.uint8)
    cdef uint8_t[::1] ov = out
    cdef const uint8_t* s = &arena[0] if arena.shape[0] > 0 else NULL
    _check_word_offsets(arena, offsets)
    with nogil:
        for w in range(n_words):
            i = offsets[w]
            e = offsets[w + 1]
            out_f = 0
            f = 0
            while i < e:
                f = _char(s, i, e, &end)
                if f & BPE_UT_N:
                    out_f |= 1
                if i == offsets[w] and (f & BPE_UT_S):
                    out_f |= 2
                i = end
            if e > offsets[w] and (f & BPE_UT_S):       # f: the last character's
                out_f |= 4
            ov[w] = out_f
    return out


def word_byte_classes(const uint8_t[::1] arena, const int64_t[::1] offsets):
    """Per word (int64 rows of 5): its bytes, ASCII whitespace (`` \\t\\n\\r\\v\\f``), ASCII
    punctuation (``!`` to ``~`` less letters and digits), ASCII letters and digits, ASCII digits.

    >>> word_byte_classes(np.frombuffer(b"ab, 7\\xc3\\xa9", np.uint8), np.array([0, 3, 7])).tolist()
    [[3, 0, 1, 2, 0], [4, 1, 0, 1, 1]]

    Plain equivalent: ``superbpe.word_classes_python`` (numpy over the byte classes; tested equal).
    """
    cdef Py_ssize_t n_words = offsets.shape[0] - 1, w, i
    cdef uint8_t c
    out = np.zeros((max(n_words, 0), 5), dtype=np.int64)
    cdef int64_t[:, ::1] ov = out
    _check_word_offsets(arena, offsets)
    with nogil:
        for w in range(n_words):
            ov[w, 0] = offsets[w + 1] - offsets[w]
            for i in range(offsets[w], offsets[w + 1]):
                c = arena[i]
                if c == 0x20 or (0x09 <= c <= 0x0D):
                    ov[w, 1] += 1
                elif (0x30 <= c <= 0x39) or (0x41 <= c <= 0x5A) or (0x61 <= c <= 0x7A):
                    ov[w, 3] += 1
                    if c <= 0x39:
                        ov[w, 4] += 1
                elif 0x21 <= c <= 0x7E:
                    ov[w, 2] += 1
    return out


def table_sums(const int64_t[::1] offsets, const int64_t[::1] counts):
    """The totals of a word table: ``(pretokens, text bytes, one-byte words)``.

    Contract: ``offsets`` (int64, ``n_words + 1``) and ``counts`` (int64, ``n_words``) of a table
    (``count_pretokens``); any buffer (numpy arrays, ``array.array``). Returns the sum of the
    counts, the sum of ``len(word) * count`` (the bytes of text the table stands for), and the
    number of words of one byte.

    >>> table_sums(np.array([0, 1, 3, 6]), np.array([5, 2, 1]))
    (8, 12, 1)

    Plain equivalent: ``(int(counts.sum()), int(np.dot(np.diff(offsets), counts)),
    int(np.count_nonzero(np.diff(offsets) == 1)))``.
    """
    cdef Py_ssize_t i, n = counts.shape[0]
    cdef int64_t total = 0, covered = 0, single = 0, length
    if offsets.shape[0] != n + 1:
        raise ValueError(f"table_sums: {offsets.shape[0]} offsets for {n} words (n_words + 1 expected)")
    with nogil:
        for i in range(n):
            length = offsets[i + 1] - offsets[i]
            total += counts[i]
            covered += length * counts[i]
            single += length == 1
    return int(total), int(covered), int(single)


def drop_one_byte_words(const uint8_t[::1] arena, const int64_t[::1] offsets, const int64_t[::1] counts):
    """The table without its words of one byte (they hold no pair), as ``array.array`` (``"B"``,
    ``"q"``, ``"q"``); None when it has none.

    >>> a, o, c = drop_one_byte_words(b"abcdef", np.array([0, 1, 3, 6]), np.array([5, 2, 1]))
    >>> bytes(a), o.tolist(), c.tolist()
    (b'bcdef', [0, 2, 5], [2, 1])

    Plain equivalent: ``pretok.wordtable.WordTable.without_singletons`` (numpy masks).
    """
    cdef Py_ssize_t i, n = counts.shape[0], n_keep = 0, n_bytes = 0, k = 0, pos = 0, length
    if offsets.shape[0] != n + 1:
        raise ValueError(f"drop_one_byte_words: {offsets.shape[0]} offsets for {n} words")
    if n and (offsets[0] != 0 or offsets[n] > arena.shape[0]):
        raise ValueError("drop_one_byte_words: offsets outside the arena")
    for i in range(n):
        length = offsets[i + 1] - offsets[i]
        if length != 1:
            n_keep += 1
            n_bytes += length
    if n_keep == n:
        return None
    cdef array.array arena_out = array.clone(_U8, n_bytes, False)
    cdef array.array offsets_out = array.clone(_I64, n_keep + 1, False)
    cdef array.array counts_out = array.clone(_I64, n_keep, False)
    cdef uint8_t* a = arena_out.data.as_uchars
    cdef int64_t* o = <int64_t*>offsets_out.data.as_voidptr
    cdef int64_t* c = <int64_t*>counts_out.data.as_voidptr
    with nogil:
        o[0] = 0
        for i in range(n):
            length = offsets[i + 1] - offsets[i]
            if length != 1:
                if length:
                    memcpy(a + pos, &arena[offsets[i]], length)
                pos += length
                c[k] = counts[i]
                k += 1
                o[k] = pos
    return arena_out, offsets_out, counts_out
