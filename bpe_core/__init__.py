"""bpe_core: exact, fast, RAM-budgeted byte-level BPE training and corpus encoding.

This is the public API.
"""


def _check_extensions() -> None:
    """Say in one line what to do when the compiled extensions are missing next to this file.

    That happens when Python finds the source checkout before the installed package (the current
    directory is the repository root), and otherwise ends in a confusing circular-import error.
    """
    try:
        from .engine import merge  # noqa: F401  (loads the compiled _engine)
    except ImportError as exc:
        import importlib.machinery
        import os

        here = os.path.dirname(os.path.abspath(__file__))
        built = any(os.path.exists(os.path.join(here, "engine", "_engine" + suffix))
                    for suffix in importlib.machinery.EXTENSION_SUFFIXES)
        if built:
            raise                       # built but broken: the real error says more
        raise ImportError(
            f"bpe_core: the compiled extensions are not built in {here} (you are importing the source "
            f"checkout, probably because the current directory is the repository root); run "
            f"`python setup.py build_ext --inplace` or run from another folder", name=exc.name) from None


_check_extensions()
from .config import TrainConfig  # noqa: E402
from .encode.encode_corpus import encode_corpus  # noqa: E402
from .encode.tokenizer import Tokenizer  # noqa: E402
from .formats.model import Model, load_model as load  # noqa: E402
from .pretok.pretokenize import pretokenize  # noqa: E402
from .training import TrainResult, train, train_bpe, train_from_iterator  # noqa: E402

__version__ = "0.1.0"

__all__ = ["TrainConfig", "Model", "TrainResult", "Tokenizer", "encode_corpus", "load", "pretokenize",
           "train", "train_bpe", "train_from_iterator", "__version__"]
