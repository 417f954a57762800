"""Pass 2 (PMI seeds), pass 3 (the Appendix-A span score and leaf surgery) and the training driver."""
from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
import numpy as np
from typing import Any, Callable, Optional, Sequence


from ...corpus.specials import encode_specials
from ...engine.merge import MergeEngine
from ...engine.units import expand_units, strip_marks
from ...errors import InternalError
from ...formats.model import Model
from ...pretok.patterns import resolve_pattern
from ...pretok.pretokenize import pretoken_ends
from ...pretok.wordtable import WordTable
from ...runtime.memmon import phase
from ...runtime.progress import progress_bar
from ...runtime.workers import big_blocks_mapped, release_free_memory
from ..superbpe import (NUMERIC, STAGE2_BYTES_PER_SYMBOL, Stage2Rules, StageAwareEncoder, numeric_cuts,
                        resolve_transition, stage2_table, word_flags)
from ..superbpe import word_classes as byte_classes
from ..superbpe.stage2 import OVERHEAD_STEP, sample_fraction, stage2_merges
from .documents import can_use_record, count_documents, documents_from_records
from .script import (STOPWORDS_EN, ScriptGate, TAU_BE, normalize_hamza, script_gate_from_table, sigmoid, supercategory)
from .stats import NgramStats, flatten_units, word_classes


# ==== Pass 2: seeds ============================================================================


def select_seeds(stats: NgramStats, surfaces: list[bytes], min_count: int, min_pmi: float, max_n: int = 6,
                 max_seeds: Optional[int] = None) -> list[tuple[int, ...]]:
    """PMI seeds: n-grams (2 <= n <= max_n) with count >= min_count and PMI >= min_pmi, ranked by
    count x PMI, with overlap control: a candidate sharing a run of max(2, n-1) or more consecutive
    words with an already chosen seed is a variant of it and is skipped."""
    cands = []
    for n in range(2, min(max_n, len(stats.levels)) + 1):
        lv = stats.levels[n - 1]
        if lv.counts.size == 0:
            continue
        pmi = stats.pmi(n)
        sel = np.flatnonzero((lv.counts >= min_count) & (pmi >= min_pmi))
        wm = stats.word_matrix(n)
        for j in sel:
            cands.append((-float(lv.counts[j] * pmi[j]), tuple(int(x) for x in wm[j])))
    cands.sort(key=lambda c: (c[0], [surfaces[w] for w in c[1]]))
    covered: set[tuple[int, ...]] = set()
    seeds: list[tuple[int, ...]] = []
    for _, words in cands:
        n = len(words)
        k = max(2, n - 1)
        if any(words[i:i + m] in covered for m in range(k, n + 1) for i in range(n - m + 1)):
            continue
        seeds.append(words)
        for m in range(2, n + 1):
            for i in range(n - m + 1):
                covered.add(words[i:i + m])
        if max_seeds is not None and len(seeds) >= max_seeds:
            break
    return seeds


PASS2_CROSS = ("seeds", "words", "all", "none")


class SeedRule:
    """Pass-2 eligibility: a merge inside one pretoken, or a cross-pretoken merge that passes the
    stage-2 rules and ``cross``: ``"seeds"`` (the paper: its bytes lie inside a seed phrase, after
    hamza normalization), ``"words"`` (its bytes are letters, marks, single spaces and apostrophes:
    only word-word boundaries are crossed), ``"all"`` (any boundary, as SuperBPE's stage 2) or
    ``"none"`` (no cross-pretoken merge: pass 2 is plain BPE); never one the script gate forbids."""

    def __init__(self, seed_surfaces: Sequence[bytes], pattern: str, rules: Stage2Rules,
                 gate: Optional[ScriptGate], normalize: bool, cross: str = "seeds"):
        if cross not in PASS2_CROSS:
            raise ValueError(f"unknown pass2_cross {cross!r} ({', '.join(PASS2_CROSS)})")
        self.text = b"\x00".join(_norm_bytes(s, normalize) for s in seed_surfaces)
        self.pattern = pattern
        self.rules = rules
        self.gate = gate if gate is not None and gate.active else None
        self.normalize = normalize
        self.cross = cross
        self._crosses: dict[bytes, bool] = {}

    def crosses(self, merged: bytes) -> bool:
        """Whether ``merged`` spans more than one pretoken (remembered: the report counts the
        cross-pretoken merges of pass 2 again, each of which ``allows`` was asked about).

        >>> rule = SeedRule([], "gpt2", Stage2Rules(), None, False, "all")
        >>> rule.crosses(b" of the"), rule.crosses(b" the")
        (True, False)
        """
        known = self._crosses.get(merged)
        if known is None:
            known = self._crosses[merged] = bool(pretoken_ends(merged, self.pattern).size > 1)
        return known

    def allows(self, left: bytes, right: bytes) -> bool:
        if self.gate is not None and not self.gate.allows(left, right):
            return False
        merged = left + right
        if not self.crosses(merged):
            return True
        if self.cross == "none" or not self.rules.allows(left, right):
            return False
        if self.cross == "all":
            return True
        if self.cross == "words":
            return valid_surface(merged.decode("utf-8", "surrogateescape"))
        return _norm_bytes(merged, self.normalize) in self.text


def _norm_bytes(b: bytes, normalize: bool) -> bytes:
    if not normalize:
        return b
    return normalize_hamza(b.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


# ==== Pass 3: Appendix-A score ===================================================================


@dataclass
class SpanFeatures:
    """What Appendix A needs about one candidate span s = (w_1..w_n)."""

    n: int
    c_train: int
    pmi: float
    npmi: float
    h_left: float
    h_right: float
    mean_idf: float
    adj_npmi: float
    c_peak: float
    l_tok: int
    r_stop: float
    all_stop: bool
    awl: float
    clen: int
    c_holdout: int
    df_holdout: int
    valid_surface: bool = True


def score_span(f: SpanFeatures) -> dict[str, float]:
    """The Appendix-A composite score S(s) and its factors (equations 6-12)."""
    h_b = min(f.h_left, f.h_right)
    g_b = sigmoid(1.75, h_b - TAU_BE)
    g_n = sigmoid(6.0, f.npmi - 0.22)
    b_spec = 1 + 0.14 * max(0.0, f.mean_idf - 1)
    b_con = 1 + 0.50 * max(0.0, f.adj_npmi - f.c_peak)
    p_stop = max(0.30, 1 - 0.78 * f.r_stop ** 1.35)
    b_len = 1 + 0.08 * max(0, f.n - 2)
    b_cont = 1 + 0.04 * max(0.0, f.awl - 5)
    p_surf = 0.88 if f.clen > 42 else 1.0
    g_tok = f.l_tok - 1
    g_hold = g_tok * (f.c_holdout + 0.60 * f.df_holdout + 0.18 * math.sqrt(f.c_train))
    s = g_hold * g_n * g_b * b_spec * b_con * p_stop * b_len * b_cont * p_surf
    if f.c_holdout == 0:
        s *= 0.45
    return {"H_B": h_b, "g_B": g_b, "g_N": g_n, "b_spec": b_spec, "b_con": b_con, "p_stop": p_stop,
            "b_len": b_len, "b_cont": b_cont, "p_surf": p_surf, "G_hold": g_hold, "S": s}


def hard_reject(f: SpanFeatures, sc: dict[str, float]) -> Optional[str]:
    """The Appendix-A rejection rule that fires first, or None."""
    if f.c_train < 3:
        return "c_train<3"
    if f.pmi < 4.4:
        return "PMI<4.4"
    if sc["g_B"] < 0.18:
        return "g_B<0.18"
    if f.r_stop >= 0.75:
        return "r_stop>=0.75"
    if f.all_stop:
        return "all stopwords"
    if not f.valid_surface:
        return "surface"
    if f.l_tok <= 1:
        return "l_tok<=1"
    if sc["S"] <= 0.40:
        return "S<=0.40"
    return None


def gain(f: SpanFeatures) -> float:
    """A(s) = c_holdout * max(1, l_tok - 1) + 0.35 df_holdout (equation 13)."""
    return f.c_holdout * max(1, f.l_tok - 1) + 0.35 * f.df_holdout


def leaf_utility(f_eval: int, df_eval: int) -> float:
    """U(m) = f_eval(m) + 0.35 df_eval(m) (equation 13)."""
    return f_eval + 0.35 * df_eval


def valid_surface(text: str) -> bool:
    """No digits, tabs, newlines, double spaces, control characters; only letters, marks, single
    spaces and apostrophes.

    >>> valid_surface(" of the"), valid_surface(" of  the"), valid_surface(" 3 times"), valid_surface("a\\tb")
    (True, False, False, False)
    """
    if "  " in text or not text.strip():
        return False
    for ch in text:
        sc = supercategory(ch)
        if sc == "LM" or ch == " " or ch == "'":
            continue
        return False
    return True


# ==== Training =================================================================================


def listed_units_table(part: tuple, table: WordTable, seg_symbols: np.ndarray, seg_offsets: np.ndarray,
                       numeric: np.ndarray, token_lengths: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Listed word-id units (``documents``' ``listed=True``: ``(data, starts, encoded)``, every unit as
    often as it occurs) as pass 2's units of pass-1 tokens: ``(symbols, offsets, counts, encoded)``,
    what ``superbpe.stage2_table`` makes of the same units counted (each unit's words written as
    their pass-1 tokens, uint16 when every token id fits; a unit of one numeric word cut into its
    digit groups by ``numeric_cuts``, each group a unit with the word's flag), in text order, each
    with count 1. Pass 2 (``stage2_merges``) deduplicates the pieces it cuts, so equal units need not
    be counted first. A numeric word's cuts are found once per distinct word.

    >>> t = WordTable.from_counts({b" a": 1, b" 1234": 1})
    >>> words = [t.arena[t.offsets[i]:t.offsets[i + 1]].tobytes() for i in range(t.n_words)]
    >>> a, n = words.index(b" a"), words.index(b" 1234")       # each byte a pass-1 token:
    >>> seg = np.frombuffer(t.arena.tobytes(), np.uint8).astype(np.uint32), np.asarray(t.offsets)
    >>> part = (np.array([a, n, a, a], np.uint32), np.array([0, 1, 2, 4]), np.array([False, True, False]))
    >>> s, o, c, e = listed_units_table(part, t, *seg, np.arange(2) == n, np.ones(256, np.int64))
    >>> bytes(s.tolist()), o.tolist(), c.tolist(), e.tolist()       # ' ' | '1' | '234'
    (b' a 1234 a a', [0, 2, 3, 4, 7, 11], [1, 1, 1, 1, 1], [False, True, True, True, False])
    """
    data, starts, encoded = part
    data = np.ascontiguousarray(data, dtype=np.uint32)
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    seg_symbols = np.ascontiguousarray(seg_symbols, dtype=np.uint32)
    seg_offsets = np.ascontiguousarray(seg_offsets, dtype=np.int64)
    narrow = seg_symbols.size == 0 or int(seg_symbols.max()) <= 0xFFFF
    symbols, offsets = expand_units(data, starts, seg_symbols, seg_offsets, narrow=narrow)
    encoded = np.asarray(encoded, dtype=bool)
    n_units = starts.size - 1
    single = np.flatnonzero(np.diff(starts) == 1)
    if single.size:
        single = single[np.asarray(numeric, dtype=bool)[data[starts[single]]]]
    if not single.size:
        return symbols, offsets, np.ones(n_units, dtype=np.int64), encoded
    # the digit groups of each distinct numeric word (from its bytes and its tokens' lengths), once
    words, which = np.unique(data[starts[single]], return_inverse=True)
    which = which.reshape(-1)
    arena = table.arena.tobytes()
    w_lo = np.asarray(table.offsets, dtype=np.int64)
    cuts_of = [numeric_cuts(arena[w_lo[w]:w_lo[w + 1]],
                            token_lengths[seg_symbols[seg_offsets[w]:seg_offsets[w + 1]]].tolist())
               for w in words.tolist()]
    n_cuts = np.array([len(c) for c in cuts_of], dtype=np.int64)
    if not n_cuts.any():
        return symbols, offsets, np.ones(n_units, dtype=np.int64), encoded
    flat = np.array([x for c in cuts_of for x in c], dtype=np.int64)
    first = np.concatenate(([0], np.cumsum(n_cuts)))
    # every occurrence's cuts: where its unit starts plus its word's cut positions
    per = n_cuts[which]
    occ = np.repeat(np.arange(single.size), per)
    nth = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
    extra = offsets[single[occ]] + flat[first[which[occ]] + nth]
    offsets = np.insert(offsets, np.searchsorted(offsets, extra), extra)
    pieces = np.ones(n_units, dtype=np.int64)
    pieces[single] += per
    return symbols, offsets, np.ones(offsets.size - 1, dtype=np.int64), np.repeat(encoded, pieces)





#: Pass 2's listed units are expanded in chunks of about this many word ids (``unit_chunks``): each
#: chunk's arrays are their own, so stage 2's cut lets each go once it is cut, while its piece tables
#: grow, instead of all the units after the last (``cut_pieces_parts(consume=)``). 60 MB at 32k:
#: 4 chunks of ~3.9 M pass-1 tokens, the cut's peak 231-232 MiB (THP off); 2**20 ids (13 chunks)
#: held it no lower (235-236) for more work a chunk (each expansion and numeric cut is set up
#: again: callgrind on 5 MB at 8k, +1.0% instructions at 4 chunks, +2.2% at 9).
PASS2_CHUNK_IDS = 1 << 22


def unit_chunks(part: tuple, max_ids: int) -> list:
    """Listed word-id units ``(data, starts, encoded)`` as consecutive chunks of whole units, each of
    about ``max_ids`` word ids (a unit longer than that alone), in order (views of ``part``).

    >>> part = (np.arange(10), np.array([0, 3, 4, 8, 10]), np.array([False, True, False, False]))
    >>> [(d.tolist(), s.tolist(), e.tolist()) for d, s, e in unit_chunks(part, 4)]
    [([0, 1, 2, 3], [0, 3, 4], [False, True]), ([4, 5, 6, 7], [0, 4], [False]), ([8, 9], [0, 2], [False])]
    """
    data, starts, encoded = part
    starts = np.asarray(starts, dtype=np.int64)
    n_units = starts.size - 1
    if n_units <= 0 or int(starts[-1]) <= max_ids:
        return [part]
    # the first unit that starts at or after each multiple of max_ids begins a chunk
    at = np.unique(np.searchsorted(starts[:-1], np.arange(max_ids, int(starts[-1]), max_ids)))
    bounds = [0] + [int(u) for u in at if 0 < u < n_units] + [n_units]
    return [(data[starts[a]:starts[b]], starts[a:b + 1] - starts[a], encoded[a:b])
            for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _ticker(bar) -> Optional[Callable[[int], None]]:
    """The engine's ``progress(n_done)`` for a bar (None without one)."""
    if bar is None:
        return None
    last = [0]

    def tick(done: int) -> None:
        bar.update(done - last[0])
        last[0] = done

    return tick


def _blank(token: bytes) -> bool:
    """Stage-1 tokens of whitespace only: the ones pass 2's merges rebuild (``"\\n" + "\\n"``), whose
    boundaries ``stage2_merges(rebuilds=True)`` keeps from the start.

    >>> _blank(b"\\n\\n"), _blank(b" the"), _blank(b"")
    (True, False, False)
    """
    return token.isspace()


_MARKS = frozenset(b" \t\n\r\x0b\x0c!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _blank_marks(token: bytes) -> bool:
    """Tokens of whitespace, maybe with ASCII punctuation: the ones pass 2's merges rebuild
    (``".\\n" + "\\n"`` after ``"." + "\\n\\n"``), whose pairs ``stage2_merges(rebuilds=True)`` never
    prunes.

    >>> _blank_marks(b".\\n\\n"), _blank_marks(b"  "), _blank_marks(b"..."), _blank_marks(b" a")
    (True, True, False, False)
    """
    return not token.strip() or (any(c in b" \t\n\r\x0b\x0c" for c in token) and _MARKS.issuperset(token))


def _close(bar) -> None:
    if bar is not None:
        bar.close()


def _encoder_for(vocab: dict[int, bytes], merges: list, n1: int, specials: Sequence[str], pattern: str
                 ) -> StageAwareEncoder:
    """SuperBPE's stage-aware encoder over (stage 1 = pass 1, stage 2 = passes 2 and 3)."""
    model = Model(vocab=vocab, merges=merges, special_tokens=list(specials), pattern=pattern, method="superbpe",
                  stages=[{"name": "bpe", "merges": n1}, {"name": "superbpe", "merges": len(merges) - n1}])
    return StageAwareEncoder(model)


def _vocab_of(merges: list, specials: Sequence[bytes]) -> dict[int, bytes]:
    vocab = {i: bytes([i]) for i in range(256)}
    for s in specials:
        vocab[len(vocab)] = s
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return vocab


def _replay(enc: StageAwareEncoder, table: WordTable, units: tuple, numeric: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segment word-id units the way the encoder does: stage 1 per word, stage 2 per unit.
    Returns (symbols, offsets, counts) of the final segmentation (counts are the units' counts)."""
    seg, seg_offs = enc.stage1.merge_many(table.arena.astype(np.uint32), table.offsets)
    syms, offs, cnts, _ = stage2_table(units, table, seg, seg_offs, numeric, enc.lengths)
    out, out_offs = enc.stage2.merge_many(syms, offs)
    return out, out_offs, cnts


#: The final token count (no pass-3 change) is the pass-2 engine's, which counts every unit with its
#: count (the encoded ones too, with no weight), instead of a replay of all the units by the encoder
#: (0.84 + 0.40 + 0.13 CPU-s at 32k on 60 MB of en_train); False: the replay (the tests' plain twin).
FINAL_COUNT_BY_ENGINE = True


def _tokens_of(enc: StageAwareEncoder, table: WordTable, units: tuple, numeric: np.ndarray) -> int:
    """The encoder's token count of word-id units (each times its count): :func:`_replay`."""
    _, o, c = _replay(enc, table, units, numeric)
    return int((np.diff(o) * c).sum())


def _heldout_units(held: list[np.ndarray], numeric: np.ndarray) -> tuple:
    """Held-out documents as units; the 'count' of a unit is its document index (stage2_table keeps
    counts per unit, so the index follows each unit through the expansion)."""
    data, bounds, docs = [], [0], []
    pos = 0
    for d, ids in enumerate(held):
        if ids.size == 0:
            continue
        num = numeric[ids]
        cut = np.flatnonzero(num[1:] | num[:-1]) + 1
        b = np.concatenate((cut, [ids.size])) + pos
        bounds.extend(b.tolist())
        docs.extend([d] * b.size)
        data.append(ids)
        pos += ids.size
    if not data:
        return np.zeros(0, np.uint32), np.zeros(1, np.int64), np.zeros(0, np.int64)
    return np.concatenate(data).astype(np.uint32), np.array(bounds, np.int64), np.array(docs, np.int64)


def train_supratok(config, table: WordTable, report: dict, plan, progress: bool = False,
                   recorded: Optional[list] = None):
    """All passes on a counted corpus; returns ``(vocab, merges, stages)``.

    ``recorded``: the counting pass's record of every pretoken (``count_corpus(record=)``): the
    documents come from it (``documents_from_records``) instead of a second pre-tokenization of the
    file, when they can (``documents.can_use_record``); it is cleared once they are listed.

    Its passes each hold tens of MB in arrays of a few MB: while they run, such blocks are mapped, so
    they go back to the OS when freed (peak RSS 555 -> 431 MiB on 60 MB at 32k;
    ``runtime.workers.big_blocks_mapped``: for these passes only, not for the rest of the process)."""
    with big_blocks_mapped():
        return _train_supratok(config, table, report, plan, progress, recorded)


def _train_supratok(config, table: WordTable, report: dict, plan, progress: bool, recorded: Optional[list]):
    """:func:`train_supratok` while big blocks are mapped."""
    specials = encode_specials(config.special_tokens)
    pattern = resolve_pattern(config.pattern)
    # SupraTok keeps SuperBPE's rules as they were before issue 15 (no digit cap, duplicates allowed)
    # and its "units" split: its documents, seeds and encoder are built on them.
    rules = dataclasses.replace(Stage2Rules.from_config(config), max_digits=None, distinct=False)
    t_size = resolve_transition(config.transition, config.vocab_size, len(specials))
    n1_target = t_size - 256 - len(specials)
    n_total = config.vocab_size - 256 - len(specials)
    script_aware = config.script_aware
    seconds = report["seconds"]
    info: dict[str, Any] = {"transition": t_size}
    t0 = time.perf_counter()

    # ---- documents: training units, held-out split (only for pass 3: without it the held-out
    # documents would serve nothing and be lost to passes 1 and 2), document frequencies
    heldout = config.heldout_fraction if config.supratok_rounds > 0 else 0.0
    phase("supratok documents")
    bar = progress_bar(progress, total=os.path.getsize(config.input_path), desc="supratok documents", unit="B",
                       unit_scale=True)
    # the words' statistic ids serve the n-gram statistics (seeds, pass 3) and pass 3's document
    # frequencies; neither runs: not made (a decode of every word)
    use_seeds = config.pass2_cross == "seeds"
    sid, surfaces = word_classes(table, normalize=script_aware) if use_seeds or heldout > 0 else (None, [])
    # the process's measured size rounded up to a whole step and the fraction rounded down to a
    # whole step, as SuperBPE's stage 2 does: a few KB more or less in the interpreter must not
    # change the sample of a tight budget, hence the merges (0.3028 and 0.3061 in two runs of one
    # command under --memory-limit 300M before)
    overhead = -(-max(int(plan.parent_overhead), 0) // OVERHEAD_STEP) * OVERHEAD_STEP
    budget_share = max(plan.memory_limit - overhead - 3 * table.nbytes, 64 << 20)
    need = int(table.counts.sum() * 2) * STAGE2_BYTES_PER_SYMBOL
    fraction = sample_fraction(need, budget_share)
    # units of text that looks like encoded data (uuencode) are marked: pass 2 gives them no weight,
    # as SuperBPE's stage 2 (stage2_skip_encoded, on by default), so the vocabulary learns no such junk
    skip_encoded = config.stage2_skip_encoded
    # the words' flags (one native pass): the encoded-unit test's and the numeric words (NUMERIC is
    # numeric_mask's rule: word_flags is tested equal to word_flags_python, whose NUMERIC it is)
    flags = word_flags(table)
    # pass 2 alone reads the units (no seeds, no pass 3: no held-out documents, and the final count is
    # the engine's, not a replay): unless sampled, they are listed as they come, not counted
    # (documents.UnitList; pass 2 deduplicates its pieces; docs["listed"] says which)
    listed = not use_seeds and heldout <= 0 and FINAL_COUNT_BY_ENGINE
    if recorded and can_use_record(heldout, pattern):
        # the pretokens as counted: no second pre-tokenization of the file
        info["documents_source"] = "record"
        docs = documents_from_records(recorded, table, pattern, plan.num_workers, fraction, script_aware,
                                      flags=flags if skip_encoded else None,
                                      classes=byte_classes(table) if skip_encoded else None, listed=listed)
        if bar is not None:
            bar.update(os.path.getsize(config.input_path))
    else:
        info["documents_source"] = "scan"
        docs = count_documents(config.input_path, table, sid, specials, pattern, plan.num_workers,
                               plan.chunk_bytes, fraction, heldout, script_aware,
                               on_bytes=bar.update if bar is not None else None,
                               flags=flags if skip_encoded else None,
                               classes=byte_classes(table) if skip_encoded else None, listed=listed)
    if recorded is not None:
        recorded.clear()            # its memory goes before pass 1's
    # what the documents' threads and the record freed goes back to the OS (glibc keeps it in their
    # heaps, resident: 89 MiB at pass 2 on 60 MB at 32k), here and after each pass below
    release_free_memory()
    _close(bar)
    numeric = (flags & NUMERIC) > 0
    listed = docs["listed"]
    held = docs["held"]
    held_counts = np.zeros(table.n_words, np.int64)
    if held:
        held_counts = np.bincount(np.concatenate(held), minlength=table.n_words).astype(np.int64)
    # suffix mining only for a language that holds at least 1% of the training documents
    min_docs = max(5, 0.01 * docs["n_train_docs"])
    langs = {k: v for k, v in docs["lang"].items() if docs["lang_docs"].get(k, 0) >= min_docs}
    gate = (script_gate_from_table(table, langs, config.script_bigram_min)
            if script_aware else ScriptGate())
    info.update(sample_fraction=fraction, units_seen=docs["seen"], units_kept=docs["kept"],
                train_documents=docs["n_train_docs"], heldout_documents=len(held),
                spaceless_bigrams=len(gate.bigrams), suffixes=len(gate.suffixes))
    t1 = time.perf_counter()
    seconds["supratok_documents"] = round(t1 - t0, 3)

    # ---- pass 1: BPE inside pretokens on the training documents
    phase("merge loop")
    engine = MergeEngine(table.symbols(), table.offsets, np.maximum(table.counts - held_counts, 0),
                         [bytes([i]) for i in range(256)])
    bar = progress_bar(progress, total=max(n1_target, 0), desc="pass 1 merges", unit="merge")
    steps1 = engine.run(n1_target, allowed=gate.allows if gate.active else None, progress=_ticker(bar))
    _close(bar)
    seg_symbols, seg_offsets, _ = engine.words()
    tokens = engine.tokens()
    del engine
    release_free_memory()
    t2 = time.perf_counter()
    seconds["pass1"] = round(t2 - t1, 3)

    # ---- word statistics and seeds
    phase("supratok statistics")
    # n-gram statistics serve the seeds (pass2_cross "seeds") and pass 3 (which needs held-out
    # documents: without them every gain is 0 and nothing is accepted); neither: none are counted
    run_pass3 = config.supratok_rounds > 0 and bool(held)
    seeds: list[tuple[int, ...]] = []
    features: list = []
    if use_seeds or run_pass3:
        data, starts, ucounts = docs["units"]
        if skip_encoded:            # the statistics see every unit, marked or not (on copies: marks stay)
            data, starts, _ = strip_marks(np.array(data, dtype=np.uint32), np.array(starts, dtype=np.int64))
        seq, weights = flatten_units(data, starts, sid, ucounts, dtype=np.int32)
        raw, _ = flatten_units(data, starts, np.arange(table.n_words), ucounts, dtype=np.int32)
        max_n = max(config.seed_max_n, config.span_max_n)
        bar = progress_bar(progress, total=max_n, desc="supratok statistics", unit="step")  # lengths 2.., candidates
        stats = NgramStats(seq, raw, weights, len(surfaces), max_n,
                           min(config.seed_min_count, config.span_min_count),
                           on_level=bar.update if bar is not None else None,
                           contexts_for=(lambda st, n: span_candidate_ids(st, n, config)) if run_pass3 else None)
        if use_seeds:
            seeds = select_seeds(stats, surfaces, config.seed_min_count, config.seed_pmi, config.seed_max_n)
        if run_pass3:
            # pass 3's candidates need these statistics and no vocabulary: taken now, so that the
            # statistics' arrays (several per position of the units) are gone before the pass-2 engine
            held_data, held_bounds, held_docs = _heldout_units(held, numeric)
            hseq, _ = flatten_units(held_data, held_bounds, sid, np.ones(max(held_bounds.size - 1, 0), np.int64))
            hdocs = np.repeat(held_docs, np.diff(held_bounds) + 1) if held_docs.size else np.zeros(0, np.int64)
            features = span_candidates(stats, surfaces, docs["df"], docs["n_train_docs"], hseq, hdocs, config)
            del hseq, hdocs
        del stats, seq, raw, weights
        if bar is not None:
            bar.update(1)
        _close(bar)
    seed_surfaces = [b"".join(surfaces[w] for w in s) for s in seeds]
    info["seeds"] = len(seeds)
    info["seed_examples"] = [s.decode("utf-8", "replace") for s in seed_surfaces[:20]]
    t3 = time.perf_counter()
    seconds["supratok_statistics"] = round(t3 - t2, 3)

    # ---- pass 2: seeded cross-boundary merges on the units
    phase("merge loop")
    token_lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    # (uint16 symbols when every pass-1 token id fits: half the bytes beside the pieces as they are cut)
    # the engine's weights: none for the encoded units; its final count: every unit with its count
    # (FINAL_COUNT_BY_ENGINE: the final count is the engine's then, not a replay of all the units)
    by_engine = FINAL_COUNT_BY_ENGINE

    def pass2_units(units_now) -> tuple:
        """The units as pass 2's parts ``([symbols], [offsets], [weights], [counts])`` and the
        encoded units' count and pass-1 tokens: listed units (a list of parts, each let go once
        expanded) or counted ones (``stage2_table``; without pass 3 its marks are stripped in place)."""
        if listed:
            tables = []
            while units_now:
                part = units_now.pop(0)
                for chunk in unit_chunks(part, PASS2_CHUNK_IDS):
                    tables.append(listed_units_table(chunk, table, seg_symbols, seg_offsets, numeric,
                                                     token_lengths))
                del part, chunk
        else:
            tables = [stage2_table(units_now, table, seg_symbols, seg_offsets, numeric, token_lengths, narrow=True,
                                   give_up=by_engine and not run_pass3)]
        parts: tuple = ([], [], [], [])
        n_encoded = encoded_tokens = 0
        for syms, offs, cnts, enc in tables:
            n_encoded += int(cnts[enc].sum())
            encoded_tokens += int((np.diff(offs)[enc] * cnts[enc]).sum())     # pass-1 tokens in them
            weights = np.where(enc, 0, cnts) if enc.any() else cnts
            for out, x in zip(parts, (syms, offs, weights, cnts if by_engine else weights)):
                out.append(x)
        return parts, n_encoded, encoded_tokens

    units, info["encoded_units"], info["encoded_tokens"] = pass2_units(docs["units"])
    info["skip_encoded"] = bool(skip_encoded)

    # Without pass 3 the word-id units serve only a restart of pass 2: they go before the pass-2
    # engine (its peak was theirs too: 396 -> ~340 MiB on 60 MB at 32k); a restart lists them again
    # by a scan of the file, as SuperBPE's stage 2 does (the record is gone)
    if by_engine and not run_pass3:
        docs["units"] = None

    def listed_again():
        """The same units again (stage2_merges lets them go once they are cut; a run that starts again
        from the first merge lists them again)."""
        if docs["units"] is None:
            again = count_documents(config.input_path, table, sid, specials, pattern, plan.num_workers,
                                    plan.chunk_bytes, fraction, heldout, script_aware,
                                    flags=flags if skip_encoded else None,
                                    classes=byte_classes(table) if skip_encoded else None, listed=listed)
            if again["listed"] != listed:
                raise InternalError("pass 2's units listed again are not in the form of the first listing")
            units_now = again["units"]
            del again
        else:           # (kept for pass 3: not given up to the expansion)
            units_now = list(docs["units"]) if listed else docs["units"]
        return pass2_units(units_now)[0]

    release_free_memory()           # (the expansion's and the word-id units' memory, before the cut's)
    rule = SeedRule(seed_surfaces, pattern, rules, gate, script_aware, config.pass2_cross)
    bar = progress_bar(progress, total=max(n_total - len(steps1), 0), desc="pass 2 merges", unit="merge")
    # Pass 2 may merge again a pair pass 1 merged, met across pretokens ("\n" + "\n" of "\n\nI", which
    # GPT-2 cuts in two): the stage-aware encoder needs that merge, and refusing it (as SuperBPE's
    # stage 2 does) cost 0.8% more tokens (docs/supratok_exports.md). Its id holds bytes a smaller id
    # holds; no encoder emits it and every export lists the bytes once, under the smaller id.
    # The engine runs on the pieces of the units as SuperBPE's stage 2 does (stage2_merges: the units
    # cut where no merge can reach, deduplicated), with the boundaries beside rebuilt tokens kept
    # (rebuilds: whitespace tokens from the start); the same merges as the engine on the whole units.
    # (Its loop stops below the cut, at least 1: a pair seen only in weightless units is never merged.)
    result = stage2_merges(*units, tokens, n_total - len(steps1), rule.allows, bounded=True, rebuilds=True,
                           guard_tokens=_blank, spare_tokens=_blank_marks, threads=plan.num_workers,
                           regenerate=listed_again, count_weighted=True)
    del units
    steps2 = result.steps
    if bar is not None:
        bar.update(len(steps2))
    _close(bar)
    all_tokens = result.tokens
    merges = [(all_tokens[a], all_tokens[b]) for a, b, _ in list(steps1) + list(steps2)]
    n1 = len(steps1)
    n2 = len(steps2)
    # the engine counted every unit (encoded ones too) with its count; its figure of old counts the
    # weighted units only: the same engine's count of the units with their weights (none for the
    # encoded ones), not the encoder's replay of the encoded units taken off (0.27 CPU-s at 32k on
    # 60 MB: a stage-aware encoder built and the units replayed; tested equal to the replay)
    engine_tokens = result.weighted_tokens
    info["pass2_engine_tokens"] = engine_tokens
    info["pass2_cut"] = result.info
    report["engine"] = result.engine_stats
    for k, v in result.seconds.items():
        seconds[f"pass2_{k}"] = v
    result_final_tokens = result.final_tokens
    del result              # pass 3 and the final count need only the merges
    info["pass1_merges"], info["pass2_merges"] = n1, n2
    info["pass2_cross_merges"] = sum(1 for a, b in merges[n1:] if rule.crosses(a + b))
    t4 = time.perf_counter()
    seconds["pass2"] = round(t4 - t3, 3)

    # ---- pass 3: scored spans with leaf surgery
    phase("supratok pass 3")
    info["pass3_candidates"] = len(features)
    # per round: each candidate is scored, then considered for acceptance
    # (no bar when pass 3 does not run: off, or no candidates)
    bar = progress_bar(progress if features else False, total=2 * len(features) * config.supratok_rounds,
                       desc="pass 3 spans", unit="span")
    origin = [1] * n1 + [2] * n2          # which pass made each merge (kept in step with ``merges``)
    spans3: list[tuple[bytes, ...]] = []
    n_removed = 0
    rounds = []
    for r in range(config.supratok_rounds if features else 0):
        vocab = _vocab_of(merges, specials)
        enc = _encoder_for(vocab, merges, n1, config.special_tokens, pattern)
        accepted, removed, log = leaf_surgery(enc, merges, n1, table, held_data, held_bounds, held_docs, numeric,
                                              features, free_slots=n_total - len(merges),
                                              on_span=bar.update if bar is not None else None)
        rounds.append(log)
        if not accepted:
            break
        keep = [i for i in range(len(merges)) if i not in removed]
        n1 -= sum(1 for i in removed if i < n1)
        n_removed += len(removed)
        merges = [merges[i] for i in keep]
        origin = [origin[i] for i in keep]
        for chain in accepted:
            merges.extend(chain)
            origin.extend([3] * len(chain))
            spans3.append(tuple(chain))
    info["pass3_rounds"] = rounds
    info["pass3_spans"] = len(spans3)
    info["pass3_removed_leaves"] = n_removed
    n3 = origin.count(3)
    if bar is not None:             # rounds that did not run (nothing was accepted) count as done
        bar.update(2 * (config.supratok_rounds - len(rounds)) * len(features))
    _close(bar)
    t5 = time.perf_counter()
    seconds["pass3"] = round(t5 - t4, 3)

    # ---- the final token count, by the encoder's own replay
    phase("supratok final count")
    bar = progress_bar(progress, total=2, desc="supratok final count", unit="part")
    vocab = _vocab_of(merges, specials)
    enc = None                      # (built only for a replay)
    if by_engine and not spans3 and not n_removed:
        # the merges are pass 2's: the engine's count of every unit is the encoder's (its replay
        # rewrites each unit as the merge loop did; tested against the replay)
        info["final_tokens"] = int(result_final_tokens)
    else:
        enc = _encoder_for(vocab, merges, n1, config.special_tokens, pattern)
        info["final_tokens"] = _tokens_of(enc, table, docs["units"], numeric)
    if bar is not None:
        bar.update(1)
    hd, hb, _ = _heldout_units(held, numeric)
    held_tokens = 0
    if hd.size:
        if enc is None:
            enc = _encoder_for(vocab, merges, n1, config.special_tokens, pattern)
        _, ho, _ = _replay(enc, table, (hd, hb, np.ones(hb.size - 1, np.int64)), numeric)
        held_tokens = int(np.diff(ho).sum())
    info["heldout_tokens"] = held_tokens
    if bar is not None:
        bar.update(1)
    _close(bar)
    seconds["supratok_final_count"] = round(time.perf_counter() - t5, 3)
    # tokens of the whole corpus (special tokens excluded) when no sampling happened
    info["final_tokens_corpus"] = info["final_tokens"] + held_tokens if fraction >= 1 else None
    seconds["merge_loop"] = round((t2 - t1) + (t4 - t3), 3)
    report["merges"] = len(merges)
    report["merges_requested"] = max(n_total, 0)
    report["supratok"] = info
    # what the tools' summary line names (each phase above, not only pre-tokenization and merges)
    report["summary_phases"] = [["pre-tokenize", "pretokenize"], ["documents", "supratok_documents"],
                                ["pass 1", "pass1"], ["statistics", "supratok_statistics"], ["pass 2", "pass2"],
                                ["pass 3", "pass3"], ["final count", "supratok_final_count"]]
    n2_final = origin.count(2)
    stages = [
        {"name": "bpe", "merges": n1},
        {"name": "supratok-seeds", "merges": n2_final, "rules": rules.to_dict(), "cross": config.pass2_cross,
         "seeds_hex": [x.hex() for x in seed_surfaces]},
        {"name": "supratok-spans", "merges": n3, "spans": len(spans3)},
    ]
    return vocab, merges, stages


def span_candidate_ids(stats: NgramStats, n: int, config) -> np.ndarray:
    """The ids of level ``n`` that pass 3 scores: count >= span_min_count, PMI >= span_pmi, at most
    span_max_candidates by count x PMI (sorted ids). Also asked while the statistics are built, so
    that only these n-grams keep their contexts (``NgramStats(contexts_for=)``)."""
    lv = stats.levels[n - 1]
    if n > config.span_max_n or lv.counts.size == 0:
        return np.zeros(0, np.int64)
    pmi = stats.pmi(n)
    cand = np.flatnonzero((lv.counts >= config.span_min_count) & (pmi >= config.span_pmi))
    if cand.size > config.span_max_candidates:
        order = np.lexsort((cand, -(lv.counts[cand] * pmi[cand])))
        cand = np.sort(cand[order[:config.span_max_candidates]])
    return cand


def span_candidates(stats: NgramStats, surfaces: list[bytes], df: np.ndarray, n_docs: int, hseq: np.ndarray,
                    hdocs: np.ndarray, config) -> list[tuple[bytes, list[bytes], SpanFeatures]]:
    """Pass-3 candidates (2..span_max_n words, count >= span_min_count, PMI >= span_pmi) with every
    Appendix-A feature except ``l_tok`` (which depends on the current vocabulary)."""
    l1 = stats.levels[0]
    texts = [s.decode("utf-8", "surrogateescape") for s in surfaces]
    is_stop = np.array([t.strip().lower().lstrip("'") in STOPWORDS_EN for t in texts], dtype=bool)
    idf = np.log((n_docs + 1) / (1 + df.astype(np.float64))) if df.size else np.zeros(0)
    wlen = np.array([len(t.strip()) for t in texts], dtype=np.int64)
    out = []
    bigram_npmi = stats.npmi(2) if len(stats.levels) > 1 else np.zeros(0)
    for n in range(2, min(config.span_max_n, len(stats.levels)) + 1):
        lv = stats.levels[n - 1]
        if lv.counts.size == 0:
            continue
        pmi = stats.pmi(n)
        npmi = stats.npmi(n)
        cand = span_candidate_ids(stats, n, config)
        if cand.size == 0:
            continue
        wm = stats.word_matrix(n)[cand]
        h_l, h_r, peak = stats.contexts(n, cand)
        c_h, d_h = stats.heldout_counts(n, hseq, hdocs, cand)
        bi = stats.lookup(2, np.stack([wm[:, :-1].ravel(), wm[:, 1:].ravel()], axis=1)).reshape(cand.size, n - 1)
        adj = np.where(bi >= 0, bigram_npmi[np.maximum(bi, 0)], 0.0).mean(axis=1)
        for k, j in enumerate(cand):
            words = [surfaces[w] for w in wm[k]]
            surface = b"".join(words)
            text = surface.decode("utf-8", "surrogateescape")
            stops = is_stop[wm[k]]
            f = SpanFeatures(
                n=n, c_train=int(lv.counts[j]), pmi=float(pmi[j]), npmi=float(npmi[j]),
                h_left=float(h_l[k]), h_right=float(h_r[k]), mean_idf=float(idf[wm[k]].mean()),
                adj_npmi=float(adj[k]), c_peak=float(peak[k]), l_tok=0, r_stop=float(stops.mean()),
                all_stop=bool(stops.all()), awl=float(wlen[wm[k]].mean()), clen=len(text.strip()),
                c_holdout=int(c_h[k]), df_holdout=int(d_h[k]), valid_surface=valid_surface(text))
            out.append((surface, words, f))
    out.sort(key=lambda x: x[0])
    return out


def leaf_surgery(enc: StageAwareEncoder, merges: list, n1: int, table: WordTable, held_data, held_bounds,
                 held_docs, numeric, features, free_slots: int = 0,
                 on_span: Optional[Callable[[int], None]] = None):
    """One round of pass 3. Returns (accepted chains of merges, indices of removed merges, log).

    U(m) of every leaf merge is measured on the held-out documents encoded with the current
    vocabulary; candidates are taken in decreasing Priority(s) = Net(s) + 0.03 S(s) and each takes the
    cheapest leaves still free (free vocabulary slots cost nothing); accepted iff Net(s) > 0.
    """
    # held-out token counts and document frequencies per token bytes
    f_eval: dict[bytes, int] = {}
    df_eval: dict[bytes, int] = {}
    if held_data.size:
        out, offs, docs = _replay(enc, table, (held_data, held_bounds, held_docs), numeric)
        unit_of = np.repeat(np.arange(offs.size - 1), np.diff(offs))
        tb = enc.token_bytes
        c = np.bincount(out, minlength=len(tb))
        dd = np.unique(docs[unit_of].astype(np.int64) * len(tb) + out)
        d = np.bincount(dd % len(tb), minlength=len(tb))
        for i in np.flatnonzero(c):
            f_eval[tb[i]] = f_eval.get(tb[i], 0) + int(c[i])
            df_eval[tb[i]] = df_eval.get(tb[i], 0) + int(d[i])
    results = [a + b for a, b in merges]
    operands = set()
    leaves = []
    for i in range(len(merges) - 1, -1, -1):
        a, b = merges[i]
        if results[i] not in operands:
            leaves.append(i)
        operands.add(a)
        operands.add(b)
    util = {i: leaf_utility(f_eval.get(results[i], 0), df_eval.get(results[i], 0)) for i in leaves}
    leaves.sort(key=lambda i: (util[i], -i))
    # score the candidates under the current vocabulary
    scored = []
    for k, (surface, words, f0) in enumerate(features):
        if on_span is not None and k % 256 == 255:
            on_span(256)
        toks = [enc.token_bytes[i] for i in enc.encode_ordinary(surface).tolist()]
        f = dataclasses.replace(f0, l_tok=len(toks))
        sc = score_span(f)
        if hard_reject(f, sc) is not None:
            continue
        k = len(toks) - 1
        cost = sum(util[i] for i in leaves[:max(0, k - free_slots)])
        net = gain(f) - cost
        scored.append((-(net + 0.03 * sc["S"]), surface, toks, f, sc))
    if on_span is not None:
        on_span(len(features) % 256)
    scored.sort(key=lambda x: (x[0], x[1]))
    accepted, removed = [], []
    protected: set[bytes] = set()
    taken: list[bytes] = []
    li = 0
    free = free_slots
    log = {"scored": len(scored), "accepted": 0, "examples": []}
    removed_bytes: set[bytes] = set()
    # V ids stay V different strings: a chain step whose pair is already a merge (a span accepted
    # earlier in the round with the same first words) is shared, not added again; a span whose chain
    # would build the bytes of a token some other way is skipped
    live_pairs = set(merges)
    known = set(enc.token_bytes)
    told = 0                          # candidates reported to on_span in this loop
    for n_seen, (_, surface, toks, f, sc) in enumerate(scored):
        if on_span is not None and n_seen % 256 == 255:
            on_span(256)
            told += 256
        if any(surface in t or t in surface for t in taken):
            continue                                   # overlap with a span accepted this round
        if removed_bytes.intersection(toks):
            continue                                   # its segmentation lost a token this round
        chain, built, clash = [], [], False
        left = toks[0]
        for t in toks[1:]:
            built.append(left + t)
            if (left, t) not in live_pairs:
                if left + t in known:
                    clash = True
                    break
                chain.append((left, t))
            left = left + t
        if clash or not chain:
            continue                                   # it would give a second id to existing bytes
        k = len(chain)
        use_free = min(free, k)
        chosen = []
        j = li
        while len(chosen) < k - use_free and j < len(leaves):
            if results[leaves[j]] not in protected and results[leaves[j]] not in toks \
                    and results[leaves[j]] not in built:
                chosen.append(j)
            j += 1
        if len(chosen) < k - use_free:
            break
        net = gain(f) - sum(util[leaves[x]] for x in chosen)
        if net <= 0:
            continue
        free -= use_free
        accepted.append(chain)
        taken.append(surface)
        protected.update(toks)
        protected.update(built)
        live_pairs.update(chain)
        known.update(built)
        for x in chosen:
            removed.append(leaves[x])
            removed_bytes.add(results[leaves[x]])
            live_pairs.discard(merges[leaves[x]])
        chosen_set = set(chosen)
        leaves = [l for x, l in enumerate(leaves) if x not in chosen_set]
        if len(log["examples"]) < 10:
            log["examples"].append({"span": surface.decode("utf-8", "replace"), "net": round(net, 2),
                                    "S": round(sc["S"], 2), "l_tok": f.l_tok})
    if on_span is not None:           # the candidates not considered (rejected, or no leaf left) count as done
        on_span(len(features) - told)
    log["accepted"] = len(accepted)
    log["removed"] = len(removed)
    return accepted, set(removed), log
