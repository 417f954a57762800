"""``encode_corpus`` on an executor (``cluster=``): the shards of many inputs (``corpus.shards``)
are encoded by tasks into spill files on a shared filesystem (:func:`encode_source_shard`), then
placed into their slices of the outputs (:func:`place_segments`); the output is byte-identical to
one machine's.

Part of ``encode.encode_corpus`` (the cluster path).
"""
from __future__ import annotations

import contextlib
import copy
import os
import shutil
import sys
import threading
import time

import numpy as np

from ..corpus.shards import shard_blocks
from ..errors import VerifyError
from ..pretok.counting import private_shard, shard_weights
from ..runtime import budget as scheduler
from ..runtime.atomic import DISK_FULL, atomic_path, named, new_temp_dir
from ..runtime.executors import open_executor
from ..runtime.memmon import MemoryMonitor, phase
from ..runtime.workers import check_total
from .corpus_outputs import (output_layout as _output_layout, publish_outputs as _publish, verify_sample as _verify,
                             write_doc_index as _write_doc_index, write_manifest as _write_manifest)
from .corpus_plan import EncodeResult, prepare as _prepare, progress_bar as _progress
from .corpus_workers import (VERIFY_IDS, bytes_of as _bytes_of, spill_path as _spill_path,
                             token_lengths_of as _token_lengths)


COPY_BYTES = scheduler.ENCODE_COPY_BYTES      # spill -> output copy block


def encode_sources_on(input_path, tokenizer, out_path, cluster, num_workers: int | None = None,
                      memory_limit: int | None = None, chunk_bytes: int | None = None, verify: bool = False,
                      progress: bool | str = True, monitor_interval: float = 0.05, *, separator: bool = True,
                      doc_index=None, shard_tokens: int | None = None, input_format: str = "auto",
                      text_field: str = "text", text_column: str = "text",
                      skip_bad_records: bool = False, cluster_timeout: float | None = None) -> EncodeResult:
    """``encode_corpus`` on a cluster for every input it takes on one machine (many files, compressed
    files, JSON Lines, Parquet; not standard input or iterators, which a worker cannot read).

    1. **encode**: one task per shard (``Source.shards``: a byte range of a plain or JSON Lines
       file, Parquet row groups, a whole compressed file); it reads its shard where it runs and
       writes its ids -- with the separator id between the items inside it -- to a spill file
       beside the output (a shared filesystem), renamed into place when complete. It returns its
       token count, items, bytes per source, bad records (and document starts without a separator).
    2. **place**: the client works out, in shard order, where a separator goes between two shards
       (as ``encode_corpus`` does between two chunks), creates the output file(s) (one ``.npy``, or
       ``shard_tokens`` shards) in temp files beside the output, writes those separator ids, and
       tasks copy each spill file into its slices (``pwrite``; a slice may span two shard files).
    3. doc index, manifest, the conservation checks and the rename, as ``encode_corpus``.

    The output is byte-identical to ``encode_corpus`` on one machine.
    """
    t0 = time.perf_counter()
    marks: list[tuple[str, float]] = []

    def enter(name: str) -> None:
        phase(name)
        marks.append((name, time.perf_counter()))

    enter("plan")
    (out_path, sources, tok, doc_index, size, the_plan, dtype, sep, sep_id, opts,
     single_plain) = _prepare(input_path, tokenizer, out_path, num_workers, memory_limit, chunk_bytes, progress,
                              separator, doc_index, shard_tokens, input_format, text_field, text_column,
                              skip_bad_records, distributable=True)
    folder = os.path.dirname(os.path.abspath(out_path))
    spill_dir = None
    temps: list[str] = []
    commits: list = []
    bar = _progress(size, progress)
    monitor = MemoryMonitor(interval=monitor_interval, budget=the_plan.memory_limit)
    announce = None if progress in (False, None, "none") else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        # made inside the try: a signal after it (the monitor's start takes a while) removes it
        spill_dir = new_temp_dir(folder, "." + os.path.basename(out_path) + f".spill-{os.getpid()}-")
        monitor.start()
        enter("cluster start")
        with open_executor(cluster, the_plan.num_workers, announce=announce, timeout=cluster_timeout) as ex:
            enter("cut")
            shards = [sh for src in sources for sh in src.shards(opts)]
            weights = shard_weights(shards)
            enter("encode")
            spec = ex.share(tok._encoder_spec(), recomputable=True)
            lengths = ex.share(_token_lengths(tok), recomputable=True)
            vocab = ex.share([tok.vocab.get(i, b"") for i in range(tok.n_vocab)], recomputable=True) \
                if verify and not single_plain \
                else None
            want_starts = doc_index is not None and not sep
            results = ex.map(encode_source_shard, list(enumerate(shards)),
                             shared=(spec, lengths, spill_dir, dtype.str, sep_id, want_starts, vocab),
                             on_done=lambda task: bar.update(weights[id(task[1])]))
            for src in sources:
                if src.stamp is not None:
                    src.stamp.check()
            items = 0
            leads, counts, per_source, entries = [], [], {}, []
            for r in results:
                lead = bool(sep) and r["begins_item"] and items > 0       # the separator between two shards
                items += r["n_items"]
                leads.append(lead)
                counts.append(r["n_ids"] + lead)
                entries.append((r["n_ids"], lead, r["doc_starts"]))
                for k, v in r["per_source"].items():
                    per_source[k] = per_source.get(k, 0) + v
                opts.bad.absorb(r["bad"])
            # Conservation: every byte of every plain file encoded once (streams: checked by their task).
            for src in sources:
                if src.plain_text:
                    check_total(f"bytes of {src.name} (bytes encoded vs file size)", per_source.get(src.index, 0),
                                src.size)
            inner = sum(r["separators"] for r in results)
            n_bytes = sum(per_source.values()) + len(sep) * (sum(leads) + inner)
            total = sum(counts)
            enter("assemble")
            outputs, sizes = _output_layout(out_path, total, shard_tokens)
            tmps, headers = [], []
            for path, n in zip(outputs, sizes):
                tmp, _ = atomic_path(path)
                temps.append(tmp)
                tmps.append(tmp)
                commits.append((tmp, path))
                arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(n,))
                headers.append(arr.offset)
                del arr
            firsts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])     # first token of each file

            def where(token: int, n: int) -> list[tuple[str, int, int]]:
                """Tokens [token, token + n) of the concatenated outputs as (file, byte offset, count)."""
                out = []
                while n > 0:
                    k = int(np.searchsorted(firsts, token, side="right")) - 1
                    take = min(n, int(firsts[k + 1]) - token)
                    out.append((tmps[k], headers[k] + (token - int(firsts[k])) * dtype.itemsize, take))
                    token += take
                    n -= take
                return out

            starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])[:-1]
            sep_bytes = np.array([sep_id if sep_id is not None else 0], dtype=dtype).tobytes()
            places, n_leads = [], 0
            for i, (r, lead) in enumerate(zip(results, leads)):
                first = int(starts[i])
                if lead:
                    for f, off, _ in where(first, 1):
                        _pwrite_file(f, off, sep_bytes)
                    n_leads += 1
                    first += 1
                if r["n_ids"]:
                    segs, spill_off = [], 0
                    for f, off, k in where(first, r["n_ids"]):
                        segs.append((f, off, spill_off, k * dtype.itemsize))
                        spill_off += k * dtype.itemsize
                    places.append((_spill_path(spill_dir, r["index"]), segs))
            written = ex.map(place_segments, places)
            # Conservation: tokens written = the sum over shards; the files hold exactly that.
            check_total("tokens written (output files vs the sum over shards)",
                        sum(written) // dtype.itemsize + n_leads, total)
            check_total("tokens in the output files (their sizes vs the sum over shards)",
                        sum((os.path.getsize(t) - h) // dtype.itemsize for t, h in zip(tmps, headers)), total)
            n_docs = None
            if doc_index is not None:
                tmp, _ = atomic_path(doc_index)
                temps.append(tmp)
                commits.append((tmp, doc_index))
                n_docs = _write_doc_index(tmp, tmps, entries, counts, sep_id if sep else None, items)
            verified = 0
            if verify and single_plain and shard_tokens is None:
                enter("verify")
                chunks = [(sh.start, sh.end) for sh in shards]
                verified = _verify(tmps[0], sources[0].name, tok, chunks, counts)
            elif verify:
                verified = n_bytes
            cluster_info = ex.describe() if ex.remote else {}
            n_workers = ex.n_workers
            enter("write")
            if shard_tokens is not None:
                _write_manifest(out_path, outputs, sizes, total, shard_tokens, dtype, sep_id, n_docs, doc_index,
                                temps, commits)
            _publish(out_path, commits, shard_tokens, outputs)     # shards and index first, the manifest last
            t_end = time.perf_counter()          # closing a cluster we started is not the run's time
    except BaseException as exc:
        for tmp in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if getattr(bar, "closed", None) is False:
            bar.closed = True
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise named(exc, out_path) from None
        raise
    finally:
        bar.close()
        if spill_dir is not None:
            _remove_spill(spill_dir, SPILL_WRITERS_GRACE if sys.exc_info()[0] is not None else 0.0)
        monitor.stop()
    seconds = {name: round((marks[k + 1][1] if k + 1 < len(marks) else t_end) - t, 3)
               for k, (name, t) in enumerate(marks)}
    return EncodeResult(out_path, total, n_bytes, dtype.name, t_end - t0, n_workers,
                        sum(r["n_blocks"] for r in results), verified, plan=the_plan.to_dict(),
                        memory=dict(monitor.summary(), held_back_chunks=0), phase_seconds=seconds,
                        n_documents=n_docs, bad_records=opts.bad.to_dict(),
                        shards=outputs if shard_tokens is not None else None, cluster=cluster_info)


#: After a failed run, how long the spill folder's removal waits for the tasks still running on the
#: cluster's workers (a failed task cancels the pending ones, not those running): one of them can
#: write its spill file after the folder was emptied, and the folder stayed behind.
SPILL_WRITERS_GRACE = 5.0


def _remove_spill(spill_dir: str, grace: float) -> None:
    """Remove the run's spill folder; for up to ``grace`` seconds, again while a task still running
    writes into it."""
    deadline = time.monotonic() + grace
    while True:
        shutil.rmtree(spill_dir, ignore_errors=True)
        if not os.path.exists(spill_dir) or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def encode_source_shard(task: tuple, spec, token_lengths: np.ndarray, spill_dir: str, dtype: str, sep_id,
                        want_doc_starts: bool, vocab=None) -> dict:
    """Task: encode one shard of ``corpus.shards`` (``(index, shard)``) into its spill file.

    The shard's blocks are read here, in order (one for a byte range or row groups; a compressed
    file decompresses into many); the separator id goes between two items inside the shard, as
    ``encode_corpus`` puts it between two chunks. With ``vocab`` (the bytes of each id) the start
    of every block is decoded back and compared. Conservation: the ids of each block stand for
    exactly its bytes.

    Returns a dict: ``index``, ``n_ids`` (separators inside included), ``begins_item`` (the
    shard's first item starts before any other of its items), ``n_items``, ``separators`` (written
    inside), ``per_source`` (bytes encoded), ``doc_starts`` (without a separator: the id offsets
    in the spill where documents start; else None), ``bad`` (bad records met), ``n_blocks``.
    """
    index, shard = task
    enc = _thread_spec(spec)
    sh = private_shard(shard)
    path = _spill_path(spill_dir, index)
    part = f"{path}.{os.getpid()}-{threading.get_ident()}.part"
    dt = np.dtype(dtype)
    sep = np.array([sep_id if sep_id is not None else 0], dtype=dt).tobytes()
    n_ids = seen = joins = n_blocks = 0
    begins = False
    per_source: dict = {}
    starts: list = []
    try:
        with open(part, "wb") as out:
            for block in shard_blocks(sh):
                n_blocks += 1
                if block.begins_item:
                    if seen:
                        joins += 1
                        if sep_id is not None:
                            out.write(sep)
                            n_ids += 1
                    else:
                        begins = True
                seen += block.n_items
                buf = block.data
                if block.doc_ends is None:
                    ranges = [(0, len(buf))]
                else:
                    ends = np.asarray(block.doc_ends).tolist()
                    ranges = list(zip([0] + ends[:-1], ends))
                mark = want_doc_starts and (block.doc_ends is not None or block.begins_item)
                n_bytes, head, n_block_ids = 0, [], 0
                for a, b in ranges:
                    if mark:
                        starts.append(n_ids)
                    for ids in enc.iter_encode(buf, a, b) if b > a else ():
                        n_bytes += _bytes_of(token_lengths, ids)
                        ids.astype(dt, copy=False).tofile(out)
                        n_ids += len(ids)
                        if vocab is not None and n_block_ids < VERIFY_IDS:
                            head.append(np.array(ids[:VERIFY_IDS - n_block_ids]))
                        n_block_ids += len(ids)
                check_total(f"bytes of {block.label} (bytes the ids stand for vs bytes read)", n_bytes, len(buf))
                if vocab is not None:
                    got = b"".join(vocab[i] for i in (np.concatenate(head).tolist() if head else []))
                    if bytes(buf[:len(got)]) != got or (n_block_ids <= VERIFY_IDS and len(got) != len(buf)):
                        raise VerifyError(f"{block.label}: ids do not decode back to the input")
                per_source[block.source] = per_source.get(block.source, 0) + n_bytes
        if not sh.lazy:     # Conservation: every byte the reader produced was encoded once.
            check_total(f"bytes of {sh.source.name} (bytes encoded vs bytes the reader produced)",
                        sum(per_source.values()), sh.bytes_out)
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    return {"index": index, "n_ids": n_ids, "begins_item": begins, "n_items": seen,
            "separators": joins if sep_id is not None else 0, "per_source": per_source,
            "doc_starts": np.asarray(starts, np.int64) if want_doc_starts else None,
            "bad": sh.opts.bad.to_dict(), "n_blocks": n_blocks}


def place_segments(place: tuple) -> int:
    """Task: copy a spill file into its slices of the output files (``(spill, [(file, byte offset,
    offset in the spill, bytes)])``, ``pwrite``) and fsync them; returns the bytes written, each
    slice checked against its size. Placing again writes the same bytes (a retried task is harmless)."""
    spill, segments = place
    written = 0
    with open(spill, "rb") as f:
        for out_path, offset, spill_off, n_bytes in segments:
            fd = os.open(out_path, os.O_WRONLY)
            try:
                done = 0
                while done < n_bytes:
                    data = os.pread(f.fileno(), min(COPY_BYTES, n_bytes - done), spill_off + done)
                    if not data:
                        break
                    view = memoryview(data)
                    while view:
                        k = os.pwrite(fd, view, offset + done)
                        done += k
                        view = view[k:]
                os.fsync(fd)
            finally:
                os.close(fd)
            check_total(f"bytes of {spill} (bytes placed vs the slice's size)", done, n_bytes)
            written += done
    return written


def _pwrite_file(path: str, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


#: Per thread: (the shared spec it was made from, this thread's own copy with its encoder and cache).
_THREAD_SPEC = threading.local()


def _thread_spec(spec):
    held = getattr(_THREAD_SPEC, "held", None)
    if held is None or held[0] is not spec:
        held = _THREAD_SPEC.held = (spec, copy.copy(spec))
    return held[1]
