"""SupraTok: passes 1-2 equal the plain twin, the Appendix-A score against hand-computed values,
leaf surgery keeps the vocabulary size, the encoder reproduces training, determinism, round trip."""
from paths import CORPORA
import math
import os
import pathlib
import tempfile
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core.reference import supratok as reference_supratok
from bpe_core.corpus.specials import split_on_specials
from bpe_core.methods.superbpe import Stage2Rules
from bpe_core.methods.supratok import SupraTokEncoder
from bpe_core.methods.supratok.passes import (SeedRule, SpanFeatures, gain, hard_reject, leaf_utility, score_span,
                                              select_seeds, valid_surface)
from bpe_core.methods.supratok.script import ScriptGate, normalize_hamza, supercategory
from bpe_core.methods.supratok.stats import NgramStats, flatten_units

from strategies import SPECIAL

SPECIAL_B = SPECIAL.encode()

PHRASES = [" the cat sat on the mat", " of the", " in the house", " New York", " she said", " it was",
           " a lot of", " the end", "\n", " 12 cats", ".", " and then", " olive oil"]
phrase_docs = st.lists(st.lists(st.sampled_from(PHRASES), min_size=1, max_size=12).map("".join),
                       min_size=1, max_size=8).map(lambda ds: SPECIAL.join(ds).encode())


def small_options(**kw):
    opts = dict(seed_min_count=3, seed_pmi=0.5, span_min_count=2, span_pmi=1.0, heldout_fraction=0.3,
                num_workers=1)
    opts.update(kw)
    return opts


def train_bytes(data: bytes, vocab_size: int, **options):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.txt")
        with open(path, "wb") as f:
            f.write(data)
        return bpe_core.train(bpe_core.TrainConfig(path, vocab_size, method="supratok", **options))


def n_specials(data: bytes) -> int:
    return sum(1 for _, s in split_on_specials(data, [SPECIAL_B]) if s)


# ==== Appendix-A score ===========================================================================


def test_score_components_hand_computed():
    f = SpanFeatures(n=3, c_train=100, pmi=6.0, npmi=0.22, h_left=1.15, h_right=2.0, mean_idf=2.0,
                     adj_npmi=0.6, c_peak=0.4, l_tok=3, r_stop=0.0, all_stop=False, awl=7.0, clen=10,
                     c_holdout=4, df_holdout=2)
    sc = score_span(f)
    assert sc["H_B"] == 1.15 and sc["g_B"] == pytest.approx(0.5) and sc["g_N"] == pytest.approx(0.5)
    assert sc["b_spec"] == pytest.approx(1.14) and sc["b_con"] == pytest.approx(1.1)
    assert sc["p_stop"] == 1.0 and sc["b_len"] == pytest.approx(1.08) and sc["b_cont"] == pytest.approx(1.08)
    assert sc["p_surf"] == 1.0
    assert sc["G_hold"] == pytest.approx(2 * (4 + 0.6 * 2 + 0.18 * 10))          # = 14
    assert sc["S"] == pytest.approx(14 * 0.5 * 0.5 * 1.14 * 1.1 * 1.08 * 1.08)
    assert gain(f) == pytest.approx(4 * 2 + 0.35 * 2)
    assert leaf_utility(10, 4) == pytest.approx(11.4)
    assert hard_reject(f, sc) is None


def test_score_penalties_and_rejections():
    base = dict(n=2, c_train=50, pmi=6.0, npmi=0.5, h_left=3.0, h_right=3.0, mean_idf=1.0, adj_npmi=0.0,
                c_peak=0.9, l_tok=2, r_stop=0.5, all_stop=False, awl=4.0, clen=50, c_holdout=0, df_holdout=0)
    sc = score_span(SpanFeatures(**base))
    assert sc["p_stop"] == pytest.approx(max(0.30, 1 - 0.78 * 0.5 ** 1.35))
    assert sc["p_surf"] == 0.88
    # no held-out occurrence: S is scaled by 0.45
    g = 1 * (0.18 * math.sqrt(50))
    expect = g * sc["g_N"] * sc["g_B"] * sc["p_stop"] * 0.88 * 0.45
    assert sc["S"] == pytest.approx(expect)
    cases = {"c_train<3": dict(c_train=2), "PMI<4.4": dict(pmi=4.3), "g_B<0.18": dict(h_left=0.0),
             "r_stop>=0.75": dict(r_stop=0.75), "l_tok<=1": dict(l_tok=1, c_holdout=50, df_holdout=20),
             "surface": dict(valid_surface=False, c_holdout=50)}
    for reason, change in cases.items():
        f = SpanFeatures(**{**base, **change})
        assert hard_reject(f, score_span(f)) == reason
    assert hard_reject(SpanFeatures(**base), sc) == "S<=0.40"


def test_surface_and_scripts():
    assert valid_surface(" New York") and not valid_surface(" New\nYork") and not valid_surface(" 3 days")
    assert [supercategory(c) for c in "aé!5 \t"] == ["LM", "LM", "PS", "N", "Z", "C"]
    assert normalize_hamza("إسلام") == "اسلام"
    gate = ScriptGate({"東京": 80, "京都": 10}, 50)
    assert gate.allows("東".encode(), "京".encode()) and not gate.allows("京".encode(), "都".encode())
    assert gate.allows("京".encode()[:2], "京".encode()[2:] + "都".encode())   # inside a character: no junction


# ==== n-gram statistics against plain counting =======================================================


def test_ngram_stats_match_plain_counts():
    words = "a b c a b d a b c x a b c".split()
    ids = {w: i for i, w in enumerate(sorted(set(words)))}
    data = np.array([ids[w] for w in words], dtype=np.uint32)
    starts = np.array([0, 8, 13])                      # two units
    counts = np.array([2, 1])
    sid = np.arange(len(ids))
    seq, weights = flatten_units(data, starts, sid, counts)
    stats = NgramStats(seq, seq.copy(), weights, len(ids), 3, 1)
    units = [(words[0:8], 2), (words[8:13], 1)]
    plain = Counter()
    for u, c in units:
        for n in (1, 2, 3):
            for i in range(len(u) - n + 1):
                plain[tuple(u[i:i + n])] += c
    n_tot = {n: sum(c for k, c in plain.items() if len(k) == n) for n in (1, 2, 3)}
    for n in (2, 3):
        lv = stats.levels[n - 1]
        assert lv.total == n_tot[n]
        wm = stats.word_matrix(n)
        pmi = stats.pmi(n)
        inv = {i: w for w, i in ids.items()}
        got = {tuple(inv[x] for x in row): int(c) for row, c in zip(wm, lv.counts)}
        assert got == {k: c for k, c in plain.items() if len(k) == n}
        for row, p in zip(wm, pmi):
            k = tuple(inv[x] for x in row)
            expect = math.log2(plain[k] / n_tot[n]) - sum(math.log2(plain[(w,)] / n_tot[1]) for w in k)
            assert p == pytest.approx(expect)
    # contexts of "a b": left {edge: 2, c: 2, d: 2, x: 1}, right {c: 2 + 1, d: 2, edge: 2}
    j = stats.lookup(2, np.array([[ids["a"], ids["b"]]]))
    h_l, h_r, peak = stats.contexts(2, j)
    pl = np.array([2, 2, 2, 1]) / 7
    pr = np.array([3, 2, 2]) / 7
    assert h_l[0] == pytest.approx(-(pl * np.log2(pl)).sum()) and h_r[0] == pytest.approx(-(pr * np.log2(pr)).sum())
    assert peak[0] == pytest.approx(3 / 7)
    # held-out counts and document frequency
    hseq = np.array([ids["a"], ids["b"], -1, ids["a"], ids["b"], ids["c"], -1])
    hdocs = np.array([0, 0, 0, 1, 1, 1, 1])
    c, d = stats.heldout_counts(2, hseq, hdocs, j)
    assert c.tolist() == [2] and d.tolist() == [2]


def test_seed_overlap_control():
    words = ("x of the y " * 30 + "one of the z " * 20 + "new york q " * 25).split()
    vocab = sorted(set(words))
    ids = {w: i for i, w in enumerate(vocab)}
    data = np.array([ids[w] for w in words], dtype=np.uint32)
    seq, weights = flatten_units(data, np.array([0, data.size]), np.arange(len(vocab)), np.array([1]))
    stats = NgramStats(seq, seq.copy(), weights, len(vocab), 3, 2)
    seeds = select_seeds(stats, [w.encode() for w in vocab], 10, 0.0, 3)
    phrases = [" ".join(vocab[w] for w in s) for s in seeds]
    # one member of the "of the" family, and "new york" is still covered
    assert sum("of the" in p for p in phrases) == 1
    assert any("new york" in p for p in phrases)


def test_seed_rule():
    rule = SeedRule([b" of the", b" New York"], "gpt2", Stage2Rules(), None, False)
    assert rule.allows(b" of", b" the") and rule.allows(b" New", b" Y")
    assert not rule.allows(b" in", b" the")
    assert rule.allows(b" th", b"ing")                  # inside one pretoken: BPE continues


# ==== training ==================================================================================


@settings(max_examples=max(5, settings().max_examples // 6))
@given(phrase_docs, st.integers(0, 15), st.integers(0, 30))
def test_passes_1_2_equal_plain_reference(data, n1, n2):
    data = data * 3
    transition = 257 + n1
    opts = small_options(heldout_fraction=0.0, supratok_rounds=0, script_aware=False)
    fast = train_bytes(data, transition + n2, transition=transition, **opts)
    seeds = [bytes.fromhex(h) for h in fast.model.stages[1]["seeds_hex"]]
    rule = SeedRule(seeds, "gpt2", Stage2Rules(), None, False, fast.model.stages[1]["cross"])
    merges, k1 = reference_supratok.train_passes_1_2(data, transition + n2, transition - 257, [SPECIAL], "gpt2",
                                                     rule.allows)
    assert fast.merges == merges
    assert fast.model.stages[0]["merges"] == k1


@settings(max_examples=max(5, settings().max_examples // 6))
@given(phrase_docs, st.sampled_from([1, 2]), st.sampled_from([{}, {"pass2_cross": "seeds", "supratok_rounds": 2}]))
def test_encoder_reproduces_training_and_vocab_size(data, workers, passes):
    data = data * 4          # passes: the defaults, or the paper's passes 2 and 3
    result = train_bytes(data, 330, transition=290, **small_options(num_workers=workers, chunk_bytes=64, **passes))
    info = result.report["supratok"]
    assert len(result.vocab) == 256 + 1 + len(result.merges)
    assert sum(s["merges"] for s in result.model.stages) == len(result.merges)
    enc = SupraTokEncoder(result.model)
    ids = enc.encode(data)
    assert enc.decode(ids) == data
    assert len(ids) - n_specials(data) == info["final_tokens_corpus"]
    for r in info["pass3_rounds"]:
        assert all(e["net"] > 0 for e in r["examples"])


def _mixed_corpus(n_docs=60):
    doc_parts = ["Mary lives in New York and works in New York City every day",
                 "the United States of America is a country", "we ate olive oil and bread",
                 "he said that it was a lot of fun", "in the house of the rising sun"]
    docs = []
    for i in range(n_docs):
        docs.append(" ".join(doc_parts[(i + k) % len(doc_parts)] for k in range(4)) + f" {i}.")
    return SPECIAL.join(docs).encode()


def test_leaf_surgery_keeps_vocab_size_and_determinism():
    data = _mixed_corpus()
    opts = small_options(seed_min_count=20, seed_pmi=1.0, span_pmi=0.5, span_min_count=5, heldout_fraction=0.25,
                         pass2_cross="seeds", supratok_rounds=2)       # the paper's passes 2 and 3
    one = train_bytes(data, 380, transition=300, **opts)
    info = one.report["supratok"]
    assert len(one.vocab) == 380             # pass 2 filled the vocabulary; pass 3 swapped leaves for spans
    assert info["pass3_spans"] > 0 and info["pass3_removed_leaves"] > 0
    for r in info["pass3_rounds"]:
        assert all(e["net"] > 0 for e in r["examples"])
    two = train_bytes(data, 380, transition=300, **{**opts, "num_workers": 2, "chunk_bytes": 512})
    assert one.merges == two.merges and one.model.stages == two.model.stages
    enc = SupraTokEncoder(one.model)
    ids = enc.encode(data)
    assert enc.decode(ids) == data and len(ids) - n_specials(data) == info["final_tokens_corpus"]


def test_round_trip_multilingual(corpora_dir):
    files = sorted((corpora_dir / "multi").glob("*.txt"))
    docs = []
    for f in files:
        lines = f.read_bytes().splitlines(keepends=True)[:120]
        docs += [b"".join(lines[i:i + 20]) for i in range(0, len(lines), 20)]
    data = SPECIAL_B.join(docs)
    result = train_bytes(data, 1200, **small_options(seed_min_count=10, span_min_count=3))
    enc = SupraTokEncoder(result.model)
    ids = enc.encode(data)
    assert len(ids) - n_specials(data) == result.report["supratok"]["final_tokens_corpus"]
    for f in files:
        sample = f.read_bytes()[:20000]
        assert enc.decode(enc.encode(sample)) == sample, f.name


# ==== Documents from the counting pass's record ===================================================

MIXED = PHRASES + [" ve bir ev için", " bu çok daha güzel", " evlerimizde", " kitaplarımızdan", " ja että oli",
                   " myös mutta talossamme", " kirjoissamme", " 0123456789", " M'XX%,#'A=9&4@#0A=9&4@#0A",
                   "*!A9&4@&3!4=9&4@#0A=9&4@#0A", "\n\n", "  "]
mixed_docs = st.lists(st.lists(st.sampled_from(MIXED), min_size=1, max_size=14).map("".join),
                      min_size=1, max_size=10).map(lambda ds: SPECIAL.join(ds).encode())


def _recorded_vs_scanned(path, **options):
    """Train SupraTok twice: its documents from the counting pass's record, and from a second scan
    (the method told it cannot use a record); returns both results."""
    from bpe_core.formats import registry
    cls = type(registry.get("supratok"))
    out = {}
    try:
        for records in (True, False):
            cls.records_pretokens = records
            out[records] = bpe_core.train(bpe_core.TrainConfig(str(path), method="supratok", **options))
    finally:
        cls.records_pretokens = True
    return out[True], out[False]


def _same_training(rec, scan):
    assert rec.report["supratok"].pop("documents_source") == "record"
    assert scan.report["supratok"].pop("documents_source") == "scan"
    assert rec.model.merges == scan.model.merges
    assert rec.report["supratok"] == scan.report["supratok"]


@settings(max_examples=12, deadline=None)
@given(mixed_docs, st.sampled_from([64, 150, 4096]), st.sampled_from([1, 2]), st.booleans(),
       st.sampled_from([1.0, 0.5]))
def test_documents_from_the_record_equal_a_second_scan(tmp_path_factory, data, chunk, workers, keep_encoded,
                                                       fraction):
    """SupraTok's documents from the counting pass's record train what the second scan trains: the
    same merges and the same report (units seen and kept, encoded units, documents, language
    suffixes, token counts), with chunks that cut documents, on one and two workers, sampled or not."""
    import _pytest.monkeypatch
    path = tmp_path_factory.mktemp("strec") / "c.txt"
    path.write_bytes(data * 3)
    mp = _pytest.monkeypatch.MonkeyPatch()
    try:
        if fraction < 1:    # a sample, as a tight budget would make (the same one on both routes: the
            # planned fraction follows the process's measured size)
            from bpe_core.methods.supratok import passes
            scan_docs, record_docs = passes.count_documents, passes.documents_from_records
            mp.setattr(passes, "count_documents", lambda *a, **k: scan_docs(*a[:7], fraction, *a[8:], **k))
            mp.setattr(passes, "documents_from_records", lambda *a, **k: record_docs(*a[:4], fraction, *a[5:], **k))
        rec, scan = _recorded_vs_scanned(path, vocab_size=300, special_tokens=[SPECIAL], chunk_bytes=chunk,
                                         num_workers=workers, stage2_skip_encoded=not keep_encoded)
    finally:
        mp.undo()
    _same_training(rec, scan)


def test_documents_from_the_record_on_the_fixture(tmp_path):
    """On real text with Turkish and Finnish documents (the language guess and its suffix gate), at
    several chunk sizes and both worker counts: the record route trains the scan's merges and report."""
    en = (pathlib.Path(__file__).parents[1] / "fixtures" / "corpus.en").read_bytes()[:60000]
    tr = " Bu kitap için çok daha güzel bir ev ve bir bahçe ile geldi, evlerimizde kitaplarımızdan".encode()
    fi = " Talo oli iso ja että myös mutta se joka oli kirjoissamme talossamme".encode()
    docs = en.split(b"\n\n") + [tr * 3] * 40 + [fi * 3] * 40
    path = tmp_path / "c.txt"
    path.write_bytes(SPECIAL_B.join(docs))
    first = None
    for chunk, workers in ((5000, 1), (20000, 2), (1 << 20, 2)):
        rec, scan = _recorded_vs_scanned(path, vocab_size=700, special_tokens=[SPECIAL], chunk_bytes=chunk,
                                         num_workers=workers)
        assert rec.report["supratok"]["suffixes"] > 0
        _same_training(rec, scan)
        first = first or rec.model.merges
        assert rec.model.merges == first


def test_held_out_documents_are_scanned(tmp_path):
    """Pass 3 needs held-out documents and their frequencies: the counting pass keeps no record for
    it, and the documents are scanned; the default (no pass 3) keeps one and uses it."""
    path = tmp_path / "c.txt"
    path.write_bytes(SPECIAL_B.join(p.encode() * 4 for p in PHRASES) * 10)
    base = dict(vocab_size=300, special_tokens=[SPECIAL])
    plain = bpe_core.train(bpe_core.TrainConfig(str(path), method="supratok", **base))
    assert plain.report["supratok"]["documents_source"] == "record"
    rounds = bpe_core.train(bpe_core.TrainConfig(str(path), method="supratok", supratok_rounds=1,
                                                 **small_options(**base)))
    assert rounds.report["supratok"]["documents_source"] == "scan"


@pytest.mark.parametrize("workers", [1, 2])
def test_pass2_units_in_chunks_train_as_in_one(tmp_path, monkeypatch, workers):
    """Pass 2's listed units expanded in chunks (``PASS2_CHUNK_IDS``: many parts, each let go once
    stage 2's cut has read it) train the merges and report of the units in one part, a restart
    (listed again, in chunks) included."""
    from bpe_core.methods import superbpe
    from bpe_core.methods.supratok import passes
    path = tmp_path / "c.txt"
    path.write_bytes(b" the cat sat, 12 dogs.\n\n M'XX%,#'A=9&4@#0A=9&4@#0A=9&4@#0A=9&4@#0A\n"
                     b"<|endoftext|> the dog sat on 3 mats, ve bir ev" * 60)
    options = dict(input_path=str(path), vocab_size=360, method="supratok", special_tokens=["<|endoftext|>"],
                   chunk_bytes=1000, num_workers=workers)
    monkeypatch.setattr(passes, "PASS2_CHUNK_IDS", 1 << 40)
    whole = bpe_core.train(bpe_core.TrainConfig(**options))
    for ids in (1, 2, 37):          # (1: a chunk per unit)
        monkeypatch.setattr(passes, "PASS2_CHUNK_IDS", ids)
        chunked = bpe_core.train(bpe_core.TrainConfig(**options))
        assert chunked.model.merges == whole.model.merges
        assert chunked.report["supratok"] == whole.report["supratok"]
    monkeypatch.setattr(superbpe.stage2, "first_cut", lambda *a, **k: 10 ** 6)
    again = bpe_core.train(bpe_core.TrainConfig(**options))
    assert again.report["supratok"]["pass2_cut"]["restarts"] >= 1
    for run in (chunked, again):
        assert run.model.merges == whole.model.merges
    assert chunked.report["supratok"] == whole.report["supratok"]
    for info in (whole.report["supratok"], again.report["supratok"]):
        info.pop("pass2_cut")
    assert again.report["supratok"] == whole.report["supratok"]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_pass2_restart_lists_the_documents_again_by_a_scan(tmp_path, monkeypatch, workers):
    """Without pass 3 the word-id units are let go before pass 2's engine; a first cut too high makes
    pass 2 start again, and the units are then listed by a scan of the file: the merges and the
    report (final token count included) are those of a run that did not restart."""
    from bpe_core.methods import superbpe
    path = tmp_path / "c.txt"
    path.write_bytes(b" the cat sat, 12 dogs.\n\n M'XX%,#'A=9&4@#0A=9&4@#0A=9&4@#0A=9&4@#0A\n"
                     b"<|endoftext|> the dog sat on 3 mats, ve bir ev" * 60)
    options = dict(input_path=str(path), vocab_size=360, method="supratok", special_tokens=["<|endoftext|>"],
                   chunk_bytes=1000, num_workers=workers)
    plain = bpe_core.train(bpe_core.TrainConfig(**options))
    monkeypatch.setattr(superbpe.stage2, "first_cut", lambda *a, **k: 10 ** 6)
    again = bpe_core.train(bpe_core.TrainConfig(**options))
    assert plain.report["supratok"]["pass2_cut"]["restarts"] == 0
    assert again.report["supratok"]["pass2_cut"]["restarts"] >= 1
    assert again.report["supratok"]["documents_source"] == "record"        # the first listing
    assert again.model.merges == plain.model.merges
    for info in (plain.report["supratok"], again.report["supratok"]):
        info.pop("pass2_cut")
    assert again.report["supratok"] == plain.report["supratok"]
    assert plain.report["supratok"]["encoded_units"] > 0
