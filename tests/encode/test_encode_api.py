"""The tiktoken-style API of ``Tokenizer``: native decoding (``TokenTable``), lists built once from
the native ids, batches (lists and flat), ``allowed_special`` / ``disallowed_special``."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.encode import _encode
from bpe_core.encode.tokenizer import Tokenizer
from encode_helpers import EOT, SETTINGS, gpt2_tiktoken, gpt2_tokenizer, small_model

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
PIECES = st.lists(st.sampled_from([EOT, "<s>", "<s><s>", "<", "s>", " ", "a", "é", "1", "\n"]) | TEXT,
                  max_size=12).map("".join)
ARRAY_DTYPES = [np.uint16, np.uint32, np.int64, np.int32, np.uint8, np.uint64, np.int16]


def plain_decode(tok: Tokenizer, ids) -> bytes:
    """The plain path: each id's bytes joined."""
    vocab = tok.vocab
    return b"".join(vocab[int(i)] for i in ids)


def small_tokenizer(specials=(EOT, "<s>", "<s><s>")):
    vocab, merges, _ = small_model()
    return Tokenizer(vocab, merges, list(specials))


# ==== Decoding ================================================================================


@SETTINGS
@given(st.lists(st.integers(0, 50256), max_size=300), st.sampled_from(["list", "tuple", "iter"] + ARRAY_DTYPES))
def test_decode_bytes_equals_plain_join_gpt2(ids, kind):
    tok = gpt2_tokenizer()
    if kind == "list":
        given_ids = list(ids)
    elif kind == "tuple":
        given_ids = tuple(ids)
    elif kind == "iter":
        given_ids = iter(ids)
    else:
        if np.iinfo(kind).max < 50256:
            ids = [i % (np.iinfo(kind).max + 1) for i in ids]
        given_ids = np.array(ids, dtype=kind)
    expected = plain_decode(tok, ids)
    assert tok.decode_bytes(given_ids) == expected
    assert tok.decode(given_ids if kind not in ("iter",) else iter(ids)) == expected.decode("utf-8", "replace")


@SETTINGS
@given(st.lists(st.integers(0, 402), max_size=200))
def test_decode_bytes_equals_reference_on_trained_vocab(ids):
    tok = small_tokenizer()
    vocab = tok.vocab
    ids = [i for i in ids if i in vocab]
    assert tok.decode_bytes(ids) == reference.decode_bytes(ids, vocab)
    assert tok.decode_bytes(np.array(ids, dtype=np.uint32)) == plain_decode(tok, ids)


def test_decode_accepts_numpy_scalars_bools_and_non_contiguous_arrays():
    tok = gpt2_tokenizer()
    arr = np.arange(100, 300, dtype=np.uint32)
    assert tok.decode_bytes(arr[::3]) == plain_decode(tok, arr[::3].tolist())
    assert tok.decode_bytes([np.int64(104), np.uint16(105)]) == plain_decode(tok, [104, 105])
    assert tok.decode_bytes([True, False]) == plain_decode(tok, [1, 0])
    assert tok.decode_bytes(arr.astype(">u4")) == plain_decode(tok, arr.tolist())
    assert tok.decode_bytes(range(104, 106)) == plain_decode(tok, [104, 105])
    assert tok.decode_bytes([]) == b"" and tok.decode_bytes(np.zeros(0, np.uint32)) == b""


@pytest.mark.parametrize("bad, shown", [
    ([104, 50257], [50257]), ([-1, 104], [-1]), ([104, 10**30], [10**30]), ([1.5], [1.5]),
    (["a"], ["a"]), (np.array([104, -3], np.int64), [-3]), (np.array([60000], np.uint16), [60000]),
    (np.array([2**64 - 1], np.uint64), [2**64 - 1]), (np.array([1.0]), [1.0]),
])
def test_decode_unknown_ids_raise_as_before(bad, shown):
    tok = gpt2_tokenizer()
    with pytest.raises(ValueError, match=r"unknown token id\(s\) ") as info:
        tok.decode_bytes(bad)
    assert str(info.value) == f"unknown token id(s) {shown} (ids are 0..50256)"


def test_decode_holes_of_a_sparse_vocab_raise():
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[1000] = b"xyz"
    tok = Tokenizer(vocab, [])
    assert tok.decode_bytes([1000, 97]) == b"xyza"
    assert tok.decode_bytes(np.array([1000], np.uint16)) == b"xyz"
    for ids in ([500], np.array([500], np.uint32), (97, 999)):
        with pytest.raises(ValueError, match="unknown token id"):
            tok.decode_bytes(ids)


def test_token_table_handles_long_tokens_and_empty_tokens():
    long = bytes(range(256)) * 3
    t = _encode.TokenTable([b"", long, b"x" * 17, None, b"y"])
    ids = [1, 0, 2, 4, 1, 2, 0, 4, 4]
    assert t.decode(ids) == b"".join([b"", long, b"x" * 17, b"y"][k if k < 3 else 3] for k in ids)
    assert t.decode(np.array(ids, np.int64)) == t.decode(ids)
    assert t.decode([3]) is None and t.decode([5]) is None and t.decode(np.array([-1], np.int64)) is None


@SETTINGS
@given(st.lists(st.lists(st.integers(0, 50256), max_size=30), max_size=8))
def test_decode_batch_is_decode_of_each(batch):
    tok = gpt2_tokenizer()
    assert tok.decode_bytes_batch(batch) == [plain_decode(tok, ids) for ids in batch]
    assert tok.decode_batch(batch) == [plain_decode(tok, ids).decode("utf-8", "replace") for ids in batch]
    assert tok.decode_batch([np.array(ids, np.uint32) for ids in batch], errors="ignore") == \
        [plain_decode(tok, ids).decode("utf-8", "ignore") for ids in batch]


# ==== Lists of ids ===========================================================================


@SETTINGS
@given(TEXT)
def test_encode_list_equals_array_and_tiktoken(text):
    tok = gpt2_tokenizer()
    ids = tok.encode(text)
    assert type(ids) is list and all(type(i) is int for i in ids)
    assert ids == tok.encode_to_numpy(text).tolist() == gpt2_tiktoken().encode(text, allowed_special="all")
    assert tok.encode_ordinary(text) == gpt2_tiktoken().encode_ordinary(text)


def test_to_list_of_ids_beyond_the_shared_ints():
    t = _encode.TokenTable([b"a", b"b"], max_ints=1)
    assert t.to_list(np.array([0, 1, 7, 2**32 - 1], np.uint32)) == [0, 1, 7, 2**32 - 1]
    assert t.to_list(np.zeros(0, np.uint32)) == []
    assert t.split_lists(np.array([5, 6, 7], np.uint32), np.array([0, 0, 2, 3], np.int64)) == [[], [5, 6], [7]]
    with pytest.raises(ValueError):
        t.split_lists(np.array([5], np.uint32), np.array([0, 2], np.int64))


# ==== Special tokens as tiktoken ================================================================


@SETTINGS
@given(PIECES, st.sets(st.sampled_from([EOT, "<s>", "<s><s>", "<nope>"])))
def test_allowed_special_subsets_match_the_reference(text, allowed):
    tok = small_tokenizer()
    vocab = tok.vocab
    data = text.encode("utf-8", "surrogateescape")
    chosen = [s for s in tok.special_tokens if s in allowed]
    expected = reference.encode(data, vocab, tok.merges, chosen)
    assert tok.encode(text, allowed_special=allowed) == expected
    assert tok.encode_to_numpy(text, allowed_special=allowed).tolist() == expected
    assert tok.encode(text, allowed_special="all") == reference.encode(data, vocab, tok.merges, list(tok.special_tokens))
    assert tok.encode_batch([text, text], allowed_special=allowed) == [expected, expected]


@SETTINGS
@given(PIECES)
def test_allowed_and_disallowed_match_tiktoken_gpt2(text):
    tok, enc = gpt2_tokenizer(), gpt2_tiktoken()
    for kw in ({"allowed_special": "all"}, {"allowed_special": {EOT}}, {"disallowed_special": ()},
               {"allowed_special": set(), "disallowed_special": ()}, {}):
        ours_kw = kw if kw else {"allowed_special": set(), "disallowed_special": "all"}   # tiktoken's defaults
        try:
            expected = enc.encode(text, **kw)
        except ValueError:
            with pytest.raises(ValueError, match="disallowed special token"):
                tok.encode(text, **ours_kw)
            with pytest.raises(ValueError, match="disallowed special token"):
                tok.encode_batch(["", text], **ours_kw)
            continue
        if not kw.get("allowed_special"):
            ours_kw = {"allowed_special": set(), "disallowed_special": ()} if "disallowed_special" in kw else ours_kw
        assert tok.encode(text, **ours_kw) == expected


def test_disallowed_special_raises_one_line():
    tok = gpt2_tokenizer()
    assert tok.encode("a<|endoftext|>") == [64, 50256]           # our default: all allowed
    with pytest.raises(ValueError) as info:
        tok.encode("a<|endoftext|>", allowed_special=set(), disallowed_special="all")
    assert "\n" not in str(info.value) and "'<|endoftext|>'" in str(info.value)
    with pytest.raises(ValueError, match="disallowed special token 'xyz'"):
        tok.encode("axyz", disallowed_special={"xyz"})
    assert tok.encode("<|endoftext|>", allowed_special=set()) == gpt2_tiktoken().encode_ordinary("<|endoftext|>")
    with pytest.raises(ValueError, match="allowed_special must be"):
        tok.encode("a", allowed_special="none")
    assert tok.special_tokens_set == {EOT}


# ==== Batches ================================================================================


@SETTINGS
@given(st.lists(PIECES, max_size=12), st.sampled_from([1, 2, 3]))
def test_batches_equal_encode_of_each(texts, threads):
    tok = small_tokenizer()
    expected = [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, threads) == expected
    assert tok.encode_batch(texts, num_threads=threads, allowed_special="all") == expected
    assert tok.encode_ordinary_batch(texts, threads) == [tok.encode_ordinary(t) for t in texts]
    ids, offsets = tok.encode_batch(texts, threads, flat=True)
    assert ids.dtype == np.uint32 and offsets.dtype == np.int64 and len(offsets) == len(texts) + 1
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == expected
    ids2, offsets2 = tok.encode_batch_flat(texts, threads)
    assert np.array_equal(ids, ids2) and np.array_equal(offsets, offsets2)
    o_ids, o_offsets = tok.encode_ordinary_batch(texts, threads, flat=True)
    assert [o_ids[a:b].tolist() for a, b in zip(o_offsets[:-1], o_offsets[1:])] == \
        [tok.encode_ordinary(t) for t in texts]


def test_batches_on_many_threads(monkeypatch):
    """A thread per byte (so every thread count runs), the same ids for str, bytes,
    surrogate-escaped text and a custom pattern."""
    from bpe_core.encode import tokenizer_batch as batch_mod

    monkeypatch.setattr(batch_mod, "_BATCH_THREAD_BYTES", 1)
    tok = gpt2_tokenizer()
    texts = [f"doc {i} é{'x' * (i % 37)} <|endoftext|> {i * 7919}" for i in range(300)]
    texts += [b"bytes \xff\xfe doc", "esc \udcff\udce2", "", bytearray(b"ba"), "ünïcödé " * 50]
    expected = [tok.encode(t) for t in texts]
    for threads in (1, 2, 4):
        assert tok.encode_batch(texts, threads) == expected
        ids, offsets = tok.encode_batch_flat(texts, threads)
        assert offsets[-1] == len(ids) == sum(map(len, expected))
    custom = Tokenizer(tok.vocab, tok.merges, [EOT], pattern=r"\S+|\s+")
    assert custom.encode_batch(texts[:20], 2) == [custom.encode(t) for t in texts[:20]]
    assert tok.encode_batch([]) == [] and tok.encode_batch_flat([])[1].tolist() == [0]
    assert tok.encode_batch(t for t in texts[:3]) == expected[:3]


def test_stage_aware_batches_and_specials(tmp_path):
    import bpe_core
    from bpe_core.encode.tokenizer import StageAwareTokenizer
    from encode_helpers import fixture_text

    path = tmp_path / "c.txt"
    text = fixture_text("corpus.en")[:8000]
    path.write_text(text + EOT + text[:999], encoding="utf-8")
    r = bpe_core.train(bpe_core.TrainConfig(str(path), 400, method="superbpe", transition=320, num_workers=1,
                                            special_tokens=[EOT]))
    bpe_core.formats.model.dump_folder(r.model, str(tmp_path / "m"))
    tok = Tokenizer.load(str(tmp_path / "m"))
    assert isinstance(tok, StageAwareTokenizer)
    texts = [text[:300], "the cat" + EOT + " sat", "", text[500:900]]
    expected = [tok.encode(t) for t in texts]
    assert expected[1] != tok.encode_ordinary(texts[1])
    assert tok.encode_batch(texts, 2) == expected
    ids, offsets = tok.encode_batch_flat(texts, 2)
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == expected
    assert tok.encode_ordinary_batch(texts, 2) == [tok.encode_ordinary(t) for t in texts]
    assert tok.encode(texts[1], allowed_special=set()) == tok.encode_ordinary(texts[1])
    with pytest.raises(ValueError, match="disallowed special token"):
        tok.encode(texts[1], allowed_special=set(), disallowed_special="all")
    assert tok.decode_batch(expected) == texts


def test_batch_of_a_generator_with_a_disallowed_check():
    tok = gpt2_tokenizer()
    texts = ["a b", "c d"]
    assert tok.encode_batch((t for t in texts), disallowed_special={"zz"}) == [tok.encode(t) for t in texts]


def test_encode_corpus_lends_the_tokenizers_warm_encoders(tmp_path):
    """encode_corpus's worker threads take the tokenizer's idle encoders and give them back: a second
    run on the same text starts with a warm cache (few new misses), and the ids are the same."""
    from bpe_core.encode.encode_corpus import encode_corpus
    from encode_helpers import fixture_path

    tok = Tokenizer.from_files(fixture_path("gpt2_vocab.json"), fixture_path("gpt2_merges.txt"), [EOT])
    path = tmp_path / "in.txt"
    path.write_bytes(open(fixture_path("corpus.en"), "rb").read() * 2)
    encode_corpus(str(path), tok, str(tmp_path / "a.npy"), num_workers=1, progress=False, chunk_bytes=40_000)
    assert len(tok._idle) == 1 and tok._idle[0].cache_info()["entries"] > 0
    first = tok._idle[0].cache_info()["misses"]
    encode_corpus(str(path), tok, str(tmp_path / "b.npy"), num_workers=1, progress=False, chunk_bytes=40_000)
    assert len(tok._idle) == 1 and tok._idle[0].cache_info()["misses"] - first < first / 10
    encode_corpus(str(path), tok, str(tmp_path / "c.npy"), num_workers=2, progress=False, chunk_bytes=40_000)
    assert 1 <= len(tok._idle) <= 2
    a, b, c = (np.load(tmp_path / f"{x}.npy") for x in "abc")
    assert np.array_equal(a, b) and np.array_equal(a, c) and a.tolist() == tok.encode(path.read_bytes())
