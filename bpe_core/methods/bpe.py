"""Plain byte-level BPE (CS336 semantics): the merge loop over the counted word table."""
from __future__ import annotations

from ..engine.merge import train_words
from ..formats import registry

__all__ = ["BPE"]


class BPE(registry.Method):
    """Standard BPE: merges inside pretokens, ties to the greatest ``(left_bytes, right_bytes)``."""

    name = "bpe"
    rereads_input = False          # one pass: the counted table is all it needs
    supports_init = True

    def train(self, config, table, plan, progress=False, init=None) -> registry.MethodResult:
        report: dict = {"seconds": {}}
        vocab, merges = train_words(table, config.vocab_size, config.special_tokens, progress=progress,
                                    report=report, init_merges=init.merges if init is not None else None)
        return registry.MethodResult(vocab, merges, [{"name": "bpe", "merges": len(merges)}], report)


registry.register(BPE())
