"""Stage 6: the training methods, each behind the small ``formats.registry.Method`` interface and
declared by name when this package is imported (each module is imported when first used):

- ``bpe``: plain byte-level BPE;
- ``superbpe``: SuperBPE, a second stage that merges across whitespace;
- ``supratok``: SupraTok, PMI-seeded multiword merges and scored spans (experimental);
- ``curate``: entropy curation of the input, a pre-pass for any method (``--entropy-filter``).
"""
from ..formats import registry

# Each module registers its method when imported: the registry imports it the first time the name is
# asked for (a plain BPE run never imports SuperBPE's or SupraTok's modules).
for _name in ("bpe", "superbpe", "supratok"):
    registry.declare(_name, f"{__name__}.{_name}")
del _name

__all__ = ["bpe", "superbpe", "supratok"]


def __getattr__(name: str):
    """``methods.superbpe`` and the like: the submodule, imported on first use."""
    if name in __all__ or name in ("curate", "init_from"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
