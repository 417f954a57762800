"""The output side's fused paths, each against the separate passes it replaces:

* ``Encoder.encode_counted`` (the corpus worker's encode + uint16 narrowing + conservation sum in one
  pass) equals ``encode_text`` followed by ``sum_lengths`` and ``astype``, on random and adversarial
  bytes, with a block limit, with specials, and with a length table that misses ids (-1, so the
  corpus encoder's check refuses);
* ``EncoderSpec.iter_encode_counted`` equals ``iter_encode`` + the plain sum (``_counted``), native
  and not.
"""
import functools
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.encode import _encode, ids_out
from bpe_core.encode import encode_corpus as ec
from bpe_core.encode import tokenizer as tk
from bpe_core.errors import InternalError
from bpe_core.encode.tokenizer import Tokenizer

from encode_helpers import EOT, SETTINGS, gpt2_tokenizer, small_model

TEXTS = st.one_of(
    st.binary(max_size=400),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.lists(st.sampled_from([b" the", b"a", EOT.encode(), b"\n\n", b"\xe2\x82", b"\xff", b"  ", b"1234"]),
             max_size=60).map(b"".join),
)


def _plain(enc, buf, start, end, pattern_id, table, max_bytes, lengths, narrow):
    ids, stop, done = enc.encode_text(buf, start, end, pattern_id, table, max_bytes)
    n_bytes = _encode.sum_lengths(lengths, ids)
    return ids.astype(np.uint16) if narrow else ids, stop, done, n_bytes


@functools.lru_cache(maxsize=None)
def _small():
    return Tokenizer(*small_model())


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_tokenizer()


@SETTINGS
@given(data=TEXTS, narrow=st.booleans(), max_bytes=st.sampled_from([0, 1, 7, 64]),
       cut=st.integers(0, 400), specials=st.booleans())
def test_encode_counted_equals_the_separate_passes(gpt2, data, narrow, max_bytes, cut, specials):
    tok = gpt2
    lengths = ec._token_lengths(tok)
    table = tok._special_table_for(specials) if specials else None
    start = min(cut, len(data))
    enc_a, enc_b = tok._borrow(), tok._borrow()
    try:
        got = enc_a.encode_counted(data, start, len(data), tok._pattern_id, table, max_bytes, lengths, narrow)
        want = _plain(enc_b, data, start, len(data), tok._pattern_id, table, max_bytes, lengths, narrow)
    finally:
        tok._idle += [enc_a, enc_b]
    assert got[0].dtype == (np.uint16 if narrow else np.uint32)
    assert got[0].tolist() == want[0].tolist() and got[1:] == want[1:]
    if got[2]:
        assert got[3] == got[1] - start            # conservation: the ids stand for the bytes encoded


@SETTINGS
@given(data=st.binary(min_size=1, max_size=300), short=st.integers(0, 300), narrow=st.booleans())
def test_encode_counted_reports_an_id_outside_the_table(gpt2, data, short, narrow):
    """A table that misses some ids gives -1 exactly when sum_lengths does (the check then refuses)."""
    tok = gpt2
    lengths = np.ascontiguousarray(ec._token_lengths(tok)[:short])
    enc = tok._borrow()
    try:
        ids, stop, done, n_bytes = enc.encode_counted(data, 0, len(data), tok._pattern_id, None, 0, lengths, narrow)
        wide, _, _ = enc.encode_text(data, 0, len(data), tok._pattern_id, None, 0)
    finally:
        tok._idle.append(enc)
    full = ec._token_lengths(tok)
    assert ids.tolist() == (wide.astype(np.uint16) if narrow else wide).tolist()
    assert n_bytes == _encode.sum_lengths(lengths, wide)
    assert (n_bytes == -1) == bool(len(wide) and int(wide.max()) >= short)
    assert n_bytes == -1 or n_bytes == int(full[wide].sum()) == len(data)


def test_encode_counted_refuses_to_narrow_a_large_vocabulary(gpt2):
    enc = gpt2._borrow()
    try:
        with pytest.raises(ValueError):
            enc.encode_counted(b"ab", 0, 2, gpt2._pattern_id, None, 0, np.ones(70000, np.int64), True)
        ids, _, _, n = enc.encode_counted(b"ab", 0, 2, gpt2._pattern_id, None, 0, np.ones(70000, np.int64), False)
        assert ids.dtype == np.uint32 and n == 1
        ids, stop, done, n = enc.encode_counted(b"ab", 1, 1, gpt2._pattern_id, None, 0, np.ones(3, np.int64), True)
        assert len(ids) == 0 and (stop, done, n) == (1, True, 0)
    finally:
        gpt2._idle.append(enc)


@SETTINGS
@given(data=TEXTS, narrow=st.booleans())
def test_spec_iter_encode_counted_equals_iter_encode(data, narrow):
    tok = _small()
    lengths = ec._token_lengths(tok)
    spec = tok._encoder_spec()
    plain = list(tk._counted(spec.iter_encode(data, 0, len(data)), lengths, narrow))
    fused = list(spec.iter_encode_counted(data, 0, len(data), lengths, narrow))
    assert [(a.dtype, a.tolist(), n) for a, n in fused] == [(a.dtype, a.tolist(), n) for a, n in plain]
    assert sum(n for _, n in fused) == len(data)


@pytest.mark.parametrize("fault", ["longer", "short_table"])
@pytest.mark.parametrize("workers", [1, 2])
def test_the_corpus_check_refuses_ids_that_do_not_stand_for_the_bytes(tmp_path, monkeypatch, fault, workers):
    """A length table one byte off on every merged token, or one that misses ids: the run stops
    with the conservation error and publishes nothing; a table that misses ids stops the block
    before its ids are put."""
    tok = _small()
    src = tmp_path / "in.txt"
    src.write_bytes((b"the cat sat on the mat " * 300 + EOT.encode() + b"\n") * 4)
    real = ec._token_lengths

    def wrong(t):
        lengths = real(t).copy()
        if fault == "longer":
            lengths[256:] += 1
            return lengths
        return np.ascontiguousarray(lengths[:256])

    puts = []
    real_put = ids_out.ChunkSlot.put

    def put(self, ids):
        puts.append(int(ids.max()) if len(ids) else -1)
        return real_put(self, ids)

    monkeypatch.setattr(ec, "_token_lengths", wrong)
    monkeypatch.setattr(ids_out.ChunkSlot, "put", put)
    with pytest.raises(InternalError, match="do not add up"):
        ec.encode_corpus(src, tok, tmp_path / "ids.npy", num_workers=workers, chunk_bytes=1000, progress=False)
    if fault == "short_table":
        assert all(m < 256 for m in puts)             # no block with an id outside the table was put
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]


# ---- str input: the str's own UTF-8 (``_encode.utf8_of``) ------------------------------------------

SURROGATE_TEXTS = st.lists(st.one_of(
    st.characters(),                                              # any code point, surrogates included
    st.sampled_from(["\udc80", "\udcff", "\ud800", "\udfff", "é", "€", "😀", " ", "a", EOT, "\n"])),
    max_size=80).map("".join)


def _old_bytes(text):
    return text.encode("utf-8", "surrogateescape")


@SETTINGS
@given(text=SURROGATE_TEXTS)
def test_utf8_of_equals_surrogateescape(text):
    try:
        want = _old_bytes(text)
    except UnicodeEncodeError as e:
        with pytest.raises(UnicodeEncodeError) as got:
            _encode.utf8_of(text)
        assert (got.value.start, got.value.end, got.value.reason) == (e.start, e.end, e.reason)
        return
    view = _encode.utf8_of(text)
    assert bytes(view) == want and len(view) == len(want)
    assert bytes(_encode.utf8_of(text)) == want        # again: the UTF-8 kept in the str


# ASCII runs of every length between code points of each width (the converter takes 8, 4 or 2
# ASCII code points at a time, by the str's kind), and surrogates anywhere.
MIXED_TEXTS = st.lists(st.one_of(st.text(alphabet="ab \n", max_size=19), SURROGATE_TEXTS,
                                 st.sampled_from(["ÿ", "é", "\x80", "€", "\uffff", "😀", "\U0010ffff", "\udcff"])),
                       max_size=12).map("".join)


@SETTINGS
@given(text=MIXED_TEXTS)
def test_encode_utf8_equals_surrogateescape(text):
    """``_encode.encode_utf8`` (what ``utf8_of`` and the batch job use for a str without kept
    UTF-8) gives CPython's bytes, or its error, for strs of each kind (latin-1, UCS-2, UCS-4)."""
    for t in (text, text + "ÿ", text + "€", text + "😀"):
        try:
            want = _old_bytes(t)
        except UnicodeEncodeError as e:
            with pytest.raises(UnicodeEncodeError) as got:
                _encode.encode_utf8(t)
            assert (got.value.start, got.value.end) == (e.start, e.end)
            continue
        assert _encode.encode_utf8(t) == want


@SETTINGS
@given(text=SURROGATE_TEXTS, specials=st.booleans())
def test_encode_of_a_str_equals_encode_of_its_bytes(gpt2, text, specials):
    """Every str, lone surrogates included, encodes as its ``surrogateescape`` bytes did; a str that
    has none (a high surrogate not from surrogateescape) raises the same error as before."""
    try:
        data = _old_bytes(text)
    except UnicodeEncodeError as e:
        with pytest.raises(UnicodeEncodeError) as got:
            gpt2.encode_to_numpy(text, specials)
        assert (got.value.start, got.value.end) == (e.start, e.end)
        with pytest.raises(UnicodeEncodeError):
            gpt2.encode(text)
        return
    want = gpt2.encode_to_numpy(data, specials)
    assert gpt2.encode_to_numpy(text, specials).tolist() == want.tolist()
    assert gpt2.encode_to_numpy(text, specials).tolist() == want.tolist()     # the kept UTF-8
    assert gpt2.encode(text) == gpt2.encode(data)
    assert gpt2.encode_ordinary(text) == gpt2.encode_ordinary(data)


def test_utf8_of_reads_only_what_costs_nothing():
    """ASCII: a view of the str itself; other text: encoded (bytes), unless CPython kept its UTF-8."""
    import ctypes
    assert type(_encode.utf8_of("plain ascii")).__name__ == "Utf8View"
    fresh = "".join(["caf", "é ", "€"])
    assert type(_encode.utf8_of(fresh)) is bytes and bytes(_encode.utf8_of(fresh)) == fresh.encode()
    get = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_void_p]
    assert get(fresh, None)                              # CPython makes and keeps its UTF-8
    view = _encode.utf8_of(fresh)
    assert type(view).__name__ == "Utf8View" and bytes(view) == fresh.encode()


def test_utf8_view_keeps_its_str_alive():
    import gc
    view = _encode.utf8_of("".join(["abc "] * 1000))
    gc.collect()
    assert bytes(view) == b"abc " * 1000
    with pytest.raises((BufferError, TypeError)):
        memoryview(view)[0:1] = b"x"                     # read-only
    assert bytes(_encode.utf8_of("")) == b""


def test_str_input_edge_cases(gpt2):
    class S(str):
        def encode(self, *a, **k):                       # a subclass is encoded as before (its own encode)
            return b"x"
    assert gpt2.encode_to_numpy(S("hello")).tolist() == gpt2.encode_to_numpy(b"x").tolist()
    long = ("caf\u00e9 \udcff naïve " * 120_000)           # over one native block: the generator path
    assert gpt2.encode_to_numpy(long).tolist() == gpt2.encode_to_numpy(_old_bytes(long)).tolist()
    for text in ("é" + EOT, "x" + EOT):                  # read by encode, and in place (ASCII)
        with pytest.raises(ValueError, match="disallowed special"):
            gpt2.encode(text, allowed_special=set(), disallowed_special="all")
        assert gpt2.encode(text, allowed_special=set(), disallowed_special=()) == gpt2.encode_ordinary(text)


# ---- batches: lists straight from the workers' buffers, one worker's buffer handed over ---------

DOCS = st.lists(st.one_of(st.binary(max_size=60), st.text(max_size=30),
                          st.sampled_from(["", " the cat", EOT, "\udcff é"])), max_size=40)


def _job(tok, docs, n_workers, specials=True):
    job = _encode.BatchJob(docs, tok._pattern_id, tok._special_table_for(specials))
    lent = tok._borrow()
    tok._idle.append(lent)
    encs = [_encode.Encoder(lent.table, max_entries=1 << 10) for _ in range(n_workers)]   # small caches
    import threading
    threads = [threading.Thread(target=job.run, args=(e,)) for e in encs[1:]]
    for t in threads:
        t.start()
    job.run(encs[0])
    for t in threads:
        t.join()
    return job, encs


def _want(tok, docs, specials=True):
    return [tok.encode_to_numpy(d, specials).tolist() for d in docs]


@SETTINGS
@given(docs=DOCS, n_workers=st.sampled_from([1, 2, 3]))
def test_collect_lists_equal_split_lists_of_the_flat_ids(gpt2, docs, n_workers):
    import gc
    want = _want(gpt2, docs)
    job, _ = _job(gpt2, docs, n_workers)
    got = job.collect(gpt2._tokens)
    assert got == want
    assert all(type(x) is list and gc.is_tracked(x) for x in got)
    job, _ = _job(gpt2, docs, n_workers)
    ids, offsets = job.collect()
    assert gpt2._tokens.split_lists(ids, offsets) == want
    assert ids.dtype == np.uint32 and ids.flags.writeable and ids.flags.c_contiguous


@SETTINGS
@given(docs=DOCS)
def test_a_handed_over_buffer_outlives_its_encoder_and_the_next_job(gpt2, docs):
    want = _want(gpt2, docs)
    job, (enc,) = _job(gpt2, docs, 1)
    ids, offsets = job.collect()
    flat = [i for w in want for i in w]
    assert ids.tolist() == flat and offsets[-1] == len(flat)
    copy = ids.copy()
    other = ["zzz " * 50, "qq"] * 3                      # the same encoder writes a new buffer
    job2 = _encode.BatchJob(other, gpt2._pattern_id, None)
    job2.run(enc)
    ids2, _ = job2.collect()
    del job, job2, enc
    import gc
    gc.collect()
    assert ids.tolist() == copy.tolist()                 # the first job's ids, untouched
    assert ids2.tolist() == [i for d in other for i in gpt2.encode_to_numpy(d, False).tolist()]
    if len(ids):
        ids[0] = 7                                       # writable, as np.empty's was
        assert ids[0] == 7


def test_batch_api_lists_equal_the_flat_api(gpt2):
    docs = ["hello world", "", "é " * 300, EOT + " x", b"\xff\xfe"] * 200
    for threads in (1, 2, 4):
        flat_ids, offsets = gpt2.encode_batch_flat(docs, num_threads=threads)
        want = gpt2._tokens.split_lists(flat_ids, offsets)
        assert gpt2.encode_batch(docs, num_threads=threads) == want
        assert gpt2.encode_ordinary_batch(docs, num_threads=threads) == [gpt2.encode_ordinary(d) for d in docs]


def test_lists_built_without_zeroing_survive_a_collection_midway():
    """``_list`` leaves slots unset until written: the lists are untracked meanwhile, so a
    collection while a batch is built (forced here by a tiny threshold) never sees them."""
    import gc
    t = _encode.TokenTable([bytes([i]) for i in range(256)], max_ints=16)   # ids >= 16: new ints
    ids = (np.arange(5000, dtype=np.uint32) * 7) % 256
    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        lists = t.split_lists(ids, np.arange(0, 5001, 5, dtype=np.int64))
        one = t.to_list(ids)
    finally:
        gc.set_threshold(*old)
    assert one == ids.tolist() and gc.is_tracked(one)
    assert [x for l in lists for x in l] == ids.tolist()
