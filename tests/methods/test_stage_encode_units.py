"""The native whole-text encoder on the ``"units"`` stage-2 split (SuperBPE's ``stage2_split="units"``
and SupraTok): ``_encode.encode_stage_aware(split="units")`` equals the plain path
(``StageAwareEncoder.encode_python``) and the reference, on every named pattern, on numbers of every
length (digit groups cut between stage-1 tokens), digits beyond ASCII and invalid UTF-8."""
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core import reference
from bpe_core.encode.tokenizer import TwoStageEncoder
from bpe_core.methods.superbpe import StageAwareEncoder
from bpe_core.methods.superbpe.words import numeric_cuts
from bpe_core.methods.supratok import SupraTokEncoder

from strategies import SPECIAL, corpus_bytes

PIECES = ["the", " the", " cat", "  ", " ", "\n", "\n\n", "\t", "1", " 12", "123", " 123", "2024", "12345",
          " 1234567", "4567", "٣٣", "١٢٣٤", " ²", "½", "２０２４", "\u2003", "\u00a0", " é", "日本", ".", ",", "!!",
          " 'll", "'s", "\r\n", "\xff", "\xe2\x82", SPECIAL]
text = st.lists(st.sampled_from(PIECES), max_size=60).map(
    lambda ps: b"".join(p.encode("latin-1") if p in ("\xff", "\xe2\x82") else p.encode() for p in ps))
digits = st.lists(st.sampled_from(["1", "2", "3", "0", "٣", "２", "²", "½", " ", "a", ",", "\xff"]),
                  min_size=1, max_size=40).map(
    lambda ps: b"".join(p.encode("latin-1") if p == "\xff" else p.encode() for p in ps))

_MODELS = {}


def _train(method, pattern, **kw):
    """A small model trained once on a mix of the pieces (digit groups of every size, so stage 2
    learns merges of digits that a missed group cut would apply)."""
    key = (method, pattern)
    if key not in _MODELS:
        rng = np.random.default_rng(11)
        pieces = [p.encode() for p in PIECES[:-3]]
        data = b"".join(pieces[i] for i in rng.integers(0, len(pieces), 4000))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.txt")
            with open(path, "wb") as f:
                f.write(data + SPECIAL.encode() + data[:999])
            _MODELS[key] = bpe_core.train(bpe_core.TrainConfig(path, 420, method=method, transition=290,
                                                               pattern=pattern, num_workers=1, **kw))
    return _MODELS[key]


def _superbpe(pattern):
    return _train("superbpe", pattern, stage2_split="units")


def _supratok():
    return _train("supratok", "gpt2", seed_min_count=3, seed_pmi=0.5, span_min_count=2, span_pmi=1.0,
                  heldout_fraction=0.3)


def test_units_models_take_the_native_path():
    enc = StageAwareEncoder(_superbpe("gpt2").model)
    assert enc.split == "units" and enc.native is not None
    assert SupraTokEncoder(_supratok().model).native is not None


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
@settings(max_examples=40, deadline=None)
@given(data=st.one_of(text, digits, corpus_bytes))
def test_native_units_equals_plain_path(pattern, data):
    r = _superbpe(pattern)
    enc = StageAwareEncoder(r.model)
    native = enc.encode(data)
    assert native == enc.encode_python(data)
    assert enc.encode_array(data, specials=False).tolist() == enc.encode_ordinary(data).tolist()
    if pattern == "gpt2":
        assert native == reference.encode_superbpe(data, r.vocab, r.merges, r.model.stages[0]["merges"], [SPECIAL],
                                                   pattern=pattern, split="units")


@settings(max_examples=60, deadline=None)
@given(data=st.one_of(text, digits, corpus_bytes))
def test_native_supratok_equals_plain_path(data):
    enc = SupraTokEncoder(_supratok().model)
    assert enc.encode(data) == enc.encode_python(data)
    assert enc.encode_array(data, specials=False).tolist() == enc.encode_ordinary(data).tolist()


@pytest.mark.parametrize("pattern", ["gpt2", "o200k"])
@settings(max_examples=30, deadline=None)
@given(data=st.one_of(text, digits))
def test_native_units_without_cuts_equals_plain_path(pattern, data):
    """Every pair crossable (no Stage2Table cuts): the digit-group and numeric cuts alone."""
    enc = StageAwareEncoder(_superbpe(pattern).model)
    n1 = int(enc.model.stages[0]["merges"])
    no_cuts = TwoStageEncoder(enc.model.vocab, enc.model.merges[:n1], enc.model.special_tokens, enc.pattern,
                              enc.stage2, all_cross=True, split="units")
    assert no_cuts.encode(data).tolist() == enc.encode_python(data)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_kernel_digit_group_cuts_equal_numeric_cuts(data):
    """``Stage2Table.digit_group_cuts`` (the encoder's ``_digit_group_cuts``) equals
    ``words.numeric_cuts`` on any bytes cut into any tokens (lengths summing to the pretoken's or
    not), digits of every script, invalid UTF-8 and tokens that split a character."""
    from bpe_core.encode import _encode
    from bpe_core.engine.units import RankMerger
    pretoken = data.draw(st.one_of(digits, corpus_bytes))
    lengths = data.draw(st.lists(st.integers(1, 5), max_size=len(pretoken) + 2))
    m = RankMerger(np.array([0], np.uint32), np.array([0], np.uint32), np.array([1], np.uint32))
    table = _encode.Stage2Table(m, token_lengths=np.arange(8, dtype=np.uint32))
    assert table.digit_group_cuts(pretoken, lengths) == numeric_cuts(pretoken, lengths)


def test_digit_groups_cut_where_numeric_cuts_does():
    """Numbers whose stage-1 tokens run across a group of three: the native ids equal the plain
    path's, and the model has a stage-2 merge that would join across the group (so the cut matters)."""
    r = _superbpe("gpt2")
    enc = StageAwareEncoder(r.model)
    n1 = int(r.model.stages[0]["merges"])
    stage2 = {a + b for a, b in r.model.merges[n1:]}
    assert any(t.strip(b" ").isdigit() for t in stage2)
    assert numeric_cuts(b" 1234567", [1, 1, 3, 3]) == [1, 2, 3]
    for n in range(1, 14):
        for lead in (b"", b" ", b"a"):
            data = lead + b"1234567890123"[:n] + b" the"
            assert enc.encode(data) == enc.encode_python(data), data
    mixed = "١٢٣٤٥ ２０２４５ 12,345,678 ²³⁴ v1234 ½½½½".encode()
    assert enc.encode(mixed) == enc.encode_python(mixed)


def test_long_units_text_across_pretoken_windows():
    r = _superbpe("gpt2")
    enc = StageAwareEncoder(r.model)
    rng = np.random.default_rng(5)
    pieces = [p.encode() for p in PIECES[:-3]]
    data = b"".join(pieces[i] for i in rng.integers(0, len(pieces), 30000))
    assert enc.encode(data) == enc.encode_python(data)
    numbers = b" " + b"1234567890" * 3000 + b" the the" * 5000     # one numeric pretoken of 30,000 digits
    assert enc.encode(numbers) == enc.encode_python(numbers)


def test_supratok_tokenizer_uses_the_native_path():
    r = _supratok()
    with tempfile.TemporaryDirectory() as d:
        bpe_core.formats.model.dump_folder(r.model, d)
        tok = bpe_core.Tokenizer.load(d)
    enc = SupraTokEncoder(r.model)
    data = "the cat  sat 2024\u3000½ the 1234567\n\n the" + SPECIAL + " the cat 12"
    assert tok.encode(data) == enc.encode_python(data)
    assert tok.encode_ordinary(data) == enc.encode_ordinary(data.encode()).tolist()
    assert tok.encode_to_numpy(data).tolist() == enc.encode_python(data)
