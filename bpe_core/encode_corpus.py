"""Whole-corpus encoding: one flat ``.npy`` of token ids, in bounded memory, with any worker count.

Pipeline (see ``docs/encoding.md`` and ``docs/memory.md``); each step is a ``memmon.phase``:

1. **plan.** ``scheduler.plan_encoding`` turns the RAM budget (``memory_limit``; None: the default
   budget, 8 GiB or 80% of the RAM available) into a worker count and a chunk size, or raises
   ``scheduler.BudgetError`` naming the smallest budget that works. ``plan.to_dict()`` goes into
   the result.
2. **cut.** The parent walks the memory-mapped input in windows and cuts chunks only at points
   ``corpus.chunk_boundaries`` proves safe (a special-token start, or a safe newline), so the ids
   of a chunk do not depend on where it was cut. Each window is unmapped after use, so the parent
   never holds the input in memory.
3. **encode.** Workers (processes from a ``forkserver`` that has imported bpe_core once) get the
   rank-table arrays (``tokenizer.EncoderSpec``, not the vocabulary), map their own chunk, encode
   it in blocks of about 1 MiB and append the ids to a spill file of that chunk. At most
   ``2 * workers`` chunks are in flight; a ``memmon.MemoryMonitor`` samples the RSS of the
   process tree and, while it is within one worker's share of the budget, no new chunk is handed
   out until an earlier one is done.
4. **assemble.** Once the total is known, the ``.npy`` is created with
   ``np.lib.format.open_memmap`` in a temp file beside the output and the spill files are copied
   into it in chunk order. The result is identical for any worker count and chunk size. Peak disk
   use is about twice the output size (spill files + output).
5. **verify** (optional): a sample of chunks is decoded back and compared with the input.
6. **write.** fsync, then the temp file is renamed onto the output: a run that is killed leaves no
   file at the output path (only a hidden temp file and spill folder beside it).

``uint16`` is used when every id fits (vocab <= 65,536), else ``uint32``.
"""
from __future__ import annotations

import contextlib
import mmap
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from . import scheduler
from ._atomic import atomic_path, output_problem, remove_stale
from .corpus import CorpusError, check_input, chunk_boundaries, warn_if_binary
from .memmon import MemoryMonitor, phase
from .tokenizer import EncoderSpec, Tokenizer

MiB = 1 << 20
COPY_BYTES = scheduler.ENCODE_COPY_BYTES      # spill -> output copy block


# ==== Cut ====================================================================================


def iter_chunks(path: str, chunk_bytes: int, special_tokens, pattern: str, inside_documents: bool = True):
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
                cuts = chunk_boundaries(view, chunk_bytes, special_tokens, pattern, inside_documents)
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


def _init_worker(spec: EncoderSpec, input_path: str, spill_dir: str, dtype: str) -> None:
    _WORKER.update(spec=spec, input_path=input_path, spill_dir=spill_dir, dtype=np.dtype(dtype))


def _spill_path(spill_dir: str, index: int) -> str:
    return os.path.join(spill_dir, f"chunk-{index:08d}.bin")


def _encode_chunk(task: tuple[int, int, int]) -> tuple[int, int]:
    """Encode bytes ``[start, end)`` of the input into the chunk's spill file; returns (index, n_ids)."""
    index, start, end = task
    spec: EncoderSpec = _WORKER["spec"]
    dtype = _WORKER["dtype"]
    n_ids = 0
    gran = mmap.ALLOCATIONGRANULARITY
    base = start - start % gran
    with open(_WORKER["input_path"], "rb") as f, open(_spill_path(_WORKER["spill_dir"], index), "wb") as out:
        mm = mmap.mmap(f.fileno(), end - base, access=mmap.ACCESS_READ, offset=base)
        try:
            for ids in spec.iter_encode(mm, start - base, end - base):
                ids.astype(dtype, copy=False).tofile(out)
                n_ids += len(ids)
        finally:
            mm.close()          # unmap: the chunk's pages leave this process's RSS
    return index, n_ids


# ==== Assemble ===============================================================================


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
                "plan": self.plan, "memory": self.memory}


class VerifyError(RuntimeError):
    """``verify=True`` found ids that do not decode back to the input."""


def ids_dtype(n_vocab: int) -> np.dtype:
    """``uint16`` when every id fits, else ``uint32``.

    >>> ids_dtype(50257), ids_dtype(65537)
    (dtype('uint16'), dtype('uint32'))
    """
    return np.dtype(np.uint16) if n_vocab <= 1 << 16 else np.dtype(np.uint32)


def plan(input_path: str | os.PathLike, tokenizer: Tokenizer, num_workers: int | None = None,
         memory_limit: int | None = None, chunk_bytes: int | None = None) -> scheduler.Plan:
    """The memory plan ``encode_corpus`` would follow (workers, chunk size, estimated peak).

    Raises:
        CorpusError: bad input. ``scheduler.BudgetError``: the budget is too small (the message
            names the smallest budget that works).
    """
    size = check_input(os.fspath(input_path))
    overhead = None
    if (num_workers is None or num_workers > 1) and (os.cpu_count() or 1) > 1:
        # The RSS of a worker as encode_corpus starts it (from the forkserver, bpe_core imported).
        method = _start_method()
        _mp_context(method)
        overhead = scheduler.measure_worker_overhead(method)
    return scheduler.plan_encoding(size, tokenizer.n_vocab, memory_limit, num_workers=num_workers,
                                   per_worker_overhead=overhead, chunk_bytes=chunk_bytes)


def encode_corpus(input_path: str | os.PathLike, tokenizer: Tokenizer | str | os.PathLike,
                  out_path: str | os.PathLike, num_workers: int | None = None,
                  memory_limit: int | None = None, chunk_bytes: int | None = None,
                  verify: bool = False, progress: bool | str = True,
                  mp_context: str | None = None, monitor_interval: float = 0.05) -> EncodeResult:
    """Encode a whole file into one flat ``.npy`` of token ids (see the module docstring).

    Args:
        input_path: the corpus (read as bytes; special tokens are document separators).
        tokenizer: a ``Tokenizer`` or a path that ``Tokenizer.load`` reads.
        out_path: the ``.npy`` to write (atomically: temp file + rename).
        num_workers: upper bound on encoding processes (None: the CPU count); the plan may use
            fewer to fit the budget. 1 encodes in this process.
        memory_limit: RAM budget in bytes for the RSS of the process tree (None: the default
            budget, ``scheduler.default_memory_limit()``).
        chunk_bytes: override the planned chunk size (tests use tiny chunks).
        verify: decode a sample of chunks back and compare with the input before renaming.
        progress: progress on stderr (bytes, MB/s): ``True``/``"auto"`` (a tqdm bar on a terminal,
            else a plain line every 10 s or 10 %), ``"bar"``, ``"plain"``, ``"json"`` (JSON lines),
            ``False``/``"none"`` (``bpe_core.progress``).
        mp_context: multiprocessing start method (None: ``forkserver`` where available, else
            ``spawn``; never plain ``fork``, which is unsafe in a process with threads, and the
            memory monitor is one).
        monitor_interval: seconds between RSS samples of the process tree.

    Returns:
        An ``EncodeResult`` with the plan (``plan.to_dict()``) and the sampled peak RSS.

    Raises:
        CorpusError: bad input file. ``ModelFormatError``: bad tokenizer. ``scheduler.BudgetError``:
        the budget cannot fit one worker (before any work). ``VerifyError``.

    >>> import tempfile, os; d = tempfile.mkdtemp()
    >>> _ = open(f"{d}/in.txt", "w").write("hi there<|endoftext|>bye")
    >>> vocab = {i: bytes([i]) for i in range(256)}
    >>> r = encode_corpus(f"{d}/in.txt", Tokenizer(vocab, [], ["<|endoftext|>"]), f"{d}/ids.npy",
    ...                   num_workers=1, progress=False)
    >>> np.load(f"{d}/ids.npy", mmap_mode="r").tolist()[-4:], r.plan["num_workers"]
    ([256, 98, 121, 101], 1)
    """
    t0 = time.perf_counter()
    marks: list[tuple[str, float]] = []

    def enter(name: str) -> None:
        phase(name)
        marks.append((name, time.perf_counter()))

    enter("plan")
    input_path, out_path = os.fspath(input_path), os.fspath(out_path)
    size = check_input(input_path)
    from .progress import check_mode
    check_mode(progress)
    warn_if_binary(input_path)
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(tokenizer)
    _check_out(out_path)
    the_plan = plan(input_path, tok, num_workers, memory_limit, chunk_bytes)
    dtype = ids_dtype(tok.n_vocab)
    specials = list(tok._special_bytes)

    folder = os.path.dirname(os.path.abspath(out_path))
    spill_dir = tempfile.mkdtemp(dir=folder, prefix="." + os.path.basename(out_path) + ".spill-")
    tmp, commit = atomic_path(out_path)
    bar = _progress(size, progress)
    monitor = MemoryMonitor(interval=monitor_interval, budget=the_plan.memory_limit)
    monitor.start()
    try:
        enter("cut")
        chunks = list(iter_chunks(input_path, the_plan.chunk_bytes, specials, tok.pattern,
                                  getattr(tok, "chunks_inside_documents", True)))
        enter("encode")
        counts = [0] * len(chunks)
        workers = min(the_plan.num_workers, max(1, len(chunks)))
        tasks = [(i, s, e) for i, (s, e) in enumerate(chunks)]
        spec = tok._encoder_spec()
        held = 0
        if workers == 1:
            _init_worker(spec, input_path, spill_dir, dtype.str)
            for task in tasks:
                i, n = _encode_chunk(task)
                counts[i] = n
                bar.update(task[2] - task[1])
        else:
            held = _encode_in_workers(tasks, counts, workers, the_plan, monitor, bar,
                                      (spec, input_path, spill_dir, dtype.str), mp_context)
        total = sum(counts)
        enter("assemble")
        _assemble(tmp, spill_dir, counts, dtype)
        verified = 0
        if verify:
            enter("verify")
            verified = _verify(tmp, input_path, tok, chunks, counts)
        enter("write")
        commit()
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        bar.close()
        _WORKER.clear()             # the in-process encoder (one worker) and its cache go now
        shutil.rmtree(spill_dir, ignore_errors=True)
        monitor.stop()
    t_end = time.perf_counter()
    seconds = {name: round((marks[k + 1][1] if k + 1 < len(marks) else t_end) - t, 3)
               for k, (name, t) in enumerate(marks)}
    memory = dict(monitor.summary(), held_back_chunks=held)
    return EncodeResult(out_path, total, size, dtype.name, t_end - t0, workers, len(chunks), verified,
                        plan=the_plan.to_dict(), memory=memory, phase_seconds=seconds)


def _start_method(mp_context: str | None = None) -> str:
    return mp_context or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")


def _mp_context(method: str):
    """The multiprocessing context; a ``forkserver`` imports bpe_core once, before its first fork.

    Workers then fork from a server that has numpy and the encoder loaded (not from this process,
    which has threads), so a worker starts in milliseconds. The preload list is global to the
    process's forkserver and takes effect only if set before the server starts.
    """
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["bpe_core.encode_corpus"])
    return ctx


def _encode_in_workers(tasks, counts, workers: int, the_plan: scheduler.Plan, monitor: MemoryMonitor,
                       bar, init_args, mp_context: str | None) -> int:
    """Encode ``tasks`` in a pool; results are consumed in order, at most ``2 * workers`` in flight.

    Before a chunk is handed out while others are in flight, the tree's RSS must be below
    ``memory_limit - per_worker_bytes`` (the room one more chunk needs); if it is not, the oldest
    chunk is waited for first. Returns how many times a chunk was held back that way.
    """
    ctx = _mp_context(_start_method(mp_context))
    room = the_plan.memory_limit - the_plan.per_worker_bytes
    held = [0]
    with ctx.Pool(workers, _init_worker, init_args) as pool:
        pending: list = []

        def consume_oldest() -> None:
            done, res = pending.pop(0)
            counts[done[0]] = res.get()[1]
            bar.update(done[2] - done[1])

        for task in tasks:
            # Hold the chunk back while the tree is too close to the budget: wait for the oldest
            # chunk in flight (its worker unmaps it when done). With none in flight the plan's
            # word stands: one more chunk fits.
            while pending and len(pending) >= 2 * workers:
                consume_oldest()
            while pending and not monitor.wait_below(room, timeout=0):
                held[0] += 1
                consume_oldest()
            pending.append((task, pool.apply_async(_encode_chunk, (task,))))
        while pending:
            consume_oldest()
    return held[0]


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
    problem = output_problem(out_path, "a .npy file path")
    if problem is not None:
        raise CorpusError(out_path, problem)
    remove_stale(out_path, ("tmp", "spill"))      # what a killed run left beside the output


def _progress(total: int, mode):
    """The ``encode`` progress reporter (``bpe_core.progress``; ``mode`` a bool or a mode name)."""
    from .progress import make_progress

    return make_progress(mode, total=total, desc="encode", unit="B", unit_scale=True, smoothing=0.1)


__all__ = ["EncodeResult", "VerifyError", "encode_corpus", "ids_dtype", "iter_chunks", "plan"]