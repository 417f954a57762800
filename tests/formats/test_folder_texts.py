"""The model folder's texts (``formats.texts``: a few passes in C over the whole vocabulary) are, byte
for byte, what the plain writers below write: a Python expression per token and per merge,
``json.dump`` of whole documents. Property-tested over random models: every byte value, tokens with
quotes, backslashes and control bytes, special tokens with odd Unicode (one whose text is an ordinary
token's GPT-2 string), two ids holding the same bytes, merges HF cannot use; and the folder's files are
fsynced once each."""
import hashlib
import io
import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from bpe_core.formats import hf
from bpe_core.encode.tokenizer import model_encoder
from bpe_core.formats.exactness import hf_folder_check
from bpe_core.formats.folder import save_folder
from bpe_core.formats.model import FORMAT_NAME, FORMAT_VERSION, Model, bytes_to_unicode
from bpe_core.formats import texts as texts_module
from bpe_core.formats.texts import FolderTexts, gpt2_name_list, merges_hex_text

# ---- the plain writers (the reference) ---------------------------------------------------------


def plain_gpt2(token: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def plain_vocab_json(vocab):
    entries = {}
    for i in sorted(vocab):
        entries.setdefault(plain_gpt2(vocab[i]), i)
    buf = io.StringIO()
    json.dump(entries, buf, ensure_ascii=False, indent=0)
    return buf.getvalue() + "\n"


def plain_merges_txt(merges):
    return "#version: 0.2\n" + "".join(f"{plain_gpt2(a)} {plain_gpt2(b)}\n" for a, b in merges)


def plain_model_json(model, files):
    doc = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "method": model.method, "pattern": model.pattern,
           "pattern_name": model.pattern_name, "special_tokens": list(model.special_tokens),
           "vocab": [model.vocab[i].hex() for i in range(len(model.vocab))],
           "merges": [[a.hex(), b.hex()] for a, b in model.merges],
           "stages": model.stages, "metadata": model.metadata,
           "files": {name: {"sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
                     for name, text in files.items()}}
    buf = io.StringIO()
    json.dump(doc, buf, ensure_ascii=False, indent=None, separators=(",", ":"))
    return buf.getvalue() + "\n"


def plain_tokenizer_json(model):
    specials = {s.encode("utf-8") for s in model.special_tokens}
    ids = {}
    for i in sorted(model.vocab):
        if model.vocab[i] in specials and i >= 256:
            continue
        ids.setdefault(model.vocab[i], i)
    vocab = {plain_gpt2(b): i for b, i in sorted(ids.items(), key=lambda kv: kv[1])}
    special_ids = {s: min(i for i, v in model.vocab.items() if v == s.encode("utf-8")) for s in model.special_tokens}
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for s, i in sorted(special_ids.items(), key=lambda kv: kv[1])]
    for tok in added:
        vocab.setdefault(tok["content"], tok["id"])
    seen, merges = set(), []
    for a, b in model.merges:
        if (a, b) in seen or a not in ids or b not in ids:
            continue
        seen.add((a, b))
        merges.append(f"{plain_gpt2(a)} {plain_gpt2(b)}")     # (the string form: tokenizers 0.19 reads it)
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": hf.hf_split_pattern(model)}, "behavior": "Isolated",
                "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": merges}}
    return json.dumps(doc, ensure_ascii=False) + "\n"


def plain_folder(model, report):
    files = {"vocab.json": plain_vocab_json(model.vocab), "merges.txt": plain_merges_txt(model.merges)}
    out = dict(files)
    out["model.json"] = plain_model_json(model, files)
    out["tokenizer.json"] = plain_tokenizer_json(model)
    out["tokenizer_config.json"] = json.dumps(hf.hf_tokenizer_config(model), indent=2) + "\n"
    out["train_report.json"] = json.dumps(report, indent=2) + "\n"
    return out


# ---- models ------------------------------------------------------------------------------------

SPECIALS = ["<|endoftext|>", 'a"b\\c', "é\n", "\u2028x", "\x00\x7f", "🙂", "Ġx", "<s>", "\\", '"']
#: bytes a token may hold: quotes, backslashes, control bytes, DEL, Latin-1, UTF-8 lead bytes
ODD = b'"\\\x00\n\r\t\x1f !\x7f\x80\xa0\xad\xc4\xe2\xff' + b"ax"


@st.composite
def native_models(draw):
    """A model laid out as training writes it: the 256 bytes, the special tokens, then one token per
    merge of two earlier tokens (sometimes bytes that another id already holds)."""
    vocab = {i: bytes([i]) for i in range(256)}
    specials = draw(st.lists(st.sampled_from(SPECIALS), unique=True, max_size=4))
    for s in specials:
        vocab[len(vocab)] = s.encode("utf-8")
    pool = [bytes([b]) for b in ODD] + [bytes([b]) for b in draw(st.lists(st.integers(0, 255), max_size=8))]
    merges = []
    for _ in range(draw(st.integers(0, 40))):
        a = draw(st.sampled_from(pool))
        b = draw(st.sampled_from(pool))
        if (a, b) in merges:
            continue
        merges.append((a, b))
        vocab[len(vocab)] = a + b
        if a + b not in pool:
            pool.append(a + b)
    return Model(vocab=vocab, merges=merges, special_tokens=specials, pattern="gpt2",
                 metadata={"n": draw(st.integers(0, 9)), "s": draw(st.text(max_size=4))})


@st.composite
def odd_models(draw):
    """Anything a ``Model`` may hold: repeated pairs, merges of bytes no id holds, repeated strings."""
    model = draw(native_models())
    extra = draw(st.lists(st.tuples(st.binary(min_size=1, max_size=4), st.binary(min_size=1, max_size=4)),
                          max_size=6))
    for a, b in extra:
        model.merges.append((a, b))
        model.vocab[len(model.vocab)] = a + b
    if model.merges and draw(st.booleans()):
        model.merges.append(model.merges[0])
        model.vocab[len(model.vocab)] = model.vocab[len(model.vocab) - 1]
    return model


def check_folder(tmp_path_factory, model, block=3):
    """``block``: entries per piece of text, small so that the pieces' seams are tested too."""
    d = tmp_path_factory.mktemp("tok")
    texts_module.BLOCK, saved = block, texts_module.BLOCK
    report = {"merges": len(model.merges), "é": [1.5, None]}
    try:
        save_folder(model, d, report, hf_check=hf_folder_check(model_encoder(model)))
    finally:
        texts_module.BLOCK = saved
    want = plain_folder(model, report)
    if not report["hf_files"]["written"]:     # HF's files failed their check (formats.exactness): left out
        assert report["hf_files"]["why"].startswith("tokenizer.json, tokenizer_config.json left out: ")
        del want["tokenizer.json"], want["tokenizer_config.json"]
        from bpe_core.formats.remote import remote_file_makers      # transformers runs bpe_core instead
        want.update({name: make() for name, make in remote_file_makers(model).items()})
    assert sorted(os.listdir(d)) == sorted(want)
    for name, text in want.items():
        assert (d / name).read_bytes() == text.encode("utf-8"), name


@settings(max_examples=40, deadline=None)
@given(native_models())
def test_a_native_models_folder_is_what_the_plain_writers_write(tmp_path_factory, model):
    if len(set(model.vocab.values())) == len(model.vocab):        # the fast path of tokenizer.json
        assert FolderTexts(model.vocab, model.merges).hf_vocab_and_merges(model) is not None
    check_folder(tmp_path_factory, model, block=1 + len(model.merges) % 5)


@settings(max_examples=30, deadline=None)
@given(odd_models())
def test_any_models_folder_is_what_the_plain_writers_write(tmp_path_factory, model):
    check_folder(tmp_path_factory, model)


def test_an_ordinary_token_keeps_a_string_that_is_also_a_special_tokens_text(tmp_path_factory):
    vocab = {**{i: bytes([i]) for i in range(256)}, 256: "Ġx".encode("utf-8"), 257: b" x"}
    model = Model(vocab=vocab, merges=[(b" ", b"x")], special_tokens=["Ġx"], pattern="gpt2")
    doc = json.loads(texts_module.join_pieces(hf._hf_pieces(model, None, "")))
    assert doc["model"]["vocab"]["Ġx"] == 257 and doc["added_tokens"][0]["id"] == 256
    check_folder(tmp_path_factory, model)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=5), max_size=300), st.permutations(range(256)))
def test_the_gpt2_strings_and_merge_lines_made_at_once_are_the_plain_ones(tokens, order):
    """The long lists take the path that maps all the bytes at once (64 tokens, 32 merges or more)."""
    tokens = tokens + [bytes([b]) for b in order]
    assert gpt2_name_list(tokens) == [plain_gpt2(t) for t in tokens]
    merges = list(zip(tokens[::2], tokens[1::2]))
    assert texts_module._merge_lines(merges) == "".join(f"{plain_gpt2(a)} {plain_gpt2(b)}\n" for a, b in merges)
    assert texts_module.join_pieces(texts_module.token_hex_pieces(tokens)) == json.dumps([t.hex() for t in tokens], separators=(",", ":"))
    assert merges_hex_text(merges) == json.dumps([[a.hex(), b.hex()] for a, b in merges], separators=(",", ":"))


@settings(max_examples=10, deadline=None)
@given(native_models())
def test_a_folder_written_in_large_blocks_is_the_same(tmp_path_factory, model):
    check_folder(tmp_path_factory, model, block=4096)


def test_every_byte_value_and_the_empty_cases():
    every = [bytes([b]) for b in range(256)]
    assert gpt2_name_list(every) == [plain_gpt2(t) for t in every]
    assert gpt2_name_list([bytes(range(256))]) == [plain_gpt2(bytes(range(256)))]
    assert merges_hex_text([]) == "[]" and merges_hex_text([(b"\x00", b"\xff")]) == '[["00","ff"]]'
    texts = FolderTexts({}, [])
    pieces, dropped = texts.vocab_json()
    assert "".join(pieces) == "{}" and dropped == [] and "".join(texts.merges_txt()) == "#version: 0.2\n"


def test_the_folders_files_are_written_once_and_fsynced_once(tmp_path, monkeypatch):
    """Inside the private folder the files are plain writes (no temp file + rename each), fsynced
    once when the folder is published, and ``vocab.json`` / ``merges.txt`` are hashed as they are
    written (not read back)."""
    import bpe_core.formats.model as fm

    vocab = {**{i: bytes([i]) for i in range(256)}, 256: b"<|endoftext|>", 257: b"ab"}
    model = Model(vocab=vocab, merges=[(b"a", b"b")], special_tokens=["<|endoftext|>"], pattern="gpt2")
    synced, real_fsync = [], os.fsync

    def fsync(fd):
        synced.append(os.fstat(fd).st_ino)
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(fm, "file_sha256", lambda path: (_ for _ in ()).throw(AssertionError("read back")))
    save_folder(model, tmp_path / "tok", {"merges": 1})
    inodes = {os.stat(tmp_path / "tok" / n).st_ino for n in os.listdir(tmp_path / "tok")}
    files = [i for i in synced if i in inodes]
    assert sorted(files) == sorted(inodes)            # each file once


@settings(max_examples=30, deadline=None)
@given(odd_models(), st.sampled_from([0, 1, 2]), st.sampled_from([1, 2, 3, 1 << 20]), st.sampled_from([2, 4096]))
def test_a_folder_of_long_tokens_is_the_same(tmp_path_factory, model, long_bytes, piece_bytes, block):
    """Tokens of ``LONG_TOKEN_BYTES`` or more on average are written one by one, each in slices of
    ``PIECE_BYTES`` of its bytes (both lowered here so that random models take either path, and
    slices cut tokens, escapes and multi-byte characters anywhere): the same files."""
    saved = texts_module.LONG_TOKEN_BYTES, texts_module.PIECE_BYTES
    texts_module.LONG_TOKEN_BYTES, texts_module.PIECE_BYTES = long_bytes, piece_bytes
    try:
        check_folder(tmp_path_factory, model, block=block)
    finally:
        texts_module.LONG_TOKEN_BYTES, texts_module.PIECE_BYTES = saved


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=9), max_size=40), st.sampled_from([0, 1, 5000]), st.integers(1, 4))
def test_the_pieces_of_long_tokens_are_the_plain_texts(tokens, long_bytes, piece_bytes):
    """Each list's text in pieces (``str`` and UTF-8 ``bytes``), one token at a time in slices or a
    block at a time, is the plain one: ``model.json``'s hex lists, ``vocab.json``'s items,
    ``merges.txt``'s lines and ``tokenizer.json``'s merges."""
    saved = texts_module.LONG_TOKEN_BYTES, texts_module.PIECE_BYTES
    texts_module.LONG_TOKEN_BYTES, texts_module.PIECE_BYTES = long_bytes, piece_bytes
    try:
        join = texts_module.join_pieces
        tokens = list(dict.fromkeys(tokens))
        merges = list(zip(tokens[::2], tokens[1::2]))
        assert join(texts_module.token_hex_pieces(tokens)) == json.dumps([t.hex() for t in tokens], separators=(",", ":"))
        assert join(texts_module.merges_hex_pieces(merges)) == json.dumps([[a.hex(), b.hex()] for a, b in merges],
                                                                           separators=(",", ":"))
        items = join(texts_module._json_item_pieces(tokens, range(len(tokens)), ",\n"))
        assert "{" + items + "}" == json.dumps({plain_gpt2(t): i for i, t in enumerate(tokens)}, ensure_ascii=False,
                                               separators=(",\n", ": "))
        texts = FolderTexts(dict(enumerate(tokens)), merges)
        assert join(texts.merges_txt()) == plain_merges_txt(merges)
        assert join(texts._hf_merge_pieces()) == json.dumps([f"{plain_gpt2(a)} {plain_gpt2(b)}" for a, b in merges],
                                                            ensure_ascii=False)
    finally:
        texts_module.LONG_TOKEN_BYTES, texts_module.PIECE_BYTES = saved


@pytest.mark.parametrize("byte", [b"a", b'"', b"\\", b"\0"])
def test_the_folder_of_one_repeated_byte_is_the_same(tmp_path_factory, monkeypatch, byte):
    """What one repeated byte trains (tokens doubling to 256 KiB, then joined): long tokens at the
    default threshold, with the JSON escapes."""
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"<|endoftext|>"
    merges, token = [], byte
    for _ in range(18):
        merges.append((token, token))
        token += token
        vocab[len(vocab)] = token
    merges.append((token, byte * 3))
    vocab[len(vocab)] = token + byte * 3
    model = Model(vocab=vocab, merges=merges, special_tokens=["<|endoftext|>"], pattern="gpt2")
    assert sum(map(len, vocab.values())) >= texts_module.LONG_TOKEN_BYTES * len(vocab)
    import bpe_core.formats.exactness as exactness

    monkeypatch.setattr(texts_module, "PIECE_BYTES", 100_000)                # (slices of tokens up to 256 KiB)
    if byte == b"a":                  # (its tokenizer.json loaded by the check's child process: a large file's path)
        monkeypatch.setattr(exactness, "SEPARATE_CHECK_BYTES", 0)
    check_folder(tmp_path_factory, model, block=4096)
