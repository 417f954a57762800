"""The add-a-method recipe of ``docs/architecture.md``, followed in a test: a tiny method defined
here registers itself and trains through the public API and the command line, with no other module
touched; its merges equal the plain reference loop with the same rule.

The method, ``capped``: byte-level BPE whose tokens are at most ``MAX_BYTES`` bytes long (a pair
whose bytes would be longer never merges). It needs one pass over the corpus, so it sets
``rereads_input = False``; it drops one-byte words as plain BPE does.
"""
from paths import REPO
import json
import pathlib
import sys

import pytest

from bpe_core import reference
from bpe_core.engine.merge import train_words
from bpe_core.encode.tokenizer import Tokenizer
from bpe_core.formats import registry
from bpe_core.formats.model import load_model
from bpe_core.training import train_bpe

ROOT = REPO
sys.path.insert(0, str(ROOT / "tools"))
import train_bpe as cli  # noqa: E402

MAX_BYTES = 3
TEXT = ("the cat sat on the mat. the dog sat on the log. a theatre, the thesis.\n" * 30
        + "<|endoftext|>" + "naïve café 123 4567 it's\n" * 10)


class Capped(registry.Method):
    """BPE with tokens of at most ``MAX_BYTES`` bytes."""

    name = "capped-test"
    rereads_input = False
    drops_single_byte_words = True

    def train(self, config, table, plan, progress=False, init=None) -> registry.MethodResult:
        vocab, merges = train_words(table, config.vocab_size, config.special_tokens, progress=progress,
                                    allowed=lambda left, right: len(left) + len(right) <= MAX_BYTES)
        return registry.MethodResult(vocab, merges, [{"name": self.name, "merges": len(merges)}],
                                     {"capped_at": MAX_BYTES})


@pytest.fixture
def capped():
    method = registry.register(Capped())
    yield method
    registry.unregister(method.name)


def reference_merges(data: bytes, vocab_size: int):
    words = {}
    for pretoken, n in reference.count_pretokens(data, ["<|endoftext|>"]).items():
        key = tuple(bytes([b]) for b in pretoken)
        words[key] = words.get(key, 0) + n
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"<|endoftext|>"
    merges = []
    reference.merge_loop(words, vocab, merges, vocab_size, allowed=lambda a, b: len(a) + len(b) <= MAX_BYTES)
    return merges


def test_a_registered_method_trains_through_the_api(capped, tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(TEXT.encode())
    vocab, merges = train_bpe(path, 320, ["<|endoftext|>"], method="capped-test", num_workers=1)
    assert merges == reference_merges(TEXT.encode(), 320)
    assert max(len(a + b) for a, b in merges) <= MAX_BYTES
    assert len(merges) > 20


def test_a_registered_method_trains_through_the_cli(capped, tmp_path, capsys):
    path = tmp_path / "c.txt"
    path.write_bytes(TEXT.encode())
    out = tmp_path / "tok"
    assert cli.main([str(path), "--vocab-size", "300", "--method", "capped-test", "--out", str(out),
                     "--no-progress"]) == 0
    model = load_model(out / "model.json")
    assert model.method == "capped-test"
    assert model.merges == reference_merges(TEXT.encode(), 300)
    report = json.loads((out / "train_report.json").read_text())
    assert report["capped_at"] == MAX_BYTES
    tok = Tokenizer.load(out)              # the folder loads and encodes with the method's merges
    assert tok.decode(tok.encode("the thesis")) == "the thesis"


def test_an_unregistered_method_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "c.txt"
    path.write_bytes(TEXT.encode())
    with pytest.raises(SystemExit) as exc:
        cli.main([str(path), "--vocab-size", "300", "--method", "capped-test", "--out", str(tmp_path / "t")])
    assert exc.value.code == 2
    assert "invalid choice: 'capped-test'" in capsys.readouterr().err
