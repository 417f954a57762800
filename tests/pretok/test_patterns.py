"""Pattern names, custom regexes that do not cover the text, the end of a piece, the list API.

- Names: tiktoken's names are aliases (any case); an unknown name is a ValueError listing the names
  (CLI: one line, exit 2); a custom regex needs a metacharacter (CLI: ``--regex``).
- Gap filling: with any pattern the pretokens concatenate to the input; the text between matches is
  a pretoken of its own, in ``pretokenize``, the reference, training counts and the encoder alike.
- The end of a piece (the end of the text, or the text before a special token): native == ``regex``
  for every named pattern on whitespace runs of mixed ``\\r \\n \\t \\x85 \\u3000`` ...
- ``_pretok.split_pieces`` (the list API) == slicing by ``split_ends``.
"""
from __future__ import annotations

from paths import REPO
import json
import os
import pathlib

import numpy as np
import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st

from bpe_core import reference
from bpe_core.pretok import _pretok
from bpe_core.config import TrainConfig
from bpe_core.corpus.specials import encode_specials, split_on_specials
from bpe_core.pretok.patterns import PATTERN_ALIASES, PATTERNS, pattern_name, regex_pieces, resolve_pattern
from bpe_core.pretok.pretokenize import count_pretokens, is_native, pretoken_ends, pretokenize
from bpe_core.encode.tokenizer import Tokenizer
from tool_runner import run_tool

ROOT = REPO
NAMES = list(PATTERNS)
EOT = "<|endoftext|>"
# Custom patterns that do not cover every text; x* and (?=a) match the empty string.
GAPPY = [r"[a-z]+", r"x*", r"\d", r"\s+", r"(?=a)", r"a|(?=b)", r"\p{L}+|[!?]", r"(?:ab)+|\b"]


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _plain_regex_pieces(data: bytes, pattern: str) -> list[bytes]:
    """The truth for a named pattern (which covers every text): ``regex.finditer``, nothing else."""
    text = data.decode("utf-8", "surrogateescape")
    return [_encode(m.group()) for m in regex.finditer(pattern, text)]


# ==== Names ========================================================================================


@pytest.mark.parametrize("alias", sorted(PATTERN_ALIASES))
def test_aliases_any_case_resolve_to_the_native_scanner(alias):
    name = PATTERN_ALIASES[alias]
    for spelling in (alias, alias.upper(), alias.title()):
        assert pattern_name(spelling) == name
        assert resolve_pattern(spelling) == PATTERNS[name]
        assert is_native(spelling)
    data = b"Hello  WORLD's 12345\r\n\t x"
    assert pretokenize(data, alias.upper()) == pretokenize(data, name)


def test_tiktoken_names_and_patterns():
    """r50k/p50k use GPT-2's split pattern in tiktoken; cl100k/o200k are ours character for character."""
    m = pytest.importorskip("tiktoken_ext.openai_public")
    src = pathlib.Path(m.__file__).read_text()
    assert src.count('"pat_str": r50k_pat_str') >= 3          # gpt2, r50k_base, p50k_base (and p50k_edit)
    assert PATTERNS["cl100k"] in src
    for part in PATTERNS["o200k"].split("|"):
        assert part in src
    for alias in ("r50k_base", "p50k_base", "cl100k_base", "o200k_base"):
        assert hasattr(m, alias) and alias in PATTERN_ALIASES


@given(st.text(st.sampled_from(list("ab Z1'sdlv\t\n\r\x85\u3000é!")), max_size=40))
def test_tiktoken_r50k_form_gives_the_gpt2_pieces(text):
    """tiktoken writes GPT-2's pattern with possessive quantifiers; the pieces are the same."""
    m = pytest.importorskip("tiktoken_ext.openai_public")
    assert regex.findall(m.r50k_pat_str, text) == regex.findall(PATTERNS["gpt2"], text)


@pytest.mark.parametrize("bad", ["GPT-2", "gpt3", "cl100k-base", "o200k base", "r50"])
def test_unknown_name_is_a_value_error_listing_the_names(bad):
    with pytest.raises(ValueError) as exc:
        resolve_pattern(bad)
    msg = str(exc.value)
    assert repr(bad) in msg and "unknown pre-tokenization pattern name" in msg
    for name in ("gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base"):
        assert name in msg
    with pytest.raises(ValueError, match="unknown pre-tokenization pattern name"):
        pretokenize(b"abc", bad)
    with pytest.raises(ValueError, match="unknown pre-tokenization pattern name"):
        TrainConfig(input_path="x.txt", vocab_size=300, pattern=bad)
    with pytest.raises(ValueError, match="unknown pre-tokenization pattern name"):
        Tokenizer({i: bytes([i]) for i in range(256)}, [], pattern=bad)


def test_bad_regex_and_non_strings():
    with pytest.raises(ValueError, match=r"invalid pre-tokenization regex '\(unclosed'"):
        resolve_pattern("(unclosed")
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="non-empty string"):
            resolve_pattern(bad)


def test_train_config_stores_the_canonical_name():
    assert TrainConfig(input_path="x", vocab_size=300, pattern="CL100K_BASE").pattern == "cl100k"
    assert TrainConfig(input_path="x", vocab_size=300, pattern=PATTERNS["o200k"]).pattern == "o200k"
    assert TrainConfig(input_path="x", vocab_size=300, pattern=r"[a-z]+").pattern == r"[a-z]+"


def test_stored_model_pattern_stays_native():
    """model.json stores the full regex string: it must still run on the native scanner."""
    for name, pat in PATTERNS.items():
        assert pattern_name(pat) == name and is_native(pat)
        tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], pattern=pat)
        assert tok._pattern_id == _pretok.PATTERN_IDS[name]


# ==== Gap filling: every pattern keeps every byte ==================================================

_TEXT = st.lists(st.sampled_from(list("abxyzAB019 \t\n!?é日") + ["ab", "xx", "\udcff", "\r\n", "’"]),
                 max_size=40).map("".join).map(_encode)


def _check_pieces(data: bytes, pattern: str, pieces: list[bytes]) -> None:
    """Pieces == non-empty matches, in order, and the non-empty texts between them."""
    assert b"".join(pieces) == data
    assert all(pieces)
    text = data.decode("utf-8", "surrogateescape")
    matches = [(m.start(), m.end()) for m in regex.finditer(pattern, text) if m.end() > m.start()]
    bounds = sorted({0, len(text), *(x for span in matches for x in span)})
    want = [_encode(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    assert pieces == want


@given(_TEXT, st.sampled_from(GAPPY))
def test_gaps_become_pretokens_everywhere(data, pattern):
    pieces = pretokenize(data, pattern)
    _check_pieces(data, pattern, pieces)
    assert reference.pretokenize(data, pattern) == pieces
    assert regex_pieces(data, regex.compile(pattern)) == pieces
    ends = pretoken_ends(data, pattern).tolist()
    assert ends == np.cumsum([len(p) for p in pieces]).tolist()
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], pattern=pattern)
    assert tok._pretoken_ends(data, 0, len(data)).tolist() == ends
    assert tok.decode_bytes(tok.encode(data)) == data
    arena, offsets, counts = count_pretokens(data, np.array([[0, len(data)]]), pattern)
    words = {arena[offsets[i]:offsets[i + 1]].tobytes(): int(counts[i]) for i in range(len(counts))}
    assert words == {w: pieces.count(w) for w in set(pieces)}


@given(_TEXT, st.sampled_from(GAPPY))
def test_gaps_with_special_tokens(data, pattern):
    text = data + EOT.encode() + data + b"<|end|>" + data
    got = pretokenize(text, pattern, [EOT, "<|end|>"])
    assert b"".join(got) == text
    want = []
    for piece, special in split_on_specials(text, encode_specials([EOT, "<|end|>"])):
        want += [piece] if special else reference.pretokenize(piece, pattern)
    assert got == want


def test_the_issue_examples():
    text = ("The Quick brown fox, 1234 jumps!\n" * 200).encode()
    for pattern in (r"[a-z]+", r"x*", r"(?=a)"):
        assert b"".join(pretokenize(text, pattern)) == text
    assert pretokenize(b"axxb", "x*") == [b"a", b"xx", b"b"]
    assert pretokenize(b"abc", "(?=a)") == [b"abc"]


@pytest.mark.parametrize("pattern", [r"[a-z]+", r"x*"])
def test_train_encode_decode_round_trip_with_a_non_covering_pattern(tmp_path, pattern):
    from bpe_core.training import train

    data = ("The Quick brown fox, 1234 jumps over the lazy dog!\n" * 40 + EOT
            + "Ünïcödé TEXT and more text 99\n" * 30).encode()
    path = tmp_path / "c.txt"
    path.write_bytes(data)
    result = train(TrainConfig(input_path=str(path), vocab_size=300, special_tokens=(EOT,), pattern=pattern,
                               num_workers=1))
    ref_vocab, ref_merges = reference.train_bpe_from_bytes(data, 300, [EOT], pattern)
    assert result.merges == ref_merges and result.vocab == ref_vocab
    assert len(result.merges) == 300 - 257          # the gaps count: training is not starved
    tok = Tokenizer(result.vocab, result.merges, [EOT], pattern)
    ids = tok.encode(data)
    assert ids == reference.encode(data, result.vocab, result.merges, [EOT], pattern)
    assert tok.decode_bytes(ids) == data
    text = data.decode()
    assert list(tok.encode_iterable([text[i:i + 7] for i in range(0, len(text), 7)])) == ids


# ==== The end of a piece: native == regex ==========================================================

_WS = ["\t", "\n", "\r", "\r\n", " ", "\x0b", "\x0c", "\x85", "\u3000", "\u00a0", "\u2028", "\u2029"]
_BEFORE = st.lists(st.sampled_from(["a", "Ab", "1", "12345", "!", "'s", " ", "x\n", "日本", "\udc80", "é"]),
                   max_size=4).map("".join)


@given(_BEFORE, st.lists(st.sampled_from(_WS), min_size=1, max_size=6).map("".join),
       st.sampled_from(["", "a", "1", "!"]))
def test_whitespace_runs_at_the_end_of_a_piece(before, run, after_special):
    """The text ends in a whitespace run, alone or before a special token."""
    for name in NAMES:
        data = _encode(before + run)
        assert pretokenize(data, name) == _plain_regex_pieces(data, PATTERNS[name]), name
        assert pretoken_ends(data, name).tolist() == \
            np.cumsum([len(p) for p in _plain_regex_pieces(data, PATTERNS[name])]).tolist()
        full = data + EOT.encode() + _encode(after_special)
        want = _plain_regex_pieces(data, PATTERNS[name]) + [EOT.encode()] + \
            _plain_regex_pieces(_encode(after_special), PATTERNS[name])
        assert pretokenize(full, name, [EOT]) == want, name


@pytest.mark.parametrize("name", NAMES)
def test_the_issue_end_cases_both_ways(name):
    for text in ["a\n\t", "\x85\r\n\u3000", "a \n", "a\t\n\t", "a\n\t ", "x\r\n\r\n\u3000\t"]:
        data = _encode(text)
        want = _plain_regex_pieces(data, PATTERNS[name])
        assert pretokenize(data, name) == want
        assert pretokenize(data + EOT.encode() + b"b", name, [EOT]) == want + [EOT.encode(), b"b"]
    # Literal expectations under regex (checked above against the native scanner).
    if name in ("gpt2", "cl100k"):
        assert _plain_regex_pieces(b"a\n\t", PATTERNS[name]) == [b"a", b"\n\t"]
    else:
        assert _plain_regex_pieces(b"a\n\t", PATTERNS[name]) == [b"a", b"\n", b"\t"]


# ==== The list API ================================================================================


@given(st.binary(max_size=120) | _BEFORE.map(_encode), st.lists(st.integers(0, 130), max_size=8),
       st.sampled_from(NAMES))
def test_split_pieces_equals_slicing_split_ends(data, cuts, name):
    """Random special spans: each is one item, the text between is sliced by split_ends."""
    pts = sorted({c % (len(data) + 1) for c in cuts})
    spans = [(a, b) for a, b in zip(pts[0::2], pts[1::2]) if b > a]
    pid = _pretok.PATTERN_IDS[name]
    got = _pretok.split_pieces(data, pid, np.array(spans, dtype=np.int64).reshape(-1, 2))
    want, pos = [], 0
    for a, b in spans + [(len(data), None)]:
        text = data[pos:a]
        ends = _pretok.split_ends(text, pid).tolist()
        want += [text[x:y] for x, y in zip([0] + ends[:-1], ends)]
        if b is not None:
            want.append(data[a:b])
            pos = b
    assert got == want
    assert all(type(p) is bytes for p in got)


def test_split_pieces_on_a_large_text_shares_short_words():
    data = ("the cat sat on the mat, " * 20000 + "averyveryverylongwordthatisnotshort " * 10).encode()
    got = _pretok.split_pieces(data, _pretok.PATTERN_IDS["gpt2"], np.zeros((0, 2), np.int64))
    assert got == _plain_regex_pieces(data, PATTERNS["gpt2"])
    assert len({id(p) for p in got if p == b" the"}) < 10      # the cache hands out one object


def test_split_pieces_checks_its_spans():
    pid = _pretok.PATTERN_IDS["gpt2"]
    for spans in ([[2, 1]], [[0, 4]], [[1, 1]], [[0, 2], [1, 3]]):
        with pytest.raises(ValueError, match="special span"):
            _pretok.split_pieces(b"abc", pid, np.array(spans, dtype=np.int64))
    with pytest.raises(ValueError):
        _pretok.split_pieces(b"abc", 9, np.zeros((0, 2), np.int64))


# ==== The CLI ======================================================================================


def _train_cli(tmp_path, *args):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"The Quick brown fox, 1234 jumps!\n" * 50)
    out = tmp_path / "tok"
    r = run_tool(ROOT / "tools" / "train_bpe.py", corpus, "--vocab-size", "280", "--out", out, "--workers", "1",
                 "--no-progress", *args)
    return r, out


@pytest.mark.parametrize("spelling,name", [("GPT2", "gpt2"), ("cl100k_base", "cl100k"), ("O200K_BASE", "o200k"),
                                           ("r50k", "gpt2"), ("p50k_base", "gpt2")])
def test_cli_pattern_names(tmp_path, spelling, name):
    r, out = _train_cli(tmp_path, "--pattern", spelling)
    assert r.returncode == 0, r.stderr
    model = json.loads((out / "model.json").read_text())
    assert model["pattern"] == PATTERNS[name] and len(model["merges"]) == 280 - 257


@pytest.mark.parametrize("args,words", [
    (["--pattern", "gpt3"], ["unknown pattern name 'gpt3'", "cl100k_base", "--regex"]),
    (["--pattern", "[a-z]+"], ["unknown pattern name", "--regex"]),
    (["--regex", "(unclosed"], ["invalid pre-tokenization regex"]),
    (["--regex", ""], ["--regex"]),
    (["--regex", "[a-z]+", "--pattern", "gpt2"], ["--pattern and --regex"]),
])
def test_cli_bad_pattern_is_one_line_exit_2(tmp_path, args, words):
    r, out = _train_cli(tmp_path, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0]
    assert not out.exists() or os.listdir(out) == []


@pytest.mark.parametrize("rx", [r"[a-z]+", r"x*", r"abc"])
def test_cli_regex_trains_and_round_trips(tmp_path, rx):
    r, out = _train_cli(tmp_path, "--regex", rx)
    assert r.returncode == 0, r.stderr
    model = json.loads((out / "model.json").read_text())
    assert len(model["merges"]) == 280 - 257
    tok = Tokenizer.load(out)
    data = (tmp_path / "c.txt").read_bytes()
    assert tok.decode_bytes(tok.encode(data)) == data
    ids_path = tmp_path / "ids.npy"
    r = run_tool(ROOT / "tools" / "encode_corpus.py", tmp_path / "c.txt", "--tokenizer", out, "--out", ids_path,
                 "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert tok.decode_bytes(np.load(ids_path).tolist()) == data
