"""A SuperBPE model's stage-2 split as one regex, for the HF export's ``Split``
(:func:`hf_split_regex`): exact for the ``"hf"`` split with the GPT-2 pattern, the closest one
otherwise."""
from __future__ import annotations

from ...formats.model import Model
from ...pretok.patterns import pattern_name, resolve_pattern  # noqa: F401  (resolve_pattern: the doctest)
from .official import OFFICIAL_STAGE2_PATTERN
from .rules import model_split

#: The ``"hf"`` split of a model pre-tokenized with the GPT-2 pattern: numeric pretokens
#: (`` ?\\p{N}+``) alone, and everything else up to the last character of a whitespace run of two or
#: more that a non-space follows (where GPT-2's ``\\s+(?!\\S)`` ends a pretoken). Uses only what
#: HF's ``Split`` (Oniguruma) supports: classes, lookahead and fixed-width lookbehind.
HF_SPLIT_GPT2 = (r"[ ]?\p{N}+"
                 r"|(?:(?![ ]?\p{N})[\s\S])(?:(?![ ]?\p{N})(?!(?<=\s)\s\S)[\s\S])*")
#: The closest for cl100k / o200k (not exact: their punctuation pretokens take trailing line breaks
#: and their whitespace rules differ): numbers in groups of 1-3 from the left (their pretokens), a cut
#: after the last line break of a whitespace run and before the last of the spaces after it.
HF_SPLIT_CL100K = (r"\p{N}{1,3}"
                   r"|(?:(?!\p{N})[\s\S])(?:(?!\p{N})(?!(?<=[\r\n])[^\S\r\n]+(?:\S|\z))"
                   r"(?!(?<=[^\S\r\n])[^\S\r\n]\S)[\s\S])*")
#: The ``"units"`` split cannot be expressed (its digit cuts depend on stage-1 tokens); this isolates
#: whole numeric pretokens, the closest a regex gets.
HF_SPLIT_UNITS_GPT2 = r"[ ]?\p{N}+|(?:(?![ ]?\p{N})[\s\S])+"


def hf_split_regex(model: Model) -> tuple[str, bool]:
    """The HF ``Split`` regex that expresses this SuperBPE model's stage-2 units, and whether it is
    exact (the same units as training on every text; else the closest one).

    >>> m = Model(vocab={i: bytes([i]) for i in range(256)}, merges=[], method="superbpe",
    ...           pattern=resolve_pattern("gpt2"),
    ...           stages=[{"name": "bpe", "merges": 0}, {"name": "superbpe", "merges": 0, "split": "hf"}])
    >>> hf_split_regex(m) == (HF_SPLIT_GPT2, True)
    True
    """
    split = model_split(model)
    name = pattern_name(model.pattern)
    if split == "official":
        return OFFICIAL_STAGE2_PATTERN, False
    if split == "units":
        return (HF_SPLIT_UNITS_GPT2 if name == "gpt2" else HF_SPLIT_CL100K), False
    if name == "gpt2":
        return HF_SPLIT_GPT2, True
    if name in ("cl100k", "o200k"):
        return HF_SPLIT_CL100K, False
    return HF_SPLIT_GPT2, False
