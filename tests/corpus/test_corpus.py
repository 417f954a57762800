"""Chunk boundaries never change pre-tokenization: chunked == whole text, for every pattern."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core import corpus, reference
from bpe_core.corpus.specials import split_on_specials

from strategies import corpus_text

NAMED = ["gpt2", "cl100k", "o200k"]


def pieces(data: bytes, specials, pattern):
    out = []
    for piece, is_special in split_on_specials(data, specials):
        out.extend([piece] if is_special else reference.pretokenize(piece, pattern))
    return out


def chunked_pieces(data: bytes, chunk_bytes, specials, pattern):
    bounds = corpus.chunk_boundaries(data, chunk_bytes, specials, pattern)
    assert bounds[0] == 0 and bounds[-1] == len(data) and bounds == sorted(set(bounds))
    out = []
    for s, e in zip(bounds[:-1], bounds[1:]):
        out.extend(pieces(data[s:e], specials, pattern))
    return out, bounds


# Lines that invite cuts: newlines between all kinds of neighbours.
line_text = st.lists(st.sampled_from(["a", "B", "1", ".", "/", " ", "\n", "\r\n", "\n\n", "'s", "é", "\t", "日", "-"]),
                     max_size=60).map("".join)


@pytest.mark.parametrize("pattern", NAMED)
@given(st.one_of(line_text, corpus_text), st.integers(1, 12))
def test_chunked_pretokens_equal_whole_text(pattern, text, chunk_bytes):
    data = text.encode("utf-8", "surrogatepass")
    specials = [b"<|endoftext|>"]
    got, _ = chunked_pieces(data, chunk_bytes, specials, pattern)
    assert got == pieces(data, specials, pattern)


@given(st.lists(st.sampled_from(["<a>", "<a><b>", "<b>", "x", "<", ">", "a", "\n"]), max_size=30).map("".join),
       st.integers(1, 6))
def test_overlapping_special_tokens_cut_where_the_whole_scan_does(text, chunk_bytes):
    data = text.encode()
    specials = [b"<a>", b"<a><b>", b"<b>"]
    got, _ = chunked_pieces(data, chunk_bytes, specials, "gpt2")
    assert got == pieces(data, specials, "gpt2")


def test_user_pattern_is_cut_only_at_special_tokens():
    data = b"one\ntwo\nthree<|endoftext|>four\nfive"
    bounds = corpus.chunk_boundaries(data, 2, [b"<|endoftext|>"], r"\w+|\s+")
    assert bounds == [0, 13, len(data)]


def test_long_document_without_specials_is_cut_at_safe_newlines():
    data = b"".join(b"line %d here.\n" % i for i in range(1000))
    bounds = corpus.chunk_boundaries(data, 1000, [], "gpt2")
    assert len(bounds) > 10
    assert all(data[b - 1:b] == b"\n" for b in bounds[1:-1])


def test_text_spans_and_specials():
    data = b"<|endoftext|>ab<|endoftext|><|endoftext|>c"
    spans = corpus.text_spans(data, 0, len(data), [b"<|endoftext|>"])
    assert [data[s:e] for s, e in spans] == [b"ab", b"c"]
    assert corpus.count_specials(data, 0, len(data), [b"<|endoftext|>"]) == 3


def test_bad_inputs_name_the_file(tmp_path):
    with pytest.raises(corpus.CorpusError, match="no such file"):
        corpus.open_corpus(tmp_path / "missing.txt")
    with pytest.raises(corpus.CorpusError, match="is a directory"):
        corpus.open_corpus(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert corpus.open_corpus(empty).shape == (0,)


@pytest.mark.parametrize("pattern", NAMED)
def test_one_long_line_is_cut_between_words(pattern):
    words = ["alpha", "Beta", "gamma's", "x", "123", "--", "é", "delta"]
    data = " ".join(words[i % len(words)] for i in range(3000)).encode()      # no newline, no special
    got, bounds = chunked_pieces(data, 500, [], pattern)
    assert len(bounds) > 20
    assert got == pieces(data, [], pattern)
