"""A ``transformers`` tokenizer backed by bpe_core: the ids that bpe_core's own encoder gives (the
stage-aware one for SuperBPE, which reproduces training), inside ``transformers``.

``export_transformers(model, folder)`` (``tools/export_tokenizer.py --format transformers``) writes
``model.json``, ``tokenizer_config.json`` and ``tokenization_bpe_core.py`` (a copy of this file);
then::

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)

loads :class:`BpeCoreTokenizer`. It needs ``transformers`` and ``bpe_core`` installed where it
runs. Encoding, decoding, batches, special tokens (split out by ``transformers`` before bpe_core sees
the text, as bpe_core does itself) and ``save_pretrained`` work as for any slow tokenizer.

This file imports bpe_core by absolute name only: ``transformers`` copies it into the folder and
loads it from there as a module of its own.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional

from transformers import PreTrainedTokenizer

from bpe_core.encode.tokenizer import Tokenizer
from bpe_core.formats.model import dump_model, load_any, token_to_gpt2
from bpe_core.runtime.atomic import atomic_write

MODEL_FILE = "model.json"
CODE_FILE = "tokenization_bpe_core.py"
CLASS_NAME = "BpeCoreTokenizer"


class BpeCoreTokenizer(PreTrainedTokenizer):
    """A slow ``transformers`` tokenizer whose text -> ids step is ``bpe_core.Tokenizer.load``.

    Tokens are shown as GPT-2 byte-level strings (``token_to_gpt2``), one per distinct token;
    special tokens as their text.
    """

    vocab_files_names = {"model_file": MODEL_FILE}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, model_file: str, **kwargs):
        self._model = load_any(model_file)
        self._tok = Tokenizer.load(model_file)
        specials = {s.encode("utf-8"): s for s in self._model.special_tokens}
        self._str_of_id: dict[int, str] = {}
        self._id_of_str: dict[str, int] = {}
        for i in sorted(self._model.vocab):
            b = self._model.vocab[i]
            s = specials.get(b) if i >= 256 and b in specials else token_to_gpt2(b)
            self._str_of_id[i] = s
            self._id_of_str.setdefault(s, i)      # bytes held by two ids: the smaller, as the encoder
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        if self._model.special_tokens:      # the document separator ends a text and pads a batch
            kwargs.setdefault("eos_token", self._model.special_tokens[0])
            kwargs.setdefault("pad_token", self._model.special_tokens[0])
        super().__init__(**kwargs)
        extra = [s for s in self._model.special_tokens if s not in self.all_special_tokens]
        if extra:
            self.add_special_tokens({"additional_special_tokens": extra})

    @property
    def vocab_size(self) -> int:
        return len(self._model.vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._id_of_str)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [self._str_of_id[i] for i in self._tok.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self._id_of_str[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self._str_of_id[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        ids = [self._id_of_str[t] for t in tokens]
        return self._tok.decode_bytes(ids).decode("utf-8", "replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: Optional[str] = None) -> tuple[str]:
        name = (filename_prefix + "-" if filename_prefix else "") + MODEL_FILE
        path = os.path.join(save_directory, name)
        dump_model(self._model, path)
        return (path,)


def export_transformers(model, folder: str | os.PathLike) -> list[str]:
    """Write a folder ``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)`` loads:
    ``model.json``, ``tokenizer_config.json`` and ``tokenization_bpe_core.py``; returns the paths."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    model_path = os.path.join(folder, MODEL_FILE)
    dump_model(model, model_path)
    code_path = os.path.join(folder, CODE_FILE)
    with open(__file__, encoding="utf-8") as src, atomic_write(code_path, "w", encoding="utf-8") as dst:
        shutil.copyfileobj(src, dst)
    config = {
        "tokenizer_class": CLASS_NAME,
        "auto_map": {"AutoTokenizer": [f"{CODE_FILE[:-3]}.{CLASS_NAME}", None]},
        "model_file": MODEL_FILE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 60,
    }
    if model.special_tokens:
        config["eos_token"] = config["pad_token"] = model.special_tokens[0]
    config_path = os.path.join(folder, "tokenizer_config.json")
    with atomic_write(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
        f.write("\n")
    return [model_path, config_path, code_path]
