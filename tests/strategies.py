"""Hypothesis strategies for corpora: random, adversarial and tie-heavy text."""
from hypothesis import strategies as st

from bpe_core.corpus import compressed_format

SPECIAL = "<|endoftext|>"

# Letters of several scripts, digits, spaces of several kinds, punctuation, apostrophes, marks.
ALPHABET = st.sampled_from(
    list("aabbcdeeé ss  \n\n\t'0123.,!?-") + ["ß", "я", "日", "한", "\u0301", "\u00a0", "\r\n", "'s", "'LL", "٣"]
)

random_text = st.lists(ALPHABET, max_size=80).map("".join)
tie_heavy = st.lists(st.sampled_from(["ab", "ba", " ab", " ba", "ab ", "aa", "bb", " "]), max_size=40).map("".join)
runs = st.lists(st.tuples(st.sampled_from("ab "), st.integers(1, 9)), max_size=12).map(
    lambda parts: "".join(c * n for c, n in parts))


def _with_specials(pieces):
    return st.lists(st.one_of(pieces, st.just(SPECIAL)), max_size=8).map("".join)


corpus_text = st.one_of(random_text, tie_heavy, runs, _with_specials(st.one_of(random_text, tie_heavy, runs)))
corpus_bytes = st.one_of(
    corpus_text.map(lambda s: s.encode("utf-8")),
    # (a file that starts like a compressed stream is refused as such: corpus.compressed_format)
    st.binary(max_size=120).filter(lambda b: compressed_format(b[:64]) is None),
    # valid text with invalid bytes spliced in (lone continuation bytes, truncated sequences)
    st.tuples(corpus_text, st.sampled_from([b"\x80", b"\xe2\x82", b"\xff", b"\xc3", b"\xed\xa0\x80"]), corpus_text)
    .map(lambda t: t[0].encode() + t[1] + t[2].encode()),
)
