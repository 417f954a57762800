"""The helper threads of batch jobs are kept between calls (``tokenizer_batch._helpers``): the ids
are those of one thread, no thread is made per call, and a forked child makes its own helpers."""
import os
import select
import sys
import threading

import pytest

from bpe_core import Tokenizer
from bpe_core.encode import tokenizer_batch


def _tok():
    vocab = {i: bytes([i]) for i in range(256)}
    vocab.update({256: b"ab", 257: b"abc", 258: b" a"})
    return Tokenizer(vocab, [(b"a", b"b"), (b"ab", b"c"), (b" ", b"a")])


@pytest.fixture
def many_threads(monkeypatch):
    monkeypatch.setattr(tokenizer_batch, "_BATCH_THREAD_BYTES", 1)   # a thread per document


def _helpers_alive():
    """The process's batch helper threads (other tests in this process may have made some)."""
    return {t.ident for t in threading.enumerate() if t.name.startswith("bpe-batch")}


def test_helpers_are_reused_and_the_ids_are_one_threads(many_threads):
    tok = _tok()
    texts = [f"abc ab a{k} " * (k % 7 + 1) for k in range(40)]
    want = [tok.encode(t) for t in texts]
    before = _helpers_alive()
    made = set()
    for _ in range(6):
        assert tok.encode_batch(texts, num_threads=4) == want
        ids, offsets = tok.encode_batch_flat(texts, num_threads=3)
        assert [ids[offsets[k]:offsets[k + 1]].tolist() for k in range(len(texts))] == want
        alive = _helpers_alive()
        assert alive and before <= alive       # kept after the call, none ended
        made |= alive - before
    # a call uses at most num_threads - 1 helpers (fewer when its job is small or the machine busy):
    # over 12 calls at most 3 were made, not one per call
    assert len(made) <= 3


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="fork")
def test_a_forked_child_makes_its_own_helpers(many_threads):
    tok = _tok()
    texts = ["abc ab a " * 3, "a b c", "abcabc"] * 5
    want = [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, num_threads=3) == want   # the parent's helpers exist now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                             # the child: its batches must not hang
        ok = tok.encode_batch(texts, num_threads=3) == want
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 30)
    got = os.read(r, 1) if ready else b"hung"
    if not ready:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert got == b"1"
