"""The single-thread whole-text path, ``Encoder.encode_all`` (what ``Tokenizer.encode``,
``encode_ordinary`` and ``encode_to_numpy`` call), against the plain passes it replaces:

* a ``str`` of any kind (ASCII, Latin-1, UCS-2, UCS-4, escaped surrogates) converted into the
  encoder's kept scratch buffer gives the ids of its ``surrogateescape`` UTF-8 bytes through
  ``encode_text`` on a fresh encoder, call after call on one encoder (the scratch holds the bytes of
  the texts before: longer, shorter, other kinds), and the list form equals the array form;
* bytes, bytearray, memoryview and uint8 arrays give the ids of the same bytes; a str with a lone
  surrogate outside the escape range raises as ``str.encode`` does;
* the pipelined probes of ``_emit_pieces`` (hashed ``LOOKAHEAD`` pieces ahead of the probe) equal
  merging each piece alone, with empty pieces and pieces too long to cache among them;
* a cache whose slot table grows past 2 MiB (allocated in huge pages) gives the ids of one that is
  cleared before it grows;
* GPT-2's ids equal tiktoken's through ``encode`` on random text, one tokenizer throughout.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.encode import _encode
from bpe_core.encode.tokenizer import Tokenizer

from encode_helpers import EOT, SETTINGS, gpt2_tiktoken, gpt2_tokenizer, small_model

# Every kind of str: CPython stores a str in 1, 2 or 4 bytes a code point by its largest one, and
# only an ASCII str is its own UTF-8 (the others go through the scratch buffer).
ALPHABETS = ["ab c\n", "ab é\xff", "a €中”", "a 😀\U0010ffff€", "a\udcff\udce2 b"]
KIND_TEXT = st.sampled_from(ALPHABETS).flatmap(
    lambda alphabet: st.lists(st.sampled_from(list(alphabet)) | st.sampled_from([EOT, "<|", " the", "'s", "  "]),
                              max_size=200).map("".join))
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300) | KIND_TEXT


def _fresh_ids(tok, data: bytes, specials: bool = True) -> list[int]:
    """The ids of ``data`` by ``encode_text`` on a new encoder (the plain path, no scratch)."""
    enc = tok._new_encoder()
    table = tok._special_table_for(specials) if specials else None
    return enc.encode_text(data, 0, len(data), tok._pattern_id, table)[0].tolist()


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_tokenizer()


@pytest.fixture(scope="module")
def one_encoder(gpt2):
    """One encoder for every example of a test: its scratch buffer keeps the texts before."""
    return gpt2._new_encoder()


@SETTINGS
@given(texts=st.lists(ANY_TEXT, min_size=1, max_size=4), specials=st.booleans())
def test_a_str_through_the_kept_scratch_equals_its_bytes(gpt2, one_encoder, texts, specials):
    table = gpt2._special_table_for(specials) if specials else None
    for text in texts:                              # one encoder, call after call
        data = text.encode("utf-8", "surrogateescape")
        want = _fresh_ids(gpt2, data, specials)
        got = one_encoder.encode_all(text, gpt2._pattern_id, table, 1 << 20)
        assert got.dtype == np.uint32 and got.tolist() == want
        assert one_encoder.encode_all(text, gpt2._pattern_id, table, 7, gpt2._tokens) == want
        assert one_encoder.encode_all(data, gpt2._pattern_id, table, 3).tolist() == want


def test_the_scratch_after_a_longer_text_of_another_kind(gpt2):
    enc = gpt2._new_encoder()
    long_text = "é€😀 " * 5000 + "tail"
    for text in [long_text, "ab", "é", "", "x" * 9, "中文 text", long_text[:7]]:
        data = text.encode("utf-8")
        assert enc.encode_all(text, gpt2._pattern_id, gpt2._special_table, 1 << 20).tolist() == _fresh_ids(gpt2, data)
        assert enc.encode_all(text, gpt2._pattern_id, None, 64, gpt2._tokens) == _fresh_ids(gpt2, data, False)


def test_buffers_and_strs_give_the_same_ids(gpt2):
    text = "Hello wörld, it's 2024! 😀 " + EOT + " done\n\n  x"
    data = text.encode("utf-8")
    want = gpt2.encode(text)
    assert want == _fresh_ids(gpt2, data) == gpt2.encode_to_numpy(text).tolist()
    for buf in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert gpt2.encode(buf) == want
        assert gpt2.encode_to_numpy(buf).tolist() == want
    assert gpt2.encode_ordinary(text) == _fresh_ids(gpt2, data, False) != want
    assert gpt2.encode("") == [] and gpt2.encode_to_numpy("").tolist() == [] and gpt2.encode(b"") == []


def test_escaped_surrogates_encode_as_their_bytes_and_others_raise(gpt2):
    text = "a\udcff b\udce2\udc82 é"
    data = text.encode("utf-8", "surrogateescape")
    assert gpt2.encode(text) == _fresh_ids(gpt2, data) == gpt2.encode_to_numpy(text).tolist()
    with pytest.raises(UnicodeEncodeError):
        gpt2.encode("a\ud800 b")
    with pytest.raises(UnicodeEncodeError):
        gpt2.encode_to_numpy("é\ud800")


@SETTINGS
@given(text=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=60),
       max_cached_len=st.sampled_from([0, 1, 3, 256]))
def test_pipelined_probes_equal_each_piece_merged_alone(text, cuts, max_cached_len):
    vocab, merges, _ = small_model()
    tok = Tokenizer(vocab, merges, [EOT])
    enc = _encode.Encoder(tok._table, max_cached_len=max_cached_len)
    ends = np.array(sorted(min(c, len(text)) for c in cuts) + [len(text)], np.int64)  # empty pieces too
    want, start = [], 0
    for end in ends:
        if end > start:
            want += enc.encode_piece(text[start:end])
        start = end
    for _ in range(2):                              # cold, then warm (every piece a hit)
        assert enc.encode_pieces(text, ends).tolist() == want


def test_a_cache_grown_past_huge_pages_equals_a_small_one(gpt2):
    # 70,000 distinct pretokens: the slot table doubles to 4 MiB (huge pages from 2 MiB up)
    text = "".join(f" w{k}q" for k in range(70_000)).encode()
    big = gpt2._new_encoder()
    small = _encode.Encoder(gpt2._table, max_entries=512)
    want = small.encode_all(text, gpt2._pattern_id, None, 1 << 20).tolist()
    assert big.encode_all(text, gpt2._pattern_id, None, 1 << 20).tolist() == want
    assert big.cache_info()["bytes"] >= 2 << 20 and big.cache_info()["entries"] >= 70_000
    assert big.encode_all(text, gpt2._pattern_id, None, 1 << 20).tolist() == want      # warm


@SETTINGS
@given(texts=st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200), min_size=1, max_size=3))
def test_gpt2_lists_and_arrays_equal_tiktoken(gpt2, texts):
    enc = gpt2_tiktoken()
    for text in texts:
        want = enc.encode(text, allowed_special="all")
        assert gpt2.encode(text) == want
        assert gpt2.encode_to_numpy(text).tolist() == want
