"""The spare id buffer (``_encode_outputs.pxi``): a handed-over array's buffer, once the array is
freed, is kept and taken by the next call of that size; ids stay equal, and a live array's
memory is never reused."""
import gc

import numpy as np

from bpe_core import Tokenizer
from bpe_core.encode import _encode


def _tok():
    vocab = {i: bytes([i]) for i in range(256)}
    vocab.update({256: b"ab", 257: b"abc", 258: b" a"})
    return Tokenizer(vocab, [(b"a", b"b"), (b"ab", b"c"), (b" ", b"a")])


def _text(seed, n=2_000_000):
    rng = np.random.default_rng(seed)
    words = ["abc", " ab", " a", "cab", " x", "\\n", " é", "abcabc"]
    return "".join(rng.choice(words, n // 3))


def test_the_spare_is_kept_taken_and_never_shared_with_a_live_array():
    tok = _tok()
    t1, t2 = _text(1), _text(2)
    want1, want2 = tok.encode_to_numpy(t1).copy(), tok.encode_to_numpy(t2).copy()
    gc.collect()
    a = tok.encode_to_numpy(t1)
    assert np.array_equal(a, want1)
    del a
    gc.collect()
    assert _encode._spare_info() > 0               # kept when the array was freed
    b = tok.encode_to_numpy(t2)                      # takes it
    assert _encode._spare_info() == 0
    c = tok.encode_to_numpy(t1)                      # b is alive: a buffer of its own
    assert np.array_equal(b, want2) and np.array_equal(c, want1)
    assert not np.shares_memory(b, c)
    ids, offsets = tok.encode_batch_flat([t1, t2], num_threads=1)   # one worker's buffer handed over
    assert np.array_equal(ids, np.concatenate([want1, want2])) and offsets[-1] == len(ids)
    del b
    gc.collect()
    d = tok.encode_to_numpy(t2)
    assert np.array_equal(d, want2) and np.array_equal(c, want1)
    assert not np.shares_memory(d, c) and not np.shares_memory(d, ids)
