"""The table of training methods: the one place training, loading, encoding and export look up a
method by the name a ``TrainConfig`` or a ``model.json`` carries.

A method is an object with the small interface of :class:`Method`; each one lives in
``bpe_core/methods/`` and registers itself when its module is imported. ``methods/__init__.py``
(which ``import bpe_core`` imports) declares each one (:func:`declare`) by name and module, so the names are
known at once and a method's module (SuperBPE's, SupraTok's: many modules) is imported only when
:func:`get` first asks for it. Layers below the methods (model files here, the encoder,
``TrainConfig``) only call through this table, so they never import a method, and adding a method
touches no other module: write ``methods/new.py`` with a ``Method`` subclass,
``register(NewMethod())``, and declare it in ``methods/__init__.py`` (``docs/architecture.md``,
"To add a method").

>>> get("no-such-method")
Traceback (most recent call last):
...
ValueError: unknown method 'no-such-method' (known: ...)
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

# The annotations "TrainConfig" (config.py) and "Model" (formats/model.py) are names only: this
# module imports neither, not even for type checkers, so the layers below methods that look a
# method up (model files, the encoder, TrainConfig) form no import cycle with it.

__all__ = ["Method", "MethodResult", "declare", "get", "names", "register", "unregister"]


class MethodResult:
    """What a method's ``train`` returns: the vocabulary, the ordered merges, the stage marks of the
    model, and its own section of the run report (merged into the run's report by training)."""

    def __init__(self, vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]], stages: list[dict],
                 report: Optional[dict] = None):
        self.vocab = vocab
        self.merges = merges
        self.stages = stages
        self.report = report or {}


class Method:
    """A training method (a curriculum over the merge engine) and what it means for its models.

    Attributes:
        name: the value of ``TrainConfig.method`` and of ``"method"`` in ``model.json``.
        n_stages: how many stages a model of this method records (None: any, including none).
        stage_aware: its models encode in stages (stage-1 merges inside pretokens, later merges
            across them), so ``Tokenizer.load`` builds :meth:`stage_encoder` for them.
        rereads_input: its ``train`` reads ``config.input_path`` again (a second pass over the
            corpus, one plain-text file). Training then first writes inputs that are not one plain
            file (several files, compressed, records, stdin, iterators) into one temp file under the
            spill folder (``corpus.shards.spool``). :meth:`reads_input_again` can refine it per
            configuration.
        drops_single_byte_words: its engine drops words of one byte (they hold no pair), so the
            merge plan counts their symbols out and a mapped table leaves them out.
        supports_init: it can start from an existing BPE model (``TrainConfig.init_from``); its
            ``train`` then gets that model as ``init`` (``methods.init_from.InitModel``).
        plain_tables: its ``train`` takes a word table of ``array.array`` (a small run's, counted
            without numpy: ``pretok.wordtable``); others get the table as numpy arrays.
        records_pretokens: its ``train`` can use the row of every pretoken, recorded as the corpus
            is counted (``pretok.counting.count_corpus(record=)``), instead of reading it again; it
            then gets them as ``recorded`` (when the training could record them and
            :meth:`uses_record` says this configuration would use them).
    """

    name: str = ""
    n_stages: Optional[int] = None
    stage_aware: bool = False
    rereads_input: bool = True
    drops_single_byte_words: bool = False
    supports_init: bool = False
    records_pretokens: bool = False
    plain_tables: bool = False

    def check_config(self, config: "TrainConfig") -> None:
        """Raise ``ValueError`` for options this method cannot run with (called by ``TrainConfig``)."""

    def reads_input_again(self, config: "TrainConfig", sources: Sequence[Any]) -> bool:
        """Whether ``train`` reads these inputs (``corpus`` sources) a second time from one plain
        file, so training must spool them into one first (default: :attr:`rereads_input`)."""
        return self.rereads_input

    def uses_record(self, config: "TrainConfig") -> bool:
        """Whether ``train`` would use the recorded pretokens for this configuration (so training
        keeps them only then: they cost memory and counting time)."""
        return self.records_pretokens

    def train(self, config: "TrainConfig", table: Any, plan: Any, progress: Any = False,
              init: Any = None, recorded: Any = None) -> MethodResult:
        """Learn the merges from the counted word table (``pretok.WordTable``) of ``config``'s corpus
        (starting from ``init``'s merges when given: only for a method that ``supports_init``)."""
        raise NotImplementedError(f"method {self.name!r} cannot train")

    def check_stages(self, path: str, model: "Model") -> None:
        """Raise ``errors.ModelFormatError`` when ``model.stages`` is not what this method writes
        (beyond the generic checks of ``formats.model.check_model``)."""

    def stage_encoder(self, model: "Model") -> Any:
        """For a stage-aware method: an object with ``encode_ordinary(bytes) -> np.ndarray``."""
        raise NotImplementedError(f"method {self.name!r} has no stage-aware encoder")

    def hf_split_pattern(self, model: "Model") -> Optional[str]:
        """The regex of the HF ``Split`` pre-tokenizer for an export (None: the model's pattern)."""
        return None

    def export_caveats(self, model: "Model", fmt: str) -> list[str]:
        """What an export to ``fmt`` cannot express of this model (said on stderr by the tools)."""
        return []

    def export_refusal(self, model: "Model", fmt: str) -> Optional[str]:
        """Why an export of this model to ``fmt`` would give other ids than bpe_core on most texts,
        so that ``export.export`` refuses to write it (None: the export may be written, with its
        :meth:`export_caveats`)."""
        return None


#: name -> the method, or the name of the module that registers it when imported (:func:`declare`)
_METHODS: dict[str, "Method | str"] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the table under ``method.name`` (a second registration replaces the first;
    a declared name keeps its place in :func:`names`)."""
    if not method.name:
        raise ValueError("a method needs a name")
    _METHODS[method.name] = method
    return method


def declare(name: str, module: str) -> None:
    """Name a method whose ``module`` (a dotted name) registers it when imported: :func:`get`
    imports it the first time the name is asked for. A method already registered stays."""
    if not isinstance(_METHODS.get(name), Method):
        _METHODS[name] = module


def unregister(name: str) -> None:
    """Remove the method called ``name`` (a test's own method, say); unknown names are ignored."""
    _METHODS.pop(name, None)


def get(name: Any) -> Method:
    """The method called ``name``; ``ValueError`` listing the known names otherwise."""
    method = _METHODS.get(name) if isinstance(name, str) else None
    if isinstance(method, str):                   # declared: its module registers it
        import importlib

        importlib.import_module(method)
        method = _METHODS.get(name)
        if not isinstance(method, Method):
            raise ImportError(f"method {name!r}: importing {_METHODS.get(name)!r} did not register it")
    if method is None:
        raise ValueError(f"unknown method {name!r} (known: {', '.join(names())})")
    return method


def names() -> list[str]:
    """The method names (registered or declared), in the order they were first registered or declared."""
    return list(_METHODS)
