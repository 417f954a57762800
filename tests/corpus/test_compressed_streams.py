"""Every compressed byte is accounted for (issue 27): a compressed input is read to the end of the
file. All streams of a multi-stream xz/bzip2 (gzip, zstd) file are read; bytes that are not a
stream (garbage between streams, a damaged magic, trailing garbage, bad xz padding) are an error
naming the file and the compressed offset (training, encoding, the CLIs, ``encode_corpus --verify``),
as ``xz -t`` refuses such files; zstd skippable frames (every ``pzstd`` output starts with one) are
recognised and skipped. With ``--skip-bad-records`` every byte the decompressor can give before
the damage is kept, compared byte for byte with the codec's own decompressor, and the message
counts them. JSON Lines records that Python's parser refuses for any reason are bad records.

Results are compared with the plain-text path (same merges, same ids), not only counted.
"""
from __future__ import annotations

from paths import TOOLS
import bz2
import gzip
import io
import json
import lzma
import os
import random
import re
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
from tool_runner import run_tool
from hypothesis import given, settings
from hypothesis import strategies as st

import bpe_core
from bpe_core import Tokenizer, encode_corpus
from bpe_core.corpus import CorpusError, check_input, compressed_format
from bpe_core.corpus.readers import BadRecords, compression_of, decompressed_pieces
from bpe_core.formats.model import Model, dump_model

zstandard = pytest.importorskip("zstandard")

S = "<|endoftext|>"
SB = S.encode()
VOCAB = 300


def _text(n_docs: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "mat", "naïve", "café", "東京", "lower", "newest", "widest", "123"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) + rng.choice([".", "\n", "!"])
            for _ in range(n_docs)]
    return SB.join(d.encode() for d in docs)


TEXT = _text(3000)                          # ~300 KB
HALF = TEXT.rfind(SB, 0, len(TEXT) // 2)     # two streams cut at a document separator
A, B = TEXT[:HALF], TEXT[HALF:]

COMPRESS = {
    "gz": gzip.compress,
    "xz": lambda b: lzma.compress(b, preset=0),
    "bz2": lambda b: bz2.compress(b, 1),    # 100 kB blocks: several per stream
    "zst": lambda b: zstandard.ZstdCompressor(write_checksum=True).compress(b),
}
FORMAT = {"gz": "gzip", "xz": "xz", "bz2": "bzip2", "zst": "zstd"}
UNIT = {"gz": "member", "xz": "stream", "bz2": "stream", "zst": "frame"}
#: Each codec's own decompressor over (possibly truncated) bytes of ONE stream: what it yields.
DECOMPRESS_ONE = {
    "gz": lambda d: zlib.decompressobj(31).decompress(d),
    "xz": lambda d: lzma.LZMADecompressor().decompress(d),
    "bz2": lambda d: bz2.BZ2Decompressor().decompress(d),
    "zst": lambda d: zstandard.ZstdDecompressor().decompressobj().decompress(d),
}
GARBAGE = bytes(range(1, 65))               # 64 bytes, none zero (gzip skips zero padding)


def _train(path, **kw):
    return bpe_core.train_bpe(path, VOCAB, [S], num_workers=1, **kw)


def _train_skip(path):
    r = bpe_core.train(bpe_core.TrainConfig(input_path=str(path), vocab_size=VOCAB, special_tokens=[S],
                                            skip_bad_records=True, num_workers=1))
    return (r.vocab, r.merges), r.report["bad_records"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain-text reference: merges of TEXT, and of the first stream's bytes alone."""
    d = tmp_path_factory.mktemp("plain")
    (d / "all.txt").write_bytes(TEXT)
    (d / "a.txt").write_bytes(A)
    return {"all": _train(d / "all.txt"), "a": _train(d / "a.txt"), "dir": d}


@pytest.fixture(scope="module")
def tok(plain):
    vocab, merges = plain["all"]
    return Tokenizer(vocab, merges, [S])


def _pieces(data: bytes, skip: bool, seekable: bool = True):
    """(kept bytes, bad records) of reading ``data`` as a compressed file."""
    bad = BadRecords(skip=skip)
    raw = io.BytesIO(data) if seekable else io.BufferedReader(_Pipe(data))
    out = b"".join(decompressed_pieces(raw, compression_of(data[:16], "f"), "f", bad, 1 << 16))
    return out, bad


class _Pipe(io.RawIOBase):
    """A reader that cannot seek (standard input)."""

    def __init__(self, data: bytes):
        self._f = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        return self._f.readinto(b)


# ==== Several streams ==============================================================================


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_every_stream_is_read(tmp_path, plain, tok, ext):
    """Two streams (`cat a.xz b.xz`), and for xz with stream padding between them (zero bytes in
    fours, as `xz` writes and reads): all documents, the merges and ids of the plain text."""
    c = COMPRESS[ext]
    files = {"two": c(A) + c(B), "three": c(A[:1000]) + c(A[1000:]) + c(B)}
    if ext in ("xz", "gz"):
        files["padded"] = c(A) + b"\0" * 8 + c(B) + b"\0" * 4
    for name, data in files.items():
        p = tmp_path / f"{name}.txt.{ext}"
        p.write_bytes(data)
        assert _train(p) == plain["all"], name
        encode_corpus(p, tok, tmp_path / "ids.npy", progress=False, verify=True)
        assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(TEXT), name


def _damaged(ext: str) -> dict:
    """{kind: (file bytes, compressed offset of the damage, decompressed bytes before it, streams
    before it)}."""
    c = COMPRESS[ext]
    ca, cb = c(A), c(B)
    magic = bytearray(ca + cb)
    magic[len(ca)] ^= 0xFF
    return {"garbage": (ca + GARBAGE + cb, len(ca), len(A), 1),
            "magic": (bytes(magic), len(ca), len(A), 1),
            "trailing": (ca + cb + GARBAGE, len(ca) + len(cb), len(TEXT), 2)}


@pytest.mark.parametrize("ext", sorted(COMPRESS))
@pytest.mark.parametrize("kind", ["garbage", "magic", "trailing"])
def test_bytes_that_are_not_a_stream_are_an_error(tmp_path, plain, tok, ext, kind):
    data, at, n, k = _damaged(ext)[kind]
    p = tmp_path / f"c.txt.{ext}"
    p.write_bytes(data)
    want = (f"{p}: compressed byte {at:,}, after {n:,} decompressed bytes: not {FORMAT[ext]} data after "
            f"{UNIT[ext]} {k} (trailing garbage or a damaged {UNIT[ext]} header)")
    with pytest.raises(CorpusError, match=re.escape(want)):
        _train(p)
    with pytest.raises(CorpusError, match=re.escape(want)):
        encode_corpus(p, tok, tmp_path / "ids.npy", progress=False, verify=True)
    assert not (tmp_path / "ids.npy").exists()
    # skipping: what came before the damage, as the plain text of it
    got, bad = _train_skip(p)
    assert bad["skipped"] == 1 and bad["examples"] == [want]
    assert got == (plain["a"] if n == len(A) else plain["all"])


def _one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def _tool(name, *args):
    """``python tools/NAME ARGS`` as its own process (forked by ``tool_runner``: no start-up cost)."""
    return run_tool(TOOLS / name, *args, timeout=120)


@pytest.mark.parametrize("ext", ["xz", "bz2"])
def test_cli_refuses_garbage_between_streams(tmp_path, tok, ext):
    """What `xz -t` / `bzip2 -t` call corrupt, the tools refuse: exit 2, one line, no output; and
    `encode_corpus --verify` does not say verified."""
    data, at, n, _ = _damaged(ext)["garbage"]
    p = tmp_path / f"c.txt.{ext}"
    p.write_bytes(data)
    where = f"{p}: compressed byte {at:,}, after {n:,} decompressed bytes: not {FORMAT[ext]} data"
    r = _tool("train_bpe.py", p, "--vocab-size", VOCAB, "--special-token", S, "--out", tmp_path / "tok")
    assert where in _one_line(r) and not (tmp_path / "tok").exists()
    (tmp_path / "model").mkdir()
    dump_model(Model(vocab=tok.vocab, merges=tok.merges, special_tokens=[S], pattern=tok.pattern),
               tmp_path / "model" / "model.json")
    r = _tool("encode_corpus.py", p, "--tokenizer", tmp_path / "model", "--out", tmp_path / "ids.npy", "--verify")
    assert where in _one_line(r) and "verified" not in r.stdout + r.stderr
    assert not (tmp_path / "ids.npy").exists()
    tool = {"xz": "xz", "bz2": "bzip2"}[ext]
    if shutil.which(tool):              # the codec's own test agrees (bzip2 warns, and drops stream 2)
        r = subprocess.run([tool, "-t", str(p)], capture_output=True, text=True)
        assert r.returncode != 0 if ext == "xz" else "trailing garbage" in r.stderr


def test_xz_padding_must_be_fours(tmp_path):
    ca = COMPRESS["xz"](A)
    p = tmp_path / "c.txt.xz"
    p.write_bytes(ca + b"\0" * 3 + COMPRESS["xz"](B))
    with pytest.raises(CorpusError, match=re.escape(f"{p}: compressed byte {len(ca):,}, after {len(A):,} "
                                                    f"decompressed bytes: xz stream padding of 3 bytes")):
        _train(p)


# ==== zstd skippable frames ========================================================================


def _skippable(n: int, low: int = 0) -> bytes:
    return struct.pack("<II", 0x184D2A50 + low, n) + bytes(range(n))


def test_zstd_skippable_frames_are_recognised_and_skipped(tmp_path, plain, tok):
    c = COMPRESS["zst"]
    assert compressed_format(_skippable(4, 0xF))[0] == "zstd" and compressed_format(b"P*M\x19....") is None
    files = {"lead": _skippable(12) + c(TEXT),
             "between": c(A) + _skippable(0, 0xF) + c(B),
             "both": _skippable(8, 3) + c(A) + _skippable(100, 9) + c(B) + _skippable(2)}
    for name, data in files.items():
        p = tmp_path / f"{name}.txt.zst"
        p.write_bytes(data)
        assert _train(p) == plain["all"], name
        encode_corpus(p, tok, tmp_path / "ids.npy", progress=False)
        assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(TEXT), name
        with pytest.raises(CorpusError, match="is zstd-compressed"):
            check_input(p)
    p = tmp_path / "cut.txt.zst"
    p.write_bytes(c(A) + _skippable(100)[:50])          # the file ends inside a skippable frame
    want = (f"compressed byte {len(c(A)) + 50:,}, after {len(A):,} decompressed bytes: truncated zstd stream "
            f"(the file ends inside frame 2)")
    with pytest.raises(CorpusError, match=re.escape(want)):
        _train(p)


@pytest.mark.skipif(not shutil.which("pzstd"), reason="no pzstd")
def test_pzstd_output(tmp_path, plain):
    (tmp_path / "c.txt").write_bytes(TEXT)
    subprocess.run(["pzstd", "-q", "-p", "2", str(tmp_path / "c.txt")], check=True)
    assert _train(tmp_path / "c.txt.zst") == plain["all"]


# ==== Skipping keeps every decompressible byte =====================================================


@pytest.mark.parametrize("ext", sorted(COMPRESS))
@pytest.mark.parametrize("cut", [0.3, 0.5, 0.97])
def test_truncated_keeps_every_decompressible_byte(tmp_path, ext, cut):
    """A truncated file keeps what the codec's own decompressor gives from the same bytes, byte
    for byte, and the message counts exactly that; the training equals the plain text of it."""
    c = COMPRESS[ext]
    ca = c(A)
    for name, data in {"one": c(TEXT), "two": ca + c(B)}.items():
        end = max(16, int(len(data) * cut))         # what sniffing needs to know the format
        cut_data = data[:end]
        want = DECOMPRESS_ONE[ext](cut_data) if name == "one" or end <= len(ca) else \
            A + DECOMPRESS_ONE[ext](cut_data[len(ca):])
        for seekable in (True, False):
            got, bad = _pieces(cut_data, skip=True, seekable=seekable)
            assert got == want, (name, len(got), len(want))
            k = 1 if end <= len(ca) or name == "one" else 2
            assert bad.count == 1 and bad.examples == [
                f"f: compressed byte {end:,}, after {len(want):,} decompressed bytes: truncated "
                f"{FORMAT[ext]} stream (the file ends inside {UNIT[ext]} {k})"]
    p = tmp_path / f"c.txt.{ext}"
    p.write_bytes(c(TEXT)[:int(len(c(TEXT)) * cut)])
    want = DECOMPRESS_ONE[ext](p.read_bytes())
    (tmp_path / "want.txt").write_bytes(want)
    got, bad = _train_skip(p)
    assert bad["skipped"] == 1 and f"after {len(want):,} decompressed bytes" in bad["examples"][0]
    assert got == _train(tmp_path / "want.txt")


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_corrupt_keeps_what_came_before_the_damage(ext):
    """A flipped byte in the middle of the second stream: every byte the decoder gives from the
    bytes before it is kept (at least what those bytes alone decompress to), the message names
    the byte where the decoder stopped, and counts what was kept."""
    c = COMPRESS[ext]
    ca, cb = c(A), c(B)
    data = bytearray(ca + cb)
    flip = len(ca) + len(cb) // 2
    data[flip] ^= 0x55
    before = A + DECOMPRESS_ONE[ext](bytes(data[len(ca):flip]))
    got, bad = _pieces(bytes(data), skip=True)
    assert len(got) >= len(before) and got[:len(before)] == before
    m = re.fullmatch(r"f: compressed byte ([\d,]+), after ([\d,]+) decompressed bytes: corrupt "
                     + FORMAT[ext] + r" stream \(" + UNIT[ext] + r" 2: .*\)", bad.examples[0])
    assert m, bad.examples
    assert int(m[1].replace(",", "")) >= flip and int(m[2].replace(",", "")) == len(got)
    with pytest.raises(CorpusError, match=rf"f: compressed bytes [\d,]+-[\d,]+, after [\d,]+ decompressed "
                                          rf"bytes: corrupt {FORMAT[ext]} stream"):
        _pieces(bytes(data), skip=False)


# ==== JSON Lines the parser refuses ================================================================


@pytest.mark.parametrize("line,reason", [
    ('{"id": ' + "7" * 5000 + ', "text": "x"}', "invalid JSON (Exceeds the limit (4300 digits)"),
    ('{"meta": ' + "[" * 100_000 + "]" * 100_000 + ', "text": "x"}', "invalid JSON (nested too deeply)"),
])
@pytest.mark.parametrize("ext", ["", ".gz"])
def test_records_the_parser_refuses_are_bad_records(tmp_path, line, reason, ext):
    lines = [json.dumps({"text": "good one"}), line, json.dumps({"text": "good two"})]
    data = "".join(x + "\n" for x in lines).encode()
    p = tmp_path / f"d.jsonl{ext}"
    p.write_bytes(gzip.compress(data) if ext else data)
    with pytest.raises(CorpusError, match=re.escape(f"{p}: line 2: {reason}")):
        _train(p)
    got, bad = _train_skip(p)
    assert bad["skipped"] == 1 and bad["examples"][0].startswith(f"{p}: line 2: {reason}")
    (tmp_path / "want.txt").write_bytes(SB.join([b"good one", b"good two"]))
    assert got == _train(tmp_path / "want.txt")


# ==== Property: any cut of any multi-stream file ===================================================


@settings(max_examples=40, deadline=None)
@given(ext=st.sampled_from(sorted(COMPRESS)), bounds=st.lists(st.integers(0, 20_000), max_size=3),
       cut=st.floats(0, 1))
def test_any_cut_keeps_exactly_what_each_stream_gives(ext, bounds, cut):
    """A file of several streams (some empty), cut anywhere: what is kept is, byte for byte, the
    whole streams before the cut and what the codec's decompressor gives of the cut one; cut at a
    stream's end, nothing is bad."""
    text = TEXT[:20_000]
    edges = [0, *sorted(bounds), len(text)]
    streams = [COMPRESS[ext](text[a:b]) for a, b in zip(edges, edges[1:])]
    data = b"".join(streams)
    end = max(16, int(len(data) * cut))         # what sniffing needs to know the format
    want, pos = b"", 0
    for s, (a, b) in zip(streams, zip(edges, edges[1:])):
        if pos + len(s) <= end:
            want += text[a:b]
        elif pos < end:
            want += DECOMPRESS_ONE[ext](data[pos:end])
        pos += len(s)
    got, bad = _pieces(data[:end], skip=True)
    assert got == want
    at_edge = end in {sum(map(len, streams[:i])) for i in range(len(streams) + 1)}
    assert bad.count == (0 if at_edge else 1)
    if not at_edge:
        assert f"after {len(want):,} decompressed bytes: truncated" in bad.examples[0]
