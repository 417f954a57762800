"""HF's files for a model: ``tokenizer.json`` (a ByteLevel BPE model of HF ``tokenizers``) and
``tokenizer_config.json`` (what ``transformers.AutoTokenizer`` reads beside it).

``tokenizer.json``: the pre-tokenizer is ``Split`` with the model's regex as Oniguruma reads it with
the same meaning (``formats.patterns_compat``; ``behavior: isolated``) followed by ``ByteLevel`` with ``use_regex: false`` (bytes to GPT-2 characters only);
special tokens are added tokens (``special: true``, not normalized); a ByteLevel decoder. For a
model whose method encodes in stages (SuperBPE, SupraTok) the split is the method's closest one and
ids can differ (``Method.export_caveats``); for plain BPE the ids are bpe_core's.
"""
from __future__ import annotations

import itertools
import json
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any, Callable, Iterable

from . import registry
from .model import Model, gpt2_names
from .texts import join_pieces

if TYPE_CHECKING:
    from .texts import FolderTexts

__all__ = ["HF_CONFIG_FILE", "HF_TOKENIZER_FILE", "hf_file_makers", "hf_folder_files", "hf_split_pattern", "hf_tokenizer_config",
           "hf_tokenizer_json", "hf_tokenizer_text", "special_ids", "unique_ids", "usable_merges"]

HF_TOKENIZER_FILE = "tokenizer.json"
HF_CONFIG_FILE = "tokenizer_config.json"


def unique_ids(model: Model) -> dict[bytes, int]:
    """bytes -> smallest id (ordinary tokens only; special tokens are handled apart)."""
    specials = {s.encode("utf-8") for s in model.special_tokens}
    out: dict[bytes, int] = {}
    for i in sorted(model.vocab):
        b = model.vocab[i]
        if b in specials and i >= 256:
            continue
        out.setdefault(b, i)
    return out


def special_ids(model: Model) -> dict[str, int]:
    ids: dict[str, int] = {}
    for s in model.special_tokens:
        b = s.encode("utf-8")
        ids[s] = min(i for i, v in model.vocab.items() if v == b)
    return ids


def usable_merges(model: Model, ids: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Merges in rank order, without repeats of a pair (the first rank wins, as in the reference)
    and without merges that can never apply (a part is not a token)."""
    merges = model.merges
    try:            # the usual case, checked in C: no repeats, every part a token -> all of them
        if len(set(merges)) == len(merges) and ids.keys() >= set(itertools.chain.from_iterable(merges)):
            return list(merges)
    except TypeError:           # a pair given as a list (unhashable): the loop below
        pass
    seen: set[tuple[bytes, bytes]] = set()
    out = []
    for a, b in model.merges:
        if (a, b) in seen or a not in ids or b not in ids:
            continue
        seen.add((a, b))
        out.append((a, b))
    return out


def hf_tokenizer_json(model: Model, names: dict[bytes, str] | None = None) -> dict[str, Any]:
    """The ``tokenizer.json`` document of HF ``tokenizers`` for this model (``names``: the model's
    ``formats.model.gpt2_names`` when the caller has them).

    For a SuperBPE model the pre-tokenizer is the official SuperBPE stage-2 split (the closest HF
    can express; see :func:`export_caveats`).
    """
    doc, vocab, pairs, names = _hf_parts(model, names)
    # each merge as the string "left right" (HF tokenizers 0.19 reads no pairs; see formats.texts)
    doc["model"].update(vocab=vocab, merges=[f"{names[a]} {names[b]}" for a, b in pairs])
    return doc


def hf_tokenizer_text(model: Model, names: dict[bytes, str] | None = None, end: str = "") -> str:
    """``json.dumps(hf_tokenizer_json(model), ensure_ascii=False) + end``, the text of
    ``tokenizer.json``, made without a list object per merge: the merges' text is joined from each
    token's JSON string (less time and a lower peak for a large vocabulary; the same characters)."""
    return join_pieces(_hf_pieces(model, names, end))


def _hf_pieces(model: Model, names: dict[bytes, str] | None, end: str,
               texts: "FolderTexts | None" = None) -> Iterable[str]:
    """The text of ``tokenizer.json`` in pieces that a writer writes one after another (never joined
    into one long text). ``texts``: the model's ``formats.texts.FolderTexts`` when the caller has it
    (its GPT-2 strings and ``merges.txt`` lines are shared); the vocab and the merges are made there
    in a few passes in C, or, for a model it does not cover, pair by pair below."""
    from .texts import FolderTexts

    if texts is None:
        texts = FolderTexts(model.vocab, model.merges)
    fast = texts.hf_vocab_and_merges(model)
    if fast is not None:
        vocab, merges, specials = fast
        head = json.dumps(_hf_doc(model, specials), ensure_ascii=False)
        assert head.endswith("}}")            # "model" is the last key, and "merges" the last of it
        return itertools.chain((head[:-2], ', "vocab": '), vocab, (', "merges": ',), merges, ("}}" + end,))
    doc, vocab, pairs, names = _hf_parts(model, names)
    head = json.dumps(doc, ensure_ascii=False)
    assert head.endswith("}}")            # "model" is the last key, and "merges" the last of it
    vocab_text = json.dumps(vocab, ensure_ascii=False)
    del vocab, doc                        # (each part is freed once it is text: a lower peak)
    quote = encode_basestring             # json's own string encoder (ensure_ascii=False)
    merges = "[" + ", ".join([quote(f"{names[a]} {names[b]}") for a, b in pairs]) + "]"
    del pairs
    return [head[:-2], ', "vocab": ', vocab_text, ', "merges": ', merges, "}}" + end]


def _hf_parts(model: Model, names: dict[bytes, str] | None):
    """``tokenizer.json`` without the model's vocab and merges; the vocab (GPT-2 string -> id), the
    usable merges (pairs of bytes) and the GPT-2 strings of the tokens."""
    ids = unique_ids(model)
    if names is None:
        names = gpt2_names(ids)           # every usable merge's parts are in ids
    vocab = {names[b]: i for b, i in sorted(ids.items(), key=lambda kv: kv[1])}
    pairs = usable_merges(model, ids)
    doc = _hf_doc(model, special_ids(model))
    for tok in doc["added_tokens"]:
        vocab.setdefault(tok["content"], tok["id"])
    return doc, vocab, pairs, names


def _hf_doc(model: Model, specials: dict[str, int]) -> dict[str, Any]:
    """``tokenizer.json`` without the model's vocab and merges (``specials``: :func:`special_ids`)."""
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for s, i in sorted(specials.items(), key=lambda kv: kv[1])
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": hf_split_pattern(model)}, "behavior": "Isolated",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
        },
    }


def hf_split_pattern(model: Model) -> str:
    """The regex of the HF ``Split``: the method's own (``Method.hf_split_pattern``), else the model's,
    rewritten for Oniguruma with the same meaning (``formats.patterns_compat``: possessive
    ``{n,m}+`` as an atomic group, ``$``, ``(?i)``, ...).

    Raises:
        PatternNotPortable: (a ``ValueError``) no rewrite with the same meaning is known.
    """
    from .patterns_compat import portable_pattern

    # (a Model made without a pattern encodes with GPT-2's, as Tokenizer's default)
    pattern = registry.get(model.method).hf_split_pattern(model) or model.pattern or "gpt2"
    return portable_pattern(pattern, "oniguruma")


def hf_tokenizer_config(model: Model) -> dict[str, Any]:
    """``tokenizer_config.json``: ``transformers`` builds a fast tokenizer over ``tokenizer.json``
    (``PreTrainedTokenizerFast``; 5.x: ``TokenizersBackend``), with the first special token as its
    end-of-text token and no tokens added around the text (``post_processor`` is null)."""
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                              "model_max_length": 1 << 60}
    if model.special_tokens:
        eot = model.special_tokens[0]
        config.update(bos_token=eot, eos_token=eot, unk_token=eot)
    return config


def hf_folder_files(model: Model, names: dict[bytes, str] | None = None) -> dict[str, str]:
    """The HF files of a model folder (name -> text), for a method whose models HF encodes exactly
    (one merge list, no stages): ``AutoTokenizer.from_pretrained(folder)`` and
    ``tokenizers.Tokenizer.from_file(folder + "/tokenizer.json")`` then give bpe_core's ids. None
    for a stage-aware method (its ``tools/export_tokenizer.py --format transformers`` is exact).

    >>> m = Model(vocab={**{i: bytes([i]) for i in range(256)}, 256: b"<|endoftext|>", 257: b"ab"},
    ...           merges=[(b"a", b"b")], special_tokens=["<|endoftext|>"])
    >>> sorted(hf_folder_files(m))
    ['tokenizer.json', 'tokenizer_config.json']
    """
    made = {name: make() for name, make in hf_file_makers(model, names).items()}
    return {name: text if isinstance(text, str) else join_pieces(text) for name, text in made.items()}


def hf_file_makers(model: Model, names: dict[bytes, str] | None = None,
                   texts: "FolderTexts | None" = None) -> dict[str, Callable[[], str]]:
    """:func:`hf_folder_files` as functions that make each text when called (a writer then holds one
    long text at a time; ``tokenizer.json``'s as a list of pieces, written one after another).
    ``texts``: the model's ``formats.texts.FolderTexts``, shared with the folder's other files."""
    if registry.get(model.method).stage_aware:
        return {}
    return {HF_TOKENIZER_FILE: lambda: _hf_pieces(model, names, "\n", texts),
            HF_CONFIG_FILE: lambda: json.dumps(hf_tokenizer_config(model), indent=2) + "\n"}
