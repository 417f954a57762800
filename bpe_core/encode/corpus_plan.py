"""The plan step of ``encode_corpus``: the inputs expanded and checked, the tokenizer loaded, every
output path checked (none may be an input; what a killed run left is recovered or removed), the
memory plan and the read options (:func:`prepare`); the result (:class:`EncodeResult`), the ids'
dtype and the progress reporter.

Part of ``encode.encode_corpus`` (its steps 1-2: plan, cut).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np

from ..corpus import check_input, file_chunks
from ..corpus.readers import BadRecords
from ..corpus.inputs import Source, expand_inputs
from ..corpus.shards import ReadOptions
from ..errors import CorpusError
from ..pretok.counting import check_distributable
from ..pretok.patterns import pattern_name
from ..runtime import budget as scheduler
from ..formats.model import folder_files
from ..runtime.atomic import output_problem, recover_files, remove_stale
from ..runtime.progress import check_mode, make_progress
from ..runtime.workers import FileStamp
from .corpus_outputs import manifest_path
from .tokenizer import Tokenizer


def iter_chunks(path: str, chunk_bytes: int, special_tokens, pattern: str, inside_documents: bool = True,
                stamp: FileStamp | None = None):
    """Yield ``(start, end)`` chunks of the file, cut only at safe points (``corpus.file_chunks``:
    a small window is read near each cut with ``pread``, never the whole file)."""
    check_input(path)
    yield from file_chunks(path, chunk_bytes, special_tokens, pattern_name(pattern), inside_documents, stamp=stamp)


@dataclass
class EncodeResult:
    """What ``encode_corpus`` did: sizes, time, the memory plan and the measured peak.

    ``plan`` is ``scheduler.Plan.to_dict()``; ``memory`` is ``MemoryMonitor.summary()`` (the peak
    RSS of the process tree, sampled, and the peak of each phase) plus ``held_back_chunks`` (how
    often a chunk waited because the tree was close to the budget); ``phase_seconds`` the wall
    time of each phase.
    """

    out_path: str
    n_tokens: int
    n_bytes: int
    dtype: str
    seconds: float
    num_workers: int
    n_chunks: int
    verified_bytes: int = 0
    plan: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    phase_seconds: dict = field(default_factory=dict)
    n_documents: int | None = None
    bad_records: dict = field(default_factory=dict)
    shards: list | None = None
    cluster: dict = field(default_factory=dict)

    @property
    def mb_per_s(self) -> float:
        return self.n_bytes / 1e6 / max(self.seconds, 1e-9)

    @property
    def peak_rss_bytes(self) -> int:
        return int(self.memory.get("peak_rss_bytes", 0))

    def summary(self) -> str:
        ratio = self.n_bytes / max(self.n_tokens, 1)
        line = (f"{self.out_path}: {self.n_tokens:,} tokens ({self.dtype}) from {self.n_bytes:,} bytes "
                f"({ratio:.2f} bytes/token) in {self.seconds:.1f} s, {self.mb_per_s:.1f} MB/s, "
                f"{self.num_workers} worker(s), {self.n_chunks} chunk(s)")
        if self.memory:
            line += (f", peak RSS {scheduler.fmt_bytes(self.peak_rss_bytes)} of "
                     f"{scheduler.fmt_bytes(int(self.plan.get('memory_limit', 0)))}")
        if self.verified_bytes:
            line += f"; verified {self.verified_bytes:,} bytes"
        return line

    def report(self) -> dict:
        """A JSON-ready dict of everything above (``tools/encode_corpus.py --report``)."""
        return {"out_path": self.out_path, "n_tokens": self.n_tokens, "n_bytes": self.n_bytes,
                "dtype": self.dtype, "seconds": round(self.seconds, 3), "mb_per_s": round(self.mb_per_s, 2),
                "num_workers": self.num_workers, "n_chunks": self.n_chunks,
                "verified_bytes": self.verified_bytes, "phase_seconds": self.phase_seconds,
                "plan": self.plan, "memory": self.memory, "n_documents": self.n_documents,
                "bad_records": self.bad_records, "shards": self.shards,
                **({"cluster": self.cluster} if self.cluster else {})}


def ids_dtype(n_vocab: int) -> np.dtype:
    """``uint16`` when every id fits, else ``uint32``.

    >>> ids_dtype(50257), ids_dtype(65537)
    (dtype('uint16'), dtype('uint32'))
    """
    return np.dtype(np.uint16) if n_vocab <= 1 << 16 else np.dtype(np.uint32)


def sources_of(inputs, input_format: str = "auto", text_column: str = "text") -> list[Source]:
    if isinstance(inputs, (str, os.PathLike)) and input_format == "auto":
        return expand_inputs(os.fspath(inputs), "auto", text_column)
    return expand_inputs(inputs, input_format, text_column)


#: The input size the plan assumes for a source of unknown size (stdin, an iterator).
UNKNOWN_INPUT_BYTES = 1 << 30


def input_bytes(sources: list[Source]) -> int:
    size = sum(s.estimated_bytes for s in sources)
    return size + (UNKNOWN_INPUT_BYTES if any(s.kind == "iterator" or s.is_stdin for s in sources) else 0)


def plan(input_path, tokenizer: Tokenizer, num_workers: int | None = None,
         memory_limit: int | None = None, chunk_bytes: int | None = None, input_format: str = "auto",
         text_column: str = "text") -> scheduler.Plan:
    """The memory plan ``encode_corpus`` would follow (workers, chunk size, estimated peak).

    Raises:
        CorpusError: bad input. ``scheduler.BudgetError``: the budget is too small (the message
            names the smallest budget that works).
    """
    size = input_bytes(sources_of(input_path, input_format, text_column))
    return scheduler.plan_encoding(size, tokenizer.n_vocab, memory_limit, num_workers=num_workers,
                                   chunk_bytes=chunk_bytes)


class Prepared(NamedTuple):
    """What both encoding paths (this machine, an executor) check and plan before any work."""
    out_path: str
    sources: list
    tok: Tokenizer
    doc_index: Optional[str]
    size: Optional[int]
    plan: object
    dtype: object
    sep: bytes
    sep_id: Optional[int]
    opts: ReadOptions
    single_plain: bool


def prepare(input_path, tokenizer, out_path, num_workers, memory_limit, chunk_bytes, progress, separator,
             doc_index, shard_tokens, input_format, text_field, text_column, skip_bad_records,
             distributable: bool) -> Prepared:
    """Expand and check the inputs, load the tokenizer, check every output path (none may be an
    input), plan chunks and memory, and build the read options; ``distributable``: every input must
    be readable by a worker (not standard input or an iterator)."""
    out_path = os.fspath(out_path)
    sources = sources_of(input_path, input_format, text_column)
    if distributable:
        check_distributable(sources)
    check_mode(progress)
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(tokenizer)
    tok_files = [] if isinstance(tokenizer, Tokenizer) else folder_files(tokenizer)
    if shard_tokens is not None and shard_tokens < 1:
        raise ValueError("shard_tokens must be at least 1")
    check_out(out_path, sources, tok_files)
    if shard_tokens is not None:
        check_not_an_input(manifest_path(out_path), sources, tok_files)
    if doc_index is not None:
        doc_index = os.fspath(doc_index)
        check_out(doc_index, sources, tok_files)
        if os.path.abspath(doc_index) == os.path.abspath(out_path):
            raise CorpusError(doc_index, "the document index and the ids would be the same file")
    size = input_bytes(sources)
    the_plan = scheduler.plan_encoding(size, tok.n_vocab, memory_limit, num_workers=num_workers,
                                       chunk_bytes=chunk_bytes)
    scheduler.warn_over_machine(the_plan)        # a --memory-limit above the RAM or the cgroup: one line
    dtype = ids_dtype(tok.n_vocab)
    specials = list(tok._special_bytes)
    sep = specials[0] if specials and separator else b""
    sep_id = tok.special_tokens[sep.decode("utf-8")] if sep else None
    opts = ReadOptions(chunk_bytes=the_plan.chunk_bytes, special_tokens=specials,
                       pattern=pattern_name(tok.pattern),
                       inside_documents=getattr(tok, "chunks_inside_documents", True),
                       separator=sep, text_field=text_field, text_column=text_column,
                       bad=BadRecords(skip=skip_bad_records))
    single_plain = len(sources) == 1 and sources[0].plain_text
    return Prepared(out_path, sources, tok, doc_index, size, the_plan, dtype, sep, sep_id, opts, single_plain)


def check_out(out_path: str, sources: list[Source] = (), tok_files: list[str] = ()) -> None:
    problem = output_problem(out_path, "a .npy file path")
    if problem is not None:
        raise CorpusError(out_path, problem)
    check_not_an_input(out_path, sources, tok_files)
    for key in (out_path, manifest_path(out_path)):    # a set a SIGKILL cut short is finished first
        recover_files(key)
    remove_stale(out_path, ("tmp", "spill"))      # what a killed run left beside the output
    remove_stale(manifest_path(out_path))


def _local_file(src: Source) -> str | None:
    """The local file a source reads (a path or a ``file://`` URL); None for other URLs and streams."""
    if not src.rereadable:
        return None
    if src.is_url:
        return src.name[len("file://"):] if src.name.startswith("file://") else None
    return src.name


def check_not_an_input(out_path: str, sources: list[Source], tok_files: list[str] = ()) -> None:
    """Refuse an output that is one of the input files, the tokenizer's included: the rename would
    replace the corpus or the model.

    >>> import tempfile; d = tempfile.mkdtemp(); p = os.path.join(d, "c.txt"); _ = open(p, "w").write("x")
    >>> check_not_an_input(p, expand_inputs(p))
    Traceback (most recent call last):
    bpe_core.errors.CorpusError: ...c.txt: is also an input (...c.txt); writing there would replace it: give another output path
    """
    if not os.path.exists(out_path):
        return
    for src in sources:
        path = _local_file(src)
        with contextlib.suppress(OSError):
            if path is not None and os.path.samefile(path, out_path):
                raise CorpusError(out_path, f"is also an input ({src.name}); writing there would replace it: "
                                            "give another output path")
    for path in tok_files:
        with contextlib.suppress(OSError):
            if os.path.samefile(path, out_path):
                raise CorpusError(out_path, f"is also an input (the tokenizer's {path}); writing there would "
                                            "replace it: give another output path")


def progress_bar(total: int, mode):
    """The ``encode`` progress reporter (``bpe_core.progress``; ``mode`` a bool or a mode name)."""
    return make_progress(mode, total=total, desc="encode", unit="B", unit_scale=True, smoothing=0.1)
