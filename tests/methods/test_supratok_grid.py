"""SupraTok's pass-2 boundary rule (``pass2_cross``), the defaults the grid chose (docs/supratok.md
states them; the config and the CLI must agree) and the grid tool's bookkeeping."""
import dataclasses
import json
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core.methods.superbpe import Stage2Rules
from bpe_core.methods.supratok.passes import SeedRule
from bpe_core.reference import supratok as reference_supratok
from paths import REPO, TOOLS
from strategies import SPECIAL

from test_supratok import phrase_docs, small_options, train_bytes

sys.path.insert(0, str(TOOLS))
import bench_supratok  # noqa: E402


def test_pass2_cross_rules():
    seeds = [b" of the"]
    rule = {c: SeedRule(seeds, "gpt2", Stage2Rules(), None, False, c) for c in ("seeds", "words", "all", "none")}
    for c, r in rule.items():
        assert r.allows(b" th", b"ing"), c                 # inside one pretoken: always
    assert [rule[c].allows(b" of", b" the") for c in ("seeds", "words", "all", "none")] == [True, True, True, False]
    assert [rule[c].allows(b" in", b" the") for c in ("seeds", "words", "all", "none")] == [False, True, True, False]
    assert [rule[c].allows(b" end", b".") for c in ("seeds", "words", "all", "none")] == [False, False, True, False]
    for c, r in rule.items():                              # the stage-2 rules bind every value
        assert not r.allows(b" a b c d", b" e"), c
        assert not r.allows(b"a:", b" b"), c
    with pytest.raises(ValueError, match="pass2_cross"):
        SeedRule(seeds, "gpt2", Stage2Rules(), None, False, "any")


def test_pass2_cross_config_checked(tmp_path):
    with pytest.raises(ValueError, match="pass2_cross"):
        bpe_core.TrainConfig(tmp_path / "c.txt", 300, method="supratok", pass2_cross="any")


@settings(max_examples=max(4, settings().max_examples // 10), deadline=None)
@given(phrase_docs, st.integers(0, 15), st.integers(0, 30), st.sampled_from(["words", "all", "none"]))
def test_passes_1_2_equal_plain_reference_each_rule(data, n1, n2, cross):
    data = data * 3
    transition = 257 + n1
    opts = small_options(heldout_fraction=0.0, supratok_rounds=0, script_aware=False, pass2_cross=cross)
    fast = train_bytes(data, transition + n2, transition=transition, **opts)
    assert fast.model.stages[1]["cross"] == cross
    rule = SeedRule([], "gpt2", Stage2Rules(), None, False, cross)
    merges, k1 = reference_supratok.train_passes_1_2(data, transition + n2, transition - 257, [SPECIAL], "gpt2",
                                                     rule.allows)
    assert fast.merges == merges
    assert fast.model.stages[0]["merges"] == k1
