"""The readable twin of bpe_core: plain-Python BPE training and encoding.

Slow and obviously right. It defines the semantics that every fast path of bpe_core is tested
against, and it is never imported by the fast path. Read it like minbpe: dicts, lists and a comment
per step.

Semantics (the whole contract, see ``docs/semantics.md``):

1. Bytes are the truth. The input is read as bytes; it is split on the special tokens (longest
   first); each text piece is decoded with ``surrogateescape`` (invalid UTF-8 is kept byte for byte),
   pre-tokenized with the pattern, and each pretoken is encoded back to the exact bytes.
2. Pretokens are counted. Each pretoken is a sequence of symbols (initially its bytes). Symbols are
   *bytes values*: two merges that build the same bytes build the same symbol.
3. Every step counts every adjacent pair in every pretoken, weighted by the pretoken's count (``aaa``
   holds ``(a, a)`` twice). The winner has the highest count; ties go to the greatest
   ``(left_bytes, right_bytes)`` tuple (``tie_break="bytes"``, CS336), or, with ``tie_break="hf"``,
   to the smallest pair of HF ranks (``hf_ranks``: the order in which HF ``tokenizers``' BpeTrainer
   gives ids, so the merges are its merges).
4. The winner is rewritten greedily left to right without overlap (``aaa`` -> ``[aa, a]``).
5. Stop when the vocabulary (256 bytes + special tokens + merges) reaches ``vocab_size`` or no pair
   is left.

>>> vocab, merges = train_bpe_from_bytes(b"low low low lower", 259, [])
>>> merges   # (l, o) and (o, w) tie at 4; (o, w) is the greater tuple
[(b'o', b'w'), (b'l', b'ow'), (b' ', b'low')]
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Iterable, Sequence

import regex

from ..corpus.specials import encode_specials, split_on_specials
from ..pretok.patterns import resolve_pattern

# ==== Pre-tokenization ======================================================================


def pretokenize(data: bytes, pattern: str = "gpt2") -> list[bytes]:
    """Pre-tokenize one text piece (no special tokens in it) into pretoken bytes.

    The pretokens are the non-empty matches of the pattern and, for a custom pattern that does not
    cover the text, the texts between them: nothing is dropped, empty matches are skipped.

    >>> pretokenize(b"a  b")
    [b'a', b' ', b' b']
    >>> pretokenize(b"caf\\xe9!")   # invalid UTF-8 is kept byte for byte
    [b'caf', b'\\xe9!']
    >>> pretokenize(b"Hi, you", r"[a-z]+")   # the text between matches is kept
    [b'H', b'i', b', ', b'you']
    """
    text = data.decode("utf-8", "surrogateescape")
    rx = regex.compile(resolve_pattern(pattern))
    pieces: list[str] = []
    pos = 0                                   # end of the text handed out so far
    for m in rx.finditer(text):
        if m.end() == m.start():              # an empty match takes no text
            continue
        if m.start() > pos:                   # unmatched text before the match
            pieces.append(text[pos:m.start()])
        pieces.append(m.group())
        pos = m.end()
    if pos < len(text):                       # unmatched text at the end
        pieces.append(text[pos:])
    return [p.encode("utf-8", "surrogateescape") for p in pieces]


def count_pretokens(data: bytes, special_tokens: Sequence[str | bytes] = (), pattern: str = "gpt2") -> Counter:
    """Count the pretokens of a whole text; special tokens are removed first.

    >>> sorted(count_pretokens(b"hi hi<|endoftext|>hi", ["<|endoftext|>"]).items())
    [(b' hi', 1), (b'hi', 2)]
    """
    specials = encode_specials(special_tokens)
    counts: Counter = Counter()
    for piece, is_special in split_on_specials(data, specials):
        if not is_special:
            counts.update(pretokenize(piece, pattern))
    return counts


# ==== Training ==============================================================================


def get_pair_counts(words: dict[tuple[bytes, ...], int]) -> Counter:
    """Count adjacent pairs, weighted by word count.

    >>> get_pair_counts({(b"a", b"a", b"a"): 2, (b"a", b"b"): 1})
    Counter({(b'a', b'a'): 4, (b'a', b'b'): 1})
    """
    pairs: Counter = Counter()
    for word, count in words.items():
        for left, right in zip(word, word[1:]):
            pairs[(left, right)] += count
    return pairs


def merge_word(word: tuple[bytes, ...], pair: tuple[bytes, bytes]) -> tuple[bytes, ...]:
    """Rewrite one word: replace ``pair`` greedily left to right, without overlap.

    >>> merge_word((b"a", b"a", b"a"), (b"a", b"a"))
    (b'aa', b'a')
    """
    left, right = pair
    out: list[bytes] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
            out.append(left + right)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def hf_byte_rank() -> list[int]:
    """The rank of each byte in HF's byte-level alphabet: HF numbers the initial alphabet in the order
    of its characters, and a byte's character is GPT-2's ``bytes_to_unicode`` one (the printable
    bytes ``!``-``~``, ``¡``-``¬``, ``®``-``ÿ`` stand for themselves, the others for U+0100 on, in
    byte order).

    >>> r = hf_byte_rank(); r[ord("!")], r[ord("a")], r[0], r[ord(" ")]
    (0, 64, 188, 220)
    """
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = {b: b for b in printable}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + n
            n += 1
    order = sorted(range(256), key=chars.__getitem__)
    rank = [0] * 256
    for i, b in enumerate(order):
        rank[b] = i
    return rank


def hf_ranks(merges: Sequence[tuple[bytes, bytes]] = ()) -> dict[bytes, int]:
    """bytes -> HF rank of every token: the single bytes by ``hf_byte_rank``, then the bytes each merge
    builds, in merge order (a merge that rebuilds existing bytes keeps the existing rank, as HF keeps
    the existing id). Only order matters: special tokens (HF's first ids) never occur in words.

    >>> hf_ranks([(b"a", b"b"), (b"ab", b"c")])[b"abc"]
    257
    """
    byte_rank = hf_byte_rank()
    ranks: dict[bytes, int] = {bytes([b]): byte_rank[b] for b in range(256)}
    for left, right in merges:
        ranks.setdefault(left + right, len(ranks))
    return ranks


def best_pair(pairs: Counter, tie_break: str = "bytes", ranks: dict[bytes, int] | None = None
              ) -> tuple[bytes, bytes] | None:
    """Highest count; ties go to the greatest ``(left_bytes, right_bytes)`` (``tie_break="bytes"``)
    or to the smallest ``(ranks[left], ranks[right])`` (``"hf"``; ``ranks`` from ``hf_ranks``).

    >>> best_pair(Counter({(b"a", b"b"): 2, (b"b", b"a"): 2, (b"z", b"z"): 1}))
    (b'b', b'a')
    >>> best_pair(Counter({(b"a", b"b"): 2, (b"b", b"a"): 2}), "hf", hf_ranks({}))
    (b'a', b'b')
    """
    best = None
    best_key = None
    for pair, count in pairs.items():
        if count <= 0:
            continue
        if tie_break == "hf":
            key = (count, -ranks[pair[0]], -ranks[pair[1]])
        else:
            key = (count, pair)
        if best_key is None or key > best_key:
            best, best_key = pair, key
    return best


def train_on_counts(pretoken_counts: dict[bytes, int], vocab_size: int,
                    special_tokens: Sequence[str | bytes] = (),
                    init_merges: Sequence[tuple[bytes, bytes]] = (), tie_break: str = "bytes",
                    max_token_bytes: int | None = None) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """BPE on counted pretokens, recounting every pair after every merge.

    ``init_merges``: start from an existing model's merges (``--init-from``): they are the first
    merges, each pretoken starts as their encoding (``encode_pretoken``), and the loop goes on.
    ``tie_break``: ``"bytes"`` (CS336) or ``"hf"`` (HF ``tokenizers``), see ``best_pair``.
    ``max_token_bytes``: a pair whose token would be longer never competes (``--max-token-bytes``).
    """
    specials = encode_specials(special_tokens)
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    for tok in specials:
        vocab[len(vocab)] = tok
    merges: list[tuple[bytes, bytes]] = list(init_merges)
    for a, b in merges:
        vocab[len(vocab)] = a + b
    words: dict[tuple[bytes, ...], int] = {}
    for pretoken, count in pretoken_counts.items():
        key = tuple(encode_pretoken(pretoken, merges))
        words[key] = words.get(key, 0) + count
    allowed = None if max_token_bytes is None else (lambda a, b: len(a) + len(b) <= max_token_bytes)
    merge_loop(words, vocab, merges, vocab_size, allowed, tie_break=tie_break)
    return vocab, merges


def merge_loop(words: dict[tuple[bytes, ...], int], vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]],
               vocab_size: int, allowed=None, tie_break: str = "bytes") -> dict[tuple[bytes, ...], int]:
    """Merge until ``vocab`` reaches ``vocab_size`` or no (allowed) pair is left; ``vocab`` and
    ``merges`` grow in place; returns the final words. ``tie_break``: see ``best_pair``."""
    ranks = hf_ranks(merges) if tie_break == "hf" else None
    while len(vocab) < vocab_size:
        # 1. Full recount of every pair (only the allowed ones compete).
        pairs = get_pair_counts(words)
        if allowed is not None:
            pairs = Counter({p: c for p, c in pairs.items() if allowed(p[0], p[1])})
        pair = best_pair(pairs, tie_break, ranks)
        if pair is None:
            break
        # 2. Record the merge; its id is the next free one.
        merges.append(pair)
        vocab[len(vocab)] = pair[0] + pair[1]
        if ranks is not None:
            ranks.setdefault(pair[0] + pair[1], len(ranks))
        # 3. Rewrite every word; words that become equal add up.
        new_words: dict[tuple[bytes, ...], int] = {}
        for word, count in words.items():
            merged = merge_word(word, pair)
            new_words[merged] = new_words.get(merged, 0) + count
        words = new_words
    return words


def train_bpe_from_bytes(data: bytes, vocab_size: int, special_tokens: Sequence[str | bytes] = (),
                         pattern: str = "gpt2", init_merges: Sequence[tuple[bytes, bytes]] = (),
                         tie_break: str = "bytes", max_token_bytes: int | None = None
                         ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train on an in-memory corpus (from ``init_merges`` on, when given).

    >>> data = b"ab ba"     # (a, b), (' ', b), (b, a) all count 1
    >>> train_bpe_from_bytes(data, 257, [])[1], train_bpe_from_bytes(data, 257, [], tie_break="hf")[1]
    ([(b'b', b'a')], [(b'a', b'b')])
    """
    return train_on_counts(count_pretokens(data, special_tokens, pattern), vocab_size, special_tokens,
                           init_merges, tie_break, max_token_bytes)


def train_bpe(input_path: str | os.PathLike, vocab_size: int, special_tokens: Sequence[str | bytes] = (),
              pattern: str = "gpt2", tie_break: str = "bytes") -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train on a file (read whole; the reference makes no attempt at scale)."""
    with open(input_path, "rb") as f:
        data = f.read()
    return train_bpe_from_bytes(data, vocab_size, special_tokens, pattern, tie_break=tie_break)


# ==== Encoding ==============================================================================


def encode_pretoken(pretoken: bytes, merges: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    """Apply the merges to one pretoken by replaying them in order, each to all of its occurrences
    left to right, exactly as training rewrote its words.

    (A merge can only apply if its bytes occur in the pretoken, so the others are skipped.)

    >>> encode_pretoken(b"aaa", [(b"a", b"a")])
    [b'aa', b'a']
    """
    parts = tuple(bytes([b]) for b in pretoken)
    for left, right in merges:
        if len(parts) < 2:
            break
        if left + right in pretoken:
            parts = merge_word(parts, (left, right))
    return list(parts)


def token_ids(vocab: dict[int, bytes]) -> dict[bytes, int]:
    """bytes -> id; when two ids hold the same bytes, the smaller id is used."""
    out: dict[bytes, int] = {}
    for i in sorted(vocab):
        out.setdefault(vocab[i], i)
    return out


def encode(data: bytes | str, vocab: dict[int, bytes], merges: Sequence[tuple[bytes, bytes]],
           special_tokens: Sequence[str | bytes] = (), pattern: str = "gpt2") -> list[int]:
    """Encode text to ids: special tokens (longest match) become their id; the rest is
    pre-tokenized and each pretoken is merged by rank.

    >>> vocab = {i: bytes([i]) for i in range(256)}; vocab[256] = b"aa"
    >>> encode(b"aaa", vocab, [(b"a", b"a")])
    [256, 97]
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    merges = list(merges)
    ids_of = token_ids(vocab)
    specials = encode_specials(special_tokens)
    out: list[int] = []
    for piece, is_special in split_on_specials(data, specials):
        if is_special:
            out.append(ids_of[piece])
            continue
        for pretoken in pretokenize(piece, pattern):
            out.extend(ids_of[p] for p in encode_pretoken(pretoken, merges))
    return out


def decode_bytes(ids: Iterable[int], vocab: dict[int, bytes]) -> bytes:
    """Concatenate the bytes of the ids.

    >>> decode_bytes([104, 105], {104: b"h", 105: b"i"})
    b'hi'
    """
    return b"".join(vocab[i] for i in ids)


# ==== SuperBPE ==============================================================================
# Stage 1 is the BPE above. Stage 2 continues from the stage-1 segmentation with whitespace
# boundaries lifted: its words are *units*, runs of consecutive pretokens of one text piece, cut only
# at hard boundaries. Hard boundaries are the edges of the text pieces (document edges, special
# tokens) and, by split:
#
# - ``"hf"`` (the default): a pretoken that holds a digit (\p{N}) is a unit of its own, and two
#   pretokens that meet inside a run of whitespace (the left one ends with whitespace, the right one
#   starts with it) are cut apart. Every cut is a place in the text, so one regex (the HF ``Split``
#   of the export) finds the same units; inside a unit no stage-1 merge can cross a pretoken
#   boundary, so one merge list applied by rank (HF's BPE) gives the stage-aware result.
# - ``"units"`` (the split before, ``"default"`` in older model files): a numeric pretoken is a unit
#   of its own, cut further where stage-1 tokens meet at a digit/non-digit change or between groups
#   of three digits counted from the right; whitespace runs are not cut.
#
# A stage-2 merge must pass the rules (``superbpe_allows``).

_DIGIT = regex.compile(r"\p{N}")


def numeric_cuts(pretoken: bytes, token_lengths: Sequence[int]) -> list[int]:
    """Where a numeric pretoken's stage-1 tokens are cut into separate units (token indices).

    A cut goes between tokens ``i-1`` and ``i`` when the byte offset there is a hard boundary:
    a change between digit and non-digit characters, or a boundary between groups of three digits
    counted from the right inside a run of digits. A pretoken without digits gets no cut.

    >>> numeric_cuts(b" 1234567", [1, 1, 3, 3])   # ' ', '1', '234', '567'
    [1, 2, 3]
    >>> numeric_cuts(b" 1234567", [2, 6])         # ' 1' | '234567': a group boundary
    [1]
    >>> numeric_cuts(b" 1234567", [3, 5])         # ' 12' | '34567': inside a group, no cut
    []
    >>> numeric_cuts(b"abc", [1, 2])
    []
    """
    text = pretoken.decode("utf-8", "surrogateescape")
    if not _DIGIT.search(text):
        return []
    # byte offset of every character, and whether it is a digit
    offsets, digit = [], []
    pos = 0
    for ch in text:
        offsets.append(pos)
        digit.append(bool(_DIGIT.match(ch)))
        pos += len(ch.encode("utf-8", "surrogateescape"))
    hard = set()
    i = 0
    while i < len(text):
        if digit[i]:
            j = i
            while j < len(text) and digit[j]:
                j += 1
            if i > 0:
                hard.add(offsets[i])
            if j < len(text):
                hard.add(offsets[j])
            first = i + ((j - i) % 3 or 3)        # groups of three, counted from the right
            for k in range(first, j, 3):
                hard.add(offsets[k])
            i = j
        else:
            i += 1
    cuts, pos = [], 0
    for t, n in enumerate(token_lengths):
        if t > 0 and pos in hard:
            cuts.append(t)
        pos += n
    return cuts


def superbpe_allows(left: bytes, right: bytes, max_words: int = 4, forbidden: Sequence[bytes] = (b": ",),
                    max_token_bytes: int | None = None, max_nonalnum: int | None = None,
                    max_digits: int | None = None, known: Iterable[bytes] | None = None) -> bool:
    r"""The stage-2 rules for a merged token ``left + right``.

    ``max_digits``: no run of more than that many digits (``\p{N}``) in the token. ``known``: the
    bytes of the tokens so far; a merge that rebuilds one of them is refused (``distinct``).

    >>> superbpe_allows(b" of", b" the"), superbpe_allows(b"key:", b" value")
    (True, False)
    >>> superbpe_allows(b" a b c", b" d e")        # five words
    False
    >>> superbpe_allows(b"12", b"34", max_digits=3), superbpe_allows(b" the", b"n", known=[b" then"])
    (False, False)
    """
    merged = left + right
    if len(merged.split()) > max_words:
        return False
    if any(f in merged for f in forbidden):
        return False
    if max_token_bytes is not None and len(merged) > max_token_bytes:
        return False
    text = merged.decode("utf-8", "surrogateescape")
    if max_nonalnum is not None:
        if sum(1 for c in text if not (c.isalnum() or c.isspace())) > max_nonalnum:
            return False
    if max_digits is not None:
        if any(len(run) > max_digits for run in regex.findall(r"\p{N}+", text)):
            return False
    if known is not None and merged in known:
        return False
    return True


_SPACE = regex.compile(r"\s")


def _space_edges(pretoken: bytes) -> tuple[bool, bool]:
    r"""Whether a pretoken starts and ends with a whitespace character (``\s``)."""
    text = pretoken.decode("utf-8", "surrogateescape")
    return bool(text) and bool(_SPACE.match(text[0])), bool(text) and bool(_SPACE.match(text[-1]))


def superbpe_units(data: bytes, special_tokens: Sequence[str | bytes], pattern: str,
                   merges: Sequence[tuple[bytes, bytes]], split: str = "hf", with_regions: bool = False):
    """The stage-2 units of a text, each as its list of stage-1 tokens, in text order.

    With ``with_regions``, returns ``(units, regions)``: ``regions[k]`` numbers the region of unit
    ``k``. A region is the text between document edges and special tokens and, with the ``hf`` split,
    the whitespace-run cuts; numbers do not end it (the encoded-data rule looks at regions, so the
    digits of a uuencoded line do not hide it).

    >>> [b"".join(u) for u in superbpe_units(b"a b  c 123\\n\\nd", [], "gpt2", [])]
    [b'a b ', b' c', b' 123', b'\\n', b'\\nd']
    >>> superbpe_units(b"a b  c 123\\n\\nd", [], "gpt2", [], with_regions=True)[1]
    [0, 1, 1, 1, 2]
    >>> [b"".join(u) for u in superbpe_units(b"a b  c 123\\n\\nd", [], "gpt2", [], split="units")]
    [b'a b  c', b' ', b'123', b'\\n\\nd']
    """
    specials = encode_specials(special_tokens)
    units: list[list[bytes]] = []
    regions: list[int] = []
    region = -1
    for piece, is_special in split_on_specials(data, specials):
        if is_special:
            continue
        region += 1
        current: list[bytes] = []
        prev_ends_space = False
        for pretoken in pretokenize(piece, pattern):
            tokens = encode_pretoken(pretoken, merges)
            starts_space, ends_space = _space_edges(pretoken)
            if split == "hf" and prev_ends_space and starts_space:
                if current:
                    units.append(current)
                    regions.append(region)
                    current = []
                region += 1
            if _DIGIT.search(pretoken.decode("utf-8", "surrogateescape")):
                if current:
                    units.append(current)
                    regions.append(region)
                    current = []
                cuts = numeric_cuts(pretoken, [len(t) for t in tokens]) if split != "hf" else []
                for a, b in zip([0] + cuts, cuts + [len(tokens)]):
                    units.append(tokens[a:b])
                    regions.append(region)
            else:
                current.extend(tokens)
            prev_ends_space = ends_space
        if current:
            units.append(current)
            regions.append(region)
    return (units, regions) if with_regions else units


def looks_encoded(unit: bytes) -> bool:
    """Whether a stage-2 region (or unit) looks like encoded binary (uuencode): at least 40 bytes that
    are not ASCII whitespace, whitespace at most 1/16 of its bytes, and of the other bytes at least a
    quarter ASCII punctuation, at least a quarter ASCII letters or digits, and at least 1/20 digits.

    >>> looks_encoded(b"M#H]3IS5LB)$_(/;W+;`BTDT*EMK4/!87P:F.>!*>`R<W$&70E89/%:V@N$;!\\n")
    True
    >>> looks_encoded(b"plain prose " * 9), looks_encoded(b"-" * 60)    # prose; a rule
    (False, False)
    >>> looks_encoded(b"Windows/DOS PC-based tools\\n==========================")   # a heading
    False
    """
    ws = sum(1 for b in unit if b in b" \t\n\r\x0b\x0c")
    punct = sum(1 for b in unit if 0x21 <= b < 0x7F and not chr(b).isalnum())
    alnum = sum(1 for b in unit if b < 0x80 and chr(b).isalnum())
    digits = sum(1 for b in unit if 0x30 <= b <= 0x39)
    nonspace = len(unit) - ws
    return (nonspace >= 40 and ws * 16 <= len(unit) and punct * 4 >= nonspace and alnum * 4 >= nonspace
            and digits * 20 >= nonspace)


def train_superbpe_from_bytes(data: bytes, vocab_size: int, special_tokens: Sequence[str | bytes] = (),
                              pattern: str = "gpt2", transition: int | None = None, split: str = "hf",
                              distinct: bool = True, init_merges: Sequence[tuple[bytes, bytes]] | None = None,
                              skip_encoded: bool = True, **rules) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]], int]:
    """Two-stage SuperBPE; returns ``(vocab, merges, n_stage1_merges)``.

    ``transition`` is the vocabulary size at which stage 2 starts (``vocab_size``: plain BPE;
    ``256 + len(special_tokens)``: BPE without pre-tokenization boundaries, the digit rule aside).
    ``distinct``: stage 2 never merges a pair whose bytes are already a token (so every id holds
    bytes of its own); ``rules`` go to ``superbpe_allows`` (``max_digits`` defaults to 3, as in
    ``TrainConfig``). ``init_merges``: stage 1 is these merges (an existing BPE model's), not trained.
    ``skip_encoded``: the units of a region (``superbpe_units(with_regions=True)``) that
    ``looks_encoded`` are not counted in stage 2.
    """
    rules.setdefault("max_digits", 3)
    specials = encode_specials(special_tokens)
    transition = vocab_size if transition is None else transition
    if init_merges is not None:
        vocab = {i: bytes([i]) for i in range(256)}
        for tok in specials:
            vocab[len(vocab)] = tok
        merges = list(init_merges)
        for a, b in merges:
            vocab[len(vocab)] = a + b
    else:
        vocab, merges = train_bpe_from_bytes(data, min(transition, vocab_size), special_tokens, pattern)
    n_stage1 = len(merges)
    # Stage 2 starts where stage 1 stopped (also when stage 1 ran out of pairs early).
    words: dict[tuple[bytes, ...], int] = {}
    units, regions = superbpe_units(data, special_tokens, pattern, merges, split, with_regions=True)
    region_bytes: dict[int, bytes] = {}
    for unit, r in zip(units, regions):
        region_bytes[r] = region_bytes.get(r, b"") + b"".join(unit)
    encoded = {r for r, text in region_bytes.items() if skip_encoded and looks_encoded(text)}
    for unit, r in zip(units, regions):
        if r in encoded:
            continue
        key = tuple(unit)
        words[key] = words.get(key, 0) + 1

    def allowed(a: bytes, b: bytes) -> bool:
        known = set(vocab.values()) if distinct else None     # vocab grows in place
        return superbpe_allows(a, b, known=known, **rules)

    merge_loop(words, vocab, merges, vocab_size, allowed)
    assert len(vocab) == 256 + len(specials) + len(merges)
    return vocab, merges, n_stage1


def encode_superbpe(data: bytes | str, vocab: dict[int, bytes], merges: Sequence[tuple[bytes, bytes]],
                    n_stage1: int, special_tokens: Sequence[str | bytes] = (), pattern: str = "gpt2",
                    split: str = "hf") -> list[int]:
    """Stage-aware encoding: stage-1 merges inside pretokens, then stage-2 merges inside units."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    ids_of = token_ids(vocab)
    specials = encode_specials(special_tokens)
    stage1, stage2 = list(merges[:n_stage1]), list(merges[n_stage1:])
    out: list[int] = []
    for piece, is_special in split_on_specials(data, specials):
        if is_special:
            out.append(ids_of[piece])
            continue
        for unit in superbpe_units(piece, (), pattern, stage1, split):
            parts = tuple(unit)
            for pair in stage2:
                if len(parts) < 2:
                    break
                parts = merge_word(parts, pair)
            out.extend(ids_of[p] for p in parts)
    return out
