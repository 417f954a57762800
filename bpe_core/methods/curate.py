"""Entropy curation (SupraTok, Tănase & Pelican 2025, section 3.2): keep documents by their
character-bigram entropy.

Each document (text between special tokens) gets

    H(doc) = -sum_b p(b) log2 p(b)        over the character bigrams b of the document

and falls into a bin: ``low`` (H < 3.0), ``medium`` (3.0 <= H <= 4.5) or ``high`` (H > 4.5), which keep
10%, 50% and 90% of their documents. Whether a document is kept is decided by a keyed hash of its
bytes (``blake2b(doc, key=seed)``) compared with the bin's rate, so the choice depends only on the
document, the bin and the seed: never on file order, chunking or worker count. The shares are
therefore expected values, not exact counts (a bin of 10 documents may keep 0 or 3 of them).

Documents are kept byte for byte, special tokens between kept documents stay as they were.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import mmap
import os
import shutil
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterator

from ..corpus.files import check_input
from ..corpus.specials import DEFAULT_SPECIAL_TOKEN
from ..runtime.atomic import atomic_write, new_temp_dir

#: (name, lower bound inclusive, upper bound inclusive, keep share), in the paper's order.
BINS: tuple[tuple[str, float], ...] = (("low", 0.10), ("medium", 0.50), ("high", 0.90))
LOW_BELOW = 3.0
HIGH_ABOVE = 4.5


def bigram_entropy(text: str) -> float:
    """Character-bigram entropy of a text in bits (0.0 for fewer than two characters).

    >>> bigram_entropy("aaaa"), round(bigram_entropy("abab"), 4), round(bigram_entropy("abcd"), 4)
    (0.0, 0.9183, 1.585)
    """
    n = len(text) - 1
    if n <= 0:
        return 0.0
    counts = Counter(zip(text, text[1:]))
    h = -sum(c / n * math.log2(c / n) for c in counts.values())
    return h if h > 0 else 0.0


def entropy_bin(h: float) -> str:
    """The bin of an entropy value.

    >>> entropy_bin(2.99), entropy_bin(3.0), entropy_bin(4.5), entropy_bin(4.51)
    ('low', 'medium', 'medium', 'high')
    """
    if h < LOW_BELOW:
        return "low"
    if h > HIGH_ABOVE:
        return "high"
    return "medium"


def keep_share(bin_name: str) -> float:
    return dict(BINS)[bin_name]


def keep_document(doc: bytes, bin_name: str, seed: int = 0) -> bool:
    """Seeded, order-free choice: keep ``doc`` when its keyed hash falls below the bin's share."""
    key = int(seed).to_bytes(8, "little", signed=True)
    h = int.from_bytes(hashlib.blake2b(doc, digest_size=8, key=key).digest(), "little")
    return h < keep_share(bin_name) * 2.0 ** 64


@dataclass
class CurationReport:
    """Counts per bin and bytes kept."""

    seed: int
    documents: dict[str, int] = field(default_factory=lambda: {b: 0 for b, _ in BINS})
    kept: dict[str, int] = field(default_factory=lambda: {b: 0 for b, _ in BINS})
    bytes_in: int = 0
    bytes_kept: int = 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["documents_total"] = sum(self.documents.values())
        d["kept_total"] = sum(self.kept.values())
        d["bytes_kept_share"] = round(self.bytes_kept / self.bytes_in, 6) if self.bytes_in else 1.0
        return d


def iter_documents(buf, special: bytes) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each document of ``buf`` (the text between occurrences of ``special``).

    >>> list(iter_documents(b"ab<s>c<s>", b"<s>"))
    [(0, 2), (5, 6), (9, 9)]
    """
    start = 0
    n = len(buf)
    while True:
        i = buf.find(special, start)
        if i < 0:
            yield start, n
            return
        yield start, i
        start = i + len(special)


def curate_bytes(data: bytes, seed: int = 0, special: bytes = DEFAULT_SPECIAL_TOKEN.encode()) -> tuple[bytes, CurationReport]:
    """Curate a corpus held in memory; returns the kept text and the report.

    >>> out, rep = curate_bytes(b"aaaaaaaa<|endoftext|>" * 3, seed=0)
    >>> rep.documents["low"], rep.bytes_in          # the empty piece after the last separator is skipped
    (3, 63)
    """
    import io

    out = io.BytesIO()
    report = _curate(data, out, seed, special)
    return out.getvalue(), report


def curate_file(input_path: str, out_path: str, seed: int = 0,
                special: str = DEFAULT_SPECIAL_TOKEN) -> CurationReport:
    """Curate a file into ``out_path`` (written to a temp file and renamed).

    Raises:
        CorpusError: the input is not a readable regular file, or is compressed.
    """
    check_input(input_path)
    with open(input_path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            with atomic_write(out_path, "wb") as out:
                return _curate(buf, out, seed, special.encode("utf-8"))
        finally:
            if size:
                buf.close()


def _curate(buf, out, seed: int, special: bytes) -> CurationReport:
    report = CurationReport(seed=seed)
    report.bytes_in = len(buf)
    first = True
    for s, e in iter_documents(buf, special):
        doc = bytes(buf[s:e])
        if e == s:
            continue                                   # empty pieces (edges, doubled separators)
        b = entropy_bin(bigram_entropy(doc.decode("utf-8", "surrogateescape")))
        report.documents[b] += 1
        if keep_document(doc, b, seed):
            report.kept[b] += 1
            if not first:
                out.write(special)
            out.write(doc)
            report.bytes_kept += len(doc)
            first = False
    return report


@contextlib.contextmanager
def curated_config(config):
    """A copy of a :class:`TrainConfig` whose input is the curated corpus (a temp file, removed
    after use), and the curation report as a dict."""
    specials = [s if isinstance(s, str) else s.decode("utf-8") for s in config.special_tokens]
    special = specials[0] if specials else DEFAULT_SPECIAL_TOKEN
    folder = new_temp_dir(config.spill_dir, "bpe_core-curate-")
    try:
        path = os.path.join(folder, "curated.txt")
        report = curate_file(config.input_path, path, seed=config.entropy_seed, special=special)
        yield dataclasses.replace(config, input_path=path, entropy_filter=False), report.to_dict()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
