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

The parts (this module is their table of contents, and keeps the names other code imports from it):

- ``corpus_plan``: step 1-2, the inputs, the output checks, the memory plan and read options
  (``prepare``); ``EncodeResult``, ``plan``, ``ids_dtype``, ``iter_chunks``.
- ``corpus_workers``: step 3, ``ChunkEncoder`` on the worker threads, the spill folder, the hold bound.
- ``ids_out``: the ordered writer the workers put their ids into (held, spilled, copied in).
- ``corpus_outputs``: steps 4-6, shard names and generations, the manifest, the document index,
  the verify sample, publishing the set.
- ``corpus_cluster``: the same run on an executor (``cluster=``; :func:`encode_sources_on`).
- ``corpus_url``: sharded outputs at an fsspec URL (:func:`encode_to_parts`); ``sharded_parts``
  reads them back (:func:`load_sharded_ids`).
"""
from __future__ import annotations

import contextlib
import os
import time

import numpy as np

from ..corpus.ranges import is_url
from ..corpus.shards import TextRangeShard, iter_tasks
from ..errors import VerifyError
from ..runtime import budget as scheduler
from ..runtime.atomic import DISK_FULL, atomic_path, named
from ..runtime.memmon import MemoryMonitor, phase
from ..runtime.workers import check_total, run_ordered
from .corpus_cluster import encode_source_shard, encode_sources_on, place_segments
from .corpus_outputs import (manifest_path, next_generation as _next_generation, publish_outputs as _publish,
                             shard_paths, verify_sample as _verify, write_doc_index as _write_doc_index,
                             write_manifest as _write_manifest)
from .corpus_plan import (EncodeResult, ids_dtype, iter_chunks, plan, prepare as _prepare, progress_bar as _progress)
from .corpus_url import encode_shard_to_url, encode_to_parts
from .corpus_workers import (ChunkEncoder as _ChunkEncoder, SpillFolder as _SpillFolder, hold_bytes as _hold_bytes,
                             hold_window as _hold_window, token_lengths_of as _token_lengths)
from .ids_out import IdsWriter, OrderedIds
from .sharded_parts import load_sharded_ids
from .tokenizer import Tokenizer

MiB = 1 << 20
#: Inputs up to this size are encoded without the memory monitor's sampling thread: such a run lasts
#: a few of its 50 ms intervals, so the thread would add a sample or two (starting and joining it
#: cost 1 ms of CPU and up to 10 ms of wall on a loaded machine). The RSS is still sampled before
#: every chunk is handed out (the budget guard), at the start and at the end.
SMALL_INPUT_BYTES = 8 * MiB


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
        if the_plan.cache_entries and hasattr(spec, "cache_entries"):     # (a long input: the large cache)
            spec.cache_entries = the_plan.cache_entries
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


__all__ = ["EncodeResult", "VerifyError", "encode_corpus", "encode_shard_to_url",
           "encode_source_shard", "encode_sources_on", "encode_to_parts", "place_segments", "ids_dtype", "iter_chunks", "load_sharded_ids", "manifest_path", "plan",
           "shard_paths"]
