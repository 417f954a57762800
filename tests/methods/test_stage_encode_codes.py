"""The stage-aware encoder's unit cuts between pretokens read from one table lookup a pretoken
(``_encode._BND_CODE`` over the ``Stage2Table.sides`` of the two ids that meet there, then the
bytes only where the ids cannot tell: ``_cut_units``, ``_resolve_cuts``), and its scratch reused
from call to call, equal the reference (``reference.encode_superbpe``) and the plain path
(``StageAwareEncoder.encode_python``, ``SupraTokEncoder.encode_python``): the code table against
the unit rule it stands for, every boundary left to the bytes (a table without token bytes), no
pair cut by the table (``all_cross``), every boundary pair crossable with a rank or none, one
encoder's scratch over a run of texts (single calls and one flat call), and a pretoken cache that
fills and clears in the middle of a text, for SuperBPE (``hf`` and ``units``) and SupraTok."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.encode import _encode
from bpe_core.encode.tokenizer import TwoStageEncoder
from bpe_core.engine.units import RankMerger

from test_stage_encode_passes import NAMES, PIECES as LONG_PIECES, _encoder
from test_stage_encode_sides import M2, MERGES, N1, PIECES, VOCAB

PT_NUMERIC, PT_STARTS_SPACE, PT_ENDS_SPACE = 1, 2, 4
L_UNSURE, R_UNSURE = 8, 8


def _joins(prev_flags: int, cur_flags: int, split: int) -> bool:
    """The unit rule, plainly: a unit goes on between two pretokens when neither holds a digit and,
    with the "hf" split (0), they do not meet inside a run of whitespace."""
    if (prev_flags | cur_flags) & PT_NUMERIC:
        return False
    return split == 1 or not (prev_flags & PT_ENDS_SPACE and cur_flags & PT_STARTS_SPACE)


@pytest.mark.parametrize("split", [0, 1])
def test_boundary_codes_are_the_unit_rule(split):
    """Every pair of sides bytes: bits 0-3 of the left one (its pretoken's last id) and bits 4-7 of
    the right one (its first id); the other half of each must not matter."""
    for left in range(16):
        for right in range(16):
            for noise in (0x00, 0xF0, 0x0F):
                code = _encode._boundary_code(split, left | (noise & 0xF0), (right << 4) | (noise & 0x0F))
                if left & L_UNSURE or right & R_UNSURE:
                    assert code == 3                # the bytes decide (and the pair is looked up)
                    continue
                want = int(_joins(left & 7, right & 7, split))
                if split == 1 and right & PT_NUMERIC:
                    want |= 2                       # digit groups
                assert code == want, (split, left, right)


def _table_encoders(**table_kw):
    """The sides-test model (pairs at every kind of boundary the ids can or cannot judge) with
    another stage-2 table: ``(split, TwoStageEncoder)``."""
    out = []
    for split in ("hf", "units"):
        enc = TwoStageEncoder(VOCAB, MERGES[:N1], [], "gpt2", M2, split=split)
        lengths = np.zeros(max(VOCAB) + 1, dtype=np.uint32)
        for i, b in VOCAB.items():
            lengths[i] = len(b)
        enc._stage2 = _encode.Stage2Table(M2, token_lengths=lengths, **table_kw)
        out.append((split, enc))
    return out


NO_BYTES = _table_encoders()                            # every boundary read from the text's bytes
ALL_CROSS = _table_encoders(all_cross=True, token_bytes=VOCAB)
DEFAULT = _table_encoders(token_bytes=VOCAB)
sides_texts = st.lists(st.sampled_from(PIECES), max_size=80).map(lambda ps: "".join(ps).encode())


@settings(max_examples=60, deadline=None)
@given(data=sides_texts)
def test_without_token_bytes_and_all_cross_equal_the_reference(data):
    for encoders in (NO_BYTES, ALL_CROSS, DEFAULT):
        for split, enc in encoders:
            want = reference.encode_superbpe(data, VOCAB, MERGES, N1, [], "gpt2", split=split)
            assert enc.encode(data).tolist() == want, (split, data)


def _crossing_model():
    """Stage 2 over pretokens ``" a"`` and ``" b"`` only: every pair of them is crossable with a
    rank (``" a a"``, ``" a b"``, ...), so a text of them is one long segment; ``"."`` never is."""
    vocab = {i: bytes([i]) for i in range(256)}
    merges = [(b" ", b"a"), (b" ", b"b")]
    stage2 = [(b" a", b" a"), (b" a", b" b"), (b" b", b" a"), (b" b", b" b"), (b" a a", b" b b"), (b" a b", b" a b")]
    for left, right in merges + stage2:
        vocab.setdefault(len(vocab), left + right)
    ids = {b: i for i, b in sorted(vocab.items(), reverse=True)}
    m2 = RankMerger(np.array([ids[a] for a, _ in stage2], np.uint32), np.array([ids[b] for _, b in stage2], np.uint32),
                    np.array([ids[a + b] for a, b in stage2], np.uint32))
    return vocab, merges + stage2, len(merges), m2


CV, CM, CN1, CM2 = _crossing_model()
CROSSING = {split: TwoStageEncoder(CV, CM[:CN1], [], "gpt2", CM2, split=split) for split in ("hf", "units")}


@settings(max_examples=40, deadline=None)
@given(words=st.lists(st.sampled_from([" a", " b", ".", " 1", "\n"]), max_size=3000),
       only_crossing=st.booleans())
def test_every_boundary_pair_crossable_or_none(words, only_crossing):
    """All pairs crossable with a rank (runs of ``" a"``/``" b"`` over several windows), or none."""
    if only_crossing:
        words = [w for w in words if w in (" a", " b")]
    data = "".join(words).encode()
    for split, enc in CROSSING.items():
        assert enc.encode(data).tolist() == reference.encode_superbpe(data, CV, CM, CN1, [], "gpt2", split=split)


def _native(enc):
    return enc.native if hasattr(enc, "native") else enc._enc.native


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_texts=st.integers(1, 12))
def test_one_scratch_over_a_run_of_texts(name, seed, n_texts):
    """One encoder and stage-2 scratch for texts of every length in a row (what was left in the
    scratch by a longer text must not leak into a shorter one), single calls and one flat call."""
    rng = np.random.default_rng(seed)
    enc = _encoder(name)
    native = _native(enc)
    texts = [b"".join(LONG_PIECES[i] for i in rng.integers(0, len(LONG_PIECES), int(rng.choice([0, 1, 3, 40, 1500]))))
             for _ in range(n_texts)]
    want = [enc.encode_python(t) for t in texts]
    assert [a.tolist() for a in native.encode_many(texts)] == want
    ids, offsets = native.encode_flat(texts)
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("max_entries", [1, 7])
def test_a_cache_that_clears_in_the_middle_of_a_text(name, max_entries):
    """A stage-1 encoder whose pretoken cache holds a few pretokens (cleared many times a text)
    gives the same ids as the default one."""
    enc = _encoder(name)
    native = _native(enc)
    rng = np.random.default_rng(max_entries)
    data = b"".join(LONG_PIECES[i] for i in rng.integers(0, len(LONG_PIECES), 3000))
    with native._borrowed() as (default, _):
        table = default.table
    small = _encode.Encoder(table, max_entries=max_entries)
    got = _encode.encode_stage_aware(small, native._stage2, _encode.Stage2Scratch(), data, native._tok._pattern_id,
                                     None, native._split)
    assert got.tolist() == enc.encode_python(data)
