"""The output folder of ``tools/train_bpe.py`` loads as users of the ecosystem expect: for plain
BPE it holds HF's ``tokenizer.json`` + ``tokenizer_config.json``, so
``transformers.AutoTokenizer.from_pretrained(folder)`` and
``tokenizers.Tokenizer.from_file(folder/tokenizer.json)`` give bpe_core's ids on held-out text;
``TrainResult.save`` and ``Tokenizer.save`` write the same folder; a stage-aware model's folder
has no ``tokenizer.json`` (HF cannot reproduce its stages) but the remote-code files that
``AutoTokenizer(trust_remote_code=True)`` loads (tests/formats/test_loaders.py)."""
import json
import sys

import pytest

from bpe_core import TrainConfig
from bpe_core.encode.tokenizer import Tokenizer
from bpe_core.training import train
from paths import FIXTURES, TOOLS

sys.path.insert(0, str(TOOLS))
import train_bpe as cli  # noqa: E402

HELD_OUT = ((FIXTURES / "german.txt").read_text(encoding="utf-8") + (FIXTURES / "address.txt").read_text(encoding="utf-8")
            + " naïve café — 東京 \t\t x\n\n\n  y<|endoftext|>after the end   ")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "tok"
    assert cli.main([str(FIXTURES / "corpus.en"), "--vocab-size", "700", "--out", str(out), "--no-progress"]) == 0
    return out


def test_the_folder_has_hf_files(folder):
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["eos_token"] == "<|endoftext|>"


def test_tokenizers_loads_tokenizer_json_with_our_ids(folder):
    tokenizers = pytest.importorskip("tokenizers")
    ours = Tokenizer.load(folder).encode(HELD_OUT)
    theirs = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).encode(HELD_OUT).ids
    assert theirs == ours


def test_auto_tokenizer_loads_the_folder_with_our_ids(folder):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = Tokenizer.load(folder).encode(HELD_OUT)
    assert tok(HELD_OUT)["input_ids"] == ours
    assert tok.decode(ours) == HELD_OUT


def test_the_api_writes_the_same_folder(folder, tmp_path):
    result = train(TrainConfig(input_path=str(FIXTURES / "corpus.en"), vocab_size=700, progress=False))
    result.save(tmp_path / "api")
    Tokenizer.load(folder).save(tmp_path / "tok")
    for name in ("vocab.json", "merges.txt", "model.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "api" / name).read_bytes() == (folder / name).read_bytes(), name
        assert (tmp_path / "tok" / name).read_bytes() == (folder / name).read_bytes(), name


def test_a_stage_aware_folder_has_no_tokenizer_json(tmp_path):
    out = tmp_path / "sb"
    assert cli.main([str(FIXTURES / "corpus.en"), "--vocab-size", "700", "--method", "superbpe", "--out", str(out),
                     "--no-progress"]) == 0
    assert (out / "model.json").is_file()
    assert not (out / "tokenizer.json").exists()
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BpeCoreTokenizer" and (out / "tokenization_bpe_core.py").is_file()
