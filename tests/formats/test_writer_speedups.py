"""The model folder's writers take the fast paths (C JSON encoder, one ``str.translate`` per token, one
GPT-2 string per token shared by ``vocab.json``, ``merges.txt`` and ``tokenizer.json``) and still
write, byte for byte, what the plain forms wrote: ``json.dump`` with ``indent=0`` for ``vocab.json``,
``json.dump`` for ``model.json``, a character-by-character GPT-2 mapping, the pair-by-pair filter
of HF's merges, ``json.dumps`` of the whole ``tokenizer.json`` document."""
import io
import json

from hypothesis import given, settings, strategies as st

from bpe_core.formats import hf
from bpe_core.formats.model import Model, bytes_to_unicode, dump_gpt2, dump_model, token_to_gpt2


def _plain_gpt2(token: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def _plain_vocab_json(vocab: dict[int, bytes]) -> str:
    entries: dict[str, int] = {}
    for i in sorted(vocab):
        entries.setdefault(_plain_gpt2(vocab[i]), i)
    buf = io.StringIO()
    json.dump(entries, buf, ensure_ascii=False, indent=0)
    return buf.getvalue() + "\n"


def _plain_usable(model: Model, ids) -> list:
    seen, out = set(), []
    for a, b in model.merges:
        if (a, b) in seen or a not in ids or b not in ids:
            continue
        seen.add((a, b))
        out.append((a, b))
    return out


tokens = st.binary(min_size=1, max_size=6)


@st.composite
def models(draw):
    """A model with arbitrary bytes: repeated strings (two merges building the same bytes), repeated
    pairs, merges whose parts are no token, special tokens with quotes and backslashes."""
    vocab = {i: bytes([i]) for i in range(256)}
    specials = draw(st.lists(st.sampled_from(["<|endoftext|>", 'a"b\\c', "é\n", "<s>"]), unique=True, max_size=3))
    for s in specials:
        vocab[len(vocab)] = s.encode("utf-8")
    merges = []
    for _ in range(draw(st.integers(0, 30))):
        a, b = draw(tokens), draw(tokens)
        merges.append((a, b))
        vocab[len(vocab)] = a + b
    return Model(vocab=vocab, merges=merges, special_tokens=specials, pattern="gpt2",
                 metadata={"x": draw(st.floats(allow_nan=False)), "s": draw(st.text(max_size=5))})


@settings(max_examples=20, deadline=None)
@given(models())
def test_gpt2_files_and_model_json_are_what_the_plain_writers_wrote(tmp_path_factory, model):
    d = tmp_path_factory.mktemp("w")
    dump_gpt2(model.vocab, model.merges, d)
    assert (d / "vocab.json").read_text(encoding="utf-8") == _plain_vocab_json(model.vocab)
    merges = "#version: 0.2\n" + "".join(f"{_plain_gpt2(a)} {_plain_gpt2(b)}\n" for a, b in model.merges)
    assert (d / "merges.txt").read_text(encoding="utf-8") == merges
    dump_model(model, d / "model.json")
    doc = json.loads((d / "model.json").read_text(encoding="utf-8"))
    buf = io.StringIO()
    json.dump(doc, buf, ensure_ascii=False, indent=None, separators=(",", ":"))
    assert (d / "model.json").read_text(encoding="utf-8") == buf.getvalue() + "\n"


@settings(max_examples=60, deadline=None)
@given(models())
def test_hf_merges_and_vocab_are_the_pair_by_pair_ones(model):
    ids = hf.unique_ids(model)
    assert hf.usable_merges(model, ids) == _plain_usable(model, ids)
    doc = hf.hf_tokenizer_json(model)
    assert doc["model"]["merges"] == [f"{_plain_gpt2(a)} {_plain_gpt2(b)}" for a, b in _plain_usable(model, ids)]
    assert all(doc["model"]["vocab"][_plain_gpt2(b)] == i for b, i in ids.items())
    assert hf.hf_tokenizer_text(model) == json.dumps(doc, ensure_ascii=False)       # tokenizer.json's text


def test_token_to_gpt2_is_the_byte_by_byte_map():
    every = bytes(range(256))
    assert token_to_gpt2(every) == _plain_gpt2(every) and token_to_gpt2(b" the") == "Ġthe"
