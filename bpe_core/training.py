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

import os
import resource
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import methods  # noqa: F401  (registers the methods)
from .config import TrainConfig
from .corpus import check_input, encode_specials, warn_if_binary
from .errors import BinaryInputWarning, BudgetError
from .formats import registry
from .formats.model import Model
from .methods.curate import curated_config
from .methods.init_from import load_init
from .pretok.counting import count_corpus
from .pretok.patterns import resolve_pattern
from .runtime import budget
from .runtime.memmon import MemoryMonitor, phase

__all__ = ["TrainResult", "plan", "train", "train_bpe"]


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


def plan(config: TrainConfig) -> budget.Plan:
    """The memory plan of a run (workers, chunk size, spilling) before any work.

    Raises:
        errors.BudgetError: the run cannot fit ``config.memory_limit``.
    """
    size = check_input(config.input_path)
    # Workers are threads running nogil kernels: more of them than cores only adds memory, so a
    # larger --workers is capped at the cores (the plan's notes say so).
    return budget.plan_training(size, config.memory_limit, os.cpu_count() or 1, None,
                                num_workers=config.num_workers, chunk_bytes=config.chunk_bytes,
                                vocab_size=config.vocab_size)


def train(config: TrainConfig) -> TrainResult:
    """Train from a :class:`TrainConfig`; returns the model and a run report."""
    if config.entropy_filter:            # curate the input first (methods/curate.py), then train on it
        check_input(config.input_path)
        warn_if_binary(config.input_path)           # about the user's file, not the temp copy
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
    size = check_input(config.input_path)
    warn_if_binary(config.input_path)
    init = load_init(config)        # --init-from: checked before any work (None without it)
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
        if n_words * budget.TABLE_BYTES_PER_WORD < the_plan.memory_limit // 8 or config.min_pretoken_count > 1:
            return          # far from the limit (cheap check first); pruning decides after counting
        try:
            the_plan.with_count(n_words)
        except BudgetError as exc:
            raise BudgetError(f"stopped while counting: {n_words:,} unique pretokens so far already need more "
                              f"than the budget; {exc}", exc.min_budget) from None

    with MemoryMonitor(interval=0.05, budget=the_plan.memory_limit) as monitor:
        table = count_corpus(config.input_path, specials, pattern, the_plan.num_workers, the_plan.chunk_bytes,
                             progress=config.progress, report=report, monitor=monitor,
                             memory_limit=the_plan.memory_limit, per_worker_bytes=the_plan.per_worker_bytes,
                             spill_threshold_bytes=the_plan.spill_threshold_bytes or None,
                             spill_dir=config.spill_dir, check_words=check_words)
        report["unique_pretokens"] = table.n_words
        report["pretokens"] = int(table.counts.sum())
        if config.min_pretoken_count > 1:
            table = table.at_least(config.min_pretoken_count)
            report["unique_pretokens_kept"] = table.n_words
        the_plan.with_count(table.n_words)      # the merge phase needs the whole table: check it now
        # Documents: text separated by special tokens (an empty input has none).
        report["documents"] = report["special_token_occurrences"] + 1 if size else 0
        result = method.train(config, table, the_plan, progress=config.progress,
                              **({"init": init} if init is not None else {}))
        del table
    section = dict(result.report)
    report["seconds"].update(section.pop("seconds", {}))
    report.update(section)
    report["vocab_size_reached"] = len(result.vocab)
    report["seconds"]["total"] = round(time.perf_counter() - t_start, 3)
    report["memory"] = monitor.summary()
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
