"""The encoder: exact ids (tiktoken on GPT-2, the reference on trained vocabs), streaming, decoding."""
from __future__ import annotations

import contextlib
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.encode import _encode
from bpe_core.encode import tokenizer as tokenizer_mod
from bpe_core.formats.model import Model, dump_model
from bpe_core.encode.tokenizer import Tokenizer, _utf8_stable_end
from encode_helpers import (EOT, FIXTURE_TEXTS, SETTINGS, corpus_names, corpus_sample, fixture_text,
                            gpt2_tiktoken, gpt2_tokenizer, merge_lists, small_model)

# Text without lone surrogates (tiktoken replaces them; bpe_core keeps them as escaped bytes).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)
SPECIAL_HEAVY = st.lists(st.sampled_from(["<|endoftext|>", "<|endoftext|><|endoftext|>", "<|", "|>", "<|end",
                                          " ", "  ", "\n", "a", "é", "'s", "1", "\udcff", "\udce2\udc82"])
                         | st.text(st.characters(blacklist_categories=("Cs",)), max_size=40), max_size=30).map("".join)


@contextlib.contextmanager
def small_blocks(block: int = 7, flush: int = 5):
    """Shrink the block and streaming sizes so every cut path runs on short text."""
    saved = tokenizer_mod._BLOCK_BYTES, tokenizer_mod._STREAM_FLUSH_BYTES
    tokenizer_mod._BLOCK_BYTES, tokenizer_mod._STREAM_FLUSH_BYTES = block, flush
    try:
        yield
    finally:
        tokenizer_mod._BLOCK_BYTES, tokenizer_mod._STREAM_FLUSH_BYTES = saved


def reference_tokenizer(specials=(EOT, EOT + EOT), pattern="gpt2"):
    vocab, merges, _ = small_model()
    tok = Tokenizer(vocab, merges, list(specials), pattern)
    return tok, tok.vocab, merges   # the vocab with every special token in it


# ==== Exact against tiktoken (GPT-2 fixture vocab) ============================================


@pytest.mark.parametrize("name", FIXTURE_TEXTS)
def test_gpt2_fixture_texts_match_tiktoken(name):
    text = fixture_text(name)
    ids = gpt2_tokenizer().encode(text)
    assert ids == gpt2_tiktoken().encode(text, allowed_special="all")
    assert gpt2_tokenizer().decode(ids) == text


@pytest.mark.parametrize("name", corpus_names())
def test_gpt2_corpus_samples_match_tiktoken(name):
    data = corpus_sample(name, 150_000)
    if data is None:
        pytest.skip("../shared/corpora is not available")
    text = data[: data.rfind(b"\n") + 1].decode("utf-8")
    assert gpt2_tokenizer().encode(text) == gpt2_tiktoken().encode(text, allowed_special="all")


@SETTINGS
@given(TEXT)
def test_gpt2_hypothesis_matches_tiktoken(text):
    assert gpt2_tokenizer().encode(text) == gpt2_tiktoken().encode(text, allowed_special="all")


def test_long_pieces_match_tiktoken():
    tok, enc = gpt2_tokenizer(), gpt2_tiktoken()
    for text in ["a" * 100_000, "ab" * 30_000 + " " + "7" * 5000, "x" * 129, "\n" * 4000,
                 "".join(chr(97 + (i * 7919) % 26) for i in range(200_000))]:
        assert tok.encode(text) == enc.encode(text)


@SETTINGS
@given(SPECIAL_HEAVY | TEXT, st.integers(1, 64), st.booleans())
def test_encode_whole_equals_one_encode_text(text, block, specials):
    """``Encoder.encode_whole`` (a long text block by block into one array) gives the ids of one
    ``encode_text`` call over the whole range, for any block size: the window cuts, the retry of a
    pretoken longer than the block, special tokens across a cut."""
    tok = gpt2_tokenizer()
    data = ("x" + text + "y").encode("utf-8", "surrogateescape")
    table = tok._special_table_for(specials)
    want = tok._new_encoder().encode_text(data, 1, len(data) - 1, tok._pattern_id, table)[0]
    got = tok._new_encoder().encode_whole(data, 1, len(data) - 1, tok._pattern_id, table, block)
    assert got.dtype == np.uint32 and got.tolist() == want.tolist()


def test_a_text_longer_than_a_block_is_one_array_with_tiktokens_ids():
    """Over ``_BLOCK_BYTES`` (here 2.3 MB: the reserved buffer in huge pages, handed over whole),
    whole text to an array and to a list give tiktoken's ids; bad arguments are refused."""
    text = fixture_text("corpus.en") + EOT + fixture_text("german.txt") + EOT
    text = text * (2_300_000 // len(text.encode()) + 1)
    assert len(text.encode()) > 2 * tokenizer_mod._BLOCK_BYTES
    tok = gpt2_tokenizer()
    want = gpt2_tiktoken().encode(text, allowed_special="all")
    ids = tok.encode_to_numpy(text)
    assert ids.dtype == np.uint32 and ids.tolist() == want and tok.encode(text) == want
    enc = tok._new_encoder()
    with pytest.raises(ValueError, match="block"):
        enc.encode_whole(b"ab", 0, 2, tok._pattern_id, None, 0)
    with pytest.raises(ValueError, match="start <= end"):
        enc.encode_whole(b"ab", 1, 3, tok._pattern_id)


# ==== Exact against the reference (vocabs we train) ===========================================


@SETTINGS
@given(st.binary(max_size=400))
def test_trained_vocab_matches_reference_on_bytes(data):
    tok, vocab, merges = reference_tokenizer()
    expected = reference.encode(data, vocab, merges, tok.special_tokens)
    assert tok.encode(data) == expected
    assert tok.decode_bytes(tok.encode(data)) == data


@SETTINGS
@given(SPECIAL_HEAVY)
def test_trained_vocab_matches_reference_with_specials(text):
    tok, vocab, merges = reference_tokenizer()
    data = text.encode("utf-8", "surrogateescape")
    assert tok.encode(text) == reference.encode(data, vocab, merges, tok.special_tokens)
    assert tok.encode_ordinary(text) == reference.encode(data, vocab, merges, [])


@pytest.mark.parametrize("name", FIXTURE_TEXTS)
def test_trained_vocab_matches_reference_on_fixtures(name):
    tok, vocab, merges = reference_tokenizer()
    data = fixture_text(name).encode()[:20_000]
    assert tok.encode(data) == reference.encode(data, vocab, merges, tok.special_tokens)


def test_fixture_reference_vocab_matches_reference():
    """The CS336 reference vocab (vocab 500 on corpus.en) loaded from its GPT-2 style files."""
    from bpe_core.formats.model import load_gpt2
    from encode_helpers import fixture_path

    vocab, merges = load_gpt2(fixture_path("train-bpe-reference-vocab.json"),
                              fixture_path("train-bpe-reference-merges.txt"))
    tok = Tokenizer(vocab, merges, [EOT])
    data = fixture_text("tinystories_sample.txt").encode()
    assert tok.encode(data) == reference.encode(data, vocab, merges, [EOT])


@st.composite
def random_merges(draw):
    """Random merge lists (``merge_lists``) with a vocabulary holding every merge's result in rank order."""
    merges = draw(merge_lists(25))
    vocab = {i: bytes([i]) for i in range(256)}
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return vocab, merges


@SETTINGS
@given(random_merges(), st.text("abc", max_size=400))
def test_random_merge_lists_match_reference_on_both_paths(model, text):
    """Duplicate-bytes merges make a merge create lower-rank pairs: both paths batch by rank."""
    vocab, merges = model
    tok = Tokenizer(vocab, merges, pattern=r"[abc]+")
    ranks = {pair: r for r, pair in reversed(list(enumerate(merges)))}
    ids_of = reference.token_ids(vocab)
    data = text.encode()
    expected = [ids_of[p] for p in reference.encode_pretoken(data, merges)] if data else []
    enc = tok._encoder()
    assert enc.encode_piece(data, "heap") == expected
    if len(data) <= 128:
        assert enc.encode_piece(data, "scan") == expected
    assert tok.encode(text) == expected


@SETTINGS
@given(random_merges(), st.text("ab", min_size=1, max_size=24) | st.text("abc", min_size=1, max_size=12))
def test_scan_rounds_match_reference_on_short_pieces(model, text):
    """``_merge_scan`` merges one pair a step (the leftmost of the lowest rank, the tail moved down,
    the two pairs around the new token looked up): short runs over two letters make adjacent,
    overlapping and repeated occurrences of one rank, and pairs made after their rank has passed.
    Fails when the rightmost lowest rank is taken, or when a round's kept rank is read one place off."""
    vocab, merges = model
    tok = Tokenizer(vocab, merges, pattern=r"[abc]+")
    ids_of = reference.token_ids(vocab)
    data = text.encode()
    expected = [ids_of[p] for p in reference.encode_pretoken(data, merges)]
    assert tok._encoder().encode_piece(data, "scan") == expected


def test_duplicate_bytes_example():
    # (a, b) -> ab, (b, c) -> bc, (a, bc) -> abc, (ab, c) -> abc again, (abc, a) at a rank between.
    vocab = {i: bytes([i]) for i in range(256)}
    merges = [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc"), (b"abc", b"a"), (b"ab", b"c")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    tok = Tokenizer(vocab, merges, pattern=r"[abc]+")
    for text in ["abca", "abcabca", "ababcc", "aabcbca"]:
        assert tok.encode(text) == reference.encode(text, vocab, merges, pattern=r"[abc]+")
    # The token bytes b"abc" have two ids; the smaller one is used.
    assert tok.token_id(b"abc") == 258



def test_a_pair_made_after_its_rank_waits_for_its_next_rank():
    """``abb`` is built twice, by ``(a, bb)`` (rank 2) and ``(ab, b)`` (rank 5); ``(abb, a)`` has ranks
    3 and 6. In ``abba`` the replay makes ``abb`` at rank 5, after rank 3 has passed: the pair merges
    at its next rank, 6. Without rank 6 it never merges (lowest-rank-first would merge it: ``abba``).
    Found by hypothesis (test_encode_singles): both merge paths used to take rank 3 after rank 5."""
    base = [(b"a", b"b"), (b"b", b"b"), (b"a", b"bb"), (b"abb", b"a"), (b"a", b"a"), (b"ab", b"b")]
    for merges, want in [(base, [b"abb", b"a"]), (base + [(b"abb", b"a")], [b"abba"])]:
        vocab = {i: bytes([i]) for i in range(256)}
        for a, b in merges:
            vocab[len(vocab)] = a + b
        tok = Tokenizer(vocab, merges, pattern=r"[abc]+")
        ids_of = reference.token_ids(vocab)
        assert reference.encode_pretoken(b"abba", merges) == want
        enc = tok._encoder()
        for method in ("scan", "heap"):
            assert enc.encode_piece(b"abba", method) == [ids_of[p] for p in want]
        assert tok.encode("abba abba") == reference.encode("abba abba", vocab, merges, pattern=r"[abc]+")
    table = tok._table
    ab_b = (ids_of[b"abb"], ids_of[b"a"])
    assert table.lookup(*ab_b) == (3, ids_of[b"abba"])
    assert table.lookup_after(*ab_b, 2) == (3, ids_of[b"abba"])
    assert table.lookup_after(*ab_b, 3) == (6, ids_of[b"abba"])
    assert table.lookup_after(*ab_b, 6) is None


# ==== Special tokens ===========================================================================


def test_overlapping_specials_longest_match_wins():
    tok = gpt2_tokenizer()
    both = Tokenizer(tok.vocab, tok.merges, [EOT, EOT + EOT])
    ids = both.encode(EOT + EOT + EOT)
    assert ids == [both.special_tokens[EOT + EOT], 50256]
    assert tok.encode("a" + EOT + "b") == [64, 50256, 65]
    assert tok.encode_ordinary(EOT) == gpt2_tiktoken().encode_ordinary(EOT)


def test_special_not_in_vocab_gets_new_id():
    vocab = {i: bytes([i]) for i in range(256)}
    tok = Tokenizer(vocab, [], ["<pad>", "<s>"])
    assert tok.special_tokens == {"<pad>": 256, "<s>": 257}
    assert tok.encode("<s>x<pad>") == [257, 120, 256]


# ==== Streaming ================================================================================


@SETTINGS
@given(SPECIAL_HEAVY, st.lists(st.integers(0, 400), max_size=12))
def test_encode_iterable_matches_encode(text, cuts):
    tok, _, _ = reference_tokenizer()
    cuts = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    expected = tok.encode(text)
    with small_blocks():
        assert list(tok.encode_iterable(pieces)) == expected
        assert tok.encode(text) == expected            # blocked whole-text encoding too
    assert list(tok.encode_iterable(iter(pieces))) == expected


@SETTINGS
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=12))
def test_encode_iterable_splits_escaped_bytes(data, cuts):
    """Random bytes as surrogateescape text, split anywhere: unfinished UTF-8 waits for its end."""
    tok = gpt2_tokenizer()
    text = data.decode("utf-8", "surrogateescape")
    cuts = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    with small_blocks(block=5, flush=1):
        assert list(tok.encode_iterable(pieces)) == tok.encode(data)


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
def test_encode_iterable_named_patterns_on_fixture(pattern):
    vocab, merges, specials = small_model()
    tok = Tokenizer(vocab, merges, specials, pattern)
    text = fixture_text("corpus.en")[:30_000] + EOT + fixture_text("german.txt") + "  \n\n x" * 50
    expected = reference.encode(text, vocab, merges, specials, pattern)
    with small_blocks(block=64, flush=50):
        pieces = [text[i: i + 37] for i in range(0, len(text), 37)]
        assert list(tok.encode_iterable(pieces)) == expected
        assert tok.encode(text) == expected


def test_encode_iterable_custom_pattern_holds_until_special():
    vocab, merges, _ = small_model()
    tok = Tokenizer(vocab, merges, [EOT], pattern=r"\w+|\s")
    text = "hello, world" + EOT + "more text!"
    with small_blocks(flush=1):
        assert list(tok.encode_iterable(list(text))) == reference.encode(text, vocab, merges, [EOT], r"\w+|\s")


def test_utf8_stable_end():
    assert _utf8_stable_end(b"ab", 0, 2) == 2
    assert _utf8_stable_end(b"a\xc3", 0, 2) == 1
    assert _utf8_stable_end(b"a\xc3\xa9", 0, 3) == 3
    assert _utf8_stable_end(b"a\xf0\x9f\x98", 0, 4) == 1
    assert _utf8_stable_end(b"a\xed\xa0", 0, 3) == 3      # surrogate range: never valid
    assert _utf8_stable_end(b"\xbf\xbf", 0, 2) == 2


# ==== Decoding, numpy, round trips =============================================================


@SETTINGS
@given(st.binary(max_size=500))
def test_decode_bytes_round_trips_any_bytes(data):
    tok = gpt2_tokenizer()
    assert tok.decode_bytes(tok.encode(data)) == data
    assert tok.decode(tok.encode(data)) == data.decode("utf-8", "replace")


def test_encode_to_numpy_and_batch():
    tok = gpt2_tokenizer()
    texts = [fixture_text(n) for n in FIXTURE_TEXTS]
    arr = tok.encode_to_numpy(texts[1])
    assert arr.dtype == np.uint32 and arr.tolist() == tok.encode(texts[1])
    assert tok.encode_batch(texts, num_threads=4) == [tok.encode(t) for t in texts]
    assert tok.encode_to_numpy("").shape == (0,)


def test_decode_rejects_unknown_ids():
    with pytest.raises(ValueError):
        gpt2_tokenizer().decode_bytes([10**6])


# ==== Loading, pickling, cache =================================================================


def test_load_native_model_and_pickle(tmp_path):
    vocab, merges, specials = small_model()
    dump_model(Model(vocab=vocab, merges=merges, special_tokens=specials, pattern=reference.resolve_pattern("gpt2")),
               tmp_path / "model.json")
    text = fixture_text("address.txt") + EOT
    expected = reference.encode(text, vocab, merges, specials)
    assert Tokenizer.load(tmp_path).encode(text) == expected
    assert Tokenizer.load(tmp_path / "model.json").encode(text) == expected
    assert pickle.loads(pickle.dumps(Tokenizer.load(tmp_path))).encode(text) == expected


def test_small_cache_is_cleared_and_stays_exact():
    tok = gpt2_tokenizer()
    text = fixture_text("corpus.en")[:20_000]
    data = text.encode()
    ends = tok._pretoken_ends(data, 0, len(data))
    enc = _encode.Encoder(tok._table, max_entries=3, max_cached_len=8)
    assert enc.encode_pieces(data, ends).tolist() == tok.encode(text)
    assert enc.cache_info()["entries"] <= 3


def test_set_max_entries_keeps_the_ids_and_gives_memory_back():
    """The cache's bound changed between calls (raised: the entries stay; lowered below them: the
    cache is emptied and its slots and arena freed, a new encoder's size), every call's ids those of
    tiktoken, and the bound held (1, just below and above the entries held, 2**20, the default)."""
    tok = gpt2_tokenizer()
    words = [f" w{i}" * (1 + i % 3) + "y" * (i % 11) for i in range(6000)]
    parts = ["".join(words[k::4]) for k in range(4)] * 2
    expected = [gpt2_tiktoken().encode(p) for p in parts]
    enc = _encode.Encoder(tok._table)
    fresh = _encode.Encoder(tok._table).cache_info()["bytes"]

    def encode(k):
        data = parts[k].encode()
        ids, stop, done = enc.encode_text(data, 0, len(data), tok._pattern_id, None)
        assert ids.tolist() == expected[k] and stop == len(data) and done
        assert enc.cache_info()["entries"] <= enc.max_entries

    encode(0)
    held = enc.cache_info()["entries"]
    assert held > 1000 and enc.cache_info()["bytes"] > fresh
    enc.set_max_entries(held)                       # at the entries held: kept
    assert enc.max_entries == held and enc.cache_info()["entries"] == held
    enc.set_max_entries(1 << 20)                    # raised: kept
    assert enc.cache_info()["entries"] == held
    encode(1)
    enc.set_max_entries(held - 1)                   # just below: emptied, memory back
    assert enc.cache_info()["entries"] == 0 and enc.cache_info()["bytes"] == fresh
    encode(2)
    for k, bound in enumerate([1, 2, 7, 1 << 20, 3, 1 << 18], start=3):
        enc.set_max_entries(bound)
        encode(k % len(parts))
    with pytest.raises(ValueError):
        enc.set_max_entries(0)
    assert enc.max_entries == 1 << 18


def test_encoder_spec_sizes_its_cache_and_gives_lent_encoders_back_as_they_were():
    """``EncoderSpec.cache_entries`` (the corpus plan's cache) on the spec's own encoder and on one
    lent by the tokenizer: the same ids; a lent encoder comes back with its own bound, and a cache
    grown past it emptied; the bound travels in a pickle (of a spec that has encoded: its special
    table stays behind, rebuilt on use) and a copy (another thread's spec)."""
    import copy

    tok = gpt2_tokenizer()
    text = "".join(f" v{i}" + "z" * (i % 7) for i in range(3000))
    data = text.encode()
    want = gpt2_tiktoken().encode(text)
    tok.encode(text[:100])                          # a warm encoder to lend
    lent = tok._idle[-1]
    spec = tok._encoder_spec()
    spec.cache_entries = 5
    spec.lend_from(tok)
    assert np.concatenate(list(spec.iter_encode(data, 0, len(data)))).tolist() == want
    assert spec._encoder is lent and lent.max_entries == 5 and lent.cache_info()["entries"] <= 5
    spec.release()
    assert tok._idle[-1] is lent and lent.max_entries == 1 << 18
    spec.cache_entries = 1 << 20
    spec.lend_from(tok)
    assert np.concatenate(list(spec.iter_encode(data, 0, len(data)))).tolist() == want
    assert lent.max_entries == 1 << 20 and lent.cache_info()["entries"] > 1 << 10
    spec.release()
    assert lent.max_entries == 1 << 18 and 0 < lent.cache_info()["entries"] <= 1 << 18
    for other in (pickle.loads(pickle.dumps(spec)), copy.copy(spec)):
        assert other.cache_entries == 1 << 20
        assert np.concatenate(list(other.iter_encode(data, 0, len(data)))).tolist() == want
        assert other._encoder.max_entries == 1 << 20
        other.release()


def test_encode_pieces_checks_ends():
    enc = gpt2_tokenizer()._encoder()
    with pytest.raises(ValueError):
        enc.encode_pieces(b"abc", np.array([2, 1], dtype=np.int64))
    with pytest.raises(ValueError):
        enc.encode_pieces(b"abc", np.array([4], dtype=np.int64))


def test_bad_vocab_and_merges():
    with pytest.raises(ValueError):
        Tokenizer({0: b"\x00"}, [])
    vocab = {i: bytes([i]) for i in range(256)}
    with pytest.raises(ValueError, match="not in the vocab"):
        Tokenizer(vocab, [(b"a", b"b")])


def test_encode_iterable_long_pretoken_is_linear():
    """A 300 KB pretoken streamed in 1 KB pieces: the held-back tail is rescanned only as it doubles."""
    tok = gpt2_tokenizer()
    text = "x" * 300_000 + " done"
    pieces = [text[i: i + 1000] for i in range(0, len(text), 1000)]
    assert list(tok.encode_iterable(pieces)) == tok.encode(text)


# ==== The native core: windows, special-token matcher, cache layout ===========================


@SETTINGS
@given(SPECIAL_HEAVY, st.integers(1, 64), st.booleans())
def test_encode_text_windows_resume_exactly(text, max_bytes, open_end):
    """Calling ``encode_text`` window by window (any ``max_bytes``, open or closed end) gives the
    ids of the whole text: every stop is a final boundary."""
    tok, _, _ = reference_tokenizer()
    data = text.encode("utf-8", "surrogateescape")
    enc = _encode.Encoder(tok._table, max_entries=5, max_cached_len=9)
    parts, pos, block = [], 0, max_bytes
    while True:
        ids, stop, done = enc.encode_text(data, pos, len(data), tok._pattern_id, tok._special_table, block,
                                          open_end)
        assert pos <= stop <= len(data)
        parts.extend(ids.tolist())
        if done:
            break
        block = 2 * block if stop == pos else max_bytes
        pos = stop
    if open_end:        # what was held back is a final tail: encode it closed
        ids, stop, done = enc.encode_text(data, stop, len(data), tok._pattern_id, tok._special_table)
        parts.extend(ids.tolist())
    assert stop == len(data) and done
    assert parts == tok.encode(text)


@SETTINGS
@given(st.lists(st.sampled_from(["<s>", "<s><s>", "<t>", "<", "s>", "a", "<<s>"]), max_size=20).map("".join),
       st.data())
def test_cut_after_is_the_first_match_end_from_the_target(text, data):
    """``SpecialTable.cut_after(buf, pos, target, end)`` from a place a whole scan starts (0 or a
    match's end): the end of the first match of that scan starting at or after ``target``, else
    ``end`` (overlapping and prefix tokens: ``<s>``, ``<s><s>``, ``<<s>``)."""
    table = _encode.SpecialTable([b"<s>", b"<s><s>", b"<t>"], [0, 1, 2])
    buf = text.encode()
    matches = table.find_all(buf)
    pos = data.draw(st.sampled_from([0] + [e for _, e, _ in matches]))
    end = data.draw(st.integers(pos, len(buf)))
    target = data.draw(st.integers(pos, end + 1))
    scan = [(pos + a, pos + b) for a, b, _ in table.find_all(buf[pos:end])]
    assert scan == [(a, b) for a, b, _ in matches if a >= pos and b <= end] or end < len(buf)
    want = next((b for a, b in scan if a >= target), end)
    assert table.cut_after(buf, pos, target, end) == want


@SETTINGS
@given(st.lists(st.sampled_from(["<s>", "<s><s>", "<t>", "<", "s>", "a", "<<s>"]), max_size=20).map("".join))
def test_special_table_matches_the_regex(text):
    from bpe_core.corpus.specials import specials_regex

    specials = [b"<s>", b"<s><s>", b"<t>"]
    data = text.encode()
    expected = [(m.start(), m.end(), specials.index(m.group())) for m in specials_regex(specials).finditer(data)]
    assert _encode.SpecialTable(specials, [0, 1, 2]).find_all(data) == expected


def test_cache_slots_long_keys_and_many_ids_stay_exact():
    """Keys over 8 bytes (tail in the arena), pieces with more than 4 ids (ids in the arena), a cache
    that grows many times and one that is cleared on every insert: all give the uncached ids."""
    tok = gpt2_tokenizer()
    words = [f" w{i}" * (1 + i % 5) + "x" * (i % 13) for i in range(20_000)]
    text = "".join(words) + "".join(words[::-1])
    data = text.encode()
    expected = gpt2_tiktoken().encode(text)
    for enc in (_encode.Encoder(tok._table), _encode.Encoder(tok._table, max_entries=1),
                _encode.Encoder(tok._table, max_cached_len=4095)):
        ids, stop, done = enc.encode_text(data, 0, len(data), tok._pattern_id, None)
        assert ids.tolist() == expected and stop == len(data) and done
        assert enc.cache_info()["entries"] <= enc.max_entries


def test_encoder_spec_pickles_and_encodes_like_the_tokenizer():
    tok, _, _ = reference_tokenizer()
    text = fixture_text("corpus.en")[:5000] + EOT + "tail  \n"
    data = text.encode()
    for t in (tok, Tokenizer(tok.vocab, tok.merges, [EOT], pattern=r"\w+|\s")):
        spec = pickle.loads(pickle.dumps(t._encoder_spec()))
        got = np.concatenate(list(spec.iter_encode(data, 0, len(data)))).tolist()
        assert got == t.encode(text)
