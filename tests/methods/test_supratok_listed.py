"""SupraTok's pass-2 units listed as they come (``documents.UnitList``, ``passes.listed_units_table``)
are the units counted (``UnitCounter``, ``superbpe.stage2_table``): the same units of pass-1 tokens,
each as often (numbers cut into their digit groups, encoded units flagged), in the scan's and the
record's listing alike. Training on them gives the same merges: ``test_supratok.py`` (record and
scan, restarts) and ``test_supratok_clean.py`` (the engine's route, listed, against the replay's,
counted) compare whole runs.
"""
from collections import Counter

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bpe_core.corpus.chunks import split_spans
from bpe_core.engine.merge import MergeEngine
from bpe_core.methods.superbpe import NUMERIC, stage2_table, word_classes, word_flags
from bpe_core.methods.supratok.documents import UnitList, count_documents
from bpe_core.methods.supratok.passes import listed_units_table, unit_chunks
from bpe_core.pretok.patterns import resolve_pattern
from bpe_core.pretok.pretokenize import pretoken_ends
from bpe_core.pretok.wordtable import WordTable

SPECIAL = b"<|endoftext|>"
WORDS = [b" the", b" cat", b",", b" 1234567", b" 12", b"7", b" 3.14", b"\xd9\xa3\xd9\xa4\xd9\xa5\xd9\xa6", b" x9y",
         b"\n", b"\n\n", b"  ", b" ve", b" bir", b"\xe4\xb8\xad\xe5\x9b\xbd", SPECIAL]
ENCODED = [b"M'XX%,#'A=9&4@#0A=9&4@#0A=9&4@#0A=9&4@#0A\n", b"*!A9&4@&3!4=9&4@#0A=9&4@#0A\n"]


def _table(text: bytes, pattern: str) -> WordTable:
    spans, _ = split_spans(text, 0, len(text), [SPECIAL])
    words = Counter()
    for s, e in spans:
        ends = pretoken_ends(text[s:e], pattern)
        words.update(text[s:e][a:b] for a, b in zip(np.concatenate(([0], ends[:-1])), ends))
    return WordTable.from_counts(words or {b"x": 1})


def _multiset(symbols, offsets, counts, encoded) -> Counter:
    out: Counter = Counter()
    for k in range(offsets.size - 1):
        out[(tuple(symbols[offsets[k]:offsets[k + 1]].tolist()), bool(encoded[k]))] += int(counts[k])
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(WORDS + ENCODED), max_size=120), st.sampled_from(["gpt2", "cl100k"]),
       st.integers(20, 400), st.booleans(), st.integers(0, 60), st.integers(1, 2))
@example([b" 1234567", b" 1234567", b",", b" 1234567", SPECIAL, b" 12"], "gpt2", 64, False, 8, 1)
@example([ENCODED[0], b" 1234567", ENCODED[0], b"\n", b" 7", ENCODED[1], SPECIAL, ENCODED[0]], "gpt2", 400, True, 30, 2)
def test_listed_units_are_the_counted_units(tmp_path_factory, words, pattern, chunk, skip_encoded, n_merges,
                                            workers):
    path = tmp_path_factory.mktemp("listed") / "corpus.txt"
    text = b"".join(words) + b" the"
    path.write_bytes(text)
    table = _table(text, pattern)
    engine = MergeEngine(table.symbols(), table.offsets, table.counts, [bytes([i]) for i in range(256)])
    engine.run(n_merges)
    seg_symbols, seg_offsets, _ = engine.words()
    token_lengths = np.array([len(t) for t in engine.tokens()], dtype=np.int64)
    flags = word_flags(table)
    numeric = (flags & NUMERIC) > 0
    marks = dict(flags=flags, classes=word_classes(table)) if skip_encoded else {}
    args = (str(path), table, None, [SPECIAL], resolve_pattern(pattern), workers, chunk, 1.0, 0.0, True)
    counted = count_documents(*args, **marks)
    listed = count_documents(*args, listed=True, **marks)
    assert not counted["listed"] and listed["listed"]
    assert (listed["seen"], listed["kept"]) == (counted["seen"], counted["kept"])
    want = _multiset(*stage2_table(counted["units"], table, seg_symbols, seg_offsets, numeric, token_lengths,
                                   narrow=True))
    got: Counter = Counter()
    for part in listed["units"]:
        symbols, offsets, counts, encoded = listed_units_table(part, table, seg_symbols, seg_offsets, numeric,
                                                               token_lengths)
        assert np.all(counts == 1)
        assert symbols.dtype == np.uint16           # (every pass-1 token id fits)
        got += _multiset(symbols, offsets, counts, encoded)
        # in chunks of whole units (pass 2 lists them so): the same units, in the same order
        chunks = [listed_units_table(c, table, seg_symbols, seg_offsets, numeric, token_lengths)
                  for c in unit_chunks(part, max(1, chunk // 16))]
        assert sum(int(c[1].size) - 1 for c in chunks) == offsets.size - 1
        assert np.concatenate([c[0] for c in chunks]).tolist() == symbols.tolist()
        assert np.concatenate([[0]] + [c[1][1:] + sum(int(d[0].size) for d in chunks[:k])
                                       for k, c in enumerate(chunks)]).tolist() == offsets.tolist()
        assert np.concatenate([c[3] for c in chunks]).tolist() == encoded.tolist()
    assert got == want
    # a sample is never listed (each unit is kept by a hash of the unit as counted)
    sampled = count_documents(*args[:7], 0.5, *args[8:], listed=True, **marks)
    assert not sampled["listed"]


@given(st.lists(st.integers(1, 9), max_size=12), st.data())
def test_unit_chunks_are_the_units_cut_at_each_multiple_of_the_chunk(lengths, data):
    """``unit_chunks`` for every chunk size from 1 to past the units' length: the chunks are the part
    again (ids, unit bounds, flags), in order, each of whole units, and a new chunk starts exactly at
    each unit that is the first to start at or after a multiple of the chunk size (one chunk when
    the part fits)."""
    starts = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    total = int(starts[-1])
    part = (np.arange(total, dtype=np.uint32), starts, np.array([n % 2 == 0 for n in lengths], dtype=bool))
    max_ids = data.draw(st.integers(1, total + 2))
    chunks = unit_chunks(part, max_ids)
    assert all(int(c[1][-1]) > 0 or total == 0 for c in chunks)
    assert np.concatenate([c[0] for c in chunks]).tolist() == part[0].tolist()
    assert np.concatenate([c[2] for c in chunks]).tolist() == part[2].tolist()
    firsts, at = [], 0
    for d, b, _ in chunks:
        assert b[0] == 0 and int(b[-1]) == d.size
        firsts.append(int(np.searchsorted(starts, at)))
        assert (b + at).tolist() == starts[firsts[-1]:firsts[-1] + b.size].tolist()
        at += d.size
    # the chunks' first units: for each multiple of the chunk size, the first unit (not the first
    # of the part) that starts at or after it (one chunk when the part fits: no such unit)
    want = sorted({next(u for u in range(len(lengths) + 1) if u == len(lengths) or starts[u] >= m * max_ids)
                   for m in range(1, total // max_ids + 1)} - {0, len(lengths)})
    assert firsts == [0] + want
    assert len(chunks) == 1 or total > max_ids


@given(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=5), max_size=8), st.integers(0, 12))
def test_unit_list_keeps_the_units_in_order(units, room):
    """``UnitList`` gives back the units it was given, in order, growing past a small room."""
    ul = UnitList(room)
    for k in range(0, len(units), 3):
        block = units[k:k + 3]
        ids = np.array([w for u in block for w in u], dtype=np.uint32)
        bounds = np.concatenate(([0], np.cumsum([len(u) for u in block]))).astype(np.int64)
        ul.add(ids, bounds, np.array([len(u) % 2 == 0 for u in block]))
    data, starts, encoded = ul.to_arrays()
    assert [data[starts[k]:starts[k + 1]].tolist() for k in range(starts.size - 1)] == units
    assert encoded.tolist() == [len(u) % 2 == 0 for u in units]
    assert ul.n_seen == len(units)
    joined = UnitList.join([(data, starts, encoded), (data, starts, encoded)])
    assert [joined[0][joined[1][k]:joined[1][k + 1]].tolist() for k in range(joined[1].size - 1)] == units + units
