"""The engine's pair map in segments (``_engine_pairmap.pxi``) and ``MergeEngine.reserve_pairs``: the
map equals a dict through puts, removes, growth and room made at any moment; room made once holds
the pairs it was made for without growing; and making room changes no merge."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.engine._engine import _PairMap
from bpe_core.engine.merge import MergeEngine
from bpe_core.runtime.budget import PAIR_SLOT_BYTES, pair_map_slots


def _key(k, salt):
    return (k * 0x9E3779B1 + salt) & 0xFFFFFFFFFFFF


def check_against_a_dict(ops, salt: int, same_tags: bool):
    """Run ``ops`` (``put``/``remove``/``get``/``reserve``, value) on a fresh map and on a dict side
    by side: every get agrees after each op, and every key is reachable at the end. Returns the map."""
    m, d = _PairMap(16), {}
    if same_tags:
        m.py_same_tags()
    for op, k in ops:
        key = _key(k, salt)
        if op == "put" and key not in d:
            m.py_put(key, k)
            d[key] = k
        elif op == "remove":
            m.py_remove(key)
            d.pop(key, None)
        elif op == "reserve":
            m.py_reserve(k)
        assert m.py_get(key) == d.get(key, -1)
    assert m.py_len() == len(d)
    assert all(m.py_get(key) == v for key, v in d.items())
    return m


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "put", "remove", "get", "reserve"]), st.integers(0, 5000)),
                max_size=2000), st.integers(0, 2 ** 32), st.booleans())
def test_pair_map_equals_a_dict_with_room_made_at_any_moment(ops, salt, same_tags):
    """Segments grow by half on their own (a few keys each: many growths) or all at once
    (``reserve``, with keys already in them); every key stays reachable. With ``same_tags`` every
    slot's tag matches every key (the slots keep ids, the keys are the pairs' own): the keys tell
    them apart."""
    m = check_against_a_dict(ops, salt, same_tags)
    assert all(n >= 16 for n in m.py_segment_slots())


def test_room_made_once_holds_its_keys_without_growing():
    """``reserve(n)`` then n keys: no segment grows (the plan's figure, ``pair_map_slots``, is the
    map's size to the slot)."""
    for n in (700, 50_000, 300_000):
        m = _PairMap(16)
        m.py_reserve(n)
        before = m.py_nbytes()
        assert before == pair_map_slots(n) * PAIR_SLOT_BYTES and PAIR_SLOT_BYTES == 8
        for k in range(n):
            m.py_put(_key(k, 12345), k)
        assert m.py_nbytes() == before and m.py_len() == n
    # without room made, the segments grow one at a time, each by half: at most 7/10 full, and at
    # least 7/15 (a power-of-two table is between 7/20 and 7/10)
    m = _PairMap(16)
    for k in range(300_000):
        m.py_put(_key(k, 7), k)
    slots = m.py_segment_slots()
    assert 300_000 * 10 / 7 <= sum(slots) <= 300_000 * 15 / 7


def _engine(words, weights):
    syms = np.array([t for w in words for t in w], dtype=np.uint32)
    offs = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    return MergeEngine(syms, offs, np.array(weights[:len(words)], dtype=np.int64),
                       [bytes([97 + i]) for i in range(8)])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=25), min_size=1, max_size=50),
       st.lists(st.integers(0, 5), min_size=50, max_size=50), st.integers(0, 3000), st.integers(1, 60))
def test_room_for_pairs_changes_no_merge(words, weights, n_pairs, n_merges):
    plain, roomy = _engine(words, weights), _engine(words, weights)
    roomy.reserve_pairs(n_pairs)
    assert plain.run(n_merges) == roomy.run(n_merges)
    assert plain.tokens() == roomy.tokens()
    for x, y in zip(plain.words(), roomy.words()):
        assert np.array_equal(x, y)


# ==== The list pool given back while the loop runs (``_engine_pool.pxi``) ==========================

def _long_engine(words, weights, threads=1):
    syms = np.array([t for w in words for t in w], dtype=np.uint32)
    offs = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    return MergeEngine(syms, offs, np.array(weights, dtype=np.int64), [bytes([97 + i]) for i in range(8)],
                       threads=threads, build_par_min=1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=40), min_size=1, max_size=60),
       st.lists(st.integers(0, 5), min_size=60, max_size=60), st.integers(1, 80), st.integers(1, 7),
       st.sampled_from([1, 2]))
def test_compacting_the_pool_after_every_merge_changes_no_merge(words, weights, n_merges, every, threads):
    """The pool slid down and its pages given back every ``every`` merges (``run``'s check forced:
    no free bytes needed), on one thread or two: every merge, token and final word equal."""
    plain = _long_engine(words, weights[:len(words)], threads)
    moved = _long_engine(words, weights[:len(words)], threads)
    plain.par_min_sites = moved.par_min_sites = 1
    moved.pool_check_every, moved.pool_min_free = every, 0
    assert plain.run(n_merges) == moved.run(n_merges)
    assert plain.tokens() == moved.tokens()
    for x, y in zip(plain.words(), moved.words()):
        assert np.array_equal(x, y)
    assert plain.pair_counts_dict() == moved.pair_counts_dict()


def test_compacting_gives_pages_back_and_keeps_every_list():
    """Lists spread over many pages (big early lists freed by their merges) are slid into few: the
    pool shrinks, and the merges after it are the plain engine's."""
    rng = np.random.default_rng(5)
    words = [list(rng.integers(0, 4, rng.integers(2, 30))) for _ in range(100_000)]
    weights = list(rng.integers(1, 6, len(words)))
    plain, moved = _long_engine(words, weights), _long_engine(words, weights)
    assert plain.run(80) == moved.run(80)
    before, after = moved.compact_pool()
    assert after < before and moved.stats()["pool_compactions"] == 1
    assert plain.run(200) == moved.run(200)
    assert plain.pair_counts_dict() == moved.pair_counts_dict()
