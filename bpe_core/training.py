"""Training: the pipeline from a corpus file to a model, and the public ``train`` / ``train_bpe``.

Phases (each timed in the run report and marked for the memory profile):

1. plan -- check the input; the RAM budget becomes workers, chunk size and a spill threshold
   (``runtime.budget.plan_training``).
2. pretokenize + merge counts -- worker threads count the pretokens of each chunk; the tables are
   summed into one sorted ``WordTable`` (``pretok.counting.count_corpus``), with the totals checked.
3. re-plan -- the plan is made again with the real number of unique pretokens
   (``Plan.with_count``): the merge phase fits, or the run stops naming the budget that does.
4. the method -- the table goes to the method the config names (``formats.registry``: BPE,
   SuperBPE, SupraTok), which returns vocab, merges, stages and its own section of the report.

Results do not depend on the number of workers or the chunk size: chunks are cut only where the cut
provably leaves pre-tokenization unchanged, counts are summed, and the engine breaks ties by bytes,
never by order of arrival.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from . import methods  # noqa: F401  (registers the methods)
from .config import TrainConfig
from .corpus import encode_specials
from .corpus.readers import BadRecords
from .corpus.shards import is_url
from .corpus.sources import ReadOptions, Source, expand_inputs, spool
from .errors import BinaryInputWarning, BudgetError
from .formats import registry
from .formats.model import Model
from .methods.curate import curated_config
from .methods.init_from import load_init
from .pretok.counting import check_distributable, count_corpus, count_sources_on
from .pretok.patterns import resolve_pattern
from .runtime import budget
from .runtime.executors import open_executor
from .runtime.memmon import MemoryMonitor, phase

__all__ = ["TrainResult", "plan", "train", "train_bpe", "train_from_iterator"]


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


def peak_rss_bytes() -> dict[str, int]:
    """Peak resident memory of this process (``getrusage``; Linux reports KiB).

    No figure for children: ``RUSAGE_CHILDREN`` is the largest child ever waited for, including
    processes from before this run (a pip build, an earlier run in the same interpreter). The
    workers of this run are in the sampled peak of the process tree (``tree_sampled``).
    """
    scale = 1 if sys.platform == "darwin" else 1024
    return {"self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale}


#: The input size the plan assumes for a source of unknown size (stdin, an iterator).
UNKNOWN_INPUT_BYTES = 1 << 30


def sources_of(config: TrainConfig) -> list[Source]:
    """The inputs of a run (``corpus.sources.expand_inputs``; checked, nothing read yet)."""
    return expand_inputs(config.input_path, config.input_format, config.text_column)


def _input_bytes(sources: list[Source]) -> int:
    size = sum(s.estimated_bytes for s in sources)
    if any(s.kind == "iterator" or s.is_stdin for s in sources):
        size += UNKNOWN_INPUT_BYTES
    return size


def plan(config: TrainConfig, sources: list[Source] | None = None) -> budget.Plan:
    """The memory plan of a run (workers, chunk size, spilling) before any work.

    Raises:
        errors.BudgetError: the run cannot fit ``config.memory_limit``.
    """
    size = _input_bytes(sources if sources is not None else sources_of(config))
    # Workers are threads running nogil kernels: more of them than cores only adds memory, so a
    # larger --workers is capped at the cores (the plan's notes say so).
    return budget.plan_training(size, config.memory_limit, os.cpu_count() or 1, None,
                                num_workers=config.num_workers, chunk_bytes=config.chunk_bytes,
                                vocab_size=config.vocab_size)


def _read_options(config: TrainConfig) -> ReadOptions:
    return ReadOptions(text_field=config.text_field, text_column=config.text_column,
                       bad=BadRecords(skip=config.skip_bad_records))


@contextlib.contextmanager
def _spooled(config: TrainConfig, sources: list[Source]):
    """A config whose input is one plain file holding the corpus (a temp file under the spill
    folder, removed after use), for a method or filter that reads the input again."""
    specials = encode_specials(config.special_tokens)
    opts = _read_options(config)
    opts.special_tokens = specials
    folder = tempfile.mkdtemp(prefix="bpe_core-spool-", dir=config.spill_dir)
    try:
        path = os.path.join(folder, "corpus.txt")
        with open(path, "wb") as f:
            n = spool(sources, opts, f)
        info = {"inputs": [s.describe() for s in sources], "spooled_bytes": n,
                "bad_records": opts.bad.to_dict()}
        yield dataclasses.replace(config, input_path=path, input_format="text"), info
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def train(config: TrainConfig) -> TrainResult:
    """Train from a :class:`TrainConfig`; returns the model and a run report."""
    sources = sources_of(config)             # local paths and fsspec URLs alike (corpus.sources)
    if config.cluster is not None:
        check_distributable(sources)         # stdin and iterators cannot go to cluster workers
    # one local plain file: what SupraTok, the official stage-2 split and curation read again
    single_plain = len(sources) == 1 and sources[0].plain_text and not sources[0].is_url
    if not single_plain and (config.entropy_filter or registry.get(config.method).rereads_input) \
            and not _stage2_on_shards(config, sources):
        # The method (or the filter) reads the corpus twice: one plain file makes that possible.
        with _spooled(config, sources) as (spooled, info), warnings.catch_warnings():
            warnings.simplefilter("ignore", BinaryInputWarning)
            result = train(spooled)
        result.report.update(input_path=_describe_input(config.input_path), spooled=info,
                             bad_records=info["bad_records"])
        return result
    if config.entropy_filter:            # curate the input first (methods/curate.py), then train on it
        with curated_config(config) as (curated, curation), warnings.catch_warnings():
            warnings.simplefilter("ignore", BinaryInputWarning)
            result = train(curated)
        result.report["entropy_filter"] = curation
        result.model.metadata["entropy_filter"] = curation
        return result
    t_start = time.perf_counter()
    phase("plan")
    method = registry.get(config.method)
    pattern = resolve_pattern(config.pattern)
    specials = encode_specials(config.special_tokens)
    init = load_init(config)        # --init-from: checked before any work (None without it)
    the_plan = plan(config, sources)
    budget.warn_over_machine(the_plan)       # a --memory-limit above the RAM or the cgroup: one line
    report: dict[str, Any] = {
        "input_path": _describe_input(config.input_path),
        "inputs": len(sources),
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
        if n_words * budget.TABLE_BYTES_PER_WORD < the_plan.memory_limit // 8 or config.min_pretoken_count > 1:
            return          # far from the limit (cheap check first); pruning decides after counting
        try:
            the_plan.with_count(n_words)
        except BudgetError as exc:
            raise BudgetError(f"stopped while counting: {n_words:,} unique pretokens so far already need more "
                              f"than the budget; {exc}", exc.min_budget) from None

    extra: dict[str, Any] = {}          # for method.train: init, recorded
    t_open = time.perf_counter()
    with MemoryMonitor(interval=0.05, budget=the_plan.memory_limit) as monitor, \
            open_executor(config.cluster, the_plan.num_workers, announce=_announcer(config.progress)) as executor:
        if executor.remote:
            report["seconds"]["cluster_start"] = round(time.perf_counter() - t_open, 3)
        if config.cluster is not None:
            # Each task reads its own shard of the inputs (byte ranges, row groups, whole
            # compressed files); the tables are combined on the workers.
            table = count_sources_on(executor, sources, specials, pattern, the_plan.chunk_bytes,
                                     progress=config.progress, report=report, read_options=_read_options(config))
            size = report["input_bytes"] = report["corpus_bytes"]
            config = replace(config, cluster=executor)     # the method's own data-parallel phases too
        else:
            # SuperBPE keeps each pretoken's row as it counts (4 B a pretoken: at most 4 B a byte of
            # text, ~0.9 B on English) when even that worst case is at most an eighth of the budget:
            # its stage 2 then lists its units from them instead of pre-tokenizing the file again
            # (methods.superbpe.units_from_records), when its configuration uses them
            # (Method.uses_record); otherwise nothing changes
            record = [] if (method.records_pretokens and method.uses_record(config) and single_plain
                            and budget.record_fits(sources[0].size, the_plan.memory_limit)) else None
            table = count_corpus(sources, specials, pattern, the_plan.num_workers, the_plan.chunk_bytes,
                                 progress=config.progress, report=report, monitor=monitor,
                                 memory_limit=the_plan.memory_limit, per_worker_bytes=the_plan.per_worker_bytes,
                                 spill_threshold_bytes=the_plan.spill_threshold_bytes or None,
                                 spill_dir=config.spill_dir, check_words=check_words,
                                 read_options=_read_options(config), record=record)
            if record:
                extra["recorded"] = record
            del record
            size = report["input_bytes"] = report["corpus_bytes"]
        report["unique_pretokens"] = table.n_words
        report["pretokens"] = int(table.counts.sum())
        if config.min_pretoken_count > 1:
            table = table.at_least(config.min_pretoken_count)
            report["unique_pretokens_kept"] = table.n_words
        # The merge phase: check it with the real count now (and the symbols the engine will hold); the
        # plan also says whether the engine's read-only arrays go to mapped files (merge_mapped).
        n_symbols = int(table.arena.size)
        if config.method == "bpe":         # words of one byte hold no pair: the engine drops them
            n_symbols -= int(np.count_nonzero(np.diff(table.offsets) == 1))
        merge_plan = the_plan.with_count(table.n_words, symbols=n_symbols)
        report["merge_plan"] = {k: merge_plan.to_dict()[k] for k in
                                ("merge_bytes", "merge_file_bytes", "merge_mapped", "unique_pretokens",
                                 "symbols", "phase_seconds")}
        if merge_plan.merge_mapped:
            # The table and the engine's read-only arrays go to mapped files (page cache); only what
            # the merge loop changes stays in RAM. The table in RAM is dropped here.
            phase("map words")
            tm = time.perf_counter()
            table = table.to_files(config.spill_dir or tempfile.gettempdir(), drop_singletons=config.method == "bpe")
            report["seconds"]["map_words"] = round(time.perf_counter() - tm, 3)
        if init is not None:
            extra["init"] = init
        result = method.train(config, table, merge_plan, progress=config.progress, **extra)
        extra.clear()
        del table
        if executor.remote:
            report["cluster"] = executor.describe()
    section = dict(result.report)
    report["seconds"].update(section.pop("seconds", {}))
    report.update(section)
    report["vocab_size_reached"] = len(result.vocab)
    report["seconds"]["total"] = round(time.perf_counter() - t_start, 3)
    report["memory"] = monitor.summary()
    budget.warn_exceeded(report["memory"], "training")     # the measured peak above the budget: one line
    report["peak_rss_bytes"] = {"tree_sampled": monitor.peak, **peak_rss_bytes()}
    model = Model(
        vocab=result.vocab,
        merges=result.merges,
        special_tokens=[s if isinstance(s, str) else s.decode("utf-8") for s in config.special_tokens],
        pattern=pattern,
        method=config.method,
        stages=result.stages,
        metadata={"input_bytes": size, "unique_pretokens": report["unique_pretokens"]},
    )
    if init is not None:
        report["init_from"] = model.metadata["init_from"] = init.info
    return TrainResult(model=model, report=report)


def _stage2_on_shards(config: TrainConfig, sources: list[Source]) -> bool:
    """SuperBPE on a cluster, or on URL inputs, reads many inputs twice without spooling them on this
    machine: its stage-2 units are counted over the same shards (``methods.superbpe.count_units_on``).
    That needs a separator between items (else the spooled corpus decides: it refuses several items)."""
    if config.method != "superbpe" or config.entropy_filter:
        return False
    if config.cluster is None and not any(s.is_url for s in sources):
        return False
    from .methods.superbpe import normal_split

    return normal_split(config.stage2_split) != "official" and bool(config.special_tokens)


def _announcer(progress):
    """Where the dashboard link goes: stderr, once, when progress is shown."""
    if progress in (False, None, "none"):
        return None
    return lambda line: print(line, file=sys.stderr, flush=True)


def train_bpe(input_path: str | os.PathLike, vocab_size: int, special_tokens: Sequence[str] = (),
              **options) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train a byte-level BPE tokenizer on a file (the CS336 assignment-1 interface).

    Args:
        input_path: the corpus: a text file (read as bytes, never loaded whole), or anything
            ``TrainConfig.input_path`` takes: compressed files, JSON Lines, Parquet, directories,
            glob patterns, a list of these, a ``datasets.Dataset`` (see ``docs/inputs.md``).
        vocab_size: 256 bytes + special tokens + merges.
        special_tokens: split out before pre-tokenization, never merged; ids 256, 257, ...
        **options: any other :class:`TrainConfig` field: ``pattern`` (``"gpt2"``, ``"cl100k"``,
            ``"o200k"`` or a regex), ``num_workers``, ``chunk_bytes``, ``memory_limit`` (bytes, or
            a size string such as ``"8G"``), ``min_pretoken_count``, ``spill_dir``, ``progress``,
            ``cluster`` (``"local:4"``, ``"tcp://host:8786"`` or a ``distributed.Client``: count on
            a Dask cluster, ``docs/cluster.md``; ``input_path`` may then be an fsspec URL).

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


def _describe_input(inputs: Any) -> Any:
    """The input as the report shows it: absolute path(s), or the type of an iterator."""
    if isinstance(inputs, str):
        return inputs if inputs == "-" or is_url(inputs) else os.path.abspath(inputs)
    if isinstance(inputs, (list, tuple)):
        return [_describe_input(p) if isinstance(p, str) else f"<{type(p).__name__}>" for p in inputs]
    return f"<{type(inputs).__name__}>"


def train_from_iterator(iterator: Any, vocab_size: int, special_tokens: Sequence[str] = (),
                        **options) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train on an iterator of documents (the shape Hugging Face ``tokenizers`` users know).

    Each item is one document: ``str`` (UTF-8, surrogateescape) or ``bytes``; an item that is a
    list or tuple is a batch of documents. The documents are joined by the first special token,
    exactly as the ``.txt`` holding them with separators (without special tokens they are kept
    apart: no pretoken or merge crosses two documents). The iterator is read once, in bounded
    memory; a method that reads the corpus twice (``superbpe``, ``supratok``) gets it written to a
    temp file under ``spill_dir`` first. A ``datasets.Dataset`` / ``IterableDataset`` is read by
    its ``text_column`` option (default ``"text"``).

    >>> vocab, merges = train_from_iterator(["low low low", "lower", b"lowest"], 260, ["<|endoftext|>"],
    ...                                     num_workers=1)
    >>> merges[:2], vocab[256]
    ([(b'o', b'w'), (b'l', b'ow')], b'<|endoftext|>')
    """
    if isinstance(iterator, (str, bytes, os.PathLike)):
        raise TypeError("train_from_iterator takes an iterator of documents; for a file use train_bpe(path)")
    if isinstance(iterator, (list, tuple)):
        iterator = iter(iterator)           # documents, not a list of paths
    return train_bpe(iterator, vocab_size, special_tokens, **options)
