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
3. **encode.** Worker threads (``workers.run_ordered``; the encoder's core runs without the GIL)
   read their chunk with ``pread``, encode it in blocks of about 1 MiB with an encoder of their own
   (its own pretoken cache, one shared rank table; the tokenizer's idle encoders are lent first and
   given back at the end, caches warm) and put the ids into the output through ``ids_out.OrderedIds``:
   the chunk whose turn it is (every chunk before it done) writes straight into the ``.npy``'s temp
   file beside the output (a 128-byte placeholder header first); a chunk that waits for its turn
   holds its ids in memory up to :func:`_hold_bytes` and spills the rest to a file of its own,
   copied in (``copy_file_range``) when its turn comes. At most ``2 * workers`` chunks are in
   flight; a ``memmon.MemoryMonitor`` samples the RSS and, while it is within one worker's share of
   the budget, no new chunk is handed out until an earlier one is done. No worker processes:
   nothing re-imports the caller's script, and a signal or an error stops the run within one
   chunk's time.
4. **assemble.** Once the total is known, the real ``.npy`` header (the bytes
   ``np.lib.format.open_memmap`` writes) replaces the placeholder. The result is identical for any
   worker count, chunk size and hold bound. Peak disk use is about the output size (plus the
   spills of the chunks waiting for their turn).
5. **verify** (optional): a sample of chunks is decoded back and compared with the input.
6. **write.** One fsync of each file, then the temp file is renamed onto the output: a run that is
   killed leaves no file at the output path (only hidden temp files and a spill folder beside it,
   which the next run removes; shard temp files carry the output's temp prefix too). The ids and
   their document index, or the shards, the index and the manifest, are published as one set
   (``runtime.atomic.publish_files``; shards get names of their own generation, so the older set
   stays whole until the manifest's rename).

Conservation is checked at run time: the ids of each chunk stand for exactly its bytes (the sum of
their token lengths), every byte of the input is encoded once, each chunk's ids in the output are
the ids its worker encoded, the tokens written equal the sum over chunks, and every output file
holds its header and exactly the ids written to it; a mismatch raises ``workers.InternalError``
and nothing is published.

``uint16`` is used when every id fits (vocab <= 65,536), else ``uint32``.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

from ..corpus.readers import BadRecords
from ..corpus.ranges import is_url
from ..corpus.shards import ReadOptions, TextRangeShard, iter_tasks, shard_blocks
from ..errors import CorpusError, VerifyError
from ..pretok.counting import private_shard, shard_weights
from ..pretok.patterns import pattern_name
from ..runtime import budget as scheduler
from ..runtime.atomic import DISK_FULL, atomic_path, named
from ..runtime.executors import open_executor
from ..runtime.memmon import MemoryMonitor, phase
from ..runtime.progress import check_mode
from ..runtime.workers import check_total, run_ordered
from .ids_out import IdsWriter, OrderedIds
from .sharded_parts import (MANIFEST, MANIFEST_FORMAT, fix_lead as _fix_lead, fs_of as _fs_of,
                            load_sharded_ids, npy_length as _npy_length, part_name as _part_name)
from .corpus_plan import (EncodeResult, ids_dtype, input_bytes as _input_bytes, iter_chunks, plan,
                          prepare as _prepare, progress_bar as _progress, sources_of as _sources)
from .corpus_workers import (VERIFY_IDS, ChunkEncoder as _ChunkEncoder, SpillFolder as _SpillFolder,
                             bytes_of as _bytes_of, hold_bytes as _hold_bytes, hold_window as _hold_window,
                             spill_path as _spill_path, token_lengths_of as _token_lengths)
from .corpus_outputs import (manifest_path, next_generation as _next_generation, output_layout as _output_layout,
                             publish_outputs as _publish, shard_paths, verify_sample as _verify,
                             write_doc_index as _write_doc_index, write_manifest as _write_manifest)
from .tokenizer import Tokenizer

MiB = 1 << 20
COPY_BYTES = scheduler.ENCODE_COPY_BYTES      # spill -> output copy block
#: Inputs up to this size are encoded without the memory monitor's sampling thread: such a run lasts
#: a few of its 50 ms intervals, so the thread would add a sample or two (starting and joining it
#: cost 1 ms of CPU and up to 10 ms of wall on a loaded machine). The RSS is still sampled before
#: every chunk is handed out (the budget guard), at the start and at the end.
SMALL_INPUT_BYTES = 8 * MiB


# ==== Cut ====================================================================================


# ==== Encode (worker threads) ================================================================


# ==== Assemble ===============================================================================


def encode_corpus(input_path, tokenizer: Tokenizer | str | os.PathLike,
                  out_path: str | os.PathLike, num_workers: int | None = None,
                  memory_limit: int | None = None, chunk_bytes: int | None = None,
                  verify: bool = False, progress: bool | str = True,
                  mp_context: str | None = None, monitor_interval: float = 0.05, *,
                  separator: bool = True, doc_index: str | os.PathLike | None = None,
                  shard_tokens: int | None = None, input_format: str = "auto", text_field: str = "text",
                  text_column: str = "text", skip_bad_records: bool = False,
                  cluster=None, cluster_timeout: float | None = None) -> EncodeResult:
    """Encode a corpus into one flat ``.npy`` of token ids (see the module docstring).

    Args:
        input_path: the corpus: a text file (read as bytes; special tokens are document
            separators), or anything ``corpus.inputs.expand_inputs`` takes: compressed files, JSON
            Lines, Parquet, directories, glob patterns, ``-``, a list of these, an iterator of
            documents or a ``datasets`` object (``docs/inputs.md``).
        tokenizer: a ``Tokenizer`` or a path that ``Tokenizer.load`` reads.
        out_path: the ``.npy`` to write (atomically: temp file + rename).
        num_workers: upper bound on encoding threads (None: the CPU count); the plan may use
            fewer to fit the budget. 1 encodes in this thread.
        memory_limit: RAM budget in bytes for the RSS of the process tree (None: the default
            budget, ``scheduler.default_memory_limit()``).
        chunk_bytes: override the planned chunk size (tests use tiny chunks).
        verify: decode the ids back and compare with the input before renaming (a sample of
            chunks of a plain file; the start of every block of other inputs).
        progress: progress on stderr (bytes, MB/s): ``True``/``"auto"`` (a tqdm bar on a terminal,
            else a plain line every 10 s or 10 %), ``"bar"``, ``"plain"``, ``"json"`` (JSON lines),
            ``False``/``"none"`` (``bpe_core.progress``).
        mp_context: ignored; kept so that older calls still work (workers are threads now).
        monitor_interval: seconds between RSS samples of the process tree.
        separator: write the separator id (the first special token) between two items (files,
            records), as the ``.txt`` with the same documents would have it. False (or no special
            token): no id between items; each item is encoded on its own.
        doc_index: also write this ``.npy`` (int64): the offset in the id array where each
            document starts (after every separator id; at every item without a separator).
        shard_tokens: write shards of this many tokens (``shard_paths``) and a JSON manifest
            (``manifest_path``) instead of one ``.npy``.
        input_format, text_field, text_column, skip_bad_records: how inputs are read
            (``TrainConfig`` has the same options).
        cluster: encode the shards on a cluster (``runtime.executors.open_executor``: ``"local:N"``,
            a scheduler address, a ``distributed.Client``); ``out_path`` must then be on a
            filesystem the workers share (each writes its slice of the ``.npy``). The ids are the
            same as on one machine (:func:`encode_sources_on`). Inputs may be fsspec URLs with or
            without a cluster (``docs/inputs.md``). An fsspec URL as ``out_path``
            (``s3://bucket/ids/``) gets sharded outputs and a manifest instead
            (:func:`encode_to_parts`, read back by :func:`load_sharded_ids`).
        cluster_timeout: the cluster's bound in seconds (``runtime.executors.open_executor``):
            how long to wait for a worker when none is connected, and the base of how long the run
            may go without a task finishing; past it: ``ClusterError``, nothing written.

    Returns:
        An ``EncodeResult`` with the plan (``plan.to_dict()``) and the sampled peak RSS.

    Raises:
        CorpusError: bad input file or record. ``ModelFormatError``: bad tokenizer.
        ``scheduler.BudgetError``: the budget cannot fit one worker (before any work). ``VerifyError``.

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

    if isinstance(out_path, (str, os.PathLike)) and is_url(os.fspath(out_path)):
        if not separator or doc_index is not None or shard_tokens is not None:
            raise ValueError("with a URL as the output, separator=False, doc_index and shard_tokens are not "
                             "available (write to a local or shared path for them)")
        return encode_to_parts(input_path, tokenizer, os.fspath(out_path), cluster, num_workers, memory_limit,
                               chunk_bytes, progress, verify=verify, input_format=input_format,
                               text_field=text_field, text_column=text_column, skip_bad_records=skip_bad_records,
                               cluster_timeout=cluster_timeout)
    if cluster is not None:
        return encode_sources_on(input_path, tokenizer, out_path, cluster, num_workers, memory_limit, chunk_bytes,
                                 verify, progress, monitor_interval, separator=separator, doc_index=doc_index,
                                 shard_tokens=shard_tokens, input_format=input_format, text_field=text_field,
                                 text_column=text_column, skip_bad_records=skip_bad_records,
                                 cluster_timeout=cluster_timeout)
    enter("plan")
    (out_path, sources, tok, doc_index, size, the_plan, dtype, sep, sep_id, opts,
     single_plain) = _prepare(input_path, tokenizer, out_path, num_workers, memory_limit, chunk_bytes, progress,
                              separator, doc_index, shard_tokens, input_format, text_field, text_column,
                              skip_bad_records, distributable=False)

    folder = os.path.dirname(os.path.abspath(out_path))
    spill_dir = None
    temps: list[str] = []
    commits: list = []
    bar = _progress(size if not any(s.kind == "iterator" or s.is_stdin for s in sources) else None, progress)
    monitor = MemoryMonitor(interval=monitor_interval, budget=the_plan.memory_limit)
    encoder = writer = output = None
    try:
        # made inside the try (the folder itself on the first spill): a signal after it removes it
        spill_dir = _SpillFolder(folder, out_path)
        monitor.start(thread=size > SMALL_INPUT_BYTES)
        enter("cut")
        shards = [sh for src in sources for sh in src.shards(opts)]
        # a stretch the cutter could not cut (no whitespace: maybe one pretoken) that the budget
        # cannot encode at once: one line now, before any work (not an OOM kill later)
        scheduler.check_uncut(the_plan, [(sh.source.name, sh.start, sh.end) for sh in shards
                                         if isinstance(sh, TextRangeShard)])
        enter("encode")
        results: list[tuple] = []
        items = [0]
        workers = the_plan.num_workers if any(not sh.lazy for sh in shards) else \
            min(the_plan.num_workers, max(1, len(shards)))
        spec = tok._encoder_spec()
        if hasattr(spec, "lend_from"):      # the workers use the tokenizer's warm encoders, then give them back
            spec.lend_from(tok, workers)
        # The ids go straight into the output's temp file(s), in chunk order (ids_out).
        generation = _next_generation(out_path) if shard_tokens is not None else None
        writer = IdsWriter(out_path, dtype, shard_tokens, temps=temps,
                           shard_names=lambda k: shard_paths(out_path, k + 1, generation)[k])
        in_flight = 2 * workers
        sep_bytes = np.array([sep_id], dtype=dtype).tobytes() if sep else None
        output = OrderedIds(writer, sep_bytes, _hold_bytes(_hold_window(the_plan.chunk_bytes, sources), in_flight),
                            spill_dir.file)
        encoder = _ChunkEncoder(spec, output, dtype, _token_lengths(tok),
                                want_doc_starts=doc_index is not None and not sep,
                                verify=verify and not single_plain, decode=tok.decode_bytes,
                                sep_id=sep_id if doc_index is not None and sep else None)
        room = the_plan.memory_limit - the_plan.per_worker_bytes
        per_source = [0] * len(sources)

        def consume(result: tuple) -> None:
            i, n_ids, n_bytes, begins, n_items, source, starts = result
            lead = bool(sep) and begins and items[0] > 0       # the separator between two items
            check_total(f"separators before chunk {i} (written vs expected)", output.done(i, n_items), lead)
            items[0] += n_items
            per_source[source] += n_bytes
            results.append((n_ids, lead, starts))
            bar.update(n_bytes)

        tasks = enumerate(iter_tasks(sources, opts, max(1, (workers + 1) // 2), shards=shards))
        held = run_ordered(encoder, tasks, workers, consume, max_in_flight=in_flight,
                           may_submit=lambda n: monitor.sample() < room)
        encoder.close()
        for src in sources:
            if src.stamp is not None:
                src.stamp.check()
        # Conservation: every byte of every plain file, and every byte a reader produced, was
        # encoded once.
        for k, src in enumerate(sources):
            if src.plain_text:
                check_total(f"bytes of {src.name} (bytes encoded vs file size)", per_source[k], src.size)
        streamed = sum(sh.bytes_out for sh in shards if not sh.lazy)
        check_total("bytes of the streamed inputs (bytes encoded vs bytes the readers produced)",
                    sum(per_source[s.index] for s in sources if any(not sh.lazy and sh.source is s for sh in shards)),
                    streamed)
        counts = [n + lead for n, lead, _ in results]
        leads = [lead for _, lead, _ in results]
        total = sum(counts)
        n_bytes = sum(per_source) + len(sep) * sum(leads)
        enter("assemble")
        # Conservation: tokens written = the sum over chunks (and the files hold what was written).
        check_total("tokens written (output vs the sum over chunks)", writer.written // dtype.itemsize, total)
        pairs, sizes = writer.finish()        # the real headers
        commits.extend(pairs)
        outputs = [final for _, final in pairs]
        tmps = [tmp for tmp, _ in pairs]
        n_docs = None
        if doc_index is not None:
            tmp, _ = atomic_path(doc_index)
            temps.append(tmp)
            commits.append((tmp, doc_index))
            n_docs = _write_doc_index(tmp, tmps, results, counts, sep_id if sep else None, items[0])
        verified = 0
        if verify and single_plain and shard_tokens is None:
            enter("verify")
            chunks = [(sh.start, sh.end) for sh in shards]
            verified = _verify(tmps[0], sources[0].name, tok, chunks, counts)
        elif verify:
            verified = n_bytes
        enter("write")
        if shard_tokens is not None:
            _write_manifest(out_path, outputs, sizes, total, shard_tokens, dtype, sep_id, n_docs, doc_index,
                            temps, commits)
        _publish(out_path, commits, shard_tokens, outputs)     # shards and index first, the manifest last
    except BaseException as exc:
        if writer is not None:
            writer.close()
        for tmp in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if getattr(bar, "closed", None) is False:
            bar.closed = True            # a failed run ends with its one error line, not "done"
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise named(exc, out_path) from None       # a full disk names the output
        raise
    finally:
        bar.close()
        if encoder is not None:
            encoder.close()
        if output is not None:
            output.close()
        if spill_dir is not None:
            spill_dir.remove()
        monitor.stop()
    t_end = time.perf_counter()
    seconds = {name: round((marks[k + 1][1] if k + 1 < len(marks) else t_end) - t, 3)
               for k, (name, t) in enumerate(marks)}
    memory = dict(monitor.summary(), held_back_chunks=held, max_held_ids_bytes=output.max_held,
                  spilled_ids_bytes=output.spilled)
    scheduler.warn_exceeded(memory, "encoding")       # the measured peak above the budget: one line
    return EncodeResult(out_path, total, n_bytes, dtype.name, t_end - t0, workers, len(results), verified,
                        plan=the_plan.to_dict(), memory=memory, phase_seconds=seconds,
                        n_documents=n_docs, bad_records=opts.bad.to_dict(),
                        shards=outputs if shard_tokens is not None else None)


# ==== On an executor: the shards of many inputs (corpus.shards) -> slices of the outputs ==========


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
        spill_dir = tempfile.mkdtemp(dir=folder, prefix="." + os.path.basename(out_path) + f".spill-{os.getpid()}-")
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
            shutil.rmtree(spill_dir, ignore_errors=True)
        monitor.stop()
    seconds = {name: round((marks[k + 1][1] if k + 1 < len(marks) else t_end) - t, 3)
               for k, (name, t) in enumerate(marks)}
    return EncodeResult(out_path, total, n_bytes, dtype.name, t_end - t0, n_workers,
                        sum(r["n_blocks"] for r in results), verified, plan=the_plan.to_dict(),
                        memory=dict(monitor.summary(), held_back_chunks=0), phase_seconds=seconds,
                        n_documents=n_docs, bad_records=opts.bad.to_dict(),
                        shards=outputs if shard_tokens is not None else None, cluster=cluster_info)


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


def encode_to_parts(input_path, tokenizer, out_url: str, cluster=None, num_workers: int | None = None,
                    memory_limit: int | None = None, chunk_bytes: int | None = None,
                    progress: bool | str = True, *, verify: bool = False, input_format: str = "auto",
                    text_field: str = "text", text_column: str = "text",
                    skip_bad_records: bool = False, cluster_timeout: float | None = None) -> EncodeResult:
    """Encode into sharded outputs at an fsspec URL (``s3://bucket/ids/``): one ``part-NNNNNN.npy``
    per input shard (``Source.shards``: any input ``encode_corpus`` takes but standard input and
    iterators), written by the task that encoded it, then ``manifest.json`` (written last by the
    client: the parts in order with their token counts and what input each stands for, the dtype).
    A reader trusts the parts only through the manifest (:func:`load_sharded_ids`); a run that
    fails removes the parts it wrote. Concatenated in manifest order the parts are the single-node
    ids, separators between items included: a task puts the separator id before its shard when the
    shard begins an item and is not the first shard; the client corrects the rare part where that
    guess was wrong (the shards before held no item: empty records only), rewriting that part.
    """
    t0 = time.perf_counter()
    fs, root = _fs_of(out_url)
    if fs.exists(f"{root}/{MANIFEST}"):
        raise CorpusError(out_url, f"already holds a {MANIFEST}; remove it (and its parts) or choose another URL")
    sources = _sources(input_path, input_format, text_column)
    for src in sources:
        if not src.rereadable:
            what = "standard input" if src.is_stdin else f"an iterator ({src.name})"
            raise ValueError(f"{src.name}: {what} cannot be encoded to a URL output (tasks read their own "
                             f"shards); write it to a file, or the ids to a local path")
    check_mode(progress)
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(tokenizer)
    size = _input_bytes(sources)
    the_plan = scheduler.plan_encoding(size, tok.n_vocab, memory_limit, num_workers=num_workers,
                                       chunk_bytes=chunk_bytes)
    dtype = ids_dtype(tok.n_vocab)
    specials = list(tok._special_bytes)
    sep = specials[0] if specials else b""
    sep_id = tok.special_tokens[sep.decode("utf-8")] if sep else None
    opts = ReadOptions(chunk_bytes=the_plan.chunk_bytes, special_tokens=specials,
                       pattern=pattern_name(tok.pattern),
                       inside_documents=getattr(tok, "chunks_inside_documents", True),
                       separator=sep, text_field=text_field, text_column=text_column,
                       bad=BadRecords(skip=skip_bad_records))
    fs.makedirs(root, exist_ok=True)            # a folder where there are folders; nothing on object stores
    bar = _progress(size, progress)
    announce = None if progress in (False, None, "none") else (lambda line: print(line, file=sys.stderr, flush=True))
    shards: list = []
    try:
        with open_executor(cluster, the_plan.num_workers, announce=announce, timeout=cluster_timeout) as ex:
            shards = [sh for src in sources for sh in src.shards(opts)]
            weights = shard_weights(shards)
            spec = ex.share(tok._encoder_spec(), recomputable=True)
            lengths = ex.share(_token_lengths(tok), recomputable=True)
            vocab = ex.share([tok.vocab.get(i, b"") for i in range(tok.n_vocab)], recomputable=True) \
                if verify else None
            results = ex.map(encode_shard_to_url, list(enumerate(shards)),
                             shared=(spec, lengths, out_url, dtype.str, sep_id, vocab),
                             on_done=lambda task: bar.update(weights[id(task[1])]))
            for src in sources:
                if src.stamp is not None:
                    src.stamp.check()
            items, leads, per_source = 0, [], {}
            for r in results:
                lead = bool(sep) and r["begins_item"] and items > 0       # the separator between two shards
                items += r["n_items"]
                leads.append(lead)
                if lead != r["lead"]:                # the task's guess was wrong: this part is rewritten
                    _fix_lead(fs, f"{root}/{_part_name(r['index'])}", lead, sep_id, dtype)
                    r["n_ids"] += 1 if lead else -1
                for k, v in r["per_source"].items():
                    per_source[k] = per_source.get(k, 0) + v
                opts.bad.absorb(r["bad"])
            # Conservation: every byte of every plain file encoded once (streams: checked by their task).
            for src in sources:
                if src.plain_text:
                    check_total(f"bytes of {src.name} (bytes encoded vs file size)", per_source.get(src.index, 0),
                                src.size)
            n_bytes = sum(per_source.values()) + len(sep) * (sum(leads) + sum(r["separators"] for r in results))
            parts = [dict({"path": _part_name(r["index"]), "n_tokens": r["n_ids"]}, **_shard_where(sh))
                     for sh, r in zip(shards, results)]
            for part in parts:          # Conservation: each part holds what its task counted.
                check_total(f"tokens in {part['path']}", _npy_length(fs, f"{root}/{part['path']}"), part["n_tokens"])
            total = sum(p["n_tokens"] for p in parts)
            manifest = {"format": MANIFEST_FORMAT, "input": _describe_inputs(input_path), "input_bytes": n_bytes,
                        "dtype": dtype.name, "n_tokens": total, "parts": parts}
            fs.pipe_file(f"{root}/{MANIFEST}", (json.dumps(manifest, indent=1) + "\n").encode())
            cluster_info = ex.describe() if ex.remote else {}
            n_workers = ex.n_workers
    except BaseException:
        for i in range(len(shards)):
            with contextlib.suppress(Exception):
                fs.rm_file(f"{root}/{_part_name(i)}")
        raise
    finally:
        bar.close()
    return EncodeResult(out_url, total, n_bytes, dtype.name, time.perf_counter() - t0, n_workers,
                        sum(r["n_blocks"] for r in results), n_bytes if verify else 0, plan=the_plan.to_dict(),
                        bad_records=opts.bad.to_dict(), cluster=cluster_info)


def _shard_where(shard) -> dict:
    """What input a part stands for (the manifest): the source, and its byte range or row groups."""
    out = {"source": shard.source.name}
    if hasattr(shard, "start"):
        out.update(start=shard.start, end=shard.end)
    elif hasattr(shard, "groups"):
        out["row_groups"] = [shard.groups[0], shard.groups[-1]]
    return out


def _describe_inputs(inputs):
    if isinstance(inputs, (list, tuple)):
        return [os.fspath(p) for p in inputs]
    return os.fspath(inputs)


def encode_shard_to_url(task: tuple, spec, token_lengths: np.ndarray, out_url: str, dtype: str, sep_id,
                        vocab=None) -> dict:
    """Task: encode one shard of ``corpus.shards`` (``(index, shard)``) into its own
    ``part-NNNNNN.npy`` under ``out_url`` (:func:`encode_source_shard` into a spill file in this
    worker's temp folder, then uploaded whole). The separator id goes first when the shard begins an
    item and is not the first shard (``lead`` in the result; ``encode_to_parts`` corrects a wrong
    guess). Returns :func:`encode_source_shard`'s dict, with ``n_ids`` counting that separator."""
    index, shard = task
    folder = tempfile.mkdtemp(prefix="bpe_core-part-")
    try:
        r = encode_source_shard(task, spec, token_lengths, folder, dtype, sep_id, False, vocab)
        ids = np.fromfile(_spill_path(folder, index), dtype=np.dtype(dtype))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    check_total(f"tokens of {_part_name(index)} (spill vs ids encoded)", int(ids.shape[0]), r["n_ids"])
    r["lead"] = sep_id is not None and r["begins_item"] and index > 0
    if r["lead"]:
        ids = np.concatenate([np.array([sep_id], ids.dtype), ids])
        r["n_ids"] += 1
    out = io.BytesIO()
    np.save(out, ids)
    fs, root = _fs_of(out_url)
    fs.pipe_file(f"{root}/{_part_name(index)}", out.getvalue())
    return r


#: Per thread: (the shared spec it was made from, this thread's own copy with its encoder and cache).
_THREAD_SPEC = threading.local()


def _thread_spec(spec):
    held = getattr(_THREAD_SPEC, "held", None)
    if held is None or held[0] is not spec:
        held = _THREAD_SPEC.held = (spec, copy.copy(spec))
    return held[1]


__all__ = ["EncodeResult", "VerifyError", "encode_corpus", "encode_shard_to_url",
           "encode_source_shard", "encode_sources_on", "encode_to_parts", "place_segments", "ids_dtype", "iter_chunks", "load_sharded_ids", "manifest_path", "plan",
           "shard_paths"]
