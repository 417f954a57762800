"""Starting from an existing tokenizer (``TrainConfig.init_from``, ``--init-from DIR``).

The init model is a plain BPE model: a bpe_core folder (``model.json``), a ``model.json`` file, or a
folder with GPT-2 ``vocab.json`` + ``merges.txt`` (``formats.model.load_any`` reads and checks all
three). Its merges are applied to the counted words of this run's corpus and become the first merges
of the result; then ``bpe`` continues the merge loop up to ``vocab_size`` and ``superbpe`` runs its
stage 2 (the transition is the init model's size).

Exactness: BPE's merges are greedy, so the first ``n`` merges of a run are the whole of a run to the
smaller size. When the init model was trained on the same corpus with the same options, continuing
it gives exactly the merges of a run to the larger size from scratch (tested). On another corpus it
is a continuation: the init merges are kept as they are (also those that never occur here), and the
new merges are what this corpus's counts pick after them.

Ids: the result is in bpe_core's layout, the 256 bytes (id = byte), the special tokens, then one id
per merge in merge order. The init model's merges keep their ranks, so a bpe_core init model keeps
every id; GPT-2 files, whose ``vocab.json`` numbers the bytes in its own order and puts the special
token after the merges, are renumbered (the report says ``"ids": "renumbered"``; a token's bytes map
it between the two).

>>> check_init_size(300, 300, "tok/")
Traceback (most recent call last):
...
bpe_core.errors.IncompatibleInit: tok/: the init model has 300 tokens; --vocab-size must be larger (got 300)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from ..corpus.specials import encode_specials
from ..errors import IncompatibleInit
from ..formats.model import MERGES_FILE, MODEL_FILE, VOCAB_FILE, Model, file_sha256, load_any
from ..pretok.patterns import pattern_name, resolve_pattern
from .superbpe import resolve_transition

__all__ = ["InitModel", "check_init_size", "load_init"]


@dataclass
class InitModel:
    """An init model that passed the checks, and what the report records about it (``info``)."""

    model: Model
    info: dict[str, Any]

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        return self.model.merges

    @property
    def size(self) -> int:
        """Its vocabulary size in bpe_core's layout: 256 + special tokens + merges."""
        return 256 + len(self.model.special_tokens) + len(self.model.merges)


def check_init_size(init_size: int, vocab_size: int, path: str) -> None:
    """The init model must be smaller than the vocabulary asked for."""
    if init_size >= vocab_size:
        raise IncompatibleInit(path, f"the init model has {init_size} tokens; --vocab-size must be larger "
                                     f"(got {vocab_size})")


def _native_layout(model: Model) -> bool:
    """Whether the model's ids are bpe_core's layout (bytes, specials, one id per merge)."""
    base = 256 + len(model.special_tokens)
    if len(model.vocab) != base + len(model.merges):
        return False
    if any(model.vocab.get(i) != bytes([i]) for i in range(256)):
        return False
    if any(model.vocab.get(256 + k) != s.encode("utf-8") for k, s in enumerate(model.special_tokens)):
        return False
    return all(model.vocab.get(base + r) == a + b for r, (a, b) in enumerate(model.merges))


def load_init(config) -> Optional[InitModel]:
    """Load and check ``config.init_from`` (None when it is not set).

    Raises:
        errors.ModelFormatError: the model files cannot be read.
        errors.IncompatibleInit: its method is not ``bpe``, its special tokens or pattern differ from
            the config's, or its vocabulary is not smaller than ``config.vocab_size``.
    """
    if config.init_from is None:
        return None
    path = os.fspath(config.init_from)
    if not os.path.exists(path):
        raise IncompatibleInit(path, "no such file or folder (--init-from)")
    model = load_any(path)
    if model.method != "bpe":
        raise IncompatibleInit(path, f"is a {model.method} model; --init-from needs a plain BPE model "
                                     f"(method bpe)")
    theirs = encode_specials(model.special_tokens)
    ours = encode_specials(config.special_tokens)
    if theirs != ours:
        show = [s.decode("utf-8", "replace") for s in theirs]
        raise IncompatibleInit(path, f"its special tokens {show} differ from this run's "
                                     f"{[s.decode('utf-8', 'replace') for s in ours]} (give the same ones, "
                                     f"in the same order)")
    if resolve_pattern(model.pattern) != resolve_pattern(config.pattern):
        mine = pattern_name(config.pattern) or "a custom regex"
        raise IncompatibleInit(path, f"its pattern ({model.pattern_name or 'a custom regex'}) is not this run's "
                                     f"({mine})")
    init = InitModel(model, {})
    check_init_size(init.size, config.vocab_size, path)
    if config.method == "superbpe" and config.transition is not None:
        t = resolve_transition(config.transition, config.vocab_size, len(ours))
        if t != init.size:
            raise IncompatibleInit(path, f"with --init-from, stage 2 starts at the init model's size "
                                         f"({init.size}); --transition asks for {t} (leave it out)")
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, MODEL_FILE)):
        files = {name: file_sha256(os.path.join(path, name)) for name in (VOCAB_FILE, MERGES_FILE)}
        fmt = "gpt2"
    else:
        model_file = os.path.join(path, MODEL_FILE) if os.path.isdir(path) else path
        files = {os.path.basename(model_file): file_sha256(model_file)}
        fmt = "bpe_core"
    init.info = {
        "path": os.path.abspath(path),
        "format": fmt,
        "sha256": files,
        "vocab_size": init.size,
        "merges": len(model.merges),
        "ids": "kept" if _native_layout(model) else "renumbered",
    }
    return init
