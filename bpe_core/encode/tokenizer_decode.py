"""Reading a tokenizer back: ids to bytes and text (:meth:`DecodeMixin.decode_bytes`, one native pass
over the token table), one at a time or in batches, and the read-only view of its vocabulary
(``n_vocab``, ``vocab``, ``merges``, ``special_tokens``, ``pattern``).

Part of ``encode.tokenizer`` (``Tokenizer`` takes these methods from :class:`DecodeMixin`).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

# Integer arrays that decode_bytes reads as they are (other integer dtypes are widened to int64).
_DECODE_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.int64))
_INT64_MAX = np.iinfo(np.int64).max


class DecodeMixin:
    """The decoding methods and the vocabulary properties of ``tokenizer.Tokenizer`` (they read its
    ``_tokens``, ``_decoder``, ``_vocab``, ``_merges``, ``_special_tokens``, ``_pattern`` and
    ``_ids_of``)."""

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The exact bytes of the ids (a list, a tuple, a 1-D integer array or any iterable).

        One native pass over a table of all the tokens' bytes, into one preallocated ``bytes``
        (``_encode.TokenTable``). An id that is not in the vocabulary raises ``ValueError``.

        >>> from bpe_core import Tokenizer
        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> Tokenizer(vocab, []).decode_bytes([0xE2, 0x82])
        b'\\xe2\\x82'
        """
        if isinstance(ids, np.ndarray):
            arr = ids
            if arr.ndim == 1 and arr.dtype.kind in "iu":
                if arr.dtype not in _DECODE_DTYPES:
                    if arr.dtype.kind == "u" and arr.size and arr.max() > _INT64_MAX:
                        arr = None          # the plain path below names the id
                    else:
                        arr = arr.astype(np.int64)
                if arr is not None:
                    out = self._tokens.decode(np.ascontiguousarray(arr))
                    if out is not None:
                        return out
        else:
            if not isinstance(ids, (list, tuple)):
                ids = list(ids)
            out = self._tokens.decode(ids)
            if out is not None:
                return out
        # An unknown id (or an array of another kind): the plain path, which names the bad ids.
        if isinstance(ids, np.ndarray):
            if ids.size and ids.dtype.kind == "i" and ids.min() < 0:
                raise ValueError(f"unknown token id(s) {ids[ids < 0][:5].tolist()} (ids are 0..{len(self._decoder) - 1})")
            ids = ids.tolist()
        elif not isinstance(ids, (list, tuple)):
            ids = list(ids)
        table = self._decoder
        try:
            if ids and min(ids) < 0:        # a negative index would silently pick a token from the end
                raise IndexError
            return b"".join([table[i] for i in ids])
        except (IndexError, TypeError):
            bad = [i for i in ids if not (isinstance(i, (int, np.integer)) and 0 <= i < len(table))
                   or table[i] is None]
            raise ValueError(f"unknown token id(s) {bad[:5]} (ids are 0..{len(table) - 1})") from None

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Decode to text; bytes that are not valid UTF-8 become U+FFFD (``errors="replace"``).

        >>> from bpe_core import Tokenizer
        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> Tokenizer(vocab, []).decode([104, 0xFF])
        'h\\ufffd'
        """
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def decode_single_token_bytes(self, token: int) -> bytes:
        """The bytes of one id."""
        return self.decode_bytes([token])

    @property
    def n_vocab(self) -> int:
        """One more than the largest id."""
        return len(self._decoder)

    @property
    def max_token_value(self) -> int:
        return len(self._decoder) - 1

    @property
    def vocab(self) -> dict[int, bytes]:
        return dict(self._vocab)

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        return list(self._merges)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special token string -> id."""
        return dict(self._special_tokens)

    @property
    def pattern(self) -> str:
        """The pre-tokenization regex string."""
        return self._pattern

    def token_id(self, token: bytes) -> int | None:
        """The (smallest) id holding these bytes, or None."""
        return self._ids_of.get(bytes(token))

    def cache_info(self) -> dict:
        """Statistics of the pretoken cache of the encoder used last."""
        return self._encoder().cache_info()

    def decode_bytes_batch(self, batch: Iterable[Iterable[int]]) -> list[bytes]:
        """:meth:`decode_bytes` of each sequence of ids.

        >>> from bpe_core import Tokenizer
        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> Tokenizer(vocab, []).decode_bytes_batch([[104, 105], []])
        [b'hi', b'']
        """
        return [self.decode_bytes(ids) for ids in batch]

    def decode_batch(self, batch: Iterable[Iterable[int]], errors: str = "replace") -> list[str]:
        """:meth:`decode` of each sequence of ids.

        >>> from bpe_core import Tokenizer
        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> Tokenizer(vocab, []).decode_batch([[104, 105], [0xFF]])
        ['hi', '\\ufffd']
        """
        return [self.decode_bytes(ids).decode("utf-8", errors=errors) for ids in batch]

    def decode_tokens_bytes(self, tokens: Iterable[int]) -> list[bytes]:
        """The bytes of each id, as a list (tiktoken's ``decode_tokens_bytes``)."""
        return [self.decode_bytes([t]) for t in tokens]

    @property
    def special_tokens_set(self) -> set[str]:
        """The special tokens (tiktoken's ``special_tokens_set``)."""
        return set(self._special_tokens)
