# The C types shared by the kernels, each with the reason it exists. Python code sees them as the
# numpy dtypes named in bpe_core/_typedefs.pyi (tests check the sizes match).
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

# A token id or a symbol of a word. uint32 allows 4 G ids; vocabularies are < 1 M.
ctypedef uint32_t token_id_t
# A count: pretoken and pair counts over a 15 GB corpus exceed 2**31, so always 64 bits.
ctypedef int64_t count_t
# An index into the word table (unique pretokens, or stage-2 units). uint32: < 4 G words.
ctypedef uint32_t word_id_t
# An index into the engine's pair arrays.
ctypedef uint32_t pair_id_t
# (left << 32) | right, the hash key of a pair.
ctypedef uint64_t pair_key_t


cdef inline pair_key_t pack_pair(token_id_t left, token_id_t right) noexcept nogil:
    return (<pair_key_t>left << 32) | <pair_key_t>right


cdef inline token_id_t pair_left(pair_key_t key) noexcept nogil:
    return <token_id_t>(key >> 32)


cdef inline token_id_t pair_right(pair_key_t key) noexcept nogil:
    return <token_id_t>(key & 0xFFFFFFFFu)
