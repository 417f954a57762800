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
