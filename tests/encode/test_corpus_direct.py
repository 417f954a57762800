"""The corpus encoder writes ids straight into the output (``encode.ids_out``), byte-identical to the
old layout: a ``.npy`` made by ``np.lib.format.open_memmap`` and filled with the ids in order.

- :class:`ids_out.OrderedIds` under every interleaving of workers and consumer (hypothesis drives
  a schedule: which chunk opens, puts or finishes next), holds just around each threshold;
- ``encode_corpus`` end to end against that layout and the whole-text ids: chunk sizes, hold
  bounds, workers 1/2, budgets, empty/one-document/huge-document corpora, several inputs with and
  without a separator (the separator id between items), document indexes, shards and manifests;
- conservation: a writer that loses ids stops the run and publishes nothing;
- SIGKILL and SIGTERM in the middle of the encode phase (with chunks holding and spilling): nothing at
  the output paths, and the next run leaves no temp or spill file and writes the same bytes.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bpe_core
from bpe_core.encode import ids_out
from bpe_core.encode.tokenizer import Tokenizer
from bpe_core.errors import InternalError
from bpe_core.formats.model import Model, dump_model
from bpe_core.pretok.patterns import resolve_pattern
from encode_helpers import EOT, SETTINGS, fixture_text, small_model
from robust_helpers import ENCODE, leftovers
from tool_runner import call_in_child

ec = importlib.import_module("bpe_core.encode.encode_corpus")
SEP = EOT.encode()


# ==== The .npy header and the writer ==========================================================


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize("n", [0, 1, 5, 1000, 123_457])
def test_header_is_open_memmaps(tmp_path, dtype, n):
    arr = np.lib.format.open_memmap(tmp_path / "a.npy", mode="w+", dtype=dtype, shape=(n,))
    offset = arr.offset
    del arr
    head = (tmp_path / "a.npy").read_bytes()[:offset]
    assert ids_out.npy_header(np.dtype(dtype), n) == head and offset == ids_out.HEADER_BYTES


@SETTINGS
@given(st.lists(st.lists(st.integers(0, 65535), max_size=12), max_size=12), st.none() | st.integers(1, 9),
       st.booleans())
def test_writer_puts_ids_and_copies_in_order(tmp_path_factory, pieces, shard_tokens, as_copy):
    """Writes and spill copies in any sizes land in order, shards cut every ``shard_tokens`` ids."""
    d = tmp_path_factory.mktemp("w")
    w = ids_out.IdsWriter(str(d / "ids.npy"), np.dtype(np.uint16), shard_tokens,
                          shard_names=lambda k: str(d / f"ids-{k}.npy"))
    for k, piece in enumerate(pieces):
        arr = np.array(piece, np.uint16)
        if as_copy and k % 2:
            src = d / f"spill-{k}"
            arr.tofile(src)
            fd = os.open(src, os.O_RDONLY)
            w.copy(fd, arr.nbytes)
            os.close(fd)
        else:
            w.write(arr)
    pairs, sizes = w.finish()
    ids = [i for p in pieces for i in p]
    if shard_tokens is None:
        assert sizes == [len(ids)] and pairs[0][1] == str(d / "ids.npy")
    else:
        assert sizes == ([min(shard_tokens, len(ids) - a) for a in range(0, len(ids), shard_tokens)] or [0])
        assert [p[1] for p in pairs] == [str(d / f"ids-{k}.npy") for k in range(len(sizes))]
    got = []
    for (tmp, _), n in zip(pairs, sizes):
        want = np.lib.format.open_memmap(d / "want.npy", mode="w+", dtype=np.uint16, shape=(n,))
        want[:] = ids[len(got): len(got) + n]
        want.flush()
        del want
        assert open(tmp, "rb").read() == (d / "want.npy").read_bytes()
        got += np.load(tmp).tolist()
    assert got == ids and all(p[0] in w.temps for p in pairs)


@pytest.mark.parametrize("fails_after", [0, 1, 2])
def test_spill_copy_falls_back_to_read_and_write(tmp_path, monkeypatch, fails_after):
    """Without ``copy_file_range`` (EXDEV, ENOSYS), from the start or after part of a spill was
    copied, the copy goes on by read and write from where it stopped."""
    import errno

    real, calls = os.copy_file_range, [0]

    def flaky(src, dst, count, *a):
        calls[0] += 1
        if calls[0] > fails_after:
            raise OSError(errno.EXDEV, "cross-device")
        return real(src, dst, min(count, 6), *a)

    monkeypatch.setattr(ids_out.os, "copy_file_range", flaky)
    ids = np.arange(1000, dtype=np.uint16)
    ids.tofile(tmp_path / "spill")
    w = ids_out.IdsWriter(str(tmp_path / "ids.npy"), np.dtype(np.uint16), 300,
                          shard_names=lambda k: str(tmp_path / f"s{k}.npy"))
    w.write(ids[:7])
    fd = os.open(tmp_path / "spill", os.O_RDONLY)
    os.lseek(fd, 14, os.SEEK_SET)
    w.copy(fd, ids.nbytes - 14)
    os.close(fd)
    pairs, sizes = w.finish()
    assert sizes == [300, 300, 300, 100] and calls[0] > fails_after
    assert np.concatenate([np.load(t) for t, _ in pairs]).tolist() == ids.tolist()


@st.composite
def schedules(draw):
    """Chunks (ids in pieces, begins an item, items) and a schedule of workers and the consumer."""
    n = draw(st.integers(0, 6))
    chunks = []
    for _ in range(n):
        pieces = draw(st.lists(st.lists(st.integers(0, 999), max_size=5), max_size=4))
        chunks.append((pieces, draw(st.booleans()), draw(st.integers(0, 2))))
    choices = draw(st.lists(st.integers(0, 10**6), min_size=0, max_size=80))
    return chunks, choices


@SETTINGS
@given(schedules(), st.integers(0, 24), st.sampled_from([1, 2, 3, 4]), st.booleans())
def test_ordered_ids_any_interleaving(tmp_path_factory, sched, hold, ahead, with_sep):
    """Chunks opened in any order (up to ``ahead`` beyond the head), their pieces put interleaved,
    each finished in order once its worker is done; ``hold`` just around the pieces' sizes (an id is
    2 bytes). The file holds exactly the ids in chunk order, the separator before a chunk that
    begins an item after an item, and no spill file is left."""
    chunks, choices = sched
    d = tmp_path_factory.mktemp("o")
    w = ids_out.IdsWriter(str(d / "ids.npy"), np.dtype(np.uint16))
    sep = np.array([65000], np.uint16).tobytes() if with_sep else None
    out = ids_out.OrderedIds(w, sep, hold, lambda i: str(d / f"spill-{i}"))
    slots, next_piece, consumed = {}, [0] * len(chunks), 0
    leads = []
    choice = iter(choices)
    while consumed < len(chunks):
        actions = []
        for i in range(consumed, min(len(chunks), consumed + ahead)):
            if i not in slots:
                actions.append(("open", i))
            elif next_piece[i] < len(chunks[i][0]):
                actions.append(("put", i))
        if consumed in slots and next_piece[consumed] == len(chunks[consumed][0]):
            actions.append(("done", consumed))
        kind, i = actions[next(choice, 0) % len(actions)]
        if kind == "open":
            slots[i] = out.open(i)
            slots[i].start(chunks[i][1])
        elif kind == "put":
            slots[i].put(np.array(chunks[i][0][next_piece[i]], np.uint16))
            next_piece[i] += 1
        else:
            leads.append(out.done(i, chunks[i][2]))
            consumed += 1
    pairs, sizes = w.finish()
    want, items = [], 0
    for pieces, begins, n_items in chunks:
        lead = with_sep and begins and items > 0
        want += [65000] * lead + [x for p in pieces for x in p]
        items += n_items
    assert leads == [with_sep and c[1] and sum(x[2] for x in chunks[:k]) > 0 for k, c in enumerate(chunks)]
    assert np.load(pairs[0][0]).tolist() == want and sizes == [len(want)]
    assert sorted(os.listdir(d)) == sorted(os.path.basename(t) for t in w.temps)     # no spill left
    assert out.max_held <= hold


def test_a_chunk_that_waits_holds_up_to_the_bound_then_spills(tmp_path):
    """Hold of 3 bytes: one uint16 id is held, the rest spilled; at 4 bytes, two; the spill file is
    copied in after the held ids when the chunk's turn comes, then removed."""
    for hold, held_ids in ((3, 1), (4, 2), (5, 2), (6, 3), (0, 0)):
        d = tmp_path / str(hold)
        d.mkdir()
        w = ids_out.IdsWriter(str(d / "ids.npy"), np.dtype(np.uint16))
        out = ids_out.OrderedIds(w, None, hold, lambda i: str(d / f"spill-{i}"))
        b = out.open(1)
        b.start(False)
        b.put(np.array([10, 11], np.uint16))
        b.put(np.array([12], np.uint16))
        assert b.held_bytes == 2 * held_ids and b.spill_bytes == 6 - 2 * held_ids
        assert os.path.exists(d / "spill-1") == (held_ids < 3)
        a = out.open(0)
        a.start(False)
        a.put(np.array([1, 2], np.uint16))
        assert out.done(0, 1) is False and not os.path.exists(d / "spill-1")
        b.put(np.array([13], np.uint16))        # the head now: straight into the file
        out.done(1, 1)
        assert np.load(w.finish()[0][0][0]).tolist() == [1, 2, 10, 11, 12, 13]


# ==== encode_corpus end to end ================================================================


@pytest.fixture(scope="module")
def tok():
    vocab, merges, specials = small_model()
    return Tokenizer(vocab, merges, specials)


def old_npy(path, ids, dtype=np.uint16) -> bytes:
    """The old layout: ``open_memmap`` (header), then the ids."""
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(len(ids),))
    arr[:] = ids
    arr.flush()
    del arr
    return open(path, "rb").read()


def corpora(tmp_path) -> dict:
    text = fixture_text("corpus.en").encode()
    docs = [text[a: a + n] for a, n in ((0, 900), (1000, 40), (2000, 3000), (7000, 1))]
    cases = {
        "empty": b"",
        "one_doc": text[:5000],
        "huge_doc": (text[:4000].replace(b"\n", b" ") + b"x" * 3000) * 3,        # one document, no special
        "specials": SEP + SEP.join(docs) + SEP + SEP + b"  \n" + SEP,
        "invalid": b"\xff\xfe ab" + SEP + bytes(range(256)) * 3 + SEP + "été €".encode() * 50,
    }
    for name, data in cases.items():
        (tmp_path / f"{name}.txt").write_bytes(data)
    return cases


CHUNKS = [3, 97, 1000, 10**6]
HOLDS = [0, 1, 2, 3, 64, 10**9]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_byte_identical_to_the_old_layout(tmp_path, tok, monkeypatch, workers, chunk):
    """Every corpus, every hold bound (0 and 1 byte: everything spills; 2 and 3: one id held; 64;
    no bound), the chunk sizes and workers: the bytes of an ``open_memmap`` file of the whole-text
    ids, and no temp or spill file left."""
    cases = corpora(tmp_path)
    for hold in HOLDS:
        monkeypatch.setattr(ec, "_hold_bytes", lambda c, n, h=hold: h)
        for name, data in cases.items():
            out = tmp_path / f"{name}.npy"
            r = ec.encode_corpus(tmp_path / f"{name}.txt", tok, out, num_workers=workers, chunk_bytes=chunk,
                                 progress=False)
            want = old_npy(tmp_path / "want.npy", tok.encode(data))
            assert out.read_bytes() == want, (name, hold)
            assert r.n_tokens == (len(want) - 128) // 2 and r.n_bytes == len(data)
            if hold >= 10**9 or workers == 1:
                assert r.memory["spilled_ids_bytes"] == 0
            os.unlink(out)
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


@pytest.mark.parametrize("separator", [True, False])
@pytest.mark.parametrize("workers,chunk,hold", [(1, 50, 0), (2, 50, 0), (2, 50, 3), (2, 700, 10**9),
                                                (2, 10**6, 1), (1, 10**6, 10**9)])
def test_several_inputs_separators_and_doc_index(tmp_path, tok, monkeypatch, separator, workers, chunk, hold):
    """Items from several files and JSON Lines records: the separator id between two items (written
    when the chunk after it takes its turn), or none; the document index; byte-identical to the old
    layout of the whole corpus' ids."""
    monkeypatch.setattr(ec, "_hold_bytes", lambda c, n: hold)
    text = fixture_text("corpus.en").encode()
    files = []
    for k, part in enumerate([text[:700], b"", text[700:760], text[800:2900], b"x", text[3000:3001]]):
        (tmp_path / f"in{k}.txt").write_bytes(part)
        files.append(str(tmp_path / f"in{k}.txt"))
    records = [text[a:a + 300].decode("utf-8", "ignore") for a in range(0, 3000, 300)] + ["", "y"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in records))
    files.append(str(tmp_path / "in.jsonl"))
    # an empty file is no item (as before); an empty record is one
    items = [b for b in (open(f, "rb").read() for f in files[:-1]) if b] + [t.encode() for t in records]
    out, idx = tmp_path / "ids.npy", tmp_path / "idx.npy"
    ec.encode_corpus(files, tok, out, num_workers=workers, chunk_bytes=chunk, progress=False, separator=separator,
                     doc_index=idx)
    sep_id = tok.special_tokens[EOT]
    ids, starts = [], []
    for k, item in enumerate(items):
        if separator and k:
            ids.append(sep_id)
        starts.append(len(ids))
        ids += tok.encode(item)
    assert out.read_bytes() == old_npy(tmp_path / "want.npy", ids)
    want_idx = ([0] + [i + 1 for i, x in enumerate(ids) if x == sep_id]) if separator else starts
    assert np.load(idx).tolist() == want_idx
    # the array as np.save writes it, then the trailer naming the ids it indexes (formats.ids)
    array_bytes = _npy_bytes(tmp_path / "w.npy", np.array(want_idx, np.int64))
    assert idx.read_bytes().startswith(array_bytes + b"\n#bpe_core-doc-index ")
    assert bpe_core.load_ids(out, idx)[1].tolist() == want_idx


def _npy_bytes(path, arr) -> bytes:
    np.save(path, arr)
    return open(path, "rb").read()


@pytest.mark.parametrize("workers,hold", [(1, 10**9), (2, 0), (2, 5)])
@pytest.mark.parametrize("shard_tokens", [2, 7, 60, 10**6])
def test_shards_and_manifest(tmp_path, tok, monkeypatch, workers, hold, shard_tokens):
    """Shards of ``shard_tokens`` ids (written as they fill): each the old layout of its slice, the
    manifest lists them; a second run writes the next generation and removes the first."""
    monkeypatch.setattr(ec, "_hold_bytes", lambda c, n: hold)
    text = fixture_text("corpus.en").encode()
    data = SEP + text[:300] + SEP + text[400:500] + SEP + b" \n"
    (tmp_path / "in.txt").write_bytes(data)
    ids = tok.encode(data)
    for gen in (1, 2):
        r = ec.encode_corpus(tmp_path / "in.txt", tok, tmp_path / "ids.npy", num_workers=workers,
                             chunk_bytes=60, progress=False, shard_tokens=shard_tokens, doc_index=tmp_path / "i.npy")
        manifest = json.loads((tmp_path / "ids.manifest.json").read_text())
        n_shards = max(1, -(-len(ids) // shard_tokens))
        assert [s["path"] for s in manifest["shards"]] == [f"ids-g{gen}-{k:05d}.npy" for k in range(n_shards)]
        assert manifest["n_tokens"] == len(ids) and manifest["generation"] == gen and r.shards is not None
        for k, s in enumerate(manifest["shards"]):
            part = ids[k * shard_tokens: (k + 1) * shard_tokens]
            assert s["n_tokens"] == len(part) and s["first_token"] == k * shard_tokens
            assert (tmp_path / s["path"]).read_bytes() == old_npy(tmp_path / "want.npy", part)
        shards = sorted(n for n in os.listdir(tmp_path) if n.startswith("ids-"))
        assert shards == [s["path"] for s in manifest["shards"]]
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


def test_empty_corpus_sharded_has_one_empty_shard(tmp_path, tok):
    (tmp_path / "e.txt").write_bytes(b"")
    ec.encode_corpus(tmp_path / "e.txt", tok, tmp_path / "ids.npy", num_workers=2, progress=False, shard_tokens=5)
    manifest = json.loads((tmp_path / "ids.manifest.json").read_text())
    assert [s["n_tokens"] for s in manifest["shards"]] == [0]
    assert (tmp_path / manifest["shards"][0]["path"]).read_bytes() == old_npy(tmp_path / "w.npy", [])


def _smallest_budget(input_bytes: int, vocab_size: int) -> int:
    """The smallest budget (to 1 MiB) the encoding plan accepts for this process now: the plan counts
    this process's RSS, which grows over a long pytest run, so a fixed figure is tight in one run and
    refused in another."""
    from bpe_core.errors import BudgetError
    from bpe_core.runtime import budget as scheduler

    lo, hi = 1 << 20, 16 << 30
    while hi - lo > (1 << 20):
        mid = (lo + hi) // 2
        try:
            scheduler.plan_encoding(input_bytes, vocab_size, mid, num_workers=2, chunk_bytes=2000)
            hi = mid
        except BudgetError:
            lo = mid
    return hi


@pytest.mark.parametrize("budget", [None, "smallest", "smallest+64M", 4 << 30])
def test_budgets_give_the_same_bytes(tmp_path, tok, budget):
    """Under a budget the plan may give fewer workers or hold chunks back; the bytes are the same
    (no budget, the smallest one the plan accepts (+8 MiB: the RSS moves), a little above, a large one)."""
    data = corpora(tmp_path)["specials"] * 20
    (tmp_path / "big.txt").write_bytes(data)
    if isinstance(budget, str):
        budget = _smallest_budget(len(data), tok.n_vocab) + (72 << 20 if budget.endswith("64M") else 8 << 20)
    ec.encode_corpus(tmp_path / "big.txt", tok, tmp_path / "ids.npy", num_workers=2, chunk_bytes=2000,
                     memory_limit=budget, progress=False)
    assert (tmp_path / "ids.npy").read_bytes() == old_npy(tmp_path / "w.npy", tok.encode(data))


@pytest.mark.parametrize("workers", [1, 2])
def test_the_plans_cache_reaches_the_encoders(tmp_path, tok, monkeypatch, workers):
    """The plan's cache bound (``Plan.cache_entries``, made tiny here: 7 pretokens, cleared again and
    again) is what the encoders hold while they encode, the bytes are the same, and the tokenizer's
    encoders lent to the run come back with their own bound."""
    from bpe_core.encode.tokenizer import EncoderSpec
    from bpe_core.runtime import budget as scheduler

    monkeypatch.setattr(scheduler, "ENCODE_BIG_CACHE_MIN_INPUT", 0)
    monkeypatch.setattr(scheduler, "ENCODE_BIG_CACHE_ENTRIES", 7)
    seen = []
    ready = EncoderSpec._ready

    def watched(self):
        ready(self)
        seen.append((self._encoder, self._encoder.max_entries))

    monkeypatch.setattr(EncoderSpec, "_ready", watched)
    data = corpora(tmp_path)["specials"] * 5
    (tmp_path / "c.txt").write_bytes(data)
    t = Tokenizer(tok.vocab, tok.merges, tok.special_tokens)
    lent = [t._new_encoder(), t._new_encoder()]
    t._idle.extend(lent)
    r = ec.encode_corpus(tmp_path / "c.txt", t, tmp_path / "ids.npy", num_workers=workers, chunk_bytes=500,
                         progress=False)
    assert r.plan["cache_entries"] == 7 and seen and {m for _, m in seen} == {7}
    assert any(e is x for e, _ in seen for x in lent)         # (the lent ones were used)
    assert (tmp_path / "ids.npy").read_bytes() == old_npy(tmp_path / "w.npy", tok.encode(data))
    assert t._idle and {e.max_entries for e in t._idle} == {1 << 18}


def test_budgets_around_the_large_cache_give_the_same_bytes(tmp_path, tok, monkeypatch):
    """The large cache's budget threshold (``ENCODE_BIG_CACHE_SHARE``, its input threshold at 0 and
    its bound at 5 pretokens here), found for this process now: budgets 8 MiB below and above it
    (the RSS the plan counts moves a little), and far above; both choices are made, and every
    run writes the bytes of the whole-text ids."""
    from bpe_core.runtime import budget as scheduler

    monkeypatch.setattr(scheduler, "ENCODE_BIG_CACHE_MIN_INPUT", 0)
    monkeypatch.setattr(scheduler, "ENCODE_BIG_CACHE_ENTRIES", 5)
    data = corpora(tmp_path)["specials"] * 20
    (tmp_path / "big.txt").write_bytes(data)
    want = old_npy(tmp_path / "w.npy", tok.encode(data))
    lo, hi = _smallest_budget(len(data), tok.n_vocab), 16 << 30
    while hi - lo > (1 << 20):
        mid = (lo + hi) // 2
        big = scheduler.plan_encoding(len(data), tok.n_vocab, mid, num_workers=2, chunk_bytes=2000).cache_entries
        lo, hi = (lo, mid) if big else (mid, hi)
    chosen = set()
    for budget in (hi - (8 << 20), hi + (8 << 20), 4 << 30):
        r = ec.encode_corpus(tmp_path / "big.txt", tok, tmp_path / "ids.npy", num_workers=2, chunk_bytes=2000,
                             memory_limit=budget, progress=False)
        chosen.add(r.plan["cache_entries"])
        assert (tmp_path / "ids.npy").read_bytes() == want, budget
    assert chosen == {0, 5}


@pytest.mark.parametrize("uint32", [False, True])
def test_uint32_ids_direct(tmp_path, monkeypatch, uint32):
    monkeypatch.setattr(ec, "_hold_bytes", lambda c, n: 6)
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[70_000 if uint32 else 300] = b"ab"
    tok = Tokenizer(vocab, [(b"a", b"b")])
    data = b"abcab ab" * 200
    (tmp_path / "in.txt").write_bytes(data)
    ec.encode_corpus(tmp_path / "in.txt", tok, tmp_path / "ids.npy", num_workers=2, chunk_bytes=16, progress=False)
    dtype = np.uint32 if uint32 else np.uint16
    assert (tmp_path / "ids.npy").read_bytes() == old_npy(tmp_path / "w.npy", tok.encode(data), dtype)


# ==== Conservation at run time ================================================================


@pytest.mark.parametrize("workers", [1, 2])
def test_a_writer_that_loses_ids_publishes_nothing(tmp_path, tok, monkeypatch, workers):
    """A write that drops a byte (a fault injected into the writer): the run stops with an internal
    error naming the totals, and nothing is at the output path, no temp left."""
    corpora(tmp_path)
    real = ids_out.IdsWriter.write
    calls = [0]

    def lossy(self, data):
        calls[0] += 1
        if calls[0] == 3:
            self.written -= 1          # the writer's count and the file disagree from here on
        return real(self, data)

    monkeypatch.setattr(ids_out.IdsWriter, "write", lossy)
    with pytest.raises(InternalError, match="do not add up"):
        ec.encode_corpus(tmp_path / "specials.txt", tok, tmp_path / "ids.npy", num_workers=workers,
                         chunk_bytes=100, progress=False)
    assert not (tmp_path / "ids.npy").exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


def test_a_chunk_short_of_ids_publishes_nothing(tmp_path, tok, monkeypatch):
    """A slot that puts fewer ids than its worker counted (a lost piece): the per-chunk check stops
    the run."""
    corpora(tmp_path)
    real = ids_out.ChunkSlot.put

    def short(self, ids):
        return real(self, ids[:-1] if len(ids) > 1 and self.index == 2 else ids)

    monkeypatch.setattr(ids_out.ChunkSlot, "put", short)
    with pytest.raises(InternalError, match="do not add up"):
        ec.encode_corpus(tmp_path / "specials.txt", tok, tmp_path / "ids.npy", num_workers=2, chunk_bytes=100,
                         progress=False)
    assert sorted(os.listdir(tmp_path)) == sorted(f"{n}.txt" for n in corpora(tmp_path))


# ==== Signals in the middle of the encode phase ===============================================


def child_main(args, kill_after, sig) -> int:
    """Run ``tools/encode_corpus.py`` in this (forked) child with a hold of 2 ids, so chunks hold,
    spill and write straight in; the ``kill_after``-th ``ChunkSlot.put`` sends ``sig`` to this
    process (SIGKILL: it dies there; SIGTERM: the run stops and cleans up). Returns the exit code."""
    import runpy

    from bpe_core.encode import encode_corpus as mod
    from bpe_core.encode import ids_out as out_mod

    mod._hold_bytes = lambda c, n: 4
    real, n = out_mod.ChunkSlot.put, [0]

    def counted(self, ids):
        n[0] += 1
        if n[0] == kill_after:
            os.kill(os.getpid(), getattr(signal, sig))
        return real(self, ids)

    out_mod.ChunkSlot.put = counted
    sys.argv = [str(ENCODE), *map(str, args)]
    try:
        runpy.run_path(str(ENCODE), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_signal_while_encoding_leaves_no_partial_output(tmp_path, sig, sharded):
    """Killed after some chunks are in the output's temp file and others hold or spill: nothing at
    any output path (ids, shards, index, manifest); SIGTERM exits 143 with no temp or spill file
    left; after SIGKILL the next run removes what it left and writes the same bytes as a clean run."""
    vocab, merges, specials = small_model()
    d = tmp_path / "tok"
    d.mkdir()
    dump_model(Model(vocab=vocab, merges=merges, special_tokens=specials, pattern=resolve_pattern("gpt2")),
               d / "model.json")
    text = fixture_text("corpus.en").encode()
    (tmp_path / "in.txt").write_bytes((text[:20000] + SEP) * 10)
    work = tmp_path / "out"
    work.mkdir()
    args = [tmp_path / "in.txt", "--tokenizer", d, "--out", work / "ids.npy", "--doc-index", work / "idx.npy",
            "--workers", "2", "--chunk-size", "4k", "--no-progress"] + (["--shard-tokens", "9000"] if sharded else [])
    clean = call_in_child("test_corpus_direct", "child_main", [str(a) for a in args], 0, sig, cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    want = {n: (work / n).read_bytes() for n in os.listdir(work)}
    for n in list(want):
        os.unlink(work / n)
    r = call_in_child("test_corpus_direct", "child_main", [str(a) for a in args], 20, sig, cwd=tmp_path)
    assert r.returncode == (-signal.SIGKILL if sig == "SIGKILL" else 143), r.stderr
    assert [n for n in os.listdir(work) if not n.startswith(".")] == []
    if sig == "SIGTERM":
        assert leftovers(work) == []
    r = call_in_child("test_corpus_direct", "child_main", [str(a) for a in args], 0, sig, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert leftovers(work) == []
    assert {n: (work / n).read_bytes() for n in os.listdir(work)} == want     # the same generation: g1


@SETTINGS
@given(st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=6)), min_size=1, max_size=40))
def test_token_lengths_from_the_native_table_equal_the_decoder(entries):
    """The conservation check's lengths (``TokenTable.lengths``, from the offsets) equal the byte
    length of every id in the decoder, 0 for an unused id."""
    from bpe_core.encode import _encode

    want = [0 if b is None else len(b) for b in entries]
    assert _encode.TokenTable(entries).lengths().tolist() == want


def test_token_lengths_of_a_sparse_vocabulary(tok):
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[400] = b"abc"                     # ids 256..399 unused
    sparse = Tokenizer(vocab, [])
    for t in (tok, sparse):
        got = ec._token_lengths(t)
        assert got.dtype == np.int64
        assert got.tolist() == [0 if b is None else len(b) for b in t._decoder]
