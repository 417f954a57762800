"""The texts of a model folder's files, made with a few passes in C over the whole vocabulary.

``vocab.json``, ``merges.txt``, ``model.json`` and HF's ``tokenizer.json`` all list every token
(as its GPT-2 string or its hex) and every merge. The plain way, a Python expression per token and
per merge, cost more than the training itself on a small run (0.3 s of writing for 0.15 s of
merges on 1 MB). Here the GPT-2 strings of a block of tokens are one text: all their bytes mapped
at once by ``codecs.charmap_decode`` with the 256 GPT-2 characters as its table, a separator after
each token (a byte value no token of the block holds, decoded as the separator: ``_gpt2_joined``;
``merges.txt``'s lines come out whole, space and newline included);
a JSON object's items are one ``str.join`` over a list filled by slice assignments
(``_interleaved``); ``tokenizer.json``'s merges are ``merges.txt``'s lines (made once) rewritten
by four ``str.replace`` calls (a GPT-2 string holds neither a space nor a newline, and only ``"``
and ``\\`` need a JSON escape: every other character of the alphabet is printable).

The long lists come as pieces of :data:`BLOCK` entries that a writer writes one after another
(``formats.model.write_pieces``): the whole text of a file is never held at once, nor a string per
entry of the whole list (a lower peak than one ``json.dumps``). A block of long tokens
(:data:`LONG_TOKEN_BYTES` or more on average: what a corpus of one repeated byte builds) is written
token by token, and each token in slices of :data:`PIECE_BYTES` of its bytes (hex made by
``binascii.hexlify``, GPT-2 strings by ``codecs.charmap_decode``; a slice of printable ASCII with
nothing to escape is its own UTF-8 text and is written as it is): writing holds one slice, never a
token's whole text. Pieces are ``str`` or ``bytes`` (UTF-8); :func:`join_pieces` makes one text.

What the plain writers wrote is kept, byte for byte (``tests/formats/test_folder_texts.py`` holds
them as references, property-tested over random vocabularies): a model the fast paths do not
cover (two ids holding the same bytes, a merge HF cannot use) takes the plain path for that part.
"""
from __future__ import annotations

import binascii
import codecs
import itertools
import json
import operator
from functools import lru_cache
from json.encoder import encode_basestring
from operator import itemgetter
from typing import Any, Iterable, Iterator, Sequence

__all__ = ["BLOCK", "FolderTexts", "bytes_to_unicode", "gpt2_name_list", "join_pieces", "merges_hex_pieces",
           "merges_hex_text", "token_hex_pieces", "unicode_to_bytes"]

#: Entries (tokens or merges) per piece of text.
BLOCK = 4096
#: Tokens this long on average (a corpus of one repeated byte builds tokens as long as the run) are
#: mapped and escaped one by one: joining them into one text and splitting it again copies each
#: several times (50 MB of ``a``: ~20 s of 80 writing a folder of 600 MB of tokens).
LONG_TOKEN_BYTES = 1024
#: Bytes of a long token mapped (to hex or its GPT-2 string) and written at a time.
PIECE_BYTES = 1 << 20
#: The bytes whose GPT-2 character is themselves (printable ASCII) and needs no JSON escape (all but
#: ``"`` and ``\\``); ``_PLAIN_TEXT``: the same for a text that escapes nothing (``merges.txt``).
_PLAIN_TEXT = bytes(range(0x21, 0x7F))
_PLAIN_JSON = _PLAIN_TEXT.replace(b'"', b"").replace(b"\\", b"")

_LEFT, _RIGHT = itemgetter(0), itemgetter(1)


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


@lru_cache(maxsize=None)
def _decoding_table() -> str:
    """The 256 GPT-2 characters, byte value -> character (``codecs.charmap_decode``'s fast table)."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in range(256))


def join_pieces(pieces: Iterable["str | bytes"]) -> str:
    """One text from pieces of ``str`` and UTF-8 ``bytes`` (what the writers write one after another).

    >>> join_pieces(["[", b"61", "]"])
    '[61]'
    """
    return "".join(p if isinstance(p, str) else p.decode("utf-8") for p in pieces)


def _is_long(tokens: Sequence[bytes]) -> bool:
    """Whether a block's tokens are long (:data:`LONG_TOKEN_BYTES` or more on average): written one by one."""
    return sum(map(len, tokens)) >= LONG_TOKEN_BYTES * len(tokens)


def _pairs_long(block: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether the tokens a block of merges builds are long (as :func:`_is_long`, without building them)."""
    return sum(map(len, map(_LEFT, block))) + sum(map(len, map(_RIGHT, block))) >= LONG_TOKEN_BYTES * len(block)


def _gpt2_pieces(token: bytes, escape: bool) -> Iterator["str | bytes"]:
    """``token``'s GPT-2 string (escaped for JSON when ``escape``), :data:`PIECE_BYTES` bytes of it at
    a time: a slice whose bytes are all their own characters as it is (UTF-8 already), else mapped.

    >>> list(_gpt2_pieces(b'ab"c', True)), list(_gpt2_pieces(b"ab", True)), list(_gpt2_pieces(b"", True))
    (['ab\\\\"c'], [b'ab'], [])
    """
    plain = _PLAIN_JSON if escape else _PLAIN_TEXT
    table = _decoding_table()
    for k in range(0, len(token), PIECE_BYTES):
        part = token[k:k + PIECE_BYTES]
        if not part.translate(None, plain):
            yield part
            continue
        name = codecs.charmap_decode(part, None, table)[0]
        if escape and ('"' in name or "\\" in name):
            name = name.replace("\\", "\\\\").replace('"', '\\"')
        yield name


def _hex_pieces(token: bytes) -> Iterator[bytes]:
    """``token.hex()`` as ASCII bytes, :data:`PIECE_BYTES` bytes of the token at a time.

    >>> list(_hex_pieces(b"\\x00a"))
    [b'0061']
    """
    view = memoryview(token)
    for k in range(0, len(token), PIECE_BYTES):
        yield binascii.hexlify(view[k:k + PIECE_BYTES])


def gpt2_name_list(tokens: Iterable[bytes]) -> list[str]:
    """Each token's GPT-2 string (``formats.model.token_to_gpt2``), in order.

    >>> gpt2_name_list([b" the", b"\\n", bytes([0, 255])])
    ['Ġthe', 'Ċ', 'Āÿ']
    """
    tokens = tokens if isinstance(tokens, list) else list(tokens)
    if len(tokens) < 64 or sum(map(len, tokens)) >= LONG_TOKEN_BYTES * len(tokens):
        return list(map(_LEFT, map(codecs.charmap_decode, tokens, itertools.repeat(None),
                                   itertools.repeat(_decoding_table()))))
    return _gpt2_joined(tokens, (0,))[:-1].split("\0")         # (\0 is in no GPT-2 string)


def _gpt2_joined(tokens: list[bytes], seps: tuple[int, ...]) -> str:
    """The GPT-2 strings of ``tokens``, each followed by a separator character (the code points in
    ``seps``, taken in turn; none of them a GPT-2 character): one text, made by one
    ``codecs.charmap_decode`` of all the bytes (no string per token, no numpy).

    The tokens are joined with a mark after each: a byte value that occurs in none of them (one
    per separator), which the decoding table maps to its separator. A block where fewer byte values
    are free (the 256 single bytes are in the first block of a vocabulary) decodes token by token.

    >>> _gpt2_joined([b" a", b"b", b"\\n"], (0x20, 0x0A))
    'Ġa b\\nĊ '
    """
    if not tokens:
        return ""
    blob = b"".join(tokens)
    free = _free_byte_values(blob, len(seps))
    if free is None:
        names = map(_LEFT, map(codecs.charmap_decode, tokens, itertools.repeat(None),
                               itertools.repeat(_decoding_table())))
        return "".join(itertools.chain.from_iterable(zip(names, itertools.cycle(map(chr, seps)))))
    table = list(_decoding_table())
    for b, sep in zip(free, seps):
        table[b] = chr(sep)
    marks = [bytes((b,)) for b in free]
    joined = marks[0].join(tokens) + marks[0] if len(marks) == 1 else \
        b"".join(itertools.chain.from_iterable(zip(tokens, itertools.cycle(marks))))
    return codecs.charmap_decode(joined, None, "".join(table))[0]


def _free_byte_values(blob: bytes, k: int) -> list[int] | None:
    """``k`` byte values absent from ``blob`` (control bytes first: text rarely holds them), or
    None when there are fewer than ``k``.

    >>> _free_byte_values(b"abc", 2), _free_byte_values(bytes(range(256)), 1)
    ([0, 1], None)
    """
    free: list[int] = []
    for b in _MARK_ORDER:
        if bytes((b,)) not in blob:
            free.append(b)
            if len(free) == k:
                return free
    return None


#: The order in which byte values are tried as marks: those text holds least often first.
_MARK_ORDER = (*range(0, 9), 11, 12, *range(14, 32), 127, *range(192, 194), *range(245, 256), *range(128, 192),
               *range(194, 245), 9, 10, 13, *range(32, 127))


def _json_object_indent0(entries: dict[str, int]) -> str:
    """``json.dumps(entries, ensure_ascii=False, indent=0)``, with the C encoder (an indent makes json
    use its Python encoder): a flat object is ``{``, one ``"key": value`` a line, ``}``.

    >>> d = {"a": 1, "\\"\\n": 2, "Ġé": 3}
    >>> _json_object_indent0(d) == json.dumps(d, ensure_ascii=False, indent=0), _json_object_indent0({})
    (True, '{}')
    """
    text = json.dumps(entries, ensure_ascii=False, separators=(",\n", ": "))
    return "{\n" + text[1:-1] + "\n}" if entries else text


def _blocks(n: int) -> range:
    return range(0, n, BLOCK)


def _escaped(names: list[str]) -> list[str]:
    """GPT-2 strings as JSON escapes them, without the quotes: only ``"`` and ``\\`` change (the
    alphabet has no control character), done on all of them at once (``\\0`` is in no GPT-2 string);
    the same list when nothing changes."""
    if sum(map(len, names)) >= LONG_TOKEN_BYTES * len(names):      # long names: no copy of those kept
        if not any('"' in n or "\\" in n for n in names):
            return names
        return [n.replace("\\", "\\\\").replace('"', '\\"') if '"' in n or "\\" in n else n for n in names]
    joined = "\0".join(names)
    if '"' not in joined and "\\" not in joined:
        return names
    return joined.replace("\\", "\\\\").replace('"', '\\"').split("\0")


def _interleaved(keys: list[str], between: str, values: list[str], after: str) -> str:
    """``key0 between value0 after key1 between value1 ...`` without the last ``after``: one
    ``str.join`` over a list filled by slice assignments (no string or tuple per entry)."""
    n = len(keys)
    if not n:
        return ""
    parts: list = [after] * (4 * n)
    parts[0::4] = keys
    parts[1::4] = [between] * n
    parts[2::4] = values
    parts.pop()
    return "".join(parts)


def _json_item_pieces(tokens: Sequence[bytes], values: Sequence[int], item_sep: str, skip=()) -> Iterator[str]:
    """The inside of a JSON object's text without its braces, in pieces: ``"gpt2 string": value``
    items, separated by ``item_sep``; the entries at the positions in ``skip`` left out. The GPT-2
    strings are made a block at a time (never all at once)."""
    sep = item_sep + '"'
    first = True
    for k in _blocks(len(tokens)):
        block_tokens, block_values = tokens[k:k + BLOCK], values[k:k + BLOCK]
        out = [i - k for i in skip if k <= i < k + BLOCK]
        if out:
            keep = [True] * len(block_tokens)
            for i in out:
                keep[i] = False
            block_tokens = list(itertools.compress(block_tokens, keep))
            block_values = list(itertools.compress(block_values, keep))
            if not block_tokens:
                continue
        if _is_long(block_tokens):        # one token at a time, each in slices
            for token, value in zip(block_tokens, block_values):
                yield '"' if first else sep
                yield from _gpt2_pieces(token, True)
                yield '": ' + str(value)
                first = False
            continue
        keys = _escaped(gpt2_name_list(block_tokens))
        yield ('"' if first else sep) + _interleaved(keys, '": ', list(map(str, block_values)), sep)
        first = False


def merges_hex_pieces(merges: Sequence[tuple[bytes, bytes]]) -> Iterator[str]:
    """``model.json``'s ``merges`` value, ``[["6162","63"],...]``, in pieces (hex needs no escape)."""
    if not merges:
        yield "[]"
        return
    for k in _blocks(len(merges)):
        block = merges[k:k + BLOCK]
        if _pairs_long(block):
            for j, (left, right) in enumerate(block):
                yield '[["' if k + j == 0 else '"],["'
                yield from _hex_pieces(left)
                yield '","'
                yield from _hex_pieces(right)
            continue
        yield ('[["' if k == 0 else '"],["') + '"],["'.join(map('","'.join, zip(map(bytes.hex, map(_LEFT, block)),
                                                                              map(bytes.hex, map(_RIGHT, block)))))
    yield '"]]'


def merges_hex_text(merges: Sequence[tuple[bytes, bytes]]) -> str:
    """``model.json``'s ``merges`` value.

    >>> merges_hex_text([(b"a", b"b"), (b" ", b"t")]), merges_hex_text([])
    ('[["61","62"],["20","74"]]', '[]')
    """
    return "".join(merges_hex_pieces(merges))


def token_hex_pieces(tokens: Sequence[bytes]) -> Iterator[str]:
    """``model.json``'s ``vocab`` value, ``["61","6162",...]``, in pieces."""
    if not tokens:
        yield "[]"
        return
    for k in _blocks(len(tokens)):
        block = tokens[k:k + BLOCK]
        if _is_long(block):
            for j, token in enumerate(block):
                yield '["' if k + j == 0 else '","'
                yield from _hex_pieces(token)
            continue
        yield ('["' if k == 0 else '","') + '","'.join(map(bytes.hex, block))
    yield '"]'


def _merge_lines(block: Sequence[tuple[bytes, bytes]]) -> str:
    """``merges.txt``'s lines of ``block``, each with its newline."""
    if len(block) < 32:
        return _interleaved(gpt2_name_list(map(_LEFT, block)), " ", gpt2_name_list(map(_RIGHT, block)), "\n") + "\n"
    return _gpt2_joined(list(itertools.chain.from_iterable(block)), (0x20, 0x0A))


def _gpt2_bytes(text: str) -> bytes | None:
    """The bytes whose GPT-2 string is ``text``; None when a character is outside the alphabet."""
    table = unicode_to_bytes()
    try:
        return bytes(map(table.__getitem__, text))
    except KeyError:
        return None


class FolderTexts:
    """The texts of one model's files, sharing what they have in common (the GPT-2 strings).

    ``vocab``: id -> bytes (any ids); ``merges``: ``(left, right)`` pairs. ``vocab_json()``,
    ``merges_txt()`` are ``formats.model.dump_gpt2``'s files; ``hf_vocab_and_merges(model)`` the two
    long values of ``tokenizer.json`` (``formats.hf``). Texts come in pieces (see the module).
    """

    def __init__(self, vocab: dict[int, bytes], merges: Sequence[tuple[bytes, bytes]]):
        ids = list(vocab)
        in_order = ids == list(range(len(ids)))          # (what training makes: one C comparison)
        if not in_order:
            try:
                in_order = all(map(operator.lt, ids, ids[1:]))
            except TypeError:
                in_order = False
        if not in_order:
            ids = sorted(vocab)
        self.ids = ids
        self.tokens = list(vocab.values()) if in_order else [vocab[i] for i in ids]
        self.merges = merges
        #: no two ids hold the same bytes (nor, then, the same GPT-2 string)
        self._token_set = set(self.tokens)
        self.distinct = len(self._token_set) == len(ids)
        #: the bytes of all the tokens
        self.n_bytes = sum(map(len, self.tokens))
        #: merges.txt's lines, a text per block, once made (tokenizer.json's merges rewrite them)
        self._merge_blocks: tuple[int, list] | None = None

    # ---- vocab.json + merges.txt -------------------------------------------------------------

    def vocab_json(self) -> tuple[Iterable[str], list[bytes]]:
        """``vocab.json``'s text without its final newline, in pieces (``json.dumps(entries,
        ensure_ascii=False, indent=0)``; the smaller id keeps a string two ids hold), and the bytes
        left out that way."""
        if self.distinct:
            if not self.ids:
                return ["{}"], []
            return itertools.chain(["{\n"], _json_item_pieces(self.tokens, self.ids, ",\n"), ["\n}"]), []
        entries: dict[str, int] = {}
        dropped: list[bytes] = []
        for i, key, token in zip(self.ids, gpt2_name_list(self.tokens), self.tokens):
            if key in entries:
                dropped.append(token)
                continue
            entries[key] = i
        return [_json_object_indent0(entries)], dropped

    def merges_txt(self) -> Iterator[str]:
        """``merges.txt``'s text, in pieces (kept, once all are made, for ``tokenizer.json``'s merges)."""
        yield "#version: 0.2\n"
        made, block = [], BLOCK
        for k in range(0, len(self.merges), block):
            merges = self.merges[k:k + block]
            if _pairs_long(merges):         # one merge at a time, each token in slices (not kept)
                made.append(None)
                for left, right in merges:
                    yield from _gpt2_pieces(left, False)
                    yield " "
                    yield from _gpt2_pieces(right, False)
                    yield "\n"
                continue
            lines = _merge_lines(merges)
            made.append(lines)
            yield lines
        self._merge_blocks = (block, made)

    # ---- tokenizer.json ----------------------------------------------------------------------

    def hf_vocab_and_merges(self, model: Any) -> tuple[Iterable[str], Iterable[str], dict[str, int]] | None:
        """``tokenizer.json``'s ``vocab`` and ``merges`` values as text in pieces (``json.dumps(...,
        ensure_ascii=False)`` of ``formats.hf``'s) and the special tokens' ids (``hf.special_ids``),
        or None when this model needs the plain path: two ids hold the same bytes, ids are not
        ``0..n-1``, a special token is no token of its own above 255, or not every merge is one HF
        can use (``formats.hf.usable_merges``)."""
        n = len(self.ids)
        if not self.distinct or self.ids != list(range(n)):
            return None
        tokens = self.tokens
        specials = list(dict.fromkeys(model.special_tokens))
        special_bytes = [s.encode("utf-8") for s in specials]
        special_id = {}
        for s, b in zip(specials, special_bytes):
            try:
                i = tokens.index(b)       # (the ids are 0..n-1: an id is its position)
            except ValueError:
                return None
            if i < 256:
                return None
            special_id[s] = i
        skipped = set(special_id.values())
        merges = self.merges
        if merges and not self._hf_uses_every_merge(special_bytes):
            return None
        # an ordinary token whose GPT-2 string is a special token's text keeps it (``dict.setdefault``)
        added = []
        for s, i in sorted(special_id.items(), key=itemgetter(1)):
            b = _gpt2_bytes(s)            # the bytes whose GPT-2 string is s, if any
            j = tokens.index(b) if b is not None and b in self._token_set else None
            if j is None or j in skipped:
                added.append(encode_basestring(s) + ": " + str(i))
        some = n > len(skipped)           # ordinary tokens (the vocab is not the special tokens alone)
        vocab = itertools.chain(["{"], _json_item_pieces(tokens, self.ids, ", ", skip=skipped),
                                [(", " if some else "") + ", ".join(added) if added else "", "}"])
        return vocab, self._hf_merge_pieces(), special_id

    def _hf_uses_every_merge(self, special_bytes: list[bytes]) -> bool:
        """Whether ``formats.hf.usable_merges`` keeps every merge (no pair twice, every part an
        ordinary token), checked without a set of the pairs when the layout is the native one (each
        merge builds the token of its id, ids in merge order: the tokens being distinct, so are the
        pairs)."""
        merges, tokens = self.merges, self.tokens
        parts = itertools.chain.from_iterable
        ordinary = self._token_set
        removed = [b for b in special_bytes if b in ordinary]
        ordinary.difference_update(removed)          # (for the check only: put back below)
        try:
            if not all(map(ordinary.__contains__, parts(merges))):
                return False
            base = len(tokens) - len(merges)
            native = base >= 256 and all(map(operator.eq, map(operator.add, map(_LEFT, merges), map(_RIGHT, merges)),
                                             itertools.islice(tokens, base, None)))
            return native or len(set(merges)) == len(merges)
        except TypeError:                 # a pair given as a list: the plain path
            return False
        finally:
            ordinary.update(removed)

    def _hf_merge_pieces(self) -> Iterator[str]:
        """``tokenizer.json``'s merges, ``["Ġ t", ...]``: ``merges.txt``'s lines as JSON strings (the
        form every HF ``tokenizers`` reads: 0.19, which ``transformers`` 4.40-4.44 need, does not
        read pairs ``[["Ġ", "t"], ...]``; a GPT-2 token string holds no space)."""
        if not self.merges:
            yield "[]"
            return
        block, made = self._merge_blocks or (BLOCK, None)
        self._merge_blocks = None          # (each block is freed once it is written)
        for n, k in enumerate(range(0, len(self.merges), block)):
            merges = self.merges[k:k + block]
            if _pairs_long(merges):         # (merges_txt kept no lines of them)
                for j, (left, right) in enumerate(merges):
                    yield '["' if k + j == 0 else '", "'
                    yield from _gpt2_pieces(left, True)
                    yield " "
                    yield from _gpt2_pieces(right, True)
                continue
            lines = made[n] if made is not None else _merge_lines(merges)
            if made is not None:
                made[n] = None
            lines = lines[:-1]
            if '"' in lines or "\\" in lines:
                lines = lines.replace("\\", "\\\\").replace('"', '\\"')
            yield ('["' if k == 0 else '", "') + lines.replace("\n", '", "')
        yield '"]'
