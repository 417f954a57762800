"""Tokenizer evaluation: compression, round trip, cross-word tokens, longest tokens.

Used by ``tools/evaluate.py`` for every method (BPE, SuperBPE): each model is encoded with the encoder
that reproduces its training (stage-aware for SuperBPE).
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np

from .model_io import Model, load_model

_CROSS = re.compile(rb"[^\s][\s]")


def load_encoder(path: str | os.PathLike) -> tuple[Model, Callable[[bytes], list[int]]]:
    """The model in ``path`` and the encode function that reproduces its training
    (``Tokenizer.load``: stage-aware for SuperBPE and SupraTok)."""
    from .tokenizer import Tokenizer

    return load_model(path), Tokenizer.load(path).encode


def crosses_word_boundary(token: bytes) -> bool:
    """A token crosses a word boundary when whitespace follows a non-whitespace byte in it.

    >>> crosses_word_boundary(b" the"), crosses_word_boundary(b" of the"), crosses_word_boundary(b"the ")
    (False, True, True)
    """
    return _CROSS.search(token) is not None


@dataclass
class FileScore:
    tokenizer: str
    file: str
    n_bytes: int
    n_chars: int
    n_tokens: int
    bytes_per_token: float
    chars_per_token: float
    round_trip: bool
    cross_word_share: float
    seconds: float


def score(name: str, model: Model, encode: Callable[[bytes], list[int]], path: str,
          max_bytes: Optional[int] = None) -> FileScore:
    """Encode one file (or its first ``max_bytes``) and measure it."""
    with open(path, "rb") as f:
        data = f.read(max_bytes) if max_bytes else f.read()
    t0 = time.perf_counter()
    ids = encode(data)
    seconds = time.perf_counter() - t0
    vocab = model.vocab
    round_trip = b"".join(vocab[i] for i in ids) == data
    crossing = np.array([crosses_word_boundary(vocab[i]) for i in range(len(vocab))], dtype=bool)
    n_cross = int(crossing[np.asarray(ids, dtype=np.int64)].sum()) if ids else 0
    n_chars = len(data.decode("utf-8", "surrogateescape"))
    n = max(len(ids), 1)
    return FileScore(name, os.path.basename(path), len(data), n_chars, len(ids), len(data) / n, n_chars / n,
                     round_trip, n_cross / n, round(seconds, 3))


def longest_tokens(model: Model, k: int = 10) -> list[bytes]:
    """The ``k`` longest tokens of the vocabulary (special tokens left out)."""
    specials = {s.encode("utf-8") for s in model.special_tokens}
    toks = sorted({t for t in model.vocab.values() if t not in specials}, key=lambda t: (-len(t), t))
    return toks[:k]


def as_dict(s: FileScore) -> dict:
    return asdict(s)
