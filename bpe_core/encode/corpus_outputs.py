"""The output set of ``encode_corpus``: shard names and generations, the manifest, the document
index, the verify sample, and publishing them as one set (``runtime.atomic.publish_files``).

Part of ``encode.encode_corpus`` (its steps 4-6: assemble, verify, write).
"""
from __future__ import annotations

import contextlib
import json
import os
import re

import numpy as np

from ..corpus.ranges import read_source
from ..errors import VerifyError
from ..formats.ids import dump_doc_index
from ..runtime.atomic import atomic_path, publish_files
from .tokenizer import Tokenizer


def shard_paths(out_path: str, n_shards: int, generation: int | None = None) -> list[str]:
    """The shard files of ``--shard-tokens``: ``ids.npy`` -> ``ids-g1-00000.npy``, ``ids-g1-00001.npy``,
    ... for generation 1 (each run writes the next generation, so it never writes over the shards
    the current manifest lists); without a generation, the names older versions wrote.

    >>> shard_paths("out/ids.npy", 2, 3), shard_paths("out/ids.npy", 1), manifest_path("out/ids.npy")
    (['out/ids-g3-00000.npy', 'out/ids-g3-00001.npy'], ['out/ids-00000.npy'], 'out/ids.manifest.json')
    """
    stem = out_path[:-4] if out_path.endswith(".npy") else out_path
    gen = f"g{generation}-" if generation is not None else ""
    return [f"{stem}-{gen}{k:05d}.npy" for k in range(n_shards)]


def shard_names(out_path: str) -> "re.Pattern":
    stem = os.path.basename(out_path[:-4] if out_path.endswith(".npy") else out_path)
    return re.compile(re.escape(stem) + r"-(?:g(\d+)-)?\d{5}\.npy")


def next_generation(out_path: str) -> int:
    """One more than the generation of the manifest and of any shard file there."""
    folder = os.path.dirname(os.path.abspath(out_path))
    rx = shard_names(out_path)
    gens = [0]
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        with open(manifest_path(out_path), encoding="utf-8") as f:
            gens.append(int(json.load(f).get("generation") or 0))
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            m = rx.fullmatch(name)
            if m and m.group(1):
                gens.append(int(m.group(1)))
    return max(gens) + 1


def older_shards(out_path: str, keep: set) -> list[str]:
    """Shard files of ``out_path`` other than ``keep`` (an older generation's, or an older version's)."""
    folder = os.path.dirname(os.path.abspath(out_path))
    rx = shard_names(out_path)
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if rx.fullmatch(n) and n not in keep]


def publish_outputs(out_path: str, pairs: list, shard_tokens, outputs: list[str]) -> None:
    """Rename the outputs into place as one set (``runtime.atomic.publish_files``): the ids (or the
    shards, under their generation's names) and the index first, the manifest last; then the
    shards of older generations go."""
    if shard_tokens is None:
        publish_files(pairs, key=out_path)
        return
    keep = {os.path.basename(p) for p in outputs}
    publish_files(pairs, key=manifest_path(out_path), remove=older_shards(out_path, keep))


def manifest_path(out_path: str) -> str:
    """The JSON manifest of a sharded output (see :func:`shard_paths`)."""
    stem = out_path[:-4] if out_path.endswith(".npy") else out_path
    return f"{stem}.manifest.json"


def output_layout(out_path: str, total: int, shard_tokens: int | None) -> tuple[list[str], list[int]]:
    """The output file(s) and their token counts: one ``.npy``, or shards of ``shard_tokens`` (the
    next generation's names)."""
    if shard_tokens is None:
        return [out_path], [total]
    n_shards = max(1, -(-total // shard_tokens))
    return (shard_paths(out_path, n_shards, next_generation(out_path)),
            [min(shard_tokens, total - k * shard_tokens) for k in range(n_shards)])


def write_manifest(out_path: str, outputs: list[str], sizes: list[int], total: int, shard_tokens: int,
                    dtype: np.dtype, sep_id, n_docs, doc_index, temps: list, commits: list) -> None:
    """The JSON manifest of ``--shard-tokens`` outputs, to a temp file committed after the shards."""
    gen = shard_names(out_path).fullmatch(os.path.basename(outputs[0])).group(1)
    manifest = {"format": "bpe_core-shards", "version": 1, "generation": int(gen), "dtype": dtype.name,
                "n_tokens": total,
                "shard_tokens": shard_tokens,
                "shards": [{"path": os.path.basename(p), "n_tokens": n, "first_token": k * shard_tokens}
                           for k, (p, n) in enumerate(zip(outputs, sizes))],
                "separator_id": sep_id, "n_documents": n_docs,
                "doc_index": os.path.basename(doc_index) if doc_index else None}
    tmp, _ = atomic_path(manifest_path(out_path))
    temps.append(tmp)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    commits.append((tmp, manifest_path(out_path)))


def write_doc_index(tmp: str, outputs: list[str], results: list, counts: list[int], sep_id, n_items: int) -> int:
    """The ``int64`` start offset of every document in the id array: 0 and after every separator id
    (with a separator), or every item's first id (without). Returns the number of documents.

    ``results``: ``(n_ids, lead, doc_starts)`` per chunk, ``counts`` its ids in the output (its
    separator before it included). With a separator, ``doc_starts`` are the positions of the
    separator id in the chunk's ids when the workers found them (``encode_corpus``); else (None)
    the outputs are read back for them.
    """
    if n_items == 0:
        starts_all = [np.zeros(0, np.int64)]
    elif sep_id is not None and results and all(r[2] is not None for r in results):
        starts_all = [np.zeros(1, np.int64)]
        base = 0
        for (n_ids, lead, seps), n in zip(results, counts):
            if lead:
                starts_all.append(np.array([base + 1], np.int64))
            starts_all.append(seps + (base + lead + 1))
            base += n
    elif sep_id is not None:
        starts_all = [np.zeros(1, np.int64)]
        base = 0
        for path in outputs:
            ids = np.load(path, mmap_mode="r")
            for a in range(0, len(ids), 1 << 24):
                part = np.asarray(ids[a:a + (1 << 24)])
                starts_all.append(np.flatnonzero(part == sep_id).astype(np.int64) + (base + a + 1))
            base += len(ids)
            del ids
    else:
        starts_all = []
        base = 0
        for (n_ids, lead, starts), n in zip(results, counts):
            if starts is not None and len(starts):
                starts_all.append(starts + base)
            base += n
    index = np.concatenate(starts_all) if starts_all else np.zeros(0, np.int64)
    dump_doc_index(tmp, index, outputs)     # + the trailer naming the ids it indexes (formats.ids)
    return int(len(index))


def verify_sample(tmp: str, input_path: str, tok: Tokenizer, chunks, counts, max_chunks: int = 8,
            max_ids: int = 1 << 20) -> int:
    def read(start: int, n: int) -> bytes:          # a local path or a URL
        return read_source(input_path, start, start + n).tobytes()
    return verify_sample_with(read, tmp, input_path, tok, chunks, counts, max_chunks, max_ids)


def verify_sample_with(read, tmp: str, input_path: str, tok: Tokenizer, chunks, counts, max_chunks: int = 8,
                 max_ids: int = 1 << 20) -> int:
    """Decode the start of up to ``max_chunks`` chunks (first, last, evenly between) and compare."""
    ids = np.load(tmp, mmap_mode="r")
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    n = len(chunks)
    picks = sorted({round(k * (n - 1) / max(1, max_chunks - 1)) for k in range(min(n, max_chunks))})
    checked = 0
    for i in picks:
        start, end = chunks[i]
        k = min(int(counts[i]), max_ids)
        got = tok.decode_bytes(np.asarray(ids[offsets[i]: offsets[i] + k]))
        want = read(start, min(len(got), end - start))
        if got != want or (k == counts[i] and len(got) != end - start):
            raise VerifyError(f"{input_path}: ids of bytes {start}-{end} do not decode back to the input")
        checked += len(got)
    del ids
    return checked
