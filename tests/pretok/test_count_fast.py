"""The plain count's fast path against plain Python: ``regex`` pieces summed by a ``Counter``.

``count_pretokens`` counts words of up to 15 bytes through a direct-mapped front cache (keyed with
the length in the top byte of the second word) into a short table with inline keys (slot numbers
change when it doubles), longer words into the long table, and sorts the short words as 24-byte keys
(written over the short table's slots; the length in the 16th byte) and the long words as 32-byte
keys, each by an MSD radix sort on their first 16 bytes, merging the two lists as it writes them out. The training path finds the
special tokens natively (``pretokenize.split_spans``). Each piece is checked here against the
plain definitions: ``corpus.chunks.split_spans`` (the ``re`` alternation) and ``regex.findall``
per span, counted by a ``Counter``, sorted as Python ``bytes``; and ``count_corpus`` (chunks,
workers, spill thresholds) against the same ``Counter`` over the whole file.

The inputs aim at the edges of the structures: words of 15, 16 and 17 bytes, words that differ
only in trailing NUL bytes (their zero-padded heads are equal: ``a``, ``a\\0``, ``a\\0\\0``), long
words sharing their first 16 bytes, a huge word, invalid UTF-8, special tokens and their fragments,
spans cut anywhere (inside UTF-8 sequences too), thousands of distinct words (the short table grows
from its smallest size while front slots hold pending counts; more than 64 words share their first
bytes, so the radix sort recurses).
"""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.corpus.chunks import split_spans as split_spans_regex
from bpe_core.pretok import _pretok, counting
from bpe_core.pretok.patterns import PATTERNS
from bpe_core.pretok.pretokenize import count_pretokens, split_spans
from paths import package_parent

NAMES = list(PATTERNS)  # gpt2, cl100k, o200k
SPECIAL = b"<|endoftext|>"
COMPILED = {name: regex.compile(PATTERNS[name]) for name in NAMES}

PIECES = [b"the", b" the", b"The", b" cat", b"a", b"a\x00", b"a\x00\x00", b"\x00", b" ", b"  ", b"\n",
          b"\r\n", b"\t", b"0", b"123", b"'s", b"'LL", b".", b",!?", b"--", b"/",
          b"x" * 15, b"x" * 16, b"x" * 17, b" " + b"y" * 15, b"z" * 16 + b"\x00", b"abcdefghijklmnop",
          b"abcdefghijklmnopq", b"abcdefghijklmnopqr", b"abcdefghijklmnopqq", b"\xff" * 20,
          "é".encode(), "日本語".encode(), "\u00a0".encode(), "😀".encode(), b"\x80", b"\xc3", b"\xe2\x82",
          b"\xed\xa0\x80", SPECIAL, SPECIAL, b"<|", b"|>", b"<|endoftext"]
texts = st.one_of(st.lists(st.sampled_from(PIECES), max_size=80).map(b"".join), st.binary(max_size=120))


def reference_counts(data: bytes, spans, name: str) -> list[tuple[bytes, int]]:
    """Plain Python: ``regex.findall`` over each span (decoded with surrogateescape), a Counter."""
    counts: Counter = Counter()
    for a, b in np.asarray(spans).tolist():
        text = data[a:b].decode("utf-8", "surrogateescape")
        counts.update(p.encode("utf-8", "surrogateescape") for p in COMPILED[name].findall(text))
    return sorted(counts.items())


def table_items(table) -> list[tuple[bytes, int]]:
    arena, offsets, counts = table
    assert arena.dtype == np.uint8 and offsets.dtype == np.int64 and counts.dtype == np.int64
    return [(arena[offsets[i]:offsets[i + 1]].tobytes(), int(counts[i])) for i in range(len(counts))]


# ==== Special tokens ==============================================================================

TOKEN_SETS = [[SPECIAL], [SPECIAL, b"<|pad|>"], [b"<s>", b"<s>x", b"x<s>"], [b"aa"], [b"a", b"ab", b"abc"],
              [b"\x00"], [b"\xff\xfe", b"\xfe"]]


@given(st.lists(st.sampled_from(PIECES + [b"<s>", b"x", b"<|pad|>", b"aaa", b"ab", b"\xfe\xff"]),
                max_size=60).map(b"".join),
       st.one_of(st.sampled_from(TOKEN_SETS), st.lists(st.binary(min_size=1, max_size=3), min_size=1, max_size=4)),
       st.integers(0, 400), st.integers(0, 400))
def test_split_spans_equals_the_regex_split(data, tokens, a, b):
    start, end = sorted((a % (len(data) + 1), b % (len(data) + 1)))
    spans, n = split_spans(data, start, end, tokens)
    want_spans, want_n = split_spans_regex(data, start, end, tokens)
    assert spans.dtype == np.int64 and spans.shape[1:] == (2,)
    assert spans.tolist() == want_spans.tolist() and n == want_n
    # a memory-mapped-like buffer (uint8 array) too
    spans, n = split_spans(np.frombuffer(data, np.uint8), start, end, tokens)
    assert spans.tolist() == want_spans.tolist() and n == want_n


def test_split_spans_edges():
    assert split_spans(b"", 0, 0, [SPECIAL])[0].shape == (0, 2)
    # tokens that end the range, start it, fill it, or follow each other
    assert split_spans(b"ab<s>", 0, 5, [b"<s>"])[0].tolist() == [[0, 2]]
    assert split_spans(b"ab<s>", 0, 5, [b"<s>", b"b"])[0].tolist() == [[0, 1]]
    assert split_spans(b"<s>ab", 0, 5, [b"<s>"]) [0].tolist() == [[3, 5]]
    assert split_spans(b"x<s><s>", 1, 7, [b"<s>"])[1] == 2
    assert split_spans(b"x<s><s>", 1, 7, [b"<s>"])[0].shape == (0, 2)
    assert split_spans(b"abc", 0, 3, [])[0].tolist() == [[0, 3]]
    # a token cut by the end of the range is not found; an empty token falls back to the regex
    assert split_spans(SPECIAL, 0, len(SPECIAL) - 1, [SPECIAL])[1] == 0
    for tokens in ([b""], [b"", b"a"]):
        got = split_spans(b"bab", 0, 3, tokens)
        want = split_spans_regex(b"bab", 0, 3, tokens)
        assert got[0].tolist() == want[0].tolist() and got[1] == want[1]
    with pytest.raises(ValueError):
        split_spans(b"abc", 2, 5, [b"a"])


# ==== Counting ====================================================================================


@given(texts, st.lists(st.integers(0, 10_000), max_size=6))
def test_count_equals_counter(data, cuts):
    """Spans between special tokens (native search), cut further anywhere."""
    spans, n = split_spans(data, 0, len(data), [SPECIAL])
    want_spans, want_n = split_spans_regex(data, 0, len(data), [SPECIAL])
    assert spans.tolist() == want_spans.tolist() and n == want_n
    bounds = sorted({c % (len(data) + 1) for c in cuts})
    pieces = []
    for a, b in spans.tolist():
        inner = [a] + [c for c in bounds if a < c < b] + [b]
        pieces += list(zip(inner[:-1], inner[1:]))
    spans = np.array(pieces, dtype=np.int64).reshape(-1, 2)
    for name in NAMES:
        assert table_items(count_pretokens(data, spans, name)) == reference_counts(data, spans, name)


@settings(max_examples=10)
@given(st.sampled_from(NAMES), st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 60]))
def test_many_distinct_words(name, seed, n_spans):
    """Thousands of distinct words of every length 1..40 (many NULs), each seen 1..4 times in a
    shuffled order: the short table doubles from its smallest size, front slots are evicted with
    counts pending, long words share heads; spans are cut at random places."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"ab\x00 zZ9.\xc3\xa9", np.uint8)
    words = set()
    while len(words) < 6000:
        n = int(rng.integers(1, 41))
        words.add(b"q" + alphabet[rng.integers(0, len(alphabet), n)].tobytes())
    stream = [w for w in sorted(words) for _ in range(int(rng.integers(1, 5)))]
    order = rng.permutation(len(stream))
    data = b" ".join(stream[i] for i in order)
    cuts = np.sort(rng.integers(0, len(data) + 1, n_spans - 1))
    bounds = np.concatenate([[0], cuts, [len(data)]])
    spans = np.stack([bounds[:-1], bounds[1:]], axis=1).astype(np.int64)
    assert table_items(count_pretokens(data, spans, name)) == reference_counts(data, spans, name)


TAILS = [bytes([c]) for c in (0, 1, 2, 5, 8, 0x0E, 0x0F, 0x10, 0x11, 0x1F, 0x7F)]  # "other", not \s


@settings(max_examples=40)
@given(st.lists(st.tuples(st.integers(0, 17), st.lists(st.sampled_from(TAILS), max_size=4)),
                min_size=1, max_size=60),
       st.sampled_from([b"!", b"x", b"\x01", b"\x00"]), st.integers(1, 3))
def test_keys_with_the_length_in_the_top_byte(words, fill, repeats):
    """Words of up to 21 bytes ending in bytes 0x00..0x1F, several times over: the front cache keys a
    word of up to 15 bytes with its length in the byte after it (``_count_front.h``), a word of 16
    or more with bit 4 set there (it goes to the long table); no word may be taken for another
    (``a!!..!\x0f`` of 16 bytes against the 15 bytes before it, NULs against padding)."""
    data = b"\n".join(fill * n + b"".join(tail) for n, tail in words) * repeats
    spans = np.array([[0, len(data)]], dtype=np.int64)
    for name in NAMES:
        assert table_items(count_pretokens(data, spans, name)) == reference_counts(data, spans, name)


SORT_BYTES = [b"\x00", b"\x01", b"\x05", b"\x0f", b"\x10", b"\x11", b"!"]  # "other": one piece per run


@settings(max_examples=60)
@given(st.lists(st.lists(st.sampled_from(SORT_BYTES), min_size=1, max_size=20).map(b"".join),
                min_size=1, max_size=120),
       st.integers(0, 70))
def test_short_and_long_words_in_bytes_order(words, pad):
    """Short words (up to 15 bytes, sorted with their length as the 16th key byte) and long words
    (16 or more, sorted apart) merged in bytes order: words equal in their first 15 bytes once
    padded with NULs (a short word and the long words it begins, or a long word whose 16th byte is a
    small number, the same as a short word's length tag), above and below 64 words (the radix sort's
    small groups)."""
    extra = [b"\x01" + b"\x00" * k + bytes([t]) for k in range(pad % 18) for t in (0, 1, 5, 15, 16)]
    data = b"\n".join(words + extra)
    spans = np.array([[0, len(data)]], dtype=np.int64)
    for name in NAMES:
        assert table_items(count_pretokens(data, spans, name)) == reference_counts(data, spans, name)


@pytest.mark.parametrize("name", NAMES)
def test_huge_and_repeated_words(name):
    """A 300k-byte word, 70k repeats of one word (all front-cache hits), and words whose 16-byte heads
    collide (zero padding, shared prefixes) in one buffer."""
    heads = [b"p" * 16 + bytes([c]) * k for c in (0, 1, 255) for k in range(0, 5)]
    data = (b"a" * 300_000 + b" " + b" the" * 70_000 + b" " + b"\x00".join(heads) + b"\n"
            + b"a\x00" * 50 + b"\xff" * 1000 + "é".encode() * 5000)
    spans = np.array([[0, len(data)], [5, 300_010], [300_000, len(data) - 7]], dtype=np.int64)
    assert table_items(count_pretokens(data, spans, name)) == reference_counts(data, spans, name)


# ==== count_corpus: chunks, workers and spill thresholds ==========================================


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    rng = np.random.default_rng(7)
    pieces = PIECES + [b" w%d" % i for i in range(400)]
    stream = [pieces[i] for i in rng.integers(0, len(pieces), 12_000)]
    path = tmp_path_factory.mktemp("count_fast") / "corpus.txt"
    path.write_bytes(b"".join(stream))
    return path


@settings(max_examples=12, deadline=None)
@given(data=st.data(), workers=st.sampled_from([1, 2]), chunk=st.sampled_from([1 << 10, 4 << 10, 64 << 10]),
       name=st.sampled_from(NAMES))
def test_count_corpus_equals_counter(small_corpus, tmp_path_factory, data, workers, chunk, name):
    """The whole training count, any chunk size, worker count and spill threshold (from always
    spilling to never): the Counter of the regex pieces between the special tokens, in bytes order."""
    raw = small_corpus.read_bytes()
    spans, n_specials = split_spans_regex(raw, 0, len(raw), [SPECIAL])
    want = reference_counts(raw, spans, name)
    threshold = data.draw(st.one_of(st.none(), st.integers(0, 3 * len(raw))), label="threshold")
    spill_dir = tmp_path_factory.mktemp("runs")
    report = {"seconds": {}}
    table = counting.count_corpus(str(small_corpus), [SPECIAL], name, workers, chunk, report=report,
                                  spill_threshold_bytes=threshold, spill_dir=str(spill_dir))
    assert list(table.to_dict().items()) == want
    assert report["special_token_occurrences"] == n_specials
    assert report["pretokens_counted"] == sum(c for _, c in want)
    if threshold == 0:
        assert report["spilled_runs"] > 0
    assert os.listdir(spill_dir) == []


# ==== Memory: what the budget counts for a counting worker =========================================

#: The short table's worst moment per distinct word: doubling at 3/4 full holds the old slots and
#: the new (32 B / 0.75 + 2 * 32 B / 0.75); the end (slots at 3/8 full + a 32-byte key) is below it.
WORST_BYTES_PER_WORD = 128

# Run in a fresh interpreter, the input read from a file in one piece: in the test process, memory
# freed by earlier work would be reused unseen.
MEASURE = """
import sys, numpy as np
from bpe_core.pretok.pretokenize import count_pretokens
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
data = np.fromfile(sys.argv[1], dtype=np.uint8)
count_pretokens(data[:4096], np.array([[0, 4096]]), "gpt2")  # first-call allocations
open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from the resident size
base = status("VmRSS")
table = count_pretokens(data, np.array([[0, len(data)]]), "gpt2")
print(status("VmHWM") - base, len(table[2]))
"""


def _letters(i: int) -> bytes:
    out = b""
    while True:
        out += bytes([97 + i % 26])
        i //= 26
        if i == 0:
            return out


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
@pytest.mark.parametrize("kind", ["zipf", "distinct"])
def test_count_memory_fits_the_budget_model(kind, tmp_path):
    """The peak resident memory ``count_pretokens`` adds beyond its input (its tables, keys and the
    sorted table it returns). On Zipf-like words (no more distinct ones than ``runtime.budget``
    assumes natural text has) it stays within what the budget charges a counting worker beyond
    its chunk: ``0.25 * chunk`` (scan buffers) + the front cache + the estimated distinct words
    times ``CHUNK_TABLE_BYTES_PER_WORD``. On text where every word is new (more distinct words than
    the estimate, which the budget cannot foresee) it stays within the structure's worst case per
    distinct word."""
    import subprocess
    import sys

    from bpe_core.runtime import budget

    rng = np.random.default_rng(11)
    if kind == "zipf":
        vocab = [b" " + _letters(i) for i in range(40_000)]
        ranks = np.minimum(rng.zipf(1.2, 1_500_000), len(vocab)) - 1
        data = b"".join(vocab[i] for i in ranks.tolist())
    else:
        data = b"".join(b" " + _letters(i) for i in range(300_000))
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    # from tmp_path with the package this test imports (a clean clone's root holds the unbuilt source)
    env = dict(os.environ, PYTHONPATH=package_parent())
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    peak, n_words = int(out[0]), int(out[1])
    estimate = budget.unique_pretokens_estimate(len(data))
    fixed = 0.25 * len(data) + budget.COUNT_FRONT_BYTES
    if kind == "zipf":
        assert n_words <= estimate
        allowed = fixed + estimate * budget.CHUNK_TABLE_BYTES_PER_WORD
    else:
        assert n_words > estimate
        allowed = fixed + n_words * WORST_BYTES_PER_WORD
    assert peak <= allowed, (kind, len(data), n_words, estimate, peak, allowed)


def test_reused_read_buffers_hold_no_stale_bytes(small_corpus, monkeypatch):
    """Chunks are read into buffers reused from chunk to chunk (``counting.ReadBuffers``): a buffer
    longer than the chunk holds the bytes of an earlier one past its end, a buffer too short for the
    next chunk is dropped for a new one. With buffers rounded to the byte (every size difference
    matters) and filled with garbage first, the count is still the Counter of the regex pieces."""
    taken = []

    class Dirty(counting.ReadBuffers):
        GRAIN, SLACK = 1, 0

        def take(self, n):
            buf = super().take(n)
            taken.append((len(buf), n))
            buf[:] = 0xFF if len(taken) % 2 else ord("a")   # garbage a chunk must never count
            return buf

    monkeypatch.setattr(counting, "ReadBuffers", Dirty)
    raw = small_corpus.read_bytes()
    spans, _ = split_spans_regex(raw, 0, len(raw), [SPECIAL])
    for workers in (1, 2):
        taken.clear()
        table = counting.count_corpus(str(small_corpus), [SPECIAL], "gpt2", workers, 1 << 10)
        assert list(table.to_dict().items()) == reference_counts(raw, spans, "gpt2")
        assert len(taken) > 10 and any(size > n for size, n in taken)       # reused, longer than the chunk


# ==== A counter's tables kept from chunk to chunk (CountScratch) ==================================


def _distinct_words(seed: int, n_words: int) -> bytes:
    """``n_words`` distinct words of 1..40 bytes, each once, shuffled (the short table doubles)."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"ab\x00 zZ9.\xc3\xa9", np.uint8)
    words = set()
    while len(words) < n_words:
        words.add(b"q" + alphabet[rng.integers(0, len(alphabet), int(rng.integers(1, 41)))].tobytes())
    return b" ".join(rng.permutation(sorted(words)).tolist())


ADVERSARIAL = [b"", b"a", b"x" * 5000, b"\x00" * 3000, b" " * 4000, b"ab" * 2500, b"\xff" * 2000,
               "日本語".encode() * 700]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(texts, st.sampled_from(ADVERSARIAL),
                          st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([100, 3000, 40000]))),
                min_size=1, max_size=5),
       st.sampled_from(NAMES))
def test_count_with_a_kept_scratch_equals_a_fresh_count(inputs, name):
    """One ``CountScratch`` through a sequence of inputs (large ones grow its short table, which the
    next, small one then starts with; a small input wants a smaller front cache than the one kept;
    one repeated byte, no whitespace): every table equals the count without it and the Counter."""
    from bpe_core.pretok._pretok import CountScratch

    scratch = CountScratch()
    for item in inputs:
        data = _distinct_words(*item) if isinstance(item, tuple) else item
        spans, _ = split_spans(data, 0, len(data), [SPECIAL])
        got = table_items(count_pretokens(data, spans, name, scratch=scratch))
        assert got == table_items(count_pretokens(data, spans, name)) == reference_counts(data, spans, name)
        assert scratch.nbytes > 0           # the tables went back into it
    scratch.clear()
    assert scratch.nbytes == 0


def test_count_corpus_reuses_the_counters_tables(small_corpus, monkeypatch):
    """``count_corpus`` hands each chunk's count a kept ``CountScratch`` (no more of them than
    workers), and frees the idle ones: the count is the Counter of the regex pieces."""
    made = []

    class Counted(counting.ReadBuffers):
        def take_scratch(self):
            s = super().take_scratch()
            if not any(s is m for m in made):
                made.append(s)
            return s

    monkeypatch.setattr(counting, "ReadBuffers", Counted)
    raw = small_corpus.read_bytes()
    spans, _ = split_spans_regex(raw, 0, len(raw), [SPECIAL])
    for workers in (1, 2):
        made.clear()
        table = counting.count_corpus(str(small_corpus), [SPECIAL], "gpt2", workers, 1 << 10)
        assert list(table.to_dict().items()) == reference_counts(raw, spans, "gpt2")
        assert 1 <= len(made) <= workers and all(s.nbytes == 0 for s in made)   # reused; freed at the end


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(NAMES), st.integers(0, 2**32 - 1), st.sampled_from([64, 300, 5000]))
def test_front_slots_that_turn_misses_away(name, seed, n_hot):
    """A word stays in its front slot while it was hit since the last miss there (its age, capped),
    so a miss is then counted in the short table without taking the slot: hot words hit hundreds of
    times (ages at the cap) among thousands of words seen once (misses that age them), then the hot
    set changes (the old words age out and are evicted with counts pending, the new ones take their
    slots), with the short table growing meanwhile (its slot numbers change under pending counts).
    Spans are cut at random places: every count is the ``Counter``'s."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"abcdefgh\x00 9.\xc3\xa9", np.uint8)

    def words(k, lo, hi, tag):
        out = set()
        while len(out) < k:
            out.add(tag + alphabet[rng.integers(0, len(alphabet), int(rng.integers(lo, hi)))].tobytes())
        return sorted(out)

    hot_a, hot_b, once = words(n_hot, 1, 14, b"x"), words(n_hot, 1, 14, b"y"), words(4000, 1, 20, b"z")
    halves = []
    for hot in (hot_a, hot_b):
        stream = [hot[i] for i in rng.zipf(1.3, 6000) % len(hot)] + once[: len(once) // 2]
        once = once[len(once) // 2:]
        halves.append(b" ".join(stream[i] for i in rng.permutation(len(stream))))
    data = b" ".join(halves)
    cuts = np.sort(rng.integers(0, len(data) + 1, 3))
    bounds = np.concatenate([[0], cuts, [len(data)]])
    spans = np.stack([bounds[:-1], bounds[1:]], axis=1).astype(np.int64)
    want = reference_counts(data, spans, name)
    assert table_items(count_pretokens(data, spans, name)) == want
    was = _pretok.set_front_aging(False)      # a plain direct-mapped cache: the same counts
    try:
        assert table_items(count_pretokens(data, spans, name)) == want
    finally:
        _pretok.set_front_aging(was)
