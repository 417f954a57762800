/* The native pre-tokenizer's fast path: the pretoken boundaries of 64 ASCII bytes at once.
 *
 * _pretok.pyx scans a text one pretoken at a time (its _end_<pattern> scanners, exact on any
 * input). Most text is ASCII, where every class the patterns ask about is a byte class: letters
 * [A-Za-z] (upper [A-Z], lower [a-z] for o200k), digits [0-9], whitespace [\t\n\v\f\r ], and
 * "other", the rest. There, whether a pretoken starts at a byte depends only on the bytes around
 * it (a few back, one or two ahead) and, inside a whitespace run, on where the run ends. So
 * bpe_ascii_window classifies 64 bytes into bit masks (SSE2: 16 bytes a compare; elsewhere a byte
 * loop), computes the mask of pretoken starts with shifts, ands and ors, and writes the starts as
 * ends with one count-trailing-zeros each: no branch per byte and about one per pretoken.
 *
 * Contract: i is a pretoken start of the span being scanned and s[i:i+64] lies inside the span (the
 * span goes on after it, i + 64 <= n). The window writes the pretoken ends in (i, i+64) that it can
 * prove from these 64 bytes, in order, and returns how many (0: nothing proven; the caller then
 * takes one pretoken with the exact scanner). Not proven, so left to the next window or the exact
 * scanner: anything at or after the first byte >= 0x80 (and the two bytes before it), the last two
 * bytes, and a whitespace run that reaches them (its splits depend on where it ends). *stop is set
 * to the byte after the first non-ASCII byte of the window (or 0): the caller scans exactly up to
 * there before trying a window again.
 *
 * The rules, per pattern, with "prev" the byte before (none before the window: i is a start):
 *   gpt2   '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *     A class run (letters, digits, others, whitespace) starts a pretoken; a space before a
 *     letter/digit/other joins it; a whitespace run of 2+ followed by non-space gives its last
 *     character back (\s+(?!\S)); an apostrophe that starts a pretoken (prev not other, not a space)
 *     followed by s d m t / ll ve re is a pretoken of its own (case-sensitive).
 *   cl100k '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|
 *          \s++$|\s*[\r\n]|\s+(?!\S)|\s
 *     Letters take one prefix character that starts a pretoken and is not CR/LF (an other, or the
 *     last whitespace of a run); digits come in threes; an other run takes the CR/LF run after it;
 *     a whitespace run ends a pretoken after its last CR/LF; contractions any case.
 *   o200k  [^\r\n\p{L}\p{N}]?[\p{Lu}...]*[\p{Ll}...]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|...
 *          |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *     As cl100k, but an upper-case letter after a lower-case one starts a pretoken, a contraction
 *     is the suffix of the letters before it, and an other run takes a [\r\n/] run after it.
 * The tests compare the windows with regex on random and adversarial texts (tests/pretok).
 */
#ifndef BPE_ASCII_WINDOW_H
#define BPE_ASCII_WINDOW_H

#include <stdint.h>
#include <string.h>
#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define BPE_AW_SSE2 1
#endif
#if defined(_MSC_VER)
#include <intrin.h>
#endif

enum { BPE_AW_GPT2 = 0, BPE_AW_CL100K = 1, BPE_AW_O200K = 2 };

static inline int bpe_aw_ctz(uint64_t w) {
#if defined(_MSC_VER)
    unsigned long k; _BitScanForward64(&k, w); return (int)k;
#else
    return __builtin_ctzll(w);
#endif
}

static inline int bpe_aw_clz(uint64_t w) {
#if defined(_MSC_VER)
    unsigned long k; _BitScanReverse64(&k, w); return 63 - (int)k;
#else
    return __builtin_clzll(w);
#endif
}

/* Bit k of each mask is byte k of the window. */
typedef struct {
    uint64_t hi;    /* >= 0x80 */
    uint64_t let;   /* [A-Za-z] */
    uint64_t up;    /* [A-Z] */
    uint64_t dig;   /* [0-9] */
    uint64_t ws;    /* [\t\n\v\f\r ] */
    uint64_t sp;    /* ' ' */
    uint64_t crlf;  /* \r \n */
    uint64_t apos;  /* ' */
    uint64_t slash; /* / */
} bpe_aw_masks;

/* Byte classes for the portable path: bit 0 letter, 1 upper, 2 digit, 3 whitespace, 4 space,
 * 5 CR/LF, 6 apostrophe, 7 slash (8: >= 0x80, computed). */
static inline unsigned bpe_aw_class(uint8_t c) {
    unsigned f = 0;
    if ((uint8_t)((c | 0x20) - 0x61) < 26) f |= 1;
    if ((uint8_t)(c - 0x41) < 26) f |= 2;
    if ((uint8_t)(c - 0x30) < 10) f |= 4;
    if (c == 0x20 || (c >= 0x09 && c <= 0x0D)) f |= 8;
    if (c == 0x20) f |= 16;
    if (c == 0x0A || c == 0x0D) f |= 32;
    if (c == 0x27) f |= 64;
    if (c == 0x2F) f |= 128;
    return f;
}

#if defined(_MSC_VER)
#define BPE_AW_INLINE static __forceinline
#else
#define BPE_AW_INLINE static inline __attribute__((always_inline))
#endif

#if defined(BPE_AW_SSE2)
static inline uint64_t bpe_aw_mm(__m128i m, int k) {
    return (uint64_t)(uint32_t)_mm_movemask_epi8(m) << (16 * k);
}
/* Bytes of v in [lo, lo + n) (n < 128), as 0xFF: one add and one signed compare (the range moved
 * to the bottom of the signed bytes, -128..-128+n). */
static inline __m128i bpe_aw_range(__m128i v, int lo, int n) {
    return _mm_cmplt_epi8(_mm_add_epi8(v, _mm_set1_epi8((char)(0x80 - lo))),
                          _mm_set1_epi8((char)(n - 128)));
}
#endif

/* The masks of the window at p that `pattern` reads (a constant where this is inlined: gpt2 needs
 * no up, crlf, slash; cl100k no up, slash); hi (bytes >= 0x80) is given. */
BPE_AW_INLINE void bpe_aw_classify(int pattern, const uint8_t* p, uint64_t hi, bpe_aw_masks* m) {
#if defined(BPE_AW_SSE2)
    int k;
    memset(m, 0, sizeof(*m));
    m->hi = hi;
    for (k = 0; k < 4; k++) {
        __m128i v = _mm_loadu_si128((const __m128i*)(p + 16 * k));
        __m128i sp = _mm_cmpeq_epi8(v, _mm_set1_epi8(0x20));
        m->let |= bpe_aw_mm(bpe_aw_range(_mm_or_si128(v, _mm_set1_epi8(0x20)), 0x61, 26), k);
        m->dig |= bpe_aw_mm(bpe_aw_range(v, 0x30, 10), k);
        m->ws |= bpe_aw_mm(_mm_or_si128(sp, bpe_aw_range(v, 0x09, 5)), k);
        m->sp |= bpe_aw_mm(sp, k);
        m->apos |= bpe_aw_mm(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x27)), k);
        if (pattern != BPE_AW_GPT2)
            m->crlf |= bpe_aw_mm(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x0A)),
                                              _mm_cmpeq_epi8(v, _mm_set1_epi8(0x0D))), k);
        if (pattern == BPE_AW_O200K) {
            m->up |= bpe_aw_mm(bpe_aw_range(v, 0x41, 26), k);
            m->slash |= bpe_aw_mm(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x2F)), k);
        }
    }
#else
    int k;
    (void)pattern;
    memset(m, 0, sizeof(*m));
    m->hi = hi;
    for (k = 0; k < 64; k++) {
        unsigned f = bpe_aw_class(p[k]);
        uint64_t b = (uint64_t)1 << k;
        if (f & 1) m->let |= b;
        if (f & 2) m->up |= b;
        if (f & 4) m->dig |= b;
        if (f & 8) m->ws |= b;
        if (f & 16) m->sp |= b;
        if (f & 32) m->crlf |= b;
        if (f & 64) m->apos |= b;
        if (f & 128) m->slash |= b;
    }
#endif
}

/* The end of the contraction at an apostrophe at window offset a (its next two bytes read), or 0:
 * [sdmt] then ll|ve|re, case-sensitive for gpt2, ASCII case-insensitive otherwise (c | 0x20 maps
 * only A-Z onto a-z among the bytes that can reach a-z). */
static inline int bpe_aw_contraction(const uint8_t* w, int a, int fold) {
    uint8_t c1 = w[a + 1] | (uint8_t)fold, c2 = w[a + 2] | (uint8_t)fold;
    if (c1 == 's' || c1 == 'd' || c1 == 'm' || c1 == 't') return a + 2;
    if ((c1 == 'l' && c2 == 'l') || (c1 == 'v' && c2 == 'e') || (c1 == 'r' && c2 == 'e')) return a + 3;
    return 0;
}

/* Runs of `run` that start at a bit of `mark` (each run holding at most one mark; carries do not
 * leave a run, as the bit after a run is 0). */
static inline uint64_t bpe_aw_fill(uint64_t run, uint64_t mark) {
    return run & ~(run + mark);
}

/* The bytes >= 0x80 of the window. */
static inline uint64_t bpe_aw_high(const uint8_t* p) {
#if defined(BPE_AW_SSE2)
    int k;
    uint64_t hi = 0;
    for (k = 0; k < 4; k++)
        hi |= bpe_aw_mm(_mm_loadu_si128((const __m128i*)(p + 16 * k)), k);
    return hi;
#else
    int k;
    uint64_t hi = 0;
    for (k = 0; k < 64; k++)
        if (p[k] >= 0x80) hi |= (uint64_t)1 << k;
    return hi;
#endif
}

/* The pretoken starts in (i, i + 64) that the 64 bytes at s[i] prove, as a mask (bit k: byte i + k;
 * 0: nothing proven); see the contract above. Inlined with a constant pattern. */
BPE_AW_INLINE uint64_t bpe_aw_starts(int pattern, const uint8_t* s, int64_t i, int64_t* stop) {
    const uint8_t* w = s + i;
    bpe_aw_masks m;
    uint64_t let, dig, ws, oth, starts, x, valid, hi = bpe_aw_high(w);
    int lim = 63, q = 64, a, e;
    *stop = 0;
    if (hi) {
        q = bpe_aw_ctz(hi);
        if (q < 16) {  /* non-ASCII text: the exact scanner takes it past the last such byte of
                          the window's first half (all of it in CJK text, the next accent in Latin) */
            *stop = i + 64 - bpe_aw_clz(hi & 0xFFFFFFFFu);
            return 0;
        }
        *stop = i + q + 1;
        lim = q - 1;  /* a start at p needs byte p + 1 known */
    }
    bpe_aw_classify(pattern, w, hi, &m);
    let = m.let;
    dig = m.dig;
    ws = m.ws;
    oth = ~(let | dig | ws | m.hi);

    if (pattern == BPE_AW_GPT2) {
        uint64_t a_starts;
        starts = (let & ~(let << 1)) | (dig & ~(dig << 1)) | (oth & ~(oth << 1))
                 | (ws & ~(ws << 1)) | (ws & (ws << 1) & ~(ws >> 1));
        starts &= ~((m.sp << 1) & ~ws);  /* " ?X+": a space before a non-space joins it */
        a_starts = m.apos & ~(oth << 1) & ~(m.sp << 1);
        while (a_starts) {
            a = bpe_aw_ctz(a_starts);
            a_starts &= a_starts - 1;
            if (a + 2 >= q) {  /* its next two bytes must be ASCII and in the window */
                if (a < lim) lim = a;
                break;
            }
            e = bpe_aw_contraction(w, a, 0);
            if (e) {
                starts &= ~((uint64_t)1 << (a + 1));
                if (e < 64) starts |= (uint64_t)1 << e;
            }
        }
    } else {
        int o200k = pattern == BPE_AW_O200K;
        /* An other run takes the [\r\n]* (cl100k) or [\r\n/]* (o200k) run after it: from a CR/LF
         * after an other to the end of that run. In cl100k only a run's first CR/LF can follow an
         * other; in o200k a run such as \n/\n holds two, the second inside the first's tail. */
        uint64_t absorbed, marks = m.crlf & (oth << 1), oeff;
        if (o200k) {
            uint64_t tail = m.crlf | m.slash;
            absorbed = 0;
            while (marks) {
                uint64_t run = bpe_aw_fill(tail, marks & (~marks + 1));
                absorbed |= run;
                marks &= ~run;
            }
        } else {
            absorbed = bpe_aw_fill(m.crlf, marks);
        }
        uint64_t weff = ws & ~absorbed, ws2, o_starts, l_starts, g, n3, c;
        oeff = oth & ~absorbed;
        o_starts = oeff & ~(oeff << 1) & ~(m.sp << 1);  /* " ?O+": a space takes the others */
        l_starts = let & ~(let << 1);
        /* A letter run after a prefix that starts a pretoken (an other, a whitespace not CR/LF) */
        l_starts &= ~((o_starts | (weff & ~m.crlf)) << 1);
        if (o200k) l_starts |= m.up & ((let & ~m.up) << 1);
        /* \p{N}{1,3}: a digit run starts a pretoken every three digits */
        g = dig & ~(dig << 1);
        n3 = dig & (dig << 1) & (dig << 2);
        x = g;
        while ((x = (x << 3) & n3) != 0) g |= x;
        ws2 = weff & ~m.crlf;
        starts = l_starts | o_starts | g | (weff & ~(weff << 1))
                 | (ws2 & (weff << 1) & ~(weff >> 1));  /* \s+(?!\S) gives the last back */
        /* \s*[\r\n]: a run goes on after its last CR/LF when no CR/LF follows in it */
        c = ws2 & ((weff & m.crlf) << 1);
        while (c) {
            int p = bpe_aw_ctz(c), r;
            uint64_t after;
            c &= c - 1;
            after = ~(ws2 >> p);
            if (!after) break;  /* runs out of the window: cut below */
            r = p + bpe_aw_ctz(after);
            if (r < 64 && !((m.crlf >> r) & 1)) starts |= (uint64_t)1 << p;
        }
        if (o200k) {
            /* a contraction after letters is their suffix (not after another contraction) */
            uint64_t cand = m.apos & (let << 1);
            int last_end = 0;
            while (cand) {
                a = bpe_aw_ctz(cand);
                cand &= cand - 1;
                if (a + 2 >= q) {
                    if (a < lim) lim = a;
                    break;
                }
                if (a <= last_end) continue;
                e = bpe_aw_contraction(w, a, 0x20);
                if (e) {
                    starts &= ~((((uint64_t)1 << (e - a)) - 1) << a);  /* 'rE: not at E */
                    if (e < 64) starts |= (uint64_t)1 << e;
                    last_end = e;
                }
            }
        } else {
            uint64_t a_starts = m.apos & o_starts;
            while (a_starts) {
                a = bpe_aw_ctz(a_starts);
                a_starts &= a_starts - 1;
                if (a + 2 >= q) {
                    if (a < lim) lim = a;
                    break;
                }
                e = bpe_aw_contraction(w, a, 0x20);
                if (e && e < 64) starts |= (uint64_t)1 << e;
            }
        }
    }
    /* A whitespace run through bytes lim - 1 and lim: its splits are not known; stop at its start. */
    if (((ws >> (lim - 1)) & 3) == 3) {
        x = ~ws & (((uint64_t)1 << (lim - 1)) - 1);
        lim = x ? 64 - bpe_aw_clz(x) : 0;  /* the run's first byte: a start, kept */
        lim += 1;
    }
    if (lim < 2) return 0;
    valid = (((uint64_t)1 << lim) - 1) & ~(uint64_t)1;
    return starts & valid;
}

/* The starts of a window as pretoken ends (a start is the end of the pretoken before it): how many. */
static inline int bpe_aw_write(uint64_t starts, int64_t i, int64_t* ends) {
    int k = 0;
    while (starts) {
        ends[k++] = i + bpe_aw_ctz(starts);
        starts &= starts - 1;
    }
    return k;
}

static inline int bpe_ascii_window(int pattern, const uint8_t* s, int64_t i, int64_t* ends,
                                   int64_t* stop) {
    uint64_t starts;
    if (pattern == BPE_AW_GPT2) starts = bpe_aw_starts(BPE_AW_GPT2, s, i, stop);
    else if (pattern == BPE_AW_CL100K) starts = bpe_aw_starts(BPE_AW_CL100K, s, i, stop);
    else starts = bpe_aw_starts(BPE_AW_O200K, s, i, stop);
    return bpe_aw_write(starts, i, ends);
}

#endif
