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
from paths import BENCHMARKS, REPO, TOOLS
from strategies import SPECIAL

from test_supratok import phrase_docs, small_options, train_bytes

sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(BENCHMARKS))
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


def test_no_heldout_documents_without_pass3():
    """Held-out documents serve only pass 3: with supratok_rounds=0 every document trains passes 1-2
    (they were left out of the counts before, for nothing)."""
    from test_supratok import _mixed_corpus

    data = _mixed_corpus()
    base = small_options(seed_min_count=20, seed_pmi=1.0, supratok_rounds=0)
    held = train_bytes(data, 380, transition=300, **dict(base, heldout_fraction=0.5))
    none = train_bytes(data, 380, transition=300, **dict(base, heldout_fraction=0.0))
    assert held.report["supratok"]["heldout_documents"] == 0
    assert held.merges == none.merges
    with_pass3 = train_bytes(data, 380, transition=300, **dict(base, heldout_fraction=0.5, supratok_rounds=1))
    assert with_pass3.report["supratok"]["heldout_documents"] > 0


def _documented_defaults() -> dict:
    """The ``| `field` | `value` | ...`` rows between the defaults markers of docs/supratok.md."""
    text = (REPO / "docs" / "supratok.md").read_text(encoding="utf-8")
    block = text.split("<!-- supratok-defaults -->")[1]
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", block, flags=re.M)
    assert rows, "no defaults table in docs/supratok.md"
    return {k: json.loads(v) for k, v in rows}


def test_documented_defaults_equal_config_and_cli():
    documented = _documented_defaults()
    config = {f.name: f.default for f in dataclasses.fields(bpe_core.TrainConfig)}
    for name, value in documented.items():
        assert config[name] == value or name == "transition", name
    from bpe_core.methods.superbpe import DEFAULT_TRANSITION

    assert documented["transition"] == DEFAULT_TRANSITION and config["transition"] is None
    sys.path.insert(0, str(TOOLS))
    import train_bpe

    args = train_bpe.build_parser().parse_args(["x.txt", "--vocab-size", "1000"])
    for name in ("pass2_cross", "supratok_rounds", "heldout_fraction", "seed_pmi", "seed_min_count", "max_words"):
        assert getattr(args, name) == documented[name], name
    # the grid's "best" row is the default
    best = {k: v for k, v in bench_supratok.ROWS["best"].items() if k != "method"}
    for name, value in best.items():
        assert documented[name] == value or (name == "heldout_fraction" and documented["supratok_rounds"] == 0), name


def test_default_is_deterministic_across_workers_chunks_and_budgets():
    """The defaults (pass 2 across every boundary, no pass 3): the same merges and stages for 1 or 2
    workers, any chunk size and any budget that needs no sampling; the encoder reproduces training."""
    from test_supratok import _mixed_corpus, n_specials
    from bpe_core.methods.supratok import SupraTokEncoder

    data = _mixed_corpus()
    one = train_bytes(data, 400, transition=300, num_workers=1)
    assert one.model.stages[1]["cross"] == "all" and one.model.stages[2]["merges"] == 0
    assert one.report["supratok"]["pass2_cross_merges"] > 0
    for opts in (dict(num_workers=2, chunk_bytes=512), dict(num_workers=2, chunk_bytes=97, memory_limit="2G")):
        other = train_bytes(data, 400, transition=300, **opts)
        assert other.merges == one.merges and other.model.stages == one.model.stages
    enc = SupraTokEncoder(one.model)
    ids = enc.encode(data)
    assert enc.decode(ids) == data
    assert len(ids) - n_specials(data) == one.report["supratok"]["final_tokens_corpus"]
