"""Byte-level BPE training: the pipeline from a corpus file to ``(vocab, merges)``.

Phases (each timed in the run report):

1. plan      -- check the input, pick workers and chunk size, cut the corpus into chunks.
2. pretokenize -- worker processes memory-map the file, split their chunk on special tokens, and
   count pretokens into a sorted word table (``pretokenize.count_pretokens``).
3. merge counts -- the parent sums the per-chunk tables (``pretokenize.merge_counts``).
4. build words -- the word table becomes the engine's CSR of uint32 symbols.
5. merge loop -- ``_engine.MergeEngine`` does the merges.

Results do not depend on the number of workers or the chunk size: chunks are cut only where the cut
provably leaves pre-tokenization unchanged (``corpus.chunk_boundaries``), counts are summed, and the
engine breaks ties by bytes, never by order of arrival.
"""
from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import corpus
from ._engine import MergeEngine
from . import scheduler
from .config import TrainConfig
from .memmon import MemoryMonitor, phase
from .model_io import Model
from .patterns import encode_specials, resolve_pattern
from .wordtable import WordTable
from ._atomic import remove_stale_in
from .workers import FileStamp, check_total, read_range, run_ordered

@dataclass
class TrainResult:
    """What a run produced: the model and a report of the run."""

    model: Model
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def vocab(self) -> dict[int, bytes]:
        return self.model.vocab

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        return self.model.merges


# ==== Pre-tokenization workers =============================================================


@dataclass
class ChunkCount:
    """What a worker returns for one chunk: its sorted table and the totals that must add up."""

    table: tuple            # (arena, offsets, counts), sorted by bytes
    n_bytes: int            # bytes of the chunk (read in full)
    n_specials: int         # special-token occurrences
    special_bytes: int      # bytes inside those occurrences
    n_pretokens: int        # pretokens counted (the sum of the counts)


def _count_chunk(task: tuple) -> ChunkCount:
    """Worker: count the pretokens of ``path[start:end)``; checks that they cover the text."""
    from .pretokenize import count_pretokens

    path, start, end, specials, pattern, stamp = task
    buf = read_range(path, start, end, stamp)
    spans, n_specials = corpus.split_spans(buf, 0, len(buf), specials)
    arena, offsets, counts = count_pretokens(buf, spans, pattern)
    text_bytes = int((spans[:, 1] - spans[:, 0]).sum()) if len(spans) else 0
    # Conservation: the pretokens of the text spans cover every byte of them, exactly once.
    check_total(f"bytes of {path}[{start}:{end}] (pretoken bytes vs text bytes)",
                _covered_bytes(offsets, counts), text_bytes)
    return ChunkCount((arena, offsets, counts), end - start, n_specials, end - start - text_bytes,
                      int(counts.sum()))


def _covered_bytes(offsets: np.ndarray, counts: np.ndarray) -> int:
    """Sum over words of ``len(word) * count``: the bytes of text a table stands for."""
    if len(counts) == 0:
        return 0
    return int(np.dot(np.diff(offsets), counts))


def count_corpus(path: str, specials: Sequence[bytes], pattern: str, num_workers: int,
                 chunk_bytes: int, progress: bool = False, report: Optional[dict] = None,
                 monitor: Optional[MemoryMonitor] = None, memory_limit: Optional[int] = None,
                 per_worker_bytes: int = 0, spill_threshold_bytes: Optional[int] = None,
                 spill_dir: Optional[str] = None,
                 check_words: Optional[Callable[[int], None]] = None) -> WordTable:
    """Count the pretokens of a whole file into one sorted word table.

    Chunks go to ``num_workers`` threads (``workers.run_ordered``; in this thread when 1), at most
    ``num_workers + 1`` in flight; while others are in flight, a new chunk waits when a ``monitor``
    shows the process within ``per_worker_bytes`` of ``memory_limit``. Partial tables are folded as
    they arrive, level by level (``FOLD_FANOUT`` tables of one level make one of the next, so each
    word is copied O(log n) times); when the tables in RAM outgrow ``spill_threshold_bytes``, they
    are merged and written to disk as one sorted run, and the runs are merged (exactly) at the end.
    ``check_words(n)`` is called with a lower bound on the number of unique pretokens as it grows
    (it raises to stop a run that provably cannot fit).

    Conservation is checked as the run goes: every byte of the input is read once, the pretokens of
    each chunk cover its text, and every fold and spill keeps the sum of the counts (so the final
    table holds exactly the pretokens the workers counted). A failure raises
    ``workers.InternalError``.
    """
    from .pretokenize import merge_counts

    t0 = time.perf_counter()
    stamp = FileStamp.of(path)
    chunks = corpus.file_chunks(path, chunk_bytes, specials, pattern, stamp=stamp)
    tasks = [(path, s, e, list(specials), pattern, stamp) for s, e in chunks]
    if report is not None:
        report["n_chunks"] = len(tasks)
        report["seconds"]["plan"] = round(report["seconds"].get("plan", 0) + time.perf_counter() - t0, 3)
    phase("pretokenize")
    bar = _bar(progress, total=stamp.size, desc="pre-tokenize", unit="B",
               unit_scale=True, unit_divisor=1024)
    spill = _Spill(spill_threshold_bytes, spill_dir)
    levels: list[tuple[int, tuple]] = []       # (level, sorted table) held in RAM
    totals = {"bytes": 0, "specials": 0, "special_bytes": 0, "pretokens": 0}
    t1 = time.perf_counter()
    merge_seconds = 0.0

    def fold(tables: list) -> tuple:
        merged = merge_counts(tables)
        check_total("pretoken counts after a fold", int(merged[2].sum()), sum(int(t[2].sum()) for t in tables))
        return merged

    def absorb(result: ChunkCount):
        nonlocal levels, merge_seconds
        for key, value in (("bytes", result.n_bytes), ("specials", result.n_specials),
                           ("special_bytes", result.special_bytes), ("pretokens", result.n_pretokens)):
            totals[key] += value
        levels.append((0, result.table))
        tm = time.perf_counter()
        while True:                 # fold FOLD_FANOUT tables of the lowest full level into one
            sizes: dict[int, int] = {}
            for lv, _ in levels:
                sizes[lv] = sizes.get(lv, 0) + 1
            full = [lv for lv, k in sizes.items() if k >= FOLD_FANOUT]
            if not full:
                break
            lv = min(full)
            group = [t for l2, t in levels if l2 == lv]
            levels = [(l2, t) for l2, t in levels if l2 != lv] + [(lv + 1, fold(group))]
        if spill.threshold is not None and sum(_table_bytes(t) for _, t in levels) > spill.threshold:
            # Over the threshold: merge everything in RAM into one table; it goes to disk if it is
            # still over, else it stays, as one table of the top level. Nothing is dropped.
            top = max(lv for lv, _ in levels)
            merged = fold([t for _, t in levels]) if len(levels) > 1 else levels[0][1]
            levels = [(top + 1, t) for t in spill.offer([merged])]
        merge_seconds += time.perf_counter() - tm
        if check_words is not None and levels:
            check_words(max(len(t[2]) for _, t in levels))
        if bar is not None:
            bar.update(result.n_bytes)

    def may_submit(n_in_flight: int) -> bool:
        return monitor is None or not memory_limit or monitor.sample() < memory_limit - per_worker_bytes

    try:
        run_ordered(_count_chunk, tasks, min(num_workers, len(tasks)), absorb, may_submit=may_submit)
        if bar is not None:
            bar.close()
        stamp.check()
        phase("merge counts")
        tm = time.perf_counter()
        runs = spill.runs() + [t for _, t in levels]
        table = WordTable.from_arrays(merge_counts(runs)) if runs else WordTable.empty()
        merge_seconds += time.perf_counter() - tm
    finally:
        spill.cleanup()
    # Conservation over the whole run: every byte read once; the table holds every pretoken counted,
    # and its words cover every byte outside the special tokens.
    check_total(f"bytes of {path} (bytes read vs file size)", totals["bytes"], stamp.size)
    check_total("pretokens (sum of the table's counts vs pretokens counted by the workers)",
                int(table.counts.sum()), totals["pretokens"])
    check_total(f"bytes of {path} (bytes the table covers vs text bytes)",
                _covered_bytes(table.offsets, table.counts), stamp.size - totals["special_bytes"])
    if report is not None:
        report["seconds"]["pretokenize"] = round(time.perf_counter() - t1 - merge_seconds, 3)
        report["seconds"]["merge_counts"] = round(merge_seconds, 3)
        report["special_token_occurrences"] = totals["specials"]
        report["bytes_scanned"] = totals["bytes"]
        report["pretokens_counted"] = totals["pretokens"]
        report["spilled_runs"] = spill.n_runs
        report["spilled_bytes"] = spill.n_bytes
    return table


FOLD_FANOUT = 4
#: Spill folders are named ``bpe_core-spill-<pid>-*``: a later run removes those of a dead pid.
SPILL_PREFIX = "bpe_core-spill-"


def _table_bytes(table: tuple) -> int:
    return int(sum(a.nbytes for a in table))


class _Spill:
    """Sorted runs of the pretoken table on disk, once the table outgrows its share of the budget."""

    def __init__(self, threshold: Optional[int], folder: Optional[str]):
        self.threshold = threshold
        self.folder = folder
        self._dir: Optional[tempfile.TemporaryDirectory] = None
        self.paths: list[str] = []
        self.sums: list[int] = []
        self.n_runs = 0
        self.n_bytes = 0

    def offer(self, tables: list[tuple]) -> list[tuple]:
        """Spill the tables if they are over the threshold; return what stays in RAM.

        The caller must keep what is returned: a table is either written here or handed back.
        """
        if self.threshold is None or sum(_table_bytes(t) for t in tables) <= self.threshold:
            return tables
        if self._dir is None:
            folder = self.folder or tempfile.gettempdir()
            remove_stale_in(folder, [SPILL_PREFIX])          # what a killed run left
            self._dir = tempfile.TemporaryDirectory(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=folder)
        for arena, offsets, counts in tables:
            base = os.path.join(self._dir.name, f"run{self.n_runs:05d}")
            for name, arr in (("arena", arena), ("offsets", offsets), ("counts", counts)):
                np.save(f"{base}.{name}.npy", arr)
            self.paths.append(base)
            self.sums.append(int(counts.sum()))
            self.n_runs += 1
            self.n_bytes += int(arena.nbytes + offsets.nbytes + counts.nbytes)
        return []

    def runs(self) -> list[tuple]:
        """The spilled runs, memory-mapped (pages are read as the merge reaches them); each run's
        sum of counts is checked against what was written."""
        out = []
        for base, want in zip(self.paths, self.sums):
            run = tuple(np.load(f"{base}.{name}.npy", mmap_mode="r") for name in ("arena", "offsets", "counts"))
            check_total(f"pretoken counts of spilled run {base}", int(run[2].sum()), want)
            out.append(run)
        return out

    def cleanup(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


# ==== Training =============================================================================


def _bar(mode, **kwargs):
    """A progress reporter for ``mode`` (``bpe_core.progress``: a bool or auto/bar/plain/json/none), or
    None when there is nothing to report."""
    from .progress import make_progress, resolve_mode

    if resolve_mode(mode) == "none":
        return None
    return make_progress(mode, **kwargs)


def peak_rss_bytes() -> dict[str, int]:
    """Peak resident memory of this process (``getrusage``; Linux reports KiB).

    No figure for children: ``RUSAGE_CHILDREN`` is the largest child ever waited for, including
    processes from before this run (a pip build, an earlier run in the same interpreter). The
    workers of this run are in the sampled peak of the process tree (``tree_sampled``).
    """
    scale = 1 if sys.platform == "darwin" else 1024
    return {"self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale}


def train_words(table: WordTable, vocab_size: int, special_tokens: Sequence[str | bytes] = (),
                progress: bool = False, allowed: Optional[Callable[[bytes, bytes], bool]] = None,
                report: Optional[dict] = None, spill_dir: Optional[str] = None,
                fill_buffer_bytes: int = scheduler.FILL_BUFFER_BYTES) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Run the merge loop on a word table; return ``(vocab, merges)``.

    With ``spill_dir``, the engine keeps its read-only arrays (word records, initial position lists)
    in mapped files there (``docs/memory.md``); the result is the same. A mapped table
    (:meth:`WordTable.to_files`) is taken as it is: its one-byte words were dropped when it was written.
    """
    specials = encode_specials(special_tokens)
    n_merges = vocab_size - 256 - len(specials)
    t0 = time.perf_counter()
    phase("build words")
    if not table.mapped:
        table = table.without_singletons()
    engine = MergeEngine(table.arena, table.offsets, table.counts, [bytes([i]) for i in range(256)],
                         spill_dir=spill_dir, map_threshold=0 if spill_dir is not None else 1 << 62,
                         fill_buffer_bytes=fill_buffer_bytes)
    del table
    t1 = time.perf_counter()
    bar = _bar(progress, total=n_merges, desc="merges", unit="merge")
    last = [0]

    def tick(done):
        if bar is not None:
            bar.update(done - last[0])
            last[0] = done

    phase("merge loop")
    steps = engine.run(n_merges, allowed=allowed, progress=tick if bar is not None else None)
    if bar is not None:
        bar.close()
    t2 = time.perf_counter()
    tokens = engine.tokens()
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    for s in specials:
        vocab[len(vocab)] = s
    merges: list[tuple[bytes, bytes]] = []
    for left, right, _new in steps:
        pair = (tokens[left], tokens[right])
        merges.append(pair)
        vocab[len(vocab)] = pair[0] + pair[1]
    if report is not None:
        report["seconds"]["build_words"] = round(t1 - t0, 3)
        report["seconds"]["merge_loop"] = round(t2 - t1, 3)
        report["engine"] = engine.stats()
        report["engine"]["mapped"] = spill_dir is not None
        report["merges"] = len(merges)
        report["merges_requested"] = max(n_merges, 0)
    return vocab, merges


def plan(config: TrainConfig) -> scheduler.Plan:
    """The memory plan of a run (workers, chunk size, spilling) before any work.

    Raises:
        scheduler.BudgetError: the run cannot fit ``config.memory_limit``.
    """
    size = corpus.check_input(config.input_path)
    # Workers are threads running nogil kernels: more of them than cores only adds memory, so a
    # larger --workers is capped at the cores (the plan's notes say so).
    return scheduler.plan_training(size, config.memory_limit, os.cpu_count() or 1, None,
                                   num_workers=config.num_workers, chunk_bytes=config.chunk_bytes,
                                   vocab_size=config.vocab_size)


def train(config: TrainConfig) -> TrainResult:
    """Train from a :class:`TrainConfig`; returns the model and a run report."""
    if config.entropy_filter:            # curate the input first (bpe_core/curate.py), then train on it
        import warnings

        from .curate import curated_config
        corpus.check_input(config.input_path)
        corpus.warn_if_binary(config.input_path)           # about the user's file, not the temp copy
        with curated_config(config) as (curated, curation), warnings.catch_warnings():
            warnings.simplefilter("ignore", corpus.BinaryInputWarning)
            result = train(curated)
        result.report["entropy_filter"] = curation
        result.model.metadata["entropy_filter"] = curation
        return result
    t_start = time.perf_counter()
    phase("plan")
    pattern = resolve_pattern(config.pattern)
    specials = encode_specials(config.special_tokens)
    size = corpus.check_input(config.input_path)
    corpus.warn_if_binary(config.input_path)
    the_plan = plan(config)
    report: dict[str, Any] = {
        "input_path": os.path.abspath(config.input_path),
        "input_bytes": size,
        "vocab_size": config.vocab_size,
        "special_tokens": list(config.special_tokens),
        "pattern": pattern,
        "num_workers": the_plan.num_workers,
        "chunk_bytes": the_plan.chunk_bytes,
        "memory_limit": the_plan.memory_limit,
        "plan": the_plan.to_dict(),
        "seconds": {"plan": round(time.perf_counter() - t_start, 3)},
    }
    def check_words(n_words: int) -> None:
        """Stop counting as soon as the merge phase provably cannot fit (n_words is a lower bound)."""
        if n_words * scheduler.TABLE_BYTES_PER_WORD < the_plan.memory_limit // 8 or config.min_pretoken_count > 1:
            return          # far from the limit (cheap check first); pruning decides after counting
        try:
            scheduler.plan_training(size, the_plan.memory_limit, the_plan.cpu_count, the_plan.available,
                                    num_workers=the_plan.num_workers, chunk_bytes=the_plan.chunk_bytes,
                                    per_worker_overhead=the_plan.worker_overhead,
                                    parent_overhead=the_plan.parent_overhead, vocab_size=config.vocab_size,
                                    unique_pretokens=n_words)
        except scheduler.BudgetError as exc:
            raise scheduler.BudgetError(
                f"stopped while counting: {n_words:,} unique pretokens so far already need more than the "
                f"budget; {exc}", exc.min_budget) from None

    with MemoryMonitor(interval=0.05, budget=the_plan.memory_limit) as monitor:
        table = count_corpus(config.input_path, specials, pattern, the_plan.num_workers, the_plan.chunk_bytes,
                             progress=config.progress, report=report, monitor=monitor,
                             memory_limit=the_plan.memory_limit, per_worker_bytes=the_plan.per_worker_bytes,
                             spill_threshold_bytes=the_plan.spill_threshold_bytes if the_plan.spill_threshold_bytes else None,
                             spill_dir=config.spill_dir, check_words=check_words)
        report["unique_pretokens"] = table.n_words
        report["pretokens"] = int(table.counts.sum())
        if config.min_pretoken_count > 1:
            table = table.at_least(config.min_pretoken_count)
            report["unique_pretokens_kept"] = table.n_words
        # The merge phase: check it with the real count now (and the symbols the engine will hold).
        n_symbols = int(table.arena.size)
        if config.method == "bpe":         # words of one byte hold no pair: the engine drops them
            n_symbols -= int(np.count_nonzero(np.diff(table.offsets) == 1))
        merge_plan = scheduler.plan_training(
            size, the_plan.memory_limit, the_plan.cpu_count, the_plan.available,
            num_workers=the_plan.num_workers, chunk_bytes=the_plan.chunk_bytes,
            per_worker_overhead=the_plan.worker_overhead, parent_overhead=the_plan.parent_overhead,
            vocab_size=config.vocab_size, unique_pretokens=table.n_words, symbols=n_symbols)
        report["merge_plan"] = {k: merge_plan.to_dict()[k] for k in
                                ("merge_bytes", "merge_file_bytes", "merge_mapped", "unique_pretokens",
                                 "symbols", "phase_seconds")}
        spill_folder = None
        if merge_plan.merge_mapped:
            # The table and the engine's read-only arrays go to mapped files (page cache); only what
            # the merge loop changes stays in RAM. The table in RAM is dropped here.
            spill_folder = config.spill_dir or tempfile.gettempdir()
            phase("map words")
            tm = time.perf_counter()
            table = table.to_files(spill_folder, drop_singletons=config.method == "bpe")
            report["seconds"]["map_words"] = round(time.perf_counter() - tm, 3)
        # Documents: text separated by special tokens (an empty input has none).
        report["documents"] = report["special_token_occurrences"] + 1 if size else 0
        if config.method == "superbpe":
            from .superbpe import train_superbpe
            vocab, merges, stages = train_superbpe(config, table, report, the_plan, progress=config.progress)
        elif config.method == "supratok":
            from .supratok import train_supratok
            vocab, merges, stages = train_supratok(config, table, report, the_plan, progress=config.progress)
        else:
            vocab, merges = train_words(table, config.vocab_size, config.special_tokens,
                                        progress=config.progress, report=report, spill_dir=spill_folder,
                                        fill_buffer_bytes=merge_plan.fill_buffer_bytes)
            stages = [{"name": "bpe", "merges": len(merges)}]
        del table
    report["vocab_size_reached"] = len(vocab)
    report["seconds"]["total"] = round(time.perf_counter() - t_start, 3)
    report["memory"] = monitor.summary()
    report["peak_rss_bytes"] = {"tree_sampled": monitor.peak, **peak_rss_bytes()}
    model = Model(
        vocab=vocab,
        merges=merges,
        special_tokens=[s if isinstance(s, str) else s.decode("utf-8") for s in config.special_tokens],
        pattern=pattern,
        method=config.method,
        stages=stages,
        metadata={"input_bytes": size, "unique_pretokens": report["unique_pretokens"]},
    )
    return TrainResult(model=model, report=report)


def train_bpe(input_path: str | os.PathLike, vocab_size: int, special_tokens: Sequence[str] = (),
              **options) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train a byte-level BPE tokenizer on a file (the CS336 assignment-1 interface).

    Args:
        input_path: the corpus; read as bytes, memory-mapped, never loaded whole.
        vocab_size: 256 bytes + special tokens + merges.
        special_tokens: split out before pre-tokenization, never merged; ids 256, 257, ...
        **options: any other :class:`TrainConfig` field: ``pattern`` (``"gpt2"``, ``"cl100k"``,
            ``"o200k"`` or a regex), ``num_workers``, ``chunk_bytes``, ``memory_limit`` (bytes, or
            a size string such as ``"8G"``), ``min_pretoken_count``, ``spill_dir``, ``progress``.

    Returns:
        ``(vocab, merges)``: ``vocab`` maps id -> bytes; ``merges`` lists ``(left, right)`` in order.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "c.txt")
    >>> _ = open(p, "wb").write(b"low low low lower<|endoftext|>lowest")
    >>> vocab, merges = train_bpe(p, 260, ["<|endoftext|>"], num_workers=1)
    >>> merges[:2], vocab[256]
    ([(b'o', b'w'), (b'l', b'ow')], b'<|endoftext|>')
    """
    unknown = set(options) - set(TrainConfig.field_names())
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    config = TrainConfig(input_path=input_path, vocab_size=vocab_size,
                         special_tokens=tuple(special_tokens), **options)
    result = train(config)
    return result.vocab, result.merges
