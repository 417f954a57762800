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

from . import methods  # noqa: F401  (registers the methods)
from .corpus.specials import encode_specials, split_on_specials
from .encode.tokenizer import StageAwareTokenizer, Tokenizer
from .export import hf_tokenizer_json
from .formats import registry
from .formats.model import Model, load_any

_CROSS = re.compile(rb"[^\s][\s]")


def load_encoder(path: str | os.PathLike) -> tuple[Model, Callable[[bytes], list[int]]]:
    """The model in ``path`` (``model.json``, or a folder of GPT-2 ``vocab.json`` + ``merges.txt``)
    and the encode function that reproduces its training (stage-aware for SuperBPE and SupraTok)."""
    return load_model_encoder(load_any(path))


def show_token(token: bytes, width: int = 40) -> str:
    """A token for display: its text (U+FFFD for bytes that are not UTF-8), cut to ``width``
    characters with the full length in bytes after a long one.

    >>> show_token(b" the"), show_token(b"ab" * 500, width=6)
    ("' the'", "'ababab'... (1000 bytes)")
    """
    text = token.decode("utf-8", "replace")
    if len(text) <= width:
        return repr(text)
    return f"{text[:width]!r}... ({len(token)} bytes)"


def token_change(n_tokens: int, base_tokens: int) -> str:
    """How many fewer (or more) tokens than the base, in words.

    >>> token_change(90, 100), token_change(110, 100), token_change(100, 100)
    ('10.0% fewer tokens', '10.0% more tokens', 'as many tokens')
    """
    if n_tokens == base_tokens:
        return "as many tokens"
    if base_tokens == 0:
        return f"{n_tokens:,} tokens (the base has none)"
    change = 100 * (1 - n_tokens / base_tokens)
    return f"{abs(change):.1f}% {'fewer' if change > 0 else 'more'} tokens"


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


#: A full uuencode line: ``M`` (45 bytes) and 60 characters of the uuencode alphabet (0x21-0x60,
#: the space written as a backquote), with its newline
UUENCODE_LINE = re.compile(rb"^M[\x21-\x60]{60}(?:\r?\n|\Z)", re.MULTILINE)


def without_uuencode(data: bytes) -> tuple[bytes, int, int]:
    """``data`` without its full uuencode lines (:data:`UUENCODE_LINE`): ``(rest, lines, bytes)``,
    the lines taken out and their bytes. For measuring a tokenizer on held-out text apart from
    the encoded binaries some corpora carry (en_heldout: 952 lines, 59 KB of 20 Newsgroups
    attachments).

    >>> line = b"M" + b"86%C9&5F9VAI:FML;6YO<'%R<W1U=G=X>7I!0D-$149'2$E*2TQ-3D]045)3" + b"\\n"
    >>> without_uuencode(b"before\\n" + line + line + b"after M short\\n")
    (b'before\\nafter M short\\n', 2, 124)
    """
    rest, n = UUENCODE_LINE.subn(b"", data)
    return rest, n, len(data) - len(rest)


def score(name: str, model: Model, encode: Callable[[bytes], list[int]], path: str,
          max_bytes: Optional[int] = None, skip_uuencode: bool = False) -> FileScore:
    """Encode one file (or its first ``max_bytes``) and measure it; ``skip_uuencode``: without its
    full uuencode lines (:func:`without_uuencode`; the file is then named ``"<name> w/o N uuencode
    lines"``)."""
    with open(path, "rb") as f:
        data = f.read(max_bytes) if max_bytes else f.read()
    label = os.path.basename(path)
    if skip_uuencode:
        data, n_lines, _ = without_uuencode(data)
        label = f"{label} w/o {n_lines} uuencode lines"
    t0 = time.perf_counter()
    ids = encode(data)
    seconds = time.perf_counter() - t0
    vocab = model.vocab
    round_trip = b"".join(vocab[i] for i in ids) == data
    # ids need not be dense (a GPT-2 vocab.json lists bytes held by two ids once)
    crossing = np.array([crosses_word_boundary(vocab.get(i, b"")) for i in range(max(vocab) + 1)], dtype=bool)
    n_cross = int(crossing[np.asarray(ids, dtype=np.int64)].sum()) if ids else 0
    n_chars = len(data.decode("utf-8", "surrogateescape"))
    n = max(len(ids), 1)
    return FileScore(name, label, len(data), n_chars, len(ids), len(data) / n, n_chars / n,
                     round_trip, n_cross / n, round(seconds, 3))


def longest_tokens(model: Model, k: int = 10) -> list[bytes]:
    """The ``k`` longest tokens of the vocabulary (special tokens left out)."""
    specials = {s.encode("utf-8") for s in model.special_tokens}
    toks = sorted({t for t in model.vocab.values() if t not in specials}, key=lambda t: (-len(t), t))
    return toks[:k]


def as_dict(s: FileScore) -> dict:
    return asdict(s)


# ==== HF export against bpe_core =============================================================


@dataclass
class Agreement:
    """How the exported ``tokenizer.json`` (run by HF ``tokenizers``) compares with bpe_core's own
    encoder (stage-aware for SuperBPE) on a list of documents."""

    n_docs: int
    identical: int              # documents whose ids are the same list
    hf_tokens: int
    tokens: int                 # bpe_core's count

    @property
    def identical_share(self) -> float:
        return self.identical / self.n_docs if self.n_docs else 1.0

    @property
    def token_gap(self) -> float:
        """HF's token count relative to bpe_core's, minus 1 (0.004: HF needs 0.4% more tokens)."""
        return self.hf_tokens / self.tokens - 1 if self.tokens else 0.0

    def line(self) -> str:
        """The two figures in words.

        >>> Agreement(200, 199, 1002, 1000).line()
        'HF tokenizer.json: identical ids on 199 of 200 documents (99.5%); 0.20% more tokens (1,002 vs 1,000)'
        """
        gap = 100 * self.token_gap
        what = "as many tokens" if self.hf_tokens == self.tokens else \
            f"{abs(gap):.2f}% {'more' if gap > 0 else 'fewer'} tokens"
        return (f"HF tokenizer.json: identical ids on {self.identical:,} of {self.n_docs:,} documents "
                f"({100 * self.identical_share:.1f}%); {what} ({self.hf_tokens:,} vs {self.tokens:,})")


def split_documents(data: bytes, model: Model) -> list[bytes]:
    """The documents of a text: the pieces between the model's special tokens (empty ones dropped);
    a text without one is cut into paragraphs (at blank lines), or else into lines.

    >>> m = Model(vocab={}, merges=[], special_tokens=["<|endoftext|>"])
    >>> split_documents(b"a b<|endoftext|>c<|endoftext|>", m), split_documents(b"a\\n\\nb", m)
    ([b'a b', b'c'], [b'a', b'b'])
    """
    specials = encode_specials(model.special_tokens)
    docs = [p for p, is_special in split_on_specials(data, specials) if not is_special and p] if specials else [data]
    for sep in (b"\n\n", b"\n"):
        if len(docs) == 1:
            docs = [p for p in docs[0].split(sep) if p.strip()]
    return docs


def hf_agreement(model: Model, docs: list[bytes], max_docs: Optional[int] = None) -> Agreement:
    """Encode every document with the HF export of ``model`` (needs ``tokenizers``) and with
    bpe_core's encoder that reproduces training; count identical documents and tokens.

    Documents are decoded as UTF-8 (invalid bytes become U+FFFD: HF takes only valid text), and
    both encoders get the same text.
    """
    import json

    import tokenizers

    hf = tokenizers.Tokenizer.from_str(json.dumps(hf_tokenizer_json(model)))
    _, encode = load_model_encoder(model)
    texts = [d.decode("utf-8", "replace") for d in (docs[:max_docs] if max_docs else docs)]
    out = hf.encode_batch(texts, add_special_tokens=False)
    same = n_hf = n_ours = 0
    for text, enc in zip(texts, out):
        ours = encode(text.encode("utf-8"))
        n_hf += len(enc.ids)
        n_ours += len(ours)
        same += enc.ids == list(ours)
    return Agreement(len(texts), same, n_hf, n_ours)


def load_model_encoder(model: Model) -> tuple[Model, Callable[[bytes], list[int]]]:
    """The encode function that reproduces a model's training (stage-aware for SuperBPE)."""
    if registry.get(model.method).stage_aware:
        return model, StageAwareTokenizer(model).encode
    return model, Tokenizer(model.vocab, model.merges, model.special_tokens, model.pattern).encode
