"""A set of output files is published as one unit (issue 27, docs/formats.md "Output sets").

A model folder, shards + manifest (+ document index), ids + document index: a run killed at any
rename or publish step (SIGKILL or SIGTERM, injected by a child script that wraps ``os.replace``,
``os.rename`` and ``atomic.exchange``), or one that meets a full disk, leaves the older set whole
and byte-identical, or the new set whole and byte-identical to a clean run; never a mix. After a
SIGKILL between two renames of files at fixed paths the set's journal is there, and the next
writer finishes it. No output may be one of the run's inputs (the tokenizer's files, the memory
profile's outputs included).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from bpe_core.encode.tokenizer import Tokenizer
from bpe_core.formats.model import Model, dump_folder, load_model
from bpe_core.runtime import atomic
from paths import package_parent
from robust_helpers import ENCODE, TRAIN, leftovers, stderr_lines
from tool_runner import call_in_child

SPECIAL = "<|endoftext|>"
MODEL_SET = ("model.json", "vocab.json", "merges.txt")


def child_main(tool_path, args, kill_at, sig, full_disk, count_file) -> int:
    """Run a tool in this process (a child) with every rename-like call counted (``os.replace``,
    ``os.rename``, ``atomic.exchange``) into ``count_file``; the call numbered ``kill_at`` sends
    ``sig`` to this process just before it happens (SIGKILL: it dies there; SIGTERM/SIGINT: the
    handler runs at once, or when the publish step that holds signals ends). ``full_disk``: the
    model and document-index writers raise ENOSPC. Returns the exit code."""
    import runpy

    from bpe_core.runtime import atomic as atomic_module
    n = [0]

    def counted(real):
        def wrapped(*a, **k):
            n[0] += 1
            with open(count_file, "w") as f:
                f.write(str(n[0]))
            if n[0] == kill_at:
                os.kill(os.getpid(), getattr(signal, sig))
            return real(*a, **k)
        return wrapped
    os.replace, os.rename = counted(os.replace), counted(os.rename)
    if hasattr(atomic_module, "exchange"):
        atomic_module.exchange = counted(atomic_module.exchange)
    if full_disk:
        import bpe_core.encode.corpus_outputs as outputs     # where the document index is written
        import bpe_core.formats.model as fm

        def full(*a, **k):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fm.dump_model = full
        outputs.dump_doc_index = full
    os.environ.pop("BPE_CORE_DEBUG", None)
    sys.argv = [str(tool_path), *map(str, args)]
    code = 0
    try:
        runpy.run_path(str(tool_path), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    return code


def run_child(tmp_path, tool_path, args, kill_at=0, sig="SIGKILL", full_disk=False):
    """:func:`child_main` in a child process, forked by ``tool_runner``'s server (bpe_core is
    imported already: no start-up cost; the server runs no other thread, so forking it is safe)
    with ``tmp_path`` as its working directory. Returns a ``CompletedProcess`` (exit code as
    ``subprocess`` gives it, stdout, stderr); ``calls(tmp_path)`` the number of calls."""
    count_file = str(tmp_path.parent / f"{tmp_path.name}.count")
    with open(count_file, "w") as f:
        f.write("0")
    spec = (str(tool_path), [str(a) for a in args], kill_at, sig, full_disk, count_file)
    return call_in_child("test_output_sets", "child_main", *spec, cwd=tmp_path)


def calls(tmp_path) -> int:
    return int((tmp_path.parent / f"{tmp_path.name}.count").read_text())


def write_corpus(path, words: str, n: int = 60) -> str:
    docs = [f"{words} {i % 7} {words[::-1]}\n" for i in range(n)]
    path.write_text(SPECIAL.join(docs))
    return str(path)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpora")
    old = write_corpus(d / "old.txt", "low lower lowest newer wider", 80)
    new = write_corpus(d / "new.txt", "the quick brown fox jumps over the lazy dog", 90)
    return old, new


def snapshot(folder, names=MODEL_SET) -> dict:
    return {n: (folder / n).read_bytes() for n in names if (folder / n).exists()}


# ==== The model folder ========================================================================


def train_args(corpus, out, vocab):
    return [corpus, "--vocab-size", vocab, "--out", out, "--no-progress", "--workers", "1"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, corpora):
    """A clean run of the old and of the new model: what a killed run must leave, byte for byte."""
    d = tmp_path_factory.mktemp("models")
    old, new = corpora
    for name, corpus, vocab in (("old", old, 300), ("new", new, 320)):
        r = run_child(d, TRAIN, train_args(corpus, d / name, vocab))
        assert r.returncode == 0, r.stderr
    return {k: snapshot(d / k) for k in ("old", "new")}, d


def check_model_folder(folder, models, allowed, extra=None):
    """The folder holds the old or the new model, whole (model.json, vocab.json, merges.txt and
    train_report.json), byte-identical to a clean run; never a mix. Returns which."""
    got = snapshot(folder)
    which = next((k for k in allowed if models[k] == got), None)
    assert which is not None, f"{folder} holds neither model whole: {sorted(got)}"
    assert set(got) == set(MODEL_SET) and (folder / "train_report.json").exists()
    model = load_model(folder)
    assert Tokenizer.load(str(folder)).n_vocab == len(model.vocab)
    if extra:
        assert (folder / extra[0]).read_text() == extra[1], "a file the run did not write is kept"
    return which


# SIGTERM is held while a set is published, so its runs repeat the SIGKILL runs' checks with one more
# exit path: they run with --slow (the kill matrix is the suite's slowest part)
@pytest.mark.parametrize("sig,layout", [("SIGKILL", "swap"), pytest.param("SIGTERM", "swap", marks=pytest.mark.slow),
                                        ("SIGKILL", "in_place")])
def test_training_over_a_model_killed_at_any_publish_step_leaves_one_whole_model(tmp_path, corpora, models, sig,
                                                                                  layout):
    """``in_place``: a subfolder in the model folder (it cannot be swapped): the files are renamed one
    by one; a SIGKILL between two renames leaves the journal, and the next run finishes the set."""
    snaps, d = models
    old, new = corpora
    out = tmp_path / "tok"

    def old_model():
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(d / "old", out)             # what a clean run of the old corpus wrote
        (out / "NOTES.md").write_text("mine")
        if layout == "in_place":
            (out / "sub").mkdir()
    old_model()
    r = run_child(tmp_path, TRAIN, train_args(new, out, 320))
    assert r.returncode == 0, r.stderr
    n_calls = calls(tmp_path)
    assert n_calls >= (6 if layout == "in_place" else 1)      # the swap (plain writes inside the fresh folder)
    seen = set()
    for k in range(1, n_calls + 2):
        old_model()
        r = run_child(tmp_path, TRAIN, train_args(new, out, 320), kill_at=k, sig=sig)
        if k <= n_calls:
            want = -signal.SIGKILL if sig == "SIGKILL" else 143
            assert r.returncode in (want, 0), (k, r.returncode, r.stderr)
        if r.returncode not in (0, -signal.SIGKILL):
            assert len(stderr_lines(r.stderr)) == 1 and "Traceback" not in r.stderr, r.stderr
        if layout == "in_place" and journal(out):
            assert set(snapshot(out).items()) <= set(snaps["old"].items()) | set(snaps["new"].items())
        else:
            seen.add(check_model_folder(out, snaps, ("old", "new"), extra=("NOTES.md", "mine")))
        if sig == "SIGTERM":
            assert leftovers(tmp_path) == [], (k, leftovers(tmp_path))
        # the next run cleans up what a SIGKILL left (finishes a journal) and publishes whole
        r = run_child(tmp_path, TRAIN, train_args(new, out, 320))
        assert r.returncode == 0, r.stderr
        check_model_folder(out, snaps, ("new",), extra=("NOTES.md", "mine"))
        assert leftovers(tmp_path) == [], (k, leftovers(tmp_path))
    # in place, every rename comes after the journal (the files are written plainly before)
    assert seen == ({"new"} if layout == "in_place" else {"old", "new"})


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_a_run_stopped_while_it_writes_a_new_folder_leaves_no_folder_that_loads(tmp_path, corpora, models, sig):
    snaps, _ = models
    _, new = corpora
    out = tmp_path / "fresh" / "tok"
    out.parent.mkdir()                      # (the folder above an output must exist)
    r = run_child(tmp_path, TRAIN, train_args(new, out, 320))
    assert r.returncode == 0
    n_calls = calls(tmp_path)
    for name in os.listdir(out):
        os.unlink(out / name)
    os.rmdir(out)
    for k in range(1, n_calls + 1):
        r = run_child(tmp_path, TRAIN, train_args(new, out, 320), kill_at=k, sig=sig)
        assert r.returncode == (130 if sig == "SIGINT" else -signal.SIGKILL), r.stderr
        if out.exists():            # stopped at the publish step itself (signals wait for it): whole
            assert k == n_calls
            check_model_folder(out, snaps, ("new",))
        if sig == "SIGINT":
            assert stderr_lines(r.stderr) == ["train_bpe.py: interrupted; temporary files removed"]
            assert leftovers(tmp_path / "fresh") == []
        if out.exists():
            for name in os.listdir(out):
                os.unlink(out / name)
            os.rmdir(out)
    r = run_child(tmp_path, TRAIN, train_args(new, out, 320))
    assert r.returncode == 0 and leftovers(tmp_path / "fresh") == []


def test_a_full_disk_while_the_model_is_written_keeps_the_old_model_and_names_the_folder(tmp_path, corpora, models):
    snaps, _ = models
    old, new = corpora
    out = tmp_path / "tok"
    assert run_child(tmp_path, TRAIN, train_args(old, out, 300)).returncode == 0
    r = run_child(tmp_path, TRAIN, train_args(new, out, 320), full_disk=True)
    assert r.returncode == 2
    assert stderr_lines(r.stderr)[-1] == f"train_bpe.py: error: {out}: No space left on device"
    check_model_folder(out, snaps, ("old",))
    assert leftovers(tmp_path) == []


# ==== Shards + manifest + document index, ids + document index =================================


def encode_args(corpus, tok, out, idx, shards=None):
    args = [corpus, "--tokenizer", tok, "--out", out, "--doc-index", idx, "--no-progress", "--workers", "1"]
    return args + (["--shard-tokens", shards] if shards else [])


def read_shard_set(folder):
    """(ids, doc index) of the shards the manifest lists."""
    manifest = json.loads((folder / "ids.manifest.json").read_text())
    ids = np.concatenate([np.load(folder / s["path"]) for s in manifest["shards"]])
    assert len(ids) == manifest["n_tokens"]
    return ids.tolist(), np.load(folder / manifest["doc_index"]).tolist()


def read_pair(folder):
    return np.load(folder / "ids.npy").tolist(), np.load(folder / "idx.npy").tolist()


@pytest.fixture(scope="module")
def encoded(tmp_path_factory, corpora, models):
    """Clean runs of both corpora: the ids and document index each must give."""
    _, d = models
    old, new = corpora
    want = {}
    for name, corpus in (("old", old), ("new", new)):
        f = tmp_path_factory.mktemp(name)
        r = run_child(f, ENCODE, encode_args(corpus, d / "old", f / "ids.npy", f / "idx.npy"))
        assert r.returncode == 0, r.stderr
        want[name] = read_pair(f)
    return want, d / "old"


def journal(folder) -> list[str]:
    return [n for n in os.listdir(folder) if ".commit-" in n]


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("sig", ["SIGKILL", pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_encoding_over_an_output_killed_at_any_rename_leaves_one_whole_set(tmp_path, corpora, encoded, sharded, sig):
    want, tok = encoded
    old, new = corpora
    out, ref = tmp_path / "out", tmp_path / "ref"
    shards = len(want["new"][0]) // 3 + 1 if sharded else None            # three shards
    args = lambda corpus, f=out: encode_args(corpus, tok, f / "ids.npy", f / "idx.npy", shards)   # noqa: E731
    read = read_shard_set if shards else read_pair
    ref.mkdir()
    assert run_child(tmp_path, ENCODE, args(old, ref)).returncode == 0
    r = run_child(tmp_path, ENCODE, args(new, tmp_path))
    assert r.returncode == 0, r.stderr
    n_calls = calls(tmp_path)
    assert n_calls == (5 if shards else 2)            # 3 shards, the index, the manifest
    seen = set()
    for k in range(1, n_calls + 2):
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(ref, out)                      # what a clean run of the old corpus wrote
        assert read(out) == want["old"]
        r = run_child(tmp_path, ENCODE, args(new), kill_at=k, sig=sig)
        assert r.returncode in (0, 143, -signal.SIGKILL), r.stderr
        got = read(out)
        if got in (want["old"], want["new"]):
            seen.add("new" if got == want["new"] else "old")
        else:
            # only a SIGKILL between two renames of files at fixed paths; the journal names the set
            assert sig == "SIGKILL" and journal(out), f"step {k}: a mix of two runs"
        if journal(out):            # the next writer (or any recover_files) finishes the set
            assert sig == "SIGKILL"
            atomic.recover_files(out / ("ids.manifest.json" if shards else "ids.npy"))
            assert journal(out) == [] and read(out) == want["new"], f"step {k}: the journal finishes the new set"
        if sig == "SIGTERM":
            assert [n for n in leftovers(out)] == [], leftovers(out)
        r = run_child(tmp_path, ENCODE, args(new))        # the next run: whole, nothing half-written left
        assert r.returncode == 0, r.stderr
        assert read(out) == want["new"] and leftovers(out) == []
        if shards:
            listed = {s["path"] for s in json.loads((out / "ids.manifest.json").read_text())["shards"]}
            assert {n for n in os.listdir(out) if n.startswith("ids-")} == listed, "older shards are gone"
    # SIGTERM waits for the renames to end (the new set); SIGKILL before the first one leaves the old
    assert seen == ({"old", "new"} if sig == "SIGKILL" else {"new"})


def test_a_killed_pair_is_finished_by_the_next_encode_run(tmp_path, corpora, encoded):
    """SIGKILL right after ids.npy is renamed: the next run (here to another corpus) finishes the
    pair first and then writes its own, whole."""
    want, tok = encoded
    old, new = corpora
    args = lambda corpus: encode_args(corpus, tok, tmp_path / "ids.npy", tmp_path / "idx.npy")   # noqa: E731
    assert run_child(tmp_path, ENCODE, args(old)).returncode == 0
    r = run_child(tmp_path, ENCODE, args(new), kill_at=2)         # before the second rename
    assert r.returncode == -signal.SIGKILL and journal(tmp_path)
    assert run_child(tmp_path, ENCODE, args(old)).returncode == 0
    assert read_pair(tmp_path) == want["old"] and journal(tmp_path) == [] and leftovers(tmp_path) == []


def test_load_ids_finishes_a_killed_pair_and_refuses_a_mixed_one(tmp_path, corpora, encoded):
    """SIGKILL between the two renames (ids.npy renamed, idx.npy not): ``np.load`` would pair the new
    ids with the old index; ``bpe_core.load_ids`` finishes the journal first and reads the new pair.
    A pair from two runs with no journal to finish is refused, naming the index."""
    import bpe_core

    want, tok = encoded
    old, new = corpora
    ids, idx = tmp_path / "ids.npy", tmp_path / "idx.npy"
    args = lambda corpus: encode_args(corpus, tok, ids, idx)   # noqa: E731
    assert run_child(tmp_path, ENCODE, args(old)).returncode == 0
    got_ids, got_idx = bpe_core.load_ids(ids, idx)
    assert (got_ids.tolist(), got_idx.tolist()) == want["old"]
    saved_old_index = idx.read_bytes()
    r = run_child(tmp_path, ENCODE, args(new), kill_at=2)         # after the first rename
    assert r.returncode == -signal.SIGKILL and journal(tmp_path)
    assert np.load(ids).tolist() == want["new"][0] and np.load(idx).tolist() == want["old"][1]   # the hazard
    got_ids, got_idx = bpe_core.load_ids(ids, idx)
    assert (got_ids.tolist(), got_idx.tolist()) == want["new"] and journal(tmp_path) == []
    assert leftovers(tmp_path) == []
    idx.write_bytes(saved_old_index)                              # an index of the other run
    with pytest.raises(bpe_core.errors.CorpusError, match=f"{idx}: is not the document index of {ids}"):
        bpe_core.load_ids(ids, idx)
    np.save(idx, np.array(want["new"][1], np.int64))              # an index without a trailer
    with pytest.raises(bpe_core.errors.CorpusError, match="records no ids file"):
        bpe_core.load_ids(ids, idx)
    assert bpe_core.load_ids(ids, idx, check=False)[1].tolist() == want["new"][1]


def test_a_full_disk_while_encoding_keeps_the_old_set_and_names_the_output(tmp_path, corpora, encoded):
    want, tok = encoded
    old, new = corpora
    args = lambda corpus: encode_args(corpus, tok, tmp_path / "ids.npy", tmp_path / "idx.npy")   # noqa: E731
    assert run_child(tmp_path, ENCODE, args(old)).returncode == 0
    r = run_child(tmp_path, ENCODE, args(new), full_disk=True)
    assert r.returncode == 2
    assert stderr_lines(r.stderr)[-1] == f"encode_corpus.py: error: {tmp_path / 'ids.npy'}: No space left on device"
    assert read_pair(tmp_path) == want["old"] and leftovers(tmp_path) == []


# ==== No output is an input ===================================================================


@pytest.mark.parametrize("how", ["out_model", "out_vocab_file_tokenizer", "doc_index", "report", "profile",
                                 "profile_merges"])
def test_encode_outputs_never_replace_the_tokenizer(tmp_path, corpora, models, how):
    _, d = models
    tok = tmp_path / "tk"
    tok.mkdir()
    for name in MODEL_SET:
        (tok / name).write_bytes((d / "old" / name).read_bytes())
    before = snapshot(tok)
    corpus = corpora[0]
    args = [corpus, "--tokenizer", tok, "--out", tmp_path / "ids.npy", "--no-progress"]
    target = {"out_model": tok / "model.json", "out_vocab_file_tokenizer": tok / "vocab.json",
              "doc_index": tok / "merges.txt", "report": tok / "model.json", "profile": tok / "vocab.json",
              "profile_merges": tok / "model.json"}[how]
    if how == "out_model":
        args[4] = tok / "model.json"
    elif how == "out_vocab_file_tokenizer":
        args[2], args[4] = tok / "model.json", tok / "vocab.json"
    elif how == "doc_index":
        args += ["--doc-index", tok / "merges.txt"]
    elif how == "report":
        args += ["--report", tok / "model.json"]
    elif how == "profile":
        args += ["--profile-memory", tok / "vocab"]
    else:
        args += ["--profile-memory", tok / "model"]
    r = run_child(tmp_path, ENCODE, args)
    assert r.returncode == 2, r.stderr
    lines = stderr_lines(r.stderr)
    assert len(lines) == 1 and str(target) in lines[0] and "is also an input" in lines[0], lines
    assert snapshot(tok) == before and not (tmp_path / "ids.npy").exists()


def test_encode_api_refuses_an_output_that_is_a_tokenizer_file(tmp_path, corpora, models):
    from bpe_core.encode.encode_corpus import encode_corpus
    from bpe_core.errors import CorpusError
    _, d = models
    before = snapshot(d / "old")
    with pytest.raises(CorpusError, match="is also an input"):
        encode_corpus(corpora[0], str(d / "old"), d / "old" / "vocab.json", progress=False)
    assert snapshot(d / "old") == before


@pytest.mark.parametrize("how", ["profile_in_out", "init_from_out", "corpus_in_set"])
def test_train_outputs_never_replace_an_input(tmp_path, corpora, models, how):
    _, d = models
    out = tmp_path / "tok"
    assert run_child(tmp_path, TRAIN, train_args(corpora[0], out, 300)).returncode == 0
    before = snapshot(out)
    args = train_args(corpora[1], out, 320)
    target = out / "model.json"
    if how == "profile_in_out":
        args += ["--profile-memory", out / "model"]
    elif how == "init_from_out":
        args += ["--init-from", out]
    else:
        args[0] = out / "merges.txt"              # plain text: a corpus like any other
        target = out / "merges.txt"
    r = run_child(tmp_path, TRAIN, args)
    assert r.returncode == 2, r.stderr
    lines = stderr_lines(r.stderr)
    assert len(lines) == 1 and str(target) in lines[0], lines
    assert snapshot(out) == before


# ==== The helpers ============================================================================


def small_model(n_merges: int = 1) -> Model:
    vocab = {i: bytes([i]) for i in range(256)}
    merges = [(b"a", b"b"), (b"ab", b"c")][:n_merges]
    for r, (a, b) in enumerate(merges):
        vocab[256 + r] = a + b
    return Model(vocab=vocab, merges=merges, pattern=r"\S+|\s+")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("swap", ["exchange", "two_renames", "in_place", "not_permitted"])
def test_publish_folder_carries_other_files_and_drops_the_old_sets(tmp_path, monkeypatch, swap):
    tok = tmp_path / "tok"
    dump_folder(small_model(1), tok, extra={"train_report.json": "{}", "tokenizer.json": "old"})
    (tok / "NOTES.md").write_text("mine")
    os.symlink("NOTES.md", tok / "link")
    os.chmod(tok / "merges.txt", 0o600)
    inode = os.stat(tok / "NOTES.md").st_ino
    if swap == "two_renames":
        monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    elif swap == "in_place":
        (tok / "sub").mkdir()                        # a subfolder cannot be carried: written in place
    elif swap == "not_permitted":
        def refuse(a, b):
            raise PermissionError(errno.EPERM, "Operation not permitted", b)
        monkeypatch.setattr(atomic, "exchange", refuse)
    dump_folder(small_model(2), tok, extra={"train_report.json": "{}"})
    assert len(load_model(tok).merges) == 2
    assert os.stat(tok / "merges.txt").st_mode & 0o777 == 0o600, "a file keeps the mode of the one it replaces"
    names = set(os.listdir(tok))
    assert {"NOTES.md", "link", *MODEL_SET, "train_report.json"} <= names
    assert "tokenizer.json" not in names, "a file of the old set that this run did not write goes with it"
    assert (tok / "NOTES.md").read_text() == "mine" and os.readlink(tok / "link") == "NOTES.md"
    assert os.stat(tok / "NOTES.md").st_ino == inode, "carried by hard link (or left in place), not copied"
    assert leftovers(tmp_path) == []


def test_publish_folder_leaves_the_old_folder_on_an_error_and_a_new_one_absent(tmp_path):
    tok = tmp_path / "tok"
    dump_folder(small_model(1), tok)
    before = snapshot(tok)
    with pytest.raises(OSError, match=str(tok)):
        with atomic.publish_folder(tok) as tmp:
            open(os.path.join(tmp, "model.json"), "w").write("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert snapshot(tok) == before and leftovers(tmp_path) == []
    with pytest.raises(KeyboardInterrupt):
        with atomic.publish_folder(tmp_path / "new") as tmp:
            open(os.path.join(tmp, "model.json"), "w").write("half")
            raise KeyboardInterrupt
    assert sorted(os.listdir(tmp_path)) == ["tok"]


def test_recover_folder_puts_an_old_folder_back_and_removes_a_dead_writers_new_one(tmp_path):
    dead = dead_pid()
    aside = tmp_path / f".tok.old-{dead}-x"
    dump_folder(small_model(1), aside)
    (tmp_path / f".tok.new-{dead}-y").mkdir()
    (tmp_path / f".tok.new-{os.getpid()}-z").mkdir()        # a live writer's: kept
    atomic.recover_folder(tmp_path / "tok")
    assert len(load_model(tmp_path / "tok").merges) == 1
    assert sorted(os.listdir(tmp_path)) == [f".tok.new-{os.getpid()}-z", "tok"]


def test_publish_files_holds_signals_until_the_set_is_renamed(tmp_path):
    pairs = []
    for name in ("a", "b", "c"):
        (tmp_path / f".{name}.tmp").write_text(name)
        pairs.append((tmp_path / f".{name}.tmp", tmp_path / name))
    real = os.replace

    def replace(src, dst):
        if str(dst).endswith("a"):
            os.kill(os.getpid(), signal.SIGINT)
        return real(src, dst)
    os.replace = replace
    try:
        with pytest.raises(KeyboardInterrupt):
            atomic.publish_files(pairs)
    finally:
        os.replace = real
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]


def test_two_runs_into_a_fresh_folder_the_loser_says_another_run_owns_it(tmp_path):
    """Two runs started together into a fresh ``--out``: the first to publish owns the folder; the
    other's rename fails, and it says so (not ``.tok.new-PID-xxx: Directory not empty``), leaving
    the winner's model whole and no temp folder."""
    tok = tmp_path / "tok"
    with pytest.raises(atomic.FolderTaken) as info:
        with atomic.publish_folder(tok) as loser:
            (pathlib.Path(loser) / "model.json").write_text("loser")
            with atomic.publish_folder(tok) as winner:              # the other run, finishing first
                (pathlib.Path(winner) / "model.json").write_text("winner")
    assert info.value.filename == str(tok) and "another run published this output folder" in str(info.value)
    assert (tok / "model.json").read_text() == "winner" and leftovers(tmp_path) == []


def test_the_loser_of_two_training_runs_is_one_line(tmp_path, corpora):
    """The same through train_bpe.py: exit 2, one line naming the folder; the winner's model loads."""
    old, new = corpora
    out = tmp_path / "tok"
    r = run_child(tmp_path, TRAIN, train_args(old, out, 300))
    assert r.returncode == 0
    shutil.move(out, tmp_path / "winner")
    env = dict(os.environ, PYTHONPATH=package_parent())
    env.pop("BPE_CORE_DEBUG", None)
    code = subprocess.run(
        [sys.executable, "-c", LOSER, str(TRAIN), str(tmp_path / "winner"), str(out), *map(str, train_args(new, out, 300))],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert code.returncode == 2, code.stderr
    assert stderr_lines(code.stderr) == [f"train_bpe.py: error: {out}: another run published this output folder "
                                         "while this one was writing it and owns it now; this run's files were "
                                         "discarded (run again to replace it)"]
    assert (out / "model.json").read_bytes() == (tmp_path / "winner" / "model.json").read_bytes()
    assert leftovers(tmp_path) == []


# The loser: as it renames its folder into place, the winner's folder appears there first.
LOSER = r'''
import os, runpy, shutil, sys
script, winner, out = sys.argv[1], sys.argv[2], sys.argv[3]
sys.argv = [script, *sys.argv[4:]]
sys.path[0] = os.path.dirname(script)
real = os.rename
def rename(a, b, *k, **kw):
    if os.path.abspath(b) == os.path.abspath(out) and ".new-" in a and not os.path.exists(out):
        shutil.copytree(winner, out)
    return real(a, b, *k, **kw)
os.rename = rename
runpy.run_path(script, run_name="__main__")
'''
