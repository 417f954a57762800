"""The counting pass's record read through each chunk's map (``record_word_maps``, ``find_rows``,
``id_unit_stream(maps=)``): the same rows, stretches and units as the record rewritten to table rows
(``record_table_rows``), on random tables, ids and maps and on corpora counted in small chunks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.engine.units import find_rows, id_unit_stream
from bpe_core.errors import InternalError
from bpe_core.methods.record import PretokenRecord
from bpe_core.methods.superbpe import record_table_rows, record_word_maps, word_classes, word_flags
from bpe_core.pretok.counting import count_corpus
from bpe_core.pretok.patterns import resolve_pattern

SPECIAL = b"<|endoftext|>"
words_st = st.lists(st.binary(min_size=1, max_size=20), unique=True, max_size=60)


def _table(words):
    """``(arena, offsets)`` of ``words`` sorted in bytes order."""
    words = sorted(words)
    arena = np.frombuffer(b"".join(words), np.uint8)
    offsets = np.concatenate(([0], np.cumsum([len(w) for w in words]))).astype(np.int64)
    return arena, offsets, words


@settings(max_examples=200, deadline=None)
@given(words_st, st.data())
def test_find_rows_finds_each_word_as_the_plain_index(words, data):
    """Any subset of a sorted table (dense, sparse, its ends, empty) is found at its rows; a word
    missing from the table, or words out of order, are refused."""
    arena, offsets, table_words = _table(words)
    picks = sorted(data.draw(st.sets(st.sampled_from(table_words))) if table_words else [])
    w_arena, w_offsets, _ = _table(picks)
    got = find_rows(w_arena, w_offsets, arena, offsets)
    assert got.dtype == np.uint32 and got.tolist() == [table_words.index(w) for w in picks]
    extra = data.draw(st.binary(min_size=1, max_size=20))
    if extra not in table_words:
        with pytest.raises(ValueError, match="not in the table"):
            find_rows(*_table(picks + [extra])[:2], arena, offsets)
    if len(picks) > 1:        # out of order: the first word after the cursor is never found again
        backwards = np.frombuffer(b"".join(picks[::-1]), np.uint8)
        b_offsets = np.concatenate(([0], np.cumsum([len(w) for w in picks[::-1]]))).astype(np.int64)
        with pytest.raises(ValueError):
            find_rows(backwards, b_offsets, arena, offsets)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(0, 11), max_size=80), st.integers(0, 2 ** 32 - 1),
       st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([0xFFFFFFFFFFFFFFFF, 1 << 63, 1 << 62]))
def test_ids_through_maps_list_the_mapped_ids_units(n_words, ids, seed, cut_spaces, regions, narrow, keep_below):
    """``id_unit_stream(maps=)`` lists what ``id_unit_stream`` lists for the mapped ids
    (``maps[k][segments[k]]``): segments of local ids (some empty, some without a map), each with a
    random map into the words; in both loops (narrow: one record a word, or the general one), with
    or without a sample; an id past its map is refused."""
    rng = np.random.default_rng(seed)
    flags = rng.integers(0, 8, n_words).astype(np.uint8)
    kinds = np.array([[20, 0, 8, 8, 4], [5, 1, 0, 4, 0], [3, 3, 0, 0, 0]], dtype=np.int32)
    classes = np.ascontiguousarray(kinds[rng.integers(0, 3, n_words)]) if regions else None
    lens = rng.integers(0, 4, n_words)
    seg_offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    seg_symbols = rng.integers(0, 60000, int(seg_offsets[-1])).astype(np.uint32)
    n = len(ids)
    pieces = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 4))))
    bounds = list(zip(np.concatenate(([0], pieces)), np.concatenate((pieces, [n]))))
    segments, maps, mapped = [], [], []
    for a, b in bounds:
        if rng.integers(0, 4) == 0:     # a segment of word ids (no map)
            seg = np.array([i % n_words for i in ids[a:b]], dtype=np.uint32)
            segments.append(seg)
            maps.append(None)
            mapped.append(seg)
        else:
            n_local = int(rng.integers(1, 9))
            m = rng.integers(0, n_words, n_local).astype(np.uint32)
            seg = np.array([i % n_local for i in ids[a:b]], dtype=np.uint32)
            segments.append(seg)
            maps.append(m)
            mapped.append(m[seg])
    word_ids = np.concatenate(mapped).astype(np.uint32) if mapped else np.zeros(0, np.uint32)
    cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 4))))
    breaks = np.unique(np.concatenate(([0], cuts, [n]))).astype(np.int64)
    seg = (seg_symbols, seg_offsets)
    options = dict(marks=False, narrow=narrow, keep_below=keep_below)
    want = id_unit_stream(word_ids, breaks, flags, cut_spaces, classes, *seg, **options)
    got = id_unit_stream(segments, breaks, flags, cut_spaces, classes, *seg, maps=maps, **options)
    assert got[0].dtype == want[0].dtype and got[0].tolist() == want[0].tolist()
    assert got[1].tolist() == want[1].tolist() and got[2:4] == want[2:4] and got[4].tolist() == want[4].tolist()
    # word ids out (no segmentation, marks): the same through the maps
    want = id_unit_stream(word_ids, breaks, flags, cut_spaces, classes, keep_below=keep_below)
    got = id_unit_stream(segments, breaks, flags, cut_spaces, classes, keep_below=keep_below, maps=maps)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist() and got[2:] == want[2:]
    if any(m is not None and s.size for s, m in zip(segments, maps)):
        k = next(k for k, (s, m) in enumerate(zip(segments, maps)) if m is not None and s.size)
        bad = [s.copy() for s in segments]
        bad[k][-1] = maps[k].size          # one past its map
        for opts in (options, {}):
            with pytest.raises(ValueError, match="not below"):
                id_unit_stream(bad, breaks, flags, cut_spaces, classes, *seg, maps=maps, **opts)


def test_maps_are_checked():
    """A map must have an entry per array of ids, and name words of the table."""
    ids, breaks, flags = [np.array([0, 1], np.uint32)], np.array([0, 2]), np.zeros(3, np.uint8)
    with pytest.raises(ValueError, match="one entry per array"):
        id_unit_stream(ids, breaks, flags, maps=[None, None])
    with pytest.raises(ValueError, match="not below the 3 words"):
        id_unit_stream(ids, breaks, flags, maps=[np.array([0, 3], np.uint32)])


PIECES = [b" the", b" cat", b" 12", b"\n", b"\n\n", b"  ", b",", b"x", SPECIAL, SPECIAL * 2, b" 0123456789",
          b"\xc3\xa9t\xc3\xa9", b" M'XX%,#'A=9&4@#0A", b"*!A9&4@&3!4", b" dog", b".", b" sat", b"\xff",
          b" " + b"y" * 40]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=300).map(b"".join),
       st.sampled_from([64, 97, 700, 4096]), st.sampled_from([1, 2]), st.sampled_from([0, 2000, None]),
       st.booleans(), st.sampled_from([1.0, 0.5]))
def test_record_word_maps_read_as_the_rewritten_record(tmp_path_factory, text, chunk, workers, ram, with_seg,
                                                       fraction):
    """A corpus counted in chunks small enough to cut documents anywhere, its record in RAM or
    spilled: each chunk's ids through its map are the rows ``record_table_rows`` writes, the
    stretches of text the same, and the units listed from either the same (sampled or not)."""
    from bpe_core.methods.superbpe import units_from_records
    path = tmp_path_factory.mktemp("maps") / "c.txt"
    path.write_bytes(text)
    rec = PretokenRecord(1 << 30 if ram is None else ram, str(path.parent))
    table = count_corpus(str(path), [SPECIAL], resolve_pattern("gpt2"), workers, chunk, record=rec).as_numpy()
    assert all(len(r) == 7 for r in rec)      # (ids numbered as first seen, their rows last)
    segments, maps, breaks = record_word_maps(rec, table)
    ids = [np.asarray(s).copy() for s in segments]
    rows, want_breaks = record_table_rows([(r[0], r[1], r[2].copy()) + tuple(r[3:]) for r in rec], table)
    assert breaks.tolist() == want_breaks.tolist()
    assert [m[s].tolist() for s, m in zip(ids, maps)] == [r.tolist() for r in rows]
    flags, classes = word_flags(table), word_classes(table)
    seg = None
    if with_seg:
        rng = np.random.default_rng(len(text))
        lens = rng.integers(0, 4, table.n_words)
        seg = (rng.integers(0, 60000, int(lens.sum())).astype(np.uint32),
               np.concatenate(([0], np.cumsum(lens))).astype(np.int64))
    for n_workers in (1, 2):
        got, got_info = units_from_records(rec, table, flags, classes=classes, seg=seg, num_workers=n_workers,
                                           rows=(segments, maps, breaks), sample_fraction=fraction)
        want, want_info = units_from_records(rec, table, flags, classes=classes, seg=seg, num_workers=n_workers,
                                             rows=(rows, want_breaks), sample_fraction=fraction)
        assert got_info == want_info
        assert [[a.tolist() for a in part] for part in got] == [[a.tolist() for a in part] for part in want]
    rec.clear()


def test_record_word_maps_refuse_what_does_not_add_up(tmp_path):
    """A chunk word missing from the table, spans that do not end at the chunk's last pretoken, id
    rows that name no word of the chunk, or fewer pretokens than the table counts: ``InternalError``."""
    path = tmp_path / "c.txt"
    path.write_bytes(b" the cat<|endoftext|> the dog" * 20)
    rec = PretokenRecord(1 << 30)
    table = count_corpus(str(path), [SPECIAL], resolve_pattern("gpt2"), 1, 64, record=rec).as_numpy()
    chunks = list(rec)
    record_word_maps(chunks, table)
    a, o, i, s, n, e, r = chunks[0]
    with pytest.raises(InternalError, match="chunk 0"):     # a word not in the table
        record_word_maps([(np.frombuffer(b"zz", np.uint8), np.array([0, 2]), i[:0], s[:0], 0, e[:0])] + chunks[1:],
                         table)
    with pytest.raises(InternalError, match="spans"):
        record_word_maps([(a, o, i, s, n, e - 1, r)] + chunks[1:], table)
    with pytest.raises(InternalError, match="id rows"):
        record_word_maps([(a, o, i, s, n, e, r + len(r))] + chunks[1:], table)
    with pytest.raises(InternalError, match="pretokens"):
        record_word_maps(chunks[1:], table)
