"""The engine's merges on two threads (``MergeEngine(threads=2)``) against one thread and the
reference: the same merges, words, tokens and pair counts, for any words, with every merge forced
onto both threads (``par_min_sites=1``) and at the default threshold."""
import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.engine.merge import MergeEngine, run_legs

from test_engine_prune import _distinct

BYTES = [bytes([i]) for i in range(256)]


def _table(words):
    syms = np.array([t for w in words for t in w], dtype=np.uint32)
    offs = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    return syms, offs


def _engines(words, weights, tokens, par_min_sites=1, par_min_list_sites=None, **kw):
    syms, offs = _table(words)
    counts = np.array(weights[:len(words)], dtype=np.int64)
    one = MergeEngine(syms, offs, counts, tokens, **kw)
    two = MergeEngine(syms, offs, counts, tokens, threads=2, **kw)
    two.par_min_sites = par_min_sites
    if par_min_list_sites is not None:
        two.par_min_list_sites = par_min_list_sites
    return one, two


def _same(one, two):
    assert one.tokens() == two.tokens()
    for x, y in zip(one.words(), two.words()):
        assert np.array_equal(x, y)
    assert {k: v for k, v in one.pair_counts_dict().items() if v} == \
           {k: v for k, v in two.pair_counts_dict().items() if v}


# words over few symbols (long runs: a == b merges, sites of one word on both sides of a site)
_words = st.lists(st.lists(st.integers(97, 100), min_size=1, max_size=40), min_size=2, max_size=80)
_weights = st.lists(st.integers(0, 7), min_size=80, max_size=80)


@settings(max_examples=150, deadline=None)
@given(_words, _weights, st.integers(1, 60), st.sampled_from([1, 2, 5, 63, 64, 65, 2048]),
       st.sampled_from([None, 1, 2, 3]))
def test_two_threads_merge_as_one(words, weights, n_merges, par_min_sites, par_min_list_sites):
    """``par_min_list_sites``: None is the default (2048: these merges write their lists on one
    thread); 1-3 put the second share's list entries on the second thread in most merges."""
    one, two = _engines(words, weights, BYTES, par_min_sites, par_min_list_sites)
    assert one.run(n_merges) == two.run(n_merges)
    _same(one, two)


@pytest.mark.parametrize("par_min_list_sites", [3, 4, 5])
def test_the_lists_threshold_on_both_sides(par_min_list_sites):
    """The first merge, (a, b), has 8 sites, 4 in each share (the split falls between the words),
    and each makes one window of a pair holding the new token: the second share brings 4 list
    entries, written on the second thread from ``par_min_list_sites`` 4 down, on this one above.
    The next merges read those lists; the result is one thread's either way."""
    words = [[97, 98, 99, 100]] * 4 + [[97, 98, 100]] * 4
    one, two = _engines(words, [3, 1, 2, 1, 1, 2, 1, 3], BYTES, 1, par_min_list_sites)
    assert two.pair_count(97, 98) == 14 and two.pair_count(98, 99) == 7
    assert two.run(1) == one.run(1) == [(97, 98, 256)]
    assert two.n_list_jobs == (1 if par_min_list_sites <= 4 else 0)
    assert one.run(4) == two.run(4)
    _same(one, two)


@settings(max_examples=60, deadline=None)
@given(_words, _weights, st.integers(1, 40))
def test_two_threads_merge_as_the_reference(words, weights, n_merges):
    """The merges of ``run`` on two threads are the reference trainer's (CS336 semantics)."""
    counts = {}
    for w, c in zip(words, weights):
        if c:
            key = tuple(bytes([t]) for t in w)
            counts[key] = counts.get(key, 0) + c
    _, two = _engines(words, weights, BYTES)
    got = [(two.token_bytes(a), two.token_bytes(b)) for a, b, _ in two.run(n_merges)]
    ref_words, expected = dict(counts), []
    for _ in range(n_merges):
        pair = reference.best_pair(reference.get_pair_counts(ref_words))
        if pair is None:
            break
        expected.append(pair)
        new = {}
        for w, c in ref_words.items():
            m = reference.merge_word(w, pair)
            new[m] = new.get(m, 0) + c
        ref_words = new
    assert got == expected


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=30), min_size=2, max_size=60),
       st.lists(st.integers(0, 5), min_size=60, max_size=60), st.integers(1, 6), st.integers(1, 80))
def test_two_threads_with_pruning_and_rules(words, weights, cut, n_merges):
    """Stage 2's engine: ``prune_below``, ``min_count`` and the ``distinct`` rule, on two threads."""
    tokens = [bytes([97 + i]) for i in range(12)]
    one, two = _engines(words, weights, tokens, prune_below=cut)
    assert one.run(n_merges, allowed=_distinct(tokens), min_count=cut) == \
           two.run(n_merges, allowed=_distinct(tokens), min_count=cut)
    _same(one, two)


def test_canonical_tokens_on_two_threads():
    """A merge that rebuilds an existing token's bytes (the new token is an old one: its pairs are
    both in the pair map and in the shares)."""
    tokens = BYTES + [b"bc", b"ab"]
    a, b, c, x = ord("a"), ord("b"), ord("c"), ord("x")
    words = [(a, 256), (257, c), (a, 256, x), (257, c, x), (257, c, a, 256, 257, c)] * 3
    one, two = _engines(words, [5, 4, 1, 1, 2] * 3, tokens)
    assert one.run(20) == two.run(20)
    _same(one, two)


def _tasks(expected=None):
    """The threads of this process (a joined thread may leave /proc a moment later)."""
    for _ in range(100):
        n = len(os.listdir("/proc/self/task"))
        if n == expected:
            break
        time.sleep(0.01)
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_the_worker_thread_ends_with_run_even_on_an_error():
    words = [[97, 98] * 20] * 50
    _, two = _engines(words, [1] * 50, BYTES)
    before = _tasks()
    seen = []
    two.run(3, progress=lambda n: seen.append(two.worker_running), every=1)
    assert seen[:3] == [True] * 3 and not two.worker_running and _tasks(before) == before

    def refuse(left, right):
        raise RuntimeError("no")
    with pytest.raises(RuntimeError):
        two.run(3, allowed=refuse)
    assert not two.worker_running and _tasks(before) == before


def test_one_thread_runs_without_the_worker_and_merges_the_same():
    """``run(one_thread=True)`` on an engine built with ``threads=2``: no second thread while it runs
    (an idle one spins between merges), the same merges as one run on two threads; a later run
    starts the worker again."""
    words = [[97, 98, 99, 97, 98] * 8, [98, 99, 100] * 9, [97, 100] * 7] * 30
    one, two = _engines(words, [1, 2, 3] * 30, BYTES)
    seen = []
    first = two.run(4, one_thread=True, progress=lambda n: seen.append(two.worker_running), every=1)
    assert seen and not any(seen)
    rest = two.run(30, progress=lambda n: seen.append(two.worker_running), every=1)
    assert seen[-2] is True
    assert one.run(34) == first + rest
    _same(one, two)


def test_a_big_table_splits_its_sites_between_threads():
    """At the default threshold: enough sites that merges do run on both threads."""
    rng = np.random.default_rng(5)
    words = [list(rng.integers(97, 103, size=int(rng.integers(2, 12)))) for _ in range(6000)]
    weights = list(rng.integers(1, 4, size=6000))
    one, two = _engines(words, weights, BYTES, par_min_sites=2048)
    assert one.run(200) == two.run(200)
    _same(one, two)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_one_usable_cpu_keeps_one_thread():
    """Allowed one CPU (taskset, a pinned job), the engine does not start a second thread: two
    threads taking turns on one core made the loop 13x slower before this check."""
    words = [[97, 98] * 20] * 50
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(old)})
    try:
        _, two = _engines(words, [1] * 50, BYTES)
        seen = []
        two.run(3, progress=lambda n: seen.append(two.worker_running), every=1)
    finally:
        os.sched_setaffinity(0, old)
    assert seen and not any(seen)


def test_two_threads_on_one_core_still_merge_as_one(monkeypatch):
    """When the OS gives both threads one core anyway (a CPU quota), waiting yields the core: same
    merges (and no spinning through a whole time slice). The second thread is rarely running when
    this one has done its part: this one then runs the second part too (``_par_wait``)."""
    import bpe_core.engine._engine as native
    monkeypatch.setattr(native, "_usable_cpus", lambda: 2)
    rng = np.random.default_rng(7)
    words = [list(rng.integers(97, 101, size=int(rng.integers(2, 20)))) for _ in range(3000)]
    weights = list(rng.integers(1, 4, size=3000))
    one, two = _engines(words, weights, BYTES, par_min_sites=1)
    old = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else None
    if old is not None:
        os.sched_setaffinity(0, {min(old)})
    try:
        got = two.run(100)
    finally:
        if old is not None:
            os.sched_setaffinity(0, old)
    assert got == one.run(100)
    _same(one, two)
    if old is not None:
        assert two.n_jobs_taken_back > 0


def _windows(words):
    return sum(max(len(w) - 1, 0) for w in words)


@settings(max_examples=120, deadline=None)
@given(_words, _weights, st.integers(0, 40), st.sampled_from(["one", "below", "at", "above", "prune"]))
def test_a_build_on_two_threads_is_one_threads(words, weights, n_merges, where):
    """The build's count and fill on two threads (``build_par_min``, around the number of windows):
    the same pair ids, counts and initial position lists as one thread, then the same merges."""
    n = _windows(words)
    par_min = {"one": 1, "below": n - 1, "at": n, "above": n + 1, "prune": 1}[where]
    kw = {"prune_below": 2} if where == "prune" else {}
    syms, offs = _table(words)
    counts = np.array(weights[:len(words)], dtype=np.int64)
    one = MergeEngine(syms, offs, counts, BYTES, **kw)
    two = MergeEngine(syms, offs, counts, BYTES, threads=2, build_par_min=max(par_min, 1), **kw)
    assert two.build_threads == (n > 0 and n >= max(par_min, 1))
    assert one.build_lists() == two.build_lists()
    assert one.run(n_merges, min_count=kw.get("prune_below", 0)) == \
           two.run(n_merges, min_count=kw.get("prune_below", 0))
    _same(one, two)


@settings(max_examples=120, deadline=None)
@given(_words, _weights, st.integers(0, 40), st.sampled_from(["one", "below", "at", "above"]),
       st.sampled_from(["mapped", "ram"]), st.integers(1, 64), st.booleans())
def test_a_build_without_window_ids_on_two_threads_is_one_threads(tmp_path_factory, words, weights, n_merges,
                                                                  where, lists, fill_entries, more_tokens):
    """The build with no window pair ids kept (``map_threshold``: mapped position lists, written in
    passes of ``fill_buffer_bytes``, or lists in RAM filled by lookups): on two threads when the
    tokens are the 256 bytes (few pairs: the second half's pair table has room for all of them
    from the start), each pass's lists split between the threads; the same pair ids, counts, lists
    and merges as one thread. With more tokens than the bytes, one thread."""
    n = _windows(words)
    par_min = max({"one": 1, "below": n - 1, "at": n, "above": n + 1}[where], 1)
    tokens = BYTES + [b"<%d>" % i for i in range(3)] if more_tokens else BYTES
    syms, offs = _table(words)
    counts = np.array(weights[:len(words)], dtype=np.int64)
    kw = dict(map_threshold=0, fill_buffer_bytes=4 * fill_entries)
    if lists == "mapped":
        kw["spill_dir"] = str(tmp_path_factory.mktemp("spill"))
    one = MergeEngine(syms, offs, counts, tokens, **kw)
    two = MergeEngine(syms, offs, counts, tokens, threads=2, build_par_min=par_min, **kw)
    assert two.build_threads == (n > 0 and n >= par_min and not more_tokens)
    assert one.build_lists() == two.build_lists()
    assert one.fill_passes == two.fill_passes
    assert one.run(n_merges) == two.run(n_merges)
    _same(one, two)


def test_a_build_on_two_threads_at_the_default_threshold():
    """Enough windows for the default ``build_par_min``: the build runs on two threads, with pairs
    that only the second half holds (numbered after the first half's, as one thread numbers them)."""
    rng = np.random.default_rng(11)
    sizes = rng.integers(2, 14, size=170_000)        # (drawn at once: a second of Python less)
    words = [w.tolist() for w in np.split(rng.integers(97, 123, size=int(sizes.sum())), np.cumsum(sizes)[:-1])]
    words += [[200, 201, 202, 200]] * 50           # pairs only the second half has
    weights = list(rng.integers(1, 5, size=len(words)))
    one, two = _engines(words, weights, BYTES)
    assert _windows(words) >= 1 << 20 and two.build_threads and not one.build_threads
    assert one.build_lists() == two.build_lists()
    assert one.run(300) == two.run(300)
    _same(one, two)



@settings(max_examples=150, deadline=None)
@given(_words, _weights, st.integers(0, 60), st.sampled_from([1, 2, 3, 5, 8, 64]), st.integers(0, 6),
       st.booleans(), st.booleans())
def test_run_legs_merge_as_one_run(words, weights, n_merges, par, min_count, compact, stop):
    """``run_legs`` (plain BPE's loop and SuperBPE stage 2's): the large merges with the second
    thread, the rest on one, the same steps, words and pair counts as one run on one thread, at
    every switch point, with a ``min_count`` below, at and above it and a stop before a rebuilding
    merge; the first leg made only merges counting ``par`` or more."""
    one, two = _engines(words, weights, BYTES)
    want = one.run(n_merges, min_count=min_count, stop_before_existing=stop)
    counts = []
    got, n_first = run_legs(two, n_merges, 2, par, min_count=min_count, compact=compact,
                            stop_before_existing=stop, progress=counts.append)
    if compact:
        got = [tuple(x) for x in np.asarray(got).reshape(-1, 3).tolist()]
    assert got == want and two.stopped_before == one.stopped_before
    assert counts[-1] == len(want) if counts else not want or n_first == len(want)
    assert n_first <= len(want) and (n_first == 0 or min_count < par)
    _same(one, two)
    # the first leg's merges are the first n_first, each of a pair counting par or more
    check, _ = _engines(words, weights, BYTES)
    for _ in range(n_first):
        check.step()
        assert check.last_count >= par


def test_run_legs_with_a_rule_asks_what_one_run_asks():
    """``allowed`` (stage 2's ``distinct`` rule) is asked of the same pairs in the same order."""
    rng = np.random.default_rng(11)
    words = [list(rng.integers(97, 100, size=int(rng.integers(2, 16)))) for _ in range(300)]
    weights = list(rng.integers(1, 6, size=300))
    one, two = _engines(words, weights, BYTES)
    asked1, asked2 = [], []
    rule1, rule2 = _distinct(BYTES), _distinct(BYTES)
    want = one.run(80, allowed=lambda a, b: asked1.append((a, b)) or rule1(a, b))
    got, n_first = run_legs(two, 80, 2, 20, allowed=lambda a, b: asked2.append((a, b)) or rule2(a, b))
    assert got == want and asked2 == asked1 and 0 < n_first < len(want)
    _same(one, two)

_ARENA_PROBE = r"""
import ctypes
import numpy as np
from bpe_core.engine.merge import MergeEngine
rng = np.random.default_rng(3)
tables = [
    [bytes(rng.integers(97, 101, size=int(rng.integers(2, 12))).astype(np.uint8)) for _ in range(20000)],
    [b"a" * int(n) for n in rng.integers(2, 300, size=400)],                      # a == b runs
    [bytes(rng.integers(0, 256, size=int(rng.integers(2, 40))).astype(np.uint8)) for _ in range(5000)],
    [b"ab" * 3000, b"ba" * 2000, b"abc" * 1000],                                  # few long words
]
for words in tables:
    syms = np.frombuffer(b"".join(words), np.uint8)
    offs = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    counts = rng.integers(1, 50, size=len(words)).astype(np.int64)
    e = MergeEngine(syms, offs, counts, [bytes([i]) for i in range(256)], threads=2)
    e.par_min_sites = 1                  # every merge on both threads
    e.run(2000)
import sys                               # a build of mapped lists on two threads (bytes: few pairs)
sym = rng.integers(97, 123, size=1_200_000).astype(np.uint8)
offs = np.arange(0, 1_200_001, 12, dtype=np.int64)
e = MergeEngine(sym, offs, np.ones(len(offs) - 1, np.int64), [bytes([i]) for i in range(256)], threads=2,
                spill_dir=sys.argv[1], map_threshold=0, fill_buffer_bytes=1 << 20)
assert e.build_threads and e.fill_passes > 1
e = MergeEngine(sym, offs, np.ones(len(offs) - 1, np.int64), [bytes([i]) for i in range(256)], threads=2)
assert e.build_threads                   # ... and of lists in RAM
ctypes.CDLL(None).malloc_stats()         # one "Arena N:" block per glibc arena, on stderr
"""


@pytest.mark.skipif(os.uname().sysname != "Linux" or not os.path.isdir("/proc/self/task"),
                    reason="glibc's malloc_stats")
def test_the_merge_worker_never_allocates(tmp_path):
    """The second thread's share of a merge gets its room from the main thread before it runs
    (``_share_reserve``), so that thread never calls malloc and glibc never gives it an arena of its
    own (an arena's freed room stays with it: at 15 GB the second thread cost ~96 MiB that way).
    Checked in a fresh process after every merge of several tables ran on both threads and builds of
    byte tables (lists mapped and in RAM) ran on two: one arena, the main one (the previous engine
    made two). Fails if any merge outgrows what was reserved."""
    import platform
    import subprocess
    import sys
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    import bpe_core
    root = os.path.dirname(os.path.dirname(os.path.abspath(bpe_core.__file__)))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _ARENA_PROBE, str(tmp_path)], env=env, capture_output=True, text=True,
                          cwd=root, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    arenas = [line for line in proc.stderr.splitlines() if line.startswith("Arena ")]
    assert arenas == ["Arena 0:"], proc.stderr[-2000:]


def test_a_merge_is_divided_at_its_own_median():
    """The sites of (a, b) all lie in the first half of the table (its words sort together): the
    merge is still divided about evenly between the threads (``_split_at``: the word of its median
    site), where the table's middle gave the first thread all of them."""
    words = [[97, 98]] * 400 + [[100, 101, 102]] * 400
    one, two = _engines(words, [2] * 400 + [1] * 400, BYTES, par_min_sites=2)
    assert one.run(1) == two.run(1) == [(97, 98, 256)]
    assert two.par_sites == 400
    assert 180 <= two.par_sites_max <= 220
    assert one.run(5) == two.run(5)
    _same(one, two)


def test_a_share_with_more_other_pairs_than_its_table_holds():
    """Each site of (a, b) has neighbour pairs of their own, 6,000 in all: past half of a share's
    table of the other pairs' changes (OTHER_SLOTS 4,096), the rest are lowered at once
    (atomically); the counts are one thread's either way."""
    n = 3000
    tokens = BYTES + [b"<%d>" % i for i in range(n)]
    words = [[256 + i, 97, 98, 256 + (i * 7) % n] for i in range(n)]
    one, two = _engines(words, [2] * n, tokens, par_min_sites=2)
    assert one.run(1) == two.run(1) == [(97, 98, 256 + n)]
    assert two.par_sites == n
    assert one.run(3) == two.run(3)
    _same(one, two)


# words over bytes at both ends of the byte range (pairs 0x0000 and 0xFFFF among them)
_byte_words = st.lists(st.lists(st.sampled_from([0, 1, 97, 98, 254, 255]), min_size=1, max_size=30),
                       min_size=2, max_size=60)


@settings(max_examples=120, deadline=None)
@given(_byte_words, _weights, st.integers(0, 40), st.sampled_from(["always", "below", "at", "above"]),
       st.sampled_from([1, 2]), st.sampled_from(["mapped", "ram"]), st.integers(1, 64), st.booleans())
def test_a_build_by_byte_pairs_is_the_pair_maps(tmp_path_factory, words, weights, n_merges, where, threads,
                                               lists, fill_entries, more_tokens):
    """The count by byte pair (``byte_count_min``, around the number of windows; tokens the 256
    bytes only), on one thread or two, with the position lists in RAM or mapped (written in place,
    in passes of ``fill_buffer_bytes``): the same pair ids, counts, lists and merges as the count in
    the pair map on one thread; a mapped build leaves no file in its folder."""
    n = _windows(words)
    at = {"always": 0, "below": n - 1, "at": n, "above": n + 1}[where]
    tokens = BYTES + [b"<%d>" % i for i in range(3)] if more_tokens else BYTES
    syms, offs = _table(words)
    counts = np.array(weights[:len(words)], dtype=np.int64)
    kw = dict(map_threshold=0, fill_buffer_bytes=4 * fill_entries)
    if lists == "mapped":
        kw["spill_dir"] = str(tmp_path_factory.mktemp("spill"))
    plain = MergeEngine(syms, offs, counts, tokens, byte_count_min=1 << 62)
    eng = MergeEngine(syms, offs, counts, tokens, threads=threads, build_par_min=1, byte_count_min=max(at, 0),
                      **kw)
    assert eng.build_by_bytes == (n >= max(at, 0) and not more_tokens) and not plain.build_by_bytes
    assert plain.build_lists() == eng.build_lists()
    if lists == "mapped":
        assert os.listdir(kw["spill_dir"]) == []
        m = eng.memory()
        assert m["words_in_ram"] == 0 and (m["positions_in_ram"] == 0 or n == 0)
    assert plain.run(n_merges) == eng.run(n_merges)
    _same(plain, eng)
