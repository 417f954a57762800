"""Plain byte-level BPE (CS336 semantics): the merge loop over the counted word table."""
from __future__ import annotations

import tempfile
from typing import Optional

from ..engine.merge import train_words
from ..errors import BudgetError
from ..formats import registry
from ..runtime.budget import (FILL_BUFFER_BYTES, GPT2_NARROW_BYTES, TOKEN_BYTES_MERGING, TOKEN_BYTES_WRITING,
                               TOKEN_BYTES_WRITING_WIDE, fmt_bytes, fmt_size,
                              suggested_budget)

__all__ = ["BPE", "TokenBytesGuard"]


class TokenBytesGuard:
    """The merge engine's ``allowed(left, right)`` for plain BPE: ``max_token_bytes`` (no token longer
    than that; None: any length) and the budget for the bytes of the tokens the merges build.

    A corpus of one repeated byte (or any long pretoken of few distinct pairs) builds tokens as long
    as its longest pretoken: 20 MB of ``a`` make 164 MiB of tokens in 31 merges, ~2.2 GiB while the
    model folder is written. The guard adds up the bytes of each merge's token; when the merge phase
    (``merge_bytes`` + ``TOKEN_BYTES_MERGING`` x tokens) or the writing (``parent_overhead`` +
    ``TOKEN_BYTES_WRITING`` x printable ASCII bytes + ``TOKEN_BYTES_WRITING_WIDE`` x the others: their
    GPT-2 characters take 2 bytes) would pass ``memory_limit``, it stops the run with a
    :class:`BudgetError` (one line) rather than let it be killed. It never changes a merge that fits.

    >>> g = TokenBytesGuard(max_token_bytes=3)
    >>> g(b"ab", b"c"), g(b"ab", b"cd"), g(b"\\0", b"\\0"), g.total, g.wide
    (True, False, True, 5, 2)
    """

    def __init__(self, max_token_bytes: Optional[int] = None, memory_limit: Optional[int] = None,
                 merge_bytes: int = 0, parent_overhead: int = 0, longest_pretoken: int = 0):
        self.max_token_bytes = max_token_bytes
        self.memory_limit = memory_limit
        self.merge_bytes = merge_bytes
        self.parent_overhead = parent_overhead
        self.longest = longest_pretoken
        self.total = 0
        self.wide = 0                  # bytes among them whose GPT-2 character is not printable ASCII
        self.n_merges = 0

    def __call__(self, left: bytes, right: bytes) -> bool:
        n = len(left) + len(right)
        if self.max_token_bytes is not None and n > self.max_token_bytes:
            return False
        self.total += n
        self.wide += len(left.translate(None, GPT2_NARROW_BYTES)) + len(right.translate(None, GPT2_NARROW_BYTES))
        self.n_merges += 1
        if self.memory_limit is not None:
            need = int(max(self.merge_bytes + TOKEN_BYTES_MERGING * self.total,
                           self.parent_overhead + TOKEN_BYTES_WRITING * (self.total - self.wide)
                           + TOKEN_BYTES_WRITING_WIDE * self.wide))
            if need > self.memory_limit:
                raise BudgetError(
                    f"memory limit {fmt_bytes(self.memory_limit)} is too small for the tokens this corpus builds: "
                    f"after {self.n_merges:,} merges they hold {fmt_bytes(self.total)} (its longest pretoken is "
                    f"{self.longest:,} bytes without a break, and merges build tokens as long as that), and "
                    f"merging and writing them needs ~{fmt_bytes(need)}; give --max-token-bytes N (no token "
                    f"longer than N bytes: a different vocabulary), or a budget of at least --memory-limit "
                    f"{fmt_size(suggested_budget(need))} (a lower bound: later merges may build more)",
                    suggested_budget(need))
        return True

    @classmethod
    def for_run(cls, config, plan, n_merges: int) -> Optional["TokenBytesGuard"]:
        """The guard a run needs (None when no token can outgrow the budget: ``n_merges`` tokens of at
        most the longest pretoken's bytes fit, and no ``max_token_bytes``)."""
        limit = getattr(plan, "memory_limit", None)
        longest = getattr(plan, "longest_pretoken", 0) or 0
        cap = config.max_token_bytes
        merge_bytes, po = getattr(plan, "merge_bytes", 0), getattr(plan, "parent_overhead", 0)
        bound = n_merges * longest
        if cap is None and (limit is None or max(merge_bytes + TOKEN_BYTES_MERGING * bound,
                                                  po + TOKEN_BYTES_WRITING_WIDE * bound) <= limit):
            return None
        return cls(cap, limit, merge_bytes, po, longest)


#: What the merge phase's second thread adds to the process beyond the plan's merge figure: its
#: stack (1 MiB at most) and, while a build of mapped lists counts and fills on two threads, the
#: second half's pair table, arrays and fill counts (room for the 65,536 byte pairs: ~4.3 MiB). It
#: has no glibc arena of its own (the engine reserves its buffers from the main thread; an arena
#: had cost ~96 MiB at 15 GB: anon peak 2,074 MiB on two threads against 1,997 on one), and its
#: share of each merge is room the first thread's share no longer needs (the engine's ``shares``).
SECOND_THREAD_BYTES = 8 << 20


def merge_threads(plan) -> int:
    """The threads of the merge loop: the counting's workers (two at most: the engine's second
    thread; the same merges as one), when the budget has room for the second one's memory; else one.

    >>> from types import SimpleNamespace as P
    >>> merge_threads(P(num_workers=2, memory_limit=1 << 30, merge_bytes=900 << 20))
    2
    >>> merge_threads(P(num_workers=2, memory_limit=1 << 30, merge_bytes=1020 << 20))
    1
    >>> merge_threads(P(num_workers=1, memory_limit=None, merge_bytes=0))
    1
    """
    threads = getattr(plan, "num_workers", 1) or 1
    limit = getattr(plan, "memory_limit", None)
    if threads > 1 and limit is not None and getattr(plan, "merge_bytes", 0) + SECOND_THREAD_BYTES > limit:
        return 1
    return threads


class BPE(registry.Method):
    """Standard BPE: merges inside pretokens, ties to the greatest ``(left_bytes, right_bytes)`` (or, with
    ``tie_break="hf"``, in HF ``tokenizers``' order)."""

    name = "bpe"
    rereads_input = False          # one pass: the counted table is all it needs
    drops_single_byte_words = True  # the merge engine drops words of one byte (no pair in them)
    supports_init = True
    plain_tables = True            # train_words takes a small run's array.array table (no numpy)

    def train(self, config, table, plan, progress=False, init=None) -> registry.MethodResult:
        report: dict = {"seconds": {}}
        # The plan (made with the real counts) says whether the engine's read-only arrays are mapped.
        mapped = getattr(plan, "merge_mapped", False)
        n_merges = config.vocab_size - 256 - len(config.special_tokens)
        guard = TokenBytesGuard.for_run(config, plan, n_merges)
        vocab, merges = train_words(table, config.vocab_size, config.special_tokens, progress=progress,
                                    report=report, init_merges=init.merges if init is not None else None,
                                    allowed=guard,
                                    spill_dir=(config.spill_dir or tempfile.gettempdir()) if mapped else None,
                                    fill_buffer_bytes=getattr(plan, "fill_buffer_bytes", FILL_BUFFER_BYTES),
                                    tie_break=config.tie_break,
                                    threads=merge_threads(plan))
        stage = {"name": "bpe", "merges": len(merges)}
        if config.tie_break != "bytes":          # the default leaves the model file as it was
            stage["tie_break"] = report["tie_break"] = config.tie_break
        return registry.MethodResult(vocab, merges, [stage], report)


registry.register(BPE())
