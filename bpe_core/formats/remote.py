"""The files that make a folder load with ``transformers.AutoTokenizer.from_pretrained(folder,
trust_remote_code=True)`` as a tokenizer backed by bpe_core's own encoder (the stage-aware one for
SuperBPE and SupraTok): the ids are bpe_core's for every method.

- ``tokenizer_config.json``: ``"auto_map"`` names the class ``BpeCoreTokenizer`` of the module
  file beside it, so ``transformers`` finds it in the folder (no ``model_file`` entry: a path
  stored there is read relative to the working folder, and ``transformers`` 4.x then fails
  anywhere else; without it, ``transformers`` passes ``__init__`` the folder's ``model.json``);
- ``tokenization_bpe_core.py``: a copy of ``bpe_core/transformers_tokenizer.py``, which
  ``transformers`` copies into its module cache and imports; it imports ``bpe_core``, so bpe_core
  must be installed where the folder is loaded (it says so in one line when it is not);
- ``model.json``: the model (written by the caller: ``formats.model.dump_folder`` in a training
  folder, :func:`dump_remote` for ``tools/export_tokenizer.py --format transformers``).

A training folder (``formats.folder.save_folder``) carries the first two when it has no HF
``tokenizer.json`` (a stage-aware method); a plain BPE folder loads through ``tokenizer.json``,
with or without remote code.
"""
from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any, Callable

from ..runtime.atomic import publish_folder
from .model import MODEL_FILE, Model, dump_model

__all__ = ["CLASS_NAME", "CODE_FILE", "CONFIG_FILE", "dump_remote", "remote_code", "remote_file_makers",
           "remote_tokenizer_config"]

CODE_FILE = "tokenization_bpe_core.py"
CONFIG_FILE = "tokenizer_config.json"
CLASS_NAME = "BpeCoreTokenizer"
#: The module whose text is ``CODE_FILE`` (read as a file: importing it needs ``transformers``).
SOURCE_MODULE = "transformers_tokenizer.py"


def remote_code() -> str:
    """The text of ``tokenization_bpe_core.py`` (``bpe_core/transformers_tokenizer.py``).

    >>> "class BpeCoreTokenizer(" in remote_code()
    True
    """
    return resources.files("bpe_core").joinpath(SOURCE_MODULE).read_text(encoding="utf-8")


def remote_tokenizer_config(model: Model) -> dict[str, Any]:
    """``tokenizer_config.json`` for the remote-code class: ``auto_map`` to it, the first special
    token as end-of-text and padding token, no cleanup of spaces, no length limit.

    >>> from bpe_core.formats.model import Model
    >>> m = Model(vocab={i: bytes([i]) for i in range(256)}, merges=[])
    >>> remote_tokenizer_config(m)["auto_map"]
    {'AutoTokenizer': ['tokenization_bpe_core.BpeCoreTokenizer', None]}
    >>> "model_file" in remote_tokenizer_config(m)     # resolved by transformers in the folder
    False
    """
    config: dict[str, Any] = {
        "tokenizer_class": CLASS_NAME,
        "auto_map": {"AutoTokenizer": [f"{CODE_FILE[:-3]}.{CLASS_NAME}", None]},
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 60,
    }
    if model.special_tokens:
        config["eos_token"] = config["pad_token"] = model.special_tokens[0]
    return config


def remote_file_makers(model: Model) -> dict[str, Callable[[], str]]:
    """``tokenizer_config.json`` and ``tokenization_bpe_core.py`` as functions that make their text
    (the ``extra`` files of ``formats.model.dump_folder``)."""
    return {CONFIG_FILE: lambda: json.dumps(remote_tokenizer_config(model), indent=1) + "\n",
            CODE_FILE: remote_code}


def dump_remote(model: Model, folder: str | os.PathLike) -> list[str]:
    """Publish ``model.json``, ``tokenizer_config.json`` and ``tokenization_bpe_core.py`` into
    ``folder`` as one unit (``runtime.atomic.publish_folder``: other files there are kept); returns
    their paths."""
    folder = os.fspath(folder)
    makers = remote_file_makers(model)
    names = [MODEL_FILE, *makers]
    with publish_folder(folder, owned=names, last=MODEL_FILE) as tmp:
        dump_model(model, os.path.join(tmp, MODEL_FILE), durable=False)
        for name, make in makers.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(make())
    return [os.path.join(folder, name) for name in names]
