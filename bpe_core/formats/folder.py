"""The model folder a training run publishes: what ``tools/train_bpe.py --out``,
``TrainResult.save`` and ``Tokenizer.save`` write, as one unit (``formats.model.dump_folder``).

- ``vocab.json`` + ``merges.txt`` (GPT-2's layout) and ``model.json`` (the native model, with
  their sha256);
- ``tokenizer.json`` + ``tokenizer_config.json`` (HF's layout, ``formats.hf``) when HF encodes
  the model exactly (plain BPE), checked on the user's text first (``formats.exactness``): else the
  folder is written without them and the report says why;
  ``transformers.AutoTokenizer.from_pretrained(folder)`` then loads it;
- ``train_report.json`` when a report is given.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

from .hf import HF_TOKENIZER_FILE, hf_file_makers
from .model import REPORT_FILE, Model, dump_folder
from .texts import FolderTexts

__all__ = ["save_folder"]


def save_folder(model: Model, folder: str | os.PathLike, report: Optional[dict[str, Any]] = None,
                docs: Optional[Sequence[bytes]] = None, on: str = "", allow_inexact: bool = False) -> list[bytes]:
    """Publish ``model``'s folder (see the module docstring); parent folders are made. Returns the
    token bytes ``vocab.json`` left out (``formats.model.dump_gpt2``).

    HF's files are written only when HF ``tokenizers`` loads ``tokenizer.json`` and gives bpe_core's
    ids on every document of ``docs`` (``on``: what they are; default: the built-in check text,
    ``formats.exactness.builtin_documents``), or with ``allow_inexact`` (the rate then goes into the
    report); else the folder is written without them. ``report["hf_files"]`` (when a report is
    given) says which and why, with the check's result and cost.

    >>> import os, tempfile
    >>> m = Model(vocab={**{i: bytes([i]) for i in range(256)}, 256: b"<|endoftext|>", 257: b"ab"},
    ...           merges=[(b"a", b"b")], special_tokens=["<|endoftext|>"])
    >>> d = os.path.join(tempfile.mkdtemp(), "a", "tok")
    >>> save_folder(m, d, {"merges": 1}); sorted(os.listdir(d))
    []
    ['merges.txt', 'model.json', 'tokenizer.json', 'tokenizer_config.json', 'train_report.json', 'vocab.json']
    """
    texts = FolderTexts(model.vocab, model.merges)   # each token's GPT-2 string, made once for all files
    extra: dict[str, Any] = {}
    hf = checked_hf_files(model, texts, docs, on, allow_inexact)
    if hf is not None:
        extra.update(hf[0])
        if report is not None:
            report["hf_files"] = hf[1]
    if report is not None:
        extra[REPORT_FILE] = json.dumps(report, indent=2) + "\n"
    parent = os.path.dirname(os.path.abspath(os.fspath(folder)))
    os.makedirs(parent, exist_ok=True)
    return dump_folder(model, folder, extra=extra, texts=texts)


def checked_hf_files(model: Model, texts: FolderTexts, docs: Optional[Sequence[bytes]] = None, on: str = "",
                     allow_inexact: bool = False) -> "tuple[dict[str, Any], dict[str, Any]] | None":
    """HF's files of a model folder after the check (:func:`save_folder`): ``(files, facts)``, the
    files to write (none when the check fails) and what the report says of them; None for a method
    that has no HF files (a stage-aware one)."""
    makers = hf_file_makers(model, texts=texts)
    if not makers:
        return None
    from .exactness import builtin_documents, check_tokenizer_json
    from .patterns_compat import PatternNotPortable

    if docs is None:
        docs, on = builtin_documents(), "bpe_core's built-in check text"
    names = ", ".join(makers)
    try:
        text = "".join(makers[HF_TOKENIZER_FILE]())
    except PatternNotPortable as exc:
        return {}, {"written": False, "files": [], "why": f"{names} left out: {exc}"}
    try:
        result = check_tokenizer_json(model, text, docs, on)
    except ImportError:
        return {}, {"written": False, "files": [],
                    "why": f"{names} left out: HF tokenizers is not installed, so they could not be checked"}
    except Exception as exc:  # noqa: BLE001  (any failure of the library means: not loadable)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return {}, {"written": False, "files": [],
                    "why": f"{names} left out: HF tokenizers cannot load this tokenizer.json ({first})"}
    facts: dict[str, Any] = {"check": result.as_dict()}
    if not result.exact and not allow_inexact:
        facts.update(written=False, files=[], why=f"{names} left out: {result.line()}")
        return {}, facts
    files = {HF_TOKENIZER_FILE: text, **{n: m for n, m in makers.items() if n != HF_TOKENIZER_FILE}}
    facts.update(written=True, files=list(files))
    if not result.exact:
        facts["why"] = f"{names} written with allow_inexact: {result.line()}"
    return files, facts
