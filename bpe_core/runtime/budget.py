"""The RAM budget as a plan: how many worker threads, how many bytes per chunk, whether to spill.

Everything here is arithmetic on a memory model, so tests check plans for any machine. The budget
covers the **resident memory of the process** (and of any child, as ``memmon.tree_rss`` measures
it): that is what a user's ``--memory-limit 8G`` means. Workers are threads of the one process
(``workers.run_ordered``): a worker's overhead is a thread's, :data:`WORKER_THREAD_OVERHEAD`.

Memory model of training (constants below; measured on ``en_heldout`` 12.6 MB and ``en_train``
230 MB with the GPT-2 pattern, see ``docs/memory.md``)::

    U(n)      unique pretokens in n bytes of text (Heaps' law, fitted, with a 1.25x margin):
              U(n) = 1.25 * 101,444 * (n / 12.6 MB) ** 0.6
              -> 12.6 MB: 127 k (measured 101 k); 230 MB: 724 k (513 k); 15 GB: 9.3 M
    T(u)      the sorted word table of u words: u * (10 B of bytes + 8 B offset + 8 B count)
    worker    overhead + 1.25 * chunk (the chunk read into RAM + scan buffers)
                       + 1 MiB + U(chunk) * 114 B (the chunk's counter: front cache, tables, keys)
    parent    overhead + 2 * (T(U(input)) + 8 * T(U(chunk)))     while counting: the merged table,
              up to 8 partial tables before a fold, and the output of the fold (hence 2x)
    merge     overhead + 2 * T(U(input)) + 32 MiB + U(input) * (200 + vocab_size / 200) B
              (engine: CSR symbols, pair map, pair -> words lists, heap; measured growth on
              en_heldout 27 / 47 MB, en_train 116 / 182 MB for vocab 8k / 32k; the model gives
              58 / 70 MB and 157 / 218 MB)

    peak = max(parent + workers * worker,  merge)      (workers == 1 counts in the parent)

A run with one worker counts in the calling thread. When the merged pretoken
table would not fit beside the workers, the plan spills: the parent keeps at most
``spill_threshold_bytes`` of table in RAM and writes sorted runs to disk beyond that.

Two checks, because ``U`` is known only after counting (a corpus that repeats itself has far fewer
unique pretokens than its size suggests, so an estimate must not refuse a run):

1. before any work, from the size: :class:`BudgetError` when counting cannot fit even with one
   worker, the smallest chunks and a spilled table; a merge phase estimated above the budget is a
   note (``Plan.merge_fits`` is False), not an error;
2. after counting, ``plan_training(..., unique_pretokens=n_words)`` with the real count:
   :class:`BudgetError` when the merge phase does not fit, before the engine is built. Either
   error names the smallest budget that works.

>>> p = plan_training(15 << 30, memory_limit=8 << 30, cpu_count=2, available=16 << 30,
...                   per_worker_overhead=48 << 20, parent_overhead=48 << 20, vocab_size=32000)
>>> p.num_workers, p.chunk_bytes >> 20, p.spill, p.peak_bytes < 8 << 30
(2, 64, False, True)
"""
from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from ..errors import BudgetError, BudgetWarning
from .procmem import ram_available, ram_total, self_rss

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# ==== Budget ================================================================================

DEFAULT_MEMORY_LIMIT = 8 * GiB
#: Share of the RAM available now that the default budget may use; the rest is left to the OS page
#: cache and other programs.
AVAILABLE_SHARE = 0.8
#: Where a plan's budget came from (``Plan.budget_source``).
BUDGET_FROM_FLAG = "flag"
BUDGET_FROM_DEFAULT = "default"
BUDGET_FROM_RAM = "RAM"
BUDGET_FROM_CGROUP = "cgroup"
_AUTO: Any = object()

# ==== Training model (see the module docstring) ============================================

#: Heaps' law for unique pretokens, fitted on en_heldout (12.6 MB: 101,444) and en_train
#: (230 MB: 513,605): exponent 0.56, rounded up; the margin covers corpora richer than English prose.
HEAPS_REF_BYTES = 12_613_005
HEAPS_REF_UNIQUE = 101_444
HEAPS_EXPONENT = 0.6
HEAPS_MARGIN = 1.25
#: Mean bytes of a unique pretoken (measured 7.8-8.2; rare words are longer).
WORD_BYTES = 10
#: Sorted word table: bytes + int64 offset + int64 count.
TABLE_BYTES_PER_WORD = WORD_BYTES + 16
#: A worker's per-chunk hash table of pretokens, per unique pretoken (entry, bytes, count), and the
#: sorted table it hands back while the hash table still exists: measured on 1 GB of the synthetic
#: corpus with 43 MiB chunks (74 B, the figure before, let the counting phase exceed a 400M budget
#: by 15 MiB).
CHUNK_TABLE_BYTES_PER_WORD = WORD_BYTES + 104
#: The counter's front cache (``_pretok.FRONT_SLOTS`` slots of 32 B), a fixed cost of a counting
#: worker on top of its table. With it, the short table (32 B slots, at most 3/4 full, from a slot
#: per 64 input bytes up to 8 MiB) and the sort keys, ``count_pretokens`` peaked at 12.0 MiB above
#: its input on en_heldout (101 k words; 10.9 before) and 26.0 MiB on 64 MB of en_train (277 k
#: words; 42.8 before, over this model's 38 MiB): inside ``U(chunk) * CHUNK_TABLE_BYTES_PER_WORD``
#: plus this.
COUNT_FRONT_BYTES = 1 * MiB
#: A worker holds its chunk's mapped pages plus scan buffers.
CHUNK_RSS_FACTOR = 1.25
#: The parent folds partial tables every this many results (``trainer.count_corpus``).
PARTIAL_TABLES = 8
#: Merge engine (``_engine.pyx``, see ``docs/memory.md``), measured on en_train (230 MB) and the
#: synthetic 1 GB and 15 GB corpora at 32k:
#: symbols (positions) per unique pretoken: 8.2, 9.2, 10.4 (used only before the real count is known).
SYMBOLS_PER_WORD = 11
ENGINE_BASE_BYTES = 32 * MiB
#: anonymous, per symbol: the cell (4 B), the positions added by merges (pool of blocks: 3.1 B at
#: 1 GB, 3.5-3.6 B at 15 GB; 3.7 with a margin) and the block index (4 B per 16 positions).
ENGINE_CELL_BYTES = 4.0
ENGINE_LIST_BYTES = 3.7
#: ... the pool at the end of a run past 32k merges: the first merges' big lists are merged and their
#: pages given back (``_engine_pool.pxi``), later lists are smaller; 15 GB synthetic: 2.55 B at 100k
#: (498 MiB), 1.92 at 200k (374 MiB); 2.9 with a margin.
ENGINE_LIST_END_BYTES = 2.9
ENGINE_BLOCK_BYTES = 1 / 4
#: read-only, per symbol: the initial position lists; per word: the word record (count, end).
ENGINE_BASE_LIST_BYTES = 4
ENGINE_WORD_BYTES = 12
#: pairs at the end of the merge loop: PAIRS_PER_SQRT_SYMBOL * sqrt(symbols) * (vocab / 32k) ** e, e = 0.5
#: below 32k and PAIRS_VOCAB_EXPONENT above (570 k at 4.2 M symbols, 1.51 M at 15.9 M, 5.72 M at 195 M
#: at 32k; 17.34 M at 195 M and 200k, where 0.5 gave 15.7 M and the merge loop held 1.08x the
#: budget it named), each with ENGINE_PAIR_BYTES of pair arrays, plus the pair map
#: (:func:`pair_map_slots`) and the heap (:data:`ENGINE_HEAP_ENTRIES`).
PAIRS_PER_SQRT_SYMBOL = 450
#: how the pairs grow with the vocabulary above 32k (5.72 M -> 17.34 M from 32k to 200k at 195 M
#: symbols is 6.25 ** 0.605; 0.65 leaves a margin: 20.7 M planned)
PAIRS_VOCAB_EXPONENT = 0.65
#: per pair: the record (key and count, 16 B), its list (offset, length, class: 13 B) and a mark
#: (1 B): 30 B, written as pairs come (``MergeEngine.reserve_pairs`` reserves their room once); 32 B
#: with a margin. (52 B before, with a step mark of 4 B and a heap entry of 12 B for every pair: a
#: build from bytes starts the heap's floor at 1, and the floor never rose; 60 B when the arrays and
#: the heap were copied to blocks a quarter larger as they grew, the old and the new together.)
ENGINE_PAIR_BYTES = 32
#: The heap holds the pairs near the top only: its floor goes up once it holds 1 M entries
#: (``MergeEngine._raise_floor``), and again at twice what it kept; 2 M entries of 12 B (24 MiB) at
#: most, with a margin (the 15 GB synthetic corpus at 200k: 196 MiB of entries before, one a pair).
ENGINE_HEAP_ENTRIES = 2 << 20
HEAP_ENTRY_BYTES = 12
#: The pair map (``_engine_pairmap.pxi``): 8 B slots (pair id and a tag of its key; the key is in the
#: pair's record) in 64 segments of at least 16 each, sized once
#: for the pairs the plan expects (``MergeEngine.reserve_pairs``: each segment for its share at 7/10
#: load, plus 4 standard deviations); a segment that fills up grows by half on its own, so the map is
#: never held twice (the single power-of-two table it replaced held its old and new slots together
#: when it doubled: 192 MiB more at 100k on the 15 GB corpus).
PAIR_SLOT_BYTES = 8
PAIR_MAP_MIN_SLOTS = 1024
PAIR_MAP_SEGMENTS = 64
#: The margin :func:`pairs_estimate` carries over the pairs measured (6.29 M planned for 5.72 M at
#: 32k, 13.2 M for 12.1 M at 100k); the engine reserves room for the estimate with it.
PAIRS_MARGIN = 1.1
DEFAULT_VOCAB_SIZE = 32000
#: The longest pretoken (text without whitespace: one word of the engine) costs, beyond the
#: per-symbol figures above, its bytes in the counted table and its copy (2 B per byte) and the two
#: shares' tables of the sites of one merge: ``NEAR_BYTES_PER_SITE`` per occurrence of its most
#: frequent byte pair (no later pair in the word occurs more often: a new pair holds the new token,
#: which occurs as often as the pair it was made of). 20 MB of ``a``: 20 M sites, 268 MiB of tables
#: (the plan said 376 MiB, the peak was 885 MiB); 50 MB of random letters: 18 k, nothing to speak of.
#: Negligible on ordinary text (pretokens of tens of bytes).
LONG_WORD_BYTES_PER_BYTE = 2
NEAR_BYTES_PER_SITE = 14
#: The bytes of the tokens merges build, beyond the engine's own figures, in the merge phase (the
#: engine's token table, the vocabulary, the merges), and while the model folder is written (the
#: model, and HF ``tokenizers`` loading ``tokenizer.json`` for its check: the file's text, its parsed
#: vocabulary and merges and the model built from them; the texts are written a slice of a token at
#: a time, ``formats.texts``). Measured (report's ``peak_anon_by_phase``, 31-36 merges): the merge
#: loop held 0.3-0.9 x the tokens' bytes over ``merge_bytes`` (20 MB of ``a``, of NUL, 50 MB of
#: ``a``); writing held 7.1-7.2 x for ``a`` (1.2 GB for 20 MB, 4.1 GB for 50 MB: 1 x in this process,
#: the rest in HF's load) and 11.5-12.4 x for NUL (2.0 GB for 20 MB): a byte whose GPT-2 character is not
#: printable ASCII is 2 bytes in the UTF-8 files and in HF's strings. Ordinary text builds a few MB
#: of tokens; a run of one repeated byte builds tokens as long as the run
#: (``methods.bpe.TokenBytesGuard`` stops the run when they outgrow the budget).
TOKEN_BYTES_MERGING = 1.5
TOKEN_BYTES_WRITING = 8
TOKEN_BYTES_WRITING_WIDE = 14
#: The bytes whose GPT-2 character is printable ASCII (itself): one byte in every text of the folder.
GPT2_NARROW_BYTES = bytes(range(0x21, 0x7F))
#: Old per-word figure, kept for reference: the engine before the compact layout (20 B per position).
ENGINE_BYTES_PER_WORD = 200
ENGINE_VOCAB_DIVISOR = 200
#: RAM for building the mapped initial position lists of the engine (in passes of this size) where the
#: plan gives no figure, or the build's pairs are not byte pairs (``build_fill_bytes``).
FILL_BUFFER_BYTES = 256 * MiB
#: The build's own per-pair arrays beside the fill buffer when its symbols are bytes (65,536 pairs at
#: most, ~120 B each: pair arrays grown a quarter at a time, the pair map, the count and fill vectors of
#: both threads; 7.5 MiB), its count by byte pair and fill cursors (4 MiB: ``MergeEngine(byte_count_min=)``),
#: with a margin. (The fill buffer itself is the pass's part of the mapped file, written in place: its
#: pages dirty page cache while the pass runs, counted as the buffer was.)
BUILD_PAIR_BYTES = 16 * MiB
#: Seconds per unit of work (2 cores shared with other jobs; for the plan's time column, not a
#: promise): pre-tokenizing and counting per input byte and worker, folding per unique pretoken,
#: building the engine per symbol, merging per symbol and merge.
SECONDS_PER_BYTE_COUNTED = 10.0e-9
SECONDS_PER_WORD_FOLDED = 1.8e-6
SECONDS_PER_SYMBOL_BUILT = 60e-9
SECONDS_PER_SYMBOL_MAPPED = 20e-9
SECONDS_PER_SYMBOL_MERGE = 0.45e-6      # at 32k merges; grows with the square root of the merges
#: Chunk sizes: at least MIN (or the whole input), at most MAX; about 4 chunks per worker.
MIN_CHUNK_BYTES = 1 * MiB
MAX_CHUNK_BYTES = 64 * MiB
CHUNKS_PER_WORKER = 4
#: Spilling keeps at least this much pretoken table in RAM (one sorted run).
MIN_SPILL_BYTES = 16 * MiB
#: Used only when no measurement is given and none can be made.
FALLBACK_OVERHEAD = 64 * MiB
#: What one more worker thread costs before its chunk: stack, scratch and allocator arenas.
WORKER_THREAD_OVERHEAD = 8 * MiB

# ==== Encoding model =======================================================================

#: Rank table, vocab and merges of a ``Tokenizer``, per vocabulary entry.
TOKENIZER_BYTES_PER_TOKEN = 256
#: ... plus the rank table's direct table of the 65,536 two-byte pairs (``RankTable.byte_ranks``).
RANK_TABLE_FIXED_BYTES = 256 * KiB
#: The encoder's pretoken -> ids cache (``_encode.Encoder``: 2**18 entries, ~96 B each).
ENCODE_CACHE_BYTES = 24 * MiB
#: ... and the corpus encoder's where the budget holds it (``Plan.cache_entries``): 2**20 entries, in
#: slots for 2**21 (64 MiB) and an arena of at most 16 MiB (``_encode.ARENA_MAX``). A cache that is
#: full is cleared whole, so on a long corpus the default one loses its common pretokens again and
#: again: on 1 GB of the growing-vocabulary corpus it merged 1.9% of the pretokens, twice the 0.9%
#: that first occur there, and the encode took 13-19% more CPU time than with this cache.
ENCODE_BIG_CACHE_ENTRIES = 1 << 20
ENCODE_BIG_CACHE_BYTES = 80 * MiB
#: ... for inputs of this size and more (a smaller one hardly fills the default cache: 60 MB of
#: en_train holds 268k distinct pretokens, and its workers share them out).
ENCODE_BIG_CACHE_MIN_INPUT = 256 * MiB
#: ... where the plan with it, with the chunks the default cache gets, stays within this share of
#: the budget: the rest is room for the page cache (the input read, the ids written), which a memory
#: cgroup charges too. 4 GB in a 512 MiB cgroup (budget 410 MiB, the plan at 409 MiB either way,
#: peak RSS 322-336 MiB against 268-271) took 18.8-22.7 s with the large cache and 12.6-13.1 s
#: without it; in 1 GiB (plan 552 of 819 MiB) 15 GB took 38.3-45.0 s with it and 50.1-50.3 without.
ENCODE_BIG_CACHE_SHARE = 0.75
#: Per-batch buffers (1 MiB of text -> piece ends int64, ids uint32, dtype copy).
ENCODE_BATCH_BYTES = 16 * MiB
#: The parent cuts chunks in a window of 2 chunks and copies spill files in 8 MiB blocks.
ENCODE_WINDOW_CHUNKS = 2
ENCODE_COPY_BYTES = 8 * MiB


_SIZE = re.compile(r"^[ \t]*([0-9]+(?:\.[0-9]+)?)[ \t]*([kmgtpe]?)(i?b?)[ \t]*$", re.IGNORECASE | re.ASCII)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50, "e": 1 << 60}
#: The largest size :func:`parse_size` takes: no machine holds 8 EiB, and larger numbers would wrap
#: in the kernels' 64-bit counters.
MAX_SIZE = 1 << 63


def parse_size(text: str | int) -> int:
    """Parse a byte size: ``"8G"``, ``"500M"``, ``"1.5GB"``, ``"2GiB"``, ``"4096"`` (binary units K, M,
    G, T, P, E; ASCII digits only, at most 8 EiB).

    >>> parse_size("8G"), parse_size("500M"), parse_size(1024), parse_size("1P") >> 50
    (8589934592, 524288000, 1024, 1)
    >>> parse_size("-1G")
    Traceback (most recent call last):
    ValueError: size -1G: a size must be positive (examples: 8G, 500M, 1.5GB)
    """
    if isinstance(text, int):
        return text
    shown = " ".join(str(text).split())[:40]
    m = _SIZE.match(str(text))
    if not m:
        if str(text).strip().startswith("-"):
            raise ValueError(f"size {shown}: a size must be positive (examples: 8G, 500M, 1.5GB)")
        raise ValueError(f"cannot parse size {shown!r} (examples: 8G, 500M, 1.5GB; ASCII digits, units "
                         f"K M G T P E)")
    from fractions import Fraction

    value = int(Fraction(m.group(1)) * _UNITS[m.group(2).lower()])
    if value > MAX_SIZE:
        raise ValueError(f"size {shown} is too large (more than 8 EiB, the most a 64-bit machine can address)")
    return value


# ==== Plan ==================================================================================


@dataclass(frozen=True)
class Plan:
    """A memory plan: what runs at once and what the model expects it to cost.

    Attributes:
        kind: ``"train"`` or ``"encode"``.
        input_bytes: size of the input.
        num_workers: worker processes (1: the work runs in the parent).
        chunk_bytes: target bytes per chunk.
        memory_limit: the budget, bytes of RSS of the whole process tree.
        available: ``psutil.virtual_memory().available`` when the plan was made.
        cpu_count: CPU cores seen.
        worker_overhead: RSS of an idle worker (interpreter, numpy, bpe_core).
        parent_overhead: RSS of the parent before the work.
        per_worker_bytes: estimated peak RSS of one worker.
        parent_bytes: estimated peak RSS of the parent while the workers run.
        count_bytes: estimated peak RSS of the tree while the workers run (parent + workers).
        merge_bytes: estimated peak RSS of the merge phase (training; 0 for encoding).
        peak_bytes: estimated peak RSS of the tree over the whole run; above ``memory_limit`` only
            when the merge phase is an estimate that does not fit (see ``merge_fits``).
        unique_pretokens: the estimate (or the given count) of unique pretokens (training).
        spill: the merged pretoken table is expected to outgrow ``spill_threshold_bytes``.
        spill_threshold_bytes: the most pretoken-table bytes the parent may hold in RAM while
            counting; beyond it, sorted runs go to disk (also when the estimate was too low).
        notes: remarks for the user (clamped options, budget above available RAM, ...).
        symbols: the (estimated or given) symbols the merge engine holds.
        merge_mapped: the merge phase keeps its read-only arrays (word table, word records,
            initial position lists) in mapped files, because in RAM it would not fit the budget;
            ``merge_bytes`` is then its anonymous memory and ``merge_file_bytes`` the mapped files
            (page cache: the kernel may drop those pages and read them again).
        fill_buffer_bytes: memory for writing the mapped initial position lists (the bytes of
            their file written in place in one pass: dirty page cache until written back).
        phase_seconds: predicted seconds of each phase (``phase_seconds()``).
        budget_source: where ``memory_limit`` came from: ``"flag"`` (given), or the default's
            binding part: ``"default"`` (8 GiB), ``"RAM"`` or ``"cgroup"`` (:func:`default_budget`).
        budget_why: the default's reason in words (empty for a given budget).
        cache_entries: encoding: the pretokens each encoder's cache may hold
            (``ENCODE_BIG_CACHE_ENTRIES`` for a long input where the plan with that cache, its
            workers and chunks unchanged, stays within ``ENCODE_BIG_CACHE_SHARE`` of the budget);
            0: the encoder's default.
    """

    kind: str
    input_bytes: int
    num_workers: int
    chunk_bytes: int
    memory_limit: int
    available: int
    cpu_count: int
    worker_overhead: int
    parent_overhead: int
    per_worker_bytes: int
    parent_bytes: int
    count_bytes: int
    merge_bytes: int
    peak_bytes: int
    unique_pretokens: int = 0
    spill: bool = False
    spill_threshold_bytes: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    symbols: int = 0
    merge_mapped: bool = False
    merge_file_bytes: int = 0
    fill_buffer_bytes: int = FILL_BUFFER_BYTES
    phase_seconds: dict = field(default_factory=dict)
    vocab_size: int = 0
    budget_source: str = BUDGET_FROM_FLAG
    budget_why: str = ""
    longest_pretoken: int = 0
    longest_pair_sites: int = 0
    cache_entries: int = 0

    def with_count(self, unique_pretokens: int, symbols: Optional[int] = None, longest_pretoken: int = 0,
                   longest_pair_sites: int = 0, parent_overhead: Optional[int] = None) -> "Plan":
        """This training plan made again with the real number of unique pretokens (known during and
        after counting) and, after counting, of the symbols the engine will hold; the workers and
        chunk size kept: the one budget check of a run (it also decides whether the merge phase
        maps its read-only arrays, ``merge_mapped``).

        ``parent_overhead``: what the process holds beside the counted table, measured after
        counting (``training.plan_merges``); the larger of it and the figure measured before
        counting is the merge phase's.

        Raises:
            BudgetError: the merge phase does not fit; the message names the budget that does.
        """
        po = self.parent_overhead if parent_overhead is None else max(self.parent_overhead, int(parent_overhead))
        return plan_training(self.input_bytes, self.memory_limit, self.cpu_count, self.available,
                             num_workers=self.num_workers, chunk_bytes=self.chunk_bytes,
                             per_worker_overhead=self.worker_overhead, parent_overhead=po,
                             vocab_size=self.vocab_size, unique_pretokens=unique_pretokens, symbols=symbols,
                             budget_source=(self.budget_source, self.budget_why), longest_pretoken=longest_pretoken,
                             longest_pair_sites=longest_pair_sites)

    @property
    def merge_fits(self) -> bool:
        """The merge phase fits the budget (by the estimate, when ``unique_pretokens`` was not given)."""
        return self.merge_bytes <= self.memory_limit

    @property
    def workers_bytes(self) -> int:
        """Estimated RSS of the workers together (0 when the work runs in the parent)."""
        return self.per_worker_bytes * self.num_workers if self.num_workers > 1 else 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (stored in run reports).

        >>> plan_encoding(1 << 20, 50257, 1 << 30, 2, 4 << 30, per_worker_overhead=1 << 26,
        ...               parent_overhead=1 << 26).to_dict()["num_workers"]
        1
        """
        # (a shallow copy: every field is a number, a string, the notes or a flat dict of numbers;
        # ``asdict``'s deep copy took 0.3 ms, 1 % of encoding 5 MB)
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["notes"] = list(self.notes)
        d["phase_seconds"] = dict(self.phase_seconds)
        d["merge_fits"] = self.merge_fits
        return d

    def describe(self) -> str:
        """The plan in a few lines for people (``--plan`` prints it).

        >>> print(plan_encoding(1 << 30, 50257, 1 << 30, 2, 4 << 30, per_worker_overhead=1 << 26,
        ...                     parent_overhead=1 << 26).describe().splitlines()[0])
        memory plan (encode 1.0 GiB): budget 1.0 GiB, 4.0 GiB available now, 2 CPU cores
        """
        lines = [f"memory plan ({self.kind} {fmt_bytes(self.input_bytes)}): budget "
                 f"{_limit_words(self.memory_limit, self.budget_source, self.budget_why)}, "
                 f"{fmt_bytes(self.available)} available now, "
                 f"{self.cpu_count} CPU core{'s' if self.cpu_count != 1 else ''}"]
        step = "pre-tokenize" if self.kind == "train" else "encode"
        if self.num_workers > 1:
            lines.append(f"  {step:<13} {self.num_workers} workers x {fmt_bytes(self.per_worker_bytes)} "
                         f"(overhead {fmt_bytes(self.worker_overhead)}, chunks of "
                         f"{fmt_bytes(self.chunk_bytes)}) + parent {fmt_bytes(self.parent_bytes)}")
        else:
            lines.append(f"  {step:<13} in the parent process, chunks of {fmt_bytes(self.chunk_bytes)}: "
                         f"{fmt_bytes(self.parent_bytes + self.per_worker_bytes - self.worker_overhead)}")
        if self.cache_entries:
            lines.append(f"  {'cache':<13} up to {self.cache_entries:,} pretokens a worker (a long input)")
        if self.kind == "train":
            mapped = (f"; {fmt_bytes(self.merge_file_bytes)} more in mapped files" if self.merge_mapped else "")
            lines.append(f"  {'merge':<13} {fmt_bytes(self.merge_bytes)} for ~{fmt_count(self.unique_pretokens)} "
                         f"unique pretokens (word table, engine{mapped})")
            table = self.unique_pretokens * TABLE_BYTES_PER_WORD
            if self.spill:
                lines.append(f"  {'spill':<13} yes: the pretoken table (~{fmt_bytes(table)}) goes to disk "
                             f"in sorted runs beyond {fmt_bytes(self.spill_threshold_bytes)}")
            else:
                lines.append(f"  {'spill':<13} no: pretoken table ~{fmt_bytes(table)}, spills only beyond "
                             f"{fmt_bytes(self.spill_threshold_bytes)}")
        share = self.peak_bytes / self.memory_limit if self.memory_limit else 0.0
        over = "" if self.peak_bytes <= self.memory_limit else ": OVER the budget, see the note"
        lines.append(f"  {'peak':<13} {fmt_bytes(self.peak_bytes)} estimated ({share:.0%} of the budget{over})")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


# ==== Budget and overhead ===================================================================


def default_memory_limit(available: Optional[int] = None) -> int:
    """The default budget: 8 GiB, or 80% of the RAM available now when that is less, or 80% of the
    memory cgroup's room when that is less still (:func:`default_budget`).

    >>> default_memory_limit(available=64 << 30) <= 8 << 30
    True
    """
    return default_budget(available)[0]


def default_budget(available: Optional[int] = None, cgroup: Any = _AUTO,
                   own_bytes: Optional[int] = None) -> tuple[int, str, str]:
    """The default budget, where it came from and why: ``(bytes, source, reason)``.

    The smallest of :data:`DEFAULT_MEMORY_LIMIT` (``"default"``), :data:`AVAILABLE_SHARE` of the RAM
    available now (``"RAM"``), and the same share of the room the memory cgroup leaves this process
    (``"cgroup"``: its limit less what other processes in it hold; ``cgroup.CgroupMemory``): a
    container's limit binds however much RAM the machine has, and a process beyond it is killed.

    ``cgroup``: a ``CgroupMemory``, None for none, or (the default) read from ``/proc`` now.
    ``own_bytes``: this process's resident memory (None: measured now).

    >>> from bpe_core.runtime.cgroup import CgroupMemory
    >>> default_budget(64 << 30, None)[:2]
    (8589934592, 'default')
    >>> default_budget(4 << 30, None)[0] >> 20, default_budget(4 << 30, None)[1]
    (3276, 'RAM')
    >>> b = default_budget(64 << 30, CgroupMemory(150 << 20, 0, 0, "/sys/fs/cgroup/job", 2), 0)
    >>> b[0] >> 20, b[1], b[2]
    (120, 'cgroup', '80% of the room in memory cgroup /sys/fs/cgroup/job (limit 150.0 MiB)')
    """
    if available is None:
        available = ram_available()
    choices = [(DEFAULT_MEMORY_LIMIT, BUDGET_FROM_DEFAULT, f"the default of {fmt_bytes(DEFAULT_MEMORY_LIMIT)}"),
               (int(AVAILABLE_SHARE * available), BUDGET_FROM_RAM,
                f"{AVAILABLE_SHARE:.0%} of the {fmt_bytes(available)} of RAM available")]
    if cgroup is _AUTO:
        from .cgroup import cgroup_memory

        own = _current_rss() if own_bytes is None else own_bytes
        cgroup = cgroup_memory(own)
    if cgroup is not None:
        own = (_current_rss() if own_bytes is None else own_bytes)
        choices.append((int(AVAILABLE_SHARE * cgroup.room(own)), BUDGET_FROM_CGROUP,
                        f"{AVAILABLE_SHARE:.0%} of the room in memory cgroup {cgroup.path} "
                        f"(limit {fmt_bytes(cgroup.limit)})"))
    return min(choices, key=lambda c: c[0])


def machine_limit(cgroup: Any = _AUTO, total: Optional[int] = None) -> tuple[int, str]:
    """The most memory this process could ever get: the RAM, or the memory cgroup's limit when
    that is less: ``(bytes, what)``.

    >>> from bpe_core.runtime.cgroup import CgroupMemory
    >>> machine_limit(None, 16 << 30)
    (17179869184, "this machine's 16.0 GiB of RAM")
    >>> machine_limit(CgroupMemory(1 << 30, 0, 0, "/sys/fs/cgroup/job", 2), 16 << 30)[1]
    'the 1.0 GiB limit of memory cgroup /sys/fs/cgroup/job'
    """
    if total is None:
        total = ram_total()
    if cgroup is _AUTO:
        from .cgroup import cgroup_memory

        cgroup = cgroup_memory()
    if cgroup is not None and cgroup.limit < total:
        return cgroup.limit, f"the {fmt_bytes(cgroup.limit)} limit of memory cgroup {cgroup.path}"
    return total, f"this machine's {fmt_bytes(total)} of RAM"


def over_machine(memory_limit: int, cgroup: Any = _AUTO, total: Optional[int] = None) -> Optional[str]:
    """A one-line warning when a budget is above what the process could ever get (the RAM or the
    memory cgroup's limit, :func:`machine_limit`); None when it is not.

    >>> print(over_machine(1 << 40, None, 23 << 30)[:60])
    --memory-limit 1.0 TiB is above this machine's 23.0 GiB of R
    >>> over_machine(1 << 30, None, 23 << 30) is None
    True
    """
    most, what = machine_limit(cgroup, total)
    if memory_limit <= most:
        return None
    return (f"--memory-limit {fmt_bytes(memory_limit)} is above {what}: the plan cannot keep the run "
            f"within what it can get (it may be killed or swap); give at most --memory-limit "
            f"{int(AVAILABLE_SHARE * most) // MiB}M")


def warn_over_machine(plan: "Plan") -> None:
    """Warn (:class:`BudgetWarning`, one line) when the plan's budget was given and is above the RAM
    or the cgroup's limit: on every run, not only with ``--plan``."""
    if plan.budget_source == BUDGET_FROM_FLAG:
        msg = over_machine(plan.memory_limit)
        if msg is not None:
            warnings.warn(BudgetWarning(msg), stacklevel=2)


def warn_exceeded(memory: dict, what: str = "the run") -> Optional[str]:
    """Warn (:class:`BudgetWarning`, one line) when a run's measured anonymous peak
    (``MemoryMonitor.summary()``: ``budget_exceeded``) was above its budget; returns the message."""
    if not memory.get("budget_exceeded"):
        return None
    peak, limit = int(memory["peak_anon_bytes"]), int(memory["budget_bytes"])
    phase_name = max((memory.get("peak_anon_by_phase") or {"?": 0}).items(), key=lambda kv: kv[1])[0]
    msg = (f"{what} held {fmt_bytes(peak)} of anonymous memory at its peak ({phase_name}), "
           f"{peak / limit:.2f}x its budget of {fmt_bytes(limit)}: the budget was exceeded (a container "
           f"this size would have killed it; docs/memory.md)")
    warnings.warn(BudgetWarning(msg), stacklevel=2)
    return msg


def measure_worker_overhead(start_method: Optional[str] = None) -> int:
    """The memory one more worker costs before its chunk: workers are threads of this process
    (``workers.run_ordered``), so this is a thread's stack and scratch buffers, a constant.

    >>> measure_worker_overhead() >> 20
    8
    """
    return WORKER_THREAD_OVERHEAD


def _current_rss() -> int:
    return self_rss()


# ==== Training ==============================================================================


def unique_pretokens_estimate(n_bytes: int) -> int:
    """Estimated unique pretokens in ``n_bytes`` of text (Heaps' law with a margin).

    >>> unique_pretokens_estimate(12_613_005)
    126805
    >>> unique_pretokens_estimate(0), unique_pretokens_estimate(100)
    (0, 100)
    """
    if n_bytes <= 0:
        return 0
    est = HEAPS_MARGIN * HEAPS_REF_UNIQUE * (n_bytes / HEAPS_REF_BYTES) ** HEAPS_EXPONENT
    return int(min(n_bytes, math.ceil(est)))


def symbols_estimate(n_words: int) -> int:
    """Symbols (positions) of ``n_words`` unique pretokens, before they are counted.

    >>> symbols_estimate(1_000_000)
    11000000
    """
    return max(0, n_words) * SYMBOLS_PER_WORD


def pairs_estimate(n_symbols: int, vocab_size: int = DEFAULT_VOCAB_SIZE) -> int:
    """Pairs the engine holds at the end of the merge loop (those that merges create included).

    >>> pairs_estimate(195_319_199) // 1000      # measured 5,718 k at 15 GB, 32k
    6289
    """
    if n_symbols <= 0:
        return 0
    ratio = max(0.25, vocab_size / DEFAULT_VOCAB_SIZE)
    scale = ratio ** (0.5 if ratio <= 1 else PAIRS_VOCAB_EXPONENT)
    return int(min(n_symbols, PAIRS_PER_SQRT_SYMBOL * math.sqrt(n_symbols) * scale))


def engine_memory(n_words: int, vocab_size: int = DEFAULT_VOCAB_SIZE, n_symbols: Optional[int] = None,
                  mapped: bool = False) -> dict[str, int]:
    """The merge engine's memory: ``{"anon": ..., "file": ...}`` bytes.

    ``mapped``: the read-only arrays (word records, initial position lists) live in mapped files
    (``file``, page cache) instead of RAM.

    >>> m = engine_memory(18_807_369, 32000, 195_319_199, mapped=True)
    >>> m["anon"] >> 20, m["file"] >> 20
    (1798, 960)
    """
    if n_words <= 0:
        return {"anon": 0, "file": 0}
    s = symbols_estimate(n_words) if n_symbols is None else int(n_symbols)
    # the list pool peaks in the first merges (beside the pairs of a 32k run at most) and is compacted
    # after (``_engine_pool.pxi``); the pair tables peak at the end: the larger of the two moments
    early = int(s * ENGINE_LIST_BYTES) + pair_tables_peak(pairs_estimate(s, min(vocab_size, DEFAULT_VOCAB_SIZE)))
    late = int(s * ENGINE_LIST_END_BYTES) + pair_tables_peak(pairs_estimate(s, vocab_size))
    anon = ENGINE_BASE_BYTES + int(s * (ENGINE_CELL_BYTES + ENGINE_BLOCK_BYTES)) + max(early, late)
    readonly = s * ENGINE_BASE_LIST_BYTES + n_words * ENGINE_WORD_BYTES
    return {"anon": anon, "file": readonly} if mapped else {"anon": anon + readonly, "file": 0}


#: A recorded pretoken (``count_corpus(record=)``: its row in the chunk's table) takes 4 B, and a
#: pretoken is at least one byte of text.
RECORD_BYTES_PER_TEXT_BYTE = 4
#: The record is kept only when its worst case is at most this share of the budget.
RECORD_BUDGET_SHARE = 1 / 8


def record_fits(text_bytes: int, memory_limit: int) -> bool:
    """Whether SuperBPE's counting pass surely keeps the row of every pretoken of ``text_bytes`` of
    text in RAM (``methods.superbpe.units_from_records``): its worst case, 4 B for every byte, at
    most an eighth of the budget (:func:`record_ram_bytes`), so it never decides whether a run fits
    (the plan does not count it); past that share the record goes to the spill folder.

    >>> record_fits(16 << 20, 512 << 20), record_fits((16 << 20) + 1, 512 << 20)
    (True, False)
    """
    return RECORD_BYTES_PER_TEXT_BYTE * int(text_bytes) <= int(memory_limit * RECORD_BUDGET_SHARE)


def record_ram_bytes(memory_limit: int) -> int:
    """How much of SuperBPE's and SupraTok's record of the pretokens the counting pass holds in RAM
    (``methods.record.PretokenRecord``): an eighth of the budget; the chunks past it go to the
    spill folder. ``record_fits`` says whether a text's worst case stays within it.

    >>> record_ram_bytes(512 << 20) >> 20
    64
    """
    return int(memory_limit * RECORD_BUDGET_SHARE)


def pair_map_slots(n_pairs: int) -> int:
    """Slots of the engine's pair map once room is made for ``n_pairs`` pairs (``_PairMap.reserve``:
    each of the 64 segments holds its share at most 7/10 full, with a margin of 4 standard deviations
    of a share; 16 slots a segment at least).

    >>> pair_map_slots(700), pair_map_slots(6_289_000), pair_map_slots(13_195_000)
    (2304, 9099072, 19016192)
    """
    share = max(0, n_pairs) / PAIR_MAP_SEGMENTS
    need = int((share + 4.0 * math.sqrt(share) + 1.0) * 10.0 / 7.0) + 1
    return PAIR_MAP_SEGMENTS * max(PAIR_MAP_MIN_SLOTS // PAIR_MAP_SEGMENTS, need)


def pair_tables_peak(n_pairs: int) -> int:
    """Peak bytes of the engine's per-pair tables (pair arrays, pair map, heap) on the way to
    ``n_pairs`` pairs (:func:`pairs_estimate`, with its margin): the engine makes room for that many
    before the merge loop (``MergeEngine.reserve_pairs``), so no table is copied to a larger one and
    the end is the peak: every pair's entries, the map as sized. 100k on the 15 GB synthetic corpus:
    12.1 M pairs; the power-of-two map before held 384 MiB, and 576 at the moment it doubled.

    >>> pair_tables_peak(6_289_000) >> 20, pair_tables_peak(13_195_000) >> 20   # 15 GB, 32k / 100k
    (285, 571)
    """
    heap = min(max(0, n_pairs), ENGINE_HEAP_ENTRIES) * HEAP_ENTRY_BYTES
    return int(n_pairs * ENGINE_PAIR_BYTES) + pair_map_slots(n_pairs) * PAIR_SLOT_BYTES + heap


def engine_bytes(n_words: int, vocab_size: int = DEFAULT_VOCAB_SIZE, n_symbols: Optional[int] = None) -> int:
    """Estimated RAM of the merge engine for ``n_words`` unique pretokens (all arrays in RAM).

    >>> engine_bytes(1_000_000, 32000) >> 20
    248
    """
    return engine_memory(n_words, vocab_size, n_symbols)["anon"]


def fill_buffer_bytes(n_symbols: int) -> int:
    """RAM for writing a mapped engine's initial position lists when nothing more is known: a quarter
    of them (four fill passes), 16-256 MiB.

    >>> fill_buffer_bytes(56_784_484) >> 20, fill_buffer_bytes(10**6) >> 20, fill_buffer_bytes(10**9) >> 20
    (54, 16, 256)
    """
    return int(min(FILL_BUFFER_BYTES, max(16 * MiB, n_symbols * ENGINE_BASE_LIST_BYTES // 4)))


def build_fill_bytes(n_symbols: int, engine_anon: int) -> int:
    """RAM for writing a mapped engine's initial position lists, in a build from byte symbols (``train``):
    what the merge loop's list pool and pair tables take later (``engine_anon`` less the cells, the
    block index and the fixed part), which the build does not hold yet (its pairs are byte pairs, at
    most 65,536: ``BUILD_PAIR_BYTES``), up to all the lists at once (one fill pass, a scan of the
    cells, instead of four), and never less than :func:`fill_buffer_bytes`. The build then holds the
    cells and this buffer: no more than the merge loop's figure, so the plan's anonymous peak is
    unchanged. 4 GB synthetic at 32k: 217 MiB of lists in one pass (was four of 54 MiB).

    >>> s = 56_784_484
    >>> build_fill_bytes(s, engine_memory(5_753_165, 32000, s, mapped=True)["anon"]) >> 20
    216
    """
    lists = n_symbols * ENGINE_BASE_LIST_BYTES
    room = engine_anon - ENGINE_BASE_BYTES - int(n_symbols * (ENGINE_CELL_BYTES + ENGINE_BLOCK_BYTES)) - BUILD_PAIR_BYTES
    return int(max(fill_buffer_bytes(n_symbols), min(lists, room)))


def merge_phase(n_words: int, vocab_size: int, n_symbols: Optional[int], parent_overhead: int,
                mapped: bool) -> dict[str, int]:
    """Peak memory of the merge phase: ``{"anon", "file", "fill"}`` bytes.

    In RAM: the word table twice (the counted table and its copy without one-byte words) beside the
    engine. Mapped: the table goes to files first (peak: the table in RAM while it is written), then
    the engine holds only what changes in RAM; ``fill`` is the buffer for writing the initial
    position lists, beside the cells.
    """
    s = symbols_estimate(n_words) if n_symbols is None else int(n_symbols)
    table = n_words * TABLE_BYTES_PER_WORD
    eng = engine_memory(n_words, vocab_size, s, mapped)
    if not mapped:
        return {"anon": parent_overhead + 2 * table + eng["anon"], "file": 0, "fill": 0}
    fill = build_fill_bytes(s, eng["anon"])
    building = int(s * (ENGINE_CELL_BYTES + ENGINE_BLOCK_BYTES)) + fill
    anon = parent_overhead + max(table, building, eng["anon"])
    return {"anon": anon, "file": eng["file"] + s + 16 * n_words, "fill": fill}


def phase_seconds(input_bytes: int, workers: int, n_words: int, n_symbols: Optional[int], vocab_size: int,
                  mapped: bool) -> dict[str, float]:
    """Predicted seconds of each training phase (a rough model, see the constants).

    >>> sorted(phase_seconds(10**9, 2, 1_700_000, None, 32000, False))
    ['build_words', 'merge_counts', 'merge_loop', 'pretokenize']
    """
    s = symbols_estimate(n_words) if n_symbols is None else int(n_symbols)
    merges = max(0, vocab_size - 257)
    build = s * (SECONDS_PER_SYMBOL_BUILT + (SECONDS_PER_SYMBOL_MAPPED if mapped else 0))
    return {"pretokenize": round(input_bytes * SECONDS_PER_BYTE_COUNTED / max(1, workers), 1),
            "merge_counts": round(n_words * SECONDS_PER_WORD_FOLDED, 1),
            "build_words": round(build, 1),
            "merge_loop": round(s * SECONDS_PER_SYMBOL_MERGE * (merges / 31743) ** 0.5, 1)}


def _train_worker(overhead: int, chunk: int) -> int:
    """Peak RSS of a counting worker: overhead + mapped chunk + the chunk's pretoken hash table (and
    the counter's front cache)."""
    return (overhead + int(CHUNK_RSS_FACTOR * chunk) + COUNT_FRONT_BYTES
            + unique_pretokens_estimate(chunk) * CHUNK_TABLE_BYTES_PER_WORD)


def _train_parent(overhead: int, chunk: int, table: int) -> int:
    """Peak RSS of the parent while counting: ``table`` bytes of merged table + partial tables, 2x."""
    partials = PARTIAL_TABLES * unique_pretokens_estimate(chunk) * TABLE_BYTES_PER_WORD
    return overhead + 2 * (table + partials)


def _train_count_peak(workers: int, chunk: int, table: int, wo: int, po: int) -> int:
    parent = _train_parent(po, chunk, table)
    if workers == 1:       # counted in the parent: its interpreter, not a second one
        return parent + _train_worker(0, chunk)
    return parent + workers * _train_worker(wo, chunk)


def _chunk_limits(input_bytes: int, workers: int) -> tuple[int, int]:
    """(smallest, preferred) chunk size for this input and worker count."""
    lo = max(1, min(MIN_CHUNK_BYTES, input_bytes))
    pref = min(MAX_CHUNK_BYTES, math.ceil(max(input_bytes, 1) / (CHUNKS_PER_WORKER * workers)))
    return lo, max(lo, min(pref, max(input_bytes, 1)))


def _largest_fitting(lo: int, hi: int, fits) -> Optional[int]:
    """The largest x in [lo, hi] with fits(x) (fits is monotone: true up to a point), or None."""
    if not fits(lo):
        return None
    if fits(hi):
        return hi
    while hi - lo > 1:              # fits(lo) and not fits(hi)
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _round_up_mib(n: int) -> int:
    return -(-n // MiB) * MiB


#: Added to the estimate when a refusal names a budget: the interpreter's own size varies a little
#: from run to run, and the budget we name must then work.
BUDGET_SLACK = 16 * MiB


def suggested_budget(need: int) -> int:
    """The budget a refusal names for an estimated need: rounded up to MiB, plus the slack.

    >>> suggested_budget(100 << 20) >> 20
    116
    """
    return _round_up_mib(need + BUDGET_SLACK)


def plan_training(input_bytes: int, memory_limit: Optional[int] = None, cpu_count: Optional[int] = None,
                  available: Optional[int] = None, num_workers: Optional[int] = None,
                  chunk_bytes: Optional[int] = None, per_worker_overhead: Optional[int] = None, *,
                  parent_overhead: Optional[int] = None, vocab_size: int = DEFAULT_VOCAB_SIZE,
                  unique_pretokens: Optional[int] = None, symbols: Optional[int] = None,
                  budget_source: Optional[tuple[str, str]] = None, longest_pretoken: int = 0,
                  longest_pair_sites: int = 0) -> Plan:
    """Plan a training run: workers, chunk size and spilling under ``memory_limit``.

    The merge phase must fit (it needs every unique pretoken in RAM). The counting phase then gets
    as many workers as fit (up to the cores, or ``num_workers``), each with a chunk as large as
    fits up to the preferred size (about 4 chunks per worker, at most 64 MiB). If even one worker
    with the smallest chunk does not fit beside the whole pretoken table, the table spills to disk.

    Args:
        input_bytes: corpus size.
        memory_limit: budget for the RSS of the process tree (None: :func:`default_memory_limit`).
        cpu_count: cores (None: ``os.cpu_count()``).
        available: ``psutil.virtual_memory().available`` (None: asked now).
        num_workers: the user's worker count, an upper bound (None: the cores).
        chunk_bytes: the user's chunk size, kept as given (None: planned).
        per_worker_overhead: RSS of an idle worker (None: :func:`measure_worker_overhead`).
        parent_overhead: RSS of the parent before the work (None: this process's RSS now).
        vocab_size: target vocabulary size (the engine grows with it).
        unique_pretokens: the real count when known (after counting); None: estimated from size.
        symbols: the symbols of those pretokens the engine holds, when known.

    The merge phase runs in RAM when that fits the budget; otherwise its read-only arrays go to
    mapped files (``merge_mapped``) and the budget covers its anonymous memory (``docs/memory.md``).

    Raises:
        BudgetError: the work cannot fit; the message and ``min_budget`` give the smallest budget
            that works.

    >>> plan_training(230 << 20, 2 << 30, 2, 8 << 30, per_worker_overhead=50 << 20,
    ...               parent_overhead=50 << 20).num_workers
    2
    >>> est = plan_training(15 << 30, 1 << 30, 2, 8 << 30, per_worker_overhead=50 << 20,
    ...                     parent_overhead=50 << 20)    # before counting: counting fits
    >>> est.merge_fits, est.merge_bytes >> 20
    (False, 1067)
    >>> try:                                            # after counting, with the real count
    ...     plan_training(15 << 30, 1 << 30, 2, 8 << 30, per_worker_overhead=50 << 20,
    ...                   parent_overhead=50 << 20, unique_pretokens=25_000_000)
    ... except BudgetError as e:
    ...     print(e.min_budget >> 20)
    2517
    """
    if input_bytes < 0:
        raise ValueError("input_bytes must be >= 0")
    notes: list[str] = []
    available = _available(available)
    memory_limit, source, why = _resolve_budget(memory_limit, available, budget_source)
    limit_words = _limit_words(memory_limit, source, why)
    cores = max(1, int(cpu_count or os.cpu_count() or 1))
    wo = int(measure_worker_overhead() if per_worker_overhead is None else per_worker_overhead)
    po = int(_current_rss() if parent_overhead is None else parent_overhead)
    if unique_pretokens is None:
        words = unique_pretokens_estimate(input_bytes)
    else:
        words = int(unique_pretokens)
    table = words * TABLE_BYTES_PER_WORD
    n_symbols = symbols_estimate(words) if symbols is None else int(symbols)
    # the longest pretoken, held whole, and the site tables of a merge inside it
    long_word = LONG_WORD_BYTES_PER_BYTE * int(longest_pretoken) + NEAR_BYTES_PER_SITE * int(longest_pair_sites)
    merge_phase_mem = merge_phase(words, vocab_size, n_symbols, po, mapped=False)
    mapped = merge_phase_mem["anon"] + long_word > memory_limit
    if mapped:
        merge_phase_mem = merge_phase(words, vocab_size, n_symbols, po, mapped=True)
    merge = merge_phase_mem["anon"] + long_word

    max_workers = cores
    if num_workers is not None:
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        if num_workers > cores:
            notes.append(f"{num_workers} workers asked for, {cores} cores: using at most {cores}")
        max_workers = min(num_workers, cores)
    if chunk_bytes is not None and chunk_bytes < 1:
        raise ValueError("chunk_bytes must be >= 1")

    def chunks_for(w: int) -> tuple[int, int]:
        if chunk_bytes is not None:
            return chunk_bytes, chunk_bytes
        return _chunk_limits(input_bytes, w)

    # 1. Can it fit at all? Counting always; the merge phase when the real count is given.
    exact = unique_pretokens is not None
    lo1, _ = chunks_for(1)
    spill_table = min(table, MIN_SPILL_BYTES)
    count_floor = _train_count_peak(1, lo1, spill_table, wo, po)
    if count_floor > memory_limit or (exact and merge > memory_limit):
        # Refused: name a budget for the whole run, so that one refusal is enough. Before counting,
        # the merge phase is an estimate (Heaps' law with a margin): if the corpus has more unique
        # pretokens than that, the run at the named budget counts and then refuses once more with
        # the exact figure (the check after counting).
        need = max(merge, count_floor)
        if exact or merge < count_floor:
            msg = _budget_message("training", input_bytes, memory_limit, need, merge, count_floor, words,
                                  vocab_size, limit_words, longest_pretoken if 2 * longest_pretoken > n_symbols else 0)
        else:
            msg = (f"memory limit {limit_words} is too small for training on "
                   f"{fmt_bytes(input_bytes)}: counting needs ~{fmt_bytes(count_floor)} with one worker and "
                   f"the smallest chunks, and the merge phase ~{fmt_bytes(merge)} for ~{fmt_count(words)} "
                   f"unique pretokens (estimated from the input size); the smallest budget that works is "
                   f"at least --memory-limit {fmt_size(suggested_budget(need))} (an estimate: with more unique "
                   f"pretokens or longer ones, a run at that budget stops when counting ends and names the "
                   f"exact figure)")
        raise BudgetError(msg + _beyond_cgroup(suggested_budget(need), source), suggested_budget(need))
    # Is there room for the whole table beside one worker with the smallest chunk? If not, spill.
    spill = _train_count_peak(1, lo1, table, wo, po) > memory_limit
    kept = spill_table if spill else table       # table bytes reserved while choosing workers

    # 2. As many workers as fit with their smallest chunk, at most one per chunk of the input.
    workers = max_workers
    while workers > 1:
        lo, _ = chunks_for(workers)
        if math.ceil(max(input_bytes, 1) / lo) >= workers and \
                _train_count_peak(workers, lo, kept, wo, po) <= memory_limit:
            break
        workers -= 1
    if workers < max_workers and num_workers is not None and num_workers <= cores:
        notes.append(f"{num_workers} workers asked for; the budget allows {workers}")

    # 3. The largest chunk up to the preferred size that still fits.
    lo, pref = chunks_for(workers)
    chunk = _largest_fitting(lo, pref, lambda c: _train_count_peak(workers, c, kept, wo, po) <= memory_limit)
    assert chunk is not None        # lo fits for `workers` by the loop above (or workers == 1)

    # 4. Whatever the workers leave is the parent's room for the pretoken table.
    rest = memory_limit - _train_count_peak(workers, chunk, 0, wo, po)
    threshold = max(spill_table, rest // 2)
    parent = _train_parent(po, chunk, min(table, threshold))
    per_worker = _train_worker(wo, chunk)
    count_peak = _train_count_peak(workers, chunk, min(table, threshold), wo, po)
    _note_available(notes, memory_limit, available, source if not exact else "")   # re-plans: no /proc reads
    if not exact and merge > memory_limit:
        notes.append(f"the merge phase is estimated at {fmt_bytes(merge)} (~{fmt_count(words)} unique "
                     f"pretokens), above the budget: unless the corpus has fewer unique pretokens than "
                     f"estimated, training stops after counting and names the budget it needs "
                     f"(--memory-limit {fmt_size(merge)})")
    elif not exact:
        notes.append("unique pretokens are estimated from the input size; re-plan with the real "
                     "count after counting")
    return Plan(kind="train", input_bytes=input_bytes, num_workers=workers, chunk_bytes=chunk,
                memory_limit=memory_limit, available=available, cpu_count=cores, worker_overhead=wo,
                parent_overhead=po, per_worker_bytes=per_worker, parent_bytes=parent, count_bytes=count_peak,
                merge_bytes=merge,
                peak_bytes=max(count_peak, merge), unique_pretokens=words, spill=spill,
                spill_threshold_bytes=threshold, notes=tuple(notes), symbols=n_symbols,
                merge_mapped=mapped, merge_file_bytes=merge_phase_mem["file"],
                fill_buffer_bytes=merge_phase_mem["fill"] or FILL_BUFFER_BYTES,
                phase_seconds=phase_seconds(input_bytes, workers, words, n_symbols, vocab_size, mapped),
                vocab_size=vocab_size, budget_source=source, budget_why=why, longest_pretoken=int(longest_pretoken),
                longest_pair_sites=int(longest_pair_sites))


def _budget_message(what: str, input_bytes: int, limit: int, need: int, merge: int, count: int,
                    words: int, vocab_size: int | None = None, limit_words: str | None = None,
                    longest: int = 0) -> str:
    """The one-line reason of a :class:`BudgetError`.

    The merge engine's tables grow with the unique pretokens and with the requested vocabulary, so a
    vocabulary the input cannot reach (each merge needs a pair that occurs, so there are at most as
    many merges as input bytes) is named as such rather than as a budget to buy.

    >>> _budget_message("training", 133_000, 8 << 30, 22 << 30, 22 << 30, 1 << 20, 5000, 10**9)[:96]
    'a vocabulary of 1,000,000,000 cannot be reached on 129.9 KiB of input (at most 133,000 merges ar'
    """
    if merge >= count and vocab_size is not None and vocab_size - 256 > input_bytes:
        return (f"a vocabulary of {vocab_size:,} cannot be reached on {fmt_bytes(input_bytes)} of input "
                f"(at most {input_bytes:,} merges are possible, one per input byte), and the merge phase "
                f"sizes its tables for the vocabulary asked for: ~{fmt_bytes(merge)} for "
                f"{fmt_count(words)} unique pretokens, above the memory limit of {fmt_bytes(limit)}; "
                f"ask for a smaller --vocab-size")
    if merge >= count and longest:
        why = (f"the merge phase needs ~{fmt_bytes(merge)}, much of it for the longest pretoken: "
               f"{longest:,} bytes without a break (no whitespace), which the merge engine holds whole")
    elif merge >= count:
        vocab = f"a vocabulary of {vocab_size:,} over " if vocab_size is not None else ""
        why = (f"the merge phase needs ~{fmt_bytes(merge)} (the merge tables for {vocab}"
               f"{fmt_count(words)} unique pretokens)")
    else:
        why = f"counting needs ~{fmt_bytes(count)} with one worker and the smallest chunks"
    return (f"memory limit {limit_words or fmt_bytes(limit)} is too small for {what} on {fmt_bytes(input_bytes)}: {why}; "
            f"the smallest budget that works is --memory-limit {fmt_size(suggested_budget(need))}")


# ==== Encoding ==============================================================================


def _encode_worker(overhead: int, vocab_size: int, chunk: int, cache: int = ENCODE_CACHE_BYTES) -> int:
    """Peak RSS of an encoding worker: tokenizer, pretoken cache, batch buffers, mapped chunk."""
    return (overhead + vocab_size * TOKENIZER_BYTES_PER_TOKEN + RANK_TABLE_FIXED_BYTES + cache
            + ENCODE_BATCH_BYTES + chunk)


def _encode_parent(overhead: int, vocab_size: int, chunk: int) -> int:
    """Peak RSS of the encoding parent: tokenizer, the cutting window, the copy buffer."""
    return (overhead + vocab_size * TOKENIZER_BYTES_PER_TOKEN + RANK_TABLE_FIXED_BYTES + ENCODE_WINDOW_CHUNKS * chunk
            + ENCODE_COPY_BYTES)


def _encode_peak(workers: int, vocab_size: int, chunk: int, wo: int, po: int, cache: int = ENCODE_CACHE_BYTES) -> int:
    parent = _encode_parent(po, vocab_size, chunk)
    if workers == 1:
        return parent + _encode_worker(0, vocab_size, chunk, cache)
    return parent + workers * _encode_worker(wo, vocab_size, chunk, cache)


def plan_encoding(input_bytes: int, vocab_size: int, memory_limit: Optional[int] = None,
                  cpu_count: Optional[int] = None, available: Optional[int] = None,
                  num_workers: Optional[int] = None, per_worker_overhead: Optional[int] = None, *,
                  parent_overhead: Optional[int] = None, chunk_bytes: Optional[int] = None,
                  budget_source: Optional[tuple[str, str]] = None) -> Plan:
    """Plan corpus encoding: workers and chunk size under ``memory_limit``.

    Model (``encode_corpus``: workers map their chunk and encode it in 1 MiB batches to a spill
    file; the parent cuts chunks in a window and copies the spill files into the ``.npy``)::

        worker = overhead + vocab_size * 256 B + cache 24 MiB + batches 16 MiB + chunk
        (cache 80 MiB, 2**20 entries: from 256 MiB of input, where the peak with it stays
        within three quarters of the budget)
        parent = overhead + vocab_size * 256 B + 2 * chunk + 8 MiB
        peak   = parent + workers * worker            (workers == 1 encodes in the parent)

    Raises:
        BudgetError: even one worker with the smallest chunk does not fit.

    >>> p = plan_encoding(4 << 30, 32000, 1 << 30, 8, 16 << 30, per_worker_overhead=50 << 20,
    ...                   parent_overhead=50 << 20)
    >>> p.num_workers, p.chunk_bytes >> 20, p.peak_bytes <= 1 << 30
    (8, 17, True)
    """
    if input_bytes < 0:
        raise ValueError("input_bytes must be >= 0")
    notes: list[str] = []
    available = _available(available)
    memory_limit, source, why = _resolve_budget(memory_limit, available, budget_source)
    limit_words = _limit_words(memory_limit, source, why)
    cores = max(1, int(cpu_count or os.cpu_count() or 1))
    wo = int(measure_worker_overhead() if per_worker_overhead is None else per_worker_overhead)
    po = int(_current_rss() if parent_overhead is None else parent_overhead)
    max_workers = cores
    if num_workers is not None:
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        if num_workers > cores:
            notes.append(f"{num_workers} workers asked for, {cores} cores: using at most {cores}")
        max_workers = min(num_workers, cores)

    def chunks_for(w: int) -> tuple[int, int]:
        if chunk_bytes is not None:
            return chunk_bytes, chunk_bytes
        return _chunk_limits(input_bytes, w)

    lo1, _ = chunks_for(1)
    need = _encode_peak(1, vocab_size, lo1, wo, po)
    if need > memory_limit:
        raise BudgetError(f"memory limit {limit_words} is too small for encoding "
                          f"{fmt_bytes(input_bytes)} with a {vocab_size:,}-token vocabulary; the smallest "
                          f"budget that works is --memory-limit {fmt_size(suggested_budget(need))}"
                          + _beyond_cgroup(suggested_budget(need), source), suggested_budget(need))
    workers = max_workers
    while workers > 1:
        lo, _ = chunks_for(workers)
        if math.ceil(max(input_bytes, 1) / lo) >= workers and \
                _encode_peak(workers, vocab_size, lo, wo, po) <= memory_limit:
            break
        workers -= 1
    if workers < max_workers and num_workers is not None and num_workers <= cores:
        notes.append(f"{num_workers} workers asked for; the budget allows {workers}")
    lo, pref = chunks_for(workers)
    chunk = _largest_fitting(lo, pref, lambda c: _encode_peak(workers, vocab_size, c, wo, po) <= memory_limit)
    assert chunk is not None        # lo fits for `workers` by the loop above (or workers == 1)
    # a long input: the large cache where these workers and chunks hold it within a share of the
    # budget (never a worker fewer or a smaller chunk for it)
    cache, cache_entries = ENCODE_CACHE_BYTES, 0
    if input_bytes >= ENCODE_BIG_CACHE_MIN_INPUT and _encode_peak(
            workers, vocab_size, chunk, wo, po, ENCODE_BIG_CACHE_BYTES) <= ENCODE_BIG_CACHE_SHARE * memory_limit:
        cache, cache_entries = ENCODE_BIG_CACHE_BYTES, ENCODE_BIG_CACHE_ENTRIES
    _note_available(notes, memory_limit, available, source)
    peak = _encode_peak(workers, vocab_size, chunk, wo, po, cache)
    return Plan(kind="encode", input_bytes=input_bytes, num_workers=workers, chunk_bytes=chunk,
                memory_limit=memory_limit, available=available, cpu_count=cores, worker_overhead=wo,
                parent_overhead=po, per_worker_bytes=_encode_worker(wo, vocab_size, chunk, cache),
                parent_bytes=_encode_parent(po, vocab_size, chunk), count_bytes=peak, merge_bytes=0,
                peak_bytes=peak, vocab_size=vocab_size,
                notes=tuple(notes), budget_source=source, budget_why=why, cache_entries=cache_entries)


#: Encoding holds, per byte of a pretoken merged at once (``_encode`` ``_merge_heap``: ids, pair
#: ranks, two links, heap entries, the output), up to this many bytes: 50 MB of letters without
#: whitespace (one pretoken) held 1.76 GiB (37 B per byte).
ENCODE_LONG_PIECE_BYTES = 40


#: Counting (training) holds a chunk it cannot cut about 3 times (the block read, the pretoken's
#: bytes in the chunk's table, the table in the parent): 50 MB of letters peaked at 123 MB.
COUNT_LONG_PIECE_BYTES = 3


def _refuse_uncut_counting(plan: Plan, name: str, start: int, end: int) -> None:
    """:func:`check_uncut` for training: the stretch does not fit the counting phase."""
    n = end - start
    need = plan.count_bytes + COUNT_LONG_PIECE_BYTES * n
    raise BudgetError(f"{name}: bytes {start:,}-{end:,} have no place to cut (no whitespace or newline: one "
                      f"pretoken, or text such as minified JSON); counting them at once may need "
                      f"~{fmt_bytes(COUNT_LONG_PIECE_BYTES * n)} beside the plan's {fmt_bytes(plan.count_bytes)}, "
                      f"over the memory limit of {fmt_bytes(plan.memory_limit)}; the smallest budget that works is "
                      f"at least --memory-limit {fmt_size(suggested_budget(need))} (counting only: the merge phase "
                      f"is planned when counting ends, and one pretoken that long needs more)",
                      suggested_budget(need))


def check_uncut(plan: Plan, stretches: list[tuple[str, int, int]]) -> None:
    """Refuse, before encoding, a stretch of text that could not be cut into chunks and is too long
    for the budget. ``stretches``: ``(name, start, end)`` of the chunks the cutter made (byte ranges
    of plain files). Chunks are cut only where no pretoken crosses (``corpus.chunks``), so a chunk
    much longer than ``plan.chunk_bytes`` is a stretch without whitespace or newline: it may be one
    pretoken, which the encoder merges whole (``ENCODE_LONG_PIECE_BYTES`` per byte). When that does
    not fit beside the plan, one :class:`BudgetError` names the stretch and a budget that holds it.

    >>> p = plan_encoding(60 << 20, 50257, 500 << 20, 2, 8 << 30, per_worker_overhead=8 << 20,
    ...                   parent_overhead=60 << 20)
    >>> check_uncut(p, [("let.txt", 0, 1 << 20)])        # an ordinary chunk: nothing to say
    >>> try:
    ...     check_uncut(p, [("let.txt", 0, 50_000_000)])
    ... except BudgetError as e:
    ...     print(str(e)[:63])
    let.txt: bytes 0-50,000,000 have no place to cut (no whitespace
    """
    if not stretches:
        return
    name, start, end = max(stretches, key=lambda t: t[2] - t[1])
    n = end - start
    if n <= 2 * max(plan.chunk_bytes, 1):
        return
    per_byte = COUNT_LONG_PIECE_BYTES if plan.kind == "train" else ENCODE_LONG_PIECE_BYTES
    base = plan.count_bytes if plan.kind == "train" else plan.peak_bytes
    if base + per_byte * n <= plan.memory_limit:
        return
    # The budget to name: a larger budget plans more workers and larger chunks, so name the one
    # that holds the stretch beside the largest plan (all cores, the largest chunks): any budget from
    # there up works (the plan's peak stops growing), the run at the named budget included.
    if plan.kind == "train":
        _refuse_uncut_counting(plan, name, start, end)
    largest = plan_encoding(plan.input_bytes, plan.vocab_size, 1 << 50, plan.cpu_count, plan.available,
                            per_worker_overhead=plan.worker_overhead, parent_overhead=plan.parent_overhead)
    need = max(plan.peak_bytes, largest.peak_bytes) + ENCODE_LONG_PIECE_BYTES * n
    raise BudgetError(f"{name}: bytes {start:,}-{end:,} have no place to cut (no whitespace or newline: one "
                      f"pretoken, or text such as minified JSON); encoding them at once may need "
                      f"~{fmt_bytes(ENCODE_LONG_PIECE_BYTES * n)} beside the plan's {fmt_bytes(plan.peak_bytes)}, "
                      f"over the memory limit of {fmt_bytes(plan.memory_limit)}; the smallest budget that works is "
                      f"--memory-limit {fmt_size(suggested_budget(need))}", suggested_budget(need))


def refuse_memory_folder(folder: str, what: str = "the spill folder") -> None:
    """Raise :class:`BudgetError` (one line) when ``folder`` is on tmpfs or ramfs: files there are
    memory (charged to the memory cgroup, never written back), so spilling there to stay within the
    budget would not (a 300M run spilling to a tmpfs --spill-dir peaked at 1.15x its budget).
    Called when a run is about to spill, not before: a run that never spills may use any folder."""
    from .cgroup import in_memory_folder

    if in_memory_folder(folder):
        raise BudgetError(f"{folder}: {what} is on tmpfs (its files are memory): the run must spill to keep "
                          f"within --memory-limit, and spilling there would not; give --spill-dir a folder on "
                          f"disk (or TMPDIR), or a larger --memory-limit", 0)


# ==== Miscellaneous =========================================================================


def _resolve_budget(memory_limit: Optional[int], available: int,
                    given: Optional[tuple[str, str]]) -> tuple[int, str, str]:
    """``(budget, source, reason)``: the given budget (``"flag"``), or :func:`default_budget`."""
    if memory_limit is not None:
        source, why = given if given is not None else (BUDGET_FROM_FLAG, "")
        return int(memory_limit), source, why
    return default_budget(available)


def _beyond_cgroup(budget: int, source: str, cgroup: Any = _AUTO) -> str:
    """What a refusal adds when the default came from the memory cgroup and the budget it names is
    above the cgroup's limit: a flag alone cannot help then.

    >>> from bpe_core.runtime.cgroup import CgroupMemory
    >>> _beyond_cgroup(190 << 20, "cgroup", CgroupMemory(150 << 20, 0, 0, "/sys/fs/cgroup/job", 2))
    ', above the 150.0 MiB limit of memory cgroup /sys/fs/cgroup/job: give the job more memory'
    >>> _beyond_cgroup(140 << 20, "cgroup", CgroupMemory(150 << 20, 0, 0, "/sys/fs/cgroup/job", 2))
    ''
    """
    if source != BUDGET_FROM_CGROUP:
        return ""
    if cgroup is _AUTO:
        from .cgroup import cgroup_memory

        cgroup = cgroup_memory()
    if cgroup is None or budget <= cgroup.limit:
        return ""
    return f", above the {fmt_bytes(cgroup.limit)} limit of memory cgroup {cgroup.path}: give the job more memory"


def _limit_words(limit: int, source: str, why: str) -> str:
    """The budget for people, with where a default came from: ``120.0 MiB (the default: 80% of ...)``.

    >>> _limit_words(1 << 30, "flag", ""), _limit_words(1 << 30, "RAM", "80% of the RAM")
    ('1.0 GiB', '1.0 GiB (the default: 80% of the RAM)')
    """
    if source == BUDGET_FROM_FLAG or not why:
        return fmt_bytes(limit)
    return f"{fmt_bytes(limit)} (the default: {why})"


def _available(available: Optional[int]) -> int:
    if available is not None:
        return int(available)
    return ram_available()


def _note_available(notes: list[str], limit: int, available: int, source: str = BUDGET_FROM_FLAG) -> None:
    machine = over_machine(limit) if source == BUDGET_FROM_FLAG else None
    if machine is not None:
        notes.append(machine)
    if limit > available:
        notes.append(f"the budget ({fmt_bytes(limit)}) is above the RAM available now "
                     f"({fmt_bytes(available)}): the system may swap")


def fmt_bytes(n: int) -> str:
    """Bytes for people, binary units.

    >>> fmt_bytes(512), fmt_bytes(3 << 20), fmt_bytes(int(1.5 * 2**30))
    ('512 B', '3.0 MiB', '1.5 GiB')
    """
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def fmt_size(n: int) -> str:
    """A size ``parse_size`` reads back, rounded up to whole MiB: ``6345M``.

    >>> fmt_size(1), fmt_size(3 << 20)
    ('1M', '3M')
    """
    return f"{_round_up_mib(n) // MiB}M"


def fmt_count(n: int) -> str:
    """``1234567 -> '1.2 M'``.

    >>> fmt_count(950), fmt_count(152_166), fmt_count(10_700_000)
    ('950', '152 k', '10.7 M')
    """
    if n >= 1_000_000:
        return f"{n / 1e6:.1f} M"
    if n >= 1_000:
        return f"{n / 1e3:.0f} k"
    return str(n)


__all__ = ["BudgetError", "Plan", "default_memory_limit", "engine_bytes", "fmt_bytes", "fmt_size",
           "measure_worker_overhead", "plan_encoding", "plan_training", "unique_pretokens_estimate"]
