"""The unit cut between two pretokens read from the stage-1 ids that meet there
(``_encode._id_sides``, ``Stage2Table.sides``) equals the cut read from the pretokens' bytes, also
where an id cannot tell: a pretoken that ends in a non-ASCII space or digit (its last id is a
continuation byte), one that starts with a lone space before a digit (`` 5`` as ``[" ", "5"]``, or
before a non-ASCII digit), or with a non-ASCII byte. Each stage-2 merge below makes the pair at
such a boundary crossable, so a wrong verdict from the ids would merge across a unit's end (or
cut a unit) and change the ids. Checked against ``reference.encode_superbpe`` for both splits."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.encode import _encode
from bpe_core.encode.tokenizer import TwoStageEncoder
from bpe_core.engine.units import RankMerger

STAGE1 = [(b" ", b"a")]                 # " a" is one stage-1 id (a first id that can tell)
# pairs that meet at the boundaries the ids cannot judge, and ones that they can
STAGE2 = [(b"a", b" "),          # "a" | " 5": C starts with a lone space, then a digit (numeric: a cut)
          (b"\x80", b" a"),      # "\u3000" | " a": P ends with a non-ASCII space (hf: a cut)
          (b"\x80", b" "),       # "\u3000" | " b": the same, C's first id a lone space
          (b"\xa3", b"a"),       # "\u0663" | "a": P ends with a non-ASCII digit (a cut)
          (b"a", b"\xd9"),       # "a" | "\u0663": C starts with a non-ASCII byte (a digit: a cut)
          (b"a", b"\xe3"),       # "a" | "\u3000": C starts with a non-ASCII space (hf: no cut: P does not end in one)
          (b"\xa9", b" "),       # "\u00e9" | " b": P ends with a non-ASCII letter (no cut)
          (b" ", b"b"),          # inside " b" (no pretoken boundary)
          (b"a", b" b"),         # "a" | " b": both sides ASCII, joined
          (b"\n", b" "),         # "\n" | " b": P ends in whitespace, C starts with it (hf: a cut)
          (b"1", b"a")]          # "1" | "a": P numeric (a cut)
PIECES = ["a", " 5", " b", "\u3000", " a", "\u0663", " \u0663", "\u00e9", "\n", "1", " ", "b", "5", "  "]


def _model():
    vocab = {i: bytes([i]) for i in range(256)}
    merges = STAGE1 + STAGE2
    for left, right in merges:
        vocab[len(vocab)] = left + right
    ids = {b: i for i, b in sorted(vocab.items(), reverse=True)}      # the smallest id of the bytes
    n1 = len(STAGE1)
    m2 = RankMerger(np.array([ids[a] for a, _ in STAGE2], np.uint32), np.array([ids[b] for _, b in STAGE2], np.uint32),
                    np.array([ids[a + b] for a, b in STAGE2], np.uint32))
    return vocab, merges, n1, m2


VOCAB, MERGES, N1, M2 = _model()
VOCAB_ID = {b: i for i, b in sorted(VOCAB.items(), reverse=True)}
ENCODERS = {split: TwoStageEncoder(VOCAB, MERGES[:N1], [], "gpt2", M2, split=split) for split in ("hf", "units")}


def _check(data: bytes):
    for split, enc in ENCODERS.items():
        want = reference.encode_superbpe(data, VOCAB, MERGES, N1, [], "gpt2", split=split)
        assert enc.encode(data).tolist() == want, (split, data)


def test_id_sides_flags():
    sides = _encode._id_sides({0: b" 1", 1: b" ", 2: b"ab ", 3: "\u00e9".encode(), 4: b"7", 5: b"\n\xd9"})
    assert [(int(v) & 15, int(v) >> 4) for v in sides] == [(1, 3), (4, 8), (4, 0), (8, 8), (1, 1), (8, 8)]


@pytest.mark.parametrize("text", ["a 5", "a b", "a\u3000 a", "\u3000 a", "\u0663a", "a\u0663", "a \u0663", "a\u3000",
                                  "\u00e9 b", "\n b", "1a", "a 5 b a b\u3000 a\u0663a 1a \u00e9 b",
                                  "a  5", "a \n b", "a b 55 a"])
def test_boundaries_the_ids_cannot_judge(text):
    _check(text.encode())


def test_the_cuts_are_there():
    """The merges would apply without the unit cuts (all_cross joins every pair of a unit)."""
    hf = ENCODERS["hf"]
    assert hf.encode(b"a b").tolist() == [VOCAB_ID[b"a "], ord("b")]    # joined across pretokens
    assert hf.encode(b"a 5").tolist() == [ord("a"), ord(" "), ord("5")]  # cut: " 5" is numeric
    assert hf.encode(b"\n b").tolist() == [ord("\n"), VOCAB_ID[b" b"]]  # cut: whitespace meets whitespace


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40))
def test_random_runs_of_hard_boundaries(pieces):
    _check("".join(pieces).encode())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=3000))
def test_long_runs_across_windows(pieces):
    """Runs longer than a window of pretokens (its last pretoken's flags carried to the next)."""
    _check("".join(pieces).encode())


@pytest.mark.parametrize("ids_lie, text", [({32: b" x"}, "a 5"),              # a lone space taken as telling
                                           ({0x80: b"x"}, "\u3000 a"),         # a non-ASCII space's end as a letter's
                                           ({0xA3: b"x"}, "\u0663a"),          # a non-ASCII digit's end as a letter's
                                           ({0xD9: b"x"}, "a\u0663")])         # a non-ASCII digit's start as a letter's
def test_a_wrong_verdict_from_the_ids_is_caught(ids_lie, text):
    """The cases above can fail: told wrong bytes for one id (so its verdict is taken as sure and
    wrong), the encoder gives other ids than the reference on that text."""
    enc = TwoStageEncoder(VOCAB, MERGES[:N1], [], "gpt2", M2)
    enc._stage2 = _encode.Stage2Table(M2, token_bytes={**VOCAB, **ids_lie})
    data = text.encode()
    assert enc.encode(data).tolist() != reference.encode_superbpe(data, VOCAB, MERGES, N1, [], "gpt2")
