"""Lists built while a batch runs (``BatchJob.build_lists``, what ``encode_batch`` does on several
threads): the calling thread (``run(..., lists=True)``) encodes stretches of documents of its own and,
between them, lists every document finished so far, the other workers' from their buffers while they
go on encoding into them (each made room for the whole job first, so it never moves). Every list
equals the document's own encoding, whichever thread encoded it and whichever path listed it (the
listing thread during the job, its wait for the last documents, ``collect``), and each shared int holds
exactly one reference per place it has in the lists: none once they are freed."""
from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpe_core.encode import _encode
from bpe_core.encode import tokenizer_batch as batch_mod      # owns _BATCH_THREAD_BYTES
from bpe_core.encode.tokenizer import Tokenizer
from encode_helpers import EOT, SETTINGS, fixture_path, fixture_text, gpt2_tiktoken
from paths import package_parent


def _gpt2(max_ints=None):
    """A GPT-2 tokenizer of this test's own; ``max_ints``: its ids from there on have no shared int
    (an int is made per use: a vocabulary past ``TokenTable``'s ``max_ints``)."""
    tok = Tokenizer.from_files(fixture_path("gpt2_vocab.json"), fixture_path("gpt2_merges.txt"), [EOT])
    if max_ints is not None:
        tok._tokens = _encode.TokenTable(tok._decoder, max_ints=max_ints)
    return tok


TOKS = {None: _gpt2(), 300: _gpt2(300), 5000: _gpt2(5000)}
TINY = ["", " ", "a", "é", "\n\n", " the", " tokenizer", "hello world", "😀", EOT, "12345", "\udcff"]
HUGE = (" the tokenizer" * 900 + "x" * 30 + fixture_text("corpus.en")[:20_000])


def _shared(tok):
    """The tokenizer's shared int objects."""
    t = tok._tokens
    return t.to_list(np.arange(t.n_ints, dtype=np.uint32))


def _refcounts(shared):
    """The reference counts of the shared ints from 257 on (CPython's own small ints, shared with
    the rest of the process, change under the test)."""
    return np.array([sys.getrefcount(o) for o in shared[257:]], dtype=np.int64)


def _references_of(lists, n_ints):
    """The references the lists hold to each shared int from 257 on."""
    flat = np.fromiter((v for lst in lists for v in lst if v < n_ints), dtype=np.int64)
    return np.bincount(flat, minlength=n_ints)[257:]


def _check(tok, docs, lists, shared, before):
    """The lists are each document's encoding, their own objects where the table shares one, tracked
    by the cyclic collector, and hold one reference per place to each shared int, none once freed."""
    assert lists == [tok.encode_to_numpy(d, allowed_special="all").tolist() for d in docs]
    n_ints = tok._tokens.n_ints
    assert all(lst[i] is shared[v] for lst in lists for i, v in enumerate(lst) if v < n_ints)
    assert all(gc.is_tracked(lst) for lst in lists if lst)
    assert np.array_equal(_refcounts(shared) - before, _references_of(lists, n_ints))
    del lists
    assert np.array_equal(_refcounts(shared), before)


@SETTINGS
@given(st.lists(st.sampled_from(TINY) | st.text(max_size=30), max_size=120), st.integers(0, 1),
       st.integers(1, 4), st.sampled_from([None, 300, 5000]))
def test_batch_lists_equal_each_documents_encoding(docs, n_huge, threads, max_ints):
    """Random batches (empty documents, many tiny ones, a huge one anywhere) on 1 to 4 threads, the
    shared ints covering every id or not (``max_ints`` 300 / 5,000: some or most ids are made per
    use): ``encode_batch`` and ``encode_ordinary_batch`` give each document's own ids, and the
    references of the shared ints come back to where they were."""
    docs = [d.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape") for d in docs]
    if n_huge:
        docs.insert(len(docs) // 3, HUGE)
    tok = TOKS[max_ints]
    shared = _shared(tok)
    saved = batch_mod._BATCH_THREAD_BYTES
    batch_mod._BATCH_THREAD_BYTES = 1
    try:
        before = _refcounts(shared)
        _check(tok, docs, tok.encode_batch(docs, threads), shared, before)
        got = tok.encode_ordinary_batch(docs, threads)
        assert got == [tok.encode_ordinary(d) for d in docs]
        del got
        assert np.array_equal(_refcounts(shared), before)
    finally:
        batch_mod._BATCH_THREAD_BYTES = saved


DOCS = ["", HUGE, "a", "", " the tokenizer tokenizes" * 50, EOT + " x" + EOT, "😀 é " * 300, "z"] * 3


def _job(tok, docs):
    job = _encode.BatchJob(docs, tok._pattern_id, tok._special_table_for(True))
    job.build_lists(tok._tokens)
    return job


@pytest.mark.parametrize("max_ints", [None, 300])
@pytest.mark.parametrize("schedule", ["worker_then_lister", "lister_takes_all", "workers_only", "threads"])
def test_every_path_of_a_listing_job(schedule, max_ints):
    """Each way a listing job's documents reach their lists: a worker encodes them all and the
    listing thread (run last, nothing left to take) lists them from that worker's buffer; the listing
    thread takes them all itself; no listing thread (``collect`` lists them); two workers and the
    listing thread on threads of their own. With ``max_ints`` 300 most ids have no shared int."""
    tok = TOKS[max_ints]
    t = tok._table
    shared = _shared(tok)
    before = _refcounts(shared)
    docs = DOCS * 20 if schedule == "threads" else DOCS     # (long enough for documents in flight)
    job = _job(tok, docs)
    if schedule == "worker_then_lister":
        job.run(_encode.Encoder(t), None, 2)
        job.run(_encode.Encoder(t), None, 2, True)
    elif schedule == "lister_takes_all":
        job.run(_encode.Encoder(t), None, 2, True)
        job.run(_encode.Encoder(t), None, 2)
    elif schedule == "workers_only":
        job.run(_encode.Encoder(t), None, 2)
        job.run(_encode.Encoder(t), None, 2)
    else:
        workers = [threading.Thread(target=job.run, args=(_encode.Encoder(t), None, 3)) for _ in range(2)]
        for w in workers:
            w.start()
        job.run(_encode.Encoder(t), None, 3, True)
        for w in workers:
            w.join()
    # the listing thread lists every document it sees end (it waits for the last ones); with none,
    # collect lists them all
    assert job.n_listed == (0 if schedule == "workers_only" else len(docs))
    _check(tok, docs, job.collect(tok._tokens), shared, before)


@pytest.mark.parametrize("over", [-1, 0, 1])
def test_a_job_past_the_fixed_buffers_size_is_listed_by_collect(over):
    """``fixed_max`` (FIXED_MAX, 256 MB; set around this job's size here): a job of at most that many
    bytes gives its workers fixed buffers, whose documents the listing thread lists; one byte more,
    and the worker's documents wait for ``collect``. The lists are the same either way."""
    tok = TOKS[None]
    t = tok._table
    shared = _shared(tok)
    before = _refcounts(shared)
    job = _job(tok, DOCS)
    job.fixed_max = job.n_bytes + over
    job.run(_encode.Encoder(t), None, 2)                # the worker takes every document
    job.run(_encode.Encoder(t), None, 2, True)          # the listing thread: nothing left to take
    assert job.n_listed == (len(DOCS) if over >= 0 else 0)
    _check(tok, DOCS, job.collect(tok._tokens), shared, before)


def test_lists_match_tiktoken_on_many_documents():
    """The fixture's documents (and each one again, the second time from the warm cache) on 2 and 3
    threads: the lists are tiktoken's."""
    docs = [d for d in fixture_text("tinystories_sample.txt").split(EOT) if d] * 2
    want = gpt2_tiktoken().encode_batch(docs, allowed_special="all")
    tok = _gpt2()
    saved = batch_mod._BATCH_THREAD_BYTES
    batch_mod._BATCH_THREAD_BYTES = 1
    try:
        for threads in (2, 3, 2):
            assert tok.encode_batch(docs, threads) == want
    finally:
        batch_mod._BATCH_THREAD_BYTES = saved


def test_listing_job_contract():
    tok = TOKS[None]
    t = tok._table
    job = _encode.BatchJob(["a b"], tok._pattern_id)
    with pytest.raises(ValueError, match="without build_lists"):
        job.run(_encode.Encoder(t), None, 1, True)
    job.run(_encode.Encoder(t))
    with pytest.raises(RuntimeError, match="after run"):
        job.build_lists(tok._tokens)
    job = _job(tok, ["a b", ""])
    job.run(_encode.Encoder(t), None, 1, True)
    with pytest.raises(ValueError, match="another TokenTable"):
        job.collect(TOKS[300]._tokens)
    assert job.collect() == [tok.encode("a b"), []]
    with pytest.raises(RuntimeError, match="twice"):
        job.collect()


LATER = r"""
import resource, sys
import numpy as np
from bpe_core.encode import _encode
from bpe_core.encode.tokenizer import Tokenizer
tok = Tokenizer.from_files(sys.argv[1], sys.argv[2], [])
docs = [(b"hello world%d " % k) * 440_000 for k in range(4)] + [b"", b"xyz"]   # 25 MB: 100 MB of room
listing, worker = _encode.Encoder(tok._table), _encode.Encoder(tok._table)
job = _encode.BatchJob(docs, 0)
job.build_lists(tok._tokens)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (80 << 20), hard))   # no room for 96 MB at once
job.run(worker, None, 2)                        # DOC_LATER: its buffer grows (and moves) as it needs
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
job.run(listing, None, 2, True)                 # nothing left to take; lists none of them
lists = job.collect()
assert lists == [tok.encode_to_numpy(d).tolist() for d in docs]
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="an address-space limit (Linux)")
def test_a_worker_without_room_for_the_whole_job_is_listed_by_collect(tmp_path):
    """A worker that cannot make room for every id of the job at once (an address-space limit here)
    encodes into a buffer that grows, so the listing thread does not read it: ``collect`` lists its
    documents, from where the buffer ended up."""
    import os
    import subprocess

    # the bpe_core this test imported (installed, or built in place), run from elsewhere: ``python -c``
    # puts the current folder first, and in a clean clone's root that is the unbuilt source
    env = dict(os.environ, PYTHONPATH=package_parent())
    done = subprocess.run([sys.executable, "-c", LATER, fixture_path("gpt2_vocab.json"), fixture_path("gpt2_merges.txt")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


FAILED_WORKER = r"""
import resource, sys
import numpy as np
from bpe_core.encode import _encode
from bpe_core.encode.tokenizer import Tokenizer
tok = Tokenizer.from_files(sys.argv[1], sys.argv[2], [])
t = tok._tokens
shared = t.to_list(np.arange(t.n_ints, dtype=np.uint32))
def refcounts():
    return np.array([sys.getrefcount(o) for o in shared[257:]], dtype=np.int64)
# 0.6 MB of small documents and one of 4 MB (2 M ids), taken first (the largest first on two threads):
# under the limit the worker's starting buffer fits (0.77 M ids, 3 MB) but neither room for the whole
# job (4.6 M ids) nor the growth the large document needs, so it fails holding a document it took
docs = [(b" the tokenizer %d" % k) * 3000 for k in range(12)] + [b"", b" x" * 2_000_000]
before = refcounts()
job = _encode.BatchJob(docs, 0)
job.build_lists(t)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (6 << 20), hard))   # no room for the whole job
try:
    job.run(_encode.Encoder(tok._table), None, 2)
    raise SystemExit("the worker did not fail")
except MemoryError:
    pass
finally:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
job.run(_encode.Encoder(tok._table), None, 2, True)     # lists the rest, then gives the counts up
assert 0 < job.n_listed < len(docs), job.n_listed      # (the worker's own documents: DOC_LATER)
held = refcounts() - before
assert held.min() >= 0 and held.sum() > 0, ("the lists do not hold their references", held.min(), held.sum())
try:
    job.collect()
    raise SystemExit("collect did not refuse")
except RuntimeError as exc:
    assert "worker failed" in str(exc)
del job
assert np.array_equal(refcounts(), before), "references missing or left over"
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="an address-space limit (Linux)")
def test_a_failed_worker_leaves_the_lists_their_own_references(tmp_path):
    """A worker that fails (no memory to grow its buffer, under an address-space limit) makes the
    listing thread give its counted references up: each list it built increfs its shared ints one
    by one instead, so the lists hold their references while the job lives and none is missing or
    left over once it is freed; collect refuses."""
    import os
    import subprocess

    # the bpe_core this test imported (installed, or built in place), run from elsewhere: ``python -c``
    # puts the current folder first, and in a clean clone's root that is the unbuilt source
    env = dict(os.environ, PYTHONPATH=package_parent())
    done = subprocess.run([sys.executable, "-c", FAILED_WORKER, fixture_path("gpt2_vocab.json"),
                           fixture_path("gpt2_merges.txt")], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout[-1000:] + done.stderr[-2000:]
