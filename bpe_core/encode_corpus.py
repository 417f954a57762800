"""Whole-corpus encoding: one flat ``.npy`` of token ids, in bounded memory, with any worker count.

Pipeline (see ``docs/encoding.md``):

1. **Plan.** ``plan_encode`` turns the RAM budget into a worker count and a chunk size. It is the
   seam where ``bpe_core.scheduler`` (psutil) will plug in; until then it is a small formula.
2. **Cut.** The parent walks the memory-mapped input in windows and cuts chunks only at points
   ``corpus.chunk_boundaries`` proves safe (a special-token start, or a safe newline), so the ids
   of a chunk do not depend on where it was cut. Each window is unmapped after use, so the parent
   never holds the input in memory.
3. **Encode.** Workers (processes) map their own chunk, encode it in 1 MiB batches and append the
   ids to a spill file of that chunk. At most ``2 * workers`` chunks are in flight.
4. **Assemble.** Once the total is known, the ``.npy`` is created with ``np.lib.format.open_memmap``
   in a temp file beside the output, the spill files are copied into it in chunk order, and the temp
   file is renamed onto the output. The result is identical for any worker count and chunk size.
   Peak disk use is about twice the output size (spill files + output).

``uint16`` is used when every id fits (vocab <= 65,536), else ``uint32``.
"""
from __future__ import annotations

import contextlib
import math
import mmap
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
import numpy as np

from ._atomic import atomic_path
from .corpus import CorpusError, check_input, chunk_boundaries
from .tokenizer import Tokenizer

MiB = 1 << 20
# Memory model of plan_encode (measured on en_train with the GPT-2 vocab; see docs/encoding.md).
WORKER_BASE_BYTES = 128 * MiB     # interpreter, numpy, regex, rank table, pretoken cache, 1 MiB batch
PARENT_BASE_BYTES = 128 * MiB     # interpreter, tokenizer, in-order bookkeeping, copy buffer
MIN_CHUNK_BYTES = 1 * MiB
MAX_CHUNK_BYTES = 64 * MiB
DEFAULT_CHUNK_BYTES = 16 * MiB
COPY_BYTES = 8 * MiB              # spill -> output copy block


# ==== Plan ===================================================================================


@dataclass(frozen=True)
class EncodePlan:
    """How a corpus is encoded: ``num_workers`` processes, chunks of about ``chunk_bytes``.

    ``estimated_peak_bytes`` is the RSS of the process tree that the memory model predicts.
    """

    num_workers: int
    chunk_bytes: int
    estimated_peak_bytes: int


def plan_encode(input_bytes: int, memory_limit: int | None = None,
                num_workers: int | None = None) -> EncodePlan:
    """Choose workers and chunk size from the input size and the RAM budget.

    Memory model: each worker holds ``WORKER_BASE_BYTES`` plus its mapped chunk (the input pages it
    touched); the parent ``PARENT_BASE_BYTES`` plus one cutting window (``2 * chunk_bytes``). So
    ``peak = PARENT_BASE + 2 * chunk + workers * (WORKER_BASE + chunk)``. Workers default to the
    CPU count; the budget lowers them first, then the chunk size. Chunks are kept small enough that
    each worker gets about four (load balance), and within 1-64 MiB.

    Raises:
        ValueError: when even one worker with 1 MiB chunks does not fit the budget.

    >>> p = plan_encode(10 * 2**30, memory_limit=2 * 2**30, num_workers=8)
    >>> p.num_workers, p.chunk_bytes // 2**20
    (8, 64)
    >>> plan_encode(10 * 2**30, memory_limit=600 * 2**20, num_workers=8).num_workers
    3
    """
    workers = num_workers if num_workers else (os.cpu_count() or 1)
    if workers < 1:
        raise ValueError("num_workers must be at least 1")
    balance = max(MIN_CHUNK_BYTES, math.ceil(max(input_bytes, 1) / (4 * workers)))
    chunk = min(DEFAULT_CHUNK_BYTES if memory_limit is None else MAX_CHUNK_BYTES, balance)
    chunk = max(MIN_CHUNK_BYTES, chunk)

    def peak(w: int, c: int) -> int:
        return PARENT_BASE_BYTES + 2 * c + w * (WORKER_BASE_BYTES + c)

    if memory_limit is not None:
        if peak(1, MIN_CHUNK_BYTES) > memory_limit:
            raise ValueError(f"memory limit {memory_limit / MiB:.0f} MiB is too small: encoding needs at "
                             f"least {peak(1, MIN_CHUNK_BYTES) / MiB:.0f} MiB")
        while workers > 1 and peak(workers, MIN_CHUNK_BYTES) > memory_limit:
            workers -= 1
        fit = (memory_limit - PARENT_BASE_BYTES - workers * WORKER_BASE_BYTES) // (workers + 2)
        chunk = max(MIN_CHUNK_BYTES, min(chunk, fit))
    return EncodePlan(workers, int(chunk), peak(workers, chunk))


# ==== Cut ====================================================================================


def iter_chunks(path: str, chunk_bytes: int, special_tokens, pattern: str):
    """Yield ``(start, end)`` chunks of the file, cut only at safe points, reading one window at a time.

    Each window starts at a safe point, so ``chunk_boundaries`` on the window finds the same cuts as
    on the whole file; a cut is accepted only when the window also holds the bytes that decide it
    (the longest special token after it). A document longer than the window doubles the window.
    """
    size = check_input(path)
    if size == 0:
        return
    maxlen = max((len(s) for s in special_tokens), default=0)
    gran = mmap.ALLOCATIONGRANULARITY
    pos = 0
    with open(path, "rb") as f:
        window = 2 * chunk_bytes + maxlen + 1
        while pos < size:
            if size - pos <= chunk_bytes:
                yield pos, size
                return
            base = pos - pos % gran
            length = min(size, pos + window) - base
            mm = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=base)
            try:
                view = memoryview(mm)[pos - base:]
                cuts = chunk_boundaries(view, chunk_bytes, special_tokens, pattern)
                view.release()
            finally:
                mm.close()
            limit = length - (pos - base) - maxlen - 1     # a cut must be decided inside the window
            cut = next((c for c in cuts[1:-1] if c <= limit), None)
            if cut is None and pos + window >= size:
                yield pos, size           # the rest is one document without a safe point
                return
            if cut is None:
                window *= 2               # a long document: look further
                continue
            yield pos, pos + cut
            pos += cut
            window = 2 * chunk_bytes + maxlen + 1


# ==== Encode (workers) =======================================================================

_WORKER: dict = {}


def _init_worker(tokenizer: Tokenizer, input_path: str, spill_dir: str, dtype: str) -> None:
    _WORKER.update(tokenizer=tokenizer, input_path=input_path, spill_dir=spill_dir, dtype=np.dtype(dtype))


def _spill_path(spill_dir: str, index: int) -> str:
    return os.path.join(spill_dir, f"chunk-{index:08d}.bin")


def _encode_chunk(task: tuple[int, int, int]) -> tuple[int, int]:
    """Encode bytes ``[start, end)`` of the input into the chunk's spill file; returns (index, n_ids)."""
    index, start, end = task
    tok: Tokenizer = _WORKER["tokenizer"]
    dtype = _WORKER["dtype"]
    n_ids = 0
    gran = mmap.ALLOCATIONGRANULARITY
    base = start - start % gran
    with open(_WORKER["input_path"], "rb") as f, open(_spill_path(_WORKER["spill_dir"], index), "wb") as out:
        mm = mmap.mmap(f.fileno(), end - base, access=mmap.ACCESS_READ, offset=base)
        try:
            for ids in tok._iter_encode(mm, start - base, end - base):
                ids.astype(dtype, copy=False).tofile(out)
                n_ids += len(ids)
        finally:
            mm.close()          # unmap: the chunk's pages leave this process's RSS
    return index, n_ids


# ==== Assemble ===============================================================================


@dataclass
class EncodeResult:
    """What ``encode_corpus`` did."""

    out_path: str
    n_tokens: int
    n_bytes: int
    dtype: str
    seconds: float
    num_workers: int
    n_chunks: int
    verified_bytes: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.n_bytes / 1e6 / max(self.seconds, 1e-9)

    def summary(self) -> str:
        ratio = self.n_bytes / max(self.n_tokens, 1)
        line = (f"{self.out_path}: {self.n_tokens:,} tokens ({self.dtype}) from {self.n_bytes:,} bytes "
                f"({ratio:.2f} bytes/token) in {self.seconds:.1f} s, {self.mb_per_s:.1f} MB/s, "
                f"{self.num_workers} worker(s), {self.n_chunks} chunk(s)")
        if self.verified_bytes:
            line += f"; verified {self.verified_bytes:,} bytes"
        return line


class VerifyError(RuntimeError):
    """``verify=True`` found ids that do not decode back to the input."""


def ids_dtype(n_vocab: int) -> np.dtype:
    """``uint16`` when every id fits, else ``uint32``.

    >>> ids_dtype(50257), ids_dtype(65537)
    (dtype('uint16'), dtype('uint32'))
    """
    return np.dtype(np.uint16) if n_vocab <= 1 << 16 else np.dtype(np.uint32)


def encode_corpus(input_path: str | os.PathLike, tokenizer: Tokenizer | str | os.PathLike,
                  out_path: str | os.PathLike, num_workers: int | None = None,
                  memory_limit: int | None = None, chunk_bytes: int | None = None,
                  verify: bool = False, progress: bool = True,
                  mp_context: str | None = None) -> EncodeResult:
    """Encode a whole file into one flat ``.npy`` of token ids (see the module docstring).

    Args:
        input_path: the corpus (read as bytes; special tokens are document separators).
        tokenizer: a ``Tokenizer`` or a path that ``Tokenizer.load`` reads.
        out_path: the ``.npy`` to write (atomically: temp file + rename).
        num_workers: encoding processes (None: from the plan; 1 encodes in this process).
        memory_limit: RAM budget in bytes for the process tree (None: no budget).
        chunk_bytes: override the planned chunk size (tests use tiny chunks).
        verify: decode a sample of chunks back and compare with the input before renaming.
        progress: a tqdm bar (bytes, MB/s) on stderr.
        mp_context: multiprocessing start method (None: ``forkserver`` where available, else
            ``spawn``; never plain ``fork``, which is unsafe in a process with threads).

    Raises:
        CorpusError: bad input file. ``ModelFormatError``: bad tokenizer. ``VerifyError``.

    >>> import tempfile, os; d = tempfile.mkdtemp()
    >>> _ = open(f"{d}/in.txt", "w").write("hi there<|endoftext|>bye")
    >>> vocab = {i: bytes([i]) for i in range(256)}
    >>> r = encode_corpus(f"{d}/in.txt", Tokenizer(vocab, [], ["<|endoftext|>"]), f"{d}/ids.npy",
    ...                   num_workers=1, progress=False)
    >>> np.load(f"{d}/ids.npy", mmap_mode="r").tolist()[-4:]
    [256, 98, 121, 101]
    """
    t0 = time.perf_counter()
    input_path, out_path = os.fspath(input_path), os.fspath(out_path)
    size = check_input(input_path)
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(tokenizer)
    _check_out(out_path)
    plan = plan_encode(size, memory_limit, num_workers)
    chunk = chunk_bytes or plan.chunk_bytes
    dtype = ids_dtype(tok.n_vocab)
    specials = list(tok._special_bytes)

    folder = os.path.dirname(os.path.abspath(out_path))
    spill_dir = tempfile.mkdtemp(dir=folder, prefix="." + os.path.basename(out_path) + ".spill-")
    tmp, commit = atomic_path(out_path)
    bar = _progress(size, progress)
    try:
        chunks = list(iter_chunks(input_path, chunk, specials, tok.pattern))
        counts = [0] * len(chunks)
        workers = min(plan.num_workers, max(1, len(chunks)))
        tasks = [(i, s, e) for i, (s, e) in enumerate(chunks)]
        if workers == 1:
            _init_worker(tok, input_path, spill_dir, dtype.str)
            for task in tasks:
                i, n = _encode_chunk(task)
                counts[i] = n
                bar.update(task[2] - task[1])
        else:
            ctx = mp.get_context(mp_context or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"))
            with ctx.Pool(workers, _init_worker, (tok, input_path, spill_dir, dtype.str)) as pool:
                pending = []
                for task in tasks:
                    pending.append((task, pool.apply_async(_encode_chunk, (task,))))
                    while len(pending) >= 2 * workers:     # bounded in flight, consumed in order
                        done, res = pending.pop(0)
                        counts[done[0]] = res.get()[1]
                        bar.update(done[2] - done[1])
                for done, res in pending:
                    counts[done[0]] = res.get()[1]
                    bar.update(done[2] - done[1])
        total = sum(counts)
        _assemble(tmp, spill_dir, counts, dtype)
        verified = _verify(tmp, input_path, tok, chunks, counts) if verify else 0
        commit()
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        bar.close()
        shutil.rmtree(spill_dir, ignore_errors=True)
    return EncodeResult(out_path, total, size, dtype.name, time.perf_counter() - t0,
                        workers, len(chunks), verified)


def _assemble(tmp: str, spill_dir: str, counts: list[int], dtype: np.dtype) -> None:
    """Create the ``.npy`` (header via ``open_memmap``), then copy the spill files in order.

    The data is written through a plain file rather than the memmap so the written pages do not
    count in this process's RSS.
    """
    total = sum(counts)
    arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(total,))
    offset = arr.offset
    del arr
    with open(tmp, "r+b") as out:
        out.seek(offset)
        for i, n in enumerate(counts):
            path = _spill_path(spill_dir, i)
            with open(path, "rb") as f:
                shutil.copyfileobj(f, out, COPY_BYTES)
            os.unlink(path)
        if out.tell() != offset + total * dtype.itemsize:
            raise RuntimeError("spill files do not add up to the planned size")
        out.flush()
        os.fsync(out.fileno())


def _verify(tmp: str, input_path: str, tok: Tokenizer, chunks, counts, max_chunks: int = 8,
            max_ids: int = 1 << 20) -> int:
    """Decode the start of up to ``max_chunks`` chunks (first, last, evenly between) and compare."""
    ids = np.load(tmp, mmap_mode="r")
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    n = len(chunks)
    picks = sorted({round(k * (n - 1) / max(1, max_chunks - 1)) for k in range(min(n, max_chunks))})
    checked = 0
    with open(input_path, "rb") as f:
        for i in picks:
            start, end = chunks[i]
            k = min(int(counts[i]), max_ids)
            got = tok.decode_bytes(np.asarray(ids[offsets[i]: offsets[i] + k]))
            f.seek(start)
            want = f.read(len(got))
            if got != want or (k == counts[i] and len(got) != end - start):
                raise VerifyError(f"{input_path}: ids of bytes {start}-{end} do not decode back to the input")
            checked += len(got)
    del ids
    return checked


def _check_out(out_path: str) -> None:
    folder = os.path.dirname(os.path.abspath(out_path))
    if os.path.isdir(out_path):
        raise CorpusError(out_path, "is a directory, expected a .npy file path")
    if not os.path.isdir(folder):
        raise CorpusError(out_path, f"folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise CorpusError(out_path, f"folder {folder} is not writable")


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="encode", file=sys.stderr,
                dynamic_ncols=True, smoothing=0.1)


__all__ = ["EncodePlan", "EncodeResult", "VerifyError", "encode_corpus", "ids_dtype", "iter_chunks",
           "plan_encode"]