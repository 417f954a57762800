"""``superbpe.units.stage2_table`` with ``cut_numbers`` (the ``"units"`` split, SupraTok's pass 2 and
final count) equals the plain way unit by unit (expand each unit's words into their stage-1 tokens;
a unit of one numeric word is cut at ``numeric_cuts_plain``), marked (encoded) units included; and
``numeric_cuts``' ASCII path equals ``numeric_cuts_plain`` on any bytes and token lengths."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.engine.units import ENCODED_MARK
from bpe_core.methods.superbpe import numeric_mask
from bpe_core.methods.superbpe.units import stage2_table
from bpe_core.methods.superbpe.words import numeric_cuts, numeric_cuts_plain
from bpe_core.pretok.wordtable import WordTable

WORDS = [b" the", b"1", b" 12", b"2024", b" 1234567", b"12345", b" ", b"a1b22", b"\xd9\xa3\xd9\xa3", b"x",
         b" \xc2\xb2", b"3.5", b"1,000", b"\xff9"]
ascii_or_not = st.one_of(st.binary(max_size=14),
                         st.lists(st.sampled_from(list(b"0123456789 a,.")), max_size=14).map(bytes))


@settings(max_examples=400, deadline=None)
@given(ascii_or_not, st.lists(st.integers(1, 5), max_size=16))
def test_numeric_cuts_equal_the_plain_twin(pretoken, lengths):
    assert numeric_cuts(pretoken, lengths) == numeric_cuts_plain(pretoken, lengths)


def _plain(units, table, seg_symbols, seg_offsets, numeric, token_lengths):
    data, starts, counts = units
    syms, lens, cnts, enc = [], [], [], []
    for u in range(len(starts) - 1):
        ids = [int(x) for x in data[starts[u]:starts[u + 1]]]
        marked = bool(ids) and ids[-1] == ENCODED_MARK
        if marked:
            ids = ids[:-1]
        toks = [[int(t) for t in seg_symbols[seg_offsets[w]:seg_offsets[w + 1]]] for w in ids]
        if len(ids) == 1 and numeric[ids[0]]:
            w = ids[0]
            word = bytes(table.arena[table.offsets[w]:table.offsets[w + 1]])
            cuts = numeric_cuts_plain(word, [int(token_lengths[t]) for t in toks[0]])
            pieces = [toks[0][a:b] for a, b in zip([0] + cuts, cuts + [len(toks[0])])]
        else:
            pieces = [[t for ts in toks for t in ts]]
        for p in pieces:
            syms.extend(p)
            lens.append(len(p))
            cnts.append(int(counts[u]))
            enc.append(marked)
    return syms, lens, cnts, enc


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, len(WORDS) - 1), max_size=5), st.integers(1, 9), st.booleans()),
                max_size=20),
       st.lists(st.integers(1, 3), min_size=60, max_size=60))
def test_stage2_table_cuts_numbers_as_the_plain_way(units, split_at):
    table = WordTable.from_counts({w: 1 for w in WORDS})
    arena, offs = np.asarray(table.arena), np.asarray(table.offsets)
    # a stage-1 segmentation: each word cut into runs of 1-3 bytes; token ids are (start, length) pairs
    tokens, seg_symbols, seg_offsets = {}, [], [0]
    k = 0
    for w in range(table.n_words):
        b = bytes(arena[offs[w]:offs[w + 1]])
        i = 0
        while i < len(b):
            n = min(split_at[k % len(split_at)], len(b) - i)
            k += 1
            seg_symbols.append(tokens.setdefault(b[i:i + n], len(tokens)))
            i += n
        seg_offsets.append(len(seg_symbols))
    token_lengths = np.zeros(len(tokens), dtype=np.int64)
    for t, i in tokens.items():
        token_lengths[i] = len(t)
    seg_symbols = np.array(seg_symbols, dtype=np.uint32)
    seg_offsets = np.array(seg_offsets, dtype=np.int64)
    row = {bytes(arena[offs[w]:offs[w + 1]]): w for w in range(table.n_words)}
    data, starts, counts = [], [0], []
    for ids, count, marked in units:
        data.extend(row[WORDS[i]] for i in ids)
        if marked:
            data.append(ENCODED_MARK)
        starts.append(len(data))
        counts.append(count)
    given_units = (np.array(data, dtype=np.uint32), np.array(starts, dtype=np.int64), np.array(counts, dtype=np.int64))
    numeric = numeric_mask(table)
    syms, offsets, cnts, enc = stage2_table(given_units, table, seg_symbols, seg_offsets, numeric, token_lengths)
    p_syms, p_lens, p_cnts, p_enc = _plain(given_units, table, seg_symbols, seg_offsets, numeric, token_lengths)
    # (the plain way lists the pieces in unit order; stage2_table lists the other units first, then
    # the numeric ones: compare as multisets of (symbols, count, encoded))
    got = sorted((tuple(syms[offsets[i]:offsets[i + 1]].tolist()), int(cnts[i]), bool(enc[i]))
                 for i in range(len(offsets) - 1))
    starts_p = np.concatenate(([0], np.cumsum(p_lens))).astype(int)
    want = sorted((tuple(p_syms[starts_p[i]:starts_p[i + 1]]), p_cnts[i], p_enc[i]) for i in range(len(p_lens)))
    assert got == want
    assert syms.dtype == np.uint32 and offsets.dtype == np.int64 and cnts.dtype == np.int64 and enc.dtype == bool
    # narrow (SupraTok's pass 2): the same table with uint16 symbols (every token id here fits)
    n_syms, n_offsets, n_cnts, n_enc = stage2_table(given_units, table, seg_symbols, seg_offsets, numeric,
                                                    token_lengths, narrow=True)
    assert n_syms.dtype == np.uint16 and n_syms.tolist() == syms.tolist()
    assert n_offsets.tolist() == offsets.tolist() and n_cnts.tolist() == cnts.tolist()
    assert n_enc.tolist() == enc.tolist()
    # give_up: the marks stripped in place (on copies of the units here), the same table
    g_syms, g_offsets, g_cnts, g_enc = stage2_table(tuple(np.array(a) for a in given_units), table, seg_symbols,
                                                    seg_offsets, numeric, token_lengths, give_up=True)
    assert g_syms.tolist() == syms.tolist() and g_offsets.tolist() == offsets.tolist()
    assert g_cnts.tolist() == cnts.tolist() and g_enc.tolist() == enc.tolist()
    # ... and uint32 when a token id does not fit (the same symbols)
    wide = seg_symbols + np.uint32(0x10000)
    w_syms, w_offsets, _, _ = stage2_table(given_units, table, wide, seg_offsets, numeric, _shifted(token_lengths),
                                           narrow=True)
    assert w_syms.dtype == np.uint32 and (w_syms - np.uint32(0x10000)).tolist() == syms.tolist()
    assert w_offsets.tolist() == offsets.tolist()


def _shifted(token_lengths):
    """Token lengths indexed by ids 0x10000 higher (the ids below are unused)."""
    return np.concatenate((np.ones(0x10000, np.int64), token_lengths))
