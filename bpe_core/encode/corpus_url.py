"""``encode_corpus`` to an fsspec URL (``s3://bucket/ids/``): one ``part-NNNNNN.npy`` per input
shard, written by the task that encoded it, then the manifest, written last by the client
(:func:`encode_to_parts`); ``sharded_parts`` names the parts and reads them back.

Part of ``encode.encode_corpus`` (the URL output).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import time

import numpy as np

from ..corpus.readers import BadRecords
from ..corpus.shards import ReadOptions
from ..errors import CorpusError
from ..pretok.counting import shard_weights
from ..pretok.patterns import pattern_name
from ..runtime import budget as scheduler
from ..runtime.atomic import new_temp_dir
from ..runtime.executors import open_executor
from ..runtime.progress import check_mode
from ..runtime.workers import check_total
from .corpus_cluster import encode_source_shard
from .corpus_plan import (EncodeResult, ids_dtype, input_bytes as _input_bytes, progress_bar as _progress,
                          sources_of as _sources)
from .corpus_workers import spill_path as _spill_path, token_lengths_of as _token_lengths
from .sharded_parts import (MANIFEST, MANIFEST_FORMAT, fix_lead as _fix_lead, fs_of as _fs_of,
                            npy_length as _npy_length, part_name as _part_name)
from .tokenizer import Tokenizer


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
    folder = new_temp_dir(None, "bpe_core-part-")
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
