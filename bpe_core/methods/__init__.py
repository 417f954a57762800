"""Stage 6: the training methods, each behind the small ``formats.registry.Method`` interface and
registered by name when this package is imported:

- ``bpe``: plain byte-level BPE;
- ``superbpe``: SuperBPE, a second stage that merges across whitespace;
- ``supratok``: SupraTok, PMI-seeded multiword merges and scored spans (experimental);
- ``curate``: entropy curation of the input, a pre-pass for any method (``--entropy-filter``).
"""
from . import bpe, superbpe, supratok  # noqa: F401  (each registers its method)

__all__ = ["bpe", "superbpe", "supratok"]
