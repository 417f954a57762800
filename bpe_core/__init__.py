"""bpe_core: exact, fast, RAM-budgeted byte-level BPE training and corpus encoding.

This is the public API.
"""


class ExtensionsNotBuilt(ImportError):
    """``import bpe_core`` found a source checkout whose compiled extensions are not built."""


def _unbuilt_hint() -> "str | None":
    """One line saying what to do when the compiled extensions are missing next to this file (None
    when they are there).

    That happens when Python finds the source checkout before the installed package (the current
    directory is the repository root), and otherwise ends in a confusing circular-import error.
    Only the files are looked for (nothing is imported here: ``import bpe_core`` stays cheap); a
    built but broken extension raises its own error where it is first imported.
    """
    import importlib.machinery
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    built = any(os.path.exists(os.path.join(here, "engine", "_engine" + suffix))
                for suffix in importlib.machinery.EXTENSION_SUFFIXES)
    if built:
        return None
    return (f"bpe_core: the compiled extensions are not built in {here} (this is the source checkout, "
            f"found first because the current directory is the repository root); build them in place "
            f"with `pip install -e .` (or `python setup.py build_ext --inplace`), or run from another "
            f"folder to use the installed package")


def _one_line_hook(previous):
    """A ``sys.excepthook`` that prints :class:`ExtensionsNotBuilt` as its one line, no traceback."""
    def hook(kind, value, tb):
        if issubclass(kind, ExtensionsNotBuilt):
            import sys

            print(f"ImportError: {value}", file=sys.stderr)
        else:
            previous(kind, value, tb)
    return hook


_hint = _unbuilt_hint()
if _hint is not None:
    import sys as _sys

    _sys.excepthook = _one_line_hook(_sys.excepthook)
    raise ExtensionsNotBuilt(_hint, name=__name__)
del _hint
from . import methods  # noqa: E402,F401  (names the training methods; each is imported when first used)

__version__ = "0.1.0"

__all__ = ["TrainConfig", "Model", "TrainResult", "Tokenizer", "encode_corpus", "load", "load_ids", "pretokenize",
           "train", "train_bpe", "train_from_iterator", "__version__"]

#: The public names, each imported from its module when first used (``import bpe_core`` alone does
#: not import the trainer, the encoder or their dependencies: a small run pays only for what it uses).
_LAZY = {
    "TrainConfig": ("config", "TrainConfig"),
    "encode_corpus": ("encode.encode_corpus", "encode_corpus"),
    "Tokenizer": ("encode.tokenizer", "Tokenizer"),
    "Model": ("formats.model", "Model"),
    "load": ("formats.model", "load_model"),
    "load_ids": ("formats.ids", "load_ids"),
    "pretokenize": ("pretok.pretokenize", "pretokenize"),
    "TrainResult": ("training", "TrainResult"),
    "train": ("training", "train"),
    "train_bpe": ("training", "train_bpe"),
    "train_from_iterator": ("training", "train_from_iterator"),
}


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value            # the next lookup is a plain attribute
        return value
    if not name.startswith("_"):           # a sub-package or module (bpe_core.training, ...), as before
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
