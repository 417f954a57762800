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

import multiprocessing as mp
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import corpus
from ._engine import MergeEngine
from .config import TrainConfig
from .model_io import Model
from .patterns import encode_specials, resolve_pattern
from .wordtable import WordTable

DEFAULT_CHUNK_BYTES = 32 << 20


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


def _count_chunk(task: tuple) -> tuple:
    """Worker: count the pretokens of ``path[start:end)``; returns (arena, offsets, counts, n_specials)."""
    from .pretokenize import count_pretokens

    path, start, end, specials, pattern = task
    buf = corpus.open_corpus(path)
    spans, n_specials = corpus.split_spans(buf, start, end, specials)
    arena, offsets, counts = count_pretokens(buf, spans, pattern)
    return arena, offsets, counts, n_specials, end - start


def _mp_context():
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


def count_corpus(path: str, specials: Sequence[bytes], pattern: str, num_workers: int,
                 chunk_bytes: int, progress: bool = False, report: Optional[dict] = None) -> WordTable:
    """Count the pretokens of a whole file into one sorted word table."""
    from .pretokenize import merge_counts

    buf = corpus.open_corpus(path)
    t0 = time.perf_counter()
    bounds = corpus.chunk_boundaries(buf, chunk_bytes, specials, pattern)
    tasks = [(path, s, e, list(specials), pattern) for s, e in zip(bounds[:-1], bounds[1:]) if e > s]
    del buf
    if report is not None:
        report["n_chunks"] = len(tasks)
        report["seconds"]["plan"] = round(time.perf_counter() - t0, 3)
    bar = _bar(progress, total=sum(t[2] - t[1] for t in tasks), desc="pre-tokenize", unit="B",
               unit_scale=True)
    tables: list[tuple] = []
    n_docs_sep = 0
    t1 = time.perf_counter()
    merge_seconds = 0.0

    def absorb(result):
        nonlocal n_docs_sep, tables, merge_seconds
        arena, offsets, counts, n_sp, n_bytes = result
        n_docs_sep += n_sp
        tables.append((arena, offsets, counts))
        if len(tables) >= 8:       # keep the parent's memory bounded: fold partial tables as we go
            tm = time.perf_counter()
            tables = [merge_counts(tables)]
            merge_seconds += time.perf_counter() - tm
        if bar is not None:
            bar.update(n_bytes)

    if num_workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            absorb(_count_chunk(task))
    else:
        with _mp_context().Pool(min(num_workers, len(tasks))) as pool:
            for result in pool.imap_unordered(_count_chunk, tasks):
                absorb(result)
    if bar is not None:
        bar.close()
    tm = time.perf_counter()
    table = WordTable.from_arrays(merge_counts(tables)) if tables else WordTable.empty()
    merge_seconds += time.perf_counter() - tm
    if report is not None:
        report["seconds"]["pretokenize"] = round(time.perf_counter() - t1 - merge_seconds, 3)
        report["seconds"]["merge_counts"] = round(merge_seconds, 3)
        report["special_token_occurrences"] = n_docs_sep
    return table


# ==== Training =============================================================================


def _bar(enabled: bool, **kwargs):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(file=sys.stderr, dynamic_ncols=True, **kwargs)


def peak_rss_bytes() -> dict[str, int]:
    """Peak resident memory of this process and of its largest finished child (Linux: KiB units)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return {
        "self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
        "largest_child": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale,
    }


def train_words(table: WordTable, vocab_size: int, special_tokens: Sequence[str | bytes] = (),
                progress: bool = False, allowed: Optional[Callable[[bytes, bytes], bool]] = None,
                report: Optional[dict] = None) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Run the merge loop on a word table; return ``(vocab, merges)``."""
    specials = encode_specials(special_tokens)
    n_merges = vocab_size - 256 - len(specials)
    t0 = time.perf_counter()
    table = table.without_singletons()
    engine = MergeEngine(table.symbols(), table.offsets, table.counts, [bytes([i]) for i in range(256)])
    t1 = time.perf_counter()
    bar = _bar(progress, total=n_merges, desc="merges", unit="merge")
    last = [0]

    def tick(done):
        if bar is not None:
            bar.update(done - last[0])
            last[0] = done

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
        report["merges"] = len(merges)
        report["merges_requested"] = max(n_merges, 0)
    return vocab, merges


def train(config: TrainConfig) -> TrainResult:
    """Train from a :class:`TrainConfig`; returns the model and a run report."""
    t_start = time.perf_counter()
    pattern = resolve_pattern(config.pattern)
    specials = encode_specials(config.special_tokens)
    size = corpus.check_input(config.input_path)
    num_workers = config.num_workers or os.cpu_count() or 1
    chunk_bytes = config.chunk_bytes or max(1 << 20, min(DEFAULT_CHUNK_BYTES, size // (4 * num_workers) + 1))
    report: dict[str, Any] = {
        "input_path": os.path.abspath(config.input_path),
        "input_bytes": size,
        "vocab_size": config.vocab_size,
        "special_tokens": list(config.special_tokens),
        "pattern": pattern,
        "num_workers": num_workers,
        "chunk_bytes": chunk_bytes,
        "seconds": {},
    }
    table = count_corpus(config.input_path, specials, pattern, num_workers, chunk_bytes,
                         progress=config.progress, report=report)
    report["unique_pretokens"] = table.n_words
    report["pretokens"] = int(table.counts.sum())
    # Documents: text separated by special tokens (an empty input has none).
    report["documents"] = report["special_token_occurrences"] + 1 if size else 0
    vocab, merges = train_words(table, config.vocab_size, config.special_tokens,
                                progress=config.progress, report=report)
    report["vocab_size_reached"] = len(vocab)
    report["seconds"]["total"] = round(time.perf_counter() - t_start, 3)
    report["peak_rss_bytes"] = peak_rss_bytes()
    model = Model(
        vocab=vocab,
        merges=merges,
        special_tokens=[s if isinstance(s, str) else s.decode("utf-8") for s in config.special_tokens],
        pattern=pattern,
        method="bpe",
        stages=[{"name": "bpe", "merges": len(merges)}],
        metadata={"input_bytes": size, "unique_pretokens": table.n_words},
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
            ``"o200k"`` or a regex), ``num_workers``, ``chunk_bytes``, ``memory_limit``,
            ``progress``.

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
