"""The tokenizer: encode text to token ids and decode them back, exactly as training saw it.

Semantics (the same as ``reference.encode``; see ``docs/encoding.md``):

1. Bytes are the truth. A ``str`` is encoded to UTF-8 with ``surrogateescape``, so a string that
   came from ``bytes.decode("utf-8", "surrogateescape")`` round-trips byte for byte.
2. Special tokens are found first, scanning left to right, longest match first; each becomes its
   single id.
3. The text between them is pre-tokenized with the pattern (``regex.finditer`` is the truth).
4. Each pretoken is merged by rank in the Cython core (``_encode.Encoder``); ids are canonical by
   bytes (when two ids hold the same bytes, the smaller one).

This module holds ``Tokenizer`` (construction, loading, encoding, its encoders, the stream and
regex paths), ``EncoderSpec`` and the stage-aware classes; ``Tokenizer`` takes the rest of its
methods from its parts: ``tokenizer_files`` (GPT-2 files in, the model folder out),
``tokenizer_decode`` (decoding, the vocabulary properties), ``tokenizer_specials`` (which special
tokens a call recognises), ``tokenizer_batch`` (the native batch job), ``tokenizer_pool`` (the
idle encoders and their warm caches) and ``tokenizer_open_end`` (what is final at the open end of
a stream).

>>> from bpe_core.reference import train_bpe_from_bytes
>>> vocab, merges = train_bpe_from_bytes(b"low low low lower<|endoftext|>", 262, ["<|endoftext|>"])
>>> tok = Tokenizer(vocab, merges, ["<|endoftext|>"])
>>> ids = tok.encode("low lower<|endoftext|>")
>>> ids
[258, 261, 256]
>>> tok.decode(ids)
'low lower<|endoftext|>'
"""
from __future__ import annotations

import contextlib
import os
from typing import AbstractSet, Callable, Collection, Iterable, Iterator, Sequence

import numpy as np
import regex

from ..corpus.specials import encode_specials, specials_regex
from ..errors import ModelFormatError
from ..formats import registry
from ..formats.model import Model, load_any
from ..pretok.patterns import pattern_name, regex_pieces, resolve_pattern
from ..pretok.pretokenize import PATTERN_IDS, pretoken_ends
from . import _encode
from . import tokenizer_batch as batch_part      # its _BATCH_THREAD_BYTES also sets the stage-aware batches' threads
from .tokenizer_batch import BatchMixin
from .tokenizer_decode import DecodeMixin
from .tokenizer_files import FilesMixin
from .tokenizer_open_end import OpenEndMixin, utf8_stable_end as _utf8_stable_end  # noqa: F401 (tests import it here)
from .tokenizer_pool import EncoderPoolMixin
from .tokenizer_specials import SpecialsMixin, as_bytes as _as_bytes, special_table as _special_table

__all__ = ["Tokenizer", "TwoStageEncoder", "model_encoder"]

_NO_ID = 0xFFFFFFFF
# Token ids below this are accepted however sparse the vocab (see Tokenizer.__init__).
_MAX_SPARSE_ID = 1 << 24
# Text spans longer than this are pre-tokenized and merged in blocks, so memory stays bounded.
_BLOCK_BYTES = 1 << 20
# encode_iterable encodes its buffer once it holds this many bytes.
_STREAM_FLUSH_BYTES = 1 << 16
# Named patterns use the native scanner; False runs ``regex`` (benchmarks/bench_encode.py compares both).
_NATIVE_PRETOKENIZER = True
# Encoders look a cache miss up in the proven single tokens (``_encode.build_singles``, pieces up to
# 256 bytes) before merging it. Off: on GPT-2 and cl100k a cold pass was no faster with them (the
# probe of a 4 MiB table costs what merging a common word does; CHANGELOG.md, "Encoding", has the figures).
_USE_SINGLES = False


class Tokenizer(FilesMixin, BatchMixin, DecodeMixin, SpecialsMixin, EncoderPoolMixin, OpenEndMixin):
    """A byte-level BPE tokenizer: vocabulary, ordered merges, special tokens and split pattern.

    Args:
        vocab: id -> token bytes; must hold the 256 single bytes.
        merges: ordered ``(left_bytes, right_bytes)``; rank = position in the list.
        special_tokens: strings that always encode to their single id. A special token that is not
            in ``vocab`` is appended to it with the next free id.
        pattern: the pre-tokenization pattern, a name (``gpt2``, ``cl100k``, ``o200k``) or a regex.

    >>> vocab = {i: bytes([i]) for i in range(256)}; vocab[256] = b"ab"
    >>> tok = Tokenizer(vocab, [(b"a", b"b")], ["<|endoftext|>"])
    >>> tok.encode("abab<|endoftext|>")
    [256, 256, 257]
    >>> tok.decode_bytes([256, 97])
    b'aba'
    """

    # ==== Construction ==========================================================================

    def __init__(self, vocab: dict[int, bytes], merges: Sequence[tuple[bytes, bytes]],
                 special_tokens: Sequence[str] | None = None, pattern: str = "gpt2"):
        vocab = {int(i): bytes(b) for i, b in vocab.items()}
        specials = [s if isinstance(s, str) else bytes(s).decode("utf-8") for s in (special_tokens or [])]
        special_bytes = encode_specials(specials)
        if vocab and min(vocab) < 0:
            raise ValueError(f"token ids must be non-negative, got {min(vocab)}")
        # The decoder is a list indexed by id and the rank table holds uint32: sparse ids are fine,
        # but an id like 10**12 is a mistake, not a reason to allocate terabytes.
        limit = min(_NO_ID, max(_MAX_SPARSE_ID, 16 * (len(vocab) + len(specials))))
        if vocab and max(vocab) >= limit:
            raise ValueError(f"token id {max(vocab)} is out of range: ids must be below {limit:,} "
                             f"(16 x the vocab size, at least {_MAX_SPARSE_ID:,})")
        ids_of: dict[bytes, int] = {}
        for i in sorted(vocab):
            ids_of.setdefault(vocab[i], i)
        for b in special_bytes:
            if b not in ids_of:
                new_id = max(vocab, default=-1) + 1
                vocab[new_id] = b
                ids_of[b] = new_id
        missing = [x for x in range(256) if bytes([x]) not in ids_of]
        if missing:
            raise ValueError(f"vocab lacks the single-byte tokens {missing[:8]}{'...' if len(missing) > 8 else ''}")

        self._vocab = vocab
        self._merges = [(bytes(a), bytes(b)) for a, b in merges]
        self._ids_of = ids_of
        self._special_tokens = {s: ids_of[b] for s, b in zip(specials, special_bytes)}
        self._special_bytes = special_bytes
        self._specials_rx = specials_regex(special_bytes)
        self._max_special_len = max((len(b) for b in special_bytes), default=0)
        self._pattern = resolve_pattern(pattern)
        self._pattern_name = pattern_name(self._pattern)
        self._rx = regex.compile(self._pattern)
        self._decoder: list[bytes | None] = [None] * (max(vocab) + 1)
        for i, b in vocab.items():
            self._decoder[i] = b

        # The rank table: parts and result as canonical ids; a merge whose parts are not in the
        # vocabulary can never apply and is skipped.
        n = len(self._merges)
        lefts = np.full(n, _NO_ID, dtype=np.uint32)
        rights = np.full(n, _NO_ID, dtype=np.uint32)
        merged = np.zeros(n, dtype=np.uint32)
        for r, (a, b) in enumerate(self._merges):
            la, rb = ids_of.get(a), ids_of.get(b)
            if la is None or rb is None:
                continue
            m = ids_of.get(a + b)
            if m is None:
                raise ValueError(f"merge {r} ({a!r}, {b!r}) builds {a + b!r}, which is not in the vocab")
            lefts[r], rights[r], merged[r] = la, rb, m
        byte_ids = np.array([ids_of[bytes([x])] for x in range(256)], dtype=np.uint32)
        self._rank_arrays = (lefts, rights, merged, byte_ids)
        self._table = _encode.RankTable(lefts, rights, merged, byte_ids)
        self._special_table = _special_table(special_bytes, [ids_of[b] for b in special_bytes])
        self._pattern_id = PATTERN_IDS.get(self._pattern_name) if self._pattern_name else None
        # Idle encoders (each owns a pretoken cache and buffers, and is used by one thread at a
        # time). A call borrows one and gives it back, so caches stay warm across calls and across
        # the short-lived threads of encode_batch; there are as many as calls ever ran at once.
        self._idle: list[_encode.Encoder] = []
        # Every token's bytes back to back and the int of every id: decode and lists of ids (native).
        self._tokens = _encode.TokenTable(self._decoder)
        # The pieces proven to encode as one token, read by every encoder when its cache misses.
        self._singles = _encode.build_singles(self._table, self._tokens) if _USE_SINGLES else None

    # from_files (GPT-2 files) and save (the model folder): FilesMixin, tokenizer_files

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Load what ``tools/train_bpe.py`` wrote: a folder with ``model.json`` or the file itself.

        A folder that holds only ``vocab.json`` + ``merges.txt`` is read as GPT-2 files: GPT-2
        pattern, and vocab entries that no merge builds (e.g. ``<|endoftext|>``) are special tokens.
        Errors name the file.
        """
        model = load_any(path)
        try:
            method = registry.get(model.method)
        except ValueError as exc:
            raise ModelFormatError(path, str(exc)) from None
        if method.stage_aware:
            return StageAwareTokenizer(model)
        tok = cls(model.vocab, model.merges, model.special_tokens, model.pattern)
        tok._model = model                  # save() writes it back as it was read (method, metadata)
        return tok

    #: HF-style name for :meth:`load`: ``Tokenizer.from_pretrained("tok/")``.
    from_pretrained = load

    def __reduce__(self):
        specials = list(self._special_tokens)
        return (Tokenizer, (self._vocab, self._merges, specials, self._pattern))

    def __repr__(self) -> str:
        name = self._pattern_name or "custom"
        return f"<Tokenizer n_vocab={self.n_vocab} merges={len(self._merges)} pattern={name} specials={len(self._special_tokens)}>"

    # ==== Encoding ==============================================================================

    def encode(self, text: str | bytes, *, allowed_special: AbstractSet[str] | str = "all",
               disallowed_special: Collection[str] | str = ()) -> list[int]:
        """Encode text; special tokens become their single id (longest match first).

        ``allowed_special`` (the special tokens recognised; ``"all"`` by default) and
        ``disallowed_special`` (special-token strings whose presence in the text raises
        ``ValueError``; ``"all"``: every special token not allowed) work as in tiktoken; only the
        defaults differ (tiktoken: none allowed, all disallowed), see ``docs/encoding.md``. The list
        is built once from the native result.

        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> tok = Tokenizer(vocab, [], ["<s>", "<s><s>"])
        >>> tok.encode("<s><s><s>")
        [257, 256]
        >>> tok.encode("<s><s><s>", allowed_special={"<s>"})
        [256, 256, 256]
        """
        if self._native_batch():          # one native call into a list (no array in between)
            data = text if type(text) is str else _as_bytes(text)
            specials = self._select_specials(True, allowed_special, disallowed_special, (data,))
            return self._encode_all(data, specials, self._tokens)
        return self._tokens.to_list(self.encode_to_numpy(text, allowed_special=allowed_special,
                                                         disallowed_special=disallowed_special))

    def encode_ordinary(self, text: str | bytes) -> list[int]:
        """Encode text, treating special-token strings as ordinary text.

        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> Tokenizer(vocab, [], ["<s>"]).encode_ordinary("<s>")
        [60, 115, 62]
        """
        if self._native_batch():
            return self._encode_all(text if type(text) is str else _as_bytes(text), False, self._tokens)
        return self._tokens.to_list(self.encode_to_numpy(text, specials=False))

    def encode_to_numpy(self, text: str | bytes, specials: bool = True, *,
                        allowed_special: AbstractSet[str] | str = "all",
                        disallowed_special: Collection[str] | str = ()) -> np.ndarray:
        """Encode text into a uint32 array (``specials=False``: as ``encode_ordinary``; the two
        keywords as in :meth:`encode`).

        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> Tokenizer(vocab, []).encode_to_numpy("hi")
        array([104, 105], dtype=uint32)
        """
        native = self._pattern_id is not None and _NATIVE_PRETOKENIZER
        data = text if native and type(text) is str else _as_bytes(text)
        specials = self._select_specials(specials, allowed_special, disallowed_special, (data,))
        if native:
            return self._encode_all(data, specials)
        parts = list(self._iter_encode(data, 0, len(data), specials))
        if not parts:
            return np.zeros(0, dtype=np.uint32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def encode_batch(self, texts: Sequence[str | bytes], num_threads: int = 8, *,
                     allowed_special: AbstractSet[str] | str = "all",
                     disallowed_special: Collection[str] | str = (), flat: bool = False):
        """Encode many texts: a list of id lists, or with ``flat=True`` ``(ids, offsets)`` as
        :meth:`encode_batch_flat`. Each text is encoded alone, exactly as :meth:`encode`.

        The batch is one native job without the GIL (``_encode.BatchJob``): up to ``num_threads``
        threads take the texts one at a time, read the warmest pretoken cache together (read-only)
        beside one of their own, and the ids are gathered by one copy. On several threads the
        calling thread builds the lists while the others still encode.

        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> Tokenizer(vocab, []).encode_batch(["a", "bc"])
        [[97], [98, 99]]
        """
        texts = texts if isinstance(texts, list) else list(texts)
        specials = self._select_specials(True, allowed_special, disallowed_special, texts)
        if not flat and self._native_batch():
            return self._encode_job(texts, num_threads, self._special_table_for(specials), lists=True)
        ids, offsets = self._encode_flat(texts, num_threads, specials)
        return (ids, offsets) if flat else self._tokens.split_lists(ids, offsets)

    def encode_iterable(self, iterable: Iterable[str | bytes]) -> Iterator[int]:
        """Stream ids for the concatenation of ``iterable``, in constant memory.

        Yields exactly ``encode("".join(iterable))``: pretokens and special tokens may straddle the
        pieces of the iterable. Only the provably final part of the buffer is encoded; the open end
        (a possible special-token prefix, an unfinished UTF-8 character and the last two pretokens)
        waits for more text. With a custom pattern, text is held until the next special token or
        the end, since no cut inside a document can be proven safe for any regex.

        >>> vocab = {i: bytes([i]) for i in range(256)}
        >>> tok = Tokenizer(vocab, [], ["<|endoftext|>"])
        >>> list(tok.encode_iterable(["hi<|endof", "text|>"]))
        [104, 105, 256]
        """
        pending = bytearray()
        flush_at = _STREAM_FLUSH_BYTES
        for piece in iterable:
            pending += _as_bytes(piece)
            if len(pending) < flush_at:
                continue
            data = bytes(pending)
            end = self._decided_end(data)
            gen = self._iter_encode(data, 0, end, True, final=False)
            while True:
                try:
                    ids = next(gen)
                except StopIteration as stop:
                    consumed = stop.value
                    break
                yield from ids.tolist()
            del pending[:consumed]
            # What is held back (one huge pretoken, a long document under a custom pattern) is
            # rescanned only after it doubles: linear time overall.
            flush_at = max(_STREAM_FLUSH_BYTES, 2 * len(pending))
        data = bytes(pending)
        for ids in self._iter_encode(data, 0, len(data), True):
            yield from ids.tolist()

    # ==== Decoding and the vocabulary: DecodeMixin (tokenizer_decode) ===========================

    # ==== The special-token choice: SpecialsMixin (tokenizer_specials) ==========================

    # ==== Private (the idle encoders: EncoderPoolMixin, tokenizer_pool) ========================

    def _encode_all(self, data, specials, tokens: "_encode.TokenTable | None" = None):
        """``data`` (a ``str``, or bytes) encoded in one native call (``Encoder.encode_all``: block
        by block into one buffer, no generator): a uint32 array, or with ``tokens`` a list."""
        enc = self._borrow()
        try:
            return enc.encode_all(data, self._pattern_id, self._special_table_for(specials), _BLOCK_BYTES, tokens)
        finally:
            self._idle.append(enc)

    def _encoder_spec(self) -> "EncoderSpec":
        """What worker processes need to encode like this tokenizer (see ``EncoderSpec``)."""
        ids = [self._ids_of[b] for b in self._special_bytes]
        native = self._pattern_id is not None
        return EncoderSpec(self._rank_arrays, self._special_bytes, ids, self._pattern_id,
                           None if native else self)

    def _iter_encode(self, buf, start: int, end: int, specials: bool = True, final: bool = True):
        """Encode ``buf[start:end]`` in bounded batches; yields uint32 arrays.

        With ``final=False`` the last text span may continue after ``end``: only its provably
        final pretokens are encoded. Returns (as ``StopIteration.value``) the offset up to which
        the input was consumed. Named patterns run in the native core (``_iter_encode_native``),
        one call per block of about ``_BLOCK_BYTES``; custom patterns (and
        ``_NATIVE_PRETOKENIZER = False``) pre-tokenize with ``regex`` in Python.
        """
        enc = self._borrow()
        try:
            if self._pattern_id is not None and _NATIVE_PRETOKENIZER:
                table = self._special_table_for(specials)
                return (yield from _iter_encode_native(enc, buf, start, end, self._pattern_id, table, final))
            return (yield from self._iter_encode_regex(enc, buf, start, end, specials, final))
        finally:
            self._idle.append(enc)

    def _iter_encode_regex(self, enc, buf, start: int, end: int, specials: bool = True, final: bool = True):
        """``_iter_encode`` with ``regex`` pre-tokenization and the special tokens found in Python."""
        ends_parts: list[np.ndarray] = []
        special_at: list[int] = []
        special_ids: list[int] = []
        n_pieces = 0
        batch_start = start
        batch_bytes = 0

        def flush(upto: int):
            nonlocal ends_parts, special_at, special_ids, n_pieces, batch_start, batch_bytes
            if n_pieces:
                ends = ends_parts[0] if len(ends_parts) == 1 else np.concatenate(ends_parts)
                forced = None
                if special_at:
                    forced = np.full(n_pieces, -1, dtype=np.int64)
                    forced[special_at] = special_ids
                ids = enc.encode_pieces(buf, ends, batch_start, forced)
            else:
                ids = None
            ends_parts, special_at, special_ids = [], [], []
            n_pieces = 0
            batch_start = upto
            batch_bytes = 0
            return ids

        def add_text(s: int, e: int, open_end: bool) -> int:
            """Queue the pretokens of text ``[s, e)``; returns where the queued text ends."""
            nonlocal n_pieces, batch_bytes
            ends, resume = self._text_ends(buf, s, e, open_end)
            if len(ends):
                ends_parts.append(ends)
                n_pieces += len(ends)
                batch_bytes += resume - s
            return resume

        rx = self._specials_rx if specials is True else None
        if isinstance(specials, frozenset):
            rx = specials_regex(encode_specials(sorted(specials)))
        pos = start
        matches = rx.finditer(buf, start, end) if rx is not None else ()
        for m in matches:
            s, e = m.span()
            pos = yield from self._queue_span(add_text, flush, pos, s, False)
            if pos != s:        # cannot happen for a closed span
                raise AssertionError("closed text span not fully consumed")
            special_at.append(n_pieces)
            special_ids.append(self._ids_of[m.group()])
            ends_parts.append(np.array([e], dtype=np.int64))
            n_pieces += 1
            batch_bytes += e - s
            pos = e
            if batch_bytes >= _BLOCK_BYTES:
                ids = flush(pos)
                if ids is not None:
                    yield ids
        pos = yield from self._queue_span(add_text, flush, pos, end, not final)
        ids = flush(pos)
        if ids is not None and len(ids):
            yield ids
        return pos

    def _queue_span(self, add_text, flush, s: int, e: int, open_end: bool):
        """Queue text ``[s, e)`` in blocks of about ``_BLOCK_BYTES``; yields full batches."""
        pos = s
        named = self._pattern_name is not None
        block = _BLOCK_BYTES
        while named and e - pos > block:
            nxt = add_text(pos, pos + block, True)
            if nxt == pos:          # one pretoken longer than the block: look further
                block *= 2
                continue
            block = _BLOCK_BYTES
            pos = nxt
            ids = flush(pos)
            if ids is not None:
                yield ids
        if e > pos:
            pos = add_text(pos, e, open_end)
        return pos

    def _pretoken_ends(self, buf, s: int, e: int):
        """Pre-tokenize ``buf[s:e]``: absolute end offsets.

        The one place that calls the pre-tokenizer: the native scanner for the named patterns
        (byte-identical to ``regex``), else ``regex`` itself, the text between its matches kept as
        pretokens of their own (``patterns.regex_pieces``), so every byte is encoded.
        """
        if self._pattern_name is not None and _NATIVE_PRETOKENIZER:
            return s + pretoken_ends(memoryview(buf)[s:e], self._pattern_name)
        data = bytes(buf[s:e])
        text = data.decode("utf-8", "surrogateescape")
        if self._pattern_name is not None:    # the regex path, kept for comparisons (bench_encode)
            pieces = self._rx.findall(text)
            char_ends = np.cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)))
            if len(text) == e - s:          # one char per byte: char offsets are byte offsets
                return s + char_ends
            starts = np.flatnonzero((np.frombuffer(data, dtype=np.uint8) & 0xC0) != 0x80)
            if len(starts) == len(text):    # valid UTF-8: a char starts at each non-continuation byte
                return s + np.append(starts, e - s)[char_ends]
            lengths = np.fromiter((len(p.encode("utf-8", "surrogateescape")) for p in pieces),
                                  dtype=np.int64, count=len(pieces))
            return s + np.cumsum(lengths)
        pieces = regex_pieces(data, self._rx)
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        return s + np.cumsum(lengths)

    # ==== Batches (the native job and the other batch methods: BatchMixin, tokenizer_batch) =====

    def _native_batch(self) -> bool:
        """Whether a batch is one native job (a named pattern, not a stage-aware model)."""
        return (self._pattern_id is not None and _NATIVE_PRETOKENIZER
                and type(self).encode_to_numpy is Tokenizer.encode_to_numpy)

    def _encode_flat(self, texts, num_threads: int, specials) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, offsets)`` of many texts (see :meth:`encode_batch_flat`)."""
        texts = texts if isinstance(texts, list) else list(texts)
        n = len(texts)
        if self._native_batch():
            return self._encode_job(texts, num_threads, self._special_table_for(specials))
        # custom pattern or stage-aware model: text by text
        if type(self).encode_to_numpy is not Tokenizer.encode_to_numpy and not getattr(self, "_native_stage", False):
            num_threads = 1                 # a stage encoder need not be thread-safe (the native one is)

        def work(k):
            if isinstance(specials, frozenset):
                return self.encode_to_numpy(texts[k], allowed_special=specials)
            return self.encode_to_numpy(texts[k], bool(specials))

        def work_run(r):
            return [work(k) for k in r]
        if getattr(self, "_native_stage", False) and not isinstance(specials, frozenset):
            return self._encode_flat_stage(texts, num_threads, bool(specials))
        n_threads = min(num_threads, n, max(1, sum(map(len, texts)) // batch_part._BATCH_THREAD_BYTES))
        if n_threads <= 1:
            parts = work_run(range(n))
        else:
            from concurrent.futures import ThreadPoolExecutor

            # runs of texts, a few per thread (a task per text cost more than a short text's encoding)
            step = -(-n // (8 * n_threads))
            runs = [range(a, min(a + step, n)) for a in range(0, n, step)]
            with ThreadPoolExecutor(n_threads) as pool:
                parts = [p for run in pool.map(work_run, runs) for p in run]
        offsets = np.zeros(n + 1, dtype=np.int64)
        if n:
            np.cumsum([len(p) for p in parts], out=offsets[1:])
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
        return ids.astype(np.uint32, copy=False), offsets

    def _encode_flat_stage(self, texts: list, num_threads: int, specials: bool) -> tuple[np.ndarray, np.ndarray]:
        """``_encode_flat`` with the native stage-aware encoder: runs of texts, each one native call
        (``TwoStageEncoder.encode_flat``: its ids back to back), on up to ``num_threads`` threads."""
        flat = self._stage.native.encode_flat
        n = len(texts)
        n_threads = min(num_threads, n, max(1, sum(map(len, texts)) // batch_part._BATCH_THREAD_BYTES))
        if n_threads <= 1:
            return flat(texts, specials)
        from concurrent.futures import ThreadPoolExecutor

        # runs of texts, a few per thread (the threads take them in turn: a long text delays one run)
        step = -(-n // (8 * n_threads))
        with ThreadPoolExecutor(n_threads) as pool:
            runs = list(pool.map(lambda a: flat(texts[a:a + step], specials), range(0, n, step)))
        offsets = np.empty(n + 1, dtype=np.int64)
        offsets[0] = 0
        at = k = 0
        for ids, offs in runs:
            m = len(offs) - 1
            np.add(offs[1:], at, out=offsets[k + 1:k + 1 + m])
            k += m
            at += len(ids)
        return (np.concatenate([ids for ids, _ in runs]) if len(runs) > 1 else runs[0][0]), offsets


def _iter_encode_native(enc: "_encode.Encoder", buf, start: int, end: int, pattern_id: int,
                        special_table, final: bool = True):
    """Encode ``buf[start:end]`` with ``Encoder.encode_text``, one call per block; yields uint32 arrays.

    Returns (as ``StopIteration.value``) where encoding stopped: ``end`` when ``final``, else the
    start of the held-back open tail. A block that holds only part of one pretoken (no final
    pretoken boundary in it) is retried twice as large, so a pretoken of any length is encoded
    whole, in time linear in its length.
    """
    pos, block = start, _BLOCK_BYTES
    while True:
        ids, stop, done = enc.encode_text(buf, pos, end, pattern_id, special_table, block, not final)
        if len(ids):
            yield ids
        if done:
            return stop
        block = 2 * block if stop == pos else _BLOCK_BYTES
        pos = stop


class EncoderSpec:
    """What a worker process needs to encode like a ``Tokenizer``: the rank-table arrays, the
    special tokens and the pattern, a few hundred KB to pickle instead of the whole vocabulary.

    ``Tokenizer._encoder_spec()`` makes one; :meth:`iter_encode` is ``Tokenizer._iter_encode``.
    A custom pattern needs ``regex`` and the Python path, so that spec carries the tokenizer.

    >>> vocab = {i: bytes([i]) for i in range(256)}; vocab[256] = b"ab"
    >>> spec = Tokenizer(vocab, [(b"a", b"b")], ["<s>"])._encoder_spec()
    >>> import pickle; spec = pickle.loads(pickle.dumps(spec))
    >>> [ids.tolist() for ids in spec.iter_encode(b"abab<s>", 0, 7)]
    [[256, 256, 257]]
    """

    def __init__(self, rank_arrays, special_bytes, special_ids, pattern_id, tokenizer=None):
        self.rank_arrays = rank_arrays
        self.special_bytes = list(special_bytes)
        self.special_ids = list(special_ids)
        self.pattern_id = pattern_id
        self.tokenizer = tokenizer
        self._encoder = None
        self._pool = None           # lend_from: the tokenizer's idle encoders, rank table, singles
        self._rank_table = None
        self._singles = None
        #: the pretokens the encoder's cache may hold (``Plan.cache_entries``; None: its default)
        self.cache_entries: int | None = None
        self._lent_max = None       # a lent encoder's own max_entries, set back on release

    def lend_from(self, tok: "Tokenizer", n: int = 1) -> None:
        """Take encoders from ``tok``'s idle ones (warm caches; ``n`` of them made about as warm as
        the warmest, ``Tokenizer._warm_encoders``) and give them back on :meth:`release`, in this
        process (a pickled spec does not carry them)."""
        if self.tokenizer is None:
            self._pool, self._rank_table, self._singles = tok._idle, tok._table, tok._singles
            if n > 1:
                tok._warm_encoders(n)

    def release(self) -> None:
        """Give this spec's encoder back to the tokenizer it was lent from (if any)."""
        if self._pool is not None and self._encoder is not None:
            if self._lent_max is not None:      # (a cache grown past it is emptied, its memory freed)
                self._encoder.set_max_entries(self._lent_max)
            self._pool.append(self._encoder)
        self._encoder = None
        self._lent_max = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_encoder", "_pool", "_rank_table", "_singles", "_lent_max", "_table")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._encoder = None
        self._pool = self._rank_table = self._singles = self._lent_max = None

    def __copy__(self):
        """A spec of its own for another thread: the same lender, no encoder yet."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._encoder = new._lent_max = None
        return new

    def iter_encode(self, buf, start: int, end: int):
        """Yield the uint32 ids of ``buf[start:end]`` in blocks (special tokens recognised)."""
        if self.tokenizer is not None or not _NATIVE_PRETOKENIZER:
            yield from self.tokenizer._iter_encode(buf, start, end)
            return
        self._ready()
        yield from _iter_encode_native(self._encoder, buf, start, end, self.pattern_id, self._table)

    def _ready(self) -> None:
        """This spec's encoder (lent and warm, or new) and special table, on first use."""
        if self._encoder is None:
            try:
                self._encoder = self._pool.pop()        # a lent, warm encoder
            except (AttributeError, IndexError):
                table = self._rank_table if self._rank_table is not None else _encode.RankTable(*self.rank_arrays)
                self._encoder = _encode.Encoder(table, singles=self._singles)
            if self.cache_entries and self._encoder.max_entries != self.cache_entries:
                self._lent_max = self._encoder.max_entries
                self._encoder.set_max_entries(self.cache_entries)
            self._table = _special_table(self.special_bytes, self.special_ids)

    def iter_encode_counted(self, buf, start: int, end: int, lengths: np.ndarray, narrow: bool):
        """:meth:`iter_encode` for the corpus encoder: yields ``(ids, n_bytes)``, the ids as uint16
        (``narrow``) or uint32 and ``lengths[ids].sum()`` (-1 when an id is outside ``lengths``),
        made in one native pass over the ids (``Encoder.encode_counted``). Without the native
        pre-tokenizer, :meth:`iter_encode`'s blocks with the sum and the narrowing done apart."""
        if self.tokenizer is not None or not _NATIVE_PRETOKENIZER:
            yield from _counted(self.iter_encode(buf, start, end), lengths, narrow)
            return
        self._ready()
        enc, pattern_id, table = self._encoder, self.pattern_id, self._table
        pos, block = start, _BLOCK_BYTES
        while pos < end:
            ids, stop, done, n_bytes = enc.encode_counted(buf, pos, end, pattern_id, table, block, lengths, narrow)
            if len(ids):
                yield ids, n_bytes
            if done:
                return
            block = 2 * block if stop == pos else _BLOCK_BYTES
            pos = stop


def _counted(blocks, lengths: np.ndarray, narrow: bool):
    """``(ids, n_bytes)`` of uint32 id ``blocks``, apart: the plain twin of ``Encoder.encode_counted``."""
    for ids in blocks:
        if ids.size and int(ids.max()) >= len(lengths):
            n_bytes = -1
        else:
            n_bytes = int(lengths[ids].sum())
        yield (ids.astype(np.uint16) if narrow else ids), n_bytes


# ==== Stage-aware models (SuperBPE, SupraTok) ===================================================


class TwoStageEncoder:
    """SuperBPE's and SupraTok's stage-aware encoding of a whole text in one native call: stage-1
    merges inside pretokens (a :class:`Tokenizer` over them, with its pretoken cache), then ``stage2``
    (an ``engine.units.RankMerger``) inside units, cut at special tokens and at pretokens that hold a
    digit; the ``"hf"`` split also cuts inside runs of whitespace, the ``"units"`` split cuts a
    numeric pretoken into digit groups between its stage-1 tokens (``_encode.encode_stage_aware``).

    Stage 2 works segment by segment: a pair of neighbouring stage-1 ids that no stage-2 merge can
    join cuts the unit (``_encode.Stage2Table``), so most segments are one or two ids, merged from
    that table by a linear scan.

    Args:
        vocab, stage1_merges, special_tokens, pattern: as :class:`Tokenizer` (a named pattern).
        stage2: the stage-2 merges as a ``RankMerger`` over canonical ids (the smallest id of the bytes).
        all_cross: no cuts inside units (each unit is one segment; for tests).
        split: ``"hf"`` or ``"units"``.

    Thread-safe: each call borrows an encoder and a stage-2 scratch of its own.

    >>> from bpe_core.engine.units import RankMerger
    >>> vocab = {i: bytes([i]) for i in range(256)} | {256: b" a", 257: b" a a"}
    >>> m2 = RankMerger(np.array([256], np.uint32), np.array([256], np.uint32), np.array([257], np.uint32))
    >>> TwoStageEncoder(vocab, [(b" ", b"a")], [], "gpt2", m2).encode(b" a a a 1").tolist()
    [257, 256, 32, 49]
    """

    def __init__(self, vocab: dict[int, bytes], stage1_merges, special_tokens, pattern: str, stage2,
                 all_cross: bool = False, split: str = "hf"):
        self._tok = Tokenizer(vocab, stage1_merges, special_tokens, pattern)
        if self._tok._pattern_id is None:
            raise ValueError("the native stage-aware encoder needs a named pattern (gpt2, cl100k, o200k)")
        if split not in ("hf", "units"):
            raise ValueError(f"the native stage-aware encoder has no split {split!r} (hf, units)")
        self._split = split
        lengths = None
        if split == "units":
            lengths = np.zeros(max(vocab, default=-1) + 1, dtype=np.uint32)
            for i, b in vocab.items():
                lengths[i] = len(b)
        self._stage2 = _encode.Stage2Table(stage2, all_cross=all_cross, token_lengths=lengths, token_bytes=vocab)
        self._idle_scratch: list = []
        self._cache_entries: int | None = None     # (size_caches)
        self._own_bound: int | None = None

    def size_caches(self, entries: int | None) -> None:
        """The pretokens each stage-1 encoder's cache may hold from now on (the corpus plan's
        ``cache_entries``); None: their own bound again (a cache grown past it is emptied, its
        memory freed). Call it while no other thread encodes with this encoder."""
        self._cache_entries = entries
        if entries is None and self._own_bound is not None:
            for enc in list(self._tok._idle):
                enc.set_max_entries(self._own_bound)

    def encode(self, data: bytes | str, specials: bool = True) -> np.ndarray:
        """uint32 ids of ``data`` (a ``str``: its UTF-8, ``surrogateescape``; ``specials=False``:
        special tokens are plain text)."""
        with self._borrowed() as (enc, scratch):
            return _encode.encode_stage_aware(enc, self._stage2, scratch, data, self._tok._pattern_id,
                                              self._tok._special_table if specials else None, self._split)

    @contextlib.contextmanager
    def _borrowed(self):
        """An idle native encoder and stage-2 scratch for this thread, given back after the block."""
        enc = self._tok._borrow()
        if self._cache_entries and enc.max_entries != self._cache_entries:
            if self._own_bound is None:
                self._own_bound = enc.max_entries
            enc.set_max_entries(self._cache_entries)
        try:
            scratch = self._idle_scratch.pop()
        except IndexError:
            scratch = _encode.Stage2Scratch()
        try:
            yield enc, scratch
        finally:
            self._idle_scratch.append(scratch)
            self._tok._idle.append(enc)

    def encode_many(self, texts: Sequence[str | bytes], specials: bool = True) -> list[np.ndarray]:
        """:meth:`encode` of each text (a ``str`` as its UTF-8, ``surrogateescape``), with one
        borrowed encoder and scratch for all of them (a batch's run of documents).

        >>> from bpe_core.engine.units import RankMerger
        >>> vocab = {i: bytes([i]) for i in range(256)} | {256: b" a", 257: b" a a"}
        >>> m2 = RankMerger(np.array([256], np.uint32), np.array([256], np.uint32), np.array([257], np.uint32))
        >>> [a.tolist() for a in TwoStageEncoder(vocab, [(b" ", b"a")], [], "gpt2", m2).encode_many([" a a", b"", "1"])]
        [[257], [], [49]]
        """
        table = self._tok._special_table if specials else None
        pattern_id, stage2, split = self._tok._pattern_id, self._stage2, self._split
        with self._borrowed() as (enc, scratch):
            return [_encode.encode_stage_aware(enc, stage2, scratch, _encode.utf8_of(t) if type(t) is str else _as_bytes(t),
                                               pattern_id, table, split) for t in texts]

    def encode_flat(self, texts: Sequence[str | bytes], specials: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode` of each text back to back: ``(ids, offsets)`` as
        :meth:`Tokenizer.encode_batch_flat`, one native call for the run (no array per text).

        >>> from bpe_core.engine.units import RankMerger
        >>> vocab = {i: bytes([i]) for i in range(256)} | {256: b" a", 257: b" a a"}
        >>> m2 = RankMerger(np.array([256], np.uint32), np.array([256], np.uint32), np.array([257], np.uint32))
        >>> ids, offsets = TwoStageEncoder(vocab, [(b" ", b"a")], [], "gpt2", m2).encode_flat([" a a", b"", "1"])
        >>> ids.tolist(), offsets.tolist()
        ([257, 49], [0, 1, 1, 2])
        """
        bufs = [_encode.utf8_of(t) if type(t) is str else t if type(t) is bytes else _as_bytes(t) for t in texts]
        with self._borrowed() as (enc, scratch):
            return _encode.encode_stage_aware_flat(enc, self._stage2, scratch, bufs, self._tok._pattern_id,
                                                   self._tok._special_table if specials else None, self._split)


def _stage_encoder(model):
    """The method's own stage-aware encoder (``formats.registry``: ``Method.stage_encoder``)."""
    return registry.get(model.method).stage_encoder(model)


class StageAwareTokenizer(Tokenizer):
    """A :class:`Tokenizer` for multi-stage models (SuperBPE, SupraTok): stage-1 merges inside
    pretokens, later merges inside units, exactly as training did (``superbpe.StageAwareEncoder``).

    Decoding is the same as for BPE. ``encode_iterable`` streams document by document: units never
    cross a special token, so text is held back only up to the last special token seen (a document
    with no special token is held whole).
    """

    def __init__(self, model: Model):
        super().__init__(model.vocab, model.merges, model.special_tokens, model.pattern)
        self._model = model
        self._stage = _stage_encoder(model)
        # one native call a text (``TwoStageEncoder``: thread-safe, without the GIL), else Python
        self._native_stage = getattr(self._stage, "native", None) is not None
        self._specials_rx = specials_regex(self._special_bytes_list())
        self._max_special = max((len(b) for b in self._special_bytes_list()), default=0)

    def _special_bytes_list(self) -> list[bytes]:
        return [s.encode("utf-8") for s in self._special_tokens]

    def __reduce__(self):
        return (StageAwareTokenizer, (self._model,))

    def __repr__(self) -> str:
        return f"<StageAwareTokenizer method={self._model.method} n_vocab={self.n_vocab} merges={len(self._merges)}>"

    def encode_to_numpy(self, text: str | bytes, specials: bool = True, *,
                        allowed_special: AbstractSet[str] | str = "all",
                        disallowed_special: Collection[str] | str = ()) -> np.ndarray:
        if type(text) is str and self._native_stage:
            # the str itself: the native pass reads its own UTF-8, or writes it into the encoder's
            # scratch buffer (a new bytes object of 5 MB faulted in ~1,200 pages a call, 12% of it)
            data = text
        else:
            data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
        specials = self._select_specials(specials, allowed_special, disallowed_special, (data,))
        if isinstance(specials, frozenset):
            raise ValueError("a stage-aware model recognises all of its special tokens or none: "
                             "allowed_special must be 'all' or empty")
        whole = getattr(self._stage, "encode_array", None)      # a whole text in one native call
        if whole is not None:
            return whole(data, specials)
        ids = self._stage.encode(data) if specials else self._stage.encode_ordinary(data)
        return np.asarray(ids, dtype=np.uint32)

    def encode_iterable(self, iterable: Iterable[str | bytes]) -> Iterator[int]:
        """Yields exactly ``encode("".join(iterable))``, one finished document at a time."""
        buf = b""
        for piece in iterable:
            buf += piece.encode("utf-8", "surrogateescape") if isinstance(piece, str) else bytes(piece)
            cut = self._last_safe_cut(buf)
            if cut:
                yield from self.encode(buf[:cut])
                buf = buf[cut:]
        if buf:
            yield from self.encode(buf)

    #: Units run across newlines: whole-corpus encoding cuts chunks at special tokens only.
    chunks_inside_documents = False

    def _encoder_spec(self) -> "StageAwareSpec":
        return StageAwareSpec(self._model)

    def _last_safe_cut(self, buf: bytes) -> int:
        """The end of the last special token that the whole-text scan surely finds: one whose start
        is at least the longest special token's length away from the end of what we have."""
        if self._specials_rx is None:
            return 0
        cut = 0
        limit = len(buf) - self._max_special
        for m in self._specials_rx.finditer(buf):
            if m.start() > limit:
                break
            cut = m.end()
        return cut


#: The corpus encoder's blocks of a stage-aware model (``StageAwareSpec.iter_encode``): this many
#: bytes of text and up to the next special token, so most blocks' ids (~50k at 5 bytes a token) stay
#: under ``_encode.HAND_OVER_IDS``: copied into a small array, the encoder's buffer kept.
STAGE_BLOCK_BYTES = 256 << 10


class StageAwareSpec:
    """What a worker needs to encode with a multi-stage model (the model itself).

    In the process that made it, :meth:`lend_from` lends it the tokenizer: its native stage-aware
    encoder is thread-safe, so every thread's copy encodes with it (warm caches, and no thread
    builds its own tables: about a quarter of a CPU-second for a 32k model). A pickled spec, or
    one that was not lent a native tokenizer, builds its own tokenizer on first use.
    """

    def __init__(self, model: Model):
        self.model = model
        self._tok = None
        self._lent = False
        #: the pretokens each stage-1 encoder's cache may hold (``Plan.cache_entries``; None: its default)
        self.cache_entries: int | None = None

    def lend_from(self, tok: "StageAwareTokenizer", n: int = 1) -> None:
        """Encode with ``tok`` itself (when its stage-aware encoder is the thread-safe native one)."""
        if getattr(tok, "_native_stage", False) and tok._model is self.model:
            self._tok, self._lent = tok, True

    def release(self) -> None:
        """Nothing to give back (a lent tokenizer lends each call its own encoder), but a lent
        tokenizer's encoders get their own cache bound back (after the run: no thread encodes)."""
        if self._lent and self.cache_entries and self._tok._native_stage:
            self._tok._stage.native.size_caches(None)

    def __getstate__(self):
        return {"model": self.model, "cache_entries": self.cache_entries}

    def __setstate__(self, state):
        self.model = state["model"]
        self.cache_entries = state.get("cache_entries")
        self._tok = None
        self._lent = False

    def __copy__(self):
        """A spec for another thread: the lent tokenizer, or none yet (built on first use)."""
        new = object.__new__(type(self))
        new.model = self.model
        new._tok = self._tok if self._lent else None
        new._lent = self._lent
        new.cache_entries = self.cache_entries
        return new

    def iter_encode(self, buf, start: int, end: int):
        """Yield the uint32 ids of ``buf[start:end]`` (whole documents) in one block."""
        if self._tok is None:
            self._tok = StageAwareTokenizer(self.model)
        tok = self._tok
        if tok._native_stage:           # the bytes in place, no copy
            native = tok._stage.native
            if self.cache_entries:
                native.size_caches(self.cache_entries)
            view = memoryview(buf)
            if view.ndim == 1 and view.format in ("B", "b", "c") and view.c_contiguous:
                view = view.cast("B")
                # blocks of about STAGE_BLOCK_BYTES, each ending with a special token (none, a long
                # document: what is left), so a block's ids are copied into a small array and the
                # encoder keeps its buffer (a whole chunk's ids took fresh pages each time)
                table = native._tok._special_table
                pos = start
                while pos < end:
                    cut = table.cut_after(view, pos, pos + STAGE_BLOCK_BYTES, end) if table is not None else end
                    yield native.encode(view[pos:cut], True)
                    pos = cut
                return
        yield tok.encode_to_numpy(bytes(buf[start:end]))


def model_encoder(model: Model) -> "Callable[[bytes], list[int]]":
    """bpe_core's encode function for ``model``: the one that reproduces its training
    (:class:`StageAwareTokenizer` for a stage-aware method), what an export is checked against.
    A model made without a pattern encodes with GPT-2's, as its exports do.

    >>> vocab = {i: bytes([i]) for i in range(256)}; vocab[256] = b"ab"
    >>> model_encoder(Model(vocab=vocab, merges=[(b"a", b"b")]))(b"abc")
    [256, 99]
    """
    if registry.get(model.method).stage_aware:
        return StageAwareTokenizer(model).encode
    return Tokenizer(model.vocab, model.merges, model.special_tokens, model.pattern or "gpt2").encode
