"""The encode step of ``encode_corpus`` on worker threads: :class:`ChunkEncoder` encodes a chunk
(a block of ``corpus.shards``) with this thread's own encoder and puts its ids into the output
(``ids_out.OrderedIds``), checking that they stand for exactly its bytes; the spill folder of the
chunks that wait for their turn, and how many bytes of ids such a chunk holds before it spills.

Part of ``encode.encode_corpus`` (its step 3: encode).
"""
from __future__ import annotations

import copy
import os
import shutil
import threading

import numpy as np

from ..corpus.inputs import Source
from ..corpus.shards import Block, TextRangeShard, load
from ..errors import VerifyError
from ..runtime import budget as scheduler
from ..runtime.atomic import new_temp_dir
from ..runtime.workers import check_total
from . import _encode
from .ids_out import OrderedIds
from .tokenizer import Tokenizer


def spill_path(spill_dir: str, index: int) -> str:
    return os.path.join(spill_dir, f"chunk-{index:08d}.bin")


class SpillFolder:
    """The run's spill folder (``.<out>.spill-<pid>-*`` beside the output), made when the first chunk
    spills: most runs never spill, and a folder made and removed costs two directory updates (a few
    ms of wall on a loaded disk). After :meth:`remove` no folder is made any more (a worker still
    running when the run fails gets an error, not a new folder that nothing removes)."""

    def __init__(self, folder: str, out_path: str):
        self.folder = folder
        self.prefix = "." + os.path.basename(out_path) + f".spill-{os.getpid()}-"
        self.path: str | None = None
        self.removed = False
        self.lock = threading.Lock()

    def file(self, index: int) -> str:
        """The spill file of chunk ``index`` (the folder is made on the first call)."""
        with self.lock:
            if self.path is None:
                if self.removed:
                    raise RuntimeError("the run's spill folder is gone (the run is ending)")
                self.path = new_temp_dir(self.folder, self.prefix)
            return spill_path(self.path, index)

    def remove(self) -> None:
        with self.lock:
            self.removed = True
            if self.path is not None:
                shutil.rmtree(self.path, ignore_errors=True)


class ChunkEncoder:
    """Encodes blocks on worker threads: one encoder per thread (each has its own pretoken cache),
    one shared read-only rank table. The ids go to the output through ``output``
    (``ids_out.OrderedIds``: straight in while the chunk is the head, else held or spilled)."""

    def __init__(self, spec, output: OrderedIds, dtype: np.dtype, token_lengths: np.ndarray,
                 want_doc_starts: bool = False, verify: bool = False, decode=None, sep_id=None):
        self.spec = spec
        self.output = output
        self.dtype = dtype
        self.token_lengths = token_lengths
        self.want_doc_starts = want_doc_starts
        self.sep_id = sep_id
        self.verify = verify
        self.decode = decode
        self._local = threading.local()
        self._specs: list = []              # each thread's spec, so close() can give back lent encoders

    def __call__(self, task: tuple) -> tuple:
        """Encode one block into the output; returns ``(index, n_ids, n_bytes, begins_item,
        n_items, source, doc_starts)`` (``doc_starts``: the id offsets, within the block, where a
        document given by ``Block.doc_ends`` starts (``want_doc_starts``), or where the separator
        id stands (``sep_id``: a document starts after each); None unless asked for).

        Conservation: the ids of the block must stand for exactly its bytes (the sum of their token
        lengths), checked block by block as they are put.
        """
        index, piece = task
        spec = getattr(self._local, "spec", None)
        if spec is None:
            spec = self._local.spec = copy.copy(self.spec)     # its own encoder, built on first use
            self._specs.append(spec)
        slot = self.output.open(index)
        block: Block = self._read(piece)
        slot.start(block.begins_item)
        buf = block.data
        if block.doc_ends is None:
            ranges = [(0, len(buf))]
        else:
            ends = np.asarray(block.doc_ends).tolist()
            ranges = list(zip([0] + ends[:-1], ends))
        n_ids = n_bytes = 0
        head: list = []
        starts = [] if self.want_doc_starts and (block.doc_ends is not None or block.begins_item) else None
        seps = [] if self.sep_id is not None else None
        narrow = self.dtype == np.uint16
        counted = getattr(spec, "iter_encode_counted", None)
        for a, b in ranges:
            if starts is not None:
                starts.append(n_ids)
            if b <= a:
                continue
            if counted is not None:     # ids narrowed and their bytes summed in one native pass
                blocks = counted(buf, a, b, self.token_lengths, narrow)
            else:
                blocks = ((ids.astype(self.dtype, copy=False), bytes_of(self.token_lengths, ids))
                          for ids in spec.iter_encode(buf, a, b))
            for out, block_bytes in blocks:
                if block_bytes < 0:     # an id outside the table: refuse before writing it
                    check_total(f"bytes of {block.label} (an id outside the vocabulary)", block_bytes, len(buf))
                n_bytes += block_bytes
                if self.verify and n_ids < VERIFY_IDS:
                    head.append(out[:VERIFY_IDS - n_ids])
                slot.put(out)
                if seps is not None:
                    seps.append(np.flatnonzero(out == self.sep_id) + n_ids)
                n_ids += len(out)
        check_total(f"bytes of {block.label} (bytes the ids stand for vs bytes read)", n_bytes, len(buf))
        if self.verify:
            _verify_block(head, self.dtype, buf, self.decode, block.label, n_ids)
        doc_starts = np.asarray(starts, np.int64) if starts is not None else None
        if seps is not None:
            doc_starts = np.concatenate(seps).astype(np.int64) if seps else np.zeros(0, np.int64)
        return index, n_ids, n_bytes, block.begins_item, block.n_items, block.source, doc_starts

    def _read(self, task) -> Block:
        """The task's block. A byte range of a plain file is read into this thread's buffer, reused
        from chunk to chunk (nothing keeps a block's bytes after its call): a fresh array per
        chunk had its pages faulted in and zeroed, ~4% of the CPU time of a 1.5 GB run."""
        if not isinstance(task, TextRangeShard):
            return load(task)
        n = task.end - task.start
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < n:
            self._local.buf = None           # the old one goes before the new one is made
            buf = self._local.buf = np.empty(n + (n >> 6), dtype=np.uint8)
        return task.read(out=buf)

    def close(self) -> None:
        for spec in self._specs:             # lent encoders go back to the tokenizer, still warm
            getattr(spec, "release", lambda: None)()
        self._specs = []
        self._local = threading.local()      # the other encoders and their caches go now


def _verify_block(head: list, dtype: np.dtype, buf, decode, label: str, n_ids: int) -> None:
    """Decode the first ids of a block (``head``, up to ``VERIFY_IDS``) back and compare them with its bytes."""
    ids = np.concatenate(head) if head else np.zeros(0, dtype)
    got = decode(ids)
    if bytes(buf[:len(got)]) != got or (n_ids <= VERIFY_IDS and len(got) != len(buf)):
        raise VerifyError(f"{label}: ids do not decode back to the input")


#: Ids decoded back per block when a cluster task verifies (``verify=True``).
VERIFY_IDS = 1 << 20


def hold_bytes(window_bytes: int, max_in_flight: int) -> int:
    """The bytes of ids a chunk that is not the head keeps in memory before it spills:
    ``window_bytes`` shared by the at most ``max_in_flight`` chunks in flight.

    The plan gives the parent ``ENCODE_WINDOW_CHUNKS`` chunks for the cutting window. Plain files
    are cut before the encode phase, which leaves that whole window to the held ids
    (:func:`hold_window`); streamed inputs are cut while it runs, so their chunks share one chunk of
    it. A chunk's ids take about half its bytes (``uint16``, ~4 bytes a token) and a chunk that waits
    for its turn was usually half encoded when the one before it finished, so most chunks spill
    nothing (with one chunk of window, the second of two 1 MiB chunks spilled half its ids: a spill
    folder, a file, a copy and 5 % of the wall time of a 5 MB run).

    >>> hold_bytes(64 << 20, 4) >> 20
    16
    """
    return max(0, window_bytes // max(1, max_in_flight))


def hold_window(chunk_bytes: int, sources: list[Source]) -> int:
    """The parent's bytes for held ids: the plan's whole cutting window when every input is a
    plain file (cut before encoding), else one chunk of it (readers fill the rest as they go)."""
    plain = all(src.plain_text for src in sources)
    return chunk_bytes * (scheduler.ENCODE_WINDOW_CHUNKS if plain else 1)


def bytes_of(token_lengths: np.ndarray, ids: np.ndarray) -> int:
    """The bytes ``ids`` stand for: ``token_lengths[ids].sum()``, in one native pass for uint32 ids
    (``_encode.sum_lengths``, no gathered copy); an id outside the table counts -1 in all, so the
    conservation check fails."""
    if ids.dtype == np.uint32 and token_lengths.dtype == np.int64:
        return int(_encode.sum_lengths(np.ascontiguousarray(token_lengths), np.ascontiguousarray(ids)))
    if ids.size and int(ids.max()) >= len(token_lengths):
        return -1
    return int(token_lengths[ids].sum())


def token_lengths_of(tok: Tokenizer) -> np.ndarray:
    """Byte length of every id (0 for ids no token uses): what ``bytes encoded`` is summed from."""
    table = getattr(tok, "_tokens", None)   # the native table of the token bytes: from its offsets
    if table is not None and table.n == len(tok._decoder):
        return table.lengths()
    decoder = tok._decoder                  # id -> bytes or None (one pass, no copy of the vocab)
    return np.fromiter((0 if b is None else len(b) for b in decoder), dtype=np.int64, count=len(decoder))
