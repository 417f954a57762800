"""Reading and writing tokenizer models.

Two formats are written by ``tools/train_bpe.py``:

- the **native model file** ``model.json``: a versioned JSON document holding the pattern, the special
  tokens, every vocabulary entry and every merge as exact bytes (hex), so it round-trips any byte
  sequence, including invalid UTF-8, plus the method and its stage marks;
- GPT-2 ``vocab.json`` + ``merges.txt`` in the byte-to-unicode convention that HF ``tokenizers``,
  ``transformers`` and tiktoken's ``data_gym_to_mergeable_bpe_ranks`` load.

See ``docs/formats.md`` for the field-by-field description.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ._atomic import atomic_write
from .patterns import pattern_name, resolve_pattern

MODEL_FILE = "model.json"
VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
FORMAT_NAME = "bpe_core.model"
FORMAT_VERSION = 1


class ModelFormatError(ValueError):
    """A model file that cannot be read; the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


@dataclass
class Model:
    """A trained tokenizer: everything the encoder needs to reproduce training.

    Attributes:
        vocab: id -> token bytes. Ids 0-255 are the single bytes, then the special tokens in
            order, then one id per merge in merge order.
        merges: ordered ``(left_bytes, right_bytes)`` pairs; rank = position.
        special_tokens: the special tokens as strings, in id order.
        pattern: the pre-tokenization regex (the string, never just a name).
        method: ``"bpe"``, ``"superbpe"`` or ``"supratok"``.
        stages: curriculum marks, e.g. ``[{"name": "bpe", "merges": 3000}, ...]``; a stage-aware
            encoder applies each stage's merges with that stage's boundary rules.
        metadata: free-form facts about the run (input, options), stored but not interpreted.
    """

    vocab: dict[int, bytes]
    merges: list[tuple[bytes, bytes]]
    special_tokens: list[str] = field(default_factory=list)
    pattern: str = ""
    method: str = "bpe"
    stages: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def pattern_name(self) -> str | None:
        return pattern_name(self.pattern)


# ==== GPT-2 byte <-> unicode ===============================================================


@lru_cache(maxsize=None)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters.

    >>> bytes_to_unicode()[ord(" ")], bytes_to_unicode()[ord("\\n")], bytes_to_unicode()[ord("a")]
    ('Ġ', 'Ċ', 'a')
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@lru_cache(maxsize=None)
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def token_to_gpt2(token: bytes) -> str:
    """``b" the" -> "Ġthe"``."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def gpt2_to_token(text: str) -> bytes:
    """``"Ġthe" -> b" the"``; raises KeyError for a character outside the 256-symbol alphabet."""
    table = unicode_to_bytes()
    return bytes(table[c] for c in text)


# ==== Native model file ======================================================================


def dump_model(model: Model, path: str | os.PathLike) -> None:
    """Write the native model file atomically (temp file + rename)."""
    n = len(model.vocab)
    if sorted(model.vocab) != list(range(n)):
        raise ValueError("vocab ids must be 0..n-1")
    doc = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "method": model.method,
        "pattern": model.pattern,
        "pattern_name": model.pattern_name,
        "special_tokens": list(model.special_tokens),
        "vocab": [model.vocab[i].hex() for i in range(n)],
        "merges": [[a.hex(), b.hex()] for a, b in model.merges],
        "stages": model.stages,
        "metadata": model.metadata,
    }
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")


def load_model(path: str | os.PathLike) -> Model:
    """Read a native model file (or a folder holding ``model.json``); errors name the file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, MODEL_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ModelFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(path, f"not a bpe_core model file (invalid JSON: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise ModelFormatError(path, f"not a bpe_core model file (no \"format\": \"{FORMAT_NAME}\")")
    if doc.get("version") != FORMAT_VERSION:
        raise ModelFormatError(path, f"unsupported format version {doc.get('version')!r} (this bpe_core reads {FORMAT_VERSION})")
    try:
        vocab = {i: bytes.fromhex(h) for i, h in enumerate(doc["vocab"])}
        merges = [(bytes.fromhex(a), bytes.fromhex(b)) for a, b in doc["merges"]]
        specials = [str(s) for s in doc.get("special_tokens", [])]
        pattern = resolve_pattern(doc["pattern"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(path, f"malformed model file: {exc!r}") from None
    _check_consistent(path, vocab, merges, specials)
    return Model(
        vocab=vocab,
        merges=merges,
        special_tokens=specials,
        pattern=pattern,
        method=doc.get("method", "bpe"),
        stages=list(doc.get("stages") or []),
        metadata=dict(doc.get("metadata") or {}),
    )


def _check_consistent(path, vocab, merges, specials) -> None:
    for i in range(256):
        if vocab.get(i) != bytes([i]):
            raise ModelFormatError(path, f"vocab id {i} must be the single byte {i}")
    for k, s in enumerate(specials):
        if vocab.get(256 + k) != s.encode("utf-8"):
            raise ModelFormatError(path, f"special token {s!r} must have id {256 + k}")
    base = 256 + len(specials)
    if len(vocab) != base + len(merges):
        raise ModelFormatError(path, f"vocab has {len(vocab)} entries, expected {base} + {len(merges)} merges")
    for r, (a, b) in enumerate(merges):
        if vocab[base + r] != a + b:
            raise ModelFormatError(path, f"merge {r} ({a!r}, {b!r}) does not produce vocab id {base + r}")


# ==== GPT-2 vocab.json + merges.txt ==========================================================


def dump_gpt2(vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]], folder: str | os.PathLike,
              vocab_name: str = VOCAB_FILE, merges_name: str = MERGES_FILE) -> list[bytes]:
    """Write ``vocab.json`` and ``merges.txt`` (GPT-2 byte-to-unicode form) atomically.

    JSON keys must be unique: when two ids hold the same bytes (two merges can build the same
    string, e.g. ``(a, bc)`` and ``(ab, c)``), the smaller id keeps the entry. The encoders of
    bpe_core, HF and tiktoken all emit the smaller id for such bytes, so ids do not change.
    Returns the token bytes that were left out that way.
    """
    folder = os.fspath(folder)
    entries: dict[str, int] = {}
    dropped: list[bytes] = []
    for i in sorted(vocab):
        key = token_to_gpt2(vocab[i])
        if key in entries:
            dropped.append(vocab[i])
            continue
        entries[key] = i
    with atomic_write(os.path.join(folder, vocab_name), "w", encoding="utf-8") as f:
        json.dump(entries, f, ensure_ascii=False, indent=0)
        f.write("\n")
    with atomic_write(os.path.join(folder, merges_name), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{token_to_gpt2(a)} {token_to_gpt2(b)}\n")
    return dropped


def load_gpt2(vocab_path: str | os.PathLike, merges_path: str | os.PathLike
              ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Read GPT-2 ``vocab.json`` + ``merges.txt``; errors name the file and line."""
    vocab_path, merges_path = os.fspath(vocab_path), os.fspath(merges_path)
    try:
        with open(vocab_path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as exc:
        raise ModelFormatError(vocab_path, f"cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(vocab_path, f"invalid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelFormatError(vocab_path, "expected a JSON object of token -> id")
    vocab: dict[int, bytes] = {}
    for tok, i in raw.items():
        try:
            vocab[int(i)] = gpt2_to_token(tok)
        except KeyError:
            # Not in the byte alphabet: an added/special token stored verbatim (e.g. <|endoftext|>).
            vocab[int(i)] = tok.encode("utf-8")
        except (TypeError, ValueError):
            raise ModelFormatError(vocab_path, f"id of {tok!r} is not an integer") from None
    merges: list[tuple[bytes, bytes]] = []
    try:
        with open(merges_path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if not line or (lineno == 1 and line.startswith("#version")):
                    continue
                parts = line.split(" ")
                if len(parts) != 2:
                    raise ModelFormatError(merges_path, f"line {lineno}: expected two tokens separated by one space")
                try:
                    merges.append((gpt2_to_token(parts[0]), gpt2_to_token(parts[1])))
                except KeyError:
                    raise ModelFormatError(merges_path, f"line {lineno}: character outside the GPT-2 byte alphabet") from None
    except OSError as exc:
        raise ModelFormatError(merges_path, f"cannot read: {exc.strerror or exc}") from None
    return vocab, merges
