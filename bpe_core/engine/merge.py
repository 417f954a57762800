"""The merge loop over a word table: the engine's public face for training.

>>> from bpe_core.pretok.wordtable import WordTable
>>> vocab, merges = train_words(WordTable.from_counts({b"low": 5, b"lower": 2}), 258)
>>> merges          # (l, o) and (o, w) both count 7: the greater pair wins
[(b'o', b'w'), (b'l', b'ow')]
"""
from __future__ import annotations

import array
import time
from typing import Callable, Optional, Sequence

from ..runtime.lazy import np  # numpy on first use (a small run never imports it)

from ..corpus.specials import encode_specials
from ..pretok.wordtable import WordTable
from ..runtime.budget import FILL_BUFFER_BYTES, pairs_estimate
from ..runtime.budget import fill_buffer_bytes as default_fill_bytes
from ..runtime.memmon import phase
from ..runtime.atomic import naming
from ..runtime.progress import progress_bar
from ..runtime.workers import release_free_memory
from ._engine import MergeEngine, hf_byte_rank, huge_pages

__all__ = ["MergeEngine", "PAR_MIN_SITES", "PAR_SPLIT_SITES", "Replay", "hf_byte_rank", "huge_pages",
           "replay_merges", "run_legs", "train_words"]

#: With ``threads=2``, the second thread runs only while the best pair counts at least this much:
#: the first leg of ``train_words``' loop (below it, an idle second thread spins between merges, CPU
#: time for nothing). On the 4 GB synthetic corpus at 32k, the merges of pairs counting 4,096 or more
#: are two thirds of the merges and ~90% of the loop's CPU; at 15 GB the pairs count about 4x more.
PAR_MIN_SITES = 4096

#: ... and in that leg a merge is split between the two threads from this many listed sites
#: (``MergeEngine.par_min_sites``). Most merges of the first leg list far fewer sites than their
#: pair counts (the pretokens of frequent words weigh thousands each): with both thresholds at
#: 16,384, 7,640 of the first leg's 8,180 merges on the 4 GB corpus ran on one thread while the
#: second waited. A split costs a hand-over (~1-3 us while the second thread spins) and the
#: sampled split point (``MergeEngine._split_at``); 1,024 sites are ~20-40 us of work.
PAR_SPLIT_SITES = 1024


def run_legs(engine: MergeEngine, n_merges: int, threads: int, par_min_sites: int = PAR_MIN_SITES,
             allowed: Optional[Callable[[bytes, bytes], bool]] = None, progress: Optional[Callable[[int], None]] = None,
             min_count: int = 0, compact: bool = False, stop_before_existing: bool = False,
             split_min_sites: Optional[int] = None):
    """``engine.run(n_merges, allowed, min_count=min_count, ...)`` in two legs, the same merges as one
    run; return ``(steps, n_first)``, the merges and how many the first leg made.

    With ``threads`` 2 (an engine built with ``threads=2``): first the merges of pairs that count
    ``par_min_sites`` or more, with the second thread taking the sites from the split point of each
    merge that lists ``split_min_sites`` or more (``engine.par_min_sites``; None: ``par_min_sites``,
    no more than it either; a pair counts at least as many sites as it has in words of weight 1 or
    more); then the rest on this thread alone (``run(one_thread=True)``:
    an idle second thread spins, yields and naps between merges, CPU time for nothing once no merge
    has that many sites). ``run`` stops before the first pair that counts less than its
    ``min_count`` with the engine as it was (``allowed`` is not asked of it), so the second leg goes
    on as one run would. A stop before a rebuilding merge (``stop_before_existing``, see
    ``MergeEngine.run``) ends the legs. With one thread, or ``min_count`` at ``par_min_sites`` or
    more (every merge left is large), it is one run.

    ``steps``: with ``compact``, the ``(left, right, new)`` ids flat (``3 n`` uint32: an ndarray, an
    ``array.array`` for a ``plain`` engine); else a list of tuples. ``progress(n_done)`` counts over
    both legs. Plain BPE (:func:`train_words`) and SuperBPE's stage 2 both run their loop here.

    >>> e = MergeEngine(np.frombuffer(b"abababcd", np.uint8), np.array([0, 8]), np.array([1]),
    ...                 [bytes([i]) for i in range(256)], threads=2)
    >>> steps, n_first = run_legs(e, 3, threads=2, par_min_sites=2)
    >>> steps, n_first     # (a, b) counts 3, (ab, ab) 2: with the second thread; (c, d) 1: on one
    ([(97, 98, 256), (256, 256, 257), (99, 100, 258)], 2)
    """
    engine.par_min_sites = par_min_sites if split_min_sites is None else min(split_min_sites, par_min_sites)
    kw = dict(allowed=allowed, compact=compact, stop_before_existing=stop_before_existing)
    first, done = None, 0
    if threads >= 2 and min_count < par_min_sites:
        first = engine.run(n_merges, progress=progress, min_count=par_min_sites, **kw)
        done = len(first)
        if engine.stopped_before is not None or done >= n_merges:
            return _flat(engine, first, None, compact), done

    def tick(n):
        progress(done + n)
    rest = engine.run(n_merges - done, progress=tick if progress is not None else None, min_count=min_count,
                      one_thread=first is not None, **kw)
    return _flat(engine, first, rest, compact), done


def _flat(engine: MergeEngine, first, rest, compact: bool):
    """The steps of one or two legs as one sequence (``run_legs``)."""
    legs = [x for x in (first, rest) if x is not None]
    if not compact:
        return legs[0] if len(legs) == 1 else legs[0] + legs[1]
    if engine.plain:                         # flat array.array("I") already
        return legs[0] if len(legs) == 1 else legs[0] + legs[1]
    return legs[0].reshape(-1) if len(legs) == 1 else np.concatenate([x.reshape(-1) for x in legs])


class Replay:
    """Given merges applied to a word table: the words' segmentation and the engine's view.

    Attributes:
        symbols, offsets: the words after the merges (uint32 token ids, a CSR aligned with the table).
        tokens: the bytes of every token id (the 256 bytes, then each distinct merged string in merge
            order: a merge that rebuilds existing bytes gets the existing id, as in the engine).
        steps: ``(left_id, right_id, new_id)`` per merge, what ``MergeEngine.run`` returns.
    """

    def __init__(self, symbols, offsets, tokens, steps):
        self.symbols, self.offsets, self.tokens, self.steps = symbols, offsets, tokens, steps


def replay_merges(symbols: np.ndarray, offsets: np.ndarray, merges: Sequence[tuple[bytes, bytes]]) -> Replay:
    """Apply ``merges`` (in rank order) to every word, as the engine's loop would have rewritten them.

    ``RankMerger`` merges each word by rank (all occurrences of the lowest rank present, left to right,
    then only later ranks), which is how the merge loop rewrites its words; so an engine built from
    the result and run further makes the merges a run from scratch would make after these, when
    these are the merges that run made first (``train_words(..., init_merges=...)``).

    >>> r = replay_merges(np.frombuffer(b"aaab", np.uint8), np.array([0, 4]), [(b"a", b"a"), (b"aa", b"a")])
    >>> r.symbols.tolist(), r.steps, r.tokens[256:]
    ([257, 98], [(97, 97, 256), (256, 97, 257)], [b'aa', b'aaa'])

    Plain equivalent: ``reference.encode_pretoken(word, merges)`` per word.
    """
    tokens = [bytes([i]) for i in range(256)]
    ids = {t: i for i, t in enumerate(tokens)}
    steps = []
    for a, b in merges:
        left, right = ids[a], ids[b]          # a checked model: parts are bytes or built earlier
        new = ids.get(a + b)
        if new is None:
            new = ids[a + b] = len(tokens)
            tokens.append(a + b)
        steps.append((left, right, new))
    from .units import RankMerger     # (only --init-from replays merges: a plain run never loads _units)

    merger = RankMerger(np.array([s[0] for s in steps], dtype=np.uint32),
                        np.array([s[1] for s in steps], dtype=np.uint32),
                        np.array([s[2] for s in steps], dtype=np.uint32))
    seg, seg_offsets = merger.merge_many(np.ascontiguousarray(symbols, dtype=np.uint32),
                                         np.ascontiguousarray(offsets, dtype=np.int64))
    return Replay(seg, seg_offsets, tokens, steps)


def train_words(table: WordTable, vocab_size: int, special_tokens: Sequence[str | bytes] = (),
                progress: bool = False, allowed: Optional[Callable[[bytes, bytes], bool]] = None,
                report: Optional[dict] = None, init_merges: Optional[Sequence[tuple[bytes, bytes]]] = None,
                spill_dir: Optional[str] = None, fill_buffer_bytes: int = FILL_BUFFER_BYTES,
                tie_break: str = "bytes", threads: int = 1,
                par_min_sites: int = PAR_MIN_SITES,
                split_min_sites: int = PAR_SPLIT_SITES) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Run the merge loop on a word table; return ``(vocab, merges)``.

    ``init_merges``: start from these merges (an existing model's, ``--init-from``): they are applied
    to the words (:func:`replay_merges`), kept as the first merges, and the loop continues from there.
    When they are the first merges of a run on the same table, the result equals that run.

    With ``spill_dir``, the engine keeps its read-only arrays (word records, initial position lists)
    in mapped files there (``docs/memory.md``); the result is the same. A mapped table
    (:meth:`WordTable.to_files`) is taken as it is: its one-byte words were dropped when it was written.

    ``tie_break``: among pairs of equal count, ``"bytes"`` (CS336: the greatest ``(left_bytes,
    right_bytes)``) or ``"hf"`` (HF ``tokenizers``' BpeTrainer: the smallest pair of ids in HF's
    order), see ``MergeEngine``.

    ``threads``: 2 builds the engine on two threads (``MergeEngine``) and runs the loop in two legs
    (:func:`run_legs`), the same merges as one thread: while the best pair counts ``par_min_sites``
    or more, with the second thread taking half the sites of each merge that lists
    ``split_min_sites`` or more; then on one thread (``MergeEngine.run(one_thread=True)``). A table of
    fewer symbols than the smaller of the two (no merge could be split), or a small run's
    ``array.array`` table, runs on one thread.

    >>> train_words(WordTable.from_counts({b"low": 5, b"lower": 2}), 258, tie_break="hf")[1]
    [(b'l', b'o'), (b'lo', b'w')]
    """
    specials = encode_specials(special_tokens)
    n_merges = vocab_size - 256 - len(specials)
    t0 = time.perf_counter()
    phase("build words")
    if not table.mapped:
        table = table.without_singletons()
    if isinstance(table.offsets, array.array) or len(table.arena) < max(min(split_min_sites, par_min_sites), 2):
        threads = 1                       # (a small run's table: the split would import numpy)
    threads = min(max(threads, 1), 2)
    mapping = dict(spill_dir=spill_dir, map_threshold=0 if spill_dir is not None else 1 << 62,
                   fill_buffer_bytes=fill_buffer_bytes, tie_break=tie_break, threads=threads)
    init_steps: list = []
    with naming(spill_dir):               # a full spill folder is named (the engine's mapped arrays)
        if init_merges:
            table = table.as_numpy()          # (--init-from replays merges with numpy)
            replay = replay_merges(table.arena, table.offsets, init_merges)
            # (the replayed symbols are tokens, not bytes: their pairs are not the 65,536 byte pairs
            # at most that the plan's fill buffer leaves room for, ``budget.build_fill_bytes``)
            mapping["fill_buffer_bytes"] = min(fill_buffer_bytes, default_fill_bytes(len(replay.symbols)))
            engine = MergeEngine(replay.symbols, replay.offsets, table.counts, replay.tokens, **mapping)
            init_steps = replay.steps
            n_merges -= len(init_steps)
        else:
            engine = MergeEngine(table.arena, table.offsets, table.counts, [bytes([i]) for i in range(256)],
                                 **mapping)
    # room for the pairs the plan counts on, made once (no table copied to a larger one in the loop)
    engine.reserve_pairs(pairs_estimate(len(table.arena), vocab_size))
    del table
    t1 = time.perf_counter()
    bar = progress_bar(progress, total=n_merges, desc="merges", unit="merge")
    last = [0]

    def tick(done):
        if bar is not None:
            bar.update(done - last[0])
            last[0] = done

    phase("merge loop")
    # the merges as a flat uint32 array of (left, right, new) ids: no tuple per merge (an
    # array.array, from a small run's table: see MergeEngine.plain)
    steps, two_thread_merges = run_legs(engine, n_merges, threads, par_min_sites, allowed=allowed,
                                        progress=tick if bar is not None else None, compact=True,
                                        split_min_sites=split_min_sites)
    if bar is not None:
        bar.close()
    t2 = time.perf_counter()
    tokens = engine.tokens()
    stats = engine.stats() if report is not None else None
    del engine                  # its tables go back before the vocabulary is built (a lower peak)
    release_free_memory()       # ... to the OS too (glibc keeps freed heap pages: ~4 MB on 1 MB of text)
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    for s in specials:
        vocab[len(vocab)] = s
    n_steps = len(init_steps) + len(steps)
    token = tokens.__getitem__
    lefts = [s[0] for s in init_steps] + steps[0::3].tolist()
    rights = [s[1] for s in init_steps] + steps[1::3].tolist()
    merges: list[tuple[bytes, bytes]] = list(zip(map(token, lefts), map(token, rights)))
    del lefts, rights
    # a merge's token is tokens[new], the bytes left + right (the engine's own object: no copy)
    news = [s[2] for s in init_steps] + steps[2::3].tolist()
    vocab.update(zip(range(len(vocab), len(vocab) + n_steps), map(token, news)))
    del steps, news, tokens
    if report is not None:
        report["seconds"]["build_words"] = round(t1 - t0, 3)
        report["seconds"]["merge_loop"] = round(t2 - t1, 3)
        report["engine"] = stats
        report["engine"]["mapped"] = spill_dir is not None
        # the second thread: 2 when it built and merged (the first ``merges_on_two_threads`` merges)
        report["engine"]["threads"] = threads
        report["engine"]["merges_on_two_threads"] = two_thread_merges
        report["merges"] = len(merges)
        report["merges_requested"] = max(n_merges + len(init_steps), 0)
    return vocab, merges


