"""SuperBPE (Liu et al., COLM 2025): a two-stage curriculum on the same merge engine.

Stage 1 is standard BPE until the vocabulary reaches the *transition* size ``t``. Stage 2 continues
from the stage-1 segmentation with whitespace boundaries lifted: its words are **units**, runs of
consecutive pretokens of one text piece, each already split into its stage-1 tokens. Units are cut
only at hard boundaries:

- the edges of text pieces (document edges, special tokens);
- digits: a pretoken holding a digit (``\\p{N}``) is a unit of its own, and it is cut further where
  its stage-1 tokens meet at a digit/non-digit change or between groups of three digits counted from
  the right (``reference.numeric_cuts``).

A stage-2 merge must pass the rules (:class:`Stage2Rules`): at most ``max_words`` words
(``len(token.split())``), no forbidden substring (``": "``), and the optional guardrails
``max_token_bytes`` and ``max_nonalnum`` (characters that are neither alphanumeric nor whitespace).

``stage2_split="official"`` reproduces the stage-2 pre-tokenizer of the official implementation for
parity: inside each line, the pieces ``\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]{2,}[\\r\\n/]*| +(?!\\S)`` are
isolated and the gaps between them are the units; each unit is pre-tokenized and stage-1 merged on its
own.

The encoder is stage-aware (:class:`StageAwareEncoder`): stage-1 merges inside pretokens, then stage-2
merges inside units, which reproduces training exactly (the token count of the training corpus equals
the count training ended with). ``reference.train_superbpe_from_bytes`` is the plain twin.

Scale: units are deduplicated with counts (``_units.UnitCounter``). When the stage-2 table still would
not fit the budget, stage 2 trains on a deterministic sample of units (kept by a hash of their
content, so the sample does not depend on worker count); the run report says how much text it saw.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import regex

from . import corpus
from ._engine import MergeEngine
from ._pretok import PATTERN_IDS
from ._units import RankMerger, UnitCounter, WordIndex, count_chunk_units, expand_units
from .memmon import phase
from .model_io import Model
from .patterns import encode_specials, pattern_name, resolve_pattern
from .pretokenize import pretoken_ends
from .reference import numeric_cuts
from .wordtable import WordTable
from .workers import FileStamp, InputChanged, read_range, run_ordered

DEFAULT_TRANSITION = 0.4
OFFICIAL_STAGE2_PATTERN = r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]{2,}[\r\n/]*| +(?!\S)"
_DIGIT = regex.compile(r"\p{N}")
_OFFICIAL = regex.compile(OFFICIAL_STAGE2_PATTERN)
_NON_ASCII_DIGIT = regex.compile(r"(?![\x00-\x7f])\p{N}")
#: Bytes of RAM per stage-1 token of the corpus in stage 2 (the compact engine: 4 B cells, pairs of
#: stage-1 tokens, the pair map; read-only arrays mapped): measured 26.5 B on en_train at 32k (peak
#: 1,520 MiB anonymous for 60.2 M stage-1 tokens; the engine before: 66 B), rounded up. The
#: scheduler's share for stage 2 divided by this bounds the sample.
STAGE2_BYTES_PER_SYMBOL = 32
#: Read-only engine arrays larger than this live in mapped files under the spill folder.
MAP_THRESHOLD = 64 << 20


@dataclass(frozen=True)
class Stage2Rules:
    """Which merged tokens stage 2 may create (stored in the model file)."""

    max_words: int = 4
    forbidden: tuple[str, ...] = (": ",)
    max_token_bytes: Optional[int] = None
    max_nonalnum: Optional[int] = None

    def allows(self, left: bytes, right: bytes) -> bool:
        """Equivalent to ``reference.superbpe_allows``.

        >>> Stage2Rules().allows(b" of", b" the"), Stage2Rules().allows(b"a:", b" b")
        (True, False)
        """
        merged = left + right
        if len(merged.split()) > self.max_words:
            return False
        for f in self._forbidden_bytes:
            if f in merged:
                return False
        if self.max_token_bytes is not None and len(merged) > self.max_token_bytes:
            return False
        if self.max_nonalnum is not None:
            text = merged.decode("utf-8", "surrogateescape")
            if sum(1 for c in text if not (c.isalnum() or c.isspace())) > self.max_nonalnum:
                return False
        return True

    @classmethod
    def from_config(cls, config) -> "Stage2Rules":
        """The rules a :class:`~bpe_core.config.TrainConfig` asks for."""
        return cls(max_words=config.max_words, forbidden=tuple(config.forbidden),
                   max_token_bytes=config.max_token_bytes, max_nonalnum=config.max_nonalnum)

    @property
    def _forbidden_bytes(self) -> list[bytes]:
        return [f.encode("utf-8") for f in self.forbidden]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["forbidden"] = list(self.forbidden)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Stage2Rules":
        return cls(max_words=int(d.get("max_words", 4)), forbidden=tuple(d.get("forbidden", (": ",))),
                   max_token_bytes=d.get("max_token_bytes"), max_nonalnum=d.get("max_nonalnum"))


def resolve_transition(transition: float | int | None, vocab_size: int, n_specials: int) -> int:
    """The vocabulary size at the transition: an int is a size, a float in (0, 1] a fraction.

    >>> resolve_transition(0.4, 10000, 1), resolve_transition(3000, 10000, 1), resolve_transition(None, 1000, 0)
    (4000, 3000, 400)
    >>> resolve_transition(0.4, 300, 1)       # a fraction below 256 + specials starts at the base
    257
    """
    base = 256 + n_specials
    if transition is None:
        transition = DEFAULT_TRANSITION
    if isinstance(transition, float) and transition <= 1:
        if transition <= 0:
            raise ValueError(f"transition fraction must be in (0, 1], got {transition}")
        size = max(base, int(round(transition * vocab_size)))     # a fraction never goes below the base
    else:
        size = int(transition)
    if size < base or size > vocab_size:
        raise ValueError(f"transition {size} must be between {base} (256 + special tokens) and vocab_size {vocab_size}")
    return size


# ==== Units ====================================================================================


def _numeric_mask(table: WordTable) -> np.ndarray:
    """Which words hold a digit (``\\p{N}``). ASCII digits are found by numpy; non-ASCII words are
    decoded and checked with ``regex``."""
    arena, offsets = table.arena, table.offsets
    n = table.n_words
    is_digit = (arena >= 0x30) & (arena <= 0x39)
    word_of_byte = np.repeat(np.arange(n), np.diff(offsets))
    mask = np.zeros(n, dtype=bool)
    mask[word_of_byte[is_digit]] = True
    non_ascii = np.zeros(n, dtype=bool)
    non_ascii[word_of_byte[arena >= 0x80]] = True
    raw = arena.tobytes()
    for w in np.flatnonzero(non_ascii & ~mask):
        if _DIGIT.search(raw[offsets[w]:offsets[w + 1]].decode("utf-8", "surrogateescape")):
            mask[w] = True
    return mask


def _units_chunk(task: tuple) -> tuple:
    """Worker (a thread): the unique units (as word-id runs) of ``path[start:end)``."""
    path, start, end, specials, pattern, keep_below, index, numeric, stamp = task
    buf = read_range(path, start, end, stamp)
    spans, _ = corpus.split_spans(buf, 0, len(buf), specials)
    counter = UnitCounter()
    name = pattern_name(pattern)
    if name is not None:
        missing = count_chunk_units(buf, spans, PATTERN_IDS[name], index, numeric.view(np.uint8), counter, keep_below)
        if missing:
            raise InputChanged(path, "changed while it was read: a pretoken is missing from the word table "
                                     "counted earlier; nothing was written")
        data, starts, counts = counter.to_arrays()
        return data, starts, counts, counter.n_seen, counter.n_kept
    for s, e in spans:
        ends = pretoken_ends(buf[s:e], pattern) + s
        ids = index.word_ids(buf, ends, s)
        if ids.size and ids.min() < 0:
            raise InputChanged(path, "changed while it was read: a pretoken is missing from the word table "
                                     "counted earlier; nothing was written")
        num = numeric[ids]
        cut = np.flatnonzero(num[1:] | num[:-1]) + 1
        bounds = np.concatenate(([0], cut, [ids.size])).astype(np.int64)
        counter.add_units(ids.astype(np.uint32), bounds, 1, keep_below)
    data, starts, counts = counter.to_arrays()
    return data, starts, counts, counter.n_seen, counter.n_kept


def count_units(path: str, table: WordTable, specials: Sequence[bytes], pattern: str, num_workers: int,
                chunk_bytes: int, sample_fraction: float = 1.0) -> tuple[tuple, dict]:
    """Count the stage-2 units of a corpus as runs of word ids (rows of ``table``).

    Chunks are counted on worker threads (``workers.run_ordered``) that share one read-only
    ``WordIndex`` of the table; the per-chunk tables are summed in the calling thread.
    """
    stamp = FileStamp.of(path)
    # Units run across newlines: cut chunks at document edges only.
    chunks = corpus.file_chunks(path, chunk_bytes, specials, pattern, inside_documents=False, stamp=stamp)
    keep_below = 0xFFFFFFFFFFFFFFFF if sample_fraction >= 1 else int(sample_fraction * 2 ** 64)
    numeric = _numeric_mask(table)
    index = WordIndex(table.arena, table.offsets)
    tasks = [(path, s, e, list(specials), pattern, keep_below, index, numeric, stamp) for s, e in chunks]
    total = UnitCounter()
    seen = kept = 0

    def absorb(result) -> None:
        nonlocal seen, kept
        data, starts, counts, n_seen, n_kept = result
        total.add_table(data, starts, counts)
        seen += n_seen
        kept += n_kept

    run_ordered(_units_chunk, tasks, min(num_workers, len(tasks)), absorb)
    stamp.check()
    info = {"units_seen": seen, "units_kept": kept, "unique_units": total.n_units}
    return total.to_arrays(), info


def stage2_table(units: tuple, table: WordTable, seg_symbols: np.ndarray, seg_offsets: np.ndarray,
                 numeric: np.ndarray, token_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Expand word-id units into stage-1 token units; numeric words are split at their hard cuts."""
    data, starts, counts = units
    lengths = np.diff(starts)
    single_numeric = (lengths == 1) & numeric[data[starts[:-1]]] if lengths.size else np.zeros(0, bool)
    plain = np.flatnonzero(~single_numeric)
    # plain units: expand all of them in one native pass
    keep_bytes = np.repeat(~single_numeric, lengths)
    plain_starts = np.zeros(plain.size + 1, dtype=np.int64)
    np.cumsum(lengths[plain], out=plain_starts[1:])
    symbols, offsets = expand_units(np.ascontiguousarray(data[keep_bytes]), plain_starts, seg_symbols, seg_offsets)
    out_counts = [counts[plain]]
    extra_syms, extra_lens = [], []
    arena = table.arena.tobytes()
    for u in np.flatnonzero(single_numeric):
        w = int(data[starts[u]])
        seg = seg_symbols[seg_offsets[w]:seg_offsets[w + 1]]
        word = arena[table.offsets[w]:table.offsets[w + 1]]
        cuts = numeric_cuts(word, token_lengths[seg].tolist())
        for a, b in zip([0] + cuts, cuts + [len(seg)]):
            extra_syms.append(seg[a:b])
            extra_lens.append(b - a)
            out_counts.append(np.array([counts[u]], dtype=np.int64))
    if extra_syms:
        symbols = np.concatenate([symbols] + extra_syms).astype(np.uint32)
        offsets = np.concatenate([offsets, offsets[-1] + np.cumsum(extra_lens)]).astype(np.int64)
    return symbols, offsets, np.concatenate(out_counts).astype(np.int64)


# ==== Training =================================================================================


def train_superbpe(config, table: WordTable, report: dict, plan, progress: bool = False):
    """Stage 1 and stage 2 on a counted corpus; returns ``(vocab, merges, stages)``."""
    from .trainer import _bar

    specials = encode_specials(config.special_tokens)
    rules = Stage2Rules.from_config(config)
    t_size = resolve_transition(config.transition, config.vocab_size, len(specials))
    n1 = t_size - 256 - len(specials)
    n_total = config.vocab_size - 256 - len(specials)
    pattern = resolve_pattern(config.pattern)

    # ---- stage 1: plain BPE on the word table (all words, so rows stay aligned with the table)
    t0 = time.perf_counter()
    phase("build words")
    # Read-only arrays above MAP_THRESHOLD go to mapped files in the spill folder (docs/memory.md).
    folder = config.spill_dir or tempfile.gettempdir()
    engine = MergeEngine(table.arena, table.offsets, table.counts, [bytes([i]) for i in range(256)],
                         spill_dir=folder, map_threshold=MAP_THRESHOLD)
    phase("merge loop")
    bar = _bar(progress, total=n_total, desc="merges", unit="merge")
    steps1 = engine.run(n1)
    if bar is not None:
        bar.update(len(steps1))
    seg_symbols, seg_offsets, _ = engine.words()
    tokens = engine.tokens()
    del engine                      # stage 2 starts from the segmentation; free the stage-1 engine
    t1 = time.perf_counter()
    n_stage1_tokens = int((np.diff(seg_offsets) * table.counts).sum())

    # ---- stage 2 units
    phase("stage-2 units")
    table_ram = 0 if table.mapped else table.nbytes
    budget_share = max(plan.memory_limit - plan.parent_overhead - 2 * table_ram, 64 << 20)
    need = n_stage1_tokens * STAGE2_BYTES_PER_SYMBOL
    fraction = 1.0 if need <= budget_share else budget_share / need
    numeric = _numeric_mask(table)
    token_lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    if config.stage2_split == "official":
        units_syms, units_offs, units_counts, info = _official_units(
            config.input_path, specials, pattern, tokens, steps1, fraction)
    else:
        units, info = count_units(config.input_path, table, specials, pattern, plan.num_workers,
                                  plan.chunk_bytes, fraction)
        units_syms, units_offs, units_counts = stage2_table(units, table, seg_symbols, seg_offsets, numeric,
                                                            token_lengths)
        del units
    t2 = time.perf_counter()

    # ---- stage 2: continue from the stage-1 state
    phase("merge loop")
    engine2 = MergeEngine(units_syms, units_offs, units_counts, tokens, spill_dir=folder,
                          map_threshold=MAP_THRESHOLD)
    del units_syms, units_offs
    steps2 = engine2.run(n_total - len(steps1), allowed=rules.allows)
    if bar is not None:
        bar.update(len(steps2))
        bar.close()
    t3 = time.perf_counter()
    all_tokens = engine2.tokens()
    final_syms, final_offs, final_counts = engine2.words()
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    for s in specials:
        vocab[len(vocab)] = s
    merges = []
    for left, right, _ in list(steps1) + list(steps2):
        merges.append((all_tokens[left], all_tokens[right]))
        vocab[len(vocab)] = all_tokens[left] + all_tokens[right]
    report["seconds"]["stage1"] = round(t1 - t0, 3)
    report["seconds"]["stage2_units"] = round(t2 - t1, 3)
    report["seconds"]["stage2"] = round(t3 - t2, 3)
    report["seconds"]["merge_loop"] = round((t1 - t0) + (t3 - t2), 3)
    report["engine"] = engine2.stats()
    report["merges"] = len(merges)
    report["merges_requested"] = max(n_total, 0)
    report["superbpe"] = {
        "transition": t_size,
        "stage1_merges": len(steps1),
        "stage2_merges": len(steps2),
        "stage2_split": config.stage2_split,
        "rules": rules.to_dict(),
        "stage2_sample_fraction": fraction,
        "stage2_units_seen": info["units_seen"],
        "stage2_units_kept": info["units_kept"],
        "stage2_unique_units": info["unique_units"],
        "stage2_text_share": round(info["units_kept"] / info["units_seen"], 6) if info["units_seen"] else 1.0,
        "stage1_tokens": n_stage1_tokens,
        # tokens of the text stage 2 trained on, when it ended (equals the encoder's count on the
        # training corpus, special tokens excluded, when stage 2 saw all of it)
        "final_tokens": int((np.diff(final_offs) * final_counts).sum()),
    }
    stages = [
        {"name": "bpe", "merges": len(steps1)},
        {"name": "superbpe", "merges": len(steps2), "split": config.stage2_split, "rules": rules.to_dict()},
    ]
    return vocab, merges, stages


def _official_units(path, specials, pattern, tokens, steps1, fraction):
    """Units of the official stage-2 split: lines, official pieces isolated, gaps as units; each unit
    pre-tokenized and stage-1 merged on its own. Runs ``regex`` in Python (a parity mode)."""
    merger = _stage1_merger(tokens, steps1)
    counter = UnitCounter()
    keep_below = 0xFFFFFFFFFFFFFFFF if fraction >= 1 else int(fraction * 2 ** 64)
    buf = corpus.open_corpus(path)
    spans, _ = corpus.split_spans(buf, 0, len(buf), specials)
    for s, e in spans:
        for unit_bytes in official_unit_texts(bytes(buf[s:e])):
            ids = _stage1_ids(unit_bytes, pattern, merger)
            counter.add_units(ids, np.array([0, ids.size], dtype=np.int64), 1, keep_below)
    data, starts, counts = counter.to_arrays()
    info = {"units_seen": counter.n_seen, "units_kept": counter.n_kept, "unique_units": counter.n_units}
    return data, starts, counts, info


def official_unit_texts(text: bytes) -> list[bytes]:
    """The official stage-2 units of one text piece: per line, official pieces and the gaps between.

    >>> official_unit_texts(b"a b 12345 c\\nd")
    [b'a b ', b'123', b'45', b' c\\n', b'd']
    """
    out = []
    rx = _OFFICIAL
    for line in text.splitlines(keepends=True):
        s = line.decode("utf-8", "surrogateescape")
        pos = 0
        for m in rx.finditer(s):
            if m.start() > pos:
                out.append(s[pos:m.start()])
            out.append(m.group())
            pos = m.end()
        if pos < len(s):
            out.append(s[pos:])
    return [u.encode("utf-8", "surrogateescape") for u in out if u]


def _stage1_merger(tokens: Sequence[bytes], steps) -> RankMerger:
    lefts = np.array([a for a, _, _ in steps], dtype=np.uint32)
    rights = np.array([b for _, b, _ in steps], dtype=np.uint32)
    results = np.array([t for _, _, t in steps], dtype=np.uint32)
    return RankMerger(lefts, rights, results)


def _stage1_ids(text: bytes, pattern: str, merger: RankMerger) -> np.ndarray:
    ends = pretoken_ends(text, pattern)
    symbols = np.frombuffer(text, dtype=np.uint8).astype(np.uint32)
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    merged, _ = merger.merge_many(symbols, offsets)
    return merged


# ==== Stage-aware encoding =====================================================================


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
        self.split = model.stages[1].get("split", "default") if len(model.stages) > 1 else "default"
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

    def encode_ordinary(self, data: bytes) -> np.ndarray:
        """Encode text with no special tokens in it."""
        if self.split == "official":
            parts = [_stage1_ids(u, self.pattern, self.stage1) for u in official_unit_texts(data)]
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
        # numeric pretokens: a unit of their own, cut at digit boundaries between stage-1 tokens
        numeric = self._numeric_pretokens(data, starts, ends)
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
        from .patterns import split_on_specials

        out: list[int] = []
        for piece, is_special in split_on_specials(data, self.specials):
            if is_special:
                out.append(self.ids_of[piece])
            else:
                out.extend(self.encode_ordinary(piece).tolist())
        return out
