"""The stage-aware encoder of SuperBPE models (:class:`StageAwareEncoder`): stage-1 merges inside
pretokens, then stage-2 merges inside units, which reproduces training exactly."""
from __future__ import annotations

import numpy as np
import regex

from ...corpus.specials import encode_specials, split_on_specials
from ...encode.tokenizer import TwoStageEncoder
from ...engine.units import RankMerger
from ...formats.model import Model
from ...pretok.patterns import pattern_name, resolve_pattern
from ...pretok.pretokenize import pretoken_ends
from .official import official_unit_texts, stage1_ids
from .rules import model_split
from .words import ASCII_SPACE, numeric_cuts

_NON_ASCII_DIGIT = regex.compile(r"(?![\x00-\x7f])\p{N}")
_NON_ASCII_SPACE = regex.compile(r"(?![\x00-\x7f])\s")


class StageAwareEncoder:
    """Encode with a SuperBPE model: stage-1 merges inside pretokens, stage-2 merges inside units.

    Works in vocabulary ids (the smaller id for bytes that two merges build).
    """

    def __init__(self, model: Model):
        if model.method not in ("superbpe",):
            raise ValueError(f"not a SuperBPE model (method {model.method!r})")
        self.model = model
        self.pattern = resolve_pattern(model.pattern)
        self.specials = encode_specials(model.special_tokens)
        n1 = int(model.stages[0]["merges"])
        self.split = model_split(model)
        ids_of: dict[bytes, int] = {}
        for i in sorted(model.vocab):
            ids_of.setdefault(model.vocab[i], i)
        self.ids_of = ids_of
        self.token_bytes = [model.vocab[i] for i in range(len(model.vocab))]
        self.lengths = np.array([len(t) for t in self.token_bytes], dtype=np.int64)

        def merger(pairs):
            lefts = np.array([ids_of[a] for a, _ in pairs], dtype=np.uint32)
            rights = np.array([ids_of[b] for _, b in pairs], dtype=np.uint32)
            results = np.array([ids_of[a + b] for a, b in pairs], dtype=np.uint32)
            return RankMerger(lefts, rights, results)

        self.stage1 = merger(model.merges[:n1])
        self.stage2 = merger(model.merges[n1:])
        # the whole-text native path: the "hf" and "units" splits with a named pattern (the others:
        # Python below)
        self.native = None
        if self.split in ("hf", "units") and pattern_name(self.pattern) is not None:
            self.native = TwoStageEncoder(model.vocab, model.merges[:n1], model.special_tokens, self.pattern,
                                          self.stage2, split=self.split)

    def encode_array(self, data: bytes, specials: bool = True) -> np.ndarray:
        """uint32 ids of ``data`` (``specials=False``: as :meth:`encode_ordinary`); one native call
        for the ``"hf"`` and ``"units"`` splits (``encode.TwoStageEncoder``), else :meth:`encode_python`."""
        if self.native is not None:
            return self.native.encode(data, specials)
        if specials:
            return np.asarray(self.encode_python(data), dtype=np.uint32)
        return np.asarray(self.encode_ordinary(data), dtype=np.uint32)

    def encode_ordinary(self, data: bytes) -> np.ndarray:
        """Encode text with no special tokens in it."""
        if self.split == "official":
            parts = [stage1_ids(u, self.pattern, self.stage1) for u in official_unit_texts(data)]
            if not parts:
                return np.zeros(0, dtype=np.uint32)
            offsets = np.concatenate(([0], np.cumsum([p.size for p in parts]))).astype(np.int64)
            syms, offs = self.stage2.merge_many(np.concatenate(parts).astype(np.uint32), offsets)
            return syms
        ends = pretoken_ends(data, self.pattern)
        if ends.size == 0:
            return np.zeros(0, dtype=np.uint32)
        starts = np.concatenate(([0], ends[:-1]))
        symbols = np.frombuffer(data, dtype=np.uint8).astype(np.uint32)
        seg, seg_offs = self.stage1.merge_many(symbols, np.concatenate(([0], ends)).astype(np.int64))
        numeric = self._numeric_pretokens(data, starts, ends)
        if self.split == "hf":
            # a unit ends at a numeric pretoken (a unit of its own) and inside a run of whitespace
            hard = numeric[1:] | numeric[:-1]
            hard |= self._space_meets(data, starts, ends)
            cut = np.zeros(seg.size + 1, dtype=bool)
            cut[0] = cut[-1] = True
            cut[seg_offs[1:-1][hard]] = True
            out, _ = self.stage2.merge_many(seg, np.flatnonzero(cut).astype(np.int64))
            return out
        # numeric pretokens: a unit of their own, cut at digit boundaries between stage-1 tokens
        cut_before = np.zeros(seg.size + 1, dtype=bool)
        cut_before[0] = cut_before[-1] = True
        for p in np.flatnonzero(numeric):
            a, b = int(seg_offs[p]), int(seg_offs[p + 1])
            cut_before[a] = cut_before[b] = True
            lens = self.lengths[seg[a:b]].tolist()
            for c in numeric_cuts(data[starts[p]:ends[p]], lens):
                cut_before[a + c] = True
        bounds = np.flatnonzero(cut_before).astype(np.int64)
        out, _ = self.stage2.merge_many(seg, bounds)
        return out

    def _space_meets(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Per boundary between pretokens ``p`` and ``p+1``: the left one ends with whitespace and
        the right one starts with it."""
        arr = np.frombuffer(data, dtype=np.uint8)
        is_space = ASCII_SPACE[arr]
        if (arr >= 0x80).any():                 # whitespace beyond ASCII (NBSP, U+2000..): mark its bytes
            text = data.decode("utf-8", "surrogateescape")
            if _NON_ASCII_SPACE.search(text):
                is_space = is_space.copy()
                byte_pos = char_pos = 0
                for m in _NON_ASCII_SPACE.finditer(text):
                    byte_pos += len(text[char_pos:m.start()].encode("utf-8", "surrogateescape"))
                    char_pos = m.start()
                    n = len(m.group().encode("utf-8", "surrogateescape"))
                    is_space[byte_pos:byte_pos + n] = True
        return is_space[ends[:-1] - 1] & is_space[starts[1:]]

    def _numeric_pretokens(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Which pretokens hold a digit (``\\p{N}``)."""
        arr = np.frombuffer(data, dtype=np.uint8)
        digit_pos = np.flatnonzero((arr >= 0x30) & (arr <= 0x39))
        if (arr >= 0x80).any():
            text = data.decode("utf-8", "surrogateescape")
            extra, char_pos, byte_pos = [], 0, 0
            for m in _NON_ASCII_DIGIT.finditer(text):
                byte_pos += len(text[char_pos:m.start()].encode("utf-8", "surrogateescape"))
                char_pos = m.start()
                extra.append(byte_pos)
            if extra:
                digit_pos = np.union1d(digit_pos, np.array(extra, dtype=np.int64))
        numeric = np.zeros(ends.size, dtype=bool)
        if digit_pos.size:
            numeric[np.searchsorted(ends, digit_pos, side="right")] = True
        return numeric

    def encode(self, data: bytes | str) -> list[int]:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if self.native is not None:
            return self.native.encode(data).tolist()
        return self.encode_python(data)

    def encode_python(self, data: bytes | str) -> list[int]:
        """The plain path, document by document (numpy and ``RankMerger`` per text piece): the
        twin of the native whole-text path, and the path of the other splits and custom patterns."""
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        out: list[int] = []
        for piece, is_special in split_on_specials(data, self.specials):
            if is_special:
                out.append(self.ids_of[piece])
            else:
                out.extend(self.encode_ordinary(piece).tolist())
        return out
