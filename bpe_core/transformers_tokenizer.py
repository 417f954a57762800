"""A ``transformers`` tokenizer backed by bpe_core: the ids that bpe_core's own encoder gives (the
stage-aware one for SuperBPE and SupraTok, which reproduces training), inside ``transformers``.

``export_transformers(model, folder)`` (``tools/export_tokenizer.py --format transformers``) writes
``model.json``, ``tokenizer_config.json`` and ``tokenization_bpe_core.py`` (a copy of this file;
``formats.remote``), and a training folder of a stage-aware method carries the last two beside its
``model.json``; then::

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)

loads :class:`BpeCoreTokenizer`, from any working folder, on ``transformers`` 4.40+ and 5.x. It
needs ``transformers`` and ``bpe_core`` installed where it runs. Encoding, decoding, batches,
special tokens (split out by ``transformers`` before bpe_core sees the text, as bpe_core does
itself) and ``save_pretrained`` work as for any slow tokenizer.

This file imports bpe_core by absolute name only: ``transformers`` copies it into its module cache
and loads it from there as a module of its own. The bpe_core imports sit in a ``try`` block:
``transformers`` then does not ask for a package named ``bpe_core`` on its own, and a missing
bpe_core is one line saying what to install.
"""
from __future__ import annotations

import os
from typing import Optional

from transformers import PreTrainedTokenizer

try:
    from bpe_core.encode.tokenizer import Tokenizer
    from bpe_core.formats.model import dump_model, load_any, token_to_gpt2
    from bpe_core.formats.remote import dump_remote
except ImportError as _exc:               # (transformers' check of the module's imports skips try blocks)
    raise ImportError(f"tokenization_bpe_core.py: this tokenizer runs bpe_core's own encoder, and bpe_core "
                      f"cannot be imported here ({_exc}); install bpe_core in this Python environment "
                      f"(pip install . in a checkout of bpe_core)") from None

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

    def __init__(self, model_file: Optional[str] = None, **kwargs):
        if model_file is None or not os.path.isfile(model_file):
            raise FileNotFoundError(f"BpeCoreTokenizer: no {MODEL_FILE} (got {model_file!r}): the folder given to "
                                    f"from_pretrained must hold the model's {MODEL_FILE}")
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
    ``model.json``, ``tokenizer_config.json`` and ``tokenization_bpe_core.py``, published as one
    unit (``formats.remote.dump_remote``); returns the paths."""
    return dump_remote(model, folder)
