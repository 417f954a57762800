"""Real corpora in (issue 13): many files, compressed streams, JSON Lines, Parquet, iterators.

The property: the same documents give the same merges, the same ids and the same document index
whatever the container (one ``.txt`` with separators, split over files, gzip/xz/zstd/bzip2, JSON
Lines, Parquet, the iterator API), with any worker count and chunk size. Without special tokens the
documents stay apart (checked against the reference trained on the documents joined by a sentinel
special token). Then: every reader's bad records give one line naming the file and line/row, or
are counted with ``skip_bad_records``; inputs expand deterministically.
"""
from __future__ import annotations

from paths import REPO
import bz2
import gzip
import io
import json
import lzma
import os
import pathlib
import re

import numpy as np
import pytest
from tool_runner import run_tool
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core import Tokenizer, encode_corpus, reference
from bpe_core.corpus import CorpusError
from bpe_core.corpus import readers
from bpe_core.corpus.inputs import expand_inputs
from bpe_core.corpus.shards import ReadOptions, corpus_bytes
from bpe_core.training import train_from_iterator

zstandard = pytest.importorskip("zstandard")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TOOLS = REPO / "tools"
S = "<|endoftext|>"
SB = S.encode()

# Documents: words, spaces and newlines, pieces of the special token, the special token itself (a
# record holding it splits as the .txt does), invalid UTF-8, empty documents.
_piece = st.sampled_from(["low", " lower", " newest", "\n", "  ", "wid", "er", "é", "ß!", "<|endof",
                          "text|>", S, "\udc80", "\udcff", "12", " 3"])
documents = st.lists(st.lists(_piece, max_size=12).map("".join), min_size=1, max_size=9)


def _b(doc: str) -> bytes:
    return doc.encode("utf-8", "surrogateescape")


def _write_containers(d: pathlib.Path, docs: list[str], n_files: int) -> dict:
    """The same documents in every container; returns {name: input spec}."""
    raw = SB.join(_b(x) for x in docs)
    out = {}
    (d / "all.txt").write_bytes(raw)
    out["txt"] = str(d / "all.txt")
    for name, fn in (("gz", gzip.compress), ("xz", lambda b: lzma.compress(b, preset=0)), ("bz2", bz2.compress),
                     ("zst", lambda b: zstandard.ZstdCompressor().compress(b))):
        (d / f"all.txt.{name}").write_bytes(fn(raw))
        out[name] = str(d / f"all.txt.{name}")
    jsonl = "".join(json.dumps({"meta": {"text": x}, "id": i}) + "\n" for i, x in enumerate(docs))
    (d / "all.jsonl").write_text(jsonl)
    out["jsonl"] = str(d / "all.jsonl")
    (d / "all.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl.encode()))
    out["jsonl.zst"] = str(d / "all.jsonl.zst")
    table = pa.table({"text": pa.array([_b(x) for x in docs], pa.binary())})
    pq.write_table(table, d / "all.parquet", row_group_size=2)
    out["parquet"] = str(d / "all.parquet")
    # split over n_files plain files: each holds a run of documents joined by the separator
    split = d / "split"
    split.mkdir()
    bounds = np.linspace(0, len(docs), n_files + 1).astype(int)
    for k in range(n_files):
        (split / f"part-{k:02d}.txt").write_bytes(SB.join(_b(x) for x in docs[bounds[k]:bounds[k + 1]]))
    out["split"] = str(split)
    return out


def _split_text(d: pathlib.Path) -> bytes:
    """What the split files mean: the texts of the non-empty files joined by the separator."""
    parts = [p.read_bytes() for p in sorted((d / "split").iterdir())]
    return SB.join(p for p in parts if p)


@settings(max_examples=8, deadline=None)
@given(docs=documents, n_files=st.integers(1, 7), chunk=st.integers(3, 40))
def test_same_documents_same_merges_ids_and_index_in_every_container(tmp_path_factory, docs, n_files, chunk):
    d = tmp_path_factory.mktemp("c")
    specs = _write_containers(d, docs, n_files)
    raw = SB.join(_b(x) for x in docs)
    want = reference.train_bpe_from_bytes(raw, 290, [S])
    tok = Tokenizer(want[0], want[1], [S])
    want_ids = tok.encode(raw)
    starts = [0] + [i + 1 for i, t in enumerate(want_ids) if t == tok.special_tokens[S]]
    for name, spec in specs.items():
        workers = 1 + (len(name) % 2)
        got = bpe_core.train_bpe(spec, 290, [S], num_workers=workers, chunk_bytes=chunk,
                                 text_field="meta.text")
        assert got[1] == want[1], name
        encode_corpus(spec, tok, d / "ids.npy", num_workers=workers, chunk_bytes=chunk, progress=False,
                      text_field="meta.text", doc_index=d / "idx.npy")
        ids = np.load(d / "ids.npy").tolist()
        if name == "split":
            split_ids = tok.encode(_split_text(d))
            assert ids == split_ids
            continue
        assert ids == want_ids, name
        # an empty file holds no document; one empty record is one (empty) document
        text_file = name in ("txt", "gz", "xz", "bz2", "zst")
        assert np.load(d / "idx.npy").tolist() == ([] if text_file and not raw else starts), name
    assert train_from_iterator(iter(docs), 290, [S], num_workers=2, chunk_bytes=chunk)[1] == want[1]
    assert train_from_iterator([[_b(x) for x in docs]], 290, [S], num_workers=1)[1] == want[1]


@settings(max_examples=8, deadline=None)
@given(docs=documents, chunk=st.integers(3, 40))
def test_without_special_tokens_documents_never_merge(tmp_path_factory, docs, chunk):
    """No separator: pretokens and merges never cross two documents; the reference sees them split
    by a sentinel special token (which holds no merge)."""
    d = tmp_path_factory.mktemp("n")
    docs = [x.replace(S, "") for x in docs]
    sentinel = "\x00|\x00"
    want = reference.train_bpe_from_bytes(sentinel.encode().join(_b(x) for x in docs), 291, [sentinel])
    specs = _write_containers(d, docs, 1)
    (d / "one").mkdir()
    for k, x in enumerate(docs):                     # one document per file
        (d / "one" / f"{k:03d}.txt").write_bytes(_b(x))
    tok = Tokenizer(want[0], want[1], [])
    each = [tok.encode(_b(x)) for x in docs]
    for name in ("jsonl", "parquet", "gz"):
        spec = specs[name] if name != "gz" else str(d / "one")
        got = bpe_core.train_bpe(spec, 290, [], num_workers=2, chunk_bytes=chunk, text_field="meta.text")
        assert got[1] == want[1], name
    got = train_from_iterator(docs, 290, [], num_workers=2, chunk_bytes=chunk)
    assert got[1] == want[1]
    for spec in (specs["jsonl"], specs["parquet"]):
        encode_corpus(spec, tok, d / "ids.npy", num_workers=2, chunk_bytes=chunk, progress=False,
                      text_field="meta.text", doc_index=d / "idx.npy")
        assert np.load(d / "ids.npy").tolist() == [t for e in each for t in e]
        assert np.load(d / "idx.npy").tolist() == np.cumsum([0] + [len(e) for e in each[:-1]]).tolist()


def test_no_separator_keeps_documents_apart_and_omits_the_id(tmp_path):
    docs = ["low low", "lower", "", "newest"]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"text": x}) + "\n" for x in docs))
    vocab, merges = bpe_core.train_bpe(p, 280, [S], num_workers=1)
    tok = Tokenizer(vocab, merges, [S])
    r = encode_corpus(p, tok, tmp_path / "ids.npy", separator=False, doc_index=tmp_path / "idx.npy",
                      progress=False, num_workers=2, chunk_bytes=4)
    each = [tok.encode(x) for x in docs]
    assert np.load(tmp_path / "ids.npy").tolist() == [t for e in each for t in e]
    assert np.load(tmp_path / "idx.npy").tolist() == np.cumsum([0] + [len(e) for e in each[:-1]]).tolist()
    assert r.n_documents == 4


def test_shards_and_manifest_hold_the_flat_ids(tmp_path):
    text = ("the quick brown fox " * 50 + S) * 4
    (tmp_path / "c.txt").write_text(text)
    vocab, merges = bpe_core.train_bpe(tmp_path / "c.txt", 300, [S], num_workers=1)
    tok = Tokenizer(vocab, merges, [S])
    flat = tok.encode(text)
    (tmp_path / "ids-00099.npy").write_bytes(b"stale")     # an earlier run's extra shard goes
    r = encode_corpus(tmp_path / "c.txt", tok, tmp_path / "ids.npy", shard_tokens=37, progress=False,
                      num_workers=2, chunk_bytes=100)
    manifest = json.loads((tmp_path / "ids.manifest.json").read_text())
    got = np.concatenate([np.load(tmp_path / s["path"]) for s in manifest["shards"]]).tolist()
    assert got == flat and manifest["n_tokens"] == len(flat) == r.n_tokens
    assert all(s["n_tokens"] == 37 for s in manifest["shards"][:-1])
    assert [s["first_token"] for s in manifest["shards"]] == list(range(0, len(flat), 37))
    assert not (tmp_path / "ids.npy").exists() and not (tmp_path / "ids-00099.npy").exists()


def test_superbpe_on_records_equals_superbpe_on_the_txt(tmp_path):
    """A method that reads the corpus twice gets non-plain inputs spooled to one temp file."""
    docs = ["the cat sat on the mat " * 5, "the dog sat on the log " * 5, "on the mat"] * 3
    (tmp_path / "c.txt").write_text(S.join(docs))
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps({"text": x}) + "\n"
                                                                for x in docs).encode()))
    kw = dict(method="superbpe", transition=0.5, num_workers=2, spill_dir=str(tmp_path))
    want = bpe_core.train_bpe(tmp_path / "c.txt", 300, [S], **kw)
    assert bpe_core.train_bpe(tmp_path / "c.jsonl.gz", 300, [S], **kw) == want
    assert train_from_iterator(iter(docs), 300, [S], **kw) == want
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl.gz", "c.txt"]        # the spool file is gone
    with pytest.raises(CorpusError, match="need a special token as the document separator"):
        train_from_iterator(["a b", "c d"], 270, [], method="superbpe")


# ==== Bad records ==================================================================================


def _jsonl(tmp_path, lines: list[str], name="d.jsonl") -> pathlib.Path:
    p = tmp_path / name
    p.write_text("".join(line + "\n" for line in lines))
    return p


@pytest.mark.parametrize("line,reason", [
    ('{"text": "a"', "line 2: invalid JSON (Expecting ',' delimiter"),
    ('{"body": "a"}', "line 2: no field 'text'"),
    ('{"text": 3}', "line 2: field 'text' is a number, not a string"),
    ('{"text": null}', "line 2: field 'text' is null, not a string"),
    ('["text"]', "line 2: the record is an array, not an object"),
    ('{"text": "\\ud800"}', "line 2: field 'text' holds a lone surrogate (U+D800)"),
])
def test_bad_jsonl_records_name_file_and_line(tmp_path, line, reason):
    p = _jsonl(tmp_path, ['{"text": "good one"}', line, '{"text": "good two"}'])
    with pytest.raises(CorpusError, match=re.escape(f"d.jsonl: {reason}")):
        bpe_core.train_bpe(p, 270, [S], num_workers=1)
    r = bpe_core.train(bpe_core.TrainConfig(input_path=str(p), vocab_size=270, skip_bad_records=True,
                                            num_workers=1))
    assert r.report["bad_records"]["skipped"] == 1 and r.report["documents"] == 2
    assert reason.split(" (")[0] in r.report["bad_records"]["examples"][0]


def test_bad_record_line_numbers_in_a_large_file_cut_into_ranges(tmp_path):
    lines = [json.dumps({"text": f"doc {i}"}) for i in range(400)]
    lines[321] = "{oops"
    p = _jsonl(tmp_path, lines)
    with pytest.raises(CorpusError, match=r"d.jsonl: line 322: invalid JSON"):
        bpe_core.train_bpe(p, 270, [S], num_workers=2, chunk_bytes=200)


@pytest.mark.parametrize("name,compress", [("gz", gzip.compress), ("xz", lambda b: lzma.compress(b, preset=0)), ("bz2", bz2.compress),
                                           ("zst", lambda b: zstandard.ZstdCompressor().compress(b))])
def test_truncated_streams_are_bad_records(tmp_path, name, compress):
    data = compress(os.urandom(1 << 16).hex().encode())
    p = tmp_path / f"c.txt.{name}"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorpusError, match=rf"c.txt.{name}: compressed bytes? [\d,-]+, after [\d,]+ decompressed bytes: (truncated|corrupt)"):
        bpe_core.train_bpe(p, 270, [S], num_workers=1)
    r = bpe_core.train(bpe_core.TrainConfig(input_path=str(p), vocab_size=270, skip_bad_records=True))
    assert r.report["bad_records"]["skipped"] == 1


def test_corrupt_parquet_and_nulls(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a b", None, "c d"], "n": [1, 2, 3]}), p)
    with pytest.raises(CorpusError, match=r"t.parquet: row 2: the text is null"):
        bpe_core.train_bpe(p, 270, [S])
    with pytest.raises(CorpusError, match=r"t.parquet: no column 'body' \(columns: text, n\)"):
        bpe_core.train_bpe(p, 270, [S], text_column="body")
    with pytest.raises(CorpusError, match=r"column 'n' is int64, not a string or binary column"):
        bpe_core.train_bpe(p, 270, [S], text_column="n")
    bad = tmp_path / "bad.parquet"
    data = p.read_bytes()
    bad.write_bytes(data[:4] + b"\x00" * (len(data) - 8) + data[-4:])
    with pytest.raises(CorpusError, match=r"bad.parquet: not a readable Parquet file"):
        bpe_core.train_bpe(bad, 270, [S])


@pytest.mark.parametrize("text", [b"PAR1", b"PAR1 is a word here", b"PAR1 and a tail that is not the magic PAR",
                                  b"PAR1PAR1PAR1", b"PAR1 ends as it starts: PAR1", b"PAR1\n" * 40])
def test_text_that_starts_with_the_parquet_magic_is_text(tmp_path, text):
    """Parquet starts and ends with PAR1 around a footer; a text file that only starts with it is text
    (hypothesis found ``b"PAR1"``, then ``b"PAR1PAR1PAR1"``, refused as a bad Parquet file); one that
    also ends with it is text when the footer length before the closing magic does not fit."""
    p = tmp_path / "t.txt"
    p.write_bytes(text)
    assert bpe_core.train_bpe(p, 270, [S])[1] == bpe_core.reference.train_bpe_from_bytes(text, 270, [S])[1]


def test_tools_one_line_exit_2_and_skip(tmp_path):
    p = _jsonl(tmp_path, ['{"text": "hello world"}', "not json", '{"text": "hello there"}'])
    r = run_tool(TOOLS / "train_bpe.py", p, "--vocab-size", "270", "--out", tmp_path / "tok")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"train_bpe.py: error: {p}: line 2: invalid JSON (Expecting value "
                                             f"at column 1) (--skip-bad-records skips such records)"]
    r = run_tool(TOOLS / "train_bpe.py", p, "--vocab-size", "270", "--out", tmp_path / "tok", "--skip-bad-records")
    assert r.returncode == 0 and "skipped 1 bad record(s)" in r.stderr
    # stdin, gzip-compressed, to the encoder, beside a file
    (tmp_path / "more.txt").write_text("hello")
    r = run_tool(TOOLS / "encode_corpus.py", "-", tmp_path / "more.txt", "--tokenizer", tmp_path / "tok", "--out",
                 tmp_path / "ids.npy", "--progress", "none", input=gzip.compress(b"hello world"))
    assert r.returncode == 0, r.stderr
    tok = Tokenizer.load(tmp_path / "tok")
    assert np.load(tmp_path / "ids.npy").tolist() == tok.encode("hello world" + S + "hello")


def test_missing_extra_is_one_line(tmp_path, monkeypatch):
    import importlib

    real = importlib.import_module

    def fake(name, *a):
        if name == "zstandard":
            raise ImportError(name)
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake)
    p = tmp_path / "c.txt.zst"
    p.write_bytes(zstandard.ZstdCompressor().compress(b"hello"))
    with pytest.raises(CorpusError, match=r"c.txt.zst: reading this file needs the zstandard module: "
                                          r"pip install zstandard$"):
        bpe_core.train_bpe(p, 270, [S])


# ==== Expanding inputs =============================================================================


def test_inputs_expand_deterministically(tmp_path):
    for rel in ("b/2.txt", "a/10.txt", "a/9.txt", ".hidden/x.txt", "a/.x.txt", "c.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text('{"text": "x"}' if rel.endswith("jsonl") else rel)
    names = [os.path.relpath(s.name, tmp_path) for s in expand_inputs(str(tmp_path))]
    assert names == ["a/10.txt", "a/9.txt", "b/2.txt", "c.jsonl"]
    globbed = expand_inputs([str(tmp_path / "**" / "*.txt"), str(tmp_path / "c.jsonl")])
    assert [os.path.relpath(s.name, tmp_path) for s in globbed] == ["a/10.txt", "a/9.txt", "b/2.txt", "c.jsonl"]
    assert [s.kind for s in globbed] == ["text"] * 3 + ["jsonl"]
    with pytest.raises(CorpusError, match="no file matches this pattern"):
        expand_inputs(str(tmp_path / "*.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="is a directory with no files"):
        expand_inputs(str(tmp_path / "empty"))
    (tmp_path / "x.lz4").write_bytes(b"\x04\x22\x4d\x18" + b"\x00" * 12)
    with pytest.raises(CorpusError, match="is lz4-compressed, which is not read here"):
        expand_inputs(str(tmp_path / "x.lz4"))
    # compression by magic bytes, not by name
    (tmp_path / "plain.gz").write_bytes(b"not gzip at all")
    (tmp_path / "hidden.txt").write_bytes(gzip.compress(b"zipped"))
    assert corpus_bytes(expand_inputs([str(tmp_path / "plain.gz"), str(tmp_path / "hidden.txt")]),
                        ReadOptions(special_tokens=[SB])) == b"not gzip at all" + SB + b"zipped"


def test_compressed_text_is_cut_at_safe_points(tmp_path):
    """A long compressed text with tiny chunks: the blocks tile the text and the counts equal the
    plain file's, whatever the chunk size."""
    text = ("Hello world.\nThe rain in Spain " * 300 + S) * 3
    (tmp_path / "c.txt").write_text(text)
    (tmp_path / "c.txt.gz").write_bytes(gzip.compress(text.encode()))
    want = bpe_core.train(bpe_core.TrainConfig(input_path=str(tmp_path / "c.txt"), vocab_size=300, num_workers=1))
    for chunk in (50, 999, 1 << 20):
        got = bpe_core.train(bpe_core.TrainConfig(input_path=str(tmp_path / "c.txt.gz"), vocab_size=300,
                                                  num_workers=2, chunk_bytes=chunk))
        assert got.merges == want.merges
        assert got.report["n_chunks"] > 1 or chunk > len(text)
        assert got.report["pretokens"] == want.report["pretokens"]
        assert got.report["documents"] == want.report["documents"] == 4


def test_jsonl_reader_doctest_shapes():
    bad = readers.BadRecords(skip=True)
    got = list(readers.jsonl_documents(io.BytesIO(b'{"a.b": "literal"}\n{"a": {"b": "nested"}}'), "x", "a.b", bad))
    assert got == [(b"literal", 1), (b"nested", 2)] and bad.count == 0


def test_datasets_object(tmp_path):
    datasets = pytest.importorskip("datasets")
    docs = ["low low low", "lower", "newest", ""]
    ds = datasets.Dataset.from_dict({"content": docs, "n": [1, 2, 3, 4]})
    want = bpe_core.train_bpe(iter(docs), 280, [S], num_workers=1)
    assert bpe_core.train_bpe(ds, 280, [S], text_column="content") == want
    assert bpe_core.train_bpe(ds.to_iterable_dataset(), 280, [S], text_column="content") == want
    tok = Tokenizer(*want, [S])
    encode_corpus(ds, tok, tmp_path / "ids.npy", text_column="content", progress=False)
    assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(S.join(docs))
