"""The native whole-text SuperBPE encoder (``encode.TwoStageEncoder``, ``_encode.encode_stage_aware``)
equals the plain path (``StageAwareEncoder.encode_python``) and the reference, on every named pattern
and on text with digits and whitespace beyond ASCII and invalid UTF-8."""
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core import reference
from bpe_core.methods.superbpe import StageAwareEncoder

from strategies import SPECIAL, corpus_bytes

PIECES = ["the", " the", " cat", "  ", " ", "\n", "\n\n", "\t", "1", " 12", "2024", "٣٣", " ²", "½", "\u2003",
          "\u3000", "\u00a0", "\x85", "\u2028", " é", "日本", ".", "!!", " 'll", "'s", "\r\n", "\xff", "\xe2\x82",
          SPECIAL]
text = st.lists(st.sampled_from(PIECES), max_size=60).map(
    lambda ps: b"".join(p.encode("latin-1") if p in ("\xff", "\xe2\x82") else p.encode() for p in ps))

_MODELS = {}


def _model(pattern):
    """A small SuperBPE model per pattern, trained once on a mix of the pieces."""
    if pattern not in _MODELS:
        rng = np.random.default_rng(7)
        pieces = [p.encode() for p in PIECES[:-3]]
        data = b"".join(pieces[i] for i in rng.integers(0, len(pieces), 4000))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.txt")
            with open(path, "wb") as f:
                f.write(data + SPECIAL.encode() + data[:999])
            r = bpe_core.train(bpe_core.TrainConfig(path, 420, method="superbpe", transition=320, pattern=pattern,
                                                    num_workers=1))
        _MODELS[pattern] = r
    return _MODELS[pattern]


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
@settings(max_examples=40, deadline=None)
@given(data=st.one_of(text, corpus_bytes))
def test_native_equals_plain_path(pattern, data):
    r = _model(pattern)
    enc = StageAwareEncoder(r.model)
    assert enc.native is not None
    native = enc.encode(data)
    assert native == enc.encode_python(data)
    assert enc.encode_array(data, specials=False).tolist() == enc.encode_ordinary(data).tolist()
    if pattern == "gpt2":
        assert native == reference.encode_superbpe(data, r.vocab, r.merges, r.model.stages[0]["merges"], [SPECIAL],
                                                   pattern=pattern)


def test_stage_aware_tokenizer_uses_the_native_path():
    r = _model("gpt2")
    with tempfile.TemporaryDirectory() as d:
        bpe_core.formats.model.dump_folder(r.model, d)
        tok = bpe_core.Tokenizer.load(d)
    data = "the cat  sat 2024\u3000½ the\n\n the" + SPECIAL + " the cat"
    assert tok.encode(data) == StageAwareEncoder(r.model).encode_python(data)
    assert tok.encode_ordinary(data) == StageAwareEncoder(r.model).encode_ordinary(data.encode()).tolist()


@settings(max_examples=40, deadline=None)
@given(data=st.one_of(text, corpus_bytes))
def test_native_takes_a_str_as_its_utf8(data):
    """``TwoStageEncoder.encode`` of a ``str`` (ASCII: its own bytes; other text: written into the
    encoder's scratch buffer, the same buffer call after call; a surrogate: ``surrogateescape``)
    equals the encode of its UTF-8 bytes, and so does ``StageAwareTokenizer.encode_to_numpy``."""
    r = _model("gpt2")
    native = StageAwareEncoder(r.model).native
    as_str = data.decode("utf-8", "surrogateescape")
    want = native.encode(data).tolist()
    for _ in range(2):
        assert native.encode(as_str).tolist() == want
        assert native.encode(as_str, False).tolist() == native.encode(data, False).tolist()
    assert native.encode("").tolist() == []


def test_stage_aware_str_inputs_of_every_kind():
    """A ``str`` of each storage kind (ASCII, Latin-1, UCS-2, UCS-4), one with a surrogate and a
    longer one after them (the scratch buffer grown): the ids of its UTF-8 bytes, for the
    tokenizer's array and list."""
    r = _model("gpt2")
    with tempfile.TemporaryDirectory() as d:
        bpe_core.formats.model.dump_folder(r.model, d)
        tok = bpe_core.Tokenizer.load(d)
    base = "the cat  sat 2024 the\n\n the" + SPECIAL + " the cat"
    for t in (base, base + "é½", base + "\u3000€", base + "😀", base + "a\udcff b", (base + "é") * 3000):
        want = StageAwareEncoder(r.model).encode_python(t.encode("utf-8", "surrogateescape"))
        assert tok.encode_to_numpy(t).tolist() == want and tok.encode(t) == want


BATCH_TEXTS = st.lists(st.one_of(text, text.map(lambda b: b.decode("utf-8", "surrogateescape"))), max_size=12)


@settings(max_examples=25, deadline=None)
@given(texts=BATCH_TEXTS, threads=st.integers(1, 4))
def test_stage_aware_batches_equal_encode(texts, threads):
    """The batches of a stage-aware model (runs of texts on threads, each run one native call into
    one buffer: ``TwoStageEncoder.encode_flat``) give each text's own ids, str and bytes alike."""
    from bpe_core.encode import tokenizer_batch as batch_mod      # owns _BATCH_THREAD_BYTES

    saved = batch_mod._BATCH_THREAD_BYTES
    batch_mod._BATCH_THREAD_BYTES = 1           # a thread per byte: threads on the smallest batch
    try:
        tok = _stage_tokenizer()
        assert tok._native_stage
        want = [tok.encode(t) for t in texts]
        assert tok.encode_batch(texts, threads) == want
        assert tok.encode_ordinary_batch(texts, threads) == [tok.encode_ordinary(t) for t in texts]
        ids, offsets = tok.encode_batch_flat(texts, threads)
        assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want
        assert [a.tolist() for a in tok._stage.native.encode_many(texts)] == want
        ids, offsets = tok._stage.native.encode_flat([bytearray(_b(t)) for t in texts] + [memoryview(b"")], False)
        assert offsets.dtype == np.int64 and len(offsets) == len(texts) + 2 and offsets[-1] == offsets[-2] == len(ids)
        assert [ids[a:b].tolist() for a, b in zip(offsets[:-2], offsets[1:-1])] == [tok.encode_ordinary(t) for t in texts]
        assert [tok.encode_to_numpy(t).tolist() for t in texts] == want
    finally:
        batch_mod._BATCH_THREAD_BYTES = saved


def _b(t):
    return t.encode("utf-8", "surrogateescape") if isinstance(t, str) else t


_STAGE_TOKENIZERS = []


def _stage_tokenizer():
    if not _STAGE_TOKENIZERS:
        with tempfile.TemporaryDirectory() as d:
            bpe_core.formats.model.dump_folder(_model("gpt2").model, d)
            _STAGE_TOKENIZERS.append(bpe_core.Tokenizer.load(d))
    return _STAGE_TOKENIZERS[0]


# ---- stage 2 by segments (encode._encode.Stage2Table, _merge_short) ---------------------------

from bpe_core.encode import _encode  # noqa: E402
from bpe_core.encode.tokenizer import TwoStageEncoder  # noqa: E402
from bpe_core.engine.units import RankMerger  # noqa: E402

SHORT_SEG = 32          # _encode.pyx: segments up to this many ids are merged by the scan


@st.composite
def byte_merges(draw):
    """Merges as a model has them: ids canonical by bytes, a merge's result is its parts' bytes
    (so two merges can build the same bytes, and a pair can be merged again later)."""
    alphabet = draw(st.integers(2, 4))
    toks = [bytes([97 + i]) for i in range(alphabet)]
    ids = {t: i for i, t in enumerate(toks)}
    merges = []
    for _ in range(draw(st.integers(0, 24))):
        if merges and draw(st.integers(0, 4)) == 0:     # a pair merged again, later
            a, b = toks[merges[draw(st.integers(0, len(merges) - 1))][0]], toks[merges[-1][1]]
        else:
            a = toks[draw(st.integers(0, len(toks) - 1))]
            b = toks[draw(st.integers(0, len(toks) - 1))]
        if len(a) + len(b) > 8:
            continue
        if a + b not in ids:
            ids[a + b] = len(toks)
            toks.append(a + b)
        merges.append((ids[a], ids[b], ids[a + b]))
    return toks, merges


@st.composite
def merge_case(draw):
    toks, merges = draw(byte_merges())
    n_ids = len(toks)
    # a sequence: ids, or the bytes of tokens cut back to single letters (so the merges fire)
    parts = draw(st.lists(st.integers(0, n_ids - 1), max_size=40))
    if draw(st.booleans()):
        seq = [b - 97 for i in parts for b in toks[i]]
    else:
        seq = parts
    return merges, seq


def _merger(merges):
    arr = np.array(merges, dtype=np.uint32).reshape(-1, 3)
    return RankMerger(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy())


@settings(max_examples=300, deadline=None)
@given(case=merge_case())
def test_segments_merge_as_the_whole_sequence(case):
    """Cutting at pairs that are not crossable and merging each segment (scan up to SHORT_SEG ids,
    else the heap) equals RankMerger.merge of the whole sequence; so does the table with no cuts."""
    merges, seq = case
    m = _merger(merges)
    want = m.merge(np.array(seq, dtype=np.uint32)).tolist()
    assert _encode.Stage2Table(m).merge(seq).tolist() == want
    assert _encode.Stage2Table(m, all_cross=True).merge(seq).tolist() == want


@pytest.mark.parametrize("n", [SHORT_SEG - 1, SHORT_SEG, SHORT_SEG + 1, 3 * SHORT_SEG])
def test_segments_at_the_scan_threshold(n):
    """One segment of n ids (every pair crossable): the scan (<= SHORT_SEG) and the heap (longer)
    both give RankMerger's result, also where a merge builds bytes an earlier id has."""
    # a=0, b=1; (a,a)->aa=2, (aa,aa)->aaaa=3, (a,aa)->aaa=4, (aa,a)->aaa=4 (a second way), (aaa,a)->3
    m = _merger([(0, 0, 2), (2, 2, 3), (0, 2, 4), (2, 0, 4), (4, 0, 3), (1, 0, 5), (5, 2, 6)])
    t = _encode.Stage2Table(m)
    for seq in ([0] * n, ([0, 0, 1] * n)[:n], ([1, 0, 0, 0] * n)[:n]):
        want = m.merge(np.array(seq, dtype=np.uint32)).tolist()
        assert t.merge(seq).tolist() == want
        assert _encode.Stage2Table(m, all_cross=True).merge(seq).tolist() == want


@st.composite
def short_case(draw):
    """A sequence of 3 to 9 ids over a small alphabet whose merges fire densely: repeated pairs (equal
    ranks at several places, overlapping ones: ``a a a``), merges of merged ids, a pair merged again
    later, bytes built by two merges."""
    toks, merges = draw(byte_merges())
    seq = draw(st.lists(st.integers(0, min(len(toks), 6) - 1), min_size=3, max_size=9))
    return merges, seq


@settings(max_examples=400, deadline=None)
@given(case=short_case())
def test_short_segments_merge_as_the_heap(case):
    """One segment of 3 to 9 ids, the lengths most segments of text have (``_merge3``'s and
    ``_merge_short``'s rounds), gives RankMerger's result, with and without cuts."""
    merges, seq = case
    m = _merger(merges)
    want = m.merge(np.array(seq, dtype=np.uint32)).tolist()
    assert _encode.Stage2Table(m).merge(seq).tolist() == want
    assert _encode.Stage2Table(m, all_cross=True).merge(seq).tolist() == want


@pytest.mark.parametrize("n", [3, 4, 5, 7, 8, 9])
def test_short_segments_of_repeated_pairs(n):
    """Runs of one id (every pair the same rank, overlapping: the leftmost merges first) and patterns
    whose merges build on each other, n ids long, agree with the heap."""
    m = _merger([(0, 0, 2), (2, 2, 3), (0, 2, 4), (2, 0, 4), (4, 0, 3), (1, 0, 5), (5, 2, 6)])
    for seq in ([0] * n, ([0, 0, 1] * n)[:n], ([1, 0, 0, 0] * n)[:n], ([0, 1] * n)[:n], [1] * n):
        want = m.merge(np.array(seq, dtype=np.uint32)).tolist()
        assert _encode.Stage2Table(m).merge(seq).tolist() == want, seq
        assert _encode.Stage2Table(m, all_cross=True).merge(seq).tolist() == want, seq


def test_a_pair_merged_again_later():
    """(a, bc) has ranks 0 and 2: formed after rank 1, it merges at rank 2 (the rank chain)."""
    m = _merger([(0, 3, 4), (1, 2, 3), (0, 3, 4), (4, 4, 5)])          # a=0 b=1 c=2 bc=3 abc=4
    seq = [0, 1, 2, 0, 1, 2, 1]
    want = m.merge(np.array(seq, dtype=np.uint32)).tolist()
    assert want == [5, 1]
    assert _encode.Stage2Table(m).merge(seq).tolist() == want
    assert _encode.Stage2Table(m, all_cross=True).merge(seq).tolist() == want


def test_bytes_built_again_by_a_later_merge():
    """abc is built at rank 2 and again at rank 4; a pair (abc, d) of rank 3 does not apply after
    rank 4 (merges are replayed in rank order), on either side of a three-id segment."""
    a, b, c, d, ab, bc, abc, abcd, cd, bcd, e, ea = range(12)
    m = _merger([(a, b, ab), (b, c, bc), (ab, c, abc), (abc, d, abcd), (a, bc, abc), (e, a, ea)])
    m2 = _merger([(c, d, cd), (b, cd, bcd), (a, bcd, abcd), (b, c, bc), (bc, d, bcd)])
    for merger, seq, want in ((m, [a, bc, d], [abc, d]), (m, [a, b, c, d], [abcd]),
                              (m, [e, a, bc, d], [e, abc, d]),          # four ids: the general scan
                              (m2, [a, bc, d], [a, bcd]), (m2, [a, b, c, d], [abcd])):
        assert merger.merge(np.array(seq, dtype=np.uint32)).tolist() == want
        assert _encode.Stage2Table(merger).merge(seq).tolist() == want
        assert _encode.Stage2Table(merger).merge(seq * 3).tolist() == want * 3
        assert _encode.Stage2Table(merger, all_cross=True).merge(seq).tolist() == want


def test_crossable_pairs():
    """A pair is crossable when some merge's left can end with its left id and the merge's right can
    start with its right id; others cut (and the table really cuts: not every pair is crossable)."""
    m = _merger([(0, 1, 3), (3, 2, 4), (2, 2, 5)])      # ab, (ab)c, cc
    t = _encode.Stage2Table(m)
    assert t.lookup(0, 1) == (True, 0, 3)
    assert t.lookup(3, 2) == (True, 1, 4)
    assert t.lookup(1, 2) == (True, None, None)          # b|c inside (ab)c
    assert t.lookup(2, 0) == (False, None, None)
    assert t.lookup(1, 0) == (False, None, None)
    assert t.n_cross == 4 and not t.all_cross
    assert _encode.Stage2Table(m, max_pairs=2).all_cross  # too many to list: no cuts
    assert _encode.Stage2Table(m, max_pairs=2).lookup(2, 0) == (True, None, None)


def _encoders(r):
    enc = StageAwareEncoder(r.model)
    n1 = int(r.model.stages[0]["merges"])
    no_cuts = TwoStageEncoder(r.model.vocab, r.model.merges[:n1], r.model.special_tokens, enc.pattern,
                              enc.stage2, all_cross=True)
    return enc, no_cuts


@pytest.mark.parametrize("pattern", ["gpt2", "o200k"])
@settings(max_examples=30, deadline=None)
@given(data=st.one_of(text, corpus_bytes))
def test_native_without_cuts_equals_plain_path(pattern, data):
    enc, no_cuts = _encoders(_model(pattern))
    assert no_cuts.encode(data).tolist() == enc.encode_python(data)


def test_long_text_across_pretoken_windows():
    """Texts of many more pretokens than one window (4096), with units and segments that run
    across a window's end, equal the plain path."""
    r = _model("gpt2")
    enc, no_cuts = _encoders(r)
    rng = np.random.default_rng(3)
    pieces = [p.encode() for p in PIECES[:-3]]
    data = b"".join(pieces[i] for i in rng.integers(0, len(pieces), 30000))
    plain = enc.encode_python(data)
    assert enc.encode(data) == plain
    assert no_cuts.encode(data).tolist() == plain
    runs = b" the the" * 9000 + b"\n" + b"the cat" * 7000      # long segments, no cut for a while
    assert enc.encode(runs) == enc.encode_python(runs)
    assert no_cuts.encode(runs).tolist() == enc.encode_python(runs)
