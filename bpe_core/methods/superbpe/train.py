"""Training a SuperBPE model (:func:`train_superbpe`): stage 1 on the word table (trained, or given
by ``--init-from``), the stage-2 units (from the record, a scan, or shards), stage 2's merges, and
the run report."""
from __future__ import annotations

import gc
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Optional, Sequence

import numpy as np

from ...corpus.readers import BadRecords
from ...corpus.inputs import expand_inputs
from ...corpus.shards import ReadOptions
from ...corpus.specials import encode_specials
from ...engine.merge import MergeEngine, replay_merges
from ...pretok.patterns import resolve_pattern
from ...pretok.wordtable import WordTable
from ...runtime.memmon import huge_pages_ready, phase
from ...runtime.progress import progress_bar
from ...runtime.workers import release_free_memory
from .official import official_units
from .rules import Stage2Rules, normal_split, resolve_transition
from .stage2 import (MAP_THRESHOLD, STAGE2_BYTES_PER_SYMBOL, STAGE2_MAP_THRESHOLD, rows_before_stage1,
                     sample_fraction, stage2_budget_share, stage2_huge_pages, stage2_merges, unit_weights)
from .units import (count_units, count_units_on, has_url, record_table_rows, record_word_maps, stage2_table,
                    units_from_records)
from .words import NUMERIC, encoded_units, word_classes, word_flags


def train_superbpe(config, table: WordTable, report: dict, plan, progress: bool = False,
                   init_merges: Optional[Sequence[tuple[bytes, bytes]]] = None,
                   recorded: Optional[list] = None):
    """Stage 1 and stage 2 on a counted corpus; returns ``(vocab, merges, stages)`` and fills
    ``report`` (this run's section of the report: seconds per step, engine, the ``superbpe`` figures).

    ``init_merges``: stage 1 is these merges (an existing BPE model's, ``--init-from``), applied to
    the words instead of trained; the transition is their end. ``recorded``: the counting pass's
    record of every pretoken (``count_corpus(record=)``): the stage-2 units come from it
    (:func:`units_from_records`) instead of a second scan of the file, when stage 2 sees all of it."""
    specials = encode_specials(config.special_tokens)
    rules = Stage2Rules.from_config(config)
    if init_merges is not None:
        t_size = 256 + len(specials) + len(init_merges)
    else:
        t_size = resolve_transition(config.transition, config.vocab_size, len(specials))
    n1 = t_size - 256 - len(specials)
    n_total = config.vocab_size - 256 - len(specials)
    pattern = resolve_pattern(config.pattern)

    split = normal_split(config.stage2_split)
    # ---- while stage 1 runs (one thread): what stage 2 needs from the word table alone, on the other
    # core: the words' flags and byte classes, and the record's pretokens as table rows (used when
    # stage 2 sees the whole corpus, which is known after stage 1; dropped otherwise)
    prep = ThreadPoolExecutor(2, thread_name_prefix="bpe_core-stage2-prep")
    # Python's cyclic garbage collector is paused meanwhile (as the engine's loop pauses it), and on
    # again after, when it was on: the two stages' steps, tokens and the units' lists are young
    # containers by the ten thousand, and each collection walked them (60 MB at 32k: 44 collections,
    # 37 ms, against 2 ms in plain BPE's loop). The stages make no reference cycles (checked on that
    # run: nothing unreachable when it ends), so nothing waits for the collector meanwhile.
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    try:
        return _train_superbpe(config, table, report, plan, progress, init_merges, recorded, specials, rules,
                               t_size, n1, n_total, pattern, split, prep)
    finally:
        prep.shutdown(wait=True, cancel_futures=True)
        if collecting:
            gc.enable()


def _train_superbpe(config, table, report, plan, progress, init_merges, recorded, specials, rules, t_size, n1,
                    n_total, pattern, split, prep):
    """:func:`train_superbpe` once its background pool (``prep``) is open."""
    table_ram = 0 if table.mapped else table.nbytes
    budget_share = stage2_budget_share(plan.memory_limit, plan.parent_overhead, table_ram)
    record_info = None
    if split != "official":
        word_info = prep.submit(lambda: (word_flags(table),
                                         word_classes(table) if config.stage2_skip_encoded else None))
        # the rows only when stage 2 will surely see the whole corpus: even one stage-1 token per byte
        # of every pretoken fits its share (so the memory is what stage 2 would take anyway). A record
        # with its span ends is read through each chunk's map (a few bytes a chunk word, no rewrite of
        # the record); otherwise its pretokens are rewritten to table rows, on one thread: stage 1 has
        # the other core (two threads beside it slowed stage 1 by more than they gained: stage 1 + units
        # 1.14-1.51 s against 0.99-1.41 s at 32k on en_train)
        text_bytes = int((np.diff(np.asarray(table.offsets, dtype=np.int64)) * table.counts).sum())
        if recorded and rows_before_stage1(text_bytes, budget_share):
            if all(len(r) > 5 for r in recorded):
                record_info = prep.submit(record_word_maps, recorded, table)
            else:
                record_info = prep.submit(record_table_rows, recorded, table, 1)

    # ---- stage 1: plain BPE on the word table (all words, so rows stay aligned with the table)
    # Read-only engine arrays above MAP_THRESHOLD go to mapped files in the spill folder (docs/memory.md).
    folder = config.spill_dir or tempfile.gettempdir()
    t0 = time.perf_counter()
    phase("build words")
    bar = progress_bar(progress, total=n_total, desc="merges", unit="merge")
    if init_merges is not None:         # stage 1 given: apply its merges to the words
        replay = replay_merges(table.arena, table.offsets, init_merges)
        seg_symbols, seg_offsets, tokens, steps1 = replay.symbols, replay.offsets, replay.tokens, replay.steps
        del replay
    else:
        engine = MergeEngine(table.arena, table.offsets, table.counts, [bytes([i]) for i in range(256)],
                             spill_dir=folder, map_threshold=MAP_THRESHOLD)
        phase("merge loop")
        steps1 = engine.run(n1)
        seg_symbols, seg_offsets, _ = engine.words()
        tokens = engine.tokens()
        del engine                      # stage 2 starts from the segmentation; free the stage-1 engine
    if bar is not None:
        bar.update(len(steps1))
    t1 = time.perf_counter()
    n_stage1_tokens = int((np.diff(seg_offsets) * table.counts).sum())

    # ---- stage 2 units. Its big arrays are written once, in order: numpy's huge-page hint stays on
    # only while free 2 MiB blocks can hold them without the kernel compacting memory (a stall per
    # fault where memory is fragmented; ~4x fewer kernel seconds per MB where it is not:
    # runtime.memmon.huge_pages_ready)
    need = n_stage1_tokens * STAGE2_BYTES_PER_SYMBOL
    huge = huge_pages_ready(min(need, budget_share))
    report["stage2_huge_pages"] = huge
    with stage2_huge_pages(huge):
        phase("stage-2 units")
        fraction = sample_fraction(need, budget_share)
        token_lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        # units of regions that look like encoded binary (uuencode, base64) stay in the table with no
        # weight: they teach stage 2 nothing, and the final token count still covers them (as the encoder
        # sees them)
        flags, classes = word_info.result() if split != "official" else (None, None)

        def list_units(use_record: bool):
            """The stage-2 units as lists of one or two parts ``(symbols, offsets, counts, encoded)``,
            the figures and where they came from: the counting pass's record (``use_record``, when it
            can serve) or a scan of the input (the same units: tested)."""
            if split == "official":
                syms, offs, cnts, info = official_units(config.input_path, specials, pattern, tokens, steps1,
                                                         fraction)
                enc = (encoded_units(syms, offs, tokens) if config.stage2_skip_encoded
                       else np.zeros(cnts.shape[0], dtype=bool))
                return [syms], [offs], [cnts], [enc], info, "scan"
            path, sources = config.input_path, None
            if config.cluster is not None or has_url(path):
                sources = expand_inputs(path, config.input_format, config.text_column)
                if len(sources) == 1 and sources[0].plain_text and not sources[0].is_url:
                    path, sources = sources[0].name, None
            # the hf split writes each word's stage-1 tokens while it scans (no word-id units to expand);
            # the units split cuts numbers by their word ids
            seg = (seg_symbols, seg_offsets) if split != "units" else None
            source = "scan"
            if use_record and recorded and sources is None:
                # the pretokens as counted (sampled as a scan samples them): no second
                # pre-tokenization of the file
                source = "record"
                unit_parts, info = units_from_records(
                    recorded, table, flags, cut_spaces=(split == "hf"), classes=classes, seg=seg,
                    num_workers=plan.num_workers, rows=record_info.result() if record_info is not None else None,
                    sample_fraction=fraction)
            elif sources is not None:      # many inputs, compressed, records, URLs: units over the same shards
                opts = ReadOptions(text_field=config.text_field, text_column=config.text_column,
                                   bad=BadRecords(skip=True))          # bad records: reported by the counting
                units, info = count_units_on(config.cluster, sources, opts, table, specials, pattern,
                                             plan.chunk_bytes, fraction, cut_spaces=(split == "hf"), flags=flags,
                                             classes=classes, num_workers=plan.num_workers, seg=seg)
                unit_parts = [units]
                del units
            else:
                units, info = count_units(path, table, specials, pattern, plan.num_workers,
                                          plan.chunk_bytes, fraction, cut_spaces=(split == "hf"), flags=flags,
                                          executor=config.cluster, classes=classes, seg=seg)
                unit_parts = [units]
                del units
            tables = [stage2_table(u, table, seg_symbols, seg_offsets, (flags & NUMERIC) > 0, token_lengths,
                                   cut_numbers=(split == "units"), expanded=seg is not None) for u in unit_parts]
            del unit_parts
            syms, offs, cnts, enc = (list(x) for x in zip(*tables))
            return syms, offs, cnts, enc, info, source

        units_syms, units_offs, units_counts, encoded, info, units_source = list_units(use_record=True)
        if record_info is not None:     # done with its rows (or never used them): not cleared under it
            record_info.cancel()
            futures_wait([record_info])
            record_info = None
        if recorded is not None:
            recorded.clear()         # the record's memory goes before stage 2's
            # ... back to the OS: the counting threads' heaps kept it resident (60 MB at 32k: RSS
            # before stage 2's sketch 251 -> 158 MiB, the cut's peak 385 -> 321)
            release_free_memory()
        if split != "official":
            report["seconds"]["stage2_scan"] = round(time.perf_counter() - t1, 3)

        def listed_again():
            """A restart of stage 2 lists the units again, by a scan (the record is gone by then)."""
            syms, offs, cnts, enc, _, _ = list_units(use_record=False)
            return syms, offs, unit_weights(enc, cnts), cnts

        # one or two parts (stage2_merges takes them apart)
        weights = unit_weights(encoded, units_counts)
        encoded_tokens = sum(int((np.diff(o)[e] * c[e]).sum()) for o, c, e in zip(units_offs, units_counts, encoded))
        n_encoded_units = sum(int(c[e].sum()) for c, e in zip(units_counts, encoded))
        t2 = time.perf_counter()

        # ---- stage 2: continue from the stage-1 state, on the pieces of the units (stage2_merges:
        # phases "stage-2 sketch", "stage-2 cut", "stage-2 build", "merge loop")
        result = stage2_merges(units_syms, units_offs, weights, units_counts, tokens, n_total - len(steps1),
                               _allowed(rules, list(tokens) + list(specials)), bounded=rules.distinct,
                               spill_dir=folder,
                               map_threshold=max(MAP_THRESHOLD, min(STAGE2_MAP_THRESHOLD, budget_share // 8)),
                               threads=plan.num_workers, regenerate=listed_again)
        del units_syms, units_offs, units_counts, weights, encoded
        steps2 = result.steps
        if bar is not None:
            bar.update(len(steps2))
            bar.close()
        t3 = time.perf_counter()
    all_tokens = result.tokens
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    for s in specials:
        vocab[len(vocab)] = s
    merges = []
    for left, right, _ in list(steps1) + list(steps2):
        merges.append((all_tokens[left], all_tokens[right]))
        vocab[len(vocab)] = all_tokens[left] + all_tokens[right]
    report["seconds"]["stage1"] = round(t1 - t0, 3)
    report["seconds"]["stage2_units"] = round(t2 - t1, 3)
    report["seconds"]["stage2"] = round(t3 - t2, 3)
    for k, v in result.seconds.items():
        report["seconds"][f"stage2_{k}"] = v
    report["seconds"]["merge_loop"] = round((t1 - t0) + (t3 - t2), 3)
    report["engine"] = result.engine_stats
    # where the stage-2 units came from: the counting pass's record of every pretoken, or a second scan
    report["stage2_units_source"] = units_source
    report["merges"] = len(merges)
    report["merges_requested"] = max(n_total, 0)
    report["superbpe"] = {
        "transition": t_size,
        "stage1_merges": len(steps1),
        "stage2_merges": len(steps2),
        "stage2_split": split,
        "rules": rules.to_dict(),
        "stage2_sample_fraction": fraction,
        "stage2_units_seen": info["units_seen"],
        "stage2_units_kept": info["units_kept"],
        "stage2_unique_units": info["unique_units"],
        "stage2_text_share": round(info["units_kept"] / info["units_seen"], 6) if info["units_seen"] else 1.0,
        "stage1_tokens": n_stage1_tokens,
        # tokens of the text stage 2 trained on, when it ended (equals the encoder's count on the
        # training corpus, special tokens excluded, when stage 2 saw all of it)
        "final_tokens": result.final_tokens,
        "stage2_cut": result.info,
        "stage2_skip_encoded": bool(config.stage2_skip_encoded),
        "stage2_encoded_units": n_encoded_units,
        "stage2_encoded_tokens": encoded_tokens,      # stage-1 tokens in them
    }
    stages = [
        {"name": "bpe", "merges": len(steps1)},
        {"name": "superbpe", "merges": len(steps2), "split": split, "rules": rules.to_dict()},
    ]
    return vocab, merges, stages


def _allowed(rules: Stage2Rules, tokens: Sequence[bytes]):
    """The engine's stage-2 predicate: ``rules.allows`` and, with ``rules.distinct``, not the bytes of
    a token so far. The engine asks once per pair, just before it merges an allowed pair, so the
    set of known bytes grows here (equivalent to ``reference.superbpe_allows(known=vocab)``)."""
    if not rules.distinct:
        return rules.allows
    known = set(tokens)

    def allowed(left: bytes, right: bytes) -> bool:
        merged = left + right
        if merged in known or not rules.allows(left, right):
            return False
        known.add(merged)
        return True

    return allowed
