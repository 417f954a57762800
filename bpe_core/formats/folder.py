"""The model folder a training run publishes: what ``tools/train_bpe.py --out``,
``TrainResult.save`` and ``Tokenizer.save`` write, as one unit (``formats.model.dump_folder``).

- ``vocab.json`` + ``merges.txt`` (GPT-2's layout) and ``model.json`` (the native model, with
  their sha256);
- ``tokenizer.json`` + ``tokenizer_config.json`` (HF's layout, ``formats.hf``) when HF encodes
  the model exactly (plain BPE): ``transformers.AutoTokenizer.from_pretrained(folder)`` then loads it;
  otherwise (a stage-aware method) ``tokenizer_config.json`` + ``tokenization_bpe_core.py``
  (``formats.remote``): ``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)`` loads a
  tokenizer that runs bpe_core's own encoder, with bpe_core's ids;
- ``train_report.json`` when a report is given.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional

from .hf import HF_TOKENIZER_FILE, hf_file_makers
from .model import REPORT_FILE, Model, dump_folder
from .remote import remote_file_makers
from .texts import FolderTexts

__all__ = ["save_folder"]


def save_folder(model: Model, folder: str | os.PathLike,
                report: Optional[dict[str, Any] | Callable[[], dict[str, Any]]] = None) -> list[bytes]:
    """Publish ``model``'s folder (see the module docstring); parent folders are made. Returns the
    token bytes ``vocab.json`` left out (``formats.model.dump_gpt2``). ``report``: a dict, or a
    function that returns it, called when ``train_report.json`` is written (after the model files:
    ``TrainResult.publish`` puts the writing's memory peak in it).

    >>> import os, tempfile
    >>> m = Model(vocab={**{i: bytes([i]) for i in range(256)}, 256: b"<|endoftext|>", 257: b"ab"},
    ...           merges=[(b"a", b"b")], special_tokens=["<|endoftext|>"])
    >>> d = os.path.join(tempfile.mkdtemp(), "a", "tok")
    >>> save_folder(m, d, {"merges": 1}); sorted(os.listdir(d))
    []
    ['merges.txt', 'model.json', 'tokenizer.json', 'tokenizer_config.json', 'train_report.json', 'vocab.json']
    """
    texts = FolderTexts(model.vocab, model.merges)   # each token's GPT-2 string, made once for all files
    extra: dict[str, Any] = dict(hf_file_makers(model, texts=texts))     # made as they are written
    if HF_TOKENIZER_FILE not in extra:          # no exact tokenizer.json: transformers runs bpe_core
        extra.update(remote_file_makers(model))
    if callable(report):
        extra[REPORT_FILE] = lambda: json.dumps(report(), indent=2) + "\n"      # made when written (last)
    elif report is not None:
        extra[REPORT_FILE] = json.dumps(report, indent=2) + "\n"
    parent = os.path.dirname(os.path.abspath(os.fspath(folder)))
    os.makedirs(parent, exist_ok=True)
    return dump_folder(model, folder, extra=extra, texts=texts)
