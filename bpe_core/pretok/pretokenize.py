"""Pre-tokenization: bytes in, pretokens out, byte-identical to the ``regex`` module.

The truth for every pattern is ``regex`` with gap filling (``patterns.regex_pieces``)::

    text = data.decode("utf-8", "surrogateescape")
    pieces = the non-empty matches of regex.finditer(pattern, text) and the texts between them,
             each encoded back with surrogateescape

For the named patterns (``gpt2``, ``cl100k``, ``o200k`` and their tiktoken aliases, or their exact
regex strings; see ``patterns``) every text is covered by matches, and the native scanner in
``_pretok`` gives the same pieces straight from the UTF-8 bytes, ten to twenty times faster. Any
other pattern runs through ``regex`` itself, with identical output formats; text it does not match
becomes pretokens of its own, so nothing is ever dropped. Special tokens are split off first,
longest first, in both paths.

>>> pretokenize("Hello world<|endoftext|>  it's", special_tokens=["<|endoftext|>"])
[b'Hello', b' world', b'<|endoftext|>', b' ', b' it', b"'s"]
>>> pretokenize("Hello, world", pattern="[a-z]+")    # the gaps are pretokens too
[b'H', b'ello', b', ', b'world']
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Tuple, Union

from ..runtime.lazy import np  # numpy on first use (a small run never imports it)

from . import _pretok
from ._pretok import word_byte_classes, word_char_flags
from ..corpus.chunks import split_spans as _split_spans_regex
from ..corpus.specials import encode_specials, specials_regex, split_on_specials
from .patterns import pattern_name, regex_pieces, resolve_pattern

__all__ = ["PATTERN_IDS", "pretokenize", "pretoken_ends", "count_pretokens", "merge_counts", "is_native",
           "split_spans", "word_byte_classes", "word_char_flags"]

#: Pattern name -> the native scanner's id (for kernels that scan themselves, e.g. ``engine.units``).
PATTERN_IDS = dict(_pretok.PATTERN_IDS)

# (arena uint8, offsets int64 [n_words + 1], counts int64 [n_words]), words sorted by bytes.
CountArrays = Tuple["np.ndarray", "np.ndarray", "np.ndarray"]
# CountArrays + ids (uint32 [n_pretokens]): the row of every pretoken, in text order.
RecordedArrays = Tuple["np.ndarray", "np.ndarray", "np.ndarray", "np.ndarray"]
BufferLike = Union[bytes, bytearray, memoryview, "np.ndarray"]


# ==== Public ======================================================================================


def pretokenize(data: Union[str, bytes], pattern: str = "gpt2",
                special_tokens: Iterable[Union[str, bytes]] = ()) -> list[bytes]:
    """The pretokens of ``data`` in order, special tokens as their own items.

    Args:
        data: ``bytes`` (any bytes: invalid UTF-8 is kept, byte for byte) or ``str`` (encoded
            with ``surrogateescape``, so a ``str`` decoded that way round-trips).
        pattern: a name (``"gpt2"``, ``"cl100k"``, ``"o200k"``, tiktoken's ``"r50k_base"``,
            ``"p50k_base"``, ``"cl100k_base"``, ``"o200k_base"``; any case) or a custom ``regex``
            (it must contain a regex metacharacter; see ``patterns``). Text a custom regex does
            not match becomes pretokens of its own.
        special_tokens: split off first (longest first where they overlap); never pre-tokenized.

    Returns:
        ``list[bytes]`` whose concatenation is ``data``.

    Raises:
        ValueError: an unknown pattern name (the message lists the names), a regex that does not
            compile, an empty or repeated special token.

    >>> pretokenize(b"a  b")
    [b'a', b' ', b' b']
    >>> pretokenize("I'M fine", "gpt2"), pretokenize("I'M fine", "cl100k")
    ([b'I', b"'", b'M', b' fine'], [b'I', b"'M", b' fine'])
    """
    buf = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)
    specials = encode_specials(special_tokens)
    name = pattern_name(pattern)
    if name is not None:      # natively, list included: one bytes object per pretoken, built in C
        return _pretok.split_pieces(buf, _pretok.PATTERN_IDS[name], _special_spans(buf, specials))
    import regex                # a custom regex only (not imported with the package)

    compiled = regex.compile(resolve_pattern(pattern))
    out: list[bytes] = []
    for piece, is_special in split_on_specials(buf, specials):
        if is_special:
            out.append(piece)
        else:
            out.extend(regex_pieces(piece, compiled))
    return out


def _special_spans(buf: bytes, specials: list[bytes]) -> np.ndarray:
    """The ``[start, end)`` spans of the special tokens in ``buf`` (the left-to-right, longest-first
    scan of ``corpus.specials.split_on_specials``), as an int64 ``(k, 2)`` array.

    One special token (the usual case) is found natively (``_pretok.find_special``: ``memchr`` for
    its first byte, then ``memcmp``); several with the specials regex.

    >>> _special_spans(b"a<s>b<s>", [b"<s>"]).tolist()
    [[1, 4], [5, 8]]
    """
    if not specials:
        return np.zeros((0, 2), dtype=np.int64)
    if len(specials) == 1:
        return _pretok.find_special(buf, specials[0])
    rx = specials_regex(specials)
    return np.array([m.span() for m in rx.finditer(buf)], dtype=np.int64).reshape(-1, 2)


def split_spans(buf: BufferLike, start: int, end: int, special_tokens: Sequence[bytes],
                numpy: bool = True) -> tuple[np.ndarray, int]:
    """The text spans of ``buf[start:end]`` between special tokens, and how many special tokens.

    The spans are int64 ``(k, 2)`` rows ``[start, end)``, non-empty, in order; the special tokens
    are found left to right, longest first where they overlap, natively (``_pretok.special_spans``:
    ``memchr`` for the first byte they share, then ``memcmp``). What a training worker asks of a
    block before counting its pretokens.

    >>> spans, n = split_spans(b"<|e|>ab<|e|><|e|>c", 0, 18, [b"<|e|>"]); spans.tolist(), n
    ([[5, 7], [17, 18]], 3)

    Equivalent to ``corpus.chunks.split_spans`` (the ``re`` alternation of the tokens, longest
    first), which it falls back to for an empty token, and when not ``numpy`` (a flat int64
    ``array.array``, no numpy imported: a small run).
    """
    tokens = sorted(set(bytes(t) for t in special_tokens), key=lambda t: (-len(t), t))
    if not numpy or any(len(t) == 0 for t in tokens):
        return _split_spans_regex(buf, start, end, tokens, numpy=numpy)
    view = _as_uint8(buf)
    found = _pretok.special_spans(view, start, end, tokens)
    n = len(found)
    bounds = np.empty((n + 1, 2), dtype=np.int64)
    bounds[0, 0] = start
    bounds[1:, 0] = found[:, 1]
    bounds[:n, 1] = found[:, 0]
    bounds[n, 1] = end
    return bounds[bounds[:, 1] > bounds[:, 0]], n


def pretoken_ends(buf: BufferLike, pattern: str = "gpt2") -> np.ndarray:
    """End offsets (int64) of the pretokens of one text buffer (no special tokens in it).

    Pretoken k is ``buf[ends[k-1]:ends[k]]`` (``ends[-1] == len(buf)``). This is what the encoder
    walks: no ``bytes`` object per pretoken.

    >>> pretoken_ends(b"Hi  there!").tolist()
    [2, 3, 9, 10]
    """
    view = _as_uint8(buf)
    name = pattern_name(pattern)
    if name is not None:
        return _pretok.split_ends(view, _pretok.PATTERN_IDS[name])
    return _regex_ends(view, resolve_pattern(pattern))


def count_pretokens(buf: BufferLike, spans: np.ndarray, pattern: str = "gpt2",
                    record: bool = False, numpy: bool = True,
                    scratch: Optional["_pretok.CountScratch"] = None,
                    span_ends: Optional[np.ndarray] = None,
                    by_entry: bool = False) -> Union[CountArrays, RecordedArrays]:
    """Count the pretokens of the ``[start, end)`` rows of ``spans``: a sorted word table.

    Each span (the text between two special tokens, say) is pre-tokenized on its own. Returns
    ``(arena, offsets, counts)``: word i is ``arena[offsets[i]:offsets[i+1]]``, seen ``counts[i]``
    times; words are unique and sorted in ``bytes`` order, so tables merge with ``merge_counts``.
    With ``record=True`` it returns ``(arena, offsets, counts, ids)``: ``ids`` (uint32, one per
    pretoken, ``ids.size == counts.sum()``) is the row of each pretoken in text order (the spans
    in the order given, each left to right).

    >>> a, o, c = count_pretokens(b"to be or not to be", np.array([[0, 18]]))
    >>> [(bytes(a[o[i]:o[i + 1]]), int(c[i])) for i in range(len(c))]
    [(b' be', 2), (b' not', 1), (b' or', 1), (b' to', 1), (b'to', 1)]
    >>> a, o, c, ids = count_pretokens(b"to be or not to be", np.array([[0, 18]]), record=True)
    >>> ids.tolist()
    [4, 0, 2, 1, 3, 0]

    ``span_ends`` (with ``record``: an int64 array, one entry per span) is filled with where each
    span's pretokens end in ``ids``:

    >>> ends = np.empty(2, np.int64)
    >>> _ = count_pretokens(b"to be or", np.array([[0, 5], [5, 8]]), record=True, span_ends=ends)
    >>> ends.tolist()
    [2, 3]

    ``by_entry`` (with ``record``): ``ids`` number the words in the order each was first seen (a
    custom regex: in table order), and a fifth array, ``id_rows``, gives each one's row
    (``id_rows[ids]`` are the rows above).

    ``numpy=False`` (a named pattern, no ``record``): ``buf`` a ``bytes``-like object, ``spans`` a
    ``(k, 2)`` int64 buffer (a cast ``memoryview``), the table in ``array.array`` (``"B"``, ``"q"``,
    ``"q"``): numpy is not imported (a small run, ``pretok.counting``).

    ``scratch`` (a ``_pretok.CountScratch``; a named pattern, no ``record``): the native counter's
    hash tables are kept in it from call to call (a worker counting chunk after chunk allocates them
    once); the table returned is the same.
    """
    if not numpy:
        return _pretok.count_pretokens(buf, spans, _pretok.PATTERN_IDS[pattern_name(pattern)], numpy=False)
    view = _as_uint8(buf)
    spans = np.ascontiguousarray(spans, dtype=np.int64)
    if spans.size == 0:
        spans = spans.reshape(0, 2)
    if spans.ndim != 2 or spans.shape[1] != 2:
        raise ValueError(f"spans must have shape (k, 2), got {spans.shape}")
    name = pattern_name(pattern)
    if name is not None:
        return _pretok.count_pretokens(view, spans, _pretok.PATTERN_IDS[name], record=record,
                                       scratch=None if record else scratch, span_ends=span_ends,
                                       by_entry=by_entry)
    if by_entry and not record:
        raise ValueError("count_pretokens: by_entry needs record=True")
    out = _regex_count(view, spans, resolve_pattern(pattern), record)
    if span_ends is not None:
        if not record or span_ends.shape != (spans.shape[0],):
            raise ValueError("count_pretokens: span_ends needs record=True and one entry per span")
        # the pretokens cover each span exactly: a span ends after the pretokens of its bytes
        covered = np.cumsum(np.diff(out[1])[out[3]])
        span_ends[:] = np.searchsorted(covered, np.cumsum(spans[:, 1] - spans[:, 0]), side="right")
    if by_entry:
        return out + (np.arange(len(out[2]), dtype=np.uint32),)
    return out


def merge_counts(tables: Sequence[CountArrays], threads: int = 1) -> CountArrays:
    """Sum sorted word tables (``count_pretokens`` results) into one, by a k-way merge (with
    ``threads=2``, of 64k words or more, the two halves of the words on two threads: the same table).

    >>> t1 = count_pretokens(b"a b", np.array([[0, 3]]))
    >>> t2 = count_pretokens(b"b a", np.array([[0, 3]]))
    >>> a, o, c = merge_counts([t1, t2])
    >>> [(bytes(a[o[i]:o[i + 1]]), int(c[i])) for i in range(len(c))]
    [(b' a', 1), (b' b', 1), (b'a', 1), (b'b', 1)]
    """
    return _pretok.merge_counts(list(tables), threads)


def is_native(pattern: str) -> bool:
    """Whether ``pattern`` runs on the native scanner (else on ``regex``).

    >>> is_native("o200k"), is_native(r"\\w+|\\W")
    (True, False)
    """
    return pattern_name(pattern) is not None


# ==== Private: the regex path (any other pattern) =================================================


def _as_uint8(buf: BufferLike) -> np.ndarray:
    """A C-contiguous uint8 view of ``buf`` (no copy for bytes, memoryviews and uint8 arrays)."""
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise TypeError(f"expected a 1-D uint8 array, got {buf.dtype} with shape {buf.shape}")
        return np.ascontiguousarray(buf)
    return np.frombuffer(buf, dtype=np.uint8)


def _regex_pieces(data: bytes, pattern: str) -> list[bytes]:
    """The truth: ``regex.finditer`` over the surrogateescape-decoded text, gaps filled."""
    import regex

    return regex_pieces(data, regex.compile(pattern))


def _regex_ends(view: np.ndarray, pattern: str) -> np.ndarray:
    lengths = [len(p) for p in _regex_pieces(view.tobytes(), pattern)]
    return np.cumsum(np.array(lengths, dtype=np.int64), dtype=np.int64)


def _regex_count(view: np.ndarray, spans: np.ndarray, pattern: str,
                 record: bool = False) -> Union[CountArrays, RecordedArrays]:
    counts: dict[bytes, int] = {}
    seen: list[bytes] = []
    n = view.shape[0]
    for k, (start, end) in enumerate(spans.tolist()):
        if not 0 <= start <= end <= n:
            raise ValueError(f"span {k} = [{start}, {end}) is not inside the buffer of {n} bytes")
        for piece in _regex_pieces(view[start:end].tobytes(), pattern):
            counts[piece] = counts.get(piece, 0) + 1
            if record:
                seen.append(piece)
    words = sorted(counts)
    lengths = np.array([len(w) for w in words], dtype=np.int64)
    offsets = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    arena = np.frombuffer(b"".join(words), dtype=np.uint8).copy()
    table = arena, offsets, np.array([counts[w] for w in words], dtype=np.int64)
    if not record:
        return table
    row = {w: i for i, w in enumerate(words)}
    return table + (np.array([row[p] for p in seen], dtype=np.uint32),)
