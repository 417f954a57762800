# _encode.pyx, part 4 of 10 (``include``d: compiled into the module as if written there).
# Special tokens (SpecialTable) and their longest-match search.

# ==== Special tokens =========================================================================


cdef class SpecialTable:
    """Special tokens to split out before pre-tokenization: leftmost match, longest first.

    Args:
        tokens: the special tokens as non-empty, distinct ``bytes``.
        ids: the id of each.

    Equivalent to ``patterns.specials_regex(tokens).finditer`` (alternatives sorted longest first):
    scanning left to right, the first position where any token matches wins, and there the
    longest token that matches.

    >>> t = SpecialTable([b"<s>", b"<s><s>"], [1, 2])
    >>> t.find_all(b"a<s><s><s>")
    [(1, 7, 2), (7, 10, 1)]
    """

    def __init__(self, tokens, ids):
        tokens = [bytes(t) for t in tokens]
        ids = [int(i) for i in ids]
        if len(tokens) != len(ids):
            raise ValueError("tokens and ids must have the same length")
        if any(not t for t in tokens) or len(set(tokens)) != len(tokens):
            raise ValueError("special tokens must be non-empty and distinct")
        order = sorted(range(len(tokens)), key=lambda k: (-len(tokens[k]), tokens[k]))
        cdef Py_ssize_t k, off = 0
        for k in order:
            self.offsets.push_back(off)
            self.lengths.push_back(len(tokens[k]))
            self.ids.push_back(<token_id_t>ids[k])
            for b in tokens[k]:
                self.data.push_back(<uint8_t>b)
            off += len(tokens[k])
        memset(self.c.first, 0, sizeof(self.c.first))
        firsts = {t[0] for t in tokens}
        for b in firsts:
            self.c.first[b] = 1
        self.c.only_first = next(iter(firsts)) if len(firsts) == 1 else -1
        self.c.n = len(tokens)
        self.c.data = self.data.data()
        self.c.offsets = self.offsets.data()
        self.c.lengths = self.lengths.data()
        self.c.ids = self.ids.data()

    def find_all(self, const uint8_t[::1] buf):
        """Every match ``(start, end, id)`` in ``buf``, left to right (for tests)."""
        cdef Py_ssize_t pos = 0, n = buf.shape[0], ms, me
        cdef token_id_t mid
        out = []
        while n and _find_special(&self.c, &buf[0], pos, n, n, &ms, &me, &mid):
            out.append((ms, me, int(mid)))
            pos = me
        return out

    def cut_after(self, const uint8_t[::1] buf, Py_ssize_t pos, Py_ssize_t target, Py_ssize_t end):
        """Where ``buf[pos:end]`` may be cut into texts that encode apart as they do together: the
        end of the first special token at or after ``target`` that the scan from ``pos`` finds (a
        special token ends every unit and pretoken), or ``end`` when there is none. ``pos`` must be
        where a scan of the whole text starts too: its start, or the end of a match.

        >>> t = SpecialTable([b"<s>", b"<s><s>"], [1, 2])
        >>> t.cut_after(b"ab<s><s>cd<s>e", 0, 2, 14), t.cut_after(b"ab<s><s>cd<s>e", 0, 3, 14)
        (8, 13)
        """
        cdef Py_ssize_t ms = 0, me = 0, n = buf.shape[0], cut = end
        cdef token_id_t mid
        if not 0 <= pos <= end <= n:
            raise ValueError("need 0 <= pos <= end <= len(buf)")
        with nogil:
            while pos < end and _find_special(&self.c, &buf[0], pos, end, end, &ms, &me, &mid):
                if ms >= target:
                    cut = me
                    break
                pos = me
        return cut


cdef bint _find_special(const Specials* sp, const uint8_t* s, Py_ssize_t pos, Py_ssize_t window,
                        Py_ssize_t end, Py_ssize_t* ms, Py_ssize_t* me, token_id_t* mid) noexcept nogil:
    """The leftmost special token starting in ``[pos, window)`` and ending by ``end``, longest first.

    Sets ``*ms, *me, *mid`` and returns True, or returns False when there is none.
    """
    cdef Py_ssize_t i = pos, k, length
    cdef const uint8_t* hit
    if sp.n == 0:
        return False
    while i < window:
        if sp.only_first >= 0:
            hit = <const uint8_t*>memchr(s + i, sp.only_first, window - i)
            if hit == NULL:
                return False
            i = hit - s
        else:
            while i < window and not sp.first[s[i]]:
                i += 1
            if i >= window:
                return False
        for k in range(sp.n):
            length = sp.lengths[k]
            if i + length <= end and memcmp(s + i, sp.data + sp.offsets[k], length) == 0:
                ms[0] = i
                me[0] = i + length
                mid[0] = sp.ids[k]
                return True
        i += 1
    return False
