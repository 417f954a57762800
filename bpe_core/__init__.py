"""bpe_core: exact, fast, RAM-budgeted byte-level BPE training and corpus encoding.

This is the public API.
"""


class ExtensionsNotBuilt(ImportError):
    """``import bpe_core`` found a source checkout whose compiled extensions are not built."""


def _unbuilt_hint() -> "str | None":
    """One line saying what to do when the compiled extensions are missing next to this file (None
    when they load).

    That happens when Python finds the source checkout before the installed package (the current
    directory is the repository root), and otherwise ends in a confusing circular-import error.
    """
    try:
        from .engine import merge  # noqa: F401  (loads the compiled _engine)
    except ImportError:
        import importlib.machinery
        import os

        here = os.path.dirname(os.path.abspath(__file__))
        built = any(os.path.exists(os.path.join(here, "engine", "_engine" + suffix))
                    for suffix in importlib.machinery.EXTENSION_SUFFIXES)
        if built:
            raise                       # built but broken: the real error says more
        return (f"bpe_core: the compiled extensions are not built in {here} (this is the source checkout, "
                f"found first because the current directory is the repository root); build them in place "
                f"with `pip install -e .` (or `python setup.py build_ext --inplace`), or run from another "
                f"folder to use the installed package")
    return None


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
from .config import TrainConfig  # noqa: E402
from .encode.encode_corpus import encode_corpus  # noqa: E402
from .encode.tokenizer import Tokenizer  # noqa: E402
from .formats.model import Model, load_model as load  # noqa: E402
from .pretok.pretokenize import pretokenize  # noqa: E402
from .training import TrainResult, train, train_bpe, train_from_iterator  # noqa: E402

__version__ = "0.1.0"

__all__ = ["TrainConfig", "Model", "TrainResult", "Tokenizer", "encode_corpus", "load", "pretokenize",
           "train", "train_bpe", "train_from_iterator", "__version__"]
