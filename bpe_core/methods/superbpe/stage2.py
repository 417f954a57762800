"""Stage 2's merges on pieces of its units (:func:`stage2_merges`): the pair sketch, the cuts and
their restarts, the engine on the deduplicated pieces; and how much stage 2 may take (its budget
share, the sample fraction, the sketch's size)."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ...engine.merge import MergeEngine, huge_pages, run_legs
from ...engine.units import (RankMerger, SKETCH_MAX, cut_pieces_parts, pair_counts, pair_sketch, pair_sketch_parts,
                             sketch_bounds, unit_halves)
from ...errors import InternalError
from ...runtime.memmon import numpy_huge_pages, phase
from ...runtime.workers import release_free_memory

#: Bytes of RAM per stage-1 token of the corpus in stage 2 (the compact engine: 4 B cells, pairs of
#: stage-1 tokens, the pair map; read-only arrays mapped): measured 26.5 B on en_train at 32k (peak
#: 1,520 MiB anonymous for 60.2 M stage-1 tokens; the engine before: 66 B), rounded up. The
#: scheduler's share for stage 2 divided by this bounds the sample.
STAGE2_BYTES_PER_SYMBOL = 32
#: Read-only engine arrays larger than this live in mapped files under the spill folder.
MAP_THRESHOLD = 64 << 20
#: ... in stage 2, up to this when an eighth of the budget share allows it: the engine on pieces is
#: less than half the engine on whole units was (25 M symbols instead of 57 M at 32k on en_train), and
#: lists in RAM are built from the pair ids the count pass kept (no second hashing pass, no file).
STAGE2_MAP_THRESHOLD = 256 << 20


#: The stage-2 engine splits a merge between its two threads (``threads=2``) only from this many
#: sites (the engine's default: 64): the second thread then naps between the few large merges instead
#: of spinning through the many small ones, and the first does not wait for it to wake on small ones.
#: Measured at 32k on 60 MB of en_train (SuperBPE, 2 cores under load): CPU 3.6-3.9 s at 64,
#: 3.2-3.4 s here, 3.0-3.2 s on one thread; wall 9.4-14.2 s, 7.6-9.1 s, 8.1-11.5 s.
STAGE2_PAR_MIN_SITES = 4096

#: ... and its build counts and fills on two threads only from this many windows (the engine's
#: default: 2**20). The two-thread build does more work (a pair table a half, their join): on 60 MB of
#: en_train at 32k (6.4 M windows) it took 0.22-0.33 CPU-s against 0.15-0.22 on one thread, and its
#: wall time was no shorter on this 2-core host under load (0.22-0.44 s against 0.16-0.33); on 230 MB
#: (en_train whole) two threads pay: 0.38-0.61 s against 0.48-0.70, for 0.58-0.79 CPU-s against
#: 0.48-0.70 (the engine built alone on the pieces of a run, one build after the other, 4-6 rounds).
STAGE2_BUILD_PAR_MIN = 8 << 20

#: ``cut_pieces(guard=)``'s bits: no cut after a stage-1 token marked GUARD_LEFT, nor before one
#: marked GUARD_RIGHT (``stage2_merges(rebuilds=True)``)
GUARD_LEFT, GUARD_RIGHT = 1, 2

#: The first cut of stage 2 (:func:`stage2_merges`): the count of the distinct stage-1 pair at this
#: rank (times the number of stage-2 merges) when the pairs are sorted by count. Measured on en_train:
#: the last stage-2 merge counts 179 (30 MB, 8k) and 220 (230 MB, 32k), the pair at rank 2.5 x merges
#: ~140 and ~180; a cut above the last merge's count costs a restart (exact either way).
STAGE2_CUT_RANK = 2.5
#: The first cut is drawn from a sample of the pairs (exact counts of 1 in ``2**b`` distinct pairs,
#: chosen by hash) that still holds at least this many pairs above the cut's rank: the cut is then
#: within a few percent of the exact one (any cut is exact; a cut a little off costs a few pieces
#: more, or a restart).
STAGE2_CUT_SAMPLE_RANKS = 1024
#: The sketch of stage 2's pair counts (``pair_sketch``) has a counter per this many windows (a
#: power of two between 2**10 and 2**24): en_train at 32k, 57.6 M windows, 2**22 counters (8 MiB a
#: thread); its keep bitmap (512 KiB) stays in the CPU's cache while the units are cut.
STAGE2_WINDOWS_PER_COUNTER = 16
#: ... and at least one per this many windows, up to ``2**STAGE2_SKETCH_FLOOR_BITS`` counters: the
#: distinct pairs grow slower than the windows, so a smaller corpus has more of them per window and
#: one counter per 16 windows left its counters crowded. 60 MB of en_train at 32k (15.0 M windows):
#: 2**20 counters kept 8.77 M piece symbols, 2**22 keep 7.89 M (2**24: 7.70 M; the merges the same),
#: stage 2's build and loop 0.07-0.1 CPU-s less for 0.02-0.03 more in the sketch.
STAGE2_WINDOWS_PER_COUNTER_FLOOR = 4
STAGE2_SKETCH_FLOOR_BITS = 22


def cut_sample_bits(n_merges: int) -> int:
    """How finely :func:`stage2_merges` samples the pairs for its first cut (``2**-bits``, at most
    1 in 64): as coarse as still leaves ``STAGE2_CUT_SAMPLE_RANKS`` pairs above the cut's rank.

    >>> cut_sample_bits(100), cut_sample_bits(19200)     # all pairs; 1 in 32 (48,000 ranks -> 1,500)
    (0, 5)
    """
    k = int(STAGE2_CUT_RANK * n_merges)
    bits = 0
    while bits < 6 and (k >> (bits + 1)) >= STAGE2_CUT_SAMPLE_RANKS:
        bits += 1
    return bits


#: the steps of stage 2's budget share and sample fraction (``stage2_budget_share``, ``sample_fraction``)
OVERHEAD_STEP = 64 << 20
FRACTION_STEPS = 256


def stage2_budget_share(memory_limit: int, parent_overhead: int, table_ram: int) -> int:
    """The bytes stage 2 may take: the budget less the process before the work and twice the word
    table, at least 64 MiB. The process's size is measured (its RSS), so it is rounded up to a whole
    ``OVERHEAD_STEP`` first: a few KB more or less in the interpreter must not change the share,
    hence the sample of a tight budget and the merges (the same command trains the same merges).

    >>> mib = 1 << 20
    >>> stage2_budget_share(1024 * mib, 44 * mib, 100 * mib) == stage2_budget_share(1024 * mib, 45 * mib + 7, 100 * mib)
    True
    >>> stage2_budget_share(1024 * mib, 44 * mib, 100 * mib) // mib
    760
    """
    overhead = -(-max(int(parent_overhead), 0) // OVERHEAD_STEP) * OVERHEAD_STEP
    return max(int(memory_limit) - overhead - 2 * int(table_ram), 64 << 20)


def sample_fraction(need: int, share: int) -> float:
    """The share of the units stage 2 trains on when all of them (``need`` bytes) do not fit its
    ``share``: the fitting fraction rounded down to a whole 1/``FRACTION_STEPS`` (at least one
    step), 1.0 when they fit.

    >>> sample_fraction(100, 100), sample_fraction(1000, 521), sample_fraction(1000, 523)
    (1.0, 0.51953125, 0.51953125)
    """
    if need <= share:
        return 1.0
    return max(int(share * FRACTION_STEPS // need), 1) / FRACTION_STEPS


def rows_before_stage1(text_bytes: int, budget_share: int) -> bool:
    """Whether training makes the record's table rows while stage 1 runs: only when stage 2 will
    surely see the whole corpus, i.e. even one stage-1 token per byte of every pretoken fits the
    budget's share (``STAGE2_BYTES_PER_SYMBOL`` each); otherwise after stage 1, when it is known.
    Either way the rows, units and merges are the same (tested on both sides).

    >>> rows_before_stage1(10, 10 * STAGE2_BYTES_PER_SYMBOL), rows_before_stage1(11, 10 * STAGE2_BYTES_PER_SYMBOL)
    (True, False)
    """
    return text_bytes * STAGE2_BYTES_PER_SYMBOL <= budget_share


def sketch_bits(n_windows: int) -> int:
    """log2 of the number of counters in stage 2's pair sketch for ``n_windows`` windows: a counter
    per ``STAGE2_WINDOWS_PER_COUNTER`` windows, and at least one per
    ``STAGE2_WINDOWS_PER_COUNTER_FLOOR`` up to ``2**STAGE2_SKETCH_FLOOR_BITS``; from 2**10 to 2**24.

    >>> sketch_bits(1000), sketch_bits(1_347_980), sketch_bits(15_031_353), sketch_bits(57_566_692)
    (10, 19, 22, 22)
    >>> sketch_bits(10 ** 11)
    24
    """
    by_windows = (n_windows // STAGE2_WINDOWS_PER_COUNTER).bit_length()
    floor = min((n_windows // STAGE2_WINDOWS_PER_COUNTER_FLOOR).bit_length(), STAGE2_SKETCH_FLOOR_BITS)
    return max(10, min(24, max(by_windows, floor)))


@dataclass
class Stage2Result:
    """What :func:`stage2_merges` returns: the merges ``(left_id, right_id, new_id)``, the bytes of
    every token id, the token count of the units at the end (with their ``counts``), the last
    engine's stats, ``info`` (the cuts tried: pieces and symbols of each), ``seconds`` (pair
    levels, cuts and replays, engine builds, merge loops) and ``weighted_tokens``: the token count
    of the units at the end with their ``weights`` instead (SupraTok's count of the units that have
    weight, from the same engine, instead of an encoder's replay of the others)."""

    steps: list
    tokens: list
    final_tokens: int
    engine_stats: dict
    info: dict
    seconds: dict
    weighted_tokens: int = 0


def first_cut(pair_counts: np.ndarray, n_merges: int, sample_bits: int = 0) -> int:
    """The first cut :func:`stage2_merges` tries: the count of the pair at rank
    ``STAGE2_CUT_RANK * n_merges`` (1 when there are fewer pairs); ``pair_counts`` may be those of a
    ``1 / 2**sample_bits`` sample of the pairs (:func:`cut_sample_bits`), whose rank is scaled down.

    >>> first_cut(np.arange(1, 101), 10)        # the 26th greatest of 1..100
    75
    >>> first_cut(np.arange(1, 101), 40, sample_bits=2)     # a quarter's rank: 100 // 4 = 25
    75
    """
    k = int(STAGE2_CUT_RANK * n_merges) >> sample_bits
    if k >= pair_counts.size or k < 0:
        return 1
    return max(1, int(np.partition(pair_counts, pair_counts.size - 1 - k)[pair_counts.size - 1 - k]))


@contextlib.contextmanager
def stage2_huge_pages(on: bool):
    """Inside the block, stage 2's numpy arrays of 4 MiB and more (``runtime.memmon.numpy_huge_pages``)
    and the engine's build buffers (cells, window pair ids: ``engine.merge.huge_pages``) ask for transparent
    huge pages (``on``) or not; the previous settings come back after it. Memory advice only: the
    merges never depend on it (tested). The unit and piece lists keep 4 KiB pages: with huge pages
    their passes got slower on this project's VM (fresh 2 MiB blocks cost more there than the 4 KiB
    pages a process has just freed)."""
    buffers = huge_pages(on)
    try:
        with numpy_huge_pages(on):
            yield
    finally:
        huge_pages(buffers)


def stage2_merges(symbols: np.ndarray, offsets: np.ndarray, weights: np.ndarray, counts: np.ndarray,
                  tokens: Sequence[bytes], n_merges: int, allowed, bounded: bool = True,
                  cut: Optional[int] = None, spill_dir: Optional[str] = None,
                  map_threshold: int = MAP_THRESHOLD, threads: int = 1,
                  sketch_size: Optional[int] = None,
                  regenerate: Optional[Callable[[], tuple]] = None,
                  rebuilds: bool = False, guard_tokens: Optional[Callable[[bytes], bool]] = None,
                  spare_tokens: Optional[Callable[[bytes], bool]] = None,
                  count_weighted: bool = False, foresee: bool = True) -> Stage2Result:
    """Stage 2's merges on units of stage-1 tokens (``symbols``/``offsets``, ``weights`` for the
    engine, ``counts`` for the final token count), equal to one engine run on the whole units.

    **Pieces.** A stage-2 token is a run of whole stage-1 tokens, so a window ``(X, Y)`` always lies
    on one boundary between stage-1 tokens, of the pair (last stage-1 token of X, first of Y); with
    ``bounded`` (the ``distinct`` rule: every stage-2 id is built by one merge, so its stage-1 tokens
    are fixed), every occurrence of ``(X, Y)`` lies on a boundary of that one stage-1 pair, and its
    count is at most that pair's count at the start. So while the merges count at least ``cut``, none
    crosses a boundary whose stage-1 pair counts less: the units are cut there, the pieces
    deduplicated with summed weights (``cut_pieces``; far fewer symbols than the units), and the
    engine runs on the pieces until the best pair counts less than ``cut``
    (``MergeEngine.run(min_count=)``); the pairs it does not see count less, so it merges what the
    whole units would. If it stops before ``n_merges``, the cut comes down (a quarter), the units are
    cut again, the merges so far are replayed on the new pieces (``RankMerger``, as the loop rewrote
    them) and the engine goes on. At ``cut`` 1 only boundaries that count 0 are cut (exact for any
    rules: pairs that count 0 are never merged). Without ``bounded`` the cut is 1.

    **Counts by a sketch.** The stage-1 pair counts are not counted exactly: one pass adds every
    window's weight to one of ``2**sketch_bits`` counters by a hash of its pair (``pair_sketch``), so a
    counter is at least the count of each pair it holds. A window is cut only where its counter is
    below the cut (``cut_pieces(keep=)``: a bitmap of the counters at or above the cut, small enough to
    stay in the CPU's cache), so no window the exact counts keep is cut; a collision only keeps a
    window the exact counts would cut (a longer piece; 1-3% more symbols on en_train). The first cut
    comes from the exact counts of a sample of the pairs (``cut_sample_bits``, ``first_cut``).

    With ``bounded`` the engine also forgets every pair a merge makes that counts less than the cut
    (``MergeEngine(prune_below=cut)``): no merge rebuilds a token's bytes, so such a pair's count
    never rises and it cannot be merged before the engine stops at the cut; the pair map stays small.

    ``symbols``, ``offsets``, ``weights``, ``counts`` may also be lists of one or two arrays each: the
    units in parts (each part's offsets are positions in its own symbols), one thread per part, the
    result of the parts joined (so the caller need not join them). ``cut``: the first cut (default
    :func:`first_cut`; tests force others). ``threads``: 2 counts the pairs and cuts the pieces on two
    threads (the same result). ``sketch_size``: log2 of the number of counters (default
    :func:`sketch_bits`; tests force tiny sketches full of collisions).

    **Merges that rebuild a token's bytes** (``rebuilds``, with ``bounded``: rules without
    ``distinct``, SupraTok's pass 2). The engine gives such a merge the existing token's id, so that
    token then also ends (or starts) with other stage-1 tokens than before, and a pair beside it may
    count more than any one stage-1 pair at its boundary. The bound above holds for every pair whose
    left token has one last stage-1 token and whose right token has one first stage-1 token (their
    sets are followed merge by merge: a merge's token ends as its right part does and starts as its
    left part does; one that rebuilds a token adds to that token's sets); the other boundaries
    are never cut: a window whose left stage-1 token ends a token of several last ones is kept
    whole, as is one whose right stage-1 token starts a token of several first ones
    (``cut_pieces(guard=)``). ``guard_tokens(bytes)`` marks stage-1 tokens so from the start (a guess:
    whitespace, where rebuilt tokens are met); the engine stops before each merge that rebuilds a
    token (``run(stop_before_existing=)``) and, when that merge would need a boundary cut so far,
    marks it and starts again from the first merge on the pieces cut anew (a replay by rank is not
    the loop's rewriting once tokens are rebuilt); a lower cut starts again from the first merge
    too. A rebuilt token makes its pairs count more after the merges that made them, so the pairs of
    a token that may be rebuilt are never pruned (``MergeEngine(prune_spare=)``): those of the
    tokens ``spare_tokens(bytes)`` marks (a guess), and of each token rebuilt in a run so far (a
    rebuild of a token not spared from the start of the run starts it again, sparing that token).

    ``foresee`` (with ``rebuilds``): before each cut, the stage-1 tokens that a merge of two others
    would rebuild, where that pair counts at least the cut, are guarded and spared as the rebuild
    would have them (``_Edges.guard_splits``): no restart for them. SupraTok at 32k on en_train:
    ``"'" + "s"`` restarted every run from 160 MB on (the units listed again, cut, built and merged
    again: 160 MB 10.5 -> 6.3 s). False leaves them to restarts (tests of the restarts).

    ``count_weighted``: also count the units' final tokens with their ``weights`` (``weighted_tokens``
    of the result; 0 without it): one more pass over the engine's cells.

    ``regenerate``: a function that lists the same units again (``(symbols, offsets, weights,
    counts)``, as given). With it the units are let go as soon as the cut has read them (the lists
    given are emptied, the cut's own list last: ``cut_pieces_parts(consume=True)``), so the join of
    the cut's tables, the engine's build and the merge loop reuse their memory instead of fresh
    pages (300 MB at 32k on en_train; SupraTok's peak inside the cut on 60 MB at 32k: 323 -> 282 MiB);
    only a restart lists them again (checked: the same stage-1 tokens and windows, or
    ``InternalError``).

    Plain equivalent: ``MergeEngine(symbols, offsets, weights, tokens).run(n_merges, allowed)``
    (tested equal: ``tests/methods/test_superbpe.py``).
    """
    given = (symbols, offsets, weights, counts)
    parts, (symbols, offsets, weights, counts) = _stage2_parts(*given)
    seconds = {"sketch": 0.0, "cut": 0.0, "build": 0.0, "loop": 0.0}
    t0 = time.perf_counter()
    phase("stage-2 sketch")
    threads = min(max(threads, 1), 2)
    n_windows = sum(max(int(p[0].size) - (int(p[1].size) - 1), 0) for p in (parts or [(symbols, offsets)]))
    sample = cut_sample_bits(n_merges) if bounded and cut is None else 6
    bits = sketch_bits(n_windows) if sketch_size is None else sketch_size

    def sketch_of(parts, symbols, offsets, weights) -> tuple:
        if parts is not None:
            return pair_sketch_parts([p[:3] for p in parts], bits, sample)
        return pair_sketch(symbols, offsets, weights, bits, sample, threads=threads)

    sketch, sampled_counts, excess = sketch_of(parts, symbols, offsets, weights)
    # Conservation, checked: the counters and what their caps left out hold every window's weight once,
    # and the pieces (and the one-symbol pieces) hold every stage-1 token of the units
    whole = parts or [(symbols, offsets, weights, counts)]
    windows_weight = sum(int((np.maximum(np.diff(o) - 1, 0) * np.maximum(w, 0)).sum()) for _, o, w, _ in whole)
    if int(sketch.sum(dtype=np.uint64)) + excess != windows_weight:
        raise InternalError(f"stage 2's pair sketch holds {int(sketch.sum(dtype=np.uint64)) + excess} windows, "
                            f"the units {windows_weight}")
    units_tokens = sum(int((np.diff(o) * c).sum()) for _, o, _, c in whole)
    units_weighted = sum(int((np.diff(o) * w).sum()) for _, o, w, _ in whole) if count_weighted else 0
    del whole
    released = False
    if not bounded:
        cut = 1
    elif cut is None:
        cut = first_cut(sampled_counts, n_merges, sample)
    del sampled_counts
    cut = int(min(max(cut, 1), 0xFFFFFFFF))
    steps: list = []
    tokens = list(tokens)
    tried = []
    edges = _Edges(tokens, guard_tokens) if rebuilds and bounded else None
    spared: set = set()           # tokens rebuilt so far (rebuilds: their pairs are never pruned)

    def spare(token: bytes) -> bool:
        return token in spared or (spare_tokens is not None and spare_tokens(token))
    initial_tokens = list(tokens)
    t1 = time.perf_counter()
    seconds["sketch"] += t1 - t0
    while True:
        t0 = time.perf_counter()
        phase("stage-2 cut")
        if released:            # a restart: the units again (they were let go after the last cut)
            parts, (symbols, offsets, weights, counts) = _stage2_parts(*regenerate())
            again = parts or [(symbols, offsets, weights, counts)]
            again_windows = sum(max(int(p[0].size) - (int(p[1].size) - 1), 0) for p in again)
            again_tokens = sum(int((np.diff(o) * c).sum()) for _, o, _, c in again)
            del again
            if (again_windows, again_tokens) != (n_windows, units_tokens):
                raise InternalError(f"stage 2's units listed again hold {again_tokens} stage-1 tokens in "
                                    f"{again_windows} windows, the first {units_tokens} in {n_windows}")
            released = False
            if sketch is None:          # (let go after the last cut: counted again, the same counters)
                sketch, _, excess = sketch_of(parts, symbols, offsets, weights)
                if int(sketch.sum(dtype=np.uint64)) + excess != windows_weight:
                    raise InternalError("stage 2's pair sketch of the units listed again holds "
                                        f"{int(sketch.sum(dtype=np.uint64)) + excess} windows, the units {windows_weight}")
        # (a counter holds at most SKETCH_MAX: a cut above it keeps every capped counter's windows)
        keep = np.packbits(sketch >= min(cut, SKETCH_MAX), bitorder="little")
        if edges is not None and cut > 1 and foresee:
            # the boundaries a rebuild at this cut may need kept from the start, and the tokens it
            # may rebuild spared (no restart for them)
            spared.update(tokens[t] for t in
                          edges.guard_splits(sketch, cut, parts or [(symbols, offsets, weights, counts)]).tolist())
        if regenerate is not None:
            # the sketch serves only the next cut's bitmap, after a restart, which lists the units
            # again: counted again from them then, it is not kept beside the cut's tables and the
            # engine (8 MiB at 2**22 counters; SupraTok on 60 MB at 32k)
            sketch = None
        guard = edges.guard if edges is not None and cut > 1 else None
        # (one part: cut_pieces(threads=threads), as its halves)
        cut_parts = parts if parts is not None else unit_halves(threads, symbols, offsets, weights, counts)
        if regenerate is not None:
            # the units go while they are cut: once the cut has read them (cut_pieces_parts(consume=)),
            # before its tables are joined into the pieces (the cut's peak), as the cut's list held
            # the last references
            parts = symbols = offsets = weights = counts = None
            for lst in given:
                if isinstance(lst, list):
                    lst.clear()
            released = True
        data, starts, piece_weights, piece_counts, singles = cut_pieces_parts(cut_parts, cut, keep=keep, guard=guard,
                                                                              consume=regenerate is not None)
        del cut_parts
        # what the cut's threads freed (their tables, joined) stays in glibc's heaps, resident, unless
        # trimmed: given back before the engine's build (SuperBPE on 60 MB at 32k: RSS before the
        # build 344 -> 230 MiB, its peak 419 -> 327; SupraTok's 200 -> 164, 310 -> 283)
        release_free_memory()
        pieces_tokens = int((np.diff(starts) * piece_counts).sum()) + int(singles)
        if pieces_tokens != units_tokens:
            raise InternalError(f"stage 2's pieces at cut {cut} hold {pieces_tokens} stage-1 tokens, "
                                f"the units {units_tokens}")
        # the one-symbol pieces' weight: the units' weighted tokens less the listed pieces' (a
        # piece's weight is the sum of its units' weights, as its count is of their counts)
        singles_weighted = units_weighted - int((np.diff(starts) * piece_weights).sum()) if count_weighted else 0
        if not 0 <= singles_weighted <= units_weighted:
            raise InternalError(f"stage 2's pieces at cut {cut} weigh more than the units "
                                f"({units_weighted - singles_weighted} > {units_weighted})")
        tried.append({"cut": cut, "pieces": int(piece_weights.size), "symbols": int(data.size)})
        if edges is not None:
            tried[-1]["guarded_tokens"] = edges.n_guarded()
        # a piece's count differs from its weight only where encoded units gave it none: kept as those
        # differences, not as an array beside the engine (which holds the weights as its word counts:
        # the final counts are taken from it); SupraTok on 60 MB at 32k: 12.6 MB less at the
        # build's peak, and with the weights let go after the build 25 MB less in the merge loop
        differs = np.flatnonzero(piece_counts != piece_weights)
        count_extra = piece_counts[differs] - piece_weights[differs]
        del piece_counts
        if steps:
            merger = RankMerger(np.array([a for a, _, _ in steps], dtype=np.uint32),
                                np.array([b for _, b, _ in steps], dtype=np.uint32),
                                np.array([t for _, _, t in steps], dtype=np.uint32))
            data, starts = merger.merge_many(data, starts)
        t2 = time.perf_counter()
        phase("stage-2 build")
        # with bounded no pair a merge makes counts more later than when its merge made it, unless a
        # merge rebuilds one of its tokens (rebuilds): one below the cut is forgotten (a small pair
        # map), except the pairs of spared tokens (prune_spare: a rebuild of a token not spared from
        # the start of the run starts it again, sparing it)
        # the pieces' symbols become the engine's cells (donate: no copy, 4 bytes a symbol less)
        # the pieces' starts and weights are given up too (let_go: gone before the engine's position
        # lists, its build's peak; the weights are the engine's word counts now)
        given_up = [starts, piece_weights]
        del starts, piece_weights
        engine = MergeEngine(data, None, None, tokens, spill_dir=spill_dir,
                             map_threshold=map_threshold, prune_below=cut if bounded else 0, threads=threads,
                             donate=True, prune_spare=spare if edges is not None else None, let_go=given_up,
                             build_par_min=STAGE2_BUILD_PAR_MIN)
        del data
        t3 = time.perf_counter()
        phase("merge loop")
        again = False
        if edges is None or cut <= 1:
            steps += run_legs(engine, n_merges - len(steps), threads, STAGE2_PAR_MIN_SITES, allowed, min_count=cut)[0]
        else:
            while len(steps) < n_merges:
                done = run_legs(engine, n_merges - len(steps), threads, STAGE2_PAR_MIN_SITES, allowed, min_count=cut,
                                stop_before_existing=True)[0]
                edges.follow(done)
                steps += done
                if engine.stopped_before is None:
                    break
                left, right = engine.stopped_before
                merged = engine.token_bytes(left) + engine.token_bytes(right)
                was_spared = spare(merged)
                spared.add(merged)
                if not edges.rebuild(left, right, engine.tokens().index(merged)) or not was_spared:
                    # a boundary it needs was cut, or pairs of the token were pruned: the pieces
                    # again (the guard grown), and the merges from the first, sparing the token
                    again = True
                    break
                step = engine.step(allowed, cut)        # the merge it stopped before (guarded: exact)
                edges.follow([step])
                steps.append(step)
        tokens = engine.tokens()
        t1 = time.perf_counter()
        seconds["cut"] += t2 - t0       # the cut and the replay
        seconds["build"] += t3 - t2
        seconds["loop"] += t1 - t3
        if not again and (len(steps) >= n_merges or cut <= 1):
            break
        del engine
        if not again:
            cut = max(1, cut // 4)
        if edges is not None:            # (no replay by rank once tokens are rebuilt: from the first merge)
            steps, tokens = [], list(initial_tokens)
            edges.reset()
    # (the engine's word counts are the pieces' weights; their counts are those plus count_extra)
    weighted = engine.weighted_length()
    final_tokens = weighted + engine.weighted_length(count_extra, differs) + int(singles)
    weighted_tokens = weighted + singles_weighted if count_weighted else 0
    info = {"cuts": tried, "restarts": len(tried) - 1}
    return Stage2Result(steps, tokens, final_tokens, engine.stats(), info,
                        {k: round(v, 3) for k, v in seconds.items()}, weighted_tokens)


class _Edges:
    """:func:`stage2_merges` with ``rebuilds``: for every token id, the stage-1 tokens its
    occurrences can end with (``last``) and start with (``first``), followed merge by merge, and the
    ``guard`` of ``cut_pieces`` (``GUARD_LEFT``: a stage-1 token that ends a token of several last
    ones; ``GUARD_RIGHT``: one that starts a token of several first ones). The guard only grows
    (``reset`` starts the sets again for a run from the first merge, keeping it)."""

    def __init__(self, tokens: Sequence[bytes], guess: Optional[Callable[[bytes], bool]]):
        self.n_initial = len(tokens)
        self.guard = np.zeros(self.n_initial, dtype=np.uint8)
        if guess is not None:
            for i, t in enumerate(tokens):
                if guess(t):
                    self.guard[i] = GUARD_LEFT | GUARD_RIGHT
        self._tokens = list(tokens)      # (the stage-1 tokens, as given: the caller's list is rebound later)
        self._splits = None             # (_token_splits, made at the first guard_splits: foresee only)
        self.reset()

    def guard_splits(self, sketch: np.ndarray, cut: int, units: list) -> np.ndarray:
        """Guard, before the units are cut, what the merges that would rebuild a stage-1 token need:
        a pair ``(a, b)`` of stage-1 tokens whose bytes are those of a token ``t`` is merged only
        across two pretokens (inside one, stage 1 has merged every pair it could), and when its windows
        count ``cut`` or more a merge of it may come before the engine stops (the pairs the sketch
        bounds below the cut left out, the others counted exactly over ``units``, the parts of
        ``(symbols, offsets, weights, counts)``: the sketch alone, its counters shared, guarded 638
        tokens at 32k on 60 MB of en_train, most for pairs that count less, and their longer pieces
        cost more than the restarts they spare);
        ``rebuild(a, b, t)`` then finds ``t`` and ``b`` guarded on the left, ``t`` and ``a`` on the right
        (as it would mark them). Each guard the guess missed otherwise costs a restart from the first
        merge, the units listed again (SupraTok at 32k on 160 MB of en_train: ``"'" + "s"``, 4.0 s
        more). Returns the ids of the tokens such merges may rebuild (the caller spares their pairs
        from pruning, which a rebuild needs too). Only a guess as well: any guard gives the same
        merges, and a rebuild it did not foresee (of a token made by a merge, or of a pair the
        sketch put below the cut) still restarts."""
        if self._splits is None:
            self._splits = _token_splits(self._tokens)
        a, b, t = self._splits
        if a.size == 0:
            return t
        bound = sketch_bounds(sketch, np.ravel(np.column_stack((a, b))).astype(np.uint32),
                              np.arange(0, 2 * a.size + 1, 2, dtype=np.int64))[::2]
        hit = np.flatnonzero(bound >= min(cut, SKETCH_MAX))
        if hit.size:
            keys, inverse = np.unique((a[hit].astype(np.uint64) << np.uint64(32)) | b[hit].astype(np.uint64),
                                      return_inverse=True)
            exact = sum(pair_counts(p[0], p[1], p[2], keys) for p in units)
            hit = hit[exact[inverse.ravel()] >= cut]
        self.guard[t[hit]] |= GUARD_LEFT | GUARD_RIGHT
        self.guard[b[hit]] |= GUARD_LEFT
        self.guard[a[hit]] |= GUARD_RIGHT
        return np.unique(t[hit])

    def reset(self) -> None:
        self.last: dict[int, frozenset] = {}       # ids made or rebuilt by merges (else: the id itself)
        self.first: dict[int, frozenset] = {}
        self.n_tokens = self.n_initial

    def n_guarded(self) -> int:
        return int(np.count_nonzero(self.guard))

    def _last(self, t: int) -> frozenset:
        return self.last.get(t) or frozenset((t,))

    def _first(self, t: int) -> frozenset:
        return self.first.get(t) or frozenset((t,))

    def follow(self, steps) -> None:
        """Merges the engine made (fresh tokens, or rebuilt ones that ``rebuild`` allowed)."""
        for left, right, new in steps:
            if new < self.n_tokens:
                continue            # a rebuilt token: ``rebuild`` took its sets in
            self.n_tokens = new + 1
            self.last[new] = self._last(right)
            self.first[new] = self._first(left)

    def rebuild(self, left: int, right: int, t: int) -> bool:
        """The merge ``(left, right)`` rebuilds the token ``t``: take in its new last and first
        stage-1 tokens; True when every boundary they need was kept (the guard covers them),
        False when the guard grew (the pieces must be cut again)."""
        last = self._last(t) | self._last(right)
        first = self._first(t) | self._first(left)
        self.last[t], self.first[t] = last, first
        grew = False
        for ids, bit in ((last, GUARD_LEFT), (first, GUARD_RIGHT)):
            if len(ids) > 1:
                for i in ids:
                    if not self.guard[i] & bit:
                        self.guard[i] |= bit
                        grew = True
        return not grew


def _token_splits(tokens: Sequence[bytes]) -> tuple:
    """Every way to write a token's bytes as two tokens: ``(a, b, t)`` arrays (int64) with
    ``tokens[a[k]] + tokens[b[k]] == tokens[t[k]]`` (each bytes string under its first id).

    >>> [x.tolist() for x in _token_splits([b"a", b"b", b"ab", b"aab", b"ba"])]   # a+b, a+ab, b+a
    [[0, 0, 1], [1, 2, 0], [2, 3, 4]]
    """
    ids: dict = {}
    for i, tok in enumerate(tokens):
        ids.setdefault(tok, i)
    a, b, t = [], [], []
    get = ids.get
    for i, tok in enumerate(tokens):
        for k in range(1, len(tok)):
            x = get(tok[:k])
            if x is not None:
                y = get(tok[k:])
                if y is not None:
                    a.append(x)
                    b.append(y)
                    t.append(i)
    return tuple(np.array(v, dtype=np.int64) for v in (a, b, t))


def unit_weights(encoded: list, counts: list) -> list:
    """Stage 2's weight of each unit, part by part: its count, 0 for the units of encoded regions
    (they teach stage 2 nothing; their count still goes into the final token count)."""
    return [np.where(e, 0, c) if e.any() else c for e, c in zip(encoded, counts)]


def _stage2_parts(symbols, offsets, weights, counts):
    """``stage2_merges``' units as ``(parts, arrays)``: a list of one or two parts ``(symbols,
    offsets, weights, counts)`` (one thread each) and no arrays, or no parts and the four arrays
    (which the kernels halve for two threads); dtypes made right (no copy when they are)."""
    def kinds(syms):        # uint16 units stay uint16 (the kernels read both); anything else uint32
        return (np.uint16 if getattr(syms, "dtype", None) == np.uint16 else np.uint32, np.int64, np.int64, np.int64)

    if isinstance(symbols, list) and len(symbols) == 1:        # one part: the arrays (halved for threads)
        symbols, offsets, weights, counts = symbols[0], offsets[0], weights[0], counts[0]
    if isinstance(symbols, list):
        return ([tuple(np.ascontiguousarray(a, dtype=k) for a, k in zip(p, kinds(p[0])))
                 for p in zip(symbols, offsets, weights, counts)], (None, None, None, None))
    return None, tuple(np.ascontiguousarray(a, dtype=k)
                       for a, k in zip((symbols, offsets, weights, counts), kinds(symbols)))
