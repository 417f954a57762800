"""The texts of a model folder's files, made with a few passes in C over the whole vocabulary.

``vocab.json``, ``merges.txt``, ``model.json`` and HF's ``tokenizer.json`` all list every token
(as its GPT-2 string or its hex) and every merge. The plain way, a Python expression per token and
per merge, cost more than the training itself on a small run (0.3 s of writing for 0.15 s of
merges on 1 MB). Here each token's GPT-2 string is made once (``codecs.charmap_decode`` with the
256-character table) and shared by the files; the long lists are ``str.join`` over ``map`` (the
loop runs in C), and ``tokenizer.json``'s merges are ``merges.txt``'s lines rewritten by four
``str.replace`` calls (a GPT-2 string holds neither a space nor a newline, and only ``"`` and
``\\`` need a JSON escape: every other character of the alphabet is printable).

The long lists come as pieces of :data:`BLOCK` entries that a writer writes one after another
(``formats.model._write_pieces``): the whole text of a file is never held at once, nor a string per
entry of the whole list (a lower peak than one ``json.dumps``).

What the plain writers wrote is kept, byte for byte (``tests/formats/test_folder_texts.py`` holds
them as references, property-tested over random vocabularies): a model the fast paths do not
cover (two ids holding the same bytes, a merge HF cannot use) takes the plain path for that part.
"""
from __future__ import annotations

import codecs
import itertools
import operator
from functools import lru_cache
from json.encoder import encode_basestring
from operator import itemgetter
from typing import Any, Iterable, Iterator, Sequence

__all__ = ["BLOCK", "FolderTexts", "gpt2_name_list", "merges_hex_pieces", "merges_hex_text"]

#: Entries (tokens or merges) per piece of text.
BLOCK = 4096

_LEFT, _RIGHT = itemgetter(0), itemgetter(1)


@lru_cache(maxsize=None)
def _decoding_table() -> str:
    """The 256 GPT-2 characters, byte value -> character (``codecs.charmap_decode``'s fast table)."""
    from .model import bytes_to_unicode

    table = bytes_to_unicode()
    return "".join(table[b] for b in range(256))


def gpt2_name_list(tokens: Iterable[bytes]) -> list[str]:
    """Each token's GPT-2 string (``formats.model.token_to_gpt2``), in order.

    >>> gpt2_name_list([b" the", b"\\n", bytes([0, 255])])
    ['Ġthe', 'Ċ', 'Āÿ']
    """
    return list(map(_LEFT, map(codecs.charmap_decode, tokens, itertools.repeat(None),
                               itertools.repeat(_decoding_table()))))


def _blocks(n: int) -> range:
    return range(0, n, BLOCK)


def _json_item_pieces(keys: Sequence[str], values: Sequence[int], item_sep: str) -> Iterator[str]:
    """The inside of a JSON object's text without its braces, in pieces: ``"key": value`` items
    (keys already escaped), separated by ``item_sep``."""
    sep = item_sep + '"'
    for k in _blocks(len(keys)):
        yield ('"' if k == 0 else sep) + sep.join(map('": '.join, zip(keys[k:k + BLOCK],
                                                                    map(str, values[k:k + BLOCK]))))


def merges_hex_pieces(merges: Sequence[tuple[bytes, bytes]]) -> Iterator[str]:
    """``model.json``'s ``merges`` value, ``[["6162","63"],...]``, in pieces (hex needs no escape)."""
    if not merges:
        yield "[]"
        return
    for k in _blocks(len(merges)):
        block = merges[k:k + BLOCK]
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
        yield ('["' if k == 0 else '","') + '","'.join(map(bytes.hex, tokens[k:k + BLOCK]))
    yield '"]'


def _merge_lines(block: Sequence[tuple[bytes, bytes]]) -> str:
    """``merges.txt``'s lines of ``block``, joined by newlines (no final newline)."""
    table, repeat = _decoding_table(), itertools.repeat
    decode = codecs.charmap_decode
    return "\n".join(map(" ".join, zip(map(_LEFT, map(decode, map(_LEFT, block), repeat(None), repeat(table))),
                                       map(_LEFT, map(decode, map(_RIGHT, block), repeat(None), repeat(table))))))


class FolderTexts:
    """The texts of one model's files, sharing what they have in common (the GPT-2 strings).

    ``vocab``: id -> bytes (any ids); ``merges``: ``(left, right)`` pairs. ``vocab_json()``,
    ``merges_txt()`` are ``formats.model.dump_gpt2``'s files; ``hf_vocab_and_merges(model)`` the two
    long values of ``tokenizer.json`` (``formats.hf``). Texts come in pieces (see the module).
    """

    def __init__(self, vocab: dict[int, bytes], merges: Sequence[tuple[bytes, bytes]]):
        ids = list(vocab)
        try:
            in_order = all(map(operator.lt, ids, ids[1:]))
        except TypeError:
            in_order = False
        if not in_order:
            ids = sorted(vocab)
        self.ids = ids
        self.tokens = list(vocab.values()) if in_order else [vocab[i] for i in ids]
        self.merges = merges
        self.names = gpt2_name_list(self.tokens)
        #: no two ids hold the same bytes (nor, then, the same GPT-2 string)
        self.distinct = len(set(self.tokens)) == len(ids)
        self._escaped: list[str] | None = None

    @property
    def escaped(self) -> list[str]:
        """The GPT-2 strings as JSON escapes them, without the quotes (only ``"`` and ``\\\\`` change:
        the alphabet has no control character); the same strings where nothing changes."""
        if self._escaped is None:
            names = self.names
            if any(map(operator.contains, names, itertools.repeat('"'))) or \
                    any(map(operator.contains, names, itertools.repeat("\\"))):
                self._escaped = [encode_basestring(n)[1:-1] if '"' in n or "\\" in n else n for n in names]
            else:
                self._escaped = names
        return self._escaped

    # ---- vocab.json + merges.txt -------------------------------------------------------------

    def vocab_json(self) -> tuple[Iterable[str], list[bytes]]:
        """``vocab.json``'s text without its final newline, in pieces (``json.dumps(entries,
        ensure_ascii=False, indent=0)``; the smaller id keeps a string two ids hold), and the bytes
        left out that way."""
        if self.distinct:
            if not self.ids:
                return ["{}"], []
            return itertools.chain(["{\n"], _json_item_pieces(self.escaped, self.ids, ",\n"), ["\n}"]), []
        entries: dict[str, int] = {}
        dropped: list[bytes] = []
        for i, key, token in zip(self.ids, self.names, self.tokens):
            if key in entries:
                dropped.append(token)
                continue
            entries[key] = i
        from .model import _json_object_indent0

        return [_json_object_indent0(entries)], dropped

    def merges_txt(self) -> Iterator[str]:
        """``merges.txt``'s text, in pieces."""
        yield "#version: 0.2\n"
        for k in _blocks(len(self.merges)):
            yield _merge_lines(self.merges[k:k + BLOCK]) + "\n"

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
        tokens, names = self.tokens, self.names
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
        if merges:
            try:
                if len(set(merges)) != len(merges):
                    return None
            except TypeError:             # a pair given as a list: the plain path
                return None
            ordinary = set(tokens).difference(special_bytes)
            if not ordinary.issuperset(itertools.chain.from_iterable(merges)):
                return None
            del ordinary
        # an ordinary token whose GPT-2 string is a special token's text keeps it (``dict.setdefault``)
        index = dict(zip(names, self.ids)) if len(specials) > 16 else None
        added = []
        for s, i in sorted(special_id.items(), key=itemgetter(1)):
            if index is not None:
                j = index.get(s)
            else:
                try:
                    j = names.index(s)
                except ValueError:
                    j = None
            if j is None or j in skipped:
                added.append(encode_basestring(s) + ": " + str(i))
        del index
        keys, values = self.escaped, self.ids
        if skipped:
            keep = [True] * n
            for i in skipped:
                keep[i] = False
            keys = list(itertools.compress(keys, keep))
            values = list(itertools.compress(values, keep))
        vocab = itertools.chain(["{"], _json_item_pieces(keys, values, ", "),
                                [(", " if keys else "") + ", ".join(added) if added else "", "}"])
        return vocab, self._hf_merge_pieces(), special_id

    def _hf_merge_pieces(self) -> Iterator[str]:
        """``tokenizer.json``'s merges, ``[["Ġ", "t"], ...]``: ``merges.txt``'s lines rewritten."""
        if not self.merges:
            yield "[]"
            return
        for k in _blocks(len(self.merges)):
            lines = _merge_lines(self.merges[k:k + BLOCK])
            if '"' in lines or "\\" in lines:
                lines = lines.replace("\\", "\\\\").replace('"', '\\"')
            yield ('[["' if k == 0 else '"], ["') + lines.replace(" ", '", "').replace("\n", '"], ["')
        yield '"]]'
