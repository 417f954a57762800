"""``MergeEngine.run(compact=True)``: the merges as one uint32 array (what ``train_words`` takes, no
tuple per merge) hold exactly the steps of the plain list, with ``allowed``, ``min_count`` and an
engine stepped further; ``tokens()`` gives each token's bytes (the engine's own objects when no two
ids hold the same bytes)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bpe_core.engine.merge import MergeEngine, train_words
from bpe_core.pretok.wordtable import WordTable

BYTES = [bytes([i]) for i in range(256)]


def engine(words):
    items = [(w, c) for w, c in words.items() if len(w) > 1]
    symbols = np.frombuffer(b"".join(w for w, _ in items), dtype=np.uint8).astype(np.uint32)
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(w) for w, _ in items])
    return MergeEngine(symbols, offsets, np.array([c for _, c in items], dtype=np.int64), list(BYTES))


words = st.dictionaries(st.binary(min_size=2, max_size=8).map(lambda b: bytes(x % 5 + 97 for x in b)),
                        st.integers(1, 9), max_size=12)


@settings(max_examples=40, deadline=None)
@given(words, st.integers(0, 30), st.integers(1, 3))
def test_compact_steps_are_the_listed_steps(words, n, min_count):
    def allowed(a, b):
        return not (a.endswith(b"e") and b.startswith(b"a"))

    plain, compact = engine(words), engine(words)
    listed = plain.run(n, allowed=allowed, min_count=min_count) + plain.run(n)
    arr = compact.run(n, allowed=allowed, min_count=min_count, compact=True)
    more = compact.run(n, compact=True)
    assert arr.dtype == np.uint32 and arr.shape == (len(arr), 3) and more.shape[1:] == (3,)
    assert [tuple(r) for r in np.concatenate([arr, more]).tolist()] == listed
    toks = compact.tokens()
    assert toks == plain.tokens() == [compact.token_bytes(i) for i in range(compact.n_tokens)]


def test_tokens_of_an_engine_whose_merges_rebuilt_bytes():
    """``aab`` from (a, ab) and from (aa, b): one id; the tokens are still each id's bytes."""
    eng = engine({b"aab": 5, b"xaab": 1})
    eng.run(10, compact=True)
    toks = eng.tokens()
    assert toks == [eng.token_bytes(i) for i in range(eng.n_tokens)] and len(toks) == eng.n_tokens


def test_an_empty_run_is_an_empty_array():
    arr = engine({b"ab": 1}).run(0, compact=True)
    assert arr.shape == (0, 3) and arr.dtype == np.uint32


@pytest.mark.parametrize("init", [False, True])
def test_train_words_merges_share_the_tokens_bytes(init):
    """The merges' parts and the vocabulary's tokens are the same bytes objects (one per token, no
    copies), with and without ``init_merges``."""
    table = WordTable.from_counts({b"low": 5, b"lower": 2, b"newest": 6, b"widest": 3})
    full_vocab, full = train_words(table, 266)
    first = full[:3] if init else None
    vocab, merges = train_words(table, 266, init_merges=first)
    assert merges == full and vocab == full_vocab
    ids = {id(t) for t in vocab.values()}
    assert all(id(a) in ids and id(b) in ids for a, b in merges[3 if init else 0:])
