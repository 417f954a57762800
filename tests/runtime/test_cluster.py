"""The data-parallel phases on a Dask cluster (``runtime.executors``) give the single-node results.

One ``LocalCluster`` for the module (2 worker processes, one thread each, 127.0.0.1, no dashboard).
Everything that a cluster run produces -- the word table, the merges, ``model.json``, the id array
-- is compared byte for byte with the single-node run on the same input, for several shard sizes;
and once more after a worker process is killed in the middle of a run.
"""
from paths import FIXTURES, TOOLS
import os
import pickle
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

distributed = pytest.importorskip("distributed")
fsspec = pytest.importorskip("fsspec")
import cloudpickle  # noqa: E402  (comes with distributed)

from bpe_core.config import TrainConfig  # noqa: E402
from strategies import SPECIAL, corpus_bytes  # noqa: E402
from bpe_core.corpus.ranges import check_source  # noqa: E402
from bpe_core.corpus.shards import Shard, source_shards  # noqa: E402
from bpe_core.encode.encode_corpus import encode_corpus, load_sharded_ids  # noqa: E402
from bpe_core.encode.tokenizer import Tokenizer  # noqa: E402
from bpe_core.errors import BudgetError, CorpusError, InputChanged, MissingDependency  # noqa: E402
from bpe_core.formats.model import MODEL_FILE, dump_folder  # noqa: E402
from bpe_core.methods.superbpe import combine_units  # noqa: E402
from bpe_core.engine.units import UnitCounter  # noqa: E402
from bpe_core.pretok.counting import combine_counts, count_corpus, count_shard, count_shards  # noqa: E402
from bpe_core.runtime.executors import DaskExecutor, LocalExecutor, open_executor  # noqa: E402
from bpe_core.training import train  # noqa: E402

# The tasks defined here travel to the workers by value (this file is not importable there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

FIXTURES = str(FIXTURES)
SPECIALS = ["<|endoftext|>"]


@pytest.fixture(scope="module")
def client():
    import logging

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None, silence_logs=logging.ERROR)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()
    _stop_resource_tracker()


def _stop_resource_tracker():
    """The worker processes are gone; so goes the ``multiprocessing`` resource tracker their start
    left behind (it would live until pytest exits, and later tests check that no child is left)."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    if hasattr(tracker, "_stop"):
        tracker._stop()
    elif getattr(tracker, "_pid", None):                 # Python < 3.11: what _stop does
        os.close(tracker._fd)
        os.waitpid(tracker._pid, 0)
        tracker._fd = tracker._pid = None


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """About 140 KB of English with document separators (tinystories + corpus.en, interleaved)."""
    text = open(os.path.join(FIXTURES, "corpus.en"), "rb").read()
    stories = open(os.path.join(FIXTURES, "tinystories_sample.txt"), "rb").read()
    parts = text.split(b"\n\n")
    body = b"<|endoftext|>".join(parts[i] + (stories if i % 50 == 0 else b"") for i in range(len(parts)))
    path = tmp_path_factory.mktemp("cluster") / "corpus.txt"
    path.write_bytes(body)
    return str(path)


def run_tool(name: str, args: list, env: dict = None, extra: list = ()) -> tuple:
    """Run ``tools/<name>.py``'s ``main`` in this process; returns (exit code, stderr)."""
    import contextlib
    import importlib
    import io

    tools = str(TOOLS)
    if tools not in sys.path:
        sys.path.insert(0, tools)
    module = importlib.import_module(name)
    err = io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = module.main([*args, *extra])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, err.getvalue()


def _tables_equal(a, b) -> bool:
    return (np.array_equal(a.arena, b.arena) and np.array_equal(a.offsets, b.offsets)
            and np.array_equal(a.counts, b.counts))


def _model_bytes(result, folder) -> bytes:
    os.makedirs(folder)
    dump_folder(result.model, str(folder))
    return open(os.path.join(folder, MODEL_FILE), "rb").read()


# ==== Counting ================================================================================


@pytest.mark.parametrize("chunk", [1500, 20000, 1 << 20])
def test_count_on_cluster_equals_single_node(client, corpus, chunk):
    specials = [s.encode() for s in SPECIALS]
    want = count_corpus(corpus, specials, "gpt2", 1, 1 << 20)
    shards = source_shards(corpus, chunk, specials, "gpt2")
    report = {"seconds": {}}
    got = count_shards(shards, specials, "gpt2", DaskExecutor(client), os.path.getsize(corpus), corpus,
                       report=report)
    assert _tables_equal(got, want)
    assert report["n_chunks"] == len(shards) and report["bytes_scanned"] == os.path.getsize(corpus)
    local = count_shards(shards, specials, "gpt2", LocalExecutor(2), os.path.getsize(corpus), corpus)
    assert _tables_equal(local, want)


def test_shards_cover_the_input_at_the_single_node_cuts(corpus):
    from bpe_core.corpus.chunks import file_chunks

    specials = [s.encode() for s in SPECIALS]
    shards = source_shards(corpus, 3000, specials, "gpt2")
    assert [(s.start, s.end) for s in shards] == file_chunks(corpus, 3000, specials, "gpt2")
    assert [s.index for s in shards] == list(range(len(shards)))
    url = source_shards("file://" + corpus, 3000, specials, "gpt2")
    assert [(s.start, s.end) for s in url] == [(s.start, s.end) for s in shards]
    assert url[3].read().tobytes() == shards[3].read().tobytes()


@settings(deadline=None)
@given(data=st.lists(corpus_bytes, min_size=1, max_size=6).map(b"".join), chunk=st.integers(1, 64),
       pattern=st.sampled_from(["gpt2", "o200k", r"\w+|\s+|[^\w\s]+"]), url=st.booleans())
def test_sharded_count_equals_count_corpus_on_random_input(tmp_path_factory, data, chunk, pattern, url):
    """Shards of a file or a ``file://`` URL, counted by tasks and combined in a tree, give the
    single-node table on random and adversarial bytes, for any shard size."""
    from bpe_core.pretok.patterns import pattern_name

    path = tmp_path_factory.mktemp("prop") / "c.txt"
    path.write_bytes(data)
    specials = [SPECIAL.encode()]
    want = count_corpus(str(path), specials, pattern, 1, 1 << 20)
    source = ("file://" if url else "") + str(path)
    shards = source_shards(source, chunk, specials, pattern_name(pattern))
    got = count_shards(shards, specials, pattern, LocalExecutor(2), len(data), source)
    assert _tables_equal(got, want)


def _concat(task, sep):
    return f"{task}{sep}"


def _join(parts):
    return "".join(parts)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 40), workers=st.integers(1, 3))
def test_local_map_reduce_keeps_task_order(n, workers):
    got = LocalExecutor(workers).map_reduce(_concat, list(range(n)), _join, shared=(",",))
    assert got == "".join(f"{i}," for i in range(n))


def test_dask_map_reduce_keeps_task_order(client):
    ex = DaskExecutor(client)
    for n in (1, 5, 17):
        assert ex.map_reduce(_concat, list(range(n)), _join, shared=(",",)) == "".join(f"{i}," for i in range(n))
    assert ex.map(_concat, list(range(7)), shared=(";",)) == [f"{i};" for i in range(7)]


@settings(max_examples=30, deadline=None)
@given(units=st.lists(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), max_size=6), max_size=9),
       cut=st.integers(0, 9))
def test_combine_units_is_associative_and_keeps_first_seen_order(units, cut):
    def table(chunk):
        c = UnitCounter()
        for u in chunk:
            c.add_units(np.array(u, np.uint32), np.array([0, len(u)], np.int64))
        return (*c.to_arrays(), len(chunk), len(chunk))

    parts = [table(chunk) for chunk in units]
    if not parts:
        return
    flat = combine_units(parts) if len(parts) > 1 else parts[0]
    cut = min(cut, len(parts))
    left, right = parts[:cut], parts[cut:]
    grouped = [combine_units(g) for g in (left, right) if g]
    tree = combine_units(grouped) if len(grouped) > 1 else grouped[0]
    for a, b in zip(flat[:3], tree[:3]):
        assert np.array_equal(a, b)
    assert flat[3:] == tree[3:] == (sum(len(c) for c in units),) * 2


def test_combine_counts_sums_totals(corpus):
    specials = [s.encode() for s in SPECIALS]
    shards = source_shards(corpus, 10000, specials, "gpt2")
    parts = [count_shard(s, specials, "gpt2") for s in shards]
    total = combine_counts([combine_counts(parts[:3]), combine_counts(parts[3:])])
    assert total.n_bytes == os.path.getsize(corpus)
    assert total.n_pretokens == sum(p.n_pretokens for p in parts) == int(total.table[2].sum())


# ==== Training: the same merges and model.json ===================================================


@pytest.mark.parametrize("method,chunk,split", [("bpe", 1500, None), ("bpe", 50000, None),
                                                ("superbpe", 4000, "hf"), ("superbpe", 9000, "units")])
def test_train_on_cluster_is_byte_identical(client, corpus, tmp_path, method, chunk, split):
    options = dict(vocab_size=600, special_tokens=tuple(SPECIALS), method=method,
                   **({"stage2_split": split} if split else {}))
    single = train(TrainConfig(input_path=corpus, num_workers=1, **options))
    on_cluster = train(TrainConfig(input_path=corpus, chunk_bytes=chunk, cluster=client, **options))
    assert on_cluster.merges == single.merges and on_cluster.vocab == single.vocab
    assert _model_bytes(on_cluster, tmp_path / "c") == _model_bytes(single, tmp_path / "s")
    report = on_cluster.report
    assert report["cluster"]["engine"] == "dask" and report["cluster"]["workers"] == 2
    assert report["cluster"]["tasks"] >= report["n_chunks"]
    assert set(report["cluster"]["worker_peak_rss_bytes"]) == set(client.scheduler_info()["workers"])
    if method == "superbpe":
        assert report["superbpe"] == single.report["superbpe"]


def test_train_from_url_input(client, corpus, tmp_path):
    """A ``file://`` URL on the cluster, and a ``memory://`` URL on this machine's threads."""
    options = dict(vocab_size=500, special_tokens=tuple(SPECIALS))
    single = train(TrainConfig(input_path=corpus, num_workers=1, **options))
    url = train(TrainConfig(input_path="file://" + corpus, chunk_bytes=8000, cluster=client, **options))
    assert url.merges == single.merges
    fsspec.filesystem("memory").pipe("/bpe_core_test/corpus.txt", open(corpus, "rb").read())
    mem = train(TrainConfig(input_path="memory://bpe_core_test/corpus.txt", chunk_bytes=8000, num_workers=2,
                            method="superbpe", **options))
    assert mem.merges == train(TrainConfig(input_path=corpus, num_workers=1, method="superbpe", **options)).merges
    assert _model_bytes(url, tmp_path / "u") == _model_bytes(single, tmp_path / "s")


# ==== Encoding: the same id array ===============================================================


@pytest.fixture(scope="module")
def tokenizer(corpus):
    r = train(TrainConfig(input_path=corpus, vocab_size=700, special_tokens=tuple(SPECIALS), num_workers=1))
    return Tokenizer(r.vocab, r.merges, SPECIALS)


@pytest.mark.parametrize("chunk", [2000, 1 << 20])
def test_encode_on_cluster_is_byte_identical(client, corpus, tokenizer, tmp_path, chunk):
    single = encode_corpus(corpus, tokenizer, tmp_path / "single.npy", num_workers=1, progress=False)
    got = encode_corpus(corpus, tokenizer, tmp_path / "cluster.npy", chunk_bytes=chunk, progress=False,
                        cluster=client, verify=True)
    assert open(tmp_path / "cluster.npy", "rb").read() == open(tmp_path / "single.npy", "rb").read()
    assert got.n_tokens == single.n_tokens and got.verified_bytes > 0 and got.cluster["engine"] == "dask"
    assert sorted(os.listdir(tmp_path)) == ["cluster.npy", "single.npy"]      # no temp or spill left


def test_encode_superbpe_model_and_url_input(client, corpus, tmp_path):
    r = train(TrainConfig(input_path=corpus, vocab_size=650, special_tokens=tuple(SPECIALS), method="superbpe",
                          num_workers=1))
    folder = tmp_path / "tok"
    folder.mkdir()
    dump_folder(r.model, str(folder))
    tok = Tokenizer.load(str(folder))
    encode_corpus(corpus, tok, tmp_path / "single.npy", num_workers=1, progress=False)
    encode_corpus("file://" + corpus, tok, tmp_path / "cluster.npy", chunk_bytes=5000, progress=False,
                  cluster=client)
    assert open(tmp_path / "cluster.npy", "rb").read() == open(tmp_path / "single.npy", "rb").read()


def test_encode_failure_leaves_nothing(client, tmp_path, tokenizer):
    bad = tmp_path / "gone.txt"
    with pytest.raises(CorpusError, match="no such file"):
        encode_corpus("file://" + str(bad), tokenizer, tmp_path / "ids.npy", progress=False, cluster=client)
    assert os.listdir(tmp_path) == []


def test_encode_to_url_parts_with_a_manifest(client, corpus, tokenizer, tmp_path):
    single = encode_corpus(corpus, tokenizer, tmp_path / "single.npy", num_workers=1, progress=False)
    want = np.load(tmp_path / "single.npy")
    url = "file://" + str(tmp_path / "parts")
    got = encode_corpus(corpus, tokenizer, url, chunk_bytes=20000, progress=False, cluster=client)
    assert got.n_tokens == single.n_tokens and got.n_chunks > 3
    ids = load_sharded_ids(url)
    assert ids.dtype == want.dtype and np.array_equal(ids, want)
    with pytest.raises(CorpusError, match="already holds"):
        encode_corpus(corpus, tokenizer, url, progress=False, cluster=client)
    # on this machine's threads, into memory://
    encode_corpus(corpus, tokenizer, "memory://bpe_core_test/ids", chunk_bytes=30000, progress=False, num_workers=2)
    assert np.array_equal(load_sharded_ids("memory://bpe_core_test/ids"), want)
    with pytest.raises(CorpusError, match="no manifest"):
        load_sharded_ids("memory://bpe_core_test/none")


# ==== Worker loss ================================================================================


def _slow_count(shard, specials, pattern):
    time.sleep(0.15)
    return count_shard(shard, specials, pattern)


def test_a_killed_worker_changes_nothing(client, corpus):
    """Kill one worker process while tasks run: Dask recomputes what it held; same table."""
    import psutil

    specials = [s.encode() for s in SPECIALS]
    want = count_corpus(corpus, specials, "gpt2", 1, 1 << 20)
    shards = source_shards(corpus, 4000, specials, "gpt2")
    assert len(shards) >= 24
    pids = client.run(os.getpid)
    victim = sorted(pids.values())[0]
    killed = {}

    def kill():
        time.sleep(1.0)                 # a few tasks (and combines) done, most still to run
        psutil.Process(victim).kill()
        killed["at"] = time.monotonic()

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        total = DaskExecutor(client).map_reduce(_slow_count, shards, combine_counts,
                                                shared=(specials, "gpt2"))
        finished = time.monotonic()
    finally:
        killer.join()
    assert killed["at"] < finished, "the kill must land during the run"
    table = total.table
    assert np.array_equal(table[0], want.arena) and np.array_equal(table[2], want.counts)
    assert total.n_bytes == os.path.getsize(corpus)
    client.wait_for_workers(2, timeout=30)          # the nanny restarts it for the next tests
    assert victim not in client.run(os.getpid).values()


# ==== Errors: one clear line ======================================================================


def test_errors_cross_process_boundaries_intact():
    for exc in (CorpusError("a.txt", "no such file"), InputChanged("a.txt", "changed"),
                BudgetError("needs 2 GiB", 2 << 30)):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
    assert pickle.loads(pickle.dumps(BudgetError("x", 5))).min_budget == 5


def test_input_changed_on_a_worker_reaches_the_client(client, tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"hello world " * 1000)
    shards = source_shards(str(path), 3000, [], "gpt2")
    path.write_bytes(b"hello world " * 10)
    with pytest.raises(InputChanged, match="changed while it was read"):
        count_shards(shards, [], "gpt2", DaskExecutor(client), 12000, str(path))


def test_missing_dask_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(MissingDependency, match=r'pip install "dask\[distributed\]" fsspec'):
        with open_executor("local:2"):
            pass
    path = tmp_path / "c.txt"
    path.write_bytes(b"hello world")
    code, err = run_tool("train_bpe", [str(path), "--vocab-size", "260", "--out", str(tmp_path / "o"),
                                       "--cluster", "local:2"])
    assert code == 2 and err.count("\n") == 1 and 'pip install "dask[distributed]"' in err


def test_bad_cluster_specs():
    for spec, msg in (("local:0", "N >= 1"), ("loca", "expected local:N"), (3, "expected local:N")):
        with pytest.raises(ValueError, match=msg):
            TrainConfig(input_path="x", vocab_size=300, cluster=spec)


def test_url_inputs_are_checked(tmp_path):
    fsspec.filesystem("memory").pipe("/bpe_core_test/gz.txt", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03rest")
    with pytest.raises(CorpusError, match="gzip-compressed"):
        check_source("memory://bpe_core_test/gz.txt")
    with pytest.raises(CorpusError, match="no such file"):
        train(TrainConfig(input_path="memory://bpe_core_test/none.txt", vocab_size=300))
    fsspec.filesystem("memory").pipe("/bpe_core_test/t.txt", b"hello")
    # a method that reads its input twice as one local file gets the URL spooled, as a .gz would be
    r = train(TrainConfig(input_path="memory://bpe_core_test/t.txt", vocab_size=300, method="supratok"))
    assert r.report["spooled"]["spooled_bytes"] == 5
    with pytest.raises(InputChanged):
        Shard("memory://bpe_core_test/t.txt", 0, 9).read()
    with pytest.raises(CorpusError, match="every worker sees"):
        Shard(str(tmp_path / "not-here.txt"), 0, 9).read()


# ==== The tools ================================================================================


def test_tools_take_a_scheduler_address(client, corpus, tmp_path):
    address = client.scheduler.address
    code, err = run_tool("train_bpe", [corpus, "--vocab-size", "520", "--out", str(tmp_path / "c"),
                                       "--cluster", address, "--chunk-bytes", "8K", "--progress", "none"])
    assert code == 0, err
    code, err = run_tool("train_bpe", [corpus, "--vocab-size", "520", "--out", str(tmp_path / "s"),
                                       "--workers", "1", "--progress", "none"])
    assert code == 0, err
    model = lambda d: open(tmp_path / d / MODEL_FILE, "rb").read()  # noqa: E731
    assert model("c") == model("s")
    code, err = run_tool("encode_corpus", [corpus, "--tokenizer", str(tmp_path / "s"), "--out",
                                           str(tmp_path / "c.npy"), "--progress", "none", "--chunk-size", "8K"],
                         env={"DASK_SCHEDULER_ADDRESS": address}, extra=["--cluster"])
    assert code == 0, err
    code, err = run_tool("encode_corpus", [corpus, "--tokenizer", str(tmp_path / "s"), "--out",
                                           str(tmp_path / "s.npy"), "--workers", "1", "--progress", "none"])
    assert code == 0, err
    assert open(tmp_path / "c.npy", "rb").read() == open(tmp_path / "s.npy", "rb").read()


def test_empty_input_on_cluster(client, tmp_path, tokenizer):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    r = train(TrainConfig(input_path=str(path), vocab_size=300, cluster=client))
    assert r.merges == [] and r.report["unique_pretokens"] == 0
    encode_corpus(str(path), tokenizer, tmp_path / "ids.npy", progress=False, cluster=client)
    assert np.load(tmp_path / "ids.npy").shape == (0,)


# ==== Every input of docs/inputs.md on the cluster (corpus.shards input shards as tasks) ========


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The same documents in every container: plain files (one empty), .gz, .zst, JSON Lines (with a
    bad record), .jsonl.zst, Parquet with row groups of 20 rows; about 40 KB each."""
    import gzip
    import json

    zstandard = pytest.importorskip("zstandard")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    d = tmp_path_factory.mktemp("inputs")
    lines = open(os.path.join(FIXTURES, "corpus.en"), "rb").read().split(b"\n")
    docs = [b"\n".join(lines[i:i + 4]) for i in range(0, 1000, 4)]
    a, b, c = docs[:83], docs[83:166], docs[166:]
    # a uuencoded attachment in b and c, so SuperBPE's encoded regions are marked on the workers too
    import binascii
    import random
    rng = random.Random(5)
    blob = bytes(rng.randrange(256) for _ in range(45 * 30))
    uu = b"begin 644 a.gif\n" + b"".join(binascii.b2a_uu(blob[i:i + 45], backtick=True)
                                          for i in range(0, len(blob), 45)) + b"end\n"
    b, c = b[:40] + [uu] + b[40:], c[:30] + [uu] + c[30:]
    sep = SPECIALS[0].encode()
    (d / "many").mkdir()
    (d / "many" / "a.txt").write_bytes(sep.join(a))
    (d / "many" / "b.txt").write_bytes(b"")
    (d / "many" / "c.txt").write_bytes(sep.join(b))
    (d / "c.txt.gz").write_bytes(gzip.compress(sep.join(c)))
    (d / "b.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(sep.join(b)))
    records = b"".join(json.dumps({"text": x.decode("utf-8", "replace")}).encode() + b"\n" for x in a)
    records = records + b'{"no_text": 1}\n' + records[:2000].rsplit(b"\n", 1)[0] + b"\n"
    (d / "r.jsonl").write_bytes(records)
    (d / "r.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(records))
    pq.write_table(pa.table({"text": [x.decode("utf-8", "replace") for x in c]}), str(d / "p.parquet"),
                   row_group_size=20)
    return {"many": str(d / "many"), "gz": str(d / "c.txt.gz"), "zst": str(d / "b.txt.zst"),
            "jsonl": str(d / "r.jsonl"), "jsonl.zst": str(d / "r.jsonl.zst"), "parquet": str(d / "p.parquet"),
            "mixed": [str(d / "many" / "a.txt"), str(d / "r.jsonl.zst"), str(d / "p.parquet"), str(d / "c.txt.gz"),
                      str(d / "r.jsonl")]}


#: What the single-node run reports about its input, which the cluster run must report the same.
REPORT_KEYS = ("items", "documents", "separators_inserted", "bad_records", "corpus_bytes", "bytes_scanned",
               "input_bytes", "special_token_occurrences", "pretokens_counted", "unique_pretokens", "pretokens",
               "n_chunks")
KINDS = ("many", "gz", "zst", "jsonl", "jsonl.zst", "parquet", "mixed")


def every_input(cells):
    """``(kind, *cell)`` for every kind and cell. The default run: every cell on ``mixed`` (a.txt,
    .jsonl.zst, Parquet, .gz and .jsonl one after another: every container but plain .zst, cut at
    each chunk size) and on ``many`` (a folder with an empty file and a.txt, whose size the chunks
    41381/41383 straddle); each other kind alone on the first cell (the smallest chunks, the most
    shards), plain .zst on the last one too. ``--slow`` runs the whole cross (the same code paths,
    each container alone)."""
    params = []
    for kind in KINDS:
        for i, cell in enumerate(cells):
            default = kind in ("mixed", "many") or i == 0 or (kind == "zst" and i == len(cells) - 1)
            params.append(pytest.param(kind, *cell, marks=() if default else pytest.mark.slow))
    return params


# chunk sizes: many shards; about one row group / one JSONL range per 2-3 KB; around a.txt's size
# (41,382 bytes: one shard, or two); larger than every input (one shard per file).
@pytest.mark.parametrize("kind,chunk", every_input([(1500,), (8000,), (41381,), (41383,), (1 << 20,)]))
def test_train_every_input_on_cluster(client, inputs, tmp_path, kind, chunk):
    options = dict(vocab_size=380, special_tokens=tuple(SPECIALS), skip_bad_records=True, chunk_bytes=chunk)
    single = train(TrainConfig(input_path=inputs[kind], num_workers=1, **options))
    on_cluster = train(TrainConfig(input_path=inputs[kind], cluster=client, **options))
    assert on_cluster.merges == single.merges and on_cluster.vocab == single.vocab
    assert _model_bytes(on_cluster, tmp_path / "c") == _model_bytes(single, tmp_path / "s")
    for key in REPORT_KEYS:
        assert on_cluster.report[key] == single.report[key], key
    assert on_cluster.report["cluster"]["engine"] == "dask"
    if kind in ("jsonl", "jsonl.zst", "mixed"):
        assert on_cluster.report["bad_records"]["skipped"] >= 1


@pytest.mark.parametrize("kind,chunk,split", [("mixed", 3000, "hf"), ("jsonl.zst", 1 << 20, "units"),
                                              ("many", 5000, "hf"), ("parquet", 2000, "units"),
                                              ("mixed", 3000, "official")])
def test_superbpe_every_input_on_cluster(client, inputs, tmp_path, kind, chunk, split):
    """SuperBPE's stage-2 units are counted over the same shards on the workers (no spooled copy on
    the client); the model equals the single-node one, which reads a spooled copy. The official
    split reads one local file: the client spools the inputs first, then counts that on the cluster."""
    options = dict(vocab_size=450, special_tokens=tuple(SPECIALS), skip_bad_records=True, chunk_bytes=chunk,
                   method="superbpe", stage2_split=split)
    single = train(TrainConfig(input_path=inputs[kind], num_workers=1, **options))
    on_cluster = train(TrainConfig(input_path=inputs[kind], cluster=client, **options))
    assert "spooled" in single.report and ("spooled" in on_cluster.report) == (split == "official")
    assert on_cluster.merges == single.merges
    assert _model_bytes(on_cluster, tmp_path / "c") == _model_bytes(single, tmp_path / "s")
    assert on_cluster.report["superbpe"] == single.report["superbpe"]
    if split != "official" and kind != "jsonl.zst":      # the inputs with the uuencoded document
        assert on_cluster.report["superbpe"]["stage2_encoded_units"] > 0
    for key in ("documents", "corpus_bytes", "special_token_occurrences", "bad_records"):
        assert on_cluster.report[key] == single.report[key], key


@pytest.fixture(scope="module")
def inputs_tokenizer(inputs):
    r = train(TrainConfig(input_path=inputs["many"], vocab_size=420, special_tokens=tuple(SPECIALS), num_workers=1))
    return Tokenizer(r.vocab, r.merges, SPECIALS)


def _files(folder) -> dict:
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("kind,chunk,options", every_input([
    (1500, {}),
    (8000, {"doc_index": True, "shard_tokens": 3000}),        # slices spanning two shard files
    (41383, {"separator": False, "doc_index": True}),         # items kept apart, documents from the tasks
    (1 << 20, {"verify": True}),
]))
def test_encode_every_input_on_cluster(client, inputs, inputs_tokenizer, tmp_path, kind, chunk, options):
    runs = {}
    for mode in ("single", "cluster"):
        folder = tmp_path / mode
        folder.mkdir()
        kw = dict(options)
        if kw.get("doc_index"):
            kw["doc_index"] = folder / "docs.npy"
        where = {"num_workers": 1} if mode == "single" else {"cluster": client}
        runs[mode] = encode_corpus(inputs[kind], inputs_tokenizer, folder / "ids.npy", chunk_bytes=chunk,
                                   progress=False, skip_bad_records=True, **where, **kw)
    single, got = runs["single"], runs["cluster"]
    assert _files(tmp_path / "cluster") == _files(tmp_path / "single")      # ids, shards, manifest, index
    assert (got.n_tokens, got.n_bytes, got.n_documents, got.bad_records, got.n_chunks, got.verified_bytes) == \
        (single.n_tokens, single.n_bytes, single.n_documents, single.bad_records, single.n_chunks,
         single.verified_bytes)
    assert got.cluster["engine"] == "dask"
    if options.get("shard_tokens"):
        assert len(got.shards) > 1


def test_bad_record_on_cluster_is_the_single_node_line(client, inputs, inputs_tokenizer, tmp_path):
    for kind in ("jsonl", "jsonl.zst"):
        with pytest.raises(CorpusError) as want:
            train(TrainConfig(input_path=inputs[kind], vocab_size=300, special_tokens=tuple(SPECIALS), num_workers=1,
                              chunk_bytes=3000))
        with pytest.raises(CorpusError) as got:
            train(TrainConfig(input_path=inputs[kind], vocab_size=300, special_tokens=tuple(SPECIALS), cluster=client,
                              chunk_bytes=3000))
        assert str(got.value) == str(want.value) and "line 84" in str(got.value)
        with pytest.raises(CorpusError, match="line 84"):
            encode_corpus(inputs[kind], inputs_tokenizer, tmp_path / "ids.npy", progress=False, cluster=client,
                          chunk_bytes=3000)
        assert os.listdir(tmp_path) == []


def test_streams_are_refused_on_cluster_in_one_line(client, inputs_tokenizer, tmp_path):
    for spec, what in (("-", "standard input"), (iter(["a b", "c"]), "iterator")):
        with pytest.raises(ValueError, match=what) as info:
            train(TrainConfig(input_path=spec, vocab_size=300, cluster=client))
        assert "\n" not in str(info.value) and "cluster" in str(info.value)
    with pytest.raises(ValueError, match="standard input"):
        encode_corpus("-", inputs_tokenizer, tmp_path / "ids.npy", progress=False, cluster=client)
    assert os.listdir(tmp_path) == []


def _slow_source_count(shard, specials, pattern):
    time.sleep(0.15)
    from bpe_core.pretok.counting import count_source_shard

    return count_source_shard(shard, specials, pattern)


def test_a_killed_worker_changes_nothing_for_many_inputs(client, inputs):
    """As above, over the shards of many containers (byte ranges, row groups, compressed files)."""
    import psutil
    from bpe_core.corpus.inputs import expand_inputs
    from bpe_core.corpus.shards import ReadOptions

    specials = [s.encode() for s in SPECIALS]

    def opts():
        from bpe_core.corpus.readers import BadRecords

        return ReadOptions(chunk_bytes=3000, special_tokens=specials, pattern="gpt2", bad=BadRecords(skip=True))

    sources = expand_inputs(inputs["mixed"])
    want = count_corpus(sources, specials, "gpt2", 1, 3000, read_options=opts())
    o = opts()
    shards = [sh for src in sources for sh in src.shards(o)]
    assert len(shards) >= 24
    victim = sorted(client.run(os.getpid).values())[0]
    killed = {}

    def kill():
        time.sleep(1.0)
        psutil.Process(victim).kill()
        killed["at"] = time.monotonic()

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        total = DaskExecutor(client).map_reduce(_slow_source_count, shards, combine_counts,
                                                shared=(specials, "gpt2"))
        finished = time.monotonic()
    finally:
        killer.join()
    assert killed["at"] < finished, "the kill must land during the run"
    assert np.array_equal(total.table[0], want.arena) and np.array_equal(total.table[2], want.counts)
    single = {"seconds": {}}
    count_corpus(sources, specials, "gpt2", 1, 3000, read_options=opts(), report=single)
    assert total.n_items == single["items"] and total.joins == single["separators_inserted"]
    assert total.bad["skipped"] == single["bad_records"]["skipped"]
    client.wait_for_workers(2, timeout=30)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=12),
       st.data())
@settings(max_examples=60, deadline=None)
def test_combine_counts_items_and_joins_in_any_tree(parts, data):
    """Items and joins (separators between items) folded in any tree of consecutive groups equal
    the sequential count of ``count_corpus`` (a join: a part that begins an item after an item)."""
    from bpe_core.pretok.counting import ChunkCount
    from bpe_core.pretok.wordtable import WordTable

    empty = WordTable.empty()
    leaves = [ChunkCount((empty.arena, empty.offsets, empty.counts), 0, 0, 0, 0, begins, n + int(begins), 0, joins)
              for begins, n, joins in parts]
    seen = want_joins = 0
    for leaf in leaves:
        want_joins += leaf.joins + int(leaf.begins_item and seen > 0)
        seen += leaf.n_items
    level = list(leaves)
    while len(level) > 1:                    # random consecutive groups, level by level
        out, i = [], 0
        while i < len(level):
            k = data.draw(st.integers(1, 4))
            out.append(combine_counts(level[i:i + k]))
            i += k
        level = out
    root = combine_counts(level)
    assert root.n_items == seen and root.joins == want_joins


def test_tools_take_every_input_on_a_cluster(client, inputs, tmp_path):
    address = client.scheduler.address
    files = inputs["mixed"][:4]
    common = ["--vocab-size", "360", "--progress", "none", "--chunk-bytes", "4K", "--skip-bad-records"]
    assert run_tool("train_bpe", [*files, "--out", str(tmp_path / "c"), "--cluster", address, *common])[0] == 0
    assert run_tool("train_bpe", [*files, "--out", str(tmp_path / "s"), "--workers", "1", *common])[0] == 0
    assert open(tmp_path / "c" / MODEL_FILE, "rb").read() == open(tmp_path / "s" / MODEL_FILE, "rb").read()
    enc = ["--tokenizer", str(tmp_path / "s"), "--progress", "none", "--chunk-size", "4K", "--skip-bad-records",
           "--shard-tokens", "4000"]
    code, err = run_tool("encode_corpus", [*files, "--out", str(tmp_path / "c.npy"), "--cluster", address, *enc])
    assert code == 0, err
    code, err = run_tool("encode_corpus", [*files, "--out", str(tmp_path / "s.npy"), "--workers", "1", *enc])
    assert code == 0, err
    names = sorted(n for n in os.listdir(tmp_path) if n.startswith("c-") or n.startswith("c."))
    assert len(names) > 2
    assert "c.manifest.json" in names
    for name in names:               # the manifest names its shards: c-g1-00000.npy where the other has s-...
        got = open(tmp_path / name, "rb").read().replace(b'"c-g', b'"s-g')
        assert got == open(tmp_path / ("s" + name[1:]), "rb").read(), name
    code, err = run_tool("train_bpe", ["-", "--vocab-size", "300", "--out", str(tmp_path / "x"), "--cluster", address,
                                       "--progress", "none"])
    assert code == 2 and err.count("\n") == 1 and "standard input" in err


def test_local_clusters_start_without_malloc_trimming_or_profiler(monkeypatch):
    """What ``open_executor("local:N")`` changes in the config its nannies copy (docs/cluster.md)."""
    import dask

    from bpe_core.runtime.executors import PROFILE_ENV, TRIM_ENV, _quiet_workers

    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.delenv(TRIM_ENV, raising=False)
    with _quiet_workers():
        assert dask.config.get("distributed.worker.profile.enabled") is False
        environ = dask.config.get("distributed.nanny.pre-spawn-environ")
        assert TRIM_ENV not in environ and environ.get("OMP_NUM_THREADS") == 1
    assert TRIM_ENV in dask.config.get("distributed.nanny.pre-spawn-environ")
    monkeypatch.setenv(TRIM_ENV, "65536")
    monkeypatch.setenv(PROFILE_ENV, "True")
    with _quiet_workers():
        assert TRIM_ENV in dask.config.get("distributed.nanny.pre-spawn-environ")
        assert dask.config.get("distributed.worker.profile.enabled") is not False


# ==== fsspec URL inputs: every container, many files, globs (corpus.ranges through fsspec) =========


def _unurl(value):
    """A report value with ``file://`` taken out of the messages (bad records name the URL)."""
    if isinstance(value, dict) and "examples" in value:
        return dict(value, examples=[e.replace("file://", "", 1) for e in value["examples"]])
    return value


def _url(spec):
    """``file://`` URLs of the local inputs (workers are processes: ``memory://`` would not reach them)."""
    return [_url(s) for s in spec] if isinstance(spec, list) else "file://" + spec


@pytest.mark.parametrize("kind", KINDS)
def test_train_every_input_from_urls_on_cluster(client, inputs, tmp_path, kind):
    """The same inputs as ``file://`` URLs (a folder URL for ``many``, a list for ``mixed``) on the
    cluster: the model and the report's totals are those of the local paths on one machine."""
    options = dict(vocab_size=380, special_tokens=tuple(SPECIALS), skip_bad_records=True, chunk_bytes=3000)
    single = train(TrainConfig(input_path=inputs[kind], num_workers=1, **options))
    on_cluster = train(TrainConfig(input_path=_url(inputs[kind]), cluster=client, **options))
    assert _model_bytes(on_cluster, tmp_path / "c") == _model_bytes(single, tmp_path / "s")
    for key in REPORT_KEYS:
        assert _unurl(on_cluster.report[key]) == single.report[key], key
    assert on_cluster.report["inputs"] == single.report["inputs"]


def test_train_urls_on_this_machine(inputs, tmp_path):
    """Without a cluster this machine's threads read the URLs: ``memory://`` copies of the mixed
    inputs (and a ``file://`` glob) give the local model."""
    options = dict(vocab_size=380, special_tokens=tuple(SPECIALS), skip_bad_records=True, chunk_bytes=3000,
                   num_workers=2)
    mem = fsspec.filesystem("memory")
    urls = []
    for k, path in enumerate(inputs["mixed"]):
        name = f"/bpe_core_urls/{k}-{os.path.basename(path)}"
        mem.pipe(name, open(path, "rb").read())
        urls.append("memory://" + name.lstrip("/"))
    single = train(TrainConfig(input_path=inputs["mixed"], **options))
    got = train(TrainConfig(input_path=urls, **options))
    assert _model_bytes(got, tmp_path / "m") == _model_bytes(single, tmp_path / "s")
    for key in REPORT_KEYS:
        if key != "bad_records":
            assert got.report[key] == single.report[key], key
    assert got.report["bad_records"]["skipped"] == single.report["bad_records"]["skipped"]
    folder = os.path.dirname(inputs["jsonl"])
    want = train(TrainConfig(input_path=os.path.join(folder, "r.jsonl*"), **options))
    glob = train(TrainConfig(input_path="file://" + os.path.join(folder, "r.jsonl*"), **options))
    assert glob.report["inputs"] == 2 and glob.merges == want.merges


@pytest.mark.parametrize("split,where", [("hf", "cluster"), ("units", "cluster"), ("hf", "here")])
def test_superbpe_from_urls(client, inputs, tmp_path, split, where):
    """SuperBPE's stage-2 units over the shards of URL inputs (on the cluster, or on this machine's
    threads), with no spooled copy: the model of the local paths."""
    options = dict(vocab_size=450, special_tokens=tuple(SPECIALS), skip_bad_records=True, chunk_bytes=3000,
                   method="superbpe", stage2_split=split)
    single = train(TrainConfig(input_path=inputs["mixed"], num_workers=1, **options))
    run = {"cluster": client} if where == "cluster" else {"num_workers": 2}
    got = train(TrainConfig(input_path=_url(inputs["mixed"]), **run, **options))
    assert "spooled" not in got.report
    assert _model_bytes(got, tmp_path / "u") == _model_bytes(single, tmp_path / "s")
    assert got.report["superbpe"] == single.report["superbpe"]


@pytest.mark.parametrize("kind,options", [
    ("mixed", {"doc_index": True, "shard_tokens": 3000}),
    ("many", {"verify": True}),
    ("parquet", {"separator": False, "doc_index": True}),
    ("jsonl.zst", {}), ("gz", {}), ("zst", {}), ("jsonl", {}),
])
def test_encode_every_input_from_urls_on_cluster(client, inputs, inputs_tokenizer, tmp_path, kind, options):
    runs = {}
    for mode in ("single", "cluster"):
        folder = tmp_path / mode
        folder.mkdir()
        kw = dict(options)
        if kw.get("doc_index"):
            kw["doc_index"] = folder / "docs.npy"
        if mode == "single":
            where, spec = {"num_workers": 1}, inputs[kind]
        else:
            where, spec = {"cluster": client}, _url(inputs[kind])
        runs[mode] = encode_corpus(spec, inputs_tokenizer, folder / "ids.npy", chunk_bytes=3000,
                                   progress=False, skip_bad_records=True, **where, **kw)
    single, got = runs["single"], runs["cluster"]
    assert _files(tmp_path / "cluster") == _files(tmp_path / "single")      # ids, shards, manifest, index
    assert (got.n_tokens, got.n_bytes, got.n_documents, _unurl(got.bad_records), got.n_chunks) == \
        (single.n_tokens, single.n_bytes, single.n_documents, single.bad_records, single.n_chunks)


def test_encode_urls_to_url_parts(client, inputs, inputs_tokenizer, tmp_path):
    """URL inputs of every container into URL parts with a manifest (on the cluster, and into
    ``memory://`` on this machine): concatenated they are the local single-node ids. A first shard
    with no item (a JSON Lines file of blank lines) puts no separator before the next one."""
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b"\n\n\n")
    specs = [str(blank)] + inputs["mixed"]
    encode_corpus(specs, inputs_tokenizer, tmp_path / "single.npy", num_workers=1, progress=False,
                  skip_bad_records=True, chunk_bytes=3000)
    want = np.load(tmp_path / "single.npy")
    out = "file://" + str(tmp_path / "parts")
    got = encode_corpus(_url(specs), inputs_tokenizer, out, chunk_bytes=3000, progress=False, cluster=client,
                        skip_bad_records=True, verify=True)
    assert got.n_tokens == len(want) and got.bad_records["skipped"] >= 1 and got.verified_bytes > 0
    assert np.array_equal(load_sharded_ids(out), want)
    encode_corpus(_url(specs), inputs_tokenizer, "memory://bpe_core_urls/parts", chunk_bytes=5000, progress=False,
                  num_workers=2, skip_bad_records=True)
    assert np.array_equal(load_sharded_ids("memory://bpe_core_urls/parts"), want)


def test_bad_url_inputs_are_one_line(client, inputs, inputs_tokenizer, tmp_path):
    """A missing URL, a pattern that matches nothing, a format not read here, a Parquet file that is
    not one, and a bad record: one line naming the URL, from the API and from the tools (exit 2)."""
    tok = tmp_path / "tok"
    tok.mkdir()
    dump_folder(train(TrainConfig(input_path=inputs["gz"], vocab_size=300, special_tokens=tuple(SPECIALS))).model,
                str(tok))
    (tmp_path / "x.lz4").write_bytes(b"\x04\x22\x4d\x18" + b"\0" * 20)
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really parquet")
    cases = [("file://" + str(tmp_path / "gone.txt"), "no such file"),
             ("file://" + str(tmp_path / "*.none"), "no file matches"),
             ("file://" + str(tmp_path / "x.lz4"), "lz4-compressed"),
             ("file://" + str(tmp_path / "bad.parquet"), "not a readable Parquet file")]
    for url, message in cases:
        with pytest.raises(CorpusError, match=message) as info:
            train(TrainConfig(input_path=url, vocab_size=300, cluster=client))
        assert str(info.value).startswith(url) and "\n" not in str(info.value)
        code, err = run_tool("train_bpe", [url, "--vocab-size", "300", "--out", str(tmp_path / "o"),
                                           "--cluster", client.scheduler.address, "--progress", "none"])
        assert code == 2 and err.count("\n") == 1 and message in err, err
        code, err = run_tool("encode_corpus", [url, "--tokenizer", str(tok), "--out",
                                               str(tmp_path / "ids.npy"), "--progress", "none"])
        assert code == 2 and err.count("\n") == 1 and message in err, err
    with pytest.raises(CorpusError, match="line 84") as info:       # the local run's line, with the URL
        encode_corpus(_url(inputs["jsonl"]), inputs_tokenizer, tmp_path / "ids.npy", progress=False,
                      cluster=client, chunk_bytes=3000)
    assert str(info.value).startswith("file://")
    assert sorted(os.listdir(tmp_path)) == ["bad.parquet", "tok", "x.lz4"]


def test_url_changed_mid_run_is_refused(client, tmp_path):
    """A URL rewritten after its shards were cut: the worker that reads it (or the final check)
    raises ``InputChanged`` naming it; nothing is written."""
    from bpe_core.corpus.inputs import expand_inputs
    from bpe_core.corpus.shards import ReadOptions
    from bpe_core.pretok.counting import count_sources_on

    path = tmp_path / "c.txt"
    path.write_bytes(b"hello world<|endoftext|>" * 500)
    sources = expand_inputs("file://" + str(path))
    time.sleep(0.01)
    path.write_bytes(b"hello there<|endoftext|>" * 500)           # same size, new content
    with pytest.raises(InputChanged, match="changed while it was read") as info:
        count_sources_on(DaskExecutor(client), sources, [b"<|endoftext|>"], "gpt2", 3000, read_options=ReadOptions())
    assert str(info.value).startswith("file://")


# ==== Worker loss while encoding ===================================================================


def _slowly(fn, *args):
    time.sleep(0.15)
    return fn(*args)


class _SlowExecutor(DaskExecutor):
    """Every task sleeps a little first, so a kill lands while tasks are in flight."""

    def map(self, fn, tasks, shared=(), on_done=None):
        import functools

        return super().map(functools.partial(_slowly, fn), tasks, shared, on_done)


def test_a_killed_worker_changes_nothing_while_encoding(client, inputs, inputs_tokenizer, tmp_path):
    """Kill one worker process during cluster encoding (shards of many containers, read through
    ``file://`` URLs): the lost tasks run again and the .npy equals the single-node one."""
    import psutil

    specs = inputs["mixed"]
    encode_corpus(specs, inputs_tokenizer, tmp_path / "single.npy", num_workers=1, progress=False,
                  skip_bad_records=True, chunk_bytes=3000)
    victim = sorted(client.run(os.getpid).values())[0]
    killed = {}

    def kill():
        time.sleep(1.0)
        psutil.Process(victim).kill()
        killed["at"] = time.monotonic()

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        got = encode_corpus(_url(specs), inputs_tokenizer, tmp_path / "cluster.npy", progress=False,
                            skip_bad_records=True, chunk_bytes=3000, cluster=_SlowExecutor(client))
        finished = time.monotonic()
    finally:
        killer.join()
    assert killed["at"] < finished, "the kill must land during the run"
    assert got.n_chunks >= 24
    assert open(tmp_path / "cluster.npy", "rb").read() == open(tmp_path / "single.npy", "rb").read()
    assert sorted(os.listdir(tmp_path)) == ["cluster.npy", "single.npy"]
    client.wait_for_workers(2, timeout=30)
