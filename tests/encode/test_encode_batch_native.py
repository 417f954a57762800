"""The native batch (``_encode.BatchJob`` behind ``encode_batch`` / ``encode_batch_flat``): the ids of
every text are ``encode(text)``'s (and tiktoken's on GPT-2) for any batch shape and thread count, with
or without a shared read-only cache, and the caches the threads fill are kept for the next call."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.encode import _encode
from bpe_core.encode import tokenizer_batch as batch_mod      # owns _BATCH_THREAD_BYTES
from bpe_core.encode.tokenizer import Tokenizer
from encode_helpers import EOT, SETTINGS, fixture_text, gpt2_tiktoken, small_model

PIECES = ["<|endoftext|>", "<|endoftext|><|endoftext|>", "<|", " ", "  ", "\n", "\n\n", "a", "é", "'s", "1",
          "123456", "\udcff", "\udce2\udc82", "hello", " world", "\t", "ünï", "😀"]
DOC = st.lists(st.sampled_from(PIECES) | st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
               max_size=25).map("".join)
BATCH = st.lists(DOC | st.binary(max_size=40), max_size=12)


def _gpt2():
    """A GPT-2 tokenizer of this test's own (the tests change its idle encoders)."""
    from encode_helpers import fixture_path

    return Tokenizer.from_files(fixture_path("gpt2_vocab.json"), fixture_path("gpt2_merges.txt"), [EOT])


GPT2 = _gpt2()


def _split(ids, offsets):
    return [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


@pytest.fixture
def every_byte_a_thread(monkeypatch):
    """A thread per byte of text, so num_threads threads run on the smallest batch."""
    monkeypatch.setattr(batch_mod, "_BATCH_THREAD_BYTES", 1)


@SETTINGS
@given(BATCH, st.integers(1, 9), st.sampled_from(["all", set(), {"<|endoftext|>"}]))
def test_any_batch_any_threads_equals_encode(texts, threads, allowed):
    saved = batch_mod._BATCH_THREAD_BYTES
    batch_mod._BATCH_THREAD_BYTES = 1
    try:
        expected = [GPT2.encode(t, allowed_special=allowed) for t in texts]
        assert GPT2.encode_batch(texts, threads, allowed_special=allowed) == expected
        ids, offsets = GPT2.encode_batch_flat(texts, threads, allowed_special=allowed)
        assert ids.dtype == np.uint32 and offsets.dtype == np.int64 and len(offsets) == len(texts) + 1
        assert _split(ids, offsets) == expected
        assert GPT2.encode_ordinary_batch(texts, threads) == [GPT2.encode_ordinary(t) for t in texts]
    finally:
        batch_mod._BATCH_THREAD_BYTES = saved


@SETTINGS
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60), max_size=10), st.integers(1, 6))
def test_batches_match_tiktoken(texts, threads):
    saved = batch_mod._BATCH_THREAD_BYTES
    batch_mod._BATCH_THREAD_BYTES = 1
    try:
        assert GPT2.encode_batch(texts, threads) == gpt2_tiktoken().encode_batch(texts, allowed_special="all")
    finally:
        batch_mod._BATCH_THREAD_BYTES = saved


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_batch_shapes(every_byte_a_thread, threads):
    tok = _gpt2()
    text = fixture_text("tinystories_sample.txt")
    docs = [d for d in text.split(EOT) if d]
    huge = (fixture_text("corpus.en") + EOT) * 3 + "x" * 20_000           # specials inside, a long piece
    shapes = [[], [""], ["", "", ""], ["one text"], docs[:1], docs[:threads - 1] or ["a"],
              docs, [huge, "", huge[:1000]], [EOT] * 5, [huge[:77] for _ in range(40)]]
    tt = gpt2_tiktoken()
    for texts in shapes:
        expected = tt.encode_batch(texts, allowed_special="all")
        assert tok.encode_batch(texts, threads) == expected
        ids, offsets = tok.encode_batch_flat(texts, threads)
        assert _split(ids, offsets) == expected and offsets[0] == 0 and offsets[-1] == len(ids)


def test_threads_share_the_warmest_cache_and_keep_what_they_learn(every_byte_a_thread):
    tok = _gpt2()
    docs = [d for d in fixture_text("tinystories_sample.txt").split(EOT) if d]
    want = gpt2_tiktoken().encode_batch(docs, allowed_special="all")
    assert tok.encode_batch(docs, 3) == want          # cold: 3 private caches, then one shared
    entries = [e.cache_info()["entries"] for e in tok._idle]
    assert len(tok._idle) == 4 and entries[:3] == [0, 0, 0] and entries[3] > 0   # the warm one last
    warm = tok._idle[-1]
    misses = sum(e.cache_info()["misses"] + e.cache_info()["single_hits"] for e in tok._idle)
    assert tok.encode_batch(docs, 3) == want          # warm: every piece is found in the shared cache
    assert sum(e.cache_info()["misses"] + e.cache_info()["single_hits"] for e in tok._idle) == misses
    assert tok._idle[-1] is warm and [e.cache_info()["entries"] for e in tok._idle[:3]] == [0, 0, 0]
    assert tok.encode(docs[0]) == want[0]             # a one-thread call takes the warm encoder
    assert tok._idle[-1] is warm


def test_a_warm_shared_cache_beside_new_text_gives_the_same_ids(every_byte_a_thread):
    tok = _gpt2()
    tok.encode(fixture_text("german.txt"))            # warm on other text
    docs = [d for d in fixture_text("corpus.en").split("\n\n") if d]
    assert tok.encode_batch(docs, 4) == gpt2_tiktoken().encode_batch(docs, allowed_special="all")


def test_absorb_cache_keeps_ids_exact():
    vocab, merges, specials = small_model()
    tok = Tokenizer(vocab, merges, specials)
    a, b = tok._new_encoder(), tok._new_encoder()
    text = fixture_text("corpus.en").encode()
    first, second = text[: len(text) // 2], text[len(text) // 2:]
    b.encode_text(first, 0, len(first), tok._pattern_id)
    a.encode_text(second, 0, len(second), tok._pattern_id)
    n_a, n_b = a.cache_info()["entries"], b.cache_info()["entries"]
    a.absorb_cache(b)
    assert b.cache_info()["entries"] == 0 and n_a < a.cache_info()["entries"] <= n_a + n_b
    misses = a.cache_info()["misses"] + a.cache_info()["single_hits"]
    ids, _, _ = a.encode_text(text, 0, len(text), tok._pattern_id)
    assert ids.tolist() == tok.encode(text)
    assert a.cache_info()["misses"] + a.cache_info()["single_hits"] == misses   # all of it cached
    with pytest.raises(ValueError, match="one rank table"):
        a.absorb_cache(GPT2._new_encoder())


def test_absorb_into_a_fresh_encoder_reserves_room_and_keeps_every_entry():
    """A large cache absorbed by a fresh encoder (slots far smaller than the source's: its room is
    reserved at once, as a first batch call's does) keeps every entry, and they give the ids."""
    text = (fixture_text("corpus.en") + fixture_text("german.txt") + fixture_text("tinystories_sample.txt")).encode()
    big, fresh = GPT2._new_encoder(), GPT2._new_encoder()
    big.encode_text(text, 0, len(text), GPT2._pattern_id)
    n = big.cache_info()["entries"]
    assert n > 4096 and fresh.cache_info()["bytes"] < big.cache_info()["bytes"]
    fresh.absorb_cache(big)
    assert fresh.cache_info()["entries"] == n and big.cache_info()["entries"] == 0
    misses = fresh.cache_info()["misses"]
    ids, _, _ = fresh.encode_text(text, 0, len(text), GPT2._pattern_id)
    assert ids.tolist() == GPT2.encode_ordinary(text) and fresh.cache_info()["misses"] == misses


def test_a_cold_batch_merges_into_one_shared_cache(every_byte_a_thread):
    """A first multi-thread call: its threads add what they merge to the one shared cache (room
    reserved for the batch), not each to its own, so it holds every distinct piece of the batch
    (as a one-thread encoder's cache does) and is last in the idle list; the threads' own caches
    stay empty; the next call finds every piece there."""
    tok = _gpt2()
    docs = [d for d in fixture_text("tinystories_sample.txt").split(EOT) if d]
    want = gpt2_tiktoken().encode_batch(docs, allowed_special="all")
    assert tok.encode_ordinary_batch(docs, 2) == want
    kept = tok._idle[-1]
    assert [e.cache_info()["entries"] for e in tok._idle[:-1]] == [0, 0]
    one = tok._new_encoder()
    for d in docs:
        one.encode_text(d.encode(), 0, len(d.encode()), tok._pattern_id)
    assert kept.cache_info()["entries"] == one.cache_info()["entries"] > 0
    # each distinct piece merged once, unless two threads missed it at the same moment
    misses = sum(e.cache_info()["misses"] for e in tok._idle)
    assert one.cache_info()["misses"] <= misses < 1.05 * one.cache_info()["misses"]
    assert tok.encode_batch(docs, 2) == want
    assert sum(e.cache_info()["misses"] for e in tok._idle) == misses


@pytest.mark.parametrize("max_entries", [1, 40, 1 << 18])
@pytest.mark.parametrize("reserve", [False, True])
def test_a_full_shared_cache_spills_into_the_threads_caches(max_entries, reserve):
    """The shared cache of a job is never grown nor cleared while the threads read it: once it is
    full (``max_entries``, or its slots at 3/4 when no room was reserved), each thread keeps its
    new pieces in its own cache; the ids are the same, and ``absorb_cache`` afterwards keeps them."""
    import threading

    text = fixture_text("corpus.en") + fixture_text("german.txt")
    docs = [d for d in text.split("\n") if d]
    want = [GPT2.encode_ordinary(d) for d in docs]
    shared = _encode.Encoder(GPT2._table, max_entries=max_entries)
    if reserve:
        assert shared.reserve_shared(sum(len(d) for d in docs)) > 0
    workers = [GPT2._new_encoder() for _ in range(3)]
    job = _encode.BatchJob(docs, GPT2._pattern_id)
    threads = [threading.Thread(target=job.run, args=(enc, shared, 3)) for enc in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _split(*job.collect()) == want
    n_shared = shared.cache_info()["entries"]
    assert 0 < n_shared <= max_entries
    if max_entries == 1 or not reserve:
        assert sum(e.cache_info()["entries"] for e in workers) > 0     # spilled
    for enc in workers:
        shared.absorb_cache(enc)
    assert _split(*_one_job(docs, shared)) == want


def _one_job(docs, enc):
    job = _encode.BatchJob(docs, GPT2._pattern_id)
    job.run(enc)
    return job.collect()


def test_reserve_shared_makes_room_before_the_job():
    enc = _encode.Encoder(GPT2._table)
    small = enc.cache_info()["bytes"]
    assert enc.reserve_shared(0) == 0 and enc.cache_info()["bytes"] == small
    got = enc.reserve_shared(5_000_000)                 # ~83k pieces at 3/4 load: 131072 slots
    assert 80_000 < got < 90_000 and enc.cache_info()["bytes"] >= 131072 * 32
    assert _encode.Encoder(GPT2._table, max_entries=100).reserve_shared(5_000_000) == 100


def test_batch_job_contract():
    t = GPT2._table
    job = _encode.BatchJob(["a b", b"c"], 0)
    with pytest.raises(RuntimeError, match="before every document"):
        job.collect()
    with pytest.raises(ValueError, match="one rank table"):
        job.run(GPT2._new_encoder(), Tokenizer({i: bytes([i]) for i in range(256)}, [])._new_encoder())
    job.run(_encode.Encoder(t))
    ids, offsets = job.collect()
    assert _split(ids, offsets) == [GPT2.encode("a b"), GPT2.encode("c")]
    with pytest.raises(ValueError, match="pattern id"):
        _encode.BatchJob([], 7)
    ids, offsets = _encode.BatchJob([], 0).collect()
    assert ids.size == 0 and offsets.tolist() == [0]


@pytest.mark.parametrize("n_workers", [1, 3])
def test_reserved_and_grown_worker_buffers_keep_every_id(n_workers):
    """A worker reserves its share of the ids first (one per 3 bytes; from 2 MiB up the buffer is
    2 MiB aligned, with huge pages advised) and grows it, keeping what it holds, when a document
    has more: on a byte vocabulary every byte is an id, three times the reservation."""
    t = Tokenizer({i: bytes([i]) for i in range(256)}, [])._table
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in (3 << 20, 5, 1 << 20, 0)]
    job = _encode.BatchJob(docs, 0)
    job.run(_encode.Encoder(t), None, n_workers)
    ids, offsets = job.collect()
    assert offsets.tolist() == [0, 3 << 20, (3 << 20) + 5, (4 << 20) + 5, (4 << 20) + 5]
    assert np.array_equal(ids, np.frombuffer(b"".join(docs), np.uint8).astype(np.uint32))
    with pytest.raises(ValueError, match="n_workers"):
        _encode.BatchJob(docs, 0).run(_encode.Encoder(t), None, 0)


def test_custom_pattern_and_stage_free_paths_still_batch():
    custom = Tokenizer(GPT2.vocab, GPT2.merges, [EOT], pattern=r"\S+|\s+")
    texts = ["a  b" + EOT, "", "ccc dd"]
    assert custom.encode_batch(texts, 2) == [custom.encode(t) for t in texts]
    ids, offsets = custom.encode_batch_flat(texts, 2)
    assert _split(ids, offsets) == [custom.encode(t) for t in texts]


def test_concurrent_batches_on_one_tokenizer(every_byte_a_thread):
    """Python threads that each run batches (and one-thread calls) on one tokenizer at once: every
    encoder is borrowed by one job at a time, so the ids stay exact."""
    import threading

    tok = _gpt2()
    docs = [d for d in fixture_text("tinystories_sample.txt").split(EOT) if d]
    want = gpt2_tiktoken().encode_batch(docs, allowed_special="all")
    failures = []

    def work(k):
        for _ in range(3):
            if tok.encode_batch(docs[k:] + docs[:k], 3) != want[k:] + want[:k]:
                failures.append(k)
            if tok.encode(docs[k]) != want[k]:
                failures.append(-k)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_several_workers_take_the_large_documents_first():
    """With several workers the documents over 1/64 of a worker's share are taken first, largest
    first (``ordered``), the rest in order; one worker keeps document order. The ids are the same."""
    t = GPT2._table
    small = [f"doc {k} " * 3 for k in range(200)]
    docs = small[:50] + ["big " * 2000] + small[50:] + ["bigger " * 3000]
    want = [GPT2.encode(d) for d in docs]
    for n_workers, ordered in ((1, False), (2, True), (3, True)):
        job = _encode.BatchJob(docs, GPT2._pattern_id)
        for _ in range(n_workers):                  # one after another: the first takes them all
            job.run(_encode.Encoder(t), None, n_workers)
        assert job.ordered is ordered
        ids, offsets = job.collect()
        assert _split(ids, offsets) == want
        job = _encode.BatchJob(docs, GPT2._pattern_id)
        job.run(_encode.Encoder(t), None, n_workers)
        assert job.collect(GPT2._tokens) == want
    job = _encode.BatchJob(small, GPT2._pattern_id)   # none large: document order
    job.run(_encode.Encoder(t), None, 2)
    assert not job.ordered and _split(*job.collect()) == [GPT2.encode(d) for d in small]


# Documents of the sizes that meet the batch's edges: empty, one byte, keys of 8 to 16 bytes that
# share their first 8 and differ after, keys that end a document (the last pieces of a text are
# probed one by one, the others by the loop of hits), and text that spans several blocks of pieces.
TINY = ["", " ", "a", "é", "\n\n", "abcdefgh", " abcdefgh", "abcdefghijklmnop", "abcdefghijklmnoq", " tokenizer",
        " tokenizes", " tokenizers!!", "  x", "😀", "hello world",
        " the the the the the the the the the the the the the the the the the the"]


@SETTINGS
@given(st.lists(st.sampled_from(TINY) | st.text(max_size=30), max_size=200), st.integers(0, 2),
       st.integers(1, 3))
def test_warm_flat_batches_of_tiny_and_huge_documents_match_tiktoken(docs, n_huge, threads):
    """Many tiny documents, empty ones and up to two huge ones (anywhere in the batch, so the
    threads' shares end at every kind of boundary), flat and as lists, twice (the second call
    reads the cache the first one filled): every document's ids are tiktoken's."""
    docs = [d.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for d in docs]
    for k in range(n_huge):
        docs.insert((k * 7919) % (len(docs) + 1), (" the tokenizer" * 700 + "x" * 20) * (k + 1))
    want = gpt2_tiktoken().encode_batch(docs, allowed_special="all")
    tok = GPT2
    saved = batch_mod._BATCH_THREAD_BYTES
    batch_mod._BATCH_THREAD_BYTES = 1
    try:
        for _ in range(2):
            ids, offsets = tok.encode_batch_flat(docs, threads)
            assert _split(ids, offsets) == want
            assert tok.encode_batch(docs, threads) == want
    finally:
        batch_mod._BATCH_THREAD_BYTES = saved
