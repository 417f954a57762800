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
from .model import REPORT_FILE, Model, dump_folder, write_pieces
from .remote import remote_file_makers
from .texts import FolderTexts

__all__ = ["save_folder"]


def save_folder(model: Model, folder: str | os.PathLike,
                report: Optional[dict[str, Any] | Callable[[], dict[str, Any]]] = None,
                hf_check: Optional[Callable[[Model, str], tuple[bool, dict]]] = None) -> list[bytes]:
    """Publish ``model``'s folder (see the module docstring); parent folders are made. Returns the
    token bytes ``vocab.json`` left out (``formats.model.dump_gpt2``). ``report``: a dict, or a
    function that returns it, called when ``train_report.json`` is written (after the model files:
    ``TrainResult.publish`` puts the writing's memory peak in it).

    ``hf_check(model, path) -> (write, facts)`` decides on HF's files from ``tokenizer.json`` as
    written (``path``, in the private folder: ``formats.exactness.hf_folder_check`` loads it with HF
    ``tokenizers`` and compares its ids with bpe_core's on the user's text; every caller in the
    package passes one); when ``write`` is false the folder is published without them. A check
    with a ``start(model, path)`` (``formats.exactness.FolderCheck``) runs while the model files are
    written. ``report["hf_files"]`` (when a report is given) says which were written, with the
    check's ``facts`` (its result and cost, why not).

    >>> import os, tempfile
    >>> m = Model(vocab={**{i: bytes([i]) for i in range(256)}, 256: b"<|endoftext|>", 257: b"ab"},
    ...           merges=[(b"a", b"b")], special_tokens=["<|endoftext|>"])
    >>> d = os.path.join(tempfile.mkdtemp(), "a", "tok")
    >>> save_folder(m, d, {"merges": 1}, hf_check=lambda model, path: (False, {"why": "a test"}))
    []
    >>> sorted(os.listdir(d))         # (the remote-code files instead: formats.remote)
    ['merges.txt', 'model.json', 'tokenization_bpe_core.py', 'tokenizer_config.json', 'train_report.json', 'vocab.json']
    """
    texts = FolderTexts(model.vocab, model.merges)   # each token's GPT-2 string, made once for all files
    hf: dict[str, Any] = {}                          # the facts of HF's files, once decided
    extra: dict[str, Any] = {}

    def with_facts(doc: dict[str, Any]) -> str:
        if hf.get("facts") is not None:
            doc["hf_files"] = hf["facts"]
        return json.dumps(doc, indent=2) + "\n"

    if callable(report):
        extra[REPORT_FILE] = lambda: with_facts(report())      # made when written (last)
    elif report is not None:
        extra[REPORT_FILE] = lambda: with_facts(report)
    parent = os.path.dirname(os.path.abspath(os.fspath(folder)))
    os.makedirs(parent, exist_ok=True)
    try:
        return dump_folder(model, folder, extra=extra, texts=texts,
                           early=lambda tmp: _hf_files(model, texts, hf_check, tmp, hf))
    finally:
        hf.get("cancel", lambda: None)()      # (a failure before the check was waited for)


def _hf_files(model: Model, texts: FolderTexts, hf_check, tmp: str, hf: dict[str, Any]
              ) -> Callable[[], dict[str, Any]]:
    """Write HF's ``tokenizer.json`` into the private folder ``tmp`` and start ``hf_check`` on it;
    returns the function that waits for the check and gives the folder's other HF files (HF's
    ``tokenizer_config.json``, or, when the check failed (``tokenizer.json`` then removed) or for a
    method that has no HF files (a stage-aware one), the remote-code files: ``formats.remote``).
    ``hf["facts"]``: what the report says of them (none for a stage-aware method)."""
    makers = hf_file_makers(model, texts=texts)
    if not makers:
        return lambda: remote_file_makers(model)
    from .patterns_compat import PatternNotPortable

    names = ", ".join(makers)
    path = os.path.join(tmp, HF_TOKENIZER_FILE)
    try:
        write_pieces(path, makers[HF_TOKENIZER_FILE](), durable=False)
    except PatternNotPortable as exc:
        if os.path.exists(path):
            os.remove(path)
        hf["facts"] = {"written": False, "files": [], "why": f"{names} left out: {exc}"}
        return lambda: remote_file_makers(model)
    others = {n: m for n, m in makers.items() if n != HF_TOKENIZER_FILE}
    if hf_check is None:                         # (a caller that checked them itself)
        hf["facts"] = {"written": True, "files": list(makers)}
        return lambda: others
    start = getattr(hf_check, "start", None)
    if start is not None:
        wait = start(model, path)
        hf["cancel"] = getattr(wait, "cancel", lambda: None)
    else:
        done = hf_check(model, path)
        wait = lambda: done                      # noqa: E731

    def later() -> dict[str, Any]:
        write, facts = wait()
        hf.pop("cancel", None)
        if "why" in facts:
            facts["why"] = f"{names} {'written with allow_inexact' if write else 'left out'}: {facts['why']}"
        if not write:
            os.remove(path)
            hf["facts"] = {"written": False, "files": [], **facts}
            return remote_file_makers(model)
        hf["facts"] = {"written": True, "files": list(makers), **facts}
        return others

    return later
