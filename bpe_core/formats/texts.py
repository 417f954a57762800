"""The texts of a model folder's files, made with a few passes in C over the whole vocabulary.

``vocab.json``, ``merges.txt``, ``model.json`` and HF's ``tokenizer.json`` all list every token
(as its GPT-2 string or its hex) and every merge. The plain way, a Python expression per token and
per merge, cost more than the training itself on a small run (0.3 s of writing for 0.15 s of
merges on 1 MB). Here each token's GPT-2 string is made once (``codecs.charmap_decode`` with the
256-character table) and shared by the files; the long lists are ``str.join`` over ``map`` (the
loop runs in C), and ``tokenizer.json``'s merges are ``merges.txt``'s lines rewritten by four
``str.replace`` calls (a GPT-2 string holds neither a space nor a newline, and only ``"`` and
``\\`` need a JSON escape: every other character of the alphabet is printable).

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
from typing import Any, Iterable, Sequence

__all__ = ["FolderTexts", "gpt2_name_list", "merges_hex_text"]

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
    tokens = tokens if isinstance(tokens, list) else list(tokens)
    return list(map(_LEFT, map(codecs.charmap_decode, tokens, itertools.repeat(None),
                               itertools.repeat(_decoding_table()))))


def _json_items(keys: Sequence[str], values: Iterable[int], item_sep: str) -> str:
    """The inside of a JSON object's text without its braces: ``"key": value`` items (keys already
    escaped), separated by ``item_sep``."""
    if not keys:
        return ""
    return '"' + (item_sep + '"').join(map('": '.join, zip(keys, map(str, values))))


def merges_hex_text(merges: Sequence[tuple[bytes, bytes]]) -> str:
    """``model.json``'s ``merges`` value: ``[["6162","63"],...]`` (hex needs no escape).

    >>> merges_hex_text([(b"a", b"b"), (b" ", b"t")]), merges_hex_text([])
    ('[["61","62"],["20","74"]]', '[]')
    """
    if not merges:
        return "[]"
    return ('[["' + '"],["'.join(map('","'.join, zip(map(bytes.hex, map(_LEFT, merges)),
                                                    map(bytes.hex, map(_RIGHT, merges))))) + '"]]')


class _Names(dict):
    """bytes -> GPT-2 string; a token outside the vocabulary (a merge part no id holds) is converted
    when asked."""

    def __missing__(self, token: bytes) -> str:
        return codecs.charmap_decode(token, None, _decoding_table())[0]


class FolderTexts:
    """The texts of one model's files, sharing what they have in common (the GPT-2 strings).

    ``vocab``: id -> bytes (any ids); ``merges``: ``(left, right)`` pairs. ``vocab_json()``,
    ``merges_txt()`` are ``formats.model.dump_gpt2``'s files; ``hf_vocab_and_merges(model)`` the two
    long values of ``tokenizer.json`` (``formats.hf``).
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
        self.tokens = [vocab[i] for i in ids]
        self.merges = merges
        self.names = gpt2_name_list(self.tokens)
        #: no two ids hold the same bytes (nor, then, the same GPT-2 string)
        self.distinct = len(set(self.tokens)) == len(ids)
        self._escaped: list[str] | None = None
        self._body: str | None = None

    @property
    def escaped(self) -> list[str]:
        """The GPT-2 strings as JSON escapes them, without the quotes (only ``"`` and ``\\`` change:
        the alphabet has no control character); the same strings where nothing changes."""
        if self._escaped is None:
            names = self.names
            joined = "\0".join(names)          # (\0 is in no GPT-2 string)
            if '"' not in joined and "\\" not in joined:
                self._escaped = names
            else:
                self._escaped = [encode_basestring(n)[1:-1] if '"' in n or "\\" in n else n for n in names]
        return self._escaped

    # ---- vocab.json + merges.txt -------------------------------------------------------------

    def vocab_json(self) -> tuple[str, list[bytes]]:
        """``vocab.json``'s text without its final newline (``json.dumps(entries, ensure_ascii=False,
        indent=0)``; the smaller id keeps a string two ids hold), and the bytes left out that way."""
        if self.distinct:
            if not self.ids:
                return "{}", []
            return "{\n" + _json_items(self.escaped, self.ids, ",\n") + "\n}", []
        entries: dict[str, int] = {}
        dropped: list[bytes] = []
        for i, key, token in zip(self.ids, self.names, self.tokens):
            if key in entries:
                dropped.append(token)
                continue
            entries[key] = i
        from .model import _json_object_indent0

        return _json_object_indent0(entries), dropped

    def merges_body(self) -> str:
        """``merges.txt``'s lines without the header, joined by newlines (no final newline); made once."""
        if self._body is None:
            get = _Names(zip(self.tokens, self.names)).__getitem__      # (dropped once the lines are made)
            self._body = "\n".join(map(" ".join, zip(map(get, map(_LEFT, self.merges)),
                                                     map(get, map(_RIGHT, self.merges)))))
        return self._body

    def merges_txt(self) -> list[str]:
        """``merges.txt``'s text, in pieces."""
        return ["#version: 0.2\n", self.merges_body(), "\n"] if self.merges else ["#version: 0.2\n"]

    # ---- tokenizer.json ----------------------------------------------------------------------

    def hf_vocab_and_merges(self, model: Any) -> tuple[str, str, dict[str, int]] | None:
        """``tokenizer.json``'s ``vocab`` and ``merges`` values as text (``json.dumps(...,
        ensure_ascii=False)`` of ``formats.hf``'s) and the special tokens' ids (``hf.special_ids``), or None when this model needs the plain path:
        two ids hold the same bytes, ids are not ``0..n-1``, a special token is no token of its own
        above 255, or not every merge is one HF can use (``formats.hf.usable_merges``)."""
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
        taken = []
        for s in specials:
            if index is not None:
                j = index.get(s)
            else:
                try:
                    j = names.index(s)
                except ValueError:
                    j = None
            taken.append(j is not None and j not in skipped)
        taken = dict(zip(specials, taken))
        del index
        keys, values = self.escaped, self.ids
        if skipped:
            keep = [True] * n
            for i in skipped:
                keep[i] = False
            keys = list(itertools.compress(keys, keep))
            values = list(itertools.compress(values, keep))
        items = [_json_items(keys, values, ", ")] if keys else []
        for s, i in sorted(special_id.items(), key=itemgetter(1)):
            if taken[s]:
                continue                  # an ordinary token has this string: it keeps it
            items.append(encode_basestring(s) + ": " + str(i))
        vocab_text = "{" + ", ".join(items) + "}"
        if not merges:
            return vocab_text, "[]", special_id
        body = self.merges_body()
        if '"' in body or "\\" in body:
            body = body.replace("\\", "\\\\").replace('"', '\\"')
        return vocab_text, '[["' + body.replace(" ", '", "').replace("\n", '"], ["') + '"]]', special_id
