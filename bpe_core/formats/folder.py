"""The model folder a training run publishes: what ``tools/train_bpe.py --out``,
``TrainResult.save`` and ``Tokenizer.save`` write, as one unit (``formats.model.dump_folder``).

- ``vocab.json`` + ``merges.txt`` (GPT-2's layout) and ``model.json`` (the native model, with
  their sha256);
- ``tokenizer.json`` + ``tokenizer_config.json`` (HF's layout, ``formats.hf``) when HF encodes
  the model exactly (plain BPE), checked on the user's text first (``formats.exactness``):
  ``transformers.AutoTokenizer.from_pretrained(folder)`` then loads it;
  otherwise (a stage-aware method, or a ``tokenizer.json`` that failed its check: the report says
  why) ``tokenizer_config.json`` + ``tokenization_bpe_core.py`` (``formats.remote``):
  ``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)`` loads a tokenizer that runs
  bpe_core's own encoder, with bpe_core's ids;
- ``train_report.json`` when a report is given.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional

from .hf import HF_TOKENIZER_FILE, hf_file_makers
from .model import REPORT_FILE, Model, dump_folder
from .remote import remote_file_makers
from .texts import FolderTexts, join_pieces

__all__ = ["save_folder"]


def save_folder(model: Model, folder: str | os.PathLike,
                report: Optional[dict[str, Any] | Callable[[], dict[str, Any]]] = None,
                hf_check: Optional[Callable[[Model, str], tuple[bool, dict]]] = None) -> list[bytes]:
    """Publish ``model``'s folder (see the module docstring); parent folders are made. Returns the
    token bytes ``vocab.json`` left out (``formats.model.dump_gpt2``). ``report``: a dict, or a
    function that returns it, called when ``train_report.json`` is written (after the model files:
    ``TrainResult.publish`` puts the writing's memory peak in it).

    ``hf_check(model, text) -> (write, facts)`` decides on HF's files from the text of
    ``tokenizer.json`` (``formats.exactness.hf_folder_check``: loaded with HF ``tokenizers`` and
    compared with bpe_core's ids on the user's text; every caller in the package passes one): when
    ``write`` is false the folder is written without them. ``report["hf_files"]`` (when a report is
    given) says which were written, with the check's ``facts`` (its result and cost, why not).

    >>> import os, tempfile
    >>> m = Model(vocab={**{i: bytes([i]) for i in range(256)}, 256: b"<|endoftext|>", 257: b"ab"},
    ...           merges=[(b"a", b"b")], special_tokens=["<|endoftext|>"])
    >>> d = os.path.join(tempfile.mkdtemp(), "a", "tok")
    >>> save_folder(m, d, {"merges": 1}, hf_check=lambda model, text: (False, {"why": "a test"}))
    []
    >>> sorted(os.listdir(d))         # (the remote-code files instead: formats.remote)
    ['merges.txt', 'model.json', 'tokenization_bpe_core.py', 'tokenizer_config.json', 'train_report.json', 'vocab.json']
    """
    texts = FolderTexts(model.vocab, model.merges)   # each token's GPT-2 string, made once for all files
    extra: dict[str, Any] = {}
    hf = _hf_files(model, texts, hf_check)
    facts = None
    if hf is not None:
        extra.update(hf[0])
        facts = hf[1]
    if HF_TOKENIZER_FILE not in extra:          # no exact tokenizer.json: transformers runs bpe_core
        extra.update(remote_file_makers(model))

    def with_facts(doc: dict[str, Any]) -> str:
        if facts is not None:
            doc["hf_files"] = facts
        return json.dumps(doc, indent=2) + "\n"

    if callable(report):
        extra[REPORT_FILE] = lambda: with_facts(report())      # made when written (last)
    elif report is not None:
        extra[REPORT_FILE] = with_facts(report)
    parent = os.path.dirname(os.path.abspath(os.fspath(folder)))
    os.makedirs(parent, exist_ok=True)
    return dump_folder(model, folder, extra=extra, texts=texts)


def _hf_files(model: Model, texts: FolderTexts, hf_check) -> "tuple[dict[str, Any], dict[str, Any]] | None":
    """HF's files of a model folder after ``hf_check``: ``(files, facts)``; None for a method that has
    no HF files (a stage-aware one)."""
    makers = hf_file_makers(model, texts=texts)
    if not makers:
        return None
    if hf_check is None:                         # (a caller that checked them itself)
        return dict(makers), {"written": True, "files": list(makers)}
    from .patterns_compat import PatternNotPortable

    names = ", ".join(makers)
    try:
        text = join_pieces(makers[HF_TOKENIZER_FILE]())
    except PatternNotPortable as exc:
        return {}, {"written": False, "files": [], "why": f"{names} left out: {exc}"}
    write, facts = hf_check(model, text)
    if "why" in facts:
        facts["why"] = f"{names} {'written with allow_inexact' if write else 'left out'}: {facts['why']}"
    if not write:
        return {}, {"written": False, "files": [], **facts}
    files = {HF_TOKENIZER_FILE: text, **{n: m for n, m in makers.items() if n != HF_TOKENIZER_FILE}}
    return files, {"written": True, "files": list(files), **facts}
