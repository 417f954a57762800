"""Honest inputs and output files (issue 16): file modes under the umask, every output path checked
before any work, FIFOs/devices/compressed input refused, binary input warned about, an unbuilt source
checkout named, --progress modes, and the small CLI refusals. Each CLI case: exit code, one line on
stderr, no traceback, no leftover files."""
from __future__ import annotations

from paths import REPO
import gzip
import bz2
import json
import lzma
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bpe_core
from bpe_core import reference
from bpe_core.runtime.atomic import atomic_path, atomic_write, current_umask, output_problem
from bpe_core.corpus import BinaryInputWarning, CorpusError, binary_reason, check_input, compressed_format
from bpe_core.formats.model import Model, dump_model
from bpe_core.runtime.progress import _Lines, make_progress
from tool_runner import run_tool

ROOT = REPO
TOOLS = ROOT / "tools"
TEXT = ("the cat sat on the mat. the dog sat on the log.\n" * 30 + "<|endoftext|>"
        + "naïve café — 東京 and ok. 123 4567 it's I'M\n" * 10).encode()


def tool(name, *args, umask=None, timeout=60, **kw):
    """``python tools/NAME ARGS`` as its own process (forked by ``tool_runner``: no start-up cost)."""
    return run_tool(TOOLS / name, *args, umask=-1 if umask is None else umask, timeout=timeout, **kw)


def one_error_line(r, rc=2):
    """Exit code ``rc``, exactly one line on stderr, no traceback; returns the line."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == rc, (r.returncode, r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.fixture
def corpus_file(tmp_path):
    p = tmp_path / "in" / "corpus.txt"
    p.parent.mkdir()
    p.write_bytes(TEXT)
    return p


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"<|endoftext|>"
    merges = [(b"t", b"h"), (b"th", b"e"), (b"a", b"t")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    dump_model(Model(vocab=vocab, merges=merges, special_tokens=["<|endoftext|>"], pattern="gpt2"),
               d / "model.json")
    return d


@pytest.fixture
def readonly_dir(tmp_path):
    """A folder this process cannot create files in (chmod 555; root ignores that, so /sys then)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        if output_problem(d / "x") is not None:
            yield d
        elif output_problem("/sys/x") is not None:
            yield pathlib.Path("/sys")
        else:
            pytest.skip("no read-only folder available")
    finally:
        d.chmod(0o755)


def listing(*folders):
    return {str(p) for f in folders for p in pathlib.Path(f).rglob("*")}


# ==== File modes ============================================================================


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077])
def test_atomic_outputs_get_the_umask_mode(tmp_path, mask):
    old = os.umask(mask)
    try:
        assert current_umask() == mask
        with atomic_write(tmp_path / "a.txt", "w") as f:
            f.write("x")
        tmp, commit = atomic_path(tmp_path / "b.npy")
        np.save(tmp, np.arange(3))          # a writer that opens the path itself (as open_memmap)
        commit()
    finally:
        os.umask(old)
    for name in ("a.txt", "b.npy"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o666 & ~mask, name


def test_replaced_output_keeps_its_mode(tmp_path):
    p = tmp_path / "model.json"
    p.write_text("old")
    p.chmod(0o604)
    with atomic_write(p, "w") as f:
        f.write("new")
    assert p.read_text() == "new" and stat.S_IMODE(p.stat().st_mode) == 0o604


def test_tools_write_outputs_with_the_umask_mode(tmp_path, corpus_file):
    out = tmp_path / "tok"
    r = tool("train_bpe.py", corpus_file, "--vocab-size", 300, "--out", out, "--progress", "none", umask=0o027)
    assert r.returncode == 0, r.stderr
    for name in ("model.json", "vocab.json", "merges.txt", "train_report.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o640, name
    ids, rep = tmp_path / "ids.npy", tmp_path / "run.json"
    r = tool("encode_corpus.py", corpus_file, "--tokenizer", out, "--out", ids, "--report", rep,
             "--workers", 1, "--progress", "none", umask=0o002)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(ids.stat().st_mode) == 0o664 and stat.S_IMODE(rep.stat().st_mode) == 0o664
    r = tool("export_tokenizer.py", out, "--format", "hf", "--out", tmp_path / "t.json", umask=0o022)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((tmp_path / "t.json").stat().st_mode) == 0o644
    r = tool("profile_memory.py", "--no-plot", "--out", tmp_path / "prof", "--", sys.executable, "-c", "pass",
             umask=0o077)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((tmp_path / "prof.json").stat().st_mode) == 0o600


# ==== Output paths are checked before any work ==============================================


def test_output_problem_names_each_case(tmp_path, readonly_dir):
    os.mkfifo(tmp_path / "fifo")
    assert output_problem(tmp_path / "x.json") is None
    assert output_problem(tmp_path) == "is a directory, expected a file path"
    assert output_problem(tmp_path / "no" / "x.json") == f"folder {tmp_path / 'no'} does not exist"
    assert "not a regular file" in output_problem(tmp_path / "fifo")
    assert "is not writable" in output_problem(readonly_dir / "x.json")


def test_encode_report_path_checked_before_encoding(tmp_path, corpus_file, tok_dir):
    ids = tmp_path / "ids.npy"
    r = tool("encode_corpus.py", corpus_file, "--tokenizer", tok_dir, "--out", ids,
             "--report", tmp_path / "nodir" / "r.json", "--progress", "none")
    line = one_error_line(r)
    assert "r.json: folder" in line and "does not exist" in line
    assert not ids.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".ids")]


def test_encode_out_must_not_be_a_special_file(tmp_path, corpus_file, tok_dir):
    os.mkfifo(tmp_path / "fifo.npy")
    r = tool("encode_corpus.py", corpus_file, "--tokenizer", tok_dir, "--out", tmp_path / "fifo.npy",
             "--progress", "none", timeout=30)
    assert "exists and is not a regular file" in one_error_line(r)
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo.npy").st_mode)
    with pytest.raises(CorpusError, match="not a regular file"):
        bpe_core.encode_corpus(corpus_file, tok_dir, tmp_path / "fifo.npy", num_workers=1, progress=False)


@pytest.mark.parametrize("where", ["missing", "readonly"])
def test_profile_memory_prefix_checked_before_training(tmp_path, corpus_file, readonly_dir, where):
    prefix = tmp_path / "nodir" / "prof" if where == "missing" else readonly_dir / "prof"
    out = tmp_path / "tok"
    r = tool("train_bpe.py", corpus_file, "--vocab-size", 300, "--out", out, "--profile-memory", prefix)
    line = one_error_line(r)
    assert "prof.json" in line and ("does not exist" in line or "not writable" in line)
    assert not out.exists() and "trained" not in r.stdout


def test_encode_profile_memory_prefix_checked(tmp_path, corpus_file, tok_dir):
    ids = tmp_path / "ids.npy"
    r = tool("encode_corpus.py", corpus_file, "--tokenizer", tok_dir, "--out", ids,
             "--profile-memory", tmp_path / "nodir" / "p")
    assert "does not exist" in one_error_line(r) and not ids.exists()


def test_profile_command_api_checks_before_running(tmp_path):
    from bpe_core.runtime.profile import profile_command

    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match="does not exist"):
        profile_command([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path / "no" / "p", plot=False)
    assert not marker.exists()


def test_profile_memory_tool_checks_writable(readonly_dir):
    r = tool("profile_memory.py", "--out", readonly_dir / "p", "--", sys.executable, "-c", "pass")
    assert "not writable" in one_error_line(r)


def test_train_spill_dir_checked(tmp_path, corpus_file):
    out = tmp_path / "tok"
    r = tool("train_bpe.py", corpus_file, "--vocab-size", 300, "--out", out, "--spill-dir", tmp_path / "nope")
    assert "--spill-dir folder does not exist" in one_error_line(r) and not out.exists()


def test_evaluate_json_checked_before_evaluating(tmp_path, corpus_file, tok_dir):
    r = tool("evaluate.py", "--tokenizer", tok_dir, "--text", corpus_file, "--json", tmp_path / "no" / "s.json")
    assert "does not exist" in one_error_line(r) and r.stdout == ""
    r = tool("evaluate.py", "--tokenizer", tok_dir, "--text", corpus_file, "--json", tmp_path / "s.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "s.json").read_text())[0]["n_tokens"] > 0


@pytest.mark.parametrize("fmt,out", [("hf", "no/t.json"), ("tiktoken", "no/t.tiktoken"), ("gpt2", "no/sub")])
def test_export_out_checked_before_loading(tmp_path, tok_dir, fmt, out):
    r = tool("export_tokenizer.py", tok_dir, "--format", fmt, "--out", tmp_path / out)
    assert "does not exist" in one_error_line(r) and not (tmp_path / "no").exists()


def test_curate_out_checked(tmp_path, corpus_file):
    r = tool("curate.py", corpus_file, "--out", tmp_path / "no" / "c.txt")
    assert "does not exist" in one_error_line(r)


# ==== Non-regular, compressed and binary input ==============================================


def test_fifo_and_devices_are_refused(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    with pytest.raises(CorpusError, match=r"is not a regular file \(a FIFO\); save it to a file first"):
        check_input(fifo)
    for dev in ("/dev/zero", "/dev/urandom"):
        if os.path.exists(dev):
            with pytest.raises(CorpusError, match=r"\(a character device\)"):
                check_input(dev)
    with pytest.raises(CorpusError, match="FIFO"):
        bpe_core.train_bpe(fifo, 300)


def test_fifo_with_a_writer_is_refused_by_the_tools(tmp_path, tok_dir):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'wb').write(b'x' * 88000)"])
    try:
        r = tool("train_bpe.py", fifo, "--vocab-size", 300, "--out", tmp_path / "tok", timeout=30)
        assert "in.fifo: is not a regular file (a FIFO)" in one_error_line(r)
        assert not (tmp_path / "tok").exists()
        r = tool("encode_corpus.py", "/dev/zero", "--tokenizer", tok_dir, "--out", tmp_path / "ids.npy",
                 timeout=30)
        assert "/dev/zero: is not a regular file (a character device)" in one_error_line(r)
        assert not (tmp_path / "ids.npy").exists()
    finally:
        writer.kill()
        writer.wait()


def _zstd_frame(data: bytes) -> bytes:
    return b"\x28\xb5\x2f\xfd" + b"\x00" * 8          # the magic is all the check reads


@pytest.mark.parametrize("name,make,hint", [
    ("gzip", gzip.compress, "gzip -dk"), ("xz", lzma.compress, "xz -dk"), ("bzip2", bz2.compress, "bzip2 -dk"),
])
def test_compressed_input_is_read_by_the_tools_and_refused_by_the_plain_fast_path(tmp_path, tok_dir, name, make,
                                                                                 hint):
    """``check_input`` (the pread fast path of one plain file) still refuses compressed files; the
    tools and ``train_bpe`` read them as streams (``corpus.inputs``; tests/corpus/test_sources.py)."""
    p = tmp_path / "c.txt.z"
    p.write_bytes(make(TEXT))
    with pytest.raises(CorpusError, match=f"is {name}-compressed; decompress it first"):
        check_input(p)
    (tmp_path / "plain.txt").write_bytes(TEXT)
    assert bpe_core.train_bpe(p, 300) == bpe_core.train_bpe(tmp_path / "plain.txt", 300)
    r = tool("encode_corpus.py", p, "--tokenizer", tok_dir, "--out", tmp_path / "ids.npy")
    assert r.returncode == 0, r.stderr
    tok = bpe_core.Tokenizer.load(tok_dir)
    assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(TEXT)


def test_corrupt_compressed_input_is_one_line(tmp_path, tok_dir):
    p = tmp_path / "c.txt.z"
    p.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 8)          # a zstd magic, then nonsense
    pytest.importorskip("zstandard")
    with pytest.raises(CorpusError, match="zstd stream"):
        bpe_core.train_bpe(p, 300)
    r = tool("train_bpe.py", p, "--vocab-size", 300, "--out", tmp_path / "tok")
    assert f"{p}: compressed byte 12, after 0 decompressed bytes: truncated zstd stream (the file ends inside frame 1)" in one_error_line(r)
    assert not (tmp_path / "tok").exists()
    r = tool("encode_corpus.py", p, "--tokenizer", tok_dir, "--out", tmp_path / "ids.npy")
    assert "zstd stream" in one_error_line(r) and not (tmp_path / "ids.npy").exists()


def test_text_that_starts_like_a_magic_is_not_refused(tmp_path):
    for head in (b"BZh is a word", b"BZh9 and more text", b"PK then text"):
        p = tmp_path / "t.txt"
        p.write_bytes(head + TEXT)
        assert check_input(p) == len(head) + len(TEXT)
    assert compressed_format(bz2.compress(b""))[0] == "bzip2" and compressed_format(bz2.compress(b"x"))[0] == "bzip2"


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=300))
def test_text_never_looks_binary(text):
    data = text.encode("utf-8")
    assert binary_reason(data) is None
    assert binary_reason((data * 300)[: 64 << 10]) is None         # the sniff cut mid-character


@given(st.binary(min_size=1, max_size=200), st.integers(0, 200))
def test_nul_bytes_look_binary(data, at):
    at = min(at, len(data))
    assert binary_reason(data[:at] + b"\x00" + data[at:]) == "it has NUL bytes"


def test_latin1_prose_does_not_look_binary():
    assert binary_reason("Le cœur a ses raisons que la raison ne connaît point, déjà ça.".encode("cp1252")) is None


def test_binary_input_warns_but_trains(tmp_path):
    p = tmp_path / "bin.dat"
    p.write_bytes(bytes(range(256)) * 40 + TEXT)
    with pytest.warns(BinaryInputWarning, match=r"bin.dat: looks binary, not text \(it has NUL bytes\)"):
        vocab, merges = bpe_core.train_bpe(p, 270, num_workers=1)
    assert merges == reference.train_bpe_from_bytes(p.read_bytes(), 270, [])[1]      # trained on its bytes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = tmp_path / "text.txt"
        q.write_bytes(TEXT)
        bpe_core.train_bpe(q, 270, num_workers=1)            # plain text: no warning at all
    r = tool("train_bpe.py", p, "--vocab-size", 270, "--out", tmp_path / "tok", "--progress", "none")
    assert r.returncode == 0, r.stderr
    warn = [line for line in r.stderr.splitlines() if "looks binary" in line]
    assert warn == [f"train_bpe.py: warning: {p}: looks binary, not text (it has NUL bytes); using its bytes anyway"]
    assert "warnings.warn" not in r.stderr


def test_binary_warning_from_encode_corpus(tmp_path, tok_dir):
    p = tmp_path / "bin.dat"
    p.write_bytes(bytes(range(128, 256)) * 100)
    with pytest.warns(BinaryInputWarning, match="invalid UTF-8 or control characters"):
        bpe_core.encode_corpus(p, tok_dir, tmp_path / "ids.npy", num_workers=1, progress=False)


# ==== Import from an unbuilt source checkout ================================================


def test_unbuilt_checkout_says_what_to_do(tmp_path):
    pkg = tmp_path / "bpe_core"
    pkg.mkdir()
    for f in (ROOT / "bpe_core").glob("*.py"):
        shutil.copy(f, pkg / f.name)
    # -S: no site-packages, so neither an installed bpe_core nor an editable finder is in the way.
    r = subprocess.run([sys.executable, "-S", "-c", "import bpe_core"], cwd=tmp_path, capture_output=True,
                       text=True)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "circular" not in r.stderr
    assert last == (f"ImportError: bpe_core: the compiled extensions are not built in {pkg} (this is the source "
                    f"checkout, found first because the current directory is the repository root); build them "
                    f"in place with `pip install -e .` (or `python setup.py build_ext --inplace`), or run from "
                    f"another folder to use the installed package")


# ==== Small ones ============================================================================


def test_report_has_no_unrelated_child_peak(tmp_path):
    subprocess.run([sys.executable, "-c", "bytearray(200 << 20)"], check=True)    # an earlier big child
    p = tmp_path / "c.txt"
    p.write_bytes(TEXT)
    result = bpe_core.train(bpe_core.TrainConfig(p, 300, num_workers=1))
    peak = result.report["peak_rss_bytes"]
    assert set(peak) == {"tree_sampled", "self"} and peak["tree_sampled"] > 0


def test_vocab_size_beyond_the_input_is_explained(tmp_path):
    out = tmp_path / "tok"
    sample = os.path.join("bpe_core", "data", "sample.txt")     # the default input (from the package)
    r = tool("train_bpe.py", "--vocab-size", 10**9, "--out", out, "--memory-limit", "1G", "--progress", "none")
    # The merge engine no longer sizes anything by the vocabulary asked for (its pairs are bounded by
    # the input's symbols), so the run fits and says how far it got, in one warning line.
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "warning" in lines[0] and sample in lines[0]
    assert "merges were possible (asked for 999,999,743)" in lines[0].replace("999999743", "999,999,743")
    assert (out / "merges.txt").exists()


@pytest.mark.parametrize("flag", ["--chunk-bytes", "--chunk-size"])
def test_tiny_chunks_are_refused(tmp_path, corpus_file, tok_dir, flag):
    if flag == "--chunk-bytes":
        r = tool("train_bpe.py", corpus_file, "--out", tmp_path / "tok", flag, "1")
    else:
        r = tool("encode_corpus.py", corpus_file, "--tokenizer", tok_dir, "--out", tmp_path / "i.npy", flag, "1")
    line = one_error_line(r)
    assert "chunks smaller than 4 KiB only slow the run down" in line
    assert not (tmp_path / "tok").exists() and not (tmp_path / "i.npy").exists()


def test_plain_progress_lines_every_tenth_and_every_ten_seconds():
    import io

    now = [0.0]
    s = io.StringIO()
    p = _Lines(total=1000, desc="encode", unit="B", unit_scale=True, as_json=False, stream=s, clock=lambda: now[0])
    for _ in range(1000):
        p.update(1)
    p.close()
    lines = s.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == [f"{k}0%" for k in range(1, 10)] + ["100%"]
    assert lines[-1].endswith(", done") and "\r" not in s.getvalue()
    s = io.StringIO()
    p = _Lines(total=10**9, desc="m", unit="merge", unit_scale=False, as_json=True, stream=s, clock=lambda: now[0])
    for _ in range(5):
        now[0] += 6.0
        p.update(1)
    p.close()
    rows = [json.loads(line) for line in s.getvalue().splitlines()]
    assert [r["seconds"] for r in rows] == [12.0, 24.0, 30.0] and [r["final"] for r in rows] == [False, False, True]


def test_progress_modes_of_the_tools(tmp_path, corpus_file, tok_dir):
    base = [corpus_file, "--vocab-size", 300]
    r = tool("train_bpe.py", *base, "--out", tmp_path / "a")                 # stderr is a pipe: auto = plain
    assert r.returncode == 0 and "\r" not in r.stderr
    assert any(line.startswith("merges: 100% (") for line in r.stderr.splitlines()), r.stderr
    r = tool("train_bpe.py", *base, "--out", tmp_path / "b", "--progress", "json")
    assert r.returncode == 0 and {json.loads(line)["task"] for line in r.stderr.splitlines()} == {"pre-tokenize", "merges"}
    r = tool("train_bpe.py", *base, "--out", tmp_path / "c", "--no-progress")
    assert r.returncode == 0 and r.stderr == ""
    r = tool("encode_corpus.py", corpus_file, "--tokenizer", tok_dir, "--out", tmp_path / "i.npy", "--workers", 1,
             "--progress", "json")
    assert r.returncode == 0 and json.loads(r.stderr.splitlines()[-1])["final"] is True
    r = tool("encode_corpus.py", corpus_file, "--tokenizer", tok_dir, "--out", tmp_path / "j.npy", "--progress", "fancy")
    assert "--progress" in one_error_line(r) and not (tmp_path / "j.npy").exists()
    with pytest.raises(ValueError, match="unknown progress mode 'fancy'"):
        bpe_core.TrainConfig(corpus_file, 300, progress="fancy")
    with pytest.raises(ValueError, match="unknown progress mode"):
        make_progress("fancy", total=1)
    before = set(os.listdir(tmp_path))
    with pytest.raises(ValueError, match="unknown progress mode"):
        bpe_core.encode_corpus(corpus_file, tok_dir, tmp_path / "k.npy", progress="fancy")
    assert set(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("how", ["same", "file_url", "hard_link", "doc_index", "manifest"])
@pytest.mark.parametrize("cluster", [False, True])
def test_encode_output_that_is_an_input_is_refused(tmp_path, corpus_file, tok_dir, how, cluster):
    """The ids never replace an input file (the rename would destroy the corpus)."""
    from bpe_core.runtime.executors import LocalExecutor
    other = tmp_path / "in" / "other.txt"
    other.write_bytes(TEXT)
    inputs, out, extra = [str(corpus_file), str(other)], str(corpus_file), {}
    if how == "file_url":
        inputs = [f"file://{tmp_path / 'in'}/"]
    elif how == "hard_link":
        out = str(tmp_path / "link.npy")
        os.link(other, out)
    elif how == "doc_index":
        out, extra = str(tmp_path / "ids.npy"), {"doc_index": str(other)}
    elif how == "manifest":
        manifest = tmp_path / "in" / "ids.manifest.json"
        manifest.write_text("{}")
        inputs, out, extra = [str(corpus_file), str(manifest)], str(tmp_path / "in" / "ids.npy"), {"shard_tokens": 100}
    with pytest.raises(CorpusError, match="is also an input"):
        bpe_core.encode_corpus(inputs, str(tok_dir), out, progress=False,
                               cluster=LocalExecutor(2) if cluster else None, **extra)
    assert corpus_file.read_bytes() == TEXT and other.read_bytes() == TEXT


def test_encode_tool_output_that_is_an_input_is_one_line(tmp_path, corpus_file, tok_dir):
    line = one_error_line(tool("encode_corpus.py", corpus_file, "--tokenizer", tok_dir, "--out", corpus_file,
                               "--no-progress"))
    assert "is also an input" in line and str(corpus_file) in line
    assert corpus_file.read_bytes() == TEXT
