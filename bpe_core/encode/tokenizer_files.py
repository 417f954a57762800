"""A tokenizer's files: :meth:`FilesMixin.from_files` reads GPT-2's ``vocab.json`` + ``merges.txt``,
:meth:`FilesMixin.save` writes the model folder that ``Tokenizer.load`` reads back (``load`` itself
stays beside ``Tokenizer``: it may return the stage-aware subclass).

Part of ``encode.tokenizer`` (``Tokenizer`` takes these methods from :class:`FilesMixin`).
"""
from __future__ import annotations

import os
from typing import Sequence

from ..errors import ModelFormatError
from ..formats.exactness import hf_folder_check
from ..formats.folder import save_folder
from ..formats.model import MODEL_FILE, Model, check_model, load_gpt2


class FilesMixin:
    """Reading GPT-2 files into a ``tokenizer.Tokenizer`` and saving one as a model folder."""

    @classmethod
    def from_files(cls, vocab_path: str | os.PathLike, merges_path: str | os.PathLike,
                   special_tokens: Sequence[str] | None = None, pattern: str = "gpt2") -> "Tokenizer":
        """Load GPT-2 style ``vocab.json`` + ``merges.txt`` (byte-to-unicode form).

        The two files must belong together (``formats.model.load_gpt2``: each merge builds from earlier
        tokens a token of ``vocab.json``, and no ordinary token lacks its merge); otherwise
        :class:`~bpe_core.errors.ModelFormatError` names the file and line.

        >>> import json, os, tempfile; d = tempfile.mkdtemp()
        >>> from bpe_core import Tokenizer
        >>> from bpe_core.formats.model import bytes_to_unicode; b2u = bytes_to_unicode()
        >>> raw = {b2u[b]: b for b in range(256)}; raw.update({"Ġt": 256, "Ġth": 257, "<|endoftext|>": 258})
        >>> _ = open(os.path.join(d, "vocab.json"), "w", encoding="utf-8").write(json.dumps(raw))
        >>> _ = open(os.path.join(d, "merges.txt"), "w", encoding="utf-8").write("#version: 0.2\\nĠ t\\nĠt h\\n")
        >>> tok = Tokenizer.from_files(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"), ["<|endoftext|>"])
        >>> tok.encode(" the<|endoftext|>")          # " th" (257), "e" (101), the special token
        [257, 101, 258]
        """
        vocab, merges = load_gpt2(vocab_path, merges_path, special_tokens)
        return cls(vocab, merges, special_tokens, pattern)

    def save(self, folder: str | os.PathLike) -> str:
        """Write a model folder that :meth:`load` reads back (``vocab.json`` + ``merges.txt``,
        ``model.json`` and, for plain BPE, HF's ``tokenizer.json`` + ``tokenizer_config.json``:
        ``formats.folder.save_folder``, as ``tools/train_bpe.py --out`` writes it, published whole),
        creating the folder if needed; returns the folder. The ids must have the layout of a
        trained model (bytes 0-255, the special tokens, then one id per merge): otherwise
        :class:`~bpe_core.errors.ModelFormatError` says what is off and nothing is written.

        >>> import os, tempfile
        >>> from bpe_core import Tokenizer
        >>> vocab = {i: bytes([i]) for i in range(256)}; vocab[256] = b"<|endoftext|>"; vocab[257] = b"ab"
        >>> tok = Tokenizer(vocab, [(b"a", b"b")], ["<|endoftext|>"])
        >>> Tokenizer.load(tok.save(os.path.join(tempfile.mkdtemp(), "tok"))).encode("abab<|endoftext|>")
        [257, 257, 256]
        """
        folder = os.fspath(folder)
        model = getattr(self, "_model", None)
        if model is None:
            model = Model(vocab=dict(self._vocab), merges=list(self._merges),
                          special_tokens=list(self._special_tokens), pattern=self._pattern)
            shown = os.path.join(folder, MODEL_FILE)
            layout = ([bytes([i]) for i in range(256)] + [s.encode("utf-8") for s in model.special_tokens]
                      + [a + b for a, b in model.merges])
            if len(model.vocab) != len(layout) or any(model.vocab.get(i) != b for i, b in enumerate(layout)):
                raise ModelFormatError(shown, "cannot hold these ids: a model file has ids 0-255 for the bytes, "
                                              "then the special tokens, then one id per merge in order")
            check_model(model, shown)
        # HF's files only when HF tokenizers gives these ids (on the built-in check text)
        save_folder(model, folder, hf_check=hf_folder_check(self.encode))
        return folder
