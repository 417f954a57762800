/* The counters' hot loop: a batch of pretokens against the front cache (see "The plain count" in
 * _pretok.pyx).
 *
 * A front slot holds a word of up to BPE_SHORT_MAX (15) bytes keyed by two words: its first 8 bytes
 * (zero-padded, little-endian) and the next 7 with its length in the top byte (the 16th byte of
 * such a word is padding, so this is one-to-one; a longer word's top byte gets bit 4 set, so it
 * matches no slot). A batch of pretokens is taken in two passes: the first keys each pretoken as
 * the scanner finds it (bpe_cf_window inside a 64-byte window, straight from its start mask;
 * bpe_cf_key after the exact scanner) and requests its front slot, so the slots' cache misses
 * overlap with the scanning; the second (bpe_front_hits) compares each with its slot and counts a
 * hit in place, without a branch: every pretoken writes its number to the miss list, and only a
 * miss moves the list on. The misses (new words, evicted words, longer words) go back to the caller
 * with their keys.
 */
#ifndef BPE_COUNT_FRONT_H
#define BPE_COUNT_FRONT_H

#include <stdint.h>
#include <string.h>
#include "_ascii_window.h"

enum { BPE_SHORT_MAX = 15 };

/* The layout of _pretok.pxd's FrontSlot (32 bytes). */
typedef struct {
    uint64_t w0;
    uint64_t w1;      /* bytes 8..14 and the length in the top byte (bpe_front_count's key) */
    uint32_t base;    /* its age: (uint32_t)pending - base (_pretok_counter.pxi, _flush_short) */
    uint32_t idx;     /* its slot in the short table */
    int64_t pending;  /* counts not yet added there */
} bpe_front_slot;

/* [min(length, 16)] -> the masks of the two head words and the tag of the second. */
static const uint64_t bpe_cf_masks[17][4] = {
    {0x0000000000000000ULL, 0x0000000000000000ULL, 0x0000000000000000ULL, 0},
    {0x00000000000000FFULL, 0x0000000000000000ULL, 0x0100000000000000ULL, 0},
    {0x000000000000FFFFULL, 0x0000000000000000ULL, 0x0200000000000000ULL, 0},
    {0x0000000000FFFFFFULL, 0x0000000000000000ULL, 0x0300000000000000ULL, 0},
    {0x00000000FFFFFFFFULL, 0x0000000000000000ULL, 0x0400000000000000ULL, 0},
    {0x000000FFFFFFFFFFULL, 0x0000000000000000ULL, 0x0500000000000000ULL, 0},
    {0x0000FFFFFFFFFFFFULL, 0x0000000000000000ULL, 0x0600000000000000ULL, 0},
    {0x00FFFFFFFFFFFFFFULL, 0x0000000000000000ULL, 0x0700000000000000ULL, 0},
    {0xFFFFFFFFFFFFFFFFULL, 0x0000000000000000ULL, 0x0800000000000000ULL, 0},
    {0xFFFFFFFFFFFFFFFFULL, 0x00000000000000FFULL, 0x0900000000000000ULL, 0},
    {0xFFFFFFFFFFFFFFFFULL, 0x000000000000FFFFULL, 0x0A00000000000000ULL, 0},
    {0xFFFFFFFFFFFFFFFFULL, 0x0000000000FFFFFFULL, 0x0B00000000000000ULL, 0},
    {0xFFFFFFFFFFFFFFFFULL, 0x00000000FFFFFFFFULL, 0x0C00000000000000ULL, 0},
    {0xFFFFFFFFFFFFFFFFULL, 0x000000FFFFFFFFFFULL, 0x0D00000000000000ULL, 0},
    {0xFFFFFFFFFFFFFFFFULL, 0x0000FFFFFFFFFFFFULL, 0x0E00000000000000ULL, 0},
    {0xFFFFFFFFFFFFFFFFULL, 0x00FFFFFFFFFFFFFFULL, 0x0F00000000000000ULL, 0},
    {0xFFFFFFFFFFFFFFFFULL, 0xFFFFFFFFFFFFFFFFULL, 0x1000000000000000ULL, 0},
};

static inline uint64_t bpe_cf_load_le64(const uint8_t* p) {
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* The front slot of a key. */
static inline uint64_t bpe_cf_index(uint64_t w0, uint64_t w1, uint64_t mask) {
    return ((w0 ^ (w1 * 0xC2B2AE3D27D4EB4FULL)) * 0x9E3779B97F4A7C15ULL >> 40) & mask;
}

#if defined(_MSC_VER)
#include <xmmintrin.h>
#define bpe_cf_prefetch(p) _mm_prefetch((const char*)(p), _MM_HINT_T0)
#else
#define bpe_cf_prefetch(p) __builtin_prefetch((const void*)(p))
#endif

/* Pretoken k = p[0:length]: its key into keys[2k], keys[2k+1], its front slot into fronts[k] (and
 * requested). Reads 16 bytes at p when they lie before limit (the end of the buffer). */
BPE_AW_INLINE void bpe_cf_key(
        const uint8_t* p, uint64_t length, const uint8_t* limit, const bpe_front_slot* front,
        uint64_t front_mask, uint64_t* keys, uint32_t* fronts, size_t k) {
    uint64_t m = length < 16 ? length : 16, w0, w1, f;
    if (p + 16 <= limit) {
        w0 = bpe_cf_load_le64(p);
        w1 = bpe_cf_load_le64(p + 8);
    } else {
        uint8_t tmp[16];
        memset(tmp, 0, 16);
        memcpy(tmp, p, (size_t)m);
        w0 = bpe_cf_load_le64(tmp);
        w1 = bpe_cf_load_le64(tmp + 8);
    }
    w0 &= bpe_cf_masks[m][0];
    w1 = (w1 & bpe_cf_masks[m][1]) | bpe_cf_masks[m][2];
    f = bpe_cf_index(w0, w1, front_mask);
    bpe_cf_prefetch(front + f);
    keys[2 * k] = w0;
    keys[2 * k + 1] = w1;
    fronts[k] = (uint32_t)f;
}

/* The pretokens a 64-byte window proves at s[i] (bpe_aw_starts, needs i + 64 <= the span's end),
 * keyed as they are found (no pass over their ends): ends, keys and front slots from k on; the new
 * k (at most 62 more). Inlined with a constant pattern. */
BPE_AW_INLINE size_t bpe_cf_window(
        int pattern, const uint8_t* s, int64_t i, int64_t* stop, const uint8_t* limit,
        const bpe_front_slot* front, uint64_t front_mask, int64_t* ends, uint64_t* keys,
        uint32_t* fronts, size_t k) {
    uint64_t starts = bpe_aw_starts(pattern, s, i, stop);
    int64_t a = i;
    while (starts) {
        int64_t b = i + bpe_aw_ctz(starts);
        starts &= starts - 1;
        bpe_cf_key(s + a, (uint64_t)(b - a), limit, front, front_mask, keys, fronts, k);
        ends[k++] = b;
        a = b;
    }
    return k;
}

/* The second pass over keyed pretokens 0..got-1: count the hits in their front slots (pending += 1),
 * the numbers k of the misses into misses, in order; how many. */
static inline size_t bpe_front_hits(const uint64_t* keys, const uint32_t* fronts, size_t got,
                                    bpe_front_slot* front, uint32_t* misses) {
    size_t k, n_misses = 0;
    for (k = 0; k < got; k++) {
        bpe_front_slot* f = front + fronts[k];
        uint64_t hit = (uint64_t)((f->w0 == keys[2 * k]) & (f->w1 == keys[2 * k + 1]));
        f->pending += (int64_t)hit;
        misses[n_misses] = (uint32_t)k;
        n_misses += hit ^ 1;
    }
    return n_misses;
}

#endif
