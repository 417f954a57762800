# _encode.pyx, part 9 of 10 (``include``d: compiled into the module as if written there).
# The UTF-8 of a str (Utf8View, encode_utf8, utf8_of) and the bytes the ids stand for (sum_lengths).

# ==== The UTF-8 of a str =========================================================================

cdef extern from *:
    """
    /* The UTF-8 of str s (ready) written into the caller's scratch buffer *buf (capacity *cap
       bytes), grown first to the worst case (3 bytes a code point of a UCS-2 str) with
       bpe_enc_grow_buffer: huge pages, of which only those written are ever touched. A buffer kept
       from call to call is written, not faulted in again: a new bytes object of 5 MB of text
       faulted in some 1,200 pages on each call. Its length to *n; 0, 1 when s holds a surrogate
       (the caller leaves it to CPython), -1 when memory ran out. */
    static int bpe_utf8_into(PyObject* s, char** buf, size_t* cap, Py_ssize_t* n) {
        int kind = PyUnicode_KIND(s);
        Py_ssize_t len = PyUnicode_GET_LENGTH(s);
        size_t need;
        char* end;
        void* grown;
        if (len > PY_SSIZE_T_MAX / 8)
            return -1;
        need = (size_t)len * (kind == 1 ? 2 : kind == 2 ? 3 : 4) + 8;
        if (need > *cap) {
            grown = bpe_enc_grow_buffer(*buf, 0, need, 1);
            if (grown == NULL)
                return -1;
            *buf = (char*)grown;
            *cap = need;
        }
        end = bpe_utf8_write(PyUnicode_DATA(s), kind, len, *buf);
        if (end == NULL)
            return 1;
        *n = end - *buf;
        return 0;
    }
    """
    int utf8_into "bpe_utf8_into"(object s, char** buf, size_t* cap, Py_ssize_t* n)


cdef object _text_in(Encoder enc, object text, const uint8_t** p, Py_ssize_t* n):
    """The bytes a native pass reads for ``text`` (``p[0]``, ``n[0]``; NULL when empty): a ``str``'s
    own UTF-8 when it holds it, else written into ``enc``'s scratch buffer (kept from call to call:
    ``_text_done`` after the pass), or for a ``str`` with a surrogate its ``surrogateescape``
    bytes; a bytes-like buffer in place. Returns what the caller holds while the bytes are read."""
    cdef int got
    cdef const uint8_t[::1] view
    p[0] = NULL
    n[0] = 0
    if type(text) is str:
        p[0] = <const uint8_t*>utf8_if_free(text, n)
        if p[0] != NULL:
            return text
        got = utf8_into(text, &enc.text_buf, &enc.text_cap, n)
        if got < 0:
            raise MemoryError()
        if got == 0:
            p[0] = <const uint8_t*>enc.text_buf
            return None
        keep = (<str>text).encode("utf-8", "surrogateescape")      # CPython's surrogateescape rules
        p[0] = <const uint8_t*>PyBytes_AS_STRING(keep)
        n[0] = PyBytes_GET_SIZE(keep)
        return keep
    view = text
    n[0] = view.shape[0]
    if n[0]:
        p[0] = &view[0]
    return view


cdef void _text_done(Encoder enc) noexcept:
    """After a pass over ``_text_in``'s bytes: a scratch buffer past ``TEXT_KEEP`` bytes goes."""
    if enc.text_cap > TEXT_KEEP:
        free(enc.text_buf)
        enc.text_buf = NULL
        enc.text_cap = 0


@cython.final
cdef class Utf8View:
    """A read-only buffer over the UTF-8 that CPython keeps in a ``str`` (see :func:`utf8_of`);
    it holds the ``str``, so the bytes stay valid while the view lives."""
    cdef object text
    cdef const char* p
    cdef Py_ssize_t n

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, <void*>self.p, self.n, 1, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __len__(self):
        return self.n


cdef object _encode_utf8(str text):
    """``text.encode("utf-8", "surrogateescape")``: our encoder (``bpe_utf8_bytes``),
    CPython's where ``text`` holds a surrogate."""
    cdef PyObject* got = utf8_bytes(text)
    if got == NULL:
        return text.encode("utf-8", "surrogateescape")
    result = <object>got
    decref(got)
    return result


def encode_utf8(str text not None):
    """``text.encode("utf-8", "surrogateescape")`` (a new ``bytes``; the converter of ``utf8_of``
    and ``BatchJob``, exposed for tests).

    >>> encode_utf8("hi é€😀\\udcff"), encode_utf8("a" * 9 + "ÿ")
    (b'hi \\xc3\\xa9\\xe2\\x82\\xac\\xf0\\x9f\\x98\\x80\\xff', b'aaaaaaaaa\\xc3\\xbf')
    """
    return _encode_utf8(text)


def utf8_of(str text not None):
    """The UTF-8 of ``text`` with ``surrogateescape``, as a buffer: ``text.encode("utf-8",
    "surrogateescape")`` without the copy where the ``str`` holds it already. An ASCII ``str`` is
    its own UTF-8 (no copy); another ``str`` whose UTF-8 CPython made and kept before
    (``PyUnicode_AsUTF8``) is read there. Any other ``str`` is encoded as before: making and
    keeping its UTF-8 (``PyUnicode_AsUTF8AndSize``, as tiktoken's binding does) cost ~30% more CPU
    than ``encode`` for a ``str`` seen once, and doubles its memory.

    >>> bytes(utf8_of("hi é")), bytes(utf8_of("a\\udcff")), len(utf8_of("€")), type(utf8_of("ab")).__name__
    (b'hi \\xc3\\xa9', b'a\\xff', 3, 'Utf8View')
    """
    cdef Py_ssize_t size = 0
    cdef const char* p = utf8_if_free(text, &size)
    cdef Utf8View view
    if p == NULL:                                   # no UTF-8 kept
        return _encode_utf8(text)
    view = Utf8View.__new__(Utf8View)
    view.text = text
    view.p = p
    view.n = size
    return view


# ==== Bytes the ids stand for ====================================================================

@cython.boundscheck(False)
@cython.wraparound(False)
def sum_lengths(const int64_t[::1] lengths not None, const uint32_t[::1] ids not None):
    """``lengths[ids].sum()`` without the gathered copy (the corpus encoder's conservation check,
    block by block); -1 when an id is outside ``lengths``.

    >>> sum_lengths(np.array([1, 2, 3], np.int64), np.array([2, 2, 0], np.uint32))
    7
    >>> sum_lengths(np.ones(2, np.int64), np.array([5], np.uint32))
    -1
    """
    cdef Py_ssize_t k, n = ids.shape[0], m = lengths.shape[0]
    cdef int64_t total = 0
    cdef uint32_t x
    with nogil:
        for k in range(n):
            x = ids[k]
            if x >= m:
                total = -1
                break
            total += lengths[x]
    return total
