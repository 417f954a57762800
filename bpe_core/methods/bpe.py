"""Plain byte-level BPE (CS336 semantics): the merge loop over the counted word table."""
from __future__ import annotations

import tempfile

from ..engine.merge import train_words
from ..formats import registry
from ..runtime.budget import FILL_BUFFER_BYTES

__all__ = ["BPE"]


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
        vocab, merges = train_words(table, config.vocab_size, config.special_tokens, progress=progress,
                                    report=report, init_merges=init.merges if init is not None else None,
                                    spill_dir=(config.spill_dir or tempfile.gettempdir()) if mapped else None,
                                    fill_buffer_bytes=getattr(plan, "fill_buffer_bytes", FILL_BUFFER_BYTES),
                                    tie_break=config.tie_break)
        stage = {"name": "bpe", "merges": len(merges)}
        if config.tie_break != "bytes":          # the default leaves the model file as it was
            stage["tie_break"] = report["tie_break"] = config.tie_break
        return registry.MethodResult(vocab, merges, [stage], report)


registry.register(BPE())
